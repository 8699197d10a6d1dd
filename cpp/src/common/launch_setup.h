// Launch setup that must happen once per (kernel, device), not once per call:
// the dynamic shared memory opt-in, clusters of a non-portable size, and the
// device's opt-in limit. Each is a
// driver call, and an eager call has little more host time to spend than the
// launch itself (docs/design.md section 1).
//
// The caches are keyed by the current device (cudaGetDevice: thread-local,
// cheap). They assume that a device's primary context lives as long as the
// process, as torch does: after a cudaDeviceReset the attribute is gone but
// still cached. Devices with ordinals >= kCachedDevices are configured on every
// call.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>

namespace samattn {

constexpr int kCachedDevices = 64;
// Dynamic shared memory a kernel may take without an opt-in.
constexpr int kDefaultDynamicSmem = 48 * 1024;

namespace detail {

// One value per device ordinal; 0 means "not known yet". Static instances are
// zero-initialized before any code runs, so they need no guard.
struct PerDevice {
  std::atomic<int> value[kCachedDevices];
};

// The slow path: setting an attribute and recording it happen together, so a
// recorded value is never larger than what the driver holds (two threads
// raising the same kernel to different sizes cannot undo each other).
inline std::mutex& launch_setup_mutex() {
  static std::mutex mutex;
  return mutex;
}

inline cudaError_t raise_attribute(const void* kernel, cudaFuncAttribute attribute, int value,
                                   PerDevice& allowed) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  if (device < 0 || device >= kCachedDevices) {
    return cudaFuncSetAttribute(kernel, attribute, value);
  }
  std::atomic<int>& slot = allowed.value[device];
  if (slot.load(std::memory_order_acquire) >= value) return cudaSuccess;
  std::lock_guard<std::mutex> lock(launch_setup_mutex());
  if (slot.load(std::memory_order_relaxed) >= value) return cudaSuccess;
  status = cudaFuncSetAttribute(kernel, attribute, value);
  if (status == cudaSuccess) slot.store(value, std::memory_order_release);
  return status;
}

}  // namespace detail

// Lets the kernel `Kernel` (a __global__ function, named as a template
// argument so that each kernel has its own cache) launch with `bytes` of
// dynamic shared memory on the current device. Sets the attribute the first
// time a device needs it (or needs more than before), then only reads a
// cached value.
template <auto Kernel>
cudaError_t allow_dynamic_smem(int bytes) {
  if (bytes <= kDefaultDynamicSmem) return cudaSuccess;
  static detail::PerDevice allowed;
  return detail::raise_attribute(reinterpret_cast<const void*>(Kernel),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, bytes, allowed);
}

// Lets `Kernel` launch in clusters of more than 8 CTAs (a non-portable size,
// up to 16 on Hopper) on the current device; set once per device.
template <auto Kernel>
cudaError_t allow_nonportable_cluster() {
  static detail::PerDevice allowed;
  return detail::raise_attribute(reinterpret_cast<const void*>(Kernel),
                                 cudaFuncAttributeNonPortableClusterSizeAllowed, 1, allowed);
}

#ifdef __CUDACC__
// Kernel<<<grid, threads, smem, stream>>>(params), its dynamic shared memory
// allowed first (allow_dynamic_smem).
template <auto Kernel, class Params>
cudaError_t launch_with_smem(Params const& params, dim3 grid, int threads, int smem,
                             cudaStream_t stream) {
  const cudaError_t allowed = allow_dynamic_smem<Kernel>(smem);
  if (allowed != cudaSuccess) return allowed;
  Kernel<<<grid, threads, smem, stream>>>(params);
  return cudaGetLastError();
}
#endif

// cudaDevAttrMaxSharedMemoryPerBlockOptin of the current device, queried once
// per device.
inline cudaError_t device_smem_optin(int* bytes) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  static detail::PerDevice cache;
  std::atomic<int>* slot = device >= 0 && device < kCachedDevices ? &cache.value[device] : nullptr;
  if (slot != nullptr) {
    *bytes = slot->load(std::memory_order_relaxed);
    if (*bytes > 0) return cudaSuccess;
  }
  status = cudaDeviceGetAttribute(bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (status == cudaSuccess && slot != nullptr) slot->store(*bytes, std::memory_order_relaxed);
  return status;
}

}  // namespace samattn
