// sm90 grouped GEMM instantiation tags (see gemm_sm90_config.h): one per
// 16-bit dtype, pair of operand layouts and cluster shape, each instantiated
// in one generated translation unit (cpp/instantiations.cmake).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/problem.h"
#include "gemm/gemm_config.h"
#include "gemm/sm90/grouped_sm90_plan.h"

namespace samattn::gemm {

// A grouped GEMM's operand layouts (grouped_sm90_plan.h), D row-major, and
// the cluster shape (GroupedCluster). Rows form: A (rows, K) K-major, B per
// group K-major (an (experts, N, K) weight) or N-major ((experts, K, N)). K
// form (the weight gradient x^T dy): A and B both M- and N-major.
template <DType T, Major A, Major B, sm90::GroupedCluster C>
struct Sm90Grouped {};

// Defined in grouped_sm90_launch.cuh. `plan` is sm90::plan_grouped(problem),
// eligible; the problem supplies alpha, the ends, the stream, the SM count
// and the workspace.
template <class Config>
cudaError_t run_sm90_grouped(const sm90::GroupedPlan& plan, const GemmProblem& problem);
// Device workspace: the per-group arrays and CUTLASS's TMA descriptors.
template <class Config>
size_t sm90_grouped_workspace_bytes(const sm90::GroupedPlan& plan, const GemmProblem& problem);

}  // namespace samattn::gemm
