// Attention dropout in the kernels: which probabilities a call keeps.
//
// Probability (b, h, i, j) (batch entry, query head, query and key index in
// the sequence) is kept iff its 8-bit random byte is >= threshold =
// round(p * 256) (at most 255), and a kept one is scaled by
// 256 / (256 - threshold): p is used rounded to a multiple of 1/256, and the
// scale is that of the p used, so the output's expectation is exactly the
// output without dropout. The bytes come from Philox4x32-7 (Salmon et al.,
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
  float scale;           // 256 / (256 - threshold)
};

inline DropoutParams dropout_params(const DropoutView& d) {
  if (!(d.p > 0.0f) || d.seed == nullptr) return {nullptr, 0u, 1.0f};
  const double rounded = std::nearbyint(double(d.p) * 256.0);
  const uint32_t threshold = static_cast<uint32_t>(rounded > 255.0 ? 255.0 : rounded);
  return {d.seed, threshold, static_cast<float>(256.0 / (256.0 - double(threshold)))};
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
  uint32_t stream;           // batch * nheads + head
  uint32_t threshold_high;   // the threshold in the high 8 bits
  uint32_t threshold_bytes;  // the threshold in each byte

  // Reads the seed only when dropout is on.
  __device__ DropoutRng(DropoutParams const& d, int batch, int nheads, int head) {
    const uint64_t seed = d.seed != nullptr ? *d.seed : 0;
    key = make_uint2(uint32_t(seed), uint32_t(seed >> 32));
    stream = uint32_t(batch) * uint32_t(nheads) + uint32_t(head);
    threshold_high = d.threshold << 24;
    threshold_bytes = d.threshold * 0x01010101u;
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

// Bit 7 of each byte of the result: that byte of x >= that byte of y (bytes
// unsigned; the other bits are not meaningful). y_low = y & 0x7f7f7f7f.
__device__ inline uint32_t bytes_at_least(uint32_t x, uint32_t y, uint32_t y_low) {
  // Per byte 0x80 + (x & 0x7f) - (y & 0x7f), which never borrows from the
  // next byte: its bit 7 says whether the low 7 bits compare >=.
  const uint32_t low = (x | 0x80808080u) - y_low;
  return (x & ~y) | (~(x ^ y) & low);
}

// The keep decisions of one thread's accumulator fragment, drawn ahead of
// the scores (they depend only on coordinates: a warpgroup draws them while
// its tensor cores compute the scores), as byte masks in the fragment's
// storage order: groups of four values (row r: columns c, c + 1; row r + 8:
// the same), in an m16n8 fragment ((2, 2), MMA_M, MMA_N) one n8 atom, in a
// wgmma one ((2, 2, N/8), 1, 1) one 8-column group (gmma_fragment.cuh).
// Group g's word is output word (its 8-column group) % 4 of the draw of its
// 16 x 32 block, bit 7 of each byte set where kept. coords: the rowcol view
// (rowcol_view, gmma_rowcol_view) of the fragment's tile coordinates, whose
// columns run through the 8-column groups in order, 2 values each.
template <int kGroups, class Coords>
__device__ inline void draw_keep_masks(Coords const& coords, int m0, int n0, DropoutRng const& rng,
                                       uint32_t (&masks)[kGroups]) {
  using namespace cute;
  constexpr int kRowBlocks = decltype(size<0>(coords))::value / 2;
  constexpr int kColGroups = decltype(size<1>(coords))::value / 2;
  static_assert(kRowBlocks * kColGroups == kGroups && kColGroups % 4 == 0, "16 x 32 blocks");
  const uint32_t y_low = rng.threshold_bytes & 0x7f7f7f7fu;
  CUTE_UNROLL
  for (int m = 0; m < kRowBlocks; ++m) {
    const int row = m0 + get<0>(coords(2 * m, 0));
    CUTE_UNROLL
    for (int b = 0; b < kColGroups / 4; ++b) {
      const int col = n0 + get<1>(coords(0, 8 * b));  // the block's first group
      const uint4 w = rng.bytes(row / 16, col / 32, (row % 8) * 4 + (col % 8) / 2);
      const uint32_t words[4] = {w.x, w.y, w.z, w.w};
      CUTE_UNROLL
      for (int a = 0; a < 4; ++a) {
        masks[m + kRowBlocks * (4 * b + a)] = bytes_at_least(words[a], rng.threshold_bytes, y_low);
      }
    }
  }
}

// Zeroes the dropped values of P, 16-bit values in the fragment's storage
// order (each group's two row pairs in two 32-bit registers): one byte
// permute that spreads two keep bits over a pair, and one AND.
template <int kGroups, class Tensor>
__device__ inline void apply_keep_masks(Tensor& p, const uint32_t (&masks)[kGroups]) {
  static_assert(sizeof(typename Tensor::value_type) == 2 &&
                decltype(cute::size(p))::value == 4 * kGroups);
  uint32_t* pairs = reinterpret_cast<uint32_t*>(p.data());
  CUTE_UNROLL
  for (int g = 0; g < kGroups; ++g) {
    uint32_t low, high;  // each byte's bit 7 copied over the byte (prmt's sign mode)
    asm("prmt.b32 %0, %1, 0, 0x9988;" : "=r"(low) : "r"(masks[g]));
    asm("prmt.b32 %0, %1, 0, 0xbbaa;" : "=r"(high) : "r"(masks[g]));
    pairs[2 * g] &= low;
    pairs[2 * g + 1] &= high;
  }
}

}  // namespace samattn::attention
