// RemoteExecutor: routed experts computed by worker processes (and by the backbone for the
// experts no worker holds). See include/moesh/remote.h for the protocol of one layer.
//
// The backbone's own share is computed as raw expert outputs too: each local (token, rank) pair
// becomes one row of a k=1 plan with weight 1, so LocalExecutor returns y*1 = y exactly (its row
// results do not depend on the other rows of the batch). Local and remote outputs are then
// combined by one loop, in rank order, with LocalExecutor's float operations — which is what
// makes EXACT mode bit-identical to all-local execution for any placement.
#include <algorithm>
#include <bit>
#include <mutex>

#include "moe/expert_stages.h"
#include "moesh/remote.h"
#include "moesh/swarm.h"

namespace moesh {

struct RemoteExecutor::Impl {
  const Model* model = nullptr;
  RemoteOptions opts;
  std::vector<std::unique_ptr<WorkerLink>> links;
  Placement placement;
  std::vector<ExpertWeights> local_weights;
  std::unique_ptr<LocalExecutor> local;
  ThreadPool* pool = nullptr;
  int64_t n_embd = 0;
  int64_t n_expert = 0;
  RemoteTraffic traffic;
  // Per-worker counters: written by the executor's thread, read by monitoring threads.
  mutable std::mutex worker_mu;
  std::vector<WorkerTraffic> workers;
  void note_error(int w) {
    std::lock_guard<std::mutex> lk(worker_mu);
    ++workers[w].errors;
  }

  // One DISPATCH: the tokens of a layer that have at least one pair on one worker.
  struct Request {
    int worker = 0;
    bool started = false;
    std::chrono::steady_clock::time_point sent_at;
    wire::DispatchMsg msg;         // hidden.bytes dropped once encoded (shape kept for checks)
    std::vector<int32_t> tokens;   // batch index of each dispatched token
    std::vector<int32_t> slots;    // token*k + rank of each pair, in pair order
    std::vector<float> rows;       // decoded COMBINE rows
  };
  struct Job : SubmittedJob {
    net::Deadline deadline;
    Status error;                  // a failure found by submit(), reported by wait()
    std::vector<Request> reqs;     // reused; the first n_reqs are this job's
    size_t n_reqs = 0;
    std::vector<int32_t> local_slots;
    std::vector<float> out;
  };
  std::vector<Job> jobs;
  Ticket next_ticket = 1;

  // Reusable buffers.
  std::vector<float> rows_f32;        // gathered hidden rows of one request
  std::vector<int64_t> owner_pairs;   // pairs per worker
  std::vector<int> assign;            // per (token, rank) slot: the worker computing it, or kLocal
  std::vector<int> tok_pairs;         // pairs of the current token per worker (replica balance)
  std::vector<int> req_of_worker;
  std::vector<float> xl, lw;          // local expanded rows, unit weights
  std::vector<int32_t> lids;
  RoutingPlan local_plan;
  std::vector<const float*> slot_src;
  std::vector<uint8_t> has;

