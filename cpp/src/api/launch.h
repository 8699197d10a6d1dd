// The one call skeleton every op shares: (args checked by the op) -> device
// facts -> family from the registry -> workspace -> device guard -> launch ->
// status.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "api/device.h"
#include "api/error.h"
#include "api/select.h"
#include "common/registry.h"
#include "samattn/samattn.h"

namespace samattn {

// Picks the family that runs `problem`. A forced family (args or
// SAMATTN_FAMILY) whose plan declines is an error with its reason, unless
// its registration names a forced_fallback that accepts; automatic
// selection walks the registered families newest first and takes the first
// that runs on the GPU, has the dtype and whose plan accepts, so a decline
// falls through to the next family. No allocation unless it fails.
template <Op kOp>
int choose_kernels(const Subject& subject, int32_t dtype, const GpuSpec& gpu, int32_t requested,
                   bool allow_tf32, const ProblemOf<kOp>& problem, const Kernels<kOp>** chosen) {
  constexpr int32_t group = op_group(kOp);
  Request request;
  const int status = resolve_request(group, dtype, gpu, requested, allow_tf32, false, &request);
  if (status != SAMATTN_OK) return status;
  if (request.family != SAMATTN_FAMILY_AUTO) {
    const Kernels<kOp>* kernels = registered_kernels<kOp>(static_cast<Family>(request.family));
    if (kernels == nullptr) return declined(subject, gpu, request, "no such kernels in this build");
    if (kernels->plan != nullptr && !kernels->plan(problem, nullptr)) {
      const Kernels<kOp>* fallback =
          kernels->forced_fallback == 0
              ? nullptr
              : registered_kernels<kOp>(static_cast<Family>(kernels->forced_fallback));
      if (fallback != nullptr &&
          family_candidate(group, dtype, gpu, fallback->family, allow_tf32, false) &&
          (fallback->plan == nullptr || fallback->plan(problem, nullptr))) {
        *chosen = fallback;
        return SAMATTN_OK;
      }
      std::string why;
      kernels->plan(problem, &why);
      if (fallback != nullptr && fallback->plan != nullptr) {
        // Say why the fallback declined too (e.g. a head dim left out of the
        // build), not only the forced family's reason for handing over.
        std::string fallback_why;
        fallback->plan(problem, &fallback_why);
        why += "; family " + std::string(family_name(fallback->family)) +
               ", which runs what it hands over: " + fallback_why;
      }
      return declined(subject, gpu, request, why);
    }
    *chosen = kernels;
    return SAMATTN_OK;
  }
  bool any = false;
  for (Family family : kFamiliesNewestFirst) {
    if (!family_candidate(group, dtype, gpu, family, allow_tf32, false)) continue;
    const Kernels<kOp>* kernels = registered_kernels<kOp>(family);
    if (kernels == nullptr) continue;
    any = true;
    if (kernels->plan == nullptr || kernels->plan(problem, nullptr)) {
      *chosen = kernels;
      return SAMATTN_OK;
    }
  }
  if (!any) return no_family(group, dtype, gpu, allow_tf32);
  std::string reasons;
  for (Family family : kFamiliesNewestFirst) {
    if (!family_candidate(group, dtype, gpu, family, allow_tf32, false)) continue;
    const Kernels<kOp>* kernels = registered_kernels<kOp>(family);
    if (kernels == nullptr) continue;
    std::string why;
    kernels->plan(problem, &why);
    reasons +=
        (reasons.empty() ? "family " : "; family ") + std::string(family_name(family)) + ": " + why;
  }
  return declined(subject, gpu, request, reasons);
}

// The most workspace any registered family needs for `problem`: what a
// caller allocates before the family is known (the query needs no GPU).
template <Op kOp>
int64_t registered_workspace_bytes(const ProblemOf<kOp>& problem) {
  int64_t bytes = 0;
  for (Family family : kFamiliesNewestFirst) {
    const Kernels<kOp>* kernels = registered_kernels<kOp>(family);
    if (kernels != nullptr && kernels->workspace_bytes != nullptr) {
      bytes = std::max(bytes, static_cast<int64_t>(kernels->workspace_bytes(problem)));
    }
  }
  return bytes;
}

// The workspace of the family a call of `problem` would run (selection as
// choose_kernels makes it); where none would, the most of any family, so
// that the call's own error says why.
template <Op kOp>
int64_t chosen_workspace_bytes(const Subject& subject, int32_t dtype, const GpuSpec& gpu,
                               int32_t requested, const ProblemOf<kOp>& problem) {
  const Kernels<kOp>* kernels = nullptr;
  if (choose_kernels<kOp>(subject, dtype, gpu, requested, false, problem, &kernels) != SAMATTN_OK) {
    return registered_workspace_bytes<kOp>(problem);
  }
  return kernels->workspace_bytes != nullptr
             ? static_cast<int64_t>(kernels->workspace_bytes(problem))
             : 0;
}

// What the skeleton needs to know of a call besides its problem.
struct OpCall {
  Subject subject;
  int32_t dtype;
  int32_t family;  // requested
  int32_t device;
  bool allow_tf32;
  const void* workspace;
  int64_t workspace_bytes;
  const char* workspace_query;  // the function that tells the size, for messages
};

// Runs one call whose arguments the op has checked: `make_problem(device)`
// fills the op's parameters once, with the device's facts.
template <Op kOp, class MakeProblem>
int run_op(const OpCall& call, MakeProblem&& make_problem, int32_t* family_used) {
  const DeviceInfo* device = nullptr;
  int status = device_info(call.device, call.subject, &device);
  if (status != SAMATTN_OK) return status;
  const ProblemOf<kOp> problem = make_problem(*device);
  const Kernels<kOp>* kernels = nullptr;
  status = choose_kernels<kOp>(call.subject, call.dtype, device->gpu, call.family, call.allow_tf32,
                               problem, &kernels);
  if (status != SAMATTN_OK) return status;
  if (kernels->workspace_bytes != nullptr) {
    const int64_t needed = static_cast<int64_t>(kernels->workspace_bytes(problem));
    if (needed > 0 && (call.workspace == nullptr || call.workspace_bytes < needed)) {
      return fail(SAMATTN_NEEDS_WORKSPACE,
                  call.subject + ": needs " + to_text(needed) + " bytes of workspace, got " +
                      to_text(call.workspace == nullptr ? 0 : call.workspace_bytes) + " (ask " +
                      call.workspace_query + ")");
    }
  }

  DeviceGuard guard;
  const cudaError_t entered = guard.enter(call.device);
  if (entered != cudaSuccess) return launch_status(entered, call.subject, kernels->family, *device);
  cudaGetLastError();  // start clean: only this launch's errors count
  const cudaError_t launched = kernels->launch(problem);
  status = launch_status(launched, call.subject, kernels->family, *device);
  if (status == SAMATTN_OK && family_used != nullptr) {
    *family_used = static_cast<int32_t>(kernels->family);
  }
  return status;
}

// Checks args->struct_size (the first field of every argument struct): at
// least this library's size; larger only when the bytes this library does
// not know are zero (fields of a newer header, left unused).
template <class Args>
int check_struct_size(const Subject& subject, const Args* args, const char* struct_name) {
  const int64_t size = args->struct_size;
  constexpr int64_t kKnown = static_cast<int64_t>(sizeof(Args));
  if (size == kKnown) return SAMATTN_OK;
  if (size < kKnown) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": args->struct_size is " + to_text(size) + ", but " + struct_name +
                    " is " + to_text(kKnown) + " bytes in C ABI " + to_text(SAMATTN_ABI_VERSION) +
                    " (this library): the caller was built for an older ABI (< " +
                    to_text(SAMATTN_ABI_VERSION) +
                    ", without struct_size) or did not set struct_size = sizeof(" + struct_name +
                    "); rebuild it against this samattn.h");
  }
  // A newer header adds a few fields; anything far larger is not a size (an
  // ABI 3 caller's dtype and family read as one int64).
  constexpr int64_t kMaxGrowth = 4096;
  if (size > kKnown + kMaxGrowth) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject + ": args->struct_size is " + to_text(size) +
                                              ", not a size of " + struct_name +
                                              ": the caller was built for an older C ABI (< " +
                                              to_text(SAMATTN_ABI_VERSION) +
                                              ", without struct_size); rebuild it against "
                                              "this samattn.h");
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(args);
  for (int64_t offset = kKnown; offset < size; ++offset) {
    if (bytes[offset] != 0) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  subject + ": args->struct_size is " + to_text(size) + " bytes and byte " +
                      to_text(offset) + " (a field after the " + to_text(kKnown) + " bytes of " +
                      struct_name + " in C ABI " + to_text(SAMATTN_ABI_VERSION) +
                      ") is set: the caller uses a field of a newer samattn.h that this library "
                      "does not have; update libsamattn or leave the field zero");
    }
  }
  return SAMATTN_OK;
}

}  // namespace samattn
