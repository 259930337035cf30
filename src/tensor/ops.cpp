// Per-row transformer ops with llama.cpp's (ggml CPU) float order, see docs/background/quant-formats.md §6.5
// and docs/background/moe-architectures.md §2-3. Everything is scalar and row-local: these ops are a small part
// of a step's time next to the matmuls, and a fixed scalar order keeps every ISA bit-identical.
// The build uses -ffp-contract=off, so each expression below rounds exactly where written.
#include "moesh/tensor/ops.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "moesh/tensor/fma_clones.h"
#include "moesh/tensor/kernels.h"
#include "tensor/quant_impl.h"

namespace moesh {

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  // Squares in f32, summed in double (as ggml does).
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale;
  if (w != nullptr) {
    // A separate pass, as ggml applies the weight with its own multiply op.
    for (int64_t i = 0; i < n; ++i) y[i] = y[i] * w[i];
  }
}

namespace {

// ggml_v_expf as built for AVX-512 (vec.h, "adapted from arm limited optimized routine"), one
// lane in scalar: the same constants, the same fused multiply-adds (std::fmaf where the vector
// code uses fmadd/fnmadd), scalef as an exact ldexp, and the same overflow/underflow blend.
// Agrees with expf to ~1.5 ulp but not bit for bit, and llama.cpp's softmax and SiLU use it.
// The ldexp is two multiplies by exact powers of two (std::ldexp is a libm call that kept the
// loops scalar: 4 % of a prefill): j is near 1 and |n| <= 192, so j * 2^(n/2) is exact and only
// the second product rounds, once, as ldexp does (subnormal results, overflow to inf).
inline float pow2i(int k) {  // 2^k for k in [-126, 127]
  return std::bit_cast<float>(static_cast<uint32_t>(k + 127) << 23);
}
inline __attribute__((always_inline)) float v_expf(float x) {
  const float r = 0x1.8p23f;
  const float z = std::fmaf(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = std::fmaf(-n, 0x1.7f7d1cp-20f, std::fmaf(-n, 0x1.62e4p-1f, x));
  const float u = b * b;
  const float j = std::fmaf(
      std::fmaf(std::fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, std::fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
      std::fmaf(0x1.ffffecp-1f, b, 1.0f));
  // Branch-free, so loops over it vectorise: n clamped (NaN -> -192) only to keep the integer
  // conversion defined; out-of-range lanes take the blend's constant below.
  const float nc = !(n >= -192.0f) ? -192.0f : (n > 192.0f ? 192.0f : n);
  const int ni = static_cast<int>(nc);
  const float res = (j * pow2i(ni / 2)) * pow2i(ni - ni / 2);
  return std::fabs(n) > 192.0f ? (n <= 0.0f ? 0.0f : INFINITY) : res;  // also x = -inf -> 0
}

// ggml_v_expf as built for AVX2 + FMA, one lane: the same polynomial without its constant term,
// then k + j·k fused with k = 2^n made from z's bits (where AVX-512 scales 1 + j with scalef);
// lanes with |n| > 126 go through the two-factor scaling s2·(1 + j)·s1, |n| > 192 saturate.
// Differs from the AVX-512 build in the last bit for about one input in eight.
inline __attribute__((always_inline)) float v_expf_avx2(float x) {
  const float r = 0x1.8p23f;
  const float z = std::fmaf(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = std::fmaf(-n, 0x1.7f7d1cp-20f, std::fmaf(-n, 0x1.62e4p-1f, x));
  const uint32_t e = std::bit_cast<uint32_t>(z) << 23;
  const float k = std::bit_cast<float>(e + std::bit_cast<uint32_t>(1.0f));
  const float u = b * b;
  const float j = std::fmaf(
      std::fmaf(std::fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, std::fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
      0x1.ffffecp-1f * b);
  const float an = std::fabs(n);
  if (!(an > 126.0f)) return std::fmaf(k, j, k);
  const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
  const float s1 = std::bit_cast<float>(g + 0x7f000000u);
  const float s2 = std::bit_cast<float>(e - g);
  if (an > 192.0f) return s1 * s1;
  return std::fmaf(s2, j, s2) * s1;
}

// _mm512_reduce_add_ps: a halving tree over 16 lanes (8, 4, 2, 1).
float reduce16(float a[16]) {
  for (int h = 8; h >= 1; h /= 2) {
    for (int l = 0; l < h; ++l) a[l] += a[l + h];
  }
  return a[0];
}

}  // namespace

namespace quant::ref {

// The scalar reference of the kernel table's softmax (tensor/kernels.h SoftmaxFn).
MOESH_FMA_CLONES void softmax(float* x, int64_t n, const float* sink) {
  if (n <= 0) return;
  // The max in 16 lanes (max is exact, so any grouping gives the same value), so it vectorises.
  float m16[16];
  std::fill(m16, m16 + 16, -INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int l = 0; l < 16; ++l) m16[l] = std::max(m16[l], x[i + l]);
  }
  float mx = -INFINITY;
  for (int l = 0; l < 16; ++l) mx = std::max(mx, m16[l]);
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  if (sink != nullptr) mx = std::max(mx, *sink);
  // ggml_vec_soft_max_f32 on AVX-512: 16 at a time with v_expf, each group summed in f32 by a
  // halving tree and added to a double; the n % 16 tail with expf, added one by one.
  double sum = 0.0;
  i = 0;
  for (; i + 16 <= n; i += 16) {
    float e[16];
    for (int l = 0; l < 16; ++l) {
      e[l] = v_expf(x[i + l] - mx);
      x[i + l] = e[l];
    }
    sum += static_cast<double>(reduce16(e));
  }
  for (; i < n; ++i) {
    const float e = std::exp(x[i] - mx);
    x[i] = e;
    sum += static_cast<double>(e);
  }
  if (sink != nullptr) sum += static_cast<double>(std::exp(*sink - mx));
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t k = 0; k < n; ++k) x[k] *= inv;
}

}  // namespace quant::ref

void softmax(float* x, int64_t n, const float* sink) {
  kernels().attn.softmax(x, n, sink);
}

float silu(float x) {
  return x / (1.0f + std::exp(-x));
}

MOESH_FMA_CLONES float silu_v(float x) {
  return x / (1.0f + v_expf(0.0f - x));
}

MOESH_FMA_CLONES float silu_v_avx2(float x) {
  return x / (1.0f + v_expf_avx2(0.0f - x));
}

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

float gelu(float x) {
  constexpr float k_coef_a = 0.044715f;
  constexpr float k_sqrt_2_over_pi = 0.79788456080286535587989211986876f;
  return 0.5f * x * (1.0f + std::tanh(k_sqrt_2_over_pi * x * (1.0f + k_coef_a * x * x)));
}

MOESH_FMA_CLONES void swiglu(const float* g, const float* u, float* y, int64_t n) {
  // ggml_vec_swiglu_f32 on AVX-512 uses ggml_v_silu for every full group of 16 (all of a row
  // whose width is a multiple of 16, the case for every FFN width in practice).
  for (int64_t i = 0; i < n; ++i) y[i] = silu_v(g[i]) * u[i];
}

MOESH_FMA_CLONES void swiglu_limited(const float* g, const float* u, float* y, int64_t n, float limit) {
  // ggml_silu's vector path (ggml_v_silu) for whole groups, as swiglu.
  for (int64_t i = 0; i < n; ++i) y[i] = std::min(silu_v(g[i]), limit) * std::clamp(u[i], -limit, limit);
}

void situ(const float* g, const float* u, float* y, int64_t n, float beta, float lbeta) {
  const float ib = 1.0f / beta, il = lbeta > 0.0f ? 1.0f / lbeta : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = (std::tanh(g[i] * ib) * beta) * sigmoid(g[i]);
    const float b = lbeta > 0.0f ? std::tanh(u[i] * il) * lbeta : u[i];
    y[i] = a * b;
  }
}

void swiglu_oai(const float* g, const float* u, float* y, int64_t n, float alpha, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::min(g[i], limit);
    const float b = std::clamp(u[i], -limit, limit);
    const float glu = a / (1.0f + std::exp(alpha * (-a)));
    y[i] = glu * (b + 1.0f);
  }
}

