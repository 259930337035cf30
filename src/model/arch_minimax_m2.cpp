// minimax-m2 (MiniMax-M2): GQA whose Q and K are RMS-normalised over the WHOLE projection before
// the head split, partial NEOX RoPE; every block MoE with sigmoid gating, a selection bias and
// weights always renormalised; no shared expert. The expert width is feed_forward_length.
//
// Block:  x = rmsnorm(h) ⊙ attn_norm
//         h += wo · attn( rope(norm_full(wq·x)), rope(norm_full(wk·x)), wv·x )
//         h += moe_ffn( rmsnorm(h) ⊙ ffn_norm )
#include "model/arch.h"

namespace moesh {
namespace {

Status read_hparams(const KeyReader& kr, HParams* hp) {
  MOESH_RETURN_IF_ERROR(read_moe_counts(kr, hp, true));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("feed_forward_length", &hp->n_ff_exp));  // the expert width
  int64_t n_ff_exp_key = 0;
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_feed_forward_length", &n_ff_exp_key));  // llama.cpp requires it
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("rope.dimension_count", &hp->n_rot, hp->head_dim_k));
  int gating = 0;
  MOESH_RETURN_IF_ERROR(kr.req<int>("expert_gating_func", &gating));
  if (gating < 1 || gating > 3) {
    return make_error(StatusCode::kUnsupported, "{} = {} is not supported", kr.full("expert_gating_func"), gating);
  }
  hp->gating = static_cast<GatingFunc>(gating);
  MOESH_RETURN_IF_ERROR(kr.opt<float>("expert_weights_scale", &hp->w_scale, 0.0f));
  hp->norm_w = true;  // llama.cpp always renormalises for this architecture
  hp->rope.mode = RopeMode::kNeox;
  hp->qk_norm = QkNorm::kFull;
  return Status::ok();
}

Status bind_layer(detail::TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  MOESH_RETURN_IF_ERROR(detail::bind_gqa(b, hp, il, lw));
  return detail::bind_ffn(b, hp, il, /*moe=*/true, lw, "ffn_norm.weight", /*need=*/"s");
}

HParams make_defaults() {  // minimaxm2-a of the reference set
  HParams hp;
  hp.n_layer = 2;  // + the archs/ set shape (arch_make_defaults)
  hp.n_head = 4, hp.n_head_kv = 1, hp.head_dim_k = hp.head_dim_v = 128, hp.n_rot = 64;
  hp.rms_eps = 1e-6f, hp.rope.freq_base = 5e6f;
  hp.n_expert = 8, hp.n_expert_used = 4, hp.n_ff_exp = 64;
  hp.gating = GatingFunc::kSigmoid;
  return hp;
}

void write_hparams(const HParams& hp, KvList* kv) {
  write_common_head(hp, kv);
  write_gqa_keys(hp, kv);
  put_u32(kv, hp, "feed_forward_length", hp.n_ff_exp);
  put_u32(kv, hp, "expert_feed_forward_length", hp.n_ff_exp);
  put_u32(kv, hp, "expert_count", hp.n_expert);
  put_u32(kv, hp, "expert_used_count", hp.n_expert_used);
  put_u32(kv, hp, "expert_gating_func", static_cast<int64_t>(hp.gating));
}

}  // namespace

extern const ArchDef kArchMinimaxM2 = {
    .name = "minimax-m2",
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
