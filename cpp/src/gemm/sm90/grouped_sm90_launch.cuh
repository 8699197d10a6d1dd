// The sm90 grouped GEMM (mixture of experts; gemm/group.h), both forms in
// one launch each:
//   rows: D[rows of g] = alpha * A[rows of g] @ B[g] (forward and dx);
//   K:    D[g] = alpha * A[:, ks of g] @ B[ks of g, :] (the weight gradient).
//
// CUTLASS 3's Hopper "pointer-array" kernel runs it: a persistent grid walks
// the tiles of every group in turn, reading each group's (m, n, k), operand
// addresses and strides from device arrays and rewriting its TMA descriptors
// in global memory when it moves to a new group. Those arrays are filled on
// the device by `prepare_groups` from the cumulative ends, so the host never
// reads the ends (no synchronization, graph-capturable); the same launch
// writes the zeros no group's tiles cover (the rows form's rows after the
// last group, the K form's D of an empty group). A list of GEMMs is
// described by the host instead, through `prepare_list`'s parameters.
//
// Mainloop as the plain sm90 GEMM (TMA, 128-byte swizzle, warp-specialized
// wgmma, fp32 accumulators), cooperative 128x256 tile, clusters of two CTAs
// that share and multicast a tile of A (1x2) or of B (2x1; grouped_sm90_plan.h
// says when). Epilogue alpha * acc, with no C (void source).
#pragma once

#include "gemm/sm90/gemm_sm90_launch.cuh"

#include <cutlass/gemm/group_array_problem_shape.hpp>

#include "gemm/group.h"
#include "gemm/sm90/grouped_sm90_config.h"

namespace samattn::gemm::sm90 {

template <class Config>
struct GroupedKernel;

template <DType T, Major A, Major B, GroupedCluster C>
struct GroupedKernel<Sm90Grouped<T, A, B, C>> {
  static_assert(T != DType::f32, "grouped GEMMs take 16-bit operands");
  using ElementT = typename Element<T>::type;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  // A (m, k) K-major (row-major) or M-major; B (k, n) K-major (column-major)
  // or N-major; D row-major. The pointer types mark the layouts as per-group
  // arrays.
  using LayoutA =
      std::conditional_t<A == Major::K, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
  using LayoutB =
      std::conditional_t<B == Major::K, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignment = 16 / sizeof(ElementT);
  using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;  // grouped_tile_name
  using Cluster =
      std::conditional_t<C == GroupedCluster::k2x1, cute::Shape<cute::_2, cute::_1, cute::_1>,
                         cute::Shape<cute::_1, cute::_2, cute::_1>>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignment,
      ElementT, LayoutD*, kAlignment, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementT, float, void, float>>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementT, LayoutA*, kAlignment, ElementT,
      LayoutB*, kAlignment, float, TileShape, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, CollectiveEpilogue>;
  using Shape = typename ProblemShape::UnderlyingProblemShape;
  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;
};

// The per-group arrays the kernel reads, carved out of the front of the
// workspace; CUTLASS's own workspace (the TMA descriptors) follows.
template <class Config>
struct GroupArrays {
  using K = GroupedKernel<Config>;
  typename K::Shape* shapes;
  const typename K::ElementT** a;
  const typename K::ElementT** b;
  typename K::ElementT** d;
  typename K::StrideA* stride_a;
  typename K::StrideB* stride_b;
  typename K::StrideD* stride_d;

