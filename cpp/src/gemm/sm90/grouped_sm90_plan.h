// How the sm90 family runs a grouped GEMM (gemm/group.h): both forms on
// CUTLASS's pointer-array kernel (grouped_sm90_launch.cuh), when TMA can
// describe every group's operands. Host code only, like gemm_sm90_plan.h.
#pragma once

#include <cstdint>
#include <string>

#include "common/problem.h"
#include "gemm/sm90/gemm_sm90_plan.h"
#include "samattn/samattn.h"

namespace samattn::gemm::sm90 {

// The grouped kernel's configurations: 128x256 tiles, both consumer
// warpgroups on one tile ("cooperative"), clusters of two CTAs that share,
// and multicast, a tile of A (1x2: along N) or of B (2x1: along M).
// (Measured and dropped on the MoE shapes of samattn.bench on the H100:
// "ping-pong" 64x256 ran at 0.46-0.67 of it, and 64x256 or 128x128 at
// 0.6-0.9 on the weight gradient; benchmarks/results/h100_grouped_tuning.json
// and h100_grouped_cluster_tuning.json.)
enum class GroupedCluster { k1x2, k2x1 };

// The name samattn_gemm_plan reports, e.g. "grouped_128x256_c1x2".
const char* grouped_tile_name(GroupedCluster cluster);

// A grouped GEMM (gemm/group.h), in one of two forms:
//   rows: `groups` groups share A's m rows and D (both row-major); b is group
//     g's (k, n) matrix at b.ptr + g * b.batch_stride, K-major or N-major.
//   K (k_form): the groups share A (m, k) and B (k, n), each a range of the
//     k indices; A has its unit stride along m, B along n; group g's (m, n)
//     D is row-major at d.ptr + g * d.batch_stride.
//   list: `groups` independent GEMMs (problem.group_list), every A K-major,
//     every B K-major or every B N-major (b.k_major), every D row-major
//     (list_operands describes each).
struct GroupedPlan {
  bool eligible = false;
  std::string reason;  // why not, when !eligible
  bool k_form = false;
  bool list = false;
  int64_t groups = 0, m = 0, n = 0, k = 0;
  Operand a, b, d;
  // The order in which the persistent grid walks a group's output tiles:
  // along N (a band of row tiles sweeps every column tile: A read once, B once
  // per band) or along M (a column of tiles at a time: B read once).
  bool raster_along_n = false;
  GroupedCluster cluster = GroupedCluster::k1x2;
};

// Eligible for grouped 16-bit GEMMs with no C, bias, activation, fp32 output
// or split, the layouts above, and the contiguous extents, leading
// dimensions and group strides whole 16 bytes, so that every group's
// operands start 16-byte aligned (TMA). The API runs the rest on the sm80
// family.
GroupedPlan plan_grouped(const GemmProblem& problem);

// One GEMM of a list as the kernel reads it; false (and why) when TMA cannot
// describe it with a K-major A, B of the given layout and a row-major D. A
// GEMM with k = 0 has only D (it is written as zeros).
struct ListOperands {
  Operand a, b, d;
};
bool list_operands(const samattn_gemm_list_entry& entry, DType dtype, bool b_k_major,
                   ListOperands* out, std::string* why);

}  // namespace samattn::gemm::sm90
