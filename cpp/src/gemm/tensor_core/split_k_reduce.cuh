// The second kernel of parallel split-K (gemm/split_k.h): adds each output
// element's fp32 partial sums in split order, then applies the epilogue
// (gemm/epilogue.h) and stores D with the problem's own strides.
//
// Memory-bound and element-wise: a grid-stride loop over (batch, m, n), n
// fastest, reading the partials coalesced. Templated on the family so that
// each family's translation units carry their own copy (a kernel must sit in
// exactly one family's cubins).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

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

template <class Out, class Bias, Family kFamily>
__global__ void __launch_bounds__(256) split_k_reduce_kernel(SplitKReduceParams const p) {
  const int64_t total = p.batch * p.m * p.n;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  Out const* c = static_cast<Out const*>(p.c);
  Out* d = static_cast<Out*>(p.d);
  Bias const* bias = static_cast<Bias const*>(p.bias);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const int64_t col = i % p.n;
    const int64_t row = (i / p.n) % p.m;
    const int64_t batch = i / (p.n * p.m);
    float sum = p.partial[i];
    for (int s = 1; s < p.splits; ++s) sum += p.partial[s * p.split_stride + i];
    float v = p.alpha * sum;
    if (c != nullptr)
      v += p.beta * static_cast<float>(c[batch * p.c_batch + row * p.c_m + col * p.c_n]);
    if (bias != nullptr) v += static_cast<float>(bias[p.bias_per_row ? row : col]);
    d[batch * p.d_batch + row * p.d_m + col * p.d_n] = static_cast<Out>(activate(p.activation, v));
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
  constexpr int kThreads = 256;
  const int64_t total = p.batch * p.m * p.n;
  const int64_t wanted = (total + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(wanted, static_cast<int64_t>(std::max(sm_count, 1)) * 8)));
  split_k_reduce_kernel<Out, Bias, kFamily><<<blocks, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace samattn::gemm
