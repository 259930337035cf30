// glm4moe (GLM-4.5 / 4.6): GQA with Q/K/V biases, then per-head RMSNorm of Q and K, then NEOX
// RoPE on the first rope.dimension_count dims of each head; leading dense blocks, then MoE with
// sigmoid gating, selection bias, renormalised and scaled weights and a shared expert. The last
// nextn_predict_layers blocks are the NextN/MTP head: never in the forward pass; bound as a
// draft head for speculative decoding (bind_nextn; src/model/nextn.cpp runs it).
//
// Block:  x = rmsnorm(h) ⊙ attn_norm
//         h += wo · attn( rope(qnorm(wq·x + bq)), rope(knorm(wk·x + bk)), wv·x + bv )
//         h += moe_ffn( rmsnorm(h) ⊙ post_attention_norm )   (dense SwiGLU in the leading blocks)
#include "model/arch.h"

namespace moesh {
namespace {

Status read_hparams(const KeyReader& kr, HParams* hp) {
  MOESH_RETURN_IF_ERROR(read_moe_counts(kr, hp, true));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("feed_forward_length", &hp->n_ff));  // dense blocks
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_feed_forward_length", &hp->n_ff_exp));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_shared_count", &hp->n_expert_shared));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("leading_dense_block_count", &hp->n_leading_dense));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("nextn_predict_layers", &hp->n_nextn));
  if (hp->n_nextn < 0 || hp->n_nextn >= hp->n_layer) {
    return make_error(StatusCode::kCorrupt, "{} = {} must be in [0, {} = {})", kr.full("nextn_predict_layers"),
                      hp->n_nextn, kr.full("block_count"), hp->n_layer);
  }
  hp->n_layer -= hp->n_nextn;  // the decoder; the NextN blocks follow it in the file
  MOESH_RETURN_IF_ERROR(kr.opt<float>("expert_weights_scale", &hp->w_scale, 0.0f));
  MOESH_RETURN_IF_ERROR(kr.opt<bool>("expert_weights_norm", &hp->norm_w, false));
  int gating = 0;
  MOESH_RETURN_IF_ERROR(kr.opt<int>("expert_gating_func", &gating, 0));
  if (gating == 0) gating = static_cast<int>(GatingFunc::kSigmoid);  // absent means sigmoid here
  if (gating < 1 || gating > 3) {
    return make_error(StatusCode::kUnsupported, "{} = {} is not supported", kr.full("expert_gating_func"), gating);
  }
  hp->gating = static_cast<GatingFunc>(gating);
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("rope.dimension_count", &hp->n_rot, hp->head_dim_k));
  hp->rope.mode = RopeMode::kNeox;
  hp->qk_norm = QkNorm::kPerHead;
  return Status::ok();
}

Status bind_layer(detail::TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  MOESH_RETURN_IF_ERROR(detail::bind_gqa(b, hp, il, lw, /*biases=*/"qkv"));
  return detail::bind_ffn(b, hp, il, /*moe=*/il >= hp.n_leading_dense, lw, "post_attention_norm.weight",
                          /*need=*/"s");
}

HParams make_defaults() {  // glm4moe-a of the reference set
  HParams hp;
  hp.n_layer = 3;  // decoder blocks; + the archs/ set shape (arch_make_defaults)
  hp.n_head = 4, hp.n_head_kv = 1, hp.head_dim_k = hp.head_dim_v = 128, hp.n_rot = 64;
  hp.rms_eps = 1e-5f, hp.rope.freq_base = 1e6f;
  hp.n_ff = 256, hp.n_leading_dense = 1;
  hp.n_expert = 8, hp.n_expert_used = 2, hp.n_ff_exp = 64, hp.n_expert_shared = 1;
  hp.gating = GatingFunc::kSigmoid, hp.norm_w = true, hp.w_scale = 2.5f;
  hp.n_nextn = 1;  // blk.3: the NextN/MTP block
  return hp;
}

void write_hparams(const HParams& hp, KvList* kv) {
  write_common_head(hp, kv);
  write_gqa_keys(hp, kv);
  put_u32(kv, hp, "feed_forward_length", hp.n_ff);
  put_u32(kv, hp, "leading_dense_block_count", hp.n_leading_dense);
  put_u32(kv, hp, "expert_count", hp.n_expert);
  put_u32(kv, hp, "expert_used_count", hp.n_expert_used);
  put_u32(kv, hp, "expert_feed_forward_length", hp.n_ff_exp);
  put_u32(kv, hp, "expert_shared_count", hp.n_expert_shared);
  put_f32(kv, hp, "expert_weights_scale", hp.w_scale);
  put_bool(kv, hp, "expert_weights_norm", hp.norm_w);
  put_u32(kv, hp, "expert_gating_func", static_cast<int64_t>(hp.gating));
  put_u32(kv, hp, "nextn_predict_layers", hp.n_nextn);
}

}  // namespace

extern const ArchDef kArchGlm4Moe = {
    .name = "glm4moe",
    .read_hparams = read_hparams,
    .bind_globals = nullptr,
    .bind_layer = bind_layer,
    .bind_nextn = detail::bind_nextn_block,
    .mixer = detail::attention_gqa,
    .make_defaults = make_defaults,
    .write_hparams = write_hparams,
    .chat_family = "glm4",
};

}  // namespace moesh
