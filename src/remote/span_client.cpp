// The backbone's span runner (span_client.h): per span a peer link (or the local host), per
// sequence the log of every span's inputs and their hash chain, and the step protocol: send the
// new rows, replay what the peer says it lacks, fail over to the next holder.
#include "moesh/remote/span_client.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <tuple>

#include "moesh/swarm/span_host.h"
#include "moesh/swarm/swarm.h"
#include "remote/span_client_internal.h"

namespace moesh {

Result<wire::Hello> span_hello(const Model& model, const std::string& name) {
  auto id = swarm::model_identity(model.file());
  if (!id) return id.status().with_context("model identity");
  auto shape = swarm::model_shape(model.file());
  if (!shape) return shape.status().with_context("model shape");
  return swarm::make_hello(wire::PeerRole::kBackbone, *id, *shape, swarm::ExpertSet{}, name);
}

const char* span_chain_mode_name(SpanChainMode m) {
  switch (m) {
    case SpanChainMode::kOff:
      return "off";
    case SpanChainMode::kOn:
      return "on";
    case SpanChainMode::kAuto:
      return "auto";
  }
  return "?";
}

Result<SpanChainMode> parse_span_chain_mode(const std::string& s) {
  for (SpanChainMode m : {SpanChainMode::kOff, SpanChainMode::kOn, SpanChainMode::kAuto}) {
    if (s == span_chain_mode_name(m)) return m;
  }
  return make_error(StatusCode::kInvalidArgument, "--span-chain '{}' is not off, on or auto", s);
}

Result<SpanTarget> parse_span_target(const std::string& s) {
  const size_t at = s.find('@');
  if (at == std::string::npos || at == 0 || at + 1 >= s.size()) {
    return make_error(StatusCode::kInvalidArgument,
                      "--span '{}' is not FIRST-LAST@HOST:PORT or FIRST-LAST@here (e.g. 12-23@10.0.0.2:7070)", s);
  }
  SpanTarget t;
  MOESH_ASSIGN_OR_RETURN(t.span, parse_layer_span(s.substr(0, at)));
  if (s.substr(at + 1) == "here") {
    t.here = true;
    return t;
  }
  MOESH_ASSIGN_OR_RETURN(WorkerAddress a, parse_worker_address(s.substr(at + 1)));
  t.peers.push_back(std::move(a));
  return t;
}

Result<SpanTarget> parse_span_lane(const std::string& s) {
  auto t = parse_span_target(s);
  if (!t) return t.status().with_context("--span-lane");
  if (t->here) {
    return make_error(StatusCode::kInvalidArgument,
                      "--span-lane '{}': a lane is another peer (the span's own runner may be here)", s);
  }
  t->lanes = std::move(t->peers);
  t->peers.clear();
  return t;
}

Result<std::vector<SpanTarget>> merge_span_targets(std::vector<SpanTarget> targets) {
  std::vector<SpanTarget> out;
  // Lanes last, so that they join the span whichever order they were given in.
  std::stable_partition(targets.begin(), targets.end(), [](const SpanTarget& t) { return !t.peers.empty() || t.here; });
  for (SpanTarget& t : targets) {
    auto it = std::find_if(out.begin(), out.end(), [&](const SpanTarget& o) { return o.span == t.span; });
    const bool lanes_only = t.peers.empty() && !t.here;
    if (lanes_only && it == out.end()) {
      return make_error(StatusCode::kInvalidArgument,
                        "lane of span {}-{}, which no --span names (a lane shares a span's sequences with its runner)",
                        t.span.first, t.span.last);
    }
    if (it != out.end()) {
      for (WorkerAddress& a : t.lanes) it->lanes.push_back(std::move(a));
      if (lanes_only) continue;
      if (it->here != t.here) {
        return make_error(StatusCode::kInvalidArgument,
                          "span {}-{} is given both here and on a peer (a span here runs on this process only)",
                          t.span.first, t.span.last);
      }
      for (WorkerAddress& a : t.peers) it->peers.push_back(std::move(a));
    } else {
      out.push_back(std::move(t));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const SpanTarget& a, const SpanTarget& b) { return a.span.first < b.span.first; });
  for (size_t k = 1; k < out.size(); ++k) {
    if (out[k].span.first <= out[k - 1].span.last) {
      return make_error(StatusCode::kInvalidArgument, "spans {}-{} and {}-{} overlap", out[k - 1].span.first,
                        out[k - 1].span.last, out[k].span.first, out[k].span.last);
    }
  }
  return out;
}

SpanClient::SpanClient(const Model& model, const SpanOptions& opts) : model_(model), opts_(opts) {}

int64_t SpanClient::width_in(int k) const {
  return model_.hparams().span_row_width(spans_[static_cast<size_t>(k)].first);
}
int64_t SpanClient::width_out(int k) const {
  return model_.hparams().span_row_width(spans_[static_cast<size_t>(k)].last + 1);
}
uint32_t SpanClient::span_row_limit() const {
  // The widest rows a span may answer with (with residual checkpoints, those entering the output
  // head; with a reused indexer selection, those entering the block that reuses it).
  return static_cast<uint32_t>(model_.hparams().max_span_row_width());
}

Status SpanClient::check_edge_wires(const std::vector<LayerSpan>& spans) const {
  const HParams& hp = model_.hparams();
  for (const LayerSpan& sp : spans) {
    for (const auto& [il, d, what] :
         {std::tuple{sp.first, opts_.hidden_wire, "hidden"}, std::tuple{sp.last + 1, opts_.return_wire, "return"}}) {
      if (d != wire::WireDType::kF32 && hp.carries_selection(il)) {
        return make_error(StatusCode::kInvalidArgument,
                          "span {}-{}: rows entering block {} carry an indexer selection (cell positions, which must "
                          "arrive exactly), so the {} wire there must be f32, not {}",
                          sp.first, sp.last, il, what, wire::wire_dtype_name(d));
      }
    }
  }
  return Status::ok();
}

SpanPeerView SpanClient::view_of(const LayerSpan& sp, const std::string& label, const WorkerLink* link) {
  SpanPeerView v;
  v.span = sp;
  v.label = label;
  v.local = link == nullptr;
  if (link == nullptr) return v;
  v.warmup_rtt_ms = std::chrono::duration<double, std::milli>(link->warmup_rtt).count();
  v.address = link->address.to_string();
  v.slab_bytes = link->capacity.slab_bytes;
  v.mem_total_bytes = link->capacity.mem_total_bytes;
  v.mem_available_bytes = link->capacity.mem_available_bytes;
  v.offer_bytes = link->capacity.offer_bytes;
  v.replica_budget_bytes = link->capacity.replica_budget_bytes;
  return v;
}

SpanClient::~SpanClient() {
  for (auto& r : runners_) {
    if (r->link) r->link->shut_down();
    for (auto& l : r->lanes)
      if (l->link) l->link->shut_down();
  }
}

Result<std::shared_ptr<SpanClient>> SpanClient::connect(const Model& model, std::vector<SpanTarget> targets,
                                                        const SpanOptions& opts) {
  MOESH_ASSIGN_OR_RETURN(std::vector<SpanTarget> merged, merge_span_targets(std::move(targets)));
  if (merged.empty()) return make_error(StatusCode::kInvalidArgument, "no spans given");
  const int64_t n_layer = model.hparams().n_layer;
  for (const SpanTarget& t : merged) {
    if (t.span.last >= n_layer) {
      return make_error(StatusCode::kInvalidArgument, "span {}-{} is beyond the model's blocks 0-{}", t.span.first,
                        t.span.last, n_layer - 1);
    }
  }
  for (wire::WireDType d : {opts.hidden_wire, opts.return_wire}) {
    if (d != wire::WireDType::kF32 && d != wire::WireDType::kF16 && d != wire::WireDType::kBF16) {
      return make_error(StatusCode::kInvalidArgument,
                        "{} rows are not offered between spans (f32, f16 or bf16: a replayed input must re-encode "
                        "to its own bits)",
                        wire::wire_dtype_name(d));
    }
  }
  std::shared_ptr<SpanClient> c(new SpanClient(model, opts));
  for (SpanTarget& t : merged) {
    c->spans_.push_back(t.span);
    auto r = std::make_unique<Runner>();
    r->target = std::move(t);
    c->runners_.push_back(std::move(r));
  }
  MOESH_RETURN_IF_ERROR(c->check_edge_wires(c->spans_));
  // One log store per span (rows of its input width); the memory budget shared in proportion.
  int64_t total_width = 0;
  for (size_t k = 0; k < c->spans_.size(); ++k) total_width += c->width_in(static_cast<int>(k));
  for (size_t k = 0; k < c->spans_.size(); ++k) {
    RowStoreOptions ro;
    ro.row_floats = c->width_in(static_cast<int>(k));
    ro.chunk_rows = opts.log_chunk_rows;
    ro.memory_budget = opts.log_memory_bytes == SIZE_MAX
                           ? SIZE_MAX
                           : static_cast<size_t>(static_cast<double>(opts.log_memory_bytes) *
                                                 static_cast<double>(ro.row_floats) / static_cast<double>(total_width));
    ro.spill_dir = opts.log_dir;
    c->log_stores_.push_back(RowStore::create(ro));
  }
  for (size_t k = 0; k < c->runners_.size(); ++k) {
    Status st = c->fail_over(static_cast<int>(k), Status::ok());
    if (!st.is_ok()) return st;
  }
  c->stats_.failovers = 0;  // the first connection of each span is not a failover
  // Lanes at start: one that does not answer is left out (the span runs on without it), said.
  for (size_t k = 0; k < c->runners_.size(); ++k) {
    const SpanTarget t = c->runners_[k]->target;
    for (const WorkerAddress& a : t.lanes) {
      Status st = c->add_lane(t.span, a.to_string());
      if (!st.is_ok()) {
        spdlog::warn("span {}-{}: lane {} left out: {}", t.span.first, t.span.last, a.to_string(), st.to_string());
      }
    }
  }
  return c;
}

// Moves span k to its next peer that connects — after a failure, then to an idle span peer that
// loads the blocks — else (local_fallback) to this process. `why` is what made the current one
// fail (ok at start-up).
Status SpanClient::fail_over(int k, const Status& why) {
  Runner& r = *runners_[static_cast<size_t>(k)];
  const LayerSpan sp = r.target.span;
  if (r.link) {
    spdlog::warn("span {}-{}: {} failed ({}); moving the span", sp.first, sp.last, r.label, why.to_string());
    r.link->shut_down();
    r.link.reset();
  }
  r.has.clear();  // a new runner holds nothing of ours until it says so
  r.pending.reset();
  std::string errors;
  MOESH_ASSIGN_OR_RETURN(wire::Hello hello, span_hello(model_, opts_.name));
  const bool failure = !why.is_ok();
  const bool can_run_here = opts_.local_fallback || r.target.here;
  // Takes the span onto `link`; `at`: its index in target.peers.
  auto take = [&](std::unique_ptr<WorkerLink> link, size_t at, bool loaded, bool idle) {
    if (loaded) {
      ++stats_.loads;
      if (failure) ++stats_.failover_loads;
    }
    if (idle) ++stats_.idle_takeovers;
    r.link = std::move(link);
    r.link->limits.max_n_embd = span_row_limit();
    r.local.reset();
    r.label = r.link->label;
    r.current = at;
    r.last_retry = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> vl(view_mu_);
      r.view = view_of(r.target.span, r.label, r.link.get());
    }
    if (failure) ++stats_.failovers;
  };
  // Dials a; ok with *link set when it can run the span now. A peer that loads spans is asked to
  // hold the blocks: at start-up it is waited for (load_timeout); after a failure for
  // failover_load_wait when the span can run here meanwhile (it is then kept loading as
  // r.pending, the first such peer only), else for load_timeout.
  auto dial = [&](const WorkerAddress& a, bool idle, std::unique_ptr<WorkerLink>* link, bool* loaded) -> Status {
    *loaded = false;
    auto l = connect_worker(a, hello, opts_.link);
    if (!l) return l.status();
    if (((*l)->session.features & wire::kFeatureSpan) == 0) {
      (*l)->shut_down();
      return make_error(StatusCode::kUnsupported, "{} runs no layer span (start it with moesh span)", (*l)->label);
    }
    if (((*l)->session.features & wire::kFeatureSpanLoad) == 0) {
      if (idle) {
        (*l)->shut_down();
        return make_error(StatusCode::kUnsupported, "{} does not load blocks", (*l)->label);
      }
      // A replacement that cannot load: the steps find out whether it holds the blocks.
      *link = std::move(*l);
      return Status::ok();
    }
    if (!failure) {
      Status st = load_span_on_peer(**l, sp, opts_.load_timeout, loaded);
      if (!st.is_ok()) {
        (*l)->shut_down();
        return st;
      }
      *link = std::move(*l);
      return Status::ok();
    }
    auto p = std::make_unique<SpanPendingLoad>();
    p->link = std::move(*l);
    p->address = a;
    p->idle = idle;
    WorkerLink* lp = p->link.get();
    bool* lf = &p->loaded;
    const std::chrono::milliseconds timeout = opts_.load_timeout;
    p->done = std::async(std::launch::async, [lp, sp, timeout, lf] { return load_span_on_peer(*lp, sp, timeout, lf); });
    const bool may_wait_here = can_run_here && !r.pending;
    const auto wait = may_wait_here ? opts_.failover_load_wait : opts_.load_timeout + std::chrono::seconds(1);
    // (A wait of 0 never waits: the span runs here first, which tests rely on.)
    if (wait.count() > 0 && p->done.wait_for(wait) == std::future_status::ready) {
      Status st = p->done.get();
      if (!st.is_ok()) return st;
      *loaded = p->loaded;
      *link = std::move(p->link);
      return Status::ok();
    }
    const std::string label = p->link->label;
    if (!may_wait_here) {
      return make_error(StatusCode::kTimeout, "{} was still loading the blocks after {} ms", label, wait.count());
    }
    r.pending = std::move(p);
    return make_error(StatusCode::kUnavailable, "{} loads the blocks (the span moves there once it holds them)", label);
  };
  while (r.next_peer < r.target.peers.size()) {
    const WorkerAddress& a = r.target.peers[r.next_peer++];
    std::unique_ptr<WorkerLink> link;
    bool loaded = false;
    Status st = dial(a, false, &link, &loaded);
    if (st.is_ok()) {
      r.pending.reset();
      take(std::move(link), r.next_peer - 1, loaded, false);
      return Status::ok();
    }
    errors += fmt::format("; {}: {}", a.to_string(), st.message());
  }
  // The idle span peers this backbone knows (let go of, or made known): one that loads the
  // blocks takes the span over, so it need not come here.
  if (failure) {
    for (const SpanPeerView& v : idle_view()) {
      auto a = parse_worker_address(v.address);
      if (!a) continue;
      const bool named = std::any_of(r.target.peers.begin(), r.target.peers.end(),
                                     [&](const WorkerAddress& x) { return x.to_string() == a->to_string(); });
      if (named) continue;
      std::unique_ptr<WorkerLink> link;
      bool loaded = false;
      Status st = dial(*a, true, &link, &loaded);
      if (st.is_ok()) {
        r.pending.reset();
        r.target.peers.push_back(*a);
        r.next_peer = r.target.peers.size();
        take(std::move(link), r.target.peers.size() - 1, loaded, true);
        spdlog::info("span {}-{}: taken over by {}, an idle span peer", sp.first, sp.last, r.label);
        forget_running_idle();
        return Status::ok();
      }
      errors += fmt::format("; {} (idle): {}", a->to_string(), st.message());
    }
  }
  if (!can_run_here) {
    return make_error(StatusCode::kUnavailable, "span {}-{}: no peer can run it{}", sp.first, sp.last, errors);
  }
  r.moved_here = r.moved_here || r.target.here;  // named here: no preferred peer to go back to
  if (!r.local) {
    swarm::SpanHostOptions ho;
    ho.span = sp;
    ho.n_threads = opts_.local_threads;
    if (opts_.here_executor) ho.executor = std::make_shared<BorrowedExecutor>(opts_.here_executor);
    MOESH_ASSIGN_OR_RETURN(r.local, swarm::SpanHost::create(model_, ho));
    r.local->borrow_pool(pool_.load());
  }
  if (!errors.empty()) spdlog::warn("span {}-{}: runs here (peers: {})", sp.first, sp.last, errors.substr(2));
  r.label = "here";
  r.current = r.target.peers.size();
  r.last_retry = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> vl(view_mu_);
    r.view = view_of(r.target.span, r.label, nullptr);
    r.view.chosen_here = r.moved_here;
  }
  if (failure) ++stats_.failovers;
  return Status::ok();
}

