// Host side of softmax: plan a problem (softmax_plan.h) and launch the
// kernels of softmax_kernel.cuh. Included by the generated translation units,
// each of which instantiates one run_forward / run_backward.
#pragma once

#include <cuda_runtime.h>

#include "common/launch_setup.h"
#include "softmax/softmax_config.h"
#include "softmax/softmax_kernel.cuh"
#include "softmax/softmax_plan.h"

namespace samattn::softmax {

namespace detail {

template <class T>
struct LaunchArgs {
  Operands<T> ops;
  Plan plan;
  int64_t outer, dim, inner;
  cudaStream_t stream;
};

template <class Op, class T, int kThreadsPerRow, Family F>
cudaError_t launch_rows_in_registers(const LaunchArgs<T>& args) {
  constexpr int kVecs = Tuning::register_vecs(Op::kInputs == 2, 16 / sizeof(T));
  constexpr int kThreads = RegisterRowsCta<kThreadsPerRow>::kThreads;
  rows_in_registers_kernel<Op, T, kThreadsPerRow, kVecs, F>
      <<<static_cast<unsigned>(args.plan.grid), kThreads, 0, args.stream>>>(args.ops, args.outer,
                                                                            args.dim);
  return cudaGetLastError();
}

template <class Op, class T, Family F>
cudaError_t launch_registers(const LaunchArgs<T>& args) {
  switch (args.plan.threads_per_row) {
    case 2:
      return launch_rows_in_registers<Op, T, 2, F>(args);
    case 4:
      return launch_rows_in_registers<Op, T, 4, F>(args);
    case 8:
      return launch_rows_in_registers<Op, T, 8, F>(args);
    case 16:
      return launch_rows_in_registers<Op, T, 16, F>(args);
    case 32:
      return launch_rows_in_registers<Op, T, 32, F>(args);
    case 64:
      return launch_rows_in_registers<Op, T, 64, F>(args);
    case 128:
      return launch_rows_in_registers<Op, T, 128, F>(args);
    case 256:
      return launch_rows_in_registers<Op, T, 256, F>(args);
    case 512:
      return launch_rows_in_registers<Op, T, 512, F>(args);
    case 1024:
      // 16-bit forward rows stop at 512 lanes (softmax_plan.h): not built.
      if constexpr (sizeof(T) != 2 || Op::kInputs != 1) {
        return launch_rows_in_registers<Op, T, 1024, F>(args);
      }
      break;
  }
  return cudaErrorInvalidConfiguration;
}

template <class Op, class T, int kVec, Stage kStage, Family F>
cudaError_t launch_two_pass_stage(const LaunchArgs<T>& args, int64_t splits, int64_t chunk,
                                  int64_t cache_vecs, size_t smem_bytes) {
  constexpr int kUnroll = Tuning::two_pass_unroll(kVec, Op::kInputs);
  auto* kernel = two_pass_kernel<Op, T, kVec, kUnroll, kStage, F>;
  const cudaError_t allowed = allow_dynamic_smem<two_pass_kernel<Op, T, kVec, kUnroll, kStage, F>>(
      static_cast<int>(smem_bytes));
  if (allowed != cudaSuccess) return allowed;
  kernel<<<static_cast<unsigned>(args.plan.grid), args.plan.cta_threads, smem_bytes, args.stream>>>(
      args.ops, args.outer, args.dim, splits, chunk, cache_vecs);
  return cudaGetLastError();
}

template <class Op, class T, int kVec, Family F>
cudaError_t launch_long_rows(const LaunchArgs<T>& args) {
  const Plan& plan = args.plan;
  if (plan.path == Path::two_pass) {
    return launch_two_pass_stage<Op, T, kVec, Stage::whole_row, F>(
        args, 1, args.dim, plan.cache_vecs, plan.smem_bytes);
  }
  // Split: partial stats per chunk, merged per row, then the output per chunk.
  // The stats travel in the output (see stats_slot), so `out` must not
  // overlap the inputs.
  cudaError_t status = launch_two_pass_stage<Op, T, kVec, Stage::partial_stats, F>(
      args, plan.splits, plan.chunk, 0, 0);
  if (status != cudaSuccess) return status;
  const int64_t combine_grid =
      std::min(ceil_div(args.outer, kCombineThreads / 32), Tuning::kMaxGrid);
  combine_splits_kernel<Op, T, F>
      <<<static_cast<unsigned>(combine_grid), kCombineThreads, 0, args.stream>>>(
          args.ops.out, args.outer, args.dim, plan.splits, plan.chunk);
  status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  return launch_two_pass_stage<Op, T, kVec, Stage::finish, F>(args, plan.splits, plan.chunk, 0, 0);
}

template <class Op, class T, int kVec, Family F>
cudaError_t launch_columns(const LaunchArgs<T>& args) {
  columns_kernel<Op, T, kVec, F>
      <<<static_cast<unsigned>(args.plan.grid), args.plan.cta_threads, 0, args.stream>>>(
          args.ops, args.outer, args.dim, args.inner, args.plan.tile_vecs);
  return cudaGetLastError();
}

inline int residue16(const void* p) {
  return static_cast<int>(reinterpret_cast<uintptr_t>(p) % 16);
}

template <class Op, class T, Family F>
cudaError_t run(const SoftmaxProblem& problem) {
  constexpr int kFullVec = 16 / sizeof(T);
  if (problem.outer <= 0 || problem.dim <= 0 || problem.inner <= 0) return cudaSuccess;

  LaunchArgs<T> args;
  args.ops.in[0] = static_cast<const T*>(problem.x);
  args.ops.in[1] = Op::kInputs == 2 ? static_cast<const T*>(problem.dy) : args.ops.in[0];
  args.ops.out = static_cast<T*>(problem.out);
  args.outer = problem.outer;
  args.dim = problem.dim;
  args.inner = problem.inner;
  args.stream = problem.stream;

  PlanInput in{};
  in.elem_bytes = sizeof(T);
  in.backward = Op::kInputs == 2;
  in.outer = problem.outer;
  in.dim = problem.dim;
  in.inner = problem.inner;
  in.residues[0] = residue16(args.ops.in[0]);
  in.residues[1] = residue16(Op::kInputs == 2 ? args.ops.in[1] : args.ops.out);
  in.residues[2] = residue16(args.ops.out);
  in.operands = Op::kInputs + 1;
  in.sm_count = problem.sm_count > 0 ? problem.sm_count : 1;
  in.smem_optin = 0;
  args.plan = make_plan(in);
  if (args.plan.path == Path::two_pass) {
    // Plan again with the device's shared memory, for the row cache.
    const cudaError_t status = device_smem_optin(&in.smem_optin);
    if (status != cudaSuccess) return status;
    args.plan = make_plan(in);
  }

  switch (args.plan.path) {
    case Path::registers:
      return launch_registers<Op, T, F>(args);
    case Path::two_pass:
    case Path::split:
      return args.plan.vec == kFullVec ? launch_long_rows<Op, T, kFullVec, F>(args)
                                       : launch_long_rows<Op, T, 1, F>(args);
    case Path::columns:
      return args.plan.vec == kFullVec ? launch_columns<Op, T, kFullVec, F>(args)
                                       : launch_columns<Op, T, 1, F>(args);
  }
  return cudaErrorInvalidConfiguration;
}

}  // namespace detail

template <DType D, Family F>
cudaError_t run_forward(const SoftmaxProblem& problem) {
  return detail::run<detail::Forward, typename ElementOf<D>::type, F>(problem);
}

template <DType D, Family F>
cudaError_t run_backward(const SoftmaxProblem& problem) {
  return detail::run<detail::Backward, typename ElementOf<D>::type, F>(problem);
}

}  // namespace samattn::softmax
