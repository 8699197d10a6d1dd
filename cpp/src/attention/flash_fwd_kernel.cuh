// FlashAttention-2 forward for the mma.sync families, in CuTe.
//
// One CTA computes a kBlockM-row tile of O for one (batch, head):
//   load Q once (to registers, or kept in shared memory for large head dims);
//   for each key tile that some row attends, last to first:
//     S = Q K^T (fp32), softcap, mask where the tile needs it,
//     online softmax (running max/sum, O rescaled), P = S as 16-bit
//     (with dropout the dropped elements zeroed: dropout.cuh),
//     O += P V;
//   O /= row sums, LSE, O staged through shared memory to 16-byte stores.
// With an attention mask, the mask's tile map (mask_tiles.h) marks the key
// tiles to skip (neither loaded nor computed; the loop still passes their
// barriers, so the pipeline's stages stay fixed) and those that read no mask.
// K and V have kKVStages shared buffers each. With one, their loads overlap
// the other GEMM: V(n) streams in during S = Q K(n)^T, K(n-1) during
// O += P V(n). With two, each load has a whole key tile to land in (for
// short key loops, where little else hides the latency).
// Every global access is predicated on the sequence ends and the head dim;
// out-of-range elements are zero-filled, so any seqlen and any head dim up to
// kHeadDim is exact. Rows move as 16-byte vectors when every row starts on a
// 16-byte boundary, else element by element (GmemAccess). The kvcache kernel
// for fp8 caches (kFp8Cache) widens each K and V tile in shared memory where
// it lands (fp8_cache.cuh) and applies the scales to S and O.
#pragma once

#include <cute/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention/dropout.cuh"
#include "attention/fp8_cache.cuh"
#include "attention/fragment_layout.cuh"
#include "attention/mask.cuh"
#include "attention/mask_tiles.cuh"
#include "attention/score_terms.cuh"
#include "attention/softmax_online.cuh"
#include "attention/split_cluster.cuh"

namespace samattn::attention {

// Kernel arguments: element strides, the window already normalized.
struct FlashFwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // nullptr: not written
  int64_t q_batch, q_seq, q_head;
  int64_t k_batch, k_seq, k_head;
  int64_t v_batch, v_seq, v_head;
  int64_t o_batch, o_seq, o_head;
  int64_t lse_batch, lse_seq, lse_head;
  const int32_t* cu_seqlens_q;  // nullptr: fixed length
  const int32_t* cu_seqlens_k;
  int seqlen_q, seqlen_k;  // fixed length: the lengths; varlen: unused
  int headdim;
  int kv_group;  // query heads per KV head
  int window_left, window_right;
  float scale_log2;   // log2(e) * softmax_scale, or log2(e) with softcap
  float softcap;      // 0: off
  float softcap_pre;  // softmax_scale / softcap
  // Read by the kernels compiled with kTerms only (score_terms.cuh).
  ScoreTermsParams terms;
  const float* sinks;      // nullptr: none
  MaskTileMap mask_tiles;  // the masked kernel's: key tiles it skips or reads no mask in

  // The kvcache kernel only (FlashFwdConfig's kKVCache; see KVCacheView).
  // Grid (m tiles x splits, heads or KV heads, batch). Query row R of a
  // (batch, grid head) is query R / group of head grid head x group + R % group.
  int nheads;
  int group;           // query heads packed per KV head (1: not packed)
  int num_splits;      // > 1: results go to the partials, combined after
  float* o_partial;    // fp32 (splits, batch, nheads, seqlen_q, headdim)
  float* lse_partial;  // fp32 (splits, batch, nheads, seqlen_q)
  const int32_t* seqused_k;
  const int32_t* leftpad_k;
  const int32_t* kv_batch_idx;
  const int32_t* block_table;
  int64_t block_table_stride;
  int page_size;  // 0: not paged
  int kv_cache_batch, capacity, seqlen_new;
  // fp8 caches (the kFp8Cache kernels; Fp8CacheView): kFp8E4M3 or kFp8E5M2,
  // and the scales (per KV head at h * kv_scale_head; null: the values).
  int kv_fp8;
  const float* k_scale;
  const float* v_scale;
  int64_t kv_scale_head;
  float k_scale_value, v_scale_value;
};

// How a tile's rows move between global and shared memory. 16-byte vectors
// need every row of every tensor on a 16-byte boundary, which a head dim that
// is not a multiple of 8 (or a view with odd strides) breaks; those move
// element by element (8 loads in flight per thread), columns at or past the
// head dim zero-filled. The host picks per call (forward_vectors,
// backward_vectors) and launches the kernel compiled for that choice.
struct GmemAccess {
  bool vectors;
  int cols;  // the head dim
};

