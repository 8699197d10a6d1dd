// Softmax kernels over the middle mode of a contiguous (outer, dim, inner)
// tensor, forward and backward, for every family (each family's translation
// units compile these templates with their own -gencode).
//
// The math lives in two policies, Forward and Backward, on fp32 values:
// per-thread statistics of some elements of a row (accumulate), merged across
// threads (combine), turned into what the output needs (finalize) and applied
// element-wise (apply). The kernels only move data:
//   rows_in_registers_kernel  row held in registers, read once, written once
//   two_pass_kernel           long rows: statistics pass, then output pass;
//                             the row is cached in shared memory when it fits,
//                             and a row may be split over several CTAs
//   combine_splits_kernel     merges the statistics of a split row
//   columns_kernel            inner > 1: threads across inner, loop over dim
// The output is rounded once to the input dtype.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cute/numeric/numeric_types.hpp>

#include "softmax/softmax_config.h"
#include "softmax/softmax_plan.h"

namespace samattn::softmax {

template <DType D>
struct ElementOf;
template <>
struct ElementOf<DType::f16> {
  using type = cute::half_t;
};
template <>
struct ElementOf<DType::bf16> {
  using type = cute::bfloat16_t;
};
template <>
struct ElementOf<DType::f32> {
  using type = float;
};

// Pointers of one launch. Forward: in[0] = x, out = y. Backward: in[0] = y,
// in[1] = dy, out = dx.
template <class T>
struct Operands {
  const T* in[2];
  T* out;
};

namespace detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr unsigned kFullMask = 0xffffffffu;

// 2^x on the special-function unit (about 2 ulp; results below 2^-126 flush
// to 0). Inline PTX, so the accuracy does not depend on --use_fast_math.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// exp(x - shift). Subtracting before scaling keeps the rounding error
// relative to x - shift (as torch's exp(x - max)), not to |shift|, so
// statistics taken against different shifts stay consistent.
__device__ __forceinline__ float exp_minus(float x, float shift) {
  return fast_exp2((x - shift) * kLog2e);
}

// Forward: y = exp(x - max) / sum(exp(x - max)), torch semantics included: a
// row holding NaN or +inf, or only -inf, gives NaN everywhere.
//
// Statistics are an online pair (max, sum of exp(x - shift)) where shift is
// max, or 0 while max is -inf, so that leading -inf elements add 0 instead of
// exp(-inf - -inf) = NaN. apply() uses the true max: a row of only -inf then
// yields exp(NaN) = NaN as in torch; a NaN or +inf has already made sum NaN.
struct Forward {
  static constexpr int kInputs = 1;
  struct alignas(8) Stats {
    float max;
    float sum;
  };
  struct Final {
    float max;
    float inv_sum;
  };

  // Value of elements outside the row: they leave the stats unchanged.
  __device__ static float fill(int /*input*/) { return -INFINITY; }
  __device__ static Stats identity() { return {-INFINITY, 0.f}; }
  __device__ static float shift_of(float max) { return max == -INFINITY ? 0.f : max; }

  // in[input][e]: N elements of one row.
  template <int N>
  __device__ static void accumulate(Stats& stats, const float (&in)[kInputs][N]) {
    float max = stats.max;
#pragma unroll
    for (int e = 0; e < N; ++e) max = fmaxf(max, in[0][e]);
    const float shift = shift_of(max);
    float sum = 0.f;
#pragma unroll
    for (int e = 0; e < N; ++e) sum += exp_minus(in[0][e], shift);
    stats.sum = stats.sum * exp_minus(stats.max, shift) + sum;
    stats.max = max;
  }

  __device__ static Stats combine(const Stats& a, const Stats& b) {
    const float max = fmaxf(a.max, b.max);
    const float shift = shift_of(max);
    return {max, a.sum * exp_minus(a.max, shift) + b.sum * exp_minus(b.max, shift)};
  }

