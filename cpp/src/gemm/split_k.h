// Split-K for the GEMM families that run it themselves (the sm80 and sm75
// tensor-core kernels): how K is cut and what the parallel reduction needs.
// Host code, shared by the plans, the workspace size and the launch, so that
// they cut K by one rule.
//
// Parallel split-K: split s multiplies A[:, ks] @ B[ks, :] over its K range
// ks and writes the raw fp32 sums to partial[s]; a second kernel adds the
// partials in split order and applies alpha, beta * C, the bias and the
// activation. The order is fixed, so a fixed split is bit-reproducible.
#pragma once

#include <cstdint>
#include <string>

#include "common/problem.h"
#include "gemm/group.h"
#include "samattn/samattn.h"

namespace samattn::gemm {

inline constexpr int32_t kMaxSplitK = 64;
// Each split's K range starts on a multiple of this many elements: a
// multiple of every kernel's K tile (16 or 32), and 16-byte vector loads
// stay aligned after the pointer moves to a split's first K.
inline constexpr int64_t kSplitKGranule = 64;

struct SplitK {
  int32_t splits = 1;       // K ranges, none of them empty
  int64_t k_per_split = 0;  // elements of K per range (the last may be shorter)
};

// The cut of K into `requested` ranges of whole granules, fewer when K has
// fewer granules than that.
inline SplitK split_k_ranges(int64_t k, int32_t requested) {
  SplitK out;
  if (requested <= 1 || k <= kSplitKGranule) {
    out.k_per_split = k;
    return out;
  }
  const int64_t granules = (k + kSplitKGranule - 1) / kSplitKGranule;
  const int64_t per = (granules + requested - 1) / requested;
  out.k_per_split = per * kSplitKGranule;
  out.splits = static_cast<int32_t>((k + out.k_per_split - 1) / out.k_per_split);
  if (out.splits == 1) out.k_per_split = k;
  return out;
}

// Whether the sm80 or sm75 family computes `problem` on its tensor-core
// kernels, the ones that split K (the FMA-unit kernels do not).
inline bool on_tensor_cores(Family family, const GemmProblem& problem) {
  if (family == Family::sm75) return problem.dtype == DType::f16;
  return problem.dtype != DType::f32 || problem.allow_tf32;
}

// split_k = "auto" on the sm80 family's tensor cores: a K of at least 8192
// whose output, counted in 128x128 tiles, fills at most half the SMs is cut
// into the most ranges (a power of 2, at most 64) that keep about two CTAs
// per SM with at least 1024 of K each. Without it such a GEMM ran at 0.02-0.27
// of cuBLAS with the sm80 family forced on the H100, and forced parallel
// splits at 0.4-0.97 (benchmarks/results/h100_gemm_modes.json). The sm75
// family splits only when asked (unmeasured).
inline int32_t auto_split_k(Family family, const GemmProblem& problem) {
  constexpr int64_t kMinK = 8192, kMinKPerSplit = 1024, kTile = 128;
  if (family != Family::sm80 || problem.split_k != 0 || problem.group_mode != group::kGroupNone ||
      !on_tensor_cores(family, problem) || problem.k < kMinK) {
    return 1;
  }
  const int64_t tiles =
      problem.batch * ((problem.m + kTile - 1) / kTile) * ((problem.n + kTile - 1) / kTile);
  const int64_t slots = 2 * static_cast<int64_t>(problem.sm_count);
  if (tiles * 4 > slots) return 1;
  int32_t splits = 1;
  while (splits < kMaxSplitK && tiles * splits * 2 <= slots &&
         problem.k / (splits * 2) >= kMinKPerSplit) {
    splits *= 2;
  }
  return splits;
}

// The cut the sm80 or sm75 family uses for `problem`: the forced split, or
// its automatic one.
inline SplitK split_k_ranges(Family family, const GemmProblem& problem) {
  return split_k_ranges(problem.k,
                        problem.split_k >= 2 ? problem.split_k : auto_split_k(family, problem));
}

// Bytes of fp32 partial sums of the parallel reduction (0: no split).
inline int64_t split_k_workspace_bytes(Family family, const GemmProblem& problem) {
  const SplitK split = split_k_ranges(family, problem);
  if (split.splits <= 1) return 0;
  return static_cast<int64_t>(split.splits) * problem.batch * problem.m * problem.n * 4;
}

// The split-K part of the sm80 and sm75 families' plans (parallel mode
// only): whether the family runs `problem`'s split request, and if not, why.
inline bool plan_split_k(Family family, const GemmProblem& problem, std::string* why);

// The sm80 and sm75 families' plans: their tensor-core kernels split K and
// run grouped GEMMs; their FMA-unit kernels run neither.
inline bool plan_tensor_core_modes(Family family, const GemmProblem& problem, std::string* why) {
  return plan_split_k(family, problem, why) &&
         group::plan_group(family, problem, on_tensor_cores(family, problem), why);
}

inline bool plan_split_k(Family family, const GemmProblem& problem, std::string* why) {
  if (problem.split_k < 2) return true;
  const char* name = family_name(family);
  if (!on_tensor_cores(family, problem)) {
    if (why != nullptr) {
      *why = std::string("split_k runs on tensor cores, and the ") + name +
             " family computes this dtype on its FMA units (exact fp32, or bf16 on sm75)";
    }
    return false;
  }
  if (problem.split_k_mode == SAMATTN_SPLIT_K_SERIAL) {
    if (why != nullptr) {
      *why = std::string("serial split-K runs on the sm90 family; the ") + name +
             " family reduces splits in parallel (split_k_mode parallel or auto)";
    }
    return false;
  }
  return true;
}

// The sm80 and sm75 families' workspace: the partial sums of a split.
inline int64_t split_k_family_workspace_bytes(Family family, const GemmProblem& problem) {
  return on_tensor_cores(family, problem) ? split_k_workspace_bytes(family, problem) : 0;
}

}  // namespace samattn::gemm
