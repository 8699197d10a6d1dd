// The pass that fills an attention mask's tile map (mask_tiles.h), and what
// the kernels ask of the map. One CTA per tile of the map reads the tile's
// elements inside the sequence lengths (coalesced; 16-byte pieces where the
// rows are aligned, four per thread between checks) and stops as soon as the
// tile is known to be partial, so that a mask with values everywhere (a
// learned bias) costs a few rows per tile.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "attention/attention_problem.h"
#include "attention/mask_tiles.h"

namespace samattn::attention {

// The codes of the key tiles of (batch, head, query tile m_block); nullptr
// where there is no map.
__host__ __device__ inline const uint8_t* mask_tile_row(const MaskTileMap& map, int batch, int head,
                                                        int m_block) {
  if (map.codes == nullptr) return nullptr;
  return map.codes + batch * map.batch_stride + head * map.head_stride +
         int64_t(m_block) * map.n_blocks;
}

// The key tile before n, from n_begin, that the mask does not leave out
// entirely (n_begin - 1: none). Key tiles run from the last down. For one
// thread (the producer's); the consumers' warps take KeyTileBits.
__device__ inline int previous_key_tile(const uint8_t* codes, int n, int n_begin) {
  for (--n;
       codes != nullptr && n >= n_begin && codes[n] == static_cast<uint8_t>(MaskTileClass::empty);
       --n) {
  }
  return n;
}

// A warp's copy of a query tile's key-tile classes, 32 key tiles at a time
// as bit masks: each lane loads one code and two ballots spread them, so that
// the consumers' key loop tests a bit where it would wait on a load per key
// tile. Every lane of the warp calls previous() with the same key tile.
struct KeyTileBits {
  int low = INT_MAX;  // the bits hold key tiles [low, low + 32)
  uint32_t empty = 0, partial = 0;

  // As previous_key_tile; codes nullptr: n - 1.
  __device__ int previous(const uint8_t* codes, int n, int n_begin) {
    --n;
    if (codes == nullptr) return n;
    for (; n >= n_begin; --n) {
      if (n < low) load(codes, n, n_begin);
      if (((empty >> (n - low)) & 1u) == 0) break;
    }
    return n;
  }
  // Whether key tile n (one previous() returned) reads its mask elements.
  __device__ bool read(const uint8_t* codes, int n) const {
    return codes == nullptr || ((partial >> (n - low)) & 1u) != 0;
  }

 private:
  // Key tiles [n - 31, n]: the loop runs down from n.
  __device__ void load(const uint8_t* codes, int n, int n_begin) {
    low = n - 31;
    const int k = low + int(threadIdx.x % 32);
    const uint8_t code = k >= n_begin ? codes[k] : static_cast<uint8_t>(MaskTileClass::empty);
    empty = __ballot_sync(0xffffffffu, code == static_cast<uint8_t>(MaskTileClass::empty));
    partial = __ballot_sync(0xffffffffu, code == static_cast<uint8_t>(MaskTileClass::partial));
  }
};

// The backward's view: the classes of one key tile's query tiles.
struct MaskTileColumn {
  const uint8_t* codes;  // query tile 0's; nullptr: no map
  int stride;            // from one query tile to the next: the map's n_blocks

