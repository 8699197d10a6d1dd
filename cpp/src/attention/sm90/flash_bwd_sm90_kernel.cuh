// The sm90 attention backward kernel (Hopper, sm_90a): FlashAttention's
// backward on wgmma, with TMA loads and warp specialization.
//
// A CTA owns one key tile (kBlockN keys of one head) and walks the query
// tiles that attend it. Warpgroup 0 is the producer: one thread loads K and
// V once and then each query tile's Q and dO with TMA into kStages buffers,
// a second warp fills the same stage with the rows' LSE (times log2 e) and
// D = rowsum(dO * O), and a third writes dQ out (bwd_dq_writer). Two consumer
// warpgroups follow. Per query tile, with the key tile's rows as the MMA's M
// so that P and dS come out of the accumulators as the register A operands of
// the next GEMMs:
//   S^T = K Q^T and dP^T = V dO^T      (both operands in shared memory)
//   P^T = exp2(S^T scale_log2 - LSE),  dS^T = P^T (dP^T - D)
//   dV += P^T dO,  dK += dS^T Q        (P^T, dS^T from registers)
//   dQ = dS K                          (dS through shared memory)
// Up to head dim 128 each consumer owns 64 keys and does all of this for
// them (consume_key_halves); the two meet once per query tile, when both
// have written their dS (two dS buffers, so that neither waits for the
// other's dQ GEMM). Past 128, dK and dV of 64 keys would take the whole
// register file of one warpgroup, so the tile has 64 keys and the two
// consumers split the work by role (consume_roles): one computes S^T, P^T
// and dV, the other dP^T, dS^T and dK, P^T passing between them through
// shared memory in fp32.
// Either way each consumer computes dQ over all keys of the tile, for its
// 64 query rows (query tiles of 128 rows) or else its part of the head dim,
// and stages it in shared memory (DqStaging); the writer warp adds each part
// to the fp32 accumulator with a bulk reduction (cp.reduce.async.bulk,
// applied in the L2 without a round trip per element), so that the
// consumers never wait on global memory.
// flash_bwd_sm90_convert_dq_kernel reads the accumulator back in the same
// fragment order. Softcap multiplies dS by tanh's derivative; the
// deterministic mode orders each query tile's reductions by key tile (the
// writer waits for its turn). With an attention mask, the mask's tile map
// (mask_tiles.cuh) lets a key tile skip the query tiles the mask leaves out
// entirely (no turn taken in that order) and read the mask only in those it
// cuts.
//
// The parts: flash_bwd_sm90_traits.cuh (types and parameters),
// flash_bwd_sm90_mainloop.cuh (producer and consumers),
// flash_bwd_sm90_epilogue.cuh (dQ writer, dK / dV stores, dQ conversion).
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

#include "attention/sm90/flash_bwd_sm90_epilogue.cuh"
#include "attention/sm90/flash_bwd_sm90_mainloop.cuh"
#include "attention/sm90/flash_bwd_sm90_traits.cuh"

namespace samattn::attention::sm90 {

// kTerms: masked, the variant that reads an attention mask (and writes its
// gradient); computed, the one with dropout; none, neither (ALiBi is in all
// three).
template <class Traits, TermsKernel kTerms>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_bwd_sm90_kernel(CUTE_GRID_CONSTANT BwdParams<Traits> const p) {
  using namespace cute;
  using Transaction = cutlass::arch::ClusterTransactionBarrier;
  using Barrier = cutlass::arch::ClusterBarrier;
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
  const int n0 = n_block * Traits::kBlockN;
  if (n0 >= mask.seqlen_k) return;
  QueryTiles tiles = query_tiles(mask, n_block, Traits::kBlockM, Traits::kBlockN);
  // The masked kernel skips the query tiles that its mask leaves out entirely.
  MaskTileColumn column{nullptr, 0};
  if constexpr (kTerms == TermsKernel::masked) {
    column = mask_tile_column(p.mask_tiles, batch, head, n_block);
    while (tiles.first <= tiles.last && column.empty(tiles.first)) ++tiles.first;
    while (tiles.last >= tiles.first && column.empty(tiles.last)) --tiles.last;
  }

  extern __shared__ __align__(1024) char smem_raw[];
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw);
  BwdSmemTensors<Traits> s{
      make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKV{}),
      make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutKV{}),
      make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKt{}),
      make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{}),
      make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutQ{}),
      make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQt{}),
      make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutQt{}),
      make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::SmemLayoutDS{}),
      make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::SmemLayoutDSt{}),
  };

  const int warp_group = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  if (threadIdx.x == 0) {
    Transaction::init(&smem.kv_full, 1);
    CUTE_UNROLL
    for (int i = 0; i < Traits::kStages; ++i) {
      Transaction::init(&smem.q_full[i], 1);
      Transaction::init(&smem.do_full[i], 1);
      Barrier::init(&smem.rows_full[i], 32);
      Barrier::init(&smem.empty[i], Traits::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (threadIdx.x / 32 == 2) {
      // dQ's accumulator rows of query tile 0 of this (batch, head), and its
      // query tiles' semaphores (deterministic).
      float* dq_tile_base = p.dq_accum + head * p.dq_head_stride +
                            (seq_q.row0 + int64_t(batch) * Traits::kBlockM) * Traits::kHeadDim;
      int* semaphores = p.semaphores == nullptr
                            ? nullptr
                            : p.semaphores + (int64_t(batch) * gridDim.y + head) * p.sem_per_head;
      bwd_dq_writer<Traits>(smem.dq.data(), dq_tile_base, semaphores, mask, tiles, column, n_block);
    } else {
      bwd_producer(p, smem, tiles, column, seq_q, seq_k, n_block, head, batch, s.q, s.dout, s.k,
                   s.v);
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int tidx = int(threadIdx.x) - 128;
  const int64_t accum_offset = (head * p.rows_k + seq_k.row0 + n0) * int64_t(p.headdim);
  float* mask_grad = nullptr;
  if constexpr (kTerms == TermsKernel::masked) {
    const int64_t pairs = int64_t(mask.seqlen_q) * mask.seqlen_k;
    if (p.dmask != nullptr) mask_grad = p.dmask + (int64_t(batch) * gridDim.y + head) * pairs;
  }
  const BwdTile<Traits> t{
      mask,
      tiles,
      n_block,
      n0,
      p.dk + (varlen ? seq_k.row0 * p.dk_seq : batch * p.dk_batch) + head * p.dk_head +
          int64_t(n0) * p.dk_seq,
      p.dv + (varlen ? seq_k.row0 * p.dv_seq : batch * p.dv_batch) + head * p.dv_head +
          int64_t(n0) * p.dv_seq,
      p.kv_group == 1 ? nullptr : p.dk_accum + accum_offset,
      p.kv_group == 1 ? nullptr : p.dv_accum + accum_offset,
      p.kv_group == 1,
      batch,
      head,
      mask_grad,
      // Reads the seed only with dropout.
      DropoutRng(kTerms == TermsKernel::computed ? p.terms.dropout : DropoutParams{}, batch,
                 int(gridDim.y), head),
      column,
  };
  if constexpr (Traits::kRoles) {
    consume_roles<kTerms>(p, t, smem, s, tidx);
  } else {
    consume_key_halves<kTerms>(p, t, smem, s, tidx);
  }
}

}  // namespace samattn::attention::sm90
