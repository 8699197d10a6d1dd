// The sm90 attention forward kernel (Hopper, sm_90a): FlashAttention's online
// softmax on wgmma, with TMA loads and warp specialization.
//
// A CTA walks output tiles (query tile, head, batch; fwd_tile) t =
// blockIdx.x, + gridDim.x, ...: one CTA per SM where the tiles have equal
// work (a persistent grid), or where they come in pairs of equal work (causal:
// see first_tile), else one CTA per tile. Warpgroup 0 is the producer: one
// thread issues the TMA loads of each tile's Q and then of its K and V
// tiles, newest key tile first, into kStages shared-memory buffers each,
// completing on mbarriers ("full"); the consumers free a buffer by arriving
// on its "empty" mbarrier, so the loads of the next output tile start while
// this one is finishing. Warpgroups 1.. are consumers, each owning 64 query
// rows: S = Q K^T with both operands in shared memory, the online softmax in
// registers, and O += P V with P taken from registers. Within a consumer the
// next key tile's Q K^T is issued before this key tile's P V, so that the
// softmax of one overlaps the other's tensor-core work; two consumers take
// turns issuing their GEMMs (ping-pong). setmaxnreg moves registers from the
// producer to the consumers.
//
// The epilogue divides O by the row sums, stages it in shared memory (a
// buffer of its own, or Q's where there is no room) and writes it with one
// TMA store, which clips the rows past seqlen_q and the columns past the
// head dim (varlen: row by row, within the sequence); the LSE is written
// from registers.
//
// With an attention mask, a pass before the kernel maps the mask's tiles
// (mask_tiles.cuh): the producer and the consumers skip the key tiles the
// mask leaves out entirely, and the consumers read the mask only in the tiles
// it cuts.
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
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

#include <cmath>

#include "attention/dropout.cuh"
#include "attention/mask.cuh"
#include "attention/mask_tiles.cuh"
#include "attention/score_terms.cuh"
#include "attention/sm90/flash_fwd_sm90_config.h"
#include "attention/sm90/flash_fwd_sm90_scheduler.cuh"
#include "attention/sm90/gmem_tensor.cuh"
#include "attention/sm90/gmma_fragment.cuh"
#include "attention/sm90/warpgroup.cuh"
#include "attention/softmax_online.cuh"
#include "common/tensor_core_types.cuh"

namespace samattn::attention::sm90 {

// Types and sizes of one configuration; the host builds its TMA descriptors
// from the same layouts.
template <class Config>
struct FwdTraits {
  using Element = typename tensor_core::ElementOf<Config::kDType>::type;
  static constexpr int kHeadDim = Config::kHeadDim, kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN, kStages = Config::kStages;
  static constexpr int kConsumerGroups = kBlockM / 64;
  static constexpr int kConsumerThreads = 128 * kConsumerGroups;
  static constexpr int kThreads = 128 + kConsumerThreads;
  // Registers per thread after setmaxnreg: the producer needs few; the
  // consumers take the rest of the 64 K (multiples of 8).
  static constexpr int kProducerRegs = kConsumerGroups == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kConsumerGroups == 2 ? 240 : 160;
  // GEMMs of the two consumer warpgroups take turns (GemmTurns).
  static constexpr bool kPingpong = kConsumerGroups == 2;

