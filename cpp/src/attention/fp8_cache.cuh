// FP8 KV caches (attention_problem.h, Fp8CacheView) in the kvcache kernel: a
// tile of fp8 rows lands by cp.async in the upper half of its 16-bit shared
// stage and is widened there, in place, into the swizzled tile the MMAs read;
// the scales multiply the scores (k) and the output (v). The append's
// quantization of new keys and values is quantize_fp8.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cutlass/numeric_types.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attention/fp8_bits.h"

namespace samattn::attention {

// Two half bits as two Elements (fp16: as they are; bf16: exactly, every fp8
// value being a bf16 value).
template <class Element>
__device__ inline uint32_t half2_bits_to(uint32_t h) {
  if constexpr (std::is_same_v<Element, cutlass::half_t>) {
    return h;
  } else {
    __half2 pair;
    static_assert(sizeof(pair) == sizeof(h));
    memcpy(&pair, &h, sizeof(h));
    const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(pair));
    uint32_t out;
    memcpy(&out, &b, sizeof(out));
    return out;
  }
}

// Sixteen fp8 values -> sixteen Elements (two 16-byte vectors, in order).
template <class Element>
__device__ inline void widen_fp8x16(uint4 raw, int kind, uint4& lo, uint4& hi) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t out[8];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    out[2 * w] = half2_bits_to<Element>(fp8x2_to_half2_bits(words[w], kind));
    out[2 * w + 1] = half2_bits_to<Element>(fp8x2_to_half2_bits(words[w] >> 16, kind));
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

// cp.async of one 16-byte vector, zero-filled where !valid (src is then not
// read, but must be a global address).
__device__ inline void cp_async_16(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem),
               "r"(valid ? 16 : 0));
}

// The fp8 tile of a K or V stage: kRows rows of kHeadDim bytes, row-major,
// in the upper half of the stage's 16-bit buffer (`stage16`, kRows x kHeadDim
// Elements). Thread t moves 16-byte vectors t, t + kThreads, ...
template <int kRows, int kHeadDim, int kThreads>
struct Fp8Tile {
  static constexpr int kRowVectors = kHeadDim / 16;
  static constexpr int kPerThread = kRows * kRowVectors / kThreads;
  static_assert(kRows * kRowVectors % kThreads == 0, "whole vectors per thread");

  template <class Element>
  __device__ static uint8_t* raw(Element* stage16) {
    return reinterpret_cast<uint8_t*>(stage16) + kRows * kHeadDim;
  }

  // Starts the loads of the tile's rows: row r < rows_left from row_ptr(r)
  // (the row's first byte), columns below headdim; the rest zero-filled.
  template <class Element, class RowPtr>
  __device__ static void load(Element* stage16, RowPtr const& row_ptr, int rows_left, int headdim) {
    uint8_t* dst = raw(stage16);
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int v = int(threadIdx.x) + i * kThreads;
      const int row = v / kRowVectors, col = v % kRowVectors * 16;
      const bool valid = row < rows_left && col < headdim;
      const uint8_t* src = row_ptr(valid ? row : 0) + (valid ? col : 0);
      cp_async_16(dst + v * 16, src, valid);
    }
  }

  // Widens the landed tile into `s` (the stage as a (row, column) tensor of
  // Elements). Every thread of the CTA takes part: two barriers, one before
  // the widened rows overwrite fp8 bytes that other threads read, one before
  // the MMAs read them.
  template <class Element, class STile>
  __device__ static void widen(Element* stage16, STile&& s, int kind) {
    const uint4* src = reinterpret_cast<const uint4*>(raw(stage16));
    uint4 bytes[kPerThread];
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) bytes[i] = src[int(threadIdx.x) + i * kThreads];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int v = int(threadIdx.x) + i * kThreads;
      const int row = v / kRowVectors, col = v % kRowVectors * 16;
      uint4 lo, hi;
      widen_fp8x16<Element>(bytes[i], kind, lo, hi);
      // 8-element groups are contiguous in the swizzled tile.
      *reinterpret_cast<uint4*>(&s(row, col)) = lo;
      *reinterpret_cast<uint4*>(&s(row, col + 8)) = hi;
    }
    __syncthreads();
  }
};

// The fp8 value nearest y / scale (IEEE division), saturated to the largest
// finite value; NaN stays NaN.
__device__ inline uint8_t quantize_fp8(float y, float scale, int kind) {
  const float x = __fdiv_rn(y, scale);
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(x, __NV_SATFINITE, kind == kFp8E4M3 ? __NV_E4M3 : __NV_E5M2));
}

}  // namespace samattn::attention
