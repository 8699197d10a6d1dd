// samattn_gemm and its queries: argument checks and the GEMM's problem.
#include <climits>
#include <cmath>
#include <cstdio>
#include <string>

#include "api/launch.h"
#include "api/ops.h"
#include "api/validate.h"
#include "common/problem.h"
#include "gemm/epilogue.h"
#include "gemm/group.h"
#include "gemm/sm90/gemm_sm90_plan.h"
#include "gemm/sm90/grouped_sm90_plan.h"
#include "gemm/sm90/split_sm90_plan.h"
#include "gemm/split_k.h"

namespace samattn {
namespace {

// The grouping fields (gemm/group.h); the ends themselves live on the
// device, where the kernels clamp them. (SAMATTN_GROUP_LIST: check_list_args.)
int check_group_args(const Subject& subject, const samattn_gemm_args& g) {
  if (g.group_reserved != 0) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": group_reserved must be 0, got " + to_text(g.group_reserved));
  }
  if (g.group_mode < SAMATTN_GROUP_NONE || g.group_mode > SAMATTN_GROUP_K) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": unknown group_mode " + to_text(g.group_mode) +
                    " (expected SAMATTN_GROUP_NONE = 0, _ROWS = 1, _K = 2 or _LIST = 3)");
  }
  if (g.group_list != nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": group_list is set but group_mode is not SAMATTN_GROUP_LIST");
  }
  if (g.group_mode == SAMATTN_GROUP_NONE) {
    if (g.group_offsets != nullptr) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  subject + ": group_offsets is set but group_mode is SAMATTN_GROUP_NONE");
    }
    return SAMATTN_OK;
  }
  if (g.group_offsets == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject + ": a grouped GEMM needs group_offsets");
  }
  if (!aligned(g.group_offsets, 4)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": group_offsets is not aligned to its 4-byte elements");
  }
  if (g.batch < 1 || g.batch > gemm::group::kMaxGroups) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject + ": a grouped GEMM has 1.." +
                                              to_text(gemm::group::kMaxGroups) +
                                              " groups (batch), got " + to_text(g.batch));
  }
  if (g.split_k > 1) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": a grouped GEMM does not split K (split_k must be 0 or 1)");
  }
  const bool rows = g.group_mode == SAMATTN_GROUP_ROWS;
  const bool shared_ok = rows ? g.a_batch_stride == 0 && g.d_batch_stride == 0 &&
                                    (g.beta == 0.0f || g.c_batch_stride == 0)
                              : g.a_batch_stride == 0 && g.b_batch_stride == 0;
  if (!shared_ok) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + (rows ? ": SAMATTN_GROUP_ROWS shares a, c and d between the groups "
                                  "(their batch strides must be 0)"
                                : ": SAMATTN_GROUP_K shares a and b between the groups (their "
                                  "batch strides must be 0)"));
  }
  if (g.m > INT32_MAX || g.n > INT32_MAX || g.k > INT32_MAX) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": a grouped GEMM's m, n and k must be below 2^31");
  }
  return SAMATTN_OK;
}

