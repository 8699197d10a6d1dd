// The tile table of the sm75 attention family (Turing: fp16 on mma.sync
// m16n8k8, synchronous 16-byte loads instead of cp.async), forward and
// backward: the only place its tiles are written (fixed form: see
// attention/flash_tiles.h). One row per head dim, the same on every GPU the
// family runs on (forced on a newer GPU it runs exactly what a T4 runs); the
// dispatch refuses a head dim without a row or whose row does not fit the
// device's shared memory.
//
// Turing has 64 KB of shared memory per SM, all of which one block may take
// (opt-in 65536 dynamic bytes on 7.5), 64K registers and 1024 threads per
// SM. A synchronous load stalls the warps that issue it until the data has
// landed, so a second resident CTA is what hides the global latency: forward
// tiles stay within 32 KB where a 64-row tile allows it, and the backward
// keeps one Q / dO stage (a second one would only cost shared memory: the
// prefetch of the next query tile cannot run ahead of the warps that load it).
#pragma once

#include "attention/flash_tiles.h"
#include "common/problem.h"

namespace samattn::attention {

// bf16 needs sm80.
inline constexpr DType kSm75AttentionDTypes[] = {DType::f16};

// Forward. Shared memory: (block_m + 2 block_n) x head dim x 2 bytes.
// Registers per thread: O is 16-row slices x head dim / 32 floats, the score
// tile rows x block_n / 32, Q in registers half the O count.
inline constexpr FlashFwdTile kSm75FwdTiles[] = {
    // head_dim, block_m, block_n, warps, q_in_regs, kv_stages, use
    // 32 / 64: the sm80 tiles, 16 / 32 KB: two (or more) CTAs per SM.
    {32, 128, 64, 4, true, 1, TileUse::any},
    {64, 128, 64, 4, true, 1, TileUse::any},
    // 96 / 128: 64x32 tiles keep 24 / 32 KB (two CTAs per SM); 4 warps of 16
    // rows hold Q in registers: ~ 24 / 32 (Q) + 48 / 64 (O) + 16 (S).
    {96, 64, 32, 4, true, 1, TileUse::any},
    {128, 64, 32, 4, true, 1, TileUse::any},
    // 192 / 256: the smallest 4-warp tiles, 48 / 64 KB (one CTA per SM); Q is
    // re-read from shared memory (O alone is 96 / 128 registers).
    {192, 64, 32, 4, false, 1, TileUse::any},
    {256, 64, 32, 4, false, 1, TileUse::any},
    // Inference (the kvcache kernel): 64-row query tiles, within 64 KB.
    {32, 64, 64, 4, true, 1, TileUse::kvcache},
    {64, 64, 64, 4, true, 1, TileUse::kvcache},
    {96, 64, 64, 4, true, 1, TileUse::kvcache},
    {128, 64, 64, 4, true, 1, TileUse::kvcache},
    {192, 64, 32, 4, false, 1, TileUse::kvcache},
    {256, 64, 32, 4, false, 1, TileUse::kvcache},
};
static_assert(tiles_valid(kSm75FwdTiles));

// Backward. Shared memory (one Q / dO stage):
//   (2 block_m D + 2 block_n D + 2 block_m block_n) x 2 + 8 block_m bytes.
// Registers per thread: dK + dV 2 block_n D / threads for the whole query
// loop, S and dP block_m block_n / threads each. Every tile below leaves one
// CTA per SM, so its own warps are all that hide the synchronous loads: 8
// warps where the tile splits into them (4 warps of 64x64 spill), else 4.
// No row for 256: K and V alone take 32 KB at 32 keys and Q and dO another
// 32 KB at 32 queries, so the smallest tile (68 KB) exceeds 64 KB, and
// 16-query tiles would leave two warps with 256 dK + dV registers each.
inline constexpr FlashBwdTile kSm75BwdTiles[] = {
    // head_dim, block_m, block_n, warps, q_stages
    // 32: 128 keys per CTA (each Q / dO read serves twice the keys), 56.5 KB;
    // dK + dV 32, S + dP 64 registers.
    {32, 64, 128, 8, 1},
    // 64: 64x64, 48.5 KB; dK + dV 32, S + dP 32 registers.
    {64, 64, 64, 8, 1},
    // 96 / 128: 32 queries x 64 keys, 44 / 56 KB; dK + dV 96 / 64 registers
    // (a 96-wide row is copied by 4 threads, so 8 warps would cover 64 rows
    // per pass: more than the 32-query tile).
    {96, 32, 64, 4, 1},
    {128, 32, 64, 8, 1},
    // 192: 32x32 (8 warps cannot split a 32x32 score tile in 16x16 blocks),
    // 52 KB; dK + dV 96 registers.
    {192, 32, 32, 4, 1},
};
static_assert(tiles_valid(kSm75BwdTiles));
static_assert(bwd_terms_covered(kSm75BwdTiles), "a row for calls with score terms");

}  // namespace samattn::attention
