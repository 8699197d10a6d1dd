// The sm90 forward instantiation tag: plain data, no CuTe, so that the
// family's dispatch names an instantiation without compiling its kernel.
// Each row of kSm90FwdTiles (flash_sm90_tiles.h) is instantiated in exactly
// one translation unit.
#pragma once

#include "attention/attention_problem.h"

namespace samattn::attention {

// The shared memory of an sm90 forward tile: Q and `stages` K and V tiles of
// 16-bit elements, plus the mbarriers; O gets a buffer of its own where it
// fits next to them (227 KB on 9.0), so that the next tile's Q loads while
// this tile's O is stored; else O is staged in Q's buffer.
struct FlashFwdSm90Smem {
  int bytes;
  bool separate_o;
};
constexpr FlashFwdSm90Smem flash_fwd_sm90_smem(int head_dim, int block_m, int block_n, int stages) {
  const int tile = block_m * head_dim * 2;
  const int base = (block_m + 2 * stages * block_n) * head_dim * 2 + 1024;
  const bool separate_o = base + tile <= 227 * 1024;
  return {base + (separate_o ? tile : 0), separate_o};
}

// One sm90 forward kernel: dtype, padded head dim (smaller head dims run in
// it: TMA fills the missing columns with zeros and clips them on the store),
// kBlockM query rows (64 per consumer warpgroup) x kBlockN keys per tile,
// kStages shared-memory buffers for each of K and V.
template <DType T, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_>
struct FlashFwdSm90Config {
  static constexpr DType kDType = T;
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static_assert(kBlockM % 64 == 0 && kBlockM / 64 <= 3, "64 rows per consumer warpgroup");
  static_assert(kHeadDim % 64 == 0, "128-byte swizzled rows");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "a wgmma N / K extent");
  static constexpr FlashFwdSm90Smem kSmem =
      flash_fwd_sm90_smem(kHeadDim, kBlockM, kBlockN, kStages);
  static constexpr bool kSeparateO = kSmem.separate_o;
  static constexpr int kSmemBytes = kSmem.bytes;
};

// The forward kernel a call runs: masked with an attention mask, computed
// with ALiBi or dropout, else none (sinks join every kernel's epilogue).
inline TermsKernel sm90_forward_terms_kernel(const AttentionForwardProblem& problem) {
  if (problem.terms.mask.kind != MaskKind::none) return TermsKernel::masked;
  return problem.terms.alibi_slopes != nullptr || dropout_on(problem.terms) ? TermsKernel::computed
                                                                            : TermsKernel::none;
}

// Defined in flash_fwd_sm90_launch.cuh, instantiated once per tag.
template <class Config>
cudaError_t run_flash_fwd_sm90(const AttentionForwardProblem& problem);

}  // namespace samattn::attention
