// New span edges while running (SpanClient::resplit, span_client.h), and what it shares with a
// planned move: making a runner before it is used, feeding it a sequence's inputs.
//
// Why it can be exact: a span's output rows depend only on its blocks and its inputs, and a batch
// of rows computes what the same rows one by one would (the model's contract). So a new span that
// starts where an old one started is warmed with that old span's log, and a new span that starts
// inside an old one is warmed with the rows the new span before it computes from its own warm-up:
// the rows it would have been sent had the edge always been there.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <future>
#include <thread>

#include "moesh/remote/span_client.h"
#include "moesh/swarm/span_host.h"
#include "remote/span_client_internal.h"

namespace moesh {

namespace {

// Rows per warm-up message: bounds a message's size (and a local step's scratch).
constexpr int64_t kFeedChunkRows = 256;
// How often a peer loading blocks is asked how far it is (from kLoadPollFirst, doubling: a peer on
// the full model is ready in milliseconds, a download takes minutes), and how long a let-go may take.
constexpr std::chrono::milliseconds kLoadPollFirst{5};
constexpr std::chrono::milliseconds kLoadPoll{200};
constexpr std::chrono::milliseconds kDropTimeout{5000};

// One SPAN_HOLD round trip on a link nothing else reads.
Result<wire::SpanHeldMsg> hold_trip(WorkerLink& link, wire::SpanHoldOp op, const LayerSpan& sp,
                                    net::Deadline deadline) {
  wire::SpanHoldMsg m;
  m.request_id = link.mux->next_request_id();
  m.op = op;
  if (op != wire::SpanHoldOp::kList) {
    m.first = static_cast<uint32_t>(sp.first);
    m.last = static_cast<uint32_t>(sp.last);
  }
  MOESH_ASSIGN_OR_RETURN(std::vector<uint8_t> frame, wire::encode_span_hold(m));
  MOESH_RETURN_IF_ERROR(link.mux->start(m.request_id, frame, deadline));
  MOESH_ASSIGN_OR_RETURN(wire::Frame reply, link.mux->wait(m.request_id, deadline));
  return wire::decode_span_held(reply);
}

const wire::SpanHolding* holding_of(const wire::SpanHeldMsg& h, const LayerSpan& sp) {
  for (const wire::SpanHolding& x : h.spans) {
    if (static_cast<int>(x.first) == sp.first && static_cast<int>(x.last) == sp.last) return &x;
  }
  return nullptr;
}

}  // namespace

Status load_span_on_peer(WorkerLink& link, const LayerSpan& sp, std::chrono::milliseconds timeout, bool* loaded) {
  const auto t0 = std::chrono::steady_clock::now();
  const net::Deadline deadline = net::deadline_in(timeout);
  wire::SpanHoldOp op = wire::SpanHoldOp::kLoad;
  std::chrono::milliseconds poll = kLoadPollFirst;
  *loaded = false;
  for (;;) {
    MOESH_ASSIGN_OR_RETURN(wire::SpanHeldMsg held, hold_trip(link, op, sp, deadline));
    const wire::SpanHolding* h = holding_of(held, sp);
    if (h == nullptr) {
      return make_error(StatusCode::kUnavailable, "{} lists no blocks {}-{} after being asked to load them", link.label,
                        sp.first, sp.last);
    }
    if (h->state == wire::SpanHeldState::kReady) {
      if (*loaded) {
        spdlog::info("span {}-{}: {} loaded the blocks in {:.1f} s", sp.first, sp.last, link.label,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      return Status::ok();
    }
    if (h->state == wire::SpanHeldState::kFailed) {
      return make_error(StatusCode::kUnavailable, "{} could not load blocks {}-{}: {}", link.label, sp.first, sp.last,
                        h->error);
    }
    if (!*loaded) spdlog::info("span {}-{}: {} loads the blocks", sp.first, sp.last, link.label);
    *loaded = true;
    op = wire::SpanHoldOp::kList;
    if (net::Clock::now() + poll >= deadline) {
      return make_error(StatusCode::kTimeout, "{} was still loading blocks {}-{} after {} ms", link.label, sp.first,
                        sp.last, timeout.count());
    }
    std::this_thread::sleep_for(poll);
    poll = std::min(poll * 2, kLoadPoll);
  }
}

bool SpanClient::let_go(const LayerSpan& sp, std::unique_ptr<WorkerLink> link) {
  if (!link) return false;
  bool dropped = false;
  if ((link->session.features & wire::kFeatureSpanLoad) != 0) {
    auto held = hold_trip(*link, wire::SpanHoldOp::kDrop, sp, net::deadline_in(kDropTimeout));
    if (held) {
      dropped = true;
      spdlog::info("span {}-{}: {} let go of the blocks", sp.first, sp.last, link->label);
    } else {
      spdlog::info("span {}-{}: {} keeps the blocks ({})", sp.first, sp.last, link->label, held.status().to_string());
    }
  }
  SpanPeerView v = view_of({-1, -1}, link->label, link.get());
  link->shut_down();
  std::lock_guard<std::mutex> lk(view_mu_);
  idle_.erase(std::remove_if(idle_.begin(), idle_.end(), [&](const SpanPeerView& x) { return x.address == v.address; }),
              idle_.end());
  idle_.push_back(std::move(v));
  return dropped;
}

void SpanClient::forget_running_idle() {
  std::lock_guard<std::mutex> lk(view_mu_);
  idle_.erase(std::remove_if(idle_.begin(), idle_.end(),
                             [&](const SpanPeerView& x) {
                               return std::any_of(runners_.begin(), runners_.end(), [&](const auto& r) {
                                 if (!r) return false;
                                 if (!r->view.local && r->view.address == x.address) return true;
                                 return std::any_of(r->lanes.begin(), r->lanes.end(),
                                                    [&](const auto& l) { return l->view.address == x.address; });
                               });
                             }),
              idle_.end());
}

std::vector<SpanPeerView> SpanClient::idle_view() const {
  std::lock_guard<std::mutex> lk(view_mu_);
  return idle_;
}

Status SpanClient::add_idle(const std::string& address) {
  MOESH_ASSIGN_OR_RETURN(WorkerAddress addr, parse_worker_address(address));
  {
    std::lock_guard<std::mutex> lk(view_mu_);
    for (const auto& r : runners_) {
      if (!r->view.local && r->view.address == addr.to_string()) {
        return make_error(StatusCode::kInvalidArgument, "{} runs span {}-{} of this backbone now", address,
                          r->view.span.first, r->view.span.last);
      }
      for (const auto& l : r->lanes) {
        if (l->view.address == addr.to_string()) {
          return make_error(StatusCode::kInvalidArgument, "{} is a lane of span {}-{} of this backbone now", address,
                            r->view.span.first, r->view.span.last);
        }
      }
    }
  }
  MOESH_ASSIGN_OR_RETURN(wire::Hello hello, span_hello(model_, opts_.name));
  MOESH_ASSIGN_OR_RETURN(std::unique_ptr<WorkerLink> link, connect_worker(addr, hello, opts_.link));
  if ((link->session.features & wire::kFeatureSpan) == 0) {
    link->shut_down();
    return make_error(StatusCode::kUnsupported, "{} runs no layer span (start it with moesh span)", link->label);
  }
  SpanPeerView v = view_of({-1, -1}, link->label, link.get());
  link->shut_down();
  std::lock_guard<std::mutex> lk(view_mu_);
  idle_.erase(std::remove_if(idle_.begin(), idle_.end(), [&](const SpanPeerView& x) { return x.address == v.address; }),
              idle_.end());
  spdlog::info("span peer {} known, idle (warm-up rtt {:.3f} ms)", v.label, v.warmup_rtt_ms);
  idle_.push_back(std::move(v));
  return Status::ok();
}

Result<SpanPlacement> parse_span_placement(const std::string& s) {
  const size_t at = s.find('@');
  if (at == std::string::npos || at == 0 || at + 1 >= s.size()) {
    return make_error(StatusCode::kInvalidArgument, "'{}' is not FIRST-LAST@HOST:PORT or FIRST-LAST@here", s);
  }
  SpanPlacement p;
  MOESH_ASSIGN_OR_RETURN(p.span, parse_layer_span(s.substr(0, at)));
  p.to = s.substr(at + 1);
  if (p.to != "here") MOESH_RETURN_IF_ERROR(parse_worker_address(p.to).status());
  return p;
}

Result<SpanClient::NewRunner> SpanClient::dial(const LayerSpan& sp, const std::string& to) const {
  NewRunner nr;
  if (to == "here") {
    swarm::SpanHostOptions ho;
    ho.span = sp;
    ho.n_threads = opts_.local_threads;
    if (opts_.here_executor) ho.executor = std::make_shared<BorrowedExecutor>(opts_.here_executor);
    auto h = swarm::SpanHost::create(model_, ho);
    if (!h) return h.status().with_context(fmt::format("span {}-{} here", sp.first, sp.last));
    (*h)->borrow_pool(pool_.load());
    nr.local = std::move(*h);
    nr.label = "here";
    nr.between_passes = opts_.here_executor != nullptr;
    return nr;
  }
  MOESH_ASSIGN_OR_RETURN(nr.addr, parse_worker_address(to));
  MOESH_ASSIGN_OR_RETURN(wire::Hello hello, span_hello(model_, opts_.name));
  MOESH_ASSIGN_OR_RETURN(nr.link, connect_worker(nr.addr, hello, opts_.link));
  if ((nr.link->session.features & wire::kFeatureSpan) == 0) {
    nr.link->shut_down();
    return make_error(StatusCode::kUnsupported, "{} runs no layer span (start it with moesh span)", nr.link->label);
  }
  nr.link->limits.max_n_embd = span_row_limit();
  nr.label = nr.link->label;
  if ((nr.link->session.features & wire::kFeatureSpanLoad) != 0) {
    Status st = load_span_on_peer(*nr.link, sp, opts_.load_timeout, &nr.loaded);
    if (!st.is_ok()) {
      nr.link->shut_down();
      return st;
    }
  }
  return nr;
}

Result<wire::SpanResultMsg> SpanClient::step_here(NewRunner& nr, const wire::SpanStepMsg& m) {
  if (!nr.between_passes) return nr.local->step(opts_.name, m);
  std::unique_lock<std::mutex> turnstile(pass_gate_);
  std::unique_lock<std::shared_mutex> no_pass(pass_mu_);
  turnstile.unlock();
  return nr.local->step(opts_.name, m);
}

Status SpanClient::feed(NewRunner& nr, const LayerSpan& sp, int32_t seq, const LogView& in, int64_t from,
                        std::vector<float>* out, SpanStats* counts) {
  const HParams& hp = model_.hparams();
  const int64_t Win = hp.span_row_width(sp.first), Wout = hp.span_row_width(sp.last + 1);
  const int64_t n = static_cast<int64_t>(in.pos.size());
  if (out != nullptr) out->assign(static_cast<size_t>(std::max<int64_t>(n - from, 0) * Wout), 0.0f);
  std::vector<float> rows, got;
  int restarts = 0;
  for (int64_t s = from; s < n;) {
    const int64_t c = std::min(kFeedChunkRows, n - s);
    wire::SpanStepMsg m;
    m.request_id = nr.link ? nr.link->mux->next_request_id() : nr.next_id++;
    m.first = static_cast<uint32_t>(sp.first);
    m.last = static_cast<uint32_t>(sp.last);
    m.return_dtype = opts_.return_wire;
    wire::SpanSeq q;
    q.seq = seq;
    q.n_new = static_cast<uint32_t>(c);
    q.start = static_cast<uint64_t>(s);
    if (s > 0) q.chain = in.chain[static_cast<size_t>(s - 1)];
    m.seqs.push_back(q);
    m.pos.assign(in.pos.begin() + s, in.pos.begin() + s + c);
    m.cut.assign(static_cast<size_t>(c), 0);
    rows.resize(static_cast<size_t>(c * Win));
    MOESH_RETURN_IF_ERROR(in.rows.read(s, c, rows.data()));
    // Logged rows are the bits sent before (rounded to the wire then), so they re-encode exactly.
    MOESH_ASSIGN_OR_RETURN(m.hidden, wire::encode_rows(opts_.hidden_wire, rows.data(), static_cast<uint32_t>(c),
                                                       static_cast<uint32_t>(Win)));
    wire::SpanResultMsg res;
    if (nr.local) {
      MOESH_ASSIGN_OR_RETURN(res, step_here(nr, m));
    } else {
      MOESH_RETURN_IF_ERROR(link_trip(*nr.link, m, &res, counts));
    }
    if (res.need.size() == 1 && res.need[0].seq == seq && static_cast<int64_t>(res.need[0].have) < s &&
        ++restarts <= 2) {
      // A recurrent state restorable only at its checkpoints: from the last one it has (the
      // rows before `from` are computed again and dropped).
      s = static_cast<int64_t>(res.need[0].have);
      continue;
    }
    if (!res.need.empty() || res.rows.n_rows != static_cast<uint32_t>(c) ||
        res.rows.n_cols != static_cast<uint32_t>(Wout)) {
      return make_error(StatusCode::kCorrupt,
                        "{} answered cells {}-{} of sequence {} with {}x{} rows and {} lacks (expected {}x{})",
                        nr.label, s, s + c - 1, seq, res.rows.n_rows, res.rows.n_cols, res.need.size(), c, Wout);
    }
    if (out != nullptr) {
      got.resize(static_cast<size_t>(c * Wout));
      wire::decode_rows(res.rows, got.data());
      const int64_t skip = std::max<int64_t>(from - s, 0);
      std::copy(got.begin() + skip * Wout, got.end(), out->begin() + (s + skip - from) * Wout);
    }
    counts->resplit_rows += static_cast<uint64_t>(c);
    s += c;
  }
  return Status::ok();
}

std::shared_ptr<RowStore> SpanClient::make_log_store(int64_t row_floats, int64_t total_width) const {
  RowStoreOptions ro;
  ro.row_floats = row_floats;
  ro.chunk_rows = opts_.log_chunk_rows;
  ro.memory_budget = opts_.log_memory_bytes == SIZE_MAX
                         ? SIZE_MAX
                         : static_cast<size_t>(static_cast<double>(opts_.log_memory_bytes) *
                                               static_cast<double>(row_floats) / static_cast<double>(total_width));
  ro.spill_dir = opts_.log_dir;
  return RowStore::create(ro);
}

uint64_t SpanClient::begin_pass() {
  // Through the turnstile first: a resplit waiting for the passes in flight holds it, so passes
  // started back to back cannot keep it waiting (a shared mutex may prefer readers).
  { std::lock_guard<std::mutex> turnstile(pass_gate_); }
  pass_mu_.lock_shared();
  return generation_;
}

void SpanClient::end_pass() {
  pass_mu_.unlock_shared();
}

std::vector<std::string> SpanClient::where_all() const {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& r : runners_) out.push_back(where_text(*r));
  return out;
}

Status SpanClient::resplit(const std::vector<SpanPlacement>& want_in) {
  const HParams& hp = model_.hparams();
  std::vector<SpanPlacement> want = want_in;
  std::sort(want.begin(), want.end(),
            [](const SpanPlacement& a, const SpanPlacement& b) { return a.span.first < b.span.first; });
  std::lock_guard<std::mutex> one_move(move_mu_);  // spans_ and runners_ change only under it

  // 1. The new layout must cover the blocks covered now, at edges the model may be cut at.
  auto list = [](const auto& v, auto span_of) {
    std::string s;
    for (const auto& x : v) s += fmt::format("{}{}-{}", s.empty() ? "" : ", ", span_of(x).first, span_of(x).last);
    return s;
  };
  const std::vector<LayerSpan> old = spans_;
  const std::string old_text = list(old, [](const LayerSpan& x) { return x; });
  if (want.empty()) return make_error(StatusCode::kInvalidArgument, "no spans given (the spans are {})", old_text);
  std::vector<int> old_at(static_cast<size_t>(hp.n_layer), -1);  // old span starting at block il
  std::vector<bool> covered(static_cast<size_t>(hp.n_layer), false);
  for (size_t k = 0; k < old.size(); ++k) {
    old_at[static_cast<size_t>(old[k].first)] = static_cast<int>(k);
    for (int il = old[k].first; il <= old[k].last; ++il) covered[static_cast<size_t>(il)] = true;
  }
  std::vector<bool> now(static_cast<size_t>(hp.n_layer), false);
  for (size_t j = 0; j < want.size(); ++j) {
    const LayerSpan& sp = want[j].span;
    if (sp.first < 0 || sp.last < sp.first || sp.last >= hp.n_layer) {
      return make_error(StatusCode::kInvalidArgument, "span {}-{} is not within the model's blocks 0-{}", sp.first,
                        sp.last, hp.n_layer - 1);
    }
    if (j > 0 && sp.first <= want[j - 1].span.last) {
      return make_error(StatusCode::kInvalidArgument, "spans {}-{} and {}-{} overlap", want[j - 1].span.first,
                        want[j - 1].span.last, sp.first, sp.last);
    }
    for (int il = sp.first; il <= sp.last; ++il) now[static_cast<size_t>(il)] = true;
  }
  if (now != covered) {
    return make_error(StatusCode::kInvalidArgument,
                      "spans {} do not cover the blocks the spans {} cover: a resplit moves span edges within "
                      "those blocks (the backbone keeps no state for them and runs the others itself; start it "
                      "with the blocks it runs as spans too, --span F-L@here, to move any block live, else "
                      "restart it with the new --span list)",
                      list(want, [](const SpanPlacement& x) { return x.span; }), old_text);
  }
  {
    std::vector<LayerSpan> edges;
    for (const SpanPlacement& w : want) edges.push_back(w.span);
    MOESH_RETURN_IF_ERROR(check_edge_wires(edges));
  }

  // 2. Which spans stay as they are (same blocks, same runner), and runners for the others,
  // made before any lock: dialling may take a round trip or a timeout.
  const size_t J = want.size();
  uint64_t loads_done = 0;
  std::vector<int> kept(J, -1);      // the old span index a new span keeps, runner and all
  std::vector<int> from_old(J, -1);  // the old span whose log a new span starts from (same first block)
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t j = 0; j < J; ++j) {
      const int k = old_at[static_cast<size_t>(want[j].span.first)];
      from_old[j] = k;
      if (k < 0 || !(old[static_cast<size_t>(k)] == want[j].span)) continue;
      const Runner& r = *runners_[static_cast<size_t>(k)];
      const bool same = want[j].to == "here" ? r.local != nullptr
                                             : (r.link && r.current < r.target.peers.size() &&
                                                r.target.peers[r.current].to_string() == want[j].to);
      if (same) kept[j] = k;
    }
  }
  if (std::all_of(kept.begin(), kept.end(), [](int k) { return k >= 0; }) && J == old.size()) {
    return Status::ok();  // nothing changes
  }
  // All at once: a peer may first load the blocks (SPAN_HOLD), which can take minutes each.
  std::vector<NewRunner> fresh(J);
  {
    std::vector<std::future<Result<NewRunner>>> dialled(J);
    for (size_t j = 0; j < J; ++j) {
      if (kept[j] < 0) dialled[j] = std::async(std::launch::async, [&, j] { return dial(want[j].span, want[j].to); });
    }
    Status first_error = Status::ok();
    for (size_t j = 0; j < J; ++j) {
      if (kept[j] >= 0) continue;
      Result<NewRunner> nr = dialled[j].get();
      if (!nr) {
        if (first_error.is_ok()) {
          first_error = nr.status().with_context(
              fmt::format("resplit: span {}-{} on {}", want[j].span.first, want[j].span.last, want[j].to));
        }
        continue;
      }
      fresh[j] = std::move(*nr);
      if (fresh[j].loaded) ++loads_done;
    }
    if (!first_error.is_ok()) {
      for (NewRunner& f : fresh)
        if (f.link) f.link->shut_down();
      return first_error;
    }
  }
  auto give_up = [&](const Status& st) {
    for (NewRunner& f : fresh)
      if (f.link) f.link->shut_down();
    return st;
  };
  // A new span starting inside an old one has no log yet: it is built from the rows leaving the
  // new span before it (which therefore is new as well, and adjacent).
  int64_t total_width = 0;
  for (size_t j = 0; j < J; ++j) total_width += hp.span_row_width(want[j].span.first);
  std::vector<std::shared_ptr<RowStore>> stores(J);
  for (size_t j = 0; j < J; ++j) {
    if (from_old[j] >= 0) {
      stores[j] = log_stores_[static_cast<size_t>(from_old[j])];
    } else {
      stores[j] = make_log_store(hp.span_row_width(want[j].span.first), total_width);
    }
  }
  auto interior = [&](size_t j) { return j < J && from_old[j] < 0; };

