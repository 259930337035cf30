// RemoteExecutor's state, shared by its translation units: remote_executor.cpp (submit, wait,
// failover, joins, hot experts) and remote_verify.cpp (--verify-rate). Not a public header.
#pragma once

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <future>
#include <mutex>
#include <random>
#include <set>
#include <tuple>

#include "moesh/moe/expert_stages.h"
#include "moesh/remote/combiner.h"
#include "moesh/remote/fanout.h"
#include "moesh/remote/local_experts.h"
#include "moesh/remote/remote.h"
#include "moesh/remote/trip_planner.h"
#include "moesh/swarm/swarm.h"

namespace moesh {

struct RemoteExecutor::Impl {
  const Model* model = nullptr;
  RemoteOptions opts;
  std::unique_ptr<FanOut> fan;
  Planner planner;
  std::unique_ptr<LocalExperts> mine;  // what the backbone can compute itself
  std::unique_ptr<LocalExecutor> local;
  ThreadPool* pool = nullptr;
  int64_t n_embd = 0;
  int64_t n_expert = 0;
  RemoteTraffic traffic;
  // Activations: [layer * n_expert + expert] pairs routed, and tokens per layer.
  std::vector<uint64_t> act, act_tokens;
  int last_layer = INT_MAX;    // the layer of the last submit (a lower or equal one starts a pass)
  uint64_t next_hot_plan = 0;  // tokens at a pass's first layer when the hot set is chosen next
  HotExpertReport hot;
  // request_experts: asked (under worker_mu), carried out between calls by take_expert_requests.
  struct ExpertRequest {
    std::string worker;
    std::vector<wire::ExpertRange> ranges;
    int waited = 0;     // calls waited for the worker to answer
    bool drop = false;  // drop_experts: let go of these replicas instead
  };
  std::vector<ExpertRequest> expert_asks;
  ExpertRequestReport expert_report;  // under worker_mu
  void take_expert_requests();
  // Per-worker counters: written by the executor's thread, read by monitoring threads.
  mutable std::mutex worker_mu;
  std::vector<WorkerTraffic> workers;
  // Per worker, the fastest DISPATCH -> COMBINE trip seen (0: none yet): the planner's cost. The
  // minimum is the path's latency without queueing; a mean follows every load spike of the host.
  std::vector<double> min_latency;
  // Stragglers: per worker its last trips, whose median (when it exceeds the minimum) becomes its
  // cost, so a worker that turns slow is taken off the hot path while a near replica (or the
  // backbone's copy) can do its work; see check_stragglers.
  struct RecentTrips {
    static constexpr size_t kN = 16;
    std::array<double, kN> sec{};
    size_t n = 0, next = 0;
    uint64_t total = 0;  // samples ever: whether new ones came since the last check
    void add(double v) {
      sec[next] = v;
      next = (next + 1) % kN;
      n = std::min(n + 1, kN);
      ++total;
    }
    double median() const {
      std::array<double, kN> c = sec;
      std::nth_element(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(n / 2),
                       c.begin() + static_cast<std::ptrdiff_t>(n));
      return c[n / 2];
    }
  };
  std::vector<RecentTrips> recent;
  std::vector<uint64_t> recent_seen;  // RecentTrips::total at the last check
  std::vector<int> idle_checks;       // checks in a row without a new trip (a demoted worker)
  // Per worker never given a trip: the RTT of its latest idle probe PING (0: none). Its cost
  // until then is one padded warm-up ping, which a loaded host can blow up; a replica judged far
  // on that alone would never be tried again (check_stragglers).
  std::vector<double> probe_rtt;
  uint64_t straggler_calls = 0;
  void note_error(int w) {
    std::lock_guard<std::mutex> lk(worker_mu);
    ++workers[w].errors;
  }

  // One DISPATCH: the tokens of a layer that have at least one pair on one worker.
  struct Request {
    int worker = 0;
    bool started = false;
    bool failed = false;  // its COMBINE never came right: its pairs were re-planned (or the call failed)
    std::chrono::steady_clock::time_point sent_at;
    wire::DispatchMsg msg;        // hidden.bytes dropped once encoded (shape kept for checks)
    std::vector<int32_t> tokens;  // batch index of each dispatched token
    std::vector<int32_t> slots;   // token*k + rank of each pair, in pair order
    std::vector<float> rows;      // decoded COMBINE rows
    Status error;                 // why it failed (failed)
    // An EXACT call's request whose every token carries ranks 0..j of that token: sent as PARTIAL,
    // so the worker answers one rank-order sum per token (the bits the backbone's own sum has after
    // rank j) instead of j+1 raw rows (RemoteOptions::exact_prefix_sums).
    bool prefix_sums = false;
  };
  struct Job : SubmittedJob {
    net::Deadline deadline;
    Status error;            // a failure found by submit() that no failover can mend, reported by wait()
    Status send_error;       // the first DISPATCH that could not be sent (its pairs fail over)
    int failed_worker = -1;  // the worker a DISPATCH could not be sent to
    // For the hidden-trip counters: submit() returned, first DISPATCH sent, last COMBINE filed.
    std::chrono::steady_clock::time_point submitted, first_sent, last_arrival;
    std::vector<Request> reqs;  // reused; the first n_reqs are this job's
    size_t n_reqs = 0;
    std::vector<int32_t> local_slots;
    std::vector<int32_t> assign;     // per (token, rank) slot: who computes it (re-planned on failover)
    std::vector<float> ylocal_kept;  // the backbone's share, kept while verification reuses the local executor
    std::vector<float> out;
  };
  std::vector<Job> jobs;
  Ticket next_ticket = 1;
  std::vector<size_t> failed_workers;  // of the last wait()

