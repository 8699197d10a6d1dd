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
// Either way each consumer computes dQ for its part of the head dim over all
// keys of the tile and stages it in shared memory (DqStaging); the writer
// warp adds each part to the fp32 accumulator with a bulk reduction
// (cp.reduce.async.bulk, applied in the L2 without a round trip per
// element), so that the consumers never wait on global memory.
// flash_bwd_sm90_convert_dq_kernel reads the accumulator back in the same
// fragment order. Softcap multiplies dS by tanh's derivative; the
// deterministic mode orders each query tile's reductions by key tile (the
// writer waits for its turn). With an attention mask, the mask's tile map
// (mask_tiles.cuh) lets a key tile skip the query tiles the mask leaves out
// entirely (no turn taken in that order) and read the mask only in those it
// cuts.
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

#include "attention/dropout.cuh"
#include "attention/flash_bwd_kernel.cuh"
#include "attention/mask.cuh"
#include "attention/mask_tiles.cuh"
#include "attention/score_terms.cuh"
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
  // Past head dim 128 the consumers split the work by role (consume_roles):
  // one key tile of 64 keys, whose dV one warpgroup accumulates and whose dK
  // the other.
  static constexpr bool kRoles = kHeadDim > 128;
  static_assert(!kRoles || kBlockN == 64, "split roles take 64 keys");
  static constexpr int kConsumerGroups = kRoles ? 2 : kBlockN / 64;
  // Query tiles of 128 rows: S^T and dP^T take 64 registers each, so dV is
  // issued only once dS is computed and P^T in fp32 is dead (else dV's
  // GEMM runs while dS is computed).
  static constexpr bool kLateDV = !kRoles && kBlockM > 64;
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

  // S^T and dP^T, dV and dK: each consumer warpgroup takes 64 rows (keys);
  // with split roles each computes its own GEMMs over all 64 keys.
  using GroupLayout =
      cute::Layout<cute::Shape<cute::Int<kRoles ? 1 : kConsumerGroups>, cute::_1, cute::_1>>;
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
  // dS buffers. With key halves a second one lets a warpgroup write the next
  // query tile's dS while the other still reads this one in its dQ GEMM, so
  // that the two meet once per query tile; with split roles the P^T barrier
  // already orders them.
  static constexpr int kDSStages = kRoles ? 1 : 2;
  // dS as (query rows, keys, stage), query-contiguous; dS^T its (keys, query
  // rows, stage) view, written from the dS^T accumulators.
  using SmemLayoutDS = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_MN_SW128_Atom<Element>{},
      cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>, cute::Int<kDSStages>>{}));
  using SmemLayoutDSt = decltype(cute::composition(
      SmemLayoutDS{},
      cute::make_ordered_layout(
          cute::Shape<cute::Int<kBlockN>, cute::Int<kBlockM>, cute::Int<kDSStages>>{},
          cute::Step<cute::_2, cute::_1, cute::_3>{})));

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
  // One query tile of dQ in fp32: each consumer warpgroup's share (its part
  // of the head dim) contiguous, in fragment order (DqStaging).
  static constexpr int kDQFloats = kBlockM * kHeadDim;
  static constexpr int kDQShare = kDQFloats / kConsumerGroups;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutDS>, 1024> ds;
    cute::array_aligned<float, kDQFloats, 128> dq;
    // Split roles: P^T of one query tile in fp32, in fragment order.
    cute::array_aligned<float, kRoles ? kBlockN * kBlockM : 4, 128> probs;
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
  // ALiBi, an attention mask (the masked kernel; fixed length only) and
  // dropout (the dropout kernel), as the other attention kernels read them
  // (score_terms.cuh).
  ScoreTermsParams terms;
  // The additive mask's gradient, fp32 (batch, nheads, seqlen_q, seqlen_k)
  // zeroed by the caller; nullptr: not computed.
  float* dmask;
  // Deterministic: per (batch, head, query tile) the number of key tiles that
  // have added their dQ, so that they add in key-tile order; nullptr: any order.
  int* semaphores;
  int sem_per_head;
  // The masked kernel's: the query tiles a key tile skips or reads no mask in.
  MaskTileMap mask_tiles;
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

