// The span peer's compute (span_host.h): one Context holding the span's share of every
// backbone's sequences, keyed by (backbone name, sequence id), and the hash chains that tell
// which held cells a step may build on.
#include "moesh/swarm/span_host.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace moesh::swarm {

SpanChain span_chain_next(const SpanChain& prev, int64_t pos, const float* row, int64_t n_embd) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  XXH3_128bits_update(st, prev.data(), prev.size());
  XXH3_128bits_update(st, &pos, sizeof(pos));
  XXH3_128bits_update(st, row, static_cast<size_t>(n_embd) * sizeof(float));
  const XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  SpanChain out;
  std::memcpy(out.data(), &h.low64, 8);
  std::memcpy(out.data() + 8, &h.high64, 8);
  // All zero is reserved for the empty chain.
  if (out == SpanChain{}) out[0] = 1;
  return out;
}

SpanHost::SpanHost(const Model& model, const SpanHostOptions& opts) : model_(model), opts_(opts) {}
SpanHost::~SpanHost() = default;

Result<std::unique_ptr<SpanHost>> SpanHost::create(const Model& model, const SpanHostOptions& opts) {
  const int64_t n_layer = model.hparams().n_layer;
  if (opts.span.first < 0 || opts.span.last < opts.span.first || opts.span.last >= n_layer) {
    return make_error(StatusCode::kInvalidArgument, "blocks {}-{} are not within the model's 0-{}", opts.span.first,
                      opts.span.last, n_layer - 1);
  }
  if (opts.span.first < model.blocks().first || opts.span.last > model.blocks().last) {
    return make_error(StatusCode::kInvalidArgument, "blocks {}-{} asked, the file holds {}-{} only (a span slice)",
                      opts.span.first, opts.span.last, model.blocks().first, model.blocks().last);
  }
  if (opts.max_seqs == 0) return make_error(StatusCode::kInvalidArgument, "max_seqs must be at least 1");
  std::unique_ptr<SpanHost> h(new SpanHost(model, opts));
  ContextParams cp;
  cp.n_threads = opts.n_threads;
  cp.n_ctx = opts.n_ctx;
  cp.executor = opts.executor;
  cp.micro_batching = MicroBatching::kOff;
  cp.layers = opts.span;  // only the span's KV cells and recurrent state are kept here
  h->ctx_ = std::make_unique<Context>(model, cp);
  return h;
}

void SpanHost::borrow_pool(ThreadPool* pool) {
  std::lock_guard<std::mutex> lk(mu_);
  ctx_->borrow_pool(pool);
}

size_t SpanHost::n_sequences() const {
  std::lock_guard<std::mutex> lk(mu_);
  return seqs_.size();
}

bool SpanHost::serves_other_than(const std::string& peer) const {
  std::lock_guard<std::mutex> lk(mu_);
  return std::any_of(seqs_.begin(), seqs_.end(), [&](const auto& kv) { return kv.first.first != peer; });
}

int64_t SpanHost::usable(const Seq& s, uint64_t start, const SpanChain& chain) const {
  if (start == 0) return 0;
  if (s.chain.size() < start || s.chain[start - 1] != chain) return 0;
  // The cells match; a recurrent state can only go back to a checkpoint.
  return ctx_->state().restorable(s.local, static_cast<int64_t>(start));
}

void SpanHost::evict(const std::vector<Key>& keep) {
  while (seqs_.size() > opts_.max_seqs) {
    auto victim = seqs_.end();
    for (auto it = seqs_.begin(); it != seqs_.end(); ++it) {
      if (std::find(keep.begin(), keep.end(), it->first) != keep.end()) continue;
      if (victim == seqs_.end() || it->second.last_use < victim->second.last_use) victim = it;
    }
    if (victim == seqs_.end()) return;
    ctx_->state().remove(victim->second.local);
    seqs_.erase(victim);
    stats_.evictions.fetch_add(1);
  }
}