  // 3. Phase 1, steps going on: every sequence's logs at the old span starts, snapshot; each new
  // span fed its inputs in block order, the rows leaving it logged for an interior span after it.
  struct Built {
    RowLog rows;
    std::vector<int64_t> pos;
    std::vector<std::array<uint8_t, 16>> chain;
  };
  struct SeqWork {
    std::vector<Built> snap;   // [old span]: the snapshot
    std::vector<Built> built;  // [new span]: the interior spans' logs
    std::vector<int64_t> has;  // [new span]: cells its new runner holds
  };
  std::map<int32_t, SeqWork> work;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [seq, log] : logs_) {
      SeqWork w;
      for (size_t k = 0; k < old.size(); ++k) {
        if (k >= log.chain.size()) {
          w.snap.push_back({RowLog(), {}, {}});
          continue;
        }
        const int64_t n = static_cast<int64_t>(log.chain[k].size());
        w.snap.push_back({log.rows[k].prefix(n), log.pos[k], log.chain[k]});
      }
      work.emplace(seq, std::move(w));
    }
  }
  SpanStats counts;
  // Feeds new span j of sequence seq cells [from, n) of its inputs `in`; the rows leaving it
  // go to the interior span after it (its log cut to `from` first).
  auto feed_one = [&](size_t j, int32_t seq, const LogView& in, int64_t from, SeqWork& w) -> Status {
    const bool pass_on = interior(j + 1);
    std::vector<float> out;
    MOESH_RETURN_IF_ERROR(feed(fresh[j], want[j].span, seq, in, from, pass_on ? &out : nullptr, &counts)
                              .with_context(fmt::format("resplit: warming span {}-{} on {} with sequence {}",
                                                        want[j].span.first, want[j].span.last, fresh[j].label, seq)));
    w.has[j] = static_cast<int64_t>(in.pos.size());
    if (!pass_on) return Status::ok();
    Built& nx = w.built[j + 1];
    const int64_t W = hp.span_row_width(want[j + 1].span.first);
    const int64_t n = static_cast<int64_t>(in.pos.size());
    MOESH_RETURN_IF_ERROR(round_to_wire(&out, W));
    nx.rows.truncate(from);
    nx.pos.resize(static_cast<size_t>(from));
    nx.chain.resize(static_cast<size_t>(from));
    MOESH_RETURN_IF_ERROR(nx.rows.append(out.data(), n - from));
    std::array<uint8_t, 16> c = from > 0 ? nx.chain.back() : std::array<uint8_t, 16>{};
    for (int64_t i = from; i < n; ++i) {
      c = swarm::span_chain_next(c, in.pos[static_cast<size_t>(i)], out.data() + (i - from) * W, W);
      nx.chain.push_back(c);
      nx.pos.push_back(in.pos[static_cast<size_t>(i)]);
    }
    return Status::ok();
  };
  for (auto& [seq, w] : work) {
    w.built.clear();
    for (size_t j = 0; j < J; ++j) w.built.push_back({RowLog(stores[j]), {}, {}});
    w.has.assign(J, 0);
    for (size_t j = 0; j < J; ++j) {
      if (kept[j] >= 0) continue;
      const Built& in = interior(j) ? w.built[j] : w.snap[static_cast<size_t>(from_old[j])];
      if (in.pos.empty()) continue;
      Status st = feed_one(j, seq, LogView{in.rows, in.pos, in.chain}, 0, w);
      if (!st.is_ok()) return give_up(st);
    }
  }

  // 4. Phase 2, between two passes: what the steps changed meanwhile, then the switch.
  std::unique_lock<std::mutex> turnstile(pass_gate_);
  std::unique_lock<std::shared_mutex> no_pass(pass_mu_);
  turnstile.unlock();
  for (NewRunner& f : fresh) f.between_passes = false;  // held now, for every step that follows
  std::unique_lock<std::mutex> lk(mu_);
  for (auto it = work.begin(); it != work.end();) {
    it = logs_.count(it->first) != 0 ? std::next(it) : work.erase(it);  // sequences gone meanwhile
  }
  for (const auto& [seq, log] : logs_) {
    if (work.count(seq) != 0) continue;  // new meanwhile: nothing of it was fed
    SeqWork w;
    w.snap.resize(old.size());
    for (size_t j = 0; j < J; ++j) w.built.push_back({RowLog(stores[j]), {}, {}});
    w.has.assign(J, 0);
    work.emplace(seq, std::move(w));
  }
  for (auto& [seq, w] : work) {
    const SeqLog& log = logs_.at(seq);
    // Per new span, the cells of its (snapshot-based) inputs that are still the inputs now: an
    // old start's log compared by hash chain; an interior span's inputs are as valid as the
    // inputs of the span before it.
    std::vector<int64_t> valid(J, 0);
    for (size_t j = 0; j < J; ++j) {
      if (interior(j)) {
        valid[j] = valid[j - 1];
        continue;
      }
      const size_t k = static_cast<size_t>(from_old[j]);
      const auto& snap = w.snap[k].chain;
      const std::vector<std::array<uint8_t, 16>> none;
      const auto& cur = k < log.chain.size() ? log.chain[k] : none;
      size_t p = 0;
      while (p < snap.size() && p < cur.size() && snap[p] == cur[p]) ++p;
      valid[j] = static_cast<int64_t>(p);
    }
    for (size_t j = 0; j < J; ++j) {
      if (kept[j] >= 0) continue;
      w.has[j] = std::min(w.has[j], valid[j]);
      if (!interior(j + 1)) continue;  // its runner catches up at its next step (replay from its log)
      // The rows leaving span j for cells valid[j].. are the next span's inputs: fed now.
      if (interior(j)) {
        const Built& in = w.built[j];
        Status st = feed_one(j, seq, LogView{in.rows, in.pos, in.chain}, valid[j], w);
        if (!st.is_ok()) return give_up(st);
      } else {
        const size_t k = static_cast<size_t>(from_old[j]);
        if (k >= log.chain.size()) continue;
        Status st = feed_one(j, seq, LogView{log.rows[k], log.pos[k], log.chain[k]}, valid[j], w);
        if (!st.is_ok()) return give_up(st);
      }
    }
  }

  // The switch: new spans, runners, stores and logs; the old runners not kept are let go.
  // The views are read without mu_ (peers_view, under view_mu_ only): runners_ changes under both.
  std::unique_lock<std::mutex> views(view_mu_);
  std::vector<std::unique_ptr<Runner>> runners(J);
  for (size_t j = 0; j < J; ++j) {
    if (kept[j] >= 0) {
      runners[j] = std::move(runners_[static_cast<size_t>(kept[j])]);
      continue;
    }
    auto r = std::make_unique<Runner>();
    r->target.span = want[j].span;
    const bool here = fresh[j].local != nullptr;
    r->target.here = here;
    if (!here) r->target.peers.push_back(fresh[j].addr);
    r->link = std::move(fresh[j].link);
    r->local = std::move(fresh[j].local);
    if (r->local) r->local->borrow_pool(pool_.load());  // the pool as of now (set_pool holds mu_ too)
    r->label = fresh[j].label;
    r->current = here ? r->target.peers.size() : 0;
    r->next_peer = here ? r->target.peers.size() : 1;
    r->moved_here = here;
    r->last_retry = std::chrono::steady_clock::now();
    for (const auto& [seq, w] : work) {
      if (w.has[j] > 0) r->has[seq] = w.has[j];
    }
    r->view = view_of(want[j].span, r->label, here ? nullptr : r->link.get());
    r->view.chosen_here = here;
    runners[j] = std::move(r);
  }
  std::map<int32_t, SeqLog> logs;
  for (auto& [seq, log] : logs_) {
    SeqLog nl;
    SeqWork& w = work.at(seq);
    for (size_t j = 0; j < J; ++j) {
      if (interior(j)) {
        nl.rows.push_back(std::move(w.built[j].rows));
        nl.chain.push_back(std::move(w.built[j].chain));
        nl.pos.push_back(std::move(w.built[j].pos));
        continue;
      }
      const size_t k = static_cast<size_t>(from_old[j]);
      if (k < log.chain.size()) {
        nl.rows.push_back(std::move(log.rows[k]));
        nl.chain.push_back(std::move(log.chain[k]));
        nl.pos.push_back(std::move(log.pos[k]));
      } else {
        nl.rows.emplace_back(stores[j]);
        nl.chain.emplace_back();
        nl.pos.emplace_back();
      }
    }
    logs.emplace(seq, std::move(nl));
  }
  // The old runners not kept are let go once the switch is done (below, without the locks).
  std::vector<std::pair<LayerSpan, std::unique_ptr<WorkerLink>>> old_links;
  for (auto& r : runners_) {
    if (!r) continue;
    if (r->link) old_links.emplace_back(r->target.span, std::move(r->link));
    // A span that changes loses its lanes with its runner (they ran the old blocks).
    for (auto& l : r->lanes) old_links.emplace_back(r->target.span, std::move(l->link));
  }
  std::vector<LayerSpan> spans;
  for (const SpanPlacement& p : want) spans.push_back(p.span);
  runners_ = std::move(runners);
  views.unlock();
  spans_ = std::move(spans);
  log_stores_ = std::move(stores);
  logs_ = std::move(logs);
  chain_times_.clear();
  ++generation_;
  ++stats_.resplits;
  stats_.resplit_rows += counts.resplit_rows;
  stats_.bytes_sent += counts.bytes_sent;
  stats_.bytes_received += counts.bytes_received;
  stats_.loads += loads_done;
  spdlog::info("spans {} -> {} ({} rows fed to the new runners first)", old_text,
               list(want, [](const SpanPlacement& x) { return x.span; }), counts.resplit_rows);
  lk.unlock();
  no_pass.unlock();
  uint64_t drops = 0;
  for (auto& [sp, link] : old_links) drops += let_go(sp, std::move(link)) ? 1 : 0;
  forget_running_idle();  // a peer let go of one span may run another
  if (drops > 0) {
    std::lock_guard<std::mutex> again(mu_);
    stats_.drops += drops;
  }
  return Status::ok();
}

}  // namespace moesh
