// MLA attention (Multi-head Latent Attention, DeepSeek-V2/V3) in the absorbed form.
//
// MLA, per token (shapes as ggml ne, i.e. [in, out]):
//   q      = wq_b[q_lora, H*(nope+rope)] · rmsnorm(wq_a[n_embd, q_lora] · x) ⊙ q_a_norm
//   [c|kpe]= wkv_a_mqa[n_embd, r+rope] · x ;  c = rmsnorm(c) ⊙ kv_a_norm   (r = kv_lora_rank)
//   rope(q_pe), rope(kpe)   NORM + YaRN; kpe is one head shared by all heads
//   q_abs_h = wk_b[nope, r, H]_h · q_nope_h               (k_b absorbed into the query)
//   attention with one KV head: Q_h = [q_abs_h | q_pe_h], K = [c | kpe], V = c  -> o_h (r)
//   o'_h = wv_b[r, v, H]_h · o_h ;  out = wo[H*v, n_embd] · concat_h o'_h
// The cache holds [c | kpe] (r + rope floats) as K and c as V per token.
#include <algorithm>

#include "model/layers.h"

namespace moesh::detail {

void attention_mla(Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out) {
  const HParams& hp = f.hp;
  const int64_t T = f.batch.n, H = hp.n_head;
  const int64_t r = hp.kv_lora_rank, rope_d = hp.n_rot;
  const int64_t dqk = hp.head_dim_qk_mla, nope = hp.head_dim_qk_nope(), dv = hp.head_dim_v_mla;
  const int64_t dk = r + rope_d;  // width of the latent key / absorbed query

  // Query and compressed KV projections.
  float* q = grow(f.s.q, static_cast<size_t>(T * H * dqk));
  float* kv = grow(f.s.k, static_cast<size_t>(T * dk));
  if (lw.wq_a.valid()) {
    float* qa = grow(f.s.qa, static_cast<size_t>(T * hp.q_lora_rank));
    project(f, xn, T, hp.n_embd, {{&lw.wq_a, qa}, {&lw.wkv_a_mqa, kv}});
    rms_norm_rows(qa, lw.q_a_norm, qa, T, hp.q_lora_rank, hp.rms_eps);
    project(f, qa, T, hp.q_lora_rank, {{&lw.wq_b, q}});
  } else {
    project(f, xn, T, hp.n_embd, {{&lw.wq, q}, {&lw.wkv_a_mqa, kv}});
  }

  for (int64_t t = 0; t < T; ++t) {
    float* kvt = kv + t * dk;
    rms_norm_rows(kvt, lw.kv_a_norm, kvt, 1, r, hp.rms_eps);  // c only; k_pe is not normed
    rope(kvt + r, 1, static_cast<int>(rope_d), static_cast<size_t>(rope_d), f.batch.pos[t], hp.rope);
    rope(q + t * H * dqk + nope, static_cast<int>(H), static_cast<int>(rope_d), static_cast<size_t>(dqk),
         f.batch.pos[t], hp.rope);
    const int64_t cell = f.batch.cell[t];
    std::copy_n(kvt, dk, f.kv.k(f.batch.seq[t], state_layer(f, il), cell));
    std::copy_n(kvt, r, f.kv.v(f.batch.seq[t], state_layer(f, il), cell));
  }

  // Absorbed query: Q_h = [wk_b_h · q_nope_h | q_pe_h], [T][H][dk].
  float* qf = grow(f.s.o2, static_cast<size_t>(T * H * dk));
  float* tmp = grow(f.s.tmp, static_cast<size_t>(T * std::max(nope, r)));
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t t = 0; t < T; ++t) std::copy_n(q + (t * H + h) * dqk, nope, tmp + t * nope);
    const TensorView wk_b_h = lw.wk_b.expert(h);
    project(f, tmp, T, nope, {{&wk_b_h, qf + h * dk, static_cast<size_t>(H * dk)}});
    for (int64_t t = 0; t < T; ++t) {
      std::copy_n(q + (t * H + h) * dqk + nope, rope_d, qf + (t * H + h) * dk + r);
    }
  }

  // MQA over the latent cache: one KV head of [c | kpe], V = c.
  float* o = grow(f.s.o, static_cast<size_t>(T * H * r));
  attention_core(f, il, qf, H, 1, dk, r, hp.kq_scale, o);

  // Decompress each head's output with wv_b, then the output projection.
  float* ov = grow(f.s.v, static_cast<size_t>(T * H * dv));
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t t = 0; t < T; ++t) std::copy_n(o + (t * H + h) * r, r, tmp + t * r);
    const TensorView wv_b_h = lw.wv_b.expert(h);
    project(f, tmp, T, r, {{&wv_b_h, ov + h * dv, static_cast<size_t>(H * dv)}});
  }
  project(f, ov, T, H * dv, {{&lw.wo, out}});
}

}  // namespace moesh::detail