  static constexpr size_t kAlign = 256;
  static size_t slot(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  static size_t bytes(int64_t groups) {
    const size_t g = static_cast<size_t>(groups);
    return slot(g * sizeof(typename K::Shape)) + 3 * slot(g * sizeof(void*)) +
           slot(g * sizeof(typename K::StrideA)) + slot(g * sizeof(typename K::StrideB)) +
           slot(g * sizeof(typename K::StrideD));
  }
  static GroupArrays carve(void* workspace, int64_t groups) {
    const size_t g = static_cast<size_t>(groups);
    char* at = static_cast<char*>(workspace);
    const auto take = [&](size_t bytes) {
      char* here = at;
      at += slot(bytes);
      return here;
    };
    GroupArrays arrays;
    arrays.shapes = reinterpret_cast<typename K::Shape*>(take(g * sizeof(typename K::Shape)));
    arrays.a = reinterpret_cast<const typename K::ElementT**>(take(g * sizeof(void*)));
    arrays.b = reinterpret_cast<const typename K::ElementT**>(take(g * sizeof(void*)));
    arrays.d = reinterpret_cast<typename K::ElementT**>(take(g * sizeof(void*)));
    arrays.stride_a = reinterpret_cast<typename K::StrideA*>(take(g * sizeof(typename K::StrideA)));
    arrays.stride_b = reinterpret_cast<typename K::StrideB*>(take(g * sizeof(typename K::StrideB)));
    arrays.stride_d = reinterpret_cast<typename K::StrideD*>(take(g * sizeof(typename K::StrideD)));
    return arrays;
  }
};

// What prepare_groups reads: the oriented plan's operands, their strides
// (the same for every group, built on the host) and the ends. Group g's
// operand X starts at X + begin * x_range_stride + g * x_group_stride, where
// [begin, end) is g's range of what the ends index (rows of A and D in the
// rows form, K indices of A and B in the K form).
template <class Config>
struct GroupSource {
  using K = GroupedKernel<Config>;
  const int32_t* ends;
  int groups;
  bool k_form;
  int m, n, k;  // the whole problem's; the ends index m (rows) or k (K form)
  const void* a;
  int64_t a_range_stride;
  const void* b;
  int64_t b_range_stride, b_group_stride;
  void* d;
  int64_t d_range_stride, d_group_stride, ldd;
  typename K::StrideA stride_a;
  typename K::StrideB stride_b;
  typename K::StrideD stride_d;
};

constexpr int kPrepareThreads = 256;

// Zeroes rows [first, last) of the row-major d (n columns, 16-byte rows: the
// plan requires them), 16 bytes per thread and step.
template <class ElementT>
__device__ void zero_rows(ElementT* d, int64_t ldd, int64_t first, int64_t last, int64_t n,
                          int64_t thread, int64_t threads) {
  constexpr int kVector = 16 / sizeof(ElementT);
  const int64_t vectors_per_row = n / kVector;
  const int64_t vectors = (last - first) * vectors_per_row;
  for (int64_t v = thread; v < vectors; v += threads) {
    const int64_t row = first + v / vectors_per_row, col = (v % vectors_per_row) * kVector;
    *reinterpret_cast<uint4*>(d + row * ldd + col) = uint4{};
  }
}

// Threads 0..groups-1 (over the whole grid) describe one group each. Then
// the grid zeroes what no group's tiles write: the rows form's rows after
// the last group, the K form's D of each group with no K (such a group gets
// no tiles: m = 0).
template <class Config>
__global__ void __launch_bounds__(kPrepareThreads)
    prepare_groups(GroupArrays<Config> arrays, GroupSource<Config> src) {
  using K = GroupedKernel<Config>;
  using ElementT = typename K::ElementT;
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int limit = src.k_form ? src.k : src.m;
  for (int64_t g = thread; g < src.groups; g += threads) {
    const group::Range r = group::range(src.ends, static_cast<int>(g), limit);
    const int length = r.end - r.begin;
    arrays.shapes[g] = src.k_form ? typename K::Shape{length > 0 ? src.m : 0, src.n, length}
                                  : typename K::Shape{length, src.n, src.k};
    arrays.a[g] = static_cast<const ElementT*>(src.a) + r.begin * src.a_range_stride;
    arrays.b[g] =
        static_cast<const ElementT*>(src.b) + r.begin * src.b_range_stride + g * src.b_group_stride;
    arrays.d[g] =
        static_cast<ElementT*>(src.d) + r.begin * src.d_range_stride + g * src.d_group_stride;
    arrays.stride_a[g] = src.stride_a;
    arrays.stride_b[g] = src.stride_b;
    arrays.stride_d[g] = src.stride_d;
  }
  auto* d = static_cast<ElementT*>(src.d);
  if (!src.k_form) {
    const int tail = group::clamped_end(src.ends, src.groups - 1, src.m);
    zero_rows(d, src.ldd, tail, src.m, src.n, thread, threads);
    return;
  }
  for (int g = 0; g < src.groups; ++g) {  // every thread, the same walk
    const group::Range r = group::range(src.ends, g, limit);
    if (r.end == r.begin)
      zero_rows(d + g * src.d_group_stride, src.ldd, 0, src.m, src.n, thread, threads);
  }
}

// A list's GEMMs as prepare_list reads them: kListChunk per launch, in the
// kernel's parameters (at most 4 KB), so the host array needs no copy to the
// device and a CUDA graph captures the values.
constexpr int kListChunk = 32;

template <class Config>
struct ListChunk {
  using K = GroupedKernel<Config>;
  struct Entry {
    typename K::Shape shape;  // (m, n, k) of the GEMM
    const void* a;
    const void* b;
    void* d;
    typename K::StrideA stride_a;
    typename K::StrideB stride_b;
    typename K::StrideD stride_d;
    int64_t ldd;
  };
  int first, count;  // entries [first, first + count) of the list
  Entry entries[kListChunk];
};

// Thread i (over the whole grid) describes entry i of the chunk. A GEMM with
// no K gets no tiles (m = 0 for the kernel); the grid writes its zeros.
template <class Config>
__global__ void __launch_bounds__(kPrepareThreads)
    prepare_list(GroupArrays<Config> arrays, const ListChunk<Config> chunk) {
  using K = GroupedKernel<Config>;
  using ElementT = typename K::ElementT;
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = thread; i < chunk.count; i += threads) {
    const auto& e = chunk.entries[i];
    const int64_t g = chunk.first + i;
    const int m = cute::get<0>(e.shape), n = cute::get<1>(e.shape), k = cute::get<2>(e.shape);
    arrays.shapes[g] = typename K::Shape{k > 0 ? m : 0, n, k};
    arrays.a[g] = static_cast<const ElementT*>(e.a);
    arrays.b[g] = static_cast<const ElementT*>(e.b);
    arrays.d[g] = static_cast<ElementT*>(e.d);
    arrays.stride_a[g] = e.stride_a;
    arrays.stride_b[g] = e.stride_b;
    arrays.stride_d[g] = e.stride_d;
  }
  for (int i = 0; i < chunk.count; ++i) {  // every thread, the same walk
    const auto& e = chunk.entries[i];
    if (cute::get<2>(e.shape) == 0) {
      zero_rows(static_cast<ElementT*>(e.d), e.ldd, 0, cute::get<0>(e.shape), cute::get<1>(e.shape),
                thread, threads);
    }
  }
}

template <class Config>
typename GroupedKernel<Config>::GemmKernel::Arguments make_grouped_arguments(
    const GroupedPlan& plan, const GemmProblem& problem, const GroupArrays<Config>& arrays) {
  using K = GroupedKernel<Config>;
  cutlass::KernelHardwareInfo hw_info;
  cudaGetDevice(&hw_info.device_id);
  hw_info.sm_count = problem.sm_count;
  typename K::GemmKernel::Arguments arguments{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {static_cast<int>(plan.groups), arrays.shapes, nullptr},  // shapes on the device only
      {arrays.a, arrays.stride_a, arrays.b, arrays.stride_b},
      {{}, nullptr, nullptr, arrays.d, arrays.stride_d},
      hw_info};
  auto& epilogue = arguments.epilogue.thread;
  epilogue.alpha = problem.alpha;
  epilogue.beta = 0.0f;
  // (The group scheduler's raster swizzle needs the groups' shapes on the
  // host: with device-side shapes it is always 1.)
  using Raster = typename K::GemmKernel::TileScheduler::RasterOrderOptions;
  arguments.scheduler.raster_order = plan.raster_along_n ? Raster::AlongN : Raster::AlongM;
  return arguments;
}

}  // namespace samattn::gemm::sm90

