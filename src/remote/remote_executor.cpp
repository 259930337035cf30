// RemoteExecutor: routed experts computed by worker processes (and by the backbone for the
// experts it computes itself). See include/moesh/remote/remote.h for the protocol of one layer;
// this file wires the planner, the fan-out and the combiner together.
//
// The backbone's own share is computed as raw expert outputs too: each local (token, rank) pair
// becomes one row of a k=1 plan with weight 1, so LocalExecutor returns y*1 = y exactly (its row
// results do not depend on the other rows of the batch). Local and remote outputs are then
// combined by one loop, in rank order, with LocalExecutor's float operations — which is what
// makes EXACT mode bit-identical to all-local execution for any placement.
#include "remote/remote_executor_internal.h"

namespace moesh {

RemoteExecutor::RemoteExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RemoteExecutor::~RemoteExecutor() = default;

Result<std::unique_ptr<RemoteExecutor>> RemoteExecutor::connect(const Model& model,
                                                                const std::vector<WorkerAddress>& workers,
                                                                const RemoteOptions& opts) {
  if (workers.empty() && !opts.registry)
    return make_error(StatusCode::kInvalidArgument, "remote executor: no workers given");
  auto impl = std::make_unique<Impl>();
  impl->model = &model;
  impl->opts = opts;
  const HParams& hp = model.hparams();
  impl->n_embd = hp.n_embd_exp();  // the rows the experts take (latent MoE: the latent)
  impl->n_expert = hp.n_expert;
  impl->mine = std::make_unique<LocalExperts>(model);
  impl->local = std::make_unique<LocalExecutor>(impl->mine->weights(), nullptr);
  impl->act.assign(static_cast<size_t>(hp.n_layer * hp.n_expert), 0);
  impl->act_tokens.assign(static_cast<size_t>(hp.n_layer), 0);
  impl->next_hot_plan = static_cast<uint64_t>(std::max<int64_t>(opts.hot_plan_after_tokens, 1));
  impl->hot.budget_bytes = opts.local_experts_bytes;

  MOESH_ASSIGN_OR_RETURN(wire::Hello hello, backbone_hello(model, opts));
  MOESH_ASSIGN_OR_RETURN(swarm::ModelShape shape, swarm::model_shape(model.file()));
  if (shape.n_embd != hp.n_embd_exp() || shape.n_layer != hp.n_layer || shape.n_expert != hp.n_expert) {
    return make_error(StatusCode::kInternal, "remote executor: model shape disagrees with its hparams");
  }

  PlacementInput pin;
  pin.n_layer = static_cast<int>(hp.n_layer);
  pin.n_expert = static_cast<int>(hp.n_expert);
  for (const LayerWeights& lw : model.layers) {
    pin.moe_layer.push_back(lw.is_moe);
    pin.local_layer.push_back(lw.is_moe && lw.experts.valid());
  }
  std::vector<std::unique_ptr<WorkerLink>> links;
  const LinkOptions lopts = opts.link_options();
  std::vector<std::pair<WorkerAddress, Status>> down;
  std::vector<double> given_costs;  // RemoteOptions::worker_costs of the workers that answered
  for (size_t i = 0; i < workers.size(); ++i) {
    const WorkerAddress& a = workers[i];
    auto link = connect_worker(a, hello, lopts);
    if (!link && opts.failover && workers.size() > 1) {
      down.emplace_back(a, link.status());
      continue;
    }
    if (i < opts.worker_costs.size()) given_costs.push_back(opts.worker_costs[i]);
    if (!link) return link.status();
    auto held = swarm::expert_set_from_ranges((*link)->session.peer.experts, shape);
    if (!held) return held.status().with_context("worker " + (*link)->label + " announces");
    pin.worker_experts.push_back(held->ranges);
    impl->announced.push_back(held->ranges);
    pin.worker_names.push_back((*link)->label);
    links.push_back(std::move(*link));
  }
  // Peer-to-peer round trips, for the planner (`moesh swarm plan --status`): only over TCP (a given
  // dialer's addresses, e.g. in-process transports, are not the workers' network addresses).
  if (links.size() >= 2 && !opts.dialer) {
    std::vector<WorkerLink*> ask;
    std::vector<const WorkerLink*> peers;
    for (auto& l : links) {
      ask.push_back(l.get());
      peers.push_back(l.get());
    }
    probe_peer_rtts(ask, peers, net::deadline_in(opts.connect_timeout));
  }
  auto placement = build_placement(pin);
  // Workers that did not answer: the backbone starts without them only when some worker did and
  // every expert still has a holder (another worker — a replica — or the backbone's own copy), as
  // if they had failed mid-run; they are re-dialled in the background and join when they answer.
  // Otherwise the first of them is the error (naming the worker), with what would be uncovered.
  if (!down.empty()) {
    if (links.empty()) return down.front().second;
    if (!placement)
      return make_error(
          down.front().second.code(), "{}; without {}, {}", down.front().second.message(),
          down.size() == 1 ? std::string("it") : fmt::format("the {} workers that do not answer", down.size()),
          placement.status().message());
    // Given costs follow the workers that answered (one that answers later gets the cheapest).
    if (opts.worker_costs.size() == workers.size()) impl->opts.worker_costs = std::move(given_costs);
    for (auto& [a, why] : down) {
      spdlog::warn(
          "remote executor: worker {} does not answer ({}); starting without it: its experts have other "
          "holders; re-dialled in the background",
          a.to_string(), why.to_string());
      Impl::Late& l = impl->late.emplace_back();
      l.address = a;
      l.last = why;
      l.attempts = 1;
      l.backoff = opts.rejoin_backoff;
      l.retry_at = std::chrono::steady_clock::now() + l.backoff;
    }
    impl->publish_late();
  }
  if (!placement) return placement.status().with_context("placement");
  impl->planner = Planner(std::move(*placement), opts.planner);
  impl->pin = pin;
  const size_t n = links.size();
  impl->fan = std::make_unique<FanOut>(std::move(links));
  impl->fan->set_poll_us(opts.tcp.poll_us);
  impl->req_of_worker.assign(n, -1);
  impl->owner_pairs.assign(n, 0);
  impl->workers.resize(n);
  for (size_t i = 0; i < n; ++i) {
    impl->workers[i].label = impl->fan->link(i).label;
    impl->workers[i].name = impl->fan->link(i).session.peer.name;
    impl->workers[i].up_since = std::chrono::steady_clock::now();
  }
  impl->health.resize(n);
  impl->hello = hello;
  impl->verify_rng.seed(opts.verify_seed);
  // MOESH_EXACT_ROWS=1: raw rows for every EXACT request (the A/B baseline of exact_prefix_sums).
  if (const char* e = std::getenv("MOESH_EXACT_ROWS"); e != nullptr && std::string(e) == "1")
    impl->opts.exact_prefix_sums = false;
  // Replicas: the near ones take the load (planner.h); until trips are measured, the warm-up RTT.
  impl->planner.set_worker_costs(impl->worker_costs());
  return std::unique_ptr<RemoteExecutor>(new RemoteExecutor(std::move(impl)));
}

void RemoteExecutor::set_pool(ThreadPool* pool) {
  impl_->pool = pool;
  impl_->local = std::make_unique<LocalExecutor>(impl_->mine->weights(), pool);
}

const std::vector<uint64_t>& RemoteExecutor::activation_counts() const {
  return impl_->act;
}
const std::vector<uint64_t>& RemoteExecutor::routed_tokens() const {
  return impl_->act_tokens;
}
RemoteExecutor::Activations RemoteExecutor::activation_snapshot() const {
  std::lock_guard<std::mutex> lk(impl_->worker_mu);
  return Activations{impl_->act, impl_->act_tokens, impl_->n_expert, impl_->traffic.layer_calls,
                     impl_->traffic.token_layers};
}
HotExpertReport RemoteExecutor::hot_experts() const {
  return impl_->hot;
}
Status RemoteExecutor::plan_local_experts_now() {
  for (const Impl::Job& j : impl_->jobs) {
    if (j.pending) {
      return make_error(StatusCode::kInvalidArgument, "hot experts: cannot re-plan with a layer call pending");
    }
  }
  return impl_->plan_hot();
}

const Placement& RemoteExecutor::placement() const {
  return impl_->planner.placement();
}
const Planner& RemoteExecutor::planner() const {
  return impl_->planner;
}
size_t RemoteExecutor::n_workers() const {
  return impl_->fan->size();
}
const WorkerLink& RemoteExecutor::worker(size_t i) const {
  return impl_->fan->link(i);
}
const RemoteOptions& RemoteExecutor::options() const {
  return impl_->opts;
}
const std::vector<size_t>& RemoteExecutor::last_failed_workers() const {
  return impl_->failed_workers;
}

Status RemoteExecutor::set_placement(Placement placement) {
  const Placement& cur = impl_->planner.placement();
  if (placement.n_layer() != cur.n_layer() || placement.n_expert() != cur.n_expert() ||
      placement.n_workers() > static_cast<int>(impl_->fan->size())) {
    return make_error(StatusCode::kInvalidArgument,
                      "placement of {} layers x {} experts naming {} workers does not fit this executor "
                      "({} x {}, {} workers)",
                      placement.n_layer(), placement.n_expert(), placement.n_workers(), cur.n_layer(), cur.n_expert(),
                      impl_->fan->size());
  }
  impl_->planner.set_placement(std::move(placement));
  return Status::ok();
}

void RemoteExecutor::set_worker_costs(std::vector<double> costs) {
  impl_->planner.set_worker_costs(std::move(costs));
}

void RemoteExecutor::set_excluded(size_t worker, bool excluded) {
  Impl& m = *impl_;
  if (worker < m.health.size()) m.health[worker].manual = excluded;
  m.planner.set_excluded(static_cast<int>(worker), excluded || (worker < m.health.size() && m.health[worker].down));
}

RemoteExecutor::FailoverStats RemoteExecutor::failover_stats() const {
  return impl_->fo;
}

bool RemoteExecutor::worker_down(size_t w) const {
  return w < impl_->health.size() && impl_->health[w].down;
}

void RemoteExecutor::poll_rejoins(bool wait) {
  impl_->start_redials(wait);
  impl_->dial_late(wait);
  impl_->check_paths(wait);
}

std::vector<RemoteExecutor::LateWorker> RemoteExecutor::late_workers() const {
  std::lock_guard<std::mutex> lk(impl_->worker_mu);
  return impl_->late_view;
}

void RemoteExecutor::Impl::publish_late() {
  std::vector<RemoteExecutor::LateWorker> v;
  for (const Late& l : late) v.push_back({l.address.to_string(), l.last.to_string(), l.attempts});
  std::lock_guard<std::mutex> lk(worker_mu);
  late_view = std::move(v);
}

Status RemoteExecutor::dial_worker(const WorkerAddress& address) {
  const std::string want = address.to_string();
  std::lock_guard<std::mutex> lk(impl_->worker_mu);
  for (const WorkerTraffic& w : impl_->workers)  // labels are "HOST:PORT (name)"
    if (w.label == want || w.label.rfind(want + " ", 0) == 0)
      return make_error(StatusCode::kInvalidArgument, "worker {} is already one of the workers ({})", want, w.label);
  for (const LateWorker& l : impl_->late_view)
    if (l.address == want) return make_error(StatusCode::kInvalidArgument, "worker {} is being dialled", want);
  for (const WorkerAddress& a : impl_->dial_requests)
    if (a.to_string() == want) return make_error(StatusCode::kInvalidArgument, "worker {} is being dialled", want);
  impl_->dial_requests.push_back(address);
  impl_->late_view.push_back({want, "not dialled yet", 0});
  return Status::ok();
}

void RemoteExecutor::Impl::dial_late(bool wait) {
  const auto now = std::chrono::steady_clock::now();
  std::vector<WorkerAddress> asked;
  {
    std::lock_guard<std::mutex> lk(worker_mu);
    asked.swap(dial_requests);
  }
  if (late.empty() && asked.empty()) return;  // the usual case, on every forward pass
  for (const WorkerAddress& a : asked) {
    Late& l = late.emplace_back();
    l.address = a;
    l.last = make_error(StatusCode::kUnavailable, "not dialled yet");
    l.backoff = opts.rejoin_backoff;
    l.retry_at = now;
  }
  for (size_t i = 0; i < late.size(); ++i) {
    Late& l = late[i];
    if (l.dial.valid()) {
      if (!wait && l.dial.wait_for(std::chrono::seconds(0)) != std::future_status::ready) continue;
      Result<std::unique_ptr<WorkerLink>> link = l.dial.get();
      Status why = link.status();
      if (link.is_ok()) {
        const std::string label = (*link)->label;
        why = add_worker(std::move(*link));
        if (why.is_ok()) {
          ++fo.rejoins;
          spdlog::info("remote executor: worker {} answered after {} tries and joined", label, l.attempts);
          late.erase(late.begin() + static_cast<std::ptrdiff_t>(i));
          --i;
          continue;
        }
      }
      l.last = why;
      l.backoff = std::min(l.backoff * 2, opts.rejoin_backoff_max);
      l.retry_at = now + l.backoff;
      continue;
    }
    if (!wait && now < l.retry_at) continue;  // `wait` (tests): dial now, whatever the backoff
    ++l.attempts;
    l.dial = std::async(std::launch::async, [addr = l.address, hello = hello, lo = opts.link_options()] {
      return connect_worker(addr, hello, lo);
    });
    if (wait) --i;  // take its result in this same call
  }
  publish_late();
}

void RemoteExecutor::Impl::mark_down(int w) {
  Health& h = health[static_cast<size_t>(w)];
  if (h.evicted) {
    h.down = true;
  } else if (!h.down) {
    h.down = true;
    h.backoff = opts.rejoin_backoff;
    spdlog::warn("remote executor: worker {} is down; its experts go to other holders, re-dial in {} ms",
                 fan->link(static_cast<size_t>(w)).label, h.backoff.count());
  }
  h.retry_at = std::chrono::steady_clock::now() + h.backoff;
  planner.set_excluded(w, true);
  std::lock_guard<std::mutex> lk(worker_mu);
  WorkerTraffic& wt = workers[static_cast<size_t>(w)];
  if (!wt.down) wt.up_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - wt.up_since).count();
  wt.down = true;
  ++wt.failovers;
}

