// The sm90 attention backward's epilogue: dQ staged by the consumers
// (DqStaging) and added to the fp32 accumulator by the writer warp
// (bwd_dq_writer) query tile by query tile; dK and dV stored from registers
// at the end (store_key_grad); the accumulator's conversion to dq
// (flash_bwd_sm90_convert_dq_kernel).
#pragma once

// cute/tensor.hpp first: the Hopper atoms below need what it declares.
#include <cute/tensor.hpp>
// clang-format off
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
// clang-format on
#include <cutlass/arch/barrier.h>

#include <cstdint>

#include "attention/flash_bwd_kernel.cuh"
#include "attention/sm90/flash_bwd_sm90_traits.cuh"

namespace samattn::attention::sm90 {

// Adds `bytes` of fp32 from shared memory to global memory in the L2 (an
// asynchronous bulk operation of the issuing thread's bulk group).
__device__ inline void bulk_reduce_add(float* global, const float* shared, uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(global),
      "r"(cute::cast_smem_ptr_to_uint(shared)), "r"(bytes)
      : "memory");
}

// dQ of a query tile leaves each consumer warpgroup through its share of the
// shared dQ tile, in fragment order: values 4j..4j+3 of thread t of the
// warpgroup at float4 j x 128 + t (16-byte stores, no bank conflicts), the
// order the conversion kernel reads back. The consumer waits only for the
// writer warp to have read the share it staged one query tile earlier.
template <class Traits>
struct DqStaging {
  static_assert(Traits::kDQShare % (4 * 128) == 0);

  template <class Acc>
  __device__ static void stash(float* dq, int group, int wg_thread, Acc const& acc) {
    using namespace cute;
    constexpr int kValues = decltype(size(acc))::value;
    static_assert(kValues % 4 == 0 && kValues * 128 == Traits::kDQShare);
    cutlass::arch::NamedBarrier::sync(kDQHandshakeThreads, kBarrierDQEmpty + group);
    float4* share = reinterpret_cast<float4*>(dq + group * Traits::kDQShare) + wg_thread;
    CUTE_UNROLL
    for (int j = 0; j < kValues / 4; ++j) {
      share[j * 128] = make_float4(acc(4 * j), acc(4 * j + 1), acc(4 * j + 2), acc(4 * j + 3));
    }
    cutlass::arch::fence_view_async_shared();  // the bulk reduction reads what these wrote
    cutlass::arch::NamedBarrier::arrive(kDQHandshakeThreads, kBarrierDQFull + group);
  }
};

// The dQ writer, warp 2 of the producer warpgroup: for each query tile, in
// the consumers' order, adds every warpgroup's share to the fp32 accumulator
// with one bulk reduction (cp.reduce.async.bulk, applied in the L2), so that
// the consumers never wait on global memory. Deterministic: the key tiles of
// a query tile add in their order, each after the one before has finished
// (the reductions completed, then the semaphore released), so the sums round
// the same way on every run; the masked kernel's key tiles that skip the
// query tile take no turn.
template <class Traits>
__device__ inline void bwd_dq_writer(const float* dq, float* tile_base, int* semaphores,
                                     AttentionMask const& mask, QueryTiles tiles,
                                     MaskTileColumn column, int n_block) {
  using NamedBarrier = cutlass::arch::NamedBarrier;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kGroups = Traits::kConsumerGroups;
  constexpr uint32_t kShareBytes = Traits::kDQShare * sizeof(float);
  const bool leader = threadIdx.x % 32 == 0;
  if (tiles.last < tiles.first) return;
  CUTE_UNROLL
  for (int g = 0; g < kGroups; ++g) NamedBarrier::arrive(kDQHandshakeThreads, kBarrierDQEmpty + g);
#pragma unroll 1
  for (int m = tiles.first; m <= tiles.last; m = column.next(m, tiles.last)) {
    float* accum = tile_base + int64_t(m) * kBlockM * Traits::kHeadDim;
    int* semaphore = nullptr;
    if (semaphores != nullptr) {
      // Every share first, then the turn, so that it is held briefly.
      CUTE_UNROLL
      for (int g = 0; g < kGroups; ++g) NamedBarrier::sync(kDQHandshakeThreads, kBarrierDQFull + g);
      if (leader) {
        int n_begin, n_end;
        mask.key_tiles(m * kBlockM, kBlockM, kBlockN, n_begin, n_end);
        semaphore = semaphores + m;
        const int turn = column.key_tiles_before(m, n_begin, n_block);
        while (load_acquire(semaphore) != turn) {
        }
        asm volatile("fence.proxy.async.global;" ::: "memory");  // the reductions after the wait
      }
    }
    CUTE_UNROLL
    for (int g = 0; g < kGroups; ++g) {
      if (semaphores == nullptr) NamedBarrier::sync(kDQHandshakeThreads, kBarrierDQFull + g);
      if (leader) {
        bulk_reduce_add(accum + g * Traits::kDQShare, dq + g * Traits::kDQShare, kShareBytes);
        cute::tma_store_arrive();
      }
    }
    if (leader) {
      if (semaphore != nullptr) {
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // completed, not only read
        asm volatile("fence.proxy.async.global;" ::: "memory");
        __threadfence();
        atomicAdd(semaphore, 1);
      } else {
        cute::tma_store_wait<0>();  // read: the shares may be written again
      }
    }
    __syncwarp();
    // No arrival after the last tile: none waits for it.
    if (column.next(m, tiles.last) <= tiles.last) {
      CUTE_UNROLL
      for (int g = 0; g < kGroups; ++g) {
        NamedBarrier::arrive(kDQHandshakeThreads, kBarrierDQEmpty + g);
      }
    }
  }
  if (leader) cute::tma_store_wait<0>();  // shared memory outlives the reductions' reads
}

