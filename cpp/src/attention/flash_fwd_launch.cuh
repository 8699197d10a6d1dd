// Host launch of the forward kernel for one configuration tag. Included by
// the translation units that instantiate run_flash_fwd<Config>.
#pragma once

#include <cuda_runtime.h>

#include "attention/flash_fwd_config.h"
#include "attention/flash_fwd_kernel.cuh"
#include "attention/flash_fwd_traits.h"
#include "common/launch_setup.h"

namespace samattn::attention {

template <class Config>
cudaError_t run_flash_fwd(const AttentionForwardProblem& problem) {
  using Traits = FlashFwdTraits<Config>;
  if (problem.headdim <= 0 || problem.headdim > Traits::kHeadDim) return cudaErrorInvalidValue;
  // Grid (m tiles, heads, batch): the API keeps the y and z extents <= 65535.
  const int m_blocks = (problem.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  if (m_blocks == 0 || problem.batch == 0 || problem.nheads == 0) return cudaSuccess;

  FlashFwdParams p{};
  p.q = problem.q.ptr;
  p.k = problem.k.ptr;
  p.v = problem.v.ptr;
  p.o = problem.o.ptr;
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
  p.o_batch = problem.o.batch_stride;
  p.o_seq = problem.o.seq_stride;
  p.o_head = problem.o.head_stride;
  p.lse_batch = problem.lse_batch_stride;
  p.lse_seq = problem.lse_seq_stride;
  p.lse_head = problem.lse_head_stride;
  p.cu_seqlens_q = problem.cu_seqlens_q;
  p.cu_seqlens_k = problem.cu_seqlens_k;
  p.seqlen_q = problem.seqlen_q;
  p.seqlen_k = problem.seqlen_k;
  p.headdim = problem.headdim;
  p.kv_group = problem.kv_group;
  p.window_left = problem.window.left;
  p.window_right = problem.window.right;
  p.softcap = problem.softcap;
  p.softcap_pre = problem.softcap_pre;
  p.scale_log2 = problem.scale_log2;

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