namespace samattn::gemm {

template <class Config>
size_t sm90_grouped_workspace_bytes(const sm90::GroupedPlan& plan, const GemmProblem& problem) {
  using Arrays = sm90::GroupArrays<Config>;
  const Arrays none{};
  return Arrays::bytes(plan.groups) +
         sm90::GroupedKernel<Config>::GemmKernel::get_workspace_size(
             sm90::make_grouped_arguments<Config>(plan, problem, none));
}

namespace sm90 {

// Blocks for a prepare kernel: enough threads for `work` (groups, 16-byte
// stores of zeros), up to four waves' worth.
inline unsigned prepare_blocks(int64_t work, int sm_count) {
  const int64_t blocks = std::min<int64_t>((work + kPrepareThreads - 1) / kPrepareThreads,
                                           4 * static_cast<int64_t>(sm_count));
  return static_cast<unsigned>(std::max<int64_t>(blocks, 1));
}

// Fills the arrays of a list from the host array, kListChunk GEMMs per
// prepare_list launch.
template <class Config>
cudaError_t prepare_list_arrays(const GroupedPlan& plan, const GemmProblem& problem,
                                const GroupArrays<Config>& arrays) {
  using K = GroupedKernel<Config>;
  using Chunk = ListChunk<Config>;
  static_assert(sizeof(Chunk) + sizeof(GroupArrays<Config>) <= 4000,
                "a chunk must fit a kernel's 4 KB of parameters");
  Chunk chunk{};
  int64_t zeros = 0;  // 16-byte stores of the chunk's largest GEMM with no K
  const auto flush = [&]() {
    prepare_list<Config><<<prepare_blocks(std::max<int64_t>(chunk.count, zeros), problem.sm_count),
                           kPrepareThreads, 0, problem.stream>>>(arrays, chunk);
    chunk.first += chunk.count;
    chunk.count = 0;
    zeros = 0;
    return cudaGetLastError();
  };
  for (int64_t g = 0; g < plan.groups; ++g) {
    const samattn_gemm_list_entry& e = problem.group_list[g];
    typename Chunk::Entry& x = chunk.entries[chunk.count++];
    x = typename Chunk::Entry{};
    x.shape = typename K::Shape{0, 0, 1};  // no tiles, nothing to zero
    if (e.m > 0 && e.n > 0) {
      ListOperands operands;
      if (!list_operands(e, problem.dtype, plan.b.k_major, &operands, nullptr)) {
        return cudaErrorInvalidValue;  // the plan accepted it: not reached
      }
      x.shape =
          typename K::Shape{static_cast<int>(e.m), static_cast<int>(e.n), static_cast<int>(e.k)};
      x.d = const_cast<void*>(operands.d.ptr);
      x.ldd = operands.d.ld;
      x.stride_d = make_stride3<typename K::StrideD>(operands.d.ld, 1, 0);
      if (e.k > 0) {
        x.a = operands.a.ptr;
        x.b = operands.b.ptr;
        x.stride_a = make_stride3<typename K::StrideA>(operands.a.ld, 1, 0);
        x.stride_b = plan.b.k_major ? make_stride3<typename K::StrideB>(operands.b.ld, 1, 0)
                                    : make_stride3<typename K::StrideB>(1, operands.b.ld, 0);
      } else {
        zeros = std::max<int64_t>(zeros, e.m * e.n / 8);
      }
    }
    if (chunk.count == kListChunk) {
      const cudaError_t error = flush();
      if (error != cudaSuccess) return error;
    }
  }
  return chunk.count > 0 ? flush() : cudaSuccess;
}

// Fills the arrays of the rows or K form from the ends, on the device.
template <class Config>
cudaError_t prepare_group_arrays(const GroupedPlan& plan, const GemmProblem& problem,
                                 const GroupArrays<Config>& arrays) {
  using K = GroupedKernel<Config>;
  GroupSource<Config> src;
  src.ends = problem.group_offsets;
  src.groups = static_cast<int>(plan.groups);
  src.k_form = plan.k_form;
  src.m = static_cast<int>(plan.m);
  src.n = static_cast<int>(plan.n);
  src.k = static_cast<int>(plan.k);
  src.a = plan.a.ptr;
  src.b = plan.b.ptr;
  src.d = const_cast<void*>(plan.d.ptr);
  src.ldd = plan.d.ld;
  // Rows form: the ends step A's and D's rows, B by group. K form: the ends
  // step A's columns and B's rows (their leading dimensions: both have the
  // unit stride on m or n), D by group.
  src.a_range_stride = plan.a.ld;
  src.b_range_stride = plan.k_form ? plan.b.ld : 0;
  src.b_group_stride = plan.k_form ? 0 : plan.b.batch_stride;
  src.d_range_stride = plan.k_form ? 0 : plan.d.ld;
  src.d_group_stride = plan.k_form ? plan.d.batch_stride : 0;
  // A (m, k) and B (n, k) with the unit stride on k, or on m and n; D (m, n).
  src.stride_a = plan.a.k_major ? make_stride3<typename K::StrideA>(plan.a.ld, 1, 0)
                                : make_stride3<typename K::StrideA>(1, plan.a.ld, 0);
  src.stride_b = plan.b.k_major ? make_stride3<typename K::StrideB>(plan.b.ld, 1, 0)
                                : make_stride3<typename K::StrideB>(1, plan.b.ld, 0);
  src.stride_d = make_stride3<typename K::StrideD>(plan.d.ld, 1, 0);
  // Enough threads for the groups, and for the zeros if every row past the
  // last group or every group is empty (known only on the device).
  prepare_groups<Config>
      <<<prepare_blocks(std::max<int64_t>(plan.groups, plan.m * plan.n / 8), problem.sm_count),
         kPrepareThreads, 0, problem.stream>>>(arrays, src);
  return cudaGetLastError();
}

}  // namespace sm90

template <class Config>
cudaError_t run_sm90_grouped(const sm90::GroupedPlan& plan, const GemmProblem& problem) {
  using K = sm90::GroupedKernel<Config>;
  using Arrays = sm90::GroupArrays<Config>;
  const size_t array_bytes = Arrays::bytes(plan.groups);
  const Arrays arrays = Arrays::carve(problem.workspace, plan.groups);
  const auto arguments = sm90::make_grouped_arguments<Config>(plan, problem, arrays);
  if (!K::GemmKernel::can_implement(arguments)) return cudaErrorNotSupported;
  const size_t kernel_bytes = K::GemmKernel::get_workspace_size(arguments);
  if (array_bytes + kernel_bytes > static_cast<size_t>(problem.workspace_bytes)) {
    return cudaErrorInvalidValue;
  }
  void* kernel_workspace = static_cast<char*>(problem.workspace) + array_bytes;
  cudaError_t error = plan.list ? sm90::prepare_list_arrays<Config>(plan, problem, arrays)
                                : sm90::prepare_group_arrays<Config>(plan, problem, arrays);
  if (error != cudaSuccess) return error;
  if (kernel_bytes > 0 &&
      K::GemmKernel::initialize_workspace(arguments, kernel_workspace, problem.stream) !=
          cutlass::Status::kSuccess) {
    error = cudaGetLastError();
    return error != cudaSuccess ? error : cudaErrorLaunchFailure;
  }
  return sm90::launch<typename K::GemmKernel>(
      K::GemmKernel::to_underlying_arguments(arguments, kernel_workspace), problem.stream);
}

}  // namespace samattn::gemm
