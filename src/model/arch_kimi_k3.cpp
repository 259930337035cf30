// kimi-k3 (Kimi K3): a hybrid of KDA linear attention (layers_deltanet.cpp: a recurrent state per
// sequence, a decay per key channel, short convolutions on q, k and v, a full-rank sigmoid output
// gate) and MLA without RoPE (layers_mla.cpp: the 32 "rope" dims take part unrotated, a sigmoid
// gate on the attention output before attn_output). attention.head_count_kv is an array: 0 marks
// a KDA block. Leading dense blocks, then latent MoE: the router reads the full-width x, the routed
// experts run on z = ffn_routed_down · x (expert_latent_length wide — what goes to the workers),
// their sum comes back through rmsnorm ⊙ ffn_routed_norm and ffn_routed_up; sigmoid + bias
// routing, normalised, × expert_weights_scale, plus a full-width shared expert. Every FFN uses the
// situ activation (activation.situ_beta / situ_linear_beta). Cross-layer residual attention
// (attn_res.block_size B, layers.h block_begin): the stream restarts every B blocks, the input of
// each mixer, FFN and of the output head is a softmax mix of the banked checkpoints and the stream.
//
// Block:  a = mix(p, attn_res_score);  y = kda_or_mla(rmsnorm(a) ⊙ attn_norm)
//         il % B == 0 ? (bank p; p = y) : p += y
//         p += ffn( rmsnorm(mix(p, ffn_res_score)) ⊙ ffn_norm )      (dense situ / latent MoE)
// Head:   logits = output · rmsnorm(mix(p, output_res_score)) ⊙ output_norm
#include "model/arch.h"

namespace moesh {
namespace {

// The recurrent blocks: attention.head_count_kv[il] == 0 (an array; a single number: none).
Status read_recurrent_blocks(const KeyReader& kr, HParams* hp) {
  const gguf::Value* kv = kr.file().find(kr.full("attention.head_count_kv"));
  if (kv == nullptr || kv->type != gguf::ValueType::ARRAY) return Status::ok();
  MOESH_ASSIGN_OR_RETURN(std::vector<int64_t> v,
                         kr.file().get<std::vector<int64_t>>(kr.full("attention.head_count_kv")));
  if (static_cast<int64_t>(v.size()) != hp->n_layer) {
    return make_error(StatusCode::kCorrupt, "{} has {} entries for {} blocks", kr.full("attention.head_count_kv"),
                      v.size(), hp->n_layer);
  }
  hp->recurrent.assign(v.size(), 0);
  bool any = false;
  for (size_t i = 0; i < v.size(); ++i) any |= (hp->recurrent[i] = v[i] == 0 ? 1 : 0) != 0;
  if (!any) hp->recurrent.clear();
  return Status::ok();
}

Status read_hparams(const KeyReader& kr, HParams* hp) {
  MOESH_RETURN_IF_ERROR(read_moe_counts(kr, hp, true));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("feed_forward_length", &hp->n_ff));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_feed_forward_length", &hp->n_ff_exp));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_shared_count", &hp->n_expert_shared));
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("leading_dense_block_count", &hp->n_leading_dense, 0));
  MOESH_RETURN_IF_ERROR(kr.opt<float>("expert_weights_scale", &hp->w_scale, 0.0f));
  MOESH_RETURN_IF_ERROR(kr.opt<bool>("expert_weights_norm", &hp->norm_w, false));
  int gating = 0;
  MOESH_RETURN_IF_ERROR(kr.req<int>("expert_gating_func", &gating));
  if (gating < 1 || gating > 3) {
    return make_error(StatusCode::kUnsupported, "{} = {} is not supported", kr.full("expert_gating_func"), gating);
  }
  hp->gating = static_cast<GatingFunc>(gating);
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("expert_latent_length", &hp->n_expert_latent, 0));
  if (hp->n_expert_latent < 0) {
    return make_error(StatusCode::kCorrupt, "{} = {} must be >= 0", kr.full("expert_latent_length"),
                      hp->n_expert_latent);
  }
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attn_res.block_size", &hp->attn_res_block));
  if (hp->attn_res_block < 0) {
    return make_error(StatusCode::kCorrupt, "{} = {} must be >= 0", kr.full("attn_res.block_size"), hp->attn_res_block);
  }
  // situ everywhere: the routed experts (workers too: part of the expert FFN definition), the
  // shared expert and the dense FFN (LayerWeights::ffn_act).
  hp->expert_ffn.act = ExpertActivation::kSitu;
  MOESH_RETURN_IF_ERROR(kr.req<float>("activation.situ_beta", &hp->expert_ffn.situ_beta));
  MOESH_RETURN_IF_ERROR(kr.req<float>("activation.situ_linear_beta", &hp->expert_ffn.situ_linear_beta));
  if (!(hp->expert_ffn.situ_beta > 0.0f)) {
    return make_error(StatusCode::kCorrupt, "{} = {} must be > 0", kr.full("activation.situ_beta"),
                      hp->expert_ffn.situ_beta);
  }
  MOESH_RETURN_IF_ERROR(read_mla_keys(kr, hp));  // MLA blocks: sizes, latent cache, 1/sqrt(key_length_mla)
  MOESH_RETURN_IF_ERROR(read_recurrent_blocks(kr, hp));
  if (!hp->recurrent.empty()) MOESH_RETURN_IF_ERROR(read_kda_keys(kr, hp));
  return Status::ok();
}

