// Host-side choice of a GEMM instantiation: the operand layouts (which mode
// is contiguous) and whether 16-byte vector loads are legal. No CuTe here:
// the dispatch code only names instantiation tags (gemm_config.h).
#pragma once

#include "gemm/gemm_config.h"
#include "gemm/group.h"

namespace samattn::gemm {

struct OperandPlan {
  Major major = Major::K;
  bool vectorized = false;
};

// An operand seen as rows x cols with K along `cols` (A) or along `rows` (B).
// 16-byte loads need: a 16-byte aligned pointer, a contiguous extent and
// leading/batch strides that are multiples of the vector width.
inline OperandPlan plan_operand(const MatrixView& view, int64_t rows, int64_t cols,
                                bool k_along_cols, int64_t batch, int element_bytes) {
  const int64_t vector = 16 / element_bytes;
  const bool aligned_ptr = reinterpret_cast<uintptr_t>(view.ptr) % 16 == 0;
  const bool batch_ok = batch == 1 || view.batch_stride % vector == 0;
  auto fits = [&](int64_t contiguous_extent, int64_t other_extent, int64_t leading_stride) {
    (void)other_extent;
    return aligned_ptr && batch_ok && contiguous_extent % vector == 0 &&
           leading_stride % vector == 0;
  };
  // Row-contiguous (col_stride 1) or column-contiguous (row_stride 1).
  const bool row_contiguous = view.col_stride == 1;
  const bool col_contiguous = view.row_stride == 1;
  const Major row_contiguous_major = k_along_cols ? Major::K : Major::MN;
  const Major col_contiguous_major = k_along_cols ? Major::MN : Major::K;
  if (row_contiguous && fits(cols, rows, view.row_stride)) return {row_contiguous_major, true};
  if (col_contiguous && fits(rows, cols, view.col_stride)) return {col_contiguous_major, true};
  return {Major::K, false};
}

template <DType T, Major A, Major B, bool V, Family F>
cudaError_t launch(TensorCoreGemm<T, A, B, V, F>, const GemmProblem& problem) {
  return run_tensor_core<TensorCoreGemm<T, A, B, V, F>>(problem);
}
template <DType T, Major A, Major B, bool V, Family F>
cudaError_t launch(SimtGemm<T, A, B, V, F>, const GemmProblem& problem) {
  return run_simt<SimtGemm<T, A, B, V, F>>(problem);
}

// Strides of size-1 modes never matter; zeroing them lets layout checks
// ignore them (a (K,1) column is as vectorizable as any K-major operand).
inline GemmProblem canonical(GemmProblem p) {
  auto clean = [&](MatrixView& v, int64_t rows, int64_t cols) {
    if (rows == 1) v.row_stride = 0;
    if (cols == 1) v.col_stride = 0;
    if (p.batch == 1) v.batch_stride = 0;
  };
  clean(p.a, p.m, p.k);
  clean(p.b, p.k, p.n);
  clean(p.c, p.m, p.n);
  return p;
}

// D^T = B^T A^T: the same product with the operands' roles swapped.
inline GemmProblem transposed(const GemmProblem& problem) {
  GemmProblem t = problem;
  t.m = problem.n;
  t.n = problem.m;
  t.a = {problem.b.ptr, problem.b.batch_stride, problem.b.col_stride, problem.b.row_stride};
  t.b = {problem.a.ptr, problem.a.batch_stride, problem.a.col_stride, problem.a.row_stride};
  t.c = {problem.c.ptr, problem.c.batch_stride, problem.c.col_stride, problem.c.row_stride};
  t.d_row_stride = problem.d_col_stride;
  t.d_col_stride = problem.d_row_stride;
  t.bias_per_row = !problem.bias_per_row;  // the caller's columns are D^T's rows
  return t;
}

// Runs Kernel<T, majorA, majorB, vectorized, F>: the four vectorized layouts,
// or the element-wise kernel when either operand cannot take vector loads.
// kNMajorB = false: the family has no vectorized N-major-B kernel; such
// problems run transposed (A K-major) or element-wise.
template <template <DType, Major, Major, bool, Family> class Kernel, DType T, Family F,
          bool kNMajorB = true>
cudaError_t run_gemm(const GemmProblem& original, int element_bytes) {
  const GemmProblem problem = canonical(original);
  OperandPlan a = plan_operand(problem.a, problem.m, problem.k, /*k_along_cols=*/true,
                               problem.batch, element_bytes);
  OperandPlan b = plan_operand(problem.b, problem.k, problem.n, /*k_along_cols=*/false,
                               problem.batch, element_bytes);
  // A group starts at any row (rows) or any K (K): 16-byte vectors stay
  // aligned only along the modes that do not move.
  const bool group_rows = problem.group_mode == group::kGroupRows;
  if (group_rows && a.major == Major::MN) a.vectorized = false;
  if (problem.group_mode == group::kGroupK) {
    if (a.major == Major::K) a.vectorized = false;
    if (b.major == Major::K) b.vectorized = false;
  }
  if (!a.vectorized || !b.vectorized) {
    return launch(Kernel<T, Major::K, Major::K, false, F>{}, problem);
  }
  if constexpr (!kNMajorB) {
    if (b.major == Major::MN) {  // transposed, unless its rows are groups
      return a.major == Major::K && !group_rows
                 ? launch(Kernel<T, Major::MN, Major::K, true, F>{}, transposed(problem))
                 : launch(Kernel<T, Major::K, Major::K, false, F>{}, problem);
    }
    return a.major == Major::K ? launch(Kernel<T, Major::K, Major::K, true, F>{}, problem)
                               : launch(Kernel<T, Major::MN, Major::K, true, F>{}, problem);
  } else {
    if (a.major == Major::K) {
      return b.major == Major::K ? launch(Kernel<T, Major::K, Major::K, true, F>{}, problem)
                                 : launch(Kernel<T, Major::K, Major::MN, true, F>{}, problem);
    }
    return b.major == Major::K ? launch(Kernel<T, Major::MN, Major::K, true, F>{}, problem)
                               : launch(Kernel<T, Major::MN, Major::MN, true, F>{}, problem);
  }
}

}  // namespace samattn::gemm
