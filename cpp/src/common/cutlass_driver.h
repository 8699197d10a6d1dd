// CUTLASS and CuTe build TMA descriptors with driver functions
// (cuTensorMapEncodeTiled) that they look up by name, through the runtime's
// cudaGetDriverEntryPoint, on every call: several microseconds per launch.
// This header points CUTLASS's call macro (CUTLASS_CUDA_DRIVER_WRAPPER_CALL,
// which CuTe's make_tma_copy uses too) at entry points looked up once. The
// library still reaches the driver only through the runtime's entry-point
// query: it links no libcuda, so the wheel needs nothing but the driver.
//
// Shared by the families that use TMA: the sm90 GEMM
// (gemm/sm90/gemm_sm90_launch.cuh) and the sm90 attention forward
// (attention/sm90/flash_fwd_sm90_launch.cuh). Include it before any CUTLASS
// or CuTe header: the macro is expanded where CUTLASS's headers are parsed.
#pragma once

#ifdef CUTLASS_CUDA_DRIVER_WRAPPER_CALL
#error "common/cutlass_driver.h must be included before any CUTLASS or CuTe header"
#endif

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <atomic>

namespace samattn::cutlass_driver {

// The driver's `name` at the ABI of CUDA 12.0, or nullptr. A failed lookup
// is not cached: it is tried again on the next call.
template <class Function>
Function driver_entry_point(const char* name, std::atomic<Function>& cache) {
  Function function = cache.load(std::memory_order_acquire);
  if (function != nullptr) return function;
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t status =
      cudaGetDriverEntryPointByVersion(name, &entry, 12000, cudaEnableDefault, &found);
#else
  const cudaError_t status = cudaGetDriverEntryPoint(name, &entry, cudaEnableDefault, &found);
#endif
  if (status != cudaSuccess || found != cudaDriverEntryPointSuccess) return nullptr;
  function = reinterpret_cast<Function>(entry);
  cache.store(function, std::memory_order_release);
  return function;
}

// What CUTLASS_CUDA_DRIVER_WRAPPER_CALL(func) names below: one per driver
// function that the CUTLASS and CuTe headers of the sm90 GEMM and attention
// call (a header calling another one fails to compile, naming it).
template <class... Args>
CUresult cached_cuTensorMapEncodeTiled(Args... args) {
  static std::atomic<PFN_cuTensorMapEncodeTiled_v12000> cache{nullptr};
  const auto function = driver_entry_point("cuTensorMapEncodeTiled", cache);
  return function != nullptr ? function(args...) : CUDA_ERROR_NOT_FOUND;
}

}  // namespace samattn::cutlass_driver

#include <cutlass/cuda_host_adapter.hpp>

#undef CUTLASS_CUDA_DRIVER_WRAPPER_CALL
#define CUTLASS_CUDA_DRIVER_WRAPPER_CALL(func) ::samattn::cutlass_driver::cached_##func
