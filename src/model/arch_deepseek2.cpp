// deepseek2 (DeepSeek-V2/V3/R1): Multi-head Latent Attention (MLA, layers_mla.cpp) in the
// absorbed form, YaRN RoPE on the rope dims, the first `leading_dense_block_count` blocks dense,
// the rest MoE with sigmoid (V3) or softmax (V2) gating, selection bias, group-limited routing
// and shared experts.
//
// Block:  x = rmsnorm(h) ⊙ attn_norm
//         h += mla(x)                              (cache: latent [c | k_pe] per token)
//         h += moe_ffn( rmsnorm(h) ⊙ ffn_norm )    (dense SwiGLU in the leading blocks)
#include "model/arch.h"

namespace moesh {
namespace {

Status read_hparams(const KeyReader& kr, HParams* hp) {
  MOESH_RETURN_IF_ERROR(read_moe_counts(kr, hp, true));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("feed_forward_length", &hp->n_ff));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("leading_dense_block_count", &hp->n_leading_dense));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_feed_forward_length", &hp->n_ff_exp));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_shared_count", &hp->n_expert_shared));
  MOESH_RETURN_IF_ERROR(kr.opt<float>("expert_weights_scale", &hp->w_scale, 0.0f));
  MOESH_RETURN_IF_ERROR(kr.opt<bool>("expert_weights_norm", &hp->norm_w, false));
  int gating = 0;
  MOESH_RETURN_IF_ERROR(kr.opt<int>("expert_gating_func", &gating, 0));
  if (gating == 0) gating = static_cast<int>(GatingFunc::kSoftmax);  // V2 files lack the key
  if (gating < 1 || gating > 3) {
    return make_error(StatusCode::kUnsupported, "{} = {} is not supported", kr.full("expert_gating_func"), gating);
  }
  hp->gating = static_cast<GatingFunc>(gating);
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("expert_group_count", &hp->n_group, 0));
  if (hp->n_group > 1) {
    MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_group_used_count", &hp->n_group_used));
  }
  return read_mla_keys(kr, hp);  // MLA sizes, the latent cache, YaRN into the score scale
}

Status bind_layer(detail::TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  MOESH_RETURN_IF_ERROR(detail::bind_mla(b, hp, il, lw));
  return detail::bind_ffn(b, hp, il, /*moe=*/il >= hp.n_leading_dense, lw);
}

}  // namespace

extern const ArchDef kArchDeepseek2 = {
    .name = "deepseek2",
    .read_hparams = read_hparams,
    .bind_globals = nullptr,
    .bind_layer = bind_layer,
    .bind_nextn = nullptr,
    .mixer = detail::attention_mla,
    .make_defaults = nullptr,
    .write_hparams = nullptr,
    .chat_family = "",  // DeepSeek-V2 and V3 (both "deepseek2") use different templates
};

}  // namespace moesh
