// Warpgroup helpers shared by the sm90 attention kernels: one wgmma batch
// over every k block, and the wait on an mbarrier's phase.
#pragma once

// cute/tensor.hpp first: the Hopper atoms below need what it declares.
#include <cute/tensor.hpp>
// clang-format off
#include <cute/atom/mma_traits_sm90_gmma.hpp>
// clang-format on
#include <cutlass/arch/barrier.h>

namespace samattn::attention::sm90 {

// One wgmma batch of the warpgroup: c (+)= a b over every k block, committed;
// kWait >= 0 waits until at most kWait batches are pending (-1: no wait).
template <bool kZeroInit, int kWait, class TiledMma, class TA, class TB, class TC>
__device__ inline void warpgroup_gemm(TiledMma& mma, TA const& a, TB const& b, TC& c) {
  using namespace cute;
  constexpr bool kRegisterA =
      !is_base_of<GMMA::DescriptorIterator, typename TiledMma::FrgTypeA>::value;
  if constexpr (kRegisterA) warpgroup_fence_operand(const_cast<TA&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  if constexpr (kWait >= 0) warpgroup_wait<kWait>();
  warpgroup_fence_operand(c);
  if constexpr (kRegisterA) warpgroup_fence_operand(const_cast<TA&>(a));
}

// Waits until the mbarrier has completed the phase of parity `phase`.
__device__ inline void wait_barrier(uint64_t& barrier, int phase) {
  cutlass::arch::ClusterBarrier::wait(&barrier, phase);
}

}  // namespace samattn::attention::sm90