Result<wire::SpanResultMsg> SpanHost::step(const std::string& peer, const wire::SpanStepMsg& m) {
  const auto t0 = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lk(mu_);
  // Row widths in and out: n_embd, plus the residual-attention checkpoints where the model has them.
  const int64_t Win = model_.hparams().span_row_width(opts_.span.first);
  const int64_t Wout = model_.hparams().span_row_width(opts_.span.last + 1);
  if (static_cast<int>(m.first) != opts_.span.first || static_cast<int>(m.last) != opts_.span.last) {
    stats_.errors.fetch_add(1);
    return make_error(StatusCode::kNotFound, "this span peer runs blocks {}-{}, the step asks for {}-{}",
                      opts_.span.first, opts_.span.last, m.first, m.last);
  }
  if (static_cast<int64_t>(m.hidden.n_cols) != Win) {
    stats_.errors.fetch_add(1);
    return make_error(StatusCode::kInvalidArgument, "rows of width {}, block {} takes {}", m.hidden.n_cols,
                      opts_.span.first, Win);
  }

  // 1. Which sequences can start where the step says, and from what (nothing changes yet).
  struct Start {
    Key key;
    const Seq* from = nullptr;  // a sequence whose prefix matches (a copy), or null
  };
  std::vector<Start> starts(m.seqs.size());
  std::vector<wire::SpanHave> need;
  for (size_t k = 0; k < m.seqs.size(); ++k) {
    const wire::SpanSeq& q = m.seqs[k];
    starts[k].key = {peer, q.seq};
    if (q.start == 0) continue;
    auto it = seqs_.find(starts[k].key);
    const int64_t own = it == seqs_.end() ? 0 : usable(it->second, q.start, q.chain);
    if (own == static_cast<int64_t>(q.start)) continue;
    // Another of this backbone's sequences with the same inputs up to `start` (its prefix cache
    // copied them there): copy them here too.
    for (const auto& [key, s] : seqs_) {
      if (key.first == peer && key.second != q.seq && usable(s, q.start, q.chain) == static_cast<int64_t>(q.start)) {
        starts[k].from = &s;
        break;
      }
    }
    if (starts[k].from == nullptr) need.push_back({q.seq, static_cast<uint64_t>(own)});
  }
  if (!need.empty()) {
    stats_.needs.fetch_add(1);
    wire::SpanResultMsg r;
    r.request_id = m.request_id;
    r.need = std::move(need);
    return r;
  }

  // 2. Cut or copy every sequence to its start; then the rows.
  SequenceState& state = ctx_->state();
  std::vector<int32_t> local(m.seqs.size());
  for (size_t k = 0; k < m.seqs.size(); ++k) {
    const wire::SpanSeq& q = m.seqs[k];
    auto it = seqs_.find(starts[k].key);
    if (it == seqs_.end()) it = seqs_.emplace(starts[k].key, Seq{next_local_++, {}, 0}).first;
    Seq& s = it->second;
    Status st = Status::ok();
    if (starts[k].from != nullptr) {
      st = state.copy(starts[k].from->local, s.local, static_cast<int64_t>(q.start));
      s.chain.assign(starts[k].from->chain.begin(), starts[k].from->chain.begin() + static_cast<ptrdiff_t>(q.start));
      stats_.prefix_copies.fetch_add(1);
    } else {
      st = state.truncate(s.local, static_cast<int64_t>(q.start));
      s.chain.resize(std::min<size_t>(s.chain.size(), q.start));
    }
    if (st.is_ok() && state.seq_len(s.local) != static_cast<int64_t>(q.start)) {
      st = make_error(StatusCode::kInternal, "sequence {} holds {} cells after a cut to {}", q.seq,
                      state.seq_len(s.local), q.start);
    }
    if (!st.is_ok()) {
      stats_.errors.fetch_add(1);
      return st;
    }
    s.last_use = ++clock_;
    local[k] = s.local;
  }
  const uint32_t n_rows = m.n_rows();
  std::vector<float> h(static_cast<size_t>(n_rows) * static_cast<size_t>(std::max(Win, Wout)));
  wire::decode_rows(m.hidden, h.data());
  std::vector<Context::LayerToken> toks(n_rows);
  uint32_t n_new = 0;
  {
    uint32_t row = 0;
    for (size_t k = 0; k < m.seqs.size(); ++k) {
      for (uint32_t j = 0; j < m.seqs[k].n_replay + m.seqs[k].n_new; ++j, ++row) {
        toks[row] = {local[k], m.pos[row], m.cut[row] != 0};
      }
      n_new += m.seqs[k].n_new;
    }
  }
  // The chains of the new cells, from the inputs as received (before decode_layers overwrites h).
  std::vector<SpanChain> chains(n_rows);
  {
    uint32_t row = 0;
    for (size_t k = 0; k < m.seqs.size(); ++k) {
      const Seq& s = seqs_.at(starts[k].key);
      SpanChain c = s.chain.empty() ? SpanChain{} : s.chain.back();
      for (uint32_t j = 0; j < m.seqs[k].n_replay + m.seqs[k].n_new; ++j, ++row) {
        c = span_chain_next(c, m.pos[row], h.data() + static_cast<size_t>(row) * Win, Win);
        chains[row] = c;
      }
    }
  }
  Status st = ctx_->decode_layers(toks, opts_.span.first, opts_.span.last, h.data());
  if (!st.is_ok()) {
    stats_.errors.fetch_add(1);
    return st;
  }

  // 3. The new rows back; the chains kept.
  std::vector<float> out(static_cast<size_t>(n_new) * static_cast<size_t>(Wout));
  std::vector<Key> keep;
  {
    uint32_t row = 0, o = 0;
    for (size_t k = 0; k < m.seqs.size(); ++k) {
      Seq& s = seqs_.at(starts[k].key);
      for (uint32_t j = 0; j < m.seqs[k].n_replay + m.seqs[k].n_new; ++j, ++row) {
        s.chain.push_back(chains[row]);
        if (j >= m.seqs[k].n_replay) {
          std::copy(h.data() + static_cast<size_t>(row) * Wout, h.data() + static_cast<size_t>(row + 1) * Wout,
                    out.data() + static_cast<size_t>(o++) * Wout);
        }
      }
      stats_.replayed_rows.fetch_add(m.seqs[k].n_replay);
      keep.push_back(starts[k].key);
    }
  }
  evict(keep);
  auto rows = wire::encode_rows(m.return_dtype, out.data(), n_new, static_cast<uint32_t>(Wout));
  if (!rows) return rows.status();
  stats_.steps.fetch_add(1);
  stats_.rows.fetch_add(n_rows);
  wire::SpanResultMsg r;
  r.request_id = m.request_id;
  r.rows = std::move(*rows);
  r.compute_us = static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
  return r;
}

