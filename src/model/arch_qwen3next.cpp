// qwen3next (Qwen3-Next): a hybrid. Most blocks mix tokens with a gated DeltaNet (linear
// attention with a recurrent state per sequence, layers_deltanet.cpp); every
// full_attention_interval-th block runs gated full attention instead — per head, attn_q emits
// [query | gate], Q/K get per-head RMSNorm and partial NEOX RoPE, and the attention output is
// multiplied by sigmoid(gate). Every block is MoE: softmax router, top-k renormalised, plus a
// shared expert scaled by sigmoid(ffn_gate_inp_shexp · x). DeltaNet value head h reads key head
// h / (n_v / n_k) (the converter keeps the original grouped order; qwen35moe differs).
//
// Block:  x = rmsnorm(h) ⊙ attn_norm
//         h += recurrent(il) ? deltanet(x) : wo · (attn(rope(qnorm(q)), rope(knorm(wk·x)), wv·x) ⊙ σ(gate))
//         h += moe_ffn( rmsnorm(h) ⊙ post_attention_norm )
#include "model/arch.h"

namespace moesh {

// Shared by qwen35moe (arch_qwen35moe.cpp), which differs only where it says so.
Status read_qwen3next_keys(const KeyReader& kr, HParams* hp) {
  MOESH_RETURN_IF_ERROR(read_moe_counts(kr, hp, true));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_feed_forward_length", &hp->n_ff_exp));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_shared_feed_forward_length", &hp->n_ff_shexp));
  hp->n_expert_shared = 1;  // one shared expert, gated
  hp->shexp_gated = true;
  MOESH_RETURN_IF_ERROR(kr.opt<float>("expert_weights_scale", &hp->w_scale, 0.0f));
  hp->gating = GatingFunc::kSoftmax;
  hp->norm_w = true;
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("nextn_predict_layers", &hp->n_nextn, 0));
  if (hp->n_nextn < 0 || hp->n_nextn >= hp->n_layer) {
    return make_error(StatusCode::kCorrupt, "{} = {} must be in [0, {} = {})", kr.full("nextn_predict_layers"),
                      hp->n_nextn, kr.full("block_count"), hp->n_layer);
  }
  hp->n_layer -= hp->n_nextn;  // the MTP block follows the decoder in the file: loaded, not run
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("rope.dimension_count", &hp->n_rot, hp->head_dim_k));
  hp->rope.mode = RopeMode::kNeox;
  hp->qk_norm = QkNorm::kPerHead;
  hp->q_gated = true;
  return read_deltanet_keys(kr, hp);
}

void write_qwen3next_keys(const HParams& hp, KvList* kv) {
  write_common_head(hp, kv);
  write_gqa_keys(hp, kv);
  put_u32(kv, hp, "expert_count", hp.n_expert);
  put_u32(kv, hp, "expert_used_count", hp.n_expert_used);
  put_u32(kv, hp, "expert_feed_forward_length", hp.n_ff_exp);
  put_u32(kv, hp, "expert_shared_feed_forward_length", hp.n_ff_shexp);
  write_deltanet_keys(hp, kv);
}

Status bind_qwen3next_layer(detail::TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  if (hp.is_recurrent(il)) {
    MOESH_RETURN_IF_ERROR(detail::bind_deltanet(b, hp, il, lw));
  } else {
    MOESH_RETURN_IF_ERROR(detail::bind_gqa(b, hp, il, lw));
  }
  return detail::bind_ffn(b, hp, il, /*moe=*/true, lw, "post_attention_norm.weight");
}

HParams qwen3next_make_defaults() {  // qwen3next-a of the reference set
  HParams hp;
  hp.n_layer = 2;
  hp.n_head = 4, hp.n_head_kv = 1, hp.head_dim_k = hp.head_dim_v = 128, hp.n_rot = 32;
  hp.rms_eps = 1e-6f, hp.rope.freq_base = 1e7f;
  hp.n_expert = 8, hp.n_expert_used = 2, hp.n_ff_exp = 64, hp.n_ff_shexp = 64, hp.n_expert_shared = 1;
  hp.dnet.d_conv = 4, hp.dnet.d_state = 32, hp.dnet.n_k_head = 2, hp.dnet.n_v_head = 8, hp.dnet.d_inner = 256;
  hp.dnet.attn_interval = 2;
  return hp;
}

namespace {

Status read_hparams(const KeyReader& kr, HParams* hp) {
  MOESH_RETURN_IF_ERROR(read_qwen3next_keys(kr, hp));
  hp->dnet.tiled = false;     // grouped value heads
  hp->dnet.split_ba = false;  // one ssm_ba, grouped by key head
  return Status::ok();
}

}  // namespace

extern const ArchDef kArchQwen3Next = {
    .name = "qwen3next",
    .read_hparams = read_hparams,
    .bind_globals = nullptr,
    .bind_layer = bind_qwen3next_layer,
    .bind_nextn = nullptr,
    .mixer = hybrid_mixer,
    .make_defaults = qwen3next_make_defaults,
    .write_hparams = write_qwen3next_keys,
    .chat_family = "chatml",
};

}  // namespace moesh
