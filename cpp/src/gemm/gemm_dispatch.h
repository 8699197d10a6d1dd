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

// One GEMM of a list as a plain problem.
inline GemmProblem list_gemm(const GemmProblem& list, const samattn_gemm_list_entry& e) {
  GemmProblem one = list;
  one.group_mode = group::kGroupNone;
  one.group_list = nullptr;
  one.batch = 1;
  one.m = e.m;
  one.n = e.n;
  one.k = e.k;
  one.a = {e.a, 0, e.a_row_stride, e.a_col_stride};
  one.b = {e.b, 0, e.b_row_stride, e.b_col_stride};
  one.d = e.d;
  one.d_batch_stride = 0;
  one.d_row_stride = e.d_row_stride;
  one.d_col_stride = e.d_col_stride;
  one.split_k = 1;
  return one;
}

inline samattn_gemm_list_entry list_entry(const GemmProblem& one) {
  return {one.m,
          one.n,
          one.k,
          one.a.ptr,
          one.a.row_stride,
          one.a.col_stride,
          one.b.ptr,
          one.b.row_stride,
          one.b.col_stride,
          one.d,
          one.d_row_stride,
          one.d_col_stride};
}

// A problem, or a list (SAMATTN_GROUP_LIST) whose GEMMs all take this
// instantiation: the tensor-core kernel runs a list in one launch per
// kListLaunchGemms, the FMA-unit kernels one GEMM after another.
template <DType T, Major A, Major B, bool V, Family F>
cudaError_t launch(TensorCoreGemm<T, A, B, V, F>, const GemmProblem& problem) {
  return run_tensor_core<TensorCoreGemm<T, A, B, V, F>>(problem);
}
template <DType T, Major A, Major B, bool V, Family F>
cudaError_t launch(SimtGemm<T, A, B, V, F>, const GemmProblem& problem) {
  if (problem.group_mode != group::kGroupList) return run_simt<SimtGemm<T, A, B, V, F>>(problem);
  for (int64_t i = 0; i < problem.batch; ++i) {
    const cudaError_t status =
        run_simt<SimtGemm<T, A, B, V, F>>(list_gemm(problem, problem.group_list[i]));
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
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

// The instantiation Kernel<T, a, b, vectorized, F> that runs a problem, and
// the problem as it takes it: the four vectorized layouts, or the
// element-wise kernel (K, K, false) when either operand cannot take vector
// loads. kNMajorB = false: the family has no vectorized N-major-B kernel;
// such problems run transposed (A K-major) or element-wise.
struct KernelChoice {
  Major a = Major::K;
  Major b = Major::K;
  bool vectorized = false;
  GemmProblem problem;

  // 0 for the element-wise kernel, 1-4 for the vectorized layouts.
  int index() const { return vectorized ? 1 + 2 * static_cast<int>(a) + static_cast<int>(b) : 0; }
};
inline constexpr int kKernelChoices = 5;

template <bool kNMajorB>
KernelChoice choose_kernel(const GemmProblem& original, int element_bytes) {
  KernelChoice choice;
  choice.problem = canonical(original);
  const GemmProblem& problem = choice.problem;
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
  if (!a.vectorized || !b.vectorized) return choice;
  if (!kNMajorB && b.major == Major::MN) {
    if (a.major == Major::K && !group_rows) {  // D^T = B^T A^T: A becomes N-major, B K-major
      choice.problem = transposed(problem);
      choice.a = Major::MN;
      choice.vectorized = true;
    }
    return choice;
  }
  choice.a = a.major;
  choice.b = b.major;
  choice.vectorized = true;
  return choice;
}

// Kernel<T, choice's layout, F> on `problem`.
template <template <DType, Major, Major, bool, Family> class Kernel, DType T, Family F,
          bool kNMajorB>
cudaError_t launch_choice(const KernelChoice& choice, const GemmProblem& problem) {
  constexpr Major K = Major::K, MN = Major::MN;
  if (!choice.vectorized) return launch(Kernel<T, K, K, false, F>{}, problem);
  if (choice.a == K) {
    if constexpr (kNMajorB) {
      if (choice.b == MN) return launch(Kernel<T, K, MN, true, F>{}, problem);
    }
    return launch(Kernel<T, K, K, true, F>{}, problem);
  }
  if constexpr (kNMajorB) {
    if (choice.b == MN) return launch(Kernel<T, MN, MN, true, F>{}, problem);
  }
  return launch(Kernel<T, MN, K, true, F>{}, problem);
}

// A list (SAMATTN_GROUP_LIST) on the sm80 and sm75 families: its GEMMs sorted
// by the instantiation that runs each (as run_gemm chooses), every
// instantiation's share launched as one list (the tensor-core kernel takes
// kListLaunchGemms GEMMs per launch; the FMA-unit kernels run them one by
// one). A list of one layout is one launch per 32 GEMMs.
template <template <DType, Major, Major, bool, Family> class Kernel, DType T, Family F,
          bool kNMajorB = true>
cudaError_t run_gemm_list(const GemmProblem& list, int element_bytes) {
  constexpr int kShare = 64;  // GEMMs per call of an instantiation
  samattn_gemm_list_entry share[kShare];
  for (int index = 0; index < kKernelChoices; ++index) {
    KernelChoice choice;
    int count = 0;
    const auto flush = [&]() {
      GemmProblem part = list;
      part.batch = count;
      part.group_list = share;
      part.split_k = 1;
      count = 0;
      return launch_choice<Kernel, T, F, kNMajorB>(choice, part);
    };
    for (int64_t i = 0; i < list.batch; ++i) {
      const samattn_gemm_list_entry& e = list.group_list[i];
      if (e.m == 0 || e.n == 0) continue;
      const KernelChoice mine = choose_kernel<kNMajorB>(list_gemm(list, e), element_bytes);
      if (mine.index() != index) continue;
      choice = mine;
      share[count++] = list_entry(mine.problem);
      if (count == kShare) {
        const cudaError_t status = flush();
        if (status != cudaSuccess) return status;
      }
    }
    if (count > 0) {
      const cudaError_t status = flush();
      if (status != cudaSuccess) return status;
    }
  }
  return cudaSuccess;
}

// Runs a problem, or a list, on the family's instantiations.
template <template <DType, Major, Major, bool, Family> class Kernel, DType T, Family F,
          bool kNMajorB = true>
cudaError_t run_gemm(const GemmProblem& original, int element_bytes) {
  if (original.group_mode == group::kGroupList) {
    return run_gemm_list<Kernel, T, F, kNMajorB>(original, element_bytes);
  }
  const KernelChoice choice = choose_kernel<kNMajorB>(original, element_bytes);
  return launch_choice<Kernel, T, F, kNMajorB>(choice, choice.problem);
}

}  // namespace samattn::gemm
