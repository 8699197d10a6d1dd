// The C ABI of libsamattn (samattn/samattn.h): argument validation, device
// facts, family selection and the call into the chosen kernel family.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "api/error.h"
#include "api/family.h"
#include "attention/attention_problem.h"
#include "common/problem.h"
#include "gemm/sm90/gemm_sm90_plan.h"
#include "samattn/samattn.h"

#ifndef SAMATTN_VERSION_STRING
#define SAMATTN_VERSION_STRING "unknown"
#endif

#define SAMATTN_EXPORT extern "C" __attribute__((visibility("default")))

namespace samattn {
namespace {

struct DeviceInfo {
  GpuSpec gpu;
  int sm_count = 0;
  int max_smem_per_block = 0;  // opt-in dynamic shared memory per block, bytes
};

std::string cuda_error_text(cudaError_t error) {
  return std::string(cudaGetErrorName(error)) + " (" + cudaGetErrorString(error) + ")";
}

// Facts about a CUDA ordinal, queried once per device (thread-safe).
int device_info(int32_t device, const std::string& subject, DeviceInfo* info) {
  static std::mutex mutex;
  static std::map<int32_t, DeviceInfo> cache;
  std::lock_guard<std::mutex> lock(mutex);
  const auto cached = cache.find(device);
  if (cached != cache.end()) {
    *info = cached->second;
    return SAMATTN_OK;
  }
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    cudaGetLastError();  // not sticky: leave no stale error for the next call
    return fail(SAMATTN_CUDA_ERROR,
                subject + ": no CUDA device (is an NVIDIA GPU and its driver installed?): " +
                    (error != cudaSuccess ? cuda_error_text(error) : "no GPU is visible"));
  }
  if (device < 0 || device >= count) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject + ": device " + to_text(device) +
                                              " does not exist (" + to_text(count) +
                                              " CUDA device(s) visible)");
  }
  cudaDeviceProp properties;
  error = cudaGetDeviceProperties(&properties, device);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return fail(SAMATTN_CUDA_ERROR, subject + ": cannot query CUDA device " + to_text(device) +
                                        ": " + cuda_error_text(error));
  }
  DeviceInfo fresh;
  fresh.gpu.cc_major = properties.major;
  fresh.gpu.cc_minor = properties.minor;
  fresh.gpu.name = properties.name;
  fresh.sm_count = properties.multiProcessorCount;
  fresh.max_smem_per_block = static_cast<int>(properties.sharedMemPerBlockOptin);
  cache.emplace(device, fresh);
  *info = fresh;
  return SAMATTN_OK;
}

// Makes `device` current for the scope and restores the caller's device.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }

  cudaError_t enter(int device) {
    cudaError_t error = cudaGetDevice(&previous_);
    if (error != cudaSuccess || previous_ == device) return error;
    error = cudaSetDevice(device);
    switched_ = error == cudaSuccess;
    return error;
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// Status of a kernel launch: the family's return value, then any error the
// runtime recorded (an invalid stream, a launch configuration error).
int launch_status(cudaError_t launched, const std::string& subject, int32_t family,
                  const DeviceInfo& device) {
  const cudaError_t recorded = cudaGetLastError();
  const cudaError_t error = launched != cudaSuccess ? launched : recorded;
  if (error == cudaSuccess) return SAMATTN_OK;
  const std::string where = std::string("family ") + family_name(family) + " on " +
                            device.gpu.name + " (compute capability " +
                            to_text(device.gpu.cc_major) + "." + to_text(device.gpu.cc_minor) + ")";
  if (error == cudaErrorNoKernelImageForDevice) {
    return fail(SAMATTN_UNSUPPORTED, subject + ": this library holds no code of " + where +
                                         "; rebuild with SAMATTN_CUDA_ARCHS including " +
                                         to_text(device.gpu.cc_major) +
                                         to_text(device.gpu.cc_minor) +
                                         ", or install the samattn wheel built for this GPU (" +
                                         cuda_error_text(error) + ")");
  }
  if (error == cudaErrorUnsupportedPtxVersion) {
    return fail(SAMATTN_UNSUPPORTED, subject + ": the NVIDIA driver is too old for the code of " +
                                         where + "; update the driver (" + cuda_error_text(error) +
                                         ")");
  }
  return fail(SAMATTN_CUDA_ERROR,
              subject + ": CUDA error in " + where + ": " + cuda_error_text(error));
}

bool any_negative(int64_t x, int64_t y, int64_t z) { return x < 0 || y < 0 || z < 0; }

// Largest byte offset of a (batch, rows, cols) view plus one element; false
// when it does not fit in int64.
bool fits_in_int64(int64_t batch, int64_t rows, int64_t cols, int64_t batch_stride,
                   int64_t row_stride, int64_t col_stride, int64_t element_size) {
  int64_t by_batch = 0, by_row = 0, by_col = 0, offset = 0, bytes = 0;
  return !__builtin_mul_overflow(batch - 1, batch_stride, &by_batch) &&
         !__builtin_mul_overflow(rows - 1, row_stride, &by_row) &&
         !__builtin_mul_overflow(cols - 1, col_stride, &by_col) &&
         !__builtin_add_overflow(by_batch, by_row, &offset) &&
         !__builtin_add_overflow(offset, by_col, &offset) &&
         !__builtin_add_overflow(offset, int64_t{1}, &offset) &&
         !__builtin_mul_overflow(offset, element_size, &bytes);
}

std::string strides_text(int64_t batch, int64_t row, int64_t col) {
  return "(" + to_text(batch) + ", " + to_text(row) + ", " + to_text(col) + ")";
}

// Calls the family's GEMM; false when this build lacks it (select_family
// rules that out, so this is a last line of defence).
bool run_gemm(int32_t family, const GemmProblem& problem, cudaError_t* launched) {
  switch (family) {
#if defined(SAMATTN_WITH_SM80) && defined(SAMATTN_WITH_GEMM)
    case SAMATTN_FAMILY_SM80:
      *launched = gemm_sm80(problem);
      return true;
#endif
#if defined(SAMATTN_WITH_SM75) && defined(SAMATTN_WITH_GEMM)
    case SAMATTN_FAMILY_SM75:
      *launched = gemm_sm75(problem);
      return true;
#endif
#if defined(SAMATTN_WITH_SM90) && defined(SAMATTN_WITH_GEMM)
    case SAMATTN_FAMILY_SM90:
      *launched = gemm_sm90(problem);
      return true;
#endif
    default:
      (void)problem;
      (void)launched;
      return false;
  }
}

bool run_softmax(int32_t family, bool backward, const SoftmaxProblem& problem,
                 cudaError_t* launched) {
  switch (family) {
#if defined(SAMATTN_WITH_SM80) && defined(SAMATTN_WITH_SOFTMAX)
    case SAMATTN_FAMILY_SM80:
      *launched = backward ? softmax_backward_sm80(problem) : softmax_forward_sm80(problem);
      return true;
#endif
#if defined(SAMATTN_WITH_SM75) && defined(SAMATTN_WITH_SOFTMAX)
    case SAMATTN_FAMILY_SM75:
      *launched = backward ? softmax_backward_sm75(problem) : softmax_forward_sm75(problem);
      return true;
#endif
    default:
      (void)backward;
      (void)problem;
      (void)launched;
      return false;
  }
}

int not_in_build(const std::string& subject, int32_t family) {
  return fail(SAMATTN_UNSUPPORTED, subject + ": family " + std::string(family_name(family)) +
                                       " has no such kernels in this build");
}

// Checks shared by every op: dtype, family and device codes.
int check_codes(const std::string& subject, int32_t dtype, int32_t family, int32_t device) {
  if (dtype_name(dtype) == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": unknown dtype code " + to_text(dtype) +
                    " (expected SAMATTN_F16 = 0, SAMATTN_BF16 = 1 or SAMATTN_F32 = 2)");
  }
  if (family_name(family) == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": unknown family code " + to_text(family) +
                    " (expected SAMATTN_FAMILY_AUTO = 0, _SM75 = 75, _SM80 = 80 or _SM90 = 90)");
  }
  if (device < 0) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": device must be a CUDA ordinal >= 0, got " + to_text(device));
  }
  return SAMATTN_OK;
}

