// step35 (Step-3.5-Flash): GQA whose blocks differ per layer — query head counts
// (attention.head_count is an array), sliding-window or full attention
// (attention.sliding_window_pattern, a bool per block), and RoPE: sliding-window blocks rotate the
// whole head with rope.freq_base_swa, full blocks only the first rope.dimension_count / 2 dims with
// rope.freq_base and the rope_freqs divisors. Per-head Q/K RMSNorm before RoPE; a head-wise
// sigmoid gate (attn_gate [n_embd, n_head]: one scalar per head and token) on the attention
// output. Leading dense blocks, then MoE: sigmoid gating with selection bias, weights renormalised
// and scaled by expert_weights_scale, plus an ungated shared expert. Per-layer SwiGLU limits
// (swiglu_clamp_exp for the routed experts, swiglu_clamp_shexp for the shared expert and the dense
// FFN). The last nextn_predict_layers blocks are the NextN/MTP head: never in the forward pass, a
// draft source like glm4moe's.
//
// Block:  x = rmsnorm(h) ⊙ attn_norm
//         q, k = rope_il(qnorm(wq·x)), rope_il(knorm(wk·x));  o_h = attn_il(q_h, k, wv·x)  (window on swa blocks)
//         h += wo · [ σ(attn_gate·x)_h · o_h ]_h
//         h += moe_ffn( rmsnorm(h) ⊙ ffn_norm ) + shexp(…)   (dense SwiGLU in the leading blocks)
//         swiglu_L(g, u) = min(silu(g), L) · clamp(u, −L, L) where the block's limit L > 0
#include "model/arch.h"

namespace moesh {
namespace {

// A per-block float key (llama.cpp get_key_or_arr): absent = 0 everywhere, one number for every
// block, or one per block (block_count entries, NextN blocks included).
Status read_block_floats(const KeyReader& kr, const char* key, int64_t n_blocks, std::vector<float>* out) {
  out->assign(static_cast<size_t>(n_blocks), 0.0f);
  const gguf::Value* v = kr.file().find(kr.full(key));
  if (v == nullptr) return Status::ok();
  if (v->type != gguf::ValueType::ARRAY) {
    float x = 0.0f;
    MOESH_RETURN_IF_ERROR(kr.req<float>(key, &x));
    std::fill(out->begin(), out->end(), x);
    return Status::ok();
  }
  MOESH_ASSIGN_OR_RETURN(std::vector<float> a, kr.file().get<std::vector<float>>(kr.full(key)));
  if (static_cast<int64_t>(a.size()) != n_blocks) {
    return make_error(StatusCode::kCorrupt, "{} has {} entries for {} blocks", kr.full(key), a.size(), n_blocks);
  }
  for (float x : a) {
    if (!(x >= 0.0f)) return make_error(StatusCode::kCorrupt, "{}: limit {} must be >= 0", kr.full(key), x);
  }
  *out = std::move(a);
  return Status::ok();
}

Status read_hparams(const KeyReader& kr, HParams* hp) {
  const int64_t n_blocks = hp->n_layer;  // decoder + NextN blocks: the per-block arrays' length
  MOESH_RETURN_IF_ERROR(read_moe_counts(kr, hp, true));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("feed_forward_length", &hp->n_ff));  // dense blocks
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_feed_forward_length", &hp->n_ff_exp));
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("expert_shared_feed_forward_length", &hp->n_ff_shexp));
  hp->n_expert_shared = hp->n_ff_shexp > 0 ? 1 : 0;
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("leading_dense_block_count", &hp->n_leading_dense));
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
  if (gating == 0) gating = static_cast<int>(GatingFunc::kSigmoid);
  if (gating < 1 || gating > 3) {
    return make_error(StatusCode::kUnsupported, "{} = {} is not supported", kr.full("expert_gating_func"), gating);
  }
  hp->gating = static_cast<GatingFunc>(gating);

  // Attention: per-block window pattern; full blocks rotate half of rope.dimension_count.
  MOESH_RETURN_IF_ERROR(kr.req<int64_t>("attention.sliding_window", &hp->n_swa));
  MOESH_RETURN_IF_ERROR(kr.positive("attention.sliding_window", hp->n_swa));
  hp->swa_layer.assign(static_cast<size_t>(n_blocks), 0);
  if (kr.has("attention.sliding_window_pattern")) {
    MOESH_ASSIGN_OR_RETURN(std::vector<bool> pat,
                           kr.file().get<std::vector<bool>>(kr.full("attention.sliding_window_pattern")));
    if (static_cast<int64_t>(pat.size()) != n_blocks) {
      return make_error(StatusCode::kCorrupt, "{} has {} entries for {} blocks",
                        kr.full("attention.sliding_window_pattern"), pat.size(), n_blocks);
    }
    for (size_t i = 0; i < pat.size(); ++i) hp->swa_layer[i] = pat[i] ? 1 : 0;
  }
  int64_t n_rot = 0;
  MOESH_RETURN_IF_ERROR(kr.opt<int64_t>("rope.dimension_count", &n_rot, hp->head_dim_k));
  if (n_rot <= 0 || n_rot % 4 != 0 || n_rot > hp->head_dim_k) {
    return make_error(StatusCode::kCorrupt, "{} = {} must be a positive multiple of 4 <= head dim {}",
                      kr.full("rope.dimension_count"), n_rot, hp->head_dim_k);
  }
  hp->rope.mode = RopeMode::kNeox;
  hp->n_rot = n_rot / 2;  // full-attention blocks (llama.cpp halves it for them)
  hp->rope_swa_own = true;
  hp->rope_swa = hp->rope;
  hp->rope_swa.n_rot = static_cast<int>(n_rot);
  hp->rope_swa.freq_factors = nullptr;  // rope_freqs belongs to the full blocks
  MOESH_RETURN_IF_ERROR(kr.opt<float>("rope.freq_base_swa", &hp->rope_swa.freq_base, hp->rope.freq_base));
  hp->qk_norm = QkNorm::kPerHead;

  // Per-block SwiGLU limits: routed experts (part of the expert FFN definition, so workers
  // compute the same) and the shared expert / dense FFN.
  MOESH_RETURN_IF_ERROR(read_block_floats(kr, "swiglu_clamp_exp", n_blocks, &hp->expert_ffn.swiglu_limit));
  MOESH_RETURN_IF_ERROR(read_block_floats(kr, "swiglu_clamp_shexp", n_blocks, &hp->ffn_swiglu_limit));
  // llama.cpp applies a limit only above 1e-6.
  for (auto* v : {&hp->expert_ffn.swiglu_limit, &hp->ffn_swiglu_limit}) {
    for (float& x : *v) x = x > 1e-6f ? x : 0.0f;
  }
  if (!hp->expert_ffn.has_swiglu_limits()) hp->expert_ffn.swiglu_limit.clear();
  return Status::ok();
}

