#include "moesh/util/status.h"

namespace moesh {

const char* status_code_name(StatusCode c) {
  switch (c) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kCorrupt:
      return "corrupt";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kTypeMismatch:
      return "type mismatch";
    case StatusCode::kUnsupported:
      return "unsupported";
    case StatusCode::kIoError:
      return "i/o error";
    case StatusCode::kOutOfRange:
      return "out of range";
    case StatusCode::kTimeout:
      return "timeout";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kInternal:
      return "internal error";
    case StatusCode::kUnauthenticated:
      return "unauthenticated";
    case StatusCode::kCOUNT:
      break;
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + msg_;
}

}  // namespace moesh
