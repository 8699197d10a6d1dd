#include "api/family.h"

#include <cstdlib>
#include <string>

#include "api/error.h"
#include "samattn/samattn.h"

namespace samattn {
namespace {

// Dtypes a family runs for one op. kF32 is exact fp32 (FMA units); kTF32 is
// fp32 inputs on tf32 tensor cores, used only when the caller allows it.
enum : uint32_t { kF16 = 1u, kBF16 = 2u, kF32 = 4u, kTF32 = 8u };

struct FamilyOp {
  int32_t op;
  int32_t family;
  uint32_t dtypes;
};

// Which family has which op for which dtypes. A new family op is one line,
// e.g. {SAMATTN_OP_GEMM, SAMATTN_FAMILY_SM90, kF16 | kBF16 | kTF32}.
constexpr FamilyOp kSupport[] = {
    // Hopper: TMA + wgmma. Exact fp32 has no wgmma: it runs on sm80's FMA kernel.
    {SAMATTN_OP_GEMM, SAMATTN_FAMILY_SM90, kF16 | kBF16 | kTF32},
    {SAMATTN_OP_GEMM, SAMATTN_FAMILY_SM80, kF16 | kBF16 | kF32 | kTF32},
    // Turing has no tf32: fp32 always runs exact, which is never an error.
    {SAMATTN_OP_GEMM, SAMATTN_FAMILY_SM75, kF16 | kBF16 | kF32},
    {SAMATTN_OP_SOFTMAX, SAMATTN_FAMILY_SM80, kF16 | kBF16 | kF32},
    {SAMATTN_OP_SOFTMAX, SAMATTN_FAMILY_SM75, kF16 | kBF16 | kF32},
    // FlashAttention-2, forward and backward (one op code), on mma.sync
    // m16n8k16; Hopper has no attention kernels of its own, so automatic
    // selection falls through to sm80 there.
    {SAMATTN_OP_ATTENTION, SAMATTN_FAMILY_SM80, kF16 | kBF16},
    // Turing: fp16 on mma.sync m16n8k8; its tensor cores have no bf16.
    {SAMATTN_OP_ATTENTION, SAMATTN_FAMILY_SM75, kF16},
};

// Newest first: the order in which automatic selection tries them.
constexpr int32_t kFamilies[] = {SAMATTN_FAMILY_SM90, SAMATTN_FAMILY_SM80, SAMATTN_FAMILY_SM75};

constexpr const char* kFamilyEnv = "SAMATTN_FAMILY";

int32_t family_bit(int32_t family) {
  switch (family) {
    case SAMATTN_FAMILY_SM75:
      return 1;
    case SAMATTN_FAMILY_SM80:
      return 2;
    case SAMATTN_FAMILY_SM90:
      return 4;
    default:
      return 0;
  }
}

bool is_built(int32_t family) { return (built_families_mask() & family_bit(family)) != 0; }

uint32_t family_dtypes(int32_t op, int32_t family) {
  for (const FamilyOp& row : kSupport) {
    if (row.op == op && row.family == family) return row.dtypes;
  }
  return 0;
}

bool supports(int32_t op, int32_t family, int32_t dtype, bool allow_tf32) {
  const uint32_t dtypes = family_dtypes(op, family);
  switch (dtype) {
    case SAMATTN_F16:
      return (dtypes & kF16) != 0;
    case SAMATTN_BF16:
      return (dtypes & kBF16) != 0;
    case SAMATTN_F32:
      return (dtypes & kF32) != 0 || (allow_tf32 && (dtypes & kTF32) != 0);
    default:
      return false;
  }
}

bool cc_at_least(const GpuSpec& gpu, int major, int minor) {
  return gpu.cc_major > major || (gpu.cc_major == major && gpu.cc_minor >= minor);
}

// sm75 code runs on Turing and newer; sm80 code on Ampere and newer (newer
// than the wheel through its PTX); sm90a code only on compute capability 9.0.
bool runs_on(int32_t family, const GpuSpec& gpu) {
  switch (family) {
    case SAMATTN_FAMILY_SM75:
      return cc_at_least(gpu, 7, 5);
    case SAMATTN_FAMILY_SM80:
      return cc_at_least(gpu, 8, 0);
    case SAMATTN_FAMILY_SM90:
      return gpu.cc_major == 9 && gpu.cc_minor == 0;
    default:
      return false;
  }
}

const char* family_requirement(int32_t family) {
  switch (family) {
    case SAMATTN_FAMILY_SM75:
      return "compute capability 7.5 or newer";
    case SAMATTN_FAMILY_SM80:
      return "compute capability 8.0 or newer";
    default:
      return "compute capability 9.0 exactly (Hopper; its code is sm_90a)";
  }
}

std::string cc_string(const GpuSpec& gpu) {
  return to_text(gpu.cc_major) + "." + to_text(gpu.cc_minor);
}

std::string describe_gpu(const GpuSpec& gpu) {
  if (gpu.name.empty()) return "a GPU of compute capability " + cc_string(gpu);
  return gpu.name + " (compute capability " + cc_string(gpu) + ")";
}

std::string join_families(int32_t mask) {
  std::string out;
  for (int32_t family : {SAMATTN_FAMILY_SM75, SAMATTN_FAMILY_SM80, SAMATTN_FAMILY_SM90}) {
    if ((mask & family_bit(family)) == 0) continue;
    if (!out.empty()) out += ", ";
    out += family_name(family);
  }
  return out.empty() ? "none" : out;
}

std::string describe_dtypes(uint32_t dtypes) {
  std::string out;
  auto add = [&out](const char* name) {
    if (!out.empty()) out += ", ";
    out += name;
  };
  if (dtypes & kF16) add("float16");
  if (dtypes & kBF16) add("bfloat16");
  if (dtypes & kF32) {
    add("float32");
  } else if (dtypes & kTF32) {
    add("float32 with tf32 only");
  }
  return out;
}

// Families that would run op x dtype on this GPU, newest first, among those
// built (or all, to say what a rebuild would need).
std::string usable_families(int32_t op, int32_t dtype, const GpuSpec& gpu, bool allow_tf32,
                            bool built_only) {
  std::string out;
  for (int32_t family : kFamilies) {
    if (built_only && !is_built(family)) continue;
    if (!runs_on(family, gpu) || !supports(op, family, dtype, allow_tf32)) continue;
    if (!out.empty()) out += ", ";
    out += family_name(family);
  }
  return out;
}

std::string usable_sentence(int32_t op, int32_t dtype, const GpuSpec& gpu, bool allow_tf32) {
  const std::string usable = usable_families(op, dtype, gpu, allow_tf32, /*built_only=*/true);
  return " Families that can run it on this GPU: " +
         (usable.empty() ? "none in this build" : usable) + ".";
}

// Why a Turing run of this op lacks the dtype, when that is the reason: its
// tensor cores have no bf16, which the attention kernels need.
std::string turing_dtype_hint(int32_t op, int32_t dtype) {
  if (dtype != SAMATTN_BF16 || supports(op, SAMATTN_FAMILY_SM75, dtype, false)) return "";
  return std::string(" bfloat16 ") + op_name(op) +
         " needs compute capability 8.0 or newer (family sm80); on Turing use float16.";
}

int parse_family(const std::string& text, int32_t* family) {
  for (int32_t candidate : kFamilies) {
    if (text == family_name(candidate)) {
      *family = candidate;
      return SAMATTN_OK;
    }
  }
  return SAMATTN_INVALID_ARGUMENT;
}

}  // namespace

const char* op_name(int32_t op) {
  switch (op) {
    case SAMATTN_OP_GEMM:
      return "gemm";
    case SAMATTN_OP_SOFTMAX:
      return "softmax";
    case SAMATTN_OP_ATTENTION:
      return "attention";
    default:
      return nullptr;
  }
}

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case SAMATTN_F16:
      return "float16";
    case SAMATTN_BF16:
      return "bfloat16";
    case SAMATTN_F32:
      return "float32";
    default:
      return nullptr;
  }
}

