// How the kvcache kernel (FlashFwdConfig's kKVCache) runs a forward: which
// problems take it, how its grid packs query heads and splits the keys, and
// the workspace that needs. Host only; shared by the family's workspace
// query, its dispatch and the launch, so that all three agree.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "attention/attention_problem.h"
#include "attention/flash_tiles.h"

namespace samattn::attention {

// Decode-shaped calls without cache features also take the kvcache kernel:
// fixed-length queries whose query heads of one KV head fit one 64-row tile
// (seqlen_q x group <= 64). The prefill kernel would run one CTA per query
// head with mostly empty 128-row tiles and no split over the keys.
constexpr int kDecodeRows = 64;

inline bool decode_shaped(const AttentionForwardProblem& p) {
  return p.cu_seqlens_q == nullptr && int64_t(p.seqlen_q) * p.kv_group <= kDecodeRows;
}

// Whether `p` runs in the kvcache kernel. Cache features need it; a
// decode-shaped call takes it when its rows allow 16-byte vectors (the only
// access the kvcache kernel has), else it stays on the prefill kernel.
// A mask or dropout (no cache features: the API refuses both) keeps a call
// on the prefill kernel, the only one compiled with them.
inline bool uses_kvcache_kernel(const AttentionForwardProblem& p) {
  return p.cache.enabled || (decode_shaped(p) && forward_vectors(p) &&
                             p.terms.mask.kind == MaskKind::none && !dropout_on(p.terms));
}

// The query heads of one KV head share a tile (one read of K and V per group)
// when the queries have a fixed length; varlen (paged prefill) packs nothing.
inline bool packs_query_heads(const AttentionForwardProblem& p) {
  return p.cu_seqlens_q == nullptr && p.kv_group > 1;
}

// Keys are split only with fixed-length queries, at most this many ways.
constexpr int kMaxSplits = 128;
// The most splits the sm90 family combines in one cluster (split_cluster.cuh):
// 16, a cluster size Hopper allows on request (non-portable), where two CTAs
// of the tile fit an SM, so that a cluster takes 8 SMs of a GPC; else the
// portable 8.
constexpr int kMaxClusterSplits = 16;
constexpr int kMaxPortableClusterSplits = 8;
inline int max_cluster_splits(int tile_smem, int max_smem_per_block) {
  return 2 * tile_smem <= max_smem_per_block ? kMaxClusterSplits : kMaxPortableClusterSplits;
}

struct KVCacheGrid {
  int group;     // query heads per tile row group: kv_group when packed, else 1
  int heads;     // grid y: KV heads when packed, else query heads
  int rows;      // query rows of one (batch, grid head): seqlen_q x group
  int m_blocks;  // query tiles per (batch, grid head)
  int n_blocks;  // key tiles of the longest sequence
  int splits;    // CTAs per query tile, each a contiguous share of its key tiles
};

// The grid of the kvcache kernel with block_m x block_n tiles. With
// num_splits = 0 the keys are split when the query tiles alone leave the
// GPU's slots (two CTAs per SM: two fit up to d = 128 on 9.0) short: the
// fewest splits whose last wave is at least 85% full, relative to the best
// count, at most one per key tile. (A 1.2-wave grid waits on its tail: on
// the H100, batch 8 x 32k keys ran 17% faster with 8 splits than with 5.)
// (Waves of one CTA per SM were tried: contiguous batch 1 x 128k gained 7%,
// but paged caches fell to 0.60-0.77 of the copy bandwidth from 0.88-1.0:
// their per-row page lookups need the second CTA to keep loads in flight.)
// Each CTA then divides the key tiles its rows actually attend (a cache's
// used length is known only on the device), so an oversized capacity costs
// empty splits, not imbalance.
inline KVCacheGrid kvcache_grid(const AttentionForwardProblem& p, int block_m, int block_n) {
  KVCacheGrid g{};
  const bool packed = packs_query_heads(p);
  g.group = packed ? p.kv_group : 1;
  g.heads = packed ? p.nheads_k : p.nheads;
  g.rows = p.seqlen_q * g.group;
  g.m_blocks = (g.rows + block_m - 1) / block_m;
  const int keys = p.cache.enabled && p.cache.capacity > 0 ? p.cache.capacity : p.seqlen_k;
  g.n_blocks = std::max(1, (keys + block_n - 1) / block_n);
  const int max_splits = p.cu_seqlens_q != nullptr ? 1 : std::min(kMaxSplits, g.n_blocks);
  const int64_t ctas = std::max<int64_t>(1, int64_t(p.batch) * g.heads * g.m_blocks);
  const int64_t slots = 2 * int64_t(std::max(p.sm_count, 1));
  if (p.num_splits >= 1) {
    g.splits = std::min(p.num_splits, max_splits);
  } else if (ctas * 5 >= slots * 4) {
    g.splits = 1;
  } else {
    auto wave_use = [&](int splits) {  // fill of the grid's waves, 1 = every slot busy
      const int64_t blocks = ctas * splits;
      const int64_t waves = (blocks + slots - 1) / slots;
      return double(blocks) / double(waves * slots);
    };
    double best = 0.0;
    for (int s = 1; s <= max_splits; ++s) best = std::max(best, wave_use(s));
    g.splits = 1;
    while (g.splits < max_splits && wave_use(g.splits) < 0.85 * best) ++g.splits;
  }
  g.splits = std::max(g.splits, 1);
  return g;
}

// Key tiles of one split's share up to which the sm90 family lowers an
// automatic split count over paged caches to fit its grid into one CTA per
// SM: their per-row page lookups want two CTAs per SM in flight over long
// shares (sm80's grid), while a short loop is bound by the launch and the
// combine.
constexpr int kMaxClusterShareTiles = 4;

// The sm90 family's grid, whose splits combine in clusters (split_cluster.cuh):
// 2 to max_cluster_splits splits over at most one CTA per SM, else splits = 0
// (sm80 runs the call). Clusters are placed GPC by GPC and fewer of them fit
// at once than CTAs: a full grid of two CTAs per SM (batch 8 x 8k keys, 4
// splits) measured 1.3-1.6x slower on the H100 than sm80's kernel and
// combine, while a grid under one CTA per SM saves the combine's launch. An
// automatic split count (num_splits = 0) whose grid is larger is lowered to
// fit: over contiguous caches as far as a cluster holds, whatever the share
// (4-22% faster on the H100 than sm80's grid of more splits, batch 1 and 8,
// 8k-128k keys: benchmarks/notes/decode_h100.md), over paged ones where each
// share stays within kMaxClusterShareTiles.
inline KVCacheGrid cluster_kvcache_grid(const AttentionForwardProblem& p, int block_m, int block_n,
                                        int tile_smem) {
  KVCacheGrid g = kvcache_grid(p, block_m, block_n);
  const int64_t tiles = int64_t(p.batch) * g.heads * g.m_blocks;  // query tiles
  const int max_splits = max_cluster_splits(tile_smem, p.max_smem_per_block);
  if (p.num_splits < 1 && tiles * g.splits > p.sm_count) {
    const bool paged = p.cache.enabled && p.cache.block_table != nullptr;
    g.splits = int(std::min<int64_t>(g.splits, p.sm_count / tiles));
    if (!paged) g.splits = std::min(g.splits, max_splits);
    if (g.splits < 1 || (paged && (g.n_blocks + g.splits - 1) / g.splits > kMaxClusterShareTiles)) {
      g.splits = 0;
    }
  }
  if (g.splits < 2 || g.splits > max_splits || tiles * g.splits > p.sm_count) g.splits = 0;
  return g;
}

// Workspace of the kvcache kernel, in 256-byte aligned pieces:
//   q rotated   (batch, seqlen_q, nheads, headdim) of q's dtype, with rotary
//   o partials  fp32 (splits, batch, nheads, seqlen_q, headdim), splits > 1
//   lse partials fp32 (splits, batch, nheads, seqlen_q), splits > 1
// The partials only where the splits combine through global memory
// (`partials`; the sm90 family combines them in a cluster).
struct KVCacheWorkspace {
  size_t q_rotated, o_partial, lse_partial, total;  // byte offsets, size
};
inline KVCacheWorkspace kvcache_workspace_layout(const AttentionForwardProblem& p,
                                                 const KVCacheGrid& g, bool partials = true) {
  auto align = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  const size_t rows = size_t(p.batch) * size_t(p.nheads) * size_t(p.seqlen_q);
  const bool rotary = p.cache.rotary_cos != nullptr && p.cache.rotary_dim > 0;
  KVCacheWorkspace w{};
  w.q_rotated = 0;
  w.o_partial = w.q_rotated + (rotary ? align(rows * size_t(p.headdim) * 2) : 0);
  const size_t splits = partials && g.splits > 1 ? size_t(g.splits) : 0;
  w.lse_partial = w.o_partial + align(splits * rows * size_t(p.headdim) * 4);
  w.total = w.lse_partial + align(splits * rows * 4);
  return w;
}

// Shared memory of a forward row of a tile table (FlashFwdConfig::kSmemBytes).
constexpr int fwd_tile_smem(const FlashFwdTile& row) {
  return (row.block_m + 2 * row.kv_stages * row.block_n) * row.head_dim * 2;
}

// The kvcache row of a tile table the dispatch takes for `p` (the first for
// its padded head dim whose shared memory fits), or nullptr.
template <size_t N>
const FlashFwdTile* kvcache_tile(const FlashFwdTile (&tiles)[N], const AttentionForwardProblem& p) {
  const int padded = padded_headdim(p.headdim);
  for (size_t i = 0; i < N; ++i) {
    if (tiles[i].use == TileUse::kvcache && tiles[i].head_dim == padded &&
        fwd_tile_smem(tiles[i]) <= p.max_smem_per_block) {
      return &tiles[i];
    }
  }
  return nullptr;
}

// Forward workspace bytes of a family whose table is `tiles` (0 unless the
// kvcache kernel rotates, or splits with `partials`).
template <size_t N>
size_t kvcache_workspace_bytes(const FlashFwdTile (&tiles)[N], const AttentionForwardProblem& p,
                               bool partials = true) {
  if (!uses_kvcache_kernel(p)) return 0;
  const FlashFwdTile* row = kvcache_tile(tiles, p);  // as run_flash_fwd_rows chooses
  if (row == nullptr) return 0;
  return kvcache_workspace_layout(p, kvcache_grid(p, row->block_m, row->block_n), partials).total;
}

}  // namespace samattn::attention
