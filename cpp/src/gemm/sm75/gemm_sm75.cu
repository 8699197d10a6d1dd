// GEMM, sm75 family (Turing): fp16 on mma.sync m16n8k8; bf16 and fp32 on FMA
// units (Turing has no bf16 or tf32 tensor cores), always exact fp32 math.
#include "common/registry.h"
#include "gemm/gemm_dispatch.h"
#include "gemm/group.h"
#include "gemm/split_k.h"

namespace samattn {

namespace {

// A problem, or a list of them (gemm_dispatch.h, run_gemm_list).
cudaError_t gemm_sm75(const GemmProblem& problem) {
  using gemm::Family;
  using gemm::SimtGemm;
  using gemm::TensorCoreGemm;
  switch (problem.dtype) {
    case DType::f16:
      // No vectorized N-major-B kernel on sm75: with two k8 MMAs per step its
      // shared-memory reads ran out of the tile (compute-sanitizer, H200);
      // those problems run transposed or element-wise (gemm_dispatch.h).
      return gemm::run_gemm<TensorCoreGemm, DType::f16, Family::sm75, false>(problem, 2);
    case DType::bf16:
      return gemm::run_gemm<SimtGemm, DType::bf16, Family::sm75>(problem, 2);
    case DType::f32:
      return gemm::run_gemm<SimtGemm, DType::f32, Family::sm75>(problem, 4);
  }
  return cudaErrorInvalidValue;
}

bool plan_sm75(const GemmProblem& problem, std::string* why) {
  return gemm::plan_tensor_core_modes(Family::sm75, problem, why);
}

size_t workspace_sm75(const GemmProblem& problem) {
  return static_cast<size_t>(gemm::split_k_family_workspace_bytes(Family::sm75, problem));
}

[[maybe_unused]] const bool kRegistered =
    register_kernels<Op::gemm>({Family::sm75, &plan_sm75, &workspace_sm75, &gemm_sm75});

}  // namespace
}  // namespace samattn