// A replacement that was still loading the blocks when span k failed over here: once it holds
// them the span moves there (its inputs replayed from the log, as after any move).
void SpanClient::adopt_loaded(int k) {
  Runner& r = *runners_[static_cast<size_t>(k)];
  if (!r.pending || r.pending->done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
  std::unique_ptr<SpanPendingLoad> p = std::move(r.pending);
  const LayerSpan sp = r.target.span;
  Status st = p->done.get();
  if (!st.is_ok() || !r.local) {
    if (!st.is_ok()) spdlog::warn("span {}-{}: the replacement did not load it: {}", sp.first, sp.last, st.to_string());
    return;
  }
  auto& peers = r.target.peers;
  size_t at = std::find_if(peers.begin(), peers.end(),
                           [&](const WorkerAddress& a) { return a.to_string() == p->address.to_string(); }) -
              peers.begin();
  if (at == peers.size()) peers.push_back(p->address);
  spdlog::info("span {}-{}: {} holds the blocks now; the span moves there from here", sp.first, sp.last,
               p->link->label);
  if (p->loaded) {
    ++stats_.loads;
    ++stats_.failover_loads;
  }
  if (p->idle) ++stats_.idle_takeovers;
  r.link = std::move(p->link);
  r.link->limits.max_n_embd = span_row_limit();
  r.local.reset();
  r.has.clear();  // the need/replay path gives it every cell
  r.label = r.link->label;
  r.current = at;
  r.next_peer = at + 1;
  r.last_retry = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> vl(view_mu_);
    r.view = view_of(sp, r.label, r.link.get());
  }
  forget_running_idle();
}

