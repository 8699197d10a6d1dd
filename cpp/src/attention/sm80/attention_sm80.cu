// Attention forward, sm80 family (Ampere, Ada, and newer GPUs through PTX):
// fp16 and bf16 on mma.sync m16n8k16. The kernels are instantiated in their
// own translation units (one per FlashFwdConfig).
#include "attention/flash_fwd_dispatch.h"

namespace samattn {

cudaError_t attention_forward_sm80(const AttentionForwardProblem& problem) {
  if (problem.headdim <= 0) return cudaErrorNotSupported;
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

}  // namespace samattn