Status RemoteExecutor::Impl::take_announced(size_t w, const swarm::ExpertSet& held) {
  const swarm::ExpertSet before = swarm::canonicalize(announced[w]);
  if (held == before) return Status::ok();
  Placement next = planner.placement();
  const int32_t wi = static_cast<int32_t>(w);
  // Fewer than before: replicas it let go of (another backbone's UNSTORE, or its disk). Taken when
  // someone else can still compute each: another live worker, or the backbone's own copy.
  std::vector<std::string> uncovered;
  for (const wire::ExpertRange& r : before.ranges) {
    for (uint32_t e = r.first; e < r.first + r.count; ++e) {
      if (held.holds(r.layer, e)) continue;
      const int l = static_cast<int>(r.layer), x = static_cast<int>(e);
      const auto hs = next.holders(l, x);
      const bool others = next.local_copy(l, x) ||
                          std::any_of(hs.begin(), hs.end(), [&](int32_t h) { return h != wi && !planner.excluded(h); });
      if (!others) uncovered.push_back(fmt::format("{}:{}", l, x));
      next.remove_holder(l, x, wi);
    }
  }
  if (!uncovered.empty()) {
    std::string list;
    for (size_t i = 0; i < uncovered.size() && i < 16; ++i) list += (i ? "," : "") + uncovered[i];
    return make_error(StatusCode::kInvalidArgument,
                      "it now announces {} instead of {}: experts are missing that nobody else holds (layer:expert "
                      "{}{})",
                      held.to_string(), before.to_string(), list, uncovered.size() > 16 ? ", ..." : "");
  }
  // More than before: replicas it was sent (STORE) and mapped again after a restart. They are
  // planned with like any holder's.
  for (const wire::ExpertRange& r : held.ranges) {
    for (uint32_t e = r.first; e < r.first + r.count; ++e) {
      if (before.holds(r.layer, e)) continue;
      const auto hs = next.holders(static_cast<int>(r.layer), static_cast<int>(e));
      if (std::find(hs.begin(), hs.end(), wi) == hs.end())
        next.add_holder(static_cast<int>(r.layer), static_cast<int>(e), static_cast<int>(w));
    }
  }
  planner.set_placement(std::move(next));
  announced[w] = held.ranges;
  return Status::ok();
}

