#!/usr/bin/env bash
# Builds benchmarks/attention_check/attn_check (forward) and attn_bwd_check
# (backward) from the repo root or anywhere:
#   CUTLASS_INC=/path/to/cutlass/include bash benchmarks/attention_check/build.sh
# One translation unit per forward / backward configuration of the sm80 tile
# table (cpp/src/attention/sm80/flash_sm80_tiles.h), written by
# cpp/cmake/attention_tiles.py as for the library, plus the alternatives the
# checkers time; compiled in parallel. GENCODE overrides the targets;
# PTXAS_VERBOSE=1 prints the register / spill report.
#   FAMILY=sm90 bash benchmarks/attention_check/build.sh
# builds attn_sm90_check and attn_sm90_bwd_check instead: the checkers on the
# sm90 family (sm_90a; -DSAMATTN_CHECK_SM90), from kSm90FwdTiles,
# kSm90BwdTiles and sm90_alt_configs.
#   HEAD_DIMS=64,128 builds those head dims only (as SAMATTN_ATTENTION_HEAD_DIMS
# does for the library: the others are refused); ccache, when installed,
# launches the compiles (a rebuild after a kernel change recompiles only the
# units whose preprocessed text changed).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
: "${CUTLASS_INC:?set CUTLASS_INC to the CUTLASS include directory}"
NVCC="${NVCC:-nvcc}"
FAMILY="${FAMILY:-sm80}"
if [[ "$FAMILY" == sm90 ]]; then
  GENCODE="${GENCODE:--gencode=arch=compute_90a,code=sm_90a}"
else
  GENCODE="${GENCODE:--gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_80,code=sm_90}"
fi
JOBS="${JOBS:-16}"
build="$here/build${FAMILY#sm80}"
mkdir -p "$build"
# Objects built for other targets or flags are stale.
stamp="$GENCODE ${PTXAS_VERBOSE:-0} $NVCC ${HEAD_DIMS:-all}"
if [[ "$(cat "$build/stamp" 2>/dev/null)" != "$stamp" ]]; then
  rm -f "$build"/*.o
  echo "$stamp" >"$build/stamp"
fi
flags=(-O3 -std=c++17 --expt-relaxed-constexpr -I"$CUTLASS_INC" -I"$repo/cpp/src" -I"$repo/cpp/include"
  $GENCODE)
launcher=()
if command -v ccache >/dev/null; then launcher=(ccache); fi
# A subset of head dims: the mask CMake passes (bit d / 32), and only their units.
head_dims="${HEAD_DIMS:-}"
if [[ -n "$head_dims" ]]; then
  mask=0
  for d in ${head_dims//,/ }; do mask=$((mask | (1 << (d / 32)))); done
  flags+=(-DSAMATTN_ATTENTION_HEAD_DIM_MASK=$mask)
fi
keep_unit() { # keep_unit PATH: whether the unit's head dim (_d<N>_ in its name) is built
  [[ -z "$head_dims" ]] && return 0
  local d
  d="$(basename "$1" | sed -n 's/.*_d\([0-9]*\)_.*/\1/p')"
  [[ ",$head_dims," == *",$d,"* ]]
}
if [[ "${PTXAS_VERBOSE:-0}" == 1 ]]; then flags+=(-Xptxas -v); fi

# Alternatives that the checkers time next to the table's choice (bf16 only;
# they must match kAltConfigs in attn_check.cu / attn_bwd_check.cu). Forward:
# head_dim,block_m,block_n,warps,q_in_regs[,kv_stages]; backward:
# head_dim,block_m,block_n,warps,q_stages.
alt_configs=(
  "64,128,128,4,true"
  "64,128,64,4,false"
)
bwd_alt_configs=(
  "64,64,128,8,1"
  "128,128,64,8,2"
)
# sm90 (kAltConfigs under SAMATTN_CHECK_SM90): head_dim,block_m,block_n,stages.
# (The table's own rows need no entry here.)
sm90_alt_configs=(
  "64,128,192,2"
)
# sm90 backward (kAltConfigs of attn_bwd_check.cu under SAMATTN_CHECK_SM90):
# head_dim,block_m,block_n,stages. (Its other alternative is a row of the table.)
sm90_bwd_alt_configs=(
  "128,64,128,2"
)
alt_args=()
if [[ "$FAMILY" == sm90 ]]; then
  for cfg in "${sm90_alt_configs[@]}"; do alt_args+=(--fwd "$cfg"); done
  for cfg in "${sm90_bwd_alt_configs[@]}"; do alt_args+=(--bwd "$cfg"); done
else
  for cfg in "${alt_configs[@]}"; do alt_args+=(--fwd "$cfg"); done
  for cfg in "${bwd_alt_configs[@]}"; do alt_args+=(--bwd "$cfg"); done
