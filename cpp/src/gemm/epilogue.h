// The GEMM epilogue every family applies in fp32 before D is rounded:
//   D = activation(alpha * acc + beta * C + bias[column])
// Host and device code, no CUDA headers: the simt kernel's CPU emulation
// compiles it too.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define SAMATTN_EPILOGUE_FN __host__ __device__ __forceinline__
#else
#define SAMATTN_EPILOGUE_FN inline
#endif

namespace samattn::gemm {

// Values of SAMATTN_ACTIVATION_*. A runtime value: one kernel serves every
// activation. A kernel that applies it to a register fragment should branch
// on it once, not per element: a switch per element of an unrolled loop
// becomes an indirect branch per element (gemm_tensor_core_kernel.cuh).
enum class Activation : int32_t { none = 0, relu = 1, gelu = 2, gelu_tanh = 3, silu = 4 };
constexpr int32_t kActivationCount = 5;

// torch's formulas (F.relu, F.gelu with approximate "none" and "tanh",
// F.silu) in fp32. relu keeps NaN, as torch's does.
SAMATTN_EPILOGUE_FN float activate(Activation activation, float x) {
  switch (activation) {
    case Activation::relu:
      return x < 0.0f ? 0.0f : x;
    case Activation::gelu:
      return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case Activation::gelu_tanh: {
      const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);  // sqrt(2/pi)
      return 0.5f * x * (1.0f + tanhf(inner));
    }
    case Activation::silu:
      return x / (1.0f + expf(-x));
    case Activation::none:
      break;
  }
  return x;
}

}  // namespace samattn::gemm