void SpanClient::set_pool(ThreadPool* pool) {
  pool_.store(pool);
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& r : runners_)
    if (r && r->local) r->local->borrow_pool(pool);
}

void SpanClient::retry_preferred(int k) {
  adopt_loaded(k);
  Runner& r = *runners_[static_cast<size_t>(k)];
  if (r.current == 0 || r.moved_here || opts_.retry_preferred.count() < 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - r.last_retry < opts_.retry_preferred) return;
  r.last_retry = now;
  auto hello = span_hello(model_, opts_.name);
  if (!hello) return;
  const LayerSpan sp = r.target.span;
  for (size_t i = 0; i < std::min(r.current, r.target.peers.size()); ++i) {
    auto link = connect_worker(r.target.peers[i], *hello, opts_.link);
    if (!link || ((*link)->session.features & wire::kFeatureSpan) == 0) continue;
    spdlog::info("span {}-{}: back on {} (was {})", sp.first, sp.last, (*link)->label, r.label);
    if (r.link) r.link->shut_down();
    r.pending.reset();
    r.link = std::move(*link);
    r.link->limits.max_n_embd = span_row_limit();
    r.local.reset();
    r.has.clear();  // it holds nothing of ours until it says so: the need/replay path restores it
    r.label = r.link->label;
    r.current = i;
    r.next_peer = i + 1;
    ++stats_.restored;
    std::lock_guard<std::mutex> vl(view_mu_);
    r.view = view_of(sp, r.label, r.link.get());
    return;
  }
}

// One round trip of span k (or one local step).
Status SpanClient::trip(int k, const wire::SpanStepMsg& m, wire::SpanResultMsg* out) {
  Runner& r = *runners_[static_cast<size_t>(k)];
  ++stats_.trips;
  if (r.local) {
    auto res = r.local->step(opts_.name, m);
    if (!res) return res.status();
    *out = std::move(*res);
    return Status::ok();
  }
  const auto t0 = std::chrono::steady_clock::now();
  MOESH_RETURN_IF_ERROR(link_trip(*r.link, m, out, &stats_));
  std::lock_guard<std::mutex> vl(view_mu_);
  note_trip(&r.view, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), m, *out);
  return Status::ok();
}

void note_trip(SpanPeerView* v, double seconds, const wire::SpanStepMsg& m, const wire::SpanResultMsg& res) {
  ++v->trips;
  v->trip_seconds += seconds;
  v->min_trip_seconds = v->trips == 1 ? seconds : std::min(v->min_trip_seconds, seconds);
  ++v->compute_steps;
  for (const wire::SpanSeq& q : m.seqs) v->compute_rows += q.n_replay + q.n_new;
  v->compute_seconds += res.compute_us * 1e-6;
}

Status SpanClient::link_trip(WorkerLink& link, const wire::SpanStepMsg& m, wire::SpanResultMsg* out,
                             SpanStats* counts) {
  const net::Deadline deadline = net::deadline_in(opts_.timeout);
  MOESH_RETURN_IF_ERROR(start_trip(link, m, deadline, counts));
  return finish_trip(link, m.request_id, deadline, out, counts);
}

Status SpanClient::start_trip(WorkerLink& link, const wire::SpanStepMsg& m, net::Deadline deadline, SpanStats* counts) {
  auto frame = wire::encode_span_step(m);
  if (!frame) return frame.status();
  if (frame->size() - wire::kHeaderBytes > link.session.max_send_bytes) {
    return make_error(StatusCode::kOutOfRange, "{}: a SPAN_STEP of {} bytes exceeds its frame limit", link.label,
                      frame->size());
  }
  counts->bytes_sent += frame->size();
  return link.mux->start(m.request_id, *frame, deadline).with_context(link.label);
}