// The producer warpgroup: warp 0 loads K and V once, then each query tile's
// Q and dO into the next stage; warp 1 writes the tile's LSE and D beside
// them. Runs with the producer's few registers.
template <class Traits, class SharedStorage, class SmemQ, class SmemKV>
__device__ inline void bwd_producer(BwdParams<Traits> const& p, SharedStorage& smem,
                                    QueryTiles tiles, MaskTileColumn column, SeqExtent seq_q,
                                    SeqExtent seq_k, int n_block, int head, int batch, SmemQ& sQ,
                                    SmemQ& sdO, SmemKV& sK, SmemKV& sV) {
  using namespace cute;
  using Transaction = cutlass::arch::ClusterTransactionBarrier;
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int kBlockM = Traits::kBlockM, kStages = Traits::kStages;
  constexpr float kLog2e = 1.4426950408889634f;
  const bool varlen = p.cu_seqlens_q != nullptr;
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
      if (column.empty(m)) continue;  // the mask leaves the query tile out
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
    const int seqlen_q = seq_q.len;
    int row = tiles.first * kBlockM + lane;
    const int64_t lse_step = 32 * p.lse_seq;
    const float* lse = p.lse + (varlen ? seq_q.row0 * p.lse_seq : batch * p.lse_batch) +
                       head * p.lse_head + row * p.lse_seq;
    const float* dsum = p.dsum + head * p.rows_q + seq_q.row0 + row;
    int stage = 0, phase = 0;
#pragma unroll 1
    for (int m = tiles.first; m <= tiles.last; ++m) {
      // A query tile the mask leaves out: the pointers step past it.
      const bool skipped = column.empty(m);
      if (!skipped) wait_barrier(smem.empty[stage], phase ^ 1);
      CUTE_UNROLL
      for (int i = lane; i < kBlockM; i += 32, row += 32, lse += lse_step, dsum += 32) {
        if (skipped) continue;
        const bool valid = row < seqlen_q;
        smem.lse[stage][i] = valid ? *lse * kLog2e : INFINITY;
        smem.dsum[stage][i] = valid ? *dsum : 0.0f;
      }
      if (skipped) continue;
      Barrier::arrive(&smem.rows_full[stage]);
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
  }
}

// S^T's fragments as the score-terms code of every attention kernel reads
// scores (score_terms.cuh, mask.cuh): rows are queries, columns keys.
template <class Scores>
__device__ inline auto query_key_view(Scores& scores) {
  return cute::make_tensor(scores.data(), cute::select<1, 0>(scores.layout()));
}
// The (query, key) coordinates of that view, from S^T's (key, query) ones.
template <class Coords>
struct QueryKeyCoords {
  Coords const& coords;
  __device__ auto operator()(int query, int key) const {
    const auto key_query = coords(key, query);
    return cute::make_coord(cute::get<1>(key_query), cute::get<0>(key_query));
  }
};

// dS^T, the gradient of an additive mask (added after any softcap: the plan
// declines softcap with one), into its (query, key) rows.
template <class DScores, class Coords>
__device__ inline void store_mask_grad(DScores const& dscores, Coords const& coords,
                                       const AttentionMask& mask, int m0, int n0, float* grad) {
  using namespace cute;
  CUTE_UNROLL
  for (int c = 0; c < size<1>(dscores); ++c) {
    const int row = m0 + get<1>(coords(0, c));
    if (row >= mask.seqlen_q) continue;
    float* grad_row = grad + int64_t(row) * mask.seqlen_k;
    CUTE_UNROLL
    for (int r = 0; r < size<0>(dscores); ++r) {
      const int key = n0 + get<0>(coords(r, 0));
      if (key < mask.seqlen_k) grad_row[key] = dscores(r, c);
    }
  }
}

