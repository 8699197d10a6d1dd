// The parameters of one attention call, shared by the C API and the kernel
// families: filled and normalized once at the API boundary (api/attention.cpp),
// then only read by the plans, the tile choice, the launchers and the kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/problem.h"

namespace samattn {

// A (batch, seq, head, dim) tensor given by element strides; the dim stride
// is 1. With varlen the batch stride is unused and sequence b starts at row
// cu_seqlens[b] of a packed (total, head, dim) tensor.
struct SeqHeadView {
  const void* ptr;
  int64_t batch_stride, seq_stride, head_stride;
};

// A writable (batch, seq, head, dim) tensor, same conventions as SeqHeadView.
struct SeqHeadOut {
  void* ptr;
  int64_t batch_stride, seq_stride, head_stride;
};

// The attention window in the kernels' form. Query row i (0-based, of sq
// queries and sk keys) attends key j iff
//   i + sk - sq - left <= j <= i + sk - sq + right,
// -1 meaning unbounded, as flash_attn_func documents; causal is right = 0.
// A bound becomes -1 only where that is exactly equivalent for every row:
// the right bound reaches the last key from row 0 when right >= sq - 1, the
// left bound reaches key 0 from the last row when left >= sk - 1. (flash-attn
// turns any bound >= sk into unbounded, which lets rows see keys beyond their
// window when sq > sk.) With varlen, sq and sk are the longest sequences, so
// the rule stays exact for every sequence. Kept bounds are then < sq - 1 and
// < sk - 1, which keeps the mask arithmetic (mask.cuh) inside int32.
struct AttentionWindow {
  int left, right;
};
constexpr AttentionWindow normalize_window(bool causal, int64_t left, int64_t right,
                                           int64_t seqlen_q, int64_t seqlen_k) {
  if (causal) right = 0;
  if (left < 0 || left >= seqlen_k - 1) left = -1;
  if (right < 0 || right >= seqlen_q - 1) right = -1;
  return {static_cast<int>(left), static_cast<int>(right)};
}

// FP8 caches (samattn.h, kv_fp8): k and v hold 1-byte elements, a key
// element x standing for x * k_scale of its KV head (k_scale[h *
// scale_head_stride], or k_scale_value where the pointer is null), a value
// element for x * v_scale. kind none: k and v hold the problem's dtype.
enum class Fp8Kind : int { none = 0, e4m3 = 4, e5m2 = 5 };
struct Fp8CacheView {
  Fp8Kind kind;
  const float* k_scale;
  const float* v_scale;
  int64_t scale_head_stride;  // 0: one scale for every head; 1: one per KV head
  float k_scale_value, v_scale_value;
};

// The KV-cache fields of a forward (all null / 0: none). Sequence b attends
// cache rows [leftpad_k[b], seqused_k[b] + seqlen_new) of cache sequence
// kv_batch_idx[b] (each clamped into the cache by the kernels), after
// k_new / v_new are written at rows seqused_k[b] + i with rotary embedding.
struct KVCacheView {
  bool enabled;  // any field below set: k and v are caches
  const int32_t* seqused_k;
  const int32_t* leftpad_k;
  const int32_t* kv_batch_idx;
  const int32_t* block_table;  // paged when not null
  int64_t block_table_batch_stride;
  int page_size;       // paged: rows per page (multiple of 16); else 0
  int kv_cache_batch;  // leading extent of k and v: sequences, or pages
  int capacity;        // rows one sequence may hold: seqlen_k, or pages x page_size
  SeqHeadView k_new, v_new;
  int seqlen_new;
  const void* rotary_cos;  // (rotary_seqlen, rotary_dim / 2), q's dtype
  const void* rotary_sin;
  int rotary_dim, rotary_seqlen;
  bool rotary_interleaved;
  bool rotary_q_per_row;  // causal or a window: query row i at seqused_k[b] + i
  Fp8CacheView fp8;       // kind none: k and v hold the problem's dtype
};
inline bool fp8_cache(const KVCacheView& c) { return c.fp8.kind != Fp8Kind::none; }

// An attention mask read by the kernels (fixed length only): the value for
// (batch b, query head h, query i, key j) at ptr + b * batch_stride +
// h * head_stride + i * q_stride + j * k_stride elements (0 broadcasts).
enum class MaskKind : int {
  none = 0,
  keep = 1,     // uint8: 0 masks the key for that query
  add_f32 = 2,  // fp32, added to the scaled score (-inf masks)
};
struct AttnMaskView {
  const void* ptr;
  MaskKind kind;
  int64_t batch_stride, head_stride, q_stride, k_stride;
};

// Dropout on the probabilities (samattn.h): p == 0 is off; seed points to
// the call's 64-bit Philox key on the device (attention/dropout.cuh).
struct DropoutView {
  float p;
  const uint64_t* seed;
};

// Terms of the scores beyond scale q k^T (samattn.h, ABI 6); nullptr: off.
// The scaled (and capped) score of query i, key j becomes
//   s + ALiBi's -slope * |i + sk - sq - j| + an additive mask,
// or -inf where a keep mask says 0.
struct ScoreTerms {
  // slope = alibi_slopes[b * alibi_batch_stride + h] (stride 0: per head).
  const float* alibi_slopes;
  int64_t alibi_batch_stride;
  // Sinks: (nheads,) one logit per query head in every row's softmax
  // denominator, a key whose value is zero.
  const float* sinks;
  AttnMaskView mask;
  // Not a term of the scores, but it runs where they do: the kernels with
  // terms draw the dropout mask (TermsKernel::computed or masked).
  DropoutView dropout;
};
inline bool dropout_on(const ScoreTerms& t) { return t.dropout.p > 0.0f; }
// The kernel variant a call's score terms need (score_terms.cuh): none; the
// computed terms (ALiBi, sinks, dropout); or also a mask, whose per-element
// loads take registers that the other calls should not pay for.
enum class TermsKernel : int { none = 0, computed = 1, masked = 2 };
inline TermsKernel forward_terms_kernel(const ScoreTerms& t) {
  if (t.mask.kind != MaskKind::none) return TermsKernel::masked;
  return t.alibi_slopes != nullptr || t.sinks != nullptr || dropout_on(t) ? TermsKernel::computed
                                                                          : TermsKernel::none;
}
// The backward's main kernel: the sinks change only the LSE it reads (their
// gradient is a kernel of its own).
inline TermsKernel backward_terms_kernel(const ScoreTerms& t) {
  if (t.mask.kind != MaskKind::none) return TermsKernel::masked;
  return t.alibi_slopes != nullptr || dropout_on(t) ? TermsKernel::computed : TermsKernel::none;
}

// Whether the forward needs a kernel with terms.
inline bool any_terms(const ScoreTerms& t) { return forward_terms_kernel(t) != TermsKernel::none; }
// Whether the backward's main kernel does.
inline bool backward_terms(const ScoreTerms& t) {
  return backward_terms_kernel(t) != TermsKernel::none;
}

// Forward: o = softmax(scale q k^T + mask) v per (batch, query head).
struct AttentionForwardProblem {
  DType dtype;  // f16 or bf16; output and inputs share it
  int batch;
  int nheads, nheads_k;    // nheads % nheads_k == 0 (GQA / MQA)
  int kv_group;            // nheads / nheads_k: query heads per key/value head
  int seqlen_q, seqlen_k;  // varlen: the maxima over the batch
  int headdim;             // 1..256
  SeqHeadView q, k, v;
  SeqHeadOut o;  // forward: written; backward: read

