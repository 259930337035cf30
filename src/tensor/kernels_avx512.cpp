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

// ---- Attention (kernels.h AttnScores / AttnKqv; the AVX2 versions in simd_x86_attn.h explain
// the transposed tree). One zmm per 16 canonical lanes: a cell's 64 lanes are four registers,
// the 32- and 16-steps register adds, then 8, 4, 2, 1 for sixteen cells at once.

inline __m512 attn_cell16(const float* k, const float* q, int64_t np) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < np; i += 64) {
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(k + i), _mm512_loadu_ps(q + i), a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(k + i + 16), _mm512_loadu_ps(q + i + 16), a1);
    a2 = _mm512_fmadd_ps(_mm512_loadu_ps(k + i + 32), _mm512_loadu_ps(q + i + 32), a2);
    a3 = _mm512_fmadd_ps(_mm512_loadu_ps(k + i + 48), _mm512_loadu_ps(q + i + 48), a3);
  }
  return _mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3));  // h = 32, then 16
}

// h = 8 for two cells -> [a 8 lanes | b 8 lanes]; h = 4 for four -> four 128-bit quarters.
inline __m512 attn_h8_512(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
inline __m512 attn_h4_512(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}
// h = 2 and h = 1, within each 128-bit quarter.
inline __m512 attn_h2_512(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
inline __m512 attn_h1_512(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

void attn_scores_512(const AttnScores& a) {
  const int64_t np = a.dk & ~static_cast<int64_t>(63);
  // After h = 1, lane 4k + m holds cell k + 4m; this gathers cell c from lane 4 (c % 4) + c / 4.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512 scale = _mm512_set1_ps(a.scale);
  // Cell-major within a block: each key row is read for up to kQ queries in a row (so it is
  // still in L1; rows of the cache are kilobytes apart and evict each other when read
  // query-major), and the cells' reduced lanes wait in r until the block's tree.
  constexpr int kQ = 8;
  __m512 r[kQ][16];
  constexpr int64_t kAhead = 8;  // cells: a row is prefetched this far ahead of its use
  for (int64_t cb = a.c0; cb < a.c1; cb += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, a.c1 - cb));
    const float* kb = a.k + static_cast<size_t>(cb) * a.k_stride;
    for (int j0 = 0; j0 < a.nq; j0 += kQ) {
      const int nj = std::min(kQ, a.nq - j0);
      const float* q0 = a.q + static_cast<size_t>(j0) * a.q_stride;
      for (int i = 0; i < 16; ++i) {
        const float* kc = kb + static_cast<size_t>(i) * a.k_stride;
        // Rows kilobytes apart defeat the hardware prefetchers, and a row's own misses alone
        // leave memory idle between rows (attn/scores/ctx32768 in bench_kernels: 2.3x).
        if (cb + kAhead + i < a.c1) {
          const char* nx = reinterpret_cast<const char*>(kc + kAhead * a.k_stride);
          for (int64_t b = 0; b < a.dk * 4; b += 64) _mm_prefetch(nx + b, _MM_HINT_T0);
        }
        for (int j = 0; j < nj; ++j) {
          r[j][i] = i < n ? attn_cell16(kc, q0 + static_cast<size_t>(j) * a.q_stride, np) : _mm512_setzero_ps();
        }
      }
      for (int j = 0; j < nj; ++j) {
        __m512 p[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) p[i] = attn_h8_512(r[j][2 * i], r[j][2 * i + 1]);
        const __m512 s0 = attn_h2_512(attn_h4_512(p[0], p[1]), attn_h4_512(p[2], p[3]));
        const __m512 s1 = attn_h2_512(attn_h4_512(p[4], p[5]), attn_h4_512(p[6], p[7]));
        const __m512 sum = _mm512_permutexvar_ps(order, attn_h1_512(s0, s1));
        float* out = a.out + static_cast<size_t>(j0 + j) * a.out_stride + cb;
        const __mmask16 m = static_cast<__mmask16>((1u << n) - 1u);
        if (np == a.dk) {
          _mm512_mask_storeu_ps(out, m, _mm512_mul_ps(sum, scale));
          continue;
        }
        const float* q = q0 + static_cast<size_t>(j) * a.q_stride;
        alignas(64) float tmp[16];
        _mm512_store_ps(tmp, sum);
        for (int i = 0; i < n; ++i) {
          const float* kc = kb + static_cast<size_t>(i) * a.k_stride;
          out[i] = quant::ref::dot_f32_ggml_tail(kc, q, np, a.dk, tmp[i]) * a.scale;
        }
      }
    }
  }
}

// The 16 lanes of one output slice (lane l at lane0 + l * dv; m: its valid floats) over cells
// [lo, hi), each lane's cells (c % 16 == l) in order; the slice of cell c at
// src + (c - base) * src_stride.
void attn_kqv_slice_512(float* lane0, int64_t dv, __mmask16 m, const float* src, size_t src_stride, int64_t base,
                        const float* p, int64_t lo, int64_t hi) {
  __m512 acc[16];
#pragma GCC unroll 16
  for (int l = 0; l < 16; ++l) acc[l] = _mm512_maskz_loadu_ps(m, lane0 + l * dv);
  for (int64_t cb = lo & ~static_cast<int64_t>(15); cb < hi; cb += 16) {
    const bool whole = cb >= lo && cb + 16 <= hi;
    const float* sb = src + static_cast<size_t>(cb - base) * src_stride;
#pragma GCC unroll 16
    for (int l = 0; l < 16; ++l) {
      const int64_t c = cb + l;
      if (!whole && (c < lo || c >= hi)) continue;
      acc[l] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, sb + static_cast<size_t>(l) * src_stride), _mm512_set1_ps(p[c]),
                               acc[l]);
    }
  }
