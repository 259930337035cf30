// glm-dsa (GLM-5.x): DeepSeek-V3-style MLA with q and kv LoRA (layers_mla.cpp) plus DeepSeek
// sparse attention: a lightning indexer (layers_indexer.cpp) scores every visible cell per query
// token and the attention of all heads runs over the attention.indexer.top_k best cells only.
// attention.indexer.types marks per block whether it computes its own selection (1) or reuses
// the one of the nearest earlier block that does (0). Leading dense blocks, then MoE with sigmoid
// gating, selection bias, renormalised and scaled weights and a shared expert. The last
// nextn_predict_layers blocks are the NextN/MTP head (no indexer: dense MLA): never in the
// forward pass, a draft source like glm4moe's.
//
// Block:  x = rmsnorm(h) ⊙ attn_norm;  qr = rmsnorm(attn_q_a · x) ⊙ attn_q_a_norm
//         keep = indexer(x, qr) (own blocks) | keep of the source block (reusing blocks)
//         h += mla(x, qr) over the kept cells   (cache: [c | k_pe | indexer key] per token)
//         h += moe_ffn( rmsnorm(h) ⊙ ffn_norm ) + shexp(…)   (dense SwiGLU in the leading blocks)
#include "model/arch.h"

namespace moesh {
namespace {

// attention.indexer.types: one entry per decoder block (NextN entries, if any, are ignored).
// Absent: every block has its own indexer (GLM-5 / 5.1), except for files with a 1M context,
// which llama.cpp takes for GLM-5.2 (full indexers on blocks 0, 1 and every fourth from 2).
Status read_indexer_types(const KeyReader& kr, int64_t n_blocks, HParams* hp) {
  std::vector<int64_t> types(static_cast<size_t>(hp->n_layer), 1);
  if (kr.has("attention.indexer.types")) {
    const gguf::Value* v = kr.file().find(kr.full("attention.indexer.types"));
    if (v->type == gguf::ValueType::ARRAY) {
      MOESH_ASSIGN_OR_RETURN(types, kr.file().get<std::vector<int64_t>>(kr.full("attention.indexer.types")));
      if (static_cast<int64_t>(types.size()) != hp->n_layer && static_cast<int64_t>(types.size()) != n_blocks) {
        return make_error(StatusCode::kCorrupt, "{} has {} entries for {} decoder blocks",
                          kr.full("attention.indexer.types"), types.size(), hp->n_layer);
      }
      types.resize(static_cast<size_t>(hp->n_layer));
    } else {
      int64_t one = 0;
      MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.indexer.types", &one));
      std::fill(types.begin(), types.end(), one);
    }
  } else if (hp->n_ctx_train >= 1048576) {
    for (int64_t il = 0; il < hp->n_layer; ++il) types[static_cast<size_t>(il)] = il < 2 || (il - 2) % 4 == 0;
  }
  hp->indexer_source.assign(static_cast<size_t>(hp->n_layer), -1);
  int32_t last_full = -1;
  for (int64_t il = 0; il < hp->n_layer; ++il) {
    const int64_t t = types[static_cast<size_t>(il)];
    if (t != 0 && t != 1) {
      return make_error(StatusCode::kCorrupt, "{}[{}] = {} must be 0 or 1", kr.full("attention.indexer.types"), il, t);
    }
    if (t == 1) last_full = static_cast<int32_t>(il);
    if (last_full < 0) {
      return make_error(StatusCode::kCorrupt,
                        "{}: block {} reuses the indexer selection of an earlier block, but none "
                        "before it computes one",
                        kr.full("attention.indexer.types"), il);
    }
    hp->indexer_source[static_cast<size_t>(il)] = last_full;
  }
  return Status::ok();
}

Status read_hparams(const KeyReader& kr, HParams* hp) {
  const int64_t n_blocks = hp->n_layer;  // decoder + NextN blocks
  MOESH_RETURN_IF_ERROR(read_moe_counts(kr, hp, true));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("feed_forward_length", &hp->n_ff));  // dense blocks
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_feed_forward_length", &hp->n_ff_exp));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_shared_count", &hp->n_expert_shared));
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("leading_dense_block_count", &hp->n_leading_dense, 0));
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("nextn_predict_layers", &hp->n_nextn, 0));
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

  MOESH_RETURN_IF_ERROR(read_mla_keys(kr, hp));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.q_lora_rank", &hp->q_lora_rank));
  MOESH_RETURN_IF_ERROR(kr.positive("attention.q_lora_rank", hp->q_lora_rank));  // the indexer reads qr

  // The lightning indexer; its key (RoPE on the first n_rot dims) extends the cached K row.
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.indexer.head_count", &hp->n_indexer_head));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.indexer.key_length", &hp->indexer_head_dim));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.indexer.top_k", &hp->indexer_top_k));
  MOESH_RETURN_IF_ERROR(kr.positive("attention.indexer.head_count", hp->n_indexer_head));
  MOESH_RETURN_IF_ERROR(kr.positive("attention.indexer.top_k", hp->indexer_top_k));
  if (hp->indexer_head_dim < hp->n_rot) {
    return make_error(StatusCode::kCorrupt, "{} = {} is below {} = {} (its first dims rotate)",
                      kr.full("attention.indexer.key_length"), hp->indexer_head_dim, kr.full("rope.dimension_count"),
                      hp->n_rot);
  }
  MOESH_RETURN_IF_ERROR(read_indexer_types(kr, n_blocks, hp));
  hp->kv_k_width += hp->indexer_head_dim;
  return Status::ok();
}

