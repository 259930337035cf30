// Status and Result<T>: how errors cross module boundaries in moesh.
//
// Every I/O path (files, frames, HTTP bodies) returns a Status or a Result<T> instead of throwing,
// so a malformed input becomes a message naming what was wrong and where, never an abort.
// Exceptions must not escape a public API; asserts are only for broken internal invariants.
#pragma once

#include <fmt/format.h>

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace moesh {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,  // caller passed something unusable (bad CLI value, bad shape)
  kCorrupt,          // a file or frame violates its format
  kNotFound,         // missing key, tensor, file
  kTypeMismatch,     // a value exists but has another type
  kUnsupported,      // valid input we do not handle (yet)
  kIoError,          // OS-level failure (open, mmap, read, socket)
  kOutOfRange,       // index/count past a limit
  kTimeout,          // a network wait ran past its deadline
  kUnavailable,      // a peer is unreachable or went away
  kInternal,         // a bug: an invariant did not hold
  kUnauthenticated,  // a peer did not prove it holds the swarm key (or we could not)
  kCOUNT
};

const char* status_code_name(StatusCode c);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string msg) : code_(code), msg_(std::move(msg)) {}

  static Status ok() { return Status(); }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return msg_; }
  // "corrupt: tensor 'x' offset 123 past end of file (size 100)"
  std::string to_string() const;

  // Prefixes context to the message ("loading model.gguf: ...").
  Status with_context(const std::string& ctx) const {
    if (is_ok()) return *this;
    return Status(code_, ctx + ": " + msg_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string msg_;
};

template <typename... Args>
Status make_error(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}

// Result<T>: a value or a non-ok Status (std::expected is C++23; this is the subset we need).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status st) : v_(std::move(st)) {    // NOLINT
    assert(!std::get<Status>(v_).is_ok() && "Result built from an ok Status");
  }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status k_ok;
    return is_ok() ? k_ok : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace moesh

// Early-return helpers for Status / Result plumbing.
#define MOESH_RETURN_IF_ERROR(expr) \
  do {                              \
    ::moesh::Status _st = (expr);   \
    if (!_st.is_ok()) return _st;   \
  } while (0)

#define MOESH_CONCAT_INNER(a, b) a##b
#define MOESH_CONCAT(a, b) MOESH_CONCAT_INNER(a, b)
#define MOESH_ASSIGN_OR_RETURN(lhs, expr)                                                    \
  auto MOESH_CONCAT(_res_, __LINE__) = (expr);                                               \
  if (!MOESH_CONCAT(_res_, __LINE__).is_ok()) return MOESH_CONCAT(_res_, __LINE__).status(); \
  lhs = std::move(MOESH_CONCAT(_res_, __LINE__)).value()
