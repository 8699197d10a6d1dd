// The forward attention instantiation tag. A plain type with no CuTe in it,
// so that the family dispatch names an instantiation without compiling its
// kernel; each tag a family's tile table names (flash_tiles.h) is explicitly
// instantiated in exactly one translation unit.
#pragma once

#include "attention/attention_problem.h"

namespace samattn::attention {

using Family = ::samattn::Family;

// One forward kernel: head dim (the padded one the tiles use; smaller head
// dims run in it with predicated loads and stores), CTA tile of kBlockM
// queries x kBlockN keys, warps (each owns 16-row slices of the query tile),
// whether the Q tile stays in registers for the whole key loop (else it is
// re-read from shared memory per key tile, which frees registers for large
// head dims), the family (sm80: mma.sync m16n8k16 + cp.async; sm75: the
// same kernel with an m16n8k8 atom and synchronous loads; sm90: sm80's
// kvcache kernel whose key splits combine in a cluster) and the
// shared-memory stages of K and V (2: tiles load a whole key tile ahead;
// cp.async only); kKVCache: the inference kernel (TileUse::kvcache), which
// reads K and V from caches (paged or not, per-sequence lengths), splits the
// key range over CTAs and packs the query heads of a KV head into one tile;
// kFp8Cache: its caches hold fp8 (Fp8CacheView), widened to T in shared
// memory where each tile lands (cp.async only).
template <DType T, int kHeadDim, int kBlockM, int kBlockN, int kWarps, bool kQInRegs, Family F,
          int kKVStages = 1, bool kKVCache = false, bool kFp8Cache = false>
struct FlashFwdConfig {
  static_assert(kKVStages == 1 || (kKVStages == 2 && F != Family::sm75), "2 stages need cp.async");
  static_assert(!kFp8Cache || (kKVCache && F != Family::sm75), "fp8 caches: kvcache, cp.async");
  static constexpr Family kFamily = F;
  // Q (reused to stage O), kKVStages K and V tiles of 16-bit elements.
  static constexpr int kSmemBytes = (kBlockM + 2 * kKVStages * kBlockN) * kHeadDim * 2;
};

// Defined in flash_fwd_launch.cuh, instantiated once per tag.
template <class Config>
cudaError_t run_flash_fwd(const AttentionForwardProblem& problem);

}  // namespace samattn::attention
