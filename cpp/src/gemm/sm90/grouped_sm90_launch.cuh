// The sm90 grouped GEMM (mixture of experts, rows form; gemm/group.h):
// D[rows of g] = alpha * A[rows of g] @ B[g] for every group g in one launch.
//
// CUTLASS 3's Hopper "pointer-array" kernel runs it: a persistent grid walks
// the tiles of every group in turn, reading each group's (m, n, k), operand
// addresses and strides from device arrays and rewriting its TMA descriptors
// in global memory when it moves to a new group. Those arrays are filled on
// the device by `prepare_groups` from the cumulative row ends, so the host
// never reads the ends (no synchronization, graph-capturable); the same
// launch writes the zero rows after the last group, which no group covers.
//
// Mainloop as the plain sm90 GEMM (TMA, 128-byte swizzle, warp-specialized
// wgmma, fp32 accumulators), cooperative 128x256 tile, cluster 1x2: the two
// CTAs of a cluster share the group's A tile (N, the expert dimension, is
// wide) and multicast it. Epilogue alpha * acc, with no C (void source).
#pragma once

#include "gemm/sm90/gemm_sm90_launch.cuh"

#include <cutlass/gemm/group_array_problem_shape.hpp>

#include "gemm/group.h"
#include "gemm/sm90/grouped_sm90_config.h"

namespace samattn::gemm::sm90 {

template <class Config>
struct GroupedKernel;

template <DType T, Major B>
struct GroupedKernel<Sm90Grouped<T, B>> {
  static_assert(T != DType::f32, "grouped GEMMs take 16-bit operands");
  using ElementT = typename Element<T>::type;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  // A (m, k) row-major; B (k, n) per group: K-major (an (experts, N, K)
  // weight) or N-major (experts, K, N); D row-major. The pointer types mark
  // the layouts as per-group arrays.
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB =
      std::conditional_t<B == Major::K, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignment = 16 / sizeof(ElementT);
  using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;  // kGroupedTileName
  using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;

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
// (the same for every group, built on the host) and the ends.
template <class Config>
struct GroupSource {
  using K = GroupedKernel<Config>;
  const int32_t* ends;
  int groups, rows, n, k;
  const void* a;
  int64_t lda;
  const void* b;
  int64_t b_group_stride;
  void* d;
  int64_t ldd;
  typename K::StrideA stride_a;
  typename K::StrideB stride_b;
  typename K::StrideD stride_d;
};

constexpr int kPrepareThreads = 256;

// Threads 0..groups-1 (over the whole grid) describe one group each; every
// thread also zeroes its share of the rows after the last group, 16 bytes at
// a time (the plan requires 16-byte rows).
template <class Config>
__global__ void __launch_bounds__(kPrepareThreads)
    prepare_groups(GroupArrays<Config> arrays, GroupSource<Config> src) {
  using K = GroupedKernel<Config>;
  using ElementT = typename K::ElementT;
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = thread; g < src.groups; g += threads) {
    const group::Range rows = group::range(src.ends, static_cast<int>(g), src.rows);
    arrays.shapes[g] = typename K::Shape{rows.end - rows.begin, src.n, src.k};
    arrays.a[g] = static_cast<const ElementT*>(src.a) + rows.begin * src.lda;
    arrays.b[g] = static_cast<const ElementT*>(src.b) + g * src.b_group_stride;
    arrays.d[g] = static_cast<ElementT*>(src.d) + rows.begin * src.ldd;
    arrays.stride_a[g] = src.stride_a;
    arrays.stride_b[g] = src.stride_b;
    arrays.stride_d[g] = src.stride_d;
  }
  const int tail = group::clamped_end(src.ends, src.groups - 1, src.rows);
  constexpr int kVector = 16 / sizeof(ElementT);
  const int64_t vectors_per_row = src.n / kVector;
  const int64_t vectors = static_cast<int64_t>(src.rows - tail) * vectors_per_row;
  for (int64_t v = thread; v < vectors; v += threads) {
    const int64_t row = tail + v / vectors_per_row, col = (v % vectors_per_row) * kVector;
    *reinterpret_cast<uint4*>(static_cast<ElementT*>(src.d) + row * src.ldd + col) = uint4{};
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

  sm90::GroupSource<Config> src;
  src.ends = problem.group_offsets;
  src.groups = static_cast<int>(plan.groups);
  src.rows = static_cast<int>(plan.m);
  src.n = static_cast<int>(plan.n);
  src.k = static_cast<int>(plan.k);
  src.a = plan.a.ptr;
  src.lda = plan.a.ld;
  src.b = plan.b.ptr;
  src.b_group_stride = plan.b.batch_stride;
  src.d = const_cast<void*>(plan.d.ptr);
  src.ldd = plan.d.ld;
  // A (m, k) and B (n, k) with the unit stride on k, or B's on n; D (m, n).
  src.stride_a = sm90::make_stride3<typename K::StrideA>(plan.a.ld, 1, 0);
  src.stride_b = plan.b.k_major ? sm90::make_stride3<typename K::StrideB>(plan.b.ld, 1, 0)
                                : sm90::make_stride3<typename K::StrideB>(1, plan.b.ld, 0);
  src.stride_d = sm90::make_stride3<typename K::StrideD>(plan.d.ld, 1, 0);
  // Enough threads for the groups, and for the zero rows if every row past
  // the last group (their count is known only on the device), up to a wave.
  const int64_t work = std::max<int64_t>(plan.groups, plan.m * plan.n / 8);
  const int64_t blocks =
      std::min<int64_t>((work + sm90::kPrepareThreads - 1) / sm90::kPrepareThreads,
                        4 * static_cast<int64_t>(problem.sm_count));
  sm90::prepare_groups<Config><<<static_cast<unsigned>(std::max<int64_t>(blocks, 1)),
                                 sm90::kPrepareThreads, 0, problem.stream>>>(arrays, src);
  cudaError_t error = cudaGetLastError();
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
