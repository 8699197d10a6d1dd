// GEMM, sm80 family (Ampere, Ada, and newer GPUs through PTX): fp16 and bf16
// on mma.sync m16n8k16, fp32 on tf32 mma.sync when allowed, else exact FMA.
#include "common/registry.h"
#include "gemm/gemm_dispatch.h"
#include "gemm/group.h"
#include "gemm/split_k.h"

namespace samattn {

namespace {

// A problem, or a list of them (gemm_dispatch.h, run_gemm_list).
cudaError_t gemm_sm80(const GemmProblem& problem) {
  using gemm::Family;
  using gemm::SimtGemm;
  using gemm::TensorCoreGemm;
  switch (problem.dtype) {
    case DType::f16:
      return gemm::run_gemm<TensorCoreGemm, DType::f16, Family::sm80>(problem, 2);
    case DType::bf16:
      return gemm::run_gemm<TensorCoreGemm, DType::bf16, Family::sm80>(problem, 2);
    case DType::f32:
      return gemm::on_tensor_cores(Family::sm80, problem)  // tf32 allowed
                 ? gemm::run_gemm<TensorCoreGemm, DType::f32, Family::sm80>(problem, 4)
                 : gemm::run_gemm<SimtGemm, DType::f32, Family::sm80>(problem, 4);
  }
  return cudaErrorInvalidValue;
}

bool plan_sm80(const GemmProblem& problem, std::string* why) {
  return gemm::plan_tensor_core_modes(Family::sm80, problem, why);
}

size_t workspace_sm80(const GemmProblem& problem) {
  return static_cast<size_t>(gemm::split_k_family_workspace_bytes(Family::sm80, problem));
}

[[maybe_unused]] const bool kRegistered =
    register_kernels<Op::gemm>({Family::sm80, &plan_sm80, &workspace_sm80, &gemm_sm80});

}  // namespace
}  // namespace samattn
