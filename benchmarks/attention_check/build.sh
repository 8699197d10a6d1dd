#!/usr/bin/env bash
# Builds .device/attn/attn_check (forward) and attn_bwd_check (backward) from
# the repo root or anywhere:
#   CUTLASS_INC=/path/to/cutlass/include bash .device/attn/build.sh
# One translation unit per forward / backward configuration (the lists must
# match Sm80FwdTiles / Sm80BwdTiles in cpp/src/attention/; a missing one is a
# link error), compiled in parallel. GENCODE overrides the targets;
# PTXAS_VERBOSE=1 prints the register / spill report.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
: "${CUTLASS_INC:?set CUTLASS_INC to the CUTLASS include directory}"
NVCC="${NVCC:-nvcc}"
GENCODE="${GENCODE:--gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_80,code=sm_90}"
JOBS="${JOBS:-16}"
build="$here/build"
mkdir -p "$build"
# Objects built for other targets or flags are stale.
stamp="$GENCODE ${PTXAS_VERBOSE:-0} $NVCC"
if [[ "$(cat "$build/stamp" 2>/dev/null)" != "$stamp" ]]; then
  rm -f "$build"/*.o
  echo "$stamp" >"$build/stamp"
fi
flags=(-O3 -std=c++17 --expt-relaxed-constexpr -I"$CUTLASS_INC" -I"$repo/cpp/src" $GENCODE)
if [[ "${PTXAS_VERBOSE:-0}" == 1 ]]; then flags+=(-Xptxas -v); fi

# head_dim block_m block_n warps q_in_regs [kv_stages] (Sm80FwdTiles and
# Sm80FwdShortKeyTiles)
configs=(
  "32 128 64 4 true"
  "64 128 64 4 true"
  "64 128 64 4 true 2"
  "96 128 64 4 false"
  "128 128 64 4 false"
  "192 64 64 4 false"
  "256 64 64 4 false"
)
# Alternatives that attn_check times next to the table's choice (bf16 only;
# must match kAltConfigs in attn_check.cu).
alt_configs=(
  "64 128 128 4 true"
  "64 128 64 4 false"
)
# Backward (must match Sm80BwdTiles in cpp/src/attention/flash_bwd_config.h):
# head_dim block_m block_n warps q_stages.
bwd_configs=(
  "32 64 128 8 2"
  "32 128 128 8 2"
  "64 64 128 8 2"
  "64 128 128 8 2"
  "96 64 64 8 2"
  "96 64 128 8 2"
  "128 64 64 8 1"
  "128 64 128 8 2"
  "192 32 64 8 1"
  "192 64 64 8 2"
  "256 32 32 4 1"
  "256 64 64 8 1"
  "256 64 64 8 2"
)
# Backward alternatives timed by attn_bwd_check (bf16; kAltConfigs there lists
# these and some of the table's own).
bwd_alt_configs=(
  "64 64 128 8 1"
  "128 128 64 8 2"
)
jobs_list=()
for dtype in f16 bf16; do
  for cfg in "${configs[@]}"; do jobs_list+=("fwd $dtype $cfg"); done
  for cfg in "${bwd_configs[@]}"; do jobs_list+=("bwd $dtype $cfg"); done
done
for cfg in "${alt_configs[@]}"; do jobs_list+=("fwd bf16 $cfg"); done
for cfg in "${bwd_alt_configs[@]}"; do jobs_list+=("bwd bf16 $cfg"); done

fwd_sources=()
bwd_sources=()
for job in "${jobs_list[@]}"; do
  # qr: q_in_regs, or the backward's q_stages; kv: the forward's K/V stages, if given
  read -r kind dtype d bm bn w qr kv <<<"$job"
  if [[ "$kind" == fwd ]]; then
    src="$build/fwd_${dtype}_d${d}_${bm}x${bn}_w${w}_q${qr}${kv:+_kv$kv}.cu"
    cat >"$src.tmp" <<CU
#include "attention/flash_fwd_launch.cuh"
template cudaError_t samattn::attention::run_flash_fwd<
    samattn::attention::FlashFwdConfig<samattn::DType::${dtype}, ${d}, ${bm}, ${bn}, ${w}, ${qr},
                                       samattn::attention::Family::sm80${kv:+, $kv}>>(
    const samattn::AttentionForwardProblem&);
CU
    fwd_sources+=("$src")
  else
    src="$build/bwd_${dtype}_d${d}_${bm}x${bn}_w${w}_s${qr}.cu"
    cat >"$src.tmp" <<CU
#include "attention/flash_bwd_launch.cuh"
template cudaError_t samattn::attention::run_flash_bwd<
    samattn::attention::FlashBwdConfig<samattn::DType::${dtype}, ${d}, ${bm}, ${bn}, ${w}, ${qr},
                                       samattn::attention::Family::sm80>>(
    const samattn::AttentionBackwardProblem&);
CU
    bwd_sources+=("$src")
  fi
  if ! cmp -s "$src.tmp" "$src"; then mv "$src.tmp" "$src"; else rm "$src.tmp"; fi
done
sources=("${fwd_sources[@]}" "${bwd_sources[@]}"
  "$repo/cpp/src/attention/sm80/flash_fwd_sm80.cu" "$repo/cpp/src/attention/sm80/flash_bwd_sm80.cu"
  "$repo/cpp/src/common/registry.cpp"
  "$here/attn_check.cu" "$here/attn_bwd_check.cu")

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
    if ! "$NVCC" "${flags[@]}" -c "$src" -o "$obj" >"$obj.log" 2>&1; then
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
obj_of() { echo "$build/$(basename "${1%.cu}").o"; }
fwd_objects=()
for src in "${fwd_sources[@]}"; do fwd_objects+=("$(obj_of "$src")"); done
bwd_objects=()
for src in "${bwd_sources[@]}"; do bwd_objects+=("$(obj_of "$src")"); done
"$NVCC" $GENCODE "${fwd_objects[@]}" "$build/flash_fwd_sm80.o" "$build/registry.o" "$build/attn_check.o" \
  -o "$here/attn_check"
"$NVCC" $GENCODE "${fwd_objects[@]}" "${bwd_objects[@]}" "$build/flash_fwd_sm80.o" "$build/registry.o" \
  "$build/flash_bwd_sm80.o" "$build/attn_bwd_check.o" -o "$here/attn_bwd_check"
echo "built $here/attn_check and $here/attn_bwd_check"
