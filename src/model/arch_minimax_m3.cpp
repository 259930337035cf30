// minimax-m3 (MiniMax-M3): GQA with per-head Q/K RMSNorm (one head_dim vector for every head)
// and partial NEOX RoPE, as minimax-m2 but per head; leading dense blocks, then MoE blocks with
// sigmoid gating + selection bias, weights renormalised and scaled, and a shared expert; every
// FFN (dense, routed, shared) uses gpt-oss's swiglu-oai (α 1.702, limit 7, no biases). The MoE
// blocks run MiniMax sparse attention (MSA, layers_msa.cpp): a block indexer with one head per
// KV group picks, per token and group, the `local_blocks` most recent position blocks plus the
// best others up to `top_k`, and the group's query heads attend only there.
//
// Block:  x = rmsnorm(h) ⊙ attn_norm
//         q, k = rope(qnorm_h(wq·x)), rope(knorm_h(wk·x))
//         h += wo · attn(q, k, wv·x)          dense blocks: causal
//                                              MoE blocks: causal within the group's taken blocks
//         h += ffn( rmsnorm(h) ⊙ ffn_norm )   dense swiglu-oai, or MoE × scale + shared expert
#include "model/arch.h"

namespace moesh {
namespace {

Status read_hparams(const KeyReader& kr, HParams* hp) {
  MOESH_RETURN_IF_ERROR(read_moe_counts(kr, hp, true));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("feed_forward_length", &hp->n_ff));  // dense blocks
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
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("rope.dimension_count", &hp->n_rot, hp->head_dim_k));
  hp->rope.mode = RopeMode::kNeox;
  hp->qk_norm = QkNorm::kPerHead;
  hp->expert_ffn.act = ExpertActivation::kSwigluOai;

  // MSA: llama.cpp reads the indexer keys as optional (0 = absent); a model with MoE blocks
  // needs them all.
  HParams::Msa& m = hp->msa;
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("attention.indexer.head_count", &m.n_head, 0));
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("attention.indexer.key_length", &m.head_dim, 0));
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("attention.indexer.top_k", &m.top_k, 0));
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("attention.indexer.block_size", &m.block, 0));
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("attention.indexer.local_blocks", &m.local, 0));
  if (hp->n_leading_dense < 0 || hp->n_leading_dense > hp->n_layer) {
    return make_error(StatusCode::kCorrupt, "{} = {} must be in [0, {}]", kr.full("leading_dense_block_count"),
                      hp->n_leading_dense, hp->n_layer);
  }
  if (hp->n_leading_dense < hp->n_layer) {
    for (const char* k : {"attention.indexer.head_count", "attention.indexer.key_length", "attention.indexer.top_k",
                          "attention.indexer.block_size"}) {
      int64_t v = 0;
      MOESH_RETURN_IF_ERROR(kr.req<int64_t>(k, &v));
      MOESH_RETURN_IF_ERROR(kr.positive(k, v));
    }
    if (m.n_head != hp->n_head_kv) {
      return make_error(StatusCode::kUnsupported, "{} = {}: one indexer head per KV group ({} = {}) is required",
                        kr.full("attention.indexer.head_count"), m.n_head, kr.full("attention.head_count_kv"),
                        hp->n_head_kv);
    }
    if (m.local < 0)
      return make_error(StatusCode::kCorrupt, "{} = {} < 0", kr.full("attention.indexer.local_blocks"), m.local);
    if (hp->n_rot > m.head_dim) {
      return make_error(StatusCode::kCorrupt, "{} = {} exceeds {} = {}", kr.full("rope.dimension_count"), hp->n_rot,
                        kr.full("attention.indexer.key_length"), m.head_dim);
    }
    // The indexer key is cached with the layer's K heads (one cache row per cell and layer).
    hp->kv_k_width = hp->n_head_kv * hp->head_dim_k + m.head_dim;
    hp->kv_v_width = hp->n_head_kv * hp->head_dim_v;
  } else {
    m = HParams::Msa{};
  }
  return Status::ok();
}

