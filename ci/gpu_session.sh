#!/usr/bin/env bash
# One call on the GPU machine: build the wheel, install it, print samattn.info, run the
# CPU and GPU test tiers, and benchmark against torch. Run from the repository root with
# $OUT set (a folder whose files come back); .whl/ must hold the nvidia-cutlass and nox
# wheels (the machine has no network).
#
#   bash ci/gpu_session.sh
#
# Environment (all optional):
#   STAGES              comma list of build,info,tests,bench (default: all four). Without
#                       build, the newest wheel already in dist/ is installed.
#   SAMATTN_CUDA_ARCHS  archs to build (default 75;80;86;89;90a; "75;80;90a" builds faster)
#   TEST_PATHS          test paths relative to the repo (default "tests/cpu tests/gpu")
#   PYTEST_ARGS         extra pytest arguments, e.g. "-x -k gemm"
#   BENCH_ARGS          samattn.bench arguments (default none: automatic selection and
#                       every family the GPU runs, forced)
#   DEADLINE_S          seconds for the whole script (default 540); each stage gets at most
#                       what is left, and the benchmark adds --quick when little is left
#   BUILD_CAP_S, INFO_CAP_S, TESTS_CAP_S, BENCH_CAP_S
#                       each stage's own limit (default 420, 60, 300, 300 seconds)
#
# Files in $OUT: build.log, info.txt, tests.log, junit.xml, bench.log, bench.json,
# bench.png, summary.txt (each stage's verdict; each test tier's counts and failures).
# A failed stage does not stop the later ones; the exit status is non-zero if any stage
# failed, or a test tier had a failure or nothing that passed.

# The stage functions run by name (--stage), and ls -t picks the newest wheel.
# shellcheck disable=SC2329,SC2012
set -u -o pipefail

SCRIPT=$(readlink -f "${BASH_SOURCE[0]}")
REPO=$(pwd)
OUT=${OUT:?set OUT to the folder whose files come back}
export SAMATTN_CUDA_ARCHS=${SAMATTN_CUDA_ARCHS:-75;80;86;89;90a}
TEST_PATHS=${TEST_PATHS:-tests/cpu tests/gpu}
PYTEST_ARGS=${PYTEST_ARGS:-}
BENCH_ARGS=${BENCH_ARGS:-}
DEADLINE_S=${DEADLINE_S:-540}
export SESSION_START=${SESSION_START:-$(date +%s)}
export PIP_ROOT_USER_ACTION=ignore
# These wheels are tested here, never published: the GPU machine's glibc (2.39) puts
# symbols in the link that the manylinux_2_28 stubs do not cover (docs/release.md, Platform tag).
export SAMATTN_GLIBC_COMPAT=${SAMATTN_GLIBC_COMPAT:-OFF}

# Both folders are git-ignored, so they stay between calls while the machine is warm, and
# a build cut off by a call's time limit resumes in the next call (ci/keep_mtimes.py).
WHEELHOUSE=$REPO/dist
SITE=$REPO/build/gpu-session/site # the installed samattn wheel
TOOLS=/tmp/site                   # the carried wheels: cutlass_library (CUTLASS headers), nox
export PYTHONPATH=$SITE:$TOOLS${PYTHONPATH:+:$PYTHONPATH}
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

remaining() { echo $((DEADLINE_S - ($(date +%s) - SESSION_START))); }

# ----------------------------------------------------------------- stages ----
build() {
  # Jobs from cores and memory, at the peak memory per compile that earlier builds
  # recorded (build/*/compile_memory.tsv; 3.8 GB when none is).
  local jobs began wheel
  # Each command gets a fresh copy of the tree, every file stamped anew: put the times of
  # unchanged files back, so that a build cut off by the call's time limit resumes in the
  # next call on the warm machine instead of starting over.
  python3 ci/keep_mtimes.py build/source_mtimes.json
  jobs=$(python3 ci/compile_jobs.py --explain) || jobs=1
  echo "archs $SAMATTN_CUDA_ARCHS, $jobs jobs; full log in \$OUT/build.log"
  began=$(date +%s)
  if ! CMAKE_BUILD_PARALLEL_LEVEL=$jobs python3 -m pip wheel --no-index --no-build-isolation \
    --no-deps -v -w "$WHEELHOUSE" . >"$OUT/build.log" 2>&1; then
    echo "build failed; the end of build.log:"
    tail -n 60 "$OUT/build.log"
    return 1
  fi
  grep -E "\[[0-9]+/[0-9]+\]" "$OUT/build.log" | tail -n 1
  wheel=$(ls -t "$WHEELHOUSE"/samattn*.whl | head -n 1)
  echo "built $(basename "$wheel") ($(du -h "$wheel" | cut -f1)) in $(($(date +%s) - began))s"
}

