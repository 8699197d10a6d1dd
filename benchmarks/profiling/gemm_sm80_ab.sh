#!/usr/bin/env bash
# A/B of the sm80 GEMM between commits (issue 53): small libraries with only the sm80
# family's GEMM (SAMATTN_CUDA_ARCHS=90: the sm80 family alone, SASS for sm_90 from
# compute_80 as in the wheels; SAMATTN_OPS=gemm: 21 CUDA units), timed forced against
# cuBLAS in one run.
#
#   here (with git), from the repository root:
#       bash benchmarks/profiling/gemm_sm80_ab.sh prepare [NAME=REV ...]
#     default old=097571d head=9fa3b66 fix=fix-53: writes build-ab53/src/NAME (the sources
#     of REV: CMakeLists.txt, cpp/, samattn/, pyproject.toml; build-ab53/ is git-ignored by
#     /build*/) and copies this script and gemm_sm80_ab.py to build-ab53/.
#   on the GPU machine, from the repository root:
#       bash build-ab53/gemm_sm80_ab.sh build [NAME ...]
#     carrying build-ab53 and .whl (the nvidia-cutlass wheel: CUTLASS's headers); builds
#     every NAME at once into build-ab53/build/NAME/libsamattn.so (logs beside them and,
#     with $OUT set, in $OUT), about 7 min on 16 cores for old, head and fix;
#       bash build-ab53/gemm_sm80_ab.sh time [NAME ...] [-- gemm_sm80_ab.py options]
#     e.g. `-- --rounds 3 --json $OUT/ab53.json` (--all: every shape of
#     results/h100_all_families.json). In a second call right after the build (the machine
#     stays warm 30 s), do not carry build-ab53 again: a carried path replaces the one on
#     the machine, built libraries included. A build cut off by a call's limit resumes
#     (ninja) in the next call while the machine is warm.
set -euo pipefail

ROOT=$(pwd)
AB=$ROOT/build-ab53
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")

names_or_default() {
  if (($#)); then echo "$@"; else ls "$AB/src"; fi
}

cutlass_path() {
  # The carried nvidia-cutlass wheel, installed once per machine.
  if ! python3 -c "import cutlass_library" 2>/dev/null; then
    if [[ ! -d /tmp/site/cutlass_library ]]; then
      python3 -m pip install -q --no-index --no-deps --target /tmp/site "$ROOT"/.whl/nvidia_cutlass-*.whl
    fi
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
}

case "${1:-}" in
prepare)
  shift
  specs=("$@")
  ((${#specs[@]})) || specs=(old=097571d head=9fa3b66 fix=fix-53)
  mkdir -p "$AB/src"
  for spec in "${specs[@]}"; do
    name=${spec%%=*} rev=${spec#*=}
    rm -rf "$AB/src/$name"
    mkdir -p "$AB/src/$name"
    git archive "$rev" -- CMakeLists.txt cpp samattn pyproject.toml | tar -x -C "$AB/src/$name"
    echo "$rev $(git rev-parse --short "$rev")" >"$AB/src/$name/REV"
    echo "build-ab53/src/$name: $(cat "$AB/src/$name/REV")"
  done
  cp "$here/gemm_sm80_ab.sh" "$here/gemm_sm80_ab.py" "$AB/"
  du -sh "$AB"
  ;;
build)
  shift
  read -r -a names <<<"$(names_or_default "$@")"
  cutlass_path
  cutlass=$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))")
  export PATH=/usr/local/cuda/bin:$PATH
  # All libraries at once, sharing the cores (a small unit finishes early and frees its
  # jobs) and the memory: up to 3.8 GB per compile (ci/compile_jobs.py's default).
  total=$((2 * $(nproc)))
  by_memory=$(awk '/MemAvailable/ {print int($2 / 3800000)}' /proc/meminfo)
  ((by_memory >= total)) || total=$by_memory
  jobs=$((total / ${#names[@]}))
  ((jobs >= 1)) || jobs=1
  echo "building ${names[*]} with $jobs jobs each"
  pids=()
  mkdir -p "$AB/build"
  for name in "${names[@]}"; do
    (
      cmake -S "$AB/src/$name" -B "$AB/build/$name" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DSAMATTN_CUDA_ARCHS=90 -DSAMATTN_OPS=gemm -DSAMATTN_GLIBC_COMPAT=OFF \
        -DSAMATTN_CUTLASS_INCLUDE_DIR="$cutlass" \
        -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" &&
        cmake --build "$AB/build/$name" -j "$jobs"
    ) >"$AB/build/$name.log" 2>&1 &
    pids+=($!)
  done
  status=0
  for i in "${!names[@]}"; do
    if wait "${pids[$i]}"; then
      echo "${names[$i]}: $(ls -l "$AB/build/${names[$i]}/libsamattn.so" | awk '{print $5}') bytes"
    else
      status=1
      echo "${names[$i]}: build failed"
      tail -n 30 "$AB/build/${names[$i]}.log"
    fi
    grep -h "spill" "$AB/build/${names[$i]}.log" | sort -u | head -n 20 || true
    if [[ -n "${OUT:-}" ]]; then cp "$AB/build/${names[$i]}.log" "$OUT/build_${names[$i]}.log"; fi
  done
  exit $status
  ;;
time)
  shift
  names=()
  while (($#)) && [[ $1 != -- ]]; do
    names+=("$1")
    shift
  done
  [[ ${1:-} == -- ]] && shift
  ((${#names[@]})) || read -r -a names <<<"$(names_or_default)"
  specs=()
  for name in "${names[@]}"; do
    specs+=("$name=$AB/src/$name:$AB/build/$name/libsamattn.so")
  done
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader || true
  python3 "$here/gemm_sm80_ab.py" "${specs[@]}" "$@"
  ;;
*)
  sed -n '2,22p' "${BASH_SOURCE[0]}"
  exit 2
  ;;
esac
