// The score terms beyond scale q k^T (ScoreTerms in attention_problem.h) in
// the kernels: ALiBi's bias, an attention mask and the sinks.
//
// Kernels compiled with these terms (kTerms, TermsKernel) add ALiBi's
// -slope * |d - j| (d: the row's diagonal, mask.cuh) in the units of the
// scores as they are (the slope times alibi_scale, attention_problem.h), and
// an additive mask to scores they scaled first (by bias_pre, the softmax then
// running with scale_log2 = log2(e), as with softcap); a keep mask sets -inf.
// Slopes and diagonals are recomputed per key tile (a few L1 loads) rather
// than held in registers through the key loop.
// A sink is one more key of the row with value zero: it joins the softmax
// denominator once, in the epilogue (OnlineSoftmax::finalize).
#pragma once

#include <cute/tensor.hpp>

#include <cmath>
#include <cstdint>

#include "attention/attention_problem.h"
#include "attention/dropout.cuh"
#include "attention/mask.cuh"

namespace samattn::attention {

// The terms as the kernels read them.
struct ScoreTermsParams {
  const float* alibi_slopes;  // nullptr: none
  int64_t alibi_batch_stride;
  const char* mask;  // nullptr: none
  MaskKind mask_kind;
  int64_t mask_batch, mask_head, mask_q;  // strides in bytes; keys are contiguous
  float bias_pre;                         // the scores' scale before an additive mask (1: none)
  float alibi_scale;                      // of the slopes
  DropoutParams dropout;
};

inline ScoreTermsParams score_terms_params(const AttentionForwardProblem& p) {
  const AttnMaskView& m = p.terms.mask;
  const int64_t bytes = m.kind == MaskKind::add_f32 ? 4 : 1;
  return {p.terms.alibi_slopes,
          p.terms.alibi_batch_stride,
          m.kind == MaskKind::none ? nullptr : static_cast<const char*>(m.ptr),
          m.ptr == nullptr ? MaskKind::none : m.kind,
          m.batch_stride * bytes,
          m.head_stride * bytes,
          m.q_stride * bytes,
          p.bias_pre,
          p.alibi_scale,
          dropout_params(p.terms.dropout)};
}

// The terms of one row of a score tile: its ALiBi slope (times alibi_scale)
// and diagonal, and its row of the mask (key j at element j of mask_row).
struct RowTerms {
  float slope, diagonal;
  const char* mask_row;  // (batch, head, query, key 0); the query clamped into the mask

  __device__ RowTerms(ScoreTermsParams const& t, int batch, int head, int query,
                      AttentionMask const& mask)
      : slope(t.alibi_slopes != nullptr
                  ? t.alibi_slopes[batch * t.alibi_batch_stride + head] * t.alibi_scale
                  : 0.0f),
        diagonal(float(mask.diagonal(query))),
        mask_row(t.mask + batch * t.mask_batch + head * t.mask_head +
                 min(query, mask.seqlen_q - 1) * t.mask_q) {}

  __device__ float alibi(int key) const { return -slope * fabsf(diagonal - float(key)); }
  // Key `key`'s mask element, the key clamped into the mask: a key past the
  // sequence is masked by AttentionMask anyway, so the loads need no branch.
  template <class T>
  __device__ T mask_at(int key, int seqlen_k) const {
    return reinterpret_cast<const T*>(mask_row)[min(key, seqlen_k - 1)];
  }
};

// scores (rows, cols) of the key tile at (m0, n0): bias_pre * s + the
// additive terms, -inf where a keep mask says 0 (kMask: the kernel variant with masks;
// read_mask false: the tile's mask keeps every element as it is, mask_tiles.h).
// coords(r, c): the tile coordinates of fragment element (r, c); head_of / query_of map a tile row
// to its query head and query row. The branches on the terms are uniform over the CTA and outside
// the unrolled loops, whose element code has none (a branch per element, or a loop copy per mask
// kind, made the kernel twice its size).
template <bool kMask, class Scores, class Coords, class HeadOf, class QueryOf>
__device__ inline void apply_score_terms(Scores& scores, Coords const& coords, int m0, int n0,
                                         ScoreTermsParams const& t, int batch, HeadOf head_of,
                                         QueryOf query_of, AttentionMask const& mask,
                                         bool read_mask = true) {
  using namespace cute;
  const bool alibi = t.alibi_slopes != nullptr;
  // ALiBi's distance d - j of element (r, c) is (d_r - j_0) - (j_c - j_0), with j_c - j_0
  // a constant of the fragment layout: one subtraction per score, where converting each
  // key index to float would take as many conversions as the softmax takes exp2s.
  const int key0 = n0 + get<1>(coords(0, 0));
  const float key0_f = float(key0);
  CUTE_UNROLL
  for (int r = 0; r < size<0>(scores); ++r) {
    const int row = m0 + get<0>(coords(r, 0));
    const RowTerms terms(t, batch, head_of(row), query_of(row), mask);
    if (t.bias_pre != 1.0f) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) scores(r, c) *= t.bias_pre;
    }
    if (alibi) {
      const float distance0 = terms.diagonal - key0_f;  // exact: both below 2^24
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) {
        const float distance = distance0 - float(n0 + get<1>(coords(0, c)) - key0);
        scores(r, c) = fmaf(fabsf(distance), -terms.slope, scores(r, c));
      }
    }
    if constexpr (kMask) {
      if (read_mask && t.mask_kind == MaskKind::add_f32) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(scores); ++c) {
          scores(r, c) += terms.mask_at<float>(n0 + get<1>(coords(0, c)), mask.seqlen_k);
        }
      } else if (read_mask && t.mask_kind == MaskKind::keep) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(scores); ++c) {
          const uint8_t keep = terms.mask_at<uint8_t>(n0 + get<1>(coords(0, c)), mask.seqlen_k);
          scores(r, c) = keep != 0 ? scores(r, c) : -INFINITY;
        }
      }
    }
  }
}

