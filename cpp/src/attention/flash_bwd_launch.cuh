// Host launch of the backward for one configuration tag: preprocess (D),
// the main kernel, and the conversion of the fp32 accumulators. Included by
// the translation units that instantiate run_flash_bwd<Config>.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "attention/flash_bwd_config.h"
#include "attention/flash_bwd_kernel.cuh"
#include "attention/flash_bwd_traits.h"
#include "attention/flash_tiles.h"
#include "common/launch_setup.h"

namespace samattn::attention {

namespace detail {

// One launch of the main kernel compiled for (kVectors, kTerms).
template <class Traits, bool kVectors, TermsKernel kTerms>
cudaError_t launch_bwd(FlashBwdParams const& p, dim3 grid, cudaStream_t stream) {
  return launch_with_smem<flash_bwd_kernel<Traits, kVectors, kTerms>>(p, grid, Traits::kThreads,
                                                                      Traits::kSmemBytes, stream);
}

}  // namespace detail

template <class Config>
cudaError_t run_flash_bwd(const AttentionBackwardProblem& problem) {
  using Traits = FlashBwdTraits<Config>;
  using Element = typename Traits::Element;
  const AttentionBackwardProblem& P = problem;
  if (P.headdim <= 0 || P.headdim > Traits::kHeadDim) return cudaErrorInvalidValue;
  // Sizes and the GQA ratio are checked at the API boundary.
  if (P.batch == 0 || P.nheads == 0) return cudaSuccess;
  const bool varlen_q = P.cu_seqlens_q != nullptr, varlen_k = P.cu_seqlens_k != nullptr;
  const int64_t rows_q = varlen_q ? P.total_q : int64_t(P.batch) * P.seqlen_q;
  const int64_t rows_k = varlen_k ? P.total_k : int64_t(P.batch) * P.seqlen_k;
  const size_t workspace_needed = flash_bwd_workspace_bytes(P);
  if ((P.lse == nullptr && rows_q > 0) || P.workspace_bytes < workspace_needed ||
      (workspace_needed > 0 &&
       (P.workspace == nullptr || reinterpret_cast<uintptr_t>(P.workspace) % 256 != 0))) {
    return cudaErrorInvalidValue;
  }
  const bool vectors = backward_vectors(P);
  const bool terms = backward_terms(P.terms);
  if (terms && !vectors) return cudaErrorNotSupported;  // the plan declines these (plan_terms)

  const FlashBwdWorkspace layout = flash_bwd_workspace_layout(P);
  char* workspace = static_cast<char*>(P.workspace);
  float* dq_accum = reinterpret_cast<float*>(workspace + layout.dq_accum);
  float* dk_accum = reinterpret_cast<float*>(workspace + layout.dk_accum);
  float* dv_accum = reinterpret_cast<float*>(workspace + layout.dv_accum);
  float* dsum = reinterpret_cast<float*>(workspace + layout.dsum);
  int* semaphores =
      P.deterministic ? reinterpret_cast<int*>(workspace + layout.semaphores) : nullptr;
  const int sem_per_head = (P.seqlen_q + 15) / 16;

  // The workspace is zeroed on the stream where the kernels expect zeros, so
  // that callers cannot get it wrong: the dQ accumulator by step 1, here the
  // semaphores and with varlen GQA the dK / dV accumulators (rows outside
  // every sequence are converted too but no CTA writes them).
  const int group = P.kv_group;
  cudaError_t status;
  // The fragment-order dQ tiles (dq_tile_accum) must fit the layout's bound.
  static_assert(Traits::kBlockM <= kFlashBwdMaxBlockM);
  if (Traits::kHeadDim > padded_headdim(P.headdim)) return cudaErrorInvalidValue;
  if (varlen_k && group > 1 && rows_k > 0) {
    status = cudaMemsetAsync(dk_accum, 0, layout.dsum - layout.dk_accum, P.stream);
    if (status != cudaSuccess) return status;
  }
  if (semaphores != nullptr && layout.total > layout.semaphores) {
    status = cudaMemsetAsync(semaphores, 0, layout.total - layout.semaphores, P.stream);
    if (status != cudaSuccess) return status;
  }

  // 1. D = rowsum(dO * O), and zeros for the dQ accumulator.
  if (P.seqlen_q > 0) {
    status = launch_dot_do_o<Traits>(P, layout, dsum, dq_accum, vectors, rows_q);
    if (status != cudaSuccess) return status;
  }

  // 1b. The sinks' gradient, from D and the LSE.
  status = launch_dsinks<Traits::kFamily>(P, dsum, rows_q);
  if (status != cudaSuccess) return status;

  // 2. The main kernel.
  const int n_blocks = (P.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  if (n_blocks > 0) {
    FlashBwdParams p{};
    p.q = P.q.ptr;
    p.k = P.k.ptr;
    p.v = P.v.ptr;
    p.dout = P.dout.ptr;
    p.lse = P.lse;
    p.dq_accum = dq_accum;
    p.dq_head_stride = int64_t(layout.dq_head_stride);
    p.dk_accum = dk_accum;
    p.dv_accum = dv_accum;
    p.dsum = dsum;
    p.semaphores = semaphores;
    p.dk = P.dk.ptr;
    p.dv = P.dv.ptr;
    p.dk_batch = P.dk.batch_stride, p.dk_seq = P.dk.seq_stride, p.dk_head = P.dk.head_stride;
    p.dv_batch = P.dv.batch_stride, p.dv_seq = P.dv.seq_stride, p.dv_head = P.dv.head_stride;
    p.softmax_scale = P.softmax_scale;
    p.q_batch = P.q.batch_stride, p.q_seq = P.q.seq_stride, p.q_head = P.q.head_stride;
    p.k_batch = P.k.batch_stride, p.k_seq = P.k.seq_stride, p.k_head = P.k.head_stride;
    p.v_batch = P.v.batch_stride, p.v_seq = P.v.seq_stride, p.v_head = P.v.head_stride;
    p.do_batch = P.dout.batch_stride, p.do_seq = P.dout.seq_stride;
    p.do_head = P.dout.head_stride;
    p.lse_batch = P.lse_batch_stride, p.lse_seq = P.lse_seq_stride;
    p.lse_head = P.lse_head_stride;
    p.cu_seqlens_q = P.cu_seqlens_q;
    p.cu_seqlens_k = P.cu_seqlens_k;
    p.seqlen_q = P.seqlen_q;
    p.seqlen_k = P.seqlen_k;
    p.headdim = P.headdim;
    p.nheads = P.nheads;
    p.kv_group = P.kv_group;
    p.rows_q = rows_q;
    p.rows_k = rows_k;
    p.sem_per_head = sem_per_head;
    p.window_left = P.window.left;
    p.window_right = P.window.right;
    p.softcap = P.softcap;
    p.softcap_pre = P.softcap_pre;
    p.scale_log2 = P.scale_log2;
    p.terms = score_terms_params(P);
    p.dmask = P.dmask;
    if (terms && backward_terms_kernel(P.terms) == TermsKernel::masked) {
      // The mask's tile map first, on the same stream, after the steps'
      // buffers (bwd_workspace_bytes sized it; without room every tile reads
      // the mask).
      const size_t map_offset = mask_tile_map_offset(workspace_needed);
      const size_t room = P.workspace_bytes > map_offset ? P.workspace_bytes - map_offset : 0;
      status = cudaSuccess;
      p.mask_tiles = build_mask_tile_map<Traits::kFamily, Traits::kBlockM, Traits::kBlockN>(
          P.terms.mask, P.batch, P.nheads, P.seqlen_q, P.seqlen_k,
          room > 0 ? workspace + map_offset : nullptr, room, P.stream, &status);
      if (status != cudaSuccess) return status;
    }
    dim3 grid(unsigned(n_blocks), unsigned(P.nheads), unsigned(P.batch));
    if (terms) {
      // Rows without room for the terms are not instantiated with them
      // (bwd_tile_takes_terms; the dispatch skips them).
      constexpr FlashBwdTile kRow{Traits::kHeadDim, Traits::kBlockM, Traits::kBlockN,
                                  Traits::kWarps, Traits::kQStages};
      if constexpr (bwd_tile_takes_terms(kRow)) {
        status = backward_terms_kernel(P.terms) == TermsKernel::masked
                     ? detail::launch_bwd<Traits, true, TermsKernel::masked>(p, grid, P.stream)
                     : detail::launch_bwd<Traits, true, TermsKernel::computed>(p, grid, P.stream);
      } else {
        status = cudaErrorNotSupported;
      }
    } else {
      status = vectors ? detail::launch_bwd<Traits, true, TermsKernel::none>(p, grid, P.stream)
                       : detail::launch_bwd<Traits, false, TermsKernel::none>(p, grid, P.stream);
    }
    if (status != cudaSuccess) return status;
  }

  // 3. dq = scale dQacc; with GQA dk = scale sum over the group of dKacc,
  // dv likewise unscaled (without, the main kernel wrote them).
  const int m_blocks = (P.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  if (m_blocks > 0) {
    const ConvertDqParams c = convert_dq_params(P, layout, dq_accum, vectors);
    dim3 grid(unsigned(m_blocks), unsigned(P.nheads), unsigned(P.batch));
    flash_bwd_convert_dq_kernel<Traits><<<grid, Traits::kThreads, 0, P.stream>>>(c);
    status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  if (group == 1) return cudaSuccess;
  return launch_group_sums<Element, Traits::kFamily>(P, dk_accum, dv_accum, rows_k, vectors);
}

}  // namespace samattn::attention
