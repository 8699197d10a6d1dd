// Error reporting of the C API: a status code plus a thread-local message.
#pragma once

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>

#include "samattn/samattn.h"

namespace samattn {

// The calling thread's last failure message (samattn_last_error()). A
// function-local thread_local, so every translation unit shares one.
inline std::string& last_error_message() {
  static thread_local std::string message;
  return message;
}

// Numbers in messages. Not std::to_string: its libstdc++ helpers would be
// exported from the library as weak symbols.
inline std::string to_text(int64_t value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%lld", static_cast<long long>(value));
  return buffer;
}

inline std::string float_to_text(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", value);
  return buffer;
}

// What a message is about: "samattn gemm (bfloat16)". Kept as two C strings
// so that a successful call builds no std::string; `subject + ": ..."` makes
// the text only when a check fails.
struct Subject {
  const char* op;               // "samattn gemm"
  const char* dtype = nullptr;  // "bfloat16", or nullptr before the dtype is known

  std::string text() const {
    std::string out = op;
    if (dtype != nullptr) out = out + " (" + dtype + ")";
    return out;
  }
};
inline std::string operator+(const Subject& subject, const char* tail) {
  return subject.text() + tail;
}
inline std::string operator+(const Subject& subject, const std::string& tail) {
  return subject.text() + tail;
}

// Records `message` for this thread and returns `status`, so that a check
// reads `return fail(SAMATTN_INVALID_ARGUMENT, "...");`.
inline int fail(int status, std::string message) {
  last_error_message() = std::move(message);
  return status;
}

// Runs `body` (returning a status) so that no C++ exception crosses the C
// ABI: an exception becomes SAMATTN_CUDA_ERROR (the generic failure, a
// RuntimeError in Python) with its text.
template <class Body>
int catch_all(const char* function, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& error) {
    try {
      return fail(SAMATTN_CUDA_ERROR, std::string(function) + ": internal error: " + error.what());
    } catch (...) {
    }
  } catch (...) {
    try {
      return fail(SAMATTN_CUDA_ERROR, std::string(function) + ": internal error");
    } catch (...) {
    }
  }
  return SAMATTN_CUDA_ERROR;  // could not even store the message (out of memory)
}

}  // namespace samattn
