// Grouped GEMM (mixture of experts): the groups' extents come from a device
// array of cumulative ends, read by the kernel itself, so the host never
// waits for them.
//
//   rows (SAMATTN_GROUP_ROWS): D[rows of g] = A[rows of g] @ B[g], where group
//     g owns rows [end[g-1], end[g]) of A and D (the tokens routed to expert g,
//     sorted by expert); the rows after end[groups-1] are written as zeros.
//   k (SAMATTN_GROUP_K): D[g] = A[:, ks] @ B[ks, :] over ks = [end[g-1],
//     end[g]) of K: the weight gradient of the rows form (x_g^T @ dy_g).
//   list (SAMATTN_GROUP_LIST): independent GEMMs of any sizes, described on
//     the host (no ends).
//
// The ends are clamped into [0, limit] and each group starts at the previous
// group's (clamped) end, so bad offsets never address memory outside the
// operands; the Python layer reports them (without a synchronization).
#pragma once

#include <cstdint>
#include <string>

#include "common/problem.h"
#include "samattn/samattn.h"

namespace samattn::gemm::group {

inline constexpr int kGroupNone = SAMATTN_GROUP_NONE;
inline constexpr int kGroupRows = SAMATTN_GROUP_ROWS;
inline constexpr int kGroupK = SAMATTN_GROUP_K;
inline constexpr int kGroupList = SAMATTN_GROUP_LIST;

// The most groups a grouped GEMM takes (the K form puts them on gridDim.y).
inline constexpr int64_t kMaxGroups = 65535;

// CTAs along M of a rows-grouped GEMM: every group's last tile may be partial,
// and the zero rows after the last group are one more group.
inline int64_t row_tile_bound(int64_t rows, int64_t groups, int64_t block_m) {
  return (rows + block_m - 1) / block_m + groups;
}

// The grouping part of the sm80 and sm75 families' plans: grouped GEMMs run
// on their tensor-core kernels (`tensor_core`), not on the FMA-unit ones; a
// list runs on either (gemm_dispatch.h, run_gemm_list).
inline bool plan_group(Family family, const GemmProblem& problem, bool tensor_core,
                       std::string* why) {
  if (problem.group_mode == kGroupNone || problem.group_mode == kGroupList || tensor_core) {
    return true;
  }
  if (why != nullptr) {
    *why = std::string("grouped GEMMs run on tensor cores, and the ") + family_name(family) +
           " family computes this dtype on its FMA units (exact fp32, or bf16 on sm75)";
  }
  return false;
}

#if defined(__CUDACC__) || defined(SAMATTN_GROUP_EMULATION)
// Device code; the CPU emulation (emulation/group_schedule_emulation.cpp)
// compiles it as host code, with a warp of host threads behind the
// intrinsics.
#if defined(__CUDACC__)
#define SAMATTN_GROUP_DEVICE __device__ __forceinline__
#else
#define SAMATTN_GROUP_DEVICE inline
#endif

struct Range {
  int begin, end;
};

SAMATTN_GROUP_DEVICE int clamped_end(const int32_t* ends, int g, int limit) {
  return min(max(__ldg(ends + g), 0), limit);
}

// Group g's range of [0, limit).
SAMATTN_GROUP_DEVICE Range range(const int32_t* ends, int g, int limit) {
  const int begin = g == 0 ? 0 : clamped_end(ends, g - 1, limit);
  return {begin, max(clamped_end(ends, g, limit), begin)};
}

struct RowTile {
  int group;   // groups: the zero rows after the last group
  int tile;    // BM-row tile within the group
  Range rows;  // the group's rows
};

// Which group's row tile the rows-grouped CTA `linear` computes; false when
// `linear` is past the last tile. Every warp runs the same scan over the
// groups (32 at a time, tile counts summed with shuffles): no shared memory,
// no barrier. Groups 0..groups-1 are the ends' groups; group `groups` is
// [end[groups-1], rows).
SAMATTN_GROUP_DEVICE bool find_row_tile(const int32_t* ends, int groups, int rows, int block_m,
                                        int linear, RowTile* out) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = static_cast<int>(threadIdx.x % 32);
  int tiles_before = 0;
  for (int first = 0; first <= groups; first += 32) {
    const int g = first + lane;
    Range r{0, 0};
    if (g < groups) {
      r = range(ends, g, rows);
    } else if (g == groups) {
      r.begin = groups == 0 ? 0 : clamped_end(ends, groups - 1, rows);
      r.end = rows;
    }
    const int tiles = (r.end - r.begin + block_m - 1) / block_m;
    int inclusive = tiles;
    for (int offset = 1; offset < 32; offset *= 2) {
      const int other = __shfl_up_sync(kAll, inclusive, offset);
      if (lane >= offset) inclusive += other;
    }
    const int end_tile = tiles_before + inclusive;
    const int begin_tile = end_tile - tiles;
    const unsigned found = __ballot_sync(kAll, linear >= begin_tile && linear < end_tile);
    if (found != 0) {
      const int src = __ffs(found) - 1;
      out->group = __shfl_sync(kAll, g, src);
      out->tile = linear - __shfl_sync(kAll, begin_tile, src);
      out->rows.begin = __shfl_sync(kAll, r.begin, src);
      out->rows.end = __shfl_sync(kAll, r.end, src);
      return true;
    }
    tiles_before = __shfl_sync(kAll, end_tile, 31);
  }
  return false;
}

#endif  // __CUDACC__ || SAMATTN_GROUP_EMULATION

}  // namespace samattn::gemm::group
