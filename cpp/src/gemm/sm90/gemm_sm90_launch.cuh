// The sm90 GEMM kernel: CUTLASS 3's Hopper collectives assembled for one tag.
//
// Mainloop: TMA loads of A and B tiles into 128-byte-swizzled shared memory,
// completing on mbarriers, a multistage pipeline (as many stages as fit next
// to the epilogue's buffers), wgmma with fp32 accumulators in registers. The
// kernel is warp-specialized: one producer warp issues the TMA loads, two
// consumer warpgroups share a tile ("cooperative") and take most registers
// through setmaxnreg. Grid: persistent, one CTA per SM walking tiles in
// swizzled raster order; clusters of 2 multicast the shared operand tile.
// The stream-K tile scheduler splits K across CTAs when there are too few
// output tiles to fill the GPU. Epilogue, through shared memory and TMA
// stores, row-major (column-major for swap_ab): alpha * acc + beta * C
// (Epilogue::plain), or act(alpha * acc + beta * C + bias) in CUTLASS's
// visitor tree with the activation chosen at run time (gemm/epilogue.h) and
// the bias read only when given (fused), with fp32 C and D (fused_f32).
#pragma once

// First: it redirects CUTLASS's driver calls (see there).
#include "common/cutlass_driver.h"

#include <cuda_runtime_api.h>

#include <cutlass/cutlass.h>
#include <cutlass/device_kernel.h>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>
#include <type_traits>

#include "common/launch_setup.h"
#include "gemm/epilogue.h"
#include "gemm/sm90/gemm_sm90_config.h"

namespace samattn::gemm::sm90 {

// The epilogue's activation as a CUTLASS compute functor whose Arguments
// carry the choice: one kernel for every activation, the branch taken once
// per fragment.
struct ActivationArguments {
  Activation kind = Activation::none;
};

template <class T>
struct RuntimeActivation {
  using Arguments = ActivationArguments;
  CUTLASS_HOST_DEVICE T operator()(T const& x, Arguments const& args) const {
    return activate(args.kind, x);
  }
};

template <class T, int N>
struct RuntimeActivation<cutlass::Array<T, N>> {
  using Arguments = ActivationArguments;
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& x,
                                                      Arguments const& args) const {
    switch (args.kind) {
      case Activation::relu:
        return apply<Activation::relu>(x);
      case Activation::gelu:
        return apply<Activation::gelu>(x);
      case Activation::gelu_tanh:
        return apply<Activation::gelu_tanh>(x);
      case Activation::silu:
        return apply<Activation::silu>(x);
      case Activation::none:
        break;
    }
    return x;
  }

 private:
  template <Activation kKind>
  CUTLASS_HOST_DEVICE static cutlass::Array<T, N> apply(cutlass::Array<T, N> const& x) {
    cutlass::Array<T, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = activate(kKind, x[i]);
    return y;
  }
};

template <DType T>
struct Element;
template <>
struct Element<DType::f16> {
  using type = cutlass::half_t;
};
template <>
struct Element<DType::bf16> {
  using type = cutlass::bfloat16_t;
};
template <>
struct Element<DType::f32> {
  using type = float;  // the builder maps float operands to tf32 wgmma
};

// Output tile, cluster and tile scheduler of each Tile.
template <Tile kTile>
struct TileTraits;
// Both consumer warpgroups share each tile (the "cooperative" schedule).
struct Cooperative {
  using MainloopSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
};

template <>
struct TileTraits<Tile::k128x256_c2x1> : Cooperative {
  using TileMN = cute::Shape<cute::_128, cute::_256>;
  using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using Scheduler = cutlass::gemm::PersistentScheduler;
};
template <>
struct TileTraits<Tile::k128x128_c1x2> : Cooperative {
  using TileMN = cute::Shape<cute::_128, cute::_128>;
  using Cluster = cute::Shape<cute::_1, cute::_2, cute::_1>;
  using Scheduler = cutlass::gemm::PersistentScheduler;
};
template <>
struct TileTraits<Tile::k128x64_streamk> : Cooperative {
  using TileMN = cute::Shape<cute::_128, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Scheduler = cutlass::gemm::StreamKScheduler;
};
template <>
struct TileTraits<Tile::k128x64_swap_ab> : TileTraits<Tile::k128x64_streamk> {};

template <class Config>
struct Kernel;

