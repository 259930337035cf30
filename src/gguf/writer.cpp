// GGUF v3 writer.
//
// Layout follows ggml's strict rule so llama.cpp loads what we write: tensor data appears in
// info order, each tensor padded to the alignment, and each info's offset is the running sum of
// the padded sizes. The header, KVs and infos are encoded into memory first (they are small and
// this validates everything before a byte reaches disk); tensor data is streamed.
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>

#include "moesh/gguf/gguf.h"

namespace moesh::gguf {
namespace {

constexpr uint32_t k_version = 3;
constexpr size_t k_default_alignment = 32;
constexpr size_t k_max_name_bytes = 64;

uint64_t align_up(uint64_t x, uint64_t a) {
  return x + (a - x % a) % a;
}

template <typename T>
void put(std::vector<uint8_t>* out, T x) {
  const size_t n = out->size();
  out->resize(n + sizeof(T));
  std::memcpy(out->data() + n, &x, sizeof(T));
}

void put_string(std::vector<uint8_t>* out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out->insert(out->end(), s.begin(), s.end());
}

// Encodes one value payload (without its type id). A Value whose variant does not match its
// declared type, or an array item whose type differs from the array's element type, is refused:
// writing it would produce a file that reads back as something else.
Status encode_value(const Value& v, std::vector<uint8_t>* out) {
  auto mismatch = [&]() {
    return make_error(StatusCode::kInvalidArgument, "value declared {} holds another kind of data",
                      value_type_name(v.type));
  };
  const auto* u = std::get_if<uint64_t>(&v.v);
  const auto* i = std::get_if<int64_t>(&v.v);
  const auto* d = std::get_if<double>(&v.v);
  switch (v.type) {
    case ValueType::UINT8:
      if (!u) return mismatch();
      put<uint8_t>(out, static_cast<uint8_t>(*u));
      break;
    case ValueType::UINT16:
      if (!u) return mismatch();
      put<uint16_t>(out, static_cast<uint16_t>(*u));
      break;
    case ValueType::UINT32:
      if (!u) return mismatch();
      put<uint32_t>(out, static_cast<uint32_t>(*u));
      break;
    case ValueType::UINT64:
      if (!u) return mismatch();
      put<uint64_t>(out, *u);
      break;
    case ValueType::INT8:
      if (!i) return mismatch();
      put<int8_t>(out, static_cast<int8_t>(*i));
      break;
    case ValueType::INT16:
      if (!i) return mismatch();
      put<int16_t>(out, static_cast<int16_t>(*i));
      break;
    case ValueType::INT32:
      if (!i) return mismatch();
      put<int32_t>(out, static_cast<int32_t>(*i));
      break;
    case ValueType::INT64:
      if (!i) return mismatch();
      put<int64_t>(out, *i);
      break;
    case ValueType::FLOAT32:
      if (!d) return mismatch();
      put<float>(out, static_cast<float>(*d));
      break;
    case ValueType::FLOAT64:
      if (!d) return mismatch();
      put<double>(out, *d);
      break;
    case ValueType::BOOL: {
      const auto* b = std::get_if<bool>(&v.v);
      if (!b) return mismatch();
      put<uint8_t>(out, *b ? 1 : 0);
      break;
    }
    case ValueType::STRING: {
      const auto* s = std::get_if<std::string>(&v.v);
      if (!s) return mismatch();
      put_string(out, *s);
      break;
    }
    case ValueType::ARRAY: {
      const auto* a = std::get_if<Array>(&v.v);
      if (!a) return mismatch();
      if (a->elem_type >= ValueType::kCOUNT) {
        return make_error(StatusCode::kInvalidArgument, "array element type id {} is invalid",
                          static_cast<uint32_t>(a->elem_type));
      }
      put<uint32_t>(out, static_cast<uint32_t>(a->elem_type));
      put<uint64_t>(out, a->items.size());
      for (size_t k = 0; k < a->items.size(); ++k) {
        const Value& item = a->items[k];
        if (item.type != a->elem_type) {
          return make_error(StatusCode::kInvalidArgument, "array of {} has element {} of type {}",
                            value_type_name(a->elem_type), k, value_type_name(item.type));
        }
        Status st = encode_value(item, out);
        if (!st.is_ok()) return Status(st.code(), fmt::format("element {}: {}", k, st.message()));
      }
      break;
    }
    case ValueType::kCOUNT:
      return make_error(StatusCode::kInvalidArgument, "value type id {} is invalid", static_cast<uint32_t>(v.type));
  }
  return Status::ok();
}

using Sink = std::function<Status(const void* data, size_t n)>;

}  // namespace

Writer::Writer() = default;

void Writer::set(const std::string& key, Value v) {
  for (auto& kv : kvs_) {
    if (kv.first == key) {
      kv.second = std::move(v);
      return;
    }
  }
  kvs_.emplace_back(key, std::move(v));
}

Status Writer::add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne, const void* data) {
  if (name.empty() || name.size() >= k_max_name_bytes) {
    return make_error(StatusCode::kInvalidArgument, "tensor name '{}' must be 1..{} bytes", name, k_max_name_bytes - 1);
  }
  for (const auto& t : tensors_) {
    if (t.name == name) {
      return make_error(StatusCode::kInvalidArgument, "duplicate tensor name '{}'", name);
    }
  }
  if (ne.empty() || ne.size() > 4) {
    return make_error(StatusCode::kInvalidArgument, "tensor '{}': {} dims, expected 1..4", name, ne.size());
  }
  const uint32_t id = static_cast<uint32_t>(type);
  if (!type_is_known(id)) {
    return make_error(StatusCode::kInvalidArgument, "tensor '{}': unknown type id {}", name, id);
  }
  const auto& tr = type_traits(type);
  int64_t n_rows = 1;
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] < 0) {
      return make_error(StatusCode::kInvalidArgument, "tensor '{}': ne[{}] = {} is negative", name, d, ne[d]);
    }
    if (d > 0 && __builtin_mul_overflow(n_rows, ne[d], &n_rows)) {
      return make_error(StatusCode::kInvalidArgument, "tensor '{}': shape overflows", name);
    }
  }
  if (ne[0] % tr.block_size != 0) {
    return make_error(StatusCode::kInvalidArgument, "tensor '{}': ne[0] = {} is not a multiple of the {} block size {}",
                      name, ne[0], tr.name, tr.block_size);
  }
  uint64_t n_bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(type_row_bytes(type, ne[0])), static_cast<uint64_t>(n_rows),
                             &n_bytes)) {
    return make_error(StatusCode::kInvalidArgument, "tensor '{}': byte size overflows", name);
  }
  if (data == nullptr && n_bytes > 0) {
    return make_error(StatusCode::kInvalidArgument, "tensor '{}': null data", name);
  }
  tensors_.push_back(PendingTensor{name, type, ne, data, n_bytes, nullptr});
  return Status::ok();
}

