// Typed metadata access: File::get<T> with range-checked integer coercion.
//
// Writers pick integer widths freely (u32 vs u64 counts, i32 vs u32 ids), so an integer key is
// readable as any integer type its value fits in. Other kinds never convert silently: a float is
// not an integer, a bool is not a number, a string is not anything else.
#include <fmt/format.h>

#include <limits>
#include <type_traits>

#include "moesh/gguf/gguf.h"

namespace moesh::gguf {
namespace {

template <typename T>
struct is_vector : std::false_type {};
template <typename T>
struct is_vector<std::vector<T>> : std::true_type {
  using elem = T;
};

template <typename T>
constexpr bool k_is_int = std::is_integral_v<T> && !std::is_same_v<T, bool>;

template <typename T>
const char* target_name() {
  if constexpr (std::is_same_v<T, bool>)
    return "BOOL";
  else if constexpr (k_is_int<T>)
    return "an integer";
  else if constexpr (std::is_floating_point_v<T>)
    return "FLOAT32 or FLOAT64";
  else if constexpr (std::is_same_v<T, std::string>)
    return "STRING";
  else
    return "ARRAY";
}

template <typename T>
const char* int_name() {
  if constexpr (std::is_signed_v<T>) {
    switch (sizeof(T)) {
      case 1:
        return "int8";
      case 2:
        return "int16";
      case 4:
        return "int32";
      default:
        return "int64";
    }
  } else {
    switch (sizeof(T)) {
      case 1:
        return "uint8";
      case 2:
        return "uint16";
      case 4:
        return "uint32";
      default:
        return "uint64";
    }
  }
}

Status wrong_type(ValueType found, const char* expected) {
  return make_error(StatusCode::kTypeMismatch, "has type {}, expected {}", value_type_name(found), expected);
}

// Converts one value to T; errors lack the key so the caller can prefix "key 'k'[ element i]".
template <typename T>
Status convert(const Value& val, T* out) {
  if constexpr (std::is_same_v<T, bool>) {
    if (val.type != ValueType::BOOL) return wrong_type(val.type, target_name<T>());
    *out = std::get<bool>(val.v);
    return Status::ok();
  } else if constexpr (k_is_int<T>) {
    using Lim = std::numeric_limits<T>;
    if (const auto* u = std::get_if<uint64_t>(&val.v)) {
      if (*u > static_cast<uint64_t>(Lim::max())) {
        return make_error(StatusCode::kOutOfRange, "value {} ({}) does not fit in {}", *u, value_type_name(val.type),
                          int_name<T>());
      }
      *out = static_cast<T>(*u);
      return Status::ok();
    }
    if (const auto* i = std::get_if<int64_t>(&val.v)) {
      const bool fits = std::is_signed_v<T>
                            ? (*i >= static_cast<int64_t>(Lim::min()) && *i <= static_cast<int64_t>(Lim::max()))
                            : (*i >= 0 && static_cast<uint64_t>(*i) <= static_cast<uint64_t>(Lim::max()));
      if (!fits) {
        return make_error(StatusCode::kOutOfRange, "value {} ({}) does not fit in {}", *i, value_type_name(val.type),
                          int_name<T>());
      }
      *out = static_cast<T>(*i);
      return Status::ok();
    }
    return wrong_type(val.type, target_name<T>());
  } else if constexpr (std::is_floating_point_v<T>) {
    const auto* d = std::get_if<double>(&val.v);
    if (d == nullptr) return wrong_type(val.type, target_name<T>());
    *out = static_cast<T>(*d);
    return Status::ok();
  } else if constexpr (std::is_same_v<T, std::string>) {
    const auto* s = std::get_if<std::string>(&val.v);
    if (s == nullptr) return wrong_type(val.type, target_name<T>());
    *out = *s;
    return Status::ok();
  } else {
    static_assert(is_vector<T>::value, "unsupported get<T> type");
    using E = typename is_vector<T>::elem;
    const auto* a = std::get_if<Array>(&val.v);
    if (a == nullptr) return wrong_type(val.type, target_name<T>());
    T result;
    result.reserve(a->items.size());
    for (size_t i = 0; i < a->items.size(); ++i) {
      E e{};
      Status st = convert<E>(a->items[i], &e);
      if (!st.is_ok()) return Status(st.code(), fmt::format("element {} {}", i, st.message()));
      result.push_back(std::move(e));
    }
    *out = std::move(result);
    return Status::ok();
  }
}

}  // namespace

template <typename T>
Result<T> File::get(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return make_error(StatusCode::kNotFound, "key '{}' not found", key);
  T out{};
  Status st = convert<T>(*v, &out);
  if (!st.is_ok()) return Status(st.code(), fmt::format("key '{}' {}", key, st.message()));
  return out;
}

// The supported T, instantiated here so the template body stays out of the header.
#define MOESH_GGUF_GET(T)                                  \
  template Result<T> File::get<T>(std::string_view) const; \
  template Result<std::vector<T>> File::get<std::vector<T>>(std::string_view) const;

MOESH_GGUF_GET(bool)
MOESH_GGUF_GET(int8_t)
MOESH_GGUF_GET(uint8_t)
MOESH_GGUF_GET(int16_t)
MOESH_GGUF_GET(uint16_t)
MOESH_GGUF_GET(int32_t)
MOESH_GGUF_GET(uint32_t)
MOESH_GGUF_GET(long)
MOESH_GGUF_GET(unsigned long)
MOESH_GGUF_GET(long long)
MOESH_GGUF_GET(unsigned long long)
MOESH_GGUF_GET(float)
MOESH_GGUF_GET(double)
MOESH_GGUF_GET(std::string)
// Nested arrays (e.g. per-layer lists) as vectors of vectors.
#define MOESH_GGUF_GET_NESTED(T) \
  template Result<std::vector<std::vector<T>>> File::get<std::vector<std::vector<T>>>(std::string_view) const;
MOESH_GGUF_GET_NESTED(int32_t)
MOESH_GGUF_GET_NESTED(uint32_t)
MOESH_GGUF_GET_NESTED(int64_t)
MOESH_GGUF_GET_NESTED(float)
MOESH_GGUF_GET_NESTED(std::string)

#undef MOESH_GGUF_GET_NESTED
#undef MOESH_GGUF_GET

}  // namespace moesh::gguf
