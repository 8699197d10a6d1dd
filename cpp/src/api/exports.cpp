// The exported C functions of samattn/samattn.h: each runs its op so that no
// C++ exception crosses the C ABI.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "api/device.h"
#include "api/error.h"
#include "api/launch.h"
#include "api/ops.h"
#include "api/select.h"
#include "common/registry.h"
#include "samattn/samattn.h"

#ifndef SAMATTN_VERSION_STRING
#define SAMATTN_VERSION_STRING "unknown"
#endif

#define SAMATTN_EXPORT extern "C" __attribute__((visibility("default")))

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
                   [&] { return samattn::softmax_op(args, /*backward=*/false, family_used); });
}

SAMATTN_EXPORT int samattn_softmax_backward(const samattn_softmax_args* args,
                                            int32_t* family_used) {
  return catch_all("samattn_softmax_backward",
                   [&] { return samattn::softmax_op(args, /*backward=*/true, family_used); });
}

// The *_with_pointers calls: the op on a copy of `prepared` with new pointers.
// A NULL `prepared` goes to the op, which names it.
SAMATTN_EXPORT int samattn_gemm_with_pointers(const samattn_gemm_args* prepared, const void* a,
                                              const void* b, void* d, const void* bias,
                                              void* stream, void* workspace,
                                              int64_t workspace_bytes, int32_t* family_used) {
  return catch_all("samattn_gemm_with_pointers", [&] {
    if (prepared == nullptr) return samattn::gemm_op(nullptr, family_used);
    // The struct is copied at this library's size: larger callers' extra
    // bytes must be zero (unused fields), as the op would check.
    const int status =
        samattn::check_struct_size(samattn::Subject{"samattn gemm"}, prepared, "samattn_gemm_args");
    if (status != SAMATTN_OK) return status;
    samattn_gemm_args args = *prepared;
    args.struct_size = sizeof args;
    args.a = a;
    args.b = b;
    args.d = d;
    args.bias = bias;
    args.stream = stream;
    args.workspace = workspace;
    args.workspace_bytes = workspace_bytes;
    return samattn::gemm_op(&args, family_used);
  });
}

namespace {
int softmax_with_pointers(const samattn_softmax_args* prepared, bool backward, const void* x,
                          const void* dy, void* out, void* stream, int32_t* family_used) {
  if (prepared == nullptr) return samattn::softmax_op(nullptr, backward, family_used);
  const samattn::Subject subject{backward ? "samattn softmax_backward" : "samattn softmax"};
  const int status = samattn::check_struct_size(subject, prepared, "samattn_softmax_args");
  if (status != SAMATTN_OK) return status;
  samattn_softmax_args args = *prepared;  // at this library's size, as above
  args.struct_size = sizeof args;
  args.x = x;
  args.dy = dy;
  args.out = out;
  args.stream = stream;
  return samattn::softmax_op(&args, backward, family_used);
}
}  // namespace

SAMATTN_EXPORT int samattn_softmax_forward_with_pointers(const samattn_softmax_args* prepared,
                                                         const void* x, const void* dy, void* out,
                                                         void* stream, int32_t* family_used) {
  return catch_all("samattn_softmax_forward_with_pointers", [&] {
    return softmax_with_pointers(prepared, false, x, dy, out, stream, family_used);
  });
}

SAMATTN_EXPORT int samattn_softmax_backward_with_pointers(const samattn_softmax_args* prepared,
                                                          const void* x, const void* dy, void* out,
                                                          void* stream, int32_t* family_used) {
  return catch_all("samattn_softmax_backward_with_pointers", [&] {
    return softmax_with_pointers(prepared, true, x, dy, out, stream, family_used);
  });
}

SAMATTN_EXPORT int samattn_attention_forward(const samattn_attention_args* args,
                                             int32_t* family_used) {
  return catch_all("samattn_attention_forward",
                   [&] { return samattn::attention_forward_op(args, family_used); });
}

SAMATTN_EXPORT int samattn_attention_forward_workspace_size(const samattn_attention_args* args,
                                                            int64_t* bytes) {
  return catch_all("samattn_attention_forward_workspace_size",
                   [&] { return samattn::attention_forward_workspace_size_op(args, bytes); });
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

SAMATTN_EXPORT int samattn_attention_plan(const samattn_attention_args* args, int32_t backward,
                                          int32_t cc_major, int32_t cc_minor,
                                          int32_t smem_per_block, int32_t* family, char* text,
                                          int32_t text_capacity) {
  return catch_all("samattn_attention_plan", [&] {
    return samattn::attention_plan_op(args, backward, cc_major, cc_minor, smem_per_block, family,
                                      text, text_capacity);
  });
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
    const samattn::Subject subject{"samattn_device_properties"};
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
    const samattn::DeviceInfo* info = nullptr;
    const int status = samattn::device_info(device, subject, &info);
    if (status != SAMATTN_OK) return status;
    const size_t length = std::min(std::strlen(info->name), static_cast<size_t>(name_capacity - 1));
    std::memcpy(name, info->name, length);
    name[length] = '\0';
    *cc_major = info->gpu.cc_major;
    *cc_minor = info->gpu.cc_minor;
    *sm_count = info->sm_count;
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
