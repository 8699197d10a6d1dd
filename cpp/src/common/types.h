// The element types and kernel families every op shares (docs/design.md section
// 2). Device-safe constexpr only, so that kernels, tile tables and the host
// layer all name the same Family and DType.
#pragma once

#include <cstdint>

namespace samattn {

// Values of SAMATTN_F16 / _BF16 / _F32.
enum class DType : int32_t { f16 = 0, bf16 = 1, f32 = 2 };

// A kernel family: the instruction set its translation units are compiled
// for. The value is the SAMATTN_FAMILY_* code. Each family's code is a
// template argument of its kernels, so that two families never emit the same
// symbol (each copy must stay bound to its own fatbin).
enum class Family : int32_t { sm75 = 75, sm80 = 80, sm90 = 90 };

// Newest first: the order in which automatic selection tries them.
inline constexpr Family kFamiliesNewestFirst[] = {Family::sm90, Family::sm80, Family::sm75};

constexpr const char* family_name(Family family) {
  return family == Family::sm75 ? "sm75" : family == Family::sm80 ? "sm80" : "sm90";
}

// Bit of samattn_built_families().
constexpr int32_t family_bit(Family family) {
  return family == Family::sm75 ? 1 : family == Family::sm80 ? 2 : 4;
}

// sm75 code runs on Turing and newer; sm80 code on Ampere and newer (newer
// than the wheel through its PTX); sm90a code only on compute capability 9.0.
constexpr bool family_runs_on(Family family, int cc_major, int cc_minor) {
  return family == Family::sm75   ? cc_major * 10 + cc_minor >= 75
         : family == Family::sm80 ? cc_major >= 8
                                  : cc_major == 9 && cc_minor == 0;
}

constexpr const char* family_requirement(Family family) {
  return family == Family::sm75   ? "compute capability 7.5 or newer"
         : family == Family::sm80 ? "compute capability 8.0 or newer"
                                  : "compute capability 9.0 exactly (Hopper; its code is sm_90a)";
}

}  // namespace samattn