// Checks a GEMM's arguments (no device access). `empty`: D has no elements,
// so there is nothing to compute. `subject` names the op and dtype for messages.
int check_gemm_args(const std::string& op, const samattn_gemm_args& g, std::string* subject,
                    bool* empty) {
  *empty = false;
  *subject = op;
  int status = check_codes(op, g.dtype, g.family, g.device);
  if (status != SAMATTN_OK) return status;
  *subject = op + " (" + dtype_name(g.dtype) + ")";
  const std::string& subject_text = *subject;
  if (g.batch < 0 || g.m < 0 || g.n < 0 || g.k < 0) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject_text + ": sizes must be >= 0, got batch=" + to_text(g.batch) +
                    " m=" + to_text(g.m) + " n=" + to_text(g.n) + " k=" + to_text(g.k));
  }
  if (!std::isfinite(g.alpha)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject_text + ": alpha must be finite, got " + float_to_text(g.alpha));
  }
  if (!std::isfinite(g.beta)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject_text + ": beta must be finite, got " + float_to_text(g.beta));
  }
  const struct {
    const char* name;
    int64_t batch, row, col;
  } strides[] = {{"a", g.a_batch_stride, g.a_row_stride, g.a_col_stride},
                 {"b", g.b_batch_stride, g.b_row_stride, g.b_col_stride},
                 {"c", g.c_batch_stride, g.c_row_stride, g.c_col_stride},
                 {"d", g.d_batch_stride, g.d_row_stride, g.d_col_stride}};
  for (const auto& s : strides) {
    if (any_negative(s.batch, s.row, s.col)) {
      return fail(SAMATTN_INVALID_ARGUMENT, subject_text + ": " + s.name +
                                                " strides must be >= 0, got " +
                                                strides_text(s.batch, s.row, s.col));
    }
  }
  if (g.workspace_bytes < 0) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject_text + ": workspace_bytes must be >= 0, got " + to_text(g.workspace_bytes));
  }
  if (g.c == nullptr && g.beta != 0.0f) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject_text + ": c is NULL but beta is " +
                                              float_to_text(g.beta) +
                                              " (c may be NULL only "
                                              "when beta == 0)");
  }
  *empty = g.batch == 0 || g.m == 0 || g.n == 0;
  if (*empty) return SAMATTN_OK;  // D is empty: nothing to check or compute

  if (g.d == nullptr) return fail(SAMATTN_INVALID_ARGUMENT, subject_text + ": d is NULL");
  if (g.k > 0 && g.a == nullptr)
    return fail(SAMATTN_INVALID_ARGUMENT, subject_text + ": a is NULL");
  if (g.k > 0 && g.b == nullptr)
    return fail(SAMATTN_INVALID_ARGUMENT, subject_text + ": b is NULL");
  if ((g.batch > 1 && g.d_batch_stride == 0) || (g.m > 1 && g.d_row_stride == 0) ||
      (g.n > 1 && g.d_col_stride == 0)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject_text + ": d strides " +
                    strides_text(g.d_batch_stride, g.d_row_stride, g.d_col_stride) +
                    " make elements of d overlap (a stride of 0 on a size > 1)");
  }
  const int64_t element = dtype_size(g.dtype);
  const bool with_c = g.beta != 0.0f;
  if ((g.k > 0 && (!fits_in_int64(g.batch, g.m, g.k, g.a_batch_stride, g.a_row_stride,
                                  g.a_col_stride, element) ||
                   !fits_in_int64(g.batch, g.k, g.n, g.b_batch_stride, g.b_row_stride,
                                  g.b_col_stride, element))) ||
      (with_c && !fits_in_int64(g.batch, g.m, g.n, g.c_batch_stride, g.c_row_stride, g.c_col_stride,
                                element)) ||
      !fits_in_int64(g.batch, g.m, g.n, g.d_batch_stride, g.d_row_stride, g.d_col_stride,
                     element)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject_text + ": sizes and strides overflow a 64-bit byte offset");
  }

  return SAMATTN_OK;
}

GemmProblem make_gemm_problem(const samattn_gemm_args& g, int sm_count) {
  GemmProblem problem{};
  const bool with_c = g.beta != 0.0f;
  problem.dtype = static_cast<DType>(g.dtype);
  problem.batch = g.batch;
  problem.m = g.m;
  problem.n = g.n;
  problem.k = g.k;
  problem.a = {g.a, g.a_batch_stride, g.a_row_stride, g.a_col_stride};
  problem.b = {g.b, g.b_batch_stride, g.b_row_stride, g.b_col_stride};
  problem.c = {with_c ? g.c : nullptr, g.c_batch_stride, g.c_row_stride, g.c_col_stride};
  problem.d = g.d;
  problem.d_batch_stride = g.d_batch_stride;
  problem.d_row_stride = g.d_row_stride;
  problem.d_col_stride = g.d_col_stride;
  problem.alpha = g.alpha;
  problem.beta = g.beta;
  problem.allow_tf32 = g.allow_tf32 != 0;
  problem.sm_count = sm_count;
  problem.stream = static_cast<cudaStream_t>(g.stream);
  problem.workspace = g.workspace;
  problem.workspace_bytes = g.workspace_bytes;
  return problem;
}

