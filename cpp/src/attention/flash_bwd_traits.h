// CuTe types of one backward configuration (FlashBwdConfig): three tiled
// MMAs, shared-memory layouts and their transposed views, copy atoms.
#pragma once

#include <type_traits>

#include "attention/flash_bwd_config.h"
#include "attention/flash_fwd_traits.h"

namespace samattn::attention {

// Warps over an (M, N) MMA tile, 16 x unit_n per warp and tile repeat
// (unit_n / 8 n8 atoms; 16: one ldmatrix.x4 loads a B fragment; see
// WarpTiledMma for which columns). The split minimizes a warp's M + N extent:
// the A and B fragments it loads per k-step, which the loads of the next
// k-step keep live next to the accumulators.
constexpr int balanced_warps_m(int warps, int extent_m, int extent_n, int unit_n = 16) {
  int best = 0, best_cost = 1 << 30;
  for (int wm = 1; wm <= warps; wm *= 2) {
    const int wn = warps / wm;
    if (extent_m % (16 * wm) != 0 || extent_n % (unit_n * wn) != 0) continue;
    const int cost = extent_m / wm + extent_n / wn;
    if (cost <= best_cost) best = wm, best_cost = cost;  // ties: more warps along M
  }
  return best;
}

// kWholeBlocks permutes N so that each warp takes kUnitN / 8 adjacent n8
// atoms (warp n of a kUnitN * kWarpsN tile takes columns kUnitN n .. +
// kUnitN - 1): its S tile is then whole 16 x 32 blocks as dropout's random
// bytes are laid out (dropout.cuh), or, where the warps outnumber the
// tile's 16 x 32 blocks, whole 16 x 16 halves of them. Otherwise warp n
// takes columns 8n .. 8n + 7 and 8 (kWarpsN + n) .. + 7 of each 16 * kWarpsN
// tile.
template <class MmaAtom, int kWarps, int kExtentM, int kExtentN, bool kWholeBlocks = false>
struct WarpTiledMma {
  static constexpr int kUnitN =
      kWholeBlocks && balanced_warps_m(kWarps, kExtentM, kExtentN, 32) > 0 ? 32 : 16;
  static constexpr int kWarpsM = balanced_warps_m(kWarps, kExtentM, kExtentN, kUnitN);
  static_assert(kWarpsM > 0, "the warps cannot tile this MMA extent in 16 x 16 blocks");
  static constexpr int kWarpsN = kWarps / kWarpsM;
  using BlocksN = cute::Layout<cute::Shape<cute::_8, cute::Int<kWarpsN>, cute::Int<kUnitN / 8>>,
                               cute::Stride<cute::_1, cute::Int<kUnitN>, cute::_8>>;
  using TileN = std::conditional_t<kWholeBlocks, BlocksN, cute::Int<16 * kWarpsN>>;
  using type = decltype(cute::make_tiled_mma(
      MmaAtom{}, cute::Layout<cute::Shape<cute::Int<kWarpsM>, cute::Int<kWarpsN>, cute::_1>>{},
      cute::Tile<cute::Int<16 * kWarpsM>, TileN, cute::_16>{}));
};

// (rows, cols) row-major tile of 16-bit elements in 8-row swizzled atoms of
// 128 bytes (64 when cols is not a multiple of 64), and its (cols, rows)
// transposed view over the same bytes, for ldmatrix.trans.
template <int kRows, int kCols>
struct SwizzledTile {
  static constexpr int kAtomCols = kCols % 64 == 0 ? 64 : 32;
  static_assert(kCols % kAtomCols == 0, "tile columns must be a multiple of 32");
  using Atom =
      decltype(cute::composition(cute::Swizzle<kAtomCols == 64 ? 3 : 2, 3, 3>{},
                                 cute::Layout<cute::Shape<cute::_8, cute::Int<kAtomCols>>,
                                              cute::Stride<cute::Int<kAtomCols>, cute::_1>>{}));
  using Layout =
      decltype(cute::tile_to_shape(Atom{}, cute::Shape<cute::Int<kRows>, cute::Int<kCols>>{}));
  using Transposed = decltype(cute::composition(
      Layout{},
      cute::make_layout(cute::Shape<cute::Int<kCols>, cute::Int<kRows>>{}, cute::GenRowMajor{})));
  using TransposedNoSwizzle = decltype(cute::get_nonswizzle_portion(Transposed{}));
};

template <class Config>
struct FlashBwdTraits;

template <DType T, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kQStages_, Family F>
struct FlashBwdTraits<FlashBwdConfig<T, kHeadDim_, kBlockM_, kBlockN_, kWarps_, kQStages_, F>> {
  using Config = FlashBwdConfig<T, kHeadDim_, kBlockM_, kBlockN_, kWarps_, kQStages_, F>;
  using Element = typename ElementOf<T>::type;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kQStages = kQStages_;
  static_assert(kQStages == 1 || kQStages == 2);
  static constexpr Family kFamily = F;
  static constexpr bool kAsyncCopy = F == Family::sm80;
  static_assert(kBlockM % 16 == 0 && kBlockN % 32 == 0 && kHeadDim % 32 == 0);