// One GEMM of a list: D (m, n) written, A and B read when k > 0.
int check_list_entry(const Subject& subject, const samattn_gemm_list_entry& e, int64_t index,
                     int32_t dtype) {
  const std::string which = subject + ": group_list[" + to_text(index) + "]";
  if (e.m < 0 || e.n < 0 || e.k < 0 || e.m > INT32_MAX || e.n > INT32_MAX || e.k > INT32_MAX) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                which + ": sizes must be in [0, 2^31), got m=" + to_text(e.m) +
                    " n=" + to_text(e.n) + " k=" + to_text(e.k));
  }
  if (any_negative(e.a_row_stride, e.a_col_stride, e.b_row_stride) ||
      any_negative(e.b_col_stride, e.d_row_stride, e.d_col_stride)) {
    return fail(SAMATTN_INVALID_ARGUMENT, which + ": strides must be >= 0");
  }
  if (e.m == 0 || e.n == 0) return SAMATTN_OK;  // nothing to write
  const int64_t element = dtype_size(dtype);
  const struct {
    const char* name;
    const void* ptr;
    int64_t rows, cols, row, col;
    bool used;
  } operands[] = {{"a", e.a, e.m, e.k, e.a_row_stride, e.a_col_stride, e.k > 0},
                  {"b", e.b, e.k, e.n, e.b_row_stride, e.b_col_stride, e.k > 0},
                  {"d", e.d, e.m, e.n, e.d_row_stride, e.d_col_stride, true}};
  for (const auto& o : operands) {
    if (!o.used) continue;
    if (o.ptr == nullptr) return fail(SAMATTN_INVALID_ARGUMENT, which + ": " + o.name + " is NULL");
    if (!aligned(o.ptr, static_cast<uintptr_t>(element))) {
      return fail(SAMATTN_INVALID_ARGUMENT, which + ": " + o.name + " is not aligned to its " +
                                                to_text(element) + "-byte elements");
    }
    if (!fits_in_int64(1, o.rows, o.cols, 0, o.row, o.col, element)) {
      return fail(SAMATTN_INVALID_ARGUMENT,
                  which + ": " + o.name + "'s sizes and strides overflow a 64-bit byte offset");
    }
  }
  if ((e.m > 1 && e.d_row_stride == 0) || (e.n > 1 && e.d_col_stride == 0)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                which + ": d's strides make its elements overlap (a stride of 0 on a size > 1)");
  }
  return SAMATTN_OK;
}

// SAMATTN_GROUP_LIST: the GEMMs come from the host array group_list, so the
// fields that describe one GEMM must be unset. `empty`: no GEMM writes
// anything.
int check_list_args(const Subject& subject, const samattn_gemm_args& g, bool* empty) {
  if (g.group_reserved != 0) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": group_reserved must be 0, got " + to_text(g.group_reserved));
  }
  if (g.dtype != SAMATTN_F16 && g.dtype != SAMATTN_BF16) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject + ": a GEMM list takes float16 or bfloat16");
  }
  if (g.group_list == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject + ": SAMATTN_GROUP_LIST needs group_list");
  }
  if (g.batch < 1 || g.batch > gemm::group::kMaxGroups) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject + ": a GEMM list has 1.." +
                                              to_text(gemm::group::kMaxGroups) +
                                              " GEMMs (batch), got " + to_text(g.batch));
  }
  const bool unset = g.m == 0 && g.n == 0 && g.k == 0 && g.a == nullptr && g.b == nullptr &&
                     g.c == nullptr && g.d == nullptr && g.a_batch_stride == 0 &&
                     g.a_row_stride == 0 && g.a_col_stride == 0 && g.b_batch_stride == 0 &&
                     g.b_row_stride == 0 && g.b_col_stride == 0 && g.c_batch_stride == 0 &&
                     g.c_row_stride == 0 && g.c_col_stride == 0 && g.d_batch_stride == 0 &&
                     g.d_row_stride == 0 && g.d_col_stride == 0 && g.beta == 0.0f &&
                     g.bias == nullptr && g.activation == 0 && g.output_fp32 == 0 &&
                     g.split_k == 0 && g.split_k_mode == 0 && g.group_offsets == nullptr;
  if (!unset) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject +
                    ": SAMATTN_GROUP_LIST takes its GEMMs from group_list: m, n, k, the "
                    "operands and their strides, beta, bias, activation, output_fp32, "
                    "split_k, split_k_mode and group_offsets must be 0");
  }
  if (g.workspace_bytes < 0) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": workspace_bytes must be >= 0, got " + to_text(g.workspace_bytes));
  }
  *empty = true;
  for (int64_t i = 0; i < g.batch; ++i) {
    const samattn_gemm_list_entry& e = g.group_list[i];
    const int status = check_list_entry(subject, e, i, g.dtype);
    if (status != SAMATTN_OK) return status;
    *empty = *empty && (e.m == 0 || e.n == 0);
  }
  return SAMATTN_OK;
}

