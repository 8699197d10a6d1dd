// Softmax entry points of the sm75 family (Turing; also runs on newer GPUs
// from its own SASS). The kernels are instantiated in generated translation units.
#include "softmax/softmax_config.h"

namespace samattn {

cudaError_t softmax_forward_sm75(const SoftmaxProblem& problem) {
  return softmax::dispatch_forward<softmax::Family::sm75>(problem);
}

cudaError_t softmax_backward_sm75(const SoftmaxProblem& problem) {
  return softmax::dispatch_backward<softmax::Family::sm75>(problem);
}

}  // namespace samattn
