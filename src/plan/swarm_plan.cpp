// The swarm planner's cost model and search (swarm_plan.h).
#include "moesh/plan/swarm_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>

#include "moesh/gguf/gguf.h"
#include "moesh/model/model.h"

namespace moesh {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Replicas sharing an expert's pairs: those costing at most this x the cheapest holder + the slack
// (remote/planner.h PlannerPolicy's defaults: what the runtime does).
constexpr double kNearFactor = 1.25;
constexpr double kNearSlackSeconds = 0.002;
// add_load_replicas keeps a copy that makes the predicted step at least this much faster.
constexpr double kLoadReplicaGain = 0.005;

double wire_s(double rate_bps, double bytes) {
  return rate_bps > 0 ? bytes * 8.0 / rate_bps : 0.0;
}

int tokens(const PlanOptions& o) {
  return std::max(1, o.tokens_per_step);
}
double accepted(const PlanOptions& o) {
  return o.accepted_per_step > 0 ? o.accepted_per_step : tokens(o);
}

// A holder of routed experts of backbone layers: the backbone itself (peer -1) or an expert peer.
struct Holder {
  int peer = -1;
  double rtt_s = 0, speed = 1, rate_bps = 0;
};

// One holder's share of one layer: experts first..last.
struct Seg {
  int holder = 0;
  int first = 0, last = 0;
};

// E[max over the holders a step needs] of one backbone MoE layer, and the chance it makes a trip.
struct LayerTrip {
  double expected_s = 0;
  double p_trip = 0;
};

// The chance one token needs none of a set of experts: exact (hypergeometric: its k distinct
// experts all outside the set) when activations are uniform, else the product of (1 - p_e).
double miss_chance(const PlanModel& m, int n_in_set, double product, bool product_form = false) {
  if (!m.p.empty() || product_form) return product;
  const int n = m.n_expert, k = m.n_expert_used;
  if (n - n_in_set < k) return 0.0;
  double r = 1.0;
  for (int i = 0; i < k; ++i) r *= static_cast<double>(n - n_in_set - i) / (n - i);
  return r;
}

// `shares` (optional): this layer's activation shares in the segments' expert order, when the
// segments index a permutation of the layer's experts; else the model's own. product_form: the
// segments index shares that are not whole experts (a copied expert's pairs split over its near
// holders), priced by the product of (1 - share) as with counted activations.
LayerTrip layer_trip(const PlanModel& m, const PlanOptions& o, int layer, const std::vector<Holder>& holders,
                     const std::vector<Seg>& segs, const std::vector<double>* shares = nullptr,
                     bool product_form = false) {
  const int T = tokens(o);
  const PlanLayer& L = m.layers[static_cast<size_t>(layer)];
  struct C {
    double cost, product;
    int count;
    bool remote;
  };
  std::vector<C> cs;
  for (const Seg& s : segs) {
    double product = 1.0, share = 0.0;
    for (int e = s.first; e <= s.last; ++e) {
      const double p = shares != nullptr ? (*shares)[static_cast<size_t>(e)] : m.p_at(layer, e);
      product *= 1.0 - p;
      share += p;
    }
    const int count = s.last - s.first + 1;
    const double q = 1.0 - miss_chance(m, count, product, product_form);  // a token needs this holder
    const Holder& h = holders[static_cast<size_t>(s.holder)];
    double cost = share * T * L.expert_s / h.speed;  // its expected pairs
    if (h.peer >= 0) cost += h.rtt_s + 2 * o.message_s + wire_s(h.rate_bps, 2.0 * q * T * m.hidden_bytes);
    cs.push_back({cost, product, count, h.peer >= 0});
  }
  // E[max] = sum_i cost_i x P(holder i needed, none slower needed), slowest first:
  //        = sum_i cost_i x (miss(slower)^T - miss(slower + i)^T).
  std::sort(cs.begin(), cs.end(), [](const C& a, const C& b) { return a.cost > b.cost; });
  LayerTrip r;
  int n_slower = 0;
  double prod_slower = 1.0, miss_slower = 1.0;
  for (const C& c : cs) {
    const double miss_with = std::pow(miss_chance(m, n_slower + c.count, prod_slower * c.product, product_form), T);
    r.expected_s += c.cost * (miss_slower - miss_with);
    n_slower += c.count;
    prod_slower *= c.product;
    miss_slower = miss_with;
  }
  int n_remote = 0;
  double prod_remote = 1.0;
  for (const C& c : cs)
    if (c.remote) {
      n_remote += c.count;
      prod_remote *= c.product;
    }
  r.p_trip = n_remote > 0 ? 1.0 - std::pow(miss_chance(m, n_remote, prod_remote, product_form), T) : 0.0;
  return r;
}

// One span peer's trip for T rows (a lane's share: T / holders).
double span_cost_rows(const PlanModel& m, const PlanOptions& o, const PlanPeer& p, int first, int last, double T) {
  const double rows = static_cast<double>(m.row_bytes_at(first) + m.row_bytes_at(last + 1));
  double c = p.rtt_s + 2 * o.message_s + wire_s(p.rate_bps, T * rows);
  for (int l = first; l <= last; ++l) {
    const PlanLayer& L = m.layers[static_cast<size_t>(l)];
    c += (L.dense_s + (L.moe ? m.n_expert_used * L.expert_s : 0.0)) * m.rows_cost(T) / p.speed;
  }
  return c;
}

double span_cost(const PlanModel& m, const PlanOptions& o, const PlanPeer& p, int first, int last) {
  return span_cost_rows(m, o, p, first, last, tokens(o));
}

}  // namespace

double chain_saving(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o, int q, int p,
                    int boundary) {
  if (!o.chain_spans || q < 0 || p < 0 || q == p || static_cast<size_t>(q) >= o.peer_rtt_s.size() ||
      static_cast<size_t>(p) >= o.peer_rtt_s[static_cast<size_t>(q)].size())
    return 0;
  const double hop = o.peer_rtt_s[static_cast<size_t>(q)][static_cast<size_t>(p)];
  if (hop < 0) return 0;
  const PlanPeer &a = peers[static_cast<size_t>(q)], &b = peers[static_cast<size_t>(p)];
  // q -> backbone -> p (two messages, each on its own link) becomes q -> p (one message, at the
  // slower of the two links' rates).
  const double rows = static_cast<double>(tokens(o)) * static_cast<double>(m.row_bytes_at(boundary));
  const double wire = std::min(wire_s(a.rate_bps, rows), wire_s(b.rate_bps, rows));
  return std::max(0.0, 0.5 * (a.rtt_s + b.rtt_s - hop) + o.message_s + wire);
}

namespace {

uint64_t layer_bytes(const PlanModel& m, int l) {
  const PlanLayer& L = m.layers[static_cast<size_t>(l)];
  return L.dense_bytes + L.state_bytes + (L.moe ? L.expert_bytes * static_cast<uint64_t>(m.n_expert) : 0);
}

Status check_inputs(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o) {
  if (m.layers.empty() || m.n_expert <= 0 || m.n_expert_used <= 0 || m.n_expert_used > m.n_expert)
    return make_error(StatusCode::kInvalidArgument, "plan: model '{}' has no routed experts ({} layers, {} of {})",
                      m.name, m.layers.size(), m.n_expert_used, m.n_expert);
  if (!o.peer_rtt_s.empty()) {
    if (o.peer_rtt_s.size() != peers.size())
      return make_error(StatusCode::kInvalidArgument, "plan: peer RTTs for {} peers, {} given", o.peer_rtt_s.size(),
                        peers.size());
    for (const auto& row : o.peer_rtt_s) {
      if (row.size() != peers.size())
        return make_error(StatusCode::kInvalidArgument, "plan: a row of {} peer RTTs for {} peers", row.size(),
                          peers.size());
    }
  }
  if (!m.p.empty()) {
    if (m.p.size() != m.layers.size())
      return make_error(StatusCode::kInvalidArgument, "plan: {} rows of activation shares for {} layers", m.p.size(),
                        m.layers.size());
    for (size_t l = 0; l < m.p.size(); ++l) {
      if (m.p[l].size() != static_cast<size_t>(m.n_expert))
        return make_error(StatusCode::kInvalidArgument, "plan: layer {} has {} activation shares, expected {}", l,
                          m.p[l].size(), m.n_expert);
      for (double v : m.p[l])
        if (!(v >= 0 && v <= 1))
          return make_error(StatusCode::kInvalidArgument, "plan: layer {}: activation share {} outside [0,1]", l, v);
    }
  }
  for (const PlanPeer& p : peers)
    if (!(p.speed > 0) || !(p.rtt_s >= 0) || !(p.rate_bps >= 0))
      return make_error(StatusCode::kInvalidArgument, "plan: peer '{}': speed must be > 0, rtt and rate >= 0", p.name);
  if (!(o.backbone_speed > 0)) return make_error(StatusCode::kInvalidArgument, "plan: backbone speed must be > 0");
  return Status::ok();
}

// The expert-size unit of the fill: the largest routed expert of any layer.
uint64_t expert_unit(const PlanModel& m) {
  uint64_t u = 0;
  for (const PlanLayer& L : m.layers)
    if (L.moe) u = std::max(u, L.expert_bytes);
  return std::max<uint64_t>(u, 1);
}

// The holders of backbone layers' experts in fill order (the backbone's budget, then expert peers
// nearest first) and their capacity in experts.
struct Fill {
  std::vector<Holder> holders;
  std::vector<int64_t> cap;  // experts each holds at most
  int64_t total = 0;

