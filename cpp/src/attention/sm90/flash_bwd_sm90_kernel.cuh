// The sm90 attention backward kernel (Hopper, sm_90a): FlashAttention's
// backward on wgmma, with TMA loads and warp specialization.
//
// A CTA owns one key tile (kBlockN keys of one head) and walks the query
// tiles that attend it. Warpgroup 0 is the producer: one thread loads K and
// V once and then each query tile's Q and dO with TMA into kStages buffers,
// and a second warp fills the same stage with the rows' LSE (times log2 e)
// and D = rowsum(dO * O). Warpgroups 1.. are consumers, each owning 64 keys.
// Per query tile, with the key tile's rows as the MMA's M so that P and dS
// come out of the accumulators as the register A operands of the next GEMMs:
//   S^T = K Q^T and dP^T = V dO^T      (both operands in shared memory)
//   P^T = exp2(S^T scale_log2 - LSE),  dS^T = P^T (dP^T - D)
//   dV += P^T dO,  dK += dS^T Q        (P^T, dS^T from registers)
//   dQ = dS K                          (dS through shared memory)
// Each consumer computes dQ for its half of the head dim over all keys of
// the tile, writes it to shared memory in fragment order and one thread adds
// the whole query tile to the fp32 accumulator with a bulk reduction
// (cp.reduce.async.bulk), which the L2 applies without a round trip per
// element. flash_bwd_sm90_convert_dq_kernel reads the accumulator back in
// the same fragment order. Softcap multiplies dS by tanh's derivative; the
// deterministic mode orders each query tile's reductions by key tile.
#pragma once

// cute/tensor.hpp first: the Hopper atoms below need what it declares.
#include <cute/tensor.hpp>
// clang-format off
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
// clang-format on
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "attention/flash_bwd_kernel.cuh"
#include "attention/mask.cuh"
#include "attention/sm90/flash_bwd_sm90_config.h"
#include "attention/sm90/gmem_tensor.cuh"
#include "attention/sm90/gmma_fragment.cuh"
#include "attention/sm90/warpgroup.cuh"
#include "attention/softmax_online.cuh"
#include "common/tensor_core_types.cuh"

namespace samattn::attention::sm90 {

template <class Config>
struct BwdTraits {
  using Element = typename tensor_core::ElementOf<Config::kDType>::type;
  static constexpr int kHeadDim = Config::kHeadDim, kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN, kStages = Config::kStages;
  static constexpr int kConsumerGroups = kBlockN / 64;
  static constexpr int kConsumerThreads = 128 * kConsumerGroups;
  static constexpr int kThreads = 128 + kConsumerThreads;
  // Registers per thread after setmaxnreg (multiples of 8) out of the CTA's
  // pool, the launch's allocation (a setmaxnreg.inc beyond it waits forever):
  // the producer needs few, the consumers take the rest.
  static constexpr int kLaunchRegs = 64 * 1024 / kThreads / 8 * 8;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs =
      std::min(256, (kLaunchRegs * kThreads - 128 * kProducerRegs) / kConsumerThreads / 8 * 8);
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kLaunchRegs * kThreads);

