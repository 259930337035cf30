// Tensor element types as GGUF stores them (ggml type ids), with their block geometry.
//
// A quantized tensor row is a whole number of blocks; `type_block_size` elements take
// `type_block_bytes` bytes. Ids are ggml's, so a GGUF tensor-info type maps straight onto this
// enum; ids ggml removed (4, 5, 31-33, 36-38) and types we do not compute with are rejected by
// `type_is_known`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace moesh {

enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ4_NL = 20,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
  MXFP4 = 39,
  kCOUNT = 40
};

struct TypeTraits {
  const char* name;    // "Q4_K"
  int64_t block_size;  // elements per block (1 for plain types)
  size_t block_bytes;  // bytes per block
  bool is_quantized;
  bool is_known;  // a valid ggml id with known geometry
};

// Traits for any u32 id read from a file; unknown ids give is_known == false.
const TypeTraits& type_traits(uint32_t id);
inline const TypeTraits& type_traits(GgmlType t) {
  return type_traits(static_cast<uint32_t>(t));
}

inline const char* type_name(GgmlType t) {
  return type_traits(t).name;
}
inline int64_t type_block_size(GgmlType t) {
  return type_traits(t).block_size;
}
inline size_t type_block_bytes(GgmlType t) {
  return type_traits(t).block_bytes;
}
inline bool type_is_known(uint32_t id) {
  return type_traits(id).is_known;
}

// Bytes of one row of n elements (n must be a multiple of the block size).
inline size_t type_row_bytes(GgmlType t, int64_t n) {
  const auto& tr = type_traits(t);
  return static_cast<size_t>(n / tr.block_size) * tr.block_bytes;
}

// Parses "q4_k" / "Q4_K" / "f16" ...; returns false when the name is unknown.
bool type_from_name(std::string_view name, GgmlType* out);

}  // namespace moesh
