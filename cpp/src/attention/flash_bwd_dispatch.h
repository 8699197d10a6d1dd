// Picks the backward configuration of a problem from its family's tile table
// (padded head dim, the device's shared memory) and calls its instantiation,
// which lives in its own translation unit. Only rows of the table can be
// named here: the kernel is FlashBwdConfig<row's fields>.
#pragma once

#include <iterator>
#include <utility>

#include "attention/flash_bwd_config.h"
#include "attention/flash_fwd_dispatch.h"

namespace samattn::attention {

// Runs row I of kTiles if the problem may use it: sets *result and returns
// true, else returns false (see run_flash_fwd_row).
template <DType T, Family F, const auto& kTiles, size_t I>
bool run_flash_bwd_row(const AttentionBackwardProblem& problem, int head_dim, cudaError_t* result) {
  constexpr FlashBwdTile row = kTiles[I];
  if constexpr (!head_dim_built(row.head_dim)) {
    return false;
  } else {
    using Config =
        FlashBwdConfig<T, row.head_dim, row.block_m, row.block_n, row.warps, row.q_stages, F>;
    if (row.head_dim != head_dim || problem.max_smem_per_block < Config::kSmemBytes ||
        (backward_terms(problem.terms) && !bwd_tile_takes_terms(row))) {
      return false;
    }
    *result = run_flash_bwd<Config>(problem);
    return true;
  }
}

template <DType T, Family F, const auto& kTiles, size_t... I>
cudaError_t run_flash_bwd_rows(const AttentionBackwardProblem& problem, std::index_sequence<I...>) {
  const int head_dim = padded_headdim(problem.headdim);
  cudaError_t result = cudaErrorNotSupported;
  // The first row, in table order, that fits.
  (run_flash_bwd_row<T, F, kTiles, I>(problem, head_dim, &result) || ...);
  return result;
}

// cudaErrorNotSupported where no row of the family's table fits the problem.
template <DType T, Family F, const auto& kTiles>
cudaError_t run_flash_bwd_table(const AttentionBackwardProblem& problem) {
  return run_flash_bwd_rows<T, F, kTiles>(problem, std::make_index_sequence<std::size(kTiles)>{});
}

// The shared memory of the family's smallest backward tile for the problem's
// padded head dim (0: the table has none, e.g. sm75 at 256).
template <Family F, const auto& kTiles>
int min_bwd_smem(int headdim) {
  const int padded = padded_headdim(headdim);
  return smallest_smem<kTiles>(
      [&](const FlashBwdTile& row) { return row.head_dim == padded; },
      [](auto index) {
        constexpr FlashBwdTile row = kTiles[decltype(index)::value];
        return FlashBwdConfig<DType::f16, row.head_dim, row.block_m, row.block_n, row.warps,
                              row.q_stages, F>::kSmemBytes;
      },
      std::make_index_sequence<std::size(kTiles)>{});
}

// The backward's steps (attention_problem.h), then a masked call's tile map
// for its head dim's rows that take score terms.
template <const auto& kTiles>
size_t bwd_workspace_bytes(const AttentionBackwardProblem& problem) {
  const size_t steps = flash_bwd_workspace_bytes(problem);
  const int head_dim = padded_headdim(problem.headdim);
  const size_t map = mask_tile_map_bytes(problem, kTiles, [&](const FlashBwdTile& row) {
    return row.head_dim == head_dim && bwd_tile_takes_terms(row);
  });
  return map == 0 ? steps : mask_tile_map_offset(steps) + map;
}

template <DType T>
cudaError_t run_flash_bwd_sm80_dtype(const AttentionBackwardProblem& problem) {
  static_assert(dtype_listed<T>(kSm80AttentionDTypes), "not in kSm80AttentionDTypes");
  return run_flash_bwd_table<T, Family::sm80, kSm80BwdTiles>(problem);
}

template <DType T>
cudaError_t run_flash_bwd_sm75_dtype(const AttentionBackwardProblem& problem) {
  static_assert(dtype_listed<T>(kSm75AttentionDTypes), "not in kSm75AttentionDTypes");
  return run_flash_bwd_table<T, Family::sm75, kSm75BwdTiles>(problem);
}

}  // namespace samattn::attention
