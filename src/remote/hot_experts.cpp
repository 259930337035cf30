// The backbone's expert placement at run time (remote.h): worker costs and stragglers, FETCH and
// STORE of expert slabs, hot experts kept here (plan_hot), replicas (replicate_hot) and moves to
// nearer workers (rebalance).
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "remote/remote_executor_internal.h"

namespace moesh {

std::vector<double> RemoteExecutor::Impl::worker_costs() const {
  // A trip's cost per worker: given, or the fastest measured DISPATCH -> COMBINE latency (before
  // any, the warm-up RTT). The minimum, not the mean: on a loaded host the mean of a near
  // replica jumps with every stall, and near replicas would flip to "far" at random. But when
  // the median of its last 16 trips is higher, that is what it costs now (a straggler): one stall
  // does not move a median, a worker that stays slow does.
  if (opts.worker_costs.size() == fan->size()) return opts.worker_costs;
  std::lock_guard<std::mutex> lk(worker_mu);
  std::vector<double> c(fan->size());
  for (size_t w = 0; w < c.size(); ++w) {
    if (w < min_latency.size() && min_latency[w] > 0) {
      c[w] = min_latency[w];
    } else if (w < probe_rtt.size() && probe_rtt[w] > 0) {
      c[w] = probe_rtt[w];  // the latest probe is what its path costs now, not the warm-up
    } else {
      c[w] = std::chrono::duration<double>(fan->link(w).warmup_rtt).count();
    }
    if (w < recent.size() && recent[w].n >= RecentTrips::kN / 2) c[w] = std::max(c[w], recent[w].median());
  }
  return c;
}

void RemoteExecutor::Impl::check_stragglers() {
  // Every 16 steps (first MoE layer calls). A worker that got no trip since the last check for 8
  // checks in a row (demoted: its replicas take its pairs) has its recent trips forgotten, so it
  // is tried again at its best cost and demoted again only if it is still slow. A worker that
  // never got a trip (a replica judged far at connect) has nothing measured to forget: it gets a
  // small PING at its first idle check and every 8th after, and that RTT becomes its cost, so a
  // noisy warm-up does not keep a near replica idle for good, and a far one costs one trip.
  if (opts.worker_costs.size() == fan->size()) return;
  std::vector<size_t> to_probe;
  {
    std::lock_guard<std::mutex> lk(worker_mu);
    recent.resize(fan->size());
    recent_seen.resize(fan->size(), 0);
    idle_checks.resize(fan->size(), 0);
    probe_rtt.resize(fan->size(), 0.0);
    for (size_t w = 0; w < fan->size(); ++w) {
      if (recent[w].total == recent_seen[w]) {
        ++idle_checks[w];
        if (idle_checks[w] >= 8 && recent[w].n > 0) {
          recent[w] = RecentTrips{.total = recent[w].total};
          idle_checks[w] = 0;
        } else if (recent[w].total == 0 && idle_checks[w] % 8 == 1 && !(w < health.size() && health[w].down)) {
          to_probe.push_back(w);
        }
      } else {
        idle_checks[w] = 0;
      }
      recent_seen[w] = recent[w].total;
    }
  }
  for (const size_t w : to_probe) {
    auto rtt = probe(w);
    if (!rtt) {
      // Not a failover: the next DISPATCH it gets (if any) finds out and fails over as usual.
      spdlog::warn("remote executor: probe of idle worker {}: {}", fan->link(w).label, rtt.status().to_string());
      continue;
    }
    std::lock_guard<std::mutex> lk(worker_mu);
    probe_rtt[w] = *rtt;
    ++workers[w].probes;
  }
  planner.set_worker_costs(worker_costs());
}

Result<double> RemoteExecutor::Impl::probe(size_t w) {
  wire::PingMsg p;
  p.request_id = fan->link(w).mux->next_request_id();
  const auto t0 = net::Clock::now();
  p.send_time_ns = static_cast<uint64_t>(t0.time_since_epoch().count());
  MOESH_ASSIGN_OR_RETURN(auto frame, wire::encode_ping(p));
  const net::Deadline deadline = net::deadline_in(opts.timeout);
  MOESH_RETURN_IF_ERROR(fan->start(w, p.request_id, frame, deadline));
  const FanOut::Outstanding one{w, p.request_id};
  Result<wire::Frame> got = Status(StatusCode::kInternal, "no reply");
  net::Clock::time_point arrived = t0;
  fan->gather(std::span<const FanOut::Outstanding>(&one, 1), deadline, [&](FanOut::Reply&& rep) {
    got = std::move(rep.frame);
    arrived = rep.arrived;
  });
  if (!got) return got.status();
  MOESH_ASSIGN_OR_RETURN(wire::PongMsg pong, wire::decode_pong(*got));
  if (pong.ping_time_ns != p.send_time_ns) {
    return make_error(StatusCode::kCorrupt, "PONG echoed timestamp {} for PING {}", pong.ping_time_ns, p.send_time_ns);
  }
  return std::max(std::chrono::duration<double>(arrived - t0).count(), 1e-9);
}

Result<wire::Frame> RemoteExecutor::Impl::ask_one(size_t w, uint64_t id, const std::vector<uint8_t>& frame) {
  // A slab is megabytes: more time than a layer call, still a deadline.
  const net::Deadline deadline = net::deadline_in(std::max(opts.timeout, std::chrono::milliseconds(30000)));
  MOESH_RETURN_IF_ERROR(fan->start(w, id, frame, deadline));
  const FanOut::Outstanding one{w, id};
  Result<wire::Frame> out = Status(StatusCode::kInternal, "no reply");
  fan->gather(std::span<const FanOut::Outstanding>(&one, 1), deadline,
              [&](FanOut::Reply&& rep) { out = std::move(rep.frame); });
  return out;
}

Result<wire::SlabMsg> RemoteExecutor::Impl::fetch(size_t w, int layer, int expert) {
  const WorkerLink& link = fan->link(w);
  if ((link.session.features & wire::kFeatureFetch) == 0) {
    return make_error(StatusCode::kUnsupported, "worker {} does not serve FETCH", link.label);
  }
  wire::FetchMsg req;
  req.request_id = fan->next_request_id(w);
  req.layer = static_cast<uint32_t>(layer);
  req.expert = static_cast<uint32_t>(expert);
  auto got = [&]() -> Result<wire::SlabMsg> {
    MOESH_ASSIGN_OR_RETURN(std::vector<uint8_t> frame, wire::encode_fetch(req));
    MOESH_ASSIGN_OR_RETURN(wire::Frame reply, ask_one(w, req.request_id, frame));
    MOESH_ASSIGN_OR_RETURN(wire::SlabMsg slab, wire::decode_slab(reply, link.limits));
    MOESH_RETURN_IF_ERROR(wire::check_slab_matches(req, slab));
    std::lock_guard<std::mutex> lk(worker_mu);
    ++workers[w].fetches;
    workers[w].fetch_bytes += wire::kHeaderBytes + reply.payload.size();
    return slab;
  }();
  if (!got)
    return got.status().with_context(fmt::format("FETCH layer {} expert {} from {}", layer, expert, link.label));
  return got;
}

Result<wire::StoredMsg> RemoteExecutor::Impl::store_on(size_t w, wire::SlabMsg slab) {
  const WorkerLink& link = fan->link(w);
  if ((link.session.features & wire::kFeatureStore) == 0)
    return make_error(StatusCode::kUnsupported, "worker {} keeps no replicas", link.label);
  slab.request_id = fan->next_request_id(w);
  auto got = [&]() -> Result<wire::StoredMsg> {
    MOESH_ASSIGN_OR_RETURN(std::vector<uint8_t> frame, wire::encode_store(slab));
    if (frame.size() - wire::kHeaderBytes > link.session.max_send_bytes)
      return make_error(StatusCode::kOutOfRange, "{} bytes over the worker's frame limit", frame.size());
    // The worker checks, writes and maps the slabs before it answers.
    MOESH_ASSIGN_OR_RETURN(wire::Frame reply, ask_one(w, slab.request_id, frame));
    MOESH_ASSIGN_OR_RETURN(wire::StoredMsg stored, wire::decode_stored(reply, link.limits));
    MOESH_RETURN_IF_ERROR(wire::check_stored_matches(slab, stored));
    return stored;
  }();
  if (!got)
    return got.status().with_context(
        fmt::format("STORE layer {} expert {} on {}", slab.layer, slab.expert, link.label));
  return got;
}

Result<wire::StoredMsg> RemoteExecutor::Impl::unstore_on(size_t w, int l, int e) {
  const WorkerLink& link = fan->link(w);
  if ((link.session.features & wire::kFeatureUnstore) == 0)
    return make_error(StatusCode::kUnsupported, "worker {} does not let go of replicas (no UNSTORE)", link.label);
  const wire::UnstoreMsg req{
      .request_id = fan->next_request_id(w), .layer = static_cast<uint32_t>(l), .expert = static_cast<uint32_t>(e)};
  auto got = [&]() -> Result<wire::StoredMsg> {
    MOESH_ASSIGN_OR_RETURN(std::vector<uint8_t> frame, wire::encode_unstore(req));
    MOESH_ASSIGN_OR_RETURN(wire::Frame reply, ask_one(w, req.request_id, frame));
    MOESH_ASSIGN_OR_RETURN(wire::StoredMsg done, wire::decode_unstored(reply, link.limits));
    MOESH_RETURN_IF_ERROR(wire::check_unstored_matches(req, done));
    return done;
  }();
  if (!got) return got.status().with_context(fmt::format("UNSTORE layer {} expert {} on {}", l, e, link.label));
  return got;
}

Status RemoteExecutor::Impl::drop_replicas(int32_t w, const std::vector<wire::ExpertRange>& ranges, uint64_t* dropped,
                                           std::vector<wire::ExpertRange>* only_holder) {
  const size_t wi = static_cast<size_t>(w);
  Placement next = planner.placement();
  Status refused = Status::ok();
  for (const wire::ExpertRange& r : ranges) {
    const int l = static_cast<int>(r.layer);
    if (l >= next.n_layer() || static_cast<int64_t>(r.first) + r.count > next.n_expert())
      return make_error(StatusCode::kInvalidArgument, "layer {} experts {}-{} are beyond the model's", l, r.first,
                        r.first + r.count - 1);
    for (uint32_t k = 0; k < r.count; ++k) {
      const int e = static_cast<int>(r.first + k);
      const auto hs = next.holders(l, e);
      if (std::find(hs.begin(), hs.end(), w) == hs.end()) continue;  // not its: nothing to do
      if (own_experts.count({wi, l, e}) != 0) {
        std::lock_guard<std::mutex> lk(worker_mu);
        ++expert_report.kept;  // refused before: its own file's
        continue;
      }
      // Never the last: another live holder or the backbone's own copy must be able to compute it.
      const bool others = next.local_copy(l, e) ||
                          std::any_of(hs.begin(), hs.end(), [&](int32_t h) { return h != w && !planner.excluded(h); });
      if (!others) {
        only_holder->push_back({r.layer, static_cast<uint32_t>(e), 1});
        continue;
      }
      // Out of the placement before the worker is told: no pair is sent to it from now on (nothing
      // of this executor is in flight between calls).
      next.remove_holder(l, e, w);
      planner.set_placement(next);
      auto done = unstore_on(wi, l, e);
      if (!done && done.status().code() == StatusCode::kUnsupported) {
        // Its own file's (or it lets go of nothing): it still holds and serves it; not asked again.
        next.add_holder(l, e, w);
        planner.set_placement(next);
        own_experts.insert({wi, l, e});
        {
          std::lock_guard<std::mutex> lk(worker_mu);
          ++expert_report.kept;
        }
        refused = done.status();
        continue;
      }
      // NOT_HELD: gone already (another backbone had it let go of). A lost answer leaves it out of
      // the placement all the same: a copy it may still hold is only memory, never a wrong sum.
      if (!done && done.status().code() != StatusCode::kNotFound) return done.status();
      forget_held(wi, l, e);
      if (done) {
        std::lock_guard<std::mutex> lk(worker_mu);
        if (replica_use.size() <= wi) replica_use.resize(wi + 1);
        replica_use[wi] = {done->replica_bytes, done->budget_bytes};
        ++*dropped;
      }
    }
  }
  return refused;
}

int32_t RemoteExecutor::Impl::nearest_live_holder(const Placement& pl, int l, int e, const std::vector<double>& costs,
                                                  int32_t except) const {
  int32_t best = -1;
  for (const int32_t w : pl.holders(l, e)) {
    if (w == except || planner.excluded(w)) continue;
    if (best < 0 || costs[static_cast<size_t>(w)] < costs[static_cast<size_t>(best)]) best = w;
  }
  return best;
}

uint64_t RemoteExecutor::Impl::replica_room(size_t w) const {
  std::lock_guard<std::mutex> lk(worker_mu);
  if (w < replica_use.size() && replica_use[w].second > 0)
    return replica_use[w].second - std::min(replica_use[w].first, replica_use[w].second);
  const wire::InfoMsg& c = fan->link(w).capacity;
  return c.replica_budget_bytes - std::min(c.replica_bytes, c.replica_budget_bytes);
}

Result<uint64_t> RemoteExecutor::Impl::place_replica(int l, int e, int32_t target, const std::vector<double>& costs,
                                                     Placement* next) {
  Result<wire::SlabMsg> slab = Status(StatusCode::kUnavailable, "");
  const int32_t source = nearest_live_holder(*next, l, e, costs, target);
  if (mine->has(l, e)) {
    slab = swarm::slab_of(mine->weights()[static_cast<size_t>(l)], mine->slot(l, e), static_cast<uint32_t>(l),
                          static_cast<uint32_t>(e));
  } else if (source >= 0) {
    // Relayed through the backbone, and checked here first: a worker is never handed another
    // worker's bytes unchecked.
    slab = fetch(static_cast<size_t>(source), l, e);
    if (slab) {
      if (Status st = swarm::check_slab_for_model(model->file(), *slab); !st.is_ok()) slab = st;
    }
  } else {
    slab = make_error(StatusCode::kUnavailable, "layer {} expert {}: no copy to replicate", l, e);
  }
  if (!slab) return slab.status();
  uint64_t bytes = 0;
  for (const wire::SlabTensor& t : slab->tensors) bytes += t.bytes.size();
  MOESH_ASSIGN_OR_RETURN(wire::StoredMsg stored, store_on(static_cast<size_t>(target), std::move(*slab)));
  {
    std::lock_guard<std::mutex> lk(worker_mu);
    if (replica_use.size() <= static_cast<size_t>(target)) replica_use.resize(static_cast<size_t>(target) + 1);
    replica_use[static_cast<size_t>(target)] = {stored.replica_bytes, stored.budget_bytes};
  }
  next->add_holder(l, e, target);
  // It announces the replica from now on (after a restart too).
  std::vector<wire::ExpertRange> had = announced[static_cast<size_t>(target)];
  had.push_back({static_cast<uint32_t>(l), static_cast<uint32_t>(e), 1});
  announced[static_cast<size_t>(target)] = swarm::canonicalize(std::move(had)).ranges;
  return bytes;
}

void RemoteExecutor::request_experts(const std::string& worker, std::vector<wire::ExpertRange> ranges) {
  std::lock_guard<std::mutex> lk(impl_->worker_mu);
  impl_->expert_asks.push_back({worker, std::move(ranges), 0, false});
  ++impl_->expert_report.requests;
  ++impl_->expert_report.pending;
}

void RemoteExecutor::drop_experts(const std::string& worker, std::vector<wire::ExpertRange> ranges) {
  std::lock_guard<std::mutex> lk(impl_->worker_mu);
  impl_->expert_asks.push_back({worker, std::move(ranges), 0, true});
  ++impl_->expert_report.requests;
  ++impl_->expert_report.pending;
}

ExpertRequestReport RemoteExecutor::expert_requests() const {
  std::lock_guard<std::mutex> lk(impl_->worker_mu);
  return impl_->expert_report;
}

void RemoteExecutor::Impl::take_expert_requests() {
  std::vector<ExpertRequest> asks;
  {
    std::lock_guard<std::mutex> lk(worker_mu);
    if (expert_asks.empty()) return;  // the usual case, on every forward pass
    asks.swap(expert_asks);
  }
  auto finish = [&](const ExpertRequest& a, const Status& st, uint64_t sent, uint64_t bytes) {
    std::lock_guard<std::mutex> lk(worker_mu);
    --expert_report.pending;
    expert_report.sent += sent;
    expert_report.sent_bytes += bytes;
    if (st.is_ok()) {
      ++expert_report.done;
    } else {
      ++expert_report.failed;
      expert_report.last_error = st.message();
      spdlog::warn("experts for {}: {}", a.worker, st.message());
    }
  };
  // The worker by name, label or the address it was dialled at; -1: none (yet).
  auto worker_of = [&](const ExpertRequest& a, bool* dialling) {
    int32_t w = -1;
    std::lock_guard<std::mutex> lk(worker_mu);
    for (size_t i = 0; i < workers.size() && i < fan->size(); ++i) {
      const WorkerTraffic& t = workers[i];
      if (t.label == a.worker || fan->link(i).session.peer.name == a.worker ||
          fan->link(i).address.to_string() == a.worker || t.label.rfind(a.worker + " ", 0) == 0)
        w = static_cast<int32_t>(i);
    }
    for (const LateWorker& l : late_view) *dialling = *dialling || l.address == a.worker;
    return w;
  };
  // Drops go first (they free the replica budget copies may need), then the copies, then the drops
  // of experts their worker was the only holder of, which a copy may since have given another.
  std::stable_partition(asks.begin(), asks.end(), [](const ExpertRequest& a) { return a.drop; });
  struct Deferred {
    size_t ask;
    int32_t w;
    uint64_t dropped;
    Status st;
    std::vector<wire::ExpertRange> only_holder;
  };
  std::vector<Deferred> deferred;
  std::vector<ExpertRequest> again;
  for (size_t i = 0; i < asks.size(); ++i) {
    ExpertRequest& a = asks[i];
    bool dialling = false;
    const int32_t w = worker_of(a, &dialling);
    if (w < 0 || planner.excluded(w)) {
      if ((w >= 0 || dialling) && ++a.waited < kExpertRequestWaitCalls) {
        again.push_back(std::move(a));
        continue;
      }
      finish(a, make_error(StatusCode::kUnavailable, "{} is not a live worker of this backbone", a.worker), 0, 0);
      continue;
    }
    if (a.drop) {
      Deferred d{i, w, 0, Status::ok(), {}};
      d.st = drop_replicas(w, a.ranges, &d.dropped, &d.only_holder);
      deferred.push_back(std::move(d));
      continue;
    }
    if ((fan->link(static_cast<size_t>(w)).session.features & wire::kFeatureStore) == 0) {
      finish(a,
             make_error(StatusCode::kUnsupported,
                        "{} keeps no replicas (start it with --replica-dir and --replica-mb): experts cannot be "
                        "given to it",
                        fan->link(static_cast<size_t>(w)).label),
             0, 0);
      continue;
    }
    Placement next = planner.placement();
    const std::vector<double> costs = worker_costs();
    Status st = Status::ok();
    uint64_t sent = 0, bytes = 0;
    for (const wire::ExpertRange& r : a.ranges) {
      const int l = static_cast<int>(r.layer);
      if (l >= next.n_layer()) {
        st = make_error(StatusCode::kInvalidArgument, "layer {} is beyond the model's {} layers", l, next.n_layer());
        break;
      }
      for (uint32_t k = 0; k < r.count && st.is_ok(); ++k) {
        const int e = static_cast<int>(r.first + k);
        if (e >= next.n_expert()) {
          st = make_error(StatusCode::kInvalidArgument, "expert {} is beyond the model's {}", e, next.n_expert());
          break;
        }
        const auto hs = next.holders(l, e);
        if (std::find(hs.begin(), hs.end(), w) != hs.end()) continue;
        auto b = place_replica(l, e, w, costs, &next);
        if (!b) {
          st = b.status().with_context(fmt::format("layer {} expert {} to {}", l, e, fan->link(w).label));
          break;
        }
        ++sent;
        bytes += *b;
      }
      if (!st.is_ok()) break;
    }
    planner.set_placement(next);  // what was copied serves, even when the rest failed
    if (sent > 0) spdlog::info("experts for {}: {} copied ({:.2f} MiB)", fan->link(w).label, sent, bytes / 1048576.0);
    finish(a, st, sent, bytes);
  }
  for (Deferred& d : deferred) {
    const ExpertRequest& a = asks[d.ask];
    if (d.st.is_ok() && !d.only_holder.empty() && !planner.excluded(d.w)) {
      std::vector<wire::ExpertRange> still;
      d.st = drop_replicas(d.w, d.only_holder, &d.dropped, &still);
      if (d.st.is_ok() && !still.empty()) {
        {
          std::lock_guard<std::mutex> lk(worker_mu);
          expert_report.kept += swarm::canonicalize(still).n_pairs();
        }
        d.st = make_error(StatusCode::kUnsupported,
                          "{} kept {}: no other live worker holds them and the backbone has no copy",
                          fan->link(static_cast<size_t>(d.w)).label, swarm::canonicalize(still).to_string());
      }
    }
    {
      std::lock_guard<std::mutex> lk(worker_mu);
      expert_report.dropped += d.dropped;
    }
    if (d.dropped > 0)
      spdlog::info("experts of {}: {} replicas let go of", fan->link(static_cast<size_t>(d.w)).label, d.dropped);
    finish(a, d.st, 0, 0);
  }
  if (!again.empty()) {
    std::lock_guard<std::mutex> lk(worker_mu);
    for (ExpertRequest& a : again) expert_asks.push_back(std::move(a));
  }
}

void RemoteExecutor::Impl::replicate_hot() {
  HotExpertReport& r = hot;
  ++r.replica_plans;
  Placement next = planner.placement();
  const int L = next.n_layer(), E = next.n_expert();
  const std::vector<double> costs = worker_costs();
  auto live = [&](int32_t w) { return !planner.excluded(w); };
  // The most activated experts first; those already on two live workers need nothing.
  std::vector<std::tuple<uint64_t, int, int>> order;
  for (int l = 0; l < L; ++l) {
    for (int e = 0; e < E; ++e) {
      const uint64_t n = act[static_cast<size_t>(l) * E + e];
      if (n == 0) continue;
      const auto hs = next.holders(l, e);
      if (std::count_if(hs.begin(), hs.end(), live) < 2) order.emplace_back(n, l, e);
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return std::get<0>(a) > std::get<0>(b); });
  std::vector<bool> full(fan->size(), false);
  int sent = 0;
  for (const auto& [n, l, e] : order) {
    if (sent >= opts.replicate_hot) break;
    const auto hs = next.holders(l, e);
    // The nearest live worker that keeps replicas, has room, and lacks this one.
    int target = -1;
    for (size_t w = 0; w < fan->size(); ++w) {
      const int32_t wi = static_cast<int32_t>(w);
      if (!live(wi) || std::find(hs.begin(), hs.end(), wi) != hs.end()) continue;
      if (full[w] || (fan->link(w).session.features & wire::kFeatureStore) == 0) continue;
      if (target < 0 || costs[w] < costs[static_cast<size_t>(target)]) target = wi;
    }
    if (target < 0) continue;  // nobody can take it
    auto bytes = place_replica(l, e, target, costs, &next);
    if (!bytes) {
      // OVERLOADED (its budget is spent) or gone: not asked again in this plan.
      if (bytes.status().code() == StatusCode::kUnavailable) full[static_cast<size_t>(target)] = true;
      ++r.replica_failures;
      r.last_replica_error = bytes.status().to_string();
      spdlog::warn("replica not placed: {}", r.last_replica_error);
      continue;
    }
    ++sent;
    ++r.replicas_sent;
    r.replica_bytes_sent += *bytes;
    spdlog::info("replica of layer {} expert {} now on {}", l, e, fan->link(static_cast<size_t>(target)).label);
  }
  if (sent > 0) planner.set_placement(std::move(next));
}

TripProblem RemoteExecutor::Impl::trip_problem(const Placement& cur, const std::vector<double>& costs,
                                               uint64_t budget) const {
  const int L = cur.n_layer(), E = cur.n_expert();
  TripProblem pb;
  pb.n_layer = L;
  pb.n_expert = E;
  pb.budget_bytes = budget;
  pb.p.assign(static_cast<size_t>(L), std::vector<double>(static_cast<size_t>(E), 0.0));
  pb.bytes.assign(static_cast<size_t>(L), std::vector<uint64_t>(static_cast<size_t>(E), 0));
  pb.workers.resize(fan->size());
  std::vector<double> compute(fan->size(), 0.0);
  {
    std::lock_guard<std::mutex> lk(worker_mu);
    for (size_t w = 0; w < fan->size(); ++w) {
      const WorkerTraffic& t = workers[w];
      if (t.requests > t.errors) compute[w] = t.compute_sum_seconds / static_cast<double>(t.requests - t.errors);
    }
  }
  for (size_t w = 0; w < fan->size(); ++w) {
    pb.workers[w].compute_s = std::min(compute[w], costs[w]);
    pb.workers[w].rtt_s = costs[w] - pb.workers[w].compute_s;
    pb.workers[w].experts.assign(static_cast<size_t>(L), {});
  }
  // Each expert a worker would serve goes to its nearest live holder (what the planner does with
  // replicas).
  for (int l = 0; l < L; ++l) {
    const uint64_t tokens = act_tokens[static_cast<size_t>(l)];
    const uint64_t slab = mine->slab_bytes(l);
    for (int e = 0; e < E; ++e) {
      if (tokens > 0) {
        pb.p[l][e] = std::min(1.0, static_cast<double>(act[static_cast<size_t>(l) * E + e]) / tokens);
      }
      // Unknown size: cannot be budgeted, so never chosen.
      pb.bytes[l][e] = slab > 0 ? slab : budget + 1;
      const int32_t best = nearest_live_holder(cur, l, e, costs);
      if (best >= 0) pb.workers[static_cast<size_t>(best)].experts[static_cast<size_t>(l)].push_back(e);
    }
  }
  return pb;
}

void RemoteExecutor::Impl::rebalance() {
  HotExpertReport& r = hot;
  ++r.rebalance_plans;
  const std::vector<double> costs = worker_costs();
  planner.set_worker_costs(costs);
  Placement next = planner.placement();
  const int L = next.n_layer(), E = next.n_expert();
  // What no trip is needed for: the backbone's own experts and its hot copies.
  auto no_trip = [&](int l, int e) { return next.owner(l, e) == Placement::kLocal || next.local_copy(l, e); };
  auto predicted = [&]() {
    TripProblem pb = trip_problem(next, costs, 0);
    for (int l = 0; l < L; ++l)
      for (int e = 0; e < E; ++e)
        if (no_trip(l, e)) pb.p[l][e] = 0;
    return expected_trip_latency(pb, {});
  };
  const double before = predicted();
  // Targets: live workers that keep replicas, nearest first. Each takes, within its room, the
  // experts whose move to it saves the most expected trip latency per byte (trip_planner.h with
  // the target's own trip cost); a round sends at most opts.rebalance of them.
  std::vector<int32_t> targets;
  for (size_t w = 0; w < fan->size(); ++w)
    if (!planner.excluded(static_cast<int32_t>(w)) && (fan->link(w).session.features & wire::kFeatureStore) != 0)
      targets.push_back(static_cast<int32_t>(w));
  std::stable_sort(targets.begin(), targets.end(),
                   [&](int32_t a, int32_t b) { return costs[static_cast<size_t>(a)] < costs[static_cast<size_t>(b)]; });
  int left = opts.rebalance, sent = 0;
  for (const int32_t target : targets) {
    if (left <= 0) break;
    const uint64_t room = replica_room(static_cast<size_t>(target));
    if (room == 0) continue;
    TripProblem pb = trip_problem(next, costs, room);
    pb.local_cost_s = std::max(costs[static_cast<size_t>(target)], 1e-9);
    for (int l = 0; l < L; ++l) {
      for (int e = 0; e < E; ++e) {
        if (no_trip(l, e)) pb.p[l][e] = 0;
        // Only experts now served by a dearer holder can gain from the move.
        const int32_t h = nearest_live_holder(next, l, e, costs);
        if (no_trip(l, e) || h < 0 || h == target ||
            costs[static_cast<size_t>(h)] <= costs[static_cast<size_t>(target)])
          pb.bytes[l][e] = room + 1;
      }
    }
    auto plan = plan_local_experts(pb);
    if (!plan) {
      ++r.rebalance_failures;
      r.last_rebalance_error = plan.status().to_string();
      continue;
    }
    for (int l = 0; l < L && left > 0; ++l) {
      for (int e = 0; e < E && left > 0; ++e) {
        if (!plan->local[l][e]) continue;
        auto bytes = place_replica(l, e, target, costs, &next);
        if (!bytes) {
          ++r.rebalance_failures;
          r.last_rebalance_error = bytes.status().to_string();
          spdlog::warn("rebalance: layer {} expert {} not moved: {}", l, e, r.last_rebalance_error);
          if (bytes.status().code() == StatusCode::kUnavailable) break;  // full or gone: next layer
          continue;
        }
        --left;
        ++sent;
        ++r.rebalanced;
        r.rebalanced_bytes += *bytes;
      }
    }
  }
  if (sent > 0 || r.rebalance_plans == 1) {
    planner.set_placement(next);
    r.rebalance_predicted_s_before = before;
    r.rebalance_predicted_s_after = predicted();
  }
  if (sent > 0) {
    spdlog::info("rebalance: {} experts moved nearer; predicted trip latency {:.3f} -> {:.3f} ms per token", sent,
                 1e3 * r.rebalance_predicted_s_before, 1e3 * r.rebalance_predicted_s_after);
  }
}

Status RemoteExecutor::Impl::plan_hot() {
  const Placement& cur = planner.placement();
  const int L = cur.n_layer(), E = cur.n_expert();
  const std::vector<double> costs = worker_costs();
  planner.set_worker_costs(costs);
  // The problem of trip_planner.h from what was counted and measured.
  const TripProblem pb = trip_problem(cur, costs, opts.local_experts_bytes);

  TripPlan plan;
  if (opts.local_policy == LocalExpertPolicy::kHottest) {
    // By activation per byte, wherever they are: what load-only placement does.
    plan.local.assign(static_cast<size_t>(L), std::vector<bool>(static_cast<size_t>(E), false));
    std::vector<std::pair<double, std::pair<int, int>>> order;
    for (size_t w = 0; w < pb.workers.size(); ++w) {
      for (int l = 0; l < L; ++l) {
        for (const int32_t e : pb.workers[w].experts[static_cast<size_t>(l)]) {
          order.push_back({pb.p[l][e] / static_cast<double>(std::max<uint64_t>(pb.bytes[l][e], 1)), {l, e}});
        }
      }
    }
    std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& [score, le] : order) {
      const uint64_t b = pb.bytes[le.first][le.second];
      if (score <= 0 || plan.bytes + b > pb.budget_bytes) continue;
      plan.local[le.first][le.second] = true;
      plan.bytes += b;
    }
    plan.expected_latency_s = expected_trip_latency(pb, plan.local);
  } else {
    MOESH_ASSIGN_OR_RETURN(plan, plan_local_experts(pb));
  }