install_wheel() {
  local wheel
  wheel=$(ls -t "$WHEELHOUSE"/samattn*.whl 2>/dev/null | head -n 1)
  if [[ -z $wheel ]]; then
    echo "no samattn wheel in $WHEELHOUSE: run the build stage"
    return 1
  fi
  rm -rf "$SITE"
  python3 -m pip install -q --no-index --no-deps --target "$SITE" "$wheel" || return 1
  echo "installed $(basename "$wheel")"
}

# What imports samattn runs from /tmp, so that the source tree's samattn/ (which has no
# library) does not shadow the installed one.
info() {
  cd /tmp || return 1
  {
    python3 -c 'import samattn; print("samattn imported from", samattn.__file__)' &&
      python3 -m samattn.info
  } 2>&1 | tee "$OUT/info.txt"
}

tests() {
  local paths=() path status
  for path in $TEST_PATHS; do paths+=("$REPO/$path"); done
  rm -f "$OUT/junit.xml" # a stale one would report another run's counts
  cd /tmp || return 1
  # One pytest run for both tiers, as a user runs them (tests of one tier can disturb the
  # other's); summary.txt splits the counts by tier. PYTEST_ARGS is split into words.
  # shellcheck disable=SC2086
  # A wheel linked without the glibc stubs (SAMATTN_GLIBC_COMPAT=OFF, above) needs this
  # machine's glibc by design: the test that says so would only repeat it.
  local deselect=()
  if [[ ${SAMATTN_GLIBC_COMPAT^^} == OFF ]]; then
    deselect=(--deselect tests/cpu/test_glibc_compat.py::test_the_library_needs_at_most_the_platforms_glibc)
  fi
  python3 -m pytest -c "$REPO/pyproject.toml" --rootdir "$REPO" -q -p no:cacheprovider \
    --durations=10 --junitxml="$OUT/junit.xml" "${paths[@]}" "${deselect[@]}" $PYTEST_ARGS \
    >"$OUT/tests.log" 2>&1
  status=$?
  # The slowest tests, the failures and the counts (skip reasons stay in tests.log).
  grep -v "^SKIPPED" "$OUT/tests.log" | sed -n '/slowest 10 durations/,$p' | tail -n 100
  return "$status"
}

bench() {
  local args=$BENCH_ARGS
  if (($(remaining) < 150)) && [[ $args != *--quick* ]]; then
    echo "little time left: adding --quick"
    args="$args --quick"
  fi
  cd /tmp || return 1
  # shellcheck disable=SC2086
  python3 -m samattn.bench --json "$OUT/bench.json" --plot "$OUT/bench.png" $args 2>&1 |
    tee "$OUT/bench.log"
}

# `gpu_session.sh --stage NAME` runs one stage: how run_stage puts a timeout on it.
if [[ ${1:-} == --stage ]]; then
  "$2"
  exit $?
fi

# ------------------------------------------------------------------- main ----
STAGES=",${STAGES:-build,info,tests,bench},"
SUMMARY=()
FAILED=0
NO_WHEEL=""  # why the later stages cannot run, if they cannot
LAST_STATUS=0 # of the last stage run
mkdir -p "$OUT" "$WHEELHOUSE"

# run_stage NAME CAP_SECONDS: the stage with a timeout of CAP_SECONDS or what is left.
run_stage() {
  local name=$1 cap=$2 left limit began status verdict
  [[ $STAGES == *",$name,"* ]] || return 0
  if [[ $name != build && -n $NO_WHEEL ]]; then
    SUMMARY+=("$(printf '%-6s skipped: %s' "$name" "$NO_WHEEL")")
    FAILED=1
    return 0
  fi
  left=$(remaining)
  if ((left < 20)); then
    SUMMARY+=("$(printf '%-6s skipped: out of time' "$name")")
    FAILED=1
    return 0
  fi
  limit=$((cap < left ? cap : left))
  printf '\n=== %s (at most %ds) ===\n' "$name" "$limit"
  began=$(date +%s)
  timeout --kill-after=10 "$limit" bash "$SCRIPT" --stage "$name"
  status=$?
  verdict=ok
  if ((status == 124 || status == 137)); then
    verdict="TIMED OUT after ${limit}s"
  elif ((status != 0)); then
    verdict="FAILED (exit $status)"
  fi
  ((status != 0)) && FAILED=1
  LAST_STATUS=$status
  SUMMARY+=("$(printf '%-6s %-24s %4ds' "$name" "$verdict" $(($(date +%s) - began)))")
}