SpanHosts::SpanHosts(std::shared_ptr<SpanHost> initial, SpanLoader loader, int64_t max_row_width)
    : loader_(std::move(loader)), max_row_width_(max_row_width) {
  if (!initial) return;
  max_row_width_ = initial->model().hparams().max_span_row_width();
  const Key key{initial->span().first, initial->span().last};  // before the move below
  spans_[key] = Entry{std::move(initial), {}, {}};
}

SpanHosts::~SpanHosts() {
  std::vector<Load> loads;
  {
    std::lock_guard<std::mutex> lk(mu_);
    loads.swap(loads_);
  }
  for (Load& l : loads) l.thread.join();
}

std::shared_ptr<SpanHost> SpanHosts::find(const LayerSpan& sp) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = spans_.find({sp.first, sp.last});
  return it == spans_.end() ? nullptr : it->second.host;
}

Result<wire::SpanResultMsg> SpanHosts::step(const std::string& peer, const wire::SpanStepMsg& m) {
  std::shared_ptr<SpanHost> h = find({static_cast<int>(m.first), static_cast<int>(m.last)});
  if (!h) {
    return make_error(StatusCode::kNotFound, "this span peer runs blocks {}, the step asks for {}-{}", describe(),
                      m.first, m.last);
  }
  std::lock_guard<std::mutex> one(compute_mu_);
  return h->step(peer, m);
}

std::vector<wire::SpanHolding> SpanHosts::list_locked() const {
  std::vector<wire::SpanHolding> out;
  for (const auto& [k, e] : spans_) {
    out.push_back({static_cast<uint32_t>(k.first), static_cast<uint32_t>(k.second), e.state,
                   e.error.substr(0, wire::kMaxTextBytes)});
  }
  return out;  // block order: (first, last)
}

std::vector<wire::SpanHolding> SpanHosts::list() const {
  std::lock_guard<std::mutex> lk(mu_);
  return list_locked();
}

