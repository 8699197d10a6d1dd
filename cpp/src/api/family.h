// Kernel family selection (DESIGN.md section 2): which family runs an op for
// a dtype on a GPU of a given compute capability, as a pure function so that
// it can be tested without a GPU.
#pragma once

#include <cstdint>
#include <string>

namespace samattn {

// The GPU a selection is for. `name` is empty in the pure query
// (samattn_select_family) and the device name when an op runs, so that
// messages can name the GPU.
struct GpuSpec {
  int cc_major = 0;
  int cc_minor = 0;
  std::string name;
};

// Names used in messages; nullptr for an unknown code.
const char* op_name(int32_t op);
const char* dtype_name(int32_t dtype);
const char* family_name(int32_t family);  // "sm75"; "auto" for SAMATTN_FAMILY_AUTO

// Bytes per element of a valid dtype code.
int64_t dtype_size(int32_t dtype);

// What this library was compiled with (samattn_built_families / _ops).
int32_t built_families_mask();
int32_t built_ops_mask();

// Picks the family that runs `op` on `dtype` for `gpu`. `requested` is
// SAMATTN_FAMILY_AUTO (then SAMATTN_FAMILY in the environment is honoured)
// or a forced family. Returns a SAMATTN_* status; on failure the thread's
// last error names the op, dtype, GPU, family and what would work.
// assume_complete_build: answer as a library with every family and op would
// (samattn_gemm_plan, so that the plan can be tested on any build).
int select_family(int32_t op, int32_t dtype, const GpuSpec& gpu, int32_t requested, bool allow_tf32,
                  int32_t* family, bool assume_complete_build = false);

}  // namespace samattn
