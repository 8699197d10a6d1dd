// Host emulation of the CUDA constructs the softmax kernels use, for
// check_softmax.cpp (see run.py): each thread of a CTA is a std::thread,
// __syncthreads and warp shuffles are std::barriers, CTAs run one at a time.
// Not part of the library build.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#undef __shared__
#define __shared__ static  // one instance per kernel instantiation, shared by the CTA
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __host__
#define __host__
#undef __forceinline__
#define __forceinline__ inline

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

struct EmuCta {
  std::barrier<> cta;
  std::vector<std::unique_ptr<std::barrier<>>> warp;
  std::vector<std::array<uint32_t, 32>> lanes;
  std::vector<uint4> dynamic_smem;
  EmuCta(int threads, size_t smem_bytes)
      : cta(threads), lanes((threads + 31) / 32), dynamic_smem(smem_bytes / 16 + 1) {
    for (int w = 0; w < (threads + 31) / 32; ++w) {
      warp.emplace_back(new std::barrier<>(std::min(32, threads - 32 * w)));
    }
  }
};
inline EmuCta* g_cta = nullptr;
// Grids are cut to this many CTAs: the kernels' grid-stride loops do the rest.
inline unsigned g_emu_max_grid = 3;

inline uint4* emu_dynamic_smem() { return g_cta->dynamic_smem.data(); }
inline void __syncthreads() { g_cta->cta.arrive_and_wait(); }
inline float __uint_as_float(uint32_t u) { return std::bit_cast<float>(u); }
inline uint32_t __float_as_uint(float f) { return std::bit_cast<uint32_t>(f); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  g_cta->lanes[w][lane] = std::bit_cast<uint32_t>(v);
  g_cta->warp[w]->arrive_and_wait();
  const float r = std::bit_cast<float>(g_cta->lanes[w][lane ^ lane_mask]);
  g_cta->warp[w]->arrive_and_wait();
  return r;
}
template <class A>
inline A min(A a, A b) {
  return b < a ? b : a;
}
template <class A>
inline A max(A a, A b) {
  return a < b ? b : a;
}

// ex2.approx stand-in: exp2 times (1 + e) with |e| <= 2^-22 (PTX's bound),
// exact at 0.
inline float emu_ex2(float x) {
  const float y = std::exp2(x);
  if (x == 0.f || !std::isfinite(y) || y == 0.f) return y;
  const uint32_t h = std::bit_cast<uint32_t>(x) * 2654435761u;
  const double e = ((h >> 8) / double(1 << 24) * 2.0 - 1.0) * std::ldexp(1.0, -22);
  return float(double(y) * (1.0 + e));
}

template <class F>
cudaError_t cudaFuncSetAttribute(F*, cudaFuncAttribute, int) {
  return cudaSuccess;
}

struct EmuLaunch {
  unsigned grid;
  int block;
  size_t smem;
};
inline std::vector<EmuLaunch> g_launches;

template <class Kernel, class... Args>
void emu_launch(Kernel kernel, unsigned grid, int block, size_t smem, cudaStream_t, Args... args) {
  g_launches.push_back({grid, block, smem});
  const unsigned g = std::min(grid, g_emu_max_grid);
  for (unsigned b = 0; b < g; ++b) {
    EmuCta cta(block, smem);
    g_cta = &cta;
    std::vector<std::thread> threads;
    threads.reserve(block);
    for (int t = 0; t < block; ++t) {
      threads.emplace_back([&, t] {
        threadIdx = {static_cast<unsigned>(t), 0, 0};
        blockIdx = {b, 0, 0};
        blockDim = dim3(block);
        gridDim = dim3(g);
        kernel(args...);
      });
    }
    for (auto& t : threads) t.join();
  }
}
