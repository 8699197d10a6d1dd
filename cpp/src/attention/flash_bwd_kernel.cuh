// FlashAttention-2 backward for the mma.sync families, in CuTe.
//
// Three kernels (flash_bwd_launch.cuh runs them in order):
//  1. dot_do_o: D = rowsum(dO * O) per query row (fp32); zeroes the dQ
//     accumulator.
//  2. flash_bwd_kernel: one CTA per (key tile, head, batch) keeps K and V in
//     shared memory and dK, dV in registers, and loops over the query tiles
//     that attend its keys:
//        S = Q K^T (softcapped, ALiBi, masked), P = exp(scale S - LSE),
//        dP = dO V^T, dS = P (dP - D) [x (1 - tanh^2) with softcap],
//        dV += P^T dO, dK += dS^T Q (with dropout, P^T and dP hold the kept
//        elements only, scaled by 1 / (1 - p): dropout.cuh), and dQ = dS K added to an fp32
//        accumulator with atomics (in key-tile order under a per-query-tile
//        semaphore when deterministic).
//     dK and dV go to the outputs (no GQA), or per query head in fp32 to
//     the workspace. With an attention mask, the mask's tile map
//     (mask_tiles.h) marks the query tiles to skip (not loaded, not
//     computed; in the deterministic order they still take their turn) and
//     those that read no mask.
//  3. convert: dq = scale dQacc; with GQA dk = scale sum_group dKacc and
//     dv = sum_group dVacc; to the dtype.
// The softmax scale is applied in step 3: inside, dS is the gradient with
// respect to the scaled (and capped) scores.
#pragma once

#include <cute/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attention/dropout.cuh"
#include "attention/flash_bwd_traits.h"
#include "attention/flash_fwd_kernel.cuh"
#include "attention/fragment_layout.cuh"
#include "attention/mask.cuh"
#include "attention/mask_tiles.cuh"
#include "attention/score_terms.cuh"
#include "attention/softmax_online.cuh"

namespace samattn::attention {

struct FlashBwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* dout;
  const float* lse;
  float* dq_accum;         // per (head, query tile) in fragment order; see dq_tile_accum
  int64_t dq_head_stride;  // floats
  float* dk_accum;         // (nheads, rows_k, headdim), per query head; GQA only
  float* dv_accum;         // (nheads, rows_k, headdim)
  // Without GQA (kv_group 1) dK and dV go straight to the outputs instead.
  void* dk;
  void* dv;
  int64_t dk_batch, dk_seq, dk_head;
  int64_t dv_batch, dv_seq, dv_head;
  float softmax_scale;
  const float* dsum;  // (nheads, rows_q)
  int* semaphores;    // (batch, nheads, sem_per_head); nullptr: atomics in any order
  int64_t q_batch, q_seq, q_head;
  int64_t k_batch, k_seq, k_head;
  int64_t v_batch, v_seq, v_head;
  int64_t do_batch, do_seq, do_head;
  int64_t lse_batch, lse_seq, lse_head;
  const int32_t* cu_seqlens_q;  // nullptr: fixed length
  const int32_t* cu_seqlens_k;
  int seqlen_q, seqlen_k;  // fixed length: the lengths; varlen: the maxima
  int headdim;
  int nheads, kv_group;
  int64_t rows_q, rows_k;  // accumulator rows per head
  int sem_per_head;
  int window_left, window_right;
  float scale_log2;   // log2(e) * softmax_scale, or log2(e) with softcap
  float softcap;      // 0: off
  float softcap_pre;  // softmax_scale / softcap
  // Read by the kernel compiled with kTerms only (score_terms.cuh).
  ScoreTermsParams terms;
  // With an additive mask: its gradient, fp32 (batch, nheads, seqlen_q,
  // seqlen_k) contiguous, written where visited; nullptr: not computed.
  float* dmask;
  MaskTileMap mask_tiles;  // the masked kernel's: query tiles it skips or reads no mask in
};

// A sequence's extent and its first row, in the packed (varlen) or the
// batch-strided tensor.
struct SeqExtent {
  int len;
  int64_t row0;  // rows before it: cu_seqlens[b], or b * seqlen
};
__device__ inline SeqExtent seq_extent(const int32_t* cu_seqlens, int seqlen, int batch) {
  if (cu_seqlens == nullptr) return {seqlen, int64_t(batch) * seqlen};
  return {cu_seqlens[batch + 1] - cu_seqlens[batch], cu_seqlens[batch]};
}

