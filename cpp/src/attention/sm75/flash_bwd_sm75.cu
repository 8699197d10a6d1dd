// Attention backward, sm75 family: fp16 on mma.sync m16n8k8 with synchronous
// loads; head dims up to 192 (256 does not fit Turing's 64 KB of shared
// memory). The kernels are instantiated in their own translation units (one
// per FlashBwdConfig).
#include "attention/flash_bwd_dispatch.h"

namespace samattn {

cudaError_t attention_backward_sm75(const AttentionBackwardProblem& problem) {
  if (problem.headdim <= 0) return cudaErrorNotSupported;
  if (problem.dtype != DType::f16) return cudaErrorNotSupported;
  return attention::run_flash_bwd_sm75_dtype<DType::f16>(problem);
}

}  // namespace samattn