  // Varlen: device int32 arrays of batch + 1 offsets; nullptr = fixed length.
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  // Varlen: rows of the packed tensors (cu_seqlens[batch], which the host
  // cannot read): q and o hold total_q rows, k and v total_k; 0 with fixed
  // length.
  int64_t total_q, total_k;

  float softmax_scale;  // usually 1 / sqrt(headdim)
  // Softcap > 0: s -> softcap * tanh(s * softcap_pre), softcap_pre =
  // softmax_scale / softcap, and the softmax exponent is scale_log2 * s with
  // scale_log2 = log2(e) (the capped scores are already scaled); off:
  // softcap = softcap_pre = 0 and scale_log2 = log2(e) * softmax_scale.
  // An additive mask is added to scaled scores: the kernels scale them first
  // (by bias_pre: softmax_scale, or 1 when capped) and scale_log2 is log2(e);
  // else bias_pre is 1. ALiBi's slopes are multiplied by alibi_scale:
  // 1 / softmax_scale where the scores stay unscaled (no mask, no softcap),
  // so that the bias costs one fused multiply-add per score; else 1. A scale
  // that is not positive, or too small to invert safely, takes the mask's
  // way (the running maximum then stays that of the scaled scores).
  float softcap, softcap_pre, scale_log2, bias_pre, alibi_scale;
  AttentionWindow window;  // normalized (normalize_window), causal included
  ScoreTerms terms;