// Global -> shared copy of a (rows, head dim) tile g -> s, zero-filling rows
// at or beyond rows_left and columns past the head dim. With vectors the
// copy is tiled_copy's; coords and col_ok are its partition of the tile's
// coordinates (CPY, CPY_ROWS, CPY_COLS) and their head-dim predicates (CPY_COLS).
template <bool kAsync, class TiledCopy, class GTile, class STile, class Coords, class ColOk>
__device__ inline void load_tile(TiledCopy const& tiled_copy, GTile const& g, STile&& s,
                                 Coords const& coords, ColOk const& col_ok, int rows_left,
                                 GmemAccess access) {
  using namespace cute;
  if (!access.vectors) {
    using T = typename std::decay_t<STile>::value_type;
    constexpr int kCols = decltype(size<1>(g))::value;
    constexpr int kThreads = TiledCopy::TiledNumThr::value;
    static_assert(decltype(size(g))::value % kThreads == 0, "whole passes over the tile");
#pragma unroll 8
    for (int k = 0; k < decltype(size(g))::value / kThreads; ++k) {
      const int i = k * kThreads + int(threadIdx.x), r = i / kCols, c = i % kCols;
      s(r, c) = r < rows_left && c < access.cols ? static_cast<T>(g(r, c)) : T(0);
    }
    return;
  }
  auto thr = tiled_copy.get_slice(threadIdx.x);
  Tensor src = thr.partition_S(g);
  Tensor dst = thr.partition_D(s);
  CUTE_UNROLL
  for (int i = 0; i < size<1>(dst); ++i) {
    const bool row_ok = get<0>(coords(0, i, 0)) < rows_left;
    CUTE_UNROLL
    for (int j = 0; j < size<2>(dst); ++j) {
      const bool ok = row_ok && col_ok(j);
      if constexpr (kAsync) {
        copy(tiled_copy.with(ok), src(_, i, j), dst(_, i, j));
      } else if (ok) {
        copy(tiled_copy, src(_, i, j), dst(_, i, j));
      } else {
        clear(dst(_, i, j));
      }
    }
  }
}

// Shared -> global copy of the in-range part of a (rows, head dim) tile s -> g
// (arguments as load_tile's).
template <class TiledCopy, class STile, class GTile, class Coords, class ColOk>
__device__ inline void store_tile(TiledCopy const& tiled_copy, STile const& s, GTile&& g,
                                  Coords const& coords, ColOk const& col_ok, int rows_left,
                                  GmemAccess access) {
  using namespace cute;
  if (!access.vectors) {
    constexpr int kCols = decltype(size<1>(g))::value;
    constexpr int kThreads = TiledCopy::TiledNumThr::value;
    static_assert(decltype(size(g))::value % kThreads == 0, "whole passes over the tile");
#pragma unroll 8
    for (int k = 0; k < decltype(size(g))::value / kThreads; ++k) {
      const int i = k * kThreads + int(threadIdx.x), r = i / kCols, c = i % kCols;
      if (r < rows_left && c < access.cols) g(r, c) = s(r, c);
    }
    return;
  }
  auto thr = tiled_copy.get_slice(threadIdx.x);
  Tensor src = thr.partition_S(s);
  Tensor dst = thr.partition_D(g);
  CUTE_UNROLL
  for (int i = 0; i < size<1>(src); ++i) {
    if (get<0>(coords(0, i, 0)) < rows_left) {
      CUTE_UNROLL
      for (int j = 0; j < size<2>(src); ++j) {
        if (col_ok(j)) copy(tiled_copy, src(_, i, j), dst(_, i, j));
      }
    }
  }
}

// Global -> shared copy of a (rows, head dim) tile whose rows lie anywhere:
// row r < rows_left starts at row_ptr(r) (paged caches, packed query heads).
// 16-byte vectors only; `chunk` is the layout of one vector of tiled_copy's
// source partition; other arguments as load_tile's.
template <bool kAsync, class TiledCopy, class Chunk, class RowPtr, class STile, class Coords,
          class ColOk>
__device__ inline void load_rows(TiledCopy const& tiled_copy, Chunk const& chunk,
                                 RowPtr const& row_ptr, STile&& s, Coords const& coords,
                                 ColOk const& col_ok, int rows_left) {
  using namespace cute;
  Tensor dst = tiled_copy.get_slice(threadIdx.x).partition_D(s);
  CUTE_UNROLL
  for (int i = 0; i < size<1>(dst); ++i) {
    const int row = get<0>(coords(0, i, 0));
    const bool row_ok = row < rows_left;
    const auto* base = row_ptr(row_ok ? row : 0);  // row 0 exists: rows_left > 0
    CUTE_UNROLL
    for (int j = 0; j < size<2>(dst); ++j) {
      const bool ok = row_ok && col_ok(j);
      Tensor src = make_tensor(make_gmem_ptr(base + get<1>(coords(0, i, j))), chunk);
      if constexpr (kAsync) {
        copy(tiled_copy.with(ok), src, dst(_, i, j));
      } else if (ok) {
        copy(tiled_copy, src, dst(_, i, j));
      } else {
        clear(dst(_, i, j));
      }
    }
  }
}

// Shared -> global copy of the in-range rows of a tile s to rows anywhere
// (row r at row_ptr(r)); arguments as load_rows'.
template <class TiledCopy, class Chunk, class STile, class RowPtr, class Coords, class ColOk>
__device__ inline void store_rows(TiledCopy const& tiled_copy, Chunk const& chunk, STile const& s,
                                  RowPtr const& row_ptr, Coords const& coords, ColOk const& col_ok,
                                  int rows_left) {
  using namespace cute;
  Tensor src = tiled_copy.get_slice(threadIdx.x).partition_S(s);
  CUTE_UNROLL
  for (int i = 0; i < size<1>(src); ++i) {
    const int row = get<0>(coords(0, i, 0));
    if (row < rows_left) {
      auto* base = row_ptr(row);
      CUTE_UNROLL
      for (int j = 0; j < size<2>(src); ++j) {
        if (col_ok(j)) {
          Tensor dst = make_tensor(make_gmem_ptr(base + get<1>(coords(0, i, j))), chunk);
          copy(tiled_copy, src(_, i, j), dst);
        }
      }
    }
  }
}

