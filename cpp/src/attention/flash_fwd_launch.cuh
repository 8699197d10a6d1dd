// Host launch of the forward kernel for one configuration tag. Included by
// the translation units that instantiate run_flash_fwd<Config>.
#pragma once

#include <cuda_runtime.h>

#include "attention/flash_fwd_config.h"
#include "attention/flash_fwd_kernel.cuh"
#include "attention/flash_fwd_traits.h"
#include "attention/kvcache_aux.h"
#include "attention/kvcache_plan.h"
#include "common/launch_setup.h"

namespace samattn::attention {

// One launch of the forward kernel compiled for (kVectors, kTerms).
template <class Traits, bool kVectors, TermsKernel kTerms>
cudaError_t launch_flash_fwd(FlashFwdParams const& p, dim3 grid, cudaStream_t stream) {
  return launch_with_smem<flash_fwd_kernel<Traits, kVectors, kTerms>>(p, grid, Traits::kThreads,
                                                                      Traits::kSmemBytes, stream);
}

// The kvcache kernel of the sm90 family, its key splits one cluster of
// `splits` CTAs along x (split_cluster.cuh).
template <class Traits, TermsKernel kTerms>
cudaError_t launch_flash_fwd_cluster(FlashFwdParams const& p, dim3 grid, int splits,
                                     cudaStream_t stream) {
  constexpr auto kKernel = flash_fwd_kernel<Traits, true, kTerms>;
  cudaError_t allowed = allow_dynamic_smem<kKernel>(Traits::kSmemBytes);
  if (allowed == cudaSuccess && splits > kMaxPortableClusterSplits) {
    allowed = allow_nonportable_cluster<kKernel>();
  }
  if (allowed != cudaSuccess) return allowed;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(splits);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(Traits::kThreads);
  config.dynamicSmemBytes = Traits::kSmemBytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kKernel, p);
}