  // S = Q K^T and dP = dO V^T: (BM, BN) over the head dim.
  // dV += P^T dO and dK += dS^T Q: (BN, D) over BM.
  // dQ = dS K: (BM, D) over BN.
  // No row statistics cross lanes in the backward (P comes from the stored
  // LSE), so the warps may split both modes.
  using MmaAtom = typename MmaAtomOf<F, T>::type;
  using TiledMmaSdP = typename WarpTiledMma<MmaAtom, kWarps, kBlockM, kBlockN>::type;
  // The kernels with score terms, which run dropout: S in whole 16 x 32
  // blocks, or 16 x 16 halves of them (kDropoutCols wide per warp).
  using SdPBlocks = WarpTiledMma<MmaAtom, kWarps, kBlockM, kBlockN, true>;
  using TiledMmaSdPBlocks = typename SdPBlocks::type;
  static constexpr int kDropoutCols = SdPBlocks::kUnitN;
  using TiledMmaDKV = typename WarpTiledMma<MmaAtom, kWarps, kBlockN, kHeadDim>::type;
  // dQ of large head dims in two column slices (whole 64-column swizzle
  // atoms of K): its accumulator and fragments then fit next to dK and dV.
  static constexpr int kDQSplits = kHeadDim >= 192 && (kHeadDim / 2) % 64 == 0 &&
                                           balanced_warps_m(kWarps, kBlockM, kHeadDim / 2) > 0
                                       ? 2
                                       : 1;
  using TiledMmaDQ = typename WarpTiledMma<MmaAtom, kWarps, kBlockM, kHeadDim / kDQSplits>::type;

  using TileQ = SwizzledTile<kBlockM, kHeadDim>;   // Q, dO; transposed: B of dK, dV
  using TileKV = SwizzledTile<kBlockN, kHeadDim>;  // K, V; K transposed: B of dQ
  using TileP = SwizzledTile<kBlockM, kBlockN>;    // P, dS; transposed: A of dV, dK

  static constexpr int kSmemElements = 2 * kQStages * cute::cosize_v<typename TileQ::Layout> +
                                       2 * cute::cosize_v<typename TileKV::Layout> +
                                       2 * cute::cosize_v<typename TileP::Layout>;
  static constexpr int kSmemBytes = kSmemElements * 2 + 2 * kBlockM * 4;
  static_assert(kSmemBytes == Config::kSmemBytes, "config and traits disagree on shared memory");

  using SmemCopyAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomC = cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<32>, Element>;

  // Global -> shared: 16-byte vectors, zero-filled outside the tensor.
  static constexpr int kVector = 8;
  static constexpr int kThreadsPerRow = TileQ::kAtomCols / kVector;
  static constexpr int kRowsPerCopy = kThreads / kThreadsPerRow;
  static_assert(kBlockM % kRowsPerCopy == 0 && kBlockN % kRowsPerCopy == 0,
                "a copy pass must tile the rows");
  using GmemThreads = cute::Layout<cute::Shape<cute::Int<kRowsPerCopy>, cute::Int<kThreadsPerRow>>,
                                   cute::Stride<cute::Int<kThreadsPerRow>, cute::_1>>;
  using GmemLoadOp =
      std::conditional_t<kAsyncCopy, cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>,
                         cute::UniversalCopy<cute::uint128_t>>;
  using GmemTiledCopyLoad =
      decltype(cute::make_tiled_copy(cute::Copy_Atom<GmemLoadOp, Element>{}, GmemThreads{},
                                     cute::Layout<cute::Shape<cute::_1, cute::Int<kVector>>>{}));
};

}  // namespace samattn::attention
