#include "api/select.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "api/error.h"
#include "samattn/samattn.h"

namespace samattn {
namespace {

constexpr const char* kFamilyEnv = "SAMATTN_FAMILY";

bool valid_family_code(int32_t code) {
  return code == SAMATTN_FAMILY_SM75 || code == SAMATTN_FAMILY_SM80 || code == SAMATTN_FAMILY_SM90;
}

bool cc_at_least(const GpuSpec& gpu, int major, int minor) {
  return gpu.cc_major > major || (gpu.cc_major == major && gpu.cc_minor >= minor);
}

bool is_built(int32_t group, Family family, bool assume_complete_build) {
  return assume_complete_build || group_registered(group, family);
}

std::string cc_string(const GpuSpec& gpu) {
  return to_text(gpu.cc_major) + "." + to_text(gpu.cc_minor);
}

std::string describe_gpu(const GpuSpec& gpu) {
  if (gpu.name[0] == '\0') return "a GPU of compute capability " + cc_string(gpu);
  return std::string(gpu.name) + " (compute capability " + cc_string(gpu) + ")";
}

std::string join_families(int32_t mask) {
  std::string out;
  for (Family family : {Family::sm75, Family::sm80, Family::sm90}) {
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
  if (dtypes & kDtypeF16) add("float16");
  if (dtypes & kDtypeBF16) add("bfloat16");
  if (dtypes & kDtypeF32) {
    add("float32");
  } else if (dtypes & kDtypeTF32) {
    add("float32 with tf32 only");
  }
  return out;
}

bool supports(int32_t group, Family family, int32_t dtype, bool allow_tf32) {
  return dtype_declared(declared_dtypes(group, family), dtype, allow_tf32);
}

// Families that would run the group x dtype on this GPU, newest first, among
// those built (or all, to say what a rebuild would need).
std::string usable_families(int32_t group, int32_t dtype, const GpuSpec& gpu, bool allow_tf32,
                            bool built_only) {
  std::string out;
  for (Family family : kFamiliesNewestFirst) {
    if (built_only && !is_built(group, family, false)) continue;
    if (!family_runs_on(family, gpu.cc_major, gpu.cc_minor) ||
        !supports(group, family, dtype, allow_tf32)) {
      continue;
    }
    if (!out.empty()) out += ", ";
    out += family_name(family);
  }
  return out;
}

std::string usable_sentence(int32_t group, int32_t dtype, const GpuSpec& gpu, bool allow_tf32) {
  const std::string usable = usable_families(group, dtype, gpu, allow_tf32, /*built_only=*/true);
  return " Families that can run it on this GPU: " +
         (usable.empty() ? "none in this build" : usable) + ".";
}

// Why a Turing run of this op lacks the dtype, when that is the reason: its
// tensor cores have no bf16, which the attention kernels need.
std::string turing_dtype_hint(int32_t group, int32_t dtype) {
  if (dtype != SAMATTN_BF16 || supports(group, Family::sm75, dtype, false)) return "";
  return std::string(" bfloat16 ") + op_name(group) +
         " needs compute capability 8.0 or newer (family sm80); on Turing use float16.";
}

std::string subject_of(int32_t group, int32_t dtype) {
  return std::string("samattn ") + op_name(group) + " (" + dtype_name(dtype) + ")";
}

std::string family_text(const Request& request) {
  return std::string("family ") + family_code_name(request.family) +
         (request.from_env ? std::string(" (from ") + kFamilyEnv + ")" : std::string());
}

}  // namespace

const char* op_name(int32_t group) {
  switch (group) {
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

const char* family_code_name(int32_t family) {
  if (family == SAMATTN_FAMILY_AUTO) return "auto";
  return valid_family_code(family) ? family_name(static_cast<Family>(family)) : nullptr;
}

int64_t dtype_size(int32_t dtype) { return dtype == SAMATTN_F32 ? 4 : 2; }

int resolve_request(int32_t group, int32_t dtype, const GpuSpec& gpu, int32_t requested,
                    bool allow_tf32, bool assume_complete_build, Request* request) {
  if (op_name(group) == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                "samattn: unknown op code " + to_text(group) +
                    " (expected SAMATTN_OP_GEMM, SAMATTN_OP_SOFTMAX or SAMATTN_OP_ATTENTION)");
  }
  if (dtype_name(dtype) == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT, std::string("samattn ") + op_name(group) +
                                              ": unknown dtype code " + to_text(dtype) +
                                              " (expected float16, bfloat16 or float32)");
  }
  if (family_code_name(requested) == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject_of(group, dtype) + ": unknown family code " +
                                              to_text(requested) +
                                              " (expected auto, sm75, sm80 or sm90)");
  }
  if (gpu.cc_major < 0 || gpu.cc_minor < 0) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject_of(group, dtype) + ": invalid compute capability " + cc_string(gpu));
  }

  // The environment is a request only when the caller made none. Parsed on
  // every call (it may change), without building a string.
  request->family = requested;
  request->from_env = false;
  if (requested == SAMATTN_FAMILY_AUTO) {
    const char* env = std::getenv(kFamilyEnv);
    if (env != nullptr && env[0] != '\0') {
      int32_t parsed = SAMATTN_FAMILY_AUTO;
      for (Family candidate : kFamiliesNewestFirst) {
        if (std::strcmp(env, family_name(candidate)) == 0) parsed = static_cast<int32_t>(candidate);
      }
      if (parsed == SAMATTN_FAMILY_AUTO) {
        return fail(SAMATTN_INVALID_ARGUMENT,
                    subject_of(group, dtype) + ": environment variable " + kFamilyEnv + "='" + env +
                        "' is not a kernel family; use sm75, sm80 or sm90, or leave it "
                        "empty for automatic selection.");
      }
      request->family = parsed;
      request->from_env = true;
    }
  }

  if (!cc_at_least(gpu, 7, 5)) {
    return fail(SAMATTN_UNSUPPORTED, subject_of(group, dtype) + ": " + describe_gpu(gpu) +
                                         " is not supported; Turing (compute capability 7.5) "
                                         "is the oldest GPU samattn runs on (requested " +
                                         family_text(*request) + ").");
  }
  if (!assume_complete_build && (built_ops_mask() & (1 << group)) == 0) {
    return fail(SAMATTN_UNSUPPORTED,
                subject_of(group, dtype) + ": this library was built without the " +
                    op_name(group) +
                    " ops (SAMATTN_OPS at build time), so no family runs it; running on " +
                    describe_gpu(gpu) + ", requested " + family_text(*request) + ".");
  }
  if (request->family == SAMATTN_FAMILY_AUTO) return SAMATTN_OK;

  const Family forced = static_cast<Family>(request->family);
  if (!assume_complete_build && (built_families_mask() & family_bit(forced)) == 0) {
    return fail(SAMATTN_UNSUPPORTED, subject_of(group, dtype) + ": " + family_text(*request) +
                                         " is not built into this library (built families: " +
                                         join_families(built_families_mask()) + "); running on " +
                                         describe_gpu(gpu) + "." +
                                         usable_sentence(group, dtype, gpu, allow_tf32));
  }
  if (!family_runs_on(forced, gpu.cc_major, gpu.cc_minor)) {
    return fail(SAMATTN_UNSUPPORTED, subject_of(group, dtype) + ": " + family_text(*request) +
                                         " cannot run on " + describe_gpu(gpu) + "; it needs " +
                                         family_requirement(forced) + "." +
                                         usable_sentence(group, dtype, gpu, allow_tf32));
  }
  if (!supports(group, forced, dtype, allow_tf32)) {
    const uint32_t has = declared_dtypes(group, forced);
    std::string lacks = std::string(op_name(group)) + " kernels";
    if (has != 0) {
      const bool only_tf32 = dtype == SAMATTN_F32 && (has & kDtypeTF32) != 0;
      lacks = (only_tf32 ? std::string("exact float32 (allow_tf32 is off) ")
                         : std::string(dtype_name(dtype)) + " ") +
              lacks + " (it runs " + describe_dtypes(has) + ")";
    }
    const std::string hint =
        forced == Family::sm75 ? turing_dtype_hint(group, dtype) : std::string();
    return fail(SAMATTN_UNSUPPORTED, subject_of(group, dtype) + ": " + family_text(*request) +
                                         " has no " + lacks + "; running on " + describe_gpu(gpu) +
                                         "." + hint +
                                         usable_sentence(group, dtype, gpu, allow_tf32));
  }
  if (!is_built(group, forced, assume_complete_build)) {
    return fail(SAMATTN_UNSUPPORTED, subject_of(group, dtype) + ": " + family_text(*request) +
                                         " has no such kernels in this build");
  }
  return SAMATTN_OK;
}

