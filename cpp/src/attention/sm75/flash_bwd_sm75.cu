// Attention backward, sm75 family: fp16 on mma.sync m16n8k8 with synchronous
// loads; head dims up to 192 (256 does not fit Turing's 64 KB of shared
// memory). The kernels are instantiated in their own translation units (one
// per FlashBwdConfig).
#include <string>

#include "attention/flash_bwd_dispatch.h"
#include "common/registry.h"

namespace samattn {

cudaError_t attention_backward_sm75(const AttentionBackwardProblem& problem) {
  if (problem.dtype != DType::f16) return cudaErrorNotSupported;
  return attention::run_flash_bwd_sm75_dtype<DType::f16>(problem);
}

namespace {

bool plan(const AttentionBackwardProblem& problem, std::string* why) {
  if (!plan_terms(backward_terms(problem.terms), backward_vectors(problem), why)) return false;
  return attention::plan_flash(
      problem.headdim,
      attention::min_bwd_smem<Family::sm75, attention::kSm75BwdTiles>(problem.headdim),
      problem.max_smem_per_block, Family::sm75, /*backward=*/true, why);
}

[[maybe_unused]] const bool kRegistered = register_kernels<Op::attention_backward>(
    {Family::sm75, &plan, &attention::bwd_workspace_bytes<attention::kSm75BwdTiles>,
     &attention_backward_sm75});

}  // namespace
}  // namespace samattn