  // Segments of the j-th backbone MoE layer: slots [j*n, (j+1)*n) of the holders in order.
  std::vector<Seg> segments(int64_t j, int n_expert) const {
    std::vector<Seg> out;
    int64_t lo = j * n_expert, hi = lo + n_expert, base = 0;
    for (size_t h = 0; h < holders.size(); ++h) {
      const int64_t a = std::max(lo, base), b = std::min(hi, base + cap[h]);
      if (a < b) out.push_back({static_cast<int>(h), static_cast<int>(a - lo), static_cast<int>(b - lo - 1)});
      base += cap[h];
    }
    return out;
  }
  int64_t layers(int n_expert) const { return total / n_expert; }
};

Fill make_fill(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o,
               const std::vector<int>& expert_peers) {
  Fill f;
  const uint64_t unit = expert_unit(m);
  f.holders.push_back({-1, 0, o.backbone_speed, 0});
  f.cap.push_back(static_cast<int64_t>(o.local_experts_bytes / unit));
  std::vector<int> order = expert_peers;
  auto key = [&](int i) {
    const PlanPeer& p = peers[static_cast<size_t>(i)];
    return p.rtt_s + 2 * o.message_s + wire_s(p.rate_bps, 2.0 * m.hidden_bytes) +
           m.n_expert_used * static_cast<double>(unit) / p.speed;
  };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key(a) < key(b); });
  for (int i : order) {
    const PlanPeer& p = peers[static_cast<size_t>(i)];
    f.holders.push_back({i, p.rtt_s, p.speed, p.rate_bps});
    f.cap.push_back(static_cast<int64_t>(p.memory_bytes / unit));
  }
  for (int64_t c : f.cap) f.total += c;
  return f;
}

// The order the fill hands out one layer's experts in: hottest first (the backbone's budget, then
// the nearest peers get the experts most tokens need; the farthest holders the coldest, so they are
// needed least often), ties by id. Uniform shares: by id.
std::vector<int> hot_order(const PlanModel& m, int layer) {
  std::vector<int> order(static_cast<size_t>(m.n_expert));
  std::iota(order.begin(), order.end(), 0);
  if (!m.p.empty()) {
    const auto& p = m.p[static_cast<size_t>(layer)];
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)]; });
  }
  return order;
}

// One layer's shares in hot_order (what layer_trip reads when segments index that order).
std::vector<double> hot_shares(const PlanModel& m, int layer) {
  std::vector<double> out;
  for (int e : hot_order(m, layer)) out.push_back(m.p_at(layer, e));
  return out;
}

// Positions first..last of a layer's hot order as expert slices (ids sorted, adjacent ids merged).
std::vector<ExpertSlice> slices_of(const PlanModel& m, int layer, int first, int last) {
  const std::vector<int> order = hot_order(m, layer);
  std::vector<int> ids(order.begin() + first, order.begin() + last + 1);
  std::sort(ids.begin(), ids.end());
  std::vector<ExpertSlice> out;
  for (int e : ids) {
    if (!out.empty() && out.back().last == e - 1)
      out.back().last = e;
    else
      out.push_back({layer, e, e});
  }
  return out;
}

std::string fmt_bytes(uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.1f} GiB", b / double(1ull << 30));
  return fmt::format("{:.1f} MiB", b / double(1ull << 20));
}

// One candidate split: span peers S (the DP places them) and expert peers E (the fill).
struct Candidate {
  double cost = kInf;
  std::vector<std::pair<int, std::pair<int, int>>> spans;  // (peer, (first, last))
  std::vector<int> expert_peers;
};

// The DP over layers for one split. `ordered`: spans only in the order of S (the heuristic for
// many peers), else any subset of S in any order (a mask).
Candidate best_for_split(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o,
                         const std::vector<int>& S, const std::vector<int>& E, bool ordered) {
  Candidate best;
  const int L = m.n_layer(), T = tokens(o);
  const Fill fill = make_fill(m, peers, o, E);
  const int64_t max_kb = std::min<int64_t>(fill.layers(m.n_expert), L);
  int n_dense = 0;
  uint64_t moe_bb = 0, dense_bb = 0;  // backbone bytes per layer of each kind (largest)
  for (int l = 0; l < L; ++l) {
    const PlanLayer& Ly = m.layers[static_cast<size_t>(l)];
    if (!Ly.moe) ++n_dense;
    (Ly.moe ? moe_bb : dense_bb) = std::max(Ly.moe ? moe_bb : dense_bb, Ly.dense_bytes + Ly.state_bytes);
  }
  const int KB = static_cast<int>(max_kb) + 1, ND = n_dense + 1;
  const int NS = ordered ? static_cast<int>(S.size()) + 1 : (1 << S.size());
  // Chains: what a span saves right after another (chain_saving at the boundary they meet). The
  // state then also says which span ended at the previous layer: ordered, only "S[s-1] did" (pv 1)
  // or not (pv 0); with masks, its index (pv = q + 1) or none (pv 0). A saving only grows with
  // the rows' width, so none at the widest boundary means none anywhere.
  int widest = 0;
  for (int b = 0; b <= L; ++b)
    if (m.row_bytes_at(b) > m.row_bytes_at(widest)) widest = b;
  bool any_saving = false;
  for (size_t q = 0; q < S.size() && !any_saving; ++q)
    for (size_t p = 0; p < S.size() && !any_saving; ++p) any_saving = chain_saving(m, peers, o, S[q], S[p], widest) > 0;
  const int PV = !any_saving ? 1 : ordered ? 2 : static_cast<int>(S.size()) + 1;
  auto prev_span = [&](int s, int pv) -> int {  // index into S of the span that just ended, or -1
    if (pv == 0) return -1;
    return ordered ? s - 1 : pv - 1;
  };
  // Cost of the kb-th backbone MoE layer at layer l (the fill's slots index each layer's hot order).
  std::vector<std::vector<double>> shares(static_cast<size_t>(L));
  if (!m.p.empty())
    for (int l = 0; l < L; ++l)
      if (m.layers[static_cast<size_t>(l)].moe) shares[static_cast<size_t>(l)] = hot_shares(m, l);
  std::vector<std::vector<double>> bl(static_cast<size_t>(KB), std::vector<double>(static_cast<size_t>(L), kInf));
  for (int j = 0; j < max_kb; ++j) {
    const std::vector<Seg> segs = fill.segments(j, m.n_expert);
    for (int l = 0; l < L; ++l)
      if (m.layers[static_cast<size_t>(l)].moe)
        bl[static_cast<size_t>(j)][static_cast<size_t>(l)] =
            m.layers[static_cast<size_t>(l)].dense_s * m.rows_cost(T) / o.backbone_speed +
            layer_trip(m, o, l, fill.holders, segs, m.p.empty() ? nullptr : &shares[static_cast<size_t>(l)]).expected_s;
  }
  auto idx = [&](int pos, int s, int kb, int nd, int pv) {
    return (((static_cast<size_t>(pos) * NS + s) * KB + kb) * ND + nd) * PV + pv;
  };
  const size_t per_pos = static_cast<size_t>(NS) * KB * ND * PV;
  const size_t n_states = static_cast<size_t>(L + 1) * per_pos;
  std::vector<double> dp(n_states, kInf);
  struct Parent {
    int32_t prev = -1;
    int16_t span_peer = -1;  // index into S; -1: a backbone layer
  };
  std::vector<Parent> par(n_states);
  dp[idx(0, 0, 0, 0, 0)] = 0;
  for (int pos = 0; pos < L; ++pos) {
    const PlanLayer& Ly = m.layers[static_cast<size_t>(pos)];
    for (int s = 0; s < NS; ++s)
      for (int kb = 0; kb < KB; ++kb)
        for (int nd = 0; nd < ND; ++nd)
          for (int pv = 0; pv < PV; ++pv) {
            const size_t from = idx(pos, s, kb, nd, pv);
            const double c0 = dp[from];
            if (c0 == kInf) continue;
            auto relax = [&](size_t to, double c, int span_peer) {
              if (c < dp[to]) {
                dp[to] = c;
                par[to] = {static_cast<int32_t>(from), static_cast<int16_t>(span_peer)};
              }
            };
            // Layer pos on the backbone.
            if (Ly.moe) {
              if (kb + 1 < KB)
                relax(idx(pos + 1, s, kb + 1, nd, 0), c0 + bl[static_cast<size_t>(kb)][static_cast<size_t>(pos)], -1);
            } else if (nd + 1 < ND) {
              relax(idx(pos + 1, s, kb, nd + 1, 0), c0 + Ly.dense_s * m.rows_cost(T) / o.backbone_speed, -1);
            }
            // Ordered: candidate s is skipped (it stays idle) or is the next span. (A skip forgets
            // the span that just ended: the heuristic then prices no chain across an idle peer.)
            if (ordered && s < static_cast<int>(S.size())) relax(idx(pos, s + 1, kb, nd, 0), c0, -1);
            const int q = prev_span(s, pv);
            // A span starting at pos.
            for (size_t si = 0; si < S.size(); ++si) {
              int ns;
              if (ordered) {
                if (static_cast<int>(si) != s) continue;
                ns = s + 1;
              } else {
                if (s & (1 << si)) continue;
                ns = s | (1 << si);
              }
              const PlanPeer& p = peers[static_cast<size_t>(S[si])];
              const double save = q >= 0 ? chain_saving(m, peers, o, S[static_cast<size_t>(q)], S[si], pos) : 0.0;
              const int npv = PV == 1 ? 0 : ordered ? 1 : static_cast<int>(si) + 1;
              uint64_t bytes = 0;
              for (int last = pos; last < L; ++last) {
                bytes += layer_bytes(m, last);
                if (bytes > p.memory_bytes) break;
                relax(idx(last + 1, ns, kb, nd, npv), c0 + span_cost(m, o, p, pos, last) - save, static_cast<int>(si));
              }
            }
          }
  }
  // The backbone must hold the globals and its layers' dense parts and state.
  size_t best_state = SIZE_MAX;
  for (int s = 0; s < NS; ++s)
    for (int kb = 0; kb < KB; ++kb)
      for (int nd = 0; nd < ND; ++nd)
        for (int pv = 0; pv < PV; ++pv) {
          const size_t at = idx(L, s, kb, nd, pv);
          if (dp[at] == kInf) continue;
          const uint64_t bb = m.global_bytes + kb * moe_bb + nd * dense_bb;
          if (bb > o.backbone_memory_bytes) continue;
          if (best_state == SIZE_MAX || dp[at] < dp[best_state]) best_state = at;
        }
  if (best_state == SIZE_MAX) return best;
  best.cost = dp[best_state];
  // Walk back: a span's parent is its start position.
  for (size_t at = best_state; par[at].prev >= 0; at = static_cast<size_t>(par[at].prev)) {
    if (par[at].span_peer < 0) continue;
    const size_t from = static_cast<size_t>(par[at].prev);
    const int first = static_cast<int>(from / per_pos);
    const int last = static_cast<int>(at / per_pos) - 1;
    best.spans.push_back({S[static_cast<size_t>(par[at].span_peer)], {first, last}});
  }
  best.expert_peers = E;
  return best;
}

