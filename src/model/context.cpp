// The forward pass, top to bottom:
//
//   h = token_embd[tokens]                                    [T][n_embd]
//   for each block il:
//     h += attention_il( rmsnorm(h) ⊙ attn_norm )             (arch-specific attention)
//     h += ffn_il( rmsnorm(h) ⊙ ffn_norm )                     (MoE or dense)
//   logits = output · ( rmsnorm(h) ⊙ output_norm )            [T or 1][n_vocab]
//
// Tokens are appended to their sequence's KV cells first; attention then reads the cache, so a
// batch and the same tokens one at a time see identical keys in identical order.
#include <algorithm>

#include "model/layers.h"

namespace moesh {

namespace {

// K/V widths per cache cell and layer.
std::pair<int64_t, int64_t> kv_widths(const HParams& hp) {
  if (hp.arch == Arch::kDeepseek2) return {hp.kv_lora_rank + hp.n_rot, hp.kv_lora_rank};
  return {hp.n_head_kv * hp.head_dim_k, hp.n_head_kv * hp.head_dim_v};
}

}  // namespace

Context::Context(const Model& model, const ContextParams& params)
    : model_(model),
      pool_(std::make_unique<ThreadPool>(params.n_threads)),
      kv_(model.hparams().n_layer, kv_widths(model.hparams()).first,
          kv_widths(model.hparams()).second,
          params.n_ctx > 0 ? params.n_ctx : model.hparams().n_ctx_train),
      executor_(params.executor),
      scratch_(std::make_unique<Scratch>()) {
  if (!executor_) executor_ = std::make_shared<LocalExecutor>(model.expert_weights(), pool_.get());
}

Context::~Context() = default;

Status Context::decode(int32_t seq, const int32_t* tokens, int64_t n, float* logits,
                       bool all_logits) {
  const HParams& hp = model_.hparams();
  if (n <= 0) return make_error(StatusCode::kInvalidArgument, "decode: empty batch");
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= hp.n_vocab) {
      return make_error(StatusCode::kOutOfRange, "token {} at batch index {} not in [0, {})",
                        tokens[i], i, hp.n_vocab);
    }
  }
  Scratch& s = *scratch_;
  const int64_t T = n, D = hp.n_embd;

  // Positions continue the sequence; the cells are reserved before any layer runs.
  const int64_t n_before = kv_.seq_len(seq);
  const int64_t p0 = kv_.seq_pos_max(seq) + 1;
  int64_t* pos = detail::grow(s.pos, static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) pos[i] = p0 + i;
  MOESH_ASSIGN_OR_RETURN(const int64_t first_cell, kv_.append(seq, pos, T));

  detail::Fwd f{model_, hp, pool_.get(), kv_, s, *executor_, observer_,
                detail::Batch{seq, T, pos, first_cell}};
  const size_t n_act = static_cast<size_t>(T * D);
  float* h = detail::grow(s.h, n_act);
  float* xn = detail::grow(s.xn, n_act);
  float* attn_out = detail::grow(s.attn_out, n_act);
  float* ffn_out = detail::grow(s.ffn_out, n_act);

  // Embeddings (a dequantized row for quantized tables).
  for (int64_t i = 0; i < T; ++i) get_row_f32(model_.tok_embd, tokens[i], h + i * D);

  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& lw = model_.layers[static_cast<size_t>(il)];
    // Attention block.
    detail::rms_norm_rows(h, lw.attn_norm, xn, T, D, hp.rms_eps);
    if (hp.arch == Arch::kDeepseek2) detail::attention_mla(f, il, lw, xn, attn_out);
    else detail::attention_gqa(f, il, lw, xn, attn_out);
    for (size_t i = 0; i < n_act; ++i) h[i] = attn_out[i] + h[i];
    // FFN block.
    detail::rms_norm_rows(h, lw.ffn_norm, xn, T, D, hp.rms_eps);
    if (lw.is_moe) {
      Status st = detail::moe_ffn(f, il, lw, xn, ffn_out);
      if (!st.is_ok()) {
        kv_.seq_truncate(seq, n_before);  // leave the cache as it was
        return st;
      }
    } else {
      detail::dense_ffn(f, lw.ffn_gate, lw.ffn_up, lw.ffn_down, xn, ffn_out);
    }
    for (size_t i = 0; i < n_act; ++i) h[i] = ffn_out[i] + h[i];
    if (observer_ != nullptr) observer_->on_layer_out(il, T, D, h);
  }

  if (logits != nullptr) {
    const int64_t first = all_logits ? 0 : T - 1;
    const int64_t n_out = T - first;
    float* rows = detail::grow(s.out_rows, static_cast<size_t>(n_out * D));
    detail::rms_norm_rows(h + first * D, model_.output_norm, rows, n_out, D, hp.rms_eps);
    detail::project(f, rows, n_out, D, {{&model_.output, logits}});
  }
  return Status::ok();
}

}  // namespace moesh
