// samattn_softmax_forward / _backward: argument checks and the problem.
#include <string>

#include "api/launch.h"
#include "api/ops.h"
#include "api/validate.h"
#include "common/problem.h"

namespace samattn {

int softmax_op(const samattn_softmax_args* args, bool backward, int32_t* family_used) {
  Subject subject{backward ? "samattn softmax_backward" : "samattn softmax"};
  if (family_used != nullptr) *family_used = SAMATTN_FAMILY_AUTO;
  if (args == nullptr) return fail(SAMATTN_INVALID_ARGUMENT, subject + ": args is NULL");
  const samattn_softmax_args& s = *args;
  int status = check_struct_size(subject, args, "samattn_softmax_args");
  if (status != SAMATTN_OK) return status;
  status = check_codes(&subject, s.dtype, s.family, s.device);
  if (status != SAMATTN_OK) return status;
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

  const OpCall call{subject, s.dtype, s.family, s.device, false, nullptr, 0, ""};
  const auto make_problem = [&](const DeviceInfo& device) {
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
    return problem;
  };
  return backward ? run_op<Op::softmax_backward>(call, make_problem, family_used)
                  : run_op<Op::softmax_forward>(call, make_problem, family_used);
}

}  // namespace samattn