void RemoteExecutor::Impl::check_paths(bool wait) {
  if (opts.path_recheck.count() <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  for (size_t w = 0; w < health.size(); ++w) {
    Health& h = health[w];
    if (h.down || h.evicted) continue;
    if (h.upgrade.valid()) {
      if (!wait && h.upgrade.wait_for(std::chrono::seconds(0)) != std::future_status::ready) continue;
      Result<std::unique_ptr<WorkerLink>> link = h.upgrade.get();
      h.upgrade_at = now + opts.path_recheck;
      if (!link) continue;  // still not reachable that way: stay where it is
      auto shape = swarm::model_shape(model->file());
      auto held = shape.is_ok() ? swarm::expert_set_from_ranges((*link)->session.peer.experts, *shape)
                                : Result<swarm::ExpertSet>(shape.status());
      const WorkerLink& cur = fan->link(w);
      Status same = !held.is_ok() ? held.status()
                    : (*link)->session.peer.name != cur.session.peer.name
                        ? make_error(StatusCode::kInvalidArgument, "answers as '{}', not '{}'",
                                     (*link)->session.peer.name, cur.session.peer.name)
                        : take_announced(w, *held);
      if (!same.is_ok()) {
        spdlog::warn("remote executor: {} reachable on {}, but not used: {}", cur.label, (*link)->address.to_string(),
                     same.to_string());
        continue;
      }
      const std::string from = cur.address.to_string();
      (*link)->dialed = cur.dialed;  // a re-dial still tries every path
      {
        std::lock_guard<std::mutex> lk(worker_mu);
        fan->replace(w, std::move(*link));
        if (w < replica_use.size()) replica_use[w] = {0, 0};  // the new link's INFO is current
        workers[w].label = fan->link(w).label;
      }
      ++fo.path_switches;
      spdlog::info("remote executor: worker {} moved from {} to {}", fan->link(w).label, from,
                   fan->link(w).address.to_string());
      continue;
    }
    // On a fallback path: try the ones preferred to it, in order, in the background.
    const WorkerLink& cur = fan->link(w);
    if (cur.dialed.alternatives.empty()) continue;  // one path: nothing to prefer (the usual case, each step)
    std::vector<WorkerAddress> paths = {cur.dialed};
    paths[0].alternatives.clear();
    paths.insert(paths.end(), cur.dialed.alternatives.begin(), cur.dialed.alternatives.end());
    size_t used = 0;
    while (used < paths.size() && paths[used].to_string() != cur.address.to_string()) ++used;
    if (used == 0 || used == paths.size()) continue;  // on its first choice (or a joined link)
    if (h.upgrade_at.time_since_epoch().count() == 0) h.upgrade_at = now + opts.path_recheck;
    if (!wait && now < h.upgrade_at) continue;
    WorkerAddress better = paths[0];
    better.alternatives.assign(paths.begin() + 1, paths.begin() + static_cast<std::ptrdiff_t>(used));
    LinkOptions lo = opts.link_options();
    h.upgrade =
        std::async(std::launch::async, [better, hello = hello, lo] { return connect_worker(better, hello, lo); });
    if (wait) --w;  // take its result in this same call
  }
}

// A down worker is re-dialled in the background once its backoff has passed; a finished re-dial
// is taken in here, between calls (nothing in flight): the new link replaces the dead one when
// the worker announces the experts it had, and it is planned with again.
void RemoteExecutor::Impl::start_redials(bool wait) {
  const auto now = std::chrono::steady_clock::now();
  for (size_t w = 0; w < health.size(); ++w) {
    Health& h = health[w];
    if (!h.down || h.evicted) continue;
    if (h.redial.valid()) {
      if (!wait && h.redial.wait_for(std::chrono::seconds(0)) != std::future_status::ready) continue;
      Result<std::unique_ptr<WorkerLink>> link = h.redial.get();
      const std::string label = fan->link(w).label;
      Status why = link.status();
      if (link.is_ok()) {
        auto shape = swarm::model_shape(model->file());
        auto held = shape.is_ok() ? swarm::expert_set_from_ranges((*link)->session.peer.experts, *shape)
                                  : Result<swarm::ExpertSet>(shape.status());
        if (!held.is_ok()) {
          why = held.status();
        } else {
          why = take_announced(w, *held);
        }
      }
      if (why.is_ok()) {
        {
          std::lock_guard<std::mutex> lk(worker_mu);  // worker_status() reads the links under it
          fan->replace(w, std::move(*link));
          if (w < replica_use.size()) replica_use[w] = {0, 0};  // the new link's INFO is current
        }
        h.down = false;
        h.backoff = std::chrono::milliseconds(0);
        planner.set_excluded(static_cast<int>(w), h.manual);
        ++fo.rejoins;
        {
          std::lock_guard<std::mutex> lk(worker_mu);
          workers[w].down = false;
          workers[w].up_since = std::chrono::steady_clock::now();
          ++workers[w].rejoins;
        }
        spdlog::info("remote executor: worker {} rejoined", fan->link(w).label);
      } else {
        h.backoff = std::min(opts.rejoin_backoff_max, h.backoff * 2);
        h.retry_at = now + h.backoff;
        spdlog::warn("remote executor: worker {} still down ({}); next re-dial in {} ms", label, why.to_string(),
                     h.backoff.count());
      }
      continue;
    }
    if (!wait && now < h.retry_at) continue;  // `wait` (tests): re-dial now, whatever the backoff
    LinkOptions lo = opts.link_options();
    h.redial = std::async(std::launch::async,
                          [addr = fan->link(w).dialed, hello = hello, lo] { return connect_worker(addr, hello, lo); });
    if (wait) --w;  // take its result in this same call
  }
}

void RemoteExecutor::maintain() {
  Impl& m = *impl_;
  if (std::any_of(m.jobs.begin(), m.jobs.end(), [](const Impl::Job& j) { return j.pending; })) return;
  if (m.opts.failover) m.start_redials(false);
  m.dial_late(false);
  if (m.opts.registry) m.adopt_joined();
  m.check_paths(false);
}

void RemoteExecutor::Impl::adopt_joined() {
  for (const std::string& name : opts.registry->held()) {
    int w = -1;
    for (size_t i = 0; i < fan->size(); ++i) {
      const WorkerAddress& a = fan->link(i).address;
      if (a.path == WorkerPath::kJoined && a.name == name) w = static_cast<int>(i);
    }
    if (w < 0) {
      std::unique_ptr<WorkerLink> link = opts.registry->take_if_ready(name);
      if (!link) continue;
      const std::string label = link->label;
      if (Status st = add_worker(std::move(link)); !st.is_ok()) {
        spdlog::warn("remote executor: joined worker {} not added: {}", label, st.to_string());
      }
      continue;
    }
    Health& h = health[static_cast<size_t>(w)];
    if (h.redial.valid()) continue;  // the pending re-dial is waiting for exactly this join
    std::unique_ptr<WorkerLink> link = opts.registry->take_if_ready(name);
    if (!link) continue;
    if (h.evicted) {
      spdlog::warn("remote executor: {} joined again, but it was evicted (failed verification): not used", link->label);
      continue;  // dropped: GOODBYE
    }
    auto shape = swarm::model_shape(model->file());
    auto held = shape.is_ok() ? swarm::expert_set_from_ranges(link->session.peer.experts, *shape)
                              : Result<swarm::ExpertSet>(shape.status());
    const Status same = held.is_ok() ? take_announced(static_cast<size_t>(w), *held) : held.status();
    if (!same.is_ok()) {
      spdlog::warn("remote executor: {} joined again: not used: {}", link->label, same.to_string());
      continue;
    }
    // Its old connection is dead (the worker dialled again): nothing of it is in flight now.
    std::lock_guard<std::mutex> lk(worker_mu);
    fan->replace(static_cast<size_t>(w), std::move(link));
    if (static_cast<size_t>(w) < replica_use.size()) replica_use[static_cast<size_t>(w)] = {0, 0};
    WorkerTraffic& wt = workers[static_cast<size_t>(w)];
    wt.label = fan->link(static_cast<size_t>(w)).label;
    if (h.down) {
      h.down = false;
      h.backoff = std::chrono::milliseconds(0);
      planner.set_excluded(w, h.manual);
      ++fo.rejoins;
      wt.down = false;
      wt.up_since = std::chrono::steady_clock::now();
      ++wt.rejoins;
    }
    spdlog::info("remote executor: worker {} reconnected", wt.label);
  }
}

Status RemoteExecutor::Impl::add_worker(std::unique_ptr<WorkerLink> link) {
  MOESH_ASSIGN_OR_RETURN(swarm::ModelShape shape, swarm::model_shape(model->file()));
  MOESH_ASSIGN_OR_RETURN(swarm::ExpertSet held, swarm::expert_set_from_ranges(link->session.peer.experts, shape));
  PlacementInput next = pin;
  next.worker_experts.push_back(held.ranges);
  next.worker_names.push_back(link->label);
  MOESH_ASSIGN_OR_RETURN(Placement placement, build_placement(next));
  // The copies the backbone chose to compute itself (hot experts) stay chosen.
  const Placement& cur = planner.placement();
  for (int l = 0; l < cur.n_layer(); ++l)
    for (int e = 0; e < cur.n_expert(); ++e)
      if (cur.local_copy(l, e)) placement.set_local_copy(l, e, true);
  pin = std::move(next);
  planner.set_placement(std::move(placement));
  announced.push_back(held.ranges);
  health.emplace_back();
  req_of_worker.push_back(-1);
  owner_pairs.push_back(0);
  spdlog::info("remote executor: worker {} joined with {} experts; now {} workers", link->label, held.n_pairs(),
               fan->size() + 1);
  if (!opts.dialer) {
    // Its round trips to the workers dialled directly (nothing reads the new link yet).
    std::vector<const WorkerLink*> peers{link.get()};
    for (size_t i = 0; i < fan->size(); ++i) peers.push_back(&fan->link(i));
    probe_peer_rtts({link.get()}, peers, net::deadline_in(opts.connect_timeout));
  }
  {
    std::lock_guard<std::mutex> lk(worker_mu);
    WorkerTraffic& wt = workers.emplace_back();
    wt.label = link->label;
    wt.name = link->session.peer.name;
    wt.up_since = std::chrono::steady_clock::now();
    fan->add(std::move(link));
  }
  // Given costs (RemoteOptions::worker_costs) stay given: the newcomer gets the cheapest of them.
  if (!opts.worker_costs.empty())
    opts.worker_costs.push_back(*std::min_element(opts.worker_costs.begin(), opts.worker_costs.end()));
  planner.set_worker_costs(worker_costs());
  return Status::ok();
}

LinkOptions RemoteOptions::link_options() const {
  LinkOptions l;
  l.dialer = dialer;
  l.tcp = tcp;
  l.connect_timeout = connect_timeout;
  l.warmup_pad_bytes = warmup_pad_bytes;
  l.swarm_key = swarm_key;
  l.registry = registry;
  l.tls_pins = tls_pins;
  // "q8" hidden falls back to Q8 where the worker does not speak Q8K, so Q8 is what must be common.
  l.need_dtypes = (1u << static_cast<int>(hidden_wire)) | (1u << static_cast<int>(return_wire));
  l.need_modes = 1u << static_cast<int>(combine);
  return l;
}

wire::WireDType RemoteExecutor::hidden_dtype(size_t w, int layer) const {
  return impl_->hidden_dtype(w, layer);
}

bool RemoteExecutor::hidden_is_exact() const {
  const Impl& m = *impl_;
  if (m.opts.hidden_wire == wire::WireDType::kF32) return true;
  if (m.opts.hidden_wire != wire::WireDType::kQ8 && m.opts.hidden_wire != wire::WireDType::kQ8K) return false;
  const Placement& p = m.planner.placement();
  for (int l = 0; l < p.n_layer(); ++l) {
    for (int e = 0; e < p.n_expert(); ++e) {
      for (const int32_t o : p.holders(l, e)) {
        const std::vector<uint8_t>& act = m.fan->link(static_cast<size_t>(o)).session.peer.layer_act;
        if (static_cast<size_t>(l) >= act.size() || act[l] != static_cast<uint8_t>(m.hidden_dtype(o, l))) return false;
      }
    }
  }
  return true;
}
RemoteTraffic RemoteExecutor::traffic() const {
  return impl_->traffic;
}
void RemoteExecutor::reset_traffic() {
  impl_->traffic = RemoteTraffic{};
}
std::vector<WorkerTraffic> RemoteExecutor::worker_traffic() const {
  std::vector<WorkerTraffic> out;
  {
    std::lock_guard<std::mutex> lk(impl_->worker_mu);
    out = impl_->workers;
  }
  const auto now = std::chrono::steady_clock::now();
  for (WorkerTraffic& w : out)
    if (!w.down) w.up_seconds += std::chrono::duration<double>(now - w.up_since).count();
  return out;
}

std::vector<WorkerStatus> RemoteExecutor::worker_status() const {
  const Impl& m = *impl_;
  std::vector<WorkerStatus> out;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lk(m.worker_mu);
  for (size_t w = 0; w < m.workers.size() && w < m.fan->size(); ++w) {
    const WorkerLink& link = m.fan->link(w);
    const WorkerTraffic& t = m.workers[w];
    WorkerStatus& s = out.emplace_back();
    s.index = w;
    s.label = t.label;
    s.name = t.name;
    s.path = link.address.path;
    s.address = link.address.to_string();
    s.state = t.evicted ? "evicted" : t.down ? "down" : "up";
    s.experts = swarm::canonicalize(m.announced[w]).to_string();
    s.n_experts = swarm::canonicalize(m.announced[w]).n_pairs();
    s.warmup_rtt_ms = std::chrono::duration<double, std::milli>(link.warmup_rtt).count();
    s.min_latency_ms = w < m.min_latency.size() ? 1e3 * m.min_latency[w] : 0.0;
    if (w < m.recent.size() && m.recent[w].n >= Impl::RecentTrips::kN / 2)
      s.recent_trip_ms = 1e3 * m.recent[w].median();
    s.mean_latency_ms = t.completed > 0 ? 1e3 * t.latency_sum_seconds / static_cast<double>(t.requests) : 0.0;
    const auto heard = link.mux ? link.mux->last_received() : std::chrono::steady_clock::time_point{};
    s.last_heard_s = heard.time_since_epoch().count() == 0 ? -1.0 : std::chrono::duration<double>(now - heard).count();
    s.requests = t.requests;
    s.errors = t.errors;
    s.rejoins = t.rejoins;
    s.failovers = t.failovers;
    s.compute_seconds = t.compute_sum_seconds;
    s.compute_pairs = t.pairs;
    for (const WorkerLink::Probe& p : link.probes)
      s.paths.push_back(WorkerStatus::Path{p.address, p.ok, p.rtt_ms, p.error, p.used});
    s.peer_rtt_ms = link.peer_rtt_ms;
    s.threads = link.capacity.threads;
    s.cores = link.capacity.cores;
    s.slab_bytes = link.capacity.slab_bytes;
    s.replica_bytes = link.capacity.replica_bytes;
    s.replica_budget_bytes = link.capacity.replica_budget_bytes;
    s.rss_bytes = link.capacity.rss_bytes;
    s.mem_total_bytes = link.capacity.mem_total_bytes;
    s.mem_available_bytes = link.capacity.mem_available_bytes;
    s.offer_bytes = link.capacity.offer_bytes;
    s.loads_blocks = (link.session.features & wire::kFeatureSpanLoad) != 0;
    if (w < m.replica_use.size() && m.replica_use[w].second > 0) {
      // STOREd since it connected: the latest STORED's figures, slabs grown by what was stored.
      s.slab_bytes += m.replica_use[w].first - std::min(m.replica_use[w].first, s.replica_bytes);
      s.replica_bytes = m.replica_use[w].first;
      s.replica_budget_bytes = m.replica_use[w].second;
    }
  }
  return out;
}

std::vector<swarm::LedgerEntry> RemoteExecutor::ledger() const {
  std::vector<swarm::LedgerEntry> out;
  for (const WorkerTraffic& w : worker_traffic()) {
    swarm::LedgerEntry& e = out.emplace_back();
    e.peer = w.name;
    e.address = w.label.substr(0, w.label.find(' '));
    e.requests = w.requests;
    e.dispatches = w.completed;
    e.pairs = w.pairs;
    e.tokens = w.tokens;
    e.dispatch_bytes = w.bytes_sent;
    e.combine_bytes = w.bytes_received;
    e.errors = w.errors;
    e.fetches = w.fetches;
    e.fetch_bytes = w.fetch_bytes;
    e.verified = w.verified;
    e.mismatches = w.mismatches;
    e.compute_seconds = w.compute_sum_seconds;
    e.connected_seconds = w.up_seconds;
    e.connected = !w.down && !w.evicted;
  }
  return out;
}

std::string RemoteExecutor::describe() const {
  const Impl& m = *impl_;
  // "wire q8/f16": hidden/return; one name when both directions agree.
  const std::string wire =
      m.opts.hidden_wire == m.opts.return_wire
          ? std::string(wire::wire_dtype_name(m.opts.hidden_wire))
          : fmt::format("{}/{}", wire::wire_dtype_name(m.opts.hidden_wire), wire::wire_dtype_name(m.opts.return_wire));
  const Placement& p = m.planner.placement();
  std::string s = fmt::format("remote dispatch: wire {}, combine {}, timeout {} ms, {} worker(s)\n", wire,
                              wire::combine_mode_name(m.opts.combine), m.opts.timeout.count(), m.fan->size());
  for (size_t i = 0; i < m.fan->size(); ++i) {
    const int64_t replicas = p.count_replicas(static_cast<int>(i));
    s += fmt::format("  worker {} {}: warm-up rtt {:.3f} ms, {} experts placed ({}){}\n", i, m.fan->link(i).label,
                     std::chrono::duration<double, std::milli>(m.fan->link(i).warmup_rtt).count(),
                     p.count(static_cast<int>(i)), p.describe(static_cast<int>(i)),
                     replicas > 0 ? fmt::format(", plus {} replicas of other workers' experts", replicas) : "");
  }
  const int64_t n_local = p.count(Placement::kLocal);
  s += n_local == 0 ? std::string("  local: none (every routed expert is on a worker)\n")
                    : fmt::format("  local: {} experts ({})\n", n_local, p.describe(Placement::kLocal));
  if (m.opts.local_experts_bytes > 0) {
    const HotExpertReport& h = m.hot;
    s += h.plans == 0
             ? fmt::format("  hot experts: up to {:.1f} MiB, {} by {}, chosen after {} tokens\n",
                           m.opts.local_experts_bytes / 1048576.0,
                           m.opts.local_policy == LocalExpertPolicy::kHottest ? "hottest" : "trip-aware",
                           m.opts.local_policy == LocalExpertPolicy::kHottest ? "activation" : "expected latency",
                           m.opts.hot_plan_after_tokens)
             : fmt::format(
                   "  hot experts: {} computed here ({:.1f} of {:.1f} MiB), {} layers without a trip; "
                   "predicted trip latency {:.3f} -> {:.3f} ms per token; {} fetched, {} failed\n",
                   h.experts, h.bytes / 1048576.0, h.budget_bytes / 1048576.0, h.layers_all_local,
                   1e3 * h.predicted_s_none, 1e3 * h.predicted_s_chosen, h.fetched, h.fetch_failures);
  }
  if (m.opts.replicate_hot > 0) {
    const HotExpertReport& h = m.hot;
    s += fmt::format(
        "  replicas: up to {} hot experts per plan onto workers; {} plans, {} sent ({:.2f} MiB), {} failed{}\n",
        m.opts.replicate_hot, h.replica_plans, h.replicas_sent, h.replica_bytes_sent / 1048576.0, h.replica_failures,
        h.last_replica_error.empty() ? "" : " (last: " + h.last_replica_error + ")");
  }
  if (m.opts.rebalance > 0) {
    const HotExpertReport& h = m.hot;
    s += fmt::format(
        "  rebalance: up to {} experts per plan moved nearer; {} plans, {} moved ({:.2f} MiB), {} failed; predicted "
        "trip latency {:.3f} -> {:.3f} ms per token{}\n",
        m.opts.rebalance, h.rebalance_plans, h.rebalanced, h.rebalanced_bytes / 1048576.0, h.rebalance_failures,
        1e3 * h.rebalance_predicted_s_before, 1e3 * h.rebalance_predicted_s_after,
        h.last_rebalance_error.empty() ? "" : " (last: " + h.last_rebalance_error + ")");
  }
  return s;
}

// ---- submit ------------------------------------------------------------------------------------

Ticket RemoteExecutor::submit(int layer, const float* x, int64_t n_tokens, const RoutingPlan& plan) {
  Impl& m = *impl_;
  const bool overlapped = std::any_of(m.jobs.begin(), m.jobs.end(), [](const Impl::Job& j) { return j.pending; });
  // A forward pass starts with a call at or below the previous call's layer: the first MoE layer
  // this backbone computes, which is not the model's first when span peers run the blocks before.
  const bool pass_start = layer <= m.last_layer;
  m.last_layer = layer;
  // The hot set is re-chosen between steps (nothing in flight), on a pass's first call.
  if ((m.opts.local_experts_bytes > 0 || m.opts.replicate_hot > 0 || m.opts.rebalance > 0) && !overlapped &&
      pass_start && m.act_tokens[static_cast<size_t>(layer)] >= m.next_hot_plan) {
    // Failures are in the report; the step goes on with the old set.
    if (m.opts.local_experts_bytes > 0) (void)m.plan_hot();
    if (m.opts.replicate_hot > 0) m.replicate_hot();
    if (m.opts.rebalance > 0) m.rebalance();
    m.next_hot_plan = m.act_tokens[static_cast<size_t>(layer)] +
                      static_cast<uint64_t>(std::max<int64_t>(m.opts.hot_replan_every_tokens, 1));
  }
  if (!overlapped && pass_start) m.take_expert_requests();
  if (!overlapped && m.opts.failover) m.start_redials(false);  // between calls: take back workers that answer
  if (!overlapped && pass_start) m.check_paths(false);
  if (!overlapped && pass_start) m.dial_late(false);
  if (!overlapped && m.opts.registry && pass_start) m.adopt_joined();
  if (!overlapped && pass_start && ++m.straggler_calls % 16 == 0) m.check_stragglers();
  Impl::Job* job = &start_job(m.jobs, &m.next_ticket, layer, x, n_tokens, plan);
  job->deadline = net::deadline_in(m.opts.timeout);
  job->error = Status::ok();
  job->send_error = Status::ok();
  job->failed_worker = -1;
  job->n_reqs = 0;
  job->local_slots.clear();
  m.split_and_send(*job);
  if (overlapped && job->n_reqs > 0) ++m.traffic.overlapped_calls;
  job->submitted = std::chrono::steady_clock::now();
  return job->ticket;
}

void RemoteExecutor::Impl::split_and_send(Job& job) {
  const RoutingPlan& plan = *job.plan;
  const int k = plan.k;
  const int64_t n_tok = job.n_tokens;
  if (job.layer < 0 || job.layer >= planner.placement().n_layer() || plan.n_tokens != n_tok || k < 1 ||
      k > static_cast<int>(wire::kMaxPairsPerToken)) {
    job.error = make_error(StatusCode::kInvalidArgument,
                           "remote executor: bad dispatch (layer {}, {} tokens, plan of {} tokens, k {})", job.layer,
                           n_tok, plan.n_tokens, k);
    return;
  }
  // Pass 1: who computes each pair (the planner). Requests are created in worker order, so
  // PARTIAL sums are added in a fixed order whatever the routing or arrival order.
  {
    // Under the lock monitoring reads them with (activation_snapshot): uncontended, once per call.
    std::lock_guard<std::mutex> lk(worker_mu);
    uint64_t* a = act.data() + static_cast<size_t>(job.layer) * static_cast<size_t>(n_expert);
    for (const int32_t e : plan.ids) {
      if (e >= 0 && e < n_expert) ++a[e];
    }
    act_tokens[static_cast<size_t>(job.layer)] += static_cast<uint64_t>(n_tok);
  }
  Status planned = planner.assign(job.layer, plan, &job.assign);
  if (!planned.is_ok()) {
    job.error = planned;
    return;
  }
  for (size_t s = 0; s < job.assign.size(); ++s) {
    if (job.assign[s] == Placement::kLocal) job.local_slots.push_back(static_cast<int32_t>(s));
  }
  traffic.local_pairs += job.local_slots.size();
  add_requests(job, nullptr);
  if (job.n_reqs == 0) return;
  {
    std::lock_guard<std::mutex> lk(worker_mu);  // activation_snapshot() reads these two
    ++traffic.layer_calls;
    traffic.token_layers += static_cast<uint64_t>(n_tok);
  }
  send_requests(job, 0);
}

void RemoteExecutor::Impl::add_requests(Job& job, const std::vector<uint8_t>* mask) {
  const RoutingPlan& plan = *job.plan;
  const int k = plan.k;
  const std::vector<int32_t>& who = job.assign;
  auto wanted = [&](size_t s) { return who[s] >= 0 && (mask == nullptr || (*mask)[s] != 0); };
  std::fill(owner_pairs.begin(), owner_pairs.end(), 0);
  for (size_t s = 0; s < who.size(); ++s) {
    if (wanted(s)) ++owner_pairs[static_cast<size_t>(who[s])];
  }
  // Requests are created in worker order, so PARTIAL sums are added in a fixed order whatever
  // the routing or arrival order.
  for (size_t w = 0; w < fan->size(); ++w) {
    req_of_worker[w] = -1;
    if (owner_pairs[w] == 0) continue;
    if (job.reqs.size() <= job.n_reqs) job.reqs.emplace_back();
    Request& r = job.reqs[job.n_reqs];
    req_of_worker[w] = static_cast<int>(job.n_reqs++);
    r.worker = static_cast<int>(w);
    r.started = false;
    r.failed = false;
    r.tokens.clear();
    r.slots.clear();
    r.msg.pair_counts.clear();
    r.msg.pairs.clear();
  }
  // Per worker, its tokens and (expert, rank, weight) pairs in rank order.
  for (int64_t t = 0; t < job.n_tokens; ++t) {
    for (int rk = 0; rk < k; ++rk) {
      const int64_t s = t * k + rk;
      if (!wanted(static_cast<size_t>(s))) continue;
      Request& r = job.reqs[req_of_worker[who[s]]];
      if (r.tokens.empty() || r.tokens.back() != t) {
        r.tokens.push_back(static_cast<int32_t>(t));
        r.msg.pair_counts.push_back(0);
      }
      ++r.msg.pair_counts.back();
      r.msg.pairs.push_back(
          wire::ExpertPair{static_cast<uint16_t>(plan.ids[s]), static_cast<uint8_t>(rk), plan.weights[s]});
      r.slots.push_back(static_cast<int32_t>(s));
    }
  }
}

void RemoteExecutor::Impl::send_requests(Job& job, size_t first) {
  // Star fan-out: every request leaves before any reply is awaited.
  for (size_t i = first; i < job.n_reqs; ++i) {
    Request& r = job.reqs[i];
    const WorkerLink& link = fan->link(static_cast<size_t>(r.worker));
    const size_t nt = r.tokens.size();
    rows_f32.resize(nt * static_cast<size_t>(n_embd));
    for (size_t j = 0; j < nt; ++j) {
      std::copy_n(job.x + static_cast<int64_t>(r.tokens[j]) * n_embd, n_embd, rows_f32.data() + j * n_embd);
    }
    auto rows = wire::encode_rows(hidden_dtype(static_cast<size_t>(r.worker), job.layer), rows_f32.data(),
                                  static_cast<uint32_t>(nt), static_cast<uint32_t>(n_embd));
    r.msg.request_id = fan->next_request_id(static_cast<size_t>(r.worker));
    if (!rows) {
      job.error = rows.status().with_context(where(job, r) + ": encoding hidden rows");
      return;
    }
    r.msg.hidden = std::move(*rows);
    r.msg.layer = static_cast<uint32_t>(job.layer);
    r.msg.mode = opts.combine;
    r.prefix_sums = use_prefix_sums(r);
    if (r.prefix_sums) r.msg.mode = wire::CombineMode::kPartial;
    r.msg.return_dtype = opts.return_wire;
    r.msg.deadline_ms = static_cast<uint32_t>(std::clamp<int64_t>(opts.timeout.count(), 1, UINT32_MAX));
    auto frame = wire::encode_dispatch(r.msg);
    r.msg.hidden.bytes.clear();
    if (!frame) {
      job.error = frame.status().with_context(where(job, r) + ": encoding DISPATCH");
      return;
    }
    if (frame->size() - wire::kHeaderBytes > link.session.max_send_bytes) {
      job.error = make_error(StatusCode::kOutOfRange, "{}: DISPATCH of {} bytes exceeds the worker's frame limit {}",
                             where(job, r), frame->size() - wire::kHeaderBytes, link.session.max_send_bytes);
      return;
    }
    // Stamped before the send: a fast worker's reply can be filed by a reader before start()
    // returns, and a trip must never measure negative.
    const auto sent_at = std::chrono::steady_clock::now();
    Status st = fan->start(static_cast<size_t>(r.worker), r.msg.request_id, *frame, job.deadline);
    if (!st.is_ok()) {
      // A request that cannot even be sent fails like one whose reply fails: failover takes
      // its pairs in wait() (the rest of the requests still go out).
      note_error(r.worker);
      r.failed = true;
      if (job.failed_worker < 0) job.failed_worker = r.worker;
      if (job.send_error.is_ok()) job.send_error = st.with_context(where(job, r) + ": sending DISPATCH");
      continue;
    }
    r.started = true;
    r.sent_at = sent_at;
    if (i == first) job.first_sent = r.sent_at;
    {
      std::lock_guard<std::mutex> lk(worker_mu);
      ++workers[r.worker].requests;
      workers[r.worker].bytes_sent += frame->size();
    }
    ++traffic.dispatch_frames;
    traffic.prefix_sum_requests += r.prefix_sums ? 1 : 0;
    traffic.dispatch_bytes += frame->size();
    traffic.remote_pairs += r.msg.pairs.size();
    // Nothing of this call is gathered before wait(), so every request started so far is out.
    traffic.max_in_flight = std::max<uint64_t>(traffic.max_in_flight, i - first + 1);
  }
}

// ---- wait --------------------------------------------------------------------------------------

void RemoteExecutor::Impl::cancel_all(Job& job) {
  for (size_t i = 0; i < job.n_reqs; ++i) {
    Request& r = job.reqs[i];
    if (r.started) fan->cancel(static_cast<size_t>(r.worker), r.msg.request_id);
    r.started = false;
  }
}

Status RemoteExecutor::Impl::run_local(Job& job, std::span<const float>* y) {
  const size_t n = job.local_slots.size();
  if (n == 0) return Status::ok();
  const RoutingPlan& plan = *job.plan;
  const int k = plan.k;
  xl.resize(n * static_cast<size_t>(n_embd));
  lids.resize(n);
  lw.assign(n, 1.0f);
  for (size_t i = 0; i < n; ++i) {
    const int32_t s = job.local_slots[i];
    std::copy_n(job.x + static_cast<int64_t>(s / k) * n_embd, n_embd, xl.data() + i * n_embd);
    // The backbone's copy of the expert may be a compact stack of received ones (local_experts.h).
    lids[i] = mine->slot(job.layer, plan.ids[s]);
    if (lids[i] < 0) {
      return make_error(StatusCode::kInternal, "layer {}: expert {} planned locally but the backbone has no copy",
                        job.layer, plan.ids[s]);
    }
  }
  MOESH_RETURN_IF_ERROR(
      make_plan(job.layer, lids.data(), lw.data(), static_cast<int64_t>(n), 1, n_expert, &local_plan));
  const Ticket t = local->submit(job.layer, xl.data(), static_cast<int64_t>(n), local_plan);
  auto res = local->wait(t);
  if (!res) return res.status().with_context(fmt::format("backbone experts of layer {}", job.layer));
  *y = *res;
  return Status::ok();
}

Status RemoteExecutor::Impl::gather(Job& job, size_t first) {
  // Replies are handled in arrival order; every failed request is reported, not just the first.
  outstanding.clear();
  req_index.clear();
  if (first == 0) job.last_arrival = job.first_sent;
  std::vector<std::pair<size_t, Status>> failures;
  for (size_t i = first; i < job.n_reqs; ++i) {
    const Request& r = job.reqs[i];
    if (r.failed) {  // could not be sent (send_requests)
      failures.emplace_back(static_cast<size_t>(r.worker),
                            job.send_error.is_ok() ? make_error(StatusCode::kUnavailable, "{}: not sent", where(job, r))
                                                   : job.send_error);
      continue;
    }
    outstanding.push_back(FanOut::Outstanding{static_cast<size_t>(r.worker), r.msg.request_id});
    req_index.push_back(i);
  }
  fan->gather(outstanding, job.deadline, [&](FanOut::Reply&& rep) {
    Request& r = job.reqs[req_index[rep.index]];
    r.started = false;
    job.last_arrival = std::max(job.last_arrival, rep.arrived);
    const WorkerLink& link = fan->link(static_cast<size_t>(r.worker));
    auto fail = [&](Status st) {
      note_error(r.worker);
      r.failed = true;
      r.error = st;
      failures.emplace_back(static_cast<size_t>(r.worker), std::move(st));
    };
    if (!rep.frame) return fail(rep.frame.status().with_context(where(job, r)));
    const wire::Frame& frame = *rep.frame;
    traffic.combine_bytes += wire::kHeaderBytes + frame.payload.size();
    ++traffic.combine_frames;
    {
      // Latency as seen by the backbone: DISPATCH sent -> COMBINE arrived (receive timestamp, else filed).
      const double sec = std::chrono::duration<double>(rep.arrived - r.sent_at).count();
      const auto& bounds = WorkerTraffic::kLatencyBounds;
      const size_t b = static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), sec) - bounds.begin());
      std::lock_guard<std::mutex> lk(worker_mu);
      WorkerTraffic& wt = workers[r.worker];
      wt.bytes_received += wire::kHeaderBytes + frame.payload.size();
      ++wt.latency_counts[b];
      wt.latency_sum_seconds += sec;
      if (min_latency.size() < workers.size()) min_latency.resize(workers.size(), 0.0);
      double& mn = min_latency[static_cast<size_t>(r.worker)];
      if (sec > 0 && (mn == 0.0 || sec < mn)) mn = sec;
      if (recent.size() < workers.size()) recent.resize(workers.size());
      recent[static_cast<size_t>(r.worker)].add(sec);
    }
    auto reply = wire::decode_combine(frame, link.limits);
    if (!reply) return fail(reply.status().with_context(where(job, r) + ": COMBINE"));
    reply->request_id = frame.request_id();
    {
      std::lock_guard<std::mutex> lk(worker_mu);
      workers[r.worker].compute_sum_seconds += reply->compute_us * 1e-6;
    }
    Status st = wire::check_combine_matches(r.msg, *reply);
    if (!st.is_ok()) return fail(st.with_context(where(job, r) + ": COMBINE does not answer the DISPATCH"));
    r.rows.resize(static_cast<size_t>(reply->rows.n_rows) * static_cast<size_t>(n_embd));
    wire::decode_rows(reply->rows, r.rows.data());
    std::lock_guard<std::mutex> lk(worker_mu);
    WorkerTraffic& wt = workers[r.worker];
    ++wt.completed;
    wt.pairs += r.msg.pairs.size();
    wt.tokens += reply->rows.n_rows;
  });
  if (failures.empty()) return Status::ok();
  std::sort(failures.begin(), failures.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& f : failures) {
    if (std::find(failed_workers.begin(), failed_workers.end(), f.first) == failed_workers.end())
      failed_workers.push_back(f.first);
  }
  std::sort(failed_workers.begin(), failed_workers.end());
  if (failures.size() == 1) return failures[0].second;
  std::string msg = fmt::format("{} workers failed layer {}:", failures.size(), job.layer);
  for (const auto& f : failures) msg += " [" + f.second.to_string() + "]";
  return Status(failures[0].second.code(), msg);
}

