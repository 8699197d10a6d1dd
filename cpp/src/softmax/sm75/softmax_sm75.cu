// Softmax entry points of the sm75 family (Turing; also runs on newer GPUs
// from its own SASS). The kernels are instantiated in generated translation units.
#include "common/registry.h"
#include "softmax/softmax_config.h"

namespace samattn {

namespace {

cudaError_t softmax_forward_sm75(const SoftmaxProblem& problem) {
  return softmax::dispatch_forward<softmax::Family::sm75>(problem);
}

cudaError_t softmax_backward_sm75(const SoftmaxProblem& problem) {
  return softmax::dispatch_backward<softmax::Family::sm75>(problem);
}

[[maybe_unused]] const bool kForward =
    register_kernels<Op::softmax_forward>({Family::sm75, nullptr, nullptr, &softmax_forward_sm75});
[[maybe_unused]] const bool kBackward = register_kernels<Op::softmax_backward>(
    {Family::sm75, nullptr, nullptr, &softmax_backward_sm75});

}  // namespace
}  // namespace samattn
