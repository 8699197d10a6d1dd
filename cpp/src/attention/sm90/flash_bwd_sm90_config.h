// The sm90 backward instantiation tag: plain data, no CuTe, so that the
// family's dispatch names an instantiation without compiling its kernel.
// Each row of kSm90BwdTiles (flash_sm90_tiles.h) is instantiated in exactly
// one translation unit.
#pragma once

#include "attention/attention_problem.h"

namespace samattn::attention {

// The shared memory of an sm90 backward tile: K and V of the CTA's key tile,
// `stages` buffers of Q and dO (and of their rows' LSE and D), dS of a query
// tile in the input type (two buffers up to head dim 128, one past it), one
// query tile of dQ in fp32 for the bulk reductions into the accumulator, past
// head dim 128 (split roles) P^T in fp32, plus the mbarriers.
constexpr int flash_bwd_sm90_smem(int head_dim, int block_m, int block_n, int stages) {
  const int ds_stages = head_dim > 128 ? 1 : 2;
  return (2 * block_n * head_dim + 2 * stages * block_m * head_dim +
          ds_stages * block_m * block_n) *
             2 +
         block_m * head_dim * 4 + (head_dim > 128 ? block_m * block_n * 4 : 0) +
         stages * block_m * 2 * 4 + 1024;
}

// One sm90 backward kernel: dtype, head dim (the problem's padded head dim:
// the dQ accumulator's rows are that wide), kBlockM query rows per step of
// the key tile's loop, kBlockN keys per CTA (64 per consumer warpgroup; 64
// past head dim 128, where the two consumers split the work by role),
// kStages shared-memory buffers of the query-side tiles.
template <DType T, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_>
struct FlashBwdSm90Config {
  static constexpr DType kDType = T;
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static_assert(kBlockN % 64 == 0 && kBlockN / 64 <= 2, "64 keys per consumer warpgroup");
  static_assert(kHeadDim <= 128 || kBlockN == 64, "past head dim 128: one tile of 64 keys");
  static_assert(kHeadDim % 64 == 0, "128-byte swizzled rows");
  static_assert(kBlockM % 64 == 0 && kBlockM <= kFlashBwdMaxBlockM, "query tiles of 64 rows");
  static constexpr int kSmemBytes = flash_bwd_sm90_smem(kHeadDim, kBlockM, kBlockN, kStages);
};

// Defined in flash_bwd_sm90_launch.cuh, instantiated once per tag.
template <class Config>
cudaError_t run_flash_bwd_sm90(const AttentionBackwardProblem& problem);

}  // namespace samattn::attention
