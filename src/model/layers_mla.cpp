// MLA attention (Multi-head Latent Attention, DeepSeek-V2/V3) in the absorbed form.
//
// MLA, per token (shapes as ggml ne, i.e. [in, out]):
//   q      = wq_b[q_lora, H*(nope+rope)] · rmsnorm(wq_a[n_embd, q_lora] · x) ⊙ q_a_norm
//   [c|kpe]= wkv_a_mqa[n_embd, r+rope] · x ;  c = rmsnorm(c) ⊙ kv_a_norm   (r = kv_lora_rank)
//   rope(q_pe), rope(kpe)   NORM + YaRN; kpe is one head shared by all heads
//   q_abs_h = wk_b[nope, r, H]_h · q_nope_h               (k_b absorbed into the query)
//   attention with one KV head: Q_h = [q_abs_h | q_pe_h], K = [c | kpe], V = c  -> o_h (r)
//   o'_h = wv_b[r, v, H]_h · o_h ;  out = wo[H*v, n_embd] · concat_h o'_h
// kimi-k3 variant: no RoPE (LayerWeights::rope false) and o' *= sigmoid(out_gate · x) before wo.
// The cache holds [c | kpe] (r + rope floats) as K and c as V per token; with a lightning
// indexer (glm-dsa) the K row continues with the token's indexer key (layers_indexer.cpp).
#include <algorithm>
#include <cmath>

#include "model/arch.h"

namespace moesh {

Status read_mla_keys(const KeyReader& kr, HParams* hp) {
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("rope.dimension_count", &hp->n_rot));
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("attention.q_lora_rank", &hp->q_lora_rank, 0));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.kv_lora_rank", &hp->kv_lora_rank));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.key_length_mla", &hp->head_dim_qk_mla));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.value_length_mla", &hp->head_dim_v_mla));
  // The attention works in the compressed space: one KV head of [c | k_pe], V = c.
  if (hp->n_rot <= 0 || hp->head_dim_qk_mla <= hp->n_rot || hp->kv_lora_rank <= 0 || hp->head_dim_v_mla <= 0 ||
      hp->n_rot % 2 != 0) {
    return make_error(StatusCode::kCorrupt,
                      "{}: inconsistent MLA sizes (rope {}, key_length_mla {}, kv_lora {}, value_length_mla {})",
                      hp->arch_name, hp->n_rot, hp->head_dim_qk_mla, hp->kv_lora_rank, hp->head_dim_v_mla);
  }
  hp->head_dim_k = hp->kv_lora_rank + hp->n_rot;
  hp->head_dim_v = hp->kv_lora_rank;
  hp->n_head_kv = 1;
  hp->kv_k_width = hp->kv_lora_rank + hp->n_rot;
  hp->kv_v_width = hp->kv_lora_rank;
  hp->rope.mode = RopeMode::kNorm;

  // YaRN: the RoPE magnitude cancels fully (m = m_all) and goes into the score scale instead
  // (reference README §7).
  const HParams::RopeScaling& rs = hp->rope_scaling;
  if (rs.yarn && rs.factor > 1.0f) {
    const float f = rs.factor;
    // ggml multiplies the rotation by base = 1 + 0.1 ln f; with yarn_log_multiplier the intended
    // magnitude g(m_all) / g(m_all) = 1, without it g(1) = base (llama.cpp's deepseek2 rule).
    const float base = 1.0f + 0.1f * std::log(f);
    hp->rope.attn_factor = (rs.log_mul == 0.0f ? base : 1.0f) / base * rs.attn_factor_cfg;
  } else {
    hp->rope.attn_factor = rs.attn_factor_cfg;
  }
  hp->rope_attn_factor_set = true;
  const float mscale = rs.attn_factor_cfg * (1.0f + rs.log_mul * std::log(1.0f / hp->rope.freq_scale));
  hp->kq_scale = mscale * mscale / std::sqrt(static_cast<float>(hp->head_dim_qk_mla));
  return Status::ok();
}

