// GEMM instantiation tags. Plain types with no CuTe in them, so that the
// family dispatch code names an instantiation without compiling its kernel;
// each tag is explicitly instantiated in exactly one generated translation
// unit (cpp/instantiations.cmake).
#pragma once

#include "common/problem.h"

namespace samattn::gemm {

// Which mode of an operand is contiguous in memory: for A (m, k) and B (k, n),
// K-major means stride 1 along k; MN-major means stride 1 along m (for A) or
// n (for B). A row-major A and a column-major B are both K-major.
enum class Major { K, MN };

using Family = ::samattn::Family;

// Tensor-core GEMM (mma.sync). DType::f32 means tf32 operands.
// Vectorized: 16-byte global loads (aligned pointers, leading dimensions and
// contiguous extents); otherwise element-wise loads with any strides.
template <DType T, Major A, Major B, bool Vectorized, Family F>
struct TensorCoreGemm {};

// FMA-unit GEMM (exact fp32; bf16 on Turing), fp32 accumulation.
// Vectorized as above; the non-vectorized variant accepts any strides and
// ignores A and B.
template <DType T, Major A, Major B, bool Vectorized, Family F>
struct SimtGemm {};

// Defined in the launch headers, instantiated once per tag.
template <class Config>
cudaError_t run_tensor_core(const GemmProblem& problem);
template <class Config>
cudaError_t run_simt(const GemmProblem& problem);

}  // namespace samattn::gemm