  // Failover (RemoteOptions::failover): per worker, whether it is down (left out of planning),
  // when it is re-dialled next, the backoff, and a re-dial in flight.
  struct Health {
    bool down = false;
    bool manual = false;   // set_excluded by the caller: never re-included by a rejoin
    bool evicted = false;  // failed verification: never re-dialled
    std::chrono::steady_clock::time_point retry_at;
    std::chrono::milliseconds backoff{0};
    std::future<Result<std::unique_ptr<WorkerLink>>> redial;
    // Path policy while up: a worker on a fallback path (relayed when direct is preferred) has its
    // preferred paths tried again every RemoteOptions::path_recheck; one that works replaces the
    // link between calls.
    std::future<Result<std::unique_ptr<WorkerLink>>> upgrade;
    std::chrono::steady_clock::time_point upgrade_at;
  };
  std::vector<Health> health;
  // Per worker: (replica bytes, budget) from its latest STORED ({0, 0}: none since it connected).
  // Under worker_mu.
  std::vector<std::pair<uint64_t, uint64_t>> replica_use;
  std::vector<std::vector<wire::ExpertRange>> announced;  // each worker's experts at connect
  wire::Hello hello;
  RemoteExecutor::FailoverStats fo;
  std::vector<uint8_t> replan_mask;
  std::mt19937_64 verify_rng;
  std::vector<float> verify_rows;
  // Recomputes request q of the job here and compares; a mismatch evicts its worker and marks
  // the request failed (failover then recomputes its pairs). Returns the mismatch, or ok.
  Status verify(Job& job, size_t q);
  Status verify_on_replica(Job& job, size_t q);
  // Up workers other than r's (and `skip`) holding every expert of r, for a second opinion.
  std::vector<int> checkers(const Job& job, const Request& r, int skip) const;
  // Sends r's pairs and rows to worker c and returns its result rows (counted in c's traffic).
  Result<std::vector<float>> recompute_on(Job& job, const Request& r, int c);
  double verify_tolerance_for(int w, int layer) const;
  void evict(Job& job, int w, const std::string& why);
  void mark_down(int w);
  void start_redials(bool wait);
  // Path policy while connected (Health::upgrade); between calls only.
  void check_paths(bool wait);
  // Joined workers (RemoteOptions::registry): new names are added, fresh connections of known
  // ones replace the old. Between calls only.
  void adopt_joined();
  Status add_worker(std::unique_ptr<WorkerLink> link);
  // Dialled workers that did not answer at connect (failover on, the others and the backbone's
  // copies holding every expert): re-dialled with the rejoin backoff and added (add_worker)
  // once they answer. Between calls only.
  struct Late {
    WorkerAddress address;
    Status last;  // why the latest dial failed
    std::chrono::steady_clock::time_point retry_at;
    std::chrono::milliseconds backoff{0};
    uint64_t attempts = 0;
    std::future<Result<std::unique_ptr<WorkerLink>>> dial;
  };
  std::vector<Late> late;
  std::vector<RemoteExecutor::LateWorker> late_view;  // a copy for other threads; under worker_mu
  std::vector<WorkerAddress> dial_requests;           // dial_worker's, taken by dial_late; under worker_mu
  void dial_late(bool wait);
  void publish_late();
  PlacementInput pin;  // what the placement was built from (extended as workers join)
  Status recover(Job& job, const Status& why);

  // Reusable buffers.
  std::vector<float> rows_f32;       // gathered hidden rows of one request
  std::vector<int64_t> owner_pairs;  // pairs per worker
  std::vector<int> req_of_worker;
  std::vector<FanOut::Outstanding> outstanding;
  std::vector<size_t> req_index;  // outstanding[i] is job.reqs[req_index[i]] (gather)
  std::vector<PartialRows> partials;
  std::vector<float> xl, lw;  // local expanded rows, unit weights
  std::vector<int32_t> lids;
  RoutingPlan local_plan;
  std::vector<const float*> slot_src;
  std::vector<const float*> prefix_src;  // combine_exact's rank-prefix sums per token
  std::vector<uint8_t> prefix_len;
  std::vector<uint8_t> seen;

