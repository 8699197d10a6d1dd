// CUTLASS and CuTe build TMA descriptors with driver functions
// (cuTensorMapEncodeTiled) that they look up by name, through the runtime's
// cudaGetDriverEntryPoint, on every call: several microseconds per launch.
// This header points CUTLASS's call macro (CUTLASS_CUDA_DRIVER_WRAPPER_CALL,
// which CuTe's make_tma_copy uses too) at entry points looked up once, and
// keeps the descriptors it encodes for the next call of the same shape. The
// library still reaches the driver only through the runtime's entry-point
// query: it links no libcuda, so the wheel needs nothing but the driver.
//
// Shared by the families that use TMA: the sm90 GEMM
// (gemm/sm90/gemm_sm90_launch.cuh) and the sm90 attention forward
// (attention/sm90/flash_fwd_sm90_launch.cuh). Include it before any CUTLASS
// or CuTe header: the macro is expanded where CUTLASS's headers are parsed.
#pragma once

#ifdef CUTLASS_CUDA_DRIVER_WRAPPER_CALL
#error "common/cutlass_driver.h must be included before any CUTLASS or CuTe header"
#endif

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace samattn::cutlass_driver {

// The driver's `name` at the ABI of CUDA 12.0, or nullptr. A failed lookup
// is not cached: it is tried again on the next call.
template <class Function>
Function driver_entry_point(const char* name, std::atomic<Function>& cache) {
  Function function = cache.load(std::memory_order_acquire);
  if (function != nullptr) return function;
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t status =
      cudaGetDriverEntryPointByVersion(name, &entry, 12000, cudaEnableDefault, &found);
#else
  const cudaError_t status = cudaGetDriverEntryPoint(name, &entry, cudaEnableDefault, &found);
#endif
  if (status != cudaSuccess || found != cudaDriverEntryPointSuccess) return nullptr;
  function = reinterpret_cast<Function>(entry);
  cache.store(function, std::memory_order_release);
  return function;
}

// Every argument of cuTensorMapEncodeTiled but the tensor map and the
// address, and the current device: what a descriptor depends on besides
// where its tensor starts.
struct TiledKey {
  int device;
  CUtensorMapDataType type;
  cuuint32_t rank;
  cuuint64_t dims[5];
  cuuint64_t strides[4];
  cuuint32_t box[5];
  cuuint32_t element_strides[5];
  CUtensorMapInterleave interleave;
  CUtensorMapSwizzle swizzle;
  CUtensorMapL2promotion l2_promotion;
  CUtensorMapFloatOOBfill oob_fill;
};

// Descriptors encoded by recent calls. A call of the same signature with new
// tensors (every eager call after the first) copies its descriptor and
// points it at the new address, which takes the driver a small fraction of
// an encode; a launch builds three or four descriptors. The address obeys
// the same rules either way (16-byte aligned), so a hit returns what an
// encode would, error included.
class TiledCache {
 public:
  static constexpr int kEntries = 64;

  // Fills *map and returns true when `key` was encoded before.
  bool find(const TiledKey& key, CUtensorMap* map) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int i = 0; i < used_; ++i) {
      if (std::memcmp(&keys_[i], &key, sizeof key) == 0) {
        *map = maps_[i];
        return true;
      }
    }
    return false;
  }

  void put(const TiledKey& key, const CUtensorMap& map) {
    std::lock_guard<std::mutex> lock(mutex_);
    // Round robin: a model's layer shapes fit; a sweep over shapes only
    // replaces entries.
    const int slot = used_ < kEntries ? used_++ : (next_++ % kEntries);
    keys_[slot] = key;
    maps_[slot] = map;
  }

 private:
  std::mutex mutex_;
  int used_ = 0;
  unsigned next_ = 0;
  TiledKey keys_[kEntries];
  CUtensorMap maps_[kEntries];
};

inline CUresult encode_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
                             void* address, const cuuint64_t* dims, const cuuint64_t* strides,
                             const cuuint32_t* box, const cuuint32_t* element_strides,
                             CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                             CUtensorMapL2promotion l2_promotion,
                             CUtensorMapFloatOOBfill oob_fill) {
  static std::atomic<PFN_cuTensorMapEncodeTiled_v12000> encode_entry{nullptr};
  static std::atomic<PFN_cuTensorMapReplaceAddress_v12000> replace_entry{nullptr};
  const auto encode = driver_entry_point("cuTensorMapEncodeTiled", encode_entry);
  if (encode == nullptr) return CUDA_ERROR_NOT_FOUND;
  const auto replace = driver_entry_point("cuTensorMapReplaceAddress", replace_entry);
  const auto uncached = [&] {
    return encode(map, type, rank, address, dims, strides, box, element_strides, interleave,
                  swizzle, l2_promotion, oob_fill);
  };
  if (replace == nullptr || rank < 1 || rank > 5) return uncached();

  TiledKey key;
  std::memset(&key, 0, sizeof key);  // padding too: keys compare as bytes
  if (cudaGetDevice(&key.device) != cudaSuccess) {
    cudaGetLastError();
    return uncached();
  }
  key.type = type;
  key.rank = rank;
  for (cuuint32_t i = 0; i < rank; ++i) {
    key.dims[i] = dims[i];
    key.box[i] = box[i];
    key.element_strides[i] = element_strides[i];
    if (i + 1 < rank) key.strides[i] = strides[i];
  }
  key.interleave = interleave;
  key.swizzle = swizzle;
  key.l2_promotion = l2_promotion;
  key.oob_fill = oob_fill;

  static TiledCache cache;
  CUtensorMap cached;
  if (cache.find(key, &cached)) {
    const CUresult replaced = replace(&cached, address);
    if (replaced == CUDA_SUCCESS) *map = cached;
    return replaced;
  }
  const CUresult encoded = uncached();
  if (encoded == CUDA_SUCCESS) cache.put(key, *map);
  return encoded;
}

// What CUTLASS_CUDA_DRIVER_WRAPPER_CALL(func) names below: one per driver
// function that the CUTLASS and CuTe headers of the sm90 GEMM and attention
// call (a header calling another one fails to compile, naming it).
template <class... Args>
CUresult cached_cuTensorMapEncodeTiled(Args... args) {
  return encode_tiled(args...);
}

}  // namespace samattn::cutlass_driver

#include <cutlass/cuda_host_adapter.hpp>

#undef CUTLASS_CUDA_DRIVER_WRAPPER_CALL
#define CUTLASS_CUDA_DRIVER_WRAPPER_CALL(func) ::samattn::cutlass_driver::cached_##func
