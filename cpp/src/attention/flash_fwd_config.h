// Forward attention instantiation tags and the one table that picks a tile
// configuration per head dim. Plain types with no CuTe in them, so that the
// family dispatch names an instantiation without compiling its kernel; each
// tag is explicitly instantiated in exactly one translation unit.
#pragma once

#include "attention/attention_problem.h"

namespace samattn::attention {

using Family = ::samattn::Family;

// One forward kernel: head dim (the padded one the tiles use; smaller head
// dims run in it with predicated loads and stores), CTA tile of kBlockM
// queries x kBlockN keys, warps (each owns 16-row slices of the query tile),
// whether the Q tile stays in registers for the whole key loop (else it is
// re-read from shared memory per key tile, which frees registers for large
// head dims), the family (sm80: mma.sync m16n8k16 + cp.async; sm75 would
// be the same kernel with an m16n8k8 atom and synchronous loads) and the
// shared-memory stages of K and V (2: tiles load a whole key tile ahead;
// cp.async only).
template <DType T, int kHeadDim, int kBlockM, int kBlockN, int kWarps, bool kQInRegs, Family F,
          int kKVStages = 1>
struct FlashFwdConfig {
  static_assert(kKVStages == 1 || (kKVStages == 2 && F == Family::sm80), "1 or 2 (sm80) stages");
  // Q (reused to stage O), kKVStages K and V tiles of 16-bit elements.
  static constexpr int kSmemBytes = (kBlockM + 2 * kKVStages * kBlockN) * kHeadDim * 2;
};

// Defined in flash_fwd_launch.cuh, instantiated once per tag.
template <class Config>
cudaError_t run_flash_fwd(const AttentionForwardProblem& problem);

// Tile choices of the sm80 family. Registers bound them: per thread the O
// accumulator takes 16-row slices x head dim / 32 lanes floats, the score
// tile rows x kBlockN / 32, and Q in registers half the O count. Shared
// memory holds Q (reused to stage O), one K and one V tile:
//   (kBlockM + 2 kBlockN) x head dim x 2 bytes
// which must fit 99 KB on 8.6 / 8.9 ("small") and 163 KB on 8.0 / 227 KB on
// 9.0 ("large").
template <DType T, int kHeadDim, bool kLargeSmem>
struct Sm80FwdTiles;
// 32 rows per warp: the K/V fragments read from shared memory serve two
// 16-row slices; registers ~ 16 (Q) + 32 (O) + 64 (S).
template <DType T, bool L>
struct Sm80FwdTiles<T, 32, L> {
  using type = FlashFwdConfig<T, 32, 128, 64, 4, true, Family::sm80>;
};
// ~ 32 (Q) + 64 (O) + 64 (S) registers; 32 KB shared.
template <DType T, bool L>
struct Sm80FwdTiles<T, 64, L> {
  using type = FlashFwdConfig<T, 64, 128, 64, 4, true, Family::sm80>;
};
// From here Q is re-read from shared memory per key tile (measured faster
// on the H100 than holding it in registers: fewer registers, and 4 warps of
// 32 rows reuse each K/V fragment twice). 96 / 128: 128x64 tiles, 4 warps,
// ~ 96 / 128 (O) + 64 (S) registers; 48 / 64 KB.
template <DType T, bool L>
struct Sm80FwdTiles<T, 96, L> {
  using type = FlashFwdConfig<T, 96, 128, 64, 4, false, Family::sm80>;
};
template <DType T, bool L>
struct Sm80FwdTiles<T, 128, L> {
  using type = FlashFwdConfig<T, 128, 128, 64, 4, false, Family::sm80>;
};
// 192 / 256: 64x64 tiles, 4 warps of 16 rows: 96 / 128 (O) + 32 (S)
// registers; 72 / 96 KB, which also fits 99 KB.
template <DType T, bool L>
struct Sm80FwdTiles<T, 192, L> {
  using type = FlashFwdConfig<T, 192, 64, 64, 4, false, Family::sm80>;
};
template <DType T, bool L>
struct Sm80FwdTiles<T, 256, L> {
  using type = FlashFwdConfig<T, 256, 64, 64, 4, false, Family::sm80>;
};

// Problems with few key tiles and no mask (short_key_loop in
// flash_fwd_dispatch.h): with one K/V stage a CTA's loads have only the other
// GEMM to land in, which a short loop cannot hide. Two stages, measured on the
// H100 at d=64 (bf16, non-causal; time_variants.sh): +22% at 256 keys, +15% at
// 512, +6% at 1k, +0.5% at 2k, -4% at 8k; causal lost 2-5% at every length.
// 48 KB shared. void: the head dim keeps its one tile.
template <DType T, int kHeadDim>
struct Sm80FwdShortKeyTiles {
  using type = void;
};
template <DType T>
struct Sm80FwdShortKeyTiles<T, 64> {
  using type = FlashFwdConfig<T, 64, 128, 64, 4, true, Family::sm80, 2>;
};

}  // namespace samattn::attention
