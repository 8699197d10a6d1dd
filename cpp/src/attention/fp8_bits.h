// Two fp8 values widened to the bits of a half2 (fp8_cache.cuh), host and
// device: GPUs from sm89 convert them in one instruction; before, bit shifts
// do, which the CPU test (emulation/fp8_widen_check.cpp) checks for every
// byte pair, since no GPU here runs that path.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SAMATTN_HOST_DEVICE __host__ __device__
#else
#define SAMATTN_HOST_DEVICE
#endif

namespace samattn::attention {

constexpr int kFp8E4M3 = 4;  // SAMATTN_F8_E4M3, Fp8Kind::e4m3
constexpr int kFp8E5M2 = 5;  // SAMATTN_F8_E5M2, Fp8Kind::e5m2

// The low 16 bits of `pair` (the first value in the low byte) as a half2's
// bits, times fp8_widen_factor's inverse. Without the instruction, e5m2 is
// the top byte of a half, and an e4m3 value shifted into a half's exponent
// and mantissa is itself times 2^-8, exactly (subnormals included), which
// the scales undo; its NaN (0x7f) becomes half's.
SAMATTN_HOST_DEVICE inline uint32_t fp8x2_to_half2_bits(uint32_t pair, int kind) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h;
  const uint16_t two = static_cast<uint16_t>(pair);
  if (kind == kFp8E4M3) {
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(two));
  } else {
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h) : "h"(two));
  }
  return h;
#else
  if (kind != kFp8E4M3) return ((pair & 0xffu) << 8) | ((pair & 0xff00u) << 16);
  uint32_t h = ((pair & 0x7fu) << 7) | ((pair & 0x80u) << 8) | ((pair & 0x7f00u) << 15) |
               ((pair & 0x8000u) << 16);
  if ((pair & 0x7fu) == 0x7fu) h |= 0x7fffu;
  if ((pair & 0x7f00u) == 0x7f00u) h |= 0x7fff0000u;
  return h;
#endif
}

// What a widened value must be multiplied by to be the fp8 value it came
// from (folded into the scales).
SAMATTN_HOST_DEVICE inline float fp8_widen_factor(int kind) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return 1.0f;
#else
  return kind == kFp8E4M3 ? 256.0f : 1.0f;
#endif
}

}  // namespace samattn::attention
