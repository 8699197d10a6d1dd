// The registry of ops x kernel families (docs/design.md section 2).
//
// Each family's translation units register, per op direction, how they plan
// (and may decline) a problem, the workspace it needs and its launch, with a
// static initializer:
//
//   const bool kRegistered = register_kernels<Op::gemm>({Family::sm80, plan, nullptr, &gemm_sm80});
//
// The dtypes each family runs are declared once for every op in
// kCapabilities (registry.cpp), so that queries for a complete build
// (samattn_gemm_plan) and messages saying what a rebuild would need know the
// families this build left out. What this build holds is what registered.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/types.h"

namespace samattn {

struct GemmProblem;
struct SoftmaxProblem;
struct AttentionForwardProblem;
struct AttentionBackwardProblem;

// Op directions: each has its own problem type, plan and launch.
enum class Op : int32_t {
  gemm,
  softmax_forward,
  softmax_backward,
  attention_forward,
  attention_backward
};
inline constexpr int kOpCount = 5;

// The SAMATTN_OP_* group of a direction (selection and messages speak of groups).
constexpr int32_t op_group(Op op) {
  return op == Op::gemm ? 0 : (op == Op::softmax_forward || op == Op::softmax_backward) ? 1 : 2;
}

template <Op>
struct OpProblem;
template <>
struct OpProblem<Op::gemm> {
  using type = GemmProblem;
};
template <>
struct OpProblem<Op::softmax_forward> {
  using type = SoftmaxProblem;
};
template <>
struct OpProblem<Op::softmax_backward> {
  using type = SoftmaxProblem;
};
template <>
struct OpProblem<Op::attention_forward> {
  using type = AttentionForwardProblem;
};
template <>
struct OpProblem<Op::attention_backward> {
  using type = AttentionBackwardProblem;
};
template <Op kOp>
using ProblemOf = typename OpProblem<kOp>::type;

// One family's implementation of one op direction.
template <Op kOp>
struct Kernels {
  using Problem = ProblemOf<kOp>;
  Family family;
  // Whether the family runs `problem` (one of its dtypes, checked before);
  // on a decline, when `why` is not null, the reason. nullptr: every problem.
  // Called on every call: no allocation on the accepting path.
  bool (*plan)(const Problem& problem, std::string* why);
  // Device workspace bytes for `problem`; nullptr: none.
  size_t (*workspace_bytes)(const Problem& problem);
  // Launches on problem.stream: cudaSuccess or the launch error.
  cudaError_t (*launch)(const Problem& problem);
  // When the family is forced and its plan declines a problem: the family
  // that runs it instead (the sm90 GEMM hands what TMA cannot describe to
  // sm80, so that forcing sm90 tests it on any shape); 0: the call fails
  // with the plan's reason.
  int32_t forced_fallback = 0;
};

// Records a family's kernels (at static initialization); returns true so that
// a registration is one `const bool` initializer.
template <Op kOp>
bool register_kernels(const Kernels<kOp>& kernels);

// The family's kernels for kOp in this build, or nullptr.
template <Op kOp>
const Kernels<kOp>* registered_kernels(Family family);

// Dtype bits of a capability. kF32 is exact fp32 (FMA units); kTF32 is fp32
// inputs on tf32 tensor cores, used only when the caller allows it.
enum : uint32_t { kDtypeF16 = 1u, kDtypeBF16 = 2u, kDtypeF32 = 4u, kDtypeTF32 = 8u };

// Dtypes `family` runs for op group `group` in a complete build (0: none).
uint32_t declared_dtypes(int32_t group, Family family);

// Whether the declared dtypes include `dtype` (a DType code).
bool dtype_declared(uint32_t dtypes, int32_t dtype, bool allow_tf32);

// Whether this build registered any direction of op group `group` for `family`.
bool group_registered(int32_t group, Family family);

// samattn_built_families / samattn_built_ops: derived from the registrations.
int32_t built_families_mask();
int32_t built_ops_mask();

}  // namespace samattn