// Writes one key tile's dK (times the softmax scale) or dV from a dK / dV
// accumulator: the keys in range, zeros for keys that no query attends;
// with GQA this query head's share in fp32 to the workspace (summed per
// group later). `coords` are the accumulator's (key, column) coordinates.
template <class Element, class Acc, class Coords>
__device__ inline void store_key_grad(Acc const& acc, Coords const& coords, float scale,
                                      int keys_left, int headdim, Element* out, int64_t out_seq,
                                      float* accum, bool direct) {
  using namespace cute;
  CUTE_UNROLL
  for (int r = 0; r < size<0>(acc); ++r) {
    const int row = get<0>(coords(r, 0));
    if (row >= keys_left) continue;
    CUTE_UNROLL
    for (int c = 0; c < size<1>(acc); c += 2) {
      const int col = get<1>(coords(r, c));  // columns c, c + 1 are adjacent
      if (col >= headdim) continue;
      if (direct) {
        store_pair(out + row * out_seq + col, acc(r, c) * scale, acc(r, c + 1) * scale, true, true);
      } else {
        *reinterpret_cast<float2*>(accum + int64_t(row) * headdim + col) =
            make_float2(acc(r, c), acc(r, c + 1));
      }
    }
  }
}

// dq = scale x the dQ accumulator of one query tile, read back in the
// fragment order the main kernel's consumers staged it (DqStaging): a CTA of
// as many threads per (query tile, head, batch). The tile goes through shared
// memory so that each thread stores whole 16-byte pieces of rows (the sm90
// plan takes only 16-byte aligned rows, backward_vectors): pairs stored
// straight from the fragments half-fill their sectors and held the H100's
// store queue (Nsight Compute: lg_throttle the top stall).
template <class Traits>
__global__ void __launch_bounds__(Traits::kConsumerThreads)
    flash_bwd_sm90_convert_dq_kernel(ConvertDqParams const p) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kHeadDim = Traits::kHeadDim;
  constexpr int kThreads = Traits::kConsumerThreads;
  // Rows 16 bytes apart beyond the head dim: the fragments' pair stores
  // (8 rows by 4 column pairs per warp) fall in distinct banks.
  constexpr int kPitch = kHeadDim + 8;
  __shared__ alignas(16) Element tile[kBlockM * kPitch];
  const int tid = threadIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int m0 = blockIdx.x * kBlockM;
  const SeqExtent seq = seq_extent(p.cu_seqlens_q, p.seqlen_q, batch);
  if (m0 >= seq.len) return;
  typename Traits::TiledMmaDQ mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tid);
  auto tile_shape = Shape<Int<kBlockM>, Int<kHeadDim>>{};
  Tensor acc = partition_fragment_C(mma_dq, tile_shape);
  Tensor coords = thr_dq.partition_C(make_identity_tensor(tile_shape));
  const float4* share =
      reinterpret_cast<const float4*>(p.accum + head * p.head_stride +
                                      (seq.row0 + int64_t(batch) * kBlockM + m0) * kHeadDim +
                                      (tid / 128) * Traits::kDQShare) +
      tid % 128;
  CUTE_UNROLL
  for (int j = 0; j < size(acc) / 4; ++j) {
    const float4 v = share[j * 128];
    acc(4 * j) = v.x;
    acc(4 * j + 1) = v.y;
    acc(4 * j + 2) = v.z;
    acc(4 * j + 3) = v.w;
  }
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {  // values i, i + 1: adjacent columns of a row
    const int row = get<0>(coords(i)), col = get<1>(coords(i));
    store_pair(tile + row * kPitch + col, acc(i) * p.scale, acc(i + 1) * p.scale, true, true);
  }
  __syncthreads();
  const bool varlen = p.cu_seqlens_q != nullptr;
  Element* dq = static_cast<Element*>(p.dq) + (varlen ? seq.row0 * p.dq_seq : batch * p.dq_batch) +
                head * p.dq_head + int64_t(m0) * p.dq_seq;
  const int rows_left = seq.len - m0;
  constexpr int kPieces = kHeadDim / 8;  // 16-byte pieces per row
  static_assert(kBlockM * kPieces % kThreads == 0);
  CUTE_UNROLL
  for (int i = tid; i < kBlockM * kPieces; i += kThreads) {
    const int row = i / kPieces, col = i % kPieces * 8;
    if (row >= rows_left || col >= p.headdim) continue;
    *reinterpret_cast<uint4*>(dq + int64_t(row) * p.dq_seq + col) =
        *reinterpret_cast<const uint4*>(tile + row * kPitch + col);
  }
}

}  // namespace samattn::attention::sm90