// The family that runs `problem`: the selected one, except that the sm90
// family hands what TMA cannot describe to sm80 (`plan` says why, or gives
// the sm90 configuration).
int choose_gemm_family(const samattn_gemm_args& g, const GpuSpec& gpu, const GemmProblem& problem,
                       int32_t* family, gemm::sm90::Plan* plan,
                       bool assume_complete_build = false) {
  int status = select_family(SAMATTN_OP_GEMM, g.dtype, gpu, g.family, g.allow_tf32 != 0, family,
                             assume_complete_build);
  if (status != SAMATTN_OK || *family != SAMATTN_FAMILY_SM90) return status;
  *plan = gemm::sm90::plan(problem);
  if (plan->eligible) return SAMATTN_OK;
  return select_family(SAMATTN_OP_GEMM, g.dtype, gpu, SAMATTN_FAMILY_SM80, g.allow_tf32 != 0,
                       family, assume_complete_build);
}

// Workspace bytes the chosen family needs for `problem`.
int64_t gemm_workspace_bytes(int32_t family, const GemmProblem& problem) {
#if defined(SAMATTN_WITH_SM90) && defined(SAMATTN_WITH_GEMM)
  if (family == SAMATTN_FAMILY_SM90) {
    return static_cast<int64_t>(gemm_sm90_workspace_bytes(problem));
  }
#endif
  (void)family;
  (void)problem;
  return 0;
}

int gemm_op(const samattn_gemm_args* args, int32_t* family_used) {
  const std::string op = "samattn gemm";
  if (family_used != nullptr) *family_used = SAMATTN_FAMILY_AUTO;
  if (args == nullptr) return fail(SAMATTN_INVALID_ARGUMENT, op + ": args is NULL");
  const samattn_gemm_args& g = *args;
  std::string subject;
  bool empty = false;
  int status = check_gemm_args(op, g, &subject, &empty);
  if (status != SAMATTN_OK || empty) return status;

  DeviceInfo device;
  status = device_info(g.device, subject, &device);
  if (status != SAMATTN_OK) return status;
  const GemmProblem problem = make_gemm_problem(g, device.sm_count);
  int32_t family = SAMATTN_FAMILY_AUTO;
  gemm::sm90::Plan plan;
  status = choose_gemm_family(g, device.gpu, problem, &family, &plan);
  if (status != SAMATTN_OK) return status;
  const int64_t needed = gemm_workspace_bytes(family, problem);
  if (needed > 0 && (g.workspace == nullptr || g.workspace_bytes < needed)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": needs " + to_text(needed) + " bytes of workspace, got " +
                    to_text(g.workspace == nullptr ? 0 : g.workspace_bytes) +
                    " (ask samattn_gemm_workspace_size)");
  }

  DeviceGuard guard;
  const cudaError_t entered = guard.enter(g.device);
  if (entered != cudaSuccess) return launch_status(entered, subject, family, device);
  cudaGetLastError();  // start clean: only this launch's errors count
  cudaError_t launched = cudaSuccess;
  if (!run_gemm(family, problem, &launched)) return not_in_build(subject, family);
  status = launch_status(launched, subject, family, device);
  if (status == SAMATTN_OK && family_used != nullptr) *family_used = family;
  return status;
}

int gemm_workspace_size_op(const samattn_gemm_args* args, int64_t* bytes) {
  const std::string op = "samattn gemm_workspace_size";
  if (args == nullptr || bytes == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT, op + ": args or bytes is NULL");
  }
  *bytes = 0;
  std::string subject;
  bool empty = false;
  int status = check_gemm_args(op, *args, &subject, &empty);
  if (status != SAMATTN_OK || empty) return status;
  DeviceInfo device;
  status = device_info(args->device, subject, &device);
  if (status != SAMATTN_OK) return status;
  const GemmProblem problem = make_gemm_problem(*args, device.sm_count);
  int32_t family = SAMATTN_FAMILY_AUTO;
  gemm::sm90::Plan plan;
  status = choose_gemm_family(*args, device.gpu, problem, &family, &plan);
  if (status != SAMATTN_OK) return status;
  *bytes = gemm_workspace_bytes(family, problem);
  return SAMATTN_OK;
}

int gemm_plan_op(const samattn_gemm_args* args, int32_t cc_major, int32_t cc_minor,
                 int32_t sm_count, int32_t* family, char* text, int32_t capacity) {
  const std::string op = "samattn gemm_plan";
  if (args == nullptr || family == nullptr || text == nullptr || capacity < 1) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                op + ": args, family and plan must be non-NULL, plan_capacity >= 1");
  }
  if (sm_count < 1) {
    return fail(SAMATTN_INVALID_ARGUMENT, op + ": sm_count must be >= 1, got " + to_text(sm_count));
  }
  *family = SAMATTN_FAMILY_AUTO;
  text[0] = '\0';
  std::string subject;
  bool empty = false;
  int status = check_gemm_args(op, *args, &subject, &empty);
  if (status != SAMATTN_OK) return status;
  GpuSpec gpu;
  gpu.cc_major = cc_major;
  gpu.cc_minor = cc_minor;
  const GemmProblem problem = make_gemm_problem(*args, sm_count);
  gemm::sm90::Plan plan;
  status = choose_gemm_family(*args, gpu, problem, family, &plan, /*assume_complete_build=*/true);
  if (status != SAMATTN_OK) return status;
  std::string description;
  if (*family == SAMATTN_FAMILY_SM90) {
    description = std::string("tile=") + gemm::sm90::tile_name(plan.tile) +
                  " swizzle=" + to_text(plan.swizzle) +
                  " transposed=" + (plan.transposed ? "1" : "0");
  } else if (!plan.reason.empty()) {
    description = "sm90 cannot run it: " + plan.reason;
  }
  std::snprintf(text, static_cast<size_t>(capacity), "%s", description.c_str());
  return SAMATTN_OK;
}

