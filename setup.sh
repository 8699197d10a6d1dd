#!/usr/bin/env bash
# First command on a fresh clone: sets up a development environment and builds a quick wheel.
# The second is `nox -s tests` (with the virtualenv's nox: .venv/bin/nox -s tests).
#
#   ./setup.sh                  a virtualenv, the pinned tools, a wheel for this machine's GPUs
#   ./setup.sh --archs 75,80    ... for these archs (CI's subset: both older kernel families)
#   ./setup.sh --release        ... for every arch and head dim (what the release wheels hold)
#   ./setup.sh --no-venv        use the current python3 and its packages as they are (CI)
#   ./setup.sh --no-build       set up only
#
# Needs bash and python3 >= 3.9 (with its venv module), nvcc >= 12.4 and a C++17 compiler;
# pip needs PyPI for whatever is not installed yet. Environment:
#   SAMATTN_ATTENTION_HEAD_DIMS  head dims to build (default 64,128; of 32,64,96,128,192,256)
#   SAMATTN_VENV                 the virtualenv's folder (default .venv)
#   SAMATTN_TORCH                the torch to install when none is importable (default torch==2.13.0)
#   PYTHON                       the interpreter to use or to make the virtualenv from (python3)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
started=$SECONDS
say() { printf '\n=== %s (%ds)\n' "$*" $((SECONDS - started)); }
die() {
  printf 'setup.sh: %s\n' "$*" >&2
  exit 1
}

archs=""
release=0
use_venv=1
build=1
while [ $# -gt 0 ]; do
  case "$1" in
  --archs) archs="${2:?--archs needs a list, e.g. 75,80}" && shift ;;
  --archs=*) archs="${1#--archs=}" ;;
  --release) release=1 ;;
  --no-venv) use_venv=0 ;;
  --no-build) build=0 ;;
  -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' && exit 0 ;;
  *) die "unknown argument '$1' (see ./setup.sh --help)" ;;
  esac
  shift
done

# ---------------------------------------------------------------- python ----
say "python"
base_python="${PYTHON:-python3}"
command -v "$base_python" >/dev/null || die "no $base_python on PATH: install Python >= 3.9"
"$base_python" -c 'import sys; sys.exit(sys.version_info < (3, 9))' ||
  die "$("$base_python" --version 2>&1) is too old: samattn needs Python >= 3.9"

if [ "$use_venv" = 0 ]; then
  python="$(command -v "$base_python")"
  echo "using $python and its packages as they are (--no-venv)"
elif [ -n "${VIRTUAL_ENV:-}" ]; then
  python="$VIRTUAL_ENV/bin/python"
  echo "using the active virtualenv $VIRTUAL_ENV"
else
  venv="${SAMATTN_VENV:-.venv}"
  if [ ! -x "$venv/bin/python" ]; then
    # --system-site-packages: a torch (or CUDA toolkit package) already installed for this
    # python is reused rather than downloaded again; what the venv installs takes precedence.
    "$base_python" -m venv --system-site-packages "$venv" ||
      die "cannot create a virtualenv (on Debian/Ubuntu: apt-get install python3-venv), or use --no-venv"
    echo "created the virtualenv $venv (python -m venv --system-site-packages: it sees $base_python's packages)"
  else
    echo "using the virtualenv $venv"
  fi
  python="$PWD/$venv/bin/python"
fi
"$python" --version
export PIP_DISABLE_PIP_VERSION_CHECK=1

# ----------------------------------------------------------------- torch ----
say "torch"
torch_ok='import sys, torch; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(v < (2, 4))'
if "$python" -c "$torch_ok" 2>/dev/null; then
  echo "keeping torch $("$python" -c 'import torch; print(torch.__version__)') (any torch >= 2.4 works)"
else
  echo "no torch >= 2.4 importable: installing ${SAMATTN_TORCH:-torch==2.13.0} (what CI tests)"
  "$python" -m pip install "${SAMATTN_TORCH:-torch==2.13.0}"
fi

# ------------------------------------------------------------ dev tools ----
say "pinned dev requirements (ci/requirements-dev.txt)"
# nox, pytest, ruff, clang-format, cmake, ninja, scikit-build-core, nvidia-cutlass, cuobjdump.
"$python" -m pip install -r ci/requirements-dev.txt | { grep -v '^Requirement already satisfied' || true; }
"$python" -m nox --version >/dev/null 2>&1 || die "nox did not install"
if [ "$use_venv" = 1 ] && [ ! -x "$(dirname "$python")/nox" ]; then
  # pip found nox among the packages the virtualenv sees and installed no `nox` command
  # into it: a launcher makes `.venv/bin/nox` (and `nox` once activated) run this python's.
  printf '#!/bin/sh\nexec "$(dirname "$0")/python" -m nox "$@"\n' >"$(dirname "$python")/nox"
  chmod +x "$(dirname "$python")/nox"
fi

# ------------------------------------------------------------------ nvcc ----
say "nvcc"
candidates=()
command -v nvcc >/dev/null && candidates+=("$(command -v nvcc)")
for home in "${CUDA_HOME:-}" "${CUDA_PATH:-}"; do
  [ -n "$home" ] && candidates+=("$home/bin/nvcc")
