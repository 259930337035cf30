// deepseek2 (DeepSeek-V2/V3/R1): Multi-head Latent Attention (MLA, layers_mla.cpp) in the
// absorbed form, YaRN RoPE on the rope dims, the first `leading_dense_block_count` blocks dense,
// the rest MoE with sigmoid (V3) or softmax (V2) gating, selection bias, group-limited routing
// and shared experts.
//
// Block:  x = rmsnorm(h) ⊙ attn_norm
//         h += mla(x)                              (cache: latent [c | k_pe] per token)
//         h += moe_ffn( rmsnorm(h) ⊙ ffn_norm )    (dense SwiGLU in the leading blocks)
#include <cmath>

#include "model/arch.h"

namespace moesh {
namespace {

Status read_hparams(const KeyReader& kr, HParams* hp) {
  MOESH_RETURN_IF_ERROR(read_moe_counts(kr, hp, true));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("feed_forward_length", &hp->n_ff));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("rope.dimension_count", &hp->n_rot));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("leading_dense_block_count", &hp->n_leading_dense));
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("attention.q_lora_rank", &hp->q_lora_rank, 0));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.kv_lora_rank", &hp->kv_lora_rank));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.key_length_mla", &hp->head_dim_qk_mla));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.value_length_mla", &hp->head_dim_v_mla));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_feed_forward_length", &hp->n_ff_exp));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_shared_count", &hp->n_expert_shared));
  MOESH_RETURN_IF_ERROR(kr.opt<float>("expert_weights_scale", &hp->w_scale, 0.0f));
  MOESH_RETURN_IF_ERROR(kr.opt<bool>("expert_weights_norm", &hp->norm_w, false));
  int gating = 0;
  MOESH_RETURN_IF_ERROR(kr.opt<int>("expert_gating_func", &gating, 0));
  if (gating == 0) gating = static_cast<int>(GatingFunc::kSoftmax);  // V2 files lack the key
  if (gating < 1 || gating > 3) {
    return make_error(StatusCode::kUnsupported, "{} = {} is not supported", kr.full("expert_gating_func"), gating);
  }
  hp->gating = static_cast<GatingFunc>(gating);
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("expert_group_count", &hp->n_group, 0));
  if (hp->n_group > 1) {
    MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_group_used_count", &hp->n_group_used));
  }
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

Status bind_layer(detail::TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  using detail::blk;
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
    return make_error(StatusCode::kUnsupported,
                      "{}attn_k_b/attn_v_b missing: GGUFs with the legacy attn_kv_b tensor are not "
                      "supported (re-convert with a current llama.cpp)",
                      blk(il, ""));
  }
  MOESH_ASSIGN_OR_RETURN(lw->wo, b.take(blk(il, "attn_output.weight"), {H * dv, d}));
  return detail::bind_ffn(b, hp, il, /*moe=*/il >= hp.n_leading_dense, lw);
}

}  // namespace

extern const ArchDef kArchDeepseek2 = {
    .name = "deepseek2",
    .read_hparams = read_hparams,
    .bind_globals = nullptr,
    .bind_layer = bind_layer,
    .bind_nextn = nullptr,
    .mixer = detail::attention_mla,
    .make_defaults = nullptr,
    .write_hparams = nullptr,
    .chat_family = "",  // DeepSeek-V2 and V3 (both "deepseek2") use different templates
};

}  // namespace moesh