// Zeros to the in-range part of a (rows, head dim) tile g (arguments as
// store_tile's).
template <class TiledCopy, class GTile, class Coords, class ColOk>
__device__ inline void store_zero_tile(TiledCopy const& tiled_copy, GTile&& g, Coords const& coords,
                                       ColOk const& col_ok, int rows_left, GmemAccess access) {
  using namespace cute;
  using T = typename std::decay_t<GTile>::value_type;
  if (!access.vectors) {
    constexpr int kCols = decltype(size<1>(g))::value;
#pragma unroll 1
    for (int i = threadIdx.x; i < decltype(size(g))::value; i += blockDim.x) {
      const int r = i / kCols, c = i % kCols;
      if (r < rows_left && c < access.cols) g(r, c) = T(0);
    }
    return;
  }
  Tensor dst = tiled_copy.get_slice(threadIdx.x).partition_D(g);
  Tensor zeros = make_fragment_like(dst(_, 0, 0));
  clear(zeros);
  CUTE_UNROLL
  for (int i = 0; i < size<1>(dst); ++i) {
    if (get<0>(coords(0, i, 0)) < rows_left) {
      CUTE_UNROLL
      for (int j = 0; j < size<2>(dst); ++j) {
        if (col_ok(j)) copy(tiled_copy, zeros, dst(_, i, j));
      }
    }
  }
}

// acc += A B over the K mode of the fragments. B, and A unless it is already
// in registers, is read from shared memory one copy slice ahead of the MMAs.
// A copy slice (one ldmatrix.x4 per 16x16 block) may hold several MMA
// k-slices: two with the m16n8k8 atoms of sm75, whose K tile of 16 is two
// atoms deep. The views' K mode counts copy slices, the fragments' MMA ones.
template <bool kAInRegisters, class TiledMma, class Acc, class FragA, class SmemA, class ViewA,
          class CopyA, class FragB, class SmemB, class ViewB, class CopyB>
__device__ inline void gemm_from_smem(TiledMma& tiled_mma, Acc& acc, FragA& frag_a,
                                      SmemA const& smem_a, ViewA& view_a, CopyA const& copy_a,
                                      FragB& frag_b, SmemB const& smem_b, ViewB& view_b,
                                      CopyB const& copy_b) {
  using namespace cute;
  constexpr int kSlices = decltype(size<2>(frag_a))::value;
  static_assert(kSlices == decltype(size<2>(frag_b))::value, "A and B disagree on K");
  constexpr int kCopySlices = decltype(size<2>(view_b))::value;
  static_assert(kSlices % kCopySlices == 0, "a copy slice holds whole MMA k-slices");
  static_assert(kAInRegisters || decltype(size<2>(view_a))::value == kCopySlices,
                "A and B copies disagree on K");
  constexpr int kPerCopy = kSlices / kCopySlices;
  if constexpr (!kAInRegisters) copy(copy_a, smem_a(_, _, 0), view_a(_, _, 0));
  copy(copy_b, smem_b(_, _, 0), view_b(_, _, 0));
  CUTE_UNROLL
  for (int k = 0; k < kCopySlices; ++k) {
    if (k + 1 < kCopySlices) {
      if constexpr (!kAInRegisters) copy(copy_a, smem_a(_, _, k + 1), view_a(_, _, k + 1));
      copy(copy_b, smem_b(_, _, k + 1), view_b(_, _, k + 1));
    }
    CUTE_UNROLL
    for (int j = 0; j < kPerCopy; ++j) {
      cute::gemm(tiled_mma, frag_a(_, _, k * kPerCopy + j), frag_b(_, _, k * kPerCopy + j), acc);
    }
  }
}

