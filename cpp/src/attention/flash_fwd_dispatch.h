// Picks the forward configuration of a problem from its family's tile table
// (padded head dim, the device's shared memory, the key loop) and calls its
// instantiation, which lives in its own translation unit. Only rows of the
// table can be named here: the kernel is FlashFwdConfig<row's fields>.
#pragma once

#include <iterator>
#include <string>
#include <utility>

#include "attention/flash_fwd_config.h"
#include "attention/kvcache_plan.h"
#include "attention/mask_tiles.h"
#include "attention/sm75/flash_sm75_tiles.h"
#include "attention/sm80/flash_sm80_tiles.h"

namespace samattn::attention {

// The smallest of `smem` over the rows of a tile table that `takes` (0: none).
template <const auto& kTiles, class Takes, class Smem, size_t... I>
int smallest_smem(Takes&& takes, Smem&& smem, std::index_sequence<I...>) {
  int best = 0;
  const auto consider = [&](bool taken, int bytes) {
    if (taken && (best == 0 || bytes < best)) best = bytes;
  };
  (consider(takes(kTiles[I]), smem(std::integral_constant<size_t, I>{})), ...);
  return best;
}

// The shared memory of the family's smallest forward tile for the problem's
// padded head dim (0: the table has none, or beyond 256); f16 and bf16 tiles
// have the same size. Short-key rows do not count: they serve only some calls.
template <Family F, const auto& kTiles>
int min_fwd_smem(int headdim) {
  const int padded = padded_headdim(headdim);
  return smallest_smem<kTiles>(
      [&](const FlashFwdTile& row) { return row.head_dim == padded && row.use == TileUse::any; },
      [](auto index) {
        constexpr FlashFwdTile row = kTiles[decltype(index)::value];
        return FlashFwdConfig<DType::f16, row.head_dim, row.block_m, row.block_n, row.warps,
                              row.q_in_regs, F, row.kv_stages>::kSmemBytes;
      },
      std::make_index_sequence<std::size(kTiles)>{});
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

// The plan of the kvcache kernel for a problem with cache features (others
// fall back to the prefill kernel): a row for its head dim that fits the
// device, and 16-byte vectors (caches are updated in place, never copied).
template <const auto& kTiles>
bool plan_kvcache(const AttentionForwardProblem& problem, std::string* why) {
  if (!problem.cache.enabled) return true;
  if (!forward_vectors(problem)) {
    if (why != nullptr) {
      *why =
          "the KV-cache kernel moves 16-byte vectors: the head dim must be a multiple of 8 and "
          "q, the caches and out 16-byte aligned with strides that are multiples of 8 elements";
    }
    return false;
  }
  if (kvcache_tile(kTiles, problem) != nullptr) return true;
  if (why != nullptr) {
    *why = "no KV-cache kernel for head dim " + std::to_string(problem.headdim) +
           " that fits the " + std::to_string(problem.max_smem_per_block) +
           " bytes of shared memory per block of this GPU";
  }
  return false;
}

// Whether a problem runs a short, unmasked key loop: no causal or window
// bound, no attention mask and at most 1536 keys (24 tiles of 64), where the
// sm80 rows marked TileUse::short_keys measured faster (up to 2k keys; slower
// with a causal mask and from 4k keys). With an attention mask the d = 64 row
// ran the masked kernel 3.3-6.5x slower than the single-stage row on the H100
// (16 x 32 x 1024 x 64: 7.0 ms against 1.1 ms).
inline bool short_key_loop(const AttentionForwardProblem& problem) {
  return problem.window.left < 0 && problem.window.right < 0 && problem.seqlen_k <= 1536 &&
         problem.terms.mask.kind == MaskKind::none;
}

// A masked call's tile map (mask_tiles.h), for its head dim's TileUse::any
// rows (masked calls take no other).
template <const auto& kTiles>
size_t fwd_mask_map_bytes(const AttentionForwardProblem& problem) {
  const int head_dim = padded_headdim(problem.headdim);
  return mask_tile_map_bytes(problem, kTiles, [&](const FlashFwdTile& row) {
    return row.head_dim == head_dim && row.use == TileUse::any;
  });
}

// Runs row I of kTiles if the problem may use it: sets *result and returns
// true, else returns false. Rows of head dims left out of the build
// (SAMATTN_ATTENTION_HEAD_DIMS) are never instantiated, so never named.
template <DType T, Family F, const auto& kTiles, size_t I>
bool run_flash_fwd_row(const AttentionForwardProblem& problem, int head_dim, bool short_keys,
                       bool kvcache, cudaError_t* result) {
  constexpr FlashFwdTile row = kTiles[I];
  if constexpr (!head_dim_built(row.head_dim)) {
    return false;
  } else {
    constexpr bool kKVCacheRow = row.use == TileUse::kvcache;
    using Config = FlashFwdConfig<T, row.head_dim, row.block_m, row.block_n, row.warps,
                                  row.q_in_regs, F, row.kv_stages, kKVCacheRow>;
    if (row.head_dim != head_dim || kKVCacheRow != kvcache ||
        (row.use == TileUse::short_keys && !short_keys) ||
        problem.max_smem_per_block < Config::kSmemBytes) {
      return false;
    }
    if constexpr (kKVCacheRow && F != Family::sm75) {
      // Each kvcache row also has its fp8-cache kernel (the plans decline
      // fp8 caches on sm75).
      if (fp8_cache(problem.cache)) {
        *result =
            run_flash_fwd<FlashFwdConfig<T, row.head_dim, row.block_m, row.block_n, row.warps,
                                         row.q_in_regs, F, row.kv_stages, true, true>>(problem);
        return true;
      }
    }
    if (fp8_cache(problem.cache)) return false;
    *result = run_flash_fwd<Config>(problem);
    return true;
  }
}

template <DType T, Family F, const auto& kTiles, size_t... I>
cudaError_t run_flash_fwd_rows(const AttentionForwardProblem& problem, std::index_sequence<I...>) {
  const int head_dim = padded_headdim(problem.headdim);
  const bool short_keys = short_key_loop(problem);
  // Decode-shaped calls without cache features stay on the prefill kernel
  // where no kvcache row fits (kvcache_workspace_bytes makes the same choice).
  const bool kvcache = uses_kvcache_kernel(problem) &&
                       (problem.cache.enabled || kvcache_tile(kTiles, problem) != nullptr);
  cudaError_t result = cudaErrorNotSupported;
  // The first row, in table order, that the problem may use.
  (run_flash_fwd_row<T, F, kTiles, I>(problem, head_dim, short_keys, kvcache, &result) || ...);
  return result;
}

// cudaErrorNotSupported where no row of the family's table fits the problem.
template <DType T, Family F, const auto& kTiles>
cudaError_t run_flash_fwd_table(const AttentionForwardProblem& problem) {
  return run_flash_fwd_rows<T, F, kTiles>(problem, std::make_index_sequence<std::size(kTiles)>{});
}

template <DType T>
cudaError_t run_flash_fwd_sm80_dtype(const AttentionForwardProblem& problem) {
  static_assert(dtype_listed<T>(kSm80AttentionDTypes), "not in kSm80AttentionDTypes");
  return run_flash_fwd_table<T, Family::sm80, kSm80FwdTiles>(problem);
}

template <DType T>
cudaError_t run_flash_fwd_sm75_dtype(const AttentionForwardProblem& problem) {
  static_assert(dtype_listed<T>(kSm75AttentionDTypes), "not in kSm75AttentionDTypes");
  return run_flash_fwd_table<T, Family::sm75, kSm75FwdTiles>(problem);
}

}  // namespace samattn::attention
