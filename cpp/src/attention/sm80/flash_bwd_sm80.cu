// Attention backward, sm80 family: fp16 and bf16 on mma.sync m16n8k16. The
// kernels are instantiated in their own translation units (one per
// FlashBwdConfig).
#include <string>

#include "attention/flash_bwd_dispatch.h"
#include "common/registry.h"

namespace samattn {

cudaError_t attention_backward_sm80(const AttentionBackwardProblem& problem) {
  switch (problem.dtype) {
    case DType::f16:
      return attention::run_flash_bwd_sm80_dtype<DType::f16>(problem);
    case DType::bf16:
      return attention::run_flash_bwd_sm80_dtype<DType::bf16>(problem);
    default:
      break;
  }
  return cudaErrorNotSupported;
}

namespace {

bool plan(const AttentionBackwardProblem& problem, std::string* why) {
  if (!plan_terms(backward_terms(problem.terms), backward_vectors(problem), why)) return false;
  return attention::plan_flash(
      problem.headdim,
      attention::min_bwd_smem<Family::sm80, attention::kSm80BwdTiles>(problem.headdim),
      problem.max_smem_per_block, Family::sm80, /*backward=*/true, why);
}

[[maybe_unused]] const bool kRegistered = register_kernels<Op::attention_backward>(
    {Family::sm80, &plan, &attention::bwd_workspace_bytes<attention::kSm80BwdTiles>,
     &attention_backward_sm80});

}  // namespace
}  // namespace samattn