  // Log-sum-exp of each row's scaled scores, natural log; may be nullptr in
  // the forward. Fixed length: (batch, nheads, seqlen_q); varlen: (nheads,
  // total_q), the batch stride unused and the row offset by cu_seqlens_q[b].
  float* lse;
  int64_t lse_batch_stride, lse_head_stride, lse_seq_stride;

  // Inference: K and V are caches (samattn.h, samattn_attention_args); read
  // by the kvcache kernel only (uses_kvcache_kernel in kvcache_plan.h).
  KVCacheView cache;
  int num_splits;  // requested: 0 = heuristic, >= 1 forced

  cudaStream_t stream;
  int sm_count;            // multiprocessors of the device
  int max_smem_per_block;  // cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes

  // Caller-owned device scratch, 256-byte aligned; the library allocates
  // nothing. Forward: flash_fwd_workspace_bytes() (split keys, rotary q);
  // backward: flash_bwd_workspace_bytes().
  void* workspace;
  size_t workspace_bytes;
};

// Sets the score parameters of `p`, whose seqlen_q and seqlen_k (the maxima,
// with varlen) and terms are set: the scale, the softcap and ALiBi factors
// and the normalized window. The one place they are derived from the
// caller's values.
inline void set_scores(AttentionForwardProblem& p, float softmax_scale, float softcap, bool causal,
                       int64_t window_left, int64_t window_right) {
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kSmallestInvertedScale = 1.0f / 65536.0f;
  const bool capped = softcap > 0.0f;
  const bool scaled_first =
      p.terms.mask.kind == MaskKind::add_f32 ||
      (p.terms.alibi_slopes != nullptr && !(softmax_scale >= kSmallestInvertedScale));
  p.softmax_scale = softmax_scale;
  p.softcap = capped ? softcap : 0.0f;
  p.softcap_pre = capped ? softmax_scale / softcap : 0.0f;
  p.bias_pre = scaled_first && !capped ? softmax_scale : 1.0f;
  p.alibi_scale = scaled_first || capped ? 1.0f : 1.0f / softmax_scale;
  // Capped or pre-scaled scores are already scaled.
  p.scale_log2 = capped || scaled_first ? kLog2e : softmax_scale * kLog2e;
  p.window = normalize_window(causal, window_left, window_right, p.seqlen_q, p.seqlen_k);
}

// Backward: the gradients dq, dk, dv of the forward described by the same
// fields, given its output o, the lse it returned (required) and dout. Every
// pointer is element-aligned (2 bytes).
struct AttentionBackwardProblem : AttentionForwardProblem {
  SeqHeadView dout;
  SeqHeadOut dq, dk, dv;  // dk, dv: nheads_k heads (GQA: summed over each group)

