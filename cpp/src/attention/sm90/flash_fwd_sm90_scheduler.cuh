// The sm90 attention forward's tile scheduler: which output tiles (query
// tile, head, batch) a CTA of the persistent grid takes and in what order,
// and the ping-pong turns of its two consumer warpgroups.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cute/tensor.hpp>

#include "attention/mask.cuh"

namespace samattn::attention::sm90 {

// The tiles of a CTA: t = blockIdx.x, + gridDim.x, ... Paired (a persistent
// grid over causal tiles, whose work grows with the query tile): t = 2c,
// 2c + 1, then + 2 gridDim.x, where fwd_tile folds each head's query tiles
// (last, first, second last, second, ...) so that a pair's work is the same
// for every pair and a static stride spreads it evenly.
template <class Params>
__device__ inline int first_tile(const Params& p) {
  return p.paired ? 2 * int(blockIdx.x) : int(blockIdx.x);
}
template <class Params>
__device__ inline int next_tile(const Params& p, int t) {
  if (!p.paired) return t + int(gridDim.x);
  return (t & 1) ? t - 1 + 2 * int(gridDim.x) : t + 1;
}

// Tile t: query tiles fastest (the CTAs running at once share a head's K and
// V in L2), each head's longest tiles first when causal (folded when paired).
// With head_group > 1 (an attention mask shared by the heads), the heads of a
// group fastest, then the query tiles: the CTAs running at once read the same
// mask tiles, once from memory, and a group's K and V stay in L2.
struct FwdTile {
  int m_block, head, batch;
  int q_offset, k_offset, tma_batch;  // varlen: the sequence's first rows; TMA batch 0
  AttentionMask mask;                 // with the sequence's lengths
  int n_begin, n_end;                 // key tiles that some row of the tile attends
  bool valid;                         // varlen: the sequence has this query tile
};
template <class Params>
__device__ inline FwdTile fwd_tile(const Params& p, int t, int block_m, int block_n) {
  FwdTile tile{};
  const int heads = cute::get<2>(p.shape_q);
  int m;
  if (p.head_group > 1) {
    const int group = p.head_group, rest = t / group;
    m = rest % p.m_blocks;
    tile.head = rest / p.m_blocks % (heads / group) * group + t % group;
    tile.batch = rest / p.m_blocks / (heads / group);
  } else {
    m = t % p.m_blocks;
    tile.head = (t / p.m_blocks) % heads;
    tile.batch = t / (p.m_blocks * heads);
  }
  if (p.paired) {
    tile.m_block = (m & 1) ? m / 2 : p.m_blocks - 1 - m / 2;
  } else {
    tile.m_block = p.reverse_m ? p.m_blocks - 1 - m : m;
  }
  tile.mask = p.mask;
  tile.tma_batch = tile.batch;
  if (p.cu_seqlens_q != nullptr) {
    tile.q_offset = p.cu_seqlens_q[tile.batch];
    tile.k_offset = p.cu_seqlens_k[tile.batch];
    tile.mask.seqlen_q = p.cu_seqlens_q[tile.batch + 1] - tile.q_offset;
    tile.mask.seqlen_k = p.cu_seqlens_k[tile.batch + 1] - tile.k_offset;
    tile.tma_batch = 0;
  }
  tile.valid = tile.m_block * block_m < tile.mask.seqlen_q;
  tile.mask.key_tiles(tile.m_block * block_m, block_m, block_n, tile.n_begin, tile.n_end);
  return tile;
}

// Ping-pong of two consumer warpgroups: each issues its GEMMs only on its
// turn and passes the turn after issuing them, so that the tensor cores run
// one warpgroup's GEMMs while the other computes its softmax. A turn is a
// named barrier of both warpgroups (256 threads): the waiting one syncs, the
// other arrives. The first consumer warpgroup takes the first turn.
template <bool kEnabled>
struct GemmTurns {
  static constexpr uint32_t kFirstBarrier = 2;  // 1: the epilogue's
  int group;                                    // consumer warpgroup, 0 or 1
  __device__ void start() const {
    if constexpr (kEnabled) {
      if (group == 1) cutlass::arch::NamedBarrier::arrive(256, kFirstBarrier);
    }
  }
  __device__ void wait() const {
    if constexpr (kEnabled) cutlass::arch::NamedBarrier::sync(256, kFirstBarrier + group);
  }
  __device__ void pass() const {
    if constexpr (kEnabled) cutlass::arch::NamedBarrier::arrive(256, kFirstBarrier + 1 - group);
  }
};

}  // namespace samattn::attention::sm90