// S^T -> P^T in place: softcap, the score terms (ALiBi; the attention mask in
// the masked kernel, read only where read_mask; score_terms.cuh), the window
// (keys outside a query row's range give P = 0), then exp2(S^T scale_log2 -
// LSE). `scores` and `coords` are row-column views of the S^T accumulator and
// of its (key, query row) coordinates within the tile.
template <bool kMasked, class Scores, class Coords>
__device__ inline void scores_to_probs(Scores& scores, Coords const& coords,
                                       const AttentionMask& mask, const float* lse, int m0,
                                       int block_m, int n0, int block_n, float scale_log2,
                                       float softcap, float softcap_pre,
                                       ScoreTermsParams const& terms, int batch, int head,
                                       bool read_mask) {
  using namespace cute;
  if (softcap > 0.0f) {
    CUTE_UNROLL
    for (int i = 0; i < size(scores); ++i) scores(i) = softcap * tanhf(scores(i) * softcap_pre);
  }
  auto query_key = query_key_view(scores);
  const QueryKeyCoords<Coords> query_key_coords{coords};
  auto head_of = [head](int) { return head; };
  float score_log2 = scale_log2;
  const bool alibi = terms.alibi_slopes != nullptr;
  if constexpr (kMasked) {
    // A tile that reads no mask and adds no ALiBi takes an additive mask's
    // (positive) pre-scale in the exponent's factor, as the forward does.
    if (!read_mask && !alibi && terms.bias_pre > 0.0f) {
      score_log2 *= terms.bias_pre;
    } else if (read_mask || alibi || terms.bias_pre != 1.0f) {
      apply_score_terms<true>(query_key, query_key_coords, m0, n0, terms, batch, head_of,
                              AttentionMask::Identity{}, mask, read_mask);
    }
  } else if (alibi) {
    apply_score_terms<false>(query_key, query_key_coords, m0, n0, terms, batch, head_of,
                             AttentionMask::Identity{}, mask);
  }
  if (mask.tile_needs_mask(m0, block_m, n0, block_n)) {
    mask.apply(query_key, query_key_coords, m0, n0);
  }
  CUTE_UNROLL
  for (int c = 0; c < size<1>(scores); ++c) {
    const float row_lse = lse[get<1>(coords(0, c))];
    CUTE_UNROLL
    for (int r = 0; r < size<0>(scores); ++r) {
      scores(r, c) = fast_exp2(scores(r, c) * score_log2 - row_lse);
    }
  }
}

// The forward's dropout draws on S^T: bit i of the result keeps element i of
// the accumulator (storage order), whose (key, query) within the tile is
// coords(i). Element (query q, key k) is kept as dropout.cuh draws it: byte
// ((q % 16) / 8) * 2 + k % 2 of word (k % 32) / 8 of the draw of block
// (q / 16, k / 32) and lane (q % 8) * 4 + (k % 8) / 2. A wgmma accumulator
// of S^T holds, per thread and n8 atom of queries, keys k and k + 8 (of one
// block column) for queries q and q + 1: elements 4a + 2h + e are key
// k + 8h, query 8a + q0 + e. The two atoms of one 16-query block and both
// keys share the draw of one lane per query parity e: eight draws for 32
// elements.
template <class Coords>
__device__ inline auto dropout_keep_bits(Coords const& coords, int m0, int n0,
                                         DropoutRng const& rng) {
  using namespace cute;
  constexpr int kSize = decltype(size(coords))::value;
  static_assert(kSize <= 64 && kSize % 8 == 0);
  using Bits = std::conditional_t<(kSize > 32), uint64_t, uint32_t>;
  Bits bits = 0;
  CUTE_UNROLL
  for (int e = 0; e < 2; ++e) {
    CUTE_UNROLL
    for (int block = 0; block < kSize / 8; ++block) {
      const int first = 8 * block + e;
      const int key0 = n0 + get<0>(coords(first)), query0 = m0 + get<1>(coords(first));
      const uint4 draw = rng.bytes(query0 / 16, key0 / 32, (query0 % 8) * 4 + (key0 % 8) / 2);
      CUTE_UNROLL
      for (int k = 0; k < 4; ++k) {
        const int i = first + 2 * k;  // atoms 2 block, 2 block + 1; keys k, k + 8
        const int key = n0 + get<0>(coords(i)), query = m0 + get<1>(coords(i));
        const int w = (key % 32) / 8, b = ((query % 16) / 8) * 2 + key % 2;
        const uint32_t word = w == 0 ? draw.x : w == 1 ? draw.y : w == 2 ? draw.z : draw.w;
        // Byte b compared in the top byte, as for_each_dropout does.
        if ((word << (24 - 8 * b)) >= rng.threshold_high) bits |= Bits(1) << i;
      }
    }
  }
  return bits;
}

