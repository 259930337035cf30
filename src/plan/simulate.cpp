// The swarm simulator (simulate.h): an event queue, FIFO servers for CPUs and link directions,
// and the backbone's decode step written as continuations.
#include "moesh/plan/simulate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <queue>
#include <random>

namespace moesh {
namespace {

constexpr uint64_t kHeaderBytes = 64;  // framing of one DISPATCH/COMBINE/SPAN message

class Sim {
 public:
  Sim(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& po, const SwarmPlan& plan,
      const SimOptions& so)
      : m_(m), peers_(peers), po_(po), plan_(plan), so_(so), rng_(so.seed) {
    const size_t P = peers.size();
    peer_cpu_.assign(P, 0.0);
    up_busy_.assign(P, 0.0);
    down_busy_.assign(P, 0.0);
    up_last_.assign(P, 0.0);
    down_last_.assign(P, 0.0);
    fail_at_.assign(P, INFINITY);
    known_dead_.assign(P, false);
    span_here_.assign(P, false);
    runner_.resize(P);
    for (size_t i = 0; i < P; ++i) runner_[i] = static_cast<int>(i);
    standby_.assign(P, {});
    lanes_.assign(P, {});
    lane_dead_.assign(P, false);
    for (size_t i = 0; i < P; ++i) {
      const int h = plan.roles[i].lane_of;
      if (plan.roles[i].kind == RoleKind::kSpan && h >= 0 && static_cast<size_t>(h) < P)
        lanes_[static_cast<size_t>(h)].push_back(static_cast<int>(i));
    }
    for (const Standby& sb : plan.standbys)
      if (sb.primary >= 0 && static_cast<size_t>(sb.primary) < P)
        standby_[static_cast<size_t>(sb.primary)].push_back(sb.peer);
    res_.peer_busy_s.assign(P, 0.0);
    for (const SimFailure& f : so.failures) fail_at_[static_cast<size_t>(f.peer)] = std::min(fail_at_[f.peer], f.at_s);
    owner_.assign(static_cast<size_t>(m.n_layer()), std::vector<int>(static_cast<size_t>(m.n_expert), -1));
    for (size_t i = 0; i < P; ++i)
      for (const ExpertSlice& s : plan.roles[i].experts)
        for (int e = s.first; e <= s.last; ++e) owner_[s.layer][e] = static_cast<int>(i);
    order_.resize(static_cast<size_t>(m.n_expert));
  }

  SimResult run() {
    rows_ = static_cast<int64_t>(so_.streams) * so_.prompt_rows;
    start_step();
    while (!q_.empty()) {
      Event ev = q_.top();
      q_.pop();
      now_ = ev.t;
      ev.fn();
    }
    // Pending timeouts of answered messages run after the last step: the run ends at its end.
    res_.seconds = end_;
    res_.steps = static_cast<int>(step_times_.size());
    res_.tokens_per_s = end_ > 0 ? res_.tokens / end_ : 0;
    if (!step_times_.empty()) {
      std::vector<double> s = step_times_;
      std::sort(s.begin(), s.end());
      res_.step_mean_s = std::accumulate(s.begin(), s.end(), 0.0) / s.size();
      res_.step_p50_s = s[s.size() / 2];
      res_.step_p99_s = s[std::min(s.size() - 1, static_cast<size_t>(std::ceil(0.99 * s.size())) - 1)];
      res_.trips_per_step = static_cast<double>(trips_) / s.size();
    }
    return res_;
  }