int softmax(const samattn_softmax_args* args, bool backward, int32_t* family_used) {
  const std::string op = backward ? "samattn softmax_backward" : "samattn softmax";
  if (family_used != nullptr) *family_used = SAMATTN_FAMILY_AUTO;
  if (args == nullptr) return fail(SAMATTN_INVALID_ARGUMENT, op + ": args is NULL");
  const samattn_softmax_args& s = *args;
  int status = check_codes(op, s.dtype, s.family, s.device);
  if (status != SAMATTN_OK) return status;
  const std::string subject = op + " (" + dtype_name(s.dtype) + ")";
  if (any_negative(s.outer, s.dim, s.inner)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": sizes must be >= 0, got outer=" + to_text(s.outer) +
                    " dim=" + to_text(s.dim) + " inner=" + to_text(s.inner));
  }
  if (s.outer == 0 || s.dim == 0 || s.inner == 0) return SAMATTN_OK;  // nothing to compute

  if (s.x == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject + (backward ? ": y is NULL" : ": x is NULL"));
  }
  if (backward && s.dy == nullptr) return fail(SAMATTN_INVALID_ARGUMENT, subject + ": dy is NULL");
  if (s.out == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject + (backward ? ": dx is NULL" : ": y is NULL"));
  }
  int64_t rows = 0, elements = 0, bytes = 0;
  if (__builtin_mul_overflow(s.outer, s.dim, &rows) ||
      __builtin_mul_overflow(rows, s.inner, &elements) ||
      __builtin_mul_overflow(elements, dtype_size(s.dtype), &bytes)) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject + ": outer * dim * inner overflows 64 bits");
  }

  DeviceInfo device;
  status = device_info(s.device, subject, &device);
  if (status != SAMATTN_OK) return status;
  int32_t family = SAMATTN_FAMILY_AUTO;
  status = select_family(SAMATTN_OP_SOFTMAX, s.dtype, device.gpu, s.family, false, &family);
  if (status != SAMATTN_OK) return status;

  SoftmaxProblem problem;
  problem.dtype = static_cast<DType>(s.dtype);
  problem.outer = s.outer;
  problem.dim = s.dim;
  problem.inner = s.inner;
  problem.x = s.x;
  problem.dy = backward ? s.dy : nullptr;
  problem.out = s.out;
  problem.sm_count = device.sm_count;
  problem.stream = static_cast<cudaStream_t>(s.stream);

  DeviceGuard guard;
  const cudaError_t entered = guard.enter(s.device);
  if (entered != cudaSuccess) return launch_status(entered, subject, family, device);
  cudaGetLastError();
  cudaError_t launched = cudaSuccess;
  if (!run_softmax(family, backward, problem, &launched)) return not_in_build(subject, family);
  status = launch_status(launched, subject, family, device);
  if (status == SAMATTN_OK && family_used != nullptr) *family_used = family;
  return status;
}

// ------------------------------------------------------------- attention ----

// One (batch, seq, head, dim) operand of an attention call, for validation.
struct AttentionOperand {
  const char* name;
  const void* ptr;
  int64_t batch_stride, seq_stride, head_stride;
  int64_t seqlen, heads;  // the extents it is read or written over
  bool key_side;          // K or V: not read when no sequence has keys
};

// Largest element offset of a (batch, seq, head, dim) operand plus one, in
// bytes; false when that overflows int64.
bool attention_extent_fits(int64_t batch, const AttentionOperand& x, int64_t headdim,
                           int64_t element_size) {
  int64_t by_batch = 0, by_seq = 0, by_head = 0, offset = 0, bytes = 0;
  return !__builtin_mul_overflow(batch - 1, x.batch_stride, &by_batch) &&
         !__builtin_mul_overflow(x.seqlen - 1, x.seq_stride, &by_seq) &&
         !__builtin_mul_overflow(x.heads - 1, x.head_stride, &by_head) &&
         !__builtin_add_overflow(by_batch, by_seq, &offset) &&
         !__builtin_add_overflow(offset, by_head, &offset) &&
         !__builtin_add_overflow(offset, headdim, &offset) &&
         !__builtin_mul_overflow(offset, element_size, &bytes);
}

bool aligned(const void* ptr, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// Any head dim up to 256 runs in the next instantiated one (32, 64, 96, 128,
// 192, 256). Rows move as 16-byte vectors where the head dim and every
// pointer and stride allow it, else element by element (vector_aligned).
constexpr int64_t kMaxAttentionHeadDim = 256;
constexpr int64_t kMaxGridYZ = 65535;

// Checks the codes, sizes and scalars of a forward or backward call (no
// pointers, no device access).
int check_attention_sizes(const std::string& op, const samattn_attention_args& a, bool backward,
                          std::string* subject) {
  *subject = op;
  int status = check_codes(op, a.dtype, a.family, a.device);
  if (status != SAMATTN_OK) return status;
  if (a.dtype != SAMATTN_F16 && a.dtype != SAMATTN_BF16) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                op + ": dtype must be SAMATTN_F16 or SAMATTN_BF16, got " + dtype_name(a.dtype));
  }
  *subject = op + " (" + dtype_name(a.dtype) + ")";
  const std::string& s = *subject;
  const bool varlen = a.cu_seqlens_q != nullptr || a.cu_seqlens_k != nullptr;

  if (a.batch < 0 || a.nheads < 0 || a.nheads_k < 0 || a.seqlen_q < 0 || a.seqlen_k < 0) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": sizes must be >= 0, got batch=" + to_text(a.batch) +
                    " nheads=" + to_text(a.nheads) + " nheads_k=" + to_text(a.nheads_k) +
                    " seqlen_q=" + to_text(a.seqlen_q) + " seqlen_k=" + to_text(a.seqlen_k));
  }
  if (a.headdim < 1 || a.headdim > kMaxAttentionHeadDim) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": headdim must be in 1..256, got " + to_text(a.headdim));
  }
  if (a.nheads_k < 1 || a.nheads % a.nheads_k != 0) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": nheads (" + to_text(a.nheads) +
                                              ") must be a multiple of nheads_k (" +
                                              to_text(a.nheads_k) +
                                              " >= 1): each key/value head serves a group of query "
                                              "heads");
  }
  if (a.batch > kMaxGridYZ || a.nheads > kMaxGridYZ) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": batch (" + to_text(a.batch) + ") and nheads (" +
                                              to_text(a.nheads) + ") must be <= 65535");
  }
  if (a.seqlen_q > INT32_MAX || a.seqlen_k > INT32_MAX) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": seqlen_q and seqlen_k must be < 2^31, got " +
                                              to_text(a.seqlen_q) + " and " + to_text(a.seqlen_k));
  }
  if (a.causal != 0 && a.causal != 1) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": causal must be 0 or 1, got " + to_text(a.causal));
  }
  if (!std::isfinite(a.softmax_scale)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": softmax_scale must be finite, got " + float_to_text(a.softmax_scale));
  }
  if (!std::isfinite(a.softcap) || a.softcap < 0.0f) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": softcap must be finite and >= 0 (0 = off), got " + float_to_text(a.softcap));
  }
  if (a.workspace_bytes < 0) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": workspace_bytes must be >= 0, got " + to_text(a.workspace_bytes));
  }
  if (varlen) {
    if (a.cu_seqlens_q == nullptr || a.cu_seqlens_k == nullptr) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s +
                      ": cu_seqlens_q and cu_seqlens_k must both be given (varlen) or both be "
                      "NULL (fixed length); got " +
                      (a.cu_seqlens_q == nullptr ? "cu_seqlens_q NULL" : "cu_seqlens_k NULL"));
    }
    if (!aligned(a.cu_seqlens_q, 4) || !aligned(a.cu_seqlens_k, 4)) {
      return fail(SAMATTN_INVALID_ARGUMENT, s + ": cu_seqlens_q and cu_seqlens_k must be "
                                                "4-byte aligned int32 arrays");
    }
    if (a.max_seqlen_q < 0 || a.max_seqlen_q > a.seqlen_q || a.max_seqlen_k < 0 ||
        a.max_seqlen_k > a.seqlen_k) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s +
                      ": varlen needs 0 <= max_seqlen_q <= seqlen_q (packed rows) and 0 <= "
                      "max_seqlen_k <= seqlen_k, got max_seqlen_q=" +
                      to_text(a.max_seqlen_q) + " seqlen_q=" + to_text(a.seqlen_q) +
                      " max_seqlen_k=" + to_text(a.max_seqlen_k) +
                      " seqlen_k=" + to_text(a.seqlen_k));
    }
  }
  if (backward && a.deterministic != 0 && a.deterministic != 1) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": deterministic must be 0 or 1, got " + to_text(a.deterministic));
  }
  return SAMATTN_OK;
}