  // true: dq is accumulated in a fixed order, bit-identical run to run.
  bool deterministic;

  // With terms.sinks: (nheads,) fp32, written with the sinks' gradient;
  // nullptr: not computed.
  float* dsinks;
  // With an additive mask: fp32 (batch, nheads, seqlen_q, seqlen_k),
  // contiguous and zeroed by the caller; the kernels write the gradient of
  // every pair some query tile visits. nullptr: not computed.
  float* dmask;
};

// Whether the kernels may move rows as 16-byte vectors (8 elements): the head
// dim and every pointer and stride a multiple of 8 elements (the batch stride
// is unused with varlen). Otherwise they move single elements, which serves
// any head dim and any view at a fraction of the speed.
// `vector`: elements per 16 bytes (8; 16 for fp8 caches).
inline bool vector_aligned(const void* ptr, int64_t batch_stride, int64_t seq_stride,
                           int64_t head_stride, bool varlen, int vector = 8) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && (varlen || batch_stride % vector == 0) &&
         seq_stride % vector == 0 && head_stride % vector == 0;
}
inline bool forward_vectors(const AttentionForwardProblem& p) {
  const bool varlen_q = p.cu_seqlens_q != nullptr, varlen_k = p.cu_seqlens_k != nullptr;
  auto view = [](const SeqHeadView& t, bool varlen, int vector = 8) {
    return vector_aligned(t.ptr, t.batch_stride, t.seq_stride, t.head_stride, varlen, vector);
  };
  // Caches step over sequences or pages by their batch stride, varlen or not;
  // a 16-byte vector of an fp8 cache holds 16 elements.
  const bool packed_k = varlen_k && !p.cache.enabled;
  const int kv_vector = fp8_cache(p.cache) ? 16 : 8;
  return p.headdim % kv_vector == 0 && view(p.q, varlen_q) && view(p.k, packed_k, kv_vector) &&
         view(p.v, packed_k, kv_vector) &&
         vector_aligned(p.o.ptr, p.o.batch_stride, p.o.seq_stride, p.o.head_stride, varlen_q);
}
inline bool backward_vectors(const AttentionBackwardProblem& p) {
  const bool varlen_q = p.cu_seqlens_q != nullptr, varlen_k = p.cu_seqlens_k != nullptr;
  auto view = [](const SeqHeadView& t, bool varlen) {
    return vector_aligned(t.ptr, t.batch_stride, t.seq_stride, t.head_stride, varlen);
  };
  auto out = [](const SeqHeadOut& t, bool varlen) {
    return vector_aligned(t.ptr, t.batch_stride, t.seq_stride, t.head_stride, varlen);
  };
  return p.headdim % 8 == 0 && view(p.q, varlen_q) && out(p.o, varlen_q) &&
         view(p.dout, varlen_q) && out(p.dq, varlen_q) && view(p.k, varlen_k) &&
         view(p.v, varlen_k) && out(p.dk, varlen_k) && out(p.dv, varlen_k);
}

// The mma.sync families run score terms on 16-byte vectors only (their
// kTerms kernels): a plan declines the others, saying why.
inline bool plan_terms(bool terms, bool vectors, std::string* why) {
  if (!terms || vectors) return true;
  if (why != nullptr) {
    *why =
        "ALiBi, sinks, attention masks and dropout run on 16-byte vectors: the head dim must be a "
        "multiple of 8 and every tensor 16-byte aligned with strides that are multiples of 8 "
        "elements";
  }
  return false;
}