Status SpanClient::finish_trip(WorkerLink& link, uint64_t id, net::Deadline deadline, wire::SpanResultMsg* out,
                               SpanStats* counts) {
  auto reply = link.mux->wait(id, deadline);
  if (!reply) return reply.status().with_context(link.label);
  counts->bytes_received += wire::kHeaderBytes + reply->payload.size();
  wire::DecodeLimits lim = link.limits;
  auto res = wire::decode_span_result(*reply, lim);
  if (!res) return res.status().with_context(link.label);
  *out = std::move(*res);
  return Status::ok();
}

Result<wire::SpanStepMsg> SpanClient::replay_message(int k, const RowLog& rows_in, const std::vector<int64_t>& pos,
                                                     int32_t seq, uint64_t request_id) const {
  const size_t ks = static_cast<size_t>(k);
  const int64_t D = width_in(k);
  const int64_t n = static_cast<int64_t>(pos.size());
  wire::SpanStepMsg m;
  m.request_id = request_id;
  m.first = static_cast<uint32_t>(spans_[ks].first);
  m.last = static_cast<uint32_t>(spans_[ks].last);
  m.return_dtype = opts_.return_wire;
  wire::SpanSeq q;
  q.seq = seq;
  q.n_replay = static_cast<uint32_t>(n - 1);
  q.n_new = 1;
  m.seqs.push_back(q);
  std::vector<float> rows(static_cast<size_t>(n * D));
  MOESH_RETURN_IF_ERROR(rows_in.read(0, n, rows.data()));
  m.pos = pos;
  m.cut.assign(static_cast<size_t>(n), 0);
  // The logged rows are the bits sent before (rounded to the wire then), so they re-encode exactly.
  MOESH_ASSIGN_OR_RETURN(
      m.hidden, wire::encode_rows(opts_.hidden_wire, rows.data(), static_cast<uint32_t>(n), static_cast<uint32_t>(D)));
  return m;
}

Status SpanClient::move(const LayerSpan& sp, const std::string& to) {
  // Held throughout: a resplit changes spans_ (and the runners) only under it.
  std::lock_guard<std::mutex> one_move(move_mu_);
  int k = -1;
  for (size_t i = 0; i < spans_.size(); ++i)
    if (spans_[i].first == sp.first && spans_[i].last == sp.last) k = static_cast<int>(i);
  if (k < 0) {
    std::string have;
    for (const LayerSpan& x : spans_) have += fmt::format("{}{}-{}", have.empty() ? "" : ", ", x.first, x.last);
    return make_error(StatusCode::kNotFound, "no span {}-{} (the spans are {})", sp.first, sp.last, have);
  }
  const bool here = to == "here";
  if (!here) {
    // A lane of this span already runs these blocks for its own sequences: let it go first.
    auto addr = parse_worker_address(to);
    std::lock_guard<std::mutex> vl(view_mu_);
    for (const auto& l : runners_[static_cast<size_t>(k)]->lanes) {
      if (addr && l->view.address == addr->to_string()) {
        return make_error(StatusCode::kInvalidArgument,
                          "{} is a lane of span {}-{}: let the lane go first (drop_lane, swarm move --drop-lane)", to,
                          sp.first, sp.last);
      }
    }
  }
  // The new runner, made before the step lock: dialling may take a round trip or a timeout.
  MOESH_ASSIGN_OR_RETURN(NewRunner nr, dial(sp, to));
  std::unique_ptr<WorkerLink> link = std::move(nr.link);
  const WorkerAddress addr = nr.addr;
  const std::string label = nr.label;
  // Phase 1: a snapshot of every sequence's inputs (prefix() shares the logged rows), replayed to
  // the new runner while the span's steps go on on the old one.
  struct Snapshot {
    int32_t seq;
    RowLog rows;
    std::vector<int64_t> pos;
  };
  std::vector<Snapshot> snaps;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [seq, log] : logs_) {
      if (log.chain.size() <= static_cast<size_t>(k) || log.pos[static_cast<size_t>(k)].empty()) continue;
      const std::vector<int64_t>& pos = log.pos[static_cast<size_t>(k)];
      snaps.push_back({seq, log.rows[static_cast<size_t>(k)].prefix(static_cast<int64_t>(pos.size())), pos});
    }
  }
  std::map<int32_t, int64_t> has;
  SpanStats counts;
  for (const Snapshot& sn : snaps) {
    const uint64_t id = link ? link->mux->next_request_id() : uint64_t{1};
    auto m = replay_message(k, sn.rows, sn.pos, sn.seq, id);
    Status st = m.status();
    wire::SpanResultMsg res;
    if (st.is_ok()) {
      if (nr.local) {
        auto got = step_here(nr, *m);
        st = got.status();
        if (got) res = std::move(*got);
      } else {
        st = link_trip(*link, *m, &res, &counts);
      }
    }
    if (st.is_ok() && (!res.need.empty() || res.rows.n_rows != 1)) {
      st = make_error(StatusCode::kCorrupt, "{} answered a replay of sequence {} with {} rows and {} lacks", label,
                      sn.seq, res.rows.n_rows, res.need.size());
    }
    if (!st.is_ok()) {
      if (link) link->shut_down();
      return st.with_context(
          fmt::format("moving span {}-{} to {}: replaying sequence {}", sp.first, sp.last, label, sn.seq));
    }
    has[sn.seq] = static_cast<int64_t>(m->n_rows());
    counts.move_rows += m->n_rows();
  }
  // Phase 2, between two steps: the switch. What was logged meanwhile reaches the new runner at
  // its first step through the usual replay from `has`; a sequence cut and grown again since the
  // snapshot differs in its hash chain, so the runner asks for it (span_host.cpp), and one that
  // went away is forgotten.
  std::unique_lock<std::mutex> lk(mu_);
  Runner& r = *runners_[static_cast<size_t>(k)];
  for (auto it = has.begin(); it != has.end();) {
    it = logs_.count(it->first) != 0 ? std::next(it) : has.erase(it);
  }
  const uint64_t rows_sent = counts.move_rows;
  stats_.bytes_sent += counts.bytes_sent;
  stats_.bytes_received += counts.bytes_received;
  // Switch: the new runner takes the span's next step; the old one is let go (below, without the
  // lock; the peer keeps the blocks when the span stays on it).
  std::unique_ptr<WorkerLink> old = std::move(r.link);
  const bool same_peer = old && !here && old->address.to_string() == addr.to_string();
  if (nr.loaded) ++stats_.loads;
  r.pending.reset();  // a replacement still loading after a failure is not wanted any more
  r.link = std::move(link);
  r.local = std::move(nr.local);
  if (r.local) r.local->borrow_pool(pool_.load());  // the pool as of now (set_pool holds mu_ too)
  r.has = std::move(has);
  r.label = label;
  if (here) {
    r.current = r.target.peers.size();
    r.next_peer = r.target.peers.size();
  } else {
    auto& peers = r.target.peers;
    peers.erase(std::remove_if(peers.begin(), peers.end(),
                               [&](const WorkerAddress& a) { return a.to_string() == addr.to_string(); }),
                peers.end());
    peers.insert(peers.begin(), addr);
    r.current = 0;
    r.next_peer = 1;
  }
  r.moved_here = here;
  r.last_retry = std::chrono::steady_clock::now();
  r.star_seconds = r.compute_seconds = 0;
  r.star_samples = r.compute_samples = 0;
  ++stats_.moves;
  stats_.move_rows += rows_sent;
  {
    std::lock_guard<std::mutex> vl(view_mu_);
    r.view = view_of(sp, r.label, here ? nullptr : r.link.get());
    r.view.chosen_here = here;
  }
  spdlog::info("span {}-{}: moved to {} ({} logged inputs replayed first)", sp.first, sp.last, r.label, rows_sent);
  lk.unlock();
  if (same_peer) {
    old->shut_down();
  } else if (let_go(sp, std::move(old))) {
    std::lock_guard<std::mutex> again(mu_);
    ++stats_.drops;
  }
  forget_running_idle();
  return Status::ok();
}