  __device__ static Stats shfl_xor(const Stats& s, int lane_mask) {
    return {__shfl_xor_sync(kFullMask, s.max, lane_mask),
            __shfl_xor_sync(kFullMask, s.sum, lane_mask)};
  }

  __device__ static Final finalize(const Stats& s) { return {s.max, __frcp_rn(s.sum)}; }

  template <int N>
  __device__ static void apply(const Final& f, const float (&in)[kInputs][N], float (&out)[N]) {
#pragma unroll
    for (int e = 0; e < N; ++e) out[e] = exp_minus(in[0][e], f.max) * f.inv_sum;
  }
};

// Backward: dx = y * (dy - sum(dy * y)).
struct Backward {
  static constexpr int kInputs = 2;  // y, dy
  struct alignas(8) Stats {
    float dot;
  };
  using Final = Stats;

  __device__ static float fill(int /*input*/) { return 0.f; }
  __device__ static Stats identity() { return {0.f}; }

  template <int N>
  __device__ static void accumulate(Stats& stats, const float (&in)[kInputs][N]) {
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < N; ++e) dot += in[0][e] * in[1][e];
    stats.dot += dot;
  }

  __device__ static Stats combine(const Stats& a, const Stats& b) { return {a.dot + b.dot}; }
  __device__ static Stats shfl_xor(const Stats& s, int lane_mask) {
    return {__shfl_xor_sync(kFullMask, s.dot, lane_mask)};
  }
  __device__ static Final finalize(const Stats& s) { return s; }

  template <int N>
  __device__ static void apply(const Final& f, const float (&in)[kInputs][N], float (&out)[N]) {
#pragma unroll
    for (int e = 0; e < N; ++e) out[e] = in[0][e] * (in[1][e] - f.dot);
  }
};

// ---------------------------------------------------------------- vectors

// kVec elements of T (at most 16 bytes) in 32-bit registers, 16-bit
// elements packed in pairs: 8 halves take 4 registers. (A register array of
// half_t, CuTe's included, gives every element a register of its own, which
// doubles register use and spills.)
template <class T, int kVec>
struct Vector {
  static constexpr int kBytes = kVec * static_cast<int>(sizeof(T));
  static constexpr int kWords = (kBytes + 3) / 4;
  static_assert(kBytes <= 16 && (sizeof(T) == 2 || sizeof(T) == 4));
  uint32_t word[kWords];

  __device__ __forceinline__ float get(int k) const {
    if constexpr (sizeof(T) == 4) {
      return __uint_as_float(word[k]);
    } else {
      return float(T::bitcast(static_cast<uint16_t>(word[k / 2] >> (16 * (k % 2)))));
    }
  }

  __device__ __forceinline__ void set(int k, T value) {
    if constexpr (sizeof(T) == 4) {
      word[k] = __float_as_uint(value);
    } else {
      const int shift = 16 * (k % 2);
      word[k / 2] = (word[k / 2] & ~(0xffffu << shift)) | (uint32_t{value.raw()} << shift);
    }
  }

  // Rounds kVec floats to T.
  __device__ __forceinline__ void set(const float (&values)[kVec]) {
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) word[k] = __float_as_uint(values[k]);
    } else {
#pragma unroll
      for (int w = 0; w < kWords; ++w) {
        const uint32_t low = T(values[2 * w]).raw();
        const uint32_t high = 2 * w + 1 < kVec ? T(values[2 * w + 1]).raw() : 0u;
        word[w] = low | (high << 16);
      }
    }
  }

  __device__ __forceinline__ void load(const T* p) {
    if constexpr (kBytes == 16) {
      const uint4 v = *reinterpret_cast<const uint4*>(p);
      word[0] = v.x, word[1] = v.y, word[2] = v.z, word[3] = v.w;
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) set(k, p[k]);
    }
  }

  __device__ __forceinline__ void store(T* p) const {
    if constexpr (kBytes == 16) {
      // One STG.128 (a plain uint4 assignment was sometimes split into four
      // 32-bit stores). No "memory" clobber, which costs registers: nothing
      // a thread reads later aliases what it stores here.
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(word[0]), "r"(word[1]),
                   "r"(word[2]), "r"(word[3]));
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) p[k] = T(get(k));
    }
  }
};