namespace detail {

Status bind_mla(TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  const int64_t d = hp.n_embd, H = hp.n_head, r = hp.kv_lora_rank, rope = hp.n_rot;
  const int64_t dqk = hp.head_dim_qk_mla, nope = hp.head_dim_qk_nope(), dv = hp.head_dim_v_mla;
  MOESH_ASSIGN_OR_RETURN(lw->attn_norm, b.take(blk(il, "attn_norm.weight"), {d}));
  if (hp.q_lora_rank > 0) {
    MOESH_ASSIGN_OR_RETURN(lw->wq_a, b.take(blk(il, "attn_q_a.weight"), {d, hp.q_lora_rank}));
    MOESH_ASSIGN_OR_RETURN(lw->q_a_norm, b.take(blk(il, "attn_q_a_norm.weight"), {hp.q_lora_rank}));
    MOESH_ASSIGN_OR_RETURN(lw->wq_b, b.take(blk(il, "attn_q_b.weight"), {hp.q_lora_rank, H * dqk}));
  } else {
    MOESH_ASSIGN_OR_RETURN(lw->wq, b.take(blk(il, "attn_q.weight"), {d, H * dqk}));  // V2-Lite
  }
  MOESH_ASSIGN_OR_RETURN(lw->wkv_a_mqa, b.take(blk(il, "attn_kv_a_mqa.weight"), {d, r + rope}));
  MOESH_ASSIGN_OR_RETURN(lw->kv_a_norm, b.take(blk(il, "attn_kv_a_norm.weight"), {r}));
  MOESH_ASSIGN_OR_RETURN(lw->wk_b, b.take(blk(il, "attn_k_b.weight"), {nope, r, H}, false));
  MOESH_ASSIGN_OR_RETURN(lw->wv_b, b.take(blk(il, "attn_v_b.weight"), {r, dv, H}, false));
  if (!lw->wk_b.valid() || !lw->wv_b.valid()) {
    // A legacy conversion (one attn_kv_b) says so; otherwise they are required like the others
    // (make-model's recording binder takes them from here).
    auto legacy = b.take(blk(il, "attn_kv_b.weight"), {r, H * (nope + dv)}, false);
    if (legacy.is_ok() && legacy->valid()) {
      return make_error(StatusCode::kUnsupported,
                        "{}attn_k_b/attn_v_b missing: GGUFs with the legacy attn_kv_b tensor are not "
                        "supported (re-convert with a current llama.cpp)",
                        blk(il, ""));
    }
    MOESH_ASSIGN_OR_RETURN(lw->wk_b, b.take(blk(il, "attn_k_b.weight"), {nope, r, H}));
    MOESH_ASSIGN_OR_RETURN(lw->wv_b, b.take(blk(il, "attn_v_b.weight"), {r, dv, H}));
  }
  MOESH_ASSIGN_OR_RETURN(lw->wo, b.take(blk(il, "attn_output.weight"), {H * dv, d}));
  return Status::ok();
}

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
    if (lw.rope) {                                            // kimi-k3: no RoPE, the "rope" dims take part unrotated
      rope(kvt + r, 1, static_cast<int>(rope_d), static_cast<size_t>(rope_d), f.batch.pos[t], hp.rope);
      rope(q + t * H * dqk + nope, static_cast<int>(H), static_cast<int>(rope_d), static_cast<size_t>(dqk),
           f.batch.pos[t], hp.rope);
    }
    const int64_t cell = f.batch.cell[t];
    std::copy_n(kvt, dk, f.kv.k(f.batch.seq[t], state_layer(f, il), cell));
    std::copy_n(kvt, r, f.kv.v(f.batch.seq[t], state_layer(f, il), cell));
  }

  // Sparse attention (glm-dsa): the block's own selection (its indexer reads qr), or that of
  // an earlier block of this batch, still in the scratch.
  AttnCoreOpts opts;
  const int32_t src = hp.indexer_source_of(il);
  if (src >= 0) {
    if (src == il) lightning_indexer(f, il, lw, xn, f.s.qa.data());
    opts.cell_keep = f.s.dsa_keep.data();
    opts.cell_n_keep = f.s.dsa_n_keep.data();
    opts.cell_keep_stride = hp.indexer_top_k;
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
  attention_core(f, il, qf, H, 1, dk, r, hp.kq_scale, o, opts);

  // Decompress each head's output with wv_b, then the output projection.
  float* ov = grow(f.s.v, static_cast<size_t>(T * H * dv));
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t t = 0; t < T; ++t) std::copy_n(o + (t * H + h) * r, r, tmp + t * r);
    const TensorView wv_b_h = lw.wv_b.expert(h);
    project(f, tmp, T, r, {{&wv_b_h, ov + h * dv, static_cast<size_t>(H * dv)}});
  }
  if (lw.out_gate.valid()) {
    // kimi-k3: o *= sigmoid(attn_gate · x), x the attn-normed input, element by element.
    float* g = grow(f.s.qa, static_cast<size_t>(T * H * dv));
    project(f, xn, T, hp.n_embd, {{&lw.out_gate, g}});
    for (int64_t i = 0; i < T * H * dv; ++i) ov[i] = ov[i] * sigmoid(g[i]);
  }
  project(f, ov, T, H * dv, {{&lw.wo, out}});
}

}  // namespace detail
}  // namespace moesh