// Turns a split's spans into a full plan: layer hosts and the fill's expert slices.
SwarmPlan materialise(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o,
                      const Candidate& c) {
  SwarmPlan plan;
  plan.roles.assign(peers.size(), PeerRole{});
  plan.layer_host.assign(static_cast<size_t>(m.n_layer()), -1);
  for (const auto& [peer, range] : c.spans) {
    PeerRole& r = plan.roles[static_cast<size_t>(peer)];
    r.kind = RoleKind::kSpan;
    r.first = range.first;
    r.last = range.second;
    for (int l = range.first; l <= range.second; ++l) plan.layer_host[static_cast<size_t>(l)] = peer;
  }
  const Fill fill = make_fill(m, peers, o, c.expert_peers);
  int64_t j = 0;
  for (int l = 0; l < m.n_layer(); ++l) {
    if (plan.layer_host[static_cast<size_t>(l)] >= 0 || !m.layers[static_cast<size_t>(l)].moe) continue;
    for (const Seg& s : fill.segments(j++, m.n_expert)) {
      const int peer = fill.holders[static_cast<size_t>(s.holder)].peer;
      std::vector<ExpertSlice>& to = peer < 0 ? plan.backbone_experts : plan.roles[static_cast<size_t>(peer)].experts;
      if (peer >= 0) plan.roles[static_cast<size_t>(peer)].kind = RoleKind::kExperts;
      for (const ExpertSlice& sl : slices_of(m, l, s.first, s.last)) to.push_back(sl);
    }
  }
  return plan;
}

}  // namespace

const char* role_name(RoleKind k) {
  switch (k) {
    case RoleKind::kIdle:
      return "idle";
    case RoleKind::kSpan:
      return "span";
    case RoleKind::kExperts:
      return "experts";
  }
  return "?";
}

uint64_t plan_bytes_per_token(const PlanModel& m) {
  uint64_t b = 0;
  for (const PlanLayer& L : m.layers) b += L.dense_bytes + (L.moe ? L.expert_bytes * m.n_expert_used : 0);
  return b;
}

