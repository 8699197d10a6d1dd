// Picks the backward configuration of a problem (padded head dim, dtype, the
// device's shared memory) and calls its instantiation, which lives in its
// own translation unit.
#pragma once

#include "attention/flash_bwd_config.h"
#include "attention/flash_fwd_config.h"

namespace samattn::attention {

template <DType T, int kHeadDim>
cudaError_t run_flash_bwd_sm80_hdim(const AttentionBackwardProblem& problem) {
  using Tier2 = typename Sm80BwdTiles<T, kHeadDim, 2>::type;
  using Tier1 = typename Sm80BwdTiles<T, kHeadDim, 1>::type;
  using Tier0 = typename Sm80BwdTiles<T, kHeadDim, 0>::type;
  const int smem = problem.max_smem_per_block;
  if (smem >= Tier2::kSmemBytes) return run_flash_bwd<Tier2>(problem);
  if (smem >= Tier1::kSmemBytes) return run_flash_bwd<Tier1>(problem);
  if (smem >= Tier0::kSmemBytes) return run_flash_bwd<Tier0>(problem);
  return cudaErrorNotSupported;
}

template <DType T>
cudaError_t run_flash_bwd_sm80_dtype(const AttentionBackwardProblem& problem) {
  switch (padded_headdim(problem.headdim)) {
    case 32:
      return run_flash_bwd_sm80_hdim<T, 32>(problem);
    case 64:
      return run_flash_bwd_sm80_hdim<T, 64>(problem);
    case 96:
      return run_flash_bwd_sm80_hdim<T, 96>(problem);
    case 128:
      return run_flash_bwd_sm80_hdim<T, 128>(problem);
    case 192:
      return run_flash_bwd_sm80_hdim<T, 192>(problem);
    case 256:
      return run_flash_bwd_sm80_hdim<T, 256>(problem);
  }
  return cudaErrorNotSupported;
}

}  // namespace samattn::attention
