// Host launch of the sm90 forward kernel for one configuration tag: the TMA
// descriptors of Q, K, V and O, the parameters, the grid. Included by the
// translation units that instantiate run_flash_fwd_sm90<Config>.
#pragma once

// First: it redirects CUTLASS's driver calls (see there).
#include "common/cutlass_driver.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "attention/sm90/flash_fwd_sm90_config.h"
#include "attention/sm90/flash_fwd_sm90_kernel.cuh"
#include "attention/sm90/flash_sm90_tiles.h"
#include "attention/sm90/gmem_tensor.cuh"
#include "common/launch_setup.h"

namespace samattn::attention {

namespace sm90 {

// Causal calls run a persistent grid over pairs of tiles (first_tile) only
// with at least this many pairs per SM: the last round's imbalance is then
// a fraction of the whole; below, one CTA per tile.
constexpr int64_t kPairedMinRounds = 2;

// Whether Config's row of the tile table runs the terms kernels: the
// long_keys rows do not (the dispatch in flash_sm90.cu gives those calls the
// next row), so theirs are not instantiated.
template <class Config>
constexpr bool runs_terms() {
  for (const FlashFwdSm90Tile& row : kSm90FwdTiles) {
    if (row.head_dim == Config::kHeadDim && row.block_m == Config::kBlockM &&
        row.block_n == Config::kBlockN && row.stages == Config::kStages) {
      return row.use != TileUse::long_keys;
    }
  }
  return true;
}

// Whether masked calls of Config's head dim take heads in groups (fwd_tile's
// head_group) when their mask is shared by the heads. Measured on the H100
// (bf16, key-padding masks (batch, 1, seqlen, seqlen), 1k-16k keys):
// 1.07-1.47x faster at d = 128 (float masks gained most), 0.97-1.08 at
// d = 64 and 0.89-1.04 at d = 256, where eight heads' K and V tiles crowd the
// L2; so only d = 128.
template <class Config>
constexpr bool groups_heads_for_masks() {
  return Config::kHeadDim == 128;
}

}  // namespace sm90

template <class Config>
cudaError_t run_flash_fwd_sm90(const AttentionForwardProblem& problem) {
  using namespace cute;
  using Traits = sm90::FwdTraits<Config>;
  using Element = typename Traits::Element;
  // The plan (flash_sm90.cu) admits only what this kernel runs.
  const bool varlen = problem.cu_seqlens_q != nullptr;
  if (problem.headdim <= 0 || problem.headdim > Traits::kHeadDim || problem.seqlen_k <= 0 ||
      varlen != (problem.cu_seqlens_k != nullptr) ||
      (varlen && (problem.total_q <= 0 || problem.total_k <= 0))) {
    return cudaErrorInvalidValue;
  }
  const int m_blocks = (problem.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  const int64_t tiles = int64_t(m_blocks) * problem.nheads * problem.batch;
  if (tiles == 0) return cudaSuccess;
  if (tiles > INT32_MAX || problem.sm_count <= 0) return cudaErrorInvalidValue;

  // Varlen: one packed tensor of total rows (batch 1 for TMA).
  const int d = problem.headdim, b = varlen ? 1 : problem.batch;
  const int rows_q = varlen ? int(problem.total_q) : problem.seqlen_q;
  const int rows_k = varlen ? int(problem.total_k) : problem.seqlen_k;
  const auto* q = static_cast<Element const*>(problem.q.ptr);
  const auto* k = static_cast<Element const*>(problem.k.ptr);
  const auto* v = static_cast<Element const*>(problem.v.ptr);
  auto* o = static_cast<Element*>(problem.o.ptr);
  auto mQ = sm90::tma_view(q, problem.q, rows_q, d, problem.nheads, b);
  auto mK = sm90::tma_view(k, problem.k, rows_k, d, problem.nheads_k, b);
  auto mV = sm90::tma_view(v, problem.v, rows_k, d, problem.nheads_k, b);
  auto mO = sm90::tma_view(o, problem.o, rows_q, d, problem.nheads, b);

  sm90::FwdParams<Traits> p{
      make_tma_copy(SM90_TMA_LOAD{}, mQ, typename Traits::SmemLayoutQ{}, typename Traits::TileQ{},
                    _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mK, take<0, 2>(typename Traits::SmemLayoutKV{}),
                    typename Traits::TileKV{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mV, take<0, 2>(typename Traits::SmemLayoutKV{}),
                    typename Traits::TileKV{}, _1{}),
      make_tma_copy(SM90_TMA_STORE{}, mO, typename Traits::SmemLayoutQ{}, typename Traits::TileQ{},
                    _1{}),
      mQ.shape(),
      mK.shape(),
      problem.lse,
      problem.lse_batch_stride,
      problem.lse_head_stride,
      problem.lse_seq_stride,
      problem.cu_seqlens_q,
      problem.cu_seqlens_k,
      o,
      problem.o.seq_stride,
      problem.o.head_stride,
      AttentionMask{problem.seqlen_q, problem.seqlen_k, problem.window.left, problem.window.right},
      score_terms_params(problem),
      problem.terms.sinks,
      problem.kv_group,
      problem.softcap,
      problem.softcap_pre,
      problem.scale_log2,
      m_blocks,
      static_cast<int>(tiles),
      /*reverse_m=*/problem.window.right >= 0,
      /*paired=*/false,
      /*head_group=*/1,
      /*mask_tiles=*/MaskTileMap{nullptr, 0, 0, 0},
  };
  // Persistent, one CTA per SM (the shared memory allows no second), where
  // every tile has the same work: the next tile's loads overlap this one's
  // end. Causal tiles (a right bound, no left one) have work growing with the
  // query tile: persistent over pairs of equal work (first_tile), where there
  // are enough pairs for a few rounds per SM. A plain stride over causal tiles
  // would spread them unevenly (measured: causal d 128 at 16k keys 0.65x).
  // Windowed and varlen tiles: one CTA per tile, balanced by the hardware.
  const bool fixed = !varlen && problem.window.left < 0;
  const bool uniform = fixed && problem.window.right < 0;
  p.paired =
      fixed && problem.window.right >= 0 && tiles >= sm90::kPairedMinRounds * 2 * problem.sm_count;
  const int64_t ctas = uniform    ? std::min<int64_t>(tiles, problem.sm_count)
                       : p.paired ? std::min<int64_t>((tiles + 1) / 2, problem.sm_count)
                                  : tiles;
  const dim3 grid(static_cast<unsigned>(ctas));
  // A mask broadcast over the heads: each of its tiles is read by every head.
  // Taken by groups of heads at once, it comes from memory once per group
  // rather than once per head (a float mask moves as many bytes as the scores).
  const TermsKernel terms_kernel = sm90_forward_terms_kernel(problem);
  if (sm90::groups_heads_for_masks<Config>() && terms_kernel == TermsKernel::masked &&
      problem.terms.mask.head_stride == 0 && !varlen && !p.paired) {
    for (const int group : {8, 4, 2}) {
      if (problem.nheads % group == 0) {
        p.head_group = group;
        break;
      }
    }
  }
  switch (terms_kernel) {
    case TermsKernel::none:
      return launch_with_smem<sm90::flash_fwd_sm90_kernel<Traits, TermsKernel::none>>(
          p, grid, Traits::kThreads, Traits::kSmemBytes, problem.stream);
    case TermsKernel::computed:
      if constexpr (sm90::runs_terms<Config>()) {
        return launch_with_smem<sm90::flash_fwd_sm90_kernel<Traits, TermsKernel::computed>>(
            p, grid, Traits::kThreads, Traits::kSmemBytes, problem.stream);
      }
      break;
    case TermsKernel::masked:
      if constexpr (sm90::runs_terms<Config>()) {
        // The mask's tile map first, on the same stream (flash_sm90.cu sizes
        // the workspace for it).
        cudaError_t error = cudaSuccess;
        p.mask_tiles = build_mask_tile_map<Family::sm90, Traits::kBlockM, Traits::kBlockN>(
            problem.terms.mask, problem.batch, problem.nheads, problem.seqlen_q, problem.seqlen_k,
            problem.workspace, problem.workspace_bytes, problem.stream, &error);
        if (error != cudaSuccess) return error;
        return launch_with_smem<sm90::flash_fwd_sm90_kernel<Traits, TermsKernel::masked>>(
            p, grid, Traits::kThreads, Traits::kSmemBytes, problem.stream);
      }
      break;
  }
  return cudaErrorNotSupported;
}

}  // namespace samattn::attention
