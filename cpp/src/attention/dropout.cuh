// Attention dropout in the kernels: which probabilities a call keeps.
//
// Probability (b, h, i, j) (batch entry, query head, query and key index in
// the sequence) is kept iff its 16-bit random word is >= threshold =
// round(p * 65536), and a kept one is scaled by 1 / (1 - p). The words come
// from Philox4x32-7 (Salmon et al., SC'11; 7 rounds pass BigCrush), keyed by
// the call's 64-bit seed, which the kernels read from the device so that a
// CUDA graph replays new masks when the caller redraws it. One Philox call
// gives the 8 words of one lane of one 16 x 16 unit of the score matrix:
//   unit (i / 16, j / 16); r = i % 16, c = j % 16;
//   lane = (r % 8) * 4 + (c % 8) / 2, word = (c / 8) * 4 + (r / 8) * 2 + c % 2,
//   counter = (j / 16, i / 16, b * nheads + h, lane), words 2w and 2w + 1 the
//   low and high halves of output w.
// That is the lane and value order of an m16n8 C fragment over two n8
// atoms (and of a warp's slice of a wgmma accumulator), so a thread whose
// warp covers whole 16 x 16 units (the mma.sync and wgmma forwards' warps and
// the mma.sync backward's S tiles with terms do) draws each of its counters
// once, and kernels with different tiles agree on every element.
// samattn/_dropout.py computes the same map with torch ops.
#pragma once

#include <cute/tensor.hpp>

#include <cmath>
#include <cstdint>

#include "attention/attention_problem.h"

namespace samattn::attention {

struct DropoutParams {
  const uint64_t* seed;  // nullptr: off
  uint32_t threshold;    // words below it drop: round(p * 65536)
  float scale;           // 1 / (1 - p)
};

inline DropoutParams dropout_params(const DropoutView& d) {
  if (!(d.p > 0.0f) || d.seed == nullptr) return {nullptr, 0u, 1.0f};
  const double threshold = std::nearbyint(double(d.p) * 65536.0);
  return {d.seed, static_cast<uint32_t>(threshold > 65535.0 ? 65535.0 : threshold),
          static_cast<float>(1.0 / (1.0 - double(d.p)))};
}

__device__ inline uint4 philox_4x32_7(uint4 counter, uint2 key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  CUTE_UNROLL
  for (int round = 0; round < 7; ++round) {
    const uint32_t hi0 = __umulhi(kM0, counter.x), lo0 = kM0 * counter.x;
    const uint32_t hi1 = __umulhi(kM1, counter.z), lo1 = kM1 * counter.z;
    counter = make_uint4(hi1 ^ counter.y ^ key.x, lo1, hi0 ^ counter.w ^ key.y, lo0);
    key.x += kW0;
    key.y += kW1;
  }
  return counter;
}

// The dropout draws of one (batch, head) of a call.
struct DropoutRng {
  uint2 key;
  uint32_t stream;          // batch * nheads + head
  uint32_t threshold_high;  // the threshold in the high 16 bits

  // Reads the seed only when dropout is on.
  __device__ DropoutRng(DropoutParams const& d, int batch, int nheads, int head) {
    const uint64_t seed = d.seed != nullptr ? *d.seed : 0;
    key = make_uint2(uint32_t(seed), uint32_t(seed >> 32));
    stream = uint32_t(batch) * uint32_t(nheads) + uint32_t(head);
    threshold_high = d.threshold << 16;
  }

  __device__ uint4 words(int unit_row, int unit_col, int lane) const {
    return philox_4x32_7(make_uint4(uint32_t(unit_col), uint32_t(unit_row), stream, uint32_t(lane)),
                         key);
  }
};

// Calls keep(r, c, kept) for every element (r, c) of the (rows, cols) view
// `scores` of an m16n8 C fragment (rowcol_view; gmma_rowcol_view for wgmma)
// of the score tile at (m0, n0)
// of the sequence, coords(r, c) its tile coordinates. Rows come in pairs
// (r, r + 8 of one 16-row block) and columns in fours (c, c + 1 of one n8
// atom, then of the next), which the layouts here put in one 16 x 16 unit;
// their words are fixed by that order, so the indexing is static.
template <class Scores, class Coords, class Keep>
__device__ inline void for_each_dropout(Scores const& scores, Coords const& coords, int m0, int n0,
                                        DropoutRng const& rng, Keep&& keep) {
  using namespace cute;
  constexpr int kRows = decltype(size<0>(scores))::value;
  constexpr int kCols = decltype(size<1>(scores))::value;
  static_assert(kRows % 2 == 0 && kCols % 4 == 0, "whole 16 x 16 units of m16n8 fragments");
  CUTE_UNROLL
  for (int r0 = 0; r0 < kRows; r0 += 2) {
    const int row = m0 + get<0>(coords(r0, 0));
    CUTE_UNROLL
    for (int c0 = 0; c0 < kCols; c0 += 4) {
      const int col = n0 + get<1>(coords(0, c0));
      const uint4 w = rng.words(row / 16, col / 16, (row % 8) * 4 + (col % 8) / 2);
      const uint32_t halves[4] = {w.x, w.y, w.z, w.w};
      CUTE_UNROLL
      for (int dr = 0; dr < 2; ++dr) {
        CUTE_UNROLL
        for (int dc = 0; dc < 4; ++dc) {
          // Word 2w + 1 is the high half of output w: compared in place;
          // word 2w is its low half: shifted up first.
          const int word = (dc / 2) * 4 + dr * 2 + dc % 2;
          const uint32_t half = halves[word / 2];
          keep(r0 + dr, c0 + dc, (word % 2 == 1 ? half : half << 16) >= rng.threshold_high);
        }
      }
    }
  }
}

}  // namespace samattn::attention
