// Tile choices of the sm75 family (Turing: fp16 on mma.sync m16n8k8,
// synchronous 16-byte loads instead of cp.async), forward and backward.
// Plain types (see flash_fwd_config.h); every tag named here is instantiated
// in cpp/instantiations.cmake (SAMATTN_ATTENTION_{FWD,BWD}_SM75_CONFIGS,
// compared by tests/cpu/test_attention_build.py).
//
// Turing has 64 KB of shared memory per SM, all of which one block may take
// (opt-in 65536 dynamic bytes on 7.5), 64K registers and 1024 threads per
// SM. A synchronous load stalls the warps that issue it until the data has
// landed, so a second resident CTA is what hides the global latency: forward tiles
// stay within 32 KB where a 64-row tile allows it, and the backward keeps one
// Q / dO stage (a second one would only cost shared memory: the prefetch of
// the next query tile cannot run ahead of the warps that load it).
//
// One table per direction, the same on every GPU the family runs on (forced
// on newer GPUs it runs exactly what a T4 runs).
#pragma once

#include "attention/flash_bwd_config.h"
#include "attention/flash_fwd_config.h"

namespace samattn::attention {

// Forward. Shared memory: (kBlockM + 2 kBlockN) x head dim x 2 bytes.
// Registers per thread: O is 16-row slices x head dim / 32 floats, the score
// tile rows x kBlockN / 32, Q in registers half the O count.
template <DType T, int kHeadDim>
struct Sm75FwdTiles;
// 32 / 64: the sm80 tiles, 16 / 32 KB: two (or more) CTAs per SM.
template <DType T>
struct Sm75FwdTiles<T, 32> {
  using type = FlashFwdConfig<T, 32, 128, 64, 4, true, Family::sm75>;
};
template <DType T>
struct Sm75FwdTiles<T, 64> {
  using type = FlashFwdConfig<T, 64, 128, 64, 4, true, Family::sm75>;
};
// 96 / 128: 64x32 tiles keep 24 / 32 KB (two CTAs per SM); 4 warps of 16
// rows hold Q in registers: ~ 24 / 32 (Q) + 48 / 64 (O) + 16 (S).
template <DType T>
struct Sm75FwdTiles<T, 96> {
  using type = FlashFwdConfig<T, 96, 64, 32, 4, true, Family::sm75>;
};
template <DType T>
struct Sm75FwdTiles<T, 128> {
  using type = FlashFwdConfig<T, 128, 64, 32, 4, true, Family::sm75>;
};
// 192 / 256: the smallest 4-warp tiles, 48 / 64 KB (one CTA per SM); Q is
// re-read from shared memory (O alone is 96 / 128 registers).
template <DType T>
struct Sm75FwdTiles<T, 192> {
  using type = FlashFwdConfig<T, 192, 64, 32, 4, false, Family::sm75>;
};
template <DType T>
struct Sm75FwdTiles<T, 256> {
  using type = FlashFwdConfig<T, 256, 64, 32, 4, false, Family::sm75>;
};

// Backward. Shared memory (one Q / dO stage):
//   (2 kBlockM D + 2 kBlockN D + 2 kBlockM kBlockN) x 2 + 8 kBlockM bytes.
// Registers per thread: dK + dV 2 kBlockN D / threads for the whole query
// loop, S and dP kBlockM kBlockN / threads each. Every tile below leaves one
// CTA per SM, so its own warps are all that hide the synchronous loads: 8
// warps where the tile splits into them (4 warps of 64x64 spill), else 4.
// `type` is void where no tile fits: the dispatch then refuses the head dim.
template <DType T, int kHeadDim>
struct Sm75BwdTiles;
// 32: 128 keys per CTA (each Q / dO read serves twice the keys), 56.5 KB;
// dK + dV 32, S + dP 64 registers.
template <DType T>
struct Sm75BwdTiles<T, 32> {
  using type = FlashBwdConfig<T, 32, 64, 128, 8, 1, Family::sm75>;
};
// 64: 64x64, 48.5 KB; dK + dV 32, S + dP 32 registers.
template <DType T>
struct Sm75BwdTiles<T, 64> {
  using type = FlashBwdConfig<T, 64, 64, 64, 8, 1, Family::sm75>;
};
// 96 / 128: 32 queries x 64 keys, 44 / 56 KB; dK + dV 96 / 64 registers (a
// 96-wide row is copied by 4 threads, so 8 warps would cover 64 rows per
// pass: more than the 32-query tile).
template <DType T>
struct Sm75BwdTiles<T, 96> {
  using type = FlashBwdConfig<T, 96, 32, 64, 4, 1, Family::sm75>;
};
template <DType T>
struct Sm75BwdTiles<T, 128> {
  using type = FlashBwdConfig<T, 128, 32, 64, 8, 1, Family::sm75>;
};
// 192: 32x32 (8 warps cannot split a 32x32 score tile in 16x16 blocks),
// 52 KB; dK + dV 96 registers.
template <DType T>
struct Sm75BwdTiles<T, 192> {
  using type = FlashBwdConfig<T, 192, 32, 32, 4, 1, Family::sm75>;
};
// 256: K and V alone take 32 KB at 32 keys and Q and dO another 32 KB at 32
// queries, so the smallest tile (68 KB) exceeds 64 KB; 16-query tiles would
// leave two warps with 256 dK + dV registers each. Not supported on sm75.
template <DType T>
struct Sm75BwdTiles<T, 256> {
  using type = void;
};

}  // namespace samattn::attention
