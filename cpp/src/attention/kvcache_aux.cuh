// The two small kernels around the kvcache kernel: the append (new keys and
// values written into the cache, rotary embedding applied to them and to q)
// before it, and the combine of split-key partial results after it. Plain
// CUDA: they move a few rows per sequence. Instantiated once per family in
// the family's flash_fwd_<family>.cu (the family is only a tag there).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention/attention_problem.h"
#include "attention/fp8_cache.cuh"
#include "attention/kvcache_aux.h"
#include "attention/kvcache_plan.h"

namespace samattn::attention {

// Appends k_new / v_new into the cache (KVCacheView) with rotary embedding,
// and writes q rotated into q_rotated (contiguous (batch, seqlen_q, nheads,
// headdim)) when there is a rotary table. One thread per pair of head-dim
// elements; a pair is what one rotation mixes: (2c, 2c + 1) interleaved,
// (c, c + rotary_dim / 2) otherwise, and (2c, 2c + 1) past rotary_dim.
// Cache: Element, or uint8_t for fp8 caches, whose new elements are stored
// quantized (quantize_fp8: each value as rounded to Element, divided by its
// KV head's scale).
template <class Element, class Cache = Element>
struct AppendParams {
  const Element* k_new;
  const Element* v_new;
  int64_t kn_batch, kn_seq, kn_head, vn_batch, vn_seq, vn_head;
  Cache* k;
  Cache* v;
  int64_t k_batch, k_seq, k_head, v_batch, v_seq, v_head;
  const Element* q;
  int64_t q_batch, q_seq, q_head;
  Element* q_rotated;  // nullptr: no rotary
  const Element* cos;
  const Element* sin;
  const int32_t* seqused_k;
  const int32_t* kv_batch_idx;
  const int32_t* block_table;
  int64_t block_table_stride;
  int page_size, kv_cache_batch, capacity;
  int batch, seqlen_new, seqlen_q, nheads, nheads_k, headdim;
  int rotary_dim, rotary_seqlen;
  bool interleaved, q_per_row;
  // fp8 caches: kFp8E4M3 / kFp8E5M2 and the scales (Fp8CacheView).
  int kv_fp8;
  const float* k_scale;
  const float* v_scale;
  int64_t scale_head;
  float k_scale_value, v_scale_value;
};

// Stores one new element: as it is, or quantized to an fp8 cache.
template <class Element, class Dst>
__device__ inline void store_element(Dst* dst, Element value, float scale, int kv_fp8) {
  if constexpr (std::is_same_v<Dst, Element>) {
    *dst = value;
  } else {
    *dst = quantize_fp8(static_cast<float>(value), scale, kv_fp8);
  }
}

// `scale`: the destination's (fp8 caches only).
template <class Element, class Cache, class Dst>
__device__ inline void rotate_pair(const Element* src, Dst* dst, int pair, int pos,
                                   const AppendParams<Element, Cache>& a, float scale) {
  const int half = a.rotary_dim / 2;
  if (a.cos == nullptr || pair >= half) {  // not rotated: a copy
    store_element(dst + 2 * pair, src[2 * pair], scale, a.kv_fp8);
    store_element(dst + 2 * pair + 1, src[2 * pair + 1], scale, a.kv_fp8);
    return;
  }
  const int i1 = a.interleaved ? 2 * pair : pair;
  const int i2 = a.interleaved ? 2 * pair + 1 : pair + half;
  const int row = min(max(pos, 0), a.rotary_seqlen - 1);
  const float c = static_cast<float>(a.cos[int64_t(row) * half + pair]);
  const float s = static_cast<float>(a.sin[int64_t(row) * half + pair]);
  const float x1 = static_cast<float>(src[i1]), x2 = static_cast<float>(src[i2]);
  store_element(dst + i1, static_cast<Element>(x1 * c - x2 * s), scale, a.kv_fp8);
  store_element(dst + i2, static_cast<Element>(x1 * s + x2 * c), scale, a.kv_fp8);
}

// F: the family whose cubins hold this copy (each family's translation unit
// compiles its own, for its archs, under its own name).
template <Family F, class Element, class Cache>
__global__ void kvcache_append_kernel(const AppendParams<Element, Cache> a) {
  const int pairs = a.headdim / 2;
  const int64_t key_items =
      a.k_new == nullptr ? 0 : int64_t(a.batch) * a.seqlen_new * a.nheads_k * pairs;
  const int64_t q_items =
      a.q_rotated == nullptr ? 0 : int64_t(a.batch) * a.seqlen_q * a.nheads * pairs;
  for (int64_t item = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; item < key_items + q_items;
       item += int64_t(gridDim.x) * blockDim.x) {
    if (item < key_items) {
      const int pair = int(item % pairs);
      const int64_t rest = item / pairs;
      const int h = int(rest % a.nheads_k);
      const int64_t row = rest / a.nheads_k;
      const int b = int(row / a.seqlen_new), i = int(row % a.seqlen_new);
      const int pos = a.seqused_k[b] + i;  // cache row
      if (pos < 0 || pos >= a.capacity) continue;
      int64_t k_off, v_off;
      if (a.block_table != nullptr) {
        int page = a.block_table[b * a.block_table_stride + pos / a.page_size];
        page = min(max(page, 0), a.kv_cache_batch - 1);
        const int in_page = pos % a.page_size;
        k_off = page * a.k_batch + in_page * a.k_seq;
        v_off = page * a.v_batch + in_page * a.v_seq;
      } else {
        const int kb =
            a.kv_batch_idx == nullptr ? b : min(max(a.kv_batch_idx[b], 0), a.kv_cache_batch - 1);
        k_off = kb * a.k_batch + int64_t(pos) * a.k_seq;
        v_off = kb * a.v_batch + int64_t(pos) * a.v_seq;
      }
      AppendParams<Element, Cache> no_rotary = a;  // values are not rotated
      no_rotary.cos = nullptr;
      float k_scale = 1.0f, v_scale = 1.0f;
      if constexpr (!std::is_same_v<Cache, Element>) {
        k_scale = a.k_scale != nullptr ? a.k_scale[h * a.scale_head] : a.k_scale_value;
        v_scale = a.v_scale != nullptr ? a.v_scale[h * a.scale_head] : a.v_scale_value;
      }
      rotate_pair(a.k_new + b * a.kn_batch + i * a.kn_seq + h * a.kn_head,
                  a.k + k_off + h * a.k_head, pair, pos, a, k_scale);
      rotate_pair(a.v_new + b * a.vn_batch + i * a.vn_seq + h * a.vn_head,
                  a.v + v_off + h * a.v_head, pair, pos, no_rotary, v_scale);
    } else {
      const int64_t q_item = item - key_items;
      const int pair = int(q_item % pairs);
      const int64_t rest = q_item / pairs;
      const int h = int(rest % a.nheads);
      const int64_t row = rest / a.nheads;
      const int b = int(row / a.seqlen_q), i = int(row % a.seqlen_q);
      const int pos = a.seqused_k[b] + (a.q_per_row ? i : 0);
      rotate_pair(a.q + b * a.q_batch + i * a.q_seq + h * a.q_head,
                  a.q_rotated + ((int64_t(b) * a.seqlen_q + i) * a.nheads + h) * a.headdim, pair,
                  pos, a, 1.0f);
    }
  }
}

// Sums the split partials of each output row, weighted by exp(lse_s - lse)
// with lse = log (sum_s exp(lse_s) + exp(sink)) (no sink: exp(sink) = 0; the
// splits leave it out, so that it counts once): one block per (batch, head, query) row,
// one thread per head-dim column. The weights go through shared memory once;
// the column loop then issues its partial loads in batches (they are
// independent), which hides the L2 latency that a serial loop over the
// splits would pay once per split.
template <class Element>
struct CombineParams {
  const float* o_partial;
  const float* lse_partial;
  Element* o;
  int64_t o_batch, o_seq, o_head;
  float* lse;  // nullptr: not written
  int64_t lse_batch, lse_head, lse_seq;
  const float* sinks;  // (nheads,); nullptr: none
  int batch, nheads, seqlen_q, headdim, splits;
};

constexpr int kCombineThreads = 128;  // one per split for the weights; columns in passes

template <Family F, class Element>
__global__ void __launch_bounds__(kCombineThreads)
    split_combine_kernel(const CombineParams<Element> c) {
  static_assert(kMaxSplits <= kCombineThreads, "one thread per split for the weights");
  __shared__ float weight[kMaxSplits];
  __shared__ float reduce[kCombineThreads / 32];
  const int64_t rows = int64_t(c.batch) * c.nheads * c.seqlen_q;
  const int64_t row = blockIdx.x;
  const int q = int(row % c.seqlen_q);
  const int h = int(row / c.seqlen_q % c.nheads);
  const int b = int(row / c.seqlen_q / c.nheads);
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const float mine = t < c.splits ? c.lse_partial[t * rows + row] : -INFINITY;
  // Block max, then block sum of exp(lse_s - max).
  float v = mine;
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (lane == 0) reduce[warp] = v;
  __syncthreads();
  const float sink = c.sinks != nullptr ? c.sinks[h] : -INFINITY;
  float max_lse = fmaxf(reduce[0], sink);
  for (int w = 1; w < kCombineThreads / 32; ++w) max_lse = fmaxf(max_lse, reduce[w]);
  __syncthreads();
  Element* out = c.o + b * c.o_batch + q * c.o_seq + h * c.o_head;
  if (max_lse == -INFINITY) {  // no split saw a key, no sink: 0 and LSE +inf, as unsplit
    for (int col = t; col < c.headdim; col += kCombineThreads) out[col] = Element(0.0f);
    if (c.lse != nullptr && t == 0)
      c.lse[b * c.lse_batch + h * c.lse_head + q * c.lse_seq] = INFINITY;
    return;
  }
  v = t < c.splits ? __expf(mine - max_lse) : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (lane == 0) reduce[warp] = v;
  __syncthreads();
  float sum = sink != -INFINITY ? __expf(sink - max_lse) : 0.0f;
  for (int w = 0; w < kCombineThreads / 32; ++w) sum += reduce[w];
  const float lse = max_lse + __logf(sum);
  if (t < c.splits) weight[t] = __expf(mine - lse);
  __syncthreads();
  const float* partial = c.o_partial + row * c.headdim;
  const int64_t split_stride = rows * c.headdim;
  for (int col = t; col < c.headdim; col += kCombineThreads) {
    float acc = 0.0f;
#pragma unroll 8
    for (int s = 0; s < c.splits; ++s) acc += weight[s] * partial[s * split_stride + col];
    out[col] = static_cast<Element>(acc);
  }
  if (c.lse != nullptr && t == 0) c.lse[b * c.lse_batch + h * c.lse_head + q * c.lse_seq] = lse;
}

template <Family F, class Element, class Cache = Element>
cudaError_t launch_kvcache_append(const AttentionForwardProblem& p, void* q_rotated) {
  const KVCacheView& c = p.cache;
  const bool rotary = c.rotary_cos != nullptr && c.rotary_dim > 0;
  if (c.k_new.ptr == nullptr && !rotary) return cudaSuccess;
  if constexpr (std::is_same_v<Cache, Element>) {
    // fp8 caches: the same kernel storing bytes (never on sm75, whose plan
    // declines them).
    if constexpr (F != Family::sm75) {
      if (fp8_cache(c)) return launch_kvcache_append<F, Element, uint8_t>(p, q_rotated);
    }
    if (fp8_cache(c)) return cudaErrorNotSupported;
  }
  AppendParams<Element, Cache> a{};
  a.k_new = static_cast<const Element*>(c.k_new.ptr);
  a.v_new = static_cast<const Element*>(c.v_new.ptr);
  a.kn_batch = c.k_new.batch_stride;
  a.kn_seq = c.k_new.seq_stride;
  a.kn_head = c.k_new.head_stride;
  a.vn_batch = c.v_new.batch_stride;
  a.vn_seq = c.v_new.seq_stride;
  a.vn_head = c.v_new.head_stride;
  // The caches are written here: the problem holds them as read-only views.
  a.k = const_cast<Cache*>(static_cast<const Cache*>(p.k.ptr));
  a.v = const_cast<Cache*>(static_cast<const Cache*>(p.v.ptr));
  a.k_batch = p.k.batch_stride;
  a.k_seq = p.k.seq_stride;
  a.k_head = p.k.head_stride;
  a.v_batch = p.v.batch_stride;
  a.v_seq = p.v.seq_stride;
  a.v_head = p.v.head_stride;
  a.q = static_cast<const Element*>(p.q.ptr);
  a.q_batch = p.q.batch_stride;
  a.q_seq = p.q.seq_stride;
  a.q_head = p.q.head_stride;
  a.q_rotated = rotary ? static_cast<Element*>(q_rotated) : nullptr;
  a.cos = rotary ? static_cast<const Element*>(c.rotary_cos) : nullptr;
  a.sin = rotary ? static_cast<const Element*>(c.rotary_sin) : nullptr;
  a.seqused_k = c.seqused_k;
  a.kv_batch_idx = c.kv_batch_idx;
  a.block_table = c.block_table;
  a.block_table_stride = c.block_table_batch_stride;
  a.page_size = c.page_size;
  a.kv_cache_batch = c.kv_cache_batch;
  a.capacity = c.capacity;
  a.batch = p.batch;
  a.seqlen_new = c.k_new.ptr == nullptr ? 0 : c.seqlen_new;
  a.seqlen_q = p.seqlen_q;
  a.nheads = p.nheads;
  a.nheads_k = p.nheads_k;
  a.headdim = p.headdim;
  a.rotary_dim = rotary ? c.rotary_dim : 0;
  a.rotary_seqlen = c.rotary_seqlen;
  a.interleaved = c.rotary_interleaved;
  a.q_per_row = c.rotary_q_per_row;
  a.kv_fp8 = static_cast<int>(c.fp8.kind);
  a.k_scale = c.fp8.k_scale;
  a.v_scale = c.fp8.v_scale;
  a.scale_head = c.fp8.scale_head_stride;
  a.k_scale_value = c.fp8.k_scale_value;
  a.v_scale_value = c.fp8.v_scale_value;
  const int64_t items =
      int64_t(p.batch) *
      (int64_t(a.seqlen_new) * p.nheads_k + (rotary ? int64_t(p.seqlen_q) * p.nheads : 0)) *
      (p.headdim / 2);
  if (items == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((items + kThreads - 1) / kThreads, 65535);
  kvcache_append_kernel<F, Element, Cache><<<unsigned(blocks), kThreads, 0, p.stream>>>(a);
  return cudaGetLastError();
}

template <Family F, class Element>
cudaError_t launch_split_combine(const AttentionForwardProblem& p, int splits,
                                 const float* o_partial, const float* lse_partial) {
  CombineParams<Element> c{};
  c.o_partial = o_partial;
  c.lse_partial = lse_partial;
  c.o = static_cast<Element*>(p.o.ptr);
  c.o_batch = p.o.batch_stride;
  c.o_seq = p.o.seq_stride;
  c.o_head = p.o.head_stride;
  c.lse = p.lse;
  c.lse_batch = p.lse_batch_stride;
  c.lse_head = p.lse_head_stride;
  c.lse_seq = p.lse_seq_stride;
  c.sinks = p.terms.sinks;
  c.batch = p.batch;
  c.nheads = p.nheads;
  c.seqlen_q = p.seqlen_q;
  c.headdim = p.headdim;
  c.splits = splits;
  const int64_t rows = int64_t(p.batch) * p.nheads * p.seqlen_q;
  split_combine_kernel<F, Element><<<unsigned(rows), kCombineThreads, 0, p.stream>>>(c);
  return cudaGetLastError();
}

// The definitions a family's flash_fwd_<family>.cu instantiates: the append
// (every family with the kvcache kernel), the combine (those whose splits
// combine through global memory).
#define SAMATTN_INSTANTIATE_KVCACHE_APPEND(FAMILY)                                              \
  template <>                                                                                   \
  cudaError_t kvcache_append<FAMILY>(const AttentionForwardProblem& problem, void* q_rotated) { \
    return problem.dtype == DType::bf16                                                         \
               ? launch_kvcache_append<FAMILY, __nv_bfloat16>(problem, q_rotated)               \
               : launch_kvcache_append<FAMILY, __half>(problem, q_rotated);                     \
  }
#define SAMATTN_INSTANTIATE_KVCACHE_AUX(FAMILY)                                                 \
  SAMATTN_INSTANTIATE_KVCACHE_APPEND(FAMILY)                                                    \
  template <>                                                                                   \
  cudaError_t split_combine<FAMILY>(const AttentionForwardProblem& problem, int splits,         \
                                    const float* o_partial, const float* lse_partial) {         \
    return problem.dtype == DType::bf16                                                         \
               ? launch_split_combine<FAMILY, __nv_bfloat16>(problem, splits, o_partial,        \
                                                             lse_partial)                       \
               : launch_split_combine<FAMILY, __half>(problem, splits, o_partial, lse_partial); \
  }

}  // namespace samattn::attention
