// Backward attention instantiation tags and the table that picks a tile
// configuration per head dim. Plain types with no CuTe in them (see
// flash_fwd_config.h); each tag is instantiated in exactly one translation
// unit.
#pragma once

#include "attention/attention_problem.h"

namespace samattn::attention {

using Family = ::samattn::Family;

// One backward kernel: a CTA owns kBlockN keys of one (batch, head) and loops
// over kBlockM-query tiles. Shared memory holds kQStages buffers of Q and dO
// (kBlockM x head dim; with 2 the next query tile streams in during the
// whole current one), K, V (kBlockN x head dim), P and dS (kBlockM x
// kBlockN) as 16-bit elements, plus the tile's LSE and D (fp32).
template <DType T, int kHeadDim, int kBlockM, int kBlockN, int kWarps, int kQStages, Family F>
struct FlashBwdConfig {
  static constexpr int kSmemBytes =
      (2 * kQStages * kBlockM * kHeadDim + 2 * kBlockN * kHeadDim + 2 * kBlockM * kBlockN) * 2 +
      2 * kBlockM * 4;
};

// Defined in flash_bwd_launch.cuh, instantiated once per tag.
template <class Config>
cudaError_t run_flash_bwd(const AttentionBackwardProblem& problem);

// Tile choices of the sm80 family per shared-memory tier: 0 fits the 99 KB
// of 8.6 / 8.9, 1 the 163 KB of 8.0, 2 the 227 KB of 9.0; a tier without its
// own entry uses the one below. Registers bound the tiles: per thread the dK
// and dV accumulators take 2 x kBlockN x head dim / threads floats for the
// whole query loop, S and dP kBlockM x kBlockN / threads each, dQ kBlockM x
// head dim / threads (live after S and dP). Shared memory:
//   (2 stages kBlockM D + 2 kBlockN D + 2 kBlockM kBlockN) x 2 + 8 kBlockM bytes
// Measured on the H100 (benchmarks/notes/attention_bwd_h100.md): 128 keys
// per CTA with two query stages is fastest up to d = 128 (each Q / dO tile
// read serves twice the keys of 64x64), 1 CTA of 8 warps per SM.
template <DType T, int kHeadDim, int kTier>
struct Sm80BwdTiles : Sm80BwdTiles<T, kHeadDim, kTier - 1> {};
// 32: dK + dV 16 / 32 registers, S and dP 16 / 64; 97 / 113 KB.
template <DType T>
struct Sm80BwdTiles<T, 32, 0> {
  using type = FlashBwdConfig<T, 32, 64, 128, 8, 2, Family::sm80>;
};
template <DType T>
struct Sm80BwdTiles<T, 32, 1> {
  using type = FlashBwdConfig<T, 32, 128, 128, 8, 2, Family::sm80>;
};
// 64: 64x128 (97 KB) or 128x128 (161 KB): dK + dV 64, S and dP 64 registers;
// 128x128 is ~15% faster on the H100.
template <DType T>
struct Sm80BwdTiles<T, 64, 0> {
  using type = FlashBwdConfig<T, 64, 64, 128, 8, 2, Family::sm80>;
};
template <DType T>
struct Sm80BwdTiles<T, 64, 1> {
  using type = FlashBwdConfig<T, 64, 128, 128, 8, 2, Family::sm80>;
};
// 96 / 128: 64x64 (88 KB single-stage at 128) or 64x128 (129 / 161 KB):
// dK + dV 96 / 128 registers, S and dP 32 each.
template <DType T>
struct Sm80BwdTiles<T, 96, 0> {
  using type = FlashBwdConfig<T, 96, 64, 64, 8, 2, Family::sm80>;
};
template <DType T>
struct Sm80BwdTiles<T, 96, 1> {
  using type = FlashBwdConfig<T, 96, 64, 128, 8, 2, Family::sm80>;
};
template <DType T>
struct Sm80BwdTiles<T, 128, 0> {
  using type = FlashBwdConfig<T, 128, 64, 64, 8, 1, Family::sm80>;
};
template <DType T>
struct Sm80BwdTiles<T, 128, 1> {
  using type = FlashBwdConfig<T, 128, 64, 128, 8, 2, Family::sm80>;
};
// 192: dK + dV 96 registers; 80 KB with 32-query tiles, else 160 KB.
template <DType T>
struct Sm80BwdTiles<T, 192, 0> {
  using type = FlashBwdConfig<T, 192, 32, 64, 8, 1, Family::sm80>;
};
template <DType T>
struct Sm80BwdTiles<T, 192, 1> {
  using type = FlashBwdConfig<T, 192, 64, 64, 8, 2, Family::sm80>;
};
// 256: dK + dV 128 registers; 68 KB with 32x32 tiles and 4 warps, 144 KB
// single-stage, 209 KB with two query stages (9.0 only: 1-9% faster on the
// H100 than one stage since the dQ accumulation went to fragment order).
template <DType T>
struct Sm80BwdTiles<T, 256, 0> {
  using type = FlashBwdConfig<T, 256, 32, 32, 4, 1, Family::sm80>;
};
template <DType T>
struct Sm80BwdTiles<T, 256, 1> {
  using type = FlashBwdConfig<T, 256, 64, 64, 8, 1, Family::sm80>;
};
template <DType T>
struct Sm80BwdTiles<T, 256, 2> {
  using type = FlashBwdConfig<T, 256, 64, 64, 8, 2, Family::sm80>;
};

}  // namespace samattn::attention