Result<std::vector<SpanClient::Part>> SpanClient::begin_step(int k_first, int k_last, const SpanBatch& b) {
  std::vector<Part> parts;
  for (int64_t i = 0; i < b.n; ++i) {
    auto it = std::find_if(parts.begin(), parts.end(), [&](const Part& p) { return p.seq == b.seq[i]; });
    if (it == parts.end()) {
      parts.push_back({b.seq[i], b.cell[i], {}});
      it = parts.end() - 1;
    }
    it->rows.push_back(i);
  }
  // The log follows the backbone's state: a shorter sequence was rolled back (a failed step).
  const size_t n_spans = runners_.size();
  for (const Part& p : parts) {
    SeqLog& log = logs_[p.seq];
    while (log.rows.size() < n_spans) log.rows.emplace_back(log_stores_[log.rows.size()]);
    log.chain.resize(n_spans);
    log.pos.resize(n_spans);
    for (int k = k_first; k <= k_last; ++k) {
      const size_t ks = static_cast<size_t>(k);
      const int64_t held = static_cast<int64_t>(log.chain[ks].size());
      if (held < p.n_before) {
        return make_error(StatusCode::kInternal,
                          "span {}-{}: the input log of sequence {} holds {} cells, the step continues from {}",
                          spans_[ks].first, spans_[ks].last, p.seq, held, p.n_before);
      }
      log.chain[ks].resize(static_cast<size_t>(p.n_before));
      log.pos[ks].resize(static_cast<size_t>(p.n_before));
      log.rows[ks].truncate(p.n_before);
    }
  }
  return parts;
}

std::vector<float> SpanClient::gather(const std::vector<Part>& parts, const float* h, int64_t W) const {
  std::vector<float> rows;
  for (const Part& p : parts) {
    for (int64_t i : p.rows) rows.insert(rows.end(), h + i * W, h + (i + 1) * W);
  }
  return rows;
}

void SpanClient::scatter(const std::vector<Part>& parts, const std::vector<float>& rows, float* h, int64_t W) const {
  size_t o = 0;
  for (const Part& p : parts) {
    for (int64_t i : p.rows) {
      std::copy(rows.data() + o * W, rows.data() + (o + 1) * W, h + i * W);
      ++o;
    }
  }
}

Status SpanClient::round_to_wire(std::vector<float>* rows, int64_t W) const {
  if (opts_.hidden_wire == wire::WireDType::kF32) return Status::ok();
  const uint32_t D = static_cast<uint32_t>(W);
  const uint32_t n = static_cast<uint32_t>(rows->size() / D);
  MOESH_ASSIGN_OR_RETURN(wire::WireRows enc, wire::encode_rows(opts_.hidden_wire, rows->data(), n, D));
  wire::decode_rows(enc, rows->data());
  return Status::ok();
}

Result<wire::SpanStepMsg> SpanClient::step_message(int k, const std::vector<Part>& parts, const SpanBatch& b,
                                                   const std::vector<float>& grouped, uint64_t* replayed,
                                                   const std::map<int32_t, int64_t>& has, uint64_t request_id) {
  const int64_t D = width_in(k);
  const size_t ks = static_cast<size_t>(k);
  // Each sequence starts where the runner is known to hold matching cells.
  wire::SpanStepMsg m;
  m.request_id = request_id;
  m.first = static_cast<uint32_t>(spans_[ks].first);
  m.last = static_cast<uint32_t>(spans_[ks].last);
  m.return_dtype = opts_.return_wire;
  std::vector<float> rows;
  size_t o = 0;
  *replayed = 0;
  for (const Part& p : parts) {
    const SeqLog& log = logs_.at(p.seq);
    auto it = has.find(p.seq);
    const int64_t start = std::min<int64_t>(it == has.end() ? 0 : it->second, p.n_before);
    wire::SpanSeq q;
    q.seq = p.seq;
    q.start = static_cast<uint64_t>(start);
    q.n_replay = static_cast<uint32_t>(p.n_before - start);
    q.n_new = static_cast<uint32_t>(p.rows.size());
    if (start > 0) q.chain = log.chain[ks][static_cast<size_t>(start - 1)];
    m.seqs.push_back(q);
    const size_t at = rows.size();
    rows.resize(at + static_cast<size_t>((p.n_before - start) * D));
    MOESH_RETURN_IF_ERROR(log.rows[ks].read(start, p.n_before - start, rows.data() + at));
    for (int64_t c = start; c < p.n_before; ++c) {
      m.pos.push_back(log.pos[ks][static_cast<size_t>(c)]);
      m.cut.push_back(0);
    }
    *replayed += static_cast<uint64_t>(p.n_before - start);
    for (int64_t i : p.rows) {
      m.pos.push_back(b.pos[i]);
      m.cut.push_back(b.logits != nullptr && b.logits[i] ? 1 : 0);
    }
    rows.insert(rows.end(), grouped.begin() + static_cast<ptrdiff_t>(o * D),
                grouped.begin() + static_cast<ptrdiff_t>((o + p.rows.size()) * D));
    o += p.rows.size();
  }
  auto enc =
      wire::encode_rows(opts_.hidden_wire, rows.data(), static_cast<uint32_t>(m.pos.size()), static_cast<uint32_t>(D));
  if (!enc) return enc.status();
  m.hidden = std::move(*enc);
  return m;
}

// How long a span whose hop failed (while it still answered star-style) is not chained to.
constexpr std::chrono::seconds kNoChainAfterBrokenHop{60};

// Small steps (single streams decoding) are what kAuto times: their trips are mostly the network.
constexpr int64_t kTimedStepRows = 8;
constexpr double kTimeAverage = 0.2;  // weight of a new sample in the moving averages
constexpr int kMinSamples = 3;
constexpr uint64_t kProbeEvery = 50;  // kAuto tries the losing layout once every this many steps

namespace {
void add_sample(double* avg, int* n, double seconds) {
  *avg = *n == 0 ? seconds : (1 - kTimeAverage) * *avg + kTimeAverage * seconds;
  ++*n;
}
}  // namespace