Status evaluate_plan(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o, SwarmPlan* plan) {
  MOESH_RETURN_IF_ERROR(check_inputs(m, peers, o));
  const int L = m.n_layer(), T = tokens(o);
  if (plan->roles.size() != peers.size() || plan->layer_host.size() != static_cast<size_t>(L))
    return make_error(StatusCode::kInvalidArgument, "plan: {} roles for {} peers, {} layer hosts for {} layers",
                      plan->roles.size(), peers.size(), plan->layer_host.size(), L);
  // Who holds each expert of the backbone's layers, and who holds copies of it (PeerRole::copies).
  std::vector<Holder> holders{{-1, 0, o.backbone_speed, 0}};
  std::vector<std::vector<int>> owner(static_cast<size_t>(L), std::vector<int>(static_cast<size_t>(m.n_expert), -1));
  std::vector<std::vector<std::vector<int>>> copies(static_cast<size_t>(L),
                                                    std::vector<std::vector<int>>(static_cast<size_t>(m.n_expert)));
  auto claim = [&](const ExpertSlice& s, int holder, const std::string& who) -> Status {
    if (s.layer < 0 || s.layer >= L || s.first < 0 || s.last >= m.n_expert || s.first > s.last ||
        !m.layers[static_cast<size_t>(s.layer)].moe)
      return make_error(StatusCode::kInvalidArgument, "plan: {} holds layer {} experts {}-{}, not in the model", who,
                        s.layer, s.first, s.last);
    if (plan->layer_host[static_cast<size_t>(s.layer)] >= 0)
      return make_error(StatusCode::kInvalidArgument, "plan: {} holds experts of layer {}, which a span runs", who,
                        s.layer);
    for (int e = s.first; e <= s.last; ++e) {
      int& o2 = owner[static_cast<size_t>(s.layer)][static_cast<size_t>(e)];
      if (o2 >= 0)
        return make_error(StatusCode::kInvalidArgument, "plan: layer {} expert {} is held twice", s.layer, e);
      o2 = holder;
    }
    return Status::ok();
  };
  const uint64_t unit = expert_unit(m);
  uint64_t bb_experts = 0;
  for (const ExpertSlice& s : plan->backbone_experts) {
    MOESH_RETURN_IF_ERROR(claim(s, 0, "the backbone"));
    bb_experts += static_cast<uint64_t>(s.last - s.first + 1) * unit;
  }
  if (bb_experts > o.local_experts_bytes)
    return make_error(StatusCode::kInvalidArgument, "plan: the backbone keeps {} of experts, its budget is {}",
                      fmt_bytes(bb_experts), fmt_bytes(o.local_experts_bytes));
  for (size_t i = 0; i < peers.size(); ++i) {
    PeerRole& r = plan->roles[i];
    const PlanPeer& p = peers[i];
    r.bytes = 0;
    if (r.kind == RoleKind::kSpan) {
      if (!o.spans) return make_error(StatusCode::kInvalidArgument, "plan: span roles are not allowed ({})", p.name);
      if (r.first < 0 || r.last >= L || r.first > r.last)
        return make_error(StatusCode::kInvalidArgument, "plan: peer '{}' spans layers {}-{}, not in the model", p.name,
                          r.first, r.last);
      if (r.lane_of >= 0) {
        const int h = r.lane_of;
        if (h >= static_cast<int>(peers.size()) || h == static_cast<int>(i) ||
            plan->roles[static_cast<size_t>(h)].kind != RoleKind::kSpan ||
            plan->roles[static_cast<size_t>(h)].lane_of >= 0 || plan->roles[static_cast<size_t>(h)].first != r.first ||
            plan->roles[static_cast<size_t>(h)].last != r.last)
          return make_error(StatusCode::kInvalidArgument,
                            "plan: peer '{}' is a lane of layers {}-{} of peer {}, which does not run that span",
                            p.name, r.first, r.last, h);
      }
      for (int l = r.first; l <= r.last; ++l) {
        if (r.lane_of < 0 && plan->layer_host[static_cast<size_t>(l)] != static_cast<int>(i))
          return make_error(StatusCode::kInvalidArgument, "plan: layer {} is not hosted by its span peer '{}'", l,
                            p.name);
        r.bytes += layer_bytes(m, l);
      }
      PlanOptions one;
      one.tokens_per_step = 1;
      one.message_s = o.message_s;
      r.trip_s = span_cost(m, one, p, r.first, r.last);
    } else if (r.kind == RoleKind::kExperts) {
      if (!o.experts)
        return make_error(StatusCode::kInvalidArgument, "plan: expert roles are not allowed ({})", p.name);
      holders.push_back({static_cast<int>(i), p.rtt_s, p.speed, p.rate_bps});
      const int hid = static_cast<int>(holders.size() - 1);
      for (const ExpertSlice& s : r.experts) {
        MOESH_RETURN_IF_ERROR(claim(s, hid, "peer '" + p.name + "'"));
        r.bytes += static_cast<uint64_t>(s.last - s.first + 1) * unit;
      }
      for (const ExpertSlice& s : r.copies) {
        if (s.layer < 0 || s.layer >= L || s.first < 0 || s.last >= m.n_expert || s.first > s.last ||
            !m.layers[static_cast<size_t>(s.layer)].moe || plan->layer_host[static_cast<size_t>(s.layer)] >= 0)
          return make_error(StatusCode::kInvalidArgument,
                            "plan: peer '{}' copies layer {} experts {}-{}, not a backbone MoE layer's", p.name,
                            s.layer, s.first, s.last);
        for (int e = s.first; e <= s.last; ++e)
          copies[static_cast<size_t>(s.layer)][static_cast<size_t>(e)].push_back(hid);
        r.bytes += static_cast<uint64_t>(s.last - s.first + 1) * unit;
      }
      r.trip_s = p.rtt_s + 2 * o.message_s + wire_s(p.rate_bps, 2.0 * m.hidden_bytes);
    }
    if (r.bytes > p.memory_bytes)
      return make_error(StatusCode::kInvalidArgument, "plan: peer '{}' would hold {}, it has {}", p.name,
                        fmt_bytes(r.bytes), fmt_bytes(p.memory_bytes));
  }
  for (int l = 0; l < L; ++l) {
    const int h = plan->layer_host[static_cast<size_t>(l)];
    if (h >= 0 && (h >= static_cast<int>(peers.size()) || plan->roles[static_cast<size_t>(h)].kind != RoleKind::kSpan))
      return make_error(StatusCode::kInvalidArgument, "plan: layer {} names host {}, not a span peer", l, h);
  }
  // Costs, layer by layer.
  plan->layer_s.assign(static_cast<size_t>(L), 0.0);
  plan->step_s = m.global_s * m.rows_cost(T) / o.backbone_speed;
  plan->trips_per_step = 0;
  plan->backbone_bytes = m.global_bytes;
  for (int l = 0; l < L; ++l) {
    const PlanLayer& Ly = m.layers[static_cast<size_t>(l)];
    const int h = plan->layer_host[static_cast<size_t>(l)];
    double c = 0;
    if (h >= 0) {
      const PeerRole& r = plan->roles[static_cast<size_t>(h)];
      if (l == r.first) {
        // Its lanes share the rows: each of the n holders computes T / n, all in flight at once.
        std::vector<int> holders_of{h};
        for (size_t i = 0; i < plan->roles.size(); ++i)
          if (plan->roles[i].kind == RoleKind::kSpan && plan->roles[i].lane_of == h)
            holders_of.push_back(static_cast<int>(i));
        // By whole streams, as the runtime places them: the busiest holder has ceil(S / n) of them.
        const int S = o.streams > 0 ? std::min(o.streams, T) : T;
        const int n = static_cast<int>(std::min<size_t>(holders_of.size(), static_cast<size_t>(S)));
        const double share = static_cast<double>((S + n - 1) / n) * static_cast<double>(T) / static_cast<double>(S);
        c = 0;
        for (int x : holders_of)
          c = std::max(c, span_cost_rows(m, o, peers[static_cast<size_t>(x)], r.first, r.last, share));
        plan->trips_per_step += 1;
        // Right after another span: the two chain where that is faster (not a span with lanes).
        const int q = l > 0 ? plan->layer_host[static_cast<size_t>(l - 1)] : -1;
        auto has_lanes = [&](int x) {
          return std::any_of(plan->roles.begin(), plan->roles.end(),
                             [&](const PeerRole& o2) { return o2.kind == RoleKind::kSpan && o2.lane_of == x; });
        };
        const double save =
            q >= 0 && q != h && holders_of.size() == 1 && !has_lanes(q) ? chain_saving(m, peers, o, q, h, l) : 0.0;
        c -= save;
        plan->roles[static_cast<size_t>(h)].chained_after = save > 0 ? q : -1;
      }
    } else {
      plan->backbone_bytes += Ly.dense_bytes + Ly.state_bytes;
      c = Ly.dense_s * m.rows_cost(T) / o.backbone_speed;
      if (Ly.moe) {
        std::vector<Seg> segs;
        const auto& own = owner[static_cast<size_t>(l)];
        for (int e = 0; e < m.n_expert; ++e) {
          if (own[static_cast<size_t>(e)] < 0)
            return make_error(StatusCode::kInvalidArgument, "plan: layer {} expert {} is held by nobody", l, e);
          if (!segs.empty() && segs.back().holder == own[static_cast<size_t>(e)] && segs.back().last == e - 1)
            segs.back().last = e;
          else
            segs.push_back({own[static_cast<size_t>(e)], e, e});
        }
        bool copied = false;
        for (int e = 0; e < m.n_expert && !copied; ++e)
          copied = !copies[static_cast<size_t>(l)][static_cast<size_t>(e)].empty();
        // Several segments of one holder in a layer are one message: merge them for the trip.
        std::map<int, std::vector<Seg>> by_holder;
        for (const Seg& s : segs) by_holder[s.holder].push_back(s);
        bool contiguous = true;
        for (auto& [hid, v] : by_holder) contiguous = contiguous && v.size() == 1;
        LayerTrip t;
        if (copied) {
          // Copies: each expert's pairs split evenly over its near holders (the runtime's rule),
          // as that many part-experts, each held by one holder.
          std::map<int, std::vector<double>> parts;  // holder -> shares of the parts it computes
          for (int e = 0; e < m.n_expert; ++e) {
            std::vector<int> hs = copies[static_cast<size_t>(l)][static_cast<size_t>(e)];
            hs.push_back(own[static_cast<size_t>(e)]);
            std::sort(hs.begin(), hs.end());
            if (std::adjacent_find(hs.begin(), hs.end()) != hs.end())
              return make_error(StatusCode::kInvalidArgument, "plan: layer {} expert {} is copied to a peer holding it",
                                l, e);
            double cheapest = kInf;
            for (int h : hs) cheapest = std::min(cheapest, holders[static_cast<size_t>(h)].rtt_s);
            std::vector<int> near;
            for (int h : hs)
              if (holders[static_cast<size_t>(h)].rtt_s <= kNearFactor * cheapest + kNearSlackSeconds)
                near.push_back(h);
            for (int h : near) parts[h].push_back(m.p_at(l, e) / static_cast<double>(near.size()));
          }
          std::vector<double> perm;
          std::vector<Seg> ps;
          for (auto& [hid, v] : parts) {
            const int start = static_cast<int>(perm.size());
            perm.insert(perm.end(), v.begin(), v.end());
            ps.push_back({hid, start, static_cast<int>(perm.size()) - 1});
          }
          t = layer_trip(m, o, l, holders, ps, &perm, /*product_form=*/true);
        } else if (contiguous) {
          t = layer_trip(m, o, l, holders, segs);
        } else {
          // Permute this layer's experts so each holder's are contiguous (shares are what count).
          std::vector<double> perm;
          std::vector<Seg> ps;
          for (auto& [hid, v] : by_holder) {
            const int start = static_cast<int>(perm.size());
            for (const Seg& s : v)
              for (int e = s.first; e <= s.last; ++e) perm.push_back(m.p_at(l, e));
            ps.push_back({hid, start, static_cast<int>(perm.size()) - 1});
          }
          t = layer_trip(m, o, l, holders, ps, &perm);
        }
        c += t.expected_s;
        plan->trips_per_step += t.p_trip;
      }
    }
    plan->layer_s[static_cast<size_t>(l)] = c;
    plan->step_s += c;
  }
  if (plan->backbone_bytes > o.backbone_memory_bytes)
    return make_error(StatusCode::kInvalidArgument, "plan: the backbone would hold {}, it has {}",
                      fmt_bytes(plan->backbone_bytes), fmt_bytes(o.backbone_memory_bytes));
  plan->backbone_bytes += bb_experts;
  plan->tokens_per_s = plan->step_s > 0 ? accepted(o) / plan->step_s : 0;
  return Status::ok();
}