// The kvcache kernel: append (and rotate), the attention over the caches with
// the keys split over `splits` CTAs per query tile, and the combine of the
// splits (sm80, sm75: a second kernel over partials in the workspace; sm90:
// inside the cluster the splits form). Every launch goes to problem.stream,
// in that order.
template <class Traits>
cudaError_t run_flash_fwd_kvcache(const AttentionForwardProblem& problem, FlashFwdParams p) {
  constexpr Family F = Traits::Config::kFamily;
  constexpr bool kCluster = F == Family::sm90;
  if (!forward_vectors(problem)) return cudaErrorNotSupported;  // the plan declines these
  const KVCacheGrid grid =
      kCluster ? cluster_kvcache_grid(problem, Traits::kBlockM, Traits::kBlockN, Traits::kSmemBytes)
               : kvcache_grid(problem, Traits::kBlockM, Traits::kBlockN);
  if (grid.splits == 0) return cudaErrorNotSupported;  // the plan declines these
  const KVCacheWorkspace layout = kvcache_workspace_layout(problem, grid, /*partials=*/!kCluster);
  char* workspace = static_cast<char*>(problem.workspace);
  if (layout.total > 0 && (workspace == nullptr || problem.workspace_bytes < layout.total ||
                           reinterpret_cast<uintptr_t>(workspace) % 256 != 0)) {
    return cudaErrorInvalidValue;  // the API checked the workspace against the same layout
  }
  const KVCacheView& cache = problem.cache;
  if (cache.rotary_cos != nullptr && cache.rotary_dim > 0) {
    // q rotated into the workspace, contiguous (batch, seqlen_q, nheads, headdim).
    p.q = workspace + layout.q_rotated;
    p.q_head = problem.headdim;
    p.q_seq = int64_t(problem.nheads) * problem.headdim;
    p.q_batch = p.q_seq * problem.seqlen_q;
  }
  cudaError_t status = kvcache_append<F>(problem, workspace + layout.q_rotated);
  if (status != cudaSuccess) return status;

  p.nheads = problem.nheads;
  p.group = grid.group;
  p.num_splits = grid.splits;
  const bool partials = !kCluster && grid.splits > 1;
  p.o_partial = partials ? reinterpret_cast<float*>(workspace + layout.o_partial) : nullptr;
  p.lse_partial = partials ? reinterpret_cast<float*>(workspace + layout.lse_partial) : nullptr;
  p.seqused_k = cache.seqused_k;
  p.leftpad_k = cache.leftpad_k;
  p.kv_batch_idx = cache.kv_batch_idx;
  p.block_table = cache.block_table;
  p.block_table_stride = cache.block_table_batch_stride;
  p.page_size = cache.block_table != nullptr ? cache.page_size : 0;
  p.kv_cache_batch = cache.kv_cache_batch;
  p.capacity = cache.capacity;
  p.seqlen_new = cache.k_new.ptr != nullptr ? cache.seqlen_new : 0;
  p.seqlen_k = cache.capacity;  // fixed-length caches: every row unless seqused_k says
  if constexpr (Traits::kFp8Cache) {
    if (!fp8_cache(cache)) return cudaErrorInvalidValue;  // the dispatch picks by the cache
    p.kv_fp8 = static_cast<int>(cache.fp8.kind);
    p.k_scale = cache.fp8.k_scale;
    p.v_scale = cache.fp8.v_scale;
    p.kv_scale_head = cache.fp8.scale_head_stride;
    p.k_scale_value = cache.fp8.k_scale_value;
    p.v_scale_value = cache.fp8.v_scale_value;
  } else if (fp8_cache(cache)) {
    return cudaErrorInvalidValue;
  }

  dim3 blocks(static_cast<unsigned>(grid.m_blocks * grid.splits), static_cast<unsigned>(grid.heads),
              static_cast<unsigned>(problem.batch));
  // Masks never reach this kernel (uses_kvcache_kernel).
  if constexpr (kCluster) {  // cluster_kvcache_grid: 2 splits or more
    return any_terms(problem.terms) ? launch_flash_fwd_cluster<Traits, TermsKernel::computed>(
                                          p, blocks, grid.splits, problem.stream)
                                    : launch_flash_fwd_cluster<Traits, TermsKernel::none>(
                                          p, blocks, grid.splits, problem.stream);
  } else {
    status = any_terms(problem.terms)
                 ? launch_flash_fwd<Traits, true, TermsKernel::computed>(p, blocks, problem.stream)
                 : launch_flash_fwd<Traits, true, TermsKernel::none>(p, blocks, problem.stream);
    if (status != cudaSuccess || grid.splits == 1) return status;
    return split_combine<F>(problem, grid.splits, p.o_partial, p.lse_partial);
  }
}

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
  p.terms = score_terms_params(problem);
  p.sinks = problem.terms.sinks;
  if constexpr (Traits::kKVCache) {
    return run_flash_fwd_kvcache<Traits>(problem, p);
  } else {
    const bool vectors = forward_vectors(problem);
    dim3 grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(problem.nheads),
              static_cast<unsigned>(problem.batch));
    switch (forward_terms_kernel(problem.terms)) {
      case TermsKernel::none:
        return vectors
                   ? launch_flash_fwd<Traits, true, TermsKernel::none>(p, grid, problem.stream)
                   : launch_flash_fwd<Traits, false, TermsKernel::none>(p, grid, problem.stream);
      case TermsKernel::computed:
        // The plan declines terms without vectors (plan_terms).
        if (!vectors) return cudaErrorNotSupported;
        return launch_flash_fwd<Traits, true, TermsKernel::computed>(p, grid, problem.stream);
      case TermsKernel::masked: {
        if (!vectors) return cudaErrorNotSupported;
        // The mask's tile map first, on the same stream, in the workspace
        // (fwd_mask_map_bytes sized it; without room every tile reads the mask).
        constexpr Family kFamily = Traits::Config::kFamily;
        cudaError_t error = cudaSuccess;
        p.mask_tiles = build_mask_tile_map<kFamily, Traits::kBlockM, Traits::kBlockN>(
            problem.terms.mask, problem.batch, problem.nheads, problem.seqlen_q, problem.seqlen_k,
            problem.workspace, problem.workspace_bytes, problem.stream, &error);
        if (error != cudaSuccess) return error;
        return launch_flash_fwd<Traits, true, TermsKernel::masked>(p, grid, problem.stream);
      }
    }
    return cudaErrorNotSupported;
  }
}

}  // namespace samattn::attention