// Workspace layout of the backward, in 256-byte aligned pieces:
//   dq accumulator   fp32 (nheads, rows_q + batch x 128, padded head dim):
//                    per query tile a block of tile rows x padded head dim
//                    in the order of the dQ MMA fragments (each sequence
//                    starts up to one tile further, so tiles never overlap)
//   dk, dv per q head fp32 (nheads, rows_k, headdim) each, only with GQA
//                    (summed per group; without, the kernel writes dk, dv)
//   D = rowsum(dout * o) fp32 (nheads, rows_q)
//   semaphores       int32 (batch, nheads, ceil(seqlen_q / 16)), deterministic only
// rows = batch * seqlen, or total with varlen.
struct FlashBwdWorkspace {
  size_t dq_accum, dk_accum, dv_accum, dsum, semaphores, total;  // byte offsets, size
  size_t dq_head_stride;                                         // floats
};
// The padded head dims the tile tables are instantiated for (a head dim runs
// in the next one up); 0 when headdim is too large.
constexpr int padded_headdim(int headdim) {
  return headdim <= 32    ? 32
         : headdim <= 64  ? 64
         : headdim <= 96  ? 96
         : headdim <= 128 ? 128
         : headdim <= 192 ? 192
         : headdim <= 256 ? 256
                          : 0;
}
// Whether this build instantiated a padded head dim: all of them unless CMake's
// SAMATTN_ATTENTION_HEAD_DIMS picked a subset (bit d / 32 of the mask).
constexpr bool head_dim_built(int padded) {
#ifdef SAMATTN_ATTENTION_HEAD_DIM_MASK
  return padded > 0 && ((SAMATTN_ATTENTION_HEAD_DIM_MASK >> (padded / 32)) & 1) != 0;
#else
  return padded > 0;
#endif
}
// The largest query tile of every backward configuration.
constexpr int kFlashBwdMaxBlockM = 128;
inline FlashBwdWorkspace flash_bwd_workspace_layout(const AttentionBackwardProblem& p) {
  auto align = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  const bool varlen = p.cu_seqlens_q != nullptr;
  const size_t rows_q = varlen ? size_t(p.total_q) : size_t(p.batch) * size_t(p.seqlen_q);
  const size_t rows_k =
      p.cu_seqlens_k != nullptr ? size_t(p.total_k) : size_t(p.batch) * size_t(p.seqlen_k);
  const size_t rows_kv_accum = p.nheads == p.nheads_k ? 0 : rows_k;
  const size_t heads = size_t(p.nheads), d = size_t(p.headdim);
  FlashBwdWorkspace w{};
  w.dq_head_stride = rows_q == 0 ? 0
                                 : (rows_q + size_t(p.batch) * kFlashBwdMaxBlockM) *
                                       size_t(padded_headdim(p.headdim));
  w.dq_accum = 0;
  w.dk_accum = w.dq_accum + align(heads * w.dq_head_stride * 4);
  w.dv_accum = w.dk_accum + align(heads * rows_kv_accum * d * 4);
  w.dsum = w.dv_accum + align(heads * rows_kv_accum * d * 4);
  w.semaphores = w.dsum + align(heads * rows_q * 4);
  const size_t m_tiles = (size_t(p.seqlen_q) + 15) / 16;
  w.total =
      w.semaphores + (p.deterministic ? align(size_t(p.batch) * heads * m_tiles * 4) : size_t(0));
  return w;
}
inline size_t flash_bwd_workspace_bytes(const AttentionBackwardProblem& p) {
  return flash_bwd_workspace_layout(p).total;
}

// The families' entry points: cudaSuccess, cudaErrorNotSupported for a
// problem their registered plan declines, or the launch error. The library
// reaches them through the registry (common/registry.h); the standalone
// checkers in benchmarks/attention_check call them directly.
cudaError_t attention_forward_sm80(const AttentionForwardProblem& problem);
cudaError_t attention_backward_sm80(const AttentionBackwardProblem& problem);
cudaError_t attention_forward_sm75(const AttentionForwardProblem& problem);
cudaError_t attention_backward_sm75(const AttentionBackwardProblem& problem);
cudaError_t attention_forward_sm90(const AttentionForwardProblem& problem);
cudaError_t attention_backward_sm90(const AttentionBackwardProblem& problem);

}  // namespace samattn
