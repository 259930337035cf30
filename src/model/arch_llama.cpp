// llama with experts (Mixtral): GQA, NORM RoPE (adjacent pairs; the converter permuted Q/K so
// this is correct) with optional rope_freqs; MoE where ffn_gate_inp exists, dense FFN elsewhere;
// softmax router, top-k renormalised, SiLU experts. feed_forward_length is the expert width.
//
// Block:  x = rmsnorm(h) ⊙ attn_norm
//         h += wo · attn( rope(wq·x), rope(wk·x), wv·x )
//         h += moe_ffn( rmsnorm(h) ⊙ ffn_norm )   (or the dense SwiGLU FFN)
#include "model/arch.h"

namespace moesh {
namespace {

Status read_hparams(const KeyReader& kr, HParams* hp) {
  MOESH_RETURN_IF_ERROR(read_moe_counts(kr, hp, false));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("feed_forward_length", &hp->n_ff));
  hp->n_ff_exp = hp->n_ff;  // Mixtral: feed_forward_length is the expert width
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("rope.dimension_count", &hp->n_rot, hp->head_dim_k));
  hp->rope.mode = RopeMode::kNorm;
  hp->gating = GatingFunc::kSoftmax;
  hp->norm_w = true;
  return Status::ok();
}

Status bind_layer(detail::TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  MOESH_RETURN_IF_ERROR(detail::bind_gqa(b, hp, il, lw));
  MOESH_ASSIGN_OR_RETURN(TensorView router,
                         b.take(detail::blk(il, "ffn_gate_inp.weight"), {hp.n_embd, hp.n_expert}, false));
  return detail::bind_ffn(b, hp, il, /*moe=*/hp.n_expert > 0 && router.valid(), lw);
}

}  // namespace

extern const ArchDef kArchLlama = {
    .name = "llama",
    .read_hparams = read_hparams,
    .bind_globals = detail::bind_rope_freqs,
    .bind_layer = bind_layer,
    .bind_nextn = nullptr,
    .mixer = detail::attention_gqa,
    .make_defaults = nullptr,
    .write_hparams = nullptr,
    .chat_family = "",  // Mixtral and Llama dense models share "llama"
};

}  // namespace moesh
