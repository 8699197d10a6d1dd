// Softmax instantiation tags. No CuTe in here, so that the family entry files
// name an instantiation without compiling its kernels; each (direction, dtype,
// family) is explicitly instantiated in exactly one generated translation
// unit (cpp/instantiations.cmake).
#pragma once

#include "common/problem.h"

namespace samattn::softmax {

// The family is a template argument so that the sm75 and sm80 translation
// units never emit the same symbol (kernels included): each family's copy must
// stay bound to its own fatbin.
using Family = ::samattn::Family;

// Defined in softmax_launch.cuh. They plan the launch from the problem's
// sizes and pointer alignment, launch, and return cudaGetLastError().
template <DType T, Family F>
cudaError_t run_forward(const SoftmaxProblem& problem);
template <DType T, Family F>
cudaError_t run_backward(const SoftmaxProblem& problem);

// The family entry points dispatch on the dtype.
template <Family F>
cudaError_t dispatch_forward(const SoftmaxProblem& problem) {
  switch (problem.dtype) {
    case DType::f16:
      return run_forward<DType::f16, F>(problem);
    case DType::bf16:
      return run_forward<DType::bf16, F>(problem);
    case DType::f32:
      return run_forward<DType::f32, F>(problem);
  }
  return cudaErrorInvalidValue;
}

template <Family F>
cudaError_t dispatch_backward(const SoftmaxProblem& problem) {
  switch (problem.dtype) {
    case DType::f16:
      return run_backward<DType::f16, F>(problem);
    case DType::bf16:
      return run_backward<DType::bf16, F>(problem);
    case DType::f32:
      return run_backward<DType::f32, F>(problem);
  }
  return cudaErrorInvalidValue;
}

}  // namespace samattn::softmax
