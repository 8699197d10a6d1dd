// Attention forward, sm80 family (Ampere, Ada, and newer GPUs through PTX):
// fp16 and bf16 on mma.sync m16n8k16. The kernels are instantiated in their
// own translation units (one per FlashFwdConfig).
#include <string>

#include "attention/flash_fwd_dispatch.h"
#include "attention/kvcache_aux.cuh"
#include "common/registry.h"

namespace samattn {
namespace attention {
SAMATTN_INSTANTIATE_KVCACHE_AUX(Family::sm80)
}  // namespace attention

cudaError_t attention_forward_sm80(const AttentionForwardProblem& problem) {
  switch (problem.dtype) {
    case DType::f16:
      return attention::run_flash_fwd_sm80_dtype<DType::f16>(problem);
    case DType::bf16:
      return attention::run_flash_fwd_sm80_dtype<DType::bf16>(problem);
    default:
      break;
  }
  return cudaErrorNotSupported;
}

namespace {

bool plan(const AttentionForwardProblem& problem, std::string* why) {
  if (!plan_terms(any_terms(problem.terms), forward_vectors(problem), why)) return false;
  if (problem.cache.enabled && head_dim_built(padded_headdim(problem.headdim))) {
    return attention::plan_kvcache<attention::kSm80FwdTiles>(problem, why);
  }
  return attention::plan_flash(
      problem.headdim,
      attention::min_fwd_smem<Family::sm80, attention::kSm80FwdTiles>(problem.headdim),
      problem.max_smem_per_block, Family::sm80, /*backward=*/false, why);
}

// The kvcache kernel's scratch (split keys, rotated q); a masked call's tile
// map (masks never run the kvcache kernel).
size_t workspace_bytes(const AttentionForwardProblem& problem) {
  if (problem.terms.mask.kind != MaskKind::none) {
    return attention::fwd_mask_map_bytes<attention::kSm80FwdTiles>(problem);
  }
  return attention::kvcache_workspace_bytes(attention::kSm80FwdTiles, problem);
}

[[maybe_unused]] const bool kRegistered = register_kernels<Op::attention_forward>(
    {Family::sm80, &plan, &workspace_bytes, &attention_forward_sm80});

}  // namespace
}  // namespace samattn
