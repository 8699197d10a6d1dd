// The tile table of the sm90 attention family (Hopper: wgmma, TMA, warp
// specialization; sm_90a only): the only place its tiles are written (fixed
// form: see attention/flash_tiles.h). The dispatch takes the first row of the
// problem's head dim whose use allows the problem.
#pragma once

#include "attention/flash_tiles.h"
#include "common/problem.h"

namespace samattn::attention {

inline constexpr DType kSm90AttentionDTypes[] = {DType::f16, DType::bf16};

// Forward. A CTA is one producer warpgroup (TMA loads of Q, then K and V
// tiles through `stages` shared-memory buffers each) and block_m / 64
// consumer warpgroups, each owning 64 query rows: per thread the O
// accumulator takes head dim / 2 floats, S block_n / 2, P block_n / 4
// registers, within the 240 the consumers get through setmaxnreg. Shared
// memory: (block_m + 2 stages block_n) x head dim x 2 bytes, against 227 KB.
inline constexpr FlashFwdSm90Tile kSm90FwdTiles[] = {
    // head_dim, block_m, block_n, stages, use
    // 64: three consumer warpgroups (no ping-pong), 112 KB: from 4k keys per
    // query tile 7-17% faster on the H100 than 128 rows, slower below. Not
    // with ALiBi or dropout: their kernel spills with 160 registers a thread.
    {64, 192, 128, 2, TileUse::long_keys},
    // 64: 96 KB.
    {64, 128, 128, 2, TileUse::any},
    // 128: 160 KB.
    {128, 128, 128, 2, TileUse::any},
    // 256: O alone takes 128 registers; 64 keys per tile (192 KB) measured
    // 1.3-1.6x faster on the H100 than 80 (224 KB, 12-16 bytes of spill).
    {256, 128, 64, 2, TileUse::any},
};
static_assert(tiles_valid(kSm90FwdTiles));

// Backward. A CTA is one producer warpgroup (TMA loads of K and V once, then
// of each query tile's Q and dO through `stages` buffers) and block_n / 64
// consumer warpgroups, each owning 64 keys: per thread dK and dV take head
// dim / 2 floats each, S^T and dP^T block_m / 2 each. Past head dim 128 a
// tile has 64 keys and the two consumers split the work by role (one
// accumulates dV, the other dK: head dim / 2 floats per thread). The head dim
// must be the problem's padded head dim (the dQ accumulator's row width).
inline constexpr FlashBwdSm90Tile kSm90BwdTiles[] = {
    // head_dim, block_m, block_n, stages
    // 64: query tiles of 128 rows (195 KB), dV issued after dS (kLateDV):
    // 1.05-1.14x the 64-row tile on the H100 (bf16, 1k-16k, causal and not);
    // calls with dropout or a mask take the next row (bwd_tile_takes_terms).
    {64, 128, 128, 2},
    // 64: 114 KB.
    {64, 64, 128, 2},
    // 128: three Q / dO stages, 226 KB: +5-12% at 4k against two on the H100
    // (bf16, same call, two calls), -2% to +4% at 16k, even at 1k.
    {128, 64, 128, 3},
    // 256: K, V, one stage of Q and dO, dS, dQ and P^T in fp32: 217 KB.
    {256, 64, 64, 1},
};
static_assert(tiles_valid(kSm90BwdTiles));
static_assert(bwd_terms_covered(kSm90BwdTiles));

// Inference: the kvcache kernel of the sm80 family (mma.sync, cp.async),
// compiled for sm_90a so that the CTAs that split a query tile's keys form a
// thread block cluster and combine their shares through distributed shared
// memory (one launch, no workspace; sm80 runs a second kernel over fp32
// partials in global memory). The sm80 rows' tiles (kSm80FwdTiles), for the
// H100's shared memory: two K/V stages at every head dim.
inline constexpr FlashFwdTile kSm90FwdCacheTiles[] = {
    // head_dim, block_m, block_n, warps, q_in_regs, kv_stages, use
    // 20 KB
    {32, 64, 64, 4, true, 2, TileUse::kvcache},
    // 40 KB
    {64, 64, 64, 4, true, 2, TileUse::kvcache},
    // 60 KB
    {96, 64, 64, 4, false, 2, TileUse::kvcache},
    // 80 KB: two CTAs per SM up to here
    {128, 64, 64, 4, false, 2, TileUse::kvcache},
    // 120 KB
    {192, 64, 64, 4, false, 2, TileUse::kvcache},
    // 160 KB
    {256, 64, 64, 4, false, 2, TileUse::kvcache},
};
static_assert(tiles_valid(kSm90FwdCacheTiles));

}  // namespace samattn::attention
