// Picks the backward configuration of a problem (family, padded head dim,
// dtype, the device's shared memory) and calls its instantiation, which lives
// in its own translation unit.
#pragma once

#include <type_traits>

#include "attention/flash_bwd_config.h"
#include "attention/flash_fwd_dispatch.h"
#include "attention/sm75/flash_sm75_tiles.h"

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
  return with_padded_headdim(problem.headdim, [&](auto headdim) {
    return run_flash_bwd_sm80_hdim<T, decltype(headdim)::value>(problem);
  });
}

// The smallest backward tiles; sm75 has none for head dim 256.
template <int kHeadDim>
struct Sm80BwdMinSmem {
  static constexpr int value = Sm80BwdTiles<DType::f16, kHeadDim, 0>::type::kSmemBytes;
};
template <int kHeadDim>
struct Sm75BwdMinSmem {
  using Config = typename Sm75BwdTiles<DType::f16, kHeadDim>::type;
  static constexpr int value = [] {
    if constexpr (std::is_void_v<Config>) {
      return 0;
    } else {
      return Config::kSmemBytes;
    }
  }();
};

// sm75: one tile per head dim (none for 256); cudaErrorNotSupported where
// there is none or it does not fit the device's shared memory.
template <DType T>
cudaError_t run_flash_bwd_sm75_dtype(const AttentionBackwardProblem& problem) {
  return with_padded_headdim(problem.headdim, [&](auto headdim) {
    using Config = typename Sm75BwdTiles<T, decltype(headdim)::value>::type;
    if constexpr (std::is_void_v<Config>) {
      return cudaErrorNotSupported;
    } else {
      if (problem.max_smem_per_block < Config::kSmemBytes) return cudaErrorNotSupported;
      return run_flash_bwd<Config>(problem);
    }
  });
}

}  // namespace samattn::attention
