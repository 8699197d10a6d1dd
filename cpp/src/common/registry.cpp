#include "common/registry.h"

#include "samattn/samattn.h"

namespace samattn {
namespace {

struct Capability {
  int32_t group;
  Family family;
  uint32_t dtypes;
};

// What each family runs per op group in a complete build.
constexpr Capability kCapabilities[] = {
    // Hopper: TMA + wgmma. Exact fp32 has no wgmma: it runs on sm80's FMA kernel.
    {SAMATTN_OP_GEMM, Family::sm90, kDtypeF16 | kDtypeBF16 | kDtypeTF32},
    {SAMATTN_OP_GEMM, Family::sm80, kDtypeF16 | kDtypeBF16 | kDtypeF32 | kDtypeTF32},
    // Turing has no tf32: fp32 always runs exact, which is never an error.
    {SAMATTN_OP_GEMM, Family::sm75, kDtypeF16 | kDtypeBF16 | kDtypeF32},
    {SAMATTN_OP_SOFTMAX, Family::sm80, kDtypeF16 | kDtypeBF16 | kDtypeF32},
    {SAMATTN_OP_SOFTMAX, Family::sm75, kDtypeF16 | kDtypeBF16 | kDtypeF32},
    // Hopper: the forward on wgmma + TMA (warp specialized); the backward, and
    // the forward problems its plan declines, run sm80's kernels (the backward
    // registration declines every problem and names sm80 as forced fallback).
    {SAMATTN_OP_ATTENTION, Family::sm90, kDtypeF16 | kDtypeBF16},
    // FlashAttention-2 on mma.sync m16n8k16.
    {SAMATTN_OP_ATTENTION, Family::sm80, kDtypeF16 | kDtypeBF16},
    // Turing: fp16 on mma.sync m16n8k8; its tensor cores have no bf16.
    {SAMATTN_OP_ATTENTION, Family::sm75, kDtypeF16},
};

constexpr int family_index(Family family) {
  return family == Family::sm75 ? 0 : family == Family::sm80 ? 1 : 2;
}

// Which families registered something per op direction (bit = family_bit).
int32_t& registered_mask(Op op) {
  static int32_t masks[kOpCount] = {};
  return masks[static_cast<int>(op)];
}

// The registrations of one direction, by family; a function-local static so
// that registrars in other translation units may run first.
template <Op kOp>
Kernels<kOp>* slots() {
  static Kernels<kOp> table[3] = {};
  return table;
}

}  // namespace

template <Op kOp>
bool register_kernels(const Kernels<kOp>& kernels) {
  slots<kOp>()[family_index(kernels.family)] = kernels;
  registered_mask(kOp) |= family_bit(kernels.family);
  return true;
}

template <Op kOp>
const Kernels<kOp>* registered_kernels(Family family) {
  if ((registered_mask(kOp) & family_bit(family)) == 0) return nullptr;
  return &slots<kOp>()[family_index(family)];
}

#define SAMATTN_REGISTRY_OP(op)                                   \
  template bool register_kernels<op>(const Kernels<op>& kernels); \
  template const Kernels<op>* registered_kernels<op>(Family family);
SAMATTN_REGISTRY_OP(Op::gemm)
SAMATTN_REGISTRY_OP(Op::softmax_forward)
SAMATTN_REGISTRY_OP(Op::softmax_backward)
SAMATTN_REGISTRY_OP(Op::attention_forward)
SAMATTN_REGISTRY_OP(Op::attention_backward)
#undef SAMATTN_REGISTRY_OP

uint32_t declared_dtypes(int32_t group, Family family) {
  for (const Capability& row : kCapabilities) {
    if (row.group == group && row.family == family) return row.dtypes;
  }
  return 0;
}

bool dtype_declared(uint32_t dtypes, int32_t dtype, bool allow_tf32) {
  switch (dtype) {
    case SAMATTN_F16:
      return (dtypes & kDtypeF16) != 0;
    case SAMATTN_BF16:
      return (dtypes & kDtypeBF16) != 0;
    case SAMATTN_F32:
      return (dtypes & kDtypeF32) != 0 || (allow_tf32 && (dtypes & kDtypeTF32) != 0);
    default:
      return false;
  }
}

bool group_registered(int32_t group, Family family) {
  for (int op = 0; op < kOpCount; ++op) {
    if (op_group(static_cast<Op>(op)) == group &&
        (registered_mask(static_cast<Op>(op)) & family_bit(family)) != 0) {
      return true;
    }
  }
  return false;
}

int32_t built_families_mask() {
  int32_t mask = 0;
  for (int op = 0; op < kOpCount; ++op) mask |= registered_mask(static_cast<Op>(op));
  return mask;
}

int32_t built_ops_mask() {
  int32_t mask = 0;
  for (int op = 0; op < kOpCount; ++op) {
    if (registered_mask(static_cast<Op>(op)) != 0) mask |= 1 << op_group(static_cast<Op>(op));
  }
  return mask;
}

}  // namespace samattn
