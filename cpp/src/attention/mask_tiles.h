// The tile map of an attention mask: for each (query tile, key tile) of each
// distinct (batch, head) of the mask, whether the mask keeps none of it (the
// kernels skip the tile), keeps all of it unchanged (they read no mask there)
// or something in between (they read it element by element). Real masks are
// made of such blocks: key padding, causal or prefix masks, documents packed
// into one sequence. A pass over the mask fills the map before the attention
// kernel runs (mask_tiles.cuh); plain data here, for the host's workspace size.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "attention/attention_problem.h"

namespace samattn::attention {

enum class MaskTileClass : uint8_t {
  empty = 0,    // every element masked (a keep mask's 0, an additive -inf)
  full = 1,     // every element kept as it is (a keep mask's 1, an additive 0)
  partial = 2,  // anything else
};

// The map in a workspace: tile (query tile m, key tile n) of mask (batch,
// head) at codes[batch * batch_stride + head * head_stride + m * n_blocks +
// n]; a stride is 0 where the mask is broadcast over that dimension.
struct MaskTileMap {
  const uint8_t* codes;  // nullptr: no map, every tile read element by element
  int64_t batch_stride, head_stride;
  int n_blocks;
};

// The map's extent for tiles of block_m x block_n: one code per tile of each
// (batch, head) that the mask's strides tell apart.
struct MaskTileExtent {
  int64_t batches, heads, m_blocks, n_blocks;
  int64_t bytes() const { return batches * heads * m_blocks * n_blocks; }
};
inline MaskTileExtent mask_tile_extent(const AttnMaskView& mask, int batch, int nheads,
                                       int seqlen_q, int seqlen_k, int block_m, int block_n) {
  return {mask.batch_stride == 0 ? 1 : batch, mask.head_stride == 0 ? 1 : nheads,
          (seqlen_q + block_m - 1) / block_m, (seqlen_k + block_n - 1) / block_n};
}

// The map a masked call's workspace holds: the largest over the tile rows
// (block_m, block_n) that `takes` accepts, since the dispatch picks one of them
// only at launch. 0 without a mask and for varlen calls (fixed length only).
template <class Problem, class Rows, class Takes>
size_t mask_tile_map_bytes(const Problem& problem, const Rows& rows, Takes&& takes) {
  if (problem.terms.mask.kind == MaskKind::none || problem.cu_seqlens_q != nullptr) return 0;
  size_t bytes = 0;
  for (const auto& row : rows) {
    if (!takes(row)) continue;
    const MaskTileExtent extent =
        mask_tile_extent(problem.terms.mask, problem.batch, problem.nheads, problem.seqlen_q,
                         problem.seqlen_k, row.block_m, row.block_n);
    bytes = std::max(bytes, size_t(extent.bytes()));
  }
  return bytes;
}

// Where a map starts in a workspace whose first `bytes_before` bytes hold
// other buffers: 256-byte aligned.
inline size_t mask_tile_map_offset(size_t bytes_before) { return (bytes_before + 255) / 256 * 256; }

}  // namespace samattn::attention
