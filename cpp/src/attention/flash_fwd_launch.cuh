// Host launch of the forward kernel for one configuration tag. Included by
// the translation units that instantiate run_flash_fwd<Config>.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "attention/flash_fwd_config.h"
#include "attention/flash_fwd_kernel.cuh"
#include "attention/kernel_traits.h"
#include "common/launch_setup.h"

namespace samattn::attention {

template <class Config>
cudaError_t run_flash_fwd(const AttentionForwardProblem& problem) {
  using Traits = FlashFwdTraits<Config>;
  if (problem.headdim <= 0 || problem.headdim > Traits::kHeadDim) return cudaErrorInvalidValue;
  // Grid (m tiles, heads, batch): the y and z extents are limited to 65535.
  if (problem.nheads > 65535 || problem.batch > 65535 || problem.nheads_k <= 0 ||
      problem.nheads % problem.nheads_k != 0) {
    return cudaErrorInvalidConfiguration;
  }
  const int m_blocks = (problem.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  if (m_blocks == 0 || problem.batch == 0 || problem.nheads == 0) return cudaSuccess;

  FlashFwdParams p{};
  p.q = problem.q.ptr;
  p.k = problem.k.ptr;
  p.v = problem.v.ptr;
  p.o = problem.o;
  p.lse = problem.lse;
  p.q_batch = problem.q.batch_stride;
  p.q_seq = problem.q.seq_stride;
  p.q_head = problem.q.head_stride;
  p.k_batch = problem.k.batch_stride;
  p.k_seq = problem.k.seq_stride;
  p.k_head = problem.k.head_stride;
  p.v_batch = problem.v.batch_stride;
  p.v_seq = problem.v.seq_stride;
  p.v_head = problem.v.head_stride;
  p.o_batch = problem.o_batch_stride;
  p.o_seq = problem.o_seq_stride;
  p.o_head = problem.o_head_stride;
  p.lse_batch = problem.lse_batch_stride;
  p.lse_seq = problem.lse_seq_stride;
  p.lse_head = problem.lse_head_stride;
  p.cu_seqlens_q = problem.cu_seqlens_q;
  p.cu_seqlens_k = problem.cu_seqlens_k;
  p.seqlen_q = problem.seqlen_q;
  p.seqlen_k = problem.seqlen_k;
  p.headdim = problem.headdim;
  p.kv_group = problem.nheads / problem.nheads_k;

  // flash-attn's window normalization: a bound reaching past seqlen_k (the
  // maximum, with varlen) is unbounded; causal fixes the right bound at 0.
  p.window_left = problem.window_left >= problem.seqlen_k ? -1 : problem.window_left;
  p.window_right = problem.window_right >= problem.seqlen_k ? -1 : problem.window_right;
  if (p.window_left < 0) p.window_left = -1;
  if (p.window_right < 0) p.window_right = -1;
  if (problem.causal) p.window_right = 0;

  constexpr float kLog2e = 1.4426950408889634f;
  if (problem.softcap > 0.0f) {
    p.softcap = problem.softcap;
    p.softcap_pre = problem.softmax_scale / problem.softcap;
    p.scale_log2 = kLog2e;  // the softcapped scores are already scaled
  } else {
    p.softcap = 0.0f;
    p.softcap_pre = 0.0f;
    p.scale_log2 = problem.softmax_scale * kLog2e;
  }

  const bool vectors = forward_vectors(problem);
  auto kernel = vectors ? flash_fwd_kernel<Traits, true> : flash_fwd_kernel<Traits, false>;
  constexpr int kSmem = Traits::kSmemBytes;
  const cudaError_t allowed = vectors ? allow_dynamic_smem<flash_fwd_kernel<Traits, true>>(kSmem)
                                      : allow_dynamic_smem<flash_fwd_kernel<Traits, false>>(kSmem);
  if (allowed != cudaSuccess) return allowed;
  dim3 grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(problem.nheads),
            static_cast<unsigned>(problem.batch));
  kernel<<<grid, Traits::kThreads, kSmem, problem.stream>>>(p);
  return cudaGetLastError();
}

}  // namespace samattn::attention
