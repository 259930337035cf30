// AVX2 attention kernels (kernels.h AttnScores / AttnKqv), bit-identical to attn_ref.cpp.
//
// Scores: one cell's 64 canonical lanes live in eight ymm (lanes 8r..8r+7 in register r). The
// tree's first steps (32, 16, 8) are whole-register adds; its last three (4, 2, 1) are done for
// eight cells at once by a transposed tree: each add pairs exactly the lanes the one-cell tree
// pairs (lane l with lane l + h), two or four cells per register, so the bits are unchanged and
// eight cells cost three adds instead of 8 x (3 adds + 3 shuffles).
//
// KQV: the 16 lanes of one 8-float slice of the output are registers, not memory: a pass takes
// the cells of lanes 0-7 (or 8-15) in order, so each lane sees its cells in the same order as the
// reference, without a load and a store per cell.
#pragma once

#include <algorithm>
#include <cmath>

#include "simd_x86.h"

namespace moesh::simd {
namespace {

// The eight-lane state of one cell (after the 32-, 16- and 8-steps): zero when c is out of
// [c0, c1), so a partial block needs no branch in the tree.
inline __m256 attn_cell8(const float* k, const float* q, int64_t np) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t i = 0; i < np; i += 64) {
    const float* ki = k + i;
    const float* qi = q + i;
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(ki), _mm256_loadu_ps(qi), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(ki + 8), _mm256_loadu_ps(qi + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(ki + 16), _mm256_loadu_ps(qi + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(ki + 24), _mm256_loadu_ps(qi + 24), a3);
    a4 = _mm256_fmadd_ps(_mm256_loadu_ps(ki + 32), _mm256_loadu_ps(qi + 32), a4);
    a5 = _mm256_fmadd_ps(_mm256_loadu_ps(ki + 40), _mm256_loadu_ps(qi + 40), a5);
    a6 = _mm256_fmadd_ps(_mm256_loadu_ps(ki + 48), _mm256_loadu_ps(qi + 48), a6);
    a7 = _mm256_fmadd_ps(_mm256_loadu_ps(ki + 56), _mm256_loadu_ps(qi + 56), a7);
  }
  a0 = _mm256_add_ps(a0, a4);  // h = 32
  a1 = _mm256_add_ps(a1, a5);
  a2 = _mm256_add_ps(a2, a6);
  a3 = _mm256_add_ps(a3, a7);
  a0 = _mm256_add_ps(a0, a2);  // h = 16
  a1 = _mm256_add_ps(a1, a3);
  return _mm256_add_ps(a0, a1);  // h = 8
}

// h = 4 for two cells: [a | b], each 4 lanes.
inline __m256 attn_h4(__m256 a, __m256 b) {
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
// h = 2 for four cells; h = 1 for eight (per 128-bit half, see the layout in attn_scores_avx2).
inline __m256 attn_h2(__m256 a, __m256 b) {
  return _mm256_add_ps(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
inline __m256 attn_h1(__m256 a, __m256 b) {
  return _mm256_add_ps(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

void attn_scores_avx2(const AttnScores& a) {
  const int64_t np = a.dk & ~static_cast<int64_t>(63);
  // attn_h1's output holds cells [0, 2, 4, 6, 1, 3, 5, 7]; this puts them in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256 scale = _mm256_set1_ps(a.scale);
  // Cell-major within a block: each key row is read for up to kQ queries in a row (so it is
  // still in L1; rows of the cache are kilobytes apart and evict each other when read
  // query-major), and the cells' reduced lanes wait in r until the block's tree.
  constexpr int kQ = 8;
  __m256 r[kQ][8];
  for (int64_t cb = a.c0; cb < a.c1; cb += 8) {
    const int n = static_cast<int>(std::min<int64_t>(8, a.c1 - cb));
    const float* kb = a.k + static_cast<size_t>(cb) * a.k_stride;
    for (int j0 = 0; j0 < a.nq; j0 += kQ) {
      const int nj = std::min(kQ, a.nq - j0);
      const float* q0 = a.q + static_cast<size_t>(j0) * a.q_stride;
      for (int i = 0; i < 8; ++i) {
        const float* kc = kb + static_cast<size_t>(i) * a.k_stride;
        // Rows kilobytes apart defeat the hardware prefetchers, and a row's own misses alone
        // leave memory idle between rows.
        if (cb + 8 + i < a.c1) {
          const char* nx = reinterpret_cast<const char*>(kc + 8 * a.k_stride);
          for (int64_t b = 0; b < a.dk * 4; b += 64) _mm_prefetch(nx + b, _MM_HINT_T0);
        }
        for (int j = 0; j < nj; ++j) {
          r[j][i] = i < n ? attn_cell8(kc, q0 + static_cast<size_t>(j) * a.q_stride, np) : _mm256_setzero_ps();
        }
      }
      for (int j = 0; j < nj; ++j) {
        const __m256 s0 = attn_h2(attn_h4(r[j][0], r[j][1]), attn_h4(r[j][2], r[j][3]));
        const __m256 s1 = attn_h2(attn_h4(r[j][4], r[j][5]), attn_h4(r[j][6], r[j][7]));
        __m256 sum = _mm256_permutevar8x32_ps(attn_h1(s0, s1), order);
        float* out = a.out + static_cast<size_t>(j0 + j) * a.out_stride + cb;
        if (np == a.dk) {
          sum = _mm256_mul_ps(sum, scale);
          if (n == 8) {
            _mm256_storeu_ps(out, sum);
            continue;
          }
        }
        const float* q = q0 + static_cast<size_t>(j) * a.q_stride;
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, sum);
        for (int i = 0; i < n; ++i) {
          float s = tmp[i];
          if (np != a.dk) {
            const float* kc = kb + static_cast<size_t>(i) * a.k_stride;
            s = quant::ref::dot_f32_ggml_tail(kc, q, np, a.dk, s) * a.scale;
          }
          out[i] = s;
        }
      }
    }
  }
}

// Lanes half*8 .. half*8+7 of one 8-float output slice (lane l at lane0 + l * dv; Full: all 8
// floats, else `mask` names the dv % 8 tail) over cells [lo, hi) with c % 16 in that half, each lane's cells in order;
// the slice of cell c at src + (c - base) * src_stride.
template <bool Full>
inline __m256 attn_load8(const float* p, __m256i mask) {
  if constexpr (Full) {
    return _mm256_loadu_ps(p);
  } else {
    return _mm256_maskload_ps(p, mask);
  }
}

template <bool Full>
void attn_kqv_slice_avx2(float* lane0, int64_t dv, int half, __m256i mask, const float* src, size_t src_stride,
                         int64_t base, const float* p, int64_t lo, int64_t hi) {
  __m256 acc[8];
  for (int l = 0; l < 8; ++l) acc[l] = attn_load8<Full>(lane0 + (half * 8 + l) * dv, mask);
  for (int64_t cb = lo & ~static_cast<int64_t>(15); cb < hi; cb += 16) {
    const int64_t c_first = cb + half * 8;
    const bool whole = c_first >= lo && c_first + 8 <= hi;
    const float* sb = src + static_cast<size_t>(c_first - base) * src_stride;
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) {
      const int64_t c = c_first + l;
      if (!whole && (c < lo || c >= hi)) continue;
      acc[l] = _mm256_fmadd_ps(attn_load8<Full>(sb + static_cast<size_t>(l) * src_stride, mask), _mm256_set1_ps(p[c]),
                               acc[l]);
    }
  }
  for (int l = 0; l < 8; ++l) {
    if constexpr (Full) {
      _mm256_storeu_ps(lane0 + (half * 8 + l) * dv, acc[l]);
    } else {
      _mm256_maskstore_ps(lane0 + (half * 8 + l) * dv, mask, acc[l]);
    }
  }
}

// Both halves of slice s (full or the dv % 8 tail).
inline void attn_kqv_slice_pair_avx2(float* lane0, int64_t dv, int64_t s, __m256i mask, const float* src,
                                     size_t src_stride, int64_t base, const float* p, int64_t lo, int64_t hi) {
  for (int half = 0; half < 2; ++half) {
    if (dv - s * 8 >= 8) {
      attn_kqv_slice_avx2<true>(lane0 + s * 8, dv, half, mask, src, src_stride, base, p, lo, hi);
    } else {
      attn_kqv_slice_avx2<false>(lane0 + s * 8, dv, half, mask, src, src_stride, base, p, lo, hi);
    }
  }
}

// As attn_kqv_512: chunks of whole 16-cell groups, V copied as [slice][cell][8] (zero-padded past
// dv) once for all heads.
void attn_kqv_avx2(const AttnKqv& a) {
  constexpr int64_t kBuf = 16384;  // floats: 64 KiB
  const int64_t n_slices = (a.dv + 7) / 8;
  auto mask_of = [&](int64_t s) {
    const int64_t left = a.dv - s * 8;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(left, 8))),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  };
  const int64_t chunk = std::min<int64_t>(256, kBuf / (n_slices * 8) & ~static_cast<int64_t>(15));
  if (chunk < 16) {  // dv > 2048: V read in place
    for (int j = 0; j < a.nh; ++j) {
      for (int64_t s = 0; s < n_slices; ++s) {
        attn_kqv_slice_pair_avx2(a.lanes + j * a.lanes_stride, a.dv, s, mask_of(s), a.v + s * 8, a.v_stride, 0,
                                 a.p + j * a.p_stride, a.c0, a.c1);
      }
    }
    return;
  }
  alignas(32) float packed[kBuf];
  for (int64_t cs = a.c0 & ~static_cast<int64_t>(15); cs < a.c1; cs += chunk) {
    const int64_t lo = std::max(cs, a.c0), hi = std::min(cs + chunk, a.c1);
    for (int64_t c = lo; c < hi; ++c) {
      const float* vc = a.v + static_cast<size_t>(c) * a.v_stride;
      if (c + 8 < a.c1) {
        const char* nx = reinterpret_cast<const char*>(vc + 8 * a.v_stride);
        for (int64_t b = 0; b < a.dv * 4; b += 64) _mm_prefetch(nx + b, _MM_HINT_T0);
      }
      for (int64_t s = 0; s < n_slices; ++s) {
        _mm256_store_ps(packed + (s * chunk + (c - cs)) * 8, _mm256_maskload_ps(vc + s * 8, mask_of(s)));
      }
    }
    for (int j = 0; j < a.nh; ++j) {
      for (int64_t s = 0; s < n_slices; ++s) {
        attn_kqv_slice_pair_avx2(a.lanes + j * a.lanes_stride, a.dv, s, mask_of(s), packed + s * chunk * 8, 8, cs,
                                 a.p + j * a.p_stride, lo, hi);
      }
    }
  }
}

// ---- Softmax (kernels.h SoftmaxFn), bit-identical to quant::ref::softmax (ops.cpp).

// ggml's vector exp on 8 lanes: ops.cpp's v_expf, operation for operation (fnmadd(n, c, x) is
// fmaf(-n, c, x); the integer halving truncates toward zero as C++'s n / 2 does).
inline __m256 v_expf8(__m256 x) {
  const __m256 r = _mm256_set1_ps(0x1.8p23f);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
  const __m256 n = _mm256_sub_ps(z, r);
  const __m256 b =
      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f), _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                      _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
      u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f)));
  // n clamped to [-192, 192] (NaN -> -192: maxps returns its second operand on NaN).
  const __m256 nc = _mm256_min_ps(_mm256_max_ps(n, _mm256_set1_ps(-192.0f)), _mm256_set1_ps(192.0f));
  const __m256i ni = _mm256_cvttps_epi32(nc);
  const __m256i half = _mm256_srai_epi32(_mm256_add_epi32(ni, _mm256_srli_epi32(ni, 31)), 1);
  const __m256i rest = _mm256_sub_epi32(ni, half);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
  const __m256 res = _mm256_mul_ps(_mm256_mul_ps(j, p1), p2);
  // |n| > 192: 0 when n <= 0, else inf (ordered compares: NaN keeps res, as the scalar blend).
  const __m256 absn = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
  const __m256 out_of_range = _mm256_cmp_ps(absn, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
  const __m256 big = _mm256_blendv_ps(_mm256_set1_ps(INFINITY), _mm256_setzero_ps(),
                                      _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ));
  return _mm256_blendv_ps(res, big, out_of_range);
}