__device__ inline float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ inline int load_acquire(const int* address) {
  int value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

// The fp32 dQ accumulator of one query tile: kBlockM x kHeadDim floats in
// the order of the dQ MMA fragments, element i of thread t (of column slice
// `split`) at (split x fragment size + i) x threads + t. Each atomic add of
// a warp then covers 128 contiguous bytes, where the row-major order touched
// eight rows. Sequence b's tiles start b x kBlockM rows further, so that
// tiles of packed (varlen) sequences never overlap.
template <class Traits>
__device__ inline float* dq_tile_accum(float* accum, int64_t head_stride, int head, int batch,
                                       int64_t seq_row0, int m0) {
  return accum + head * head_stride +
         (seq_row0 + int64_t(batch) * Traits::kBlockM + m0) * Traits::kHeadDim;
}

// An add to the dQ accumulator that returns nothing. nvcc 13 compiles an
// atomicAdd whose result is unused to an ATOMG that still returns the old
// value: on the H100 that kernel moved half again FlashAttention-2's L2
// traffic, and the REDs made the whole backward 10-27% faster.
// (red.global.add.v4.f32 would issue fewer instructions, but ptxas splits it
// into four scalar REDs on 9.0.)
__device__ inline void red_add(float* address, float value) {
  asm volatile("red.global.add.f32 [%0], %1;" ::"l"(address), "f"(value) : "memory");
}

// ---------------------------------------------------------------- step 1
struct DotDoOParams {
  const void* dout;
  const void* o;
  float* dsum;      // (nheads, rows_q)
  float* dq_accum;  // zeroed here: the main kernel adds to it (dq_tile_accum)
  int64_t dq_head_stride;
  int64_t do_batch, do_seq, do_head;
  int64_t o_batch, o_seq, o_head;
  const int32_t* cu_seqlens_q;
  int seqlen_q, headdim;
  int lanes_per_row;  // a power of 2 up to 32 (see dot_do_o_lanes_per_row)
  bool vectors;       // 16-byte rows, else element by element
  int64_t rows_q;
};

// Lanes that share a query row: one per 16-byte vector of the row (so that a
// d=64 row does not leave three quarters of a warp idle), 32 for rows moved
// element by element.
inline int dot_do_o_lanes_per_row(int headdim, bool vectors) {
  if (!vectors) return 32;
  int lanes = 1;
  while (lanes < 32 && lanes * 8 < headdim) lanes *= 2;
  return lanes;
}

// D = rowsum(dO * O) for 256 / lanes_per_row query rows of one (head, batch)
// per CTA, and zeros for the dQ accumulator of those rows: row r of a
// sequence zeroes the r-th kHeadDim floats of its tiles (which rows the
// fragments mix does not matter once all of them are zero). The grid covers
// the sequence rounded up to whole query tiles, whose padding the main
// kernel adds zeros to. Templated on the traits, which name the family: each
// family's translation units then define their own kernel, which the runtime
// finds in that family's cubins.
template <class Traits>
__global__ void __launch_bounds__(256) flash_bwd_dot_do_o_kernel(DotDoOParams const p) {
  using Element = typename Traits::Element;
  const int lanes = p.lanes_per_row;
  const int lane = threadIdx.x % lanes;
  const int row = blockIdx.x * (256 / lanes) + threadIdx.x / lanes;
  const int head = blockIdx.y, batch = blockIdx.z;
  const SeqExtent seq = seq_extent(p.cu_seqlens_q, p.seqlen_q, batch);
  const int padded_len = (seq.len + Traits::kBlockM - 1) / Traits::kBlockM * Traits::kBlockM;
  if (row < padded_len) {
    float4* zero = reinterpret_cast<float4*>(
        dq_tile_accum<Traits>(p.dq_accum, p.dq_head_stride, head, batch, seq.row0, row));
    for (int i = lane; i < Traits::kHeadDim / 4; i += lanes) zero[i] = make_float4(0, 0, 0, 0);
  }
  // Every lane of a row group takes part in the shuffles below.
  const bool valid = row < seq.len;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const Element* dout = static_cast<const Element*>(p.dout) +
                        (varlen ? seq.row0 * p.do_seq : batch * p.do_batch) + head * p.do_head +
                        int64_t(row) * p.do_seq;
  const Element* o = static_cast<const Element*>(p.o) +
                     (varlen ? seq.row0 * p.o_seq : batch * p.o_batch) + head * p.o_head +
                     int64_t(row) * p.o_seq;
  float dot = 0.0f;
  if (valid && p.vectors) {
    for (int col = lane * 8; col < p.headdim; col += lanes * 8) {
      const uint4 a = *reinterpret_cast<const uint4*>(dout + col);
      const uint4 b = *reinterpret_cast<const uint4*>(o + col);
      const Element* ea = reinterpret_cast<const Element*>(&a);
      const Element* eb = reinterpret_cast<const Element*>(&b);
      CUTE_UNROLL
      for (int i = 0; i < 8; ++i) dot += static_cast<float>(ea[i]) * static_cast<float>(eb[i]);
    }
  } else if (valid) {
    for (int col = lane; col < p.headdim; col += lanes) {
      dot += static_cast<float>(dout[col]) * static_cast<float>(o[col]);
    }
  }
  for (int offset = lanes / 2; offset > 0; offset >>= 1) {
    dot += __shfl_xor_sync(0xffffffffu, dot, offset);
  }
  if (valid && lane == 0) p.dsum[head * p.rows_q + seq.row0 + row] = dot;
}

// Launches step 1 over every query tile of Traits::kBlockM rows (the grid
// covers the longest sequence, rounded up to whole tiles).
template <class Traits>
cudaError_t launch_dot_do_o(const AttentionBackwardProblem& P, const FlashBwdWorkspace& layout,
                            float* dsum, float* dq_accum, bool vectors, int64_t rows_q) {
  DotDoOParams d{};
  d.dout = P.dout.ptr;
  d.o = P.o.ptr;
  d.dsum = dsum;
  d.dq_accum = dq_accum;
  d.dq_head_stride = int64_t(layout.dq_head_stride);
  d.do_batch = P.dout.batch_stride, d.do_seq = P.dout.seq_stride, d.do_head = P.dout.head_stride;
  d.o_batch = P.o.batch_stride, d.o_seq = P.o.seq_stride, d.o_head = P.o.head_stride;
  d.cu_seqlens_q = P.cu_seqlens_q;
  d.seqlen_q = P.seqlen_q;
  d.headdim = P.headdim;
  d.vectors = vectors;
  d.lanes_per_row = dot_do_o_lanes_per_row(P.headdim, vectors);
  d.rows_q = rows_q;
  const int rows_per_cta = 256 / d.lanes_per_row;
  const int64_t padded =
      (int64_t(P.seqlen_q) + Traits::kBlockM - 1) / Traits::kBlockM * Traits::kBlockM;
  const dim3 grid(unsigned((padded + rows_per_cta - 1) / rows_per_cta), unsigned(P.nheads),
                  unsigned(P.batch));
  flash_bwd_dot_do_o_kernel<Traits><<<grid, 256, 0, P.stream>>>(d);
  return cudaGetLastError();
}

// ------------------------------------------------------- step 1b: sinks
// d loss / d sink_h = -sum over the rows of head h of P_sink D, P_sink =
// exp(sink_h - LSE): the sink is a key whose value is zero, so its dP is 0
// and its dS is P_sink (0 - D). One CTA per head sums every row of every
// sequence in a fixed order, so the result is deterministic.
struct DsinksParams {
  const float* sinks;  // (nheads,)
  float* dsinks;       // (nheads,), written
  const float* lse;
  int64_t lse_batch, lse_head, lse_seq;
  const float* dsum;  // (nheads, rows_q)
  int64_t rows_q;
  const int32_t* cu_seqlens_q;
  int batch, seqlen_q;
};

constexpr int kDsinksThreads = 256;

template <Family F>
__global__ void __launch_bounds__(kDsinksThreads) flash_bwd_dsinks_kernel(DsinksParams const p) {
  __shared__ float warp_sums[kDsinksThreads / 32];
  const int head = blockIdx.x;
  const float sink = p.sinks[head];
  const float* dsum = p.dsum + head * p.rows_q;
  const bool varlen = p.cu_seqlens_q != nullptr;
  float sum = 0.0f;
  for (int b = 0; b < p.batch; ++b) {
    const SeqExtent seq = seq_extent(p.cu_seqlens_q, p.seqlen_q, b);
    const float* lse =
        p.lse + (varlen ? seq.row0 * p.lse_seq : b * p.lse_batch) + head * p.lse_head;
    for (int i = threadIdx.x; i < seq.len; i += kDsinksThreads) {
      sum += expf(sink - lse[i * p.lse_seq]) * dsum[seq.row0 + i];
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kDsinksThreads / 32; ++w) total += warp_sums[w];
    p.dsinks[head] = -total;
  }
}

// Launches step 1b where the call has sinks and wants their gradient (F names
// the family whose cubins hold the kernel).
template <Family F>
cudaError_t launch_dsinks(const AttentionBackwardProblem& P, const float* dsum, int64_t rows_q) {
  if (P.dsinks == nullptr || P.terms.sinks == nullptr) return cudaSuccess;
  DsinksParams d{};
  d.sinks = P.terms.sinks;
  d.dsinks = P.dsinks;
  d.lse = P.lse;
  d.lse_batch = P.lse_batch_stride, d.lse_head = P.lse_head_stride;
  d.lse_seq = P.lse_seq_stride;
  d.dsum = dsum;
  d.rows_q = rows_q;
  d.cu_seqlens_q = P.cu_seqlens_q;
  d.batch = P.batch;
  d.seqlen_q = P.seqlen_q;
  flash_bwd_dsinks_kernel<F><<<unsigned(P.nheads), kDsinksThreads, 0, P.stream>>>(d);
  return cudaGetLastError();
}

// ---------------------------------------------------------------- step 3
struct ConvertParams {
  const float* accum;  // (heads * group, rows, headdim)
  void* out;
  int64_t out_batch, out_seq, out_head;
  int64_t rows;
  int heads, group;  // output heads; accumulator heads summed per output head
  int seqlen;        // fixed length: rows per batch; varlen: 0 (rows are packed)
  int headdim;
  float scale;
};

// out[row, head, :] = scale * sum_g accum[head * group + g, row, :], kVector
// elements per thread (8: a 16-byte store; 1 where rows are not 16-byte
// aligned).
template <class Element, int kVector, Family F>
__global__ void __launch_bounds__(256) flash_bwd_convert_kernel(ConvertParams const p) {
  const int vectors = p.headdim / kVector;
  const int64_t total = p.rows * p.heads * vectors;
  for (int64_t index = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; index < total;
       index += int64_t(gridDim.x) * blockDim.x) {
    const int col = int(index % vectors) * kVector;
    const int64_t rest = index / vectors;
    const int head = int(rest % p.heads);
    const int64_t row = rest / p.heads;
    float sum[kVector] = {};
    for (int g = 0; g < p.group; ++g) {
      const float* src = p.accum + ((int64_t(head) * p.group + g) * p.rows + row) * p.headdim + col;
      CUTE_UNROLL
      for (int i = 0; i < kVector; ++i) sum[i] += src[i];
    }
    const int64_t out_row = p.seqlen > 0
                                ? (row / p.seqlen) * p.out_batch + (row % p.seqlen) * p.out_seq
                                : row * p.out_seq;
    Element values[kVector];
    CUTE_UNROLL
    for (int i = 0; i < kVector; ++i) values[i] = static_cast<Element>(sum[i] * p.scale);
    Element* out = static_cast<Element*>(p.out) + out_row + head * p.out_head + col;
    if constexpr (kVector == 8) {
      *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(values);
    } else {
      CUTE_UNROLL
      for (int i = 0; i < kVector; ++i) out[i] = values[i];
    }
  }
}

// Step 3 with GQA: dk = scale x the sum over each group of the query heads'
// dK accumulators, dv the same unscaled (F names the family whose cubins
// hold the kernel; `vectors`: 16-byte rows).
template <class Element, Family F>
cudaError_t launch_group_sums(const AttentionBackwardProblem& P, const float* dk_accum,
                              const float* dv_accum, int64_t rows_k, bool vectors) {
  ConvertParams c{};
  c.headdim = P.headdim;
  c.rows = rows_k;
  c.heads = P.nheads_k;
  c.group = P.kv_group;
  c.seqlen = P.cu_seqlens_k != nullptr ? 0 : P.seqlen_k;
  const int64_t work = c.rows * c.heads * (vectors ? c.headdim / 8 : c.headdim);
  if (work == 0) return cudaSuccess;
  const int blocks =
      int(std::min<int64_t>((work + 255) / 256, int64_t(std::max(P.sm_count, 1)) * 8));
  auto launch = [&] {
    if (vectors) {
      flash_bwd_convert_kernel<Element, 8, F><<<blocks, 256, 0, P.stream>>>(c);
    } else {
      flash_bwd_convert_kernel<Element, 1, F><<<blocks, 256, 0, P.stream>>>(c);
    }
    return cudaGetLastError();
  };
  c.accum = dk_accum;
  c.scale = P.softmax_scale;
  c.out = P.dk.ptr;
  c.out_batch = P.dk.batch_stride, c.out_seq = P.dk.seq_stride, c.out_head = P.dk.head_stride;
  const cudaError_t status = launch();
  if (status != cudaSuccess) return status;
  c.accum = dv_accum;
  c.scale = 1.0f;
  c.out = P.dv.ptr;
  c.out_batch = P.dv.batch_stride, c.out_seq = P.dv.seq_stride, c.out_head = P.dv.head_stride;
  return launch();
}

// out[0], out[1] = a, b as 16-bit elements: one 32-bit store when `pair`
// (out 4-byte aligned), else one or, with `second`, two element stores.
template <class Element>
__device__ inline void store_pair(Element* out, float a, float b, bool pair, bool second) {
  if (pair) {
    Element values[2] = {static_cast<Element>(a), static_cast<Element>(b)};
    *reinterpret_cast<uint32_t*>(out) = *reinterpret_cast<const uint32_t*>(values);
  } else {
    out[0] = static_cast<Element>(a);
    if (second) out[1] = static_cast<Element>(b);
  }
}

// dq = scale x the dQ accumulator of one query tile (fragment order, see
// dq_tile_accum): a CTA of the main kernel's threads per (query tile, head,
// batch) reads its fragments back coalesced and stores pairs of columns.
struct ConvertDqParams {
  const float* accum;
  int64_t head_stride;
  void* dq;
  int64_t dq_batch, dq_seq, dq_head;
  const int32_t* cu_seqlens_q;
  int seqlen_q, headdim;
  bool vectors;  // 16-byte rows: column pairs stored as 32 bits
  float scale;
};

// The conversion's parameters for a call (the accumulator's layout: the
// workspace's; its order within a tile: the family's).
inline ConvertDqParams convert_dq_params(const AttentionBackwardProblem& P,
                                         const FlashBwdWorkspace& layout, const float* dq_accum,
                                         bool vectors) {
  ConvertDqParams c{};
  c.accum = dq_accum;
  c.head_stride = int64_t(layout.dq_head_stride);
  c.dq = P.dq.ptr;
  c.dq_batch = P.dq.batch_stride, c.dq_seq = P.dq.seq_stride, c.dq_head = P.dq.head_stride;
  c.cu_seqlens_q = P.cu_seqlens_q;
  c.seqlen_q = P.seqlen_q;
  c.headdim = P.headdim;
  c.vectors = vectors;
  c.scale = P.softmax_scale;
  return c;
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads)
    flash_bwd_convert_dq_kernel(ConvertDqParams const p) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kSplits = Traits::kDQSplits;
  const int tid = threadIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int m0 = blockIdx.x * Traits::kBlockM;
  const SeqExtent seq = seq_extent(p.cu_seqlens_q, p.seqlen_q, batch);
  if (m0 >= seq.len) return;
  auto tile_dq = Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim / kSplits>>{};
  typename Traits::TiledMmaDQ mma_dq;
  auto thr_dq = mma_dq.get_slice(tid);
  Tensor acc = partition_fragment_C(mma_dq, tile_dq);
  Tensor coords = rowcol_view(thr_dq.partition_C(make_identity_tensor(tile_dq)));
  Tensor values = rowcol_view(acc);
  const float* accum =
      dq_tile_accum<Traits>(const_cast<float*>(p.accum), p.head_stride, head, batch, seq.row0, m0) +
      tid;
  const bool varlen = p.cu_seqlens_q != nullptr;
  Element* dq = static_cast<Element*>(p.dq) + (varlen ? seq.row0 * p.dq_seq : batch * p.dq_batch) +
                head * p.dq_head + int64_t(m0) * p.dq_seq;
  const int rows_left = seq.len - m0;
  CUTE_UNROLL
  for (int split = 0; split < kSplits; ++split) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) {
      acc(i) = accum[(split * size(acc) + i) * Traits::kThreads];
    }
    const int col0 = split * (Traits::kHeadDim / kSplits);
    CUTE_UNROLL
    for (int r = 0; r < size<0>(values); ++r) {
      const int row = get<0>(coords(r, 0));
      if (row >= rows_left) continue;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(values); c += 2) {
        const int col = col0 + get<1>(coords(r, c));  // columns c, c + 1 are adjacent
        if (col >= p.headdim) continue;
        store_pair(dq + int64_t(row) * p.dq_seq + col, values(r, c) * p.scale,
                   values(r, c + 1) * p.scale, p.vectors, col + 1 < p.headdim);
      }
    }
  }
}