  // Obtain what is chosen: mapped layers have it; otherwise a copy from the nearest holder.
  Placement next = cur;
  std::vector<uint8_t> mask(static_cast<size_t>(L) * E, 0);
  HotExpertReport& r = hot;
  r.experts = 0;
  r.bytes = 0;
  for (int l = 0; l < L; ++l) {
    std::vector<bool> keep(static_cast<size_t>(E), false);
    for (int e = 0; e < E; ++e) {
      if (!plan.local[l][e]) continue;
      if (!mine->has(l, e)) {
        int best = -1;
        for (const int32_t w : cur.holders(l, e)) {
          if (planner.excluded(w)) continue;
          if (best < 0 || costs[static_cast<size_t>(w)] < costs[static_cast<size_t>(best)]) best = w;
        }
        Status st =
            best < 0 ? make_error(StatusCode::kUnavailable, "layer {} expert {}: no live holder", l, e) : Status::ok();
        if (st.is_ok()) {
          auto slab = fetch(static_cast<size_t>(best), l, e);
          st = slab ? mine->add(l, e, *slab) : slab.status();
          if (st.is_ok()) {
            ++r.fetched;
            r.fetched_bytes += mine->slab_bytes(l);
          }
        }
        if (!st.is_ok()) {
          ++r.fetch_failures;
          r.last_fetch_error = st.to_string();
          continue;  // stays remote
        }
      }
      keep[static_cast<size_t>(e)] = true;
      mask[static_cast<size_t>(l) * E + e] = 1;
      ++r.experts;
      r.bytes += mine->slab_bytes(l);
    }
    mine->retain(l, keep);
    for (int e = 0; e < E; ++e) next.set_local_copy(l, e, mine->has(l, e));
  }
  planner.set_placement(std::move(next));
  planner.set_computed_locally(std::move(mask));
  local = std::make_unique<LocalExecutor>(mine->weights(), pool);

  r.layers_all_local = 0;
  const Placement& now = planner.placement();
  for (int l = 0; l < L; ++l) {
    if (!model->layers[static_cast<size_t>(l)].is_moe) continue;
    bool all = true;
    for (int e = 0; e < E && all; ++e)
      all = now.local_copy(l, e) && (planner.computed_locally(l, e) || now.holders(l, e).empty());
    r.layers_all_local += all ? 1 : 0;
  }
  ++r.plans;
  r.predicted_s_none = expected_trip_latency(pb, {});
  std::vector<std::vector<bool>> chosen(static_cast<size_t>(L), std::vector<bool>(static_cast<size_t>(E), false));
  for (int l = 0; l < L; ++l) {
    for (int e = 0; e < E; ++e) chosen[l][e] = planner.computed_locally(l, e);
  }
  r.predicted_s_chosen = expected_trip_latency(pb, chosen);
  return Status::ok();
}

}  // namespace moesh