std::string SpanHosts::describe_locked() const {
  std::string s;
  for (const auto& [k, e] : spans_) {
    s += fmt::format("{}{}-{}{}", s.empty() ? "" : ", ", k.first, k.second,
                     e.state == wire::SpanHeldState::kLoading  ? " (loading)"
                     : e.state == wire::SpanHeldState::kFailed ? " (failed)"
                                                               : "");
  }
  return s.empty() ? std::string("none") : s;
}

std::string SpanHosts::describe() const {
  std::lock_guard<std::mutex> lk(mu_);
  return describe_locked();
}

Result<wire::SpanHeldMsg> SpanHosts::hold(const std::string& peer, const wire::SpanHoldMsg& m) {
  const Key key{static_cast<int>(m.first), static_cast<int>(m.last)};
  std::unique_lock<std::mutex> lk(mu_);
  if (m.op == wire::SpanHoldOp::kLoad) {
    auto it = spans_.find(key);
    const bool again = it != spans_.end() && it->second.state == wire::SpanHeldState::kFailed;
    if (it == spans_.end() || again) {
      if (!loader_) {
        return make_error(StatusCode::kUnsupported,
                          "this span peer runs blocks {} and cannot load {}-{} (start it with the full model, -m, "
                          "or with --fetch from its gateway)",
                          describe_locked(), m.first, m.last);
      }
      spans_[key] = Entry{nullptr, wire::SpanHeldState::kLoading, {}};
      spdlog::info("span peer: loading blocks {}-{} for '{}'", key.first, key.second, peer);
      // Loads that finished are joined here (quick: their threads are ending or gone).
      for (auto l = loads_.begin(); l != loads_.end();) {
        if (!l->done->load()) {
          ++l;
          continue;
        }
        l->thread.join();
        l = loads_.erase(l);
      }
      auto done = std::make_shared<std::atomic<bool>>(false);
      loads_.push_back({std::thread(), done});
      loads_.back().thread = std::thread([this, key, done] {
        struct Done {
          std::atomic<bool>& d;
          ~Done() { d = true; }
        } mark{*done};
        Result<std::shared_ptr<SpanHost>> h = loader_(LayerSpan{key.first, key.second});
        if (h.is_ok() && (!*h || (*h)->span().first != key.first || (*h)->span().last != key.second))
          h = make_error(StatusCode::kInternal, "the loader made no host of blocks {}-{}", key.first, key.second);
        std::lock_guard<std::mutex> finished(mu_);
        auto e = spans_.find(key);
        if (e == spans_.end()) return;  // dropped meanwhile
        if (h.is_ok()) {
          e->second = Entry{std::move(*h), wire::SpanHeldState::kReady, {}};
          spdlog::info("span peer: blocks {}-{} loaded", key.first, key.second);
        } else {
          e->second = Entry{nullptr, wire::SpanHeldState::kFailed, h.status().to_string()};
          spdlog::warn("span peer: blocks {}-{} not loaded: {}", key.first, key.second, h.status().to_string());
        }
      });
    }
  } else if (m.op == wire::SpanHoldOp::kDrop) {
    auto it = spans_.find(key);
    if (it == spans_.end())
      return make_error(StatusCode::kNotFound, "this span peer runs blocks {}, not {}-{}", describe_locked(), m.first,
                        m.last);
    if (!loader_ && it->second.state == wire::SpanHeldState::kReady) {
      return make_error(StatusCode::kUnavailable, "blocks {}-{} are kept: this span peer could not load them again",
                        m.first, m.last);
    }
    if (it->second.state == wire::SpanHeldState::kLoading)
      return make_error(StatusCode::kUnavailable, "blocks {}-{} are still loading", m.first, m.last);
    if (it->second.host && it->second.host->serves_other_than(peer)) {
      return make_error(StatusCode::kUnavailable, "blocks {}-{} also serve another backbone's sequences: kept", m.first,
                        m.last);
    }
    std::shared_ptr<SpanHost> gone = std::move(it->second.host);
    spans_.erase(it);
    spdlog::info("span peer: blocks {}-{} let go at the word of '{}'", key.first, key.second, peer);
    lk.unlock();
    // A step in flight keeps its own reference; the host goes when the last one does.
    std::lock_guard<std::mutex> one(compute_mu_);
    gone.reset();
    lk.lock();
  }
  wire::SpanHeldMsg out;
  out.request_id = m.request_id;
  out.spans = list_locked();
  return out;
}

}  // namespace moesh::swarm
