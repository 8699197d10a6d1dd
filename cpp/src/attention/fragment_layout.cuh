// Views of mma.sync accumulator fragments used by the attention kernels.
//
// A C fragment of the m16n8 atoms is ((2 columns, 2 row halves), MMA_M, MMA_N)
// per thread: values 0/1 are adjacent columns of row lane/4, values 2/3 the
// same columns of row lane/4 + 8.
#pragma once

#include <cute/tensor.hpp>

namespace samattn::attention {

// ((2,2),MMA_M,MMA_N) -> ((2,MMA_M),(2,MMA_N)): mode 0 indexes the thread's
// rows, mode 1 its columns, for row-wise softmax and masking.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto rowcol_layout(Layout const& layout) {
  using namespace cute;
  static_assert(rank(Layout{}) == 3 && size<0>(Layout{}) == 4, "expects an m16n8 C fragment");
  auto values = get<0>(layout);
  return make_layout(make_layout(get<1>(values), get<1>(layout)),
                     make_layout(get<0>(values), get<2>(layout)));
}

template <class Engine, class Layout>
CUTE_HOST_DEVICE constexpr auto rowcol_view(cute::Tensor<Engine, Layout>& tensor) {
  return cute::make_tensor(tensor.data(), rowcol_layout(tensor.layout()));
}
template <class Engine, class Layout>
CUTE_HOST_DEVICE constexpr auto rowcol_view(cute::Tensor<Engine, Layout> const& tensor) {
  return cute::make_tensor(tensor.data(), rowcol_layout(tensor.layout()));
}

// The C fragment of S = Q K^T, reinterpreted as the A fragment of P V. For
// k16 atoms two n8 C tiles make one A tile: ((2,2),MMA_M,MMA_N) ->
// (((2,2),2),MMA_M,MMA_N/2), since the A values run (k+1, m+8, k+8) and the
// C values (n+1, m+8). For k8 atoms (sm75) the layouts already coincide.
template <class MmaAtom, class Layout>
CUTE_HOST_DEVICE constexpr auto c_to_a_layout(Layout const& layout) {
  using namespace cute;
  constexpr int kAtomK = size<2>(typename MMA_Traits<MmaAtom>::Shape_MNK{});
  if constexpr (kAtomK == 8) {
    return layout;
  } else {
    static_assert(kAtomK == 16, "m16n8k8 or m16n8k16 atoms");
    auto split = logical_divide(layout, Shape<Underscore, Underscore, _2>{});
    return make_layout(make_layout(get<0>(split), get<2, 0>(split)), get<1>(split),
                       get<2, 1>(split));
  }
}

// Element-wise conversion of a float fragment to the MMA input type.
template <class To, class Engine, class Layout>
__device__ inline auto convert_fragment(cute::Tensor<Engine, Layout> const& from) {
  auto to = cute::make_tensor<To>(from.layout());
  CUTE_UNROLL
  for (int i = 0; i < cute::size(from); ++i) to(i) = static_cast<To>(from(i));
  return to;
}

}  // namespace samattn::attention
