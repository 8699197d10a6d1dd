// Attention, sm90 family (Hopper, sm_90a): the forward and the backward on
// wgmma and TMA (flash_fwd_sm90_kernel.cuh, flash_bwd_sm90_kernel.cuh), fp16
// and bf16. The forward's plan takes fixed-length and variable-length prefill
// calls whose tensors TMA can describe and whose head dim fills at least
// three quarters of a table row, with ALiBi, sinks, dropout and attention
// masks or without; the backward's takes fixed-length and variable-length
// calls at head dims 33-64, 97-128 and 193-256, with softcap, ALiBi or an
// additive mask (softcap with neither of the other two), keep masks (fixed
// length) or dropout (not both), sinks and the deterministic mode or without.
// KV caches and decode-shaped calls whose keys split 2 to 16 ways over at
// most one CTA per SM (cluster_kvcache_grid) run sm80's kvcache kernel
// compiled here, the splits combined in a cluster (kSm90FwdCacheTiles).
// Everything else (other grids, odd head dims or strides; the backward's
// dropout with a mask) declines to the sm80 family. The kernels are
// instantiated in their own translation units (one per table row and dtype).
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "attention/flash_fwd_dispatch.h"
#include "attention/kvcache_plan.h"
#include "attention/mask_tiles.h"
#include "attention/sm90/flash_bwd_sm90_config.h"
#include "attention/sm90/flash_fwd_sm90_config.h"
#include "attention/sm90/flash_sm90_tiles.h"
#include "common/registry.h"

