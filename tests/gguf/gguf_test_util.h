// Helpers shared by the GGUF tests: seeded random tensor bytes, deep Value comparison, and an
// independent walker that finds record offsets in a GGUF image so corruption tests can patch
// exact fields without going through the reader under test.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moesh/gguf/gguf.h"

namespace moesh::gguf::testing {

inline std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng() & 0xFF);
  return out;
}

// Non-degenerate: many distinct byte values occur (at least min(64, n/4)), so a wrong slab
// offset or an all-zero read cannot pass a byte comparison by accident.
inline bool bytes_are_varied(const std::vector<uint8_t>& b) {
  bool seen[256] = {};
  int distinct = 0;
  for (uint8_t x : b) {
    if (!seen[x]) {
      seen[x] = true;
      ++distinct;
    }
  }
  return distinct >= static_cast<int>(std::min<size_t>(64, b.size() / 4)) && distinct > 1;
}

inline bool values_equal(const Value& a, const Value& b) {
  if (a.type != b.type || a.v.index() != b.v.index()) return false;
  if (const auto* x = std::get_if<Array>(&a.v)) {
    const auto& y = std::get<Array>(b.v);
    if (x->elem_type != y.elem_type || x->items.size() != y.items.size()) return false;
    for (size_t i = 0; i < x->items.size(); ++i) {
      if (!values_equal(x->items[i], y.items[i])) return false;
    }
    return true;
  }
  if (const auto* d = std::get_if<double>(&a.v)) {
    // Compare bit patterns so NaN == NaN and -0.0 != 0.0: a round trip must be exact.
    const double e = std::get<double>(b.v);
    return std::memcmp(d, &e, sizeof(double)) == 0;
  }
  if (const auto* u = std::get_if<uint64_t>(&a.v)) return *u == std::get<uint64_t>(b.v);
  if (const auto* i = std::get_if<int64_t>(&a.v)) return *i == std::get<int64_t>(b.v);
  if (const auto* x = std::get_if<bool>(&a.v)) return *x == std::get<bool>(b.v);
  return std::get<std::string>(a.v) == std::get<std::string>(b.v);
}

template <typename T>
T load(const std::vector<uint8_t>& b, size_t at) {
  T x{};
  std::memcpy(&x, b.data() + at, sizeof(T));
  return x;
}

template <typename T>
void store(std::vector<uint8_t>* b, size_t at, T x) {
  std::memcpy(b->data() + at, &x, sizeof(T));
}

// Offsets of the fields of one KV record / tensor info, found by walking the bytes directly.
struct KvLayout {
  size_t record = 0;  // key length field
  size_t type = 0;    // value type id
  size_t value = 0;   // first byte of the value
  std::string key;
};
struct TensorInfoLayout {
  size_t record = 0;  // name length field
  size_t n_dims = 0;
  size_t ne = 0;  // ne[0]
  size_t type = 0;
  size_t offset = 0;
  std::string name;
};
struct Layout {
  std::vector<KvLayout> kvs;
  std::vector<TensorInfoLayout> tensors;
  size_t infos_end = 0;
};

inline size_t skip_value(const std::vector<uint8_t>& b, size_t p, uint32_t type) {
  switch (type) {
    case 0:
    case 1:
    case 7:
      return p + 1;
    case 2:
    case 3:
      return p + 2;
    case 4:
    case 5:
    case 6:
      return p + 4;
    case 10:
    case 11:
    case 12:
      return p + 8;
    case 8:
      return p + 8 + load<uint64_t>(b, p);
    case 9: {
      const uint32_t et = load<uint32_t>(b, p);
      const uint64_t n = load<uint64_t>(b, p + 4);
      p += 12;
      for (uint64_t i = 0; i < n; ++i) p = skip_value(b, p, et);
      return p;
    }
    default:
      ADD_FAILURE() << "walker: bad type " << type;
      return b.size();
  }
}

// Walks a *valid* image (as produced by the Writer).
inline Layout walk(const std::vector<uint8_t>& b) {
  Layout l;
  const uint64_t n_tensors = load<uint64_t>(b, 8);
  const uint64_t n_kv = load<uint64_t>(b, 16);
  size_t p = 24;
  for (uint64_t i = 0; i < n_kv; ++i) {
    KvLayout kv;
    kv.record = p;
    const uint64_t len = load<uint64_t>(b, p);
    kv.key.assign(reinterpret_cast<const char*>(b.data() + p + 8), len);
    kv.type = p + 8 + len;
    kv.value = kv.type + 4;
    p = skip_value(b, kv.value, load<uint32_t>(b, kv.type));
    l.kvs.push_back(kv);
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfoLayout t;
    t.record = p;
    const uint64_t len = load<uint64_t>(b, p);
    t.name.assign(reinterpret_cast<const char*>(b.data() + p + 8), len);
    t.n_dims = p + 8 + len;
    t.ne = t.n_dims + 4;
    t.type = t.ne + 8 * load<uint32_t>(b, t.n_dims);
    t.offset = t.type + 4;
    p = t.offset + 8;
    l.tensors.push_back(t);
  }
  l.infos_end = p;
  return l;
}

}  // namespace moesh::gguf::testing