  wire::WireDType hidden_dtype(size_t w, int layer) const {
    if (opts.hidden_wire != wire::WireDType::kQ8) return opts.hidden_wire;
    const wire::Session& ses = links[w]->session;
    const std::vector<uint8_t>& act = ses.peer.layer_act;
    const bool q8k = (ses.dtypes & (1u << static_cast<int>(wire::WireDType::kQ8K))) != 0 && layer >= 0 &&
                     static_cast<size_t>(layer) < act.size() &&
                     act[static_cast<size_t>(layer)] == static_cast<uint8_t>(wire::WireDType::kQ8K);
    return q8k ? wire::WireDType::kQ8K : wire::WireDType::kQ8;
  }
  std::string where(const Job& j, const Request& r) const {
    return fmt::format("worker {}, layer {}, request {}", links[r.worker]->label, j.layer, r.msg.request_id);
  }
  void split_and_send(Job& job);
  void cancel_all(Job& job);
  Status run_local(Job& job, std::span<const float>* y);
  Status gather(Job& job);
  void combine(Job& job, std::span<const float> ylocal);
};

RemoteExecutor::RemoteExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RemoteExecutor::~RemoteExecutor() = default;

Result<std::unique_ptr<RemoteExecutor>> RemoteExecutor::connect(const Model& model,
                                                                const std::vector<WorkerAddress>& workers,
                                                                const RemoteOptions& opts) {
  if (workers.empty()) return make_error(StatusCode::kInvalidArgument, "remote executor: no workers given");
  auto impl = std::make_unique<Impl>();
  impl->model = &model;
  impl->opts = opts;
  const HParams& hp = model.hparams();
  impl->n_embd = hp.n_embd;
  impl->n_expert = hp.n_expert;
  impl->local_weights = model.expert_weights();
  impl->local = std::make_unique<LocalExecutor>(impl->local_weights, nullptr);

  MOESH_ASSIGN_OR_RETURN(wire::Hello hello, backbone_hello(model, opts));
  MOESH_ASSIGN_OR_RETURN(swarm::ModelShape shape, swarm::model_shape(model.file()));
  if (shape.n_embd != hp.n_embd || shape.n_layer != hp.n_layer || shape.n_expert != hp.n_expert) {
    return make_error(StatusCode::kInternal, "remote executor: model shape disagrees with its hparams");
  }

  PlacementInput pin;
  pin.n_layer = static_cast<int>(hp.n_layer);
  pin.n_expert = static_cast<int>(hp.n_expert);
  for (const LayerWeights& lw : model.layers) {
    pin.moe_layer.push_back(lw.is_moe);
    pin.local_layer.push_back(lw.is_moe && lw.experts.valid());
  }
  for (const WorkerAddress& a : workers) {
    auto link = connect_worker(a, hello, opts);
    if (!link) return link.status();
    auto held = swarm::expert_set_from_ranges((*link)->session.peer.experts, shape);
    if (!held) return held.status().with_context("worker " + (*link)->label + " announces");
    pin.worker_experts.push_back(held->ranges);
    pin.worker_names.push_back((*link)->label);
    impl->links.push_back(std::move(*link));
  }
  auto placement = build_placement(pin);
  if (!placement) return placement.status().with_context("placement");
  impl->placement = std::move(*placement);
  impl->req_of_worker.assign(impl->links.size(), -1);
  impl->owner_pairs.assign(impl->links.size(), 0);
  impl->workers.resize(impl->links.size());
  for (size_t i = 0; i < impl->links.size(); ++i) impl->workers[i].label = impl->links[i]->label;
  return std::unique_ptr<RemoteExecutor>(new RemoteExecutor(std::move(impl)));
}

void RemoteExecutor::set_pool(ThreadPool* pool) {
  impl_->pool = pool;
  impl_->local = std::make_unique<LocalExecutor>(impl_->local_weights, pool);
}

const Placement& RemoteExecutor::placement() const { return impl_->placement; }
size_t RemoteExecutor::n_workers() const { return impl_->links.size(); }
const WorkerLink& RemoteExecutor::worker(size_t i) const { return *impl_->links.at(i); }
const RemoteOptions& RemoteExecutor::options() const { return impl_->opts; }

wire::WireDType RemoteExecutor::hidden_dtype(size_t w, int layer) const {
  return impl_->hidden_dtype(w, layer);
}

bool RemoteExecutor::hidden_is_exact() const {
  const Impl& m = *impl_;
  if (m.opts.hidden_wire == wire::WireDType::kF32) return true;
  if (m.opts.hidden_wire != wire::WireDType::kQ8 && m.opts.hidden_wire != wire::WireDType::kQ8K) return false;
  for (int l = 0; l < m.placement.n_layer(); ++l) {
    for (int e = 0; e < m.placement.n_expert(); ++e) {
      if (m.placement.owner(l, e) < 0) continue;
      for (uint64_t h = m.placement.holders(l, e); h != 0; h &= h - 1) {
        const int o = std::countr_zero(h);
        const std::vector<uint8_t>& act = m.links[static_cast<size_t>(o)]->session.peer.layer_act;
        if (static_cast<size_t>(l) >= act.size() || act[l] != static_cast<uint8_t>(m.hidden_dtype(o, l))) return false;
      }
    }
  }
  return true;
}
RemoteTraffic RemoteExecutor::traffic() const { return impl_->traffic; }
void RemoteExecutor::reset_traffic() { impl_->traffic = RemoteTraffic{}; }
std::vector<WorkerTraffic> RemoteExecutor::worker_traffic() const {
  std::lock_guard<std::mutex> lk(impl_->worker_mu);
  return impl_->workers;
}

std::string RemoteExecutor::describe() const {
  const Impl& m = *impl_;
  // "wire q8/f16": hidden/return; one name when both directions agree.
  const std::string wire = m.opts.hidden_wire == m.opts.return_wire
                               ? std::string(wire::wire_dtype_name(m.opts.hidden_wire))
                               : fmt::format("{}/{}", wire::wire_dtype_name(m.opts.hidden_wire),
                                             wire::wire_dtype_name(m.opts.return_wire));
  std::string s = fmt::format("remote dispatch: wire {}, combine {}, timeout {} ms, {} worker(s)\n", wire,
                              wire::combine_mode_name(m.opts.combine),
                              m.opts.timeout.count(), m.links.size());
  for (size_t i = 0; i < m.links.size(); ++i) {
    const int64_t replicas = m.placement.count_replicas(static_cast<int>(i));
    s += fmt::format("  worker {} {}: warm-up rtt {:.3f} ms, {} experts placed ({}){}\n", i, m.links[i]->label,
                     std::chrono::duration<double, std::milli>(m.links[i]->warmup_rtt).count(),
                     m.placement.count(static_cast<int>(i)), m.placement.describe(static_cast<int>(i)),
                     replicas > 0 ? fmt::format(", plus {} replicas of other workers' experts", replicas) : "");
  }
  s += fmt::format("  local: {} experts ({})\n", m.placement.count(Placement::kLocal),
                   m.placement.describe(Placement::kLocal));
  return s;
}

// ---- submit ------------------------------------------------------------------------------------

Ticket RemoteExecutor::submit(int layer, const float* x, int64_t n_tokens, const RoutingPlan& plan) {
  Impl& m = *impl_;
  Impl::Job* job = &start_job(m.jobs, &m.next_ticket, layer, x, n_tokens, plan);
  job->deadline = net::deadline_in(m.opts.timeout);
  job->error = Status::ok();
  job->n_reqs = 0;
  job->local_slots.clear();
  m.split_and_send(*job);
  return job->ticket;
}

void RemoteExecutor::Impl::split_and_send(Job& job) {
  const RoutingPlan& plan = *job.plan;
  const int k = plan.k;
  const int64_t n_tok = job.n_tokens;
  if (job.layer < 0 || job.layer >= placement.n_layer() || plan.n_tokens != n_tok || k < 1 ||
      k > static_cast<int>(wire::kMaxPairsPerToken)) {
    job.error = make_error(StatusCode::kInvalidArgument,
                           "remote executor: bad dispatch (layer {}, {} tokens, plan of {} tokens, k {})",
                           job.layer, n_tok, plan.n_tokens, k);
    return;
  }
  // Pass 1: who computes each pair. An expert held by several workers (replicas) goes to the
  // holder with the fewest of this token's pairs so far (ties: lowest index), so a token's
  // experts spread evenly over replicas. The choice depends only on the token's own routing,
  // never on the other tokens of the batch. Requests are created in worker order, so PARTIAL
  // sums are added in a fixed order whatever the routing.
  std::fill(owner_pairs.begin(), owner_pairs.end(), 0);
  assign.resize(static_cast<size_t>(n_tok * k));
  tok_pairs.assign(links.size(), 0);
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int rk = 0; rk < k; ++rk) {
      const int64_t s = t * k + rk;
      const int32_t e = plan.ids[s];
      int o = e >= 0 && e < n_expert ? placement.owner(job.layer, e) : Placement::kNone;
      if (o == Placement::kNone) {
        job.error = make_error(StatusCode::kInvalidArgument,
                               "remote executor: layer {} expert {} has no owner (dense layer or bad id)",
                               job.layer, e);
        return;
      }
      if (o >= 0) {
        for (uint64_t h = placement.holders(job.layer, e); h != 0; h &= h - 1) {
          const int w = std::countr_zero(h);
          if (tok_pairs[w] < tok_pairs[o]) o = w;
        }
      }
      assign[s] = o;
      if (o == Placement::kLocal) {
        job.local_slots.push_back(static_cast<int32_t>(s));
      } else {
        ++owner_pairs[o];
        ++tok_pairs[o];
      }
    }
    for (int rk = 0; rk < k; ++rk) {
      const int o = assign[t * k + rk];
      if (o >= 0) tok_pairs[o] = 0;
    }
  }
  for (size_t w = 0; w < links.size(); ++w) {
    req_of_worker[w] = -1;
    if (owner_pairs[w] == 0) continue;
    if (job.reqs.size() <= job.n_reqs) job.reqs.emplace_back();
    Request& r = job.reqs[job.n_reqs];
    req_of_worker[w] = static_cast<int>(job.n_reqs++);
    r.worker = static_cast<int>(w);
    r.started = false;
    r.tokens.clear();
    r.slots.clear();
    r.msg.pair_counts.clear();
    r.msg.pairs.clear();
  }
  // Pass 2: per worker, its tokens and (expert, rank, weight) pairs in rank order.
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int rk = 0; rk < k; ++rk) {
      const int64_t s = t * k + rk;
      const int o = assign[s];
      if (o < 0) continue;
      Request& r = job.reqs[req_of_worker[o]];
      if (r.tokens.empty() || r.tokens.back() != t) {
        r.tokens.push_back(static_cast<int32_t>(t));
        r.msg.pair_counts.push_back(0);
      }
      ++r.msg.pair_counts.back();
      r.msg.pairs.push_back(wire::ExpertPair{static_cast<uint16_t>(plan.ids[s]), static_cast<uint8_t>(rk),
                                             plan.weights[s]});
      r.slots.push_back(static_cast<int32_t>(s));
    }
  }
  traffic.local_pairs += job.local_slots.size();
  if (job.n_reqs == 0) return;
  ++traffic.layer_calls;
  traffic.token_layers += static_cast<uint64_t>(n_tok);
  // Star fan-out: every request leaves before any reply is awaited.
  for (size_t i = 0; i < job.n_reqs; ++i) {
    Request& r = job.reqs[i];
    WorkerLink& link = *links[r.worker];
    const size_t nt = r.tokens.size();
    rows_f32.resize(nt * static_cast<size_t>(n_embd));
    for (size_t j = 0; j < nt; ++j) {
      std::copy_n(job.x + static_cast<int64_t>(r.tokens[j]) * n_embd, n_embd, rows_f32.data() + j * n_embd);
    }
    auto rows = wire::encode_rows(hidden_dtype(static_cast<size_t>(r.worker), job.layer), rows_f32.data(), static_cast<uint32_t>(nt),
                                  static_cast<uint32_t>(n_embd));
    r.msg.request_id = link.mux->next_request_id();
    if (!rows) {
      job.error = rows.status().with_context(where(job, r) + ": encoding hidden rows");
      return;
    }
    r.msg.hidden = std::move(*rows);
    r.msg.layer = static_cast<uint32_t>(job.layer);
    r.msg.mode = opts.combine;
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
    Status st = link.mux->start(r.msg.request_id, *frame, job.deadline);
    if (!st.is_ok()) {
      note_error(r.worker);
      job.error = st.with_context(where(job, r) + ": sending DISPATCH");
      return;
    }
    r.started = true;
    r.sent_at = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lk(worker_mu);
      ++workers[r.worker].requests;
      workers[r.worker].bytes_sent += frame->size();
    }
    ++traffic.dispatch_frames;
    traffic.dispatch_bytes += frame->size();
    traffic.remote_pairs += r.msg.pairs.size();
  }
}

