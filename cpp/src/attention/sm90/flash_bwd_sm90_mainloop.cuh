// The sm90 attention backward's mainloop: the producer warpgroup's loads
// (bwd_producer) and the consumers' walk over a key tile's query tiles
// (consume_key_halves up to head dim 128, consume_roles past it), with the
// steps from S^T to P^T and from dP^T to dS^T between their GEMMs.
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

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention/sm90/flash_bwd_sm90_epilogue.cuh"
#include "attention/sm90/flash_bwd_sm90_traits.cuh"
#include "attention/sm90/gmma_fragment.cuh"
#include "attention/sm90/warpgroup.cuh"
#include "attention/softmax_online.cuh"

namespace samattn::attention::sm90 {

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

// Consumers up to head dim 128: warpgroup g owns keys [64 g, 64 g + 64) of
// the tile and runs every GEMM but dQ for them; dQ is split by query rows or
// head dim (BwdTraits::kDQRowSplit).
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

}  // namespace samattn::attention::sm90
