// Internal description of one attention forward call, shared by the C API
// (host code, later) and the kernel families. Plain data: the API layer
// validates and fills it, a family's dispatch picks an instantiation.
#pragma once

#include <cuda_runtime_api.h>

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
  int headdim;             // <= 256, multiple of 8 (16-byte vectors)
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

// Kernel family entry point: cudaSuccess, cudaErrorNotSupported for a head
// dim or dtype the family lacks, or the launch error.
cudaError_t attention_forward_sm80(const AttentionForwardProblem& problem);

}  // namespace samattn