  // Each consumer warpgroup runs the 64-row atoms of its own rows.
  using GroupLayout = cute::Layout<cute::Shape<cute::Int<kConsumerGroups>, cute::_1, cute::_1>>;
  using TiledMmaQK = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<kBlockN>, cute::Int<kHeadDim>>>(),
      GroupLayout{}));
  // P (registers, K-major) times V read from shared memory as (head dim, keys):
  // head-dim-contiguous, i.e. MN-major, which wgmma reads for 16-bit types.
  using TiledMmaPV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<kHeadDim>, cute::Int<kBlockN>>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      GroupLayout{}));

  // Rows of 64 elements (128 bytes), 128-byte swizzled: TMA writes them and
  // wgmma reads them without bank conflicts.
  using SmemAtom = cute::GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>, cute::Int<kStages>>{}));
  // V's buffers seen as (head dim, keys, stage): the B operand of P V.
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{},
      cute::make_ordered_layout(
          cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>, cute::Int<kStages>>{},
          cute::Step<cute::_2, cute::_1, cute::_3>{})));

  using GmemShape = sm90::GmemShape;
  using GmemLayout = sm90::GmemLayout;
  using TileQ = cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>;
  using TileKV = cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>;
  using TmaQ = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{},
      cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemLayout{}),
      SmemLayoutQ{}, TileQ{}, cute::_1{}));
  using TmaKV = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{},
      cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemLayout{}),
      cute::take<0, 2>(SmemLayoutKV{}), TileKV{}, cute::_1{}));
  using TmaO = decltype(cute::make_tma_copy(
      cute::SM90_TMA_STORE{},
      cute::make_tensor(cute::make_gmem_ptr(static_cast<Element*>(nullptr)), GmemLayout{}),
      SmemLayoutQ{}, TileQ{}, cute::_1{}));

  static constexpr uint32_t kBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kBytesKV = kBlockN * kHeadDim * sizeof(Element);

  static constexpr bool kSeparateO = Config::kSeparateO;
  // Arrivals that free Q's buffer: every consumer thread once its last
  // Q K^T is done, or, with O staged there, the thread that stores O.
  static constexpr int kQEmptyArrivals = kSeparateO ? kConsumerThreads : 1;
  template <bool kHas, class = void>
  struct OBuffer {
    CUTE_DEVICE Element* data() { return nullptr; }
  };
  template <class Unused>
  struct OBuffer<true, Unused> {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> o;
    CUTE_DEVICE Element* data() { return o.data(); }
  };

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> v;
    OBuffer<kSeparateO> o;  // else O is staged in q
    uint64_t q_full, q_empty;
    uint64_t k_full[kStages], k_empty[kStages];
    uint64_t v_full[kStages], v_empty[kStages];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= Config::kSmemBytes, "FlashFwdSm90Config::kSmemBytes is too small");
};

// The kernel's parameters, filled once per call by the launcher.
template <class Traits>
struct FwdParams {
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k, tma_v;
  typename Traits::TmaO tma_o;
  // (seq, head dim, heads, batch); varlen: (total rows, head dim, heads, 1).
  typename Traits::GmemShape shape_q, shape_k;
  float* lse;  // nullptr: not written
  int64_t lse_batch, lse_head, lse_seq;
  // Varlen: sequence b is rows [cu[b], cu[b + 1]); O is then stored row by
  // row (TMA would write past the sequence into the next one).
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  typename Traits::Element* o;
  int64_t o_seq, o_head;
  AttentionMask mask;      // fixed length; varlen: its window, with each sequence's lengths
  ScoreTermsParams terms;  // ALiBi, dropout, a mask (the terms kernels)
  const float* sinks;      // (nheads,) or nullptr
  int kv_group;
  float softcap, softcap_pre, scale_log2;
  int m_blocks;    // query tiles per (head, batch): of the longest sequence with varlen
  int tiles;       // m_blocks x heads x batch
  bool reverse_m;  // causal: the longest query tiles (the last) first
  bool paired;     // causal, persistent: tiles taken in pairs of equal work (first_tile)
  int head_group;  // > 1: heads fastest in groups of this many (fwd_tile); 1: query tiles fastest
  MaskTileMap mask_tiles;  // the masked kernel's: key tiles it skips or reads no mask in
};

