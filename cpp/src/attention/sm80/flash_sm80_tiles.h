// The tile table of the sm80 attention family (mma.sync m16n8k16 + cp.async;
// Ampere, Ada, and newer GPUs through PTX), forward and backward: the only
// place its tiles are written (fixed form: see attention/flash_tiles.h).
// Per head dim the dispatch takes the first row, in table order, that the
// problem may use and whose shared memory fits the device, so rows go from
// the most preferred to the fallback.
#pragma once

#include "attention/flash_tiles.h"
#include "common/problem.h"

namespace samattn::attention {

inline constexpr DType kSm80AttentionDTypes[] = {DType::f16, DType::bf16};

// Forward. Registers bound the tiles: per thread the O accumulator takes
// 16-row slices x head dim / 32 lanes floats, the score tile rows x
// kBlockN / 32, Q in registers half the O count. Shared memory holds Q
// (reused to stage O) and kv_stages K and V tiles:
//   (block_m + 2 kv_stages block_n) x head dim x 2 bytes
// and every single-stage row fits the 99 KB of 8.6 / 8.9.
inline constexpr FlashFwdTile kSm80FwdTiles[] = {
    // head_dim, block_m, block_n, warps, q_in_regs, kv_stages, use
    // 32 rows per warp: the K/V fragments read from shared memory serve two
    // 16-row slices; registers ~ 16 (Q) + 32 (O) + 64 (S).
    {32, 128, 64, 4, true, 1, TileUse::any},
    // Few key tiles and no mask: with one K/V stage a CTA's loads have only
    // the other GEMM to land in, which a short loop cannot hide. Two stages,
    // measured on the H100 at d=64 (bf16, non-causal; time_variants.sh): +22%
    // at 256 keys, +15% at 512, +6% at 1k, +0.5% at 2k, -4% at 8k; causal
    // lost 2-5% at every length. 48 KB.
    {64, 128, 64, 4, true, 2, TileUse::short_keys},
    // ~ 32 (Q) + 64 (O) + 64 (S) registers; 32 KB.
    {64, 128, 64, 4, true, 1, TileUse::any},
    // From here Q is re-read from shared memory per key tile (measured faster
    // on the H100 than holding it in registers: fewer registers, and 4 warps
    // of 32 rows reuse each K/V fragment twice). 96 / 128: ~ 96 / 128 (O) +
    // 64 (S) registers; 48 / 64 KB.
    {96, 128, 64, 4, false, 1, TileUse::any},
    {128, 128, 64, 4, false, 1, TileUse::any},
    // 192 / 256: 4 warps of 16 rows: 96 / 128 (O) + 32 (S) registers;
    // 72 / 96 KB.
    {192, 64, 64, 4, false, 1, TileUse::any},
    {256, 64, 64, 4, false, 1, TileUse::any},
    // Inference (the kvcache kernel). Decode is bound by reading the cache:
    // 64-row query tiles (a decode tile holds the query heads of one KV head,
    // seqlen_q x group rows), two K/V stages so that each CTA keeps a whole
    // key tile of loads in flight, two CTAs per SM on 9.0 up to d = 128
    // (20 / 40 / 60 / 80 KB). Single-stage rows serve GPUs with 99 KB.
    {32, 64, 64, 4, true, 2, TileUse::kvcache},
    {64, 64, 64, 4, true, 2, TileUse::kvcache},
    {96, 64, 64, 4, false, 2, TileUse::kvcache},
    {128, 64, 64, 4, false, 2, TileUse::kvcache},
    {192, 64, 64, 4, false, 2, TileUse::kvcache},
    {192, 64, 64, 4, false, 1, TileUse::kvcache},
    {256, 64, 64, 4, false, 2, TileUse::kvcache},
    {256, 64, 64, 4, false, 1, TileUse::kvcache},
};
static_assert(tiles_valid(kSm80FwdTiles));

// Backward. A CTA owns block_n keys and loops over block_m-query tiles.
// Registers bound the tiles: per thread the dK and dV accumulators take
// 2 x block_n x head dim / threads floats for the whole query loop, S and dP
// block_m x block_n / threads each, dQ block_m x head dim / threads (live
// after S and dP). Shared memory:
//   (2 q_stages block_m D + 2 block_n D + 2 block_m block_n) x 2 + 8 block_m bytes
// against 227 KB on 9.0, 163 KB on 8.0 and 99 KB on 8.6 / 8.9. Measured on
// the H100 (benchmarks/notes/attention_bwd_h100.md): 128 keys per CTA with
// two query stages is fastest up to d = 128 (each Q / dO tile read serves
// twice the keys of 64x64), 1 CTA of 8 warps per SM.
inline constexpr FlashBwdTile kSm80BwdTiles[] = {
    // head_dim, block_m, block_n, warps, q_stages
    // 32: dK + dV 32 / 16 registers, S and dP 64 / 16; 113 / 97 KB.
    {32, 128, 128, 8, 2},
    {32, 64, 128, 8, 2},
    // 64: 128x128 (161 KB) is ~15% faster on the H100 than 64x128 (97 KB):
    // dK + dV 64, S and dP 64 registers.
    {64, 128, 128, 8, 2},
    {64, 64, 128, 8, 2},
    // 96 / 128: 64x128 (129 / 161 KB) or 64x64 (88 KB single-stage at 128):
    // dK + dV 96 / 128 registers, S and dP 32 each.
    {96, 64, 128, 8, 2},
    {96, 64, 64, 8, 2},
    {128, 64, 128, 8, 2},
    {128, 64, 64, 8, 1},
    // 192: dK + dV 96 registers; 160 KB, else 80 KB with 32-query tiles.
    {192, 64, 64, 8, 2},
    {192, 32, 64, 8, 1},
    // 256: dK + dV 128 registers; 209 KB with two query stages (9.0 only:
    // 1-9% faster on the H100 than one stage), 144 KB single-stage, 68 KB
    // with 32x32 tiles and 4 warps.
    {256, 64, 64, 8, 2},
    {256, 64, 64, 8, 1},
    {256, 32, 32, 4, 1},
};
static_assert(tiles_valid(kSm80BwdTiles));
static_assert(bwd_terms_covered(kSm80BwdTiles), "a row for calls with score terms");

}  // namespace samattn::attention