// The elements of one vector of every input, as floats.
template <int kInputs, class T, int kVec>
__device__ __forceinline__ void unpack(const Vector<T, kVec> (&v)[kInputs],
                                       float (&out)[kInputs][kVec]) {
#pragma unroll
  for (int i = 0; i < kInputs; ++i) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) out[i][k] = v[i].get(k);
  }
}

// Elements [begin, end) of the vector starting at row element `first` that
// lie inside [lo, hi), as small ints (one predicate pair per vector rather
// than per element).
template <int kVec, class Index>
struct VectorSpan {
  int begin, end;
  __device__ __forceinline__ VectorSpan(Index first, Index lo, Index hi)
      : begin(static_cast<int>(min(max(lo - first, Index{0}), Index{kVec}))),
        end(static_cast<int>(min(max(hi - first, Index{0}), Index{kVec}))) {}
  __device__ __forceinline__ bool full() const { return begin == 0 && end == kVec; }
  __device__ __forceinline__ bool has(int k) const { return k >= begin && k < end; }
};

// Loads the aligned vector of a row whose first element is `first` (a row
// index, negative for the vector holding the row start). Elements outside
// [lo, hi) read as `fill` and are not touched in memory; a vector wholly
// inside moves as one 16-byte load. Index is int where the row length
// allows, to save registers.
template <class Index, class T, int kVec>
__device__ __forceinline__ void load_vector(const T* row, Index first, Index lo, Index hi, T fill,
                                            Vector<T, kVec>& dst) {
  const T* vector = row + first;  // may precede the row, never leaves its 16 bytes
  const VectorSpan<kVec, Index> span(first, lo, hi);
  if (span.full()) {
    dst.load(vector);
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) dst.set(k, span.has(k) ? vector[k] : fill);
  }
}

// Stores the elements of `src` that lie inside [lo, hi) of the row.
template <class Index, class T, int kVec>
__device__ __forceinline__ void store_vector(T* row, Index first, Index lo, Index hi,
                                             const Vector<T, kVec>& src) {
  T* vector = row + first;
  const VectorSpan<kVec, Index> span(first, lo, hi);
  if (span.full()) {
    src.store(vector);
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      if (span.has(k)) vector[k] = T(src.get(k));
    }
  }
}

// The 8 bytes of a split chunk [lo, ...) of an output row where the split
// kernels pass statistics between launches (the plan keeps chunks >= 16
// bytes, so the slot lies inside the chunk; the write pass overwrites it).
template <class Stats, class T>
__device__ __forceinline__ Stats* stats_slot(T* row, int64_t lo) {
  static_assert(sizeof(Stats) <= 8 && alignof(Stats) <= 8);
  const uintptr_t address = (reinterpret_cast<uintptr_t>(row + lo) + 7) & ~uintptr_t{7};
  return reinterpret_cast<Stats*>(address);
}

// ------------------------------------------------------------- reductions

// All-reduce over aligned groups of kWidth lanes (every lane of the warp
// takes part; xor masks below kWidth stay inside a group).
template <class Op, int kWidth>
__device__ __forceinline__ typename Op::Stats group_allreduce(typename Op::Stats s) {
#pragma unroll
  for (int mask = kWidth / 2; mask > 0; mask /= 2) s = Op::combine(s, Op::shfl_xor(s, mask));
  return s;
}

// All-reduce over a CTA of kThreads (> 32) threads. `scratch` holds
// kThreads / 32 stats; callers alternate two scratch buffers between calls,
// which is why no barrier is needed after the reads.
template <class Op, int kThreads>
__device__ __forceinline__ typename Op::Stats cta_allreduce(typename Op::Stats s,
                                                            typename Op::Stats* scratch) {
  constexpr int kWarps = kThreads / 32;
  s = group_allreduce<Op, 32>(s);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = s;
  __syncthreads();
  s = scratch[threadIdx.x % kWarps];
  return group_allreduce<Op, kWarps>(s);
}

