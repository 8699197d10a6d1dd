// The global tensors of the sm90 attention kernels as TMA sees them: (seq,
// head dim, head, batch), the head dim contiguous; varlen: (total rows, head
// dim, head, 1). The kernels' traits build their TMA types from GmemLayout,
// the launches their descriptors from tma_view.
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>

namespace samattn::attention::sm90 {

using GmemShape = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
using GmemStride = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
using GmemLayout = cute::Layout<GmemShape, GmemStride>;

// A (seq, head dim, head, batch) view of `view` for TMA. A dimension of
// extent 1 is never stepped over, so its stride (which torch may leave at
// any value) becomes one that TMA accepts.
template <class Element, class View>
auto tma_view(Element* ptr, const View& view, int seqlen, int headdim, int heads, int batch) {
  using namespace cute;
  auto stride_of = [](int64_t stride, int extent) { return extent > 1 ? stride : int64_t(8); };
  return make_tensor(make_gmem_ptr(ptr),
                     make_layout(make_shape(seqlen, headdim, heads, batch),
                                 make_stride(stride_of(view.seq_stride, seqlen), _1{},
                                             stride_of(view.head_stride, heads),
                                             stride_of(view.batch_stride, batch))));
}

}  // namespace samattn::attention::sm90
