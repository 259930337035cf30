// gpt-oss (gpt-oss-20b / -120b): GQA with biases on Q, K, V and the output, one learned
// attention-sink logit per head, sliding-window layers (even blocks by default) alternating with
// full ones, NEOX RoPE with YaRN (its magnitude factor kept); every block MoE: router with bias,
// softmax over the k selected logits, experts with gate/up/down biases and the clamped
// "swiglu-oai" activation; no shared expert. Weights ship as MXFP4.
//
// Block:  x = rmsnorm(h) ⊙ attn_norm
//         h += wo · attn_sinks( rope(wq·x+bq), rope(wk·x+bk), wv·x+bv ) + bo   (window on swa blocks)
//         h += Σ_j softmax(z_sel)_j · (Wd_j a_j + bd_j),  a = swiglu_oai(Wg x'+bg, Wu x'+bu)
//              x' = rmsnorm(h) ⊙ post_attention_norm,   z = Wr x' + br
#include "model/arch.h"

namespace moesh {
namespace {

Status read_hparams(const KeyReader& kr, HParams* hp) {
  MOESH_RETURN_IF_ERROR(read_moe_counts(kr, hp, true));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_feed_forward_length", &hp->n_ff_exp));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.sliding_window", &hp->n_swa));
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("attention.sliding_window_pattern", &hp->swa_period, 2));
  float base_swa = 0.0f;
  MOESH_RETURN_IF_ERROR(kr.opt<float>("rope.freq_base_swa", &base_swa, hp->rope.freq_base));
  if (base_swa != hp->rope.freq_base) {
    return make_error(StatusCode::kUnsupported, "{} = {} differs from rope.freq_base {}: not supported",
                      kr.full("rope.freq_base_swa"), base_swa, hp->rope.freq_base);
  }
  MOESH_RETURN_IF_ERROR(kr.opt<float>("expert_weights_scale", &hp->w_scale, 0.0f));
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("rope.dimension_count", &hp->n_rot, hp->head_dim_k));
  hp->rope.mode = RopeMode::kNeox;
  hp->gating = GatingFunc::kSoftmaxWeight;
  hp->norm_w = false;
  hp->expert_ffn.act = ExpertActivation::kSwigluOai;
  hp->expert_ffn.biases = true;
  return Status::ok();
}

Status bind_layer(detail::TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  MOESH_RETURN_IF_ERROR(detail::bind_gqa(b, hp, il, lw, /*biases=*/"qkvo", /*sinks=*/true));
  // llama.cpp's set_swa_pattern(p): every layer but the last of each period slides.
  lw->swa = hp.n_swa > 0 && (hp.swa_period <= 1 || il % hp.swa_period < hp.swa_period - 1);
  return detail::bind_ffn(b, hp, il, /*moe=*/true, lw, "post_attention_norm.weight", /*need=*/"r");
}

HParams make_defaults() {  // gptoss-a of the reference set
  HParams hp;
  hp.n_layer = 2;  // + the archs/ set shape (arch_make_defaults)
  hp.n_head = 8, hp.n_head_kv = 1, hp.head_dim_k = hp.head_dim_v = 64, hp.n_rot = 64;
  hp.rms_eps = 1e-5f, hp.rope.freq_base = 150000.0f;
  hp.rope_scaling.yarn = true, hp.rope_scaling.factor = 32.0f, hp.rope.n_ctx_orig = 128;
  hp.n_swa = 8;
  hp.n_expert = 8, hp.n_expert_used = 4, hp.n_ff_exp = 64;
  return hp;
}

void write_hparams(const HParams& hp, KvList* kv) {
  write_common_head(hp, kv);
  write_gqa_keys(hp, kv, /*lengths=*/true, /*rope_dims=*/false);  // rotary dims = the head
  put_u32(kv, hp, "attention.sliding_window", hp.n_swa);
  put_u32(kv, hp, "expert_feed_forward_length", hp.n_ff_exp);
  put_u32(kv, hp, "expert_count", hp.n_expert);
  put_u32(kv, hp, "expert_used_count", hp.n_expert_used);
  if (hp.rope_scaling.yarn) {
    kv->emplace_back(hp.arch_name + ".rope.scaling.type", gguf::Value::str("yarn"));
    put_f32(kv, hp, "rope.scaling.factor", hp.rope_scaling.factor);
    put_u32(kv, hp, "rope.scaling.original_context_length", hp.rope.n_ctx_orig);
  }
}

}  // namespace

extern const ArchDef kArchGptOss = {
    .name = "gpt-oss",
    .read_hparams = read_hparams,
    .bind_globals = nullptr,
    .bind_layer = bind_layer,
    .bind_nextn = nullptr,
    .mixer = detail::attention_gqa,
    .make_defaults = make_defaults,
    .write_hparams = write_hparams,
    .chat_family = "harmony",
};

}  // namespace moesh