Status Writer::add_tensor_copy(const std::string& name, GgmlType type, const std::vector<int64_t>& ne,
                               const void* data) {
  MOESH_RETURN_IF_ERROR(add_tensor(name, type, ne, data));
  PendingTensor& t = tensors_.back();
  const auto* p = static_cast<const uint8_t*>(data);
  t.owned = std::make_shared<std::vector<uint8_t>>(p, p + t.n_bytes);
  t.data = t.owned->data();
  return Status::ok();
}

// The shared body of write_bytes() and write_file().
namespace {

struct TensorOut {
  const std::string* name;
  GgmlType type;
  const std::vector<int64_t>* ne;
  const void* data;
  uint64_t n_bytes;
};

// Encodes everything up to the data section in memory, then streams it and the padded tensor
// data to `sink`.
Status write_gguf(const std::vector<std::pair<std::string, Value>>& kvs, const std::vector<TensorOut>& tensors,
                  const Sink& sink) {
  size_t alignment = k_default_alignment;
  for (const auto& [key, v] : kvs) {
    if (key.empty()) return make_error(StatusCode::kInvalidArgument, "empty metadata key");
    if (key != "general.alignment") continue;
    const auto* a = std::get_if<uint64_t>(&v.v);
    if (v.type != ValueType::UINT32 || a == nullptr || *a == 0 || !std::has_single_bit(*a)) {
      return make_error(StatusCode::kInvalidArgument, "general.alignment must be a UINT32 power of two, got {} {}",
                        value_type_name(v.type), v.to_string());
    }
    alignment = static_cast<size_t>(*a);
  }

  std::vector<uint8_t> head;
  put<uint32_t>(&head, 0x46554747);  // "GGUF"
  put<uint32_t>(&head, k_version);
  put<uint64_t>(&head, tensors.size());
  put<uint64_t>(&head, kvs.size());
  for (const auto& [key, v] : kvs) {
    put_string(&head, key);
    put<uint32_t>(&head, static_cast<uint32_t>(v.type));
    Status st = encode_value(v, &head);
    if (!st.is_ok()) return Status(st.code(), fmt::format("key '{}': {}", key, st.message()));
  }
  uint64_t offset = 0;
  for (const TensorOut& t : tensors) {
    put_string(&head, *t.name);
    put<uint32_t>(&head, static_cast<uint32_t>(t.ne->size()));
    for (int64_t n : *t.ne) put<uint64_t>(&head, static_cast<uint64_t>(n));
    put<uint32_t>(&head, static_cast<uint32_t>(t.type));
    put<uint64_t>(&head, offset);
    offset += align_up(t.n_bytes, alignment);
  }
  // ggml pads to the data section only when there are tensors; we do the same so a vocab-only
  // file ends right after its metadata.
  if (!tensors.empty()) head.resize(align_up(head.size(), alignment), 0);
  MOESH_RETURN_IF_ERROR(sink(head.data(), head.size()));

  static const uint8_t k_zeros[256] = {};
  for (const TensorOut& t : tensors) {
    const uint64_t n = t.n_bytes;
    if (n > 0) MOESH_RETURN_IF_ERROR(sink(t.data, n));
    uint64_t pad = align_up(n, alignment) - n;
    while (pad > 0) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(pad, sizeof(k_zeros)));
      MOESH_RETURN_IF_ERROR(sink(k_zeros, chunk));
      pad -= chunk;
    }
  }
  return Status::ok();
}

}  // namespace

