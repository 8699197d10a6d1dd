// The second kernel of parallel split-K (gemm/split_k.h): adds each output
// element's fp32 partial sums in split order, then applies the epilogue
// (gemm/epilogue.h) and stores D with the problem's own strides.
//
// Memory-bound and element-wise: a grid-stride loop over (batch, m, n), n
// fastest, reading the partials coalesced, with many loads in flight per
// thread (the partials are mostly still in the L2). Templated on the family so that
// each family's translation units carry their own copy (a kernel must sit in
// exactly one family's cubins).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/problem.h"
#include "gemm/epilogue.h"

namespace samattn::gemm {

struct SplitKReduceParams {
  const float* partial;  // (splits, batch, m, n), row-major
  int64_t split_stride;  // batch * m * n
  int splits;
  int64_t batch, m, n;
  const void* c;  // nullptr when beta == 0
  int64_t c_batch, c_m, c_n;
  void* d;
  int64_t d_batch, d_m, d_n;
  float alpha, beta;
  const void* bias;  // of the input type
  bool bias_per_row;
  Activation activation;
};

// The epilogue of output element (batch, row, col) from its summed partials.
template <class Out, class Bias>
__device__ inline void split_k_store(SplitKReduceParams const& p, int64_t batch, int64_t row,
                                     int64_t col, float sum) {
  float v = p.alpha * sum;
  if (p.c != nullptr) {
    v += p.beta * static_cast<float>(
                      static_cast<Out const*>(p.c)[batch * p.c_batch + row * p.c_m + col * p.c_n]);
  }
  if (p.bias != nullptr) {
    v += static_cast<float>(static_cast<Bias const*>(p.bias)[p.bias_per_row ? row : col]);
  }
  static_cast<Out*>(p.d)[batch * p.d_batch + row * p.d_m + col * p.d_n] =
      static_cast<Out>(activate(p.activation, v));
}

// kVector: four adjacent columns per thread, read as float4 (n a multiple of
// 4, the partials 16-byte aligned). Index: 32 bits where every partial's
// index fits (64-bit division costs far more than the loads it indexes).
// The loads of kUnroll splits are issued before their sums, which still add
// in split order (a fixed split gives the same bits on every run).
template <class Out, class Bias, Family kFamily, bool kVector, class Index>
__global__ void __launch_bounds__(128) split_k_reduce_kernel(SplitKReduceParams const p) {
  constexpr int kWidth = kVector ? 4 : 1;
  constexpr int kUnroll = kVector ? 8 : 16;
  using Chunk = std::conditional_t<kVector, float4, float>;
  const Index n = Index(p.n), m = Index(p.m);
  const Index chunks = Index(p.batch) * m * n / kWidth;
  const Index step = Index(gridDim.x) * blockDim.x;
  Chunk const* partial = reinterpret_cast<Chunk const*>(p.partial);
  const Index split_stride = Index(p.split_stride / kWidth);
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks; i += step) {
    float sum[kWidth] = {};
    for (int s0 = 0; s0 < p.splits; s0 += kUnroll) {
      Chunk loaded[kUnroll];
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        if (s0 + j < p.splits) loaded[j] = partial[Index(s0 + j) * split_stride + i];
      }
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        if (s0 + j < p.splits) {
          float const* part = reinterpret_cast<float const*>(&loaded[j]);
#pragma unroll
          for (int e = 0; e < kWidth; ++e) sum[e] = (s0 + j == 0) ? part[e] : sum[e] + part[e];
        }
      }
    }
    const Index first = i * kWidth;
    const Index col = first % n, rows = first / n;
#pragma unroll
    for (int e = 0; e < kWidth; ++e) {
      split_k_store<Out, Bias>(p, int64_t(rows / m), int64_t(rows % m), int64_t(col + e), sum[e]);
    }
  }
}

// The reduction of `splits` partial sums at problem.workspace into the
// problem's D, with its epilogue.
inline SplitKReduceParams split_k_reduce_params(const GemmProblem& problem, int splits) {
  SplitKReduceParams r{};
  r.partial = static_cast<const float*>(problem.workspace);
  r.split_stride = problem.batch * problem.m * problem.n;
  r.splits = splits;
  r.batch = problem.batch;
  r.m = problem.m;
  r.n = problem.n;
  r.c = problem.beta != 0.0f ? problem.c.ptr : nullptr;
  r.c_batch = problem.c.batch_stride;
  r.c_m = problem.c.row_stride;
  r.c_n = problem.c.col_stride;
  r.d = problem.d;
  r.d_batch = problem.d_batch_stride;
  r.d_m = problem.d_row_stride;
  r.d_n = problem.d_col_stride;
  r.alpha = problem.alpha;
  r.beta = problem.beta;
  r.bias = problem.bias;
  r.bias_per_row = problem.bias_per_row;
  r.activation = static_cast<Activation>(problem.activation);
  return r;
}

template <class Out, class Bias, Family kFamily>
cudaError_t launch_split_k_reduce(const SplitKReduceParams& p, int sm_count, cudaStream_t stream) {
  constexpr int kThreads = 128;
  const int64_t total = p.batch * p.m * p.n;
  const bool vector = p.n % 4 == 0 && reinterpret_cast<uintptr_t>(p.partial) % 16 == 0;
  // 32-bit indices while every partial's index fits (split_stride x splits).
  const bool narrow = total * std::max(p.splits, 1) < (int64_t{1} << 31);
  const int64_t wanted = (total / (vector && narrow ? 4 : 1) + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(wanted, static_cast<int64_t>(std::max(sm_count, 1)) * 16)));
  if (vector && narrow) {
    split_k_reduce_kernel<Out, Bias, kFamily, true, uint32_t><<<blocks, kThreads, 0, stream>>>(p);
  } else if (narrow) {
    split_k_reduce_kernel<Out, Bias, kFamily, false, uint32_t><<<blocks, kThreads, 0, stream>>>(p);
  } else {
    split_k_reduce_kernel<Out, Bias, kFamily, false, int64_t><<<blocks, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace samattn::gemm