const char* family_name(int32_t family) {
  switch (family) {
    case SAMATTN_FAMILY_AUTO:
      return "auto";
    case SAMATTN_FAMILY_SM75:
      return "sm75";
    case SAMATTN_FAMILY_SM80:
      return "sm80";
    case SAMATTN_FAMILY_SM90:
      return "sm90";
    default:
      return nullptr;
  }
}

int64_t dtype_size(int32_t dtype) { return dtype == SAMATTN_F32 ? 4 : 2; }

int32_t built_families_mask() {
  int32_t mask = 0;
#if defined(SAMATTN_WITH_SM75)
  mask |= family_bit(SAMATTN_FAMILY_SM75);
#endif
#if defined(SAMATTN_WITH_SM80)
  mask |= family_bit(SAMATTN_FAMILY_SM80);
#endif
#if defined(SAMATTN_WITH_SM90)
  mask |= family_bit(SAMATTN_FAMILY_SM90);
#endif
  return mask;
}

int32_t built_ops_mask() {
  int32_t mask = 0;
#if defined(SAMATTN_WITH_GEMM)
  mask |= 1 << SAMATTN_OP_GEMM;
#endif
#if defined(SAMATTN_WITH_SOFTMAX)
  mask |= 1 << SAMATTN_OP_SOFTMAX;
#endif
#if defined(SAMATTN_WITH_ATTENTION)
  mask |= 1 << SAMATTN_OP_ATTENTION;
#endif
  return mask;
}

