// The kvcache kernel's key splits combined inside a thread block cluster (the
// sm90 family; sm_90a). The CTAs that split one query tile's keys are one
// cluster along x. Each leaves its share (its rows' output normalized by its
// own sum, and their LSE) in its shared memory; after a cluster barrier every
// CTA weighs the shares of all splits through distributed shared memory and
// writes its slice of the columns. One launch and no workspace, where the
// sm80 family writes fp32 partials to global memory and launches a combine.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "attention/kvcache_plan.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include <cooperative_groups.h>
#endif

namespace samattn::attention {

// One split's share of a query tile, in the CTA's dynamic shared memory
// (reused after the key loop).
template <int kBlockM, int kHeadDim>
struct ClusterShare {
  float o[kBlockM][kHeadDim];                // the share's rows, normalized by its own sum
  float lse[kBlockM];                        // -inf: the split saw no key of the row
  float weight[kMaxClusterSplits][kBlockM];  // per split: exp(lse_s - lse) of the row
};

// Combines the cluster's shares of rows [0, rows) (the caller's share
// written): each CTA computes every row's weights and LSE (split 0 passes the
// LSE to write_lse(row, lse)), then writes columns [split x w, (split + 1) x w)
// of every row through o_row(row) (the row's output pointer). sink_of(row):
// the row's sink logit, -inf for none. A row that no split and no sink gives
// weight gets zeros and LSE +inf, as the unsplit kernel. Every CTA of the
// cluster must call it (the barriers are cluster-wide).
template <int kThreads, class Element, int kBlockM, int kHeadDim, class ORow, class WriteLse,
          class SinkOf>
__device__ inline void combine_cluster_splits(ClusterShare<kBlockM, kHeadDim>& share, int splits,
                                              int split, int rows, int headdim, ORow&& o_row,
                                              WriteLse&& write_lse, SinkOf&& sink_of) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every split's share is written and visible
  for (int r = threadIdx.x; r < rows; r += kThreads) {
    float lse_of[kMaxClusterSplits];
    const float sink = sink_of(r);
    float max_lse = sink;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      lse_of[s] = s < splits ? cluster.map_shared_rank(&share, s)->lse[r] : -INFINITY;
      max_lse = fmaxf(max_lse, lse_of[s]);
    }
    float lse = INFINITY;
    if (max_lse != -INFINITY) {
      float sum = sink != -INFINITY ? __expf(sink - max_lse) : 0.0f;
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) sum += __expf(lse_of[s] - max_lse);
      lse = max_lse + __logf(sum);
    }
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      share.weight[s][r] = lse != INFINITY ? __expf(lse_of[s] - lse) : 0.0f;
    }
    if (split == 0) write_lse(r, lse);
  }
  __syncthreads();
  const int width = (headdim + splits - 1) / splits;
  const int col0 = split * width;
  const int cols = min(headdim - col0, width);
  for (int i = threadIdx.x; i < rows * cols; i += kThreads) {
    const int r = i / cols, col = col0 + i % cols;
    float acc = 0.0f;
    for (int s = 0; s < splits; ++s) {
      // A split without keys for the row has weight 0 and an unwritten share.
      const float w = share.weight[s][r];
      if (w != 0.0f) acc += w * cluster.map_shared_rank(&share, s)->o[r][col];
    }
    o_row(r)[col] = static_cast<Element>(acc);
  }
  cluster.sync();  // no CTA leaves while another still reads its share
#endif
}

}  // namespace samattn::attention