void softmax_avx2(float* x, int64_t n, const float* sink) {
  if (n <= 0) return;
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    // maxps(x, m) is std::max(m, x): m kept when x is NaN or equal (the second operand wins).
    m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
    m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
  }
  alignas(32) float m16[16];
  _mm256_store_ps(m16, m0);
  _mm256_store_ps(m16 + 8, m1);
  float mx = -INFINITY;
  for (int l = 0; l < 16; ++l) mx = std::max(mx, m16[l]);
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  if (sink != nullptr) mx = std::max(mx, *sink);
  const __m256 vmx = _mm256_set1_ps(mx);
  double sum = 0.0;
  i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 e0 = v_expf8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx));
    const __m256 e1 = v_expf8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vmx));
    _mm256_storeu_ps(x + i, e0);
    _mm256_storeu_ps(x + i + 8, e1);
    // The 16 lanes' halving tree: 8 (e0 + e1), then 4, 2, 1.
    __m128 h =
        _mm_add_ps(_mm256_castps256_ps128(_mm256_add_ps(e0, e1)), _mm256_extractf128_ps(_mm256_add_ps(e0, e1), 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    sum += static_cast<double>(_mm_cvtss_f32(h));
  }
  for (; i < n; ++i) {
    const float e = std::exp(x[i] - mx);
    x[i] = e;
    sum += static_cast<double>(e);
  }
  if (sink != nullptr) sum += static_cast<double>(std::exp(*sink - mx));
  const __m256 inv = _mm256_set1_ps(static_cast<float>(1.0 / sum));
  i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  for (; i < n; ++i) x[i] *= _mm256_cvtss_f32(inv);
}

}  // namespace
}  // namespace moesh::simd