// Checks the pointer and strides of one (batch, seq, head, dim) operand;
// `output`: written, so no two of its elements may share an address.
int check_attention_operand(const std::string& s, AttentionOperand x, bool varlen,
                            const samattn_attention_args& a, bool output) {
  // With varlen the batch stride is unused: the batch extent is one packed tensor.
  const int64_t batch_extent = varlen ? 1 : a.batch;
  if (varlen) x.batch_stride = 0;
  if (x.ptr == nullptr) return fail(SAMATTN_INVALID_ARGUMENT, s + ": " + x.name + " is NULL");
  if (!aligned(x.ptr, static_cast<uintptr_t>(dtype_size(a.dtype)))) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": " + x.name + " must be aligned to its " +
                                              to_text(dtype_size(a.dtype)) + "-byte elements");
  }
  if (any_negative(x.batch_stride, x.seq_stride, x.head_stride)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": " + x.name + " strides (batch, seq, head) " +
                    strides_text(x.batch_stride, x.seq_stride, x.head_stride) + " must be >= 0");
  }
  if (!attention_extent_fits(batch_extent, x, a.headdim, dtype_size(a.dtype))) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": " + x.name + " sizes and strides overflow a 64-bit byte offset");
  }
  if (output && ((batch_extent > 1 && x.batch_stride == 0) || (x.seqlen > 1 && x.seq_stride == 0) ||
                 (x.heads > 1 && x.head_stride == 0))) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": " + x.name + " strides " +
                    strides_text(x.batch_stride, x.seq_stride, x.head_stride) +
                    " make elements of " + x.name + " overlap (a stride of 0 on a size > 1)");
  }
  return SAMATTN_OK;
}

// Checks lse, the (batch, head, seq) fp32 log-sum-exp (not NULL).
int check_attention_lse(const std::string& s, const samattn_attention_args& a, bool varlen) {
  const int64_t lse_batch = varlen ? 0 : a.lse_batch_stride;
  const AttentionOperand lse{"lse",      a.lse,    lse_batch, a.lse_seq_stride, a.lse_head_stride,
                             a.seqlen_q, a.nheads, false};
  if (!aligned(a.lse, 4)) {
    return fail(SAMATTN_INVALID_ARGUMENT, s + ": lse must be 4-byte aligned (fp32)");
  }
  if (any_negative(lse_batch, a.lse_head_stride, a.lse_seq_stride)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": lse strides (batch, head, seq) " +
                    strides_text(a.lse_batch_stride, a.lse_head_stride, a.lse_seq_stride) +
                    " must be >= 0");
  }
  if ((!varlen && a.batch > 1 && lse_batch == 0) || (a.seqlen_q > 1 && a.lse_seq_stride == 0) ||
      (a.nheads > 1 && a.lse_head_stride == 0)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": lse strides (batch, head, seq) " +
                    strides_text(a.lse_batch_stride, a.lse_head_stride, a.lse_seq_stride) +
                    " make elements of lse overlap (a stride of 0 on a size > 1)");
  }
  // One fp32 per (batch, head, seq): the extent of a head dim of 1.
  if (!attention_extent_fits(varlen ? 1 : a.batch, lse, 0, 4)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                s + ": lse sizes and strides overflow a 64-bit byte offset");
  }
  return SAMATTN_OK;
}

// Checks a forward call's arguments (no device access). `empty`: there is no
// output element, so nothing to compute.
int check_attention_forward_args(const std::string& op, const samattn_attention_args& a,
                                 std::string* subject, bool* empty) {
  *empty = false;
  int status = check_attention_sizes(op, a, /*backward=*/false, subject);
  if (status != SAMATTN_OK) return status;
  const std::string& s = *subject;
  const bool varlen = a.cu_seqlens_q != nullptr;
  // The longest sequence a CTA sees.
  const int64_t longest_q = varlen ? a.max_seqlen_q : a.seqlen_q;
  const int64_t longest_k = varlen ? a.max_seqlen_k : a.seqlen_k;
  *empty = a.batch == 0 || a.nheads == 0 || longest_q == 0;
  if (*empty) return SAMATTN_OK;

  const bool keys = longest_k > 0;  // K and V are read only when some sequence has keys
  const AttentionOperand operands[] = {
      {"q", a.q, a.q_batch_stride, a.q_seq_stride, a.q_head_stride, a.seqlen_q, a.nheads, false},
      {"k", a.k, a.k_batch_stride, a.k_seq_stride, a.k_head_stride, a.seqlen_k, a.nheads_k, true},
      {"v", a.v, a.v_batch_stride, a.v_seq_stride, a.v_head_stride, a.seqlen_k, a.nheads_k, true},
      {"o", a.o, a.o_batch_stride, a.o_seq_stride, a.o_head_stride, a.seqlen_q, a.nheads, false}};
  constexpr int kOutput = 3;  // o
  for (int i = 0; i < 4; ++i) {
    if (operands[i].key_side && !keys) continue;
    status = check_attention_operand(s, operands[i], varlen, a, /*output=*/i == kOutput);
    if (status != SAMATTN_OK) return status;
  }
  return a.lse != nullptr ? check_attention_lse(s, a, varlen) : SAMATTN_OK;
}

