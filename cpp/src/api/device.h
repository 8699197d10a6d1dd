// Device facts (cached per ordinal), the device guard and the status of a
// launch: what every op's call shares around its kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "api/error.h"
#include "common/types.h"

namespace samattn {

// The GPU a selection is for. `name` is empty in the pure queries
// (samattn_select_family, the plans) and the device name when an op runs,
// so that messages can name the GPU.
struct GpuSpec {
  int cc_major = 0;
  int cc_minor = 0;
  const char* name = "";
};

struct DeviceInfo {
  GpuSpec gpu;
  int sm_count = 0;
  int max_smem_per_block = 0;  // opt-in dynamic shared memory per block, bytes
  char name[256] = {};
};

std::string cuda_error_text(cudaError_t error);

// Facts about a CUDA ordinal, queried once per device; the cached entry
// lives as long as the library (thread-safe, lock-free once cached).
int device_info(int32_t device, const Subject& subject, const DeviceInfo** info);

// Makes `device` current for the scope and restores the caller's device.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }

  // Also binds the device's primary context to this thread the first time the
  // thread launches on it: a thread that only set its device lazily (torch's
  // autograd threads do) has none yet, and driver calls (TMA descriptors)
  // then fail with CUDA_ERROR_INVALID_CONTEXT.
  cudaError_t enter(int device) {
    cudaError_t error = cudaGetDevice(&previous_);
    if (error != cudaSuccess) return error;
    thread_local uint64_t bound = 0;  // devices 0..63 bound on this thread
    const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
    if (previous_ == device && (bound & bit) != 0) return cudaSuccess;
    error = cudaSetDevice(device);
    if (error != cudaSuccess) return error;
    switched_ = previous_ != device;
    bound |= bit;
    return cudaSuccess;
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// Status of a kernel launch: the family's return value, then any error the
// runtime recorded (an invalid stream, a launch configuration error).
int launch_status(cudaError_t launched, const Subject& subject, Family family,
                  const DeviceInfo& device);

}  // namespace samattn