// ---- wait --------------------------------------------------------------------------------------

void RemoteExecutor::Impl::cancel_all(Job& job) {
  for (size_t i = 0; i < job.n_reqs; ++i) {
    Request& r = job.reqs[i];
    if (r.started) links[r.worker]->mux->cancel(r.msg.request_id);
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
    lids[i] = plan.ids[s];
  }
  MOESH_RETURN_IF_ERROR(make_plan(job.layer, lids.data(), lw.data(), static_cast<int64_t>(n), 1, n_expert,
                                  &local_plan));
  const Ticket t = local->submit(job.layer, xl.data(), static_cast<int64_t>(n), local_plan);
  auto res = local->wait(t);
  if (!res) return res.status().with_context(fmt::format("backbone experts of layer {}", job.layer));
  *y = *res;
  return Status::ok();
}

Status RemoteExecutor::Impl::gather(Job& job) {
  for (size_t i = 0; i < job.n_reqs; ++i) {
    Request& r = job.reqs[i];
    WorkerLink& link = *links[r.worker];
    auto frame = link.mux->wait(r.msg.request_id, job.deadline);
    r.started = false;
    if (!frame) {
      note_error(r.worker);
      return frame.status().with_context(where(job, r));
    }
    traffic.combine_bytes += wire::kHeaderBytes + frame->payload.size();
    ++traffic.combine_frames;
    {
      // Latency as seen by the backbone: DISPATCH sent -> COMBINE in hand (gathered in worker
      // order, so a later worker's figure includes waiting on the earlier ones).
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.sent_at).count();
      const auto& bounds = WorkerTraffic::kLatencyBounds;
      const size_t b = static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), sec) - bounds.begin());
      std::lock_guard<std::mutex> lk(worker_mu);
      WorkerTraffic& wt = workers[r.worker];
      wt.bytes_received += wire::kHeaderBytes + frame->payload.size();
      ++wt.latency_counts[b];
      wt.latency_sum_seconds += sec;
    }
    auto reply = wire::decode_combine(*frame, link.limits);
    if (!reply) {
      note_error(r.worker);
      return reply.status().with_context(where(job, r) + ": COMBINE");
    }
    reply->request_id = frame->request_id();
    {
      std::lock_guard<std::mutex> lk(worker_mu);
      workers[r.worker].compute_sum_seconds += reply->compute_us * 1e-6;
    }
    Status st = wire::check_combine_matches(r.msg, *reply);
    if (!st.is_ok()) {
      note_error(r.worker);
      return st.with_context(where(job, r) + ": COMBINE does not answer the DISPATCH");
    }
    r.rows.resize(static_cast<size_t>(reply->rows.n_rows) * static_cast<size_t>(n_embd));
    wire::decode_rows(reply->rows, r.rows.data());
  }
  return Status::ok();
}