// Checks a GEMM's arguments (no device access). `empty`: D has no elements,
// so there is nothing to compute.
int check_gemm_args(Subject* subject, const samattn_gemm_args& g, bool* empty) {
  *empty = false;
  int status = check_struct_size(*subject, &g, "samattn_gemm_args");
  if (status != SAMATTN_OK) return status;
  status = check_codes(subject, g.dtype, g.family, g.device);
  if (status != SAMATTN_OK) return status;
  const Subject& subject_text = *subject;
  if (!std::isfinite(g.alpha)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject_text + ": alpha must be finite, got " + float_to_text(g.alpha));
  }
  if (g.group_mode == SAMATTN_GROUP_LIST) return check_list_args(subject_text, g, empty);
  if (g.batch < 0 || g.m < 0 || g.n < 0 || g.k < 0) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject_text + ": sizes must be >= 0, got batch=" + to_text(g.batch) +
                    " m=" + to_text(g.m) + " n=" + to_text(g.n) + " k=" + to_text(g.k));
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
  if (g.activation < 0 || g.activation >= gemm::kActivationCount) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject_text + ": unknown activation code " + to_text(g.activation) +
                    " (expected SAMATTN_ACTIVATION_NONE = 0, _RELU = 1, _GELU = 2, "
                    "_GELU_TANH = 3 or _SILU = 4)");
  }
  if (g.output_fp32 != 0 && g.output_fp32 != 1) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject_text + ": output_fp32 must be 0 or 1, got " + to_text(g.output_fp32));
  }
  if (g.split_k < 0 || g.split_k > gemm::kMaxSplitK) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject_text + ": split_k must be 0 (automatic) or 1.." +
                                              to_text(gemm::kMaxSplitK) + ", got " +
                                              to_text(g.split_k));
  }
  if (g.split_k_mode < SAMATTN_SPLIT_K_AUTO || g.split_k_mode > SAMATTN_SPLIT_K_PARALLEL) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject_text + ": unknown split_k_mode " + to_text(g.split_k_mode) +
                    " (expected SAMATTN_SPLIT_K_AUTO = 0, _SERIAL = 1 or _PARALLEL = 2)");
  }
  status = check_group_args(subject_text, g);
  if (status != SAMATTN_OK) return status;
  *empty = g.batch == 0 || g.m == 0 || g.n == 0;
  if (*empty) return SAMATTN_OK;  // D is empty: nothing to check or compute

  if (g.d == nullptr) return fail(SAMATTN_INVALID_ARGUMENT, subject_text + ": d is NULL");
  if (g.k > 0 && g.a == nullptr)
    return fail(SAMATTN_INVALID_ARGUMENT, subject_text + ": a is NULL");
  if (g.k > 0 && g.b == nullptr)
    return fail(SAMATTN_INVALID_ARGUMENT, subject_text + ": b is NULL");
  // Rows-grouped GEMMs share D between the groups, each writing its own rows.
  const bool d_shared = g.group_mode == SAMATTN_GROUP_ROWS;
  if ((g.batch > 1 && g.d_batch_stride == 0 && !d_shared) || (g.m > 1 && g.d_row_stride == 0) ||
      (g.n > 1 && g.d_col_stride == 0)) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject_text + ": d strides " +
                    strides_text(g.d_batch_stride, g.d_row_stride, g.d_col_stride) +
                    " make elements of d overlap (a stride of 0 on a size > 1)");
  }
  const int64_t element = dtype_size(g.dtype);
  if (g.bias != nullptr && !aligned(g.bias, static_cast<uintptr_t>(element))) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject_text + ": bias is not aligned to its " +
                                              to_text(element) + "-byte elements");
  }
  const int64_t output_element = g.output_fp32 != 0 ? 4 : element;
  const bool with_c = g.beta != 0.0f;
  if ((g.k > 0 && (!fits_in_int64(g.batch, g.m, g.k, g.a_batch_stride, g.a_row_stride,
                                  g.a_col_stride, element) ||
                   !fits_in_int64(g.batch, g.k, g.n, g.b_batch_stride, g.b_row_stride,
                                  g.b_col_stride, element))) ||
      (with_c && !fits_in_int64(g.batch, g.m, g.n, g.c_batch_stride, g.c_row_stride, g.c_col_stride,
                                output_element)) ||
      !fits_in_int64(g.batch, g.m, g.n, g.d_batch_stride, g.d_row_stride, g.d_col_stride,
                     output_element)) {
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
  problem.bias = g.bias;
  problem.activation = g.activation;
  problem.out_f32 = g.output_fp32 != 0 && problem.dtype != DType::f32;
  problem.allow_tf32 = g.allow_tf32 != 0;
  problem.split_k = g.split_k;
  problem.split_k_mode = g.split_k_mode;
  problem.group_offsets = g.group_offsets;
  problem.group_mode = g.group_mode;
  problem.group_list = g.group_list;
  problem.sm_count = sm_count;
  problem.stream = static_cast<cudaStream_t>(g.stream);
  problem.workspace = g.workspace;
  problem.workspace_bytes = g.workspace_bytes;
  gemm::sm90::read_tuning_overrides(&problem);
  return problem;
}