// P^T with dropout applied (kept elements scaled, dropped ones 0) into `to`,
// the A operand of dV: the same storage order as convert_gmma_fragment.
template <class From, class Bits, class To>
__device__ inline void convert_dropped(From const& from, Bits kept, float scale, To& to) {
  using namespace cute;
  using Element = typename To::value_type;
  constexpr int kSize = decltype(size(from))::value;
  cutlass::NumericArrayConverter<Element, float, 2> convert;
  auto* pairs = reinterpret_cast<cutlass::Array<Element, 2>*>(to.data());
  CUTE_UNROLL
  for (int i = 0; i < kSize; i += 2) {
    cutlass::Array<float, 2> pair;
    pair[0] = (kept >> i) & 1u ? from(i) * scale : 0.0f;
    pair[1] = (kept >> (i + 1)) & 1u ? from(i + 1) * scale : 0.0f;
    pairs[i / 2] = convert(pair);
  }
}

// dP^T of the dropped output: 0 where dropped, dP^T / (1 - p) where kept (D
// is already the dropped output's row sum).
template <class Acc, class Bits>
__device__ inline void drop_dprobs(Acc& dprobs, Bits kept, float scale) {
  using namespace cute;
  CUTE_UNROLL
  for (int i = 0; i < size(dprobs); ++i) dprobs(i) = (kept >> i) & 1u ? dprobs(i) * scale : 0.0f;
}

// dP^T -> dS^T in place: P^T (dP^T - D), times softcap's tanh derivative
// 1 - tanh^2 when there is one, tanh recovered from P (scale_log2 is log2 e:
// log2 P + LSE log2 e = log2 e softcap tanh; the plan declines softcap with
// ALiBi, whose bias would have to come off it); P = 0 (masked or
// underflowed) already gives dS = 0. `prob(r, c)` reads P^T at the same
// position.
template <class DScores, class Prob, class Coords>
__device__ inline void dprobs_to_dscores(DScores& dscores, Prob&& prob, Coords const& coords,
                                         const float* lse, const float* dsum, float scale_log2,
                                         float softcap) {
  using namespace cute;
  CUTE_UNROLL
  for (int c = 0; c < size<1>(dscores); ++c) {
    const float row_dsum = dsum[get<1>(coords(0, c))];
    CUTE_UNROLL
    for (int r = 0; r < size<0>(dscores); ++r) {
      dscores(r, c) = prob(r, c) * (dscores(r, c) - row_dsum);
    }
  }
  if (softcap > 0.0f) {
    const float tanh_per_log2 = 1.0f / (scale_log2 * softcap);
    CUTE_UNROLL
    for (int c = 0; c < size<1>(dscores); ++c) {
      const float row_lse = lse[get<1>(coords(0, c))];
      CUTE_UNROLL
      for (int r = 0; r < size<0>(dscores); ++r) {
        if (prob(r, c) > 0.0f) {
          const float t = (fast_log2(prob(r, c)) + row_lse) * tanh_per_log2;
          dscores(r, c) *= 1.0f - t * t;
        }
      }
    }
  }
}

// Named barriers of the backward (CUTLASS numbers them past its own).
enum BwdBarrier : uint32_t {
  kBarrierDS = 1,       // every consumer's dS of the query tile is in shared memory
  kBarrierProbs = 3,    // split roles: P^T is in shared memory
  kBarrierDQFull = 4,   // + warpgroup: its dQ share is staged (consumer arrives, writer waits)
  kBarrierDQEmpty = 6,  // + warpgroup: the writer is done with it (writer arrives, consumer waits)
};
// A consumer warpgroup and the dQ writer warp.
constexpr uint32_t kDQHandshakeThreads = 128 + 32;

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