  // S^T and dP^T: each consumer warpgroup takes 64 rows (keys).
  using GroupLayout = cute::Layout<cute::Shape<cute::Int<kConsumerGroups>, cute::_1, cute::_1>>;
  using TiledMmaSdP = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<kBlockM>, cute::Int<kHeadDim>>>(),
      GroupLayout{}));
  // dV += P^T dO and dK += dS^T Q: the A operand from registers, the B
  // operand (head dim, query rows) read head-dim-contiguous (MN-major).
  using TiledMmaDKV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<kHeadDim>, cute::Int<kBlockM>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      GroupLayout{}));
  // dQ = dS K: the warpgroups split the head dim; dS (query rows, keys) is
  // stored query-contiguous, K read as (head dim, keys): both MN-major.
  using TiledMmaDQ = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<
          Element, Element, float,
          cute::Shape<cute::_64, cute::Int<kHeadDim / kConsumerGroups>, cute::Int<kBlockN>>,
          cute::GMMA::Major::MN, cute::GMMA::Major::MN>(),
      cute::Layout<cute::Shape<cute::_1, cute::Int<kConsumerGroups>, cute::_1>>{}));

  using SmemAtom = cute::GMMA::Layout_K_SW128_Atom<Element>;
  // K and V: each dQ warpgroup reads K^T's columns of its half of the head
  // dim, which must be whole swizzle atoms (64 elements wide at 128 bytes).
  using SmemAtomKV = std::conditional_t<(kHeadDim / kConsumerGroups) % 64 == 0, SmemAtom,
                                        cute::GMMA::Layout_K_SW64_Atom<Element>>;
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SmemAtomKV{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}));
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>, cute::Int<kStages>>{}));
  // Q's and dO's buffers as (head dim, query rows, stage), K's as (head dim,
  // keys): B operands of dK, dV and dQ.
  using SmemLayoutQt = decltype(cute::composition(
      SmemLayoutQ{}, cute::make_ordered_layout(
                         cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockM>, cute::Int<kStages>>{},
                         cute::Step<cute::_2, cute::_1, cute::_3>{})));
  using SmemLayoutKt = decltype(cute::composition(
      SmemLayoutKV{},
      cute::make_ordered_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>>{},
                                cute::Step<cute::_2, cute::_1>{})));
  // dS as (query rows, keys), query-contiguous; dS^T its (keys, query rows)
  // view, written from the dS^T accumulators.
  using SmemLayoutDS =
      decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<Element>{},
                                   cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>>{}));
  using SmemLayoutDSt = decltype(cute::composition(
      SmemLayoutDS{},
      cute::make_ordered_layout(cute::Shape<cute::Int<kBlockN>, cute::Int<kBlockM>>{},
                                cute::Step<cute::_2, cute::_1>{})));

  using GmemShape = sm90::GmemShape;
  using GmemLayout = sm90::GmemLayout;
  using TileQ = cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>;
  using TileKV = cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>;
  using TmaQ = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{},
      cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemLayout{}),
      cute::take<0, 2>(SmemLayoutQ{}), TileQ{}, cute::_1{}));
  using TmaKV = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{},
      cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemLayout{}),
      SmemLayoutKV{}, TileKV{}, cute::_1{}));

  static constexpr uint32_t kBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kBytesKV = kBlockN * kHeadDim * sizeof(Element);
  // One query tile of dQ in fp32, in fragment order (dq_fragment_index).
  static constexpr int kDQFloats = kBlockM * kHeadDim;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutDS>, 1024> ds;
    cute::array_aligned<float, kDQFloats, 128> dq;
    float lse[kStages][kBlockM];   // LSE x log2 e; +inf past the sequence
    float dsum[kStages][kBlockM];  // D; 0 past the sequence
    uint64_t kv_full;
    uint64_t q_full[kStages], do_full[kStages], rows_full[kStages], empty[kStages];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= Config::kSmemBytes, "flash_bwd_sm90_smem is too small");
};

template <class Traits>
struct BwdParams {
  typename Traits::TmaQ tma_q, tma_do;
  typename Traits::TmaKV tma_k, tma_v;
  // (seq, head dim, heads, batch); varlen: (total rows, head dim, heads, 1)
  typename Traits::GmemShape shape_q, shape_k;
  // Varlen: sequence b is rows [cu[b], cu[b + 1]) of the packed tensors.
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  const float* lse;
  int64_t lse_batch, lse_head, lse_seq;
  const float* dsum;  // (nheads, rows_q), step 1's
  int64_t rows_q;
  float* dq_accum;  // per query tile in fragment order, zeroed by step 1
  int64_t dq_head_stride;
  typename Traits::Element* dk;
  typename Traits::Element* dv;
  int64_t dk_batch, dk_seq, dk_head, dv_batch, dv_seq, dv_head;
  float* dk_accum;  // GQA: this query head's dK and dV in fp32, (nheads, rows_k, headdim)
  float* dv_accum;
  int64_t rows_k;
  AttentionMask mask;  // fixed length; varlen: its window, with each sequence's lengths
  int kv_group, headdim;
  float scale_log2, softmax_scale;
  float softcap, softcap_pre;  // 0: no softcap (attention_problem.h)
  // Deterministic: per (batch, head, query tile) the number of key tiles that
  // have added their dQ, so that they add in key-tile order; nullptr: any order.
  int* semaphores;
  int sem_per_head;
};

