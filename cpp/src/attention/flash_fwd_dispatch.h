// Picks the forward configuration of a problem (family, padded head dim,
// dtype, the device's shared memory) and calls its instantiation, which lives
// in its own translation unit.
#pragma once

#include <string>
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

// value of Smem<padded head dim>: the shared memory of a family's smallest
// tile for the head dim (0: the family has none); 0 beyond 256.
template <template <int> class Smem>
constexpr int smem_for_headdim(int headdim) {
  switch (padded_headdim(headdim)) {
    case 32:
      return Smem<32>::value;
    case 64:
      return Smem<64>::value;
    case 96:
      return Smem<96>::value;
    case 128:
      return Smem<128>::value;
    case 192:
      return Smem<192>::value;
    case 256:
      return Smem<256>::value;
  }
  return 0;
}

// The plan of every mma.sync attention family: the head dim must be in the
// build (SAMATTN_ATTENTION_HEAD_DIMS) and the smallest tile of the family
// for it (`min_smem` bytes, 0: none) must fit the device's shared memory.
// `why` (may be null) gets the reason of a decline.
inline bool plan_flash(int headdim, int min_smem, int max_smem_per_block, Family family,
                       bool backward, std::string* why) {
  const int padded = padded_headdim(headdim);
  if (!head_dim_built(padded)) {
    if (why != nullptr) {
      std::string built;
      for (int d : {32, 64, 96, 128, 192, 256}) {
        if (head_dim_built(d)) built += (built.empty() ? "" : ", ") + std::to_string(d);
      }
      *why =
          "head dim " + std::to_string(headdim) + " runs in the " + std::to_string(padded) +
          " kernels, which this build left out (built with SAMATTN_ATTENTION_HEAD_DIMS = " + built +
          ")";
    }
    return false;
  }
  if (min_smem > 0 && min_smem <= max_smem_per_block) return true;
  if (why != nullptr) {
    *why = std::string("no ") + (backward ? "backward " : "") + "kernel for head dim " +
           std::to_string(headdim) + " that fits the " + std::to_string(max_smem_per_block) +
           " bytes of shared memory per block of this GPU" +
           (min_smem == 0 && backward && family == Family::sm75
                ? " (the sm75 backward supports head dims up to 192)"
                : "");
  }
  return false;
}

// Whether a problem runs a short, unmasked key loop: no causal or window
// bound and at most 1536 keys (24 tiles of 64), where Sm80FwdShortKeyTiles
// measured faster (up to 2k keys; slower with a mask and from 4k keys).
inline bool short_key_loop(const AttentionForwardProblem& problem) {
  return problem.window.left < 0 && problem.window.right < 0 && problem.seqlen_k <= 1536;
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

// The smallest forward tiles (f16 and bf16 tiles have the same size).
template <int kHeadDim>
struct Sm80FwdMinSmem {
  static constexpr int value = Sm80FwdTiles<DType::f16, kHeadDim, false>::type::kSmemBytes;
};
template <int kHeadDim>
struct Sm75FwdMinSmem {
  static constexpr int value = Sm75FwdTiles<DType::f16, kHeadDim>::type::kSmemBytes;
};

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