// Checks a backward call's arguments (no device access). `empty`: dq, dk and
// dv have no element, so nothing to compute.
int check_attention_backward_args(const std::string& op, const samattn_attention_args& a,
                                  std::string* subject, bool* empty) {
  *empty = false;
  int status = check_attention_sizes(op, a, /*backward=*/true, subject);
  if (status != SAMATTN_OK) return status;
  const std::string& s = *subject;
  const bool varlen = a.cu_seqlens_q != nullptr;
  // Rows of the query-side (q, o, dout, dq) and key-side (k, v, dk, dv)
  // tensors: with none on one side, that side is neither read nor written.
  *empty = a.batch == 0 || a.nheads == 0 || (a.seqlen_q == 0 && a.seqlen_k == 0);
  if (*empty) return SAMATTN_OK;

  const AttentionOperand operands[] = {
      {"q", a.q, a.q_batch_stride, a.q_seq_stride, a.q_head_stride, a.seqlen_q, a.nheads, false},
      {"k", a.k, a.k_batch_stride, a.k_seq_stride, a.k_head_stride, a.seqlen_k, a.nheads_k, true},
      {"v", a.v, a.v_batch_stride, a.v_seq_stride, a.v_head_stride, a.seqlen_k, a.nheads_k, true},
      {"o", a.o, a.o_batch_stride, a.o_seq_stride, a.o_head_stride, a.seqlen_q, a.nheads, false},
      {"dout", a.dout, a.dout_batch_stride, a.dout_seq_stride, a.dout_head_stride, a.seqlen_q,
       a.nheads, false},
      {"dq", a.dq, a.dq_batch_stride, a.dq_seq_stride, a.dq_head_stride, a.seqlen_q, a.nheads,
       false},
      {"dk", a.dk, a.dk_batch_stride, a.dk_seq_stride, a.dk_head_stride, a.seqlen_k, a.nheads_k,
       true},
      {"dv", a.dv, a.dv_batch_stride, a.dv_seq_stride, a.dv_head_stride, a.seqlen_k, a.nheads_k,
       true}};
  constexpr int kFirstOutput = 5;  // dq, dk, dv
  const int count = static_cast<int>(sizeof(operands) / sizeof(operands[0]));
  for (int i = 0; i < count; ++i) {
    const AttentionOperand& x = operands[i];
    if (x.seqlen == 0) continue;
    status = check_attention_operand(s, x, varlen, a, /*output=*/i >= kFirstOutput);
    if (status != SAMATTN_OK) return status;
  }
  // An output sharing its address with another tensor would be read after
  // being written (or written twice).
  for (int i = kFirstOutput; i < count; ++i) {
    if (operands[i].seqlen == 0) continue;
    for (int j = 0; j < count; ++j) {
      if (j == i || operands[j].seqlen == 0 || operands[j].ptr != operands[i].ptr) continue;
      return fail(SAMATTN_INVALID_ARGUMENT, s + ": " + operands[i].name + " and " +
                                                operands[j].name +
                                                " are the same memory; dq, dk and dv must not "
                                                "overlap each other or any input");
    }
  }
  if (a.seqlen_q > 0) {
    if (a.lse == nullptr) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  s + ": lse is NULL; the backward needs the forward's log-sum-exp");
    }
    status = check_attention_lse(s, a, varlen);
    if (status != SAMATTN_OK) return status;
  }
  return SAMATTN_OK;
}

AttentionForwardProblem make_attention_forward_problem(const samattn_attention_args& a,
                                                       const DeviceInfo& device) {
  const bool varlen = a.cu_seqlens_q != nullptr;
  AttentionForwardProblem problem{};
  problem.dtype = static_cast<DType>(a.dtype);
  problem.batch = static_cast<int>(a.batch);
  problem.nheads = static_cast<int>(a.nheads);
  problem.nheads_k = static_cast<int>(a.nheads_k);
  // Varlen: the kernels take the longest sequence (grid size, window bounds).
  problem.seqlen_q = static_cast<int>(varlen ? a.max_seqlen_q : a.seqlen_q);
  problem.seqlen_k = static_cast<int>(varlen ? a.max_seqlen_k : a.seqlen_k);
  problem.headdim = static_cast<int>(a.headdim);
  const int64_t no_batch = 0;  // varlen: one packed tensor
  problem.q = {a.q, varlen ? no_batch : a.q_batch_stride, a.q_seq_stride, a.q_head_stride};
  problem.k = {a.k, varlen ? no_batch : a.k_batch_stride, a.k_seq_stride, a.k_head_stride};
  problem.v = {a.v, varlen ? no_batch : a.v_batch_stride, a.v_seq_stride, a.v_head_stride};
  problem.o = a.o;
  problem.o_batch_stride = varlen ? no_batch : a.o_batch_stride;
  problem.o_seq_stride = a.o_seq_stride;
  problem.o_head_stride = a.o_head_stride;
  problem.cu_seqlens_q = varlen ? a.cu_seqlens_q : nullptr;
  problem.cu_seqlens_k = varlen ? a.cu_seqlens_k : nullptr;
  problem.softmax_scale = a.softmax_scale;
  problem.causal = a.causal != 0;
  problem.window_left = a.window_left < 0 ? -1 : a.window_left;
  problem.window_right = a.window_right < 0 ? -1 : a.window_right;
  problem.softcap = a.softcap;
  problem.lse = a.lse;
  problem.lse_batch_stride = varlen ? no_batch : a.lse_batch_stride;
  problem.lse_head_stride = a.lse_head_stride;
  problem.lse_seq_stride = a.lse_seq_stride;
  problem.stream = static_cast<cudaStream_t>(a.stream);
  problem.sm_count = device.sm_count;
  problem.max_smem_per_block = device.max_smem_per_block;
  return problem;
}

// A family's refusal of an attention head dim (cudaErrorNotSupported from its
// dispatch): left out of this build by SAMATTN_ATTENTION_HEAD_DIMS (CI builds
// a subset), or no tile of the family fits the device's shared memory.
int attention_not_supported(const std::string& subject, int32_t family, int64_t headdim,
                            const DeviceInfo& device, bool backward) {
  const int padded = padded_headdim(static_cast<int>(headdim));
  if (!head_dim_built(padded)) {
    std::string built;
    for (int d : {32, 64, 96, 128, 192, 256}) {
      if (head_dim_built(d)) built += (built.empty() ? "" : ", ") + std::to_string(d);
    }
    return fail(SAMATTN_UNSUPPORTED, subject + ": head dim " + to_text(headdim) + " runs in the " +
                                         to_text(padded) +
                                         " kernels, which this build left out (built with "
                                         "SAMATTN_ATTENTION_HEAD_DIMS = " +
                                         built + ")");
  }
  return fail(SAMATTN_UNSUPPORTED, subject + ": family " + family_name(family) + " has no " +
                                       (backward ? "backward " : "") + "kernel for head dim " +
                                       to_text(headdim) + " that fits the " +
                                       to_text(device.max_smem_per_block) +
                                       " bytes of shared memory per block of " + device.gpu.name +
                                       (backward && family == SAMATTN_FAMILY_SM75
                                            ? " (the sm75 backward supports head dims up to 192)"
                                            : ""));
}

bool run_attention_forward(int32_t family, const AttentionForwardProblem& problem,
                           cudaError_t* launched) {
  switch (family) {
#if defined(SAMATTN_WITH_SM80) && defined(SAMATTN_WITH_ATTENTION)
    case SAMATTN_FAMILY_SM80:
      *launched = attention_forward_sm80(problem);
      return true;
#endif
#if defined(SAMATTN_WITH_SM75) && defined(SAMATTN_WITH_ATTENTION)
    case SAMATTN_FAMILY_SM75:
      *launched = attention_forward_sm75(problem);
      return true;
#endif
    default:
      (void)problem;
      (void)launched;
      return false;
  }
}

