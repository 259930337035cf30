// Recurrent state with checkpoints, and a context's combined state
// (include/moesh/model/seq_state.h).
#include "moesh/model/seq_state.h"

#include <algorithm>

#include "moesh/model/kv_cache.h"

namespace moesh {

RecurrentState::RecurrentState(int64_t n_layer, int64_t width, CheckpointPolicy policy)
    : n_layer_(n_layer), width_(width), policy_(policy) {}

RecurrentState::Seq* RecurrentState::find(int32_t seq) {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

const RecurrentState::Seq* RecurrentState::find(int32_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

const RecurrentState::Checkpoint* RecurrentState::checkpoint_at(const Seq& s, int64_t len) const {
  for (const Checkpoint& c : s.cps) {
    if (c.len == len) return &c;
  }
  return nullptr;
}

void RecurrentState::restore(Seq& s, int64_t len) {
  const size_t n = static_cast<size_t>(n_layer_ * width_);
  s.live.resize(n);
  if (len == 0) {
    std::fill(s.live.begin(), s.live.end(), 0.0f);
  } else {
    const Checkpoint* c = checkpoint_at(s, len);
    std::copy(c->data.begin(), c->data.end(), s.live.begin());
  }
  s.len = len;
}

int64_t RecurrentState::seq_len(int32_t seq) const {
  const Seq* s = find(seq);
  return s == nullptr ? 0 : s->len;
}

int64_t RecurrentState::restorable(int32_t seq, int64_t n) const {
  const Seq* s = find(seq);
  if (s == nullptr || n <= 0) return 0;
  n = std::min(n, s->len);
  int64_t best = 0;
  for (const Checkpoint& c : s->cps) {
    if (c.len <= n) best = std::max(best, c.len);
  }
  return best;
}

Status RecurrentState::truncate(int32_t seq, int64_t n_keep) {
  Seq* s = find(seq);
  if (s == nullptr || n_keep >= s->len) return Status::ok();
  n_keep = std::max<int64_t>(0, n_keep);
  if (n_keep > 0 && checkpoint_at(*s, n_keep) == nullptr) {
    return make_error(StatusCode::kOutOfRange,
                      "sequence {}: its recurrent state has no checkpoint at {} tokens (nearest below: {})", seq,
                      n_keep, restorable(seq, n_keep));
  }
  restore(*s, n_keep);
  // Checkpoints past the cut belong to the dropped tokens.
  s->cps.erase(std::remove_if(s->cps.begin(), s->cps.end(), [&](const Checkpoint& c) { return c.len > n_keep; }),
               s->cps.end());
  return Status::ok();
}

Status RecurrentState::copy(int32_t src, int32_t dst, int64_t n) {
  if (src == dst) return make_error(StatusCode::kInvalidArgument, "copy: source and destination are both {}", src);
  const Seq* s = find(src);
  const int64_t have = s == nullptr ? 0 : s->len;
  if (n < 0 || n > have) {
    return make_error(StatusCode::kOutOfRange, "copy: sequence {} holds {} tokens, asked for {}", src, have, n);
  }
  if (n > 0 && checkpoint_at(*s, n) == nullptr) {
    return make_error(StatusCode::kOutOfRange,
                      "copy: sequence {}'s recurrent state has no checkpoint at {} tokens (nearest below: {})", src, n,
                      restorable(src, n));
  }
  Seq d;
  // Every checkpoint up to n is a valid state of the copied prefix too.
  if (s != nullptr) {
    for (const Checkpoint& c : s->cps) {
      if (c.len <= n) d.cps.push_back(c);
    }
  }
  restore(d, n);
  seqs_[dst] = std::move(d);
  return Status::ok();
}

void RecurrentState::remove(int32_t seq) {
  seqs_.erase(seq);
}

void RecurrentState::clear() {
  seqs_.clear();
}

std::vector<int64_t> RecurrentState::checkpoints(int32_t seq) const {
  std::vector<int64_t> out;
  if (const Seq* s = find(seq)) {
    for (const Checkpoint& c : s->cps) out.push_back(c.len);
  }
  return out;
}

size_t RecurrentState::checkpoint_floats() const {
  size_t n = 0;
  for (const auto& [id, s] : seqs_) {
    for (const Checkpoint& c : s.cps) n += c.data.size();
  }
  return n;
}

std::vector<float> RecurrentState::take_buffer(Seq& s) const {
  const size_t floats = static_cast<size_t>(n_layer_ * width_);
  if (s.spare.empty()) return std::vector<float>(floats);
  std::vector<float> v = std::move(s.spare.back());
  s.spare.pop_back();
  v.resize(floats);  // every layer's slice is written by after_token before the checkpoint is used
  return v;
}

void RecurrentState::give_buffer(Seq& s, std::vector<float>&& v) const {
  // Enough for a step's checkpoints; more would only hold memory.
  if (s.spare.size() < static_cast<size_t>(std::max(1, policy_.step_tokens)) + 1) s.spare.push_back(std::move(v));
}

void RecurrentState::begin_step(int32_t seq, int64_t n_new, const uint8_t* cut_after) {
  Seq& s = seqs_[seq];
  if (s.live.empty()) restore(s, 0);
  s.step_base = s.len;
  for (Checkpoint& c : s.pending) give_buffer(s, std::move(c.data));
  s.pending.clear();
  int kept = 0;
  for (int64_t j = 0; j + 1 < n_new; ++j) {
    const int64_t len = s.len + j + 1;
    const bool cut = cut_after != nullptr && cut_after[j] != 0 && kept < policy_.step_tokens;
    const bool periodic = policy_.every > 0 && len % policy_.every == 0;
    if (!cut && !periodic) continue;
    s.pending.push_back({len, take_buffer(s)});
    kept += cut ? 1 : 0;
  }
  s.pending.push_back({s.len + n_new, take_buffer(s)});
}

float* RecurrentState::live(int32_t seq, int64_t layer) {
  Seq* s = find(seq);
  return s->live.data() + static_cast<size_t>(layer * width_);
}

void RecurrentState::after_token(int32_t seq, int64_t layer, int64_t n_after) {
  Seq* s = find(seq);
  if (s == nullptr) return;
  auto it = std::lower_bound(s->pending.begin(), s->pending.end(), n_after,
                             [](const Checkpoint& c, int64_t len) { return c.len < len; });
  if (it == s->pending.end() || it->len != n_after) return;
  Checkpoint& c = *it;
  const float* from = s->live.data() + static_cast<size_t>(layer * width_);
  std::copy(from, from + width_, c.data.begin() + static_cast<ptrdiff_t>(layer * width_));
}

void RecurrentState::commit_step(int32_t seq) {
  Seq* s = find(seq);
  if (s == nullptr || s->step_base < 0) return;
  const int64_t base = s->step_base;
  if (!s->pending.empty()) s->len = s->pending.back().len;
  for (Checkpoint& c : s->pending) s->cps.push_back(std::move(c));
  s->pending.clear();
  s->step_base = -1;
  prune(*s, base);
}

void RecurrentState::abort_step(int32_t seq) {
  Seq* s = find(seq);
  if (s == nullptr || s->step_base < 0) return;
  for (Checkpoint& c : s->pending) give_buffer(*s, std::move(c.data));
  s->pending.clear();
  restore(*s, s->step_base);
  s->step_base = -1;
}

void RecurrentState::prune(Seq& s, int64_t protect_from) {
  // The checkpoints at and after the last step's start are kept; of the older ones at most
  // max_older survive, dropping the one whose neighbours are closest together each time.
  int older = static_cast<int>(
      std::count_if(s.cps.begin(), s.cps.end(), [&](const Checkpoint& c) { return c.len < protect_from; }));
  for (; older > std::max(0, policy_.max_older); --older) {
    size_t drop = 0;
    int64_t best_gap = -1;
    for (size_t i = 0; i < s.cps.size() && s.cps[i].len < protect_from; ++i) {
      const int64_t prev = i == 0 ? 0 : s.cps[i - 1].len;
      const int64_t next = s.cps[i + 1 < s.cps.size() ? i + 1 : i].len;
      const int64_t gap = next - prev;
      if (best_gap < 0 || gap < best_gap) best_gap = gap, drop = i;
    }
    give_buffer(s, std::move(s.cps[drop].data));
    s.cps.erase(s.cps.begin() + static_cast<ptrdiff_t>(drop));
  }
}

// ---- ContextState ----

int64_t ContextState::seq_len(int32_t seq) const {
  return kv_->seq_len(seq);
}

int64_t ContextState::restorable(int32_t seq, int64_t n) const {
  const int64_t m = kv_->restorable(seq, n);
  return rec_ == nullptr ? m : rec_->restorable(seq, m);
}

Status ContextState::truncate(int32_t seq, int64_t n_keep) {
  if (n_keep >= kv_->seq_len(seq)) return Status::ok();
  if (rec_ != nullptr) MOESH_RETURN_IF_ERROR(rec_->truncate(seq, n_keep));  // the one that can refuse
  MOESH_RETURN_IF_ERROR(kv_->truncate(seq, n_keep));
  if (listener_ != nullptr) listener_->on_truncate(seq, n_keep);
  return Status::ok();
}

Status ContextState::copy(int32_t src, int32_t dst, int64_t n) {
  // Checked before either part changes, so a refused copy leaves dst as it was.
  if (src == dst) return make_error(StatusCode::kInvalidArgument, "copy: source and destination are both {}", src);
  const int64_t have = kv_->seq_len(src);
  if (n < 0 || n > have) {
    return make_error(StatusCode::kOutOfRange, "copy: sequence {} holds {} tokens, asked for {}", src, have, n);
  }
  if (rec_ != nullptr) MOESH_RETURN_IF_ERROR(rec_->copy(src, dst, n));
  MOESH_RETURN_IF_ERROR(kv_->copy(src, dst, n));
  if (listener_ != nullptr) listener_->on_copy(src, dst, n);
  return Status::ok();
}

void ContextState::remove(int32_t seq) {
  kv_->remove(seq);
  if (rec_ != nullptr) rec_->remove(seq);
  if (listener_ != nullptr) listener_->on_remove(seq);
}

void ContextState::clear() {
  kv_->clear();
  if (rec_ != nullptr) rec_->clear();
  if (listener_ != nullptr) listener_->on_clear();
}

}  // namespace moesh