echo "=== setup ==="
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
fi
# The carried wheels, installed once per set of wheels: installing them again would give
# CUTLASS's headers new times, and ninja would then compile every unit again instead of
# resuming a build that an earlier call's time limit cut off.
carried=$(sha256sum .whl/*.whl 2>/dev/null | sha256sum | cut -d' ' -f1)
if [[ $(cat "$TOOLS/.carried" 2>/dev/null) != "$carried" ]]; then
  rm -rf "$TOOLS"
  if python3 -m pip install -q --no-index --no-deps --target "$TOOLS" .whl/*.whl; then
    echo "$carried" >"$TOOLS/.carried"
  else
    echo "could not install the carried wheels from .whl/ (nvidia-cutlass, nox)"
    FAILED=1
  fi
fi
python3 -c 'import sys, torch; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, GPU: {torch.cuda.is_available()}")'

run_stage build "${BUILD_CAP_S:-420}"
if [[ $STAGES == *",build,"* && $LAST_STATUS != 0 ]]; then
  NO_WHEEL="the build failed (an older wheel in dist/ would test stale code)"
elif [[ $STAGES =~ ,(info|tests|bench), ]] && ! install_wheel; then
  NO_WHEEL="no wheel could be installed"
fi
run_stage info "${INFO_CAP_S:-60}"
run_stage tests "${TESTS_CAP_S:-300}"
run_stage bench "${BENCH_CAP_S:-300}"

# Counts per tier (a test path's first two parts: tests/cpu, tests/gpu) from junit.xml;
# a failure, an error, a missing junit.xml or a tier with nothing passed fails the script.
COUNTS=""
if [[ $STAGES == *",tests,"* ]]; then
  # TEST_PATHS is split into words on purpose.
  # shellcheck disable=SC2086
  COUNTS=$(python3 - "$OUT/junit.xml" $TEST_PATHS 2>&1 <<'EOF'
import sys
import xml.etree.ElementTree as ET
from collections import Counter

junit, paths = sys.argv[1], sys.argv[2:]
tiers = list(dict.fromkeys("/".join(path.strip("/").split("/")[:2]) for path in paths))
try:
    cases = list(ET.parse(junit).getroot().iter("testcase"))
except (OSError, ET.ParseError) as error:
    sys.exit(f"tests: no counts, pytest did not finish ({error}); see tests.log")
counts = {tier: Counter() for tier in [*tiers, "other"]}
failed = []
for case in cases:
    where = case.get("classname") or case.get("name", "")  # collection errors: no class
    tier = next((t for t in tiers if f"{where}.".startswith(t.replace("/", ".") + ".")), "other")
    outcome = next((k for k in ("failure", "error", "skipped") if case.find(k) is not None), "passed")
    counts[tier][outcome] += 1
    if outcome in ("failure", "error"):
        test = "::".join(filter(None, (case.get("classname"), case.get("name"))))
        failed.append(f"  {outcome}: {test}")
bad = bool(failed)
for tier, count in counts.items():
    if tier == "other" and not count:
        continue
    print(
        f"{tier}: {count['passed']} passed, {count['failure']} failed, {count['error']} errors, "
        f"{count['skipped']} skipped"
    )
    if not count["passed"] and tier != "other":
        print(f"  {tier}: nothing passed")
        bad = True
if len(failed) > 20:
    failed[20:] = [f"  ... and {len(failed) - 20} more"]
if failed:
    print("\n".join(failed))
sys.exit(1 if bad else 0)
EOF
  ) || FAILED=1
fi

{
  printf '\n=== summary (%ds, archs %s) ===\n' $(($(date +%s) - SESSION_START)) "$SAMATTN_CUDA_ARCHS"
  printf '%s\n' "${SUMMARY[@]}"
  [[ -n $COUNTS ]] && printf '%s\n' "$COUNTS"
  [[ -f $OUT/bench.log ]] && sed -n '/^summary:/,$p' "$OUT/bench.log"
  echo "files in \$OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
} | tee "$OUT/summary.txt"
exit $FAILED
