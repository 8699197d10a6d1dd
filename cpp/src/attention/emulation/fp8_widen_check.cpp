// Checks fp8x2_to_half2_bits's shift path (GPUs before sm89; fp8_bits.h) on
// every pair of bytes, both formats: each widened half times
// fp8_widen_factor is the fp8 value exactly, NaN stays NaN, and the second
// value of a pair comes out in the high half. Built with g++ and run by
// tests/cpu/test_host_emulation.py; prints "all passed".
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>

#include "attention/fp8_bits.h"

namespace {

using samattn::attention::fp8_widen_factor;
using samattn::attention::fp8x2_to_half2_bits;
using samattn::attention::kFp8E4M3;
using samattn::attention::kFp8E5M2;

// An IEEE half's value from its bits.
double half_value(uint32_t bits) {
  const int sign = (bits >> 15) & 1, exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  double magnitude;
  if (exponent == 0x1f) {
    magnitude = mantissa != 0 ? NAN : INFINITY;
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -24);
  } else {
    magnitude = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

// An fp8 value from its byte, by the formats' definitions: e4m3 (OCP
// float8_e4m3fn: bias 7, no infinity, S.1111.111 NaN), e5m2 (IEEE-like, bias
// 15).
double fp8_value(uint32_t byte, int kind) {
  const int sign = (byte >> 7) & 1;
  double magnitude;
  if (kind == kFp8E4M3) {
    const int exponent = (byte >> 3) & 0xf, mantissa = byte & 0x7;
    if (exponent == 0xf && mantissa == 0x7) {
      magnitude = NAN;
    } else if (exponent == 0) {
      magnitude = std::ldexp(mantissa, -9);
    } else {
      magnitude = std::ldexp(8 + mantissa, exponent - 10);
    }
  } else {
    const int exponent = (byte >> 2) & 0x1f, mantissa = byte & 0x3;
    if (exponent == 0x1f) {
      magnitude = mantissa != 0 ? NAN : INFINITY;
    } else if (exponent == 0) {
      magnitude = std::ldexp(mantissa, -16);
    } else {
      magnitude = std::ldexp(4 + mantissa, exponent - 17);
    }
  }
  return sign ? -magnitude : magnitude;
}

}  // namespace

int main() {
  int failures = 0;
  for (int kind : {kFp8E4M3, kFp8E5M2}) {
    const double factor = fp8_widen_factor(kind);
    for (uint32_t pair = 0; pair < 0x10000u; ++pair) {
      const uint32_t h = fp8x2_to_half2_bits(pair, kind);
      const uint32_t bytes[2] = {pair & 0xffu, pair >> 8};
      const uint32_t halves[2] = {h & 0xffffu, h >> 16};
      for (int i = 0; i < 2; ++i) {
        const double want = fp8_value(bytes[i], kind);
        const double got = half_value(halves[i]) * factor;
        const bool same = std::isnan(want) ? std::isnan(got) : got == want;
        if (!same && ++failures <= 10) {
          std::printf("kind %d byte 0x%02x: half 0x%04x x %g = %g, want %g\n", kind, bytes[i],
                      halves[i], factor, got, want);
        }
      }
    }
  }
  if (failures != 0) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("all passed\n");
  return 0;
}