// The family that samattn_gemm_plan reports: selection as in a library built
// with every family, from the plans as host code (built whatever the
// families): sm90's (plain or grouped), and the split-K and grouping parts of
// sm80's and sm75's. `plan` gets the sm90 configuration (for a grouped GEMM
// only its eligibility), or why sm90 declined; what it declines runs on
// sm80, forced or not (the forced_fallback gemm_sm90.cu registers).
int plan_complete_build(const Subject& subject, const samattn_gemm_args& g, const GpuSpec& gpu,
                        const GemmProblem& problem, int32_t* family, gemm::sm90::Plan* plan) {
  Request request;
  const bool tf32 = g.allow_tf32 != 0;
  const int status = resolve_request(SAMATTN_OP_GEMM, g.dtype, gpu, g.family, tf32,
                                     /*assume_complete_build=*/true, &request);
  if (status != SAMATTN_OK) return status;
  int32_t forced = request.family;
  std::string declines;  // the sm80 / sm75 reasons, for an automatic choice that finds none
  for (Family candidate : kFamiliesNewestFirst) {
    if (forced != SAMATTN_FAMILY_AUTO
            ? static_cast<int32_t>(candidate) != forced
            : !family_candidate(SAMATTN_OP_GEMM, g.dtype, gpu, candidate, tf32, true)) {
      continue;
    }
    if (candidate == Family::sm90) {
      if (problem.group_mode != SAMATTN_GROUP_NONE) {
        gemm::sm90::GroupedPlan grouped = gemm::sm90::plan_grouped(problem);
        plan->eligible = grouped.eligible;
        plan->reason = std::move(grouped.reason);
      } else if (gemm::sm90::ParallelSplitPlan split = gemm::sm90::parallel_split(problem);
                 split.applies) {
        *plan = std::move(split.inner_plan);
        plan->splits = split.splits;
        plan->eligible = split.eligible;
        if (!split.eligible) plan->reason = "parallel split-K: " + split.reason;
      } else {
        *plan = gemm::sm90::plan(problem);
      }
      if (!plan->eligible) {
        if (forced != SAMATTN_FAMILY_AUTO) forced = SAMATTN_FAMILY_SM80;
        continue;
      }
    } else {
      std::string why;
      if (!gemm::plan_tensor_core_modes(candidate, problem, &why)) {
        if (forced != SAMATTN_FAMILY_AUTO) {
          return fail(SAMATTN_UNSUPPORTED,
                      subject + ": family " + family_name(candidate) + " cannot run it: " + why);
        }
        declines += (declines.empty() ? "family " : "; family ") +
                    std::string(family_name(candidate)) + ": " + why;
        continue;
      }
    }
    *family = static_cast<int32_t>(candidate);
    return SAMATTN_OK;
  }
  if (!declines.empty()) {
    return fail(SAMATTN_UNSUPPORTED, subject + ": no family runs this problem: " + declines);
  }
  return no_family(SAMATTN_OP_GEMM, g.dtype, gpu, tf32);
}

OpCall gemm_call(const Subject& subject, const samattn_gemm_args& g) {
  return {subject,           g.dtype,     g.family,          g.device,
          g.allow_tf32 != 0, g.workspace, g.workspace_bytes, "samattn_gemm_workspace_size"};
}

}  // namespace

