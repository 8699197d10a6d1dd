// Kernel traits of the tensor-core GEMM: one per instantiation tag
// TensorCoreGemm<DType, Major A, Major B, Vectorized, Family>.
//
// What varies:
//   family  sm80: mma.sync m16n8k16 (fp16/bf16) or m16n8k8 (tf32), cp.async
//           sm75: mma.sync m16n8k8 (fp16), plain synchronous loads
//   dtype   16-bit elements or tf32 (32-bit); sets BK and the swizzles
//   majors  K-major operands use ldmatrix, MN-major ones ldmatrix.trans
//           (16-bit) or scalar shared loads (tf32)
//   vector  16-byte global loads, or element-wise loads for any strides
#pragma once

#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>

#include "common/tensor_core_types.cuh"
#include "gemm/gemm_config.h"

namespace samattn::gemm {

using tensor_core::ElementOf;
using tensor_core::MmaAtomOf;

// Shape and resources of one configuration.
template <Family F, DType T>
struct TileShape {
  // 128 x 256 tiles, 8 warps of 64 x 64: about 100 KB of shared memory over
  // 4 stages, within every sm80-family GPU's limit (99 KB on 8.6/8.9).
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 256;
  static constexpr int kBlockK = sizeof(typename ElementOf<T>::type) == 2 ? 32 : 16;
  static constexpr int kStages = 4;
  static constexpr int kWarpsM = 2;
  static constexpr int kWarpsN = 4;
};
template <DType T>
struct TileShape<Family::sm75, T> {
  // Turing: 64 KB of shared memory per block and no cp.async: three stages
  // (48 KB) of 128 x 128 tiles.
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 128;
  static constexpr int kBlockK = 32;
  static constexpr int kStages = 3;
  static constexpr int kWarpsM = 2;
  static constexpr int kWarpsN = 2;
};

// Shared-memory layout, global->shared copy and shared->register atom of one
// operand of extent kRows x kBlockK (rows are M for A, N for B).
template <class Element, Major kMajor, bool kVectorized, bool kAsync, int kRows, int kBlockK,
          int kStages, int kThreads, bool kTransposedLdsm = true>
struct OperandTraits {
  static constexpr int kBits = cute::sizeof_bits_v<Element>;
  static constexpr int kVector = 128 / kBits;  // elements per 16-byte access
  // Element-wise loads land in a K-major tile whatever the source strides.
  static constexpr bool kKMajorSmem = kMajor == Major::K || !kVectorized;

  // Swizzled atoms so that ldmatrix and 16-byte stores are conflict-free:
  // K-major: 8 rows of kBlockK elements; MN-major: 8 columns of 64 (16-bit)
  // or 32 (tf32) rows.
  static auto smem_atom() {
    using namespace cute;
    if constexpr (kKMajorSmem) {
      constexpr int kRowBytes = kBlockK * kBits / 8;  // 64 B for 16-bit, 64 B for tf32
      static_assert(kRowBytes == 64, "swizzle assumes 64-byte K-major rows");
      constexpr int kSwizzleShift = kBits == 16 ? 3 : 2;
      return composition(Swizzle<2, kSwizzleShift, 3>{},
                         Layout<Shape<_8, Int<kBlockK>>, Stride<Int<kBlockK>, _1>>{});
    } else {
      constexpr int kAtomRows = 1024 / kBits;  // 128 bytes along the contiguous mode
      constexpr int kSwizzleShift = kBits == 16 ? 3 : 2;
      return composition(Swizzle<3, kSwizzleShift, 3>{},
                         Layout<Shape<Int<kAtomRows>, _8>, Stride<_1, Int<kAtomRows>>>{});
    }
  }
  using SmemLayout = decltype(cute::tile_to_shape(
      smem_atom(),
      cute::make_shape(cute::Int<kRows>{}, cute::Int<kBlockK>{}, cute::Int<kStages>{})));

