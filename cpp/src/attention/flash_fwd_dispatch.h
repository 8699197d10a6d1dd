// Picks the forward configuration of a problem (padded head dim, dtype, the
// device's shared memory) and calls its instantiation, which lives in its
// own translation unit.
#pragma once

#include "attention/flash_fwd_config.h"

namespace samattn::attention {

template <DType T, int kHeadDim>
cudaError_t run_flash_fwd_sm80_hdim(const AttentionForwardProblem& problem) {
  using Large = typename Sm80FwdTiles<T, kHeadDim, true>::type;
  using Small = typename Sm80FwdTiles<T, kHeadDim, false>::type;
  if (problem.max_smem_per_block >= Large::kSmemBytes) return run_flash_fwd<Large>(problem);
  if (problem.max_smem_per_block >= Small::kSmemBytes) return run_flash_fwd<Small>(problem);
  return cudaErrorNotSupported;
}

template <DType T>
cudaError_t run_flash_fwd_sm80_dtype(const AttentionForwardProblem& problem) {
  switch (padded_headdim(problem.headdim)) {
    case 32:
      return run_flash_fwd_sm80_hdim<T, 32>(problem);
    case 64:
      return run_flash_fwd_sm80_hdim<T, 64>(problem);
    case 96:
      return run_flash_fwd_sm80_hdim<T, 96>(problem);
    case 128:
      return run_flash_fwd_sm80_hdim<T, 128>(problem);
    case 192:
      return run_flash_fwd_sm80_hdim<T, 192>(problem);
    case 256:
      return run_flash_fwd_sm80_hdim<T, 256>(problem);
  }
  return cudaErrorNotSupported;
}

}  // namespace samattn::attention
