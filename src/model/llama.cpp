// llama with experts (Mixtral): GQA, NORM RoPE (adjacent pairs; the converter permuted Q/K so
// this is correct) with optional rope_freqs; MoE where ffn_gate_inp exists, dense FFN elsewhere.
//
// Block:  h += wo · attn( rope(wq·x), rope(wk·x), wv·x )   x = rmsnorm(h)·attn_norm
//         h += moe_ffn(rmsnorm(h)·ffn_norm)   (or the dense SwiGLU FFN)
#include "model/layers.h"

namespace moesh::detail {

Status bind_layer_llama(TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  const std::string p = "blk." + std::to_string(il) + ".";
  const int64_t d = hp.n_embd, dk = hp.head_dim_k, dv = hp.head_dim_v;
  MOESH_ASSIGN_OR_RETURN(lw->attn_norm, b.take(p + "attn_norm.weight", {d}));
  MOESH_ASSIGN_OR_RETURN(lw->wq, b.take(p + "attn_q.weight", {d, hp.n_head * dk}));
  MOESH_ASSIGN_OR_RETURN(lw->wk, b.take(p + "attn_k.weight", {d, hp.n_head_kv * dk}));
  MOESH_ASSIGN_OR_RETURN(lw->wv, b.take(p + "attn_v.weight", {d, hp.n_head_kv * dv}));
  MOESH_ASSIGN_OR_RETURN(lw->wo, b.take(p + "attn_output.weight", {hp.n_head * dv, d}));
  MOESH_ASSIGN_OR_RETURN(TensorView router, b.take(p + "ffn_gate_inp.weight", {d, hp.n_expert}, false));
  const bool moe = hp.n_expert > 0 && router.valid();
  return bind_ffn(b, hp, il, moe, lw);
}

}  // namespace moesh::detail