Status bind_globals(detail::TensorBinder& b, HParams* hp) {
  // Model::bind_tensors binds it for the forward pass; named here so make-model writes it.
  if (hp->attn_res_block > 0) return b.take("output_res_score.weight", {hp->n_embd}).status();
  return Status::ok();
}

Status bind_layer(detail::TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  using detail::blk;
  if (hp.is_recurrent(il)) {
    MOESH_RETURN_IF_ERROR(detail::bind_kda(b, hp, il, lw));
  } else {
    MOESH_RETURN_IF_ERROR(detail::bind_mla(b, hp, il, lw));
    lw->rope = false;  // no RoPE: the "rope" dims take part unrotated
    MOESH_ASSIGN_OR_RETURN(lw->out_gate,
                           b.take(blk(il, "attn_gate.weight"), {hp.n_embd, hp.n_head * hp.head_dim_v_mla}));
  }
  if (hp.attn_res_block > 0) {
    MOESH_ASSIGN_OR_RETURN(lw->attn_res_score, b.take(blk(il, "attn_res_score.weight"), {hp.n_embd}));
    MOESH_ASSIGN_OR_RETURN(lw->ffn_res_score, b.take(blk(il, "ffn_res_score.weight"), {hp.n_embd}));
    MOESH_RETURN_IF_ERROR(detail::require_f32(lw->attn_res_score));
    MOESH_RETURN_IF_ERROR(detail::require_f32(lw->ffn_res_score));
  }
  lw->ffn_act = ExpertActivation::kSitu;
  const bool moe = il >= hp.n_leading_dense;
  MOESH_RETURN_IF_ERROR(detail::bind_ffn(b, hp, il, moe, lw, "ffn_norm.weight", /*need=*/"s"));
  if (moe && hp.n_expert_latent > 0) {  // optional in the shared table; kimi-k3 files have it
    MOESH_ASSIGN_OR_RETURN(lw->ffn_routed_norm, b.take(blk(il, "ffn_routed_norm.weight"), {hp.n_expert_latent}));
  }
  return Status::ok();
}

void mixer(detail::Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out) {
  if (f.hp.is_recurrent(il)) {
    detail::attention_kda(f, il, lw, xn, out);
  } else {
    detail::attention_mla(f, il, lw, xn, out);
  }
}

