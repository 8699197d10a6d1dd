// The C ABI of libsamattn (samattn/samattn.h): argument validation, device
// facts, family selection and the call into the chosen kernel family.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "api/error.h"
#include "api/family.h"
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
