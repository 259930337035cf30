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
#include <bit>
#include <chrono>
#include <memory>
#include <optional>

#include "model/arch.h"

namespace moesh {

namespace {

// The state slots blocks [first, last] use: KV layers and recurrent layers, each a contiguous run
// (slots are numbered in block order). A span outside the model, or last < 0: every block.
struct SlotRange {
  int64_t kv_base = 0, kv_count = 0, rec_base = 0, rec_count = 0;
};
// Blocks a span runs elsewhere: their state is not kept here (ContextParams::spans, with every
// block otherwise; slot_map_). Overlapping or out-of-range spans are reported by the constructor.
std::vector<bool> span_blocks(const HParams& hp, const ContextParams& p) {
  std::vector<bool> out(static_cast<size_t>(hp.n_layer), false);
  if (!p.spans || p.layers.last >= 0) return out;
  for (const LayerSpan& sp : p.spans->spans())
    for (int64_t il = std::max<int64_t>(sp.first, 0); il <= sp.last && il < hp.n_layer; ++il)
      out[static_cast<size_t>(il)] = true;
  return out;
}

SlotRange slots_of(const HParams& hp, const ContextParams& p) {
  const LayerSpan sp = p.layers;
  if (sp.last < 0 || sp.first < 0 || sp.last < sp.first || sp.last >= hp.n_layer) {
    const std::vector<bool> away = span_blocks(hp, p);
    SlotRange r{0, 0, 0, 0};
    for (int64_t il = 0; il < hp.n_layer; ++il)
      if (!away[static_cast<size_t>(il)]) ++(hp.is_recurrent(il) ? r.rec_count : r.kv_count);
    return r;
  }
  SlotRange r{-1, 0, -1, 0};
  for (int il = sp.first; il <= sp.last; ++il) {
    const int64_t slot = hp.state_slot[static_cast<size_t>(il)];
    if (hp.is_recurrent(il)) {
      if (r.rec_base < 0) r.rec_base = slot;
      ++r.rec_count;
    } else {
      if (r.kv_base < 0) r.kv_base = slot;
      ++r.kv_count;
    }
  }
  r.kv_base = std::max<int64_t>(r.kv_base, 0);
  r.rec_base = std::max<int64_t>(r.rec_base, 0);
  return r;
}

}  // namespace

Context::Context(const Model& model, const ContextParams& params)
    : model_(model),
      pool_(std::make_unique<ThreadPool>(params.n_threads)),
      kv_(slots_of(model.hparams(), params).kv_count, model.hparams().kv_k_width, model.hparams().kv_v_width,
          params.n_ctx > 0 ? params.n_ctx : model.hparams().n_ctx_train),
      rec_(slots_of(model.hparams(), params).rec_count > 0
               ? std::make_unique<RecurrentState>(slots_of(model.hparams(), params).rec_count,
                                                  model.hparams().rec_width, params.checkpoints)
               : nullptr),
      state_(&kv_, rec_.get()),
      executor_(params.executor),
      scratch_(std::make_unique<Scratch>()),
      micro_batching_(params.micro_batching) {
  run_pool_ = pool_.get();
  if (!executor_)
    executor_ = std::make_shared<LocalExecutor>(model.expert_weights(), pool_.get());
  else
    executor_->set_pool(pool_.get());
  const SlotRange slots = slots_of(model.hparams(), params);
  if (const std::vector<bool> away = span_blocks(model.hparams(), params);
      std::find(away.begin(), away.end(), true) != away.end()) {
    // Compact state layers for the blocks that run here, in block order.
    const HParams& hp = model.hparams();
    slot_map_.assign(static_cast<size_t>(hp.n_layer), -1);
    int32_t n_kv = 0, n_rec = 0;
    for (int64_t il = 0; il < hp.n_layer; ++il)
      if (!away[static_cast<size_t>(il)]) slot_map_[static_cast<size_t>(il)] = hp.is_recurrent(il) ? n_rec++ : n_kv++;
  }
  if (!model.holds_all_blocks() && (params.layers.last < 0 || params.layers.first < model.blocks().first ||
                                    params.layers.last > model.blocks().last)) {
    span_status_ = make_error(StatusCode::kInvalidArgument,
                              "the model file holds blocks {}-{} only (a span slice): run it as a span peer "
                              "(moesh span --layers within them)",
                              model.blocks().first, model.blocks().last);
  }
  if (params.layers.last >= 0) {
    if (slots.kv_count == model.hparams().n_kv_layer && slots.rec_count == model.hparams().n_rec_layer &&
        (params.layers.first != 0 || params.layers.last != model.hparams().n_layer - 1)) {
      span_status_ = make_error(StatusCode::kInvalidArgument, "blocks {}-{} are not within the model's 0-{}",
                                params.layers.first, params.layers.last, model.hparams().n_layer - 1);
    }
    layers_ = params.layers;
    kv_base_ = slots.kv_base;
    rec_base_ = slots.rec_base;
  }
  spans_ = params.spans;
  if (spans_) {
    if (span_status_.is_ok()) span_status_ = map_spans();
    state_.set_listener(spans_.get());
    spans_->set_pool(pool_.get());  // spans run here compute on these threads, not on a second pool
  }
}

// span_at_ from the runner's spans, which must cover exactly the blocks whose state this
// context does not keep (slot_map_ -1): a resplit moves edges within them only.
Status Context::map_spans() {
  const HParams& hp = model_.hparams();
  const int n_layer = static_cast<int>(hp.n_layer);
  std::vector<int> at(static_cast<size_t>(n_layer), -1);
  std::vector<bool> covered(static_cast<size_t>(n_layer), false);
  int next_free = 0;
  const auto& sp = spans_->spans();
  for (size_t k = 0; k < sp.size(); ++k) {
    if (sp[k].first < next_free || sp[k].last < sp[k].first || sp[k].last >= n_layer) {
      return make_error(StatusCode::kInvalidArgument, "span {}-{} is not within blocks 0-{} after the previous span",
                        sp[k].first, sp[k].last, n_layer - 1);
    }
    at[static_cast<size_t>(sp[k].first)] = static_cast<int>(k);
    for (int il = sp[k].first; il <= sp[k].last; ++il) covered[static_cast<size_t>(il)] = true;
    next_free = sp[k].last + 1;
  }
  if (!slot_map_.empty()) {
    for (int il = 0; il < n_layer; ++il) {
      if (covered[static_cast<size_t>(il)] != (slot_map_[static_cast<size_t>(il)] < 0)) {
        return make_error(StatusCode::kInternal,
                          "the span runner's spans now {} block {}, which this context {}: spans may only move "
                          "their edges within the blocks they covered",
                          covered[static_cast<size_t>(il)] ? "cover" : "leave out", il,
                          covered[static_cast<size_t>(il)] ? "runs itself" : "keeps no state for");
      }
    }
  }
  span_at_ = std::move(at);
  return Status::ok();
}

Context::~Context() {
  // A shared executor (span runner) may outlive this context: it must not keep using the pool
  // that dies here.
  if (executor_) executor_->set_pool(nullptr);
  if (spans_) spans_->set_pool(nullptr);
}

void Context::borrow_pool(ThreadPool* pool) {
  run_pool_ = pool != nullptr ? pool : pool_.get();
  executor_->set_pool(run_pool_);
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
  if (!span_status_.is_ok()) return span_status_;
  if (layers_.last >= 0 && (layers_.first != 0 || layers_.last != hp.n_layer - 1)) {
    return make_error(StatusCode::kInvalidArgument, "decode: this context holds blocks {}-{} only (decode_layers)",
                      layers_.first, layers_.last);
  }
  Scratch& s = *scratch_;
  n_hidden_ = 0;

  // Cells are reserved for every sequence before any layer runs: positions continue each
  // sequence, a token's cell is its index within its sequence.
  std::vector<uint8_t> wants(static_cast<size_t>(T));
  int32_t* seq_in = detail::grow(s.seq, static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) {
    seq_in[i] = batch[i].seq;
    wants[static_cast<size_t>(i)] = batch[i].logits ? 1 : 0;
  }
  std::vector<SeqStep> steps;
  std::vector<int32_t> step_of;  // token i belongs to steps[step_of[i]]
  // The spans stay as they are for this pass (a resplit waits for it); a new generation is
  // mapped first.
  SpanPass pass(spans_.get());
  if (spans_ && pass.generation() != span_generation_) {
    Status mapped = map_spans();
    if (!mapped.is_ok()) return mapped;
    span_generation_ = pass.generation();
  }
  MOESH_RETURN_IF_ERROR(reserve_cells(T, nullptr, wants.data(), &steps, &step_of));
  const int32_t* seq = s.seq.data();
  const int64_t* pos = s.pos.data();
  const int64_t* cell = s.cell.data();
  auto rollback = [&] {
    for (const SeqStep& st : steps) {
      (void)kv_.truncate(st.seq, st.n_before);
      if (rec_) rec_->abort_step(st.seq);
    }
  };

  // One micro-batch, or two (whole sequences each; ContextParams::micro_batching).
  int n_parts = 1;
  bool auto_decided = false;
  if (steps.size() >= 2 && observer_ == nullptr && !spans_ && executor_->overlaps_submits()) {
    if (micro_batching_ == MicroBatching::kOn) n_parts = 2;
    if (micro_batching_ == MicroBatching::kAuto) {
      n_parts = mb_policy_.choose_split(static_cast<int>(steps.size())) ? 2 : 1;
      auto_decided = true;
    }
  }
  const auto t_start = std::chrono::steady_clock::now();
  if (!scratch2_ && n_parts == 2) scratch2_ = std::make_unique<Scratch>();
  Scratch* part_scratch[2] = {&s, scratch2_.get()};

  // Rows of each part: the first sequences (in order of appearance) up to half the tokens go
  // to part 0, the rest to part 1. row_of[i] = (part, row within the part).
  std::vector<std::pair<int, int64_t>> row_of(static_cast<size_t>(T));
  std::vector<int32_t> part_of_seq(steps.size(), 0);
  if (n_parts == 2) {
    int64_t acc = 0;
    for (size_t k = 0; k < steps.size(); ++k) {
      part_of_seq[k] = (k > 0 && (acc >= (T + 1) / 2 || k + 1 == steps.size())) ? 1 : 0;
      acc += steps[k].n_new;
    }
  }
  int64_t n_rows[2] = {0, 0};
  for (int64_t i = 0; i < T; ++i) {
    const int p = part_of_seq[static_cast<size_t>(step_of[static_cast<size_t>(i)])];
    row_of[i] = {p, n_rows[p]++};
  }
  struct Part {
    std::vector<int32_t> seq;
    std::vector<int64_t> pos, cell;
    float *h = nullptr, *xn = nullptr, *attn_out = nullptr, *ffn_out = nullptr;
    std::optional<detail::Fwd> f;
    detail::MoeCall call;
  };
  Part parts[2];
  for (int p = 0; p < n_parts; ++p) {
    Part& pt = parts[p];
    Scratch& ps = *part_scratch[p];
    const int64_t n = n_parts == 1 ? T : n_rows[p];
    const int32_t* pseq = seq;
    const int64_t *ppos = pos, *pcell = cell;
    if (n_parts == 2) {
      pt.seq.resize(n);
      pt.pos.resize(n);
      pt.cell.resize(n);
      for (int64_t i = 0; i < T; ++i) {
        if (row_of[i].first != p) continue;
        pt.seq[row_of[i].second] = seq[i];
        pt.pos[row_of[i].second] = pos[i];
        pt.cell[row_of[i].second] = cell[i];
      }
      pseq = pt.seq.data();
      ppos = pt.pos.data();
      pcell = pt.cell.data();
    }
    pt.f.emplace(detail::Fwd{model_, hp, run_pool_, kv_, rec_.get(), ps, *executor_, observer_,
                             detail::Batch{n, pseq, ppos, pcell}, 0, 0,
                             slot_map_.empty() ? nullptr : slot_map_.data()});
    const size_t n_act = static_cast<size_t>(n * D);
    pt.h = detail::grow(ps.h, n_act);
    pt.xn = detail::grow(ps.xn, n_act);
    pt.attn_out = detail::grow(ps.attn_out, n_act);
    pt.ffn_out = detail::grow(ps.ffn_out, n_act);
  }

  // Embeddings (a dequantized row for quantized tables).
  for (int64_t i = 0; i < T; ++i) {
    get_row_f32(model_.tok_embd, batch[i].token, parts[row_of[i].first].h + row_of[i].second * D);
  }

  // Layer il of one part up to its dispatch (for a dense layer: the whole FFN), and the rest.
  auto bufs = [](Part& pt) { return detail::BlockBufs{pt.h, pt.xn, pt.attn_out, pt.ffn_out}; };
  auto pre = [&](Part& pt, int il) -> Status {
    return detail::block_begin(*pt.f, il, model_.layers[static_cast<size_t>(il)], bufs(pt), &pt.call);
  };
  auto post = [&](Part& pt, int il) -> Status {
    return detail::block_end(*pt.f, il, model_.layers[static_cast<size_t>(il)], bufs(pt), &pt.call);
  };

  // One part: pre, post per layer. Two: part 1's layer il runs while part 0's experts are out,
  // and part 0's layer il+1 while part 1's are:  pre0(0) pre1(0) | post0(l) pre0(l+1) post1(l) pre1(l+1) | ...
  Status st = Status::ok();
  if (n_parts == 1) {
    for (int il = 0; il < hp.n_layer && st.is_ok();) {
      const int k = span_at_.empty() ? -1 : span_at_[static_cast<size_t>(il)];
      if (k >= 0) {      // blocks first..last run on a span peer: one trip for the whole span
        int k_last = k;  // a chained trip may run the spans after k too
        const auto& sp = spans_->spans();
        // Rows cross with the residual-attention checkpoints banked so far and a reused indexer
        // selection (span_row_width).
        const bool wide = hp.span_rows_wide();
        float* rows = parts[0].h;
        if (wide) {
          rows = detail::grow(s.span_rows, static_cast<size_t>(T * hp.max_span_row_width()));
          detail::pack_span_rows(*parts[0].f, parts[0].h, il, rows);
        }
        st = spans_->run_from(k, SpanBatch{T, seq, pos, cell, wants.data()}, rows, &k_last);
        for (int j = k + 1; st.is_ok() && j <= k_last; ++j) {
          if (static_cast<size_t>(j) >= sp.size() || sp[j].first != sp[j - 1].last + 1)
            st = make_error(StatusCode::kInternal, "span runner ran spans {}..{}, which are not adjacent", k, k_last);
        }
        if (k_last < k) st = make_error(StatusCode::kInternal, "span runner ran spans {}..{}", k, k_last);
        if (!st.is_ok()) break;
        il = sp[static_cast<size_t>(k_last)].last + 1;
        if (wide) st = detail::unpack_span_rows(*parts[0].f, rows, il, parts[0].h);
        if (!st.is_ok()) break;
        continue;
      }
      st = pre(parts[0], il);
      if (st.is_ok()) st = post(parts[0], il);
      ++il;
    }
  } else {
    st = pre(parts[0], 0);
    if (st.is_ok()) st = pre(parts[1], 0);
    for (int il = 0; il < hp.n_layer && st.is_ok(); ++il) {
      for (int p = 0; p < 2 && st.is_ok(); ++p) {
        st = post(parts[p], il);
        if (st.is_ok() && il + 1 < hp.n_layer) st = pre(parts[p], il + 1);
      }
    }
  }
  if (!st.is_ok()) {
    // A part whose experts are still out is waited for (and its result dropped), so the
    // executor has nothing pending for this step.
    for (int p = 0; p < n_parts; ++p) {
      if (parts[p].call.pending) (void)detail::moe_end(*parts[p].f, 0, &parts[p].call, parts[p].ffn_out);
    }
    rollback();  // leave the cache as it was
    return st;
  }

  // Cross-layer residual attention: the head reads the mix of the checkpoints and the stream.
  if (hp.attn_res_block > 0) {
    for (int p = 0; p < n_parts; ++p) {
      detail::residual_mix(*parts[p].f, detail::residual_ckpts_at_end(hp), parts[p].h, model_.output_res_score,
                           parts[p].h);
    }
  }

  // The output head: normed rows of the tokens that want logits, one projection for all. With
  // set_keep_hidden every token's normed row is kept (the logits rows are copies of those).
  float* hid = keep_hidden_ ? detail::grow(s.hidden, static_cast<size_t>(T * D)) : nullptr;
  if (hid != nullptr) {
    for (int64_t i = 0; i < T; ++i) {
      const float* hi = parts[row_of[i].first].h + row_of[i].second * D;
      detail::rms_norm_rows(hi, model_.output_norm, hid + i * D, 1, D, hp.rms_eps);
    }
  }
  n_hidden_ = hid != nullptr ? T : 0;
  if (n_out > 0) {
    float* rows = detail::grow(s.out_rows, static_cast<size_t>(n_out * D));
    int64_t r = 0;
    for (int64_t i = 0; i < T; ++i) {
      if (!batch[i].logits) continue;
      if (hid != nullptr) {
        std::copy(hid + i * D, hid + (i + 1) * D, rows + r * D);
      } else {
        const float* hi = parts[row_of[i].first].h + row_of[i].second * D;
        detail::rms_norm_rows(hi, model_.output_norm, rows + r * D, 1, D, hp.rms_eps);
      }
      ++r;
    }
    detail::project(*parts[0].f, rows, n_out, D, {{&model_.output, logits}});
  }
  if (rec_) {
    for (const SeqStep& st : steps) rec_->commit_step(st.seq);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if (auto_decided) mb_policy_.record(static_cast<int>(steps.size()), n_parts == 2, seconds);
  ++(n_parts == 2 ? mb_stats_.steps_split : mb_stats_.steps_whole);
  return Status::ok();
}

Status Context::reserve_cells(int64_t T, const int64_t* given_pos, const uint8_t* cut, std::vector<SeqStep>* steps_out,
                              std::vector<int32_t>* step_of_out) {
  Scratch& s = *scratch_;
  const int32_t* seq = s.seq.data();
  int64_t* pos = detail::grow(s.pos, static_cast<size_t>(T));
  int64_t* cell = detail::grow(s.cell, static_cast<size_t>(T));
  std::vector<SeqStep>& steps = *steps_out;
  std::vector<int32_t>& step_of = *step_of_out;
  steps.clear();
  step_of.assign(static_cast<size_t>(T), 0);
  for (int64_t i = 0; i < T; ++i) {
    const int32_t sq = seq[i];
    auto it = std::find_if(steps.begin(), steps.end(), [&](const SeqStep& x) { return x.seq == sq; });
    if (it == steps.end()) {
      steps.push_back({sq, kv_.seq_len(sq)});
      it = steps.end() - 1;
    }
    step_of[static_cast<size_t>(i)] = static_cast<int32_t>(it - steps.begin());
    cell[i] = it->n_before + it->n_new;
    ++it->n_new;
  }
  std::vector<int64_t> new_pos;
  for (size_t k = 0; k < steps.size(); ++k) {
    const SeqStep& st = steps[k];
    new_pos.resize(static_cast<size_t>(st.n_new));
    if (given_pos == nullptr) {
      const int64_t p0 = kv_.seq_pos_max(st.seq) + 1;
      for (int64_t j = 0; j < st.n_new; ++j) new_pos[j] = p0 + j;
    } else {
      for (int64_t i = 0, j = 0; i < T; ++i) {
        if (step_of[static_cast<size_t>(i)] == static_cast<int32_t>(k)) new_pos[j++] = given_pos[i];
      }
    }
    auto first = kv_.append(st.seq, new_pos.data(), st.n_new);
    if (!first) {
      for (size_t r = 0; r < k; ++r) (void)kv_.truncate(steps[r].seq, steps[r].n_before);
      return first.status();
    }
  }
  for (int64_t i = 0; i < T; ++i) pos[i] = kv_.positions(seq[i])[cell[i]];
  // Recurrent layers: the step's checkpoints are prepared per sequence (RecurrentState).
  if (rec_) {
    // Per sequence, after which of its tokens the state may be cut (those asking for logits):
    // sequence k's flags start at offset[k], in its token order.
    std::vector<int64_t> offset(steps.size() + 1, 0);
    for (size_t k = 0; k < steps.size(); ++k) offset[k + 1] = offset[k] + steps[k].n_new;
    std::vector<uint8_t> cut_after(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i) {
      const size_t k = static_cast<size_t>(step_of[static_cast<size_t>(i)]);
      cut_after[static_cast<size_t>(offset[k] + cell[i] - steps[k].n_before)] = cut != nullptr ? cut[i] : 0;
    }
    for (size_t k = 0; k < steps.size(); ++k) {
      rec_->begin_step(steps[k].seq, steps[k].n_new, cut_after.data() + offset[k]);
    }
  }
  return Status::ok();
}

Status Context::decode_layers(std::span<const LayerToken> toks, int first, int last, float* h) {
  const HParams& hp = model_.hparams();
  const int64_t T = static_cast<int64_t>(toks.size()), D = hp.n_embd;
  if (T == 0) return make_error(StatusCode::kInvalidArgument, "decode_layers: empty batch");
  if (first < 0 || last < first || last >= hp.n_layer) {
    return make_error(StatusCode::kInvalidArgument, "decode_layers: blocks {}-{} not within 0-{}", first, last,
                      hp.n_layer - 1);
  }
  if (spans_) return make_error(StatusCode::kInvalidArgument, "decode_layers: this context has spans of its own");
  if (!span_status_.is_ok()) return span_status_;
  if (layers_.last >= 0 && (first < layers_.first || last > layers_.last)) {
    return make_error(StatusCode::kInvalidArgument, "decode_layers: blocks {}-{} asked, this context holds {}-{}",
                      first, last, layers_.first, layers_.last);
  }
  Scratch& s = *scratch_;
  n_hidden_ = 0;
  std::vector<int64_t> given(static_cast<size_t>(T));
  std::vector<uint8_t> cut(static_cast<size_t>(T));
  int32_t* seq = detail::grow(s.seq, static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) {
    seq[i] = toks[static_cast<size_t>(i)].seq;
    given[static_cast<size_t>(i)] = toks[static_cast<size_t>(i)].pos;
    cut[static_cast<size_t>(i)] = toks[static_cast<size_t>(i)].cut ? 1 : 0;
  }
  std::vector<SeqStep> steps;
  std::vector<int32_t> step_of;
  MOESH_RETURN_IF_ERROR(reserve_cells(T, given.data(), cut.data(), &steps, &step_of));
  detail::Fwd f{model_,     hp,         run_pool_,
                kv_,        rec_.get(), s,
                *executor_, observer_,  detail::Batch{T, s.seq.data(), s.pos.data(), s.cell.data()},
                kv_base_,   rec_base_,  slot_map_.empty() ? nullptr : slot_map_.data()};
  const size_t n_act = static_cast<size_t>(T * D);
  detail::BlockBufs b{detail::grow(s.h, n_act), detail::grow(s.xn, n_act), detail::grow(s.attn_out, n_act),
                      detail::grow(s.ffn_out, n_act)};
  // h: [T][span_row_width(first)] in, [T][span_row_width(last + 1)] out (the stream alone
  // without cross-layer residual attention: no checkpoints).
  detail::MoeCall call;
  Status st = detail::unpack_span_rows(f, h, first, b.h);
  for (int il = first; il <= last && st.is_ok(); ++il) {
    st = detail::block_begin(f, il, model_.layers[static_cast<size_t>(il)], b, &call);
    if (st.is_ok()) st = detail::block_end(f, il, model_.layers[static_cast<size_t>(il)], b, &call);
  }
  if (!st.is_ok()) {
    if (call.pending) (void)detail::moe_end(f, 0, &call, b.ffn_out);
    for (const SeqStep& sp : steps) {
      (void)kv_.truncate(sp.seq, sp.n_before);
      if (rec_) rec_->abort_step(sp.seq);
    }
    return st;
  }
  detail::pack_span_rows(f, b.h, last + 1, h);
  if (rec_) {
    for (const SeqStep& sp : steps) rec_->commit_step(sp.seq);
  }
  return Status::ok();
}

std::span<const float> Context::hidden() const {
  return {scratch_->hidden.data(), static_cast<size_t>(n_hidden_ * model_.hparams().n_embd)};
}

Status Context::rewind(int32_t seq, int64_t n_keep, std::span<const int32_t> tokens) {
  const int64_t len = state_.seq_len(seq);
  n_keep = std::max<int64_t>(0, n_keep);
  if (n_keep >= len) return Status::ok();
  const int64_t m = state_.restorable(seq, n_keep);
  if (m < n_keep && static_cast<int64_t>(tokens.size()) < n_keep) {
    return make_error(StatusCode::kInvalidArgument,
                      "rewind: sequence {} needs its first {} tokens to recompute from {}, got {}", seq, n_keep, m,
                      tokens.size());
  }
  MOESH_RETURN_IF_ERROR(state_.truncate(seq, m));
  if (m == n_keep) return Status::ok();
  return decode(seq, tokens.data() + m, n_keep - m, nullptr, /*all_logits=*/false);
}

bool Context::MicroBatchPolicy::choose_split(int n_seq) {
  const int b = std::min(kBuckets - 1, static_cast<int>(std::bit_width(static_cast<unsigned>(n_seq))) - 1);
  const uint64_t d = decisions[b]++;
  // Two samples of each way first, then the faster, with the other re-measured now and then
  // (the network and the load change).
  if (n[b][0] < 2) return false;
  if (n[b][1] < 2) return true;
  const bool split_faster = mean_s[b][1] < mean_s[b][0];
  return (d % kAutoProbeEvery == kAutoProbeEvery - 1) ? !split_faster : split_faster;
}

void Context::MicroBatchPolicy::record(int n_seq, bool split, double seconds) {
  const int b = std::min(kBuckets - 1, static_cast<int>(std::bit_width(static_cast<unsigned>(n_seq))) - 1);
  double& m = mean_s[b][split ? 1 : 0];
  uint64_t& c = n[b][split ? 1 : 0];
  // An exponential mean that forgets: what the network does now matters, not an hour ago.
  m = c == 0 ? seconds : 0.8 * m + 0.2 * seconds;
  ++c;
}

}  // namespace moesh
