// The entry points of the kvcache kernel's helpers (kvcache_aux.cuh), which
// each family's flash_fwd_<family>.cu instantiates once: declared apart from
// their kernels so that the kvcache translation units do not compile them.
#pragma once

#include <cuda_runtime_api.h>

#include "attention/attention_problem.h"

namespace samattn::attention {

// Launches the append on problem.stream when there is anything to append or
// rotate; q_rotated: the workspace piece for the rotated q.
template <Family F>
cudaError_t kvcache_append(const AttentionForwardProblem& problem, void* q_rotated);
// Launches the combine of `splits` partials into problem.o and problem.lse.
template <Family F>
cudaError_t split_combine(const AttentionForwardProblem& problem, int splits,
                          const float* o_partial, const float* lse_partial);

}  // namespace samattn::attention