// ---------------------------------------------------------------- step 2
// kVectors: the host's GmemAccess choice (backward_vectors), as in
// flash_fwd_kernel; it also picks 32-bit pair stores of dK and dV. One CTA
// per SM is what the tiles are sized for (flash_sm80_tiles.h).
// kTermsKernel: the kernel reads ALiBi slopes, and with
// TermsKernel::masked a mask too (score_terms.cuh); separate kernels so that
// calls without them run code that never carries them (vectors only).
template <class Traits, bool kVectors, TermsKernel kTermsKernel = TermsKernel::none>
__global__ void __launch_bounds__(Traits::kThreads, 1) flash_bwd_kernel(FlashBwdParams const p) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr bool kAsync = Traits::kAsyncCopy;
  constexpr float kLog2e = 1.4426950408889634f;
  static_assert(Traits::kThreads >= kBlockM, "one thread per query row fetches LSE and D");
  const int tid = threadIdx.x;

  const int n_block = blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int kv_head = head / p.kv_group;
  const SeqExtent seq_q = seq_extent(p.cu_seqlens_q, p.seqlen_q, batch);
  const SeqExtent seq_k = seq_extent(p.cu_seqlens_k, p.seqlen_k, batch);
  const int seqlen_q = seq_q.len, seqlen_k = seq_k.len;
  const int n0 = n_block * kBlockN;
  if (n0 >= seqlen_k) return;
  const int keys_left = seqlen_k - n0;

  // The query tiles that attend some key of this tile form one range: both
  // ends of a row's key range grow with the row. (A scan, not a formula, so
  // that it agrees exactly with key_tiles, which also orders the
  // deterministic dQ accumulation.)
  const AttentionMask mask{seqlen_q, seqlen_k, p.window_left, p.window_right};
  auto attends = [&](int m_block) {
    int n_begin, n_end;
    mask.key_tiles(m_block * kBlockM, kBlockM, kBlockN, n_begin, n_end);
    return n_begin <= n_block && n_block < n_end;
  };
  const int m_blocks = (seqlen_q + kBlockM - 1) / kBlockM;
  int m_first = 0, m_last = -1;
  for (int m = 0; m < m_blocks; ++m) {
    if (attends(m)) {
      if (m_last < 0) m_first = m;
      m_last = m;
    } else if (m_last >= 0) {
      break;
    }
  }
  // The masked kernel's classes of this key tile's query tiles. Without the
  // deterministic order, whose semaphores count every query tile, the query
  // tiles the mask leaves out at either end are not visited at all.
  constexpr bool kMask = kTermsKernel == TermsKernel::masked;
  MaskTileColumn column{nullptr, 0};
  if constexpr (kMask) {
    column = mask_tile_column(p.mask_tiles, batch, head, n_block);
    if (p.semaphores == nullptr) {
      while (m_first <= m_last && column.empty(m_first)) ++m_first;
      while (m_last >= m_first && column.empty(m_last)) --m_last;
    }
  }

  typename Traits::TiledMmaDKV mma_dkv;
  auto thr_dkv = mma_dkv.get_slice(tid);
  auto tile_kv = Shape<Int<kBlockN>, Int<kHeadDim>>{};
  Tensor acc_dk = partition_fragment_C(mma_dkv, tile_kv);  // (MMA, MMA_N, MMA_D)
  Tensor acc_dv = partition_fragment_C(mma_dkv, tile_kv);
  clear(acc_dk);
  clear(acc_dv);

  if (m_first <= m_last) {
    const bool varlen_q = p.cu_seqlens_q != nullptr;
    const bool varlen_k = p.cu_seqlens_k != nullptr;
    const int64_t q_base = (varlen_q ? seq_q.row0 * p.q_seq : batch * p.q_batch) + head * p.q_head;
    const int64_t do_base =
        (varlen_q ? seq_q.row0 * p.do_seq : batch * p.do_batch) + head * p.do_head;
    const int64_t k_base =
        (varlen_k ? seq_k.row0 * p.k_seq : batch * p.k_batch) + kv_head * p.k_head;
    const int64_t v_base =
        (varlen_k ? seq_k.row0 * p.v_seq : batch * p.v_batch) + kv_head * p.v_head;
    const float* lse =
        p.lse + (varlen_q ? seq_q.row0 * p.lse_seq : batch * p.lse_batch) + head * p.lse_head;
    const float* dsum = p.dsum + head * p.rows_q + seq_q.row0;
    constexpr bool kTerms = kTermsKernel != TermsKernel::none;
    static_assert(!kTerms || kVectors, "score terms run on 16-byte vectors only");
    // Dropout (kernels with terms): the forward's keep decisions, redrawn.
    const bool dropout = kTerms && p.terms.dropout.seed != nullptr;
    const DropoutRng dropout_rng(kTerms ? p.terms.dropout : DropoutParams{}, batch, p.nheads, head);

    auto tile_q = Shape<Int<kBlockM>, Int<kHeadDim>>{};
    Tensor mQ = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.q) + q_base),
                            make_shape(seqlen_q, p.headdim), make_stride(p.q_seq, _1{}));
    Tensor mdO = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.dout) + do_base),
                             make_shape(seqlen_q, p.headdim), make_stride(p.do_seq, _1{}));
    Tensor mK = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.k) + k_base),
                            make_shape(seqlen_k, p.headdim), make_stride(p.k_seq, _1{}));
    Tensor mV = make_tensor(make_gmem_ptr(static_cast<Element const*>(p.v) + v_base),
                            make_shape(seqlen_k, p.headdim), make_stride(p.v_seq, _1{}));
    Tensor gQ = local_tile(mQ, tile_q, make_coord(_, 0));         // (BM, D, m)
    Tensor gdO = local_tile(mdO, tile_q, make_coord(_, 0));       // (BM, D, m)
    Tensor gK = local_tile(mK, tile_kv, make_coord(n_block, 0));  // (BN, D)
    Tensor gV = local_tile(mV, tile_kv, make_coord(n_block, 0));  // (BN, D)

    // Shared memory: kQStages x (Q, dO), K, V, P, dS, then the tile's LSE and D.
    using TileQ = typename Traits::TileQ;
    using TileKV = typename Traits::TileKV;
    using TileP = typename Traits::TileP;
    constexpr int kStages = Traits::kQStages;
    constexpr int kTileQElements = cosize_v<typename TileQ::Layout>;
    extern __shared__ __align__(128) char shared_memory[];
    Element* smem_q = reinterpret_cast<Element*>(shared_memory);  // stage s at + 2 s kTileQElements
    Element* smem_do = smem_q + kTileQElements;
    Element* smem_k = smem_q + 2 * kStages * kTileQElements;
    Element* smem_v = smem_k + cosize_v<typename TileKV::Layout>;
    Element* smem_p = smem_v + cosize_v<typename TileKV::Layout>;
    Element* smem_ds = smem_p + cosize_v<typename TileP::Layout>;
    float* smem_lse = reinterpret_cast<float*>(smem_ds + cosize_v<typename TileP::Layout>);
    float* smem_dsum = smem_lse + kBlockM;
    Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename TileQ::Layout{});
    Tensor sdOtNoSwizzle =
        make_tensor(make_smem_ptr(smem_do), typename TileQ::TransposedNoSwizzle{});
    Tensor sK = make_tensor(make_smem_ptr(smem_k), typename TileKV::Layout{});
    Tensor sKt = make_tensor(make_smem_ptr(smem_k), typename TileKV::Transposed{});
    Tensor sKtNoSwizzle =
        make_tensor(make_smem_ptr(smem_k), typename TileKV::TransposedNoSwizzle{});
    Tensor sV = make_tensor(make_smem_ptr(smem_v), typename TileKV::Layout{});
    Tensor sP = make_tensor(make_smem_ptr(smem_p), typename TileP::Layout{});
    Tensor sPt = make_tensor(make_smem_ptr(smem_p), typename TileP::Transposed{});
    Tensor sPtNoSwizzle = make_tensor(make_smem_ptr(smem_p), typename TileP::TransposedNoSwizzle{});
    Tensor sdS = make_tensor(make_smem_ptr(smem_ds), typename TileP::Layout{});
    Tensor sdSt = make_tensor(make_smem_ptr(smem_ds), typename TileP::Transposed{});

    // Global -> shared partitions and the head-dim predicates (Q and K tiles
    // share the column partition).
    typename Traits::GmemTiledCopyLoad gmem_load;
    auto load_thr = gmem_load.get_slice(tid);
    Tensor tQcQ = load_thr.partition_S(make_identity_tensor(tile_q));
    Tensor tKVcKV = load_thr.partition_S(make_identity_tensor(tile_kv));
    Tensor tQcolok = make_tensor<bool>(make_shape(size<2>(tQcQ)));
    CUTE_UNROLL
    for (int j = 0; j < size(tQcolok); ++j) tQcolok(j) = get<1>(tQcQ(0, 0, j)) < p.headdim;
    const GmemAccess access{kVectors, p.headdim};

    // S and dP: A = Q / dO, B = K / V, both K-major (ldmatrix).
    std::conditional_t<kTerms, typename Traits::TiledMmaSdPBlocks, typename Traits::TiledMmaSdP>
        mma_sdp;
    auto thr_sdp = mma_sdp.get_slice(tid);
    Tensor tSrA = thr_sdp.partition_fragment_A(sQ);  // (MMA, MMA_M, D/16), Q or dO
    Tensor tSrB = thr_sdp.partition_fragment_B(sK);  // (MMA, MMA_N, D/16), K or V
    auto copy_a_sdp = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_sdp);
    auto thr_copy_a_sdp = copy_a_sdp.get_slice(tid);
    Tensor tSrA_view = thr_copy_a_sdp.retile_D(tSrA);
    auto copy_b_sdp = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, mma_sdp);
    auto thr_copy_b_sdp = copy_b_sdp.get_slice(tid);
    Tensor tSsK = thr_copy_b_sdp.partition_S(sK);
    Tensor tdPsV = thr_copy_b_sdp.partition_S(sV);
    Tensor tSrB_view = thr_copy_b_sdp.retile_D(tSrB);
    // P and dS to shared memory, as 16-bit C fragments.
    auto copy_c_sdp = make_tiled_copy_C(typename Traits::SmemCopyAtomC{}, mma_sdp);
    auto thr_copy_c_sdp = copy_c_sdp.get_slice(tid);
    Tensor tPsP = thr_copy_c_sdp.partition_D(sP);
    Tensor tdSsdS = thr_copy_c_sdp.partition_D(sdS);
    Tensor tScS =
        rowcol_view(thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{})));

    // dV and dK: A = P^T / dS^T, B = dO^T / Q^T, both M/N-major (ldmatrix.trans).
    Tensor tdKVrA = thr_dkv.partition_fragment_A(sPtNoSwizzle);   // (MMA, MMA_N, BM/16)
    Tensor tdKVrB = thr_dkv.partition_fragment_B(sdOtNoSwizzle);  // (MMA, MMA_D, BM/16)
    auto copy_a_dkv = make_tiled_copy_A(typename Traits::SmemCopyAtomTransposed{}, mma_dkv);
    auto thr_copy_a_dkv = copy_a_dkv.get_slice(tid);
    Tensor tdVsPt = thr_copy_a_dkv.partition_S(sPt);
    Tensor tdKsdSt = thr_copy_a_dkv.partition_S(sdSt);
    Tensor tdKVrA_view = thr_copy_a_dkv.retile_D(tdKVrA);
    auto copy_b_dkv = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma_dkv);
    auto thr_copy_b_dkv = copy_b_dkv.get_slice(tid);
    Tensor tdKVrB_view = thr_copy_b_dkv.retile_D(tdKVrB);

    // dQ: A = dS (ldmatrix), B = K^T (ldmatrix.trans), in kDQSplits column
    // slices of the head dim.
    constexpr int kDQSplits = Traits::kDQSplits;
    auto tile_dq = Shape<Int<kBlockM>, Int<kHeadDim / kDQSplits>>{};
    auto tile_kt_slice = Shape<Int<kHeadDim / kDQSplits>, Int<kBlockN>>{};
    typename Traits::TiledMmaDQ mma_dq;
    auto thr_dq = mma_dq.get_slice(tid);
    Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);  // (MMA, MMA_M, BN/16)
    Tensor tdQrKt = thr_dq.partition_fragment_B(
        local_tile(sKtNoSwizzle, tile_kt_slice, make_coord(0, 0)));  // (MMA, MMA_D, BN/16)
    auto copy_a_dq = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_dq);
    auto thr_copy_a_dq = copy_a_dq.get_slice(tid);
    Tensor tdQsdS = thr_copy_a_dq.partition_S(sdS);
    Tensor tdQrdS_view = thr_copy_a_dq.retile_D(tdQrdS);
    auto copy_b_dq = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma_dq);
    auto thr_copy_b_dq = copy_b_dq.get_slice(tid);
    Tensor tdQrKt_view = thr_copy_b_dq.retile_D(tdQrKt);

    // Q and dO of a stage: the stage-0 tensors moved by whole tiles (which
    // leaves the swizzle pattern unchanged).
    auto stage_q = [&](int stage) {
      return make_tensor(make_smem_ptr(smem_q + 2 * stage * kTileQElements),
                         typename TileQ::Layout{});
    };
    auto stage_qt = [&](int stage) {
      return make_tensor(make_smem_ptr(smem_q + 2 * stage * kTileQElements),
                         typename TileQ::Transposed{});
    };
    auto stage_do = [&](int stage) {
      return make_tensor(make_smem_ptr(smem_do + 2 * stage * kTileQElements),
                         typename TileQ::Layout{});
    };
    auto stage_dot = [&](int stage) {
      return make_tensor(make_smem_ptr(smem_do + 2 * stage * kTileQElements),
                         typename TileQ::Transposed{});
    };

    // A query tile: Q and dO by cp.async, LSE (base 2) and D to registers,
    // stored to shared memory once the previous tile is done with them.
    float next_lse = INFINITY, next_dsum = 0.0f;
    auto load_query_tile = [&](int m_block, int stage) {
      if (column.empty(m_block)) return;  // skipped: nothing of it is read
      const int rows_left = seqlen_q - m_block * kBlockM;
      load_tile<kAsync>(gmem_load, gQ(_, _, m_block), stage_q(stage), tQcQ, tQcolok, rows_left,
                        access);
      load_tile<kAsync>(gmem_load, gdO(_, _, m_block), stage_do(stage), tQcQ, tQcolok, rows_left,
                        access);
      if (tid < kBlockM) {
        const int row = m_block * kBlockM + tid;
        // Rows past the end: P = exp2(-inf) = 0, so they contribute nothing.
        next_lse = row < seqlen_q ? lse[row * p.lse_seq] * kLog2e : INFINITY;
        next_dsum = row < seqlen_q ? dsum[row] : 0.0f;
      }
    };

    // Prologue: K, V and the first query tile.
    load_tile<kAsync>(gmem_load, gK, sK, tKVcKV, tQcolok, keys_left, access);
    load_tile<kAsync>(gmem_load, gV, sV, tKVcKV, tQcolok, keys_left, access);
    load_query_tile(m_first, 0);
    cp_async_fence();

    for (int m_block = m_first; m_block <= m_last; ++m_block) {
      const int m0 = m_block * kBlockM;
      const int stage = kStages == 1 ? 0 : (m_block - m_first) % 2;
      if (tid < kBlockM) {
        smem_lse[tid] = next_lse;
        smem_dsum[tid] = next_dsum;
      }
      // Q, dO (and K, V) have landed; every warp is done with P, dS and the
      // other stage.
      cp_async_wait<0>();
      __syncthreads();
      if constexpr (kStages == 2) {
        // The next query tile streams in during this whole one.
        if (m_block < m_last) load_query_tile(m_block + 1, stage ^ 1);
        cp_async_fence();
      }
      Tensor tSsQ = thr_copy_a_sdp.partition_S(stage_q(stage));
      Tensor tdPsdO = thr_copy_a_sdp.partition_S(stage_do(stage));
      Tensor tdVsdOt = thr_copy_b_dkv.partition_S(stage_dot(stage));
      Tensor tdKsQt = thr_copy_b_dkv.partition_S(stage_qt(stage));

      // A query tile the mask leaves out adds nothing (uniform over the CTA).
      const bool skip = column.empty(m_block);
      if (!skip) {
        // S = Q K^T, then P = exp2(S log2(e) scale - LSE log2(e)).
        Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
        clear(acc_s);
        gemm_from_smem<false>(mma_sdp, acc_s, tSrA, tSsQ, tSrA_view, copy_a_sdp, tSrB, tSsK,
                              tSrB_view, copy_b_sdp);
        // Softcap: s -> softcap tanh(s scale / softcap). Its derivative
        // 1 - tanh^2 is recovered from P below rather than kept in registers
        // next to dP.
        if (p.softcap > 0.0f) {
          CUTE_UNROLL
          for (int i = 0; i < size(acc_s); ++i)
            acc_s(i) = p.softcap * tanhf(acc_s(i) * p.softcap_pre);
        }
        Tensor scores = rowcol_view(acc_s);
        if constexpr (kTerms) {
          apply_score_terms<kMask>(
              scores, tScS, m0, n0, p.terms, batch, [head](int) { return head; },
              AttentionMask::Identity{}, mask, /*read_mask=*/column.partial(m_block));
        }
        if (mask.tile_needs_mask(m0, kBlockM, n0, kBlockN)) mask.apply(scores, tScS, m0, n0);
        CUTE_UNROLL
        for (int r = 0; r < size<0>(scores); ++r) {
          const float row_lse = smem_lse[get<0>(tScS(r, 0))];
          CUTE_UNROLL
          for (int c = 0; c < size<1>(scores); ++c) {
            scores(r, c) = fast_exp2(scores(r, c) * p.scale_log2 - row_lse);
          }
        }
        // Dropout: dV takes the kept probabilities, scaled; the bits stay for dS.
        constexpr int kScores = decltype(size(acc_s))::value;
        uint32_t kept_bits[kTerms ? (kScores + 31) / 32 : 1];
        {
          Tensor probs = convert_fragment<Element>(acc_s);
          if constexpr (kTerms) {
            if (dropout) {
              CUTE_UNROLL
              for (int i = 0; i < (kScores + 31) / 32; ++i) kept_bits[i] = 0u;
              constexpr int kRows = decltype(size<0>(scores))::value;
              Tensor probs_rc = rowcol_view(probs);
              const float scale = p.terms.dropout.scale;
              for_each_dropout<Traits::kDropoutCols>(
                  scores, tScS, m0, n0, dropout_rng, [&](int r, int c, bool kept) {
                    const int i = r + kRows * c;
                    kept_bits[i / 32] |= uint32_t(kept) << (i % 32);
                    probs_rc(r, c) = kept ? static_cast<Element>(scores(r, c) * scale) : Element(0);
                  });
            }
          }
          copy(copy_c_sdp, thr_copy_c_sdp.retile_S(probs), tPsP);
        }

        // dP = dO V^T, then dS = P (dP - D).
        Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
        clear(acc_dp);
        gemm_from_smem<false>(mma_sdp, acc_dp, tSrA, tdPsdO, tSrA_view, copy_a_sdp, tSrB, tdPsV,
                              tSrB_view, copy_b_sdp);
        Tensor dp = rowcol_view(acc_dp);
        if constexpr (kTerms) {
          // With dropout, the gradient of a dropped probability is 0, of a kept
          // one dP / (1 - p); D already holds the dropped output's rowsum.
          if (dropout) {
            constexpr int kRows = decltype(size<0>(dp))::value;
            const float scale = p.terms.dropout.scale;
            CUTE_UNROLL
            for (int r = 0; r < size<0>(dp); ++r) {
              CUTE_UNROLL
              for (int c = 0; c < size<1>(dp); ++c) {
                const int i = r + kRows * c;
                dp(r, c) = (kept_bits[i / 32] >> (i % 32)) & 1u ? dp(r, c) * scale : 0.0f;
              }
            }
          }
        }
        CUTE_UNROLL
        for (int r = 0; r < size<0>(dp); ++r) {
          const float row_dsum = smem_dsum[get<0>(tScS(r, 0))];
          CUTE_UNROLL
          for (int c = 0; c < size<1>(dp); ++c) dp(r, c) = scores(r, c) * (dp(r, c) - row_dsum);
        }
        if constexpr (kMask) {
          // dS is also the gradient of an additive mask (added after softcap).
          if (p.dmask != nullptr) {
            CUTE_UNROLL
            for (int r = 0; r < size<0>(dp); ++r) {
              const int row = m0 + get<0>(tScS(r, 0));
              if (row >= seqlen_q) continue;
              float* dmask = p.dmask + ((int64_t(batch) * p.nheads + head) * p.seqlen_q + row) *
                                           int64_t(p.seqlen_k);
              CUTE_UNROLL
              for (int c = 0; c < size<1>(dp); ++c) {
                const int key = n0 + get<1>(tScS(0, c));
                if (key < seqlen_k) dmask[key] = dp(r, c);
              }
            }
          }
        }
        if (p.softcap > 0.0f) {
          // With softcap scale_log2 is log2(e): log2(P) + LSE = log2(e) (cap +
          // terms), so tanh = (log2(P) + LSE) / (log2(e) softcap) - terms /
          // softcap. P = 0 (masked or underflowed) already gives dS = 0.
          const float tanh_per_log2 = 1.0f / (p.scale_log2 * p.softcap);
          CUTE_UNROLL
          for (int r = 0; r < size<0>(dp); ++r) {
            const float row_lse = smem_lse[get<0>(tScS(r, 0))];
            CUTE_UNROLL
            for (int c = 0; c < size<1>(dp); ++c) {
              if (scores(r, c) > 0.0f) {
                float t = (fast_log2(scores(r, c)) + row_lse) * tanh_per_log2;
                if constexpr (kTerms) {
                  const int row = m0 + get<0>(tScS(r, 0));
                  const RowTerms row_terms(p.terms, batch, head, row, mask);
                  t -= additive_term<kMask>(p.terms, row_terms, n0 + get<1>(tScS(0, c)), seqlen_k) /
                       p.softcap;
                }
                dp(r, c) *= 1.0f - t * t;
              }
            }
          }
        }
        {
          Tensor ds = convert_fragment<Element>(acc_dp);
          copy(copy_c_sdp, thr_copy_c_sdp.retile_S(ds), tdSsdS);
        }
        __syncthreads();

        // dV += P^T dO, dK += dS^T Q.
        gemm_from_smem<false>(mma_dkv, acc_dv, tdKVrA, tdVsPt, tdKVrA_view, copy_a_dkv, tdKVrB,
                              tdVsdOt, tdKVrB_view, copy_b_dkv);
        gemm_from_smem<false>(mma_dkv, acc_dk, tdKVrA, tdKsdSt, tdKVrA_view, copy_a_dkv, tdKVrB,
                              tdKsQt, tdKVrB_view, copy_b_dkv);
      }
      if constexpr (kStages == 1) {
        // Every warp is done with Q and dO: the next tile streams in during dQ.
        __syncthreads();
        if (m_block < m_last) load_query_tile(m_block + 1, 0);
        cp_async_fence();
      }

      // dQ = dS K, added to the fp32 accumulator.
      int* semaphore = nullptr;
      CUTE_UNROLL
      for (int split = 0; split < kDQSplits; ++split) {
        Tensor acc_dq = partition_fragment_C(mma_dq, tile_dq);
        clear(acc_dq);
        Tensor tdQsKt =
            thr_copy_b_dq.partition_S(local_tile(sKt, tile_kt_slice, make_coord(split, 0)));
        if (!skip) {
          gemm_from_smem<false>(mma_dq, acc_dq, tdQrdS, tdQsdS, tdQrdS_view, copy_a_dq, tdQrKt,
                                tdQsKt, tdQrKt_view, copy_b_dq);
        }
        if (split == 0 && p.semaphores != nullptr) {
          // Deterministic: the key tiles attended by this query tile add in
          // increasing order; this one waits for the ones before it.
          semaphore = p.semaphores + (int64_t(batch) * p.nheads + head) * p.sem_per_head + m_block;
          int n_begin, n_end;
          mask.key_tiles(m0, kBlockM, kBlockN, n_begin, n_end);
          if (tid == 0) {
            while (load_acquire(semaphore) != n_block - n_begin) {
            }
          }
          __syncthreads();
        }
        // Rows past the sequence and columns past the head dim hold zeros
        // (P = 0, K zero-filled) and land in the tile's own padding.
        float* dq_accum =
            dq_tile_accum<Traits>(p.dq_accum, p.dq_head_stride, head, batch, seq_q.row0, m0) +
            split * size(acc_dq) * Traits::kThreads + tid;
        if (!skip) {
          CUTE_UNROLL
          for (int i = 0; i < size(acc_dq); ++i) {
            red_add(dq_accum + i * Traits::kThreads, acc_dq(i));
          }
        }
      }
      if (semaphore != nullptr) {
        __threadfence();
        __syncthreads();
        if (tid == 0) atomicAdd(semaphore, 1);
      }
    }
  }

  // Epilogue: dK (times the softmax scale) and dV of the in-range keys, zeros
  // for keys that no query attends. Without GQA straight to the outputs as
  // pairs of 16-bit elements, else this query head's share in fp32 to the
  // workspace (summed per group later).
  Tensor dk_rc = rowcol_view(acc_dk);
  Tensor dv_rc = rowcol_view(acc_dv);
  Tensor coords = rowcol_view(thr_dkv.partition_C(make_identity_tensor(tile_kv)));
  const bool direct = p.kv_group == 1;
  const bool varlen_k = p.cu_seqlens_k != nullptr;
  Element* dk_out = static_cast<Element*>(p.dk) +
                    (varlen_k ? seq_k.row0 * p.dk_seq : batch * p.dk_batch) + head * p.dk_head +
                    int64_t(n0) * p.dk_seq;
  Element* dv_out = static_cast<Element*>(p.dv) +
                    (varlen_k ? seq_k.row0 * p.dv_seq : batch * p.dv_batch) + head * p.dv_head +
                    int64_t(n0) * p.dv_seq;
  const int64_t accum_offset = (head * p.rows_k + seq_k.row0 + n0) * p.headdim;
  CUTE_UNROLL
  for (int r = 0; r < size<0>(dk_rc); ++r) {
    const int row = get<0>(coords(r, 0));
    if (row >= keys_left) continue;
    CUTE_UNROLL
    for (int c = 0; c < size<1>(dk_rc); c += 2) {
      const int col = get<1>(coords(r, c));  // columns c, c + 1 are adjacent
      if (col >= p.headdim) continue;
      const bool second = col + 1 < p.headdim;
      if (direct) {
        const float scale = p.softmax_scale;
        store_pair(dk_out + row * p.dk_seq + col, dk_rc(r, c) * scale, dk_rc(r, c + 1) * scale,
                   kVectors, second);
        store_pair(dv_out + row * p.dv_seq + col, dv_rc(r, c), dv_rc(r, c + 1), kVectors, second);
      } else if (kVectors) {
        const int64_t offset = accum_offset + int64_t(row) * p.headdim + col;
        *reinterpret_cast<float2*>(p.dk_accum + offset) = make_float2(dk_rc(r, c), dk_rc(r, c + 1));
        *reinterpret_cast<float2*>(p.dv_accum + offset) = make_float2(dv_rc(r, c), dv_rc(r, c + 1));
      } else {
        // Rows of an odd head dim are not 8-byte aligned in the accumulator.
        const int64_t offset = accum_offset + int64_t(row) * p.headdim + col;
        p.dk_accum[offset] = dk_rc(r, c);
        p.dv_accum[offset] = dv_rc(r, c);
        if (second) {
          p.dk_accum[offset + 1] = dk_rc(r, c + 1);
          p.dv_accum[offset + 1] = dv_rc(r, c + 1);
        }
      }
    }
  }
}

}  // namespace samattn::attention