Status add_standbys(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o, SwarmPlan* plan) {
  plan->standbys.clear();
  const int P = static_cast<int>(peers.size());
  if (static_cast<int>(plan->roles.size()) != P)
    return make_error(StatusCode::kInvalidArgument, "plan: {} roles for {} peers", plan->roles.size(), P);
  const uint64_t unit = expert_unit(m);
  // Each primary's failure, priced with each idle peer standing in and with the backbone taking over.
  struct Option {
    int primary, peer;
    double failover_s, fallback_s;
    bool span;
  };
  std::vector<std::vector<Option>> per_primary;
  const size_t n_primaries = static_cast<size_t>(std::count_if(
      plan->roles.begin(), plan->roles.end(), [](const PeerRole& x) { return x.kind != RoleKind::kIdle; }));
  for (int q = 0; q < P; ++q) {
    const PeerRole& r = plan->roles[static_cast<size_t>(q)];
    if (r.kind == RoleKind::kIdle || r.lane_of >= 0) continue;  // a lane's streams go to the span's peer
    // What the backbone would have to hold to do the primary's work: a span's layers, or the
    // expert peer's experts.
    uint64_t bytes = 0;
    SwarmPlan f = *plan;
    f.roles[static_cast<size_t>(q)] = PeerRole{};
    // (Priced without the span's lanes when the backbone takes it over: a span here with lanes
    // is not in the cost model, so the fallback is priced on the safe side.)
    for (PeerRole& x : f.roles)
      if (x.lane_of == q) x = PeerRole{};
    if (r.kind == RoleKind::kSpan) {
      for (int l = r.first; l <= r.last; ++l) {
        bytes += layer_bytes(m, l);
        f.layer_host[static_cast<size_t>(l)] = -1;
        if (m.layers[static_cast<size_t>(l)].moe) f.backbone_experts.push_back({l, 0, m.n_expert - 1});
      }
    } else {
      for (const ExpertSlice& sl : r.experts) {
        bytes += static_cast<uint64_t>(sl.last - sl.first + 1) * unit;
        f.backbone_experts.push_back(sl);
      }
    }
    double fallback = -1;
    if (o.backbone_memory_bytes == UINT64_MAX || plan->backbone_bytes + bytes <= o.backbone_memory_bytes) {
      PlanOptions fo = o;
      fo.local_experts_bytes = UINT64_MAX;  // the primary's weights: counted in `bytes` above
      fo.backbone_memory_bytes = UINT64_MAX;
      if (evaluate_plan(m, peers, fo, &f).is_ok()) fallback = f.step_s;
    }
    // The idle peers that fit, nearest (then fastest) first; as many are priced as there are
    // standbys to give plus a few (at simulate's scale hundreds of idle peers would be priced over and over).
    std::vector<int> cand;
    for (int p = 0; p < P; ++p)
      if (plan->roles[static_cast<size_t>(p)].kind == RoleKind::kIdle &&
          bytes <= peers[static_cast<size_t>(p)].memory_bytes)
        cand.push_back(p);
    std::stable_sort(cand.begin(), cand.end(), [&](int a, int b) {
      const PlanPeer &x = peers[static_cast<size_t>(a)], &y = peers[static_cast<size_t>(b)];
      return x.rtt_s != y.rtt_s ? x.rtt_s < y.rtt_s : x.speed > y.speed;
    });
    const size_t keep = n_primaries * static_cast<size_t>(std::max(o.standbys_per_primary, 1)) + 8;
    if (cand.size() > keep) cand.resize(keep);
    std::vector<Option> opts;
    for (int p : cand) {
      SwarmPlan g = *plan;
      g.roles[static_cast<size_t>(p)] = g.roles[static_cast<size_t>(q)];
      g.roles[static_cast<size_t>(q)] = PeerRole{};
      if (r.kind == RoleKind::kSpan)
        for (int l = r.first; l <= r.last; ++l) g.layer_host[static_cast<size_t>(l)] = p;
      for (PeerRole& x : g.roles)
        if (x.lane_of == q) x.lane_of = p;  // the lanes go on beside the standby
      if (!evaluate_plan(m, peers, o, &g).is_ok()) continue;
      if (fallback >= 0 && g.step_s >= fallback) continue;  // the backbone would do better itself
      opts.push_back({q, p, g.step_s, fallback, r.kind == RoleKind::kSpan});
    }
    if (!opts.empty()) per_primary.push_back(std::move(opts));
  }
  // Primaries whose failure would stop the swarm first, then by what a standby saves over the
  // fallback; on a tie spans first (a failed span's state must be rebuilt by replay, a failed
  // expert peer's pairs only go elsewhere).
  auto gain = [](const std::vector<Option>& v) {
    double best = v[0].failover_s;
    for (const Option& x : v) best = std::min(best, x.failover_s);
    return v[0].fallback_s < 0 ? std::numeric_limits<double>::infinity() : v[0].fallback_s - best;
  };
  std::stable_sort(per_primary.begin(), per_primary.end(), [&](const auto& a, const auto& b) {
    const double ga = gain(a), gb = gain(b);
    return ga != gb ? ga > gb : a[0].span && !b[0].span;
  });
  std::vector<bool> used(static_cast<size_t>(P), false);
  for (int round = 0; round < o.standbys_per_primary; ++round) {
    bool added = false;
    for (const auto& v : per_primary) {
      const Option* pick = nullptr;
      for (const Option& x : v)
        if (!used[static_cast<size_t>(x.peer)] && (pick == nullptr || x.failover_s < pick->failover_s)) pick = &x;
      if (pick == nullptr) continue;
      added = true;
      used[static_cast<size_t>(pick->peer)] = true;
      const PeerRole& r = plan->roles[static_cast<size_t>(pick->primary)];
      Standby sb;
      sb.peer = pick->peer;
      sb.primary = pick->primary;
      if (r.kind == RoleKind::kSpan) {
        sb.first = r.first;
        sb.last = r.last;
      } else {
        sb.experts = r.experts;
      }
      sb.failover_step_s = pick->failover_s;
      sb.fallback_step_s = pick->fallback_s;
      plan->standbys.push_back(std::move(sb));
    }
    if (!added) break;
  }
  // Spans in layer order, then replicas in their primaries' order; a primary's own in round order.
  std::stable_sort(plan->standbys.begin(), plan->standbys.end(), [](const Standby& a, const Standby& b) {
    if (a.replica() != b.replica()) return !a.replica();
    return a.replica() ? a.primary < b.primary : a.first < b.first;
  });
  return Status::ok();
}

std::vector<ExpertSlice> held_experts(const PeerRole& r) {
  std::map<int, std::vector<std::pair<int, int>>> by_layer;
  for (const std::vector<ExpertSlice>* v : {&r.experts, &r.copies})
    for (const ExpertSlice& s : *v) by_layer[s.layer].push_back({s.first, s.last});
  std::vector<ExpertSlice> out;
  for (auto& [l, v] : by_layer) {
    std::sort(v.begin(), v.end());
    for (const auto& [a, b] : v) {
      if (!out.empty() && out.back().layer == l && a <= out.back().last + 1)
        out.back().last = std::max(out.back().last, b);
      else
        out.push_back({l, a, b});
    }
  }
  return out;
}

