// qwen3moe (Qwen3-MoE, e.g. Qwen3-30B-A3B): GQA with per-head RMSNorm of Q and K before NEOX
// RoPE; every block is MoE (softmax router, top-k renormalised, no shared expert).
//
// Block:  h += wo · attn( rope(qnorm(wq·x)), rope(knorm(wk·x)), wv·x )   x = rmsnorm(h)·attn_norm
//         h += moe_ffn(rmsnorm(h)·ffn_norm)
// The forward pass itself is shared (context.cpp, layers.cpp); this file binds the tensors.
#include "model/layers.h"

namespace moesh::detail {

Status bind_layer_qwen3moe(TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  const std::string p = "blk." + std::to_string(il) + ".";
  const int64_t d = hp.n_embd, dk = hp.head_dim_k, dv = hp.head_dim_v;
  if (dk != hp.n_rot) {
    return make_error(StatusCode::kCorrupt, "qwen3moe: key_length {} must equal the rotary dims {}", dk, hp.n_rot);
  }
  MOESH_ASSIGN_OR_RETURN(lw->attn_norm, b.take(p + "attn_norm.weight", {d}));
  MOESH_ASSIGN_OR_RETURN(lw->wq, b.take(p + "attn_q.weight", {d, hp.n_head * dk}));  // [n_embd, n_head*dk]
  MOESH_ASSIGN_OR_RETURN(lw->wk, b.take(p + "attn_k.weight", {d, hp.n_head_kv * dk}));
  MOESH_ASSIGN_OR_RETURN(lw->wv, b.take(p + "attn_v.weight", {d, hp.n_head_kv * dv}));
  MOESH_ASSIGN_OR_RETURN(lw->wo, b.take(p + "attn_output.weight", {hp.n_head * dv, d}));
  MOESH_ASSIGN_OR_RETURN(lw->q_norm, b.take(p + "attn_q_norm.weight", {dk}));  // per head
  MOESH_ASSIGN_OR_RETURN(lw->k_norm, b.take(p + "attn_k_norm.weight", {dk}));
  return bind_ffn(b, hp, il, /*moe=*/true, lw);
}

}  // namespace moesh::detail