  wire::WireDType hidden_dtype(size_t w, int layer) const {
    if (opts.hidden_wire != wire::WireDType::kQ8) return opts.hidden_wire;
    const wire::Session& ses = fan->link(w).session;
    const std::vector<uint8_t>& act = ses.peer.layer_act;
    const bool q8k = (ses.dtypes & (1u << static_cast<int>(wire::WireDType::kQ8K))) != 0 && layer >= 0 &&
                     static_cast<size_t>(layer) < act.size() &&
                     act[static_cast<size_t>(layer)] == static_cast<uint8_t>(wire::WireDType::kQ8K);
    return q8k ? wire::WireDType::kQ8K : wire::WireDType::kQ8;
  }
  // RemoteOptions::exact_prefix_sums: EXACT with f32 returns, and each token's pairs in `r` are
  // its ranks 0, 1, ..., j in order, so the worker's rank-order sum is the backbone's own partial
  // sum after rank j (with any other return dtype the sum would be rounded once instead of each
  // row: other bits).
  bool use_prefix_sums(const Request& r) const {
    if (!opts.exact_prefix_sums || opts.combine != wire::CombineMode::kExact ||
        opts.return_wire != wire::WireDType::kF32)
      return false;
    size_t p = 0;
    for (uint8_t n : r.msg.pair_counts) {
      for (uint8_t j = 0; j < n; ++j, ++p) {
        if (r.msg.pairs[p].rank != j) return false;
      }
    }
    return p == r.msg.pairs.size();
  }
  std::string where(const Job& j, const Request& r) const {
    return fmt::format("worker {}, layer {}, request {}", fan->link(r.worker).label, j.layer, r.msg.request_id);
  }
  void split_and_send(Job& job);
  // Requests for the slots of job.assign given to workers (only those with mask[slot] != 0 when
  // a mask is given), appended after the job's first n_reqs; then sent (star fan-out).
  void add_requests(Job& job, const std::vector<uint8_t>* mask);
  void send_requests(Job& job, size_t first);
  Status plan_hot();
  // One request to worker w and its answer (FETCH, STORE: outside layer calls, nothing else of
  // this executor in flight), with a deadline fit for a slab.
  Result<wire::Frame> ask_one(size_t w, uint64_t id, const std::vector<uint8_t>& frame);
  Result<wire::SlabMsg> fetch(size_t w, int layer, int expert);
  // RemoteOptions::replicate_hot: sends the hottest under-replicated experts to workers.
  void replicate_hot();
  // RemoteOptions::rebalance: moves experts to nearer workers where that saves expected trip
  // latency (trip_planner.h, the target's trip cost as the chosen holder's).
  void rebalance();
  // The trip planner's problem from the activations counted and the costs measured: each expert
  // at its nearest live holder; a size unknown here is over `budget` (never chosen).
  TripProblem trip_problem(const Placement& cur, const std::vector<double>& costs, uint64_t budget) const;
  // The live holder of (l, e) with the lowest cost other than `except`; -1: none.
  int32_t nearest_live_holder(const Placement& pl, int l, int e, const std::vector<double>& costs,
                              int32_t except = -1) const;
  // Replica bytes worker w may still take (its latest STORED, else its INFO); 0: none.
  uint64_t replica_room(size_t w) const;
  // Copies (l, e) to worker `target` (STORE): the backbone's own copy, else one FETCHed from the
  // nearest other live holder and checked against the model's slab hashes first. Then `target` is
  // a holder in *next and announces it from now on. Returns the slab bytes sent.
  Result<uint64_t> place_replica(int l, int e, int32_t target, const std::vector<double>& costs, Placement* next);
  // A worker that comes back (re-dial or join) may announce fewer experts than it had (replicas it
  // let go of) when each of those has another live holder or a copy here: it leaves the placement
  // for them; experts it announces beyond that (replicas kept on its disk) are added. Error: why not.
  Status take_announced(size_t w, const swarm::ExpertSet& held);
  // Worker w no longer holds layer l expert e (it said NOT_HELD, or let go of it): out of the
  // placement and of what it announced; it stays up for the rest.
  void forget_held(size_t w, int l, int e);
  // Sends `slab` to worker w (STORE) and waits for its STORED.
  Result<wire::StoredMsg> store_on(size_t w, wire::SlabMsg slab);
  // Asks worker w to let go of its replica of (l, e) (UNSTORE) and waits for its UNSTORED.
  Result<wire::StoredMsg> unstore_on(size_t w, int l, int e);
  // drop_experts carried out for worker w: each expert another live holder (or the backbone's
  // copy) can compute leaves the placement, then the worker is told (counted in *dropped). Those
  // it is the only holder of are listed in *only_holder, left as they are. An error for a failed
  // UNSTORE (what was dropped before it stays dropped), or UNSUPPORTED for an expert of the
  // worker's own file (it is kept, counted, and never asked for again).
  Status drop_replicas(int32_t w, const std::vector<wire::ExpertRange>& ranges, uint64_t* dropped,
                       std::vector<wire::ExpertRange>* only_holder);
  // (worker, layer, expert) a worker refused to let go of: its own file's (executor thread only).
  std::set<std::tuple<size_t, int, int>> own_experts;
  std::vector<double> worker_costs() const;
  void check_stragglers();
  // One small PING to worker w: its round trip in seconds, or why not.
  Result<double> probe(size_t w);
  void cancel_all(Job& job);
  Status run_local(Job& job, std::span<const float>* y);
  Status gather(Job& job, size_t first);
  void combine(Job& job, std::span<const float> ylocal);
};

}  // namespace moesh