Status add_span_lanes(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o, SwarmPlan* plan,
                      int max_lanes) {
  if (plan->roles.size() != peers.size())
    return make_error(StatusCode::kInvalidArgument, "plan: {} roles for {} peers", plan->roles.size(), peers.size());
  const int S = o.streams > 0 ? std::min(o.streams, tokens(o)) : tokens(o);
  if (S <= 1 || !o.spans) return Status::ok();  // one stream per step: nothing to share
  MOESH_RETURN_IF_ERROR(evaluate_plan(m, peers, o, plan));
  for (int added = 0; added < max_lanes; ++added) {
    SwarmPlan best;
    bool found = false;
    const double bar = plan->step_s * (1 - kLoadReplicaGain);
    // Per span, the idle peers that fit it, nearest (then fastest) first; the first few are
    // priced (at simulate's scale hundreds of idle peers would be priced over and over).
    constexpr size_t kLaneCandidates = 4;
    std::vector<size_t> idle;
    for (size_t p = 0; p < peers.size(); ++p)
      if (plan->roles[p].kind == RoleKind::kIdle) idle.push_back(p);
    std::stable_sort(idle.begin(), idle.end(), [&](size_t a, size_t b) {
      return peers[a].rtt_s != peers[b].rtt_s ? peers[a].rtt_s < peers[b].rtt_s : peers[a].speed > peers[b].speed;
    });
    for (size_t h = 0; h < peers.size(); ++h) {
      const PeerRole& hr = plan->roles[h];
      if (hr.kind != RoleKind::kSpan || hr.lane_of >= 0) continue;
      uint64_t bytes = 0;
      for (int l = hr.first; l <= hr.last; ++l) bytes += layer_bytes(m, l);
      size_t priced = 0;
      for (size_t p : idle) {
        if (bytes > peers[p].memory_bytes) continue;
        if (priced++ == kLaneCandidates) break;
        SwarmPlan trial = *plan;
        PeerRole& lr = trial.roles[p];
        lr = PeerRole{};
        lr.kind = RoleKind::kSpan;
        lr.first = hr.first;
        lr.last = hr.last;
        lr.lane_of = static_cast<int>(h);
        if (!evaluate_plan(m, peers, o, &trial).is_ok()) continue;
        if (trial.step_s < (found ? best.step_s : bar)) {
          best = std::move(trial);
          found = true;
        }
      }
    }
    if (!found) break;
    *plan = std::move(best);
  }
  return Status::ok();
}

Status add_load_replicas(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o, SwarmPlan* plan,
                         int max_copies) {
  if (m.p.empty() || !o.experts || max_copies <= 0) return Status::ok();
  const int P = static_cast<int>(peers.size()), L = m.n_layer();
  if (static_cast<int>(plan->roles.size()) != P)
    return make_error(StatusCode::kInvalidArgument, "plan: {} roles for {} peers", plan->roles.size(), P);
  MOESH_RETURN_IF_ERROR(evaluate_plan(m, peers, o, plan));
  const uint64_t unit = expert_unit(m);
  std::vector<std::vector<int>> owner(static_cast<size_t>(L), std::vector<int>(static_cast<size_t>(m.n_expert), -1));
  for (int i = 0; i < P; ++i)
    for (const ExpertSlice& s : plan->roles[static_cast<size_t>(i)].experts)
      for (int e = s.first; e <= s.last; ++e) owner[static_cast<size_t>(s.layer)][static_cast<size_t>(e)] = i;
  // The experts a peer computes, by their compute per token (share x cost), hottest first.
  std::vector<std::tuple<double, int, int>> hot;
  for (int l = 0; l < L; ++l) {
    if (!m.layers[static_cast<size_t>(l)].moe || plan->layer_host[static_cast<size_t>(l)] >= 0) continue;
    for (int e = 0; e < m.n_expert; ++e)
      if (owner[static_cast<size_t>(l)][static_cast<size_t>(e)] >= 0)
        hot.emplace_back(m.p_at(l, e) * m.layers[static_cast<size_t>(l)].expert_s, l, e);
  }
  std::stable_sort(hot.begin(), hot.end(),
                   [](const auto& a, const auto& b) { return std::get<0>(a) > std::get<0>(b); });
  if (hot.size() > static_cast<size_t>(4 * max_copies)) hot.resize(static_cast<size_t>(4 * max_copies));
  int added = 0;
  for (const auto& [w, l, e] : hot) {
    if (added >= max_copies) break;
    const double bar = plan->step_s * (1.0 - kLoadReplicaGain);
    int pick = -1;
    SwarmPlan best;
    for (int q = 0; q < P; ++q) {
      const PeerRole& r = plan->roles[static_cast<size_t>(q)];
      if (q == owner[static_cast<size_t>(l)][static_cast<size_t>(e)] || r.kind == RoleKind::kSpan) continue;
      if (r.bytes + unit > peers[static_cast<size_t>(q)].memory_bytes) continue;
      SwarmPlan g = *plan;
      PeerRole& gr = g.roles[static_cast<size_t>(q)];
      if (gr.kind == RoleKind::kIdle) {
        gr = PeerRole{};
        gr.kind = RoleKind::kExperts;
      }
      gr.copies.push_back({l, e, e});
      if (!evaluate_plan(m, peers, o, &g).is_ok()) continue;  // e.g. it holds a copy already
      if (g.step_s < (pick < 0 ? bar : best.step_s)) {
        pick = q;
        best = std::move(g);
      }
    }
    if (pick < 0) continue;
    *plan = std::move(best);
    ++added;
  }
  for (PeerRole& r : plan->roles) {
    if (r.copies.empty()) continue;
    PeerRole c;
    c.copies = r.copies;
    r.copies = held_experts(c);  // merged into ranges
  }
  return evaluate_plan(m, peers, o, plan);
}

Result<SwarmPlan> plan_swarm(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o) {
  MOESH_RETURN_IF_ERROR(check_inputs(m, peers, o));
  const int P = static_cast<int>(peers.size());
  if (P > 4096) return make_error(StatusCode::kInvalidArgument, "plan: {} peers; at most 4096", P);
  Candidate best;
  auto consider = [&](const std::vector<int>& S, const std::vector<int>& E, bool ordered) {
    Candidate c = best_for_split(m, peers, o, S, E, ordered);
    if (c.cost < best.cost) best = std::move(c);
  };
  if (P <= o.exhaustive_peers) {
    for (uint32_t mask = 0; mask < (1u << P); ++mask) {
      std::vector<int> S, E;
      for (int i = 0; i < P; ++i) ((mask >> i) & 1 ? S : E).push_back(i);
      if (!S.empty() && !o.spans) continue;
      if (!E.empty() && !o.experts) E.clear();  // they stay idle
      consider(S, E, false);
    }
  } else {
    // Peers with the most memory are the best spans: try the first k of that order as spans.
    std::vector<int> order(static_cast<size_t>(P));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return peers[static_cast<size_t>(a)].memory_bytes > peers[static_cast<size_t>(b)].memory_bytes;
    });
    // More spans than layers cannot help; k in steps (0-8, then every 4, then every 8, and k_max) keeps
    // the DPs few on hundreds of peers.
    const int k_max = std::min(P, m.n_layer());
    for (int k = 0; k <= k_max; k = k == k_max ? k + 1 : std::min(k_max, k + (k < 8 ? 1 : k < 32 ? 4 : 8))) {
      if (k > 0 && !o.spans) break;
      std::vector<int> S(order.begin(), order.begin() + k), E;
      if (o.experts) E.assign(order.begin() + k, order.end());
      consider(S, E, true);
    }
  }
  if (best.cost == kInf) {
    uint64_t need = m.global_bytes, have = o.backbone_memory_bytes == UINT64_MAX ? 0 : o.backbone_memory_bytes;
    for (int l = 0; l < m.n_layer(); ++l) need += layer_bytes(m, l);
    for (const PlanPeer& p : peers) have += p.memory_bytes;
    have += o.local_experts_bytes;
    return make_error(StatusCode::kOutOfRange,
                      "plan: no assignment holds every layer of '{}' ({} of weights and state; the backbone and {} "
                      "peer(s) offer {}{})",
                      m.name, fmt_bytes(need), P, o.backbone_memory_bytes == UINT64_MAX ? "unlimited + " : "",
                      fmt_bytes(have));
  }
  SwarmPlan plan = materialise(m, peers, o, best);
  MOESH_RETURN_IF_ERROR(evaluate_plan(m, peers, o, &plan));
  return plan;
}