Status bind_globals(detail::TensorBinder& b, HParams* hp) {
  // rope_freqs [rope.dimension_count / 2]; the full blocks' rotation reads its first n_rot / 2.
  MOESH_ASSIGN_OR_RETURN(TensorView rf, b.take("rope_freqs.weight", {hp->n_rot}, false));
  if (rf.valid()) {
    MOESH_RETURN_IF_ERROR(detail::require_f32(rf));
    hp->rope.freq_factors = detail::f32(rf);
  }
  return Status::ok();
}

Status bind_layer(detail::TensorBinder& b, const HParams& hp, int il, LayerWeights* lw) {
  MOESH_RETURN_IF_ERROR(detail::bind_gqa(b, hp, il, lw));
  lw->swa = static_cast<size_t>(il) < hp.swa_layer.size() && hp.swa_layer[static_cast<size_t>(il)] != 0;
  MOESH_ASSIGN_OR_RETURN(lw->head_gate, b.take(detail::blk(il, "attn_gate.weight"), {hp.n_embd, hp.n_head_of(il)}));
  if (static_cast<size_t>(il) < hp.ffn_swiglu_limit.size()) lw->swiglu_limit = hp.ffn_swiglu_limit[il];
  return detail::bind_ffn(b, hp, il, /*moe=*/il >= hp.n_leading_dense, lw, "ffn_norm.weight", /*need=*/"s");
}

HParams make_defaults() {  // step35-a of the archs2/ reference set
  HParams hp;
  hp.n_layer = 4;  // decoder blocks; + the archs/ set shape (arch_make_defaults)
  hp.n_head = 4, hp.n_head_kv = 2, hp.head_dim_k = hp.head_dim_v = 64, hp.n_rot = 32;
  hp.rms_eps = 1e-5f, hp.rope.freq_base = 5e6f, hp.rope_swa.freq_base = 1e4f;
  hp.n_swa = 8;
  hp.n_ff = 256, hp.n_leading_dense = 1;
  hp.n_expert = 8, hp.n_expert_used = 2, hp.n_ff_exp = 64, hp.n_ff_shexp = 64, hp.n_expert_shared = 1;
  hp.gating = GatingFunc::kSigmoid, hp.norm_w = true, hp.w_scale = 3.0f;
  hp.n_nextn = 1;  // blk.4: the NextN/MTP block
  return hp;
}

