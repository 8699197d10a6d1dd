// GEMM, sm90 family (Hopper, sm_90a): fp16, bf16, and fp32 as tf32, on TMA
// and wgmma; parallel split-K (split_sm90_plan.h) and both forms of the
// grouped GEMM (grouped_sm90_plan.h, 16-bit). The plan (gemm_sm90_plan.h) orients the
// problem and picks the tile; this file stages tf32 operands that are not
// K-major, maps each plan to the one instantiation that runs it, and runs
// the split-K reduction.
#include <cuda_runtime_api.h>

#include <string>
#include <utility>

#include <cutlass/numeric_types.h>

#include <cstdlib>
#include "common/problem.h"
#include "common/registry.h"
#include "gemm/sm90/gemm_sm90_config.h"
#include "gemm/sm90/grouped_sm90_config.h"
#include "gemm/sm90/split_sm90_plan.h"
#include "gemm/tensor_core/split_k_reduce.cuh"
#include "samattn/samattn.h"

namespace samattn {
namespace {

using gemm::Major;
using gemm::Sm90Gemm;
using gemm::sm90::Epilogue;
using gemm::sm90::GroupedPlan;
using gemm::sm90::ParallelSplitPlan;
using gemm::sm90::Plan;
using gemm::sm90::Tile;

// Copies a batch of fp32 (rows, cols) views with unit stride along rows into
// row-major (cols contiguous, leading dimension `cols`) matrices: a tiled
// transpose through shared memory, so that both the reads and the writes are
// coalesced. Block (32, 8) moves a 32 x 32 tile.
constexpr int kTransposeTile = 32;
constexpr int kTransposeRows = 8;

__global__ void __launch_bounds__(kTransposeTile* kTransposeRows)
    stage_k_major(const float* __restrict__ src, int64_t rows, int64_t cols, int64_t src_col_stride,
                  int64_t src_batch_stride, float* __restrict__ dst) {
  __shared__ float tile[kTransposeTile][kTransposeTile + 1];  // +1: no bank conflicts
  const int64_t batch = blockIdx.z;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTransposeTile;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kTransposeTile;
  const float* in = src + batch * src_batch_stride;
  float* out = dst + batch * rows * cols;
  // Read along rows (the source's unit stride).
  for (int c = threadIdx.y; c < kTransposeTile; c += kTransposeRows) {
    const int64_t row = row0 + threadIdx.x, col = col0 + c;
    if (row < rows && col < cols) tile[c][threadIdx.x] = in[col * src_col_stride + row];
  }
  __syncthreads();
  // Write along cols (the copy's unit stride).
  for (int r = threadIdx.y; r < kTransposeTile; r += kTransposeRows) {
    const int64_t row = row0 + r, col = col0 + threadIdx.x;
    if (row < rows && col < cols) out[row * cols + col] = tile[threadIdx.x][r];
  }
}

cudaError_t stage(const Plan::Staging& staging, int64_t batch, void* workspace,
                  cudaStream_t stream) {
  if (!staging.active) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((staging.rows + kTransposeTile - 1) / kTransposeTile),
                  static_cast<unsigned>((staging.cols + kTransposeTile - 1) / kTransposeTile),
                  static_cast<unsigned>(batch));
  if (grid.y > 65535 || grid.z > 65535) return cudaErrorInvalidConfiguration;
  stage_k_major<<<grid, dim3(kTransposeTile, kTransposeRows), 0, stream>>>(
      static_cast<const float*>(staging.src), staging.rows, staging.cols, staging.src_col_stride,
      staging.src_batch_stride,
      reinterpret_cast<float*>(static_cast<char*>(workspace) + staging.offset));
  return cudaGetLastError();
}

// Calls action(Sm90Gemm<...>{}) for the instantiation that runs `plan`.
template <DType T, Major A, Major B, Epilogue kEpilogue, class Action>
auto with_tile(const Plan& plan, Action&& action) {
  switch (plan.tile) {
    case Tile::k128x256_c2x1:
      return action(Sm90Gemm<T, A, B, Tile::k128x256_c2x1, kEpilogue>{});
    case Tile::k128x128_c1x2:
      return action(Sm90Gemm<T, A, B, Tile::k128x128_c1x2, kEpilogue>{});
    case Tile::k128x64_swap_ab:
      if constexpr (T != DType::f32) {
        return action(Sm90Gemm<T, A, B, Tile::k128x64_swap_ab, kEpilogue>{});
      }
      break;  // the plan never picks it for tf32
    case Tile::k128x64_streamk:
      break;
  }
  return action(Sm90Gemm<T, A, B, Tile::k128x64_streamk, kEpilogue>{});
}

// The plain epilogue in every layout; the fused ones in those the plan
// allows (gemm_sm90_plan.cpp).
template <DType T, Epilogue kEpilogue, class Action>
auto with_layout(const Plan& plan, Action&& action) {
  constexpr Major K = Major::K, MN = Major::MN;
  if constexpr (T == DType::f32) {
    return with_tile<T, K, K, kEpilogue>(plan, action);  // tf32: staged K-major
  } else if constexpr (kEpilogue == Epilogue::fused_f32) {
    return plan.b.k_major ? with_tile<T, K, K, kEpilogue>(plan, action)
                          : with_tile<T, K, MN, kEpilogue>(plan, action);
  } else {
    if (plan.a.k_major) {
      return plan.b.k_major ? with_tile<T, K, K, kEpilogue>(plan, action)
                            : with_tile<T, K, MN, kEpilogue>(plan, action);
    }
    if constexpr (kEpilogue == Epilogue::plain) {
      if (!plan.b.k_major) return with_tile<T, MN, MN, kEpilogue>(plan, action);
    }
    return with_tile<T, MN, K, kEpilogue>(plan, action);
  }
}

template <DType T, class Action>
auto with_epilogue(const Plan& plan, Action&& action) {
  switch (plan.epilogue) {
    case Epilogue::fused:
      return with_layout<T, Epilogue::fused>(plan, action);
    case Epilogue::fused_f32:
      if constexpr (T != DType::f32) return with_layout<T, Epilogue::fused_f32>(plan, action);
      break;  // tf32 already writes fp32: the plan never picks it
    case Epilogue::plain:
      break;
  }
  return with_layout<T, Epilogue::plain>(plan, action);
}

template <class Action>
auto with_config(DType dtype, const Plan& plan, Action&& action) {
  switch (dtype) {
    case DType::f16:
      return with_epilogue<DType::f16>(plan, action);
    case DType::bf16:
      return with_epilogue<DType::bf16>(plan, action);
    case DType::f32:
      break;
  }
  return with_epilogue<DType::f32>(plan, action);
}

// Calls action(Sm90Grouped<...>{}) for the grouped instantiation of `plan`:
// the rows form's A is K-major and B either, with either cluster; the K
// form's and a list's take the 1x2 cluster, the K form's operands are both
// MN-major.
template <DType T, class Action>
auto with_grouped_layouts(const GroupedPlan& plan, Action&& action) {
  using gemm::Sm90Grouped;
  using gemm::sm90::GroupedCluster;
  constexpr GroupedCluster k1x2 = GroupedCluster::k1x2, k2x1 = GroupedCluster::k2x1;
  if (plan.k_form) return action(Sm90Grouped<T, Major::MN, Major::MN, k1x2>{});
  if (plan.cluster == k2x1) {
    return plan.b.k_major ? action(Sm90Grouped<T, Major::K, Major::K, k2x1>{})
                          : action(Sm90Grouped<T, Major::K, Major::MN, k2x1>{});
  }
  return plan.b.k_major ? action(Sm90Grouped<T, Major::K, Major::K, k1x2>{})
                        : action(Sm90Grouped<T, Major::K, Major::MN, k1x2>{});
}

template <class Action>
auto with_grouped_config(DType dtype, const GroupedPlan& plan, Action&& action) {
  if (dtype == DType::bf16) return with_grouped_layouts<DType::bf16>(plan, action);
  return with_grouped_layouts<DType::f16>(plan, action);
}

bool grouped(const GemmProblem& problem) { return problem.group_mode != SAMATTN_GROUP_NONE; }

// Parallel split-K: the batched GEMM of the K ranges into the fp32 partials,
// then the reduction (split order, then the caller's epilogue) into D.
template <class Out>
cudaError_t reduce_splits(const ParallelSplitPlan& split, const GemmProblem& p) {
  const gemm::SplitKReduceParams r = gemm::split_k_reduce_params(p, split.splits);
  if (p.dtype == DType::bf16) {
    return gemm::launch_split_k_reduce<Out, cutlass::bfloat16_t, Family::sm90>(r, p.sm_count,
                                                                               p.stream);
  }
  return gemm::launch_split_k_reduce<Out, cutlass::half_t, Family::sm90>(r, p.sm_count, p.stream);
}

cudaError_t run_parallel_split(const ParallelSplitPlan& split, const GemmProblem& problem) {
  if (!split.eligible) return cudaErrorNotSupported;
  if (problem.workspace == nullptr) return cudaErrorInvalidValue;
  cudaError_t error = with_config(split.inner.dtype, split.inner_plan, [&](auto config) {
    return gemm::run_sm90<decltype(config)>(split.inner_plan, split.inner);
  });
  if (error != cudaSuccess) return error;
  if (problem.out_f32) return reduce_splits<float>(split, problem);
  if (problem.dtype == DType::bf16) return reduce_splits<cutlass::bfloat16_t>(split, problem);
  return reduce_splits<cutlass::half_t>(split, problem);
}

size_t gemm_sm90_workspace_bytes(const GemmProblem& problem) {
  if (const ParallelSplitPlan split = gemm::sm90::parallel_split(problem); split.applies) {
    if (!split.eligible) return 0;
    return split.partial_bytes + with_config(split.inner.dtype, split.inner_plan, [&](auto config) {
             return gemm::sm90_workspace_bytes<decltype(config)>(split.inner_plan, split.inner);
           });
  }
  if (grouped(problem)) {
    const GroupedPlan plan = gemm::sm90::plan_grouped(problem);
    if (!plan.eligible) return 0;
    return with_grouped_config(problem.dtype, plan, [&](auto config) {
      return gemm::sm90_grouped_workspace_bytes<decltype(config)>(plan, problem);
    });
  }
  const Plan plan = gemm::sm90::plan(problem);
  if (!plan.eligible) return 0;
  return plan.staging_bytes + with_config(problem.dtype, plan, [&](auto config) {
           return gemm::sm90_workspace_bytes<decltype(config)>(plan, problem);
         });
}

cudaError_t gemm_sm90(const GemmProblem& problem) {
  if (const ParallelSplitPlan split = gemm::sm90::parallel_split(problem); split.applies) {
    return run_parallel_split(split, problem);
  }
  if (grouped(problem)) {
    const GroupedPlan plan = gemm::sm90::plan_grouped(problem);
    if (!plan.eligible) return cudaErrorNotSupported;
    return with_grouped_config(problem.dtype, plan, [&](auto config) {
      return gemm::run_sm90_grouped<decltype(config)>(plan, problem);
    });
  }
  const Plan plan = gemm::sm90::plan(problem);
  if (!plan.eligible) return cudaErrorNotSupported;  // the registered plan declined it
  if (plan.staging_bytes > problem.workspace_bytes) return cudaErrorInvalidValue;
  cudaError_t error = stage(plan.stage_a, plan.batch, problem.workspace, problem.stream);
  if (error == cudaSuccess) {
    error = stage(plan.stage_b, plan.batch, problem.workspace, problem.stream);
  }
  if (error != cudaSuccess) return error;
  return with_config(problem.dtype, plan,
                     [&](auto config) { return gemm::run_sm90<decltype(config)>(plan, problem); });
}

// What TMA cannot describe is declined: automatic selection runs it on sm80,
// and so does a forced sm90 (forced_fallback).
bool plan_sm90(const GemmProblem& problem, std::string* why) {
  if (ParallelSplitPlan split = gemm::sm90::parallel_split(problem); split.applies) {
    if (!split.eligible && why != nullptr) *why = "parallel split-K: " + std::move(split.reason);
    return split.eligible;
  }
  if (grouped(problem)) {
    GroupedPlan plan = gemm::sm90::plan_grouped(problem);
    if (!plan.eligible && why != nullptr) *why = std::move(plan.reason);
    return plan.eligible;
  }
  Plan plan = gemm::sm90::plan(problem);
  if (!plan.eligible && why != nullptr) *why = std::move(plan.reason);
  return plan.eligible;
}

[[maybe_unused]] const bool kRegistered = register_kernels<Op::gemm>(
    {Family::sm90, &plan_sm90, &gemm_sm90_workspace_bytes, &gemm_sm90, SAMATTN_FAMILY_SM80});

}  // namespace
}  // namespace samattn
