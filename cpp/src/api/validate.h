// Argument checks shared by the ops (no device access).
#pragma once

#include <cstdint>
#include <string>

#include "api/error.h"
#include "api/select.h"
#include "samattn/samattn.h"

namespace samattn {

inline bool any_negative(int64_t x, int64_t y, int64_t z) { return x < 0 || y < 0 || z < 0; }

inline bool aligned(const void* ptr, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// Largest byte offset of a (batch, rows, cols) view plus one element; false
// when it does not fit in int64.
inline bool fits_in_int64(int64_t batch, int64_t rows, int64_t cols, int64_t batch_stride,
                          int64_t row_stride, int64_t col_stride, int64_t element_size) {
  int64_t by_batch = 0, by_row = 0, by_col = 0, offset = 0, bytes = 0;
  return !__builtin_mul_overflow(batch - 1, batch_stride, &by_batch) &&
         !__builtin_mul_overflow(rows - 1, row_stride, &by_row) &&
         !__builtin_mul_overflow(cols - 1, col_stride, &by_col) &&
         !__builtin_add_overflow(by_batch, by_row, &offset) &&
         !__builtin_add_overflow(offset, by_col, &offset) &&
         !__builtin_add_overflow(offset, int64_t{1}, &offset) &&
         !__builtin_mul_overflow(offset, element_size, &bytes);
}

inline std::string strides_text(int64_t batch, int64_t row, int64_t col) {
  return "(" + to_text(batch) + ", " + to_text(row) + ", " + to_text(col) + ")";
}

// Checks shared by every op: dtype, family and device codes. On success the
// subject names the dtype.
inline int check_codes(Subject* subject, int32_t dtype, int32_t family, int32_t device) {
  if (dtype_name(dtype) == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                *subject + ": unknown dtype code " + to_text(dtype) +
                    " (expected SAMATTN_F16 = 0, SAMATTN_BF16 = 1 or SAMATTN_F32 = 2)");
  }
  if (family_code_name(family) == nullptr) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                *subject + ": unknown family code " + to_text(family) +
                    " (expected SAMATTN_FAMILY_AUTO = 0, _SM75 = 75, _SM80 = 80 or _SM90 = 90)");
  }
  if (device < 0) {
    return fail(SAMATTN_INVALID_ARGUMENT,
                *subject + ": device must be a CUDA ordinal >= 0, got " + to_text(device));
  }
  subject->dtype = dtype_name(dtype);
  return SAMATTN_OK;
}

}  // namespace samattn
