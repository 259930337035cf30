// Scalar reference of the attention kernels (kernels.h AttnScores / AttnKqv): the order every
// SIMD table must reproduce bit for bit (tests/tensor/test_kernels_simd.cpp).
#include <cmath>

#include "moesh/tensor/fma_clones.h"
#include "tensor/quant_impl.h"

namespace moesh::quant::ref {

// ggml_vec_dot_f32 on AVX-512: 64 lanes (element i -> lane i % 64), a halving tree, then the
// leftovers as GCC compiles them (dot_f32_ggml_tail). The v3 clone keeps the fused multiply-adds one instruction each
// (a libm call otherwise).
MOESH_FMA_CLONES float dot_f32_ggml(const float* k, const float* q, int64_t n) {
  float acc[64] = {};
  const int64_t np = n & ~static_cast<int64_t>(63);
  for (int64_t i = 0; i < np; i += 64) {
    for (int l = 0; l < 64; ++l) acc[l] = std::fmaf(k[i + l], q[i + l], acc[l]);
  }
  for (int h = 32; h >= 1; h /= 2) {
    for (int l = 0; l < h; ++l) acc[l] += acc[l + h];
  }
  return dot_f32_ggml_tail(k, q, np, n, acc[0]);
}

void attn_scores(const AttnScores& a) {
  for (int j = 0; j < a.nq; ++j) {
    const float* q = a.q + static_cast<size_t>(j) * a.q_stride;
    float* out = a.out + static_cast<size_t>(j) * a.out_stride;
    for (int64_t c = a.c0; c < a.c1; ++c)
      out[c] = dot_f32_ggml(a.k + static_cast<size_t>(c) * a.k_stride, q, a.dk) * a.scale;
  }
}

MOESH_FMA_CLONES void attn_kqv(const AttnKqv& a) {
  for (int j = 0; j < a.nh; ++j) {
    const float* p = a.p + static_cast<size_t>(j) * a.p_stride;
    float* lanes = a.lanes + static_cast<size_t>(j) * a.lanes_stride;
    for (int64_t c = a.c0; c < a.c1; ++c) {
      const float pc = p[c];
      const float* vc = a.v + static_cast<size_t>(c) * a.v_stride;
      float* lc = lanes + (c & 15) * a.dv;
      for (int64_t d = 0; d < a.dv; ++d) lc[d] = std::fmaf(vc[d], pc, lc[d]);
    }
  }
}

}  // namespace moesh::quant::ref