int select_family(int32_t op, int32_t dtype, const GpuSpec& gpu, int32_t requested, bool allow_tf32,
                  int32_t* family, bool assume_complete_build) {
  const auto built = [assume_complete_build](int32_t candidate) {
    return assume_complete_build || is_built(candidate);
  };
  if (family == nullptr) return fail(SAMATTN_INVALID_ARGUMENT, "samattn: family output is NULL");
  if (op_name(op) == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                "samattn: unknown op code " + to_text(op) +
                    " (expected SAMATTN_OP_GEMM, SAMATTN_OP_SOFTMAX or SAMATTN_OP_ATTENTION)");
  }
  if (dtype_name(dtype) == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT, std::string("samattn ") + op_name(op) +
                                              ": unknown dtype code " + to_text(dtype) +
                                              " (expected float16, bfloat16 or float32)");
  }
  const std::string subject =
      std::string("samattn ") + op_name(op) + " (" + dtype_name(dtype) + ")";
  if (family_name(requested) == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject + ": unknown family code " + to_text(requested) +
                                              " (expected auto, sm75, sm80 or sm90)");
  }
  if (gpu.cc_major < 0 || gpu.cc_minor < 0) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": invalid compute capability " + cc_string(gpu));
  }

  // The environment is a request only when the caller made none.
  std::string source;
  if (requested == SAMATTN_FAMILY_AUTO) {
    const char* env = std::getenv(kFamilyEnv);
    if (env != nullptr && env[0] != '\0') {
      if (parse_family(env, &requested) != SAMATTN_OK) {
        return fail(SAMATTN_INVALID_ARGUMENT,
                    subject + ": environment variable " + kFamilyEnv + "='" + env +
                        "' is not a kernel family; use sm75, sm80 or sm90, or leave it "
                        "empty for automatic selection.");
      }
      source = std::string(" (from ") + kFamilyEnv + ")";
    }
  }
  const std::string family_text = std::string("family ") + family_name(requested) + source;

  if (!cc_at_least(gpu, 7, 5)) {
    return fail(SAMATTN_UNSUPPORTED, subject + ": " + describe_gpu(gpu) +
                                         " is not supported; Turing (compute capability 7.5) "
                                         "is the oldest GPU samattn runs on (requested " +
                                         family_text + ").");
  }
  if (!assume_complete_build && (built_ops_mask() & (1 << op)) == 0) {
    return fail(SAMATTN_UNSUPPORTED,
                subject + ": this library was built without the " + op_name(op) +
                    " ops (SAMATTN_OPS at build time), so no family runs it; running on " +
                    describe_gpu(gpu) + ", requested " + family_text + ".");
  }

  if (requested != SAMATTN_FAMILY_AUTO) {
    if (!built(requested)) {
      return fail(SAMATTN_UNSUPPORTED, subject + ": " + family_text +
                                           " is not built into this library (built families: " +
                                           join_families(built_families_mask()) + "); running on " +
                                           describe_gpu(gpu) + "." +
                                           usable_sentence(op, dtype, gpu, allow_tf32));
    }
    if (!runs_on(requested, gpu)) {
      return fail(SAMATTN_UNSUPPORTED, subject + ": " + family_text + " cannot run on " +
                                           describe_gpu(gpu) + "; it needs " +
                                           family_requirement(requested) + "." +
                                           usable_sentence(op, dtype, gpu, allow_tf32));
    }
    if (!supports(op, requested, dtype, allow_tf32)) {
      const uint32_t has = family_dtypes(op, requested);
      std::string lacks = std::string(op_name(op)) + " kernels";
      if (has != 0) {
        const bool only_tf32 = dtype == SAMATTN_F32 && (has & kTF32) != 0;
        lacks = (only_tf32 ? std::string("exact float32 (allow_tf32 is off) ")
                           : std::string(dtype_name(dtype)) + " ") +
                lacks + " (it runs " + describe_dtypes(has) + ")";
      }
      const std::string hint =
          requested == SAMATTN_FAMILY_SM75 ? turing_dtype_hint(op, dtype) : std::string();
      return fail(SAMATTN_UNSUPPORTED, subject + ": " + family_text + " has no " + lacks +
                                           "; running on " + describe_gpu(gpu) + "." + hint +
                                           usable_sentence(op, dtype, gpu, allow_tf32));
    }
    *family = requested;
    return SAMATTN_OK;
  }

  for (int32_t candidate : kFamilies) {
    if (built(candidate) && runs_on(candidate, gpu) && supports(op, candidate, dtype, allow_tf32)) {
      *family = candidate;
      return SAMATTN_OK;
    }
  }
  const std::string needed = usable_families(op, dtype, gpu, allow_tf32, /*built_only=*/false);
  return fail(SAMATTN_UNSUPPORTED,
              subject + ": no kernel family built into this library can run it on " +
                  describe_gpu(gpu) + " (requested family auto; built families: " +
                  join_families(built_families_mask()) + "; this GPU would need " +
                  (needed.empty() ? std::string("a family samattn does not have") : needed) + ")." +
                  (cc_at_least(gpu, 8, 0) ? std::string() : turing_dtype_hint(op, dtype)));
}

}  // namespace samattn
