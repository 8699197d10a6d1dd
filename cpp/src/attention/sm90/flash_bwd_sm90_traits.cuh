// The sm90 attention backward's types: its configuration's tiles, layouts
// and atoms (BwdTraits), the parameters filled once per call (BwdParams),
// the named barriers, a CTA's tile (BwdTile) and shared-memory views. The
// kernel (flash_bwd_sm90_kernel.cuh) composes the mainloop
// (flash_bwd_sm90_mainloop.cuh) and the epilogue (flash_bwd_sm90_epilogue.cuh)
// from them.
#pragma once

// cute/tensor.hpp first: the Hopper atoms below need what it declares.
#include <cute/tensor.hpp>
// clang-format off
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
// clang-format on
#include <cutlass/arch/barrier.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "attention/dropout.cuh"
#include "attention/mask.cuh"
#include "attention/mask_tiles.cuh"
#include "attention/score_terms.cuh"
#include "attention/sm90/flash_bwd_sm90_config.h"
#include "attention/sm90/gmem_tensor.cuh"
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
  // dQ = dS K, dS (query rows, keys) stored query-contiguous and K read as
  // (head dim, keys): both MN-major. The warpgroups split dQ's rows where the
  // query tile has 64 per warpgroup (d = 64 on 128 rows: each wgmma 64
  // columns wide instead of 32, and dS read once; 2-5% faster on the H100),
  // else the head dim.
  static constexpr bool kDQRowSplit = !kRoles && kBlockM == 64 * kConsumerGroups;
  static constexpr int kDQColumns = kDQRowSplit ? kHeadDim : kHeadDim / kConsumerGroups;
  using TiledMmaDQ = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<kDQColumns>, cute::Int<kBlockN>>,
                                 cute::GMMA::Major::MN, cute::GMMA::Major::MN>(),
      cute::Layout<cute::Shape<cute::Int<kDQRowSplit ? kConsumerGroups : 1>,
                               cute::Int<kDQRowSplit ? 1 : kConsumerGroups>, cute::_1>>{}));

  using SmemAtom = cute::GMMA::Layout_K_SW128_Atom<Element>;
  // K and V: each dQ warpgroup reads K^T's columns of its part of the head
  // dim, which must be whole swizzle atoms (64 elements wide at 128 bytes).
  using SmemAtomKV =
      std::conditional_t<kDQColumns % 64 == 0, SmemAtom, cute::GMMA::Layout_K_SW64_Atom<Element>>;
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
  // One query tile of dQ in fp32: each consumer warpgroup's share (its rows
  // or its part of the head dim) contiguous, in fragment order (DqStaging).
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

// Named barriers of the backward (CUTLASS numbers them past its own).
enum BwdBarrier : uint32_t {
  kBarrierDS = 1,       // every consumer's dS of the query tile is in shared memory
  kBarrierProbs = 3,    // split roles: P^T is in shared memory
  kBarrierDQFull = 4,   // + warpgroup: its dQ share is staged (consumer arrives, writer waits)
  kBarrierDQEmpty = 6,  // + warpgroup: the writer is done with it (writer arrives, consumer waits)
};
// A consumer warpgroup and the dQ writer warp.
constexpr uint32_t kDQHandshakeThreads = 128 + 32;

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

}  // namespace samattn::attention::sm90