namespace samattn {
namespace attention {
namespace {

// The padded head dim of the sm90 row that runs `headdim` (0: none). A head
// dim below three quarters of its row would spend over a third of the
// tensor-core work on zero columns: sm80's finer rows serve it.
constexpr int sm90_head_dim(int headdim) {
  for (const FlashFwdSm90Tile& row : kSm90FwdTiles) {
    if (headdim <= row.head_dim) return 4 * headdim >= 3 * row.head_dim ? row.head_dim : 0;
  }
  return 0;
}

// Whether the query tiles run long key loops: 4096 keys or more on average (a
// causal row sees half of its keys, a two-sided window at most its width),
// where the rows marked TileUse::long_keys measured faster; calls of the
// terms kernels skip them (their 192-row d = 64 kernels would spill).
bool long_key_loop(const AttentionForwardProblem& problem) {
  if (sm90_forward_terms_kernel(problem) != TermsKernel::none) return false;
  const AttentionWindow& window = problem.window;
  int64_t keys = problem.seqlen_k;
  if (window.left >= 0 && window.right >= 0) {
    keys = std::min<int64_t>(keys, int64_t(window.left) + window.right + 1);
  } else if (window.right >= 0) {
    keys /= 2;
  }
  return keys >= 4096;
}

template <DType T, size_t I>
bool run_row(const AttentionForwardProblem& problem, int head_dim, bool long_keys,
             cudaError_t* result) {
  constexpr FlashFwdSm90Tile row = kSm90FwdTiles[I];
  if constexpr (!head_dim_built(row.head_dim)) {
    return false;
  } else {
    using Config = FlashFwdSm90Config<T, row.head_dim, row.block_m, row.block_n, row.stages>;
    if (row.head_dim != head_dim || (row.use == TileUse::long_keys && !long_keys) ||
        problem.max_smem_per_block < Config::kSmemBytes) {
      return false;
    }
    *result = run_flash_fwd_sm90<Config>(problem);
    return true;
  }
}

template <DType T, size_t... I>
cudaError_t run_rows(const AttentionForwardProblem& problem, std::index_sequence<I...>) {
  cudaError_t result = cudaErrorNotSupported;
  const int head_dim = sm90_head_dim(problem.headdim);
  const bool long_keys = long_key_loop(problem);
  (run_row<T, I>(problem, head_dim, long_keys, &result) || ...);
  return result;
}

template <DType T>
cudaError_t run_dtype(const AttentionForwardProblem& problem) {
  static_assert(dtype_listed<T>(kSm90AttentionDTypes), "not in kSm90AttentionDTypes");
  return run_rows<T>(problem, std::make_index_sequence<std::size(kSm90FwdTiles)>{});
}

// The smallest shared memory of the rows for `head_dim` (0: none built).
constexpr int row_smem(int head_dim) {
  int bytes = 0;
  for (const FlashFwdSm90Tile& row : kSm90FwdTiles) {
    const int smem = flash_fwd_sm90_smem(row.head_dim, row.block_m, row.block_n, row.stages).bytes;
    if (row.head_dim == head_dim && head_dim_built(row.head_dim) && (bytes == 0 || smem < bytes)) {
      bytes = smem;
    }
  }
  return bytes;
}

// Strides TMA can describe: 16-byte multiples (forward_vectors), and none
// zero or negative along a dimension of more than one element.
bool tma_strides(const SeqHeadView& t, int seqlen, int heads, int batch) {
  auto ok = [](int64_t stride, int extent) { return extent <= 1 || stride > 0; };
  return ok(t.seq_stride, seqlen) && ok(t.head_stride, heads) && ok(t.batch_stride, batch);
}

bool decline(std::string* why, const char* reason) {
  if (why != nullptr) *why = reason;
  return false;
}

// KV caches and decode-shaped calls: the kvcache kernel with its key splits
// combined in a cluster, where cluster_kvcache_grid takes the grid. One CTA
// per query tile gains nothing from it; more splits than a cluster holds, or
// grids of more CTAs than SMs, stay on sm80's global-memory combine.
bool plan_cache(const AttentionForwardProblem& problem, std::string* why) {
  if (!head_dim_built(padded_headdim(problem.headdim))) {
    return decline(why, "the head dim's kernels are not in this build");
  }
  if (!plan_kvcache<kSm90FwdCacheTiles>(problem, why)) return false;
  const FlashFwdTile* row = kvcache_tile(kSm90FwdCacheTiles, problem);
  if (row == nullptr) return decline(why, "no sm90 KV-cache kernel fits this GPU's shared memory");
  if (cluster_kvcache_grid(problem, row->block_m, row->block_n, fwd_tile_smem(*row)).splits == 0) {
    return decline(why,
                   "the sm90 KV-cache kernel combines 2 to 16 key splits (8 at head dims over "
                   "128) in a cluster, over at most one CTA per SM; sm80's kernel runs this "
                   "call's grid");
  }
  return true;
}

bool plan(const AttentionForwardProblem& problem, std::string* why) {
  if (problem.cache.enabled || uses_kvcache_kernel(problem)) return plan_cache(problem, why);
  const bool varlen = problem.cu_seqlens_q != nullptr;
  if (varlen && (problem.total_q <= 0 || problem.total_k <= 0 || problem.total_q > INT32_MAX ||
                 problem.total_k > INT32_MAX)) {
    return decline(why, "variable-length calls with no rows, or more than 2^31 - 1");
  }
  if (problem.seqlen_k <= 0) return decline(why, "no keys (seqlen_k = 0)");
  const SeqHeadView out{problem.o.ptr, problem.o.batch_stride, problem.o.seq_stride,
                        problem.o.head_stride};
  // Varlen: one packed tensor of total rows.
  const int batch = varlen ? 1 : problem.batch;
  const int rows_q = varlen ? int(problem.total_q) : problem.seqlen_q;
  const int rows_k = varlen ? int(problem.total_k) : problem.seqlen_k;
  if (!forward_vectors(problem) || !tma_strides(problem.q, rows_q, problem.nheads, batch) ||
      !tma_strides(problem.k, rows_k, problem.nheads_k, batch) ||
      !tma_strides(problem.v, rows_k, problem.nheads_k, batch) ||
      !tma_strides(out, rows_q, problem.nheads, batch)) {
    return decline(why,
                   "TMA needs 16-byte aligned tensors with positive strides that are multiples "
                   "of 8 elements, and a head dim that is a multiple of 8");
  }
  const int head_dim = sm90_head_dim(problem.headdim);
  if (head_dim == 0 || !head_dim_built(head_dim)) {
    return decline(why,
                   "the sm90 forward runs head dims 48-64, 96-128 and 192-256 (those built); "
                   "sm80 runs the others");
  }
  if (int64_t(problem.seqlen_q) * problem.nheads * problem.batch > INT32_MAX) {
    return decline(why, "more than 2^31 query rows x heads");
  }
  const int smem = row_smem(head_dim);
  if (smem == 0 || smem > problem.max_smem_per_block) {
    return decline(why, "no sm90 forward kernel fits this GPU's shared memory");
  }
  return true;
}

cudaError_t launch(const AttentionForwardProblem& problem) {
  const bool cache = problem.cache.enabled || uses_kvcache_kernel(problem);
  switch (problem.dtype) {
    case DType::f16:
      return cache ? run_flash_fwd_table<DType::f16, Family::sm90, kSm90FwdCacheTiles>(problem)
                   : run_dtype<DType::f16>(problem);
    case DType::bf16:
      return cache ? run_flash_fwd_table<DType::bf16, Family::sm90, kSm90FwdCacheTiles>(problem)
                   : run_dtype<DType::bf16>(problem);
    default:
      return cudaErrorNotSupported;
  }
}

// A masked call's tile map (mask_tiles.h), for its head dim's rows that are
// not long_keys rows (the terms kernels take none).
size_t mask_map_bytes(const AttentionForwardProblem& problem) {
  const int head_dim = sm90_head_dim(problem.headdim);
  return mask_tile_map_bytes(problem, kSm90FwdTiles, [&](const FlashFwdSm90Tile& row) {
    return row.head_dim == head_dim && row.use != TileUse::long_keys;
  });
}

// The kvcache kernel's rotated q (its splits need none: the cluster combines
// them); a masked call's tile map.
size_t workspace_bytes(const AttentionForwardProblem& problem) {
  if (uses_kvcache_kernel(problem)) {
    return kvcache_workspace_bytes(kSm90FwdCacheTiles, problem, /*partials=*/false);
  }
  return mask_map_bytes(problem);
}

// ----------------------------------------------------------------- backward

// Whether a backward call runs the computed (dropout) or masked kernel, which
// some rows do not have (bwd_tile_takes_terms).
bool backward_terms_kernel_call(const AttentionBackwardProblem& problem) {
  return dropout_on(problem.terms) || problem.terms.mask.kind != MaskKind::none;
}

// Whether a backward row runs the call's head dim and kernel.
bool backward_row_runs(const FlashBwdSm90Tile& row, const AttentionBackwardProblem& problem) {
  return row.head_dim == padded_headdim(problem.headdim) && head_dim_built(row.head_dim) &&
         (bwd_tile_takes_terms(row) || !backward_terms_kernel_call(problem));
}

template <DType T, size_t I>
bool run_backward_row(const AttentionBackwardProblem& problem, cudaError_t* result) {
  constexpr FlashBwdSm90Tile row = kSm90BwdTiles[I];
  if constexpr (!head_dim_built(row.head_dim)) {
    return false;
  } else {
    using Config = FlashBwdSm90Config<T, row.head_dim, row.block_m, row.block_n, row.stages>;
    if (!backward_row_runs(row, problem) || problem.max_smem_per_block < Config::kSmemBytes) {
      return false;
    }
    *result = run_flash_bwd_sm90<Config>(problem);
    return true;
  }
}

template <DType T, size_t... I>
cudaError_t run_backward_rows(const AttentionBackwardProblem& problem, std::index_sequence<I...>) {
  cudaError_t result = cudaErrorNotSupported;
  (run_backward_row<T, I>(problem, &result) || ...);
  return result;
}

// The smallest shared memory of the backward rows that run the call (0: none
// built).
int backward_row_smem(const AttentionBackwardProblem& problem) {
  int bytes = 0;
  for (const FlashBwdSm90Tile& row : kSm90BwdTiles) {
    const int smem = flash_bwd_sm90_smem(row.head_dim, row.block_m, row.block_n, row.stages);
    if (backward_row_runs(row, problem) && (bytes == 0 || smem < bytes)) bytes = smem;
  }
  return bytes;
}

// The backward's steps (attention_problem.h), then a masked call's tile map
// for its head dim's rows.
size_t backward_workspace_bytes(const AttentionBackwardProblem& problem) {
  const size_t steps = flash_bwd_workspace_bytes(problem);
  const size_t map = mask_tile_map_bytes(problem, kSm90BwdTiles, [&](const FlashBwdSm90Tile& row) {
    return backward_row_runs(row, problem);
  });
  return map == 0 ? steps : mask_tile_map_offset(steps) + map;
}

bool plan_backward(const AttentionBackwardProblem& problem, std::string* why) {
  const bool varlen = problem.cu_seqlens_q != nullptr;
  if (varlen != (problem.cu_seqlens_k != nullptr) ||
      (varlen && (problem.total_q <= 0 || problem.total_k <= 0 || problem.total_q > INT32_MAX ||
                  problem.total_k > INT32_MAX))) {
    return decline(why, "variable-length calls with no rows, or more than 2^31 - 1");
  }
  const MaskKind mask = problem.terms.mask.kind;
  if (dropout_on(problem.terms) && mask != MaskKind::none) {
    return decline(why, "dropout with an attention mask is not in the sm90 backward");
  }
  if (mask != MaskKind::none && varlen) {
    return decline(why, "attention masks are fixed-length only");
  }
  // Softcap's derivative with ALiBi or an additive mask would hold the bias
  // next to dS (the d = 128 kernel then spills): those rare pairs run on sm80.
  if ((problem.terms.alibi_slopes != nullptr || mask == MaskKind::add_f32) &&
      problem.softcap > 0.0f) {
    return decline(why, "ALiBi or an additive mask with softcap is not in the sm90 backward");
  }
  if (problem.seqlen_q <= 0 || problem.seqlen_k <= 0) return decline(why, "no queries or no keys");
  // Varlen: one packed tensor of total rows.
  const int batch = varlen ? 1 : problem.batch;
  const int rows_q = varlen ? int(problem.total_q) : problem.seqlen_q;
  const int rows_k = varlen ? int(problem.total_k) : problem.seqlen_k;
  if (!backward_vectors(problem) || !tma_strides(problem.q, rows_q, problem.nheads, batch) ||
      !tma_strides(problem.dout, rows_q, problem.nheads, batch) ||
      !tma_strides(problem.k, rows_k, problem.nheads_k, batch) ||
      !tma_strides(problem.v, rows_k, problem.nheads_k, batch)) {
    return decline(why,
                   "TMA needs 16-byte aligned tensors with positive strides that are multiples "
                   "of 8 elements, and a head dim that is a multiple of 8");
  }
  const int smem = backward_row_smem(problem);
  if (smem == 0) {
    return decline(why,
                   "the sm90 backward runs head dims 33-64, 97-128 and 193-256 (those built); "
                   "sm80 runs the others");
  }
  if (smem > problem.max_smem_per_block) {
    return decline(why, "no sm90 backward kernel fits this GPU's shared memory");
  }
  if (int64_t(problem.seqlen_q) * problem.nheads * problem.batch > INT32_MAX ||
      int64_t(problem.seqlen_k) * problem.nheads * problem.batch > INT32_MAX) {
    return decline(why, "more than 2^31 rows x heads");
  }
  return true;
}

cudaError_t launch_backward(const AttentionBackwardProblem& problem) {
  switch (problem.dtype) {
    case DType::f16:
      return run_backward_rows<DType::f16>(problem,
                                           std::make_index_sequence<std::size(kSm90BwdTiles)>{});
    case DType::bf16:
      return run_backward_rows<DType::bf16>(problem,
                                            std::make_index_sequence<std::size(kSm90BwdTiles)>{});
    default:
      return cudaErrorNotSupported;
  }
}

[[maybe_unused]] const bool kRegistered = register_kernels<Op::attention_forward>(
    {Family::sm90, &plan, &workspace_bytes, &launch, static_cast<int32_t>(Family::sm80)});
[[maybe_unused]] const bool kRegisteredBackward = register_kernels<Op::attention_backward>(
    {Family::sm90, &plan_backward, &backward_workspace_bytes, &launch_backward,
     static_cast<int32_t>(Family::sm80)});

}  // namespace
}  // namespace attention

// The standalone checkers (benchmarks/attention_check) call the family
// directly: cudaErrorNotSupported where its plan declines.
cudaError_t attention_forward_sm90(const AttentionForwardProblem& problem) {
  return attention::plan(problem, nullptr) ? attention::launch(problem) : cudaErrorNotSupported;
}
cudaError_t attention_backward_sm90(const AttentionBackwardProblem& problem) {
  return attention::plan_backward(problem, nullptr) ? attention::launch_backward(problem)
                                                    : cudaErrorNotSupported;
}

}  // namespace samattn
