// GGUF metadata values: type names, convenience constructors and the one-line rendering used by
// `moesh inspect`.
#include <fmt/format.h>

#include <algorithm>

#include "moesh/gguf/gguf.h"

namespace moesh::gguf {

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
      return "UINT8";
    case ValueType::INT8:
      return "INT8";
    case ValueType::UINT16:
      return "UINT16";
    case ValueType::INT16:
      return "INT16";
    case ValueType::UINT32:
      return "UINT32";
    case ValueType::INT32:
      return "INT32";
    case ValueType::FLOAT32:
      return "FLOAT32";
    case ValueType::BOOL:
      return "BOOL";
    case ValueType::STRING:
      return "STRING";
    case ValueType::ARRAY:
      return "ARRAY";
    case ValueType::UINT64:
      return "UINT64";
    case ValueType::INT64:
      return "INT64";
    case ValueType::FLOAT64:
      return "FLOAT64";
    case ValueType::kCOUNT:
      break;
  }
  return "UNKNOWN";
}

Value Value::str_array(const std::vector<std::string>& xs) {
  std::vector<Value> items;
  items.reserve(xs.size());
  for (const auto& s : xs) items.push_back(Value::str(s));
  return array(ValueType::STRING, std::move(items));
}

Value Value::i32_array(const std::vector<int32_t>& xs) {
  std::vector<Value> items;
  items.reserve(xs.size());
  for (int32_t x : xs) items.push_back(Value::i32(x));
  return array(ValueType::INT32, std::move(items));
}

Value Value::f32_array(const std::vector<float>& xs) {
  std::vector<Value> items;
  items.reserve(xs.size());
  for (float x : xs) items.push_back(Value::f32(x));
  return array(ValueType::FLOAT32, std::move(items));
}

namespace {

// Quotes a string so control bytes and quotes stay on one line and stay visible.
std::string quote(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\x{:02x}", c);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace

std::string Value::to_string(size_t max_items) const {
  switch (type) {
    case ValueType::UINT8:
    case ValueType::UINT16:
    case ValueType::UINT32:
    case ValueType::UINT64:
      if (const auto* u = std::get_if<uint64_t>(&v)) return fmt::format("{}", *u);
      break;
    case ValueType::INT8:
    case ValueType::INT16:
    case ValueType::INT32:
    case ValueType::INT64:
      if (const auto* i = std::get_if<int64_t>(&v)) return fmt::format("{}", *i);
      break;
    case ValueType::FLOAT32:
      // Printed at float precision so 1e-6f shows as 1e-06, not 9.999999974752427e-07.
      if (const auto* d = std::get_if<double>(&v)) return fmt::format("{}", static_cast<float>(*d));
      break;
    case ValueType::FLOAT64:
      if (const auto* d = std::get_if<double>(&v)) return fmt::format("{}", *d);
      break;
    case ValueType::BOOL:
      if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
      break;
    case ValueType::STRING:
      if (const auto* s = std::get_if<std::string>(&v)) return quote(*s);
      break;
    case ValueType::ARRAY:
      if (const auto* a = std::get_if<Array>(&v)) {
        std::string out = fmt::format("[{} x {}] [", a->items.size(), value_type_name(a->elem_type));
        const size_t n = std::min(a->items.size(), max_items);
        for (size_t i = 0; i < n; ++i) {
          if (i) out += ", ";
          out += a->items[i].to_string(max_items);
        }
        if (n < a->items.size()) out += n ? ", ... " : "... ";
        out += "]";
        return out;
      }
      break;
    case ValueType::kCOUNT:
      break;
  }
  return fmt::format("<invalid {} value>", value_type_name(type));
}

}  // namespace moesh::gguf
