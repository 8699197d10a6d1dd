// How the sm90 family runs a grouped GEMM (gemm/group.h): the rows form on
// CUTLASS's pointer-array kernel (grouped_sm90_launch.cuh), when TMA can
// describe every group's operands. Host code only, like gemm_sm90_plan.h.
#pragma once

#include <cstdint>
#include <string>

#include "common/problem.h"
#include "gemm/sm90/gemm_sm90_plan.h"

namespace samattn::gemm::sm90 {

// The grouped kernel's one configuration, as samattn_gemm_plan names it:
// 128x256, both consumer warpgroups on one tile ("cooperative"), cluster 1x2
// (the two CTAs share, and multicast, the group's A tile). (Measured and
// dropped: 64x256 "ping-pong", cluster 1x2, ran at 0.46-0.67 of it on the
// MoE shapes of samattn.bench on the H100.)
inline constexpr const char* kGroupedTileName = "grouped_128x256_c1x2";

// A rows-grouped GEMM: `groups` groups share A's m rows and D (row-major);
// b is group g's (k, n) matrix at b.ptr + g * b.batch_stride, K-major or
// N-major.
struct GroupedPlan {
  bool eligible = false;
  std::string reason;  // why not, when !eligible
  int64_t groups = 0, m = 0, n = 0, k = 0;
  Operand a, b, d;
  // The order in which the persistent grid walks a group's output tiles:
  // along N (a band of row tiles sweeps every column tile: A read once, B once
  // per band) or along M (a column of tiles at a time: B read once).
  bool raster_along_n = false;
};

// Eligible for rows-grouped 16-bit GEMMs with no C, bias, activation, fp32
// output or split, A and D row-major, and K and N (and the leading
// dimensions and the weight's group stride) whole 16 bytes, so that every
// group's rows start 16-byte aligned. K-grouped GEMMs (the weight gradient)
// are declined; the API then runs the sm80 family.
GroupedPlan plan_grouped(const GemmProblem& problem);

}  // namespace samattn::gemm::sm90
