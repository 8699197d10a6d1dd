// Launch planning for softmax: which kernel runs a problem, with which
// threads, grid and shared memory. Plain C++ (no CUDA runtime calls), so the
// choices and the index math can be checked on a CPU.
//
// A row of `dim` elements is read as 16-byte vectors aligned in memory, not
// relative to the row: vector j of a row starts at element j*vec - head,
// where head (0..vec-1) is how far the row start lies past a 16-byte boundary.
// Rows whose length is not a multiple of the vector (dim 1000, 4097, 7, ...)
// then still move full vectors everywhere except at their two ends, where the
// elements inside the row are moved one by one.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define SAMATTN_SOFTMAX_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SAMATTN_SOFTMAX_HOST_DEVICE inline
#endif

namespace samattn::softmax {

SAMATTN_SOFTMAX_HOST_DEVICE int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// How many elements of `row` sit before it in its aligned vector of `vec`
// elements (0 for vec == 1).
SAMATTN_SOFTMAX_HOST_DEVICE int row_head(const void* row, int elem_bytes, int vec) {
  return static_cast<int>((reinterpret_cast<uintptr_t>(row) / elem_bytes) % vec);
}

// Aligned vectors [first_vector, end_vector) cover row elements [lo, hi).
SAMATTN_SOFTMAX_HOST_DEVICE int64_t first_vector(int64_t lo, int head, int vec) {
  return (lo + head) / vec;
}
SAMATTN_SOFTMAX_HOST_DEVICE int64_t end_vector(int64_t hi, int head, int vec) {
  return ceil_div(hi + head, vec);
}

// Kernel configurations. The fixed sizes are template arguments of the
// kernels, so changing one here means changing the dispatch in
// softmax_launch.cuh too.
struct Tuning {
  // Rows in registers: elements per thread of each input. The compiler keeps
  // them as fp32 whatever the dtype (it reuses the converted values after the
  // reduction), so 32 values take 32 registers: forward holds 32 of x,
  // backward 16 each of y and dy. With 1024 threads a row holds 32768
  // elements forward, 16384 backward.
  static constexpr int kRegisterElementsForward = 32;
  static constexpr int kRegisterElementsBackward = 16;
  static constexpr int register_vecs(bool backward, int vec) {
    return (backward ? kRegisterElementsBackward : kRegisterElementsForward) / vec;
  }
  static constexpr int kMaxThreadsPerRow = 1024;
  static constexpr int kMaxThreadsPerRow16BitForward = 512;
  // Rows of at most 32 lanes share a CTA of this many threads; longer rows
  // take a CTA each.
  static constexpr int kSmallRowCtaThreads = 128;
  // Two-pass kernels (long rows): CTA size, and vectors of each input a
  // thread loads per step: 16 elements (four 16-byte vectors of fp32, two of
  // fp16), or 8 single elements in all when the operands cannot be
  // vectorized (8 of x; 4 each of y and dy).
  static constexpr int kTwoPassThreads = 512;
  static constexpr int two_pass_unroll(int vec, int inputs) {
    return vec == 1 ? 8 / inputs : 16 / vec;
  }
  // Split rows: fewest elements per CTA, most CTAs per row (the cap keeps the
  // last chunk of a row at least 16 elements long, see make_plan).
  static constexpr int64_t kMinSplitChunk = 8192;
  static constexpr int64_t kMaxSplits = 512;
  // Columns kernel (inner > 1): CTA size and steps along dim per load batch.
  static constexpr int kColumnThreads = 256;
  static constexpr int kColumnUnroll = 4;
  // Shared memory the kernels declare statically, left out of the opt-in
  // budget of the row cache.
  static constexpr int kStaticSmemReserve = 1024;
  static constexpr int64_t kMaxGrid = int64_t{1} << 20;
};

enum class Path {
  registers,  // each row in registers of one CTA, warp or group of lanes
  two_pass,   // one CTA per row; the row (or most of it) cached in shared
              // memory between the passes, the rest read twice
  split,      // few long rows: each row split over several CTAs, three
              // kernels (partial stats, combine, write)
  columns     // inner > 1: threads across inner, loop over dim
};

struct PlanInput {
  int elem_bytes;  // 2 or 4
  bool backward;   // inputs are y and dy, else x
  int64_t outer, dim, inner;
  // Pointer residues modulo 16 bytes of every operand (x / y, dy, out).
  int residues[3];
  int operands;  // 2 forward, 3 backward
  int sm_count;
  int smem_optin;  // cudaDevAttrMaxSharedMemoryPerBlockOptin (0 if unknown)
};

struct Plan {
  Path path = Path::registers;
  int vec = 1;              // elements per vector: 16 / elem_bytes, or 1
  int threads_per_row = 2;  // registers: power of two, 2 ... 1024
  int cta_threads = 0;
  int64_t grid = 0;
  int64_t splits = 1;      // split: CTAs per row
  int64_t chunk = 0;       // split: elements per CTA (the last one takes the rest)
  int64_t cache_vecs = 0;  // two_pass: vectors of each input kept in shared memory
  size_t smem_bytes = 0;   // dynamic shared memory
  int tile_vecs = 0;       // columns: vectors across inner per CTA
};

inline int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

inline Plan make_plan(const PlanInput& in) {
  Plan plan;
  const int full_vec = 16 / in.elem_bytes;
  const int inputs = in.backward ? 2 : 1;
  bool congruent = true;  // every operand has the same offset from 16 bytes
  for (int i = 1; i < in.operands; ++i) congruent = congruent && in.residues[i] == in.residues[0];
  const int64_t rows = in.outer * in.inner;

  if (in.inner > 1) {
    // Vector c of a column tile holds `vec` neighbouring columns; allowed when
    // every (o, d) line starts 16-byte aligned.
    plan.path = Path::columns;
    plan.vec = (congruent && in.residues[0] == 0 && in.inner % full_vec == 0) ? full_vec : 1;
    const int64_t inner_vecs = in.inner / plan.vec;
    int64_t tile = std::min<int64_t>(pow2_ceil(inner_vecs), 32);
    const int64_t dim_threads = std::min<int64_t>(Tuning::kColumnThreads / tile, pow2_ceil(in.dim));
    tile = std::min<int64_t>(pow2_ceil(inner_vecs), Tuning::kColumnThreads / dim_threads);
    plan.tile_vecs = static_cast<int>(tile);
    plan.cta_threads = static_cast<int>(tile * dim_threads);
    plan.grid = std::min(in.outer * ceil_div(inner_vecs, tile), Tuning::kMaxGrid);
    return plan;
  }

  // Rows. Operands that disagree on their 16-byte offset cannot share the
  // vector positions of a row: they take the element-wise two-pass kernel.
  plan.vec = congruent ? full_vec : 1;
  // The largest head of any row: rows of a length that is a multiple of the
  // vector all share the first row's head.
  const int max_head = (plan.vec == 1)                         ? 0
                       : (in.dim % plan.vec == 0 || rows == 1) ? in.residues[0] / in.elem_bytes
                                                               : plan.vec - 1;
  const int64_t row_vecs = ceil_div(in.dim + max_head, plan.vec);

  const int vecs_per_thread = Tuning::register_vecs(in.backward, full_vec);
  // 16-bit forward rows wider than 512 lanes hold half the bytes in flight of
  // an fp32 row at one CTA per SM and spill on sm_90; the two-pass kernel
  // does better there (2048 x 32768 fp16 on an H200: 2.89 vs 2.77 TB/s).
  const int max_lanes = in.elem_bytes == 2 && !in.backward ? Tuning::kMaxThreadsPerRow16BitForward
                                                           : Tuning::kMaxThreadsPerRow;
  if (congruent && row_vecs <= int64_t{max_lanes} * vecs_per_thread) {
    plan.path = Path::registers;
    // At least 2 lanes per row: one lane alone with a whole row needs more
    // than 64 registers for its row index math.
    plan.threads_per_row =
        static_cast<int>(std::max<int64_t>(2, pow2_ceil(ceil_div(row_vecs, vecs_per_thread))));
    plan.cta_threads =
        plan.threads_per_row > 32 ? plan.threads_per_row : Tuning::kSmallRowCtaThreads;
    const int64_t rows_per_cta = plan.cta_threads / plan.threads_per_row;
    plan.grid = std::min(ceil_div(rows, rows_per_cta), Tuning::kMaxGrid);
    return plan;
  }

  // Long rows (or operands of mixed alignment).
  plan.cta_threads = Tuning::kTwoPassThreads;

  // Few rows: split each over several CTAs so that every SM has work.
  if (rows < 2 * int64_t{in.sm_count} && in.dim >= 2 * Tuning::kMinSplitChunk) {
    const int64_t target_ctas = int64_t{4} * in.sm_count;
    int64_t splits = std::min(
        {ceil_div(target_ctas, rows), in.dim / Tuning::kMinSplitChunk, Tuning::kMaxSplits});
    // Chunks start on multiples of 16 elements. With chunk >= 8192 and
    // splits <= 512 the last chunk keeps >= 16 elements, room for the 8-byte
    // stats slot the split kernels leave in each chunk of the output.
    const int64_t chunk = ceil_div(ceil_div(in.dim, splits), 16) * 16;
    splits = ceil_div(in.dim, chunk);
    if (splits > 1 && (in.dim - (splits - 1) * chunk) * in.elem_bytes >= 16) {
      plan.path = Path::split;
      plan.splits = splits;
      plan.chunk = chunk;
      plan.grid = std::min(rows * splits, Tuning::kMaxGrid);
      return plan;
    }
  }

  plan.path = Path::two_pass;
  plan.grid = std::min(rows, Tuning::kMaxGrid);
  // Cache the row's first vectors (of every input) in shared memory, so that
  // they are read once: all of the row when it fits, else as much as fits if
  // that is at least half of it (the rest is read twice, mostly from L2). A
  // smaller cache is not worth dropping to one CTA per SM.
  // A cached vector takes whole 32-bit words (detail::Vector).
  const int64_t vec_bytes = (int64_t{plan.vec} * in.elem_bytes + 3) / 4 * 4;
  const int64_t budget = int64_t{in.smem_optin} - Tuning::kStaticSmemReserve;
  const int64_t cache_vecs =
      std::min(row_vecs, std::max<int64_t>(budget, 0) / (vec_bytes * inputs));
  if (2 * cache_vecs >= row_vecs) {
    plan.cache_vecs = cache_vecs;
    plan.smem_bytes = static_cast<size_t>(cache_vecs * vec_bytes * inputs);
  }
  return plan;
}

}  // namespace samattn::softmax
