// Transformer ops on f32 activations, and matmul against (quantized) weight views.
//
// Activations are row-major [n_rows][n_cols] float arrays. Every op computes a row from that row
// alone, in a fixed order, so results are independent of thread count and batch composition.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "moesh/tensor/tensor.h"
#include "moesh/tensor/threadpool.h"
#include "moesh/tensor/types.h"

namespace moesh {

// Activation rows converted to a weight type's vec_dot_type (quant.h), one row per token.
struct QuantizedRows {
  GgmlType type = GgmlType::F32;
  int64_t n_cols = 0;  // K
  int64_t n_rows = 0;  // tokens
  size_t row_bytes = 0;
  std::vector<uint8_t> data;
  const uint8_t* row(int64_t i) const { return data.data() + static_cast<size_t>(i) * row_bytes; }
};

// Quantizes x[n_rows][k] into `type` (Q8_0, Q8_1, Q8_K, F16, BF16 or F32) using the current
// kernel table; parallel over rows.
void quantize_rows(GgmlType type, const float* x, int64_t n_rows, int64_t k, QuantizedRows* out, ThreadPool* pool);

// y[n][m] = dot(W row m, x row n) for a 2-D weight view W with ne = [K, M] (any supported type;
// e.g. one expert slab). x is f32 [n_rows][K]; y is f32 [n_rows][M] (row stride ldy >= M).
// Quantizes x to vec_dot_type(W.type) first. pool may be null (single thread).
void matmul(const TensorView& w, const float* x, int64_t n_rows, float* y, ThreadPool* pool);
void matmul(const TensorView& w, const float* x, int64_t n_rows, float* y, size_t ldy, ThreadPool* pool);
// Same with activations already quantized to vec_dot_type(W.type) (reused across experts).
void matmul_q(const TensorView& w, const QuantizedRows& xq, float* y, size_t ldy, ThreadPool* pool);
// Several matmul_q at once, as one pool job (the projections that share an input: q/k/v,
// gate/up). Results are bit-identical to calling matmul_q on each. ldy 0 means W.ne[1].
// At most 8 jobs.
struct MatmulQ {
  const TensorView* w = nullptr;
  const QuantizedRows* xq = nullptr;
  float* y = nullptr;
  size_t ldy = 0;
};
void matmul_q_multi(std::span<const MatmulQ> jobs, ThreadPool* pool);
// Subset of token rows: y[j] for rows[j] of xq (used by MoE: the tokens routed to one expert).
void matmul_q_rows(const TensorView& w, const QuantizedRows& xq, const int32_t* rows, int64_t n_sel, float* y,
                   size_t ldy, ThreadPool* pool);

// Dequantizes row i of a (2-D) weight view into f32 (embedding lookup).
void get_row_f32(const TensorView& w, int64_t i, float* out);

// ---- elementwise / per-row ops (single row; callers loop over rows) ----
// RMSNorm: sum of squares in double, mean=(float)(sum/n), y = x * (1/sqrtf(mean+eps)), then y*w
// (w may be null). In-place allowed (y == x).
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps);
// Softmax in place with ggml's AVX-512 float order (ggml_vec_soft_max_f32): max; groups of 16
// through ggml's vector exp (v_expf) with each group's f32 halving-tree sum added to a double;
// the n % 16 tail through expf; then multiply by (float)(1/sum). To reproduce a padded ggml row
// (attention over a KV window), pass the padded length with -inf in the padding.
// With `sink` (an attention sink, gpt-oss): one more logit that joins the max and the
// denominator but has no output (ggml soft_max_ext with sinks).
void softmax(float* x, int64_t n, const float* sink = nullptr);
float silu(float x);         // x/(1+expf(-x)) (ggml_silu_f32)
float silu_v(float x);       // x/(1+v_expf(-x)) (ggml_v_silu, one lane)
float silu_v_avx2(float x);  // the same with ggml_v_expf as built for AVX2 (kimi-k3's KDA: layers_deltanet.cpp)
float sigmoid(float x);      // 1/(1+expf(-x))
float gelu(float x);         // tanh approximation
// y[i] = silu_v(g[i]) * u[i] (ggml_vec_swiglu_f32's vector path)
void swiglu(const float* g, const float* u, float* y, int64_t n);
// Clamped SwiGLU (step35): y[i] = min(silu_v(g[i]), limit) * clamp(u[i], -limit, limit) (llama.cpp's
// ggml_silu, ggml_clamp twice, ggml_mul; the gate is clamped after SiLU and from above only).
void swiglu_limited(const float* g, const float* u, float* y, int64_t n, float limit);
// gpt-oss: a=min(g,limit), b=clamp(u,-limit,limit), y = a*sigmoid(alpha*a)*(b+1)
void swiglu_oai(const float* g, const float* u, float* y, int64_t n, float alpha = 1.702f, float limit = 7.0f);
// situ (kimi-k3): y[i] = beta*tanh(g[i]/beta)*sigmoid(g[i]) * lbeta*tanh(u[i]/lbeta), the up branch
// plain u[i] when lbeta <= 0 (llama.cpp: ggml_scale by 1/beta, ggml_tanh, ggml_scale, ggml_mul).
void situ(const float* g, const float* u, float* y, int64_t n, float beta, float lbeta);

// RoPE (ggml rope_f32 semantics incl. YaRN), applied in place to one token's heads.
enum class RopeMode { kNorm, kNeox };
struct RopeParams {
  RopeMode mode = RopeMode::kNorm;
  int n_rot = 0;  // rotated dims per head (<= head_dim); the rest pass through
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;  // 1/rope.scaling.factor
  float ext_factor = 0.0f;  // YaRN mix (1 when scaling type is yarn)
  float attn_factor = 1.0f;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int n_ctx_orig = 0;
  const float* freq_factors = nullptr;  // rope_freqs.weight [n_rot/2] or null
};
// x: [n_heads][head_dim] with head stride `head_stride` floats.
void rope(float* x, int n_heads, int head_dim, size_t head_stride, int64_t pos, const RopeParams& p);

// Top-k indices of v[0..n) by descending value, ties broken by lower index (deterministic).
void top_k(const float* v, int n, int k, int32_t* out_idx);

}  // namespace moesh