  __device__ bool empty(int m) const {
    return codes != nullptr && codes[m * stride] == static_cast<uint8_t>(MaskTileClass::empty);
  }
  __device__ bool partial(int m) const {
    return codes == nullptr || codes[m * stride] == static_cast<uint8_t>(MaskTileClass::partial);
  }
  // The query tile after m, up to last, that the mask does not leave out
  // entirely (last + 1: none).
  __device__ int next(int m, int last) const {
    for (++m; m <= last && empty(m); ++m) {
    }
    return m;
  }
  // The query tile before m that is not left out (one must be).
  __device__ int previous(int m) const {
    for (--m; empty(m); --m) {
    }
    return m;
  }
  // Of the key tiles [n_begin, n_block) of query tile m, those that are not
  // left out (this column is key tile n_block's).
  __device__ int key_tiles_before(int m, int n_begin, int n_block) const {
    if (codes == nullptr) return n_block - n_begin;
    const uint8_t* row = codes - n_block + int64_t(m) * stride;
    int count = 0;
    for (int n = n_begin; n < n_block; ++n) {
      count += row[n] != static_cast<uint8_t>(MaskTileClass::empty);
    }
    return count;
  }
};
__device__ inline MaskTileColumn mask_tile_column(const MaskTileMap& map, int batch, int head,
                                                  int n_block) {
  if (map.codes == nullptr) return {nullptr, 0};
  return {map.codes + batch * map.batch_stride + head * map.head_stride + n_block, map.n_blocks};
}

// What a thread has seen of a tile.
constexpr int kSeenKept = 1, kSeenDropped = 2, kSeenChanged = 4;

__device__ inline int classify_keep(uint32_t bytes4) {
  // Some byte nonzero: a kept element; some byte zero: a dropped one.
  const bool zero_byte = ((bytes4 - 0x01010101u) & ~bytes4 & 0x80808080u) != 0;
  return (bytes4 != 0 ? kSeenKept : 0) | (zero_byte ? kSeenDropped : 0);
}
__device__ inline int classify_add(float value) {
  return value == -INFINITY ? kSeenDropped : value == 0.0f ? kSeenKept : kSeenKept | kSeenChanged;
}

// vectors: every row of the mask starts 16-byte aligned (pointer and strides),
// so that whole 16-byte pieces inside the keys are read as one load. F, the
// family whose translation units compile it: each family's copy has its own
// name (its own archs, test_binary.py).
template <Family F, int kBlockM, int kBlockN>
__global__ void __launch_bounds__(128)
    classify_mask_tiles(AttnMaskView const mask, uint8_t* codes, int seqlen_q, int seqlen_k,
                        int m_blocks, int n_blocks, int heads, bool vectors) {
  constexpr int kThreads = 128, kPiecesPerThread = 4;
  const int64_t tile = blockIdx.x;
  const int n_block = int(tile % n_blocks), m_block = int(tile / n_blocks % m_blocks);
  const int64_t mask_index = tile / n_blocks / m_blocks;
  const int head = int(mask_index % heads), batch = int(mask_index / heads);
  const int m0 = m_block * kBlockM, n0 = n_block * kBlockN;
  const int rows = min(kBlockM, seqlen_q - m0), cols = min(kBlockN, seqlen_k - n0);
  const bool additive = mask.kind == MaskKind::add_f32;
  const int piece = vectors ? (additive ? 4 : 16) : 1;  // elements per load
  const int row_pieces = kBlockN / piece;
  // Element offsets: keys are contiguous (k_stride 1).
  const int64_t first_row =
      batch * mask.batch_stride + head * mask.head_stride + int64_t(m0) * mask.q_stride + n0;
  const auto* keep = static_cast<const uint8_t*>(mask.ptr);
  const auto* add = static_cast<const float*>(mask.ptr);
  int seen = 0;
  for (int first = 0; first < rows * row_pieces; first += kThreads * kPiecesPerThread) {
#pragma unroll
    for (int i = 0; i < kPiecesPerThread; ++i) {
      const int index = first + i * kThreads + int(threadIdx.x);
      const int row = index / row_pieces, col = index % row_pieces * piece;
      if (row >= rows || col >= cols) continue;
      const int64_t at = first_row + row * mask.q_stride + col;
      if (vectors && col + piece <= cols) {
        if (additive) {
          const float4 v = *reinterpret_cast<const float4*>(add + at);
          seen |= classify_add(v.x) | classify_add(v.y) | classify_add(v.z) | classify_add(v.w);
        } else {
          const uint4 v = *reinterpret_cast<const uint4*>(keep + at);
          seen |= classify_keep(v.x) | classify_keep(v.y) | classify_keep(v.z) | classify_keep(v.w);
        }
      } else {
        for (int j = 0; j < piece && col + j < cols; ++j) {
          seen |= additive            ? classify_add(add[at + j])
                  : keep[at + j] != 0 ? kSeenKept
                                      : kSeenDropped;
        }
      }
    }
    // Known partial: stop reading (uniform over the CTA: every thread leaves or none).
    const bool partial = (seen & kSeenChanged) != 0 || (seen & (kSeenKept | kSeenDropped)) == 3;
    if (__syncthreads_or(partial)) {
      if (threadIdx.x == 0) codes[tile] = static_cast<uint8_t>(MaskTileClass::partial);
      return;
    }
  }
  const bool kept = __syncthreads_or(seen & kSeenKept);
  const bool dropped = __syncthreads_or(seen & kSeenDropped);
  if (threadIdx.x == 0) {
    const MaskTileClass c = !kept     ? MaskTileClass::empty
                            : dropped ? MaskTileClass::partial
                                      : MaskTileClass::full;
    codes[tile] = static_cast<uint8_t>(c);
  }
}

// Fills the map of tiles kBlockM x kBlockN of a fixed-length call's mask into
// `workspace` on `stream` and returns it; a map without codes where the
// workspace is smaller than the map (every tile then read element by element).
template <Family F, int kBlockM, int kBlockN>
inline MaskTileMap build_mask_tile_map(const AttnMaskView& mask, int batch, int nheads,
                                       int seqlen_q, int seqlen_k, void* workspace,
                                       size_t workspace_bytes, cudaStream_t stream,
                                       cudaError_t* error) {
  *error = cudaSuccess;
  const MaskTileExtent extent =
      mask_tile_extent(mask, batch, nheads, seqlen_q, seqlen_k, kBlockM, kBlockN);
  const int64_t tiles = extent.bytes();
  if (mask.kind == MaskKind::none || mask.ptr == nullptr || workspace == nullptr ||
      size_t(tiles) > workspace_bytes || tiles > INT32_MAX || tiles == 0) {
    return {nullptr, 0, 0, 0};
  }
  auto* codes = static_cast<uint8_t*>(workspace);
  const int64_t element_bytes = mask.kind == MaskKind::add_f32 ? 4 : 1;
  const bool vectors = reinterpret_cast<uintptr_t>(mask.ptr) % 16 == 0 &&
                       (mask.batch_stride * element_bytes) % 16 == 0 &&
                       (mask.head_stride * element_bytes) % 16 == 0 &&
                       (mask.q_stride * element_bytes) % 16 == 0;
  static_assert(kBlockN % 16 == 0, "key tiles of whole 16-byte pieces");
  classify_mask_tiles<F, kBlockM, kBlockN>
      <<<unsigned(tiles), 128, 0, stream>>>(mask, codes, seqlen_q, seqlen_k, int(extent.m_blocks),
                                            int(extent.n_blocks), int(extent.heads), vectors);
  *error = cudaGetLastError();
  const int64_t per_head = extent.m_blocks * extent.n_blocks;
  return {codes, extent.batches == 1 ? 0 : extent.heads * per_head,
          extent.heads == 1 ? 0 : per_head, int(extent.n_blocks)};
}

}  // namespace samattn::attention
