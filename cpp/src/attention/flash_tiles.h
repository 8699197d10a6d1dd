// The row types of the attention tile tables. Each family writes its tiles
// once, as constexpr arrays of these rows in
// cpp/src/attention/<family>/flash_<family>_tiles.h; the dispatch
// (flash_fwd_dispatch.h, flash_bwd_dispatch.h) selects from those arrays, and
// the build reads the same arrays through cpp/cmake/attention_tiles.py to
// write one translation unit per (dtype, row). Plain data, no CUDA.
//
// The build parses the arrays as text, so a table keeps a fixed form:
//   inline constexpr FlashFwdTile k<Family>FwdTiles[] = {
//       {head_dim, block_m, block_n, warps, q_in_regs, kv_stages, TileUse::...},
//   };
//   inline constexpr FlashBwdTile k<Family>BwdTiles[] = {
//       {head_dim, block_m, block_n, warps, q_stages},
//   };
//   inline constexpr DType k<Family>AttentionDTypes[] = {DType::..., ...};
// one row per line, comments on their own lines; anything else inside an
// array is an error at configure time.
#pragma once

#include <cstddef>

#include "common/types.h"

namespace samattn::attention {

// When the dispatch may pick a row, besides its head dim and its shared
// memory fitting the device.
enum class TileUse {
  any,
  // only for a short, unmasked key loop (short_key_loop in flash_fwd_dispatch.h)
  short_keys,
  // the inference kernel (FlashFwdConfig's kKVCache): KV caches, paged K/V,
  // split keys, query heads of a KV head packed into one tile; used for those
  // features and for decode-shaped calls (uses_kvcache_kernel)
  kvcache,
  // sm90 rows only: for long key loops without ALiBi or dropout (long_key_loop
  // in sm90/flash_sm90.cu)
  long_keys,
};

// One forward kernel (FlashFwdConfig's parameters, flash_fwd_config.h).
struct FlashFwdTile {
  int head_dim;  // padded head dim (32, 64, 96, 128, 192, 256)
  int block_m, block_n, warps;
  bool q_in_regs;
  int kv_stages;  // 1, or 2 (cp.async only)
  TileUse use;
};

// One backward kernel (FlashBwdConfig's parameters, flash_bwd_config.h).
struct FlashBwdTile {
  int head_dim;
  int block_m, block_n, warps;
  int q_stages;
};

// One forward kernel of the sm90 family (FlashFwdSm90Config's parameters,
// sm90/flash_fwd_sm90_config.h): block_m query rows (64 per consumer
// warpgroup) x block_n keys, K and V in `stages` shared-memory buffers each.
struct FlashFwdSm90Tile {
  int head_dim;
  int block_m, block_n;
  int stages;
  TileUse use;  // any, or long_keys
};

// One backward kernel of the sm90 family (FlashBwdSm90Config's parameters,
// sm90/flash_bwd_sm90_config.h): a CTA of block_n keys (64 per consumer
// warpgroup) walks query tiles of block_m rows, Q and dO in `stages`
// shared-memory buffers each.
struct FlashBwdSm90Tile {
  int head_dim;
  int block_m, block_n;
  int stages;
};

// Whether a backward row also runs calls with score terms (ALiBi, a mask):
// its kTerms kernel needs registers for them next to S and dP. With 64 of
// each per thread (a 128 x 128 tile over 8 warps) the d = 64 kernel spilled
// 424 bytes where the plain one spills none; those calls take the next row.
constexpr bool bwd_tile_takes_terms(const FlashBwdTile& row) {
  return row.block_m * row.block_n / (32 * row.warps) <= 32;
}

// Whether an sm90 backward row also runs calls with dropout or an attention
// mask (its computed and masked kernels; ALiBi is in all three): with query
// tiles of 128 rows S^T and dP^T take 64 registers each per consumer thread,
// and at d = 64 those kernels spilled 88 (mask) and 348 (dropout) bytes where
// the plain one spills 20; those calls take the next row.
constexpr bool bwd_tile_takes_terms(const FlashBwdSm90Tile& row) {
  return row.block_m * 64 / 128 <= 32;
}

// Every head dim of a backward table has a row that takes score terms.
template <class Row, size_t N>
constexpr bool bwd_terms_covered(const Row (&rows)[N]) {
  for (size_t i = 0; i < N; ++i) {
    bool covered = false;
    for (size_t j = 0; j < N; ++j) {
      covered = covered || (rows[j].head_dim == rows[i].head_dim && bwd_tile_takes_terms(rows[j]));
    }
    if (!covered) return false;
  }
  return true;
}

// Whether a family's dtype list (k<Family>AttentionDTypes) has T.
template <DType T, size_t N>
constexpr bool dtype_listed(const DType (&dtypes)[N]) {
  for (size_t i = 0; i < N; ++i) {
    if (dtypes[i] == T) return true;
  }
  return false;
}

constexpr bool tile_head_dim_known(int head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 192 ||
         head_dim == 256;
}

constexpr bool same_tile(const FlashFwdTile& a, const FlashFwdTile& b) {
  return a.head_dim == b.head_dim && a.block_m == b.block_m && a.block_n == b.block_n &&
         a.warps == b.warps && a.q_in_regs == b.q_in_regs && a.kv_stages == b.kv_stages &&
         (a.use == TileUse::kvcache) == (b.use == TileUse::kvcache);
}
constexpr bool same_tile(const FlashFwdSm90Tile& a, const FlashFwdSm90Tile& b) {
  return a.head_dim == b.head_dim && a.block_m == b.block_m && a.block_n == b.block_n &&
         a.stages == b.stages;
}
constexpr bool same_tile(const FlashBwdSm90Tile& a, const FlashBwdSm90Tile& b) {
  return a.head_dim == b.head_dim && a.block_m == b.block_m && a.block_n == b.block_n &&
         a.stages == b.stages;
}
constexpr bool same_tile(const FlashBwdTile& a, const FlashBwdTile& b) {
  return a.head_dim == b.head_dim && a.block_m == b.block_m && a.block_n == b.block_n &&
         a.warps == b.warps && a.q_stages == b.q_stages;
}

// Every row names a known head dim and no kernel twice (each row is one
// explicit instantiation).
template <class Row, size_t N>
constexpr bool tiles_valid(const Row (&rows)[N]) {
  for (size_t i = 0; i < N; ++i) {
    if (!tile_head_dim_known(rows[i].head_dim)) return false;
    for (size_t j = 0; j < i; ++j) {
      if (same_tile(rows[i], rows[j])) return false;
    }
  }
  return true;
}

}  // namespace samattn::attention
