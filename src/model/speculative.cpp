// Speculative decoding: n-gram drafts, one forward pass per step, rollback of rejected drafts,
// and the cost model that decides the draft length. See include/moesh/model/speculative.h.
#include "moesh/model/speculative.h"

#include <algorithm>

namespace moesh {

// ---- drafts --------------------------------------------------------------------------------

NgramDraft::NgramDraft(int n_min, int n_max) : n_min_(std::max(1, n_min)), n_max_(std::max(n_min_, n_max)) {}

void NgramDraft::propose(std::span<const int32_t> h, int max_tokens, std::vector<int32_t>* out) {
  out->clear();
  const int64_t L = static_cast<int64_t>(h.size());
  if (max_tokens <= 0) return;
  for (int n = n_max_; n >= n_min_; --n) {
    if (L < n + 1) continue;
    const int32_t* suffix = h.data() + (L - n);
    // The most recent earlier occurrence: recent text predicts the continuation best.
    for (int64_t j = L - n - 1; j >= 0; --j) {
      if (!std::equal(suffix, suffix + n, h.data() + j)) continue;
      for (int64_t q = j + n; q < L && static_cast<int>(out->size()) < max_tokens; ++q) out->push_back(h[q]);
      return;
    }
  }
}

Result<std::unique_ptr<DraftSource>> make_draft_source(const std::string& name) {
  if (name == "ngram") return std::unique_ptr<DraftSource>(std::make_unique<NgramDraft>(2, 4));
  return make_error(StatusCode::kInvalidArgument, "unknown draft source '{}' (known: ngram)", name);
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
  t_sum_.assign(static_cast<size_t>(p_.draft_max) + 2, 0.0);
  t_n_.assign(t_sum_.size(), 0);
  pos_fed_.assign(t_sum_.size(), 0);
  pos_acc_.assign(t_sum_.size(), 0);
}

Status SpeculativeDecoder::start(std::span<const int32_t> prompt, int32_t* first) {
  if (prompt.empty()) return make_error(StatusCode::kInvalidArgument, "speculative decoding: empty prompt");
  const int64_t V = ctx_->model().hparams().n_vocab;
  logits_.resize(static_cast<size_t>(V));
  MOESH_RETURN_IF_ERROR(ctx_->decode(seq_, prompt.data(), static_cast<int64_t>(prompt.size()), logits_.data(),
                                     /*all_logits=*/false));
  history_.assign(prompt.begin(), prompt.end());
  const int32_t s = sampler_->sample(logits_.data(), V, history_);
  history_.push_back(s);
  *first = s;
  return Status::ok();
}

int SpeculativeDecoder::choose_draft(int cap) const {
  if (cap <= 0) return 0;
  // Step time for n tokens fed: the measured mean, else a line through the measured means (least
  // squares), else (only one-token steps measured) the one-token time — drafts assumed free, so
  // they get tried.
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  int m = 0;
  for (size_t n = 1; n < t_n_.size(); ++n) {
    if (t_n_[n] == 0) continue;
    const double y = t_sum_[n] / static_cast<double>(t_n_[n]);
    sx += static_cast<double>(n);
    sy += y;
    sxx += static_cast<double>(n * n);
    sxy += static_cast<double>(n) * y;
    ++m;
  }
  const double t1 = t_n_[1] > 0 ? t_sum_[1] / static_cast<double>(t_n_[1]) : 0.0;
  double slope = 0, icpt = t1;
  if (m >= 2) {
    const double den = m * sxx - sx * sx;
    if (den > 0) {
      slope = std::max(0.0, (m * sxy - sx * sy) / den);
      icpt = (sy - slope * sx) / m;
    }
  }
  auto t_of = [&](int n) {
    if (t_n_[static_cast<size_t>(n)] > 0) return t_sum_[static_cast<size_t>(n)] / static_cast<double>(t_n_[n]);
    return std::max(1e-9, icpt + slope * n);
  };
  // Nothing measured: explore with every draft. Drafted steps measured but no plain one: take one
  // plain step, so there is a baseline to compare with.
  if (t_n_[1] == 0) return m == 0 ? cap : 0;
  // Expected tokens emitted with k drafts: 1 + Σ_i Π_{j<=i} a_j, a_j = P(draft j kept | j-1 kept)
  // with a Laplace prior, so an untried position counts as a coin flip.
  double best_rate = 1.0 / t_of(1), expect = 1.0, keep = 1.0;
  int best = 0;
  for (int k = 1; k <= cap; ++k) {
    const double a = (static_cast<double>(pos_acc_[k]) + 1.0) / (static_cast<double>(pos_fed_[k]) + 2.0);
    keep *= a;
    expect += keep;
    const double rate = expect / t_of(1 + k);
    if (rate > best_rate * 1.0001) {
      best_rate = rate;
      best = k;
    }
  }
  return best;
}

int SpeculativeDecoder::planned_draft() const {
  return choose_draft(p_.draft_max);
}

Status SpeculativeDecoder::step(int max_new, std::vector<int32_t>* out) {
  out->clear();
  if (history_.empty()) return make_error(StatusCode::kInvalidArgument, "speculative decoding: start() first");
  if (max_new < 1) return make_error(StatusCode::kInvalidArgument, "speculative decoding: max_new {} < 1", max_new);
  KvCache& kv = ctx_->kv();
  const int64_t n_before = kv.seq_len(seq_);
  const int64_t room = kv.n_ctx() - n_before - 1;  // cells left after the pending token's
  int cap = static_cast<int>(std::min<int64_t>({p_.draft_max, max_new - 1, std::max<int64_t>(room, 0)}));
  proposal_.clear();
  if (draft_ != nullptr && cap > 0) draft_->propose(history_, cap, &proposal_);
  int k = static_cast<int>(proposal_.size());
  if (p_.adaptive && k > 0) {
    const int chosen = choose_draft(k);
    if (chosen == 0 && ++since_probe_ >= kProbeEvery) {
      since_probe_ = 0;
      k = 1;
    } else {
      k = chosen;
    }
  }
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
  t_sum_[static_cast<size_t>(1 + k)] += dt;
  ++t_n_[static_cast<size_t>(1 + k)];
  // Position i's logits give the token after feed_[i]. Sample in order, exactly as plain
  // decoding would: a draft is kept while it equals the sampled token; the first token that
  // differs (or the one after the last draft) is emitted and becomes the next step's feed.
  for (int i = 0; i <= k; ++i) {
    const int32_t s = sampler_->sample(logits_.data() + static_cast<int64_t>(i) * V, V, history_);
    out->push_back(s);
    history_.push_back(s);
    if (i < k) {
      ++pos_fed_[static_cast<size_t>(i + 1)];
      if (s == proposal_[static_cast<size_t>(i)]) {
        ++pos_acc_[static_cast<size_t>(i + 1)];
        ++stats_.accepted;
        continue;
      }
    }
    kv.seq_truncate(seq_, n_before + 1 + i);  // the cells of the rejected drafts go
    break;
  }
  stats_.emitted += static_cast<int64_t>(out->size());
  return Status::ok();
}

}  // namespace moesh
