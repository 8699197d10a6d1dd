// sm90 GEMM instantiation tags: plain types, so that the family dispatch can
// name an instantiation without compiling its kernel. Each tag is explicitly
// instantiated in exactly one generated translation unit
// (cpp/instantiations.cmake).
#pragma once

#include <cstddef>

#include "common/problem.h"
#include "gemm/gemm_config.h"
#include "gemm/sm90/gemm_sm90_plan.h"

namespace samattn::gemm {

// TMA + wgmma GEMM for sm_90a. DType::f32 means tf32 operands. A and B say
// which mode of each operand is contiguous (see Major); D is row-major. C
// and D are of type T, or fp32 with the fused_f32 epilogue (16-bit T only).
template <DType T, Major A, Major B, sm90::Tile kTile,
          sm90::Epilogue kEpilogue = sm90::Epilogue::plain>
struct Sm90Gemm {};

// Defined in gemm_sm90_launch.cuh, instantiated once per tag. `plan` is
// sm90::plan(problem), eligible; the problem supplies alpha, beta, the
// stream, the SM count and the workspace.
template <class Config>
cudaError_t run_sm90(const sm90::Plan& plan, const GemmProblem& problem);
// Device workspace the kernel needs (stream-K partial sums and flags).
template <class Config>
size_t sm90_workspace_bytes(const sm90::Plan& plan, const GemmProblem& problem);

}  // namespace samattn::gemm