Result<SwarmPlan> plan_with_roles(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o,
                                  const std::vector<RoleKind>& kinds, const std::vector<std::pair<int, int>>& ranges) {
  MOESH_RETURN_IF_ERROR(check_inputs(m, peers, o));
  if (kinds.size() != peers.size() || ranges.size() != peers.size())
    return make_error(StatusCode::kInvalidArgument, "plan: {} roles and {} ranges for {} peers", kinds.size(),
                      ranges.size(), peers.size());
  Candidate c;
  std::vector<bool> covered(static_cast<size_t>(m.n_layer()), false);
  for (size_t i = 0; i < peers.size(); ++i) {
    if (kinds[i] == RoleKind::kExperts) c.expert_peers.push_back(static_cast<int>(i));
    if (kinds[i] != RoleKind::kSpan) continue;
    const auto [first, last] = ranges[i];
    if (first < 0 || last >= m.n_layer() || first > last)
      return make_error(StatusCode::kInvalidArgument, "plan: span {}-{} of peer '{}' is not in the model", first, last,
                        peers[i].name);
    for (int l = first; l <= last; ++l) {
      if (covered[static_cast<size_t>(l)])
        return make_error(StatusCode::kInvalidArgument, "plan: layer {} is in two spans", l);
      covered[static_cast<size_t>(l)] = true;
    }
    c.spans.push_back({static_cast<int>(i), ranges[i]});
  }
  SwarmPlan plan = materialise(m, peers, o, c);
  if (Status s = evaluate_plan(m, peers, o, &plan); !s.is_ok())
    return make_error(StatusCode::kOutOfRange, "{}", s.message());
  return plan;
}

Result<SwarmPlan> plan_all_experts(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o) {
  MOESH_RETURN_IF_ERROR(check_inputs(m, peers, o));
  if (peers.empty()) return make_error(StatusCode::kInvalidArgument, "plan: no peers");
  SwarmPlan plan;
  plan.roles.assign(peers.size(), PeerRole{});
  plan.layer_host.assign(static_cast<size_t>(m.n_layer()), -1);
  const int P = static_cast<int>(peers.size());
  for (int i = 0; i < P; ++i) {
    const int first = i * m.n_expert / P, last = (i + 1) * m.n_expert / P - 1;
    if (first > last) continue;
    plan.roles[static_cast<size_t>(i)].kind = RoleKind::kExperts;
    for (int l = 0; l < m.n_layer(); ++l)
      if (m.layers[static_cast<size_t>(l)].moe) plan.roles[static_cast<size_t>(i)].experts.push_back({l, first, last});
  }
  PlanOptions o2 = o;
  o2.spans = false;
  o2.experts = true;
  if (Status s = evaluate_plan(m, peers, o2, &plan); !s.is_ok())
    return make_error(StatusCode::kOutOfRange, "experts on every peer does not fit: {}", s.message());
  return plan;
}

Result<SwarmPlan> plan_all_spans(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o) {
  MOESH_RETURN_IF_ERROR(check_inputs(m, peers, o));
  const int P = static_cast<int>(peers.size()), L = m.n_layer();
  if (P == 0) return make_error(StatusCode::kInvalidArgument, "plan: no peers");
  PlanOptions o2 = o;
  o2.spans = true;
  // Equal spans over the first k peers: every peer when that fits, else the fewest that fit.
  auto try_k = [&](int k, SwarmPlan* plan) {
    plan->roles.assign(peers.size(), PeerRole{});
    plan->layer_host.assign(static_cast<size_t>(L), -1);
    // Split by MoE blocks (they hold most of the bytes and compute); a dense layer joins the span
    // after it (the leading dense layers the first span), or the last span. More spans than MoE
    // blocks: an even split by layers (a span of dense blocks serves no experts).
    std::vector<int> moe;
    for (int l = 0; l < L; ++l)
      if (m.layers[static_cast<size_t>(l)].moe) moe.push_back(l);
    const int M = static_cast<int>(moe.size());
    // A span ends at the first boundary at or after its share where the model may split.
    int next = 0;
    for (int i = 0; i < k && next < L; ++i) {
      PeerRole& r = plan->roles[static_cast<size_t>(i)];
      r.kind = RoleKind::kSpan;
      r.first = next;
      r.last = i == k - 1 ? L - 1 : k <= M ? moe[static_cast<size_t>((i + 1) * M / k - 1)] : (i + 1) * L / k - 1;
      r.last = std::max(r.last, r.first);
      next = r.last + 1;
      for (int l = r.first; l <= r.last; ++l) plan->layer_host[static_cast<size_t>(l)] = i;
    }
    return evaluate_plan(m, peers, o2, plan);
  };
  SwarmPlan plan;
  Status all = P <= L ? try_k(P, &plan) : make_error(StatusCode::kInvalidArgument, "{} peers for {} layers", P, L);
  if (all.is_ok()) return plan;
  for (int k = 1; k <= std::min(P, L); ++k)
    if (try_k(k, &plan).is_ok()) return plan;
  return make_error(StatusCode::kOutOfRange, "{} equal spans do not fit (nor fewer): {}", P, all.message());
}

std::string format_expert_spec(const std::vector<ExpertSlice>& s, int n_expert) {
  // Group layers with the same expert range into layer runs.
  std::vector<ExpertSlice> v = s;
  std::sort(v.begin(), v.end(), [](const ExpertSlice& a, const ExpertSlice& b) {
    return a.first != b.first ? a.first < b.first : a.last != b.last ? a.last < b.last : a.layer < b.layer;
  });
  struct Run {
    int first_layer, last_layer, first, last;
  };
  std::vector<Run> runs;
  size_t i = 0;
  while (i < v.size()) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1].first == v[i].first && v[j + 1].last == v[i].last &&
           v[j + 1].layer == v[j].layer + 1)
      ++j;
    runs.push_back({v[i].layer, v[j].layer, v[i].first, v[i].last});
    i = j + 1;
  }
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) {
    return a.first_layer != b.first_layer ? a.first_layer < b.first_layer : a.first < b.first;
  });
  std::string out;
  for (const Run& r : runs) {
    if (!out.empty()) out += ',';
    out += r.first_layer == r.last_layer ? fmt::format("{}", r.first_layer)
                                         : fmt::format("{}-{}", r.first_layer, r.last_layer);
    out += ':';
    if (r.first == 0 && r.last == n_expert - 1)
      out += '*';
    else if (r.first == r.last)
      out += fmt::format("{}", r.first);
    else
      out += fmt::format("{}-{}", r.first, r.last);
  }
  return out;
}

std::string render_plan(const PlanModel& m, const std::vector<PlanPeer>& peers, const SwarmPlan& plan) {
  std::string out =
      fmt::format("{:<14} {:<8} {:>9} {:>10} {:>11}  {}\n", "peer", "role", "rtt ms", "holds", "of memory", "what");
  for (size_t i = 0; i < peers.size(); ++i) {
    const PlanPeer& p = peers[i];
    const PeerRole& r = plan.roles[i];
    std::string what = "-";
    if (r.kind == RoleKind::kSpan) what = fmt::format("layers {}-{}", r.first, r.last);
    if (r.kind == RoleKind::kSpan && r.chained_after >= 0)
      what += fmt::format(" (chained after {})", peers[static_cast<size_t>(r.chained_after)].name);
    if (r.kind == RoleKind::kSpan && r.lane_of >= 0)
      what += fmt::format(" (lane of {}: a share of the streams)", peers[static_cast<size_t>(r.lane_of)].name);
    if (r.kind == RoleKind::kExperts) {
      what = "experts " + format_expert_spec(r.experts.empty() ? r.copies : r.experts, m.n_expert);
      if (!r.copies.empty() && !r.experts.empty())
        what += " + copies of " + format_expert_spec(r.copies, m.n_expert);
      else if (!r.copies.empty())
        what += " (copies)";
    }
    std::string role = r.kind == RoleKind::kSpan && r.lane_of >= 0 ? "lane" : role_name(r.kind);
    uint64_t holds = r.bytes;
    for (const Standby& sb : plan.standbys) {
      if (sb.peer != static_cast<int>(i)) continue;
      const std::string& primary = peers[static_cast<size_t>(sb.primary)].name;
      holds = 0;
      if (sb.replica()) {
        role = "replica";
        what = fmt::format("experts {} (for {})", format_expert_spec(sb.experts, m.n_expert), primary);
        holds = plan.roles[static_cast<size_t>(sb.primary)].bytes;
      } else {
        role = "standby";
        what = fmt::format("layers {}-{} (for {})", sb.first, sb.last, primary);
        for (int l = sb.first; l <= sb.last; ++l) holds += layer_bytes(m, l);
      }
    }
    out += fmt::format("{:<14} {:<8} {:>9.1f} {:>10} {:>11}  {}\n", p.name, role, p.rtt_s * 1e3, fmt_bytes(holds),
                       fmt_bytes(p.memory_bytes), what);
  }
  int bb_layers = 0;
  for (int h : plan.layer_host) bb_layers += h < 0;
  out += fmt::format(
      "{:<14} {:<8} {:>9} {:>10} {:>11}  {} layer(s){}\n", "backbone", "", "0", fmt_bytes(plan.backbone_bytes), "",
      bb_layers,
      plan.backbone_experts.empty() ? "" : ", keeps experts " + format_expert_spec(plan.backbone_experts, m.n_expert));
  out += fmt::format("predicted: {:.1f} ms per step, {:.2f} tokens/s, {:.2f} trips per step\n", plan.step_s * 1e3,
                     plan.tokens_per_s, plan.trips_per_step);
  for (const Standby& sb : plan.standbys) {
    out += fmt::format("if {} fails: {:.1f} ms per step on {} {} (the backbone itself: {})\n",
                       peers[static_cast<size_t>(sb.primary)].name, sb.failover_step_s * 1e3,
                       sb.replica() ? "replica" : "standby", peers[static_cast<size_t>(sb.peer)].name,
                       sb.fallback_step_s < 0 ? std::string("does not fit its memory")
                                              : fmt::format("{:.1f} ms", sb.fallback_step_s * 1e3));
  }
  uint64_t widest = m.hidden_bytes;
  for (int b = 0; b <= m.n_layer(); ++b) widest = std::max(widest, m.row_bytes_at(b));
  if (widest > m.hidden_bytes)
    out += fmt::format("span rows carry up to {} bytes per token across a boundary (hidden state: {})\n", widest,
                       m.hidden_bytes);
  return out;
}

