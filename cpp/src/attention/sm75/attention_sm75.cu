// Attention forward, sm75 family (Turing, and newer GPUs when forced): fp16
// on mma.sync m16n8k8 with synchronous loads; bf16 needs sm80 (the API's
// family check refuses it before this point). The kernels are instantiated in
// their own translation units (one per FlashFwdConfig).
#include "attention/flash_fwd_dispatch.h"

namespace samattn {

cudaError_t attention_forward_sm75(const AttentionForwardProblem& problem) {
  if (problem.headdim <= 0) return cudaErrorNotSupported;
  if (problem.dtype != DType::f16) return cudaErrorNotSupported;
  return attention::run_flash_fwd_sm75_dtype<DType::f16>(problem);
}

}  // namespace samattn
