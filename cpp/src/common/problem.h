// Internal problem descriptions shared by the C API (host code) and the
// kernel families. Plain structs: the API layer validates and fills them,
// each family's registered launch (common/registry.h) picks an
// instantiation and launches it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/types.h"

struct samattn_gemm_list_entry;  // samattn/samattn.h

namespace samattn {

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
  // Epilogue: D = activation(alpha * A @ B + beta * C + bias[column]).
  const void* bias;    // n elements of `dtype`; nullptr = none
  bool bias_per_row;   // bias[row] instead: a problem transposed inside a family
  int32_t activation;  // gemm::Activation
  bool out_f32;        // C and D are fp32 (f16 / bf16 inputs); else `dtype`
  bool allow_tf32;     // fp32 inputs: tf32 tensor cores (true) or exact FMA (false)
  // Split-K: 0 = the family's choice, 1 = none, n >= 2 forced (samattn.h).
  int32_t split_k;
  int32_t split_k_mode;  // SAMATTN_SPLIT_K_*
  // Grouped GEMM (gemm/group.h): `batch` cumulative ends on the device, or
  // (SAMATTN_GROUP_LIST) `batch` GEMMs on the host.
  const int32_t* group_offsets;  // nullptr: not grouped
  int32_t group_mode;            // SAMATTN_GROUP_*
  const samattn_gemm_list_entry* group_list;
  int sm_count;  // multiprocessors of the device, for grid sizing
  cudaStream_t stream;
  // Device scratch from the caller (the sm90 family's stream-K partial sums);
  // nullptr / 0 when the family's registered workspace size is 0.
  void* workspace;
  int64_t workspace_bytes;
  // Tuning overrides of the sm90 family's plan, SAMATTN_SM90_GEMM_TILE and
  // SAMATTN_SM90_GEMM_SWIZZLE, read once per call (the plan runs several
  // times per call); nullptr when unset.
  const char* sm90_tile;
  const char* sm90_swizzle;
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

}  // namespace samattn
