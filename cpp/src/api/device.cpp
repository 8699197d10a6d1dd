#include "api/device.h"

#include <atomic>
#include <cstring>
#include <mutex>

#include "samattn/samattn.h"

namespace samattn {
namespace {

// Ordinals with a cache slot; a larger one is queried on every call.
constexpr int kCachedDevices = 64;

}  // namespace

std::string cuda_error_text(cudaError_t error) {
  return std::string(cudaGetErrorName(error)) + " (" + cudaGetErrorString(error) + ")";
}

int device_info(int32_t device, const Subject& subject, const DeviceInfo** info) {
  static std::atomic<const DeviceInfo*> cache[kCachedDevices] = {};
  static std::mutex mutex;
  if (device >= 0 && device < kCachedDevices) {
    *info = cache[device].load(std::memory_order_acquire);
    if (*info != nullptr) return SAMATTN_OK;
  }
  std::lock_guard<std::mutex> lock(mutex);
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
  // Never freed: callers hold the pointer for the library's lifetime.
  auto* fresh = new DeviceInfo;
  std::strncpy(fresh->name, properties.name, sizeof fresh->name - 1);
  fresh->gpu.cc_major = properties.major;
  fresh->gpu.cc_minor = properties.minor;
  fresh->gpu.name = fresh->name;
  fresh->sm_count = properties.multiProcessorCount;
  fresh->max_smem_per_block = static_cast<int>(properties.sharedMemPerBlockOptin);
  if (device < kCachedDevices) {
    const DeviceInfo* expected = nullptr;
    if (!cache[device].compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) {
      delete fresh;
      fresh = const_cast<DeviceInfo*>(expected);
    }
  }
  *info = fresh;
  return SAMATTN_OK;
}

int launch_status(cudaError_t launched, const Subject& subject, Family family,
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

}  // namespace samattn