#pragma GCC unroll 16
  for (int l = 0; l < 16; ++l) _mm512_mask_storeu_ps(lane0 + l * dv, m, acc[l]);
}

// Chunks of whole 16-cell groups whose V rows are copied into `packed` as [slice][cell][16]
// (one contiguous run per slice pass, zero-padded past dv), then every head's slices run from it.
void attn_kqv_512(const AttnKqv& a) {
  constexpr int64_t kBuf = 16384;  // floats: 64 KiB
  const int64_t n_slices = (a.dv + 15) / 16;
  auto mask_of = [&](int64_t s) {
    const int64_t left = a.dv - s * 16;
    return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
  };
  const int64_t chunk = std::min<int64_t>(256, kBuf / (n_slices * 16) & ~static_cast<int64_t>(15));
  if (chunk < 16) {  // dv > 1024: V read in place
    for (int j = 0; j < a.nh; ++j) {
      for (int64_t s = 0; s < n_slices; ++s) {
        attn_kqv_slice_512(a.lanes + j * a.lanes_stride + s * 16, a.dv, mask_of(s), a.v + s * 16, a.v_stride, 0,
                           a.p + j * a.p_stride, a.c0, a.c1);
      }
    }
    return;
  }
  alignas(64) float packed[kBuf];
  for (int64_t cs = a.c0 & ~static_cast<int64_t>(15); cs < a.c1; cs += chunk) {
    const int64_t lo = std::max(cs, a.c0), hi = std::min(cs + chunk, a.c1);
    const int64_t nc = chunk;
    for (int64_t c = lo; c < hi; ++c) {
      const float* vc = a.v + static_cast<size_t>(c) * a.v_stride;
      if (c + 8 < a.c1) {
        const char* nx = reinterpret_cast<const char*>(vc + 8 * a.v_stride);
        for (int64_t b = 0; b < a.dv * 4; b += 64) _mm_prefetch(nx + b, _MM_HINT_T0);
      }
      for (int64_t s = 0; s < n_slices; ++s) {
        _mm512_store_ps(packed + (s * nc + (c - cs)) * 16, _mm512_maskz_loadu_ps(mask_of(s), vc + s * 16));
      }
    }
    for (int j = 0; j < a.nh; ++j) {
      for (int64_t s = 0; s < n_slices; ++s) {
        attn_kqv_slice_512(a.lanes + j * a.lanes_stride + s * 16, a.dv, mask_of(s), packed + s * nc * 16, 16, cs,
                           a.p + j * a.p_stride, lo, hi);
      }
    }
  }
}

}  // namespace

void fill_kernels_avx512(KernelTable* t) {
  simd::fill_x86_common(t);
  t->attn = AttnKernels{attn_scores_512, attn_kqv_512, t->attn.softmax};
  t->type[static_cast<int>(GgmlType::F32)].vec_dot = dot_lanes_512<WidenRowF32, float>;
  t->type[static_cast<int>(GgmlType::F16)].vec_dot = dot_lanes_512<WidenRowF16, uint16_t>;
  t->type[static_cast<int>(GgmlType::BF16)].vec_dot = dot_lanes_512<WidenRowBF16, uint16_t>;
  t->type[static_cast<int>(GgmlType::F32)].vec_dot_tile = tile_lanes_512<WidenRowF32, float>;
  t->type[static_cast<int>(GgmlType::F16)].vec_dot_tile = tile_lanes_512<WidenRowF16, uint16_t>;
  t->type[static_cast<int>(GgmlType::BF16)].vec_dot_tile = tile_lanes_512<WidenRowBF16, uint16_t>;
}

}  // namespace moesh