int attention_forward_op(const samattn_attention_args* args, int32_t* family_used) {
  const std::string op = "samattn attention_forward";
  if (family_used != nullptr) *family_used = SAMATTN_FAMILY_AUTO;
  if (args == nullptr) return fail(SAMATTN_INVALID_ARGUMENT, op + ": args is NULL");
  const samattn_attention_args& a = *args;
  std::string subject;
  bool empty = false;
  int status = check_attention_forward_args(op, a, &subject, &empty);
  if (status != SAMATTN_OK || empty) return status;

  DeviceInfo device;
  status = device_info(a.device, subject, &device);
  if (status != SAMATTN_OK) return status;
  int32_t family = SAMATTN_FAMILY_AUTO;
  status = select_family(SAMATTN_OP_ATTENTION, a.dtype, device.gpu, a.family, false, &family);
  if (status != SAMATTN_OK) return status;
  const AttentionForwardProblem problem = make_attention_forward_problem(a, device);

  DeviceGuard guard;
  const cudaError_t entered = guard.enter(a.device);
  if (entered != cudaSuccess) return launch_status(entered, subject, family, device);
  cudaGetLastError();
  cudaError_t launched = cudaSuccess;
  if (!run_attention_forward(family, problem, &launched)) return not_in_build(subject, family);
  if (launched == cudaErrorNotSupported) {
    cudaGetLastError();
    return attention_not_supported(subject, family, a.headdim, device, /*backward=*/false);
  }
  status = launch_status(launched, subject, family, device);
  if (status == SAMATTN_OK && family_used != nullptr) *family_used = family;
  return status;
}

// The backward's problem; device facts are left 0 for the workspace query.
AttentionBackwardProblem make_attention_backward_problem(const samattn_attention_args& a,
                                                         const DeviceInfo& device) {
  const bool varlen = a.cu_seqlens_q != nullptr;
  const int64_t no_batch = 0;  // varlen: one packed tensor
  auto view = [&](const void* ptr, int64_t batch, int64_t seq, int64_t head) {
    return SeqHeadView{ptr, varlen ? no_batch : batch, seq, head};
  };
  auto out = [&](void* ptr, int64_t batch, int64_t seq, int64_t head) {
    return SeqHeadOut{ptr, varlen ? no_batch : batch, seq, head};
  };
  AttentionBackwardProblem problem{};
  problem.dtype = static_cast<DType>(a.dtype);
  problem.batch = static_cast<int>(a.batch);
  problem.nheads = static_cast<int>(a.nheads);
  problem.nheads_k = static_cast<int>(a.nheads_k);
  // Varlen: the kernels take the longest sequence (grid size, window bounds)
  // and the packed row counts (workspace).
  problem.seqlen_q = static_cast<int>(varlen ? a.max_seqlen_q : a.seqlen_q);
  problem.seqlen_k = static_cast<int>(varlen ? a.max_seqlen_k : a.seqlen_k);
  problem.total_q = varlen ? a.seqlen_q : 0;
  problem.total_k = varlen ? a.seqlen_k : 0;
  problem.headdim = static_cast<int>(a.headdim);
  problem.q = view(a.q, a.q_batch_stride, a.q_seq_stride, a.q_head_stride);
  problem.k = view(a.k, a.k_batch_stride, a.k_seq_stride, a.k_head_stride);
  problem.v = view(a.v, a.v_batch_stride, a.v_seq_stride, a.v_head_stride);
  problem.o = view(a.o, a.o_batch_stride, a.o_seq_stride, a.o_head_stride);
  problem.dout = view(a.dout, a.dout_batch_stride, a.dout_seq_stride, a.dout_head_stride);
  problem.dq = out(a.dq, a.dq_batch_stride, a.dq_seq_stride, a.dq_head_stride);
  problem.dk = out(a.dk, a.dk_batch_stride, a.dk_seq_stride, a.dk_head_stride);
  problem.dv = out(a.dv, a.dv_batch_stride, a.dv_seq_stride, a.dv_head_stride);
  problem.cu_seqlens_q = varlen ? a.cu_seqlens_q : nullptr;
  problem.cu_seqlens_k = varlen ? a.cu_seqlens_k : nullptr;
  problem.softmax_scale = a.softmax_scale;
  problem.causal = a.causal != 0;
  problem.window_left = a.window_left < 0 ? -1 : a.window_left;
  problem.window_right = a.window_right < 0 ? -1 : a.window_right;
  problem.softcap = a.softcap;
  problem.lse = a.lse;
  problem.lse_batch_stride = varlen ? no_batch : a.lse_batch_stride;
  problem.lse_head_stride = a.lse_head_stride;
  problem.lse_seq_stride = a.lse_seq_stride;
  problem.deterministic = a.deterministic != 0;
  problem.workspace = a.workspace;
  problem.workspace_bytes = a.workspace_bytes < 0 ? 0 : static_cast<size_t>(a.workspace_bytes);
  problem.stream = static_cast<cudaStream_t>(a.stream);
  problem.sm_count = device.sm_count;
  problem.max_smem_per_block = device.max_smem_per_block;
  return problem;
}

// Workspace of the backward. Every mma.sync family runs the same three steps
// (attention/flash_bwd_launch.cuh), so one layout serves them all.
int64_t attention_backward_workspace_bytes(const AttentionBackwardProblem& problem) {
  return static_cast<int64_t>(flash_bwd_workspace_bytes(problem));
}

bool run_attention_backward(int32_t family, const AttentionBackwardProblem& problem,
                            cudaError_t* launched) {
  switch (family) {
#if defined(SAMATTN_WITH_SM80) && defined(SAMATTN_WITH_ATTENTION)
    case SAMATTN_FAMILY_SM80:
      *launched = attention_backward_sm80(problem);
      return true;
#endif
#if defined(SAMATTN_WITH_SM75) && defined(SAMATTN_WITH_ATTENTION)
    case SAMATTN_FAMILY_SM75:
      *launched = attention_backward_sm75(problem);
      return true;
#endif
    default:
      (void)problem;
      (void)launched;
      return false;
  }
}

int attention_backward_op(const samattn_attention_args* args, int32_t* family_used) {
  const std::string op = "samattn attention_backward";
  if (family_used != nullptr) *family_used = SAMATTN_FAMILY_AUTO;
  if (args == nullptr) return fail(SAMATTN_INVALID_ARGUMENT, op + ": args is NULL");
  const samattn_attention_args& a = *args;
  std::string subject;
  bool empty = false;
  int status = check_attention_backward_args(op, a, &subject, &empty);
  if (status != SAMATTN_OK || empty) return status;
  const int64_t needed = attention_backward_workspace_bytes(make_attention_backward_problem(a, {}));
  if (needed > 0 && (a.workspace == nullptr || a.workspace_bytes < needed)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": needs " + to_text(needed) + " bytes of workspace, got " +
                    to_text(a.workspace == nullptr ? 0 : a.workspace_bytes) +
                    " (ask samattn_attention_backward_workspace_size)");
  }
  if (needed > 0 && !aligned(a.workspace, 256)) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject + ": workspace must be 256-byte aligned");
  }

  DeviceInfo device;
  status = device_info(a.device, subject, &device);
  if (status != SAMATTN_OK) return status;
  int32_t family = SAMATTN_FAMILY_AUTO;
  status = select_family(SAMATTN_OP_ATTENTION, a.dtype, device.gpu, a.family, false, &family);
  if (status != SAMATTN_OK) return status;
  const AttentionBackwardProblem problem = make_attention_backward_problem(a, device);

  DeviceGuard guard;
  const cudaError_t entered = guard.enter(a.device);
  if (entered != cudaSuccess) return launch_status(entered, subject, family, device);
  cudaGetLastError();
  cudaError_t launched = cudaSuccess;
  if (!run_attention_backward(family, problem, &launched)) return not_in_build(subject, family);
  if (launched == cudaErrorNotSupported) {
    cudaGetLastError();
    return attention_not_supported(subject, family, a.headdim, device, /*backward=*/true);
  }
  status = launch_status(launched, subject, family, device);
  if (status == SAMATTN_OK && family_used != nullptr) *family_used = family;
  return status;
}