// All-reduce over a CTA of blockDim.x threads (a multiple of 32, at most
// 1024). Ends with a barrier, so `scratch` (32 stats) is free on return.
template <class Op>
__device__ __forceinline__ typename Op::Stats block_allreduce(typename Op::Stats s,
                                                              typename Op::Stats* scratch) {
  s = group_allreduce<Op, 32>(s);
  const int lane = threadIdx.x % 32;
  if (lane == 0) scratch[threadIdx.x / 32] = s;
  __syncthreads();
  s = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : Op::identity();
  s = group_allreduce<Op, 32>(s);
  __syncthreads();
  return s;
}

}  // namespace detail

// ------------------------------------------------------------------ kernels

template <int kThreadsPerRow>
struct RegisterRowsCta {
  // Rows of more than a warp take a whole CTA (cta_allreduce reduces it all).
  static constexpr int kThreads =
      kThreadsPerRow > 32 ? kThreadsPerRow : Tuning::kSmallRowCtaThreads;
  static constexpr int kRows = kThreads / kThreadsPerRow;
  // Whole-CTA rows: at least 1024 resident threads per SM, so at most 64
  // registers. Rows of a warp or less (4 or more rows per CTA, each lane with
  // its own row bounds) spill a few bytes at 64: they get 80 registers and
  // 768 threads.
  static constexpr int kMinBlocks = kThreadsPerRow <= 32 ? 6 : 1024 / kThreads;
};

// Rows in registers: kThreadsPerRow lanes (a power of two) share a row, each
// holding kVecs aligned 16-byte vectors of every input: lane l holds vectors
// l, l + kThreadsPerRow, ..., so a row's lanes read consecutive vectors.
// Short rows share a CTA (several rows per warp); rows of more than 32 lanes
// take a whole CTA. Operands share their offset from 16 bytes (the plan
// checks), so a vector index means the same elements in each.
template <class Op, class T, int kThreadsPerRow, int kVecs, Family F>
__global__ void __launch_bounds__(RegisterRowsCta<kThreadsPerRow>::kThreads,
                                  RegisterRowsCta<kThreadsPerRow>::kMinBlocks)
    rows_in_registers_kernel(Operands<T> ops, int64_t rows, int64_t dim) {
  using Stats = typename Op::Stats;
  using Cta = RegisterRowsCta<kThreadsPerRow>;
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kInputs = Op::kInputs;
  constexpr int kVecStride = kThreadsPerRow * kVec;  // elements between a lane's vectors
  constexpr int kWarpsPerRow = kThreadsPerRow / 32;
  __shared__ Stats scratch[2][kWarpsPerRow > 0 ? kWarpsPerRow : 1];

  const int lane = threadIdx.x % kThreadsPerRow;
  const int64_t groups = ceil_div(rows, Cta::kRows);
  int parity = 0;
  for (int64_t group = blockIdx.x; group < groups; group += gridDim.x, parity ^= 1) {
    const int64_t row = group * Cta::kRows + threadIdx.x / kThreadsPerRow;
    // Row-local indices fit in int (the plan sends only short rows here).
    // Lanes past the last row see an empty row: they move nothing.
    const int hi = row < rows ? static_cast<int>(dim) : 0;
    const int64_t offset = row * dim;
    const int first = lane * kVec - row_head(ops.in[0] + offset, sizeof(T), kVec);

    detail::Vector<T, kVec> fragment[kVecs][kInputs];
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
#pragma unroll
      for (int i = 0; i < kInputs; ++i) {
        detail::load_vector(ops.in[i] + offset, first + v * kVecStride, 0, hi, T(Op::fill(i)),
                            fragment[v][i]);
      }
    }
    // Vector by vector, so that few converted values are live at once (the
    // forward sum is rescaled, at 2 ulp, only when the running max grows).
    Stats stats = Op::identity();
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      float values[kInputs][kVec];
      detail::unpack(fragment[v], values);
      Op::accumulate(stats, values);
    }
    if constexpr (kThreadsPerRow <= 32) {
      stats = detail::group_allreduce<Op, kThreadsPerRow>(stats);
    } else {
      stats = detail::cta_allreduce<Op, kThreadsPerRow>(stats, scratch[parity]);
    }
    const typename Op::Final final_stats = Op::finalize(stats);
    // The output replaces input 0 in the fragment. Storing each vector as
    // soon as it is computed (16-bit types), or all of them after (fp32), is
    // what fits 64 registers without spills on sm_75/80/86/89 (ptxas 13.0,
    // found by trying; sm_90 SASS of the 16-bit forward spills 8-44 bytes).
    constexpr bool kStoreEach = sizeof(T) == 2;
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      float values[kInputs][kVec], result[kVec];
      detail::unpack(fragment[v], values);
      Op::apply(final_stats, values, result);
      fragment[v][0].set(result);
      if constexpr (kStoreEach) {
        detail::store_vector(ops.out + offset, first + v * kVecStride, 0, hi, fragment[v][0]);
      }
    }
    if constexpr (!kStoreEach) {
#pragma unroll
      for (int v = 0; v < kVecs; ++v) {
        detail::store_vector(ops.out + offset, first + v * kVecStride, 0, hi, fragment[v][0]);
      }
    }
  }
}

