// Softmax entry points of the sm80 family (Ampere, Ada, and newer GPUs
// through PTX). The kernels are instantiated in generated translation units.
#include "common/registry.h"
#include "softmax/softmax_config.h"

namespace samattn {

namespace {

cudaError_t softmax_forward_sm80(const SoftmaxProblem& problem) {
  return softmax::dispatch_forward<softmax::Family::sm80>(problem);
}

cudaError_t softmax_backward_sm80(const SoftmaxProblem& problem) {
  return softmax::dispatch_backward<softmax::Family::sm80>(problem);
}

[[maybe_unused]] const bool kForward =
    register_kernels<Op::softmax_forward>({Family::sm80, nullptr, nullptr, &softmax_forward_sm80});
[[maybe_unused]] const bool kBackward = register_kernels<Op::softmax_backward>(
    {Family::sm80, nullptr, nullptr, &softmax_backward_sm80});

}  // namespace
}  // namespace samattn