// kVectors: the host's GmemAccess choice, a template parameter so
// that the vector kernel carries no element-by-element code (which costs its
// register allocation several percent at some tile sizes). kTerms: the
// kernel reads ALiBi slopes and sinks, and with TermsKernel::masked a mask
// too (score_terms.cuh); separate kernels, so that calls without them run
// code that never carries them (vectors only: the host declines the others).
template <class Traits, bool kVectors, TermsKernel kTermsKernel = TermsKernel::none>
__global__ void __launch_bounds__(Traits::kThreads, 1) flash_fwd_kernel(FlashFwdParams const p) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr bool kAsync = Traits::kAsyncCopy;

  constexpr bool kKVCache = Traits::kKVCache;
  static_assert(!kKVCache || kVectors, "the kvcache kernel moves 16-byte vectors only");
  constexpr bool kFp8 = Traits::kFp8Cache;
  constexpr bool kTerms = kTermsKernel != TermsKernel::none;
  constexpr bool kMask = kTermsKernel == TermsKernel::masked;
  static_assert(!kTerms || kVectors, "score terms run on 16-byte vectors only");
  static_assert(!kMask || !kKVCache, "masks run in the prefill kernel (uses_kvcache_kernel)");
  // The sm90 family's kvcache kernel: its key splits are one cluster
  // (split_cluster.cuh), launched with the cluster dimension num_splits.
  constexpr bool kClusterCombine = kKVCache && Traits::Config::kFamily == Family::sm90;
  using Share = ClusterShare<kBlockM, kHeadDim>;
  static_assert(!kClusterCombine || sizeof(Share) <= Traits::kSmemBytes, "the share fits");

  // Causal and windowed CTAs with high m_block have the most key tiles:
  // launch them first so that the tail of the grid is short. The kvcache
  // grid interleaves each query tile's key splits.
  const int num_splits = kKVCache ? p.num_splits : 1;
  const int m_block = kKVCache ? int(blockIdx.x) / num_splits : int(gridDim.x - 1 - blockIdx.x);
  const int split = kKVCache ? int(blockIdx.x) % num_splits : 0;
  const int group = kKVCache ? p.group : 1;  // query heads per KV head in this tile
  const int head0 = blockIdx.y * group;      // the tile's first query head
  const int head = head0;                    // (not packed: the only one)
  const int batch = blockIdx.z;
  const int kv_head = head0 / p.kv_group;
  // fp8 caches: S and O times the KV head's scales (and the widening's factor).
  float k_scale = 1.0f, v_scale = 1.0f;
  if constexpr (kFp8) {
    const int64_t at = int64_t(kv_head) * p.kv_scale_head;
    const float widen = fp8_widen_factor(p.kv_fp8);
    k_scale = (p.k_scale != nullptr ? p.k_scale[at] : p.k_scale_value) * widen;
    v_scale = (p.v_scale != nullptr ? p.v_scale[at] : p.v_scale_value) * widen;
  }

  // This sequence's extents and the offsets of its first row.
  int seqlen_q = p.seqlen_q;
  int seqlen_k = p.seqlen_k;
  int64_t q_row0 = 0, k_row0 = 0;
  int kv_batch = batch;
  bool varlen_q = p.cu_seqlens_q != nullptr;
  if (varlen_q) {
    q_row0 = p.cu_seqlens_q[batch];
    seqlen_q = p.cu_seqlens_q[batch + 1] - p.cu_seqlens_q[batch];
  }
  if (p.cu_seqlens_k != nullptr) {
    k_row0 = p.cu_seqlens_k[batch];
    seqlen_k = p.cu_seqlens_k[batch + 1] - p.cu_seqlens_k[batch];
  }
  bool varlen_k = p.cu_seqlens_k != nullptr;
  if constexpr (kKVCache) {
    // Cache rows [start, end) of cache sequence kv_batch, every index clamped
    // into the cache (the host cannot check device values). Paged caches
    // (with varlen: paged prefill) address each sequence through its pages.
    int end = p.seqused_k != nullptr ? p.seqused_k[batch] + p.seqlen_new : seqlen_k;
    end = min(max(end, 0), p.capacity);
    const int start = p.leftpad_k != nullptr ? min(max(p.leftpad_k[batch], 0), end) : 0;
    seqlen_k = end - start;
    k_row0 = start;
    varlen_k = false;
    if (p.kv_batch_idx != nullptr)
      kv_batch = min(max(p.kv_batch_idx[batch], 0), p.kv_cache_batch - 1);
  }
  const int rows_q = seqlen_q * group;  // query rows of this (batch, grid head)
  const int m0 = m_block * kBlockM;
  if (m0 >= rows_q) return;
  const int rows_left = rows_q - m0;
  // Tile row r holds query (m0 + r) / group of head head0 + (m0 + r) % group.
  const auto query_of = [group](int row) { return row / group; };

  const AttentionMask mask{seqlen_q, seqlen_k, p.window_left, p.window_right};
  int n_begin, n_end;
  const int last_query = query_of(min(m0 + kBlockM, rows_q) - 1);
  mask.key_tiles_of_rows(query_of(m0), last_query, kBlockN, n_begin, n_end);
  if (num_splits > 1) {
    // This CTA's contiguous share of the key tiles its rows attend.
    const int per_split = (n_end - n_begin + num_splits - 1) / num_splits;
    n_begin += split * per_split;
    n_end = min(n_end, n_begin + per_split);
  }

  // The masked kernel's classes of this query tile's key tiles (nullptr: none).
  const uint8_t* tile_codes = nullptr;
  if constexpr (kMask) tile_codes = mask_tile_row(p.mask_tiles, batch, head, m_block);
  const auto tile_is = [&](int n, MaskTileClass c) {
    return tile_codes != nullptr && tile_codes[n] == static_cast<uint8_t>(c);
  };

  // Global views: (seq, head dim) of this (batch, head), tiled.
  const int64_t q_base = (varlen_q ? q_row0 * p.q_seq : batch * p.q_batch) + head * p.q_head;
  const int64_t o_base = (varlen_q ? q_row0 * p.o_seq : batch * p.o_batch) + head * p.o_head;
  const int64_t k_base =
      (varlen_k ? k_row0 * p.k_seq : kv_batch * p.k_batch + k_row0 * p.k_seq) + kv_head * p.k_head;
  const int64_t v_base =
      (varlen_k ? k_row0 * p.v_seq : kv_batch * p.v_batch + k_row0 * p.v_seq) + kv_head * p.v_head;
  auto tile_q = Shape<Int<kBlockM>, Int<kHeadDim>>{};
  auto tile_kv = Shape<Int<kBlockN>, Int<kHeadDim>>{};
  Tensor mQ = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.q) + q_base),
                          make_shape(seqlen_q, p.headdim), make_stride(p.q_seq, _1{}));
  Tensor mK = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.k) + k_base),
                          make_shape(seqlen_k, p.headdim), make_stride(p.k_seq, _1{}));
  Tensor mV = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.v) + v_base),
                          make_shape(seqlen_k, p.headdim), make_stride(p.v_seq, _1{}));
  Tensor mO = make_tensor(make_gmem_ptr(static_cast<Element*>(p.o) + o_base),
                          make_shape(seqlen_q, p.headdim), make_stride(p.o_seq, _1{}));
  Tensor gQ = local_tile(mQ, tile_q, make_coord(m_block, 0));  // (BM, D)
  Tensor gO = local_tile(mO, tile_q, make_coord(m_block, 0));  // (BM, D)
  Tensor gK = local_tile(mK, tile_kv, make_coord(_, 0));       // (BN, D, n)
  Tensor gV = local_tile(mV, tile_kv, make_coord(_, 0));       // (BN, D, n)
  Tensor cQ = make_identity_tensor(tile_q);                    // tile coordinates
  Tensor cKV = make_identity_tensor(tile_kv);

  // Global <-> shared partitions and the head-dim predicates.
  typename Traits::GmemTiledCopyLoad gmem_load;
  typename Traits::GmemTiledCopyStore gmem_store;
  auto load_thr = gmem_load.get_slice(threadIdx.x);
  auto store_thr = gmem_store.get_slice(threadIdx.x);
  Tensor tQcQ = load_thr.partition_S(cQ);
  Tensor tKVcKV = load_thr.partition_S(cKV);
  Tensor tQcolok = make_tensor<bool>(make_shape(size<2>(tQcQ)));
  Tensor tKVcolok = make_tensor<bool>(make_shape(size<2>(tKVcKV)));
  CUTE_UNROLL
  for (int j = 0; j < size(tQcolok); ++j) tQcolok(j) = get<1>(tQcQ(0, 0, j)) < p.headdim;
  CUTE_UNROLL
  for (int j = 0; j < size(tKVcolok); ++j) tKVcolok(j) = get<1>(tKVcKV(0, 0, j)) < p.headdim;
  const GmemAccess access{kVectors, p.headdim};
  Tensor tOcO = store_thr.partition_D(cQ);

  // The kvcache kernel's rows: query and output rows of packed heads, and
  // the cache rows of paged K and V. One 16-byte vector's layout serves all.
  const auto chunk = load_thr.partition_S(gQ)(_, 0, 0).layout();
  const auto q_row = [&](int r) {
    const int row = m0 + r;
    return static_cast<Element const*>(p.q) + (q_base - head * p.q_head) +
           int64_t(query_of(row)) * p.q_seq + int64_t(head0 + row % group) * p.q_head;
  };
  const auto o_row = [&](int r) {
    const int row = m0 + r;
    return static_cast<Element*>(p.o) + (o_base - head * p.o_head) +
           int64_t(query_of(row)) * p.o_seq + int64_t(head0 + row % group) * p.o_head;
  };
  // Key `key` of the sequence in a paged cache: (page, row in page), the page
  // clamped into the cache.
  const auto page_of = [&](int key, int& row_in_page) {
    row_in_page = key % p.page_size;
    const int page = p.block_table[batch * p.block_table_stride + key / p.page_size];
    return int64_t(min(max(page, 0), p.kv_cache_batch - 1));
  };

  const bool write_lse = p.lse != nullptr;
  float* lse =
      write_lse ? p.lse + (varlen_q ? q_row0 * p.lse_seq : batch * p.lse_batch) + head * p.lse_head
                : nullptr;
  // Split partials: row (split, batch, head, query) of the fp32 scratch.
  const auto partial_row = [&](int r) {
    const int row = m0 + r;
    return ((int64_t(split) * gridDim.z + batch) * p.nheads + head0 + row % group) *
               int64_t(p.seqlen_q) +
           query_of(row);
  };
  // The kvcache kernel's LSE of tile row r (fixed-length or varlen queries).
  const auto lse_at = [&](int r) -> float& {
    const int row = m0 + r;
    return p.lse[(varlen_q ? q_row0 * p.lse_seq : batch * p.lse_batch) +
                 int64_t(head0 + row % group) * p.lse_head + int64_t(query_of(row)) * p.lse_seq];
  };

  // A row that attends no key: LSE +inf, or its head's sink logit.
  const auto empty_lse = [&](int r) {
    return kTerms && p.sinks != nullptr ? p.sinks[head0 + (m0 + r) % group] : INFINITY;
  };

  extern __shared__ __align__(128) char shared_memory[];
  // The cluster's combine of this tile (every split takes part, with keys or
  // without); the sink joins there.
  const auto combine_in_cluster = [&](Share& share) {
    combine_cluster_splits<Traits::kThreads, Element>(
        share, num_splits, split, min(kBlockM, rows_left), p.headdim, o_row,
        [&](int r, float row_lse) {
          if (write_lse) lse_at(r) = row_lse;
        },
        [&](int r) {
          return kTerms && p.sinks != nullptr ? p.sinks[head0 + (m0 + r) % group] : -INFINITY;
        });
  };

  if (n_begin >= n_end) {
    // No row of this tile attends any key (of this split): output 0 and LSE
    // empty_lse (split partials: -inf, a share that adds nothing; the
    // combine adds the sink).
    if constexpr (kKVCache) {
      const int rows = min(kBlockM, rows_left);
      if (kClusterCombine && num_splits > 1) {
        Share& share = *reinterpret_cast<Share*>(shared_memory);
        for (int r = threadIdx.x; r < rows; r += Traits::kThreads) share.lse[r] = -INFINITY;
        combine_in_cluster(share);
      } else if (num_splits > 1) {
        for (int i = threadIdx.x; i < rows * p.headdim; i += Traits::kThreads) {
          p.o_partial[partial_row(i / p.headdim) * p.headdim + i % p.headdim] = 0.0f;
        }
        for (int r = threadIdx.x; r < rows; r += Traits::kThreads) {
          p.lse_partial[partial_row(r)] = -INFINITY;
        }
      } else {
        for (int i = threadIdx.x; i < rows * p.headdim; i += Traits::kThreads) {
          o_row(i / p.headdim)[i % p.headdim] = Element(0);
        }
        if (write_lse) {
          for (int r = threadIdx.x; r < rows; r += Traits::kThreads) lse_at(r) = empty_lse(r);
        }
      }
      return;
    }
    store_zero_tile(gmem_store, gO, tOcO, tQcolok, rows_left, access);
    if (write_lse) {
      for (int r = threadIdx.x; r < min(kBlockM, rows_left); r += Traits::kThreads) {
        lse[(m0 + r) * p.lse_seq] = empty_lse(r);
      }
    }
    return;
  }

  // Shared memory: Q (later O), K and V stages.
  Element* smem_q = reinterpret_cast<Element*>(shared_memory);
  Element* smem_k = smem_q + cosize_v<typename Traits::SmemLayoutQ>;
  Element* smem_v = smem_k + cosize_v<typename Traits::SmemLayoutKV>;
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});
  Tensor sK =
      make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKV{});  // (BN, D, stage)
  Tensor sV = make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutVt{});
  Tensor sVtNoSwizzle =
      make_tensor(make_smem_ptr(smem_v), typename Traits::SmemLayoutVtNoSwizzle{});

  // MMA partitions: S = Q K^T is (BM, BN) over D, O = P V is (BM, D) over BN.
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_slice(threadIdx.x);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);                      // (MMA, MMA_M, D/16)
  Tensor tSrK = thr_mma.partition_fragment_B(sK(_, _, 0));             // (MMA, MMA_N, D/16)
  Tensor tOrVt = thr_mma.partition_fragment_B(sVtNoSwizzle(_, _, 0));  // (MMA, MMA_D, BN/16)
  Tensor acc_o = partition_fragment_C(tiled_mma, tile_q);              // (MMA, MMA_M, MMA_D)
  clear(acc_o);

  auto smem_copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_thr_q = smem_copy_q.get_slice(threadIdx.x);
  Tensor tSsQ = smem_thr_q.partition_S(sQ);
  Tensor tSrQ_view = smem_thr_q.retile_D(tSrQ);
  auto smem_copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_thr_k = smem_copy_k.get_slice(threadIdx.x);
  Tensor tSsK = smem_thr_k.partition_S(sK);  // (CPY, CPY_N, CPY_K, stage)
  Tensor tSrK_view = smem_thr_k.retile_D(tSrK);
  auto smem_copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  auto smem_thr_v = smem_copy_v.get_slice(threadIdx.x);
  Tensor tOsVt = smem_thr_v.partition_S(sVt);
  Tensor tOrVt_view = smem_thr_v.retile_D(tOrVt);

  // Score-tile coordinates, for masking.
  Tensor tScS =
      rowcol_view(thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{})));
  Tensor acc_o_rc = rowcol_view(acc_o);
  constexpr int kRows = decltype(size<0>(acc_o_rc))::value;
  OnlineSoftmax<kRows> softmax;
  const auto head_of = [&](int row) { return head0 + row % group; };
  // Dropout: the prefill kernels with terms only (the kvcache kernel never
  // gets it); its grid's y extent is the query heads.
  const bool dropout = kTerms && !kKVCache && p.terms.dropout.seed != nullptr;
  const DropoutRng dropout_rng(kTerms && !kKVCache ? p.terms.dropout : DropoutParams{}, batch,
                               int(gridDim.y), head);

  // Pipeline. Key tiles run last to first; tile n uses stage s, the next one
  // (n - 1) stage s + 1 (mod kStages). Commit groups go out in the order Q,
  // K(n0), then per tile V(n - kStages + 1) and K(n - kStages), each at the
  // first barrier after its stage is free. A group for a tile before n_begin
  // is empty, which keeps the wait counts fixed: 2 (kStages - 1) groups may
  // stay in flight.
  constexpr int kStages = Traits::kKVStages;
  // Key tile n of K or V (view g, base pointer, strides) into `stage`.
  auto load_kv = [&](auto const& g, Element const* base, int64_t page_stride, int64_t row_stride,
                     int n, auto&& s_stage) {
    if constexpr (kKVCache) {
      if (p.page_size > 0) {
        const auto row = [&](int r) {
          int in_page;
          const int64_t page = page_of(n * kBlockN + r, in_page);
          return base + page * page_stride + int64_t(in_page) * row_stride;
        };
        load_rows<kAsync>(gmem_load, chunk, row, s_stage, tKVcKV, tKVcolok, seqlen_k - n * kBlockN);
        return;
      }
    }
    load_tile<kAsync>(gmem_load, g(_, _, n), s_stage, tKVcKV, tKVcolok, seqlen_k - n * kBlockN,
                      access);
  };
  // Paged: the head's column of the cache; the page and row added per row.
  Element const* k_head_base = static_cast<Element const*>(p.k) + kv_head * p.k_head;
  Element const* v_head_base = static_cast<Element const*>(p.v) + kv_head * p.v_head;
  // A skipped tile's group is empty, as one before n_begin.
  // fp8 caches: key tile n's rows as bytes (strides count fp8 elements),
  // into the upper half of the stage (Fp8Tile).
  using Fp8KV = Fp8Tile<kBlockN, kHeadDim, Traits::kThreads>;
  auto load_fp8 = [&](const void* cache, int64_t base, int64_t head_offset, int64_t page_stride,
                      int64_t row_stride, int n, Element* stage16) {
    const uint8_t* bytes = static_cast<const uint8_t*>(cache);
    const auto row = [&](int r) {
      const int key = n * kBlockN + r;
      if (p.page_size > 0) {
        int in_page;
        const int64_t page = page_of(key, in_page);
        return bytes + head_offset + page * page_stride + int64_t(in_page) * row_stride;
      }
      return bytes + base + int64_t(key) * row_stride;
    };
    Fp8KV::load(stage16, row, seqlen_k - n * kBlockN, p.headdim);
  };
  auto load_k = [&](int n, int stage) {
    if (n >= n_begin && !tile_is(n, MaskTileClass::empty)) {
      if constexpr (kFp8) {
        load_fp8(p.k, k_base, kv_head * p.k_head, p.k_batch, p.k_seq, n, &sK(0, 0, stage));
      } else {
        load_kv(gK, k_head_base, p.k_batch, p.k_seq, n, sK(_, _, stage));
      }
    }
    cp_async_fence();
  };
  auto load_v = [&](int n, int stage) {
    if (n >= n_begin && !tile_is(n, MaskTileClass::empty)) {
      if constexpr (kFp8) {
        load_fp8(p.v, v_base, kv_head * p.v_head, p.v_batch, p.v_seq, n, &sV(0, 0, stage));
      } else {
        load_kv(gV, v_head_base, p.v_batch, p.v_seq, n, sV(_, _, stage));
      }
    }
    cp_async_fence();
  };
  int n_block = n_end - 1;
  if constexpr (kKVCache) {
    load_rows<kAsync>(gmem_load, chunk, q_row, sQ, tQcQ, tQcolok, rows_left);
  } else {
    load_tile<kAsync>(gmem_load, gQ, sQ, tQcQ, tQcolok, rows_left, access);
  }
  cp_async_fence();
  load_k(n_block, 0);
  CUTE_UNROLL
  for (int j = 1; j < kStages; ++j) {
    load_v(n_block - j + 1, j - 1);
    load_k(n_block - j, j);
  }
  if constexpr (Traits::kQInRegs) {
    cp_async_wait<2 * kStages - 1>();
    __syncthreads();
    copy(smem_copy_q, tSsQ, tSrQ_view);
  }

  // Decode tiles hold few rows (seqlen_q x group): in the kvcache kernel a
  // warp whose 16 rows all lie past the end skips its MMAs (its shared-memory
  // reads of K and V, the larger cost), keeping only the loads and barriers.
  static_assert(!kKVCache || kBlockM == 16 * Traits::kWarps, "one 16-row slice per warp");
  const bool warp_has_rows = !kKVCache || int(threadIdx.x / 32) * 16 < rows_left;

  auto key_tile = [&](int n_block, auto stage_c, auto first_tile) {
    constexpr bool kFirstTile = decltype(first_tile)::value;
    constexpr int stage = decltype(stage_c)::value;
    Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_s);
    // K(n) has landed, and every warp is done with V(n + 1), whose stage
    // V(n - kStages + 1) takes: stream it in.
    cp_async_wait<2 * (kStages - 1)>();
    __syncthreads();
    if constexpr (kFp8) Fp8KV::widen(&sK(0, 0, stage), sK(_, _, stage), p.kv_fp8);
    constexpr int v_stage = stage == 0 ? kStages - 1 : stage - 1;
    load_v(n_block - kStages + 1, v_stage);
    // A tile the mask leaves out adds nothing (the softmax starts from any
    // tile: from no keys its update rescales zeros).
    const bool skip = tile_is(n_block, MaskTileClass::empty);

    if (warp_has_rows && !skip) {
      gemm_from_smem<Traits::kQInRegs>(tiled_mma, acc_s, tSrQ, tSsQ, tSrQ_view, smem_copy_q, tSrK,
                                       tSsK(_, _, _, stage), tSrK_view, smem_copy_k);
    }

    if (!skip) {
      if constexpr (kFp8) {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i) acc_s(i) *= k_scale;
      }
      if (p.softcap > 0.0f) {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i) {
          acc_s(i) = p.softcap * tanhf(acc_s(i) * p.softcap_pre);
        }
      }
      Tensor scores = rowcol_view(acc_s);
      const int n0 = n_block * kBlockN;
      if constexpr (kTerms) {
        apply_score_terms<kMask>(scores, tScS, m0, n0, p.terms, batch, head_of, query_of, mask,
                                 /*read_mask=*/!tile_is(n_block, MaskTileClass::full));
      }
      if (mask.rows_need_mask(query_of(m0), query_of(m0 + kBlockM - 1), n0, kBlockN)) {
        mask.apply(scores, tScS, m0, n0, query_of);
      }
      softmax.template update<kFirstTile>(scores, acc_o_rc, p.scale_log2);
      if constexpr (kTerms && !kKVCache) {
        // The row sums keep every probability; O gets the kept ones, scaled
        // by 1 / (1 - p) in the epilogue.
        if (dropout) {
          for_each_dropout(scores, tScS, m0, n0, dropout_rng, [&](int r, int c, bool kept) {
            if (!kept) scores(r, c) = 0.0f;
          });
        }
      }
    }
    Tensor probs = convert_fragment<Element>(acc_s);
    Tensor tOrP =
        make_tensor(probs.data(), c_to_a_layout<typename Traits::MmaAtom>(probs.layout()));

    // V(n) has landed and every warp is done with K(n): K(n - kStages) takes
    // its stage.
    cp_async_wait<2 * (kStages - 1)>();
    __syncthreads();
    if constexpr (kFp8) Fp8KV::widen(&sV(0, 0, stage), sV(_, _, stage), p.kv_fp8);
    load_k(n_block - kStages, stage);

    if (warp_has_rows && !skip) {
      gemm_from_smem<true>(tiled_mma, acc_o, tOrP, tOrP, tOrP, smem_copy_q, tOrVt,
                           tOsVt(_, _, _, stage), tOrVt_view, smem_copy_v);
    }
  };

  // Stages are compile-time constants (immediate shared-memory offsets): with
  // two stages the loop body holds two tiles.
  key_tile(n_block, Int<0>{}, std::true_type{});
  for (--n_block; n_block >= n_begin; --n_block) {
    key_tile(n_block, Int<1 % kStages>{}, std::false_type{});
    if constexpr (kStages == 2) {
      if (--n_block < n_begin) break;
      key_tile(n_block, Int<0>{}, std::false_type{});
    }
  }

  // Epilogue: normalize, stage O through shared memory (Q's buffer, which no
  // warp reads any more: the last tile's barriers follow its last Q read).
  float row_lse[kRows];
  // Split partials leave the sinks to the combine.
  float sink_log2[kRows];
  sink_logits_log2(kTerms && num_splits == 1 ? p.sinks : nullptr, tScS, m0, head_of, sink_log2);
  softmax.finalize(acc_o_rc, p.scale_log2, row_lse, sink_log2);
  if (dropout) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc_o); ++i) acc_o(i) *= p.terms.dropout.scale;
  }
  if constexpr (kFp8) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc_o); ++i) acc_o(i) *= v_scale;
  }
  if constexpr (kClusterCombine) {
    if (num_splits > 1) {
      // This split's share into shared memory, once no warp reads K or V.
      __syncthreads();
      Share& share = *reinterpret_cast<Share*>(shared_memory);
      Tensor tOcO_rc = rowcol_view(thr_mma.partition_C(cQ));
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int row = get<0>(tOcO_rc(r, 0));
        if (row >= rows_left) continue;
        CUTE_UNROLL
        for (int c = 0; c < size<1>(acc_o_rc); ++c)
          share.o[row][get<1>(tOcO_rc(0, c))] = acc_o_rc(r, c);
        if (threadIdx.x % 4 == 0) share.lse[row] = row_lse[r] == INFINITY ? -INFINITY : row_lse[r];
      }
      combine_in_cluster(share);
      return;
    }
  }
  if constexpr (kKVCache) {
    if (num_splits > 1) {
      // This split's share, normalized by its own sum, straight from the
      // registers; the combine kernel weighs the shares by their LSE.
      Tensor tOcO_rc = rowcol_view(thr_mma.partition_C(cQ));
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int row = get<0>(tOcO_rc(r, 0));
        if (row >= rows_left) continue;
        const int64_t at = partial_row(row);
        float* o_part = p.o_partial + at * p.headdim;
        CUTE_UNROLL
        for (int c = 0; c < size<1>(acc_o_rc); ++c) {
          const int col = get<1>(tOcO_rc(0, c));
          if (col < p.headdim) o_part[col] = acc_o_rc(r, c);
        }
        if (threadIdx.x % 4 == 0) {
          p.lse_partial[at] = row_lse[r] == INFINITY ? -INFINITY : row_lse[r];
        }
      }
      return;
    }
  }
  Tensor out = convert_fragment<Element>(acc_o);
  Tensor sO = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});
  auto smem_copy_o = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
  auto smem_thr_o = smem_copy_o.get_slice(threadIdx.x);
  copy(smem_copy_o, smem_thr_o.retile_S(out), smem_thr_o.partition_D(sO));
  __syncthreads();
  if constexpr (kKVCache) {
    store_rows(gmem_store, chunk, sO, o_row, tOcO, tQcolok, rows_left);
  } else {
    store_tile(gmem_store, sO, gO, tOcO, tQcolok, rows_left, access);
  }

  if (write_lse && threadIdx.x % 4 == 0) {
    Tensor tOcO_rc = rowcol_view(thr_mma.partition_C(cQ));
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = get<0>(tOcO_rc(r, 0));
      if (row >= rows_left) continue;
      if constexpr (kKVCache) {
        lse_at(row) = row_lse[r];
      } else {
        lse[(m0 + row) * p.lse_seq] = row_lse[r];
      }
    }
  }
}

}  // namespace samattn::attention