Status bind_layer(detail::TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  MOESH_RETURN_IF_ERROR(detail::bind_mla(b, hp, il, lw));
  MOESH_RETURN_IF_ERROR(detail::bind_indexer(b, hp, il, lw));
  return detail::bind_ffn(b, hp, il, /*moe=*/il >= hp.n_leading_dense, lw, "ffn_norm.weight", /*need=*/"s");
}

HParams make_defaults() {  // glmdsa-a of the archs2/ reference set
  HParams hp;
  hp.n_layer = 3;  // decoder blocks; + the archs/ set shape (arch_make_defaults)
  hp.n_head = 4, hp.n_head_kv = 1, hp.n_rot = 32;
  hp.q_lora_rank = 128, hp.kv_lora_rank = 128, hp.head_dim_qk_mla = 96, hp.head_dim_v_mla = 64;
  hp.head_dim_k = hp.kv_lora_rank + hp.n_rot, hp.head_dim_v = hp.kv_lora_rank;  // the MQA form read back
  hp.rms_eps = 1e-5f, hp.rope.freq_base = 1e6f;
  hp.n_ff = 256, hp.n_leading_dense = 1;
  hp.n_expert = 8, hp.n_expert_used = 2, hp.n_ff_exp = 64, hp.n_expert_shared = 1;
  hp.gating = GatingFunc::kSigmoid, hp.norm_w = true, hp.w_scale = 2.5f;
  hp.n_indexer_head = 8, hp.indexer_head_dim = 64, hp.indexer_top_k = 6;
  hp.n_nextn = 1;  // blk.3: the NextN/MTP block
  return hp;
}

// In the converter's order (the reference file's). Indexer types: hp's own when they cover the
// decoder, else the reference's pattern for any depth (own selection on even blocks, reused on odd).
void write_hparams(const HParams& hp, KvList* kv) {
  std::vector<int32_t> types;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const bool own = static_cast<int64_t>(hp.indexer_source.size()) == hp.n_layer;
    types.push_back(own ? (hp.indexer_source_of(il) == il ? 1 : 0) : (il % 2 == 0 ? 1 : 0));
  }
  write_common_head(hp, kv);
  put_u32(kv, hp, "attention.head_count_kv", 1);
  put_u32(kv, hp, "attention.key_length", hp.kv_lora_rank + hp.n_rot);  // MQA form of the latent
  put_u32(kv, hp, "attention.value_length", hp.kv_lora_rank);
  put_u32(kv, hp, "rope.dimension_count", hp.n_rot);
  put_u32(kv, hp, "feed_forward_length", hp.n_ff);
  put_f32(kv, hp, "rope.freq_base", hp.rope.freq_base);
  put_f32(kv, hp, "attention.layer_norm_rms_epsilon", hp.rms_eps);
  put_u32(kv, hp, "expert_count", hp.n_expert);
  put_u32(kv, hp, "expert_used_count", hp.n_expert_used);
  put_u32(kv, hp, "leading_dense_block_count", hp.n_leading_dense);
  put_u32(kv, hp, "attention.q_lora_rank", hp.q_lora_rank);
  put_u32(kv, hp, "attention.kv_lora_rank", hp.kv_lora_rank);
  put_u32(kv, hp, "attention.key_length_mla", hp.head_dim_qk_mla);
  put_u32(kv, hp, "attention.value_length_mla", hp.head_dim_v_mla);
  put_u32(kv, hp, "expert_feed_forward_length", hp.n_ff_exp);
  put_u32(kv, hp, "expert_shared_count", hp.n_expert_shared);
  put_f32(kv, hp, "expert_weights_scale", hp.w_scale);
  put_bool(kv, hp, "expert_weights_norm", hp.norm_w);
  put_u32(kv, hp, "expert_gating_func", static_cast<int64_t>(hp.gating));
  put_u32(kv, hp, "attention.indexer.head_count", hp.n_indexer_head);
  put_u32(kv, hp, "attention.indexer.key_length", hp.indexer_head_dim);
  put_u32(kv, hp, "attention.indexer.top_k", hp.indexer_top_k);
  kv->emplace_back(hp.arch_name + ".attention.indexer.types", gguf::Value::i32_array(types));
  put_u32(kv, hp, "nextn_predict_layers", hp.n_nextn);
}

}  // namespace

extern const ArchDef kArchGlmDsa = {
    .name = "glm-dsa",
    .read_hparams = read_hparams,
    .bind_globals = nullptr,
    .bind_layer = bind_layer,
    .bind_nextn = detail::bind_nextn_block,
    .mixer = detail::attention_mla,
    .make_defaults = make_defaults,
    .write_hparams = write_hparams,
    .chat_family = "glm4",
};

}  // namespace moesh