Result<PlanModel> plan_model_from_gguf(const gguf::File& f, int n_ctx, double seconds_per_byte) {
  PlanModel m;
  auto arch = f.get<std::string>("general.architecture");
  if (!arch) return arch.status();
  auto or_def = [](auto r, auto def) { return r.is_ok() ? *r : def; };
  m.name = or_def(f.get_or<std::string>("general.name", *arch), *arch);
  auto n_layer = f.get<int64_t>(*arch + ".block_count");
  if (!n_layer) return n_layer.status();
  // NextN/MTP blocks (the last nextn_predict_layers blocks) are not in the forward pass: a draft
  // head the backbone maps from its file only for --draft nextn. They are never given to a span
  // and not priced (a plan is for the forward pass).
  auto n_nextn = f.get_or<int64_t>(*arch + ".nextn_predict_layers", 0);
  if (!n_nextn) return n_nextn.status();
  if (*n_nextn < 0 || *n_nextn >= *n_layer) {
    return make_error(StatusCode::kCorrupt, "plan: {}.nextn_predict_layers = {} must be in [0, {}.block_count = {})",
                      *arch, *n_nextn, *arch, *n_layer);
  }
  *n_layer -= *n_nextn;
  auto n_embd = f.get<int64_t>(*arch + ".embedding_length");
  if (!n_embd) return n_embd.status();
  auto used = f.get_or<int64_t>(*arch + ".expert_used_count", 0);
  if (!used) return used.status();
  m.n_expert_used = static_cast<int>(*used);
  m.hidden_bytes = static_cast<uint64_t>(*n_embd) * 4;
  m.layers.assign(static_cast<size_t>(*n_layer), PlanLayer{});
  for (PlanLayer& L : m.layers) L.moe = false;
  std::vector<uint64_t> exp_bytes(static_cast<size_t>(*n_layer), 0);
  uint64_t head_bytes = 0;
  // A backbone slice (`moesh slice --backbone`) leaves the routed experts out but records each
  // one's layout as "moesh.slice.layout.<tensor>" = [type, ne0, ne1, experts] (swarm.h,
  // kKeyLayoutPrefix): priced as if present, so a gateway started from its slice plans the same
  // swarm as one started from the full file.
  std::vector<gguf::TensorInfo> tensors = f.tensors();
  constexpr std::string_view kLayoutPrefix = "moesh.slice.layout.";
  for (const auto& [key, value] : f.kvs()) {
    if (!key.starts_with(kLayoutPrefix)) continue;
    const std::string name = key.substr(kLayoutPrefix.size());
    if (f.find_tensor(name) != nullptr || name.find("_exps") == std::string::npos) continue;
    auto v = f.get<std::vector<uint64_t>>(key);
    if (!v || v->size() != 4 || !type_is_known(static_cast<uint32_t>((*v)[0])) || (*v)[1] == 0 || (*v)[2] == 0 ||
        (*v)[3] == 0 || (*v)[3] > 65536 || (*v)[1] > UINT32_MAX || (*v)[2] > UINT32_MAX ||
        (*v)[1] % static_cast<uint64_t>(type_block_size(static_cast<GgmlType>((*v)[0]))) != 0) {
      return make_error(StatusCode::kCorrupt, "plan: {} is not [type, ne0, ne1, experts] of a valid tensor", key);
    }
    gguf::TensorInfo t;
    t.name = name;
    t.type = static_cast<GgmlType>((*v)[0]);
    t.n_dims = 3;
    t.ne[0] = static_cast<int64_t>((*v)[1]);
    t.ne[1] = static_cast<int64_t>((*v)[2]);
    t.ne[2] = static_cast<int64_t>((*v)[3]);
    t.n_bytes = type_row_bytes(t.type, t.ne[0]) * static_cast<uint64_t>(t.ne[1]) * static_cast<uint64_t>(t.ne[2]);
    tensors.push_back(std::move(t));
  }
  for (const gguf::TensorInfo& t : tensors) {
    int layer = -1;
    const bool in_block = std::sscanf(t.name.c_str(), "blk.%d.", &layer) == 1 && layer >= 0;
    if (in_block && layer >= *n_layer) continue;  // a NextN block
    if (!in_block) {
      m.global_bytes += t.n_bytes;
      if (t.name == "output.weight") head_bytes = t.n_bytes;
      if (t.name == "token_embd.weight" && head_bytes == 0) head_bytes = t.n_bytes;
      continue;
    }
    PlanLayer& L = m.layers[static_cast<size_t>(layer)];
    if (t.name.find("_exps") != std::string::npos) {
      L.moe = true;
      exp_bytes[static_cast<size_t>(layer)] += t.n_bytes;
      if (t.n_dims >= 3) m.n_expert = std::max(m.n_expert, static_cast<int>(t.ne[2]));
    } else {
      L.dense_bytes += t.n_bytes;
    }
  }
  if (m.n_expert <= 0 || m.n_expert_used <= 0)
    return make_error(StatusCode::kInvalidArgument, "plan: '{}' has no routed experts to place", m.name);
  // KV: n_ctx cells x (K + V) floats per layer; recurrent layers are approximated the same way.
  const int64_t n_head = or_def(f.get_or<int64_t>(*arch + ".attention.head_count", 1), int64_t{1});
  int64_t n_head_kv = n_head;
  if (auto v = f.get<int64_t>(*arch + ".attention.head_count_kv")) n_head_kv = *v;
  const int64_t kl = or_def(f.get_or<int64_t>(*arch + ".attention.key_length", *n_embd / std::max<int64_t>(n_head, 1)),
                            *n_embd / std::max<int64_t>(n_head, 1));
  const int64_t vl = or_def(f.get_or<int64_t>(*arch + ".attention.value_length", kl), kl);
  const uint64_t state = static_cast<uint64_t>(std::max(n_ctx, 0)) * static_cast<uint64_t>(n_head_kv * (kl + vl)) * 4;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    PlanLayer& L = m.layers[l];
    L.state_bytes = state;
    if (L.moe) L.expert_bytes = exp_bytes[l] / static_cast<uint64_t>(m.n_expert);
    L.dense_s = L.dense_bytes * seconds_per_byte;
    L.expert_s = L.expert_bytes * seconds_per_byte;
  }
  m.global_s = head_bytes * seconds_per_byte;
  // Span boundaries: what the model's own runtime sends across (residual-attention checkpoints,
  // a reused indexer selection). An architecture moesh cannot run keeps the default hidden_bytes.
  if (auto hp = load_hparams(f); hp.is_ok() && hp->n_layer == *n_layer) {
    for (int64_t b = 0; b <= *n_layer; ++b) m.row_bytes.push_back(static_cast<uint64_t>(hp->span_row_width(b)) * 4);
  }
  return m;
}

}  // namespace moesh
