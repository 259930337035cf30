// Dispatch for the scalar reference (quant.h): which activation format each weight type pairs
// with, which types are supported, and the per-type routine table; plus the value tables.
#include <cstring>
#include <limits>

#include "tensor/quant_impl.h"

namespace moesh::quant {

const int8_t k_values_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
const int8_t k_values_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float e8m0_to_fp32_half(uint8_t e) {
  // 2^(e-128) as a bit pattern: normal exponent e-1 for e >= 2, the two subnormals below that.
  uint32_t bits;
  if (e >= 2) {
    bits = static_cast<uint32_t>(e - 1) << 23;
  } else {
    bits = e == 1 ? 0x00400000u : 0x00200000u;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

GgmlType vec_dot_type(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q8_1:
    case GgmlType::Q8_K:
      return t;
    case GgmlType::Q4_0:
    case GgmlType::Q5_0:
    case GgmlType::Q8_0:
    case GgmlType::IQ4_NL:
    case GgmlType::MXFP4:
      return GgmlType::Q8_0;
    case GgmlType::Q4_1:
    case GgmlType::Q5_1:
      return GgmlType::Q8_1;
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::IQ4_XS:
      return GgmlType::Q8_K;
    default:
      return t;
  }
}

namespace ref {
namespace {

struct RefTable {
  RefKernels k[static_cast<int>(GgmlType::kCOUNT)];
};

const RefTable& ref_table() {
  static const RefTable table = [] {
    RefTable r;
#define MOESH_REF_SET(T, name) \
  r.k[static_cast<int>(GgmlType::T)] = RefKernels{to_float_##name, from_float_##name, vec_dot_##name};
    MOESH_REF_SET(F32, f32)
    MOESH_REF_SET(F16, f16)
    MOESH_REF_SET(BF16, bf16)
    MOESH_REF_SET(Q4_0, q4_0)
    MOESH_REF_SET(Q4_1, q4_1)
    MOESH_REF_SET(Q5_0, q5_0)
    MOESH_REF_SET(Q5_1, q5_1)
    MOESH_REF_SET(Q8_0, q8_0)
    MOESH_REF_SET(Q8_1, q8_1)
    MOESH_REF_SET(IQ4_NL, iq4_nl)
    MOESH_REF_SET(MXFP4, mxfp4)
    MOESH_REF_SET(Q2_K, q2_k)
    MOESH_REF_SET(Q3_K, q3_k)
    MOESH_REF_SET(Q4_K, q4_k)
    MOESH_REF_SET(Q5_K, q5_k)
    MOESH_REF_SET(Q6_K, q6_k)
    MOESH_REF_SET(Q8_K, q8_k)
    MOESH_REF_SET(IQ4_XS, iq4_xs)
#undef MOESH_REF_SET
    return r;
  }();
  return table;
}

}  // namespace

const RefKernels& ref_kernels(GgmlType t) {
  static const RefKernels k_none{};
  const auto i = static_cast<uint32_t>(t);
  if (i >= static_cast<uint32_t>(GgmlType::kCOUNT)) return k_none;
  return ref_table().k[i];
}

}  // namespace ref

bool type_is_supported(GgmlType t) {
  return ref::ref_kernels(t).to_float != nullptr;
}

namespace {

bool row_ok(GgmlType t, int64_t n) {
  return type_is_supported(t) && n >= 0 && n % type_block_size(t) == 0;
}

}  // namespace

bool dequantize_row_ref(GgmlType t, const void* src, float* dst, int64_t n) {
  if (!row_ok(t, n)) return false;
  ref::ref_kernels(t).to_float(src, dst, n);
  return true;
}

bool quantize_row_ref(GgmlType t, const float* src, void* dst, int64_t n) {
  if (!row_ok(t, n)) return false;
  ref::ref_kernels(t).from_float(src, dst, n);
  return true;
}

float vec_dot_ref(GgmlType t, int64_t n, const void* w, const void* x) {
  // The activation row is in vec_dot_type(t), whose block size equals t's for every pairing.
  if (!row_ok(t, n)) return std::numeric_limits<float>::quiet_NaN();
  return ref::ref_kernels(t).vec_dot(n, w, x);
}

}  // namespace moesh::quant