namespace {

template <typename F>
void for_tokens(ThreadPool* pool, int64_t n, const F& fn) {
  auto body = [&fn](int64_t a, int64_t b, int) {
    for (int64_t i = a; i < b; ++i) fn(i);
  };
  if (pool != nullptr && n > 1) pool->parallel_for(n, body);
  else body(0, n, 0);
}

}  // namespace

void RemoteExecutor::Impl::combine(Job& job, std::span<const float> ylocal) {
  const RoutingPlan& plan = *job.plan;
  const int k = plan.k;
  const int64_t n_tok = job.n_tokens;
  const int64_t D = n_embd;
  job.out.resize(static_cast<size_t>(n_tok * D));
  if (opts.combine == wire::CombineMode::kExact) {
    // Every (token, rank) slot's raw output, wherever it was computed.
    slot_src.assign(static_cast<size_t>(n_tok * k), nullptr);
    for (size_t i = 0; i < job.local_slots.size(); ++i) slot_src[job.local_slots[i]] = ylocal.data() + i * D;
    for (size_t q = 0; q < job.n_reqs; ++q) {
      const Request& r = job.reqs[q];
      for (size_t j = 0; j < r.slots.size(); ++j) slot_src[r.slots[j]] = r.rows.data() + j * D;
    }
    // LocalExecutor's stage D, operation for operation: out = y0*w0; out = out + yr*wr.
    for_tokens(pool, n_tok, [&](int64_t t) {
      float* o = job.out.data() + t * D;
      const float* wt = plan.weights.data() + t * k;
      for (int rk = 0; rk < k; ++rk) rank_sum_step(o, slot_src[t * k + rk], wt[rk], D, rk == 0);
    });
    return;
  }
  // PARTIAL: the backbone's own partial (Σ w·y over its pairs in rank order) first, then each
  // worker's partial in worker order.
  has.assign(static_cast<size_t>(n_tok), 0);
  for (size_t i = 0; i < job.local_slots.size(); ++i) {
    const int32_t s = job.local_slots[i];
    const int64_t t = s / k;
    const float wv = plan.weights[s];
    const float* y = ylocal.data() + i * D;
    float* o = job.out.data() + t * D;
    rank_sum_step(o, y, wv, D, !has[t]);
    has[t] = 1;
  }
  for (size_t q = 0; q < job.n_reqs; ++q) {
    const Request& r = job.reqs[q];
    for (size_t j = 0; j < r.tokens.size(); ++j) {
      const int64_t t = r.tokens[j];
      const float* p = r.rows.data() + j * D;
      float* o = job.out.data() + t * D;
      if (!has[t]) {
        std::copy_n(p, D, o);
        has[t] = 1;
      } else {
        for (int64_t d = 0; d < D; ++d) o[d] = o[d] + p[d];
      }
    }
  }
}

Result<std::span<const float>> RemoteExecutor::wait(Ticket t) {
  Impl& m = *impl_;
  Impl::Job* job = finish_job(m.jobs, t);
  if (job == nullptr) return make_error(StatusCode::kInvalidArgument, "remote executor: unknown ticket {}", t);
  if (!job->error.is_ok()) {
    m.cancel_all(*job);
    return job->error;
  }
  // The backbone's share runs while the workers compute theirs.
  std::span<const float> ylocal;
  Status st = m.run_local(*job, &ylocal);
  if (st.is_ok()) st = m.gather(*job);
  if (!st.is_ok()) {
    m.cancel_all(*job);
    return st;
  }
  m.combine(*job, ylocal);
  return std::span<const float>(job->out.data(), job->out.size());
}

}  // namespace moesh
