// Attention backward, sm80 family: fp16 and bf16 on mma.sync m16n8k16. The
// kernels are instantiated in their own translation units (one per
// FlashBwdConfig).
#include "attention/flash_bwd_dispatch.h"

namespace samattn {

cudaError_t attention_backward_sm80(const AttentionBackwardProblem& problem) {
  if (problem.headdim <= 0) return cudaErrorNotSupported;
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

}  // namespace samattn