enum class Stage {
  whole_row,      // statistics and output of whole rows
  partial_stats,  // split rows: statistics of one chunk into its stats slot
  finish          // split rows: output of one chunk, from the combined slot
};

// Long rows: a CTA of kTwoPassThreads threads takes elements [lo, hi) of a
// row: whole rows (splits == 1), or chunk `lo / chunk` of a split row. A step
// moves kUnroll vectors of every input per thread: vectors j0 + u*kThreads
// with j0 = base + threadIdx.x. The first `cache_vecs` vectors of each input
// stay in dynamic shared memory between the passes; each thread reads back
// only what it wrote, so no barrier guards the cache. The output pass walks
// the row backwards, so that the uncached end of a long row, read last, is
// read again first (likely from L2).
template <class Op, class T, int kVec, int kUnroll, Stage kStage, Family F>
__global__ void __launch_bounds__(Tuning::kTwoPassThreads, 2)
    two_pass_kernel(Operands<T> ops, int64_t rows, int64_t dim, int64_t splits, int64_t chunk,
                    int64_t cache_vecs) {
  using Stats = typename Op::Stats;
  using Vec = detail::Vector<T, kVec>;
  constexpr int kInputs = Op::kInputs;
  constexpr int kThreads = Tuning::kTwoPassThreads;
  constexpr int kStepVecs = kUnroll * kThreads;
  extern __shared__ uint4 row_cache_storage[];
  __shared__ Stats scratch[32];
  Vec* const row_cache = reinterpret_cast<Vec*>(row_cache_storage);

  for (int64_t work = blockIdx.x; work < rows * splits; work += gridDim.x) {
    const int64_t row = work / splits;
    const int64_t lo = (work % splits) * chunk;
    const int64_t hi = min(lo + chunk, dim);
    const int64_t offset = row * dim;
    const int head = row_head(ops.in[0] + offset, sizeof(T), kVec);
    const int64_t first_vec = first_vector(lo, head, kVec);
    const int64_t end_vec = end_vector(hi, head, kVec);

    // One step: vectors j0 + u*kThreads of every input into fragment[u][*],
    // from the cache when `from_cache`, else from memory (and then into the
    // cache when `to_cache`). Offsets within a step are small ints.
    auto load_step = [&](int64_t base, Vec(&fragment)[kUnroll][kInputs], bool from_cache,
                         bool to_cache) {
      const int64_t j0 = base + threadIdx.x;
      const int64_t e0 = j0 * kVec - head;  // row element at the start of vector j0
      const int lo_rel = static_cast<int>(max(lo - e0, int64_t{-kVec}));
      const int hi_rel = static_cast<int>(min(hi - e0, int64_t{kStepVecs} * kVec));
      const int cached =
          static_cast<int>(min(max(cache_vecs - (j0 - first_vec), int64_t{0}), int64_t{kStepVecs}));
      Vec* const cache = row_cache + (j0 - first_vec);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int step_offset = u * kThreads * kVec;
#pragma unroll
        for (int i = 0; i < kInputs; ++i) {
          Vec& slot = cache[i * cache_vecs + u * kThreads];
          if (from_cache && u * kThreads < cached) {
            fragment[u][i] = slot;
          } else {
            detail::load_vector(ops.in[i] + offset + e0, step_offset, lo_rel, hi_rel,
                                T(Op::fill(i)), fragment[u][i]);
            if (to_cache && u * kThreads < cached) slot = fragment[u][i];
          }
        }
      }
    };

    Stats stats;
    if constexpr (kStage == Stage::finish) {
      stats = *detail::stats_slot<Stats>(ops.out + offset, lo);
      __syncthreads();  // every thread has the stats before the slot is overwritten
    } else {
      stats = Op::identity();
      for (int64_t base = first_vec; base < end_vec; base += kStepVecs) {
        Vec fragment[kUnroll][kInputs];
        load_step(base, fragment, false, true);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          float values[kInputs][kVec];
          detail::unpack(fragment[u], values);
          Op::accumulate(stats, values);
        }
      }
      stats = detail::block_allreduce<Op>(stats, scratch);
      if constexpr (kStage == Stage::partial_stats) {
        if (threadIdx.x == 0) *detail::stats_slot<Stats>(ops.out + offset, lo) = stats;
        continue;
      }
    }

    const typename Op::Final final_stats = Op::finalize(stats);
    const int64_t last_base = first_vec + (end_vec - 1 - first_vec) / kStepVecs * kStepVecs;
    for (int64_t base = last_base; base >= first_vec; base -= kStepVecs) {
      Vec fragment[kUnroll][kInputs];
      load_step(base, fragment, true, false);
      const int64_t e0 = (base + threadIdx.x) * kVec - head;
      const int lo_rel = static_cast<int>(max(lo - e0, int64_t{-kVec}));
      const int hi_rel = static_cast<int>(min(hi - e0, int64_t{kStepVecs} * kVec));
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float values[kInputs][kVec], result[kVec];
        detail::unpack(fragment[u], values);
        Op::apply(final_stats, values, result);
        Vec out;
        out.set(result);
        detail::store_vector(ops.out + offset + e0, u * kThreads * kVec, lo_rel, hi_rel, out);
      }
    }
  }
}