void RemoteExecutor::Impl::combine(Job& job, std::span<const float> ylocal) {
  const RoutingPlan& plan = *job.plan;
  const int64_t D = n_embd;
  job.out.resize(static_cast<size_t>(job.n_tokens * D));
  if (opts.combine == wire::CombineMode::kExact) {
    // Every (token, rank) slot's raw output, wherever it was computed.
    slot_src.assign(static_cast<size_t>(job.n_tokens * plan.k), nullptr);
    for (size_t i = 0; i < job.local_slots.size(); ++i) slot_src[job.local_slots[i]] = ylocal.data() + i * D;
    prefix_src.assign(static_cast<size_t>(job.n_tokens), nullptr);  // rank-prefix sums, per token
    prefix_len.assign(static_cast<size_t>(job.n_tokens), 0);
    for (size_t q = 0; q < job.n_reqs; ++q) {
      const Request& r = job.reqs[q];
      if (r.failed) continue;  // its slots were recomputed by other holders
      if (r.prefix_sums) {
        for (size_t j = 0; j < r.tokens.size(); ++j) {
          prefix_src[static_cast<size_t>(r.tokens[j])] = r.rows.data() + j * D;
          prefix_len[static_cast<size_t>(r.tokens[j])] = r.msg.pair_counts[j];
        }
        continue;
      }
      for (size_t j = 0; j < r.slots.size(); ++j) slot_src[r.slots[j]] = r.rows.data() + j * D;
    }
    combine_exact(plan, slot_src, D, job.out.data(), pool, prefix_src, prefix_len);
    return;
  }
  partials.clear();
  for (size_t q = 0; q < job.n_reqs; ++q) {
    if (!job.reqs[q].failed) partials.push_back(PartialRows{job.reqs[q].tokens, job.reqs[q].rows.data()});
  }
  combine_partial(plan, job.local_slots, ylocal.data(), partials, D, job.out.data(), &seen);
}

