// Host launch of the sm90 backward for one configuration tag: step 1 (D and
// the zeroed dQ accumulator) and 1b (the sinks' gradient), the kernels sm80
// uses, on this tile's rows; the main kernel with its TMA descriptors; and the
// conversion of the fp32 accumulators. Included by the translation units that instantiate
// run_flash_bwd_sm90<Config>.
#pragma once

// First: it redirects CUTLASS's driver calls (see there).
#include "common/cutlass_driver.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "attention/score_terms.cuh"
#include "attention/sm90/flash_bwd_sm90_config.h"
#include "attention/sm90/flash_bwd_sm90_kernel.cuh"
#include "attention/sm90/gmem_tensor.cuh"
#include "common/launch_setup.h"

namespace samattn::attention {

namespace sm90 {

// What step 1 and the accumulator conversions read of a configuration.
template <class Traits>
struct BwdStepTraits {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM, kHeadDim = Traits::kHeadDim;
  static constexpr Family kFamily = Family::sm90;
};

}  // namespace sm90

template <class Config>
cudaError_t run_flash_bwd_sm90(const AttentionBackwardProblem& problem) {
  using namespace cute;
  using Traits = sm90::BwdTraits<Config>;
  using StepTraits = sm90::BwdStepTraits<Traits>;
  using Element = typename Traits::Element;
  const AttentionBackwardProblem& P = problem;
  // The plan (flash_sm90.cu) admits only what this kernel runs: 16-byte
  // rows, the dQ accumulator's rows as wide as kHeadDim.
  const bool varlen = P.cu_seqlens_q != nullptr;
  if (P.headdim <= 0 || padded_headdim(P.headdim) != Traits::kHeadDim || P.seqlen_q <= 0 ||
      P.seqlen_k <= 0 || P.lse == nullptr || varlen != (P.cu_seqlens_k != nullptr) ||
      (varlen &&
       (P.total_q <= 0 || P.total_k <= 0 || P.total_q > INT32_MAX || P.total_k > INT32_MAX))) {
    return cudaErrorInvalidValue;
  }
  // Rows without room for dropout or a mask have only the plain kernel
  // (bwd_tile_takes_terms; the dispatch gives them no such call).
  constexpr bool kTakesTerms = bwd_tile_takes_terms(
      FlashBwdSm90Tile{Traits::kHeadDim, Traits::kBlockM, Traits::kBlockN, Traits::kStages});
  if (!kTakesTerms && (dropout_on(P.terms) || P.terms.mask.kind != MaskKind::none)) {
    return cudaErrorNotSupported;
  }
  if (P.batch == 0 || P.nheads == 0) return cudaSuccess;
  const size_t workspace_needed = flash_bwd_workspace_bytes(P);
  if (P.workspace_bytes < workspace_needed || P.workspace == nullptr ||
      reinterpret_cast<uintptr_t>(P.workspace) % 256 != 0) {
    return cudaErrorInvalidValue;
  }
  const FlashBwdWorkspace layout = flash_bwd_workspace_layout(P);
  char* workspace = static_cast<char*>(P.workspace);
  float* dq_accum = reinterpret_cast<float*>(workspace + layout.dq_accum);
  float* dk_accum = reinterpret_cast<float*>(workspace + layout.dk_accum);
  float* dv_accum = reinterpret_cast<float*>(workspace + layout.dv_accum);
  float* dsum = reinterpret_cast<float*>(workspace + layout.dsum);
  const int64_t rows_q = varlen ? P.total_q : int64_t(P.batch) * P.seqlen_q;
  const int64_t rows_k = varlen ? P.total_k : int64_t(P.batch) * P.seqlen_k;
  // The semaphores' layout (attention_problem.h) counts query tiles of 16 rows;
  // a tile of kBlockM rows takes one.
  int* semaphores =
      P.deterministic ? reinterpret_cast<int*>(workspace + layout.semaphores) : nullptr;
  cudaError_t status;
  if (semaphores != nullptr && layout.total > layout.semaphores) {
    status = cudaMemsetAsync(semaphores, 0, layout.total - layout.semaphores, P.stream);
    if (status != cudaSuccess) return status;
  }
  // With varlen GQA the dK / dV accumulators are converted whole, also rows
  // outside every sequence, which no CTA writes.
  if (varlen && P.kv_group > 1) {
    status = cudaMemsetAsync(dk_accum, 0, layout.dsum - layout.dk_accum, P.stream);
    if (status != cudaSuccess) return status;
  }

  // 1. D = rowsum(dO * O), and zeros for the dQ accumulator.
  status = launch_dot_do_o<StepTraits>(P, layout, dsum, dq_accum, /*vectors=*/true, rows_q);
  if (status != cudaSuccess) return status;

  // 1b. The sinks' gradient, from D and the LSE (the main kernel needs no
  // sinks: the LSE has them).
  status = launch_dsinks<Family::sm90>(P, dsum, rows_q);
  if (status != cudaSuccess) return status;

  // 2. The main kernel: one CTA per (key tile, head, batch). Varlen: one
  // packed tensor of total rows (batch 1 for TMA).
  const int d_head = P.headdim, b = varlen ? 1 : P.batch;
  const int seq_q = varlen ? int(P.total_q) : P.seqlen_q;
  const int seq_k = varlen ? int(P.total_k) : P.seqlen_k;
  auto mQ = sm90::tma_view(static_cast<Element const*>(P.q.ptr), P.q, seq_q, d_head, P.nheads, b);
  auto mdO =
      sm90::tma_view(static_cast<Element const*>(P.dout.ptr), P.dout, seq_q, d_head, P.nheads, b);
  auto mK = sm90::tma_view(static_cast<Element const*>(P.k.ptr), P.k, seq_k, d_head, P.nheads_k, b);
  auto mV = sm90::tma_view(static_cast<Element const*>(P.v.ptr), P.v, seq_k, d_head, P.nheads_k, b);
  auto smem_q = take<0, 2>(typename Traits::SmemLayoutQ{});
  // An attention mask (fixed length: the plan declines it with varlen).
  const AttnMaskView& mask = P.terms.mask;
  const bool masked = mask.kind != MaskKind::none && mask.ptr != nullptr;
  sm90::BwdParams<Traits> p{
      make_tma_copy(SM90_TMA_LOAD{}, mQ, smem_q, typename Traits::TileQ{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mdO, smem_q, typename Traits::TileQ{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mK, typename Traits::SmemLayoutKV{}, typename Traits::TileKV{},
                    _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mV, typename Traits::SmemLayoutKV{}, typename Traits::TileKV{},
                    _1{}),
      mQ.shape(),
      mK.shape(),
      P.cu_seqlens_q,
      P.cu_seqlens_k,
      P.lse,
      P.lse_batch_stride,
      P.lse_head_stride,
      P.lse_seq_stride,
      dsum,
      rows_q,
      dq_accum,
      int64_t(layout.dq_head_stride),
      static_cast<Element*>(P.dk.ptr),
      static_cast<Element*>(P.dv.ptr),
      P.dk.batch_stride,
      P.dk.seq_stride,
      P.dk.head_stride,
      P.dv.batch_stride,
      P.dv.seq_stride,
      P.dv.head_stride,
      dk_accum,
      dv_accum,
      rows_k,
      AttentionMask{P.seqlen_q, P.seqlen_k, P.window.left, P.window.right},
      P.kv_group,
      P.headdim,
      P.scale_log2,
      P.softmax_scale,
      P.softcap,
      P.softcap_pre,
      score_terms_params(P),
      masked ? P.dmask : nullptr,
      semaphores,
      (P.seqlen_q + 15) / 16,
      MaskTileMap{nullptr, 0, 0, 0},  // set below for a mask
  };
  const int64_t n_blocks = (int64_t(P.seqlen_k) + Traits::kBlockN - 1) / Traits::kBlockN;
  const dim3 grid(unsigned(n_blocks), unsigned(P.nheads), unsigned(P.batch));
  // The plan declines a mask with dropout.
  if constexpr (!kTakesTerms) {
    status = launch_with_smem<sm90::flash_bwd_sm90_kernel<Traits, TermsKernel::none>>(
        p, grid, Traits::kThreads, Traits::kSmemBytes, P.stream);
  } else if (masked) {
    // The mask's tile map, after the steps' buffers (flash_sm90.cu sizes the
    // workspace for it).
    const size_t map_offset = mask_tile_map_offset(workspace_needed);
    p.mask_tiles = build_mask_tile_map<Family::sm90, Traits::kBlockM, Traits::kBlockN>(
        mask, P.batch, P.nheads, P.seqlen_q, P.seqlen_k, workspace + map_offset,
        P.workspace_bytes > map_offset ? P.workspace_bytes - map_offset : 0, P.stream, &status);
    if (status != cudaSuccess) return status;
    status = launch_with_smem<sm90::flash_bwd_sm90_kernel<Traits, TermsKernel::masked>>(
        p, grid, Traits::kThreads, Traits::kSmemBytes, P.stream);
  } else if (dropout_on(P.terms)) {
    status = launch_with_smem<sm90::flash_bwd_sm90_kernel<Traits, TermsKernel::computed>>(
        p, grid, Traits::kThreads, Traits::kSmemBytes, P.stream);
  } else {
    status = launch_with_smem<sm90::flash_bwd_sm90_kernel<Traits, TermsKernel::none>>(
        p, grid, Traits::kThreads, Traits::kSmemBytes, P.stream);
  }
  if (status != cudaSuccess) return status;

  // 3. dq = scale dQacc; with GQA dk = scale sum over the group of dKacc,
  // dv likewise unscaled (without, the main kernel wrote them).
  const int64_t m_blocks = (int64_t(P.seqlen_q) + Traits::kBlockM - 1) / Traits::kBlockM;
  const ConvertDqParams c = convert_dq_params(P, layout, dq_accum, /*vectors=*/true);
  sm90::flash_bwd_sm90_convert_dq_kernel<Traits>
      <<<dim3(unsigned(m_blocks), unsigned(P.nheads), unsigned(P.batch)), Traits::kConsumerThreads,
         0, P.stream>>>(c);
  status = cudaGetLastError();
  if (status != cudaSuccess || P.kv_group == 1) return status;
  return launch_group_sums<Element, Family::sm90>(P, dk_accum, dv_accum, rows_k, /*vectors=*/true);
}

}  // namespace samattn::attention
