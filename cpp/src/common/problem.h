// Internal problem descriptions shared by the C API (host code) and the
// kernel families. Plain structs: the API layer validates and fills them,
// each family's dispatch picks an instantiation and launches it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace samattn {

enum class DType : int32_t { f16 = 0, bf16 = 1, f32 = 2 };

// Element strides of a batched matrix: (b, i, j) -> b*batch + i*row + j*col.
struct MatrixView {
  const void* ptr;
  int64_t batch_stride, row_stride, col_stride;
};

struct GemmProblem {
  DType dtype;
  int64_t batch, m, n, k;
  MatrixView a, b, c;  // c.ptr == nullptr when beta == 0
  void* d;
  int64_t d_batch_stride, d_row_stride, d_col_stride;
  float alpha, beta;
  bool allow_tf32;  // fp32 inputs: tf32 tensor cores (true) or exact FMA (false)
  int sm_count;     // multiprocessors of the device, for grid sizing
  cudaStream_t stream;
  // Device scratch from the caller (the sm90 family's stream-K partial sums);
  // nullptr / 0 when gemm_sm90_workspace_bytes() is 0.
  void* workspace;
  int64_t workspace_bytes;
};

// Softmax over the middle mode of a contiguous (outer, dim, inner) tensor.
struct SoftmaxProblem {
  DType dtype;
  int64_t outer, dim, inner;
  const void* x;   // forward: input; backward: y
  const void* dy;  // backward only
  void* out;       // forward: y; backward: dx
  int sm_count;
  cudaStream_t stream;
};

// Kernel family entry points. Each returns cudaSuccess, or the launch error.
// A configuration the family cannot run never reaches them: the API layer
// checks support first (see api/family.h).
cudaError_t gemm_sm80(const GemmProblem& problem);
cudaError_t gemm_sm75(const GemmProblem& problem);
// sm90: only for problems that gemm::sm90::plan() finds eligible (the API
// runs the rest on sm80). The workspace it needs, in bytes, is
// gemm_sm90_workspace_bytes(problem) (0 for most problems).
cudaError_t gemm_sm90(const GemmProblem& problem);
size_t gemm_sm90_workspace_bytes(const GemmProblem& problem);
cudaError_t softmax_forward_sm80(const SoftmaxProblem& problem);
cudaError_t softmax_backward_sm80(const SoftmaxProblem& problem);
cudaError_t softmax_forward_sm75(const SoftmaxProblem& problem);
cudaError_t softmax_backward_sm75(const SoftmaxProblem& problem);
// Attention forward (described in attention/attention_problem.h): fp16 and
// bf16; cudaErrorNotSupported for a head dim the family has no kernel for.
struct AttentionForwardProblem;
cudaError_t attention_forward_sm80(const AttentionForwardProblem& problem);
// sm75: fp16 only (bf16 needs sm80); the backward has no head dim 256 kernel.
cudaError_t attention_forward_sm75(const AttentionForwardProblem& problem);
struct AttentionBackwardProblem;
cudaError_t attention_backward_sm75(const AttentionBackwardProblem& problem);

}  // namespace samattn
