// run_simt<SimtGemm<...>>: launches the SIMT GEMM kernel (gemm_simt_kernel.cuh)
// for one instantiation tag. Included by exactly one generated translation
// unit per tag (cpp/instantiations.cmake), compiled for the tag's family.
#pragma once

#include <cuda_runtime_api.h>

#include "gemm/gemm_config.h"
#include "gemm/simt/gemm_simt_kernel.cuh"

namespace samattn::gemm {
namespace simt {

// 256 threads, at most 128 registers each: two blocks per SM.
template <class Traits>
__global__ void __launch_bounds__(kThreads, 2)
    simt_gemm_kernel(const __grid_constant__ SimtParams<typename Traits::Element> params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  static_assert(Traits::kFamily != Family::sm80, "sm80 SIMT kernels need sm_80 or newer");
#endif
  const uint32_t batch = blockIdx.y + blockIdx.z * gridDim.y;  // < 65535^2
  if (batch >= params.batch) return;                           // the last z slice may be partial
  extern __shared__ float4 shared_storage[];
  SimtGemmKernel<Traits>{}(params, reinterpret_cast<float*>(shared_storage),
                           static_cast<int>(threadIdx.x), static_cast<int>(blockIdx.x), batch);
}

}  // namespace simt

template <class Config>
cudaError_t run_simt(const GemmProblem& problem) {
  using Traits = simt::SimtTraits<Config>;
  using Kernel = simt::SimtGemmKernel<Traits>;
  static_assert(Kernel::kSmemBytes <= 48 * 1024, "more than 48 KiB needs an opt-in attribute");

  simt::SimtParams<typename Traits::Element> params;
  simt::SimtGrid grid;
  const cudaError_t status = simt::make_simt_params<Traits>(problem, &params, &grid);
  if (status != cudaSuccess || grid.tiles == 0) return status;

  simt::simt_gemm_kernel<Traits><<<dim3(grid.tiles, grid.batch_y, grid.batch_z), simt::kThreads,
                                   Kernel::kSmemBytes, problem.stream>>>(params);
  return cudaGetLastError();
}

}  // namespace samattn::gemm