HParams make_defaults() {  // kimik3-a of the archs2/ reference set
  HParams hp;
  hp.n_layer = 4;
  hp.recurrent = {1, 0, 1, 0};
  hp.n_head = 4, hp.n_head_kv = 1;
  hp.kv_lora_rank = 128, hp.head_dim_qk_mla = 96, hp.head_dim_v_mla = 64, hp.n_rot = 32;
  hp.head_dim_k = hp.kv_lora_rank + hp.n_rot, hp.head_dim_v = hp.kv_lora_rank;
  hp.rms_eps = 1e-5f;
  hp.dnet.d_conv = 4, hp.dnet.d_state = 64, hp.dnet.gate_lower_bound = -5.0f;
  hp.n_ff = 256, hp.n_leading_dense = 1;
  hp.n_expert = 8, hp.n_expert_used = 2, hp.n_ff_exp = 64, hp.n_expert_shared = 1;
  hp.gating = GatingFunc::kSigmoid, hp.norm_w = true, hp.w_scale = 2.5f;
  hp.n_expert_latent = 128;
  hp.expert_ffn.act = ExpertActivation::kSitu;
  hp.expert_ffn.situ_beta = 1.5f, hp.expert_ffn.situ_linear_beta = 0.75f;
  hp.attn_res_block = 2;
  return hp;
}

// The keys in the converter's order; head_count_kv per block (0: KDA). Without a recurrent table
// for every block, the reference's pattern: even blocks KDA, odd blocks MLA.
void write_hparams(const HParams& hp, KvList* kv) {
  std::vector<int32_t> kv_heads;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const bool rec = static_cast<int64_t>(hp.recurrent.size()) == hp.n_layer ? hp.is_recurrent(il) : il % 2 == 0;
    kv_heads.push_back(rec ? 0 : 1);
  }
  put_u32(kv, hp, "vocab_size", hp.n_vocab);
  put_u32(kv, hp, "context_length", hp.n_ctx_train);
  put_u32(kv, hp, "embedding_length", hp.n_embd);
  put_u32(kv, hp, "block_count", hp.n_layer);
  put_u32(kv, hp, "attention.head_count", hp.n_head);
  kv->emplace_back(hp.arch_name + ".attention.head_count_kv", gguf::Value::i32_array(kv_heads));
  put_u32(kv, hp, "attention.key_length", hp.kv_lora_rank + hp.n_rot);
  put_u32(kv, hp, "attention.value_length", hp.kv_lora_rank);
  put_u32(kv, hp, "rope.dimension_count", hp.n_rot);
  put_f32(kv, hp, "attention.layer_norm_rms_epsilon", hp.rms_eps);
  put_u32(kv, hp, "attention.kv_lora_rank", hp.kv_lora_rank);
  put_u32(kv, hp, "attention.key_length_mla", hp.head_dim_qk_mla);
  put_u32(kv, hp, "attention.value_length_mla", hp.head_dim_v_mla);
  write_kda_keys(hp, kv);
  put_u32(kv, hp, "feed_forward_length", hp.n_ff);
  put_u32(kv, hp, "expert_count", hp.n_expert);
  put_u32(kv, hp, "expert_used_count", hp.n_expert_used);
  put_u32(kv, hp, "expert_feed_forward_length", hp.n_ff_exp);
  put_u32(kv, hp, "expert_shared_count", hp.n_expert_shared);
  put_u32(kv, hp, "leading_dense_block_count", hp.n_leading_dense);
  put_f32(kv, hp, "expert_weights_scale", hp.w_scale);
  put_bool(kv, hp, "expert_weights_norm", hp.norm_w);
  put_u32(kv, hp, "expert_gating_func", static_cast<int64_t>(hp.gating));
  put_u32(kv, hp, "expert_latent_length", hp.n_expert_latent);
  put_f32(kv, hp, "activation.situ_beta", hp.expert_ffn.situ_beta);
  put_f32(kv, hp, "activation.situ_linear_beta", hp.expert_ffn.situ_linear_beta);
  put_u32(kv, hp, "attn_res.block_size", hp.attn_res_block);
}

}  // namespace

extern const ArchDef kArchKimiK3 = {
    .name = "kimi-k3",
    .read_hparams = read_hparams,
    .bind_globals = bind_globals,
    .bind_layer = bind_layer,
    .bind_nextn = nullptr,
    .mixer = mixer,
    .make_defaults = make_defaults,
    .write_hparams = write_hparams,
    .chat_family = "",
};

}  // namespace moesh
