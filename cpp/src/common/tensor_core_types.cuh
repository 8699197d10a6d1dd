// CuTe element types and mma.sync atoms per kernel family and dtype, shared
// by the kernels that run on mma.sync (the tensor-core GEMM and attention);
// the sm90 attention (wgmma) takes its element types from here too.
#pragma once

#include <cute/tensor.hpp>
// clang-format off
#include <cute/atom/mma_atom.hpp>
// clang-format on

#include "common/types.h"

namespace samattn::tensor_core {

using Family = ::samattn::Family;

// Operand type of the MMA and the output type. DType::f32 means tf32 operands.
template <DType T>
struct ElementOf;
template <>
struct ElementOf<DType::f16> {
  using type = cute::half_t;
  using output = cute::half_t;
};
template <>
struct ElementOf<DType::bf16> {
  using type = cute::bfloat16_t;
  using output = cute::bfloat16_t;
};
template <>
struct ElementOf<DType::f32> {
  using type = cute::tfloat32_t;  // fp32 bits; the MMA reads them as tf32
  using output = float;
};

// The mma.sync atom per family and element type.
template <Family F, DType T>
struct MmaAtomOf;
template <>
struct MmaAtomOf<Family::sm80, DType::f16> {
  using type = cute::SM80_16x8x16_F32F16F16F32_TN;
};
template <>
struct MmaAtomOf<Family::sm80, DType::bf16> {
  using type = cute::SM80_16x8x16_F32BF16BF16F32_TN;
};
template <>
struct MmaAtomOf<Family::sm80, DType::f32> {
  using type = cute::SM80_16x8x8_F32TF32TF32F32_TN;
};
// The sm90 family's mma.sync kernels (the attention kvcache kernel) use
// Ampere's atoms, which Hopper runs as they are.
template <DType T>
struct MmaAtomOf<Family::sm90, T> : MmaAtomOf<Family::sm80, T> {};
template <>
struct MmaAtomOf<Family::sm75, DType::f16> {
  using type = cute::SM75_16x8x8_F32F16F16F32_TN;
};

}  // namespace samattn::tensor_core