// Where one CTA's consumers read and write: its key tile, its query tiles,
// its stores.
template <class Traits>
struct BwdTile {
  AttentionMask mask;  // this sequence's lengths
  QueryTiles tiles;
  int n_block, n0;
  // dK / dV: the key tile's first row, the seq stride, or the fp32 share
  // (GQA); direct when there is no group.
  typename Traits::Element *dk_out, *dv_out;
  float *dk_accum, *dv_accum;
  bool direct;
  int batch, head;
  float* mask_grad;  // the masked kernel's: (seqlen_q, seqlen_k) of this (batch, head), or nullptr
  DropoutRng rng;    // the dropout kernel's
  // The masked kernel's classes of the query tiles (no map: none skipped):
  // tiles holds the first and last that are not skipped.
  MaskTileColumn column;
};

// Consumers up to head dim 128: warpgroup g owns keys [64 g, 64 g + 64) of
// the tile and runs every GEMM but dQ for them; dQ is split by head dim.
template <TermsKernel kTerms, class Traits, class Smem>
__device__ inline void consume_key_halves(BwdParams<Traits> const& p, BwdTile<Traits> const& t,
                                          typename Traits::SharedStorage& smem, Smem const& s,
                                          int tidx) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim, kStages = Traits::kStages;
  constexpr bool kMasked = kTerms == TermsKernel::masked;
  constexpr bool kDropout = kTerms == TermsKernel::computed;
  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmaDKV mma_dkv;
  typename Traits::TiledMmaDQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tidx);
  auto thr_dkv = mma_dkv.get_thread_slice(tidx);
  auto thr_dq = mma_dq.get_thread_slice(tidx);
  Tensor tSrK = thr_sdp.partition_fragment_A(s.k);      // (MMA, MMA_M, MMA_K)
  Tensor tSrV = thr_sdp.partition_fragment_A(s.v);      // (MMA, MMA_M, MMA_K)
  Tensor tSrQ = thr_sdp.partition_fragment_B(s.q);      // (MMA, MMA_N, MMA_K, stage)
  Tensor tSrdO = thr_sdp.partition_fragment_B(s.dout);  // (MMA, MMA_N, MMA_K, stage)
  Tensor tdVrdO = thr_dkv.partition_fragment_B(s.dout_t);
  Tensor tdKrQ = thr_dkv.partition_fragment_B(s.q_t);
  Tensor tdQrdS = thr_dq.partition_fragment_A(s.ds);
  Tensor tdQrK = thr_dq.partition_fragment_B(s.k_t);
  Tensor tdSsdS = thr_sdp.partition_C(s.ds_t);  // where this thread's dS^T goes

  auto tile_kv = Shape<Int<kBlockN>, Int<kHeadDim>>{};
  Tensor acc_dk = partition_fragment_C(mma_dkv, tile_kv);
  Tensor acc_dv = partition_fragment_C(mma_dkv, tile_kv);
  clear(acc_dk);
  clear(acc_dv);

  if (t.tiles.last >= t.tiles.first) {
    Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
    Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
    // (key, query row) of each S^T element within the tile.
    Tensor flat_coords =
        thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
    Tensor coords = gmma_rowcol_view(flat_coords);
    Tensor scores = gmma_rowcol_view(acc_s);
    Tensor dscores = gmma_rowcol_view(acc_dp);
    // P^T and dS^T as the A operands of dV and dK.
    Tensor tdVrP = make_tensor<Element>(gmma_c_to_a_layout(acc_s.layout()));
    Tensor tdKrdS = make_tensor<Element>(gmma_c_to_a_layout(acc_dp.layout()));

    // One meeting of the two warpgroups per query tile (every dS written);
    // dQ leaves through the writer warp. No wgmma is in flight across the
    // loop's back edge: ptxas serializes every wgmma of a kernel where one is.
    wait_barrier(smem.kv_full, 0);
    int stage = 0, phase = 0, ds_stage = 0;
    for (int m = t.tiles.first; m <= t.tiles.last; m = t.column.next(m, t.tiles.last)) {
      const int m0 = m * kBlockM;
      wait_barrier(smem.q_full[stage], phase);
      warpgroup_gemm<true, -1>(mma_sdp, tSrK, tSrQ(_, _, _, stage), acc_s);
      wait_barrier(smem.do_full[stage], phase);
      warpgroup_gemm<true, -1>(mma_sdp, tSrV, tSrdO(_, _, _, stage), acc_dp);
      wait_barrier(smem.rows_full[stage], phase);
      warpgroup_wait<1>();  // S^T
      warpgroup_fence_operand(acc_s);
      const float* lse = smem.lse[stage];
      const float* dsum = smem.dsum[stage];
      scores_to_probs<kMasked>(scores, coords, t.mask, lse, m0, kBlockM, t.n0, kBlockN,
                               p.scale_log2, p.softcap, p.softcap_pre, p.terms, t.batch, t.head,
                               t.column.partial(m));
      // Dropout: dV takes the dropped P^T; dS the whole P^T and the dropped dP^T.
      decltype(dropout_keep_bits(flat_coords, m0, t.n0, t.rng)) kept = 0;
      if constexpr (kDropout) kept = dropout_keep_bits(flat_coords, m0, t.n0, t.rng);
      auto issue_dv = [&] {
        if constexpr (kDropout) {
          convert_dropped(acc_s, kept, p.terms.dropout.scale, tdVrP);
        } else {
          convert_gmma_fragment(acc_s, tdVrP);
        }
        warpgroup_gemm<false, -1>(mma_dkv, tdVrP, tdVrdO(_, _, _, stage), acc_dv);
      };
      if constexpr (!Traits::kLateDV) issue_dv();
      warpgroup_wait<Traits::kLateDV ? 0 : 1>();  // dP^T
      warpgroup_fence_operand(acc_dp);
      if constexpr (kDropout) drop_dprobs(acc_dp, kept, p.terms.dropout.scale);
      dprobs_to_dscores(
          dscores, [&](int r, int c) { return scores(r, c); }, coords, lse, dsum, p.scale_log2,
          p.softcap);
      if constexpr (kMasked) {
        if (t.mask_grad != nullptr) store_mask_grad(dscores, coords, t.mask, m0, t.n0, t.mask_grad);
      }
      if constexpr (Traits::kLateDV) issue_dv();
      convert_gmma_fragment(acc_dp, tdKrdS);
      // dS for dQ: every consumer's keys, through shared memory (this
      // buffer's last reader, the dQ GEMM two tiles back, completed before
      // the other warpgroup met this one at the last tile's barrier).
      copy(make_tensor(tdKrdS.data(), acc_dp.layout()), tdSsdS(_, _, _, ds_stage));
      cutlass::arch::fence_view_async_shared();  // wgmma reads what these stores wrote
      cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, kBarrierDS);
      warpgroup_gemm<true, -1>(mma_dq, tdQrdS(_, _, _, ds_stage), tdQrK, acc_dq);
      warpgroup_gemm<false, -1>(mma_dkv, tdKrdS, tdKrQ(_, _, _, stage), acc_dk);
      warpgroup_wait<1>();  // dV and dQ; dK runs on while dQ is staged
      warpgroup_fence_operand(acc_dq);
      DqStaging<Traits>::stash(smem.dq.data(), tidx / 128, tidx % 128, acc_dq);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_dk);
      warpgroup_fence_operand(acc_dv);
      Barrier::arrive(&smem.empty[stage]);  // Q, dO, LSE and D of this stage are read
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
      ds_stage ^= Traits::kDSStages - 1;
    }
  }

  Tensor kv_coords = gmma_rowcol_view(thr_dkv.partition_C(make_identity_tensor(tile_kv)));
  const int keys_left = t.mask.seqlen_k - t.n0;
  store_key_grad(gmma_rowcol_view(acc_dk), kv_coords, p.softmax_scale, keys_left, p.headdim,
                 t.dk_out, p.dk_seq, t.dk_accum, t.direct);
  store_key_grad(gmma_rowcol_view(acc_dv), kv_coords, 1.0f, keys_left, p.headdim, t.dv_out,
                 p.dv_seq, t.dv_accum, t.direct);
}