int attention_backward_workspace_size_op(const samattn_attention_args* args, int64_t* bytes) {
  const std::string op = "samattn attention_backward_workspace_size";
  if (args == nullptr || bytes == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT, op + ": args or bytes is NULL");
  }
  *bytes = 0;
  std::string subject;
  const int status = check_attention_sizes(op, *args, /*backward=*/true, &subject);
  if (status != SAMATTN_OK) return status;
  if (args->batch == 0 || args->nheads == 0) return SAMATTN_OK;
  *bytes = attention_backward_workspace_bytes(make_attention_backward_problem(*args, {}));
  return SAMATTN_OK;
}

}  // namespace
}  // namespace samattn

using samattn::catch_all;
using samattn::fail;

SAMATTN_EXPORT int samattn_gemm(const samattn_gemm_args* args, int32_t* family_used) {
  return catch_all("samattn_gemm", [&] { return samattn::gemm_op(args, family_used); });
}

SAMATTN_EXPORT int samattn_gemm_workspace_size(const samattn_gemm_args* args, int64_t* bytes) {
  return catch_all("samattn_gemm_workspace_size",
                   [&] { return samattn::gemm_workspace_size_op(args, bytes); });
}

SAMATTN_EXPORT int samattn_gemm_plan(const samattn_gemm_args* args, int32_t cc_major,
                                     int32_t cc_minor, int32_t sm_count, int32_t* family,
                                     char* plan, int32_t plan_capacity) {
  return catch_all("samattn_gemm_plan", [&] {
    return samattn::gemm_plan_op(args, cc_major, cc_minor, sm_count, family, plan, plan_capacity);
  });
}

SAMATTN_EXPORT int samattn_softmax_forward(const samattn_softmax_args* args, int32_t* family_used) {
  return catch_all("samattn_softmax_forward",
                   [&] { return samattn::softmax(args, /*backward=*/false, family_used); });
}

SAMATTN_EXPORT int samattn_softmax_backward(const samattn_softmax_args* args,
                                            int32_t* family_used) {
  return catch_all("samattn_softmax_backward",
                   [&] { return samattn::softmax(args, /*backward=*/true, family_used); });
}

SAMATTN_EXPORT int samattn_attention_forward(const samattn_attention_args* args,
                                             int32_t* family_used) {
  return catch_all("samattn_attention_forward",
                   [&] { return samattn::attention_forward_op(args, family_used); });
}

SAMATTN_EXPORT int samattn_attention_backward(const samattn_attention_args* args,
                                              int32_t* family_used) {
  return catch_all("samattn_attention_backward",
                   [&] { return samattn::attention_backward_op(args, family_used); });
}

SAMATTN_EXPORT int samattn_attention_backward_workspace_size(const samattn_attention_args* args,
                                                             int64_t* bytes) {
  return catch_all("samattn_attention_backward_workspace_size",
                   [&] { return samattn::attention_backward_workspace_size_op(args, bytes); });
}

SAMATTN_EXPORT const char* samattn_last_error(void) {
  return samattn::last_error_message().c_str();
}

SAMATTN_EXPORT const char* samattn_version(void) { return SAMATTN_VERSION_STRING; }

SAMATTN_EXPORT int32_t samattn_abi_version(void) { return SAMATTN_ABI_VERSION; }

SAMATTN_EXPORT int32_t samattn_built_families(void) { return samattn::built_families_mask(); }

SAMATTN_EXPORT int32_t samattn_built_ops(void) { return samattn::built_ops_mask(); }

SAMATTN_EXPORT int samattn_select_family(int32_t op, int32_t dtype, int32_t cc_major,
                                         int32_t cc_minor, int32_t requested, int32_t allow_tf32,
                                         int32_t* family) {
  return catch_all("samattn_select_family", [&] {
    samattn::GpuSpec gpu;
    gpu.cc_major = cc_major;
    gpu.cc_minor = cc_minor;
    return samattn::select_family(op, dtype, gpu, requested, allow_tf32 != 0, family);
  });
}

SAMATTN_EXPORT int samattn_device_properties(int32_t device, char* name, int32_t name_capacity,
                                             int32_t* cc_major, int32_t* cc_minor,
                                             int32_t* sm_count) {
  return catch_all("samattn_device_properties", [&] {
    const std::string subject = "samattn_device_properties";
    if (name == nullptr || name_capacity < 1) {
      return fail(SAMATTN_INVALID_ARGUMENT, subject + ": name must hold at least 1 byte");
    }
    if (cc_major == nullptr || cc_minor == nullptr || sm_count == nullptr) {
      return fail(SAMATTN_INVALID_ARGUMENT, subject + ": an output pointer is NULL");
    }
    name[0] = '\0';
    if (device < 0) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  subject + ": device must be >= 0, got " + samattn::to_text(device));
    }
    samattn::DeviceInfo info;
    const int status = samattn::device_info(device, subject, &info);
    if (status != SAMATTN_OK) return status;
    const size_t length = std::min(info.gpu.name.size(), static_cast<size_t>(name_capacity - 1));
    std::memcpy(name, info.gpu.name.data(), length);
    name[length] = '\0';
    *cc_major = info.gpu.cc_major;
    *cc_minor = info.gpu.cc_minor;
    *sm_count = info.sm_count;
    return static_cast<int>(SAMATTN_OK);
  });
}

SAMATTN_EXPORT int samattn_cuda_versions(int32_t* runtime_version, int32_t* driver_version) {
  return catch_all("samattn_cuda_versions", [&] {
    if (runtime_version == nullptr || driver_version == nullptr) {
      return fail(SAMATTN_INVALID_ARGUMENT, "samattn_cuda_versions: an output pointer is NULL");
    }
    int runtime = 0, driver = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
    // Without an NVIDIA driver this reports 0 (or an error): not a failure.
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    cudaGetLastError();
    *runtime_version = runtime;
    *driver_version = driver;
    return static_cast<int>(SAMATTN_OK);
  });
}
