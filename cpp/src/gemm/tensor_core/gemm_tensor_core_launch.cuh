// Host launch of the tensor-core GEMM for one instantiation tag.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/launch_setup.h"
#include "gemm/gemm_config.h"
#include "gemm/group.h"
#include "gemm/split_k.h"
#include "gemm/tensor_core/gemm_tensor_core_kernel.cuh"
#include "gemm/tensor_core/gemm_tensor_core_traits.cuh"
#include "gemm/tensor_core/split_k_reduce.cuh"

namespace samattn::gemm {

template <class Config>
struct FamilyOf;
template <DType T, Major A, Major B, bool V, Family F>
struct FamilyOf<TensorCoreGemm<T, A, B, V, F>> {
  static constexpr Family value = F;
};

// The epilogue of a split problem: the partial sums in the workspace added up
// into D (split_k_reduce.cuh).
template <class Out, class Bias, Family kFamily>
cudaError_t reduce_splits(const GemmProblem& problem, int splits) {
  return launch_split_k_reduce<Out, Bias, kFamily>(split_k_reduce_params(problem, splits),
                                                   problem.sm_count, problem.stream);
}

// A list's GEMMs (problem.group_list, each laid out as Config takes it: the
// dispatch sorted them) in launches of kListLaunchGemms. `shared` carries
// what they share: alpha and the output type.
template <class Traits>
cudaError_t run_tensor_core_list(const GemmProblem& list, TensorCoreParams shared) {
  static_assert(sizeof(TensorCoreParams) + sizeof(ListChunk) <= 4096,
                "kernel parameters are limited to 4 KB");
  constexpr int kSmem = Traits::kSmemBytes;
  const cudaError_t allowed = allow_dynamic_smem<gemm_tensor_core_list_kernel<Traits>>(kSmem);
  if (allowed != cudaSuccess) return allowed;
  shared.batch = 1;
  shared.splits = 1;
  shared.c = nullptr;
  shared.bias = nullptr;
  shared.activation = Activation::none;
  ListChunk chunk{};
  int64_t ctas = 0;  // gridDim.x: below 2^31
  const auto launch = [&]() {
    gemm_tensor_core_list_kernel<Traits>
        <<<static_cast<unsigned>(ctas), Traits::kThreads, kSmem, list.stream>>>(shared, chunk);
    chunk.count = 0;
    ctas = 0;
    return cudaGetLastError();
  };
  for (int64_t i = 0; i < list.batch; ++i) {
    const samattn_gemm_list_entry& e = list.group_list[i];
    if (e.m == 0 || e.n == 0) continue;
    const int64_t tiles_m = (e.m + Traits::kBlockM - 1) / Traits::kBlockM;
    const int64_t tiles_n = (e.n + Traits::kBlockN - 1) / Traits::kBlockN;
    if (ctas + tiles_m * tiles_n > INT32_MAX && chunk.count > 0) {
      const cudaError_t status = launch();
      if (status != cudaSuccess) return status;
    }
    ListGemm& g = chunk.gemms[chunk.count++];
    g.a = e.a;
    g.a_m = e.a_row_stride;
    g.a_k = e.a_col_stride;
    // B is (K,N) in the entry and (N,K) in the kernel.
    g.b = e.b;
    g.b_n = e.b_col_stride;
    g.b_k = e.b_row_stride;
    g.d = e.d;
    g.d_m = e.d_row_stride;
    g.d_n = e.d_col_stride;
    g.m = static_cast<int>(e.m);
    g.n = static_cast<int>(e.n);
    g.k = static_cast<int>(e.k);
    g.tiles_m = static_cast<int>(tiles_m);
    g.tiles_n = static_cast<int>(tiles_n);
    g.first_cta = static_cast<int>(ctas);
    ctas += tiles_m * tiles_n;
    if (chunk.count == kListLaunchGemms) {
      const cudaError_t status = launch();
      if (status != cudaSuccess) return status;
    }
  }
  return chunk.count > 0 ? launch() : cudaSuccess;
}

template <class Config>
cudaError_t run_tensor_core(const GemmProblem& problem) {
  using Traits = TensorCoreTraits<Config>;
  constexpr int kSmem = Traits::kSmemBytes;

  TensorCoreParams p{};
  p.m = static_cast<int>(problem.m);
  p.n = static_cast<int>(problem.n);
  p.k = static_cast<int>(problem.k);
  // B is (K,N) in the problem and (N,K) in the kernel.
  p.a = problem.a.ptr;
  p.a_m = problem.a.row_stride;
  p.a_k = problem.a.col_stride;
  p.a_batch = problem.a.batch_stride;
  p.b = problem.b.ptr;
  p.b_n = problem.b.col_stride;
  p.b_k = problem.b.row_stride;
  p.b_batch = problem.b.batch_stride;
  p.c = problem.beta != 0.0f ? problem.c.ptr : nullptr;
  p.c_m = problem.c.row_stride;
  p.c_n = problem.c.col_stride;
  p.c_batch = problem.c.batch_stride;
  p.d_m = problem.d_row_stride;
  p.d_n = problem.d_col_stride;
  p.d_batch = problem.d_batch_stride;
  p.alpha = problem.alpha;
  p.beta = problem.beta;
  p.bias = problem.bias;
  p.bias_per_row = problem.bias_per_row;
  p.activation = static_cast<Activation>(problem.activation);
  p.out_f32 = problem.out_f32;
  if (problem.group_mode == group::kGroupList) {
    // Lists are 16-bit (the API refuses others): tf32 units carry no list kernel.
    if constexpr (sizeof(typename Traits::Element) == 2) {
      return run_tensor_core_list<Traits>(problem, p);
    } else {
      return cudaErrorNotSupported;
    }
  }
  p.tiles_m = static_cast<int>((problem.m + Traits::kBlockM - 1) / Traits::kBlockM);
  p.tiles_n = static_cast<int>((problem.n + Traits::kBlockN - 1) / Traits::kBlockN);
  const SplitK split = split_k_ranges(FamilyOf<Config>::value, problem);
  p.splits = split.splits;
  p.k_per_split = static_cast<int>(split.k_per_split);
  if (split.splits > 1) {
    if (problem.workspace == nullptr ||
        problem.workspace_bytes < split_k_workspace_bytes(FamilyOf<Config>::value, problem)) {
      return cudaErrorInvalidValue;  // the API checked it against the registered size
    }
    p.partial = static_cast<float*>(problem.workspace);
    p.partial_split_stride = problem.batch * problem.m * problem.n;
  }

  p.group_offsets = problem.group_offsets;
  p.group_mode = problem.group_mode;
  if (problem.group_offsets != nullptr) {
    // One launch: the groups (at most 65535, checked by the API) index the ends.
    p.batch = static_cast<int>(problem.batch);
    p.d = problem.d;
    const dim3 grid = problem.group_mode == group::kGroupRows
                          ? dim3(static_cast<unsigned>(group::row_tile_bound(
                                     problem.m, problem.batch, Traits::kBlockM)),
                                 static_cast<unsigned>(p.tiles_n))
                          : dim3(static_cast<unsigned>(p.tiles_m * p.tiles_n),
                                 static_cast<unsigned>(problem.batch));
    if (grid.y > 65535) return cudaErrorInvalidConfiguration;
    const cudaError_t allowed = allow_dynamic_smem<gemm_tensor_core_kernel<Traits, true>>(kSmem);
    if (allowed != cudaSuccess) return allowed;
    gemm_tensor_core_kernel<Traits, true><<<grid, Traits::kThreads, kSmem, problem.stream>>>(p);
    return cudaGetLastError();
  }

  // The simple kernel where the call is D = alpha * A B (gemm_tensor_core_kernel).
  const bool general =
      p.c != nullptr || p.bias != nullptr || p.activation != Activation::none || split.splits > 1;
  auto kernel =
      general ? gemm_tensor_core_kernel<Traits, true> : gemm_tensor_core_kernel<Traits, false>;
  const cudaError_t allowed =
      general ? allow_dynamic_smem<gemm_tensor_core_kernel<Traits, true>>(kSmem)
              : allow_dynamic_smem<gemm_tensor_core_kernel<Traits, false>>(kSmem);
  if (allowed != cudaSuccess) return allowed;

  // gridDim.y is limited to 65535: launch the batch in chunks.
  constexpr int64_t kMaxBatchPerLaunch = 65535;
  using Element = typename Traits::Element;
  const int64_t output_bytes = problem.out_f32 ? 4 : sizeof(typename Traits::Output);
  for (int64_t first = 0; first < problem.batch; first += kMaxBatchPerLaunch) {
    const int64_t count = std::min(kMaxBatchPerLaunch, problem.batch - first);
    TensorCoreParams chunk = p;
    chunk.batch = static_cast<int>(count);
    chunk.a = static_cast<const Element*>(problem.a.ptr) + first * problem.a.batch_stride;
    chunk.b = static_cast<const Element*>(problem.b.ptr) + first * problem.b.batch_stride;
    if (chunk.c != nullptr) {
      chunk.c =
          static_cast<const char*>(problem.c.ptr) + first * problem.c.batch_stride * output_bytes;
    }
    chunk.d = static_cast<char*>(problem.d) + first * problem.d_batch_stride * output_bytes;
    if (chunk.partial != nullptr) chunk.partial += first * problem.m * problem.n;
    dim3 grid(p.tiles_m * p.tiles_n, static_cast<unsigned>(count), static_cast<unsigned>(p.splits));
    kernel<<<grid, Traits::kThreads, kSmem, problem.stream>>>(chunk);
    cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  if (split.splits == 1) return cudaSuccess;
  using Output = typename Traits::Output;
  constexpr Family kFamily = FamilyOf<Config>::value;
  if constexpr (std::is_same_v<Output, float>) {
    return reduce_splits<float, Output, kFamily>(problem, split.splits);
  } else {
    return problem.out_f32 ? reduce_splits<float, Output, kFamily>(problem, split.splits)
                           : reduce_splits<Output, Output, kFamily>(problem, split.splits);
  }
}

}  // namespace samattn::gemm
