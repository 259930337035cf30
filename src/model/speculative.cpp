// Speculative decoding: n-gram drafts, one forward pass per step, rollback of rejected drafts,
// and the cost model that decides the draft length. See include/moesh/model/speculative.h.
#include "moesh/model/speculative.h"

#include <algorithm>

namespace moesh {

// ---- drafts --------------------------------------------------------------------------------

NgramDraft::NgramDraft(int n_min, int n_max) : n_min_(std::max(1, n_min)), n_max_(std::max(n_min_, n_max)) {}

void NgramDraft::propose(int32_t, std::span<const int32_t> h, int max_tokens, std::vector<int32_t>* out) {
  out->clear();
  const int64_t L = static_cast<int64_t>(h.size());
  if (max_tokens <= 0) return;
  for (int n = n_max_; n >= n_min_; --n) {
    if (L < n + 1) continue;
    const int32_t* suffix = h.data() + (L - n);
    // The most recent earlier occurrence: recent text predicts the continuation best.
    for (int64_t j = L - n - 1; j >= 0; --j) {
      if (!std::equal(suffix, suffix + n, h.data() + j)) continue;
      // What followed the match, and past the end of the history the draft itself: a match d
      // tokens back means text repeating with period d, so the period keeps going (a loop, a
      // repeated phrase) instead of the draft stopping at the present.
      for (int64_t q = j + n; static_cast<int>(out->size()) < max_tokens; ++q) {
        out->push_back(q < L ? h[q] : (*out)[static_cast<size_t>(q - L)]);
      }
      return;
    }
  }
}

Result<std::unique_ptr<DraftSource>> make_nextn_draft(const DraftEnv& env);  // nextn.cpp

Result<std::unique_ptr<DraftSource>> make_draft_source(const std::string& name, const DraftEnv& env) {
  if (name == "ngram") return std::unique_ptr<DraftSource>(std::make_unique<NgramDraft>(2, 4));
  if (name == "nextn" || name == "mtp") return make_nextn_draft(env);
  return make_error(StatusCode::kInvalidArgument, "unknown draft source '{}' (known: ngram, nextn)", name);
}

// ---- the decoder ---------------------------------------------------------------------------

namespace {
// When the cost model says "no drafts" but drafts are on offer, every kProbeEvery-th such step
// verifies one anyway, so the model keeps learning (bounded cost: one extra token in 1/32 steps).
constexpr int64_t kProbeEvery = 32;
}  // namespace

SpeculativeDecoder::SpeculativeDecoder(Context* ctx, int32_t seq, Sampler* sampler, DraftSource* draft,
                                       SpeculativeParams p)
    : ctx_(ctx), seq_(seq), sampler_(sampler), draft_(draft), p_(p) {
  p_.draft_max = std::max(0, p_.draft_max);
  if (draft_ != nullptr && draft_->needs_hidden()) ctx_->set_keep_hidden(true);
}

void SpeculativeDecoder::report_hidden(int64_t first, int64_t n, const int32_t* next) {
  if (draft_ == nullptr || !draft_->needs_hidden() || n <= 0) return;
  const std::span<const float> rows = ctx_->hidden();
  const int64_t D = ctx_->model().hparams().n_embd;
  if (static_cast<int64_t>(rows.size()) < n * D) return;
  draft_->on_hidden(seq_, first, n, rows.data(), next);
}

Status SpeculativeDecoder::start(std::span<const int32_t> prompt, int32_t* first) {
  if (prompt.empty()) return make_error(StatusCode::kInvalidArgument, "speculative decoding: empty prompt");
  const int64_t V = ctx_->model().hparams().n_vocab;
  logits_.resize(static_cast<size_t>(V));
  const int64_t n_before = ctx_->state().seq_len(seq_);
  MOESH_RETURN_IF_ERROR(ctx_->decode(seq_, prompt.data(), static_cast<int64_t>(prompt.size()), logits_.data(),
                                     /*all_logits=*/false));
  history_.assign(prompt.begin(), prompt.end());
  const int32_t s = sampler_->sample(logits_.data(), V, history_);
  history_.push_back(s);
  *first = s;
  // Position p's next token is history_[p + 1] (the last one: the token just sampled).
  report_hidden(n_before, static_cast<int64_t>(prompt.size()), history_.data() + (history_.size() - prompt.size()));
  return Status::ok();
}

void StepTimeModel::record(int64_t n_tokens, double seconds) {
  const size_t b = static_cast<size_t>(std::clamp<int64_t>(n_tokens, 1, kMaxTracked));
  if (n_[b] == 0) ++n_points_;
  sum_[b] += seconds;
  ++n_[b];
}

bool StepTimeModel::measured(int64_t n_tokens) const {
  return n_[static_cast<size_t>(std::clamp<int64_t>(n_tokens, 1, kMaxTracked))] > 0;
}

double StepTimeModel::predict(int64_t n_tokens) const {
  const size_t b = static_cast<size_t>(std::clamp<int64_t>(n_tokens, 1, kMaxTracked));
  double floor = 0;  // the largest measured mean of a smaller count
  for (size_t n = 1; n < b; ++n) {
    if (n_[n] > 0) floor = std::max(floor, sum_[n] / static_cast<double>(n_[n]));
  }
  return std::max(floor, fitted(b));
}

double StepTimeModel::fitted(size_t b) const {
  if (n_[b] > 0) return sum_[b] / static_cast<double>(n_[b]);
  double sx = 0, sy = 0, sxx = 0, sxy = 0, only = 0;
  int m = 0;
  for (size_t n = 1; n < n_.size(); ++n) {
    if (n_[n] == 0) continue;
    const double y = sum_[n] / static_cast<double>(n_[n]);
    sx += static_cast<double>(n);
    sy += y;
    sxx += static_cast<double>(n) * static_cast<double>(n);
    sxy += static_cast<double>(n) * y;
    only = y;
    ++m;
  }
  if (m == 0) return 0.0;
  if (m == 1) return only;
  const double den = m * sxx - sx * sx;
  const double slope = den > 0 ? std::max(0.0, (m * sxy - sx * sy) / den) : 0.0;
  const double icpt = (sy - slope * sx) / m;
  return std::max(1e-9, icpt + slope * static_cast<double>(b));
}

void DraftAcceptance::record(int position, bool kept) {
  if (position < 1) return;
  if (fed_.size() <= static_cast<size_t>(position)) {
    fed_.resize(static_cast<size_t>(position) + 1, 0);
    kept_.resize(fed_.size(), 0);
  }
  ++fed_[static_cast<size_t>(position)];
  kept_[static_cast<size_t>(position)] += kept ? 1 : 0;
}

double DraftAcceptance::keep(int position) const {
  const size_t p = static_cast<size_t>(position);
  const double fed = p < fed_.size() ? static_cast<double>(fed_[p]) : 0.0;
  const double kept = p < kept_.size() ? static_cast<double>(kept_[p]) : 0.0;
  return (kept + 1.0) / (fed + 2.0);
}

int choose_draft_length(const StepTimeModel& t, const DraftAcceptance& a, int cap, int64_t n_base) {
  if (cap <= 0) return 0;
  n_base = std::max<int64_t>(n_base, 1);
  // Too little measured to predict: learn cheaply. Nothing yet, or only this pass size: one draft
  // (measures what one more token costs); only another size: a plain pass (the baseline).
  if (t.points() < 2) return t.measured(n_base) || t.empty() ? std::min(cap, 1) : 0;
  const double others = static_cast<double>(n_base - 1);
  double best_rate = (others + 1.0) / t.predict(n_base), expect = 1.0, keep = 1.0;
  int best = 0;
  for (int k = 1; k <= cap; ++k) {
    keep *= a.keep(k);
    expect += keep;
    const double rate = (others + expect) / t.predict(n_base + k);
    if (rate > best_rate * 1.0001) {
      best_rate = rate;
      best = k;
    }
  }
  return best;
}

int SpeculativeDecoder::planned_draft() const {
  return choose_draft_length(times_, acceptance_, p_.draft_max, 1);
}

Status SpeculativeDecoder::step(int max_new, std::vector<int32_t>* out) {
  out->clear();
  if (history_.empty()) return make_error(StatusCode::kInvalidArgument, "speculative decoding: start() first");
  if (max_new < 1) return make_error(StatusCode::kInvalidArgument, "speculative decoding: max_new {} < 1", max_new);
  KvCache& kv = ctx_->kv();
  const int64_t n_before = kv.seq_len(seq_);
  const int64_t room = kv.n_ctx() - n_before - 1;  // cells left after the pending token's
  int cap = static_cast<int>(std::min<int64_t>({p_.draft_max, max_new - 1, std::max<int64_t>(room, 0)}));
  // The cost model first: a source is asked for no more drafts than would be verified (a model
  // head pays for every draft it proposes), then judges the proposal it got.
  int want = draft_ != nullptr ? cap : 0;
  bool probe = false;
  if (p_.adaptive && want > 0) {
    want = choose_draft_length(times_, acceptance_, want, 1);
    if (want == 0 && ++since_probe_ >= kProbeEvery) {
      since_probe_ = 0;
      want = 1;
      probe = true;
    }
  }
  proposal_.clear();
  if (want > 0) draft_->propose(seq_, history_, want, &proposal_);
  int k = std::min(want, static_cast<int>(proposal_.size()));
  if (p_.adaptive && k > 0 && !probe) k = choose_draft_length(times_, acceptance_, k, 1);
  proposal_.resize(static_cast<size_t>(k));
  feed_.assign(1, history_.back());  // emitted last step (or by start), not yet in the cache
  feed_.insert(feed_.end(), proposal_.begin(), proposal_.end());
  const int64_t V = ctx_->model().hparams().n_vocab;
  logits_.resize(static_cast<size_t>((1 + k) * V));
  const auto t0 = std::chrono::steady_clock::now();
  MOESH_RETURN_IF_ERROR(ctx_->decode(seq_, feed_.data(), 1 + k, logits_.data(), /*all_logits=*/true));
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.steps;
  stats_.step_seconds += dt;
  stats_.drafted += k;
  times_.record(1 + k, p_.step_cost ? p_.step_cost(1 + k) : dt);
  // Position i's logits give the token after feed_[i]. Sample in order, exactly as plain
  // decoding would: a draft is kept while it equals the sampled token; the first token that
  // differs (or the one after the last draft) is emitted and becomes the next step's feed.
  for (int i = 0; i <= k; ++i) {
    const int32_t s = sampler_->sample(logits_.data() + static_cast<int64_t>(i) * V, V, history_);
    out->push_back(s);
    history_.push_back(s);
    if (i < k) {
      const bool kept = s == proposal_[static_cast<size_t>(i)];
      acceptance_.record(i + 1, kept);
      if (kept) {
        ++stats_.accepted;
        continue;
      }
    }
    // The kept positions n_before.. (fed token j was followed by emitted token j) are reported
    // before the rewind, which may run a forward pass of its own. Then the rejected drafts go
    // (history_ now starts with exactly the tokens kept).
    report_hidden(n_before, static_cast<int64_t>(out->size()), out->data());
    MOESH_RETURN_IF_ERROR(ctx_->rewind(seq_, n_before + 1 + i, history_));
    break;
  }
  stats_.emitted += static_cast<int64_t>(out->size());
  return Status::ok();
}

}  // namespace moesh
