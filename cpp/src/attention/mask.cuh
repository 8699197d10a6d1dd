// Which keys a query row may attend, flash-attn 2 rules:
//   key j < seqlen_k, and with d = i + seqlen_k - seqlen_q (bottom-right
//   alignment): d - window_left <= j <= d + window_right, a bound of -1
//   meaning unbounded; causal is window_right = 0.
// The API normalizes the window once (normalize_window in attention_problem.h):
// a kept bound is < seqlen_q - 1 (right) or < seqlen_k - 1 (left), so that,
// with the diagonal computed as row + (seqlen_k - seqlen_q), nothing below
// leaves int32 for any seqlen < 2^31.
#pragma once

#include <cute/tensor.hpp>

#include <cmath>

namespace samattn::attention {

struct AttentionMask {
  struct Identity {
    CUTE_HOST_DEVICE int operator()(int row) const { return row; }
  };

  int seqlen_q, seqlen_k;
  int window_left, window_right;  // -1 = unbounded

  // The key on row `row`'s diagonal: in (-seqlen_q, seqlen_k).
  CUTE_HOST_DEVICE int diagonal(int row) const { return row + (seqlen_k - seqlen_q); }
  // First key row `row` may attend (may exceed its end: nothing to attend).
  CUTE_HOST_DEVICE int first_key(int row) const {
    const int d = diagonal(row);
    return window_left >= 0 && d > window_left ? d - window_left : 0;
  }
  // One past the last key row `row` may attend (may be <= 0).
  CUTE_HOST_DEVICE int key_end(int row) const {
    const int d = diagonal(row);
    return window_right >= 0 && d < seqlen_k - 1 - window_right ? d + window_right + 1 : seqlen_k;
  }

  // Key tiles [n_begin, n_end) that some row of the query tile at m0 attends;
  // empty when no row attends anything.
  CUTE_HOST_DEVICE void key_tiles(int m0, int block_m, int block_n, int& n_begin,
                                  int& n_end) const {
    key_tiles_of_rows(m0, min(m0 + block_m, seqlen_q) - 1, block_n, n_begin, n_end);
  }
  // The same for query rows first_row..last_row.
  CUTE_HOST_DEVICE void key_tiles_of_rows(int first_row, int last_row, int block_n, int& n_begin,
                                          int& n_end) const {
    const int first = first_key(first_row);
    const int end = key_end(last_row);
    if (end <= first) {
      n_begin = n_end = 0;
    } else {
      n_begin = first / block_n;
      n_end = (end + block_n - 1) / block_n;
    }
  }

  // Whether some element of the (m0, n0) tile is masked: the tile crosses the
  // sequence end, the upper (causal) diagonal or the lower window diagonal.
  CUTE_HOST_DEVICE bool tile_needs_mask(int m0, int block_m, int n0, int block_n) const {
    return rows_need_mask(m0, m0 + block_m - 1, n0, block_n);
  }
  // The same for query rows first_row..last_row.
  CUTE_HOST_DEVICE bool rows_need_mask(int first_row, int last_row, int n0, int block_n) const {
    return n0 + block_n > key_end(first_row) || n0 < first_key(last_row);
  }

  // Sets masked scores to -inf. scores: (rows, cols) view of the thread's
  // fragment; coords: its (row, col) coordinates within the tile; query_of
  // maps a tile row m0 + r to its query row (rows of packed query heads
  // share one).
  template <class Scores, class Coords, class QueryOf = Identity>
  __device__ void apply(Scores& scores, Coords const& coords, int m0, int n0,
                        QueryOf query_of = {}) const {
    using namespace cute;
    CUTE_UNROLL
    for (int r = 0; r < size<0>(scores); ++r) {
      const int row = query_of(m0 + get<0>(coords(r, 0)));
      const int lo = first_key(row);
      const int hi = key_end(row);
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) {
        const int col = n0 + get<1>(coords(0, c));
        if (col < lo || col >= hi) scores(r, c) = -INFINITY;
      }
    }
  }
};

}  // namespace samattn::attention