Status bind_layer(detail::TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  MOESH_RETURN_IF_ERROR(detail::bind_gqa(b, hp, il, lw));
  const bool moe = il >= hp.n_leading_dense;
  if (moe) MOESH_RETURN_IF_ERROR(detail::bind_msa(b, hp, il, lw));
  // Dense blocks attend through llama.cpp's build_attn, whose flash attention (on for this
  // architecture) casts the F32 K/V cache to F16; MSA blocks hand it the F32 cache.
  lw->kv_f16 = !moe;
  lw->ffn_act = ExpertActivation::kSwigluOai;
  return detail::bind_ffn(b, hp, il, moe, lw, "ffn_norm.weight", /*need=*/"s");
}

HParams make_defaults() {  // minimaxm3-a of the archs2/ reference set
  HParams hp;
  hp.n_layer = 3;  // + the archs/ set shape (arch_make_defaults)
  hp.n_head = 4, hp.n_head_kv = 2, hp.head_dim_k = hp.head_dim_v = 64, hp.n_rot = 32;
  hp.rms_eps = 1e-6f, hp.rope.freq_base = 5e6f;
  hp.n_ff = 256, hp.n_leading_dense = 1;
  hp.n_expert = 8, hp.n_expert_used = 2, hp.n_ff_exp = 64, hp.n_expert_shared = 1;
  hp.gating = GatingFunc::kSigmoid, hp.norm_w = true, hp.w_scale = 2.0f;
  hp.msa.n_head = 2, hp.msa.head_dim = 64, hp.msa.top_k = 2, hp.msa.block = 4, hp.msa.local = 1;
  return hp;
}

void write_hparams(const HParams& hp, KvList* kv) {
  write_common_head(hp, kv);
  put_u32(kv, hp, "attention.head_count_kv", hp.n_head_kv);
  put_u32(kv, hp, "attention.key_length", hp.head_dim_k);
  put_u32(kv, hp, "attention.value_length", hp.head_dim_v);
  put_u32(kv, hp, "rope.dimension_count", hp.n_rot);
  put_u32(kv, hp, "feed_forward_length", hp.n_ff);
  put_f32(kv, hp, "rope.freq_base", hp.rope.freq_base);
  put_f32(kv, hp, "attention.layer_norm_rms_epsilon", hp.rms_eps);
  put_u32(kv, hp, "expert_count", hp.n_expert);
  put_u32(kv, hp, "expert_used_count", hp.n_expert_used);
  put_u32(kv, hp, "leading_dense_block_count", hp.n_leading_dense);
  put_u32(kv, hp, "expert_feed_forward_length", hp.n_ff_exp);
  put_u32(kv, hp, "expert_shared_count", hp.n_expert_shared);
  put_f32(kv, hp, "expert_weights_scale", hp.w_scale);
  put_bool(kv, hp, "expert_weights_norm", hp.norm_w);
  put_u32(kv, hp, "expert_gating_func", static_cast<int64_t>(hp.gating));
  // One indexer head per KV group (whatever n_head_kv make-model was given); its key at least
  // as long as the rotated part.
  put_u32(kv, hp, "attention.indexer.head_count", hp.n_head_kv);
  put_u32(kv, hp, "attention.indexer.key_length", std::max(hp.msa.head_dim, hp.n_rot));
  put_u32(kv, hp, "attention.indexer.top_k", hp.msa.top_k);
  put_u32(kv, hp, "attention.indexer.block_size", hp.msa.block);
  put_u32(kv, hp, "attention.indexer.local_blocks", hp.msa.local);
}

}  // namespace

extern const ArchDef kArchMinimaxM3 = {
    .name = "minimax-m3",
    .read_hparams = read_hparams,
    .bind_globals = nullptr,
    .bind_layer = bind_layer,
    .bind_nextn = nullptr,
    .mixer = detail::attention_gqa,
    .make_defaults = make_defaults,
    .write_hparams = write_hparams,
    .chat_family = "",  // no family of its own yet
};

}  // namespace moesh
