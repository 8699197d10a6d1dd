// Internal description of one attention forward call, shared by the C API
// (host code, later) and the kernel families. Plain data: the API layer
// validates and fills it, a family's dispatch picks an instantiation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/problem.h"

namespace samattn {

// A (batch, seq, head, dim) tensor given by element strides; the dim stride
// is 1. With varlen the batch stride is unused and sequence b starts at row
// cu_seqlens[b] of a packed (total, head, dim) tensor.
struct SeqHeadView {
  const void* ptr;
  int64_t batch_stride, seq_stride, head_stride;
};

struct AttentionForwardProblem {
  DType dtype;  // f16 or bf16; output and inputs share it
  int batch;
  int nheads, nheads_k;    // nheads % nheads_k == 0 (GQA / MQA)
  int seqlen_q, seqlen_k;  // varlen: the maxima over the batch
  int headdim;             // 1..256
  SeqHeadView q, k, v;
  void* o;
  int64_t o_batch_stride, o_seq_stride, o_head_stride;

  // Varlen: device int32 arrays of batch + 1 offsets; nullptr = fixed length.
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;

  float softmax_scale;            // usually 1 / sqrt(headdim)
  bool causal;                    // bottom-right aligned when seqlen_q != seqlen_k
  int window_left, window_right;  // -1 = unbounded (flash-attn's window_size)
  float softcap;                  // > 0: s -> softcap * tanh(s / softcap)

  // Log-sum-exp of each row's scaled scores, natural log; may be nullptr.
  // Fixed length: (batch, nheads, seqlen_q); varlen: (nheads, total_q), the
  // batch stride unused and the row offset by cu_seqlens_q[b].
  float* lse;
  int64_t lse_batch_stride, lse_head_stride, lse_seq_stride;

  cudaStream_t stream;
  int sm_count;            // multiprocessors of the device
  int max_smem_per_block;  // cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes
};

// A writable (batch, seq, head, dim) tensor, same conventions as SeqHeadView.
struct SeqHeadOut {
  void* ptr;
  int64_t batch_stride, seq_stride, head_stride;
};

// One attention backward call: the gradients dq, dk, dv of the forward
// described by the same fields, given its output o, the LSE it returned and
// dout. Every pointer is element-aligned (2 bytes).
struct AttentionBackwardProblem {
  DType dtype;  // f16 or bf16, every tensor
  int batch;
  int nheads, nheads_k;
  int seqlen_q, seqlen_k;  // varlen: the maxima over the batch
  int headdim;             // 1..256
  SeqHeadView q, k, v, o, dout;
  SeqHeadOut dq, dk, dv;  // dk, dv: nheads_k heads (GQA: summed over each group)

  // Varlen: device int32 arrays of batch + 1 offsets; nullptr = fixed length.
  // total_q / total_k: rows of the packed tensors (cu_seqlens[batch]); only
  // read with varlen, to size the workspace.
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  int64_t total_q, total_k;

  float softmax_scale;
  bool causal;
  int window_left, window_right;  // -1 = unbounded
  float softcap;                  // > 0: s -> softcap * tanh(s / softcap)

  // The forward's LSE (required), same layout as AttentionForwardProblem::lse.
  const float* lse;
  int64_t lse_batch_stride, lse_head_stride, lse_seq_stride;

  // true: dq is accumulated in a fixed order, bit-identical run to run.
  bool deterministic;

  // Caller-owned device scratch of at least flash_bwd_workspace_bytes()
  // bytes, 256-byte aligned; the library allocates nothing.
  void* workspace;
  size_t workspace_bytes;

  cudaStream_t stream;
  int sm_count;
  int max_smem_per_block;
};

// Whether the kernels may move rows as 16-byte vectors (8 elements): the head
// dim and every pointer and stride a multiple of 8 elements (the batch stride
// is unused with varlen). Otherwise they move single elements, which serves
// any head dim and any view at a fraction of the speed.
inline bool vector_aligned(const void* ptr, int64_t batch_stride, int64_t seq_stride,
                           int64_t head_stride, bool varlen) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && (varlen || batch_stride % 8 == 0) &&
         seq_stride % 8 == 0 && head_stride % 8 == 0;
}
inline bool forward_vectors(const AttentionForwardProblem& p) {
  const bool varlen_q = p.cu_seqlens_q != nullptr, varlen_k = p.cu_seqlens_k != nullptr;
  auto view = [](const SeqHeadView& t, bool varlen) {
    return vector_aligned(t.ptr, t.batch_stride, t.seq_stride, t.head_stride, varlen);
  };
  return p.headdim % 8 == 0 && view(p.q, varlen_q) && view(p.k, varlen_k) && view(p.v, varlen_k) &&
         vector_aligned(p.o, p.o_batch_stride, p.o_seq_stride, p.o_head_stride, varlen_q);
}
inline bool backward_vectors(const AttentionBackwardProblem& p) {
  const bool varlen_q = p.cu_seqlens_q != nullptr, varlen_k = p.cu_seqlens_k != nullptr;
  auto view = [](const SeqHeadView& t, bool varlen) {
    return vector_aligned(t.ptr, t.batch_stride, t.seq_stride, t.head_stride, varlen);
  };
  auto out = [](const SeqHeadOut& t, bool varlen) {
    return vector_aligned(t.ptr, t.batch_stride, t.seq_stride, t.head_stride, varlen);
  };
  return p.headdim % 8 == 0 && view(p.q, varlen_q) && view(p.o, varlen_q) &&
         view(p.dout, varlen_q) && out(p.dq, varlen_q) && view(p.k, varlen_k) &&
         view(p.v, varlen_k) && out(p.dk, varlen_k) && out(p.dv, varlen_k);
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

// Kernel family entry point: cudaSuccess, cudaErrorNotSupported for a head
// dim or dtype the family lacks, or the launch error.
cudaError_t attention_forward_sm80(const AttentionForwardProblem& problem);
cudaError_t attention_backward_sm80(const AttentionBackwardProblem& problem);

}  // namespace samattn
