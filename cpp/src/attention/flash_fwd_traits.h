// CuTe types of one forward configuration (FlashFwdConfig): MMA, shared-
// memory layouts and copy atoms. A family is a change of MmaAtomOf and of
// kAsyncCopy; the kernel reads everything else from here.
#pragma once

// cute/tensor.hpp first: the atom headers are not self-contained.
#include <cute/tensor.hpp>
// clang-format off
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
// clang-format on

#include <type_traits>

#include "attention/flash_fwd_config.h"
#include "common/tensor_core_types.cuh"

namespace samattn::attention {

using tensor_core::ElementOf;
using tensor_core::MmaAtomOf;

template <class Config>
struct FlashFwdTraits;

template <DType T, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, bool kQInRegs_, Family F,
          int kKVStages_, bool kKVCache_, bool kFp8Cache_>
struct FlashFwdTraits<FlashFwdConfig<T, kHeadDim_, kBlockM_, kBlockN_, kWarps_, kQInRegs_, F,
                                     kKVStages_, kKVCache_, kFp8Cache_>> {
  using Config = FlashFwdConfig<T, kHeadDim_, kBlockM_, kBlockN_, kWarps_, kQInRegs_, F, kKVStages_,
                                kKVCache_, kFp8Cache_>;
  using Element = typename ElementOf<T>::type;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr bool kQInRegs = kQInRegs_;
  static constexpr bool kAsyncCopy = F != Family::sm75;
  static constexpr int kKVStages = kKVStages_;
  static constexpr bool kKVCache = kKVCache_;
  static constexpr bool kFp8Cache = kFp8Cache_;

  static_assert(kBlockM % (16 * kWarps) == 0, "each warp owns whole 16-row slices");
  static_assert(kBlockN % 16 == 0 && kHeadDim % 32 == 0, "MMA k-steps of 16, swizzle atoms of 32");

  // Warps split the query rows only, so that a row's softmax statistics stay
  // inside one warp (a quad of lanes). The 16-wide N tile lets one
  // ldmatrix.x4 load a B fragment of two n8 atoms.
  using MmaAtom = typename MmaAtomOf<F, T>::type;
  using TiledMma = decltype(cute::make_tiled_mma(
      MmaAtom{}, cute::Layout<cute::Shape<cute::Int<kWarps>, cute::_1, cute::_1>>{},
      cute::Tile<cute::Int<16 * kWarps>, cute::_16, cute::_16>{}));

  // Shared tiles are row-major (row, head dim) in 8-row swizzled atoms of 128
  // bytes (or 64 when the head dim is not a multiple of 64), so that 16-byte
  // cp.async writes and ldmatrix reads hit distinct banks.
  static constexpr int kAtomCols = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzleBits = kAtomCols == 64 ? 3 : 2;
  using SmemAtom =
      decltype(cute::composition(cute::Swizzle<kSwizzleBits, 3, 3>{},
                                 cute::Layout<cute::Shape<cute::_8, cute::Int<kAtomCols>>,
                                              cute::Stride<cute::Int<kAtomCols>, cute::_1>>{}));
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));
  // K and V: kKVStages tiles each, (key, head dim, stage).
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>, cute::Int<kKVStages>>{}));
  // V as the (head dim, key, stage) B operand of P V: the same bytes, transposed view.
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{},
      cute::make_layout(
          cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>, cute::Int<kKVStages>>{},
          cute::Stride<cute::Int<kBlockN>, cute::_1, cute::Int<kBlockN * kHeadDim>>{})));
  using SmemLayoutVtNoSwizzle = decltype(cute::get_nonswizzle_portion(SmemLayoutVt{}));

  static constexpr int kSmemElements =
      cute::cosize_v<SmemLayoutQ> + 2 * cute::cosize_v<SmemLayoutKV>;
  static constexpr int kSmemBytes = kSmemElements * int(sizeof(Element));
  static_assert(kSmemBytes == Config::kSmemBytes, "config and traits disagree on shared memory");

  // Shared -> registers: ldmatrix for Q and K (K-major operands) and
  // ldmatrix.trans for V; registers -> shared for O: paired 32-bit stores.
  using SmemCopyAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomO = cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<32>, Element>;

  // Global <-> shared: 16-byte vectors, a row of an atom per kAtomCols / 8
  // threads; cp.async with zero fill on sm80.
  static constexpr int kVector = 8;
  static constexpr int kThreadsPerRow = kAtomCols / kVector;
  using GmemThreads =
      cute::Layout<cute::Shape<cute::Int<kThreads / kThreadsPerRow>, cute::Int<kThreadsPerRow>>,
                   cute::Stride<cute::Int<kThreadsPerRow>, cute::_1>>;
  using GmemLoadOp =
      std::conditional_t<kAsyncCopy, cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>,
                         cute::UniversalCopy<cute::uint128_t>>;
  using GmemTiledCopyLoad =
      decltype(cute::make_tiled_copy(cute::Copy_Atom<GmemLoadOp, Element>{}, GmemThreads{},
                                     cute::Layout<cute::Shape<cute::_1, cute::Int<kVector>>>{}));
  using GmemTiledCopyStore = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::UniversalCopy<cute::uint128_t>, Element>{}, GmemThreads{},
      cute::Layout<cute::Shape<cute::_1, cute::Int<kVector>>>{}));
};

}  // namespace samattn::attention