// kTermsKernel: computed, the kernel with ALiBi and dropout (score_terms.cuh,
// dropout.cuh); masked, also an attention mask, read element by element
// (its loads take registers that the others should not pay for) in the key
// tiles its tile map (mask_tiles.h) neither skips nor marks as kept whole;
// none, so that calls without them run code that has none. Sinks reach all
// three: they only join the epilogue's row sums.
template <class Traits, TermsKernel kTermsKernel>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_fwd_sm90_kernel(CUTE_GRID_CONSTANT FwdParams<Traits> const p) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Transaction = cutlass::arch::ClusterTransactionBarrier;
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim, kStages = Traits::kStages;
  using SharedStorage = typename Traits::SharedStorage;

  extern __shared__ __align__(1024) char smem_raw[];
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw);
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutVt{});
  Tensor sO = make_tensor(make_smem_ptr(Traits::kSeparateO ? smem.o.data() : smem.q.data()),
                          typename Traits::SmemLayoutQ{});
  const bool varlen = p.cu_seqlens_q != nullptr;
  constexpr bool kMasked = kTermsKernel == TermsKernel::masked;
  // The classes of a query tile's key tiles in the mask (nullptr: none, every
  // key tile partial); the producer and the consumers skip the same ones.
  auto mask_codes = [&](const FwdTile& tile) -> const uint8_t* {
    return kMasked ? mask_tile_row(p.mask_tiles, tile.batch, tile.head, tile.m_block) : nullptr;
  };

  // Warp-uniform role (the compiler cannot prove threadIdx.x / 128 uniform).
  const int warp_group = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  if (threadIdx.x == 0) {
    Transaction::init(&smem.q_full, 1);
    Barrier::init(&smem.q_empty, Traits::kQEmptyArrivals);
    CUTE_UNROLL
    for (int s = 0; s < kStages; ++s) {
      Transaction::init(&smem.k_full[s], 1);
      Transaction::init(&smem.v_full[s], 1);
      Barrier::init(&smem.k_empty[s], Traits::kConsumerThreads);
      Barrier::init(&smem.v_empty[s], Traits::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warp_group == 0) {
    // ------------------------------------------------------------ producer
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (threadIdx.x / 32 != 0 || !cute::elect_one_sync()) return;
    Tensor mQ = p.tma_q.get_tma_tensor(p.shape_q);
    Tensor mK = p.tma_k.get_tma_tensor(p.shape_k);
    Tensor mV = p.tma_v.get_tma_tensor(p.shape_k);
    int stage = 0, phase = 0, q_tiles = 0;
    for (int t = first_tile(p); t < p.tiles; t = next_tile(p, t)) {
      const FwdTile tile = fwd_tile(p, t, kBlockM, kBlockN);
      if (!tile.valid) continue;
      // Tiles from the sequence's first row (varlen: a partial tile reads the
      // next sequence's rows, which the mask and the store leave out).
      const int head_k = tile.head / p.kv_group;
      Tensor gQ = local_tile(
          domain_offset(make_coord(tile.q_offset, 0), mQ(_, _, tile.head, tile.tma_batch)),
          typename Traits::TileQ{}, make_coord(tile.m_block, 0));
      Tensor gK =
          local_tile(domain_offset(make_coord(tile.k_offset, 0), mK(_, _, head_k, tile.tma_batch)),
                     typename Traits::TileKV{}, make_coord(_, 0));
      Tensor gV =
          local_tile(domain_offset(make_coord(tile.k_offset, 0), mV(_, _, head_k, tile.tma_batch)),
                     typename Traits::TileKV{}, make_coord(_, 0));
      auto [tQgQ, tQsQ] = tma_partition(p.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                        group_modes<0, 2>(gQ));
      auto [tKgK, tKsK] = tma_partition(p.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                        group_modes<0, 2>(gK));
      auto [tVgV, tVsV] = tma_partition(p.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                        group_modes<0, 2>(gV));
      // Q's buffer is free once the consumers are done with the last tile's
      // (the first wait finds a fresh mbarrier's parity 1 completed). Q is
      // loaded for every tile, also one that attends no key, so that the
      // consumers' waits and arrivals alternate with these, one phase apart.
      wait_barrier(smem.q_empty, (q_tiles & 1) ^ 1);
      ++q_tiles;
      Transaction::arrive_and_expect_tx(&smem.q_full, Traits::kBytesQ);
      copy(p.tma_q.with(smem.q_full), tQgQ, tQsQ);
      const uint8_t* codes = mask_codes(tile);
      for (int n = previous_key_tile(codes, tile.n_end, tile.n_begin); n >= tile.n_begin;
           n = previous_key_tile(codes, n, tile.n_begin)) {
        wait_barrier(smem.k_empty[stage], phase ^ 1);
        Transaction::arrive_and_expect_tx(&smem.k_full[stage], Traits::kBytesKV);
        copy(p.tma_k.with(smem.k_full[stage]), tKgK(_, n), tKsK(_, stage));
        wait_barrier(smem.v_empty[stage], phase ^ 1);
        Transaction::arrive_and_expect_tx(&smem.v_full[stage], Traits::kBytesKV);
        copy(p.tma_v.with(smem.v_full[stage]), tVgV(_, n), tVsV(_, stage));
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
  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tidx);
  auto thr_pv = mma_pv.get_thread_slice(tidx);
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_K)
  Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stage)
  Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stage)
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  // P: the probabilities as the A operand of P V, in the input type.
  Tensor tOrP = make_tensor<Element>(gmma_c_to_a_layout(tSrS.layout()));
  // (row, col) of each score / output element within the tile.
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor scores = gmma_rowcol_view(tSrS);
  Tensor score_coords = gmma_rowcol_view(tScS);
  Tensor out = gmma_rowcol_view(tOrO);
  Tensor out_coords = gmma_rowcol_view(tOcO);
  constexpr int kRows = decltype(size<0>(scores))::value;

  const GemmTurns<Traits::kPingpong> turns{tidx / 128};
  turns.start();
  int stage = 0, phase = 0, q_phase = 0;
  for (int t = first_tile(p); t < p.tiles; t = next_tile(p, t)) {
    const FwdTile tile = fwd_tile(p, t, kBlockM, kBlockN);
    if (!tile.valid) continue;
    const int m0 = tile.m_block * kBlockM;
    const uint8_t* codes = mask_codes(tile);
    KeyTileBits key_tiles;  // codes as bits: no load per key tile
    clear(tOrO);
    OnlineSoftmax<kRows> softmax;
    // Dropout zeroes the dropped probabilities after the row sums took them;
    // O is scaled by 1 / (1 - p) in the epilogue.
    constexpr bool kTerms = kTermsKernel != TermsKernel::none;
    const bool dropout = kTerms && p.terms.dropout.seed != nullptr;
    const DropoutRng dropout_rng(kTerms ? p.terms.dropout : DropoutParams{}, tile.batch,
                                 int(get<2>(p.shape_q)), tile.head);
    auto drop = [&](int n) {
      if constexpr (kTerms) {
        if (dropout) {
          for_each_dropout(scores, score_coords, m0, n * kBlockN, dropout_rng,
                           [&](int r, int c, bool kept) {
                             if (!kept) scores(r, c) = 0.0f;
                           });
        }
      }
    };

    // Softcap, ALiBi (without a mask: its part common to a row in
    // row_offset, which the softmax takes) and the attention mask, then -inf
    // outside causal and the window (only tiles that cross a boundary pay).
    constexpr bool kRowOffset = kTermsKernel == TermsKernel::computed;
    float row_offset[kRows];
    // Returns the factor the softmax applies to this tile's scores (1 but
    // for an additive mask's whole tiles, below).
    auto score_terms = [&](int n) {
      float tile_scale = 1.0f;
      if (p.softcap > 0.0f) {
        CUTE_UNROLL
        for (int i = 0; i < size(tSrS); ++i) tSrS(i) = p.softcap * tanhf(tSrS(i) * p.softcap_pre);
      }
      if constexpr (kTermsKernel == TermsKernel::masked) {
        // A tile the mask keeps whole needs no term. The scale an additive
        // mask applies first then goes to the softmax (when positive), and
        // only ALiBi still needs the scores scaled.
        const bool read = key_tiles.read(codes, n);
        const bool alibi = p.terms.alibi_slopes != nullptr;
        if (!read && !alibi && p.terms.bias_pre > 0.0f) {
          tile_scale = p.terms.bias_pre;
        } else if (read || p.terms.bias_pre != 1.0f || alibi) {
          apply_score_terms<true>(
              scores, score_coords, m0, n * kBlockN, p.terms, tile.batch,
              [&](int) { return tile.head; }, [](int row) { return row; }, tile.mask, read);
        }
      } else if constexpr (kRowOffset) {
        if (p.terms.alibi_slopes != nullptr) {
          apply_alibi_by_side(scores, score_coords, m0, kBlockM, n * kBlockN, kBlockN, p.terms,
                              tile.batch, tile.head, tile.mask, row_offset);
        } else {
          CUTE_UNROLL
          for (int r = 0; r < kRows; ++r) row_offset[r] = 0.0f;
        }
      }
      if (tile.mask.tile_needs_mask(m0, kBlockM, n * kBlockN, kBlockN)) {
        tile.mask.apply(scores, score_coords, m0, n * kBlockN);
      }
      return tile_scale;
    };

    wait_barrier(smem.q_full, q_phase);
    q_phase ^= 1;
    int n = key_tiles.previous(codes, tile.n_end, tile.n_begin);
    if (n >= tile.n_begin) {
      wait_barrier(smem.k_full[stage], phase);
      turns.wait();
      warpgroup_gemm<true, -1>(mma_qk, tSrQ, tSrK(_, _, _, stage), tSrS);
      turns.pass();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      Barrier::arrive(&smem.k_empty[stage]);
      float correction[kRows];
      const float tile_scale = score_terms(n);
      if constexpr (kRowOffset) {
        softmax.template update_deferred<true>(scores, p.scale_log2, correction, row_offset);
      } else if constexpr (kTermsKernel == TermsKernel::masked) {
        softmax.template update_deferred_scaled<true>(scores, p.scale_log2, correction, tile_scale);
      } else {
        softmax.template update_deferred<true>(scores, p.scale_log2, correction);
      }
      drop(n);
      convert_gmma_fragment(tSrS, tOrP);
      for (n = key_tiles.previous(codes, n, tile.n_begin); n >= tile.n_begin;
           n = key_tiles.previous(codes, n, tile.n_begin)) {
        int next = stage + 1, next_phase = phase;
        if (next == kStages) {
          next = 0;
          next_phase ^= 1;
        }
        // Q K^T of key tile n, then P V of the one before it; the softmax of
        // n runs while P V is on the tensor cores.
        wait_barrier(smem.k_full[next], next_phase);
        turns.wait();
        warpgroup_gemm<true, -1>(mma_qk, tSrQ, tSrK(_, _, _, next), tSrS);
        wait_barrier(smem.v_full[stage], phase);
        warpgroup_gemm<false, -1>(mma_pv, tOrP, tOrV(_, _, _, stage), tOrO);
        turns.pass();
        warpgroup_wait<1>();
        warpgroup_fence_operand(tSrS);
        Barrier::arrive(&smem.k_empty[next]);
        const float tile_scale = score_terms(n);
        if constexpr (kRowOffset) {
          softmax.template update_deferred<false>(scores, p.scale_log2, correction, row_offset);
        } else if constexpr (kTermsKernel == TermsKernel::masked) {
          softmax.template update_deferred_scaled<false>(scores, p.scale_log2, correction,
                                                         tile_scale);
        } else {
          softmax.template update_deferred<false>(scores, p.scale_log2, correction);
        }
        drop(n);
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        Barrier::arrive(&smem.v_empty[stage]);
        softmax.rescale(out, correction);
        convert_gmma_fragment(tSrS, tOrP);
        stage = next;
        phase = next_phase;
      }
      // Every Q K^T of the tile is done: the next tile's Q may load.
      if constexpr (Traits::kSeparateO) Barrier::arrive(&smem.q_empty);
      wait_barrier(smem.v_full[stage], phase);
      turns.wait();
      warpgroup_gemm<false, -1>(mma_pv, tOrP, tOrV(_, _, _, stage), tOrO);
      turns.pass();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      Barrier::arrive(&smem.v_empty[stage]);
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    } else if constexpr (Traits::kSeparateO) {
      Barrier::arrive(&smem.q_empty);  // a tile with no key (or none unmasked) reads no Q
    }

    // ------------------------------------------------------------ epilogue
    float lse[kRows];
    float sink_log2[kRows];  // -inf: no sink
    sink_logits_log2(p.sinks, out_coords, m0, [&](int) { return tile.head; }, sink_log2);
    // Rows with no key: zeros, and LSE +inf (or the sink's logit).
    softmax.finalize(out, p.scale_log2, lse, sink_log2);
    if (dropout) {
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= p.terms.dropout.scale;
    }

    // O's own buffer: wait until the last tile's store has read it. (Staged
    // in Q's buffer, O needs no wait: every wgmma that read Q has completed,
    // each warpgroup writes only its own rows, and the next Q loads only
    // after this store.)
    if constexpr (Traits::kSeparateO) {
      if (tidx == 0) tma_store_wait<0>();
      cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, 1);
    }
    Tensor rO = convert_gmma_fragment<Element>(tOrO);
    copy(rO, thr_pv.partition_C(sO));
    cutlass::arch::fence_view_async_shared();  // the TMA store reads what these stores wrote
    cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, 1);
    if (!varlen) {
      if (tidx == 0) {
        Tensor mO = p.tma_o.get_tma_tensor(p.shape_q);
        Tensor gO = local_tile(mO(_, _, tile.head, tile.batch), typename Traits::TileQ{},
                               make_coord(tile.m_block, 0));
        auto [tOgO, tOsO] = tma_partition(p.tma_o, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sO),
                                          group_modes<0, 2>(gO));
        copy(p.tma_o, tOsO, tOgO);
        tma_store_arrive();
        if constexpr (!Traits::kSeparateO) {
          tma_store_wait<0>();
          Barrier::arrive(&smem.q_empty);
        }
      }
    } else {
      // 16-byte pieces of the sequence's rows and the head dim's columns (a
      // 128-byte swizzle keeps each piece's 8 elements together).
      constexpr int kPieces = kHeadDim / 8;
      const int rows = min(kBlockM, tile.mask.seqlen_q - m0), pieces = get<1>(p.shape_q) / 8;
      Element* o = p.o + int64_t(tile.q_offset + m0) * p.o_seq + tile.head * p.o_head;
      for (int i = tidx; i < rows * kPieces; i += Traits::kConsumerThreads) {
        const int row = i / kPieces, piece = i % kPieces;
        if (piece < pieces) {
          *reinterpret_cast<uint4*>(o + row * p.o_seq + piece * 8) =
              *reinterpret_cast<const uint4*>(&sO(row, piece * 8));
        }
      }
      if constexpr (!Traits::kSeparateO) {
        cutlass::arch::NamedBarrier::sync(Traits::kConsumerThreads, 1);
        if (tidx == 0) Barrier::arrive(&smem.q_empty);
      }
    }

    if (p.lse != nullptr && get<1>(out_coords(0, 0)) == 0) {  // one lane of the four per row
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int row = m0 + get<0>(out_coords(r, 0));
        if (row < tile.mask.seqlen_q) {
          p.lse[tile.batch * p.lse_batch + tile.head * p.lse_head +
                int64_t(tile.q_offset + row) * p.lse_seq] = lse[r];
        }
      }
    }
  }
  if (!varlen && tidx == 0) tma_store_wait<0>();  // the buffer outlives the store's reads
}

}  // namespace samattn::attention::sm90