  static auto gmem_copy() {
    using namespace cute;
    if constexpr (!kVectorized) {
      // One element per thread per step, threads along K.
      constexpr int kThreadsK = kBlockK;
      return make_tiled_copy(
          Copy_Atom<UniversalCopy<Element>, Element>{},
          Layout<Shape<Int<kThreads / kThreadsK>, Int<kThreadsK>>, Stride<Int<kThreadsK>, _1>>{},
          Layout<Shape<_1, _1>>{});
    } else {
      using Op = std::conditional_t<kAsync, SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>,
                                    UniversalCopy<uint128_t>>;
      if constexpr (kMajor == Major::K) {
        constexpr int kThreadsK = kBlockK / kVector;
        return make_tiled_copy(
            Copy_Atom<Op, Element>{},
            Layout<Shape<Int<kThreads / kThreadsK>, Int<kThreadsK>>, Stride<Int<kThreadsK>, _1>>{},
            Layout<Shape<_1, Int<kVector>>>{});
      } else {
        constexpr int kThreadsRows = kRows / kVector < kThreads ? kRows / kVector : kThreads;
        return make_tiled_copy(Copy_Atom<Op, Element>{},
                               Layout<Shape<Int<kThreadsRows>, Int<kThreads / kThreadsRows>>,
                                      Stride<_1, Int<kThreadsRows>>>{},
                               Layout<Shape<Int<kVector>, _1>>{});
      }
    }
  }
  using GmemCopy = decltype(gmem_copy());

  static auto smem_copy_atom() {
    using namespace cute;
    if constexpr (kKMajorSmem) {
      return Copy_Atom<SM75_U32x4_LDSM_N, Element>{};
    } else if constexpr (kBits == 16 && kTransposedLdsm) {
      return Copy_Atom<SM75_U16x8_LDSM_T, Element>{};
    } else {
      return Copy_Atom<UniversalCopy<Element>, Element>{};  // no transposing ldmatrix for tf32
    }
  }
  using SmemCopyAtom = decltype(smem_copy_atom());

  // Global strides of the (rows, K) operand view: static 1 on the contiguous
  // mode when vectorized, so CuTe proves 16-byte accesses.
  CUTE_HOST_DEVICE static auto stride(int64_t rows_stride, int64_t k_stride) {
    using namespace cute;
    if constexpr (!kVectorized) {
      return make_stride(rows_stride, k_stride);
    } else if constexpr (kMajor == Major::K) {
      return make_stride(rows_stride, _1{});
    } else {
      return make_stride(_1{}, k_stride);
    }
  }
};

template <class Config>
struct TensorCoreTraits;

template <DType T, Major kMajorA, Major kMajorB, bool kVec, Family F>
struct TensorCoreTraits<TensorCoreGemm<T, kMajorA, kMajorB, kVec, F>> : TileShape<F, T> {
  using Shape = TileShape<F, T>;
  using Element = typename ElementOf<T>::type;
  using Output = typename ElementOf<T>::output;
  static constexpr bool kVectorized = kVec;
  static constexpr bool kAsyncCopy = F == Family::sm80;
  static constexpr int kThreads = 32 * Shape::kWarpsM * Shape::kWarpsN;

  using OperandA = OperandTraits<Element, kMajorA, kVec, kAsyncCopy, Shape::kBlockM, Shape::kBlockK,
                                 Shape::kStages, kThreads>;
  using OperandB = OperandTraits<Element, kMajorB, kVec, kAsyncCopy, Shape::kBlockN, Shape::kBlockK,
                                 Shape::kStages, kThreads>;
  using SmemLayoutA = typename OperandA::SmemLayout;
  using SmemLayoutB = typename OperandB::SmemLayout;
  using GmemCopyA = typename OperandA::GmemCopy;
  using GmemCopyB = typename OperandB::GmemCopy;
  using SmemCopyAtomA = typename OperandA::SmemCopyAtom;
  using SmemCopyAtomB = typename OperandB::SmemCopyAtom;

  // Warps tile M x N; each warp step covers 16 x 16 of (M,N) and two K
  // slices so that one ldmatrix.x4 feeds a whole step.
  using MmaAtom = typename MmaAtomOf<F, T>::type;
  static constexpr int kMmaK = cute::size<2>(typename cute::MMA_Traits<MmaAtom>::Shape_MNK{});
  using TiledMma = decltype(cute::make_tiled_mma(
      MmaAtom{},
      cute::Layout<cute::Shape<cute::Int<Shape::kWarpsM>, cute::Int<Shape::kWarpsN>, cute::_1>>{},
      cute::Tile<cute::Int<16 * Shape::kWarpsM>, cute::Int<16 * Shape::kWarpsN>,
                 cute::Int<Shape::kBlockK / 2>>{}));

  static constexpr int kSmemBytes =
      (cute::cosize_v<SmemLayoutA> + cute::cosize_v<SmemLayoutB>)*sizeof(Element);

  CUTE_HOST_DEVICE static auto stride_a(int64_t m_stride, int64_t k_stride) {
    return OperandA::stride(m_stride, k_stride);
  }
  CUTE_HOST_DEVICE static auto stride_b(int64_t n_stride, int64_t k_stride) {
    return OperandB::stride(n_stride, k_stride);
  }
};

}  // namespace samattn::gemm