// Split rows, between the two two_pass_kernel launches: a warp per row merges
// the partial stats of its chunks and writes the result back to every slot.
constexpr int kCombineThreads = 128;

template <class Op, class T, Family F>
__global__ void __launch_bounds__(kCombineThreads)
    combine_splits_kernel(T* out, int64_t rows, int64_t dim, int64_t splits, int64_t chunk) {
  using Stats = typename Op::Stats;
  constexpr int kWarps = kCombineThreads / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32; row < rows;
       row += int64_t{gridDim.x} * kWarps) {
    T* out_row = out + row * dim;
    Stats stats = Op::identity();
    for (int64_t s = lane; s < splits; s += 32) {
      stats = Op::combine(stats, *detail::stats_slot<Stats>(out_row, s * chunk));
    }
    stats = detail::group_allreduce<Op, 32>(stats);
    for (int64_t s = lane; s < splits; s += 32)
      *detail::stats_slot<Stats>(out_row, s * chunk) = stats;
  }
}

// Softmax over dim with inner > 1: element (o, d, c) at (o*dim + d)*inner + c.
// A CTA takes `tile_vecs` vectors of kVec neighbouring columns (coalesced
// across threadIdx.x % tile_vecs) of one o, and blockDim.x / tile_vecs
// threads split dim. Stats per column are merged through shared memory, then
// the CTA reads the columns again (mostly from L2) and writes the output.
// kVec > 1 requires inner % kVec == 0 and 16-byte aligned operands.
template <class Op, class T, int kVec, Family F>
__global__ void __launch_bounds__(Tuning::kColumnThreads)
    columns_kernel(Operands<T> ops, int64_t outer, int64_t dim, int64_t inner, int tile_vecs) {
  using Stats = typename Op::Stats;
  using Vec = detail::Vector<T, kVec>;
  constexpr int kUnroll = Tuning::kColumnUnroll;
  constexpr int kInputs = Op::kInputs;
  __shared__ Stats partial[Tuning::kColumnThreads][kVec];

  const int dim_threads = blockDim.x / tile_vecs;
  const int tx = threadIdx.x % tile_vecs;
  const int ty = threadIdx.x / tile_vecs;
  const int64_t inner_vecs = inner / kVec;
  const int64_t tiles_per_outer = ceil_div(inner_vecs, tile_vecs);
  const int64_t d_step = int64_t{kUnroll} * dim_threads;

  for (int64_t tile = blockIdx.x; tile < outer * tiles_per_outer; tile += gridDim.x) {
    const int64_t o = tile / tiles_per_outer;
    const int64_t c = (tile % tiles_per_outer) * tile_vecs + tx;
    const bool active = c < inner_vecs;
    const int64_t column_offset = o * dim * inner + c * kVec;

    // Steps d0 + u*dim_threads of this thread's columns (fill past the tensor).
    auto load_step = [&](int64_t d0, Vec(&fragment)[kUnroll][kInputs]) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t d = d0 + int64_t{u} * dim_threads;
#pragma unroll
        for (int i = 0; i < kInputs; ++i) {
          if (active && d < dim) {
            fragment[u][i].load(ops.in[i] + column_offset + d * inner);
          } else {
#pragma unroll
            for (int k = 0; k < kVec; ++k) fragment[u][i].set(k, T(Op::fill(i)));
          }
        }
      }
    };
    // Column k of the fragment: its kUnroll steps of every input.
    auto column = [](const Vec(&fragment)[kUnroll][kInputs], int k,
                     float (&values)[kInputs][kUnroll]) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int i = 0; i < kInputs; ++i) values[i][u] = fragment[u][i].get(k);
      }
    };

    Stats stats[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) stats[k] = Op::identity();
    for (int64_t d0 = ty; d0 < dim; d0 += d_step) {
      Vec fragment[kUnroll][kInputs];
      load_step(d0, fragment);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        float values[kInputs][kUnroll];
        column(fragment, k, values);
        Op::accumulate(stats[k], values);
      }
    }

