// Parallel split-K on the sm90 family (gemm/split_k.h): the K ranges run as
// one batched GEMM on the plain sm90 kernels, split s writing A[:, ks] @
// B[ks, :] as fp32 to partial[s] in the workspace; the reduction kernel then
// adds the partials in split order and applies the epilogue. Host code only.
#pragma once

#include <cstdint>
#include <string>

#include "common/problem.h"
#include "gemm/sm90/gemm_sm90_plan.h"
#include "samattn/samattn.h"

namespace samattn::gemm::sm90 {

struct ParallelSplitPlan {
  // Whether sm90 runs the problem as a parallel split: then it runs `inner`
  // when eligible, and declines the problem (sm80 runs it) when not.
  bool applies = false;
  bool eligible = false;
  std::string reason;  // why not, when applies && !eligible
  int32_t splits = 0;
  int64_t k_per_split = 0;
  int64_t partial_bytes = 0;  // the fp32 partial sums, at the front of the workspace
  // The batched GEMM of the K ranges (batch = splits), its D the partials,
  // and its plan; `inner.workspace` follows the partials.
  GemmProblem inner{};
  Plan inner_plan;
};

// The parallel split of `problem`, if sm90 runs it as one. A forced split
// (split_k >= 2) with split_k_mode parallel applies always; it is eligible
// for a 16-bit, unbatched problem whose K is a whole number of equal ranges
// (gemm::split_k_ranges) and whose batched GEMM the plain sm90 kernels run
// with an fp32 output (A K-major). split_k = "auto" applies, when eligible,
// to a 16-bit, unbatched problem with K >= 16384 whose 128x128 output tiles
// leave SMs idle, in about 4096 of K per range (a power of 2); otherwise the
// serial stream-K path decides (gemm_sm90_plan.h).
ParallelSplitPlan parallel_split(const GemmProblem& problem);

}  // namespace samattn::gemm::sm90
