// Softmax entry points of the sm80 family (Ampere, Ada, and newer GPUs
// through PTX). The kernels are instantiated in generated translation units.
#include "softmax/softmax_config.h"

namespace samattn {

cudaError_t softmax_forward_sm80(const SoftmaxProblem& problem) {
  return softmax::dispatch_forward<softmax::Family::sm80>(problem);
}

cudaError_t softmax_backward_sm80(const SoftmaxProblem& problem) {
  return softmax::dispatch_backward<softmax::Family::sm80>(problem);
}

}  // namespace samattn
