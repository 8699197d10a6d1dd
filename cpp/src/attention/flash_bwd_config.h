// The backward attention instantiation tag. A plain type with no CuTe in it
// (see flash_fwd_config.h); each tag a family's tile table names is
// instantiated in exactly one translation unit.
#pragma once

#include "attention/attention_problem.h"

namespace samattn::attention {

using Family = ::samattn::Family;

// One backward kernel: a CTA owns kBlockN keys of one (batch, head) and loops
// over kBlockM-query tiles. Shared memory holds kQStages buffers of Q and dO
// (kBlockM x head dim; with 2 the next query tile streams in during the
// whole current one), K, V (kBlockN x head dim), P and dS (kBlockM x
// kBlockN) as 16-bit elements, plus the tile's LSE and D (fp32).
template <DType T, int kHeadDim, int kBlockM, int kBlockN, int kWarps, int kQStages, Family F>
struct FlashBwdConfig {
  static constexpr int kSmemBytes =
      (2 * kQStages * kBlockM * kHeadDim + 2 * kBlockN * kHeadDim + 2 * kBlockM * kBlockN) * 2 +
      2 * kBlockM * 4;
};

// Defined in flash_bwd_launch.cuh, instantiated once per tag.
template <class Config>
cudaError_t run_flash_bwd(const AttentionBackwardProblem& problem);

}  // namespace samattn::attention
