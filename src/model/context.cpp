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
      kv_(model.hparams().n_layer, kv_widths(model.hparams()).first, kv_widths(model.hparams()).second,
          params.n_ctx > 0 ? params.n_ctx : model.hparams().n_ctx_train),
      executor_(params.executor),
      scratch_(std::make_unique<Scratch>()) {
  if (!executor_)
    executor_ = std::make_shared<LocalExecutor>(model.expert_weights(), pool_.get());
  else
    executor_->set_pool(pool_.get());
}

Context::~Context() {
  // A shared executor may outlive this context: it must not keep using the pool that dies here.
  if (executor_) executor_->set_pool(nullptr);
}

Status Context::decode(int32_t seq, const int32_t* tokens, int64_t n, float* logits, bool all_logits) {
  if (n <= 0) return make_error(StatusCode::kInvalidArgument, "decode: empty batch");
  std::vector<BatchToken> batch(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    batch[i] = {seq, tokens[i], logits != nullptr && (all_logits || i == n - 1)};
  }
  return decode_batch(batch, logits);
}

Status Context::decode_batch(std::span<const BatchToken> batch, float* logits) {
  const HParams& hp = model_.hparams();
  const int64_t T = static_cast<int64_t>(batch.size()), D = hp.n_embd;
  if (T == 0) return make_error(StatusCode::kInvalidArgument, "decode: empty batch");
  int64_t n_out = 0;
  for (int64_t i = 0; i < T; ++i) {
    const int32_t tok = batch[i].token;
    if (tok < 0 || tok >= hp.n_vocab) {
      return make_error(StatusCode::kOutOfRange, "token {} at batch index {} not in [0, {})", tok, i, hp.n_vocab);
    }
    n_out += batch[i].logits ? 1 : 0;
  }
  if (n_out > 0 && logits == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "decode: logits requested but no buffer given");
  }
  Scratch& s = *scratch_;

  // Cells are reserved for every sequence before any layer runs: positions continue each
  // sequence, a token's cell is its index within its sequence.
  int32_t* seq = detail::grow(s.seq, static_cast<size_t>(T));
  int64_t* pos = detail::grow(s.pos, static_cast<size_t>(T));
  int64_t* cell = detail::grow(s.cell, static_cast<size_t>(T));
  struct SeqStep {
    int32_t seq;
    int64_t n_before, n_new = 0;
  };
  std::vector<SeqStep> steps;
  for (int64_t i = 0; i < T; ++i) {
    const int32_t sq = batch[i].seq;
    auto it = std::find_if(steps.begin(), steps.end(), [&](const SeqStep& x) { return x.seq == sq; });
    if (it == steps.end()) {
      steps.push_back({sq, kv_.seq_len(sq)});
      it = steps.end() - 1;
    }
    seq[i] = sq;
    cell[i] = it->n_before + it->n_new;
    ++it->n_new;
  }
  std::vector<int64_t> new_pos;
  for (size_t k = 0; k < steps.size(); ++k) {
    const SeqStep& st = steps[k];
    const int64_t p0 = kv_.seq_pos_max(st.seq) + 1;
    new_pos.resize(static_cast<size_t>(st.n_new));
    for (int64_t j = 0; j < st.n_new; ++j) new_pos[j] = p0 + j;
    auto first = kv_.append(st.seq, new_pos.data(), st.n_new);
    if (!first) {
      for (size_t r = 0; r < k; ++r) kv_.seq_truncate(steps[r].seq, steps[r].n_before);
      return first.status();
    }
  }
  for (int64_t i = 0; i < T; ++i) pos[i] = kv_.positions(seq[i])[cell[i]];
  auto rollback = [&] {
    for (const SeqStep& st : steps) kv_.seq_truncate(st.seq, st.n_before);
  };

  detail::Fwd f{model_, hp, pool_.get(), kv_, s, *executor_, observer_, detail::Batch{T, seq, pos, cell}};
  const size_t n_act = static_cast<size_t>(T * D);
  float* h = detail::grow(s.h, n_act);
  float* xn = detail::grow(s.xn, n_act);
  float* attn_out = detail::grow(s.attn_out, n_act);
  float* ffn_out = detail::grow(s.ffn_out, n_act);

  // Embeddings (a dequantized row for quantized tables).
  for (int64_t i = 0; i < T; ++i) get_row_f32(model_.tok_embd, batch[i].token, h + i * D);

  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& lw = model_.layers[static_cast<size_t>(il)];
    // Attention block.
    detail::rms_norm_rows(h, lw.attn_norm, xn, T, D, hp.rms_eps);
    if (hp.arch == Arch::kDeepseek2)
      detail::attention_mla(f, il, lw, xn, attn_out);
    else
      detail::attention_gqa(f, il, lw, xn, attn_out);
    for (size_t i = 0; i < n_act; ++i) h[i] = attn_out[i] + h[i];
    // FFN block.
    detail::rms_norm_rows(h, lw.ffn_norm, xn, T, D, hp.rms_eps);
    if (lw.is_moe) {
      Status st = detail::moe_ffn(f, il, lw, xn, ffn_out);
      if (!st.is_ok()) {
        rollback();  // leave the cache as it was
        return st;
      }
    } else {
      detail::dense_ffn(f, lw.ffn_gate, lw.ffn_up, lw.ffn_down, xn, ffn_out);
    }
    for (size_t i = 0; i < n_act; ++i) h[i] = ffn_out[i] + h[i];
    if (observer_ != nullptr) observer_->on_layer_out(il, T, D, h);
  }

  if (n_out > 0) {
    // Gather the rows that want logits, norm them, one projection for all.
    float* rows = detail::grow(s.out_rows, static_cast<size_t>(n_out * D));
    int64_t r = 0;
    for (int64_t i = 0; i < T; ++i) {
      if (!batch[i].logits) continue;
      detail::rms_norm_rows(h + i * D, model_.output_norm, rows + r * D, 1, D, hp.rms_eps);
      ++r;
    }
    detail::project(f, rows, n_out, D, {{&model_.output, logits}});
  }
  return Status::ok();
}

}  // namespace moesh
