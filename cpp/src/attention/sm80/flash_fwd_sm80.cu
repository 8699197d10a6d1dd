// Attention forward, sm80 family (Ampere, Ada, and newer GPUs through PTX):
// fp16 and bf16 on mma.sync m16n8k16. The kernels are instantiated in their
// own translation units (one per FlashFwdConfig).
#include <string>

#include "attention/flash_fwd_dispatch.h"
#include "common/registry.h"

namespace samattn {

cudaError_t attention_forward_sm80(const AttentionForwardProblem& problem) {
  switch (problem.dtype) {
    case DType::f16:
      return attention::run_flash_fwd_sm80_dtype<DType::f16>(problem);
    case DType::bf16:
      return attention::run_flash_fwd_sm80_dtype<DType::bf16>(problem);
    default:
      break;
  }
  return cudaErrorNotSupported;
}

namespace {

bool plan(const AttentionForwardProblem& problem, std::string* why) {
  return attention::plan_flash(
      problem.headdim,
      attention::min_fwd_smem<Family::sm80, attention::kSm80FwdTiles>(problem.headdim),
      problem.max_smem_per_block, Family::sm80, /*backward=*/false, why);
}

[[maybe_unused]] const bool kRegistered = register_kernels<Op::attention_forward>(
    {Family::sm80, &plan, nullptr, &attention_forward_sm80});

}  // namespace
}  // namespace samattn