// The query tiles [first, last] that attend some key of key tile n_block
// (one range: both ends of a row's key range grow with the row); empty when
// last < first. A scan, so that it agrees exactly with key_tiles.
struct QueryTiles {
  int first, last;
};
__device__ inline QueryTiles query_tiles(const AttentionMask& mask, int n_block, int block_m,
                                         int block_n) {
  QueryTiles range{0, -1};
  const int m_blocks = (mask.seqlen_q + block_m - 1) / block_m;
  for (int m = 0; m < m_blocks; ++m) {
    int n_begin, n_end;
    mask.key_tiles(m * block_m, block_m, block_n, n_begin, n_end);
    if (n_begin <= n_block && n_block < n_end) {
      if (range.last < 0) range.first = m;
      range.last = m;
    } else if (range.last >= 0) {
      break;
    }
  }
  return range;
}

// Adds `bytes` of fp32 from shared memory to global memory in the L2 (an
// asynchronous bulk operation of the issuing thread's bulk group).
__device__ inline void bulk_reduce_add(float* global, const float* shared, uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(global),
      "r"(cute::cast_smem_ptr_to_uint(shared)), "r"(bytes)
      : "memory");
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_bwd_sm90_kernel(CUTE_GRID_CONSTANT BwdParams<Traits> const p) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Transaction = cutlass::arch::ClusterTransactionBarrier;
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim, kStages = Traits::kStages;
  constexpr float kLog2e = 1.4426950408889634f;
  using SharedStorage = typename Traits::SharedStorage;

  // Key tiles fastest: the CTAs running at once share a head's Q and dO in L2
  // (measured on the H100, causal calls: up to 1.5x faster than taking every
  // head's key tiles with the most work first).
  const int n_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const SeqExtent seq_q = seq_extent(p.cu_seqlens_q, p.mask.seqlen_q, batch);
  const SeqExtent seq_k = seq_extent(p.cu_seqlens_k, p.mask.seqlen_k, batch);
  AttentionMask mask = p.mask;
  mask.seqlen_q = seq_q.len;
  mask.seqlen_k = seq_k.len;
  const int n0 = n_block * kBlockN;
  if (n0 >= mask.seqlen_k) return;
  const QueryTiles tiles = query_tiles(mask, n_block, kBlockM, kBlockN);

  extern __shared__ __align__(1024) char smem_raw[];
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw);
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutKV{});
  Tensor sKt = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKt{});
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQt{});
  Tensor sdO = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutQ{});
  Tensor sdOt = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutQt{});
  Tensor sdS = make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::SmemLayoutDS{});
  Tensor sdSt = make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::SmemLayoutDSt{});

  const int warp_group = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  if (threadIdx.x == 0) {
    Transaction::init(&smem.kv_full, 1);
    CUTE_UNROLL
    for (int s = 0; s < kStages; ++s) {
      Transaction::init(&smem.q_full[s], 1);
      Transaction::init(&smem.do_full[s], 1);
      Barrier::init(&smem.rows_full[s], 32);
      Barrier::init(&smem.empty[s], Traits::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warp_group == 0) {
    // ------------------------------------------------------------ producer
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    if (warp == 0) {
      if (!cute::elect_one_sync() || tiles.last < tiles.first) return;
      Tensor mQ = p.tma_q.get_tma_tensor(p.shape_q);
      Tensor mdO = p.tma_do.get_tma_tensor(p.shape_q);
      Tensor mK = p.tma_k.get_tma_tensor(p.shape_k);
      Tensor mV = p.tma_v.get_tma_tensor(p.shape_k);
      // Tiles from the sequence's first row (varlen: the rows past its end are
      // the next sequence's, which LSE = +inf and the key mask leave out).
      const int head_k = head / p.kv_group, tma_batch = varlen ? 0 : batch;
      const auto q_start = make_coord(varlen ? int(seq_q.row0) : 0, 0);
      const auto k_start = make_coord(varlen ? int(seq_k.row0) : 0, 0);
      Tensor gQ = local_tile(domain_offset(q_start, mQ(_, _, head, tma_batch)),
                             typename Traits::TileQ{}, make_coord(_, 0));
      Tensor gdO = local_tile(domain_offset(q_start, mdO(_, _, head, tma_batch)),
                              typename Traits::TileQ{}, make_coord(_, 0));
      Tensor gK = local_tile(domain_offset(k_start, mK(_, _, head_k, tma_batch)),
                             typename Traits::TileKV{}, make_coord(n_block, 0));
      Tensor gV = local_tile(domain_offset(k_start, mV(_, _, head_k, tma_batch)),
                             typename Traits::TileKV{}, make_coord(n_block, 0));
      auto [tQgQ, tQsQ] = tma_partition(p.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                        group_modes<0, 2>(gQ));
      auto [tOgO, tOsO] = tma_partition(p.tma_do, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sdO),
                                        group_modes<0, 2>(gdO));
      auto [tKgK, tKsK] = tma_partition(p.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                        group_modes<0, 2>(gK));
      auto [tVgV, tVsV] = tma_partition(p.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                        group_modes<0, 2>(gV));
      Transaction::arrive_and_expect_tx(&smem.kv_full, 2 * Traits::kBytesKV);
      copy(p.tma_k.with(smem.kv_full), tKgK, tKsK);
      copy(p.tma_v.with(smem.kv_full), tVgV, tVsV);
      int stage = 0, phase = 0;
      for (int m = tiles.first; m <= tiles.last; ++m) {
        wait_barrier(smem.empty[stage], phase ^ 1);
        Transaction::arrive_and_expect_tx(&smem.q_full[stage], Traits::kBytesQ);
        copy(p.tma_q.with(smem.q_full[stage]), tQgQ(_, m), tQsQ(_, stage));
        Transaction::arrive_and_expect_tx(&smem.do_full[stage], Traits::kBytesQ);
        copy(p.tma_do.with(smem.do_full[stage]), tOgO(_, m), tOsO(_, stage));
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    } else if (warp == 1) {
      // The rows' LSE and D, next to the stage's Q and dO: lane l takes rows
      // l, l + 32, ... of each tile (pointers stepped, not recomputed: the
      // producer's 24 registers hold no more).
      static_assert(kBlockM % 32 == 0);
      int row = tiles.first * kBlockM + lane;
      const int64_t lse_step = 32 * p.lse_seq;
      const float* lse = p.lse + (varlen ? seq_q.row0 * p.lse_seq : batch * p.lse_batch) +
                         head * p.lse_head + row * p.lse_seq;
      const float* dsum = p.dsum + head * p.rows_q + seq_q.row0 + row;
      int stage = 0, phase = 0;
#pragma unroll 1
      for (int m = tiles.first; m <= tiles.last; ++m) {
        wait_barrier(smem.empty[stage], phase ^ 1);
        CUTE_UNROLL
        for (int i = lane; i < kBlockM; i += 32, row += 32, lse += lse_step, dsum += 32) {
          const bool valid = row < mask.seqlen_q;
          smem.lse[stage][i] = valid ? *lse * kLog2e : INFINITY;
          smem.dsum[stage][i] = valid ? *dsum : 0.0f;
        }
        Barrier::arrive(&smem.rows_full[stage]);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    return;
  }

  // ------------------------------------------------------------- consumers
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int tidx = int(threadIdx.x) - 128;
  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmaDKV mma_dkv;
  typename Traits::TiledMmaDQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tidx);
  auto thr_dkv = mma_dkv.get_thread_slice(tidx);
  auto thr_dq = mma_dq.get_thread_slice(tidx);
  Tensor tSrK = thr_sdp.partition_fragment_A(sK);    // (MMA, MMA_M, MMA_K)
  Tensor tSrV = thr_sdp.partition_fragment_A(sV);    // (MMA, MMA_M, MMA_K)
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);    // (MMA, MMA_N, MMA_K, stage)
  Tensor tSrdO = thr_sdp.partition_fragment_B(sdO);  // (MMA, MMA_N, MMA_K, stage)
  Tensor tdVrdO = thr_dkv.partition_fragment_B(sdOt);
  Tensor tdKrQ = thr_dkv.partition_fragment_B(sQt);
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
  Tensor tdQrK = thr_dq.partition_fragment_B(sKt);
  Tensor tdSsdS = thr_sdp.partition_C(sdSt);  // where this thread's dS^T goes

  auto tile_kv = Shape<Int<kBlockN>, Int<kHeadDim>>{};
  Tensor acc_dk = partition_fragment_C(mma_dkv, tile_kv);
  Tensor acc_dv = partition_fragment_C(mma_dkv, tile_kv);
  clear(acc_dk);
  clear(acc_dv);

  if (tiles.last >= tiles.first) {
    Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
    Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
    // (key, query row) of each S^T element within the tile.
    Tensor coords = gmma_rowcol_view(
        thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{})));
    Tensor scores = gmma_rowcol_view(acc_s);
    Tensor dscores = gmma_rowcol_view(acc_dp);
    // P^T and dS^T as the A operands of dV and dK.
    Tensor tdVrP = make_tensor<Element>(gmma_c_to_a_layout(acc_s.layout()));
    Tensor tdKrdS = make_tensor<Element>(gmma_c_to_a_layout(acc_dp.layout()));
    float* dq_tile_base =
        p.dq_accum + head * p.dq_head_stride + (seq_q.row0 + int64_t(batch) * kBlockM) * kHeadDim;

    // dQ of a query tile goes to the accumulator through shared memory, in
    // fragment order, then one bulk reduction. The reduction is issued after
    // the next tile's S^T and dP^T, so that the tensor cores run them while
    // the consumers meet at its barrier (no wgmma is in flight across the
    // loop's back edge: ptxas serializes every wgmma of a kernel where one
    // is, and acc_dq is not kept live next to the next tile's S^T and dP^T).
    // Deterministic: the key tiles of a query tile add in their order, each
    // after the one before has finished (the bulk reduction completed, then
    // the semaphore released), so the sums round the same way on every run.
    int* semaphores = p.semaphores == nullptr
                          ? nullptr
                          : p.semaphores + (int64_t(batch) * gridDim.y + head) * p.sem_per_head;
    auto reduce_dq = [&](int m0) {
      cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, 2);
      if (tidx != 0) return;
      int* semaphore = nullptr;
      if (semaphores != nullptr) {
        int n_begin, n_end;
        mask.key_tiles(m0, kBlockM, kBlockN, n_begin, n_end);
        semaphore = semaphores + m0 / kBlockM;
        while (load_acquire(semaphore) != n_block - n_begin) {
        }
        asm volatile("fence.proxy.async.global;" ::: "memory");  // the reduction after the wait
      }
      bulk_reduce_add(dq_tile_base + int64_t(m0) * kHeadDim, smem.dq.data(),
                      Traits::kDQFloats * sizeof(float));
      tma_store_arrive();
      if (semaphore != nullptr) {
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // completed, not only read
        asm volatile("fence.proxy.async.global;" ::: "memory");
        __threadfence();
        atomicAdd(semaphore, 1);
      }
    };
    wait_barrier(smem.kv_full, 0);
    int stage = 0, phase = 0;
    for (int m = tiles.first; m <= tiles.last; ++m) {
      const int m0 = m * kBlockM;
      wait_barrier(smem.q_full[stage], phase);
      warpgroup_gemm<true, -1>(mma_sdp, tSrK, tSrQ(_, _, _, stage), acc_s);
      wait_barrier(smem.do_full[stage], phase);
      warpgroup_gemm<true, -1>(mma_sdp, tSrV, tSrdO(_, _, _, stage), acc_dp);
      if (m > tiles.first) reduce_dq(m0 - kBlockM);
      wait_barrier(smem.rows_full[stage], phase);
      warpgroup_wait<1>();  // S^T
      warpgroup_fence_operand(acc_s);
      if (p.softcap > 0.0f) {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i)
          acc_s(i) = p.softcap * tanhf(acc_s(i) * p.softcap_pre);
      }
      // Keys outside a query row's range: -inf, so P = 0.
      if (mask.tile_needs_mask(m0, kBlockM, n0, kBlockN)) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(scores); ++c) {
          const int row = m0 + get<1>(coords(0, c));
          const int lo = mask.first_key(row), hi = mask.key_end(row);
          CUTE_UNROLL
          for (int r = 0; r < size<0>(scores); ++r) {
            const int key = n0 + get<0>(coords(r, 0));
            if (key < lo || key >= hi) scores(r, c) = -INFINITY;
          }
        }
      }
      const float* lse = smem.lse[stage];
      const float* dsum = smem.dsum[stage];
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) {
        const float row_lse = lse[get<1>(coords(0, c))];
        CUTE_UNROLL
        for (int r = 0; r < size<0>(scores); ++r) {
          scores(r, c) = fast_exp2(scores(r, c) * p.scale_log2 - row_lse);
        }
      }
      convert_gmma_fragment(acc_s, tdVrP);
      warpgroup_gemm<false, -1>(mma_dkv, tdVrP, tdVrdO(_, _, _, stage), acc_dv);
      warpgroup_wait<1>();  // dP^T
      warpgroup_fence_operand(acc_dp);
      CUTE_UNROLL
      for (int c = 0; c < size<1>(dscores); ++c) {
        const float row_dsum = dsum[get<1>(coords(0, c))];
        CUTE_UNROLL
        for (int r = 0; r < size<0>(dscores); ++r) {
          dscores(r, c) = scores(r, c) * (dscores(r, c) - row_dsum);
        }
      }
      if (p.softcap > 0.0f) {
        // The gradient through softcap's tanh: 1 - tanh^2, with tanh recovered
        // from P (scale_log2 is log2 e: log2 P + LSE log2 e = log2 e softcap
        // tanh); P = 0 (masked or underflowed) already gives dS = 0.
        const float tanh_per_log2 = 1.0f / (p.scale_log2 * p.softcap);
        CUTE_UNROLL
        for (int c = 0; c < size<1>(dscores); ++c) {
          const float row_lse = lse[get<1>(coords(0, c))];
          CUTE_UNROLL
          for (int r = 0; r < size<0>(dscores); ++r) {
            if (scores(r, c) > 0.0f) {
              const float t = (fast_log2(scores(r, c)) + row_lse) * tanh_per_log2;
              dscores(r, c) *= 1.0f - t * t;
            }
          }
        }
      }
      convert_gmma_fragment(acc_dp, tdKrdS);
      warpgroup_gemm<false, -1>(mma_dkv, tdKrdS, tdKrQ(_, _, _, stage), acc_dk);
      // dS for dQ: every consumer's keys, through shared memory. The last
      // step's dQ GEMM has read it (each thread waited for its own before
      // the dQ barrier in reduce_dq).
      copy(make_tensor(tdKrdS.data(), acc_dp.layout()), tdSsdS);
      cutlass::arch::fence_view_async_shared();  // wgmma reads what these stores wrote
      // This step's dQ is written to the shared dQ tile below: the last bulk
      // reduction must have read it.
      if (tidx == 0) tma_store_wait<0>();
      cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, 1);
      warpgroup_gemm<true, -1>(mma_dq, tdQrdS, tdQrK, acc_dq);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_dk);
      warpgroup_fence_operand(acc_dv);
      warpgroup_fence_operand(acc_dq);
      Barrier::arrive(&smem.empty[stage]);  // Q, dO, LSE and D of this stage are read
      CUTE_UNROLL
      for (int i = 0; i < size(acc_dq); ++i) {
        smem.dq[i * Traits::kConsumerThreads + tidx] = acc_dq(i);
      }
      cutlass::arch::fence_view_async_shared();  // the bulk reduction reads these
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
    reduce_dq(tiles.last * kBlockM);
    if (tidx == 0) tma_store_wait<0>();  // shared memory outlives the reduction's reads
  }

  // Epilogue: dK (times the softmax scale) and dV of the keys in range,
  // zeros for keys that no query attends; with GQA this query head's share
  // in fp32 to the workspace (summed per group later).
  Tensor dk_rc = gmma_rowcol_view(acc_dk);
  Tensor dv_rc = gmma_rowcol_view(acc_dv);
  Tensor kv_coords = gmma_rowcol_view(thr_dkv.partition_C(make_identity_tensor(tile_kv)));
  const int keys_left = mask.seqlen_k - n0;
  const bool direct = p.kv_group == 1;
  Element* dk_out = p.dk + (varlen ? seq_k.row0 * p.dk_seq : batch * p.dk_batch) +
                    head * p.dk_head + int64_t(n0) * p.dk_seq;
  Element* dv_out = p.dv + (varlen ? seq_k.row0 * p.dv_seq : batch * p.dv_batch) +
                    head * p.dv_head + int64_t(n0) * p.dv_seq;
  const int64_t accum_offset = (head * p.rows_k + seq_k.row0 + n0) * int64_t(p.headdim);
  CUTE_UNROLL
  for (int r = 0; r < size<0>(dk_rc); ++r) {
    const int row = get<0>(kv_coords(r, 0));
    if (row >= keys_left) continue;
    CUTE_UNROLL
    for (int c = 0; c < size<1>(dk_rc); c += 2) {
      const int col = get<1>(kv_coords(r, c));  // columns c, c + 1 are adjacent
      if (col >= p.headdim) continue;
      if (direct) {
        store_pair(dk_out + row * p.dk_seq + col, dk_rc(r, c) * p.softmax_scale,
                   dk_rc(r, c + 1) * p.softmax_scale, true, true);
        store_pair(dv_out + row * p.dv_seq + col, dv_rc(r, c), dv_rc(r, c + 1), true, true);
      } else {
        const int64_t offset = accum_offset + int64_t(row) * p.headdim + col;
        *reinterpret_cast<float2*>(p.dk_accum + offset) = make_float2(dk_rc(r, c), dk_rc(r, c + 1));
        *reinterpret_cast<float2*>(p.dv_accum + offset) = make_float2(dv_rc(r, c), dv_rc(r, c + 1));
      }
    }
  }
}