int gemm_op(const samattn_gemm_args* args, int32_t* family_used) {
  Subject subject{"samattn gemm"};
  if (family_used != nullptr) *family_used = SAMATTN_FAMILY_AUTO;
  if (args == nullptr) return fail(SAMATTN_INVALID_ARGUMENT, subject + ": args is NULL");
  const samattn_gemm_args& g = *args;
  bool empty = false;
  const int status = check_gemm_args(&subject, g, &empty);
  if (status != SAMATTN_OK || empty) return status;
  return run_op<Op::gemm>(
      gemm_call(subject, g),
      [&](const DeviceInfo& device) { return make_gemm_problem(g, device.sm_count); }, family_used);
}

int gemm_workspace_size_op(const samattn_gemm_args* args, int64_t* bytes) {
  Subject subject{"samattn gemm_workspace_size"};
  if (args == nullptr || bytes == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT, subject + ": args or bytes is NULL");
  }
  *bytes = 0;
  bool empty = false;
  int status = check_gemm_args(&subject, *args, &empty);
  if (status != SAMATTN_OK || empty) return status;
  const DeviceInfo* device = nullptr;
  status = device_info(args->device, subject, &device);
  if (status != SAMATTN_OK) return status;
  const GemmProblem problem = make_gemm_problem(*args, device->sm_count);
  const Kernels<Op::gemm>* kernels = nullptr;
  status = choose_kernels<Op::gemm>(subject, args->dtype, device->gpu, args->family,
                                    args->allow_tf32 != 0, problem, &kernels);
  if (status != SAMATTN_OK) return status;
  if (kernels->workspace_bytes != nullptr) {
    *bytes = static_cast<int64_t>(kernels->workspace_bytes(problem));
  }
  return SAMATTN_OK;
}

int gemm_plan_op(const samattn_gemm_args* args, int32_t cc_major, int32_t cc_minor,
                 int32_t sm_count, int32_t* family, char* text, int32_t capacity) {
  Subject subject{"samattn gemm_plan"};
  if (args == nullptr || family == nullptr || text == nullptr || capacity < 1) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": args, family and plan must be non-NULL, plan_capacity >= 1");
  }
  if (sm_count < 1) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                subject + ": sm_count must be >= 1, got " + to_text(sm_count));
  }
  *family = SAMATTN_FAMILY_AUTO;
  text[0] = '\0';
  bool empty = false;
  int status = check_gemm_args(&subject, *args, &empty);
  if (status != SAMATTN_OK) return status;
  GpuSpec gpu;
  gpu.cc_major = cc_major;
  gpu.cc_minor = cc_minor;
  const GemmProblem problem = make_gemm_problem(*args, sm_count);
  gemm::sm90::Plan plan;
  status = plan_complete_build(subject, *args, gpu, problem, family, &plan);
  if (status != SAMATTN_OK) return status;
  std::string description;
  if (*family == SAMATTN_FAMILY_SM90 && problem.group_mode != SAMATTN_GROUP_NONE) {
    const gemm::sm90::GroupedPlan grouped = gemm::sm90::plan_grouped(problem);
    description = std::string("tile=") + gemm::sm90::grouped_tile_name(grouped.cluster) +
                  " raster=" + (grouped.raster_along_n ? "n" : "m");
  } else if (*family == SAMATTN_FAMILY_SM90) {
    description = std::string("tile=") + gemm::sm90::tile_name(plan.tile) +
                  " swizzle=" + to_text(plan.swizzle) +
                  " transposed=" + (plan.transposed ? "1" : "0");
    if (plan.splits >= 2) {
      description += " split_k=" + to_text(plan.splits) +
                     (gemm::sm90::parallel_split(problem).applies ? " parallel" : " serial");
    }
  } else {
    if (!plan.reason.empty()) description = "sm90 cannot run it: " + plan.reason;
    const gemm::SplitK split = gemm::split_k_ranges(static_cast<Family>(*family), problem);
    if (split.splits >= 2 && gemm::on_tensor_cores(static_cast<Family>(*family), problem)) {
      description += std::string(description.empty() ? "" : "; ") +
                     "split_k=" + to_text(split.splits) + " parallel";
    }
  }
  std::snprintf(text, static_cast<size_t>(capacity), "%s", description.c_str());
  return SAMATTN_OK;
}

}  // namespace samattn
