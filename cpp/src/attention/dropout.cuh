// Attention dropout in the kernels: which probabilities a call keeps.
//
// Probability (b, h, i, j) (batch entry, query head, query and key index in
// the sequence) is kept iff its 8-bit random byte is >= threshold =
// round(p * 256) (at most 255), and a kept one is scaled by 1 / (1 - p) in
// float32, flash-attn's constant: its tests (and users' references) scale by
// the p asked for, not by the p the byte threshold keeps (within 1/512 of it),
// and in fp16 the difference (0.23 % at p = 0.17) is four times the rounding
// error those references allow. The bytes come from Philox4x32-7 (Salmon et al.,
// SC'11; 7 rounds pass BigCrush), keyed by the call's 64-bit seed, which the
// kernels read from the device so that a CUDA graph replays new masks when
// the caller redraws it. One Philox call gives the 16 bytes of one lane of
// one 16 x 32 block of the score matrix:
//   block (i / 16, j / 32); r = i % 16, c = j % 32;
//   lane = (r % 8) * 4 + (c % 8) / 2,
//   counter = (j / 32, i / 16, b * nheads + h, lane),
//   output word c / 8, byte (r / 8) * 2 + c % 2 of it (lowest first).
// That is the lane and value order of an m16n8 C fragment over four n8
// atoms (and of a warp's slice of a wgmma accumulator): a thread whose warp
// covers whole 16 x 32 blocks (the mma.sync and wgmma forwards' warps, and
// the mma.sync backward's S tiles with terms, do) draws each of its counters
// once, and kernels with different tiles agree on every element. A byte per
// probability (not 16 bits) halves the Philox calls, the largest part of
// dropout's cost. samattn/_dropout.py computes the same map with torch ops.
#pragma once

#include <cute/tensor.hpp>

#include <cmath>
#include <cstdint>

#include "attention/attention_problem.h"

namespace samattn::attention {

struct DropoutParams {
  const uint64_t* seed;  // nullptr: off
  uint32_t threshold;    // bytes below it drop: round(p * 256), at most 255
  float scale;           // 1 / (1 - p), as float32 arithmetic gives it
};

inline DropoutParams dropout_params(const DropoutView& d) {
  if (!(d.p > 0.0f) || d.seed == nullptr) return {nullptr, 0u, 1.0f};
  const double rounded = std::nearbyint(double(d.p) * 256.0);
  const uint32_t threshold = static_cast<uint32_t>(rounded > 255.0 ? 255.0 : rounded);
  return {d.seed, threshold, 1.0f / (1.0f - d.p)};
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
  uint32_t threshold_high;  // the threshold in the high 8 bits

  // Reads the seed only when dropout is on.
  __device__ DropoutRng(DropoutParams const& d, int batch, int nheads, int head) {
    const uint64_t seed = d.seed != nullptr ? *d.seed : 0;
    key = make_uint2(uint32_t(seed), uint32_t(seed >> 32));
    stream = uint32_t(batch) * uint32_t(nheads) + uint32_t(head);
    threshold_high = d.threshold << 24;
  }

  // The 16 bytes of `lane` in block (block_row, block_col) (16 x 32).
  __device__ uint4 bytes(int block_row, int block_col, int lane) const {
    return philox_4x32_7(
        make_uint4(uint32_t(block_col), uint32_t(block_row), stream, uint32_t(lane)), key);
  }
};

// Calls keep(r, c, kept) for every element (r, c) of the (rows, cols) view
// `scores` of an m16n8 C fragment (rowcol_view; gmma_rowcol_view for wgmma)
// of the score tile at (m0, n0) of the sequence, coords(r, c) its tile
// coordinates. Rows come in pairs (r, r + 8 of one 16-row block) and columns
// in groups of kWarpCols / 4 (c, c + 1 of each of kWarpCols / 8 adjacent n8
// atoms), which the layouts here put in one 16 x 32 block (kWarpCols 32) or
// one 16 x 16 half of it (16: where a warp has no whole block, it uses half
// of each draw); the bytes are fixed by that order, so the indexing is
// static.
template <int kWarpCols = 32, class Scores, class Coords, class Keep>
__device__ inline void for_each_dropout(Scores const& scores, Coords const& coords, int m0, int n0,
                                        DropoutRng const& rng, Keep&& keep) {
  using namespace cute;
  static_assert(kWarpCols == 32 || kWarpCols == 16);
  constexpr int kRows = decltype(size<0>(scores))::value;
  constexpr int kCols = decltype(size<1>(scores))::value;
  constexpr int kGroup = kWarpCols / 4;
  static_assert(kRows % 2 == 0 && kCols % kGroup == 0, "whole blocks of m16n8 fragments");
  CUTE_UNROLL
  for (int r0 = 0; r0 < kRows; r0 += 2) {
    const int row = m0 + get<0>(coords(r0, 0));
    CUTE_UNROLL
    for (int c0 = 0; c0 < kCols; c0 += kGroup) {
      const int col = n0 + get<1>(coords(0, c0));
      const uint4 w = rng.bytes(row / 16, col / 32, (row % 8) * 4 + (col % 8) / 2);
      uint32_t atoms[kGroup / 2];
      if constexpr (kGroup == 8) {
        atoms[0] = w.x, atoms[1] = w.y, atoms[2] = w.z, atoms[3] = w.w;
      } else {
        const bool right = col % 32 >= 16;
        atoms[0] = right ? w.z : w.x, atoms[1] = right ? w.w : w.y;
      }
      CUTE_UNROLL
      for (int a = 0; a < kGroup / 2; ++a) {
        CUTE_UNROLL
        for (int dr = 0; dr < 2; ++dr) {
          CUTE_UNROLL
          for (int dc = 0; dc < 2; ++dc) {
            // Byte b compared in the top byte: the bytes below it cannot
            // lift it past a threshold whose low 24 bits are zero.
            const int b = dr * 2 + dc;
            keep(r0 + dr, c0 + 2 * a + dc, (atoms[a] << (24 - 8 * b)) >= rng.threshold_high);
          }
        }
      }
    }
  }
}

}  // namespace samattn::attention