namespace {

// YaRN correction dimension: the pair index whose wavelength spans n_ctx_orig/(2*pi*beta) turns.
float yarn_corr_dim(int n_rot, int n_ctx_orig, float beta, float base) {
  return static_cast<float>(n_rot) *
         std::log(static_cast<float>(n_ctx_orig) / (beta * 2.0f * std::numbers::pi_v<float>)) / (2.0f * std::log(base));
}

// cos/sin (times mscale) of every rotated pair for one position; cs[2i], cs[2i+1].
void rope_cache(int64_t pos, const RopeParams& p, float* cs) {
  const int n_pairs = p.n_rot / 2;
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_rot));
  float lo = 0.0f, hi = 0.0f;
  float mscale = p.attn_factor;
  if (p.ext_factor != 0.0f) {
    lo = std::max(0.0f, std::floor(yarn_corr_dim(p.n_rot, p.n_ctx_orig, p.beta_fast, p.freq_base)));
    hi = std::min(static_cast<float>(p.n_rot - 1),
                  std::ceil(yarn_corr_dim(p.n_rot, p.n_ctx_orig, p.beta_slow, p.freq_base)));
    // ggml builds with -march=native and GNU C++ (-ffp-contract=fast): this and the mix below
    // are fused multiply-adds in llama.cpp's binary.
    mscale *= std::fmaf(0.1f, std::log(1.0f / p.freq_scale), 1.0f);
  }
  // theta_i = pos * base^(-2i/n_rot), built by repeated f32 multiplication as ggml does, so
  // positions far into the context round the same way llama.cpp's do.
  float theta = static_cast<float>(pos);
  for (int i = 0; i < n_pairs; ++i) {
    const float ff = p.freq_factors != nullptr ? p.freq_factors[i] : 1.0f;
    const float theta_extrap = theta / ff;
    const float theta_interp = p.freq_scale * theta_extrap;
    float t = theta_interp;
    if (p.ext_factor != 0.0f) {
      const float r = (static_cast<float>(i) - lo) / std::max(0.001f, hi - lo);
      const float ramp = 1.0f - std::min(1.0f, std::max(0.0f, r));
      const float mix = ramp * p.ext_factor;
      t = std::fmaf(theta_interp, 1.0f - mix, theta_extrap * mix);
    }
    cs[2 * i] = std::cos(t) * mscale;
    cs[2 * i + 1] = std::sin(t) * mscale;
    theta *= theta_scale;
  }
}

}  // namespace

