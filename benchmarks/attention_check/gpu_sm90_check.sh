#!/usr/bin/env bash
# One call on a Hopper GPU machine (the device tool): build the sm90 checkers,
# run the backward checker (every case checked, then the timing grid), and time
# torch's SDPA backends on the same grid, so that the ratios come from one
# machine and one run. Run from the repository root with $OUT set; .whl/ holds
# the nvidia-cutlass wheel (the machine has no network; carry .whl).
#
#   HEAD_DIMS=64,128 bash benchmarks/attention_check/gpu_sm90_check.sh
#
# Environment: HEAD_DIMS (default 64,128,256), CHECKERS (default "bwd"; "fwd bwd"
# runs the forward checker too), SDPA (default 1: time SDPA), SANITIZE (default
# 0; 1: compute-sanitizer memcheck and racecheck on the backward checker's
# cases, no timing). Files in $OUT: build.log, bwd.json / bwd.log, fwd.json /
# fwd.log, sdpa.json / sdpa.log, sanitize_*.log.
set -u -o pipefail
OUT=${OUT:?set OUT}
HEAD_DIMS=${HEAD_DIMS:-64,128,256}
CHECKERS=${CHECKERS:-bwd}
here=benchmarks/attention_check
export PATH=/usr/local/cuda/bin:$PATH
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/nvidia_cutlass-*.whl ||
  exit 1
export CUTLASS_INC=/tmp/site/cutlass_library/source/include
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
start=$(date +%s)
if ! FAMILY=sm90 HEAD_DIMS=$HEAD_DIMS JOBS=$(nproc) PTXAS_VERBOSE=1 bash $here/build.sh >"$OUT/build.log" 2>&1; then
  tail -n 40 "$OUT/build.log"
  exit 1
fi
echo "build: $(($(date +%s) - start)) s"
export CHECK_DIMS=$HEAD_DIMS
if [[ "${SANITIZE:-0}" == 1 ]]; then
  compute-sanitizer --tool memcheck $here/attn_sm90_bwd_check "$OUT/san.json" --no-timing \
    >"$OUT/sanitize_memcheck.log" 2>&1
  tail -n 3 "$OUT/sanitize_memcheck.log"
  compute-sanitizer --tool racecheck $here/attn_sm90_bwd_check "$OUT/san.json" --no-timing \
    >"$OUT/sanitize_racecheck.log" 2>&1
  tail -n 3 "$OUT/sanitize_racecheck.log"
fi
for checker in $CHECKERS; do
  binary=$here/attn_sm90_check
  [[ $checker == bwd ]] && binary=$here/attn_sm90_bwd_check
  timeout 300 "$binary" "$OUT/$checker.json" >"$OUT/$checker.log" 2>&1
  echo "$checker checker: exit $?"
  grep -c '^PASS' "$OUT/$checker.log" | sed 's/^/  passed: /'
  grep -E '^FAIL' "$OUT/$checker.log" | head -n 20
done
if [[ "${SDPA:-1}" == 1 ]]; then
  timeout 200 python3 $here/sdpa_times.py "$OUT/sdpa.json" --dims "$HEAD_DIMS" >"$OUT/sdpa.log" 2>&1
fi
for checker in $CHECKERS; do
  echo "== $checker timings"
  sed -n '/TFLOPS/,$p' "$OUT/$checker.log"
done
[[ -f "$OUT/sdpa.log" ]] && cat "$OUT/sdpa.log"
