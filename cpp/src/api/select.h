// Family selection (docs/design.md section 2): which family runs an op group for
// a dtype on a GPU of a given compute capability. The checks that need no
// problem live here, as plain functions so that they can be tested without a
// GPU (samattn_select_family); api/launch.h adds the families' plans.
#pragma once

#include <cstdint>
#include <string>

#include "api/device.h"
#include "common/registry.h"

namespace samattn {

// Names used in messages; nullptr for an unknown code.
const char* op_name(int32_t group);
const char* dtype_name(int32_t dtype);
const char* family_code_name(int32_t family);  // "sm75"; "auto" for SAMATTN_FAMILY_AUTO

// Bytes per element of a valid dtype code.
int64_t dtype_size(int32_t dtype);

// A family request after SAMATTN_FAMILY: `family` is SAMATTN_FAMILY_AUTO or a
// family code; `from_env` when the environment made it.
struct Request {
  int32_t family = 0;
  bool from_env = false;
};

// Resolves `requested` (SAMATTN_FAMILY_AUTO: then SAMATTN_FAMILY in the
// environment is honoured) and checks everything about the choice that does
// not depend on the problem: the codes, the GPU, that the op group is built
// and, for a forced family, that it is built, runs on the GPU and has the
// dtype. On failure the thread's last error names the op, dtype, GPU,
// family and what would work. assume_complete_build: answer as a library
// with every family and op would (samattn_gemm_plan).
int resolve_request(int32_t group, int32_t dtype, const GpuSpec& gpu, int32_t requested,
                    bool allow_tf32, bool assume_complete_build, Request* request);

// Whether automatic selection may try `family` before asking its plan.
bool family_candidate(int32_t group, int32_t dtype, const GpuSpec& gpu, Family family,
                      bool allow_tf32, bool assume_complete_build);

// The failure when automatic selection found no candidate at all.
int no_family(int32_t group, int32_t dtype, const GpuSpec& gpu, bool allow_tf32);

// The failure when the plan of a forced family (or of every candidate)
// declined the problem: `reasons` holds "family sm90: why" sentences.
int declined(const Subject& subject, const GpuSpec& gpu, const Request& request,
             const std::string& reasons);

// samattn_select_family: the family automatic selection or the request
// picks, ignoring plans (they need a problem).
int select_family(int32_t group, int32_t dtype, const GpuSpec& gpu, int32_t requested,
                  bool allow_tf32, int32_t* family);

}  // namespace samattn