// dq = scale x the dQ accumulator of one query tile, read back in the
// fragment order the main kernel's consumers wrote it (element i of consumer
// thread t at i x threads + t): a CTA of that many threads per (query tile,
// head, batch).
template <class Traits>
__global__ void __launch_bounds__(Traits::kConsumerThreads)
    flash_bwd_sm90_convert_dq_kernel(ConvertDqParams const p) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kHeadDim = Traits::kHeadDim;
  const int tid = threadIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int m0 = blockIdx.x * kBlockM;
  const SeqExtent seq = seq_extent(p.cu_seqlens_q, p.seqlen_q, batch);
  if (m0 >= seq.len) return;
  typename Traits::TiledMmaDQ mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tid);
  auto tile = Shape<Int<kBlockM>, Int<kHeadDim>>{};
  Tensor acc = partition_fragment_C(mma_dq, tile);
  Tensor coords = thr_dq.partition_C(make_identity_tensor(tile));
  const float* accum =
      p.accum + head * p.head_stride + (seq.row0 + int64_t(batch) * kBlockM + m0) * kHeadDim + tid;
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) acc(i) = accum[i * Traits::kConsumerThreads];
  const bool varlen = p.cu_seqlens_q != nullptr;
  Element* dq = static_cast<Element*>(p.dq) + (varlen ? seq.row0 * p.dq_seq : batch * p.dq_batch) +
                head * p.dq_head + int64_t(m0) * p.dq_seq;
  const int rows_left = seq.len - m0;
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {  // values i, i + 1: adjacent columns of a row
    const int row = get<0>(coords(i)), col = get<1>(coords(i));
    if (row >= rows_left || col >= p.headdim) continue;
    store_pair(dq + int64_t(row) * p.dq_seq + col, acc(i) * p.scale, acc(i + 1) * p.scale, true,
               true);
  }
}

}  // namespace samattn::attention::sm90