Result<std::span<const float>> RemoteExecutor::wait(Ticket t) {
  Impl& m = *impl_;
  Impl::Job* job = finish_job(m.jobs, t);
  if (job == nullptr) return make_error(StatusCode::kInvalidArgument, "remote executor: unknown ticket {}", t);
  m.failed_workers.clear();
  if (!job->error.is_ok()) {
    if (job->failed_worker >= 0) m.failed_workers.push_back(static_cast<size_t>(job->failed_worker));
    m.cancel_all(*job);
    return job->error;
  }
  // The backbone's share runs while the workers compute theirs.
  std::span<const float> ylocal;
  const auto wait_start = std::chrono::steady_clock::now();
  Status st = m.run_local(*job, &ylocal);
  const auto local_end = std::chrono::steady_clock::now();
  if (st.is_ok()) st = m.gather(*job, 0);
  // Verification (RemoteOptions::verify_rate): a request that differs from the backbone's own
  // result is treated as failed, so failover recomputes it like any other failure.
  if (st.is_ok() && m.opts.verify_rate > 0) {
    // verify() runs the local executor, whose output buffer holds the backbone's share: keep it.
    if (!ylocal.empty()) {
      job->ylocal_kept.assign(ylocal.begin(), ylocal.end());
      ylocal = job->ylocal_kept;
    }
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (size_t q = 0; q < job->n_reqs; ++q) {
      if (job->reqs[q].failed || u(m.verify_rng) >= m.opts.verify_rate) continue;
      Status v = m.verify(*job, q);
      if (!v.is_ok() && st.is_ok()) st = v;
    }
  }
  // Failover: each round re-plans the failed requests' pairs onto the other holders and gathers
  // what it sent; every round leaves out at least one more worker, so it ends.
  const size_t n_local_before = job->local_slots.size();
  bool recovered = false;
  for (size_t round = 0; !st.is_ok() && m.opts.failover && round < m.fan->size() + 1; ++round) {
    const size_t first = job->n_reqs;
    const Status r = m.recover(*job, st);
    if (!r.is_ok()) {
      st = r;
      break;
    }
    recovered = true;
    st = m.gather(*job, first);
  }
  if (st.is_ok() && job->local_slots.size() != n_local_before) st = m.run_local(*job, &ylocal);
  if (!st.is_ok()) {
    m.cancel_all(*job);
    return st;
  }
  if (recovered) ++m.fo.saved_calls;
  if (job->n_reqs > 0) {
    using sec = std::chrono::duration<double>;
    // Local work while the trip was out: the caller's (submit -> wait) plus the backbone's experts.
    const double local = sec(wait_start - job->submitted).count() + sec(local_end - wait_start).count();
    const double trip = sec(job->last_arrival - job->first_sent).count();
    m.traffic.trip_seconds += trip;
    m.traffic.local_seconds += local;
    m.traffic.hidden_seconds += std::min(local, trip);
  }
  m.combine(*job, ylocal);
  return std::span<const float>(job->out.data(), job->out.size());
}

