// The precondition of the vectorized SIMT GEMM kernels, checked by run_simt.
// The family dispatch (gemm_dispatch.h) chooses the instantiation with a rule
// at least as strict (16-byte vectors); this check keeps a wrong choice from
// ever reading out of bounds. No CuTe here.
//
// The vectorized kernels move 4 elements per access (16 bytes of fp32, 8 bytes
// of bf16). An operand qualifies in a layout when, for that layout,
//   - its contiguous stride is 1 (k for K-major, m or n for MN-major),
//   - the pointer is aligned to 4 elements,
//   - the other stride and the batch stride are multiples of 4 (0 included),
//   - the contiguous extent (k for K-major, m or n for MN-major) is a
//     multiple of 4, so that a vector is entirely inside or outside the matrix.
// Anything else runs the element-wise kernel (any strides).
#pragma once

#include <cstdint>

#include "gemm/gemm_config.h"

namespace samattn::gemm {

inline constexpr int kSimtVectorWidth = 4;

struct SimtOperandLayout {
  int64_t mn_stride, k_stride, batch_stride;
  int64_t mn_extent, k_extent;
};

inline bool simt_operand_vectorizable(const void* ptr, int64_t element_bytes,
                                      const SimtOperandLayout& op, Major major) {
  constexpr int64_t kWidth = kSimtVectorWidth;
  const int64_t contiguous_stride = major == Major::K ? op.k_stride : op.mn_stride;
  const int64_t other_stride = major == Major::K ? op.mn_stride : op.k_stride;
  const int64_t contiguous_extent = major == Major::K ? op.k_extent : op.mn_extent;
  return contiguous_stride == 1 &&
         reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(kWidth * element_bytes) == 0 &&
         other_stride % kWidth == 0 && op.batch_stride % kWidth == 0 &&
         contiguous_extent % kWidth == 0;
}

// A as (m, k) and B as (k, n), each seen as (mn, k).
inline SimtOperandLayout simt_layout_of_a(const GemmProblem& p) {
  return {p.a.row_stride, p.a.col_stride, p.a.batch_stride, p.m, p.k};
}
inline SimtOperandLayout simt_layout_of_b(const GemmProblem& p) {
  return {p.b.col_stride, p.b.row_stride, p.b.batch_stride, p.n, p.k};
}

}  // namespace samattn::gemm