template <DType T, Major A, Major B, Tile kTile, Epilogue kEpilogue>
struct Kernel<Sm90Gemm<T, A, B, kTile, kEpilogue>> {
  static constexpr bool kFused = kEpilogue != Epilogue::plain;
  using ElementT = typename Element<T>::type;
  using ElementD = std::conditional_t<kEpilogue == Epilogue::fused_f32, float, ElementT>;  // and C
  // CUTLASS names layouts after the (m, k) A and (k, n) B matrices:
  // row-major A and column-major B are the K-major ones.
  using LayoutA =
      std::conditional_t<A == Major::K, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
  using LayoutB =
      std::conditional_t<B == Major::K, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr bool kDColumnMajor = d_column_major(kTile);
  using LayoutD =
      std::conditional_t<kDColumnMajor, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignment = 16 / sizeof(ElementT);  // TMA: 16-byte rows
  static constexpr int kAlignmentD = 16 / sizeof(ElementD);
  // K extent of a tile: 128 bytes, one 128-byte swizzle atom per row.
  using TileK = cute::Int<128 / sizeof(ElementT)>;
  using Traits = TileTraits<kTile>;
  using TileShape = cute::Shape<cute::tuple_element_t<0, typename Traits::TileMN>,
                                cute::tuple_element_t<1, typename Traits::TileMN>, TileK>;

  // The caller's bias runs along D's columns: the kernel's columns, or its
  // rows when the kernel computes D^T column-major (swap_ab).
  using FusedBias =
      std::conditional_t<kDColumnMajor,
                         cutlass::epilogue::fusion::LinCombPerRowBiasEltAct<
                             RuntimeActivation, ElementD, float, ElementT, ElementD, float>,
                         cutlass::epilogue::fusion::LinCombPerColBiasEltAct<
                             RuntimeActivation, ElementD, float, ElementT, ElementD, float>>;
  using Fusion = std::conditional_t<
      kFused, FusedBias,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, ElementD, float>>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, typename Traits::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementD, LayoutD, kAlignmentD,
      ElementD, LayoutD, kAlignmentD, typename Traits::EpilogueSchedule, Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementT, LayoutA, kAlignment, ElementT,
      LayoutB, kAlignment, float, TileShape, typename Traits::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Traits::MainloopSchedule>::CollectiveOp;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop,
                                           CollectiveEpilogue, typename Traits::Scheduler>;
};

// A CuTe stride of (outer, inner, batch) modes; static modes (the unit
// stride) keep their compile-time value.
template <class Stride>
Stride make_stride3(int64_t s0, int64_t s1, int64_t s2) {
  Stride stride{};
  const auto set = [](auto&& slot, int64_t value) {
    if constexpr (!cute::is_static<std::decay_t<decltype(slot)>>::value) slot = value;
  };
  set(cute::get<0>(stride), s0);
  set(cute::get<1>(stride), s1);
  set(cute::get<2>(stride), s2);
  return stride;
}

template <class Config>
typename Kernel<Config>::GemmKernel::Arguments make_arguments(const Plan& plan,
                                                              const GemmProblem& problem) {
  using K = Kernel<Config>;
  using GemmKernel = typename K::GemmKernel;
  using ElementT = typename K::ElementT;
  using ElementD = typename K::ElementD;
  // A (m, k, l) and B (n, k, l): K-major puts the unit stride on k.
  const auto stride_a = make_stride3<typename GemmKernel::StrideA>(
      plan.a.k_major ? plan.a.ld : 1, plan.a.k_major ? 1 : plan.a.ld, plan.a.batch_stride);
  const auto stride_b = make_stride3<typename GemmKernel::StrideB>(
      plan.b.k_major ? plan.b.ld : 1, plan.b.k_major ? 1 : plan.b.ld, plan.b.batch_stride);
  // D and C (m, n, l): the unit stride on n (row-major) or m (column-major).
  const auto output_stride = [](const Operand& x) {
    return K::kDColumnMajor ? make_stride3<typename GemmKernel::StrideD>(1, x.ld, x.batch_stride)
                            : make_stride3<typename GemmKernel::StrideD>(x.ld, 1, x.batch_stride);
  };
  static_assert(std::is_same_v<typename GemmKernel::StrideC, typename GemmKernel::StrideD>);
  const auto stride_d = output_stride(plan.d);
  // Without C (beta == 0) the epilogue never reads it, but its TMA descriptor
  // still needs a valid tensor: describe D.
  const Operand& c = plan.c.ptr != nullptr ? plan.c : plan.d;
  const auto stride_c = output_stride(c);

  cutlass::KernelHardwareInfo hw_info;
  cudaGetDevice(&hw_info.device_id);
  hw_info.sm_count = problem.sm_count;

  typename GemmKernel::Arguments arguments{cutlass::gemm::GemmUniversalMode::kGemm,
                                           {static_cast<int>(plan.m), static_cast<int>(plan.n),
                                            static_cast<int>(plan.k), static_cast<int>(plan.batch)},
                                           {static_cast<const ElementT*>(plan.a.ptr), stride_a,
                                            static_cast<const ElementT*>(plan.b.ptr), stride_b},
                                           {{},
                                            static_cast<const ElementD*>(c.ptr),
                                            stride_c,
                                            static_cast<ElementD*>(const_cast<void*>(plan.d.ptr)),
                                            stride_d},
                                           hw_info};
  auto& epilogue = arguments.epilogue.thread;
  epilogue.alpha = problem.alpha;
  epilogue.beta = plan.c.ptr != nullptr ? problem.beta : 0.0f;
  if constexpr (K::kFused) {
    epilogue.bias_ptr = static_cast<const ElementT*>(problem.bias);
    epilogue.activation.kind = static_cast<Activation>(problem.activation);
  }
  arguments.scheduler.max_swizzle_size = plan.swizzle;
  if constexpr (std::is_same_v<typename K::Traits::Scheduler, cutlass::gemm::StreamKScheduler>) {
    using Decomposition = typename GemmKernel::TileScheduler::DecompositionMode;
    if (plan.splits == 1) {
      arguments.scheduler.decomposition_mode = Decomposition::DataParallel;
    } else if (plan.splits >= 2) {
      arguments.scheduler.splits = plan.splits;
      arguments.scheduler.decomposition_mode = Decomposition::SplitK;
    }
    // The turnstile adds a tile's partial sums in K order: bit-reproducible.
    arguments.scheduler.reduction_mode = GemmKernel::TileScheduler::ReductionMode::Deterministic;
  }
  return arguments;
}