// The rotation as llama.cpp's rotate_pairs is compiled (GCC, -march=native, GNU mode, so the
// products are contracted; checked bit for bit against ggml_rope_ext of the reference commit for
// NORM and NEOX, n_rot 2..128, with and without YaRN, on AVX2; GCC 12 emits the same instructions
// for -march=sapphirerapids, the reference machine): x0*c - x1*s becomes
// fma(x0, c, -(x1*s)) and x0*s + x1*c becomes fma(x0, s, x1*c). NEOX's loop stays scalar. NORM's
// loop is vectorised (4 and 2 pairs a step, the same contraction), and an odd last pair goes
// through vaddsubps with both products rounded. Rounding the products separately everywhere
// differed from llama.cpp in the last bit for ~20% of the rotated values; the Q8_0 input of wo
// usually hides that, but where one value sits on a rounding boundary it flips an int8 (gptoss-a
// seq64 position 62, glm4moe-a seq64 position 19: 0.067 and 0.019 in the logits).
MOESH_FMA_CLONES void rope(float* x, int n_heads, int head_dim, size_t head_stride, int64_t pos, const RopeParams& p) {
  assert(p.n_rot > 0 && p.n_rot % 2 == 0 && p.n_rot <= head_dim);
  thread_local std::vector<float> cs;
  cs.resize(static_cast<size_t>(p.n_rot));
  rope_cache(pos, p, cs.data());
  const int n_pairs = p.n_rot / 2;
  const bool norm = p.mode == RopeMode::kNorm;
  // NORM with an odd number of pairs: the last one is not fused (see above).
  const int n_fused = norm ? n_pairs & ~1 : n_pairs;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<size_t>(h) * head_stride;
    for (int i = 0; i < n_pairs; ++i) {
      // NORM rotates adjacent pairs; NEOX pairs element i with i + n_rot/2.
      const int i0 = norm ? 2 * i : i;
      const int i1 = norm ? 2 * i + 1 : i + n_pairs;
      const float c = cs[2 * i];
      const float s = cs[2 * i + 1];
      const float x0 = v[i0];
      const float x1 = v[i1];
      if (i < n_fused) {
        v[i0] = std::fmaf(x0, c, -(x1 * s));
        v[i1] = std::fmaf(x0, s, x1 * c);
      } else {
        v[i0] = x0 * c - x1 * s;
        v[i1] = x0 * s + x1 * c;
      }
    }
  }
}

void top_k(const float* v, int n, int k, int32_t* out_idx) {
  k = std::clamp(k, 0, n);
  if (k == 0) return;
  thread_local std::vector<int32_t> idx;
  idx.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = i;
  // NaN ranks below everything so the order stays a strict weak ordering.
  auto key = [&](int32_t i) { return std::isnan(v[i]) ? -INFINITY : v[i]; };
  auto before = [&](int32_t a, int32_t b) {
    const float ka = key(a), kb = key(b);
    if (ka != kb) return ka > kb;
    return a < b;
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), before);
  std::copy(idx.begin(), idx.begin() + k, out_idx);
}

}  // namespace moesh
