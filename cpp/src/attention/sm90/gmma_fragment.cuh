// Views of wgmma accumulator fragments used by the sm90 attention kernels.
//
// The fp32 C fragment of a 64 x N wgmma is ((2, 2, N/8), MMA_M, MMA_N) per
// thread: value (c, h, g) is column 8 g + 2 (lane % 4) + c of row
// 16 (warp % 4) + lane / 4 + 8 h, within the warpgroup's 64 rows.
#pragma once

#include <cutlass/numeric_conversion.h>
#include <cute/tensor.hpp>

namespace samattn::attention::sm90 {

// ((2,2,N/8),MMA_M,MMA_N) -> ((2,MMA_M),(2,N/8,MMA_N)): mode 0 indexes the
// thread's rows, mode 1 its columns, for row-wise softmax and masking.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto gmma_rowcol_layout(Layout const& layout) {
  using namespace cute;
  static_assert(rank(Layout{}) == 3 && rank<0>(Layout{}) == 3, "expects a wgmma C fragment");
  static_assert(size<0, 0>(Layout{}) == 2 && size<0, 1>(Layout{}) == 2);
  auto values = get<0>(layout);
  return make_layout(make_layout(get<1>(values), get<1>(layout)),
                     make_layout(get<0>(values), get<2>(values), get<2>(layout)));
}

template <class Engine, class Layout>
CUTE_HOST_DEVICE constexpr auto gmma_rowcol_view(cute::Tensor<Engine, Layout>& tensor) {
  return cute::make_tensor(tensor.data(), gmma_rowcol_layout(tensor.layout()));
}
template <class Engine, class Layout>
CUTE_HOST_DEVICE constexpr auto gmma_rowcol_view(cute::Tensor<Engine, Layout> const& tensor) {
  return cute::make_tensor(tensor.data(), gmma_rowcol_layout(tensor.layout()));
}

// The C fragment of S = Q K^T (16-bit values) read as the register A
// fragment of P V: a 64 x 16 A tile is ((2,2,2),...) with values (k + 1,
// m + 8, k + 8), which are two adjacent 8-column groups of C. So
// ((2,2,N/8),MMA_M,MMA_N) -> ((2,2,2),MMA_M,(N/16,MMA_N)).
template <class Layout>
CUTE_HOST_DEVICE constexpr auto gmma_c_to_a_layout(Layout const& layout) {
  using namespace cute;
  static_assert(rank(Layout{}) == 3 && rank<0>(Layout{}) == 3, "expects a wgmma C fragment");
  // ((2, N/16)): the pair of 8-column groups of one k tile, then the k tiles.
  auto groups = get<0>(logical_divide(get<0, 2>(layout), Tile<_2>{}));
  return make_layout(make_layout(get<0, 0>(layout), get<0, 1>(layout), get<0>(groups)),
                     get<1>(layout), coalesce(make_layout(get<1>(groups), get<2>(layout))));
}

// Converts a float fragment into `to`, a register tensor of as many
// elements in the same storage order (pairs at a time: cvt.rn.*x2.f32).
template <class EngineFrom, class LayoutFrom, class EngineTo, class LayoutTo>
__device__ inline void convert_gmma_fragment(cute::Tensor<EngineFrom, LayoutFrom> const& from,
                                             cute::Tensor<EngineTo, LayoutTo>& to) {
  using From = typename EngineFrom::value_type;
  using To = typename EngineTo::value_type;
  constexpr int kSize = decltype(cute::size(from))::value;
  static_assert(decltype(cute::size(to))::value == kSize);
  cutlass::NumericArrayConverter<To, From, kSize> convert;
  *reinterpret_cast<cutlass::Array<To, kSize>*>(to.data()) =
      convert(*reinterpret_cast<const cutlass::Array<From, kSize>*>(from.data()));
}

// The same into a new register tensor of from's layout.
template <class To, class Engine, class Layout>
__device__ inline auto convert_gmma_fragment(cute::Tensor<Engine, Layout> const& from) {
  auto to = cute::make_tensor<To>(from.layout());
  convert_gmma_fragment(from, to);
  return to;
}

}  // namespace samattn::attention::sm90