// Consumers past head dim 128, on a tile of 64 keys: warpgroup 0 computes
// S^T, P^T and dV += P^T dO; warpgroup 1 dP^T, dS^T (with P^T from warpgroup
// 0 through shared memory, fp32 in fragment order: both warpgroups' threads
// hold the same elements) and dK += dS^T Q; both compute dQ for half of the
// head dim from dS in shared memory. Named barriers: kBarrierProbs, P^T
// written (it also orders dS: warpgroup 1 writes the next dS only after
// warpgroup 0 has finished this tile); kBarrierDS, dS^T written.
template <TermsKernel kTerms, class Traits, class Smem>
__device__ inline void consume_roles(BwdParams<Traits> const& p, BwdTile<Traits> const& t,
                                     typename Traits::SharedStorage& smem, Smem const& s,
                                     int tidx) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Barrier = cutlass::arch::ClusterBarrier;
  using NamedBarrier = cutlass::arch::NamedBarrier;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim, kStages = Traits::kStages;
  constexpr int kThreads = Traits::kConsumerThreads;
  constexpr bool kMasked = kTerms == TermsKernel::masked;
  constexpr bool kDropout = kTerms == TermsKernel::computed;
  const bool probs_role = tidx < 128;  // else the dS role
  const int wg_thread = tidx % 128;    // the thread within its warpgroup
  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmaDKV mma_dkv;
  typename Traits::TiledMmaDQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(wg_thread);
  auto thr_dkv = mma_dkv.get_thread_slice(wg_thread);
  auto thr_dq = mma_dq.get_thread_slice(tidx);
  // S^T = K Q^T in the P role, dP^T = V dO^T in the dS role: the same
  // partitions of other buffers.
  Tensor tSrA = thr_sdp.partition_fragment_A(probs_role ? s.k : s.v);  // (MMA, MMA_M, MMA_K)
  Tensor tSrB = thr_sdp.partition_fragment_B(probs_role ? s.q : s.dout);
  // dV += P^T dO in the P role, dK += dS^T Q in the dS role.
  Tensor tKVrB = thr_dkv.partition_fragment_B(probs_role ? s.dout_t : s.q_t);
  Tensor tdQrdS = thr_dq.partition_fragment_A(s.ds);
  Tensor tdQrK = thr_dq.partition_fragment_B(s.k_t);
  Tensor tdSsdS = thr_sdp.partition_C(s.ds_t);

  auto tile_kv = Shape<Int<kBlockN>, Int<kHeadDim>>{};
  Tensor acc_kv = partition_fragment_C(mma_dkv, tile_kv);  // dV or dK
  clear(acc_kv);

  if (t.tiles.last >= t.tiles.first) {
    Tensor acc_sdp = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
    Tensor flat_coords =
        thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
    Tensor coords = gmma_rowcol_view(flat_coords);
    Tensor sdp = gmma_rowcol_view(acc_sdp);
    Tensor tKVrA = make_tensor<Element>(gmma_c_to_a_layout(acc_sdp.layout()));  // P^T or dS^T
    // P^T in fragment order: element i of thread t at i x 128 + t.
    float* probs = smem.probs.data() + wg_thread;
    constexpr int kValues = decltype(size(acc_sdp))::value;
    static_assert(kValues * 128 == kBlockN * kBlockM);

    wait_barrier(smem.kv_full, 0);
    int stage = 0, phase = 0;
    for (int m = t.tiles.first; m <= t.tiles.last; m = t.column.next(m, t.tiles.last)) {
      const int m0 = m * kBlockM;
      wait_barrier(probs_role ? smem.q_full[stage] : smem.do_full[stage], phase);
      warpgroup_gemm<true, -1>(mma_sdp, tSrA, tSrB(_, _, _, stage), acc_sdp);
      wait_barrier(smem.rows_full[stage], phase);
      const float* lse = smem.lse[stage];
      const float* dsum = smem.dsum[stage];
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_sdp);
      if (probs_role) {
        scores_to_probs<kMasked>(sdp, coords, t.mask, lse, m0, kBlockM, t.n0, kBlockN, p.scale_log2,
                                 p.softcap, p.softcap_pre, p.terms, t.batch, t.head,
                                 t.column.partial(m));
        CUTE_UNROLL
        for (int i = 0; i < kValues; ++i) probs[i * 128] = acc_sdp(i);
        NamedBarrier::arrive(kThreads, kBarrierProbs);
        // Dropout: dV takes the dropped P^T; the dS role draws the same bits.
        if constexpr (kDropout) {
          convert_dropped(acc_sdp, dropout_keep_bits(flat_coords, m0, t.n0, t.rng),
                          p.terms.dropout.scale, tKVrA);
        } else {
          convert_gmma_fragment(acc_sdp, tKVrA);
        }
        wait_barrier(smem.do_full[stage], phase);
      } else {
        NamedBarrier::sync(kThreads, kBarrierProbs);
        Tensor prob = make_fragment_like(acc_sdp);
        CUTE_UNROLL
        for (int i = 0; i < kValues; ++i) prob(i) = probs[i * 128];
        Tensor prob_rc = gmma_rowcol_view(prob);
        if constexpr (kDropout) {
          drop_dprobs(acc_sdp, dropout_keep_bits(flat_coords, m0, t.n0, t.rng),
                      p.terms.dropout.scale);
        }
        dprobs_to_dscores(
            sdp, [&](int r, int c) { return prob_rc(r, c); }, coords, lse, dsum, p.scale_log2,
            p.softcap);
        if constexpr (kMasked) {
          if (t.mask_grad != nullptr) store_mask_grad(sdp, coords, t.mask, m0, t.n0, t.mask_grad);
        }
        convert_gmma_fragment(acc_sdp, tKVrA);
        copy(make_tensor(tKVrA.data(), acc_sdp.layout()), tdSsdS(_, _, _, 0));
        cutlass::arch::fence_view_async_shared();  // wgmma reads what these stores wrote
        wait_barrier(smem.q_full[stage], phase);
      }
      warpgroup_gemm<false, -1>(mma_dkv, tKVrA, tKVrB(_, _, _, stage), acc_kv);
      NamedBarrier::sync(kThreads, kBarrierDS);
      warpgroup_gemm<true, -1>(mma_dq, tdQrdS(_, _, _, 0), tdQrK, acc_dq);
      warpgroup_wait<1>();  // dV or dK: this stage's Q and dO are read
      warpgroup_fence_operand(acc_kv);
      Barrier::arrive(&smem.empty[stage]);
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_dq);
      DqStaging<Traits>::stash(smem.dq.data(), tidx / 128, wg_thread, acc_dq);
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
  }

  Tensor kv_coords = gmma_rowcol_view(thr_dkv.partition_C(make_identity_tensor(tile_kv)));
  const int keys_left = t.mask.seqlen_k - t.n0;
  if (probs_role) {
    store_key_grad(gmma_rowcol_view(acc_kv), kv_coords, 1.0f, keys_left, p.headdim, t.dv_out,
                   p.dv_seq, t.dv_accum, t.direct);
  } else {
    store_key_grad(gmma_rowcol_view(acc_kv), kv_coords, p.softmax_scale, keys_left, p.headdim,
                   t.dk_out, p.dk_seq, t.dk_accum, t.direct);
  }
}

// The shared-memory views of one CTA.
template <class Traits>
struct BwdSmemTensors {
  using Element = typename Traits::Element;
  template <class Layout>
  using View =
      decltype(cute::make_tensor(cute::make_smem_ptr(static_cast<Element*>(nullptr)), Layout{}));
  View<typename Traits::SmemLayoutKV> k, v;
  View<typename Traits::SmemLayoutKt> k_t;          // (head dim, keys)
  View<typename Traits::SmemLayoutQ> q, dout;       // (rows, head dim, stage)
  View<typename Traits::SmemLayoutQt> q_t, dout_t;  // (head dim, rows, stage)
  View<typename Traits::SmemLayoutDS> ds;           // (query rows, keys)
  View<typename Traits::SmemLayoutDSt> ds_t;        // (keys, query rows)
};

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

// dq = scale x the dQ accumulator of one query tile, read back in the
// fragment order the main kernel's consumers staged it (DqStaging): a CTA of
// as many threads per (query tile, head, batch).
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