// ALiBi on the key tile at (m0, n0) of rows m0 .. m0 + block_m - 1 (query
// rows, one head), returning in row_offset what the softmax adds to this
// lane's scores of each row (OnlineSoftmax's row_offset). A tile left of the
// diagonals of all its rows (every key j <= d) has the bias -slope |d - j| =
// s slope (j - j0) + s slope (j0 - d) with s = +1, one right of them (j >= d)
// with s = -1; j0 is the lane's first key. The first part is one FMA per
// score with a constant of the fragment layout, the second a constant of the
// row. Tiles that the diagonals cross (one or two per query tile) take the
// distance per score and offsets 0. bias_pre != 1 (scores scaled first)
// scales them before.
template <int kRows, class Scores, class Coords>
__device__ inline void apply_alibi_by_side(Scores& scores, Coords const& coords, int m0,
                                           int block_m, int n0, int block_n,
                                           ScoreTermsParams const& t, int batch, int head,
                                           AttentionMask const& mask, float (&row_offset)[kRows]) {
  using namespace cute;
  static_assert(decltype(size<0>(scores))::value == kRows);
  if (t.bias_pre != 1.0f) {
    CUTE_UNROLL
    for (int i = 0; i < size(scores); ++i) scores(i) *= t.bias_pre;
  }
  const float slope = t.alibi_slopes[batch * t.alibi_batch_stride + head] * t.alibi_scale;
  const int key0 = n0 + get<1>(coords(0, 0));
  const float key0_f = float(key0);
  const bool left = n0 + block_n - 1 <= mask.diagonal(m0);
  const bool right = n0 >= mask.diagonal(m0 + block_m - 1);
  if (left || right) {
    const float signed_slope = left ? slope : -slope;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float diagonal = float(mask.diagonal(m0 + get<0>(coords(r, 0))));
      row_offset[r] = signed_slope * (key0_f - diagonal);
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) {
        const float from_key0 = float(n0 + get<1>(coords(0, c)) - key0);
        scores(r, c) = fmaf(signed_slope, from_key0, scores(r, c));
      }
    }
    return;
  }
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    row_offset[r] = 0.0f;
    const float distance0 = float(mask.diagonal(m0 + get<0>(coords(r, 0)))) - key0_f;
    CUTE_UNROLL
    for (int c = 0; c < size<1>(scores); ++c) {
      const float distance = distance0 - float(n0 + get<1>(coords(0, c)) - key0);
      scores(r, c) = fmaf(fabsf(distance), -slope, scores(r, c));
    }
  }
}

// The additive terms of one score (ALiBi and an additive mask; a keep mask
// adds nothing), for the backward's softcap derivative.
template <bool kMask>
__device__ inline float additive_term(ScoreTermsParams const& t, RowTerms const& row, int key,
                                      int seqlen_k) {
  float term = t.alibi_slopes != nullptr ? row.alibi(key) : 0.0f;
  if (kMask && t.mask_kind == MaskKind::add_f32) term += row.mask_at<float>(key, seqlen_k);
  return term;
}

// Each fragment row's sink logit in log2 units (-inf without sinks).
template <int kRows, class Coords, class HeadOf>
__device__ inline void sink_logits_log2(const float* sinks, Coords const& coords, int m0,
                                        HeadOf head_of, float (&sink_log2)[kRows]) {
  using namespace cute;
  constexpr float kLog2e = 1.4426950408889634f;
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    sink_log2[r] =
        sinks != nullptr ? sinks[head_of(m0 + get<0>(coords(r, 0)))] * kLog2e : -INFINITY;
  }
}

}  // namespace samattn::attention