namespace {

// The expert a NOT_HELD names: the worker's text starts "layer L expert E" (docs/PROTOCOL.md).
// False for any other text: the caller then fails the whole worker over.
bool not_held_expert(const Status& st, int* layer, int* expert) {
  if (st.code() != StatusCode::kNotFound) return false;
  const std::string& m = st.message();
  const size_t at = m.rfind(": layer ");
  if (at == std::string::npos) return false;
  int n = 0;
  return std::sscanf(m.c_str() + at + 2, "layer %d expert %d is not held%n", layer, expert, &n) == 2 && n > 0 &&
         *layer >= 0 && *expert >= 0;
}

}  // namespace

void RemoteExecutor::Impl::forget_held(size_t w, int l, int e) {
  Placement next = planner.placement();
  next.remove_holder(l, e, static_cast<int>(w));
  planner.set_placement(next);
  std::lock_guard<std::mutex> lk(worker_mu);  // worker_status() reads what it announced
  std::vector<wire::ExpertRange> left;
  for (const wire::ExpertRange& a : announced[w])
    for (uint32_t x = a.first; x < a.first + a.count; ++x)
      if (a.layer != static_cast<uint32_t>(l) || x != static_cast<uint32_t>(e)) left.push_back({a.layer, x, 1});
  announced[w] = swarm::canonicalize(std::move(left)).ranges;
}