#pragma unroll
    for (int k = 0; k < kVec; ++k) partial[threadIdx.x][k] = stats[k];
    __syncthreads();
    // Tree over ty: thread (tx, ty) merges (tx, ty + s) for s = dim_threads/2, ..., 1.
    for (int s = dim_threads / 2; s > 0; s /= 2) {
      if (ty < s) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          partial[threadIdx.x][k] =
              Op::combine(partial[threadIdx.x][k], partial[threadIdx.x + s * tile_vecs][k]);
        }
      }
      __syncthreads();
    }
    typename Op::Final final_stats[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) final_stats[k] = Op::finalize(partial[tx][k]);
    __syncthreads();  // `partial` is free for the next tile

    for (int64_t d0 = ty; d0 < dim; d0 += d_step) {
      Vec fragment[kUnroll][kInputs];
      load_step(d0, fragment);
      float result[kUnroll][kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        float values[kInputs][kUnroll], column_result[kUnroll];
        column(fragment, k, values);
        Op::apply(final_stats[k], values, column_result);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) result[u][k] = column_result[u];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t d = d0 + int64_t{u} * dim_threads;
        if (active && d < dim) {
          Vec out;
          out.set(result[u]);
          out.store(ops.out + column_offset + d * inner);
        }
      }
    }
  }
}

}  // namespace samattn::softmax
