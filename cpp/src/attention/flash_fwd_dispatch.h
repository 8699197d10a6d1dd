// Picks the forward configuration of a problem (family, padded head dim,
// dtype, the device's shared memory) and calls its instantiation, which lives
// in its own translation unit.
#pragma once

#include <type_traits>

#include "attention/flash_fwd_config.h"
#include "attention/sm75/flash_sm75_tiles.h"

namespace samattn::attention {

template <int kHeadDim, class Run>
cudaError_t run_if_built(Run&& run) {
  if constexpr (head_dim_built(kHeadDim)) {
    return run(std::integral_constant<int, kHeadDim>{});
  } else {
    return cudaErrorNotSupported;
  }
}

// run(std::integral_constant<int, padded head dim>{}) for the problem's head
// dim; cudaErrorNotSupported beyond 256 or for a head dim left out of the build.
template <class Run>
cudaError_t with_padded_headdim(int headdim, Run&& run) {
  switch (padded_headdim(headdim)) {
    case 32:
      return run_if_built<32>(run);
    case 64:
      return run_if_built<64>(run);
    case 96:
      return run_if_built<96>(run);
    case 128:
      return run_if_built<128>(run);
    case 192:
      return run_if_built<192>(run);
    case 256:
      return run_if_built<256>(run);
  }
  return cudaErrorNotSupported;
}

// Whether a problem runs a short, unmasked key loop: no causal or window
// bound and at most 1536 keys (24 tiles of 64), where Sm80FwdShortKeyTiles
// measured faster (up to 2k keys; slower with a mask and from 4k keys).
inline bool short_key_loop(const AttentionForwardProblem& problem) {
  const auto unbounded = [&](int bound) { return bound < 0 || bound >= problem.seqlen_k; };
  return !problem.causal && unbounded(problem.window_left) && unbounded(problem.window_right) &&
         problem.seqlen_k <= 1536;
}

template <DType T, int kHeadDim>
cudaError_t run_flash_fwd_sm80_hdim(const AttentionForwardProblem& problem) {
  using Large = typename Sm80FwdTiles<T, kHeadDim, true>::type;
  using Small = typename Sm80FwdTiles<T, kHeadDim, false>::type;
  using ShortKeys = typename Sm80FwdShortKeyTiles<T, kHeadDim>::type;
  if constexpr (!std::is_void_v<ShortKeys>) {
    if (short_key_loop(problem) && problem.max_smem_per_block >= ShortKeys::kSmemBytes) {
      return run_flash_fwd<ShortKeys>(problem);
    }
  }
  if (problem.max_smem_per_block >= Large::kSmemBytes) return run_flash_fwd<Large>(problem);
  if (problem.max_smem_per_block >= Small::kSmemBytes) return run_flash_fwd<Small>(problem);
  return cudaErrorNotSupported;
}

template <DType T>
cudaError_t run_flash_fwd_sm80_dtype(const AttentionForwardProblem& problem) {
  return with_padded_headdim(problem.headdim, [&](auto headdim) {
    return run_flash_fwd_sm80_hdim<T, decltype(headdim)::value>(problem);
  });
}

// sm75: one tile per head dim; cudaErrorNotSupported where it does not fit
// the device's shared memory.
template <DType T>
cudaError_t run_flash_fwd_sm75_dtype(const AttentionForwardProblem& problem) {
  return with_padded_headdim(problem.headdim, [&](auto headdim) {
    using Config = typename Sm75FwdTiles<T, decltype(headdim)::value>::type;
    if (problem.max_smem_per_block < Config::kSmemBytes) return cudaErrorNotSupported;
    return run_flash_fwd<Config>(problem);
  });
}

}  // namespace samattn::attention
