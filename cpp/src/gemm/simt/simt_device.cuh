// The few device operations the SIMT GEMM kernel body needs: block barrier,
// cp.async, global loads/stores and an exact FMA.
//
// The kernel body (gemm_simt_kernel.cuh) also compiles as plain host C++ so
// that it can be checked without a GPU: with SAMATTN_SIMT_EMULATION defined,
// these operations forward to the CPU emulator in emulation/, which runs
// every CUDA thread of a block as a host thread, delays cp.async writes until
// the matching wait and bounds-checks every global access.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define SAMATTN_SIMT_DEVICE __device__ __forceinline__
#define SAMATTN_SIMT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SAMATTN_SIMT_DEVICE inline
#define SAMATTN_SIMT_HOST_DEVICE inline
#endif

namespace samattn::gemm::simt {

#if defined(SAMATTN_SIMT_EMULATION) && !defined(__CUDACC__)
namespace emulation {
void block_sync();
void cp_async(void* smem, const void* gmem, int bytes, bool pred);
void cp_async_commit();
void cp_async_wait(int pending_groups);
void check_global_access(const void* ptr, int bytes, bool write);
}  // namespace emulation
#endif

SAMATTN_SIMT_DEVICE void block_sync() {
#if defined(__CUDA_ARCH__)
  __syncthreads();
#elif defined(SAMATTN_SIMT_EMULATION)
  emulation::block_sync();
#endif
}

// Asynchronous global -> shared copy of 4 or 16 bytes (sm_80+). With pred
// false it writes zeros and reads nothing; gmem must still be a valid address.
template <int Bytes>
SAMATTN_SIMT_DEVICE void cp_async_zfill(void* smem, const void* gmem, bool pred) {
  static_assert(Bytes == 4 || Bytes == 16, "cp.async copies 4 or 16 bytes here");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int src_bytes = pred ? Bytes : 0;
  if constexpr (Bytes == 16) {
    // .cg: 16-byte copies may bypass L1; the tile is reused from shared memory.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem),
                 "r"(src_bytes));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr), "l"(gmem),
                 "r"(src_bytes));
  }
#elif defined(SAMATTN_SIMT_EMULATION) && !defined(__CUDACC__)
  emulation::cp_async(smem, gmem, Bytes, pred);
#endif
}

SAMATTN_SIMT_DEVICE void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#elif defined(SAMATTN_SIMT_EMULATION) && !defined(__CUDACC__)
  emulation::cp_async_commit();
#endif
}

// Waits until at most PendingGroups committed groups of this thread are in flight.
template <int PendingGroups>
SAMATTN_SIMT_DEVICE void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PendingGroups));
#elif defined(SAMATTN_SIMT_EMULATION) && !defined(__CUDACC__)
  emulation::cp_async_wait(PendingGroups);
#endif
}

// Plain global loads and stores of a scalar or an aligned vector type V.
template <class V>
SAMATTN_SIMT_DEVICE V load_global(const V* ptr) {
#if defined(SAMATTN_SIMT_EMULATION) && !defined(__CUDACC__)
  emulation::check_global_access(ptr, sizeof(V), /*write=*/false);
#endif
  return *ptr;
}

template <class V>
SAMATTN_SIMT_DEVICE void store_global(V* ptr, const V& value) {
#if defined(SAMATTN_SIMT_EMULATION) && !defined(__CUDACC__)
  emulation::check_global_access(ptr, sizeof(V), /*write=*/true);
#endif
  *ptr = value;
}

// a * b + c rounded once, never flushing denormals: the library is built with
// --use_fast_math (which implies -ftz=true), and exact fp32 GEMM must match
// cuBLAS SGEMM.
SAMATTN_SIMT_HOST_DEVICE float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  float d;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
#else
  return std::fma(a, b, c);
#endif
}

}  // namespace samattn::gemm::simt
