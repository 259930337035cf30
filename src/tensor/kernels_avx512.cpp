// AVX-512 (F/BW/VL/DQ/VNNI) kernel table.
//
// Built on the shared x86 kernels (simd_x86_*.h) with the integer primitive switched to VNNI
// dpbusd (exact, like the AVX2 maddubs path for our operand ranges, so every float step is the
// code the AVX2 tests already pin down). The F32/F16/BF16 dots use 512-bit registers: two zmm
// hold the 32 canonical lanes exactly (lanes 0..15 and 16..31).
// GCC 12's AVX-512 intrinsics pass an `_mm512_undefined_*()` pass-through operand to their masked
// builtins, which -Wuninitialized reports at every inlined call site (a false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define MOESH_SIMD_VNNI 1
#include <algorithm>

#include "moesh/tensor/fp16.h"
#include "moesh/tensor/kernels.h"
#include "simd_x86_fill.h"

namespace moesh {
namespace {

using simd::reduce8;

// The canonical reduce32 on lanes a[0..15], a[16..31].
inline float reduce32_512(__m512 a0, __m512 a1) {
  a0 = _mm512_add_ps(a0, a1);  // h = 16
  const __m256 lo = _mm512_castps512_ps256(a0);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a0), 1));
  return reduce8(_mm256_add_ps(lo, hi));  // h = 8, then 4, 2, 1
}

// ---- F32 / F16 / BF16: one weight row x NC tokens (vec_dot is NC = 1)
//
// Element i -> lane i % 32: full 32-element steps in two zmm, the tail in scalar into its lane
// (the tail starts at a multiple of 32), then the canonical reduce32. Each 32-element chunk of a
// weight row is widened once for the NC tokens (theirs as they are read: F16/BF16 -> f32 is exact).
template <class Widen, int NC>
void lanes_row_tile_512(int64_t n, const Widen& ww, const Widen* xs, float* out, size_t ldo) {
  __m512 a0[NC], a1[NC];
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j) a0[j] = _mm512_setzero_ps(), a1[j] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 w0 = ww(i), w1 = ww(i + 16);
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) {
      a0[j] = _mm512_fmadd_ps(w0, xs[j](i), a0[j]);
      a1[j] = _mm512_fmadd_ps(w1, xs[j](i + 16), a1[j]);
    }
  }
  const int rem = static_cast<int>(n - i);
  alignas(64) float wt[32], xt[32];
  if (rem > 0) ww.tail(i, rem, wt);
  for (int j = 0; j < NC; ++j) {
    if (rem > 0) {
      alignas(64) float a[32];
      _mm512_store_ps(a, a0[j]);
      _mm512_store_ps(a + 16, a1[j]);
      xs[j].tail(i, rem, xt);
      for (int l = 0; l < rem; ++l) a[l] = std::fmaf(wt[l], xt[l], a[l]);
      a0[j] = _mm512_load_ps(a);
      a1[j] = _mm512_load_ps(a + 16);
    }
    out[static_cast<size_t>(j) * ldo] = reduce32_512(a0[j], a1[j]);
  }
}

// One row of F32 / F16 / BF16 values widened 16 at a time (weights and activations alike).
struct WidenRowF32 {
  const float* p;
  __m512 operator()(int64_t i) const { return _mm512_loadu_ps(p + i); }
  void tail(int64_t i, int rem, float* t) const {
    for (int l = 0; l < rem; ++l) t[l] = p[i + l];
  }
};
struct WidenRowF16 {
  const uint16_t* p;
  __m512 operator()(int64_t i) const { return _mm512_cvtph_ps(simd::loadu256(p + i)); }
  void tail(int64_t i, int rem, float* t) const {
    for (int l = 0; l < rem; ++l) t[l] = fp16_to_fp32(p[i + l]);
  }
};
struct WidenRowBF16 {
  const uint16_t* p;
  __m512 operator()(int64_t i) const {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(simd::loadu256(p + i)), 16));
  }
  void tail(int64_t i, int rem, float* t) const {
    for (int l = 0; l < rem; ++l) t[l] = bf16_to_fp32(p[i + l]);
  }
};

template <class Widen, int Max>
void run_lanes_tile_512(int cn, int64_t n, const Widen& ww, const Widen* xs, float* o, size_t ldo) {
  if constexpr (Max == 1) {
    lanes_row_tile_512<Widen, 1>(n, ww, xs, o, ldo);
  } else if (cn == Max) {
    lanes_row_tile_512<Widen, Max>(n, ww, xs, o, ldo);
  } else {
    run_lanes_tile_512<Widen, Max - 1>(cn, n, ww, xs, o, ldo);
  }
}

template <class Widen, class E>
float dot_lanes_512(int64_t n, const void* w, const void* x) {
  const Widen xr{static_cast<const E*>(x)};
  float out;
  lanes_row_tile_512<Widen, 1>(n, Widen{static_cast<const E*>(w)}, &xr, &out, 0);
  return out;
}

// W and the activations are both E (F32, F16 or BF16: the type's own vec_dot_type).
template <class Widen, class E>
void tile_lanes_512(int64_t n, const void* vw, size_t w_stride, int nr, const void* vx, size_t x_stride, int nc,
                    float* out, size_t ldo) {
  constexpr int kNC = 8;
  for (int c0 = 0; c0 < nc; c0 += kNC) {
    const int cn = std::min(kNC, nc - c0);
    Widen xs[kNC];
    for (int j = 0; j < cn; ++j) {
      xs[j] = Widen{reinterpret_cast<const E*>(static_cast<const uint8_t*>(vx) + (c0 + j) * x_stride)};
    }
    for (int r = 0; r < nr; ++r) {
      const Widen ww{reinterpret_cast<const E*>(static_cast<const uint8_t*>(vw) + r * w_stride)};
      run_lanes_tile_512<Widen, kNC>(cn, n, ww, xs, out + static_cast<size_t>(c0) * ldo + r, ldo);
    }
  }
}

}  // namespace

void fill_kernels_avx512(KernelTable* t) {
  simd::fill_x86_common(t);
  t->type[static_cast<int>(GgmlType::F32)].vec_dot = dot_lanes_512<WidenRowF32, float>;
  t->type[static_cast<int>(GgmlType::F16)].vec_dot = dot_lanes_512<WidenRowF16, uint16_t>;
  t->type[static_cast<int>(GgmlType::BF16)].vec_dot = dot_lanes_512<WidenRowBF16, uint16_t>;
  t->type[static_cast<int>(GgmlType::F32)].vec_dot_tile = tile_lanes_512<WidenRowF32, float>;
  t->type[static_cast<int>(GgmlType::F16)].vec_dot_tile = tile_lanes_512<WidenRowF16, uint16_t>;
  t->type[static_cast<int>(GgmlType::BF16)].vec_dot_tile = tile_lanes_512<WidenRowBF16, uint16_t>;
}

}  // namespace moesh