Result<std::vector<uint8_t>> Writer::write_bytes() const {
  std::vector<TensorOut> outs;
  outs.reserve(tensors_.size());
  for (const auto& t : tensors_) outs.push_back({&t.name, t.type, &t.ne, t.data, t.n_bytes});
  std::vector<uint8_t> bytes;
  Status st = write_gguf(kvs_, outs, [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return bytes;
}

Status Writer::write_file(const std::string& path) const {
  std::vector<TensorOut> outs;
  outs.reserve(tensors_.size());
  for (const auto& t : tensors_) outs.push_back({&t.name, t.type, &t.ne, t.data, t.n_bytes});
  // Write beside the target and rename, so a reader never sees a half-written file and a failed
  // write leaves any previous file in place.
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return make_error(StatusCode::kIoError, "cannot create '{}': {}", tmp, std::strerror(errno));
  }
  Status st = write_gguf(kvs_, outs, [&](const void* p, size_t n) {
    if (std::fwrite(p, 1, n, f) != n) {
      return make_error(StatusCode::kIoError, "writing '{}': {}", tmp, std::strerror(errno));
    }
    return Status::ok();
  });
  if (std::fflush(f) != 0 && st.is_ok()) {
    st = make_error(StatusCode::kIoError, "flushing '{}': {}", tmp, std::strerror(errno));
  }
  if (st.is_ok() && ::fsync(::fileno(f)) != 0) {
    st = make_error(StatusCode::kIoError, "fsync '{}': {}", tmp, std::strerror(errno));
  }
  if (std::fclose(f) != 0 && st.is_ok()) {
    st = make_error(StatusCode::kIoError, "closing '{}': {}", tmp, std::strerror(errno));
  }
  if (st.is_ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    st = make_error(StatusCode::kIoError, "renaming '{}' to '{}': {}", tmp, path, std::strerror(errno));
  }
  if (!st.is_ok()) std::remove(tmp.c_str());
  return st;
}

}  // namespace moesh::gguf
