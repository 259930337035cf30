// llama4 (Llama 4 Scout / Maverick): GQA with "normal" RoPE divided by rope_freqs; every 4th
// block a NoPE layer (no RoPE, no Q/K norm, a query temperature beyond 8192 positions), the
// others chunked attention (8192) with Q and K RMS-normalised WITHOUT weights after RoPE; MoE
// every interleave_moe_layer_step blocks (dense SwiGLU between): top-k of the raw router logits,
// weight sigmoid(logit) multiplying the expert's INPUT (ExpertFfn::input_scaled), outputs summed,
// plus an always-on shared expert of the expert width.
//
// Block:  x = rmsnorm(h) ⊙ attn_norm
//         h += wo · attn( l2(rope(wq·x)), l2(rope(wk·x)), wv·x )     (NoPE: wq·x·temp, wk·x)
//         h += Σ_j E_j(σ(z_j)·x') + shexp(x')   x' = rmsnorm(h) ⊙ ffn_norm   (or dense SwiGLU)
#include "model/arch.h"

namespace moesh {
namespace {

constexpr int64_t kNoRopeStep = 4;  // llama.cpp's n_no_rope_layer_step for llama4

Status read_hparams(const KeyReader& kr, HParams* hp) {
  MOESH_RETURN_IF_ERROR(read_moe_counts(kr, hp, true));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("feed_forward_length", &hp->n_ff));  // dense blocks
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_feed_forward_length", &hp->n_ff_exp));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("interleave_moe_layer_step", &hp->n_moe_layer_step));
  MOESH_RETURN_IF_ERROR(kr.positive("interleave_moe_layer_step", hp->n_moe_layer_step));
  MOESH_RETURN_IF_ERROR(kr.opt<float>("expert_weights_scale", &hp->w_scale, 0.0f));
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("rope.dimension_count", &hp->n_rot, hp->head_dim_k));
  if (hp->n_rot != hp->head_dim_k || hp->head_dim_k != hp->head_dim_v) {
    return make_error(StatusCode::kCorrupt, "llama4: head sizes k {} / v {} and rotary dims {} must be equal",
                      hp->head_dim_k, hp->head_dim_v, hp->n_rot);
  }
  // attention.sliding_window = 0 turns chunking and the NoPE layers off; absent: chunks of 8192.
  int64_t swa = -1;
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("attention.sliding_window", &swa, -1));
  if (swa == 0) {
    hp->no_rope_step = 0;
  } else {
    hp->n_swa = 8192, hp->swa_chunked = true;
    hp->no_rope_step = kNoRopeStep;
    hp->attn_temp_scale = 0.1f, hp->attn_temp_floor = 8192.0f;
  }
  hp->n_expert_shared = 1;  // every MoE block has a shared expert of the expert width
  hp->rope.mode = RopeMode::kNorm;
  hp->qk_norm = hp->n_expert == 128 ? QkNorm::kNone : QkNorm::kUnweighted;  // llama.cpp: not for 128E
  hp->gating = GatingFunc::kSigmoid;
  hp->select_on_logits = true;
  hp->norm_w = false;
  hp->expert_ffn.input_scaled = true;
  return Status::ok();
}

Status bind_layer(detail::TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  MOESH_RETURN_IF_ERROR(detail::bind_gqa(b, hp, il, lw));
  const bool nope = hp.no_rope_step > 0 && (il + 1) % hp.no_rope_step == 0;
  lw->rope = !nope;
  lw->swa = hp.n_swa > 0 && !nope;  // the chunked layers are the RoPE layers (pattern 3 chunked : 1 full)
  const bool moe = (il + 1) % hp.n_moe_layer_step == 0;
  return detail::bind_ffn(b, hp, il, moe, lw);
}

HParams make_defaults() {  // llama4-a of the reference set (without its rope_freqs)
  HParams hp;
  hp.n_layer = 4;  // + the archs/ set shape (arch_make_defaults)
  hp.n_head = 4, hp.n_head_kv = 1, hp.head_dim_k = hp.head_dim_v = 64, hp.n_rot = 64;
  hp.rms_eps = 1e-5f, hp.rope.freq_base = 5e5f;
  hp.n_ff = 256, hp.n_moe_layer_step = 2;
  hp.n_expert = 8, hp.n_expert_used = 2, hp.n_ff_exp = 64;
  return hp;
}

void write_hparams(const HParams& hp, KvList* kv) {
  write_common_head(hp, kv);
  write_gqa_keys(hp, kv, /*lengths=*/false);  // head size n_embd / n_head
  put_u32(kv, hp, "feed_forward_length", hp.n_ff);
  put_u32(kv, hp, "expert_feed_forward_length", hp.n_ff_exp);
  put_u32(kv, hp, "interleave_moe_layer_step", hp.n_moe_layer_step);
  put_u32(kv, hp, "expert_count", hp.n_expert);
  put_u32(kv, hp, "expert_used_count", hp.n_expert_used);
}

}  // namespace

extern const ArchDef kArchLlama4 = {
    .name = "llama4",
    .read_hparams = read_hparams,
    .bind_globals = detail::bind_rope_freqs,
    .bind_layer = bind_layer,
    .bind_nextn = nullptr,
    .mixer = detail::attention_gqa,
    .make_defaults = make_defaults,
    .write_hparams = write_hparams,
    .chat_family = "llama4",
};

}  // namespace moesh
