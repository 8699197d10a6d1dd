#!/usr/bin/env bash
# A/B timing of attention kernel changes in about a minute on the GPU machine: builds
# time_variants.cu against several copies of cpp/src and times each on the issue's grid
# (bf16, sm80 family; head dims 64, 128, 256; 1k / 4k / 16k tokens; causal and not).
#
#   VARIANTS="base new" ROOT=/path/to/variants OUT=/tmp/out bash time_variants.sh
#
# ROOT/<variant>/cpp/src is a source tree (a copy of this repo's cpp/src with a change);
# an optional ROOT/<variant>/configs overrides tile configurations, e.g.
# "BWD256=256,64,64,8,2" (names FWD64 FWD128 FWD256 BWD64 BWD128 BWD256; a forward entry
# may end in the K/V stages, "FWD64=64,128,64,4,true,2"). Every variant's
# translation units compile in parallel; results go to $OUT/variants.jsonl (one JSON line
# per case, ROUNDS lines per case and variant when set: the variants take turns) and the
# register / spill report to $OUT/ptxas.txt. CUTLASS_INC defaults to
# the nvidia-cutlass wheel's headers. TIME_ARGS=--odd times head dims d - 1 instead (rows
# moved element by element).
set -u
here=$(cd "$(dirname "$0")" && pwd)
ROOT=${ROOT:?set ROOT to the folder of variant trees}
OUT=${OUT:?set OUT to the results folder}
CUTLASS_INC=${CUTLASS_INC:-$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))")}
GENCODE="-gencode=arch=compute_80,code=sm_90"
DEFAULTS="FWD64=64,128,64,4,true FWD128=128,128,64,4,false FWD256=256,64,64,4,false"
DEFAULTS+=" BWD64=64,128,128,8,2 BWD128=128,64,128,8,2 BWD256=256,64,64,8,2"
flags=(-O3 -std=c++17 --expt-relaxed-constexpr -I"$CUTLASS_INC" $GENCODE)

for variant in ${VARIANTS:?list the variants}; do
  build=/tmp/time_variants/$variant
  rm -rf "$build" && mkdir -p "$build"
  declare -A config=()
  for entry in $DEFAULTS $(cat "$ROOT/$variant/configs" 2>/dev/null); do
    config[${entry%%=*}]=${entry#*=}
  done
  for name in FWD64 FWD128 FWD256 BWD64 BWD128 BWD256; do
    echo "#define $name ${config[$name]}" >>"$build/configs.h"
    args=${config[$name]} stages=""
    if [[ $name == FWD* ]]; then direction=fwd problem=AttentionForwardProblem tag=FlashFwdConfig
    else direction=bwd problem=AttentionBackwardProblem tag=FlashBwdConfig; fi
    if [[ $name == FWD* && $args == *,*,*,*,*,* ]]; then stages=", ${args##*,}" args=${args%,*}; fi
    printf '#include "attention/flash_%s_launch.cuh"\ntemplate cudaError_t samattn::attention::run_flash_%s<samattn::attention::%s<samattn::DType::bf16, %s, samattn::attention::Family::sm80%s>>(const samattn::%s&);\n' \
      "$direction" "$direction" "$tag" "$args" "$stages" "$problem" >"$build/$name.cu"
    (nvcc "${flags[@]}" -I"$ROOT/$variant/cpp/src" -Xptxas -v -c "$build/$name.cu" -o "$build/$name.o" \
      >"$build/$name.log" 2>&1 || cat "$build/$name.log") &
  done
  unset config
  (nvcc "${flags[@]}" -I"$ROOT/$variant/cpp/src" -include "$build/configs.h" -c "$here/time_variants.cu" \
    -o "$build/main.o" >"$build/main.log" 2>&1 || cat "$build/main.log") &
done
wait
for variant in $VARIANTS; do
  build=/tmp/time_variants/$variant
  nvcc $GENCODE "$build"/*.o -o "$build/time_variants" || continue
  grep -h "spill\|Used" "$build"/*.log | paste - - | sed "s/^/$variant: /" >>"$OUT/ptxas.txt"
done
# Variants take turns, ROUNDS times, so that a drift of the clocks touches them all.
for _ in $(seq "${ROUNDS:-1}"); do
  for variant in $VARIANTS; do
    binary=/tmp/time_variants/$variant/time_variants
    # shellcheck disable=SC2086
    [[ -x $binary ]] && "$binary" "$variant" ${TIME_ARGS:-} | tee -a "$OUT/variants.jsonl"
  done
done