 private:
  struct Event {
    double t;
    uint64_t seq;
    std::function<void()> fn;
    bool operator<(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  void at(double t, std::function<void()> fn) { q_.push({t, seq_++, std::move(fn)}); }

  // A FIFO server: work of `dur` seconds queued at `busy`; `done` runs when it finishes.
  void serve(double* busy, double dur, std::function<void(double)> done) {
    const double start = std::max(now_, *busy);
    *busy = start + dur;
    const double end = *busy;
    at(end, [done = std::move(done), end] { done(end); });
  }
  void backbone_compute(double dur, std::function<void()> done) {
    res_.backbone_busy_s += dur;
    serve(&bb_cpu_, dur, [done = std::move(done)](double) { done(); });
  }

  // A message over peer p's link (up: backbone -> peer). Arrival after serialisation, delay,
  // message cost and jitter, never before the link's previous message.
  void send(int p, bool up, uint64_t bytes, std::function<void()> arrive) {
    const PlanPeer& pr = peers_[static_cast<size_t>(p)];
    double& busy = up ? up_busy_[p] : down_busy_[p];
    double& last = up ? up_last_[p] : down_last_[p];
    const double ser = pr.rate_bps > 0 ? bytes * 8.0 / pr.rate_bps : 0.0;
    busy = std::max(now_, busy) + ser;
    double t = busy + pr.rtt_s / 2 + po_.message_s;
    if (so_.jitter_s > 0) t += std::uniform_real_distribution<double>(0, so_.jitter_s)(rng_);
    t = std::max(t, last);
    last = t;
    res_.messages++;
    res_.bytes += bytes;
    at(t, std::move(arrive));
  }

  int tokens_per_step() const { return so_.streams * (1 + so_.draft); }

  void start_step() {
    if (static_cast<int>(step_times_.size()) >= so_.steps) return;
    step_start_ = now_;
    run_layer(0);
  }

  void run_layer(int l) {
    if (l >= m_.n_layer()) {
      backbone_compute(m_.global_s * m_.rows_cost(tokens_per_step()) / po_.backbone_speed, [this] { end_step(); });
      return;
    }
    const int h = plan_.layer_host[static_cast<size_t>(l)];
    if (h >= 0) {
      const PeerRole& r = plan_.roles[static_cast<size_t>(h)];
      const std::vector<int> chain = chain_from(h);
      if (chain.size() > 1) {
        run_chain(chain, 0);
        return;
      }
      run_span(h, r.first, r.last, [this, next = r.last + 1] { run_layer(next); });
    } else {
      backbone_layer(l, [this, l] { run_layer(l + 1); });
    }
  }

  void end_step() {
    step_times_.push_back(now_ - step_start_);
    end_ = now_;
    // Each stream keeps its verified token plus the drafts accepted before the first rejection.
    int64_t got = 0;
    std::bernoulli_distribution acc(so_.accept);
    for (int s = 0; s < so_.streams; ++s) {
      int a = 0;
      while (a < so_.draft && acc(rng_)) ++a;
      got += 1 + a;
    }
    res_.tokens += got;
    rows_ += got;
    start_step();
  }

  double span_compute_s(int first, int last, int rows) const {
    double c = 0;
    for (int l = first; l <= last; ++l) {
      const PlanLayer& L = m_.layers[static_cast<size_t>(l)];
      c += (L.dense_s + (L.moe ? m_.n_expert_used * L.expert_s : 0.0)) * m_.rows_cost(rows);
    }
    return c;
  }

  // Span p's rows to whoever runs it now (its peer, or its standby after a failover): `rows` of
  // compute, the reply to `finish`; a reply lost for the timeout fails the span over — to its
  // standby when the plan has one that is up (every row the span was sent replayed there first),
  // else to the backbone.
  void run_span(int p, int first, int last, std::function<void()> done) {
    const int T = tokens_per_step();
    // Lanes (PeerRole::lane_of) that are up share the step's streams with the span's runner, as
    // the runtime spreads them (the fewest first: whole streams, as even as they go); every part
    // is in flight at once and the step goes on when the last answers.
    std::vector<int> lanes;
    for (int l : lanes_[static_cast<size_t>(p)])
      if (!lane_dead_[static_cast<size_t>(l)]) lanes.push_back(l);
    const int n = std::min(1 + static_cast<int>(lanes.size()), so_.streams);
    if (n > 1) {
      auto left = std::make_shared<int>(n);
      auto join = std::make_shared<std::function<void()>>([left, done = std::move(done)] {
        if (--*left == 0) done();
      });
      for (int i = 0; i < n; ++i) {
        const int share = (so_.streams / n + (i < so_.streams % n ? 1 : 0)) * (1 + so_.draft);
        if (i > 0) {
          lane_trip(p, lanes[static_cast<size_t>(i - 1)], first, last, share, join);
        } else if (span_here_[static_cast<size_t>(p)]) {
          backbone_compute(span_compute_s(first, last, share) / po_.backbone_speed, [join] { (*join)(); });
        } else {
          span_trip(p, first, last, share, join, share);
        }
      }
      return;
    }
    if (span_here_[static_cast<size_t>(p)]) {
      backbone_compute(span_compute_s(first, last, T) / po_.backbone_speed, std::move(done));
      return;
    }
    span_trip(p, first, last, T, std::make_shared<std::function<void()>>(std::move(done)), T);
  }

  // Blocks first..last on peer q: `rows` sent (replays included), `out_rows` of them coming back.
  struct PeerTrip {
    int q, first, last, rows, out_rows;
  };
  // The trip's rows to its peer, its compute there and the reply to `finish`; a reply lost for the
  // timeout runs `lost` instead (once, either way).
  void peer_trip(const PeerTrip& t, std::shared_ptr<std::function<void()>> finish, std::function<void()> lost) {
    auto replied = std::make_shared<bool>(false);
    const uint64_t bytes = static_cast<uint64_t>(t.rows) * m_.hidden_bytes + kHeaderBytes;
    const uint64_t back = static_cast<uint64_t>(t.out_rows) * m_.hidden_bytes + kHeaderBytes;
    const double fail = fail_at_[static_cast<size_t>(t.q)];
    const double speed = peers_[static_cast<size_t>(t.q)].speed;
    send(t.q, true, bytes, [=, this] {
      if (now_ >= fail) return;  // lost
      const double dur = span_compute_s(t.first, t.last, t.rows) / speed;
      res_.peer_busy_s[static_cast<size_t>(t.q)] += dur;
      serve(&peer_cpu_[static_cast<size_t>(t.q)], dur, [=, this](double end) {
        if (end >= fail) return;
        send(t.q, false, back, [replied, finish] {
          if (*replied) return;
          *replied = true;
          (*finish)();
        });
      });
    });
    at(now_ + so_.timeout_s, [replied, lost = std::move(lost)] {
      if (*replied) return;
      *replied = true;
      lost();
    });
  }

  // One lane's part of span p's step (`rows` new rows) to lane peer q. Lanes' trips are in flight
  // with the runner's, so they add no network wait to the step's count. A reply lost for the
  // timeout drops the lane for good: its part goes to the span's runner (its streams' rows so far
  // replayed there first), as the runtime does.
  void lane_trip(int p, int q, int first, int last, int rows, std::shared_ptr<std::function<void()>> finish) {
    peer_trip({q, first, last, rows, rows}, finish, [=, this] {
      lane_dead_[static_cast<size_t>(q)] = true;
      res_.failovers++;
      const int T = tokens_per_step();
      const int replay = static_cast<int>(rows_ * rows / std::max(T, 1));
      res_.replayed_rows += replay;
      if (span_here_[static_cast<size_t>(p)]) {
        backbone_compute(span_compute_s(first, last, replay + rows) / po_.backbone_speed, *finish);
      } else {
        span_trip(p, first, last, replay + rows, finish, rows);
      }
    });
  }

  // `rows` sent (replays included), `out_rows` of them new: the rows that come back, and the
  // share of the span's history a failover replays.
  void span_trip(int p, int first, int last, int rows, std::shared_ptr<std::function<void()>> finish, int out_rows) {
    const int q = runner_[static_cast<size_t>(p)];
    trips_++;
    peer_trip({q, first, last, rows, out_rows}, finish, [=, this] {
      res_.failovers++;
      const int T = tokens_per_step();
      const int64_t history = rows_ * out_rows / std::max(T, 1);  // this part's streams' rows so far
      res_.replayed_rows += history;
      // The next standby in the order named that is up (one that failed before is past its
      // fail time, so a failed standby hands on to the one after it).
      for (const int sb : standby_[static_cast<size_t>(p)]) {
        if (sb == q || now_ >= fail_at_[static_cast<size_t>(sb)]) continue;
        runner_[static_cast<size_t>(p)] = sb;
        trips_--;  // the step's trip is the one to the standby
        span_trip(p, first, last, static_cast<int>(history) + out_rows, finish, out_rows);
        return;
      }
      // Fail over to the backbone: replay every row this span was sent, then this step.
      span_here_[static_cast<size_t>(p)] = true;
      backbone_compute(span_compute_s(first, last, static_cast<int>(history) + out_rows) / po_.backbone_speed, *finish);
    });
  }

  // The spans the plan chains from span peer h on (h first; just h when the next is not chained
  // after it). A chain is only taken by peers that never fail in this run: the runtime finishes a
  // broken chain star-style, which the star path below models.
  std::vector<int> chain_from(int h) const {
    std::vector<int> out{h};
    auto healthy = [&](int p) {
      return !span_here_[static_cast<size_t>(p)] && std::isinf(fail_at_[static_cast<size_t>(p)]);
    };
    if (!healthy(h)) return out;
    for (;;) {
      const int next = plan_.roles[static_cast<size_t>(out.back())].last + 1;
      if (next >= m_.n_layer()) break;
      const int h2 = plan_.layer_host[static_cast<size_t>(next)];
      if (h2 < 0 || plan_.roles[static_cast<size_t>(h2)].chained_after != out.back() || !healthy(h2)) break;
      out.push_back(h2);
    }
    return out;
  }

  // A message from span peer q straight to span peer p: half their RTT, one message cost, the
  // slower link's rate.
  void send_p2p(int q, int p, uint64_t bytes, std::function<void()> arrive) {
    const PlanPeer &a = peers_[static_cast<size_t>(q)], &b = peers_[static_cast<size_t>(p)];
    const double rate =
        a.rate_bps > 0 && b.rate_bps > 0 ? std::min(a.rate_bps, b.rate_bps) : std::max(a.rate_bps, b.rate_bps);
    double t = now_ + (rate > 0 ? bytes * 8.0 / rate : 0.0) +
               po_.peer_rtt_s[static_cast<size_t>(q)][static_cast<size_t>(p)] / 2 + po_.message_s;
    if (so_.jitter_s > 0) t += std::uniform_real_distribution<double>(0, so_.jitter_s)(rng_);
    res_.messages++;
    res_.bytes += bytes;
    at(t, std::move(arrive));
  }

  // Spans chain[i..] of one step: the head's rows come from the backbone, each next span's from
  // the peer before it, and the last returns to the backbone; every peer also returns a copy of its
  // rows to the backbone (the backbone's log), off the critical path.
  void run_chain(const std::vector<int>& chain, size_t i) {
    const int T = tokens_per_step();
    const uint64_t bytes = static_cast<uint64_t>(T) * m_.hidden_bytes + kHeaderBytes;
    auto compute = [=, this] {
      const int p = chain[i];
      const PeerRole& r = plan_.roles[static_cast<size_t>(p)];
      const double dur = span_compute_s(r.first, r.last, T) / peers_[static_cast<size_t>(p)].speed;
      res_.peer_busy_s[static_cast<size_t>(p)] += dur;
      serve(&peer_cpu_[static_cast<size_t>(p)], dur, [=, this](double) {
        if (i + 1 < chain.size()) {
          send_p2p(p, chain[i + 1], bytes, [=, this] { run_chain(chain, i + 1); });
          send(p, false, bytes, [] {});  // the copy for the backbone's log
        } else {
          send(p, false, bytes, [this, next = r.last + 1] { run_layer(next); });
        }
      });
    };
    trips_++;  // the head's trip, or the await the backbone sends this span
    if (i == 0) {
      send(chain[0], true, bytes, compute);
    } else {
      compute();
    }
  }

  // k distinct experts for one token, drawn from the layer's shares.
  void draw(int l, std::vector<int>* out) {
    out->clear();
    const int n = m_.n_expert, k = m_.n_expert_used;
    if (m_.p.empty()) {
      std::iota(order_.begin(), order_.end(), 0);
      for (int i = 0; i < k; ++i) {
        const int j = i + static_cast<int>(std::uniform_int_distribution<int>(0, n - 1 - i)(rng_));
        std::swap(order_[i], order_[j]);
        out->push_back(order_[i]);
      }
      return;
    }
    std::vector<double> w = m_.p[static_cast<size_t>(l)];
    for (int i = 0; i < k; ++i) {
      const double total = std::accumulate(w.begin(), w.end(), 0.0);
      if (total <= 0) break;
      double u = std::uniform_real_distribution<double>(0, total)(rng_);
      int e = 0;
      for (; e < n - 1; ++e) {
        if (u < w[e]) break;
        u -= w[e];
      }
      out->push_back(e);
      w[e] = 0;
    }
  }

  // Who computes an expert held by peer o (-1: the backbone): o while it is not known dead, else
  // its first replica (SwarmPlan::standbys) that is not, else the backbone's own copy.
  int holder(int o) const {
    if (o < 0 || !known_dead_[static_cast<size_t>(o)]) return o;
    for (const int r : standby_[static_cast<size_t>(o)])
      if (!known_dead_[static_cast<size_t>(r)]) return r;
    return -1;
  }

  // One DISPATCH of n_pairs pairs (rows token rows) of layer l to peer p and its COMBINE. A peer
  // that does not answer within the timeout is known dead from then on, and the pairs go to its
  // replica, else the backbone computes them.
  void dispatch(int p, int l, int n_pairs, int rows, std::function<void()> done) {
    const PlanLayer& Ly = m_.layers[static_cast<size_t>(l)];
    const size_t w = static_cast<size_t>(p);
    const double fail = fail_at_[w], speed = peers_[w].speed;
    auto replied = std::make_shared<bool>(false);
    const uint64_t out_bytes = static_cast<uint64_t>(rows) * m_.hidden_bytes + n_pairs * 8 + kHeaderBytes;
    const uint64_t back_bytes = static_cast<uint64_t>(rows) * m_.hidden_bytes + kHeaderBytes;
    send(p, true, out_bytes, [=, this] {
      if (now_ >= fail) return;
      const double dur = n_pairs * Ly.expert_s / speed;
      res_.peer_busy_s[w] += dur;
      serve(&peer_cpu_[w], dur, [=, this](double end) {
        if (end >= fail) return;
        send(p, false, back_bytes, [=] {
          if (*replied) return;
          *replied = true;
          done();
        });
      });
    });
    at(now_ + so_.timeout_s, [=, this] {
      if (*replied) return;
      *replied = true;
      if (!known_dead_[w]) res_.failovers++;
      known_dead_[w] = true;
      const int next = holder(p);
      if (next >= 0)
        dispatch(next, l, n_pairs, rows, done);
      else
        backbone_compute(n_pairs * Ly.expert_s / po_.backbone_speed, done);
    });
  }

  void backbone_layer(int l, std::function<void()> done) {
    const int T = tokens_per_step();
    const PlanLayer& L = m_.layers[static_cast<size_t>(l)];
    backbone_compute(L.dense_s * m_.rows_cost(T) / po_.backbone_speed, [this, l, T, done = std::move(done)] {
      const PlanLayer& Ly = m_.layers[static_cast<size_t>(l)];
      if (!Ly.moe) {
        done();
        return;
      }
      // Pairs and token rows per holder (-1: the backbone).
      std::vector<int> pairs(peers_.size(), 0), rows(peers_.size(), 0);
      int local_pairs = 0;
      std::vector<int> picks, touched;
      for (int t = 0; t < T; ++t) {
        draw(l, &picks);
        touched.assign(peers_.size(), 0);
        for (int e : picks) {
          int o = holder(owner_[static_cast<size_t>(l)][static_cast<size_t>(e)]);
          if (o < 0) {
            local_pairs++;
          } else {
            pairs[static_cast<size_t>(o)]++;
            if (!touched[static_cast<size_t>(o)]) rows[static_cast<size_t>(o)]++;
            touched[static_cast<size_t>(o)] = 1;
          }
        }
      }
      auto pending = std::make_shared<int>(1);
      auto finish = std::make_shared<std::function<void()>>(done);
      auto one_done = [pending, finish] {
        if (--*pending == 0) (*finish)();
      };
      bool trip = false;
      for (size_t w = 0; w < peers_.size(); ++w) {
        if (pairs[w] == 0) continue;
        trip = true;
        ++*pending;
        dispatch(static_cast<int>(w), l, pairs[w], rows[w], one_done);
      }
      if (trip) trips_++;
      if (local_pairs > 0) {
        ++*pending;
        backbone_compute(local_pairs * Ly.expert_s / po_.backbone_speed, one_done);
      }
      one_done();
    });
  }

  const PlanModel& m_;
  const std::vector<PlanPeer>& peers_;
  const PlanOptions& po_;
  const SwarmPlan& plan_;
  const SimOptions& so_;
  std::mt19937_64 rng_;
  std::priority_queue<Event> q_;
  uint64_t seq_ = 0;
  double now_ = 0, bb_cpu_ = 0, step_start_ = 0, end_ = 0;
  std::vector<double> peer_cpu_, up_busy_, down_busy_, up_last_, down_last_, fail_at_;
  std::vector<bool> known_dead_, span_here_;
  std::vector<std::vector<int>> lanes_;    // per span peer: its lanes (PeerRole::lane_of)
  std::vector<bool> lane_dead_;            // a lane whose reply was lost: dropped for good
  std::vector<int> runner_;                // per span peer: who runs its span now (itself, or its standby)
  std::vector<std::vector<int>> standby_;  // per span or expert peer: its standbys or replicas, in order
  std::vector<std::vector<int>> owner_;
  std::vector<int> order_;
  std::vector<double> step_times_;
  int64_t rows_ = 0, trips_ = 0;
  SimResult res_;
};

}  // namespace

Result<SimResult> simulate(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& po,
                           const SwarmPlan& plan, const SimOptions& so) {
  SwarmPlan checked = plan;
  MOESH_RETURN_IF_ERROR(evaluate_plan(m, peers, po, &checked));
  if (so.steps < 1 || so.streams < 1 || so.draft < 0 || !(so.accept >= 0 && so.accept <= 1) || !(so.timeout_s > 0) ||
      !(so.jitter_s >= 0) || so.prompt_rows < 0)
    return make_error(StatusCode::kInvalidArgument,
                      "simulate: steps and streams >= 1, draft and prompt rows >= 0, accept in [0,1], timeout > 0");
  for (const SimFailure& f : so.failures)
    if (f.peer < 0 || f.peer >= static_cast<int>(peers.size()))
      return make_error(StatusCode::kInvalidArgument, "simulate: failure of peer {}, there are {}", f.peer,
                        peers.size());
  Sim sim(m, peers, po, checked, so);
  return sim.run();
}

namespace {

struct Shape {
  const char* name;
  int n_layer, n_dense, n_expert, k, n_embd;
  double expert_params, attn_params, shared_params, dense_ffn_params, global_params;
  double kv_floats_per_cell;  // per layer
};

// Parameter counts from the published configurations (attention, shared expert, routed expert
// of hidden x expert-FFN x 3 matrices, dense FFN of the leading layers, embeddings + head).
constexpr Shape kShapes[] = {
    {"qwen3-30b-a3b", 48, 0, 128, 8, 2048, 3.0 * 2048 * 768, 18.9e6, 0, 0, 2 * 151936.0 * 2048, 4 * 256},
    {"deepseek-v3", 61, 3, 256, 8, 7168, 3.0 * 7168 * 2048, 187e6, 3.0 * 7168 * 2048, 3.0 * 7168 * 18432,
     2 * 129280.0 * 7168, 576},
    {"kimi-k2", 61, 1, 384, 8, 7168, 3.0 * 7168 * 2048, 101e6, 3.0 * 7168 * 2048, 3.0 * 7168 * 18432,
     2 * 163840.0 * 7168, 576},
    {"glm-4.5", 92, 3, 160, 8, 5120, 3.0 * 5120 * 1536, 136e6, 3.0 * 5120 * 1536, 3.0 * 5120 * 12288,
     2 * 151552.0 * 5120, 8 * 256},
};

}  // namespace

Result<PlanModel> plan_model_shape(const std::string& name, int n_ctx, double seconds_per_byte) {
  constexpr double kBytesPerParam = 4.85 / 8;
  for (const Shape& s : kShapes) {
    if (name != s.name) continue;
    PlanModel m;
    m.name = s.name;
    m.n_expert = s.n_expert;
    m.n_expert_used = s.k;
    m.hidden_bytes = static_cast<uint64_t>(s.n_embd) * 4;
    m.global_bytes = static_cast<uint64_t>(s.global_params * kBytesPerParam);
    m.global_s = m.global_bytes / 2.0 * seconds_per_byte;  // the head is half of the globals
    for (int l = 0; l < s.n_layer; ++l) {
      PlanLayer L;
      L.moe = l >= s.n_dense;
      L.dense_bytes = static_cast<uint64_t>(
          (s.attn_params + (L.moe ? s.shared_params + s.n_embd * double(s.n_expert) : s.dense_ffn_params)) *
          kBytesPerParam);
      L.expert_bytes = L.moe ? static_cast<uint64_t>(s.expert_params * kBytesPerParam) : 0;
      L.state_bytes = static_cast<uint64_t>(n_ctx * s.kv_floats_per_cell * 4);
      L.dense_s = L.dense_bytes * seconds_per_byte;
      L.expert_s = L.expert_bytes * seconds_per_byte;
      m.layers.push_back(L);
    }
    return m;
  }
  std::string known;
  for (const Shape& s : kShapes) known += std::string(known.empty() ? "" : ", ") + s.name;
  return make_error(StatusCode::kNotFound, "simulate: unknown shape '{}' (known: {})", name, known);
}

}  // namespace moesh