// What GemmUniversalAdapter::initialize and run do, less what need not be
// done per call: the shared memory attribute is set once per device, and the
// cluster launch skips the adapter's cudaFuncSetAttribute for non-portable
// cluster sizes (ours have 2 CTAs, within the portable 8). A kernel without
// a cluster takes the plain launch, which runs each CTA as a cluster of one:
// cudaLaunchKernelExC cost the host 1.3 us more per call on one H100 machine
// and the same on two others (benchmarks/launch_host_cost.cu).
template <class GemmKernel>
cudaError_t launch(const typename GemmKernel::Params& params, cudaStream_t stream) {
  constexpr int kSmem = GemmKernel::SharedStorageSize;
  const cudaError_t allowed = allow_dynamic_smem<cutlass::device_kernel<GemmKernel>>(kSmem);
  if (allowed != cudaSuccess) return allowed;
  using Cluster = typename GemmKernel::DispatchPolicy::ClusterShape;
  static_assert(cute::is_static_v<Cluster> && cute::size(Cluster{}) <= 8);
  const dim3 grid = GemmKernel::get_grid_shape(params);
  const dim3 block = GemmKernel::get_block_shape();
  void* args[] = {const_cast<typename GemmKernel::Params*>(&params)};
  const void* kernel = reinterpret_cast<const void*>(&cutlass::device_kernel<GemmKernel>);
  cudaError_t launched;
  if constexpr (cute::size(Cluster{}) == 1) {
    launched = cudaLaunchKernel(kernel, grid, block, args, kSmem, stream);
  } else {
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = cute::size<0>(Cluster{});
    cluster.val.clusterDim.y = cute::size<1>(Cluster{});
    cluster.val.clusterDim.z = cute::size<2>(Cluster{});
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = kSmem;
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
    launched = cudaLaunchKernelExC(&config, kernel, args);
  }
  if (launched != cudaSuccess) cudaGetLastError();  // leave no error behind for the next call
  return launched;
}

}  // namespace samattn::gemm::sm90

namespace samattn::gemm {

// The kernel's own workspace (stream-K partial sums and flags), which
// follows the plan's staging area in the caller's workspace.
template <class Config>
size_t sm90_workspace_bytes(const sm90::Plan& plan, const GemmProblem& problem) {
  using GemmKernel = typename sm90::Kernel<Config>::GemmKernel;
  return GemmKernel::get_workspace_size(sm90::make_arguments<Config>(plan, problem));
}

template <class Config>
cudaError_t run_sm90(const sm90::Plan& plan, const GemmProblem& problem) {
  using GemmKernel = typename sm90::Kernel<Config>::GemmKernel;
  const auto arguments = sm90::make_arguments<Config>(plan, problem);
  // The plan mirrors these checks; a refusal here is a bug in the plan.
  if (!GemmKernel::can_implement(arguments)) return cudaErrorNotSupported;
  const size_t kernel_bytes = GemmKernel::get_workspace_size(arguments);
  if (plan.staging_bytes + kernel_bytes > static_cast<size_t>(problem.workspace_bytes)) {
    return cudaErrorInvalidValue;
  }
  void* kernel_workspace =
      kernel_bytes > 0 ? static_cast<char*>(problem.workspace) + plan.staging_bytes : nullptr;
  if (kernel_bytes > 0 &&
      GemmKernel::initialize_workspace(arguments, kernel_workspace, problem.stream) !=
          cutlass::Status::kSuccess) {
    const cudaError_t error = cudaGetLastError();
    return error != cudaSuccess ? error : cudaErrorLaunchFailure;
  }
  return sm90::launch<GemmKernel>(GemmKernel::to_underlying_arguments(arguments, kernel_workspace),
                                  problem.stream);
}

}  // namespace samattn::gemm