fi
# One line per translation unit: "fwd|bwd PATH" (files rewritten only when
# their text changes, which keeps the objects below incremental).
fwd_sources=()
bwd_sources=()
while read -r kind src; do
  keep_unit "$src" || continue
  if [[ "$kind" == fwd ]]; then fwd_sources+=("$src"); else bwd_sources+=("$src"); fi
done < <("${PYTHON:-python3}" "$repo/cpp/cmake/attention_tiles.py" sources "$FAMILY" "$build/generated" "${alt_args[@]}")
if ((${#fwd_sources[@]} == 0)) || ((${#bwd_sources[@]} == 0)); then
  echo "attention_tiles.py listed no sources" >&2
  exit 1
fi
# The family's forward and backward entry points (the dispatch of each).
if [[ "$FAMILY" == sm90 ]]; then
  flags+=(-DSAMATTN_CHECK_SM90)
  sources=("${fwd_sources[@]}" "${bwd_sources[@]}" "$repo/cpp/src/attention/sm90/flash_sm90.cu"
    "$repo/cpp/src/attention/sm90/kvcache_append_sm90.cu"
    "$repo/cpp/src/common/registry.cpp" "$here/attn_check.cu" "$here/attn_bwd_check.cu")
else
  sources=("${fwd_sources[@]}" "${bwd_sources[@]}"
    "$repo/cpp/src/attention/sm80/flash_fwd_sm80.cu" "$repo/cpp/src/attention/sm80/flash_bwd_sm80.cu"
    "$repo/cpp/src/common/registry.cpp"
    "$here/attn_check.cu" "$here/attn_bwd_check.cu")
fi

# Each job leaves its object only on success; the checks below look for them.
objects=()
running=0
for src in "${sources[@]}"; do
  obj="$build/$(basename "${src%.*}").o"
  objects+=("$obj")
  # Incremental: skip an object newer than its source and every header.
  if [[ -f "$obj" && "$obj" -nt "$src" ]] &&
    [[ -z "$(find "$repo/cpp/src/attention" "$repo/cpp/src/common" "$repo/cpp/src/gemm/gemm_config.h" -newer "$obj" 2>/dev/null)" ]]; then
    continue
  fi
  rm -f "$obj"
  (
    if ! "${launcher[@]}" "$NVCC" "${flags[@]}" -x cu -c "$src" -o "$obj" >"$obj.log" 2>&1; then
      cat "$obj.log" >&2
      rm -f "$obj"
      exit 1
    fi
    if [[ "${PTXAS_VERBOSE:-0}" == 1 ]]; then
      grep -E "registers|spill" "$obj.log" | sed "s|^|$(basename "$src"): |" || true
    fi
  ) &
  running=$((running + 1))
  if ((running >= JOBS)); then
    wait -n || true
    running=$((running - 1))
  fi
done
wait || true
status=0
for obj in "${objects[@]}"; do
  [[ -f "$obj" ]] || { echo "failed: $obj" >&2; status=1; }
done
if ((status != 0)); then
  echo "build failed" >&2
  exit 1
fi
obj_of() { echo "$build/$(basename "${1%.*}").o"; }
fwd_objects=()
for src in "${fwd_sources[@]}"; do fwd_objects+=("$(obj_of "$src")"); done
bwd_objects=()
for src in "${bwd_sources[@]}"; do bwd_objects+=("$(obj_of "$src")"); done
if [[ "$FAMILY" == sm90 ]]; then
  "$NVCC" $GENCODE "${fwd_objects[@]}" "${bwd_objects[@]}" "$build/flash_sm90.o" \
    "$build/kvcache_append_sm90.o" "$build/registry.o" "$build/attn_check.o" \
    -o "$here/attn_sm90_check"
  "$NVCC" $GENCODE "${fwd_objects[@]}" "${bwd_objects[@]}" "$build/flash_sm90.o" \
    "$build/kvcache_append_sm90.o" "$build/registry.o" "$build/attn_bwd_check.o" \
    -o "$here/attn_sm90_bwd_check"
  echo "built $here/attn_sm90_check and $here/attn_sm90_bwd_check"
  exit 0
fi
"$NVCC" $GENCODE "${fwd_objects[@]}" "$build/flash_fwd_sm80.o" "$build/registry.o" "$build/attn_check.o" \
  -o "$here/attn_check"
"$NVCC" $GENCODE "${fwd_objects[@]}" "${bwd_objects[@]}" "$build/flash_fwd_sm80.o" "$build/registry.o" \
  "$build/flash_bwd_sm80.o" "$build/attn_bwd_check.o" -o "$here/attn_bwd_check"
echo "built $here/attn_check and $here/attn_bwd_check"