done
candidates+=(/usr/local/cuda/bin/nvcc)
# pip's nvidia-cuda-nvcc (nvidia/cuda_nvcc/bin for 12.x, nvidia/cu13/bin for 13.x), and the
# toolkits `nox -s wheel` installs under build/toolkits/.
while IFS= read -r found; do candidates+=("$found"); done < <(
  "$python" - <<'EOF'
import glob, site, sys, sysconfig
folders = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *site.getsitepackages()}
for folder in sorted(folders):
    for nvcc in sorted(glob.glob(f"{folder}/nvidia/*/bin/nvcc")):
        print(nvcc)
for nvcc in sorted(glob.glob("build/toolkits/*/bin/nvcc")):
    print(nvcc)
EOF
)
nvcc=""
for candidate in "${candidates[@]}"; do
  [ -x "$candidate" ] || continue
  release_line="$("$candidate" --version 2>/dev/null | grep -o 'release [0-9]*\.[0-9]*' || true)"
  version="${release_line#release }"
  if [ -n "$version" ] && [ "$(printf '%s\n' 12.4 "$version" | sort -V | head -n 1)" = 12.4 ]; then
    nvcc="$candidate"
    break
  fi
  echo "skipping $candidate (CUDA ${version:-?}; samattn needs 12.4 or newer)"
done
[ -n "$nvcc" ] || die "no nvcc >= 12.4 found (looked on PATH, in \$CUDA_HOME, /usr/local/cuda and pip's
nvidia-cuda-nvcc). Install a CUDA toolkit and rerun with CUDA_HOME=/path/to/cuda, or install
CUDA 13.0 from pip without root: $python ci/install_cuda.py cu130 build/toolkits/cu130"
# The toolkit's own bin/ (nvcc reports it), not the folder of a symlink or wrapper script.
nvcc_dir="$("$nvcc" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -n 1)"
[ -x "$nvcc_dir/nvcc" ] || nvcc_dir="$(dirname "$(readlink -f "$nvcc")")"
export PATH="$nvcc_dir:$PATH"
echo "$nvcc_dir/nvcc: CUDA $version"
[ "$build" = 1 ] || {
  say "set up; build later with: .venv/bin/nox -s build -- ARCHS (PATH=$nvcc_dir:\$PATH)"
  exit 0
}

# ----------------------------------------------------------------- archs ----
say "what to build"
if [ "$release" = 1 ]; then
  archs="75,80,86,89,90a"
  unset SAMATTN_ATTENTION_HEAD_DIMS
  echo "--release: every arch ($archs) and every head dim; the published wheels come from"
  echo "nox -s wheel -- VARIANT, which also installs that variant's CUDA toolkit"
else
  if [ -z "$archs" ]; then
    # One arch per GPU model present: compute capability 8.6 -> 86; Hopper needs 90a for
    # its own family; GPUs newer than the families run the sm80 family (native when nvcc
    # knows the arch, else from its compute_80 PTX).
    gpus="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | sort -u || true)"
    known="$(nvcc --list-gpu-code 2>/dev/null | tr '\n' ' ')"
    for cc in $gpus; do
      arch="${cc/./}"
      if [ "$arch" -lt 75 ]; then
        echo "GPU of compute capability $cc: older than Turing (7.5), which samattn cannot run"
        continue
      elif [ "$arch" = 90 ]; then
        arch=90a
      elif [ "$arch" -ge 100 ] && [[ " $known " != *" sm_$arch "* ]]; then
        arch=80
      fi
      archs="${archs:+$archs,}$arch"
    done
    if [ -n "$archs" ]; then
      echo "GPUs found (compute capability $(echo "$gpus" | tr '\n' ' ')): building $archs"
    else
      # No GPU: the sm80 family alone is enough to build and run the CPU tests.
      archs=80
      echo "no NVIDIA GPU found (nvidia-smi): building sm_80 only, enough for the CPU tests;"
      echo "--archs 75,80 adds the Turing family (what CI builds)"
    fi
  fi
  export SAMATTN_ATTENTION_HEAD_DIMS="${SAMATTN_ATTENTION_HEAD_DIMS:-64,128}"
  echo "attention head dims: $SAMATTN_ATTENTION_HEAD_DIMS (SAMATTN_ATTENTION_HEAD_DIMS, of 32,64,96,128,192,256:"
  echo "head dim d runs in the kernels of the next one up, e.g. 64 serves 33..64 and 128 serves"
  echo "97..128; a head dim whose kernels were left out raises an error naming this variable)"
fi
command -v ccache >/dev/null && echo "ccache: yes (rebuilds are mostly cache hits)" ||
  echo "ccache: not installed (apt-get install ccache makes rebuilds much faster)"

# ----------------------------------------------------------------- build ----
say "build (nox -s build -- $archs)"
rm -f dist/samattn-*.whl
"$python" -m nox -s build -- "$archs"

say "done"
if [ "$python" = "$(command -v "$base_python" 2>/dev/null)" ] || [ -n "${VIRTUAL_ENV:-}" ]; then
  echo "next: nox -s tests"
else
  echo "next: ${SAMATTN_VENV:-.venv}/bin/nox -s tests   (or: source ${SAMATTN_VENV:-.venv}/bin/activate; nox -s tests)"
fi