// The per-block arrays make-model writes: hp's own when they cover every block, else the
// reference's pattern for any depth — decoder blocks il % 4 in {1, 2} slide (with n_head_kv more
// query heads), the routed experts of the second half and the shared expert of the last block are
// clamped (1.0 / 1.5: reached with these weights); NextN blocks are full and unclamped.
void write_hparams(const HParams& hp, KvList* kv) {
  const int64_t n_blocks = hp.n_layer + hp.n_nextn;
  auto decoder = [&](int64_t il) { return il < hp.n_layer; };
  auto swa = [&](int64_t il) {
    if (static_cast<int64_t>(hp.swa_layer.size()) == n_blocks) return hp.swa_layer[static_cast<size_t>(il)] != 0;
    return decoder(il) && (il % 4 == 1 || il % 4 == 2);
  };
  std::vector<int32_t> heads;
  std::vector<gguf::Value> pattern;
  std::vector<float> clamp_exp, clamp_shexp;
  for (int64_t il = 0; il < n_blocks; ++il) {
    const bool own = static_cast<int64_t>(hp.n_head_layer.size()) == n_blocks;
    heads.push_back(static_cast<int32_t>(own ? hp.n_head_of(il) : hp.n_head + (swa(il) ? hp.n_head_kv : 0)));
    pattern.push_back(gguf::Value::boolean(swa(il)));
    clamp_exp.push_back(static_cast<int64_t>(hp.expert_ffn.swiglu_limit.size()) == n_blocks
                            ? hp.expert_ffn.swiglu_limit_of(il)
                            : (decoder(il) && il >= hp.n_layer / 2 ? 1.0f : 0.0f));
    clamp_shexp.push_back(static_cast<int64_t>(hp.ffn_swiglu_limit.size()) == n_blocks
                              ? hp.ffn_swiglu_limit[static_cast<size_t>(il)]
                              : (il == hp.n_layer - 1 ? 1.5f : 0.0f));
  }
  put_u32(kv, hp, "vocab_size", hp.n_vocab);
  put_u32(kv, hp, "context_length", hp.n_ctx_train);
  put_u32(kv, hp, "embedding_length", hp.n_embd);
  put_u32(kv, hp, "block_count", n_blocks);
  kv->emplace_back(hp.arch_name + ".attention.head_count", gguf::Value::i32_array(heads));
  kv->emplace_back(
      hp.arch_name + ".attention.head_count_kv",
      gguf::Value::i32_array(std::vector<int32_t>(static_cast<size_t>(n_blocks), static_cast<int32_t>(hp.n_head_kv))));
  put_u32(kv, hp, "attention.key_length", hp.head_dim_k);
  put_u32(kv, hp, "attention.value_length", hp.head_dim_v);
  put_u32(kv, hp, "rope.dimension_count", hp.n_rot * 2);  // full blocks rotate half of it
  put_f32(kv, hp, "rope.freq_base", hp.rope.freq_base);
  put_f32(kv, hp, "rope.freq_base_swa", hp.rope_swa.freq_base);
  put_u32(kv, hp, "attention.sliding_window", hp.n_swa);
  kv->emplace_back(hp.arch_name + ".attention.sliding_window_pattern",
                   gguf::Value::array(gguf::ValueType::BOOL, std::move(pattern)));
  put_f32(kv, hp, "attention.layer_norm_rms_epsilon", hp.rms_eps);
  put_u32(kv, hp, "feed_forward_length", hp.n_ff);
  put_u32(kv, hp, "expert_count", hp.n_expert);
  put_u32(kv, hp, "expert_used_count", hp.n_expert_used);
  put_u32(kv, hp, "expert_feed_forward_length", hp.n_ff_exp);
  put_u32(kv, hp, "expert_shared_feed_forward_length", hp.n_ff_shexp);
  put_f32(kv, hp, "expert_weights_scale", hp.w_scale);
  put_bool(kv, hp, "expert_weights_norm", hp.norm_w);
  put_u32(kv, hp, "expert_gating_func", static_cast<int64_t>(hp.gating));
  put_u32(kv, hp, "leading_dense_block_count", hp.n_leading_dense);
  kv->emplace_back(hp.arch_name + ".swiglu_clamp_exp", gguf::Value::f32_array(clamp_exp));
  kv->emplace_back(hp.arch_name + ".swiglu_clamp_shexp", gguf::Value::f32_array(clamp_shexp));
  put_u32(kv, hp, "nextn_predict_layers", hp.n_nextn);
}

}  // namespace

extern const ArchDef kArchStep35 = {
    .name = "step35",
    .read_hparams = read_hparams,
    .bind_globals = bind_globals,
    .bind_layer = bind_layer,
    .bind_nextn = detail::bind_nextn_block,
    .mixer = detail::attention_gqa,
    .make_defaults = make_defaults,
    .write_hparams = write_hparams,
    .chat_family = "",
};

}  // namespace moesh