Status SpanClient::accept(int k, const std::vector<Part>& parts, const SpanBatch& b, const wire::SpanResultMsg& res,
                          std::vector<float>* rows, std::map<int32_t, int64_t>* lane_has) {
  const int64_t D = width_in(k);
  const size_t ks = static_cast<size_t>(k);
  Runner& r = *runners_[ks];
  std::map<int32_t, int64_t>& has = lane_has != nullptr ? *lane_has : r.has;
  std::vector<float> out(static_cast<size_t>(rows_of(parts) * width_out(k)));
  wire::decode_rows(res.rows, out.data());
  size_t o = 0;
  for (const Part& p : parts) {
    SeqLog& log = logs_[p.seq];
    // The rows first: the one part that can fail (reading back a cut chunk of the log's file),
    // which leaves the log as it was, and the step failed.
    MOESH_RETURN_IF_ERROR(log.rows[ks].append(rows->data() + o * D, static_cast<int64_t>(p.rows.size())));
    std::array<uint8_t, 16> c = p.n_before > 0 ? log.chain[ks].back() : std::array<uint8_t, 16>{};
    for (int64_t i : p.rows) {
      const float* in = rows->data() + (o++) * D;
      c = swarm::span_chain_next(c, b.pos[i], in, D);
      log.chain[ks].push_back(c);
      log.pos[ks].push_back(b.pos[i]);
    }
    has[p.seq] = p.n_before + static_cast<int64_t>(p.rows.size());
  }
  *rows = std::move(out);
  ++stats_.steps;
  if (lane_has != nullptr) return Status::ok();
  if (r.local) ++stats_.local_steps;
  if (r.link && b.n <= kTimedStepRows) add_sample(&r.compute_seconds, &r.compute_samples, res.compute_us * 1e-6);
  return Status::ok();
}

Status SpanClient::star(int k, const std::vector<Part>& parts, const SpanBatch& b, std::vector<float>* rows) {
  if (!runners_[static_cast<size_t>(k)]->lanes.empty()) return star_lanes(k, parts, b, rows);
  return star_one(k, parts, b, rows);
}

