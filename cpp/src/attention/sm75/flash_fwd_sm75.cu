// Attention forward, sm75 family (Turing, and newer GPUs when forced): fp16
// on mma.sync m16n8k8 with synchronous loads; bf16 needs sm80 (its
// registration declares fp16 only). The kernels are instantiated in their own
// translation units (one per FlashFwdConfig).
#include <string>

#include "attention/flash_fwd_dispatch.h"
#include "attention/kvcache_aux.cuh"
#include "common/registry.h"

namespace samattn {
namespace attention {
SAMATTN_INSTANTIATE_KVCACHE_AUX(Family::sm75)
}  // namespace attention

cudaError_t attention_forward_sm75(const AttentionForwardProblem& problem) {
  if (problem.dtype != DType::f16) return cudaErrorNotSupported;
  return attention::run_flash_fwd_sm75_dtype<DType::f16>(problem);
}

namespace {

bool plan(const AttentionForwardProblem& problem, std::string* why) {
  if (fp8_cache(problem.cache)) {
    if (why != nullptr) *why = "fp8 KV caches run in the sm80 and sm90 families";
    return false;
  }
  if (!plan_terms(any_terms(problem.terms), forward_vectors(problem), why)) return false;
  if (problem.cache.enabled && head_dim_built(padded_headdim(problem.headdim))) {
    return attention::plan_kvcache<attention::kSm75FwdTiles>(problem, why);
  }
  return attention::plan_flash(
      problem.headdim,
      attention::min_fwd_smem<Family::sm75, attention::kSm75FwdTiles>(problem.headdim),
      problem.max_smem_per_block, Family::sm75, /*backward=*/false, why);
}

// The kvcache kernel's scratch (split keys, rotated q); a masked call's tile
// map (masks never run the kvcache kernel).
size_t workspace_bytes(const AttentionForwardProblem& problem) {
  if (problem.terms.mask.kind != MaskKind::none) {
    return attention::fwd_mask_map_bytes<attention::kSm75FwdTiles>(problem);
  }
  return attention::kvcache_workspace_bytes(attention::kSm75FwdTiles, problem);
}

[[maybe_unused]] const bool kRegistered = register_kernels<Op::attention_forward>(
    {Family::sm75, &plan, &workspace_bytes, &attention_forward_sm75});

}  // namespace
}  // namespace samattn