Status RemoteExecutor::Impl::recover(Job& job, const Status& why) {
  const RoutingPlan& plan = *job.plan;
  replan_mask.assign(job.assign.size(), 0);
  std::vector<int> down, lacking;  // failed workers; workers that only lack an expert (NOT_HELD)
  for (size_t q = 0; q < job.n_reqs; ++q) {
    Request& r = job.reqs[q];
    if (!r.failed || r.slots.empty()) continue;
    // NOT_HELD naming an expert of this layer it was sent (another backbone had it let go of that
    // replica): only that expert leaves its holders; the worker stays up for the rest.
    int l = -1, e = -1;
    const size_t wi = static_cast<size_t>(r.worker);
    if (not_held_expert(r.error, &l, &e) && l == job.layer && !health[wi].evicted &&
        std::any_of(r.msg.pairs.begin(), r.msg.pairs.end(),
                    [&](const wire::ExpertPair& p) { return static_cast<int>(p.expert) == e; })) {
      forget_held(wi, l, e);
      ++fo.lacking;
      spdlog::warn("remote executor: {} no longer holds layer {} expert {}; it stays up for its other experts",
                   fan->link(wi).label, l, e);
      if (std::find(lacking.begin(), lacking.end(), r.worker) == lacking.end()) lacking.push_back(r.worker);
    } else if (std::find(down.begin(), down.end(), r.worker) == down.end()) {
      down.push_back(r.worker);
    }
    for (const int32_t s : r.slots) replan_mask[static_cast<size_t>(s)] = 1;
    r.slots.clear();  // recomputed elsewhere; this request's rows are not used
  }
  if (down.empty() && lacking.empty()) return why;
  for (const int w : down) {
    if (!health[static_cast<size_t>(w)].evicted) ++fo.failures;
    mark_down(w);
  }
  // As if the failed workers had been excluded from the start: their slots go to replicas or
  // the backbone's copies, every other slot keeps its holder (and its result). A worker that only
  // lacked an expert is left out of this call's retry of its pairs, not of later calls.
  down.insert(down.end(), lacking.begin(), lacking.end());
  for (const int w : down) {
    Status st = planner.reassign(job.layer, plan, w, &job.assign);
    if (!st.is_ok()) {
      return Status(st.code(), fmt::format("{}; failover: {}", why.to_string(), st.message()));
    }
  }
  uint64_t moved = 0;
  for (size_t s = 0; s < replan_mask.size(); ++s) {
    if (replan_mask[s] == 0) continue;
    ++moved;
    if (job.assign[s] == Placement::kLocal) job.local_slots.push_back(static_cast<int32_t>(s));
  }
  fo.replanned_pairs += moved;
  const size_t first = job.n_reqs;
  add_requests(job, &replan_mask);
  // add_requests rebuilt requests from index n_reqs on only; the earlier ones keep theirs.
  send_requests(job, first);
  if (!job.error.is_ok()) return job.error;
  spdlog::warn("remote executor: layer {}: {} pairs of {} re-planned after: {}", job.layer, moved, fmt::join(down, ","),
               why.to_string());
  return Status::ok();
}

}  // namespace moesh

namespace moesh {

Result<wire::Hello> backbone_hello(const Model& model, const RemoteOptions& opts) {
  auto id = swarm::model_identity(model.file());
  if (!id) return id.status().with_context("model identity");
  auto shape = swarm::model_shape(model.file());
  if (!shape) return shape.status().with_context("model shape");
  return swarm::make_hello(wire::PeerRole::kBackbone, *id, *shape, swarm::ExpertSet{}, opts.name);
}

}  // namespace moesh