Status SpanClient::star_one(int k, const std::vector<Part>& parts, const SpanBatch& b, std::vector<float>* rows) {
  const size_t ks = static_cast<size_t>(k);
  const int64_t n_rows = rows_of(parts);
  const int64_t D = width_out(k);                           // of the result
  MOESH_RETURN_IF_ERROR(round_to_wire(rows, width_in(k)));  // idempotent: rows from a chain are already rounded
  retry_preferred(k);
  Runner* r = runners_[ks].get();
  int resends = 0;
  bool clean = true;  // one trip, no resend or failover: a fair sample of the span's trip time
  for (;;) {
    uint64_t replayed = 0;
    MOESH_ASSIGN_OR_RETURN(wire::SpanStepMsg m,
                           step_message(k, parts, b, *rows, &replayed, r->has,
                                        r->link ? r->link->mux->next_request_id() : stats_.trips + 1));
    wire::SpanResultMsg res;
    const auto t0 = std::chrono::steady_clock::now();
    Status st = trip(k, m, &res);
    if (st.is_ok() && !res.need.empty()) {
      // The runner lacks inputs: resend with them replayed.
      if (++resends > kSpanMaxResends) {
        return make_error(StatusCode::kInternal, "span {}-{}: {} still lacks inputs after {} resends", spans_[ks].first,
                          spans_[ks].last, r->label, kSpanMaxResends);
      }
      ++stats_.resends;
      clean = false;
      for (const wire::SpanHave& hv : res.need) r->has[hv.seq] = static_cast<int64_t>(hv.have);
      continue;
    }
    if (st.is_ok() &&
        (res.rows.n_rows != static_cast<uint32_t>(n_rows) || res.rows.n_cols != static_cast<uint32_t>(D))) {
      st = make_error(StatusCode::kCorrupt, "{}: SPAN_RESULT has {}x{} rows, the step sent {}x{}", r->label,
                      res.rows.n_rows, res.rows.n_cols, n_rows, D);
    }
    if (!st.is_ok()) {
      if (r->local) return st.with_context(fmt::format("span {}-{} here", spans_[ks].first, spans_[ks].last));
      Status moved = fail_over(k, st);
      if (!moved.is_ok()) return moved.with_context(st.message());
      r = runners_[ks].get();
      clean = false;
      continue;
    }
    if (clean && r->link && b.n <= kTimedStepRows) {
      add_sample(&r->star_seconds, &r->star_samples,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    MOESH_RETURN_IF_ERROR(accept(k, parts, b, res, rows));
    stats_.replayed_rows += replayed;
    return Status::ok();
  }
}

int SpanClient::chain_end(int k, const std::vector<Part>& parts, int64_t n_rows) {
  if (opts_.chain == SpanChainMode::kOff || opts_.link.tls_pins) return k;
  auto chainable = [&](int j) {
    const Runner& r = *runners_[static_cast<size_t>(j)];
    if (!r.link || (r.link->session.features & wire::kFeatureSpanChain) == 0) return false;
    if (!r.lanes.empty()) return false;  // a span with lanes splits its steps: star trips
    if (j > k && std::chrono::steady_clock::now() < r.no_chain_until) return false;
    if (r.link->address.path != WorkerPath::kDirect || r.link->address.websocket) return false;
    // A hop never replays: its runner must hold every sequence's cells already (more after a
    // rollback: it cuts back to where the step starts, as star-style).
    for (const Part& p : parts) {
      auto it = r.has.find(p.seq);
      if ((it == r.has.end() ? 0 : it->second) < p.n_before) return false;
    }
    return true;
  };
  if (!chainable(k)) return k;
  int e = k;
  while (static_cast<size_t>(e + 1) < runners_.size() &&
         spans_[static_cast<size_t>(e + 1)].first == spans_[static_cast<size_t>(e)].last + 1 && chainable(e + 1) &&
         e + 1 - k < static_cast<int>(wire::kMaxSpanHops)) {
    ++e;
  }
  if (e == k || opts_.chain == SpanChainMode::kOn) return e;
  // kAuto: chain where it measured faster than the star trips it replaces. Until star trips of
  // a span are timed, one is taken as its link's warm-up round trip plus the peer's compute (an
  // upper bound: the warm-up carries padding), so a chain that clearly wins is not interrupted
  // to time star trips first; the loser is still tried once every kProbeEvery steps.
  ChainTimes& ct = chain_times_[{k, e}];
  double star_sum = 0;
  for (int j = k; j <= e; ++j) {
    const Runner& r = *runners_[static_cast<size_t>(j)];
    star_sum += r.star_samples >= kMinSamples
                    ? r.star_seconds
                    : std::chrono::duration<double>(r.link->warmup_rtt).count() + r.compute_seconds;
  }
  if (n_rows > kTimedStepRows) {
    // Not timed: follow what the small steps measured (chain until they say otherwise).
    return ct.samples < kMinSamples || ct.seconds <= star_sum ? e : k;
  }
  const uint64_t d = ++ct.decisions;
  if (ct.samples < kMinSamples) return e;
  const bool chain_wins = ct.seconds <= star_sum;
  const bool probe = d % kProbeEvery == 0;
  return chain_wins != probe ? e : k;
}

Status SpanClient::chain(int k, int e, const std::vector<Part>& parts, const SpanBatch& b, std::vector<float>* rows) {
  const auto t0 = std::chrono::steady_clock::now();
  if (next_chain_id_ == 0) {
    std::random_device rd;
    next_chain_id_ = (uint64_t{rd()} << 32 | rd()) | 1;
  }
  const uint64_t chain_id = next_chain_id_++;
  if (next_chain_id_ == 0) next_chain_id_ = 1;
  MOESH_RETURN_IF_ERROR(round_to_wire(rows, width_in(k)));

  // 1. The awaits, so that each peer after the head answers as soon as its forwarded step is done.
  //    Span j may compute only after spans k..j-1: its deadline grows with its place in the chain.
  std::vector<uint64_t> await_id(static_cast<size_t>(e - k + 1), 0);
  std::vector<net::Deadline> deadline(static_cast<size_t>(e - k + 1));
  int last = e;  // the chain's last span: awaits could be started up to it
  for (int j = k; j <= e; ++j) {
    const auto budget = opts_.timeout * (j - k + 1);
    deadline[static_cast<size_t>(j - k)] = net::deadline_in(budget);
    if (j == k) continue;
    WorkerLink& link = *runners_[static_cast<size_t>(j)]->link;
    wire::SpanAwaitMsg aw;
    aw.request_id = link.mux->next_request_id();
    aw.chain_id = chain_id;
    aw.first = static_cast<uint32_t>(spans_[static_cast<size_t>(j)].first);
    aw.last = static_cast<uint32_t>(spans_[static_cast<size_t>(j)].last);
    aw.timeout_ms = static_cast<uint32_t>(std::clamp<int64_t>(budget.count(), 1, wire::kMaxSpanAwaitMs));
    auto frame = wire::encode_span_await(aw);
    Status st = frame ? link.mux->start(aw.request_id, *frame, deadline[static_cast<size_t>(j - k)]) : frame.status();
    if (!st.is_ok()) {
      last = j - 1;
      break;
    }
    await_id[static_cast<size_t>(j - k)] = aw.request_id;
    ++stats_.trips;
    ++stats_.awaits;
    stats_.bytes_sent += frame->size();
  }
  auto cancel_awaits = [&](int from) {
    for (int j = std::max(from, k + 1); j <= last; ++j) {
      uint64_t& id = await_id[static_cast<size_t>(j - k)];
      if (id != 0) runners_[static_cast<size_t>(j)]->link->mux->cancel(id);
      id = 0;
    }
  };

  // 2. The head step, naming the hops after it with what the backbone's log says each holds.
  int j = k;
  Status why = Status::ok();
  bool failed_peer = false;  // the break is the peer's own failure (not a lack or a lost hop)
  if (last > k) {
    uint64_t replayed = 0;
    Runner& head = *runners_[static_cast<size_t>(k)];
    MOESH_ASSIGN_OR_RETURN(wire::SpanStepMsg m,
                           step_message(k, parts, b, *rows, &replayed, head.has, head.link->mux->next_request_id()));
    m.chain_id = chain_id;
    m.hop_dtype = opts_.hidden_wire;
    for (int h = k + 1; h <= last; ++h) {
      const size_t hs = static_cast<size_t>(h);
      wire::SpanHop hop;
      hop.address = runners_[hs]->link->address.to_string();
      hop.first = static_cast<uint32_t>(spans_[hs].first);
      hop.last = static_cast<uint32_t>(spans_[hs].last);
      for (const Part& p : parts) {
        hop.start.push_back(static_cast<uint64_t>(p.n_before));
        hop.chain.push_back(p.n_before > 0 ? logs_.at(p.seq).chain[hs][static_cast<size_t>(p.n_before - 1)]
                                           : std::array<uint8_t, 16>{});
      }
      m.next.push_back(std::move(hop));
    }
    ++stats_.chains;
    // 3. The results in span order: the head's reply, then each await's.
    for (; j <= last; ++j) {
      Runner& r = *runners_[static_cast<size_t>(j)];
      wire::SpanResultMsg res;
      Status st = Status::ok();
      if (j == k) {
        st = trip(k, m, &res);
        failed_peer = !st.is_ok();
      } else {
        const size_t js = static_cast<size_t>(j - k);
        auto reply = r.link->mux->wait(await_id[js], deadline[js]);
        await_id[js] = 0;
        if (!reply) {
          st = reply.status().with_context(r.label);
          // Nothing at all by the deadline (not even the peer's own timeout answer): it stalled.
          failed_peer = net::Clock::now() >= deadline[js];
        } else {
          stats_.bytes_received += wire::kHeaderBytes + reply->payload.size();
          auto dec = wire::decode_span_result(*reply, r.link->limits);
          if (dec) {
            res = std::move(*dec);
          } else {
            st = dec.status().with_context(r.label);
          }
        }
      }
      if (st.is_ok() && !res.need.empty())
        st = make_error(StatusCode::kUnavailable, "{} lacks inputs of a chained step", r.label);
      const int64_t D = width_out(j);
      if (st.is_ok() && (res.rows.n_rows != static_cast<uint32_t>(b.n) || res.rows.n_cols != static_cast<uint32_t>(D)))
        st = make_error(StatusCode::kCorrupt, "{}: SPAN_RESULT has {}x{} rows, the step sent {}x{}", r.label,
                        res.rows.n_rows, res.rows.n_cols, b.n, D);
      if (!st.is_ok()) {
        why = st;
        break;
      }
      MOESH_RETURN_IF_ERROR(accept(j, parts, b, res, rows));
      ++stats_.chained_steps;
      if (j == k) stats_.replayed_rows += replayed;
      if (j < last) MOESH_RETURN_IF_ERROR(round_to_wire(rows, width_out(j)));
      if (!res.forward_error.empty() && j < last) {
        why = make_error(StatusCode::kUnavailable, "{} could not pass its rows on: {}", r.label, res.forward_error);
        ++j;
        break;
      }
    }
  }
  cancel_awaits(j);
  if (j > e) {
    if (b.n <= kTimedStepRows) {
      ChainTimes& ct = chain_times_[{k, e}];
      int n = ct.samples;
      add_sample(&ct.seconds, &n, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      ct.samples = n;
    }
    return Status::ok();
  }
  // 4. From the span where it broke, star-style: resends with replay, failover.
  if (!why.is_ok()) {
    ++stats_.chain_breaks;
    spdlog::info("span chain {}-{}: finished star-style from span {}-{}: {}", spans_[static_cast<size_t>(k)].first,
                 spans_[static_cast<size_t>(e)].last, spans_[static_cast<size_t>(j)].first,
                 spans_[static_cast<size_t>(j)].last, why.to_string());
    if (failed_peer) {
      Status moved = fail_over(j, why);
      if (!moved.is_ok()) return moved.with_context(why.message());
    }
  }
  const int broke_at = j;
  const std::string broken_label = runners_[static_cast<size_t>(j)]->label;
  for (; j <= e; ++j) MOESH_RETURN_IF_ERROR(star(j, parts, b, rows));
  // The span where the chain broke answered star-style, from the same peer: the hop to it is what
  // failed (a forward error, a lost forwarded step), so do not chain to it for a while.
  Runner& rb = *runners_[static_cast<size_t>(broke_at)];
  if (!why.is_ok() && broke_at > k && rb.label == broken_label && !rb.local) {
    rb.no_chain_until = std::chrono::steady_clock::now() + kNoChainAfterBrokenHop;
    spdlog::warn("span {}-{}: not chained to for {} s (the hop to {} failed: {})",
                 spans_[static_cast<size_t>(broke_at)].first, spans_[static_cast<size_t>(broke_at)].last,
                 kNoChainAfterBrokenHop.count(), rb.label, why.message());
  }
  return Status::ok();
}

Status SpanClient::run(int k, const SpanBatch& b, float* h) {
  std::lock_guard<std::mutex> lk(mu_);
  if (k < 0 || static_cast<size_t>(k) >= runners_.size())
    return make_error(StatusCode::kInvalidArgument, "no span {}", k);
  MOESH_ASSIGN_OR_RETURN(std::vector<Part> parts, begin_step(k, k, b));
  std::vector<float> rows = gather(parts, h, width_in(k));
  MOESH_RETURN_IF_ERROR(star(k, parts, b, &rows));
  scatter(parts, rows, h, width_out(k));
  return Status::ok();
}

Status SpanClient::run_from(int k, const SpanBatch& b, float* h, int* k_last) {
  std::lock_guard<std::mutex> lk(mu_);
  *k_last = k;
  if (k < 0 || static_cast<size_t>(k) >= runners_.size())
    return make_error(StatusCode::kInvalidArgument, "no span {}", k);
  for (size_t j = static_cast<size_t>(k); j < runners_.size(); ++j) retry_preferred(static_cast<int>(j));
  MOESH_ASSIGN_OR_RETURN(std::vector<Part> parts, begin_step(k, k, b));
  const int e = chain_end(k, parts, b.n);
  if (e > k) {
    MOESH_ASSIGN_OR_RETURN(parts, begin_step(k, e, b));
  }
  std::vector<float> rows = gather(parts, h, width_in(k));
  MOESH_RETURN_IF_ERROR(e > k ? chain(k, e, parts, b, &rows) : star(k, parts, b, &rows));
  scatter(parts, rows, h, width_out(e));
  *k_last = e;
  return Status::ok();
}

void SpanClient::on_truncate(int32_t seq, int64_t n_keep) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = logs_.find(seq);
  if (it == logs_.end()) return;
  const size_t n = static_cast<size_t>(std::max<int64_t>(n_keep, 0));
  for (auto& r : runners_) r->placed.erase(seq);  // a new request or a rollback: placed again
  for (size_t k = 0; k < it->second.chain.size(); ++k) {
    if (it->second.chain[k].size() <= n) continue;
    it->second.chain[k].resize(n);
    it->second.pos[k].resize(n);
    it->second.rows[k].truncate(static_cast<int64_t>(n));
  }
}

void SpanClient::on_copy(int32_t src, int32_t dst, int64_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = logs_.find(src);
  if (it == logs_.end()) {
    logs_.erase(dst);
  } else {
    SeqLog copy;
    const SeqLog& from = it->second;
    const size_t m = static_cast<size_t>(std::max<int64_t>(n, 0));
    copy.chain.resize(from.chain.size());
    copy.pos.resize(from.pos.size());
    for (size_t k = 0; k < from.chain.size(); ++k) {
      const size_t c = std::min(m, from.chain[k].size());
      copy.chain[k].assign(from.chain[k].begin(), from.chain[k].begin() + static_cast<ptrdiff_t>(c));
      copy.pos[k].assign(from.pos[k].begin(), from.pos[k].begin() + static_cast<ptrdiff_t>(c));
      copy.rows.push_back(from.rows[k].prefix(static_cast<int64_t>(c)));  // shares the rows
    }
    logs_[dst] = std::move(copy);
  }
  // The runner holds src's prefix; it finds it by its chain and copies it to dst itself.
  auto copy_has = [&](std::map<int32_t, int64_t>& has) {
    auto h = has.find(src);
    if (h == has.end()) {
      has.erase(dst);
    } else {
      has[dst] = std::min(h->second, n);
    }
  };
  for (auto& r : runners_) {
    copy_has(r->has);
    // dst runs where src's prefix is (that runner copies it itself), unless its next step finds
    // fewer sequences elsewhere (placed again).
    r->placed.erase(dst);
    auto l = r->lane_of.find(src);
    if (l == r->lane_of.end()) {
      r->lane_of.erase(dst);
    } else {
      r->lane_of[dst] = l->second;
    }
    for (auto& lane : r->lanes) copy_has(lane->has);
  }
}

void SpanClient::on_remove(int32_t seq) {
  std::lock_guard<std::mutex> lk(mu_);
  logs_.erase(seq);
  for (auto& r : runners_) {
    r->has.erase(seq);
    r->lane_of.erase(seq);
    r->placed.erase(seq);
    for (auto& lane : r->lanes) lane->has.erase(seq);
  }
}

void SpanClient::on_clear() {
  std::lock_guard<std::mutex> lk(mu_);
  logs_.clear();
  for (auto& r : runners_) {
    r->has.clear();
    r->lane_of.clear();
    r->placed.clear();
    for (auto& lane : r->lanes) lane->has.clear();
  }
}

SpanStats SpanClient::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

std::string SpanClient::where(int k) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (k < 0 || static_cast<size_t>(k) >= runners_.size()) return fmt::format("span {} (no such span now)", k);
  return where_text(*runners_[static_cast<size_t>(k)]);
}

std::string SpanClient::where_text(const Runner& r) {
  std::string out =
      fmt::format("{}-{} {}", r.target.span.first, r.target.span.last, r.local ? std::string("here") : "on " + r.label);
  for (const auto& l : r.lanes) out += " + lane " + l->label;
  return out;
}

std::vector<SpanPeerView> SpanClient::peers_view() const {
  // Not mu_: a step in flight holds it for a whole trip; the views have their own lock.
  std::lock_guard<std::mutex> lk(view_mu_);
  std::vector<SpanPeerView> out;
  for (const auto& r : runners_) out.push_back(r->view);
  return out;
}

std::string SpanClient::describe() const {
  std::string out;
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& r : runners_) {
    out += fmt::format("span {}-{} {}", r->target.span.first, r->target.span.last,
                       r->local ? std::string("here") : "on " + r->label);
    if (r->target.peers.size() > 1) out += fmt::format(" ({} peers named)", r->target.peers.size());
    for (const auto& l : r->lanes) out += " + lane " + l->label;
    out += "\n";
  }
  return out;
}

size_t SpanClient::log_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  const RowStoreStats rs = log_stats_locked();
  size_t n = rs.memory_bytes + rs.file_bytes;
  for (const auto& [seq, log] : logs_) {
    for (size_t k = 0; k < log.chain.size(); ++k) n += log.chain[k].size() * 16 + log.pos[k].size() * sizeof(int64_t);
  }
  return n;
}

RowStoreStats SpanClient::log_stats() const {
  std::lock_guard<std::mutex> lk(mu_);  // a resplit replaces the stores
  return log_stats_locked();
}

RowStoreStats SpanClient::log_stats_locked() const {
  RowStoreStats all;
  for (const auto& st : log_stores_) {
    const RowStoreStats s = st->stats();
    all.memory_bytes += s.memory_bytes;
    all.file_bytes += s.file_bytes;
    all.file_size += s.file_size;
    all.spilled_chunks += s.spilled_chunks;
    all.read_back_chunks += s.read_back_chunks;
    if (all.spill_error.empty()) all.spill_error = s.spill_error;
  }
  return all;
}

}  // namespace moesh
