// qwen3moe (Qwen3-MoE, e.g. Qwen3-30B-A3B): GQA with per-head RMSNorm of Q and K before NEOX
// RoPE over the whole head; every block is MoE (softmax router, top-k renormalised, no shared
// expert, SiLU experts).
//
// Block:  x = rmsnorm(h) ⊙ attn_norm
//         h += wo · attn( rope(qnorm(wq·x)), rope(knorm(wk·x)), wv·x )
//         h += moe_ffn( rmsnorm(h) ⊙ ffn_norm )
#include "model/arch.h"

namespace moesh {
namespace {

Status read_hparams(const KeyReader& kr, HParams* hp) {
  MOESH_RETURN_IF_ERROR(read_moe_counts(kr, hp, true));
  if (kr.has("expert_feed_forward_length") || hp->n_ff == 0) {
    MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_feed_forward_length", &hp->n_ff_exp));
  } else {
    hp->n_ff_exp = hp->n_ff / hp->n_expert_used;
  }
  hp->n_rot = hp->head_dim_k;  // qwen3moe rotates the whole head (llama.cpp asserts it)
  hp->rope.mode = RopeMode::kNeox;
  hp->qk_norm = QkNorm::kPerHead;
  hp->gating = GatingFunc::kSoftmax;
  hp->norm_w = true;  // always renormalised, whatever norm_topk_prob said
  return Status::ok();
}

Status bind_layer(detail::TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  MOESH_RETURN_IF_ERROR(detail::bind_gqa(b, hp, il, lw));
  return detail::bind_ffn(b, hp, il, /*moe=*/true, lw);
}

}  // namespace

extern const ArchDef kArchQwen3Moe = {
    .name = "qwen3moe",
    .read_hparams = read_hparams,
    .bind_globals = nullptr,
    .bind_layer = bind_layer,
    .bind_nextn = nullptr,
    .mixer = detail::attention_gqa,
    .make_defaults = nullptr,
    .write_hparams = nullptr,
    .chat_family = "chatml",
};

}  // namespace moesh