bool family_candidate(int32_t group, int32_t dtype, const GpuSpec& gpu, Family family,
                      bool allow_tf32, bool assume_complete_build) {
  return is_built(group, family, assume_complete_build) &&
         family_runs_on(family, gpu.cc_major, gpu.cc_minor) &&
         supports(group, family, dtype, allow_tf32);
}

int no_family(int32_t group, int32_t dtype, const GpuSpec& gpu, bool allow_tf32) {
  const std::string needed = usable_families(group, dtype, gpu, allow_tf32, /*built_only=*/false);
  return fail(SAMATTN_UNSUPPORTED,
              subject_of(group, dtype) +
                  ": no kernel family built into this library can run it on " + describe_gpu(gpu) +
                  " (requested family auto; built families: " +
                  join_families(built_families_mask()) + "; this GPU would need " +
                  (needed.empty() ? std::string("a family samattn does not have") : needed) + ")." +
                  (cc_at_least(gpu, 8, 0) ? std::string() : turing_dtype_hint(group, dtype)));
}

int declined(const Subject& subject, const GpuSpec& gpu, const Request& request,
             const std::string& reasons) {
  return fail(SAMATTN_UNSUPPORTED,
              subject + ": " +
                  (request.family == SAMATTN_FAMILY_AUTO
                       ? std::string("no family built into this library "
                                     "runs this problem on ")
                       : family_text(request) + " cannot run this problem on ") +
                  describe_gpu(gpu) + ": " + reasons);
}

int select_family(int32_t group, int32_t dtype, const GpuSpec& gpu, int32_t requested,
                  bool allow_tf32, int32_t* family) {
  if (family == nullptr) return fail(SAMATTN_INVALID_ARGUMENT, "samattn: family output is NULL");
  Request request;
  const int status = resolve_request(group, dtype, gpu, requested, allow_tf32, false, &request);
  if (status != SAMATTN_OK) return status;
  if (request.family != SAMATTN_FAMILY_AUTO) {
    *family = request.family;
    return SAMATTN_OK;
  }
  for (Family candidate : kFamiliesNewestFirst) {
    if (family_candidate(group, dtype, gpu, candidate, allow_tf32, false)) {
      *family = static_cast<int32_t>(candidate);
      return SAMATTN_OK;
    }
  }
  return no_family(group, dtype, gpu, allow_tf32);
}

}  // namespace samattn
