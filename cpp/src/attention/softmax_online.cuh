// Online softmax over key tiles (FlashAttention-2): per query row a running
// maximum and a running sum of exponentials; the output accumulator is
// rescaled whenever the maximum grows and divided by the sum once, at the end.
//
// Scores arrive unscaled; exp(scale * s) is computed as exp2(s * scale_log2 -
// max * scale_log2), one FFMA and one MUFU.EX2 per score.
#pragma once

#include <cute/tensor.hpp>

#include <cmath>

namespace samattn::attention {

__device__ inline float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));  // exp2(-inf) = +0
  return y;
}

// Reduction over the four lanes of a quad, which share the rows of an
// mma.sync C fragment.
template <class Op>
__device__ inline float quad_allreduce(float value, Op op) {
  value = op(value, __shfl_xor_sync(0xffffffffu, value, 1));
  value = op(value, __shfl_xor_sync(0xffffffffu, value, 2));
  return value;
}

template <int kRows>
struct OnlineSoftmax {
  float row_max[kRows];
  float row_sum[kRows];  // this lane's partial sum; the quad's is summed at the end

  __device__ OnlineSoftmax() {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.0f;
    }
  }

  // scores (rows, cols) of one key tile become probabilities relative to the
  // new running maximum; out (rows, head dim) is rescaled to match.
  // kFirstTile: out and the sums are still zero, nothing to rescale.
  template <bool kFirstTile, class Scores, class Out>
  __device__ void update(Scores& scores, Out& out, float scale_log2) {
    float correction[kRows];
    update_deferred<kFirstTile>(scores, scale_log2, correction);
    if constexpr (!kFirstTile) rescale(out, correction);
  }

  // As update, but leaves the output to the caller, who multiplies its row r
  // by correction[r] (rescale) once no MMA accumulates into it any more; so
  // the softmax of one key tile can overlap the P V product of the last.
  template <bool kFirstTile, class Scores>
  __device__ void update_deferred(Scores& scores, float scale_log2, float (&correction)[kRows]) {
    update_impl<kFirstTile, false>(scores, scale_log2, correction, nullptr);
  }

  // As update_deferred for the scores of row r plus row_offset[r]: a term
  // common to this lane's scores of the row in this tile (ALiBi's, away from
  // the diagonal) joins its maximum and the exponent's addend, not every score.
  template <bool kFirstTile, class Scores>
  __device__ void update_deferred(Scores& scores, float scale_log2, float (&correction)[kRows],
                                  const float (&row_offset)[kRows]) {
    update_impl<kFirstTile, true>(scores, scale_log2, correction, row_offset);
  }

  // As update_deferred for scores still to be multiplied by tile_scale
  // (> 0; an additive mask's pre-scale on a tile that reads no mask): the
  // scale goes to the tile's maximum and the exponent's factor instead of
  // to every score. Rounding is monotone, so the maximum is the one of the
  // scaled scores.
  template <bool kFirstTile, class Scores>
  __device__ void update_deferred_scaled(Scores& scores, float scale_log2,
                                         float (&correction)[kRows], float tile_scale) {
    update_impl<kFirstTile, false, true>(scores, scale_log2, correction, nullptr, tile_scale);
  }

  // out (rows, head dim) *= correction per row.
  template <class Out>
  __device__ static void rescale(Out& out, const float (&correction)[kRows]) {
    using namespace cute;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(out); ++c) out(r, c) *= correction[r];
    }
  }

  // Divides out by the row sums and returns each row's natural-log LSE in
  // lse[]. sink_log2[r] (-inf: none) is one more key of row r with value 0,
  // in log2 units: it joins the sum only. Rows that attended nothing (sum 0)
  // get output 0 and LSE +inf, or the sink's logit.
  template <class Out>
  __device__ void finalize(Out& out, float scale_log2, float (&lse)[kRows],
                           const float (&sink_log2)[kRows]) {
    using namespace cute;
    constexpr float kLn2 = 0.69314718055994530942f;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float sum = quad_allreduce(row_sum[r], [](float a, float b) { return a + b; });
      float max_log2 = row_max[r] * scale_log2;
      // 1 / sum as __frcp_rn: the same code whatever the division flags (with
      // --use_fast_math's approximate division the d = 256 sm90 forward spilled
      // 248 bytes; it does not with this).
      float inv_sum;
      if (sink_log2[r] != -INFINITY) {
        // The sink joins the sum, rescaled to the larger maximum; the keys'
        // share shrinks by `keep`.
        const bool no_keys = row_max[r] == -INFINITY;
        const float new_max = no_keys ? sink_log2[r] : fmaxf(max_log2, sink_log2[r]);
        const float keep = no_keys ? 0.0f : fast_exp2(max_log2 - new_max);
        sum = sum * keep + fast_exp2(sink_log2[r] - new_max);
        max_log2 = new_max;
        inv_sum = keep * __frcp_rn(sum);
      } else {
        inv_sum = sum == 0.0f || sum != sum ? 1.0f : __frcp_rn(sum);
      }
      const bool empty = sum == 0.0f || sum != sum;
      lse[r] = empty ? INFINITY : (max_log2 + __log2f(sum)) * kLn2;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(out); ++c) out(r, c) *= inv_sum;
    }
  }

 private:
  template <bool kFirstTile, bool kOffset, bool kScaled = false, class Scores>
  __device__ void update_impl(Scores& scores, float scale_log2, float (&correction)[kRows],
                              const float* row_offset, float tile_scale = 1.0f) {
    using namespace cute;
    static_assert(decltype(size<0>(scores))::value == kRows);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float tile_max = kOffset || kScaled ? -INFINITY : row_max[r];
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) tile_max = fmaxf(tile_max, scores(r, c));
      // Before the quad's reduction: a lane's offset may differ from its
      // neighbours' (it holds other columns).
      if constexpr (kOffset) tile_max = fmaxf(row_max[r], tile_max + row_offset[r]);
      if constexpr (kScaled) tile_max = fmaxf(row_max[r], tile_max * tile_scale);
      tile_max = quad_allreduce(tile_max, [](float a, float b) { return fmaxf(a, b); });
      // A row masked so far keeps max -inf: subtract 0 so that its
      // probabilities are exp2(-inf) = 0, not NaN.
      const float max_scaled = tile_max == -INFINITY ? 0.0f : tile_max * scale_log2;
      const float addend = kOffset ? row_offset[r] * scale_log2 - max_scaled : -max_scaled;
      if constexpr (!kFirstTile) {
        correction[r] = fast_exp2(row_max[r] * scale_log2 - max_scaled);
        row_sum[r] *= correction[r];
      } else {
        correction[r] = 1.0f;
      }
      row_max[r] = tile_max;
      const float score_log2 = kScaled ? scale_log2 * tile_scale : scale_log2;
      float sum = 0.0f;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) {
        const float p = fast_exp2(scores(r, c) * score_log2 + addend);
        scores(r, c) = p;
        sum += p;
      }
      row_sum[r] += sum;
    }
  }
};

}  // namespace samattn::attention
