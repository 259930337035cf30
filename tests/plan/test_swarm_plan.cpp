// The swarm planner: its search equals brute force over every role assignment on small cases,
// the cost model's structure (a span is one trip, a layer on expert peers is one, local layers
// none), memory limits, and the fixed layouts the headline compares.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "moesh/plan/swarm_plan.h"

namespace moesh {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// n_layer layers (the first n_dense dense), n_expert experts of 1 MiB, dense parts of 2 MiB.
PlanModel toy_model(int n_layer, int n_expert, int k, int n_dense = 0) {
  PlanModel m;
  m.name = "toy";
  m.n_expert = n_expert;
  m.n_expert_used = k;
  m.hidden_bytes = 4096;
  m.global_bytes = 4 * kMiB;
  for (int l = 0; l < n_layer; ++l) {
    PlanLayer L;
    L.moe = l >= n_dense;
    L.dense_bytes = L.moe ? 2 * kMiB : 6 * kMiB;
    L.expert_bytes = L.moe ? kMiB : 0;
    L.state_bytes = kMiB / 4;
    L.dense_s = L.moe ? 0.4e-3 : 1.2e-3;
    L.expert_s = L.moe ? 0.2e-3 : 0;
    m.layers.push_back(L);
  }
  return m;
}

uint64_t whole_layer(const PlanModel& m) {
  return 2 * kMiB + kMiB / 4 + static_cast<uint64_t>(m.n_expert) * kMiB;
}

// The best of plan_with_roles over every assignment: each peer idle, experts, or any span.
double brute_force(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& o) {
  const int P = static_cast<int>(peers.size()), L = m.n_layer();
  std::vector<std::pair<RoleKind, std::pair<int, int>>> choices{{RoleKind::kIdle, {-1, -1}},
                                                                {RoleKind::kExperts, {-1, -1}}};
  for (int f = 0; f < L; ++f)
    for (int l = f; l < L; ++l) choices.push_back({RoleKind::kSpan, {f, l}});
  double best = INFINITY;
  std::vector<RoleKind> kinds(static_cast<size_t>(P));
  std::vector<std::pair<int, int>> ranges(static_cast<size_t>(P));
  std::function<void(int)> rec = [&](int i) {
    if (i == P) {
      auto p = plan_with_roles(m, peers, o, kinds, ranges);
      if (p) best = std::min(best, p->step_s);
      return;
    }
    for (const auto& [k, r] : choices) {
      if (k == RoleKind::kSpan && !o.spans) continue;
      if (k == RoleKind::kExperts && !o.experts) continue;
      kinds[static_cast<size_t>(i)] = k;
      ranges[static_cast<size_t>(i)] = r;
      rec(i + 1);
    }
  };
  rec(0);
  return best;
}

TEST(SwarmPlan, EqualsBruteForceOnRandomSmallSwarms) {
  std::mt19937 rng(7);
  int compared = 0, with_span = 0, with_experts = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int L = 2 + static_cast<int>(rng() % 4), n_dense = static_cast<int>(rng() % 2);
    PlanModel m = toy_model(L, 8, 2, n_dense);
    if (rng() % 2) {  // skewed activations
      m.p.assign(static_cast<size_t>(L), std::vector<double>(8, 0.0));
      for (int l = n_dense; l < L; ++l)
        for (int e = 0; e < 8; ++e) m.p[static_cast<size_t>(l)][static_cast<size_t>(e)] = e < 2 ? 0.7 : 0.6 / 6;
    }
    const int P = 1 + static_cast<int>(rng() % 3);
    std::vector<PlanPeer> peers;
    for (int i = 0; i < P; ++i) {
      PlanPeer p;
      p.name = "p" + std::to_string(i);
      p.memory_bytes = whole_layer(m) * (rng() % 4) + kMiB * (rng() % 9);
      p.rtt_s = 1e-3 * static_cast<double>(1 + rng() % 100);
      p.speed = 0.25 + 0.25 * static_cast<double>(rng() % 8);
      peers.push_back(p);
    }
    PlanOptions o;
    o.message_s = 1e-4;
    o.tokens_per_step = 1 + static_cast<int>(rng() % 4);
    o.local_experts_bytes = kMiB * (rng() % 12);
    if (rng() % 2) o.backbone_memory_bytes = m.global_bytes + (2 * kMiB + kMiB / 4) * (rng() % 4);
    const double bf = brute_force(m, peers, o);
    auto plan = plan_swarm(m, peers, o);
    if (std::isinf(bf)) {
      EXPECT_FALSE(plan.is_ok()) << "trial " << trial << ": brute force finds nothing, the planner a plan";
      if (!plan) EXPECT_EQ(plan.status().code(), StatusCode::kOutOfRange);
      continue;
    }
    ASSERT_TRUE(plan.is_ok()) << "trial " << trial << ": " << plan.status().to_string();
    EXPECT_NEAR(plan->step_s, bf, 1e-12) << "trial " << trial << "\n" << render_plan(m, peers, *plan);
    ++compared;
    for (const PeerRole& r : plan->roles) {
      with_span += r.kind == RoleKind::kSpan;
      with_experts += r.kind == RoleKind::kExperts;
    }
  }
  // The random cases must exercise both roles and many feasible problems.
  EXPECT_GE(compared, 30);
  EXPECT_GT(with_span, 5);
  EXPECT_GT(with_experts, 5);
}

// With RTTs between peers known, adjacent spans are priced as a chain: the search (a DP that
// remembers which span ended at the previous layer) still equals brute force.
TEST(SwarmPlan, ChainedSpansEqualBruteForceOnRandomSmallSwarms) {
  std::mt19937 rng(11);
  int compared = 0, chained = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int L = 2 + static_cast<int>(rng() % 4), n_dense = static_cast<int>(rng() % 2);
    PlanModel m = toy_model(L, 8, 2, n_dense);
    const int P = 2 + static_cast<int>(rng() % 2);
    std::vector<PlanPeer> peers;
    for (int i = 0; i < P; ++i) {
      PlanPeer p;
      p.name = "p" + std::to_string(i);
      p.memory_bytes = whole_layer(m) * (1 + rng() % 3);
      p.rtt_s = 1e-3 * static_cast<double>(20 + rng() % 100);
      p.speed = 0.5 + 0.25 * static_cast<double>(rng() % 4);
      peers.push_back(p);
    }
    PlanOptions o;
    o.message_s = 1e-4;
    o.experts = rng() % 2 == 0;
    o.peer_rtt_s.assign(static_cast<size_t>(P), std::vector<double>(static_cast<size_t>(P), -1.0));
    for (int i = 0; i < P; ++i)
      for (int j = i + 1; j < P; ++j) {
        if (rng() % 4 == 0) continue;  // unknown: star only
        const double r = 1e-3 * static_cast<double>(1 + rng() % 150);
        o.peer_rtt_s[static_cast<size_t>(i)][static_cast<size_t>(j)] = r;
        o.peer_rtt_s[static_cast<size_t>(j)][static_cast<size_t>(i)] = r;
      }
    const double bf = brute_force(m, peers, o);
    auto plan = plan_swarm(m, peers, o);
    if (std::isinf(bf)) {
      EXPECT_FALSE(plan.is_ok()) << "trial " << trial;
      continue;
    }
    ASSERT_TRUE(plan.is_ok()) << "trial " << trial << ": " << plan.status().to_string();
    EXPECT_NEAR(plan->step_s, bf, 1e-12) << "trial " << trial << "\n" << render_plan(m, peers, *plan);
    ++compared;
    for (const PeerRole& r : plan->roles) chained += r.chained_after >= 0;
  }
  EXPECT_GE(compared, 30);
  EXPECT_GT(chained, 5) << "the random cases must chain spans";
}

// Four one-layer spans on peers 100 ms from the backbone and 20 ms from each other: chained, a
// step costs 50 + 3 x 10 + 50 ms of network, not 4 x 100 (plus the same compute); without peer
// RTTs, or with chaining off, it is the star. The table names the chain.
TEST(SwarmPlan, AdjacentSpansChainWhenPeersAreCloserToEachOther) {
  PlanModel m = toy_model(4, 8, 2);
  std::vector<PlanPeer> peers;
  for (int i = 0; i < 4; ++i) peers.push_back({"p" + std::to_string(i), whole_layer(m), 0.1, 1, 0});
  PlanOptions o;
  o.experts = false;
  o.backbone_memory_bytes = m.global_bytes;  // every layer must go to a span
  auto star = plan_swarm(m, peers, o);
  ASSERT_TRUE(star.is_ok()) << star.status().to_string();
  o.peer_rtt_s.assign(4, std::vector<double>(4, 0.02));
  auto chain = plan_swarm(m, peers, o);
  ASSERT_TRUE(chain.is_ok()) << chain.status().to_string();
  // Each of the 3 chained hops also saves one message (o.message_s is 0 here).
  EXPECT_NEAR(star->step_s - chain->step_s, 0.4 - (0.05 + 3 * 0.01 + 0.05), 1e-9);
  EXPECT_EQ(chain->trips_per_step, 4);
  int n_chained = 0;
  for (const PeerRole& r : chain->roles) n_chained += r.chained_after >= 0;
  EXPECT_EQ(n_chained, 3);
  EXPECT_NE(render_plan(m, peers, *chain).find("(chained after p"), std::string::npos);
  o.chain_spans = false;
  auto off = plan_swarm(m, peers, o);
  ASSERT_TRUE(off.is_ok());
  EXPECT_NEAR(off->step_s, star->step_s, 1e-12);
  // Peers farther from each other than from the backbone: chaining would not help, so nothing chains.
  o.chain_spans = true;
  o.peer_rtt_s.assign(4, std::vector<double>(4, 0.3));
  auto far = plan_swarm(m, peers, o);
  ASSERT_TRUE(far.is_ok());
  EXPECT_NEAR(far->step_s, star->step_s, 1e-12);
  // A matrix of the wrong size is refused.
  o.peer_rtt_s.assign(3, std::vector<double>(3, 0.02));
  EXPECT_EQ(plan_swarm(m, peers, o).status().code(), StatusCode::kInvalidArgument);
}

TEST(SwarmPlan, HeuristicForManyPeersIsValidAndNoWorseThanFixedLayouts) {
  PlanModel m = toy_model(12, 16, 4, 1);
  std::vector<PlanPeer> peers;
  for (int i = 0; i < 10; ++i)
    peers.push_back({"p" + std::to_string(i), whole_layer(m) * (1 + i % 4), 0.005 * (1 + i % 5), 1.0, 0});
  PlanOptions o;
  o.message_s = 1e-4;
  o.exhaustive_peers = 6;  // 10 peers: the ordered heuristic
  o.backbone_memory_bytes = m.global_bytes + 8 * kMiB;
  auto plan = plan_swarm(m, peers, o);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  SwarmPlan again = *plan;
  ASSERT_TRUE(evaluate_plan(m, peers, o, &again).is_ok());
  EXPECT_DOUBLE_EQ(again.step_s, plan->step_s);
  for (auto fixed : {plan_all_spans(m, std::vector<PlanPeer>(peers.begin(), peers.begin() + 4), o)}) {
    if (!fixed) continue;
    EXPECT_LE(plan->step_s, fixed->step_s + 1e-12);
  }
}

// Structure of the model: trips per step and who holds what.
TEST(SwarmPlan, TripsPerStepFollowTheRoles) {
  PlanModel m = toy_model(8, 16, 4);
  std::vector<PlanPeer> peers(4);
  for (int i = 0; i < 4; ++i)
    peers[static_cast<size_t>(i)] = {"p" + std::to_string(i), 10 * whole_layer(m), 0.02, 1, 0};
  PlanOptions o;
  o.backbone_memory_bytes = m.global_bytes;  // Petals-style backbone: embeddings and head only
  auto experts = plan_all_experts(m, peers, PlanOptions{});
  ASSERT_TRUE(experts.is_ok()) << experts.status().to_string();
  // Every MoE layer needs at least one peer for a top-4 token over 4 peers: one trip each.
  EXPECT_NEAR(experts->trips_per_step, 8.0, 1e-9);  // exact: no local experts
  EXPECT_EQ(format_expert_spec(experts->roles[1].experts, 16), "0-7:4-7");
  auto spans = plan_all_spans(m, peers, o);
  ASSERT_TRUE(spans.is_ok()) << spans.status().to_string();
  EXPECT_DOUBLE_EQ(spans->trips_per_step, 4.0);
  EXPECT_EQ(spans->roles[2].first, 4);
  EXPECT_EQ(spans->roles[2].last, 5);
  // With room for everything on one peer, one span of all 8 layers: one trip.
  auto best = plan_swarm(m, peers, o);
  ASSERT_TRUE(best.is_ok()) << best.status().to_string();
  EXPECT_DOUBLE_EQ(best->trips_per_step, 1.0);
  EXPECT_LT(best->step_s, spans->step_s);
  int n_span = 0;
  for (const PeerRole& r : best->roles) n_span += r.kind == RoleKind::kSpan;
  EXPECT_EQ(n_span, 1);
  // A backbone holding everything needs nobody.
  PlanOptions big;
  big.local_experts_bytes = 16 * 8 * kMiB;
  auto alone = plan_swarm(m, peers, big);
  ASSERT_TRUE(alone.is_ok());
  EXPECT_DOUBLE_EQ(alone->trips_per_step, 0.0);
  for (const PeerRole& r : alone->roles) EXPECT_EQ(r.kind, RoleKind::kIdle);
}

// A span may hold dense blocks only (its peer serves no experts): more span peers than MoE blocks
// split the layers evenly, and the search may give a peer the leading dense blocks alone.
// Span boundaries with their own row widths (kimi-k3 carries residual checkpoints across, glm-dsa
// a reused indexer selection): the search still equals brute force (whose plans evaluate_plan
// checks the same way) and prices the wider rows on rate-limited links.
TEST(SwarmPlan, SpanBoundariesEqualBruteForceOnRandomSmallSwarms) {
  std::mt19937 rng(23);
  int compared = 0, spans = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int L = 3 + static_cast<int>(rng() % 3), n_dense = static_cast<int>(rng() % 2);
    PlanModel m = toy_model(L, 8, 2, n_dense);
    for (int b = 0; b <= L; ++b) {
      m.row_bytes.push_back(m.hidden_bytes * (1 + rng() % 4));
    }
    const int P = 2 + static_cast<int>(rng() % 2);
    std::vector<PlanPeer> peers;
    for (int i = 0; i < P; ++i) {
      PlanPeer p;
      p.name = "p" + std::to_string(i);
      p.memory_bytes = whole_layer(m) * (1 + rng() % 3);
      p.rtt_s = 1e-3 * static_cast<double>(5 + rng() % 60);
      p.speed = 0.5 + 0.25 * static_cast<double>(rng() % 4);
      p.rate_bps = 1e6 * static_cast<double>(2 + rng() % 50);  // rows cost wire time
      peers.push_back(p);
    }
    PlanOptions o;
    o.message_s = 1e-4;
    o.tokens_per_step = 1 + static_cast<int>(rng() % 8);
    o.experts = rng() % 2 == 0;
    o.peer_rtt_s.assign(static_cast<size_t>(P), std::vector<double>(static_cast<size_t>(P), -1.0));
    for (int i = 0; i < P; ++i)
      for (int j = i + 1; j < P; ++j) {
        const double r = 1e-3 * static_cast<double>(1 + rng() % 60);
        o.peer_rtt_s[static_cast<size_t>(i)][static_cast<size_t>(j)] = r;
        o.peer_rtt_s[static_cast<size_t>(j)][static_cast<size_t>(i)] = r;
      }
    if (rng() % 2) o.backbone_memory_bytes = m.global_bytes + (2 * kMiB + kMiB / 4) * (rng() % 3);
    const double bf = brute_force(m, peers, o);
    auto plan = plan_swarm(m, peers, o);
    if (std::isinf(bf)) {
      EXPECT_FALSE(plan.is_ok()) << "trial " << trial;
      continue;
    }
    ASSERT_TRUE(plan.is_ok()) << "trial " << trial << ": " << plan.status().to_string();
    EXPECT_NEAR(plan->step_s, bf, 1e-12) << "trial " << trial << "\n" << render_plan(m, peers, *plan);
    ++compared;
    for (const PeerRole& r : plan->roles) spans += r.kind == RoleKind::kSpan;
  }
  EXPECT_GE(compared, 30);
  EXPECT_GT(spans, 10);
}

TEST(SwarmPlan, RowWidthsAreWhatASpanCosts) {
  PlanModel m = toy_model(4, 8, 2);
  std::vector<PlanPeer> peers{{"a", 100 * whole_layer(m), 0.02, 1, 8e6}};
  PlanOptions o;
  o.backbone_memory_bytes = m.global_bytes;  // every layer must go to the one span
  auto narrow = plan_swarm(m, peers, o);
  ASSERT_TRUE(narrow.is_ok()) << narrow.status().to_string();
  // The span's rows enter at boundary 0 and leave at 4: 3x and 5x the hidden width send 6 more
  // hidden rows' bytes per step (4096 each) over 8 Mbit/s.
  m.row_bytes = {3 * m.hidden_bytes, m.hidden_bytes, m.hidden_bytes, m.hidden_bytes, 5 * m.hidden_bytes};
  auto wide = plan_swarm(m, peers, o);
  ASSERT_TRUE(wide.is_ok()) << wide.status().to_string();
  EXPECT_NEAR(wide->step_s - narrow->step_s, 6.0 * 4096 * 8 / 8e6, 1e-12);
}

TEST(SwarmPlan, SpansOfDenseBlocksOnly) {
  PlanModel m = toy_model(4, 16, 4, /*n_dense=*/3);
  std::vector<PlanPeer> peers(4);
  for (int i = 0; i < 4; ++i)
    peers[static_cast<size_t>(i)] = {"p" + std::to_string(i), 10 * whole_layer(m), 0.02, 1, 0};
  PlanOptions o;
  o.backbone_memory_bytes = m.global_bytes;
  auto spans = plan_all_spans(m, peers, o);
  ASSERT_TRUE(spans.is_ok()) << spans.status().to_string();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(spans->roles[static_cast<size_t>(i)].first, i);
    EXPECT_EQ(spans->roles[static_cast<size_t>(i)].last, i);
  }
  EXPECT_DOUBLE_EQ(spans->trips_per_step, 4.0);
  // Peers that hold one dense layer each, and one that holds the MoE layer only: the best plan puts
  // dense-only spans on the small ones rather than leave their layers to a backbone without room.
  std::vector<PlanPeer> small = peers;
  for (int i = 0; i < 3; ++i) small[static_cast<size_t>(i)].memory_bytes = 7 * kMiB;
  small[3].memory_bytes = whole_layer(m) + kMiB;
  auto best = plan_swarm(m, small, o);
  ASSERT_TRUE(best.is_ok()) << best.status().to_string();
  int dense_spans = 0;
  for (const PeerRole& r : best->roles)
    if (r.kind == RoleKind::kSpan && r.last < 3) ++dense_spans;
  EXPECT_EQ(dense_spans, 3);
  EXPECT_NEAR(best->step_s, brute_force(m, small, o), 1e-12);
}

// Standbys: a peer the plan leaves idle (too far to pay as a span) holds a span's layers for when
// its peer fails — where the backbone could not run them itself (memory), or would be slower.
TEST(SwarmPlan, AnIdlePeerStandsByForASpanTheBackboneCouldNotTakeOver) {
  PlanModel m = toy_model(8, 16, 4);
  std::vector<PlanPeer> peers = {{"s1", 5 * whole_layer(m), 0.02, 1, 0},
                                 {"s2", 5 * whole_layer(m), 0.02, 1, 0},
                                 {"far", 5 * whole_layer(m), 0.06, 1, 0},
                                 {"tiny", whole_layer(m) / 2, 0.001, 1, 0}};
  PlanOptions o;
  o.backbone_memory_bytes = m.global_bytes;  // it holds the globals only: no fallback
  auto plan = plan_swarm(m, peers, o);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  ASSERT_EQ(plan->roles[0].kind, RoleKind::kSpan) << render_plan(m, peers, *plan);
  ASSERT_EQ(plan->roles[1].kind, RoleKind::kSpan) << render_plan(m, peers, *plan);
  ASSERT_EQ(plan->roles[2].kind, RoleKind::kIdle) << render_plan(m, peers, *plan);
  const double step = plan->step_s;
  ASSERT_TRUE(add_standbys(m, peers, o, &*plan).is_ok());
  EXPECT_EQ(plan->step_s, step) << "a standby changes nothing until a failure";
  ASSERT_EQ(plan->standbys.size(), 1u) << render_plan(m, peers, *plan);  // one idle peer that fits
  const Standby& sb = plan->standbys[0];
  EXPECT_EQ(sb.peer, 2);
  EXPECT_TRUE(sb.primary == 0 || sb.primary == 1);
  EXPECT_EQ(sb.first, plan->roles[static_cast<size_t>(sb.primary)].first);
  EXPECT_EQ(sb.last, plan->roles[static_cast<size_t>(sb.primary)].last);
  EXPECT_LT(sb.fallback_step_s, 0) << "the backbone cannot hold the span";
  // The failover is priced as the plan with the standby in the primary's place: 40 ms further.
  SwarmPlan swapped = *plan;
  swapped.roles[2] = swapped.roles[static_cast<size_t>(sb.primary)];
  swapped.roles[static_cast<size_t>(sb.primary)] = PeerRole{};
  for (int l = sb.first; l <= sb.last; ++l) swapped.layer_host[static_cast<size_t>(l)] = 2;
  ASSERT_TRUE(evaluate_plan(m, peers, o, &swapped).is_ok());
  EXPECT_DOUBLE_EQ(sb.failover_step_s, swapped.step_s);
  EXPECT_NEAR(sb.failover_step_s - step, 0.04, 1e-9);
  EXPECT_NE(render_plan(m, peers, *plan).find("standby  "), std::string::npos) << render_plan(m, peers, *plan);
  EXPECT_NE(render_plan(m, peers, *plan).find("does not fit its memory"), std::string::npos);

  // A backbone that may hold everything runs a failed span itself, faster than a peer 60 ms away:
  // no standby. A slow backbone: the standby again, priced against the fallback it beats.
  PlanOptions roomy;
  auto p2 = plan_swarm(m, peers, roomy);
  ASSERT_TRUE(p2.is_ok());
  ASSERT_TRUE(add_standbys(m, peers, roomy, &*p2).is_ok());
  for (const Standby& x : p2->standbys) EXPECT_LT(x.failover_step_s, x.fallback_step_s);
  if (p2->roles[2].kind == RoleKind::kIdle && !p2->standbys.empty()) ADD_FAILURE() << render_plan(m, peers, *p2);
  PlanOptions slow = roomy;
  slow.backbone_speed = 0.02;
  auto p3 = plan_swarm(m, peers, slow);
  ASSERT_TRUE(p3.is_ok());
  ASSERT_TRUE(add_standbys(m, peers, slow, &*p3).is_ok());
  ASSERT_FALSE(p3->standbys.empty()) << render_plan(m, peers, *p3);
  for (const Standby& x : p3->standbys) {
    EXPECT_GE(x.fallback_step_s, 0);
    EXPECT_LT(x.failover_step_s, x.fallback_step_s);
    EXPECT_NE(x.peer, 3) << "too small to hold a span";
  }
}

// An expert peer's standby is a replica: an idle peer holding the same experts, planned where
// the backbone could not hold them itself (a backbone run from its slice has no copies).
TEST(SwarmPlan, AnIdlePeerReplicatesAnExpertPeerTheBackboneCouldNotReplace) {
  PlanModel m = toy_model(4, 16, 4);
  // Spans off: "near" holds every expert, "far" and "farther" are left idle; "small" cannot
  // hold near's experts.
  std::vector<PlanPeer> peers = {{"near", 64 * kMiB, 0.01, 1, 0},
                                 {"farther", 64 * kMiB, 0.08, 1, 0},
                                 {"far", 64 * kMiB, 0.03, 1, 0},
                                 {"small", 16 * kMiB, 0.001, 1, 0}};
  PlanOptions o;
  o.spans = false;
  o.message_s = 1e-4;
  o.backbone_memory_bytes = m.global_bytes + 4 * (2 * kMiB + kMiB / 4);  // its layers' dense parts only
  auto plan = plan_swarm(m, peers, o);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  // The fill puts the experts on the nearest peers first: small takes 16, near the other 48.
  ASSERT_EQ(plan->roles[0].kind, RoleKind::kExperts) << render_plan(m, peers, *plan);
  ASSERT_EQ(plan->roles[1].kind, RoleKind::kIdle) << render_plan(m, peers, *plan);
  ASSERT_EQ(plan->roles[2].kind, RoleKind::kIdle) << render_plan(m, peers, *plan);
  ASSERT_EQ(plan->roles[3].kind, RoleKind::kExperts) << render_plan(m, peers, *plan);
  const double step = plan->step_s;
  ASSERT_TRUE(add_standbys(m, peers, o, &*plan).is_ok());
  EXPECT_EQ(plan->step_s, step) << "a replica changes nothing until a failure";
  ASSERT_EQ(plan->standbys.size(), 2u) << render_plan(m, peers, *plan);
  for (const Standby& sb : plan->standbys) {
    EXPECT_TRUE(sb.replica());
    EXPECT_EQ(sb.experts, plan->roles[static_cast<size_t>(sb.primary)].experts);
    EXPECT_LT(sb.fallback_step_s, 0) << "the backbone cannot hold the experts";
    // Priced as the plan with the replica in the primary's place.
    SwarmPlan swapped = *plan;
    swapped.roles[static_cast<size_t>(sb.peer)] = swapped.roles[static_cast<size_t>(sb.primary)];
    swapped.roles[static_cast<size_t>(sb.primary)] = PeerRole{};
    ASSERT_TRUE(evaluate_plan(m, peers, o, &swapped).is_ok());
    EXPECT_DOUBLE_EQ(sb.failover_step_s, swapped.step_s);
  }
  // Each primary gets the replica that fails over fastest: the nearer idle peer for one of them,
  // the farther for the other; near's replica gets 48 experts' worth, small's 16.
  EXPECT_NE(plan->standbys[0].peer, plan->standbys[1].peer);
  const std::string text = render_plan(m, peers, *plan);
  EXPECT_NE(text.find("replica "), std::string::npos) << text;
  EXPECT_NE(text.find("(for near)"), std::string::npos) << text;
  EXPECT_NE(text.find("on replica"), std::string::npos) << text;
  // A backbone that may hold everything computes a failed peer's pairs itself, with no trip at
  // all: no replica.
  PlanOptions roomy = o;
  roomy.backbone_memory_bytes = UINT64_MAX;
  auto p2 = plan_swarm(m, peers, roomy);
  ASSERT_TRUE(p2.is_ok());
  ASSERT_TRUE(add_standbys(m, peers, roomy, &*p2).is_ok());
  EXPECT_TRUE(p2->standbys.empty()) << render_plan(m, peers, *p2);
}

TEST(SwarmPlan, AFarSmallPeerGetsNothingWhenTheNearOnesSuffice) {
  PlanModel m = toy_model(8, 16, 4);
  std::vector<PlanPeer> peers(4);
  for (int i = 0; i < 4; ++i) peers[static_cast<size_t>(i)] = {"p" + std::to_string(i), 3 * whole_layer(m), 0.02, 1, 0};
  PlanOptions o;
  o.backbone_memory_bytes = m.global_bytes;
  auto four = plan_swarm(m, peers, o);
  ASSERT_TRUE(four.is_ok()) << four.status().to_string();
  peers.push_back({"phone", 8 * kMiB, 0.08, 0.3, 0});
  auto five = plan_swarm(m, peers, o);
  ASSERT_TRUE(five.is_ok());
  EXPECT_LE(five->step_s, four->step_s);
  EXPECT_EQ(five->roles[4].kind, RoleKind::kIdle) << render_plan(m, peers, *five);
  // When the others cannot hold the model the phone must take experts: 4 x 27 experts < 8 x 16,
  // and a span (one layer at most) frees nothing.
  PlanOptions roomy;
  std::vector<PlanPeer> short_of(4);
  for (int i = 0; i < 4; ++i)
    short_of[static_cast<size_t>(i)] = {"p" + std::to_string(i), whole_layer(m) * 3 / 2, 0.02, 1, 0};
  auto tight = plan_swarm(m, short_of, roomy);
  ASSERT_FALSE(tight.is_ok());
  EXPECT_EQ(tight.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(tight.status().message().find("no assignment holds every layer"), std::string::npos);
  short_of.push_back({"phone", 24 * kMiB, 0.08, 0.3, 0});
  auto with_phone = plan_swarm(m, short_of, roomy);
  ASSERT_TRUE(with_phone.is_ok()) << with_phone.status().to_string();
  EXPECT_EQ(with_phone->roles[4].kind, RoleKind::kExperts);
}

// Measured activations: the fill hands each layer's experts out hottest first — the backbone's
// budget, then the nearest peer — so the far peer holds the coldest and is needed least often.
TEST(SwarmPlan, HotExpertsGoToTheNearestHolderAndColdOnesFarthest) {
  PlanModel m = toy_model(2, 8, 2);
  // Experts 6 and 7 take 0.7 of the tokens each, the other six 0.1.
  m.p.assign(2, std::vector<double>(8, 0.1));
  for (auto& layer : m.p) layer[6] = layer[7] = 0.7;
  // Spans off: the near peer holds 4 experts, the far one the other 12; the backbone none.
  std::vector<PlanPeer> peers{{"near", 4 * kMiB, 0.005, 1, 0}, {"far", 12 * kMiB, 0.05, 1, 0}};
  PlanOptions o;
  o.spans = false;
  o.message_s = 1e-4;
  auto hot = plan_swarm(m, peers, o);
  ASSERT_TRUE(hot.is_ok()) << hot.status().to_string();
  // Layer 0's four slots on the near peer: the two hot experts, then 0 and 1 (ties by id).
  EXPECT_EQ(format_expert_spec(hot->roles[0].experts, 8), "0:0-1,0:6-7") << render_plan(m, peers, *hot);
  EXPECT_EQ(format_expert_spec(hot->roles[1].experts, 8), "0:2-5,1:*");
  // The same roles with the experts by id (the hot ones far) are predicted slower: the far peer
  // is then needed by 1 - 0.9^2 x 0.3^2 = 92.7 % of layer 0's tokens, not 1 - 0.9^4 = 34.4 %.
  SwarmPlan by_id = *hot;
  by_id.roles[0].experts = {{0, 0, 3}};
  by_id.roles[1].experts = {{0, 4, 7}, {1, 0, 7}};
  ASSERT_TRUE(evaluate_plan(m, peers, o, &by_id).is_ok());
  EXPECT_GT(by_id.step_s - hot->step_s, 0.5 * (0.927 - 0.344) * (0.05 - 0.005));
  EXPECT_DOUBLE_EQ(by_id.trips_per_step, hot->trips_per_step);  // every layer still makes its trip
  // A local budget of 10 experts: layer 0 whole, then layer 1's two hot ones; the far peer serves
  // only cold experts of layer 1, so fewer steps need a trip at all.
  o.local_experts_bytes = 10 * kMiB;
  auto local = plan_swarm(m, peers, o);
  ASSERT_TRUE(local.is_ok()) << local.status().to_string();
  EXPECT_EQ(format_expert_spec(local->backbone_experts, 8), "0:*,1:6-7") << render_plan(m, peers, *local);
  EXPECT_EQ(format_expert_spec(local->roles[0].experts, 8), "1:0-3");
  EXPECT_EQ(format_expert_spec(local->roles[1].experts, 8), "1:4-5");
  // Layer 1 makes a trip when the token needs one of the six cold experts (the model treats
  // experts as independent draws): 1 - 0.9^6, against 1 for the same budget by id.
  EXPECT_NEAR(local->trips_per_step, 1 - std::pow(0.9, 6), 1e-12);
}

// Load-sharing replicas (add_load_replicas): with many tokens per step on slow peers, a hot
// expert makes its holder the slowest of every step; a copy on the other near peer splits its pairs
// and the predicted step drops. A far peer shares nothing (the runtime sends it no pairs while a
// near holder is up), uniform activations add nothing, and a copy of one's own expert or of a span
// layer's is not a valid plan.
// Many streams: a peer left idle that fits a span's layers runs them beside the span's peer for a
// share of the streams (a lane), each holder computing T / n rows; one stream gets none.
TEST(SwarmPlan, LanesShareASpansStreamsAmongIdlePeers) {
  PlanModel m = toy_model(4, 8, 2);
  const uint64_t all = 4 * whole_layer(m);
  // The backbone holds only the globals: the layers go to a peer as one span.
  std::vector<PlanPeer> peers{{"a", all, 0.005, 1, 0}, {"b", all, 0.005, 1, 0}, {"small", all / 8, 0.005, 1, 0}};
  PlanOptions o;
  o.backbone_memory_bytes = 8 * kMiB;
  o.experts = false;
  o.message_s = 1e-4;
  o.tokens_per_step = 16;
  auto plan = plan_swarm(m, peers, o);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  int span_peer = -1;
  for (size_t i = 0; i < peers.size(); ++i)
    if (plan->roles[i].kind == RoleKind::kSpan) span_peer = static_cast<int>(i);
  ASSERT_GE(span_peer, 0) << render_plan(m, peers, *plan);
  const int other = span_peer == 0 ? 1 : 0;
  ASSERT_EQ(plan->roles[static_cast<size_t>(other)].kind, RoleKind::kIdle);
  SwarmPlan with = *plan;
  ASSERT_TRUE(add_span_lanes(m, peers, o, &with).is_ok());
  const PeerRole& lane = with.roles[static_cast<size_t>(other)];
  EXPECT_EQ(lane.kind, RoleKind::kSpan) << render_plan(m, peers, with);
  EXPECT_EQ(lane.lane_of, span_peer);
  EXPECT_EQ(lane.first, plan->roles[static_cast<size_t>(span_peer)].first);
  EXPECT_EQ(lane.last, plan->roles[static_cast<size_t>(span_peer)].last);
  EXPECT_EQ(with.roles[2].kind, RoleKind::kIdle);  // too small for the span
  // Two equal holders of 8 rows each: the span's compute halves, its round trip stays.
  double compute16 = 0;
  for (const PlanLayer& L : m.layers) compute16 += (L.dense_s + 2 * L.expert_s) * 16;
  EXPECT_NEAR(plan->step_s - with.step_s, compute16 / 2, 1e-9) << render_plan(m, peers, with);
  EXPECT_DOUBLE_EQ(with.trips_per_step, plan->trips_per_step);  // in flight together: one wait
  EXPECT_NE(render_plan(m, peers, with).find("lane of"), std::string::npos);
  // A lane is priced by evaluate_plan as given; one of a peer running no such span is refused.
  SwarmPlan again = with;
  ASSERT_TRUE(evaluate_plan(m, peers, o, &again).is_ok());
  EXPECT_DOUBLE_EQ(again.step_s, with.step_s);
  SwarmPlan bad = with;
  bad.roles[static_cast<size_t>(other)].lane_of = 2;
  Status st = evaluate_plan(m, peers, o, &bad);
  EXPECT_NE(st.message().find("does not run that span"), std::string::npos) << st.to_string();
  // One token per step: nothing to share.
  PlanOptions one = o;
  one.tokens_per_step = 1;
  auto single = plan_swarm(m, peers, one);
  ASSERT_TRUE(single.is_ok());
  ASSERT_TRUE(add_span_lanes(m, peers, one, &*single).is_ok());
  for (const PeerRole& r : single->roles) EXPECT_LT(r.lane_of, 0);
  // Standbys price the span's failure with its lanes going on beside the standby.
  PlanOptions three = o;
  std::vector<PlanPeer> four = peers;
  four.push_back({"d", all, 0.005, 1, 0});
  auto p4 = plan_swarm(m, four, three);
  ASSERT_TRUE(p4.is_ok());
  ASSERT_TRUE(add_span_lanes(m, four, three, &*p4, /*max_lanes=*/1).is_ok());
  ASSERT_TRUE(add_standbys(m, four, three, &*p4).is_ok());
  ASSERT_EQ(p4->standbys.size(), 1u) << render_plan(m, four, *p4);
  EXPECT_EQ(four[static_cast<size_t>(p4->standbys[0].primary)].name,
            four[static_cast<size_t>([&] {
              for (size_t i = 0; i < four.size(); ++i)
                if (p4->roles[i].kind == RoleKind::kSpan && p4->roles[i].lane_of < 0) return static_cast<int>(i);
              return -1;
            }())]
                .name);
  EXPECT_GT(p4->standbys[0].failover_step_s, 0);
}

TEST(SwarmPlan, LoadReplicasSplitAHotExpertsPairsOverNearPeers) {
  PlanModel m = toy_model(2, 8, 2);
  m.p.assign(2, std::vector<double>(8, 1.05 / 7));
  for (auto& layer : m.p) layer[0] = 0.95;  // nearly every token routes to expert 0
  std::vector<PlanPeer> peers{
      {"a", 20 * kMiB, 0.002, 0.02, 0}, {"b", 20 * kMiB, 0.002, 0.02, 0}, {"far", 20 * kMiB, 0.08, 0.02, 0}};
  PlanOptions o;
  o.spans = false;
  o.message_s = 1e-4;
  o.tokens_per_step = 32;
  auto plan = plan_swarm(m, peers, o);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  const double before = plan->step_s;
  SwarmPlan with = *plan;
  ASSERT_TRUE(add_load_replicas(m, peers, o, &with).is_ok());
  EXPECT_LT(with.step_s, 0.9 * before) << render_plan(m, peers, with);
  int copies_of_0 = 0;
  for (size_t i = 0; i < peers.size(); ++i) {
    for (const ExpertSlice& c : with.roles[i].copies) {
      EXPECT_NE(i, 2u) << "the far peer shares no pairs";
      if (c.first <= 0 && c.last >= 0) ++copies_of_0;
    }
  }
  EXPECT_EQ(copies_of_0, 2);  // expert 0 of each layer, on the near peer that does not own it
  SwarmPlan again = with;
  ASSERT_TRUE(evaluate_plan(m, peers, o, &again).is_ok());
  EXPECT_DOUBLE_EQ(again.step_s, with.step_s);
  // What a peer holds, for `moesh worker --experts` and the gateway's re-plan: experts and copies.
  for (size_t i = 0; i < 2; ++i) {
    uint64_t n = 0;
    for (const ExpertSlice& x : held_experts(with.roles[i])) n += static_cast<uint64_t>(x.last - x.first + 1);
    uint64_t own = 0, copied = 0;
    for (const ExpertSlice& x : with.roles[i].experts) own += static_cast<uint64_t>(x.last - x.first + 1);
    for (const ExpertSlice& x : with.roles[i].copies) copied += static_cast<uint64_t>(x.last - x.first + 1);
    EXPECT_EQ(n, own + copied);
  }
  // Uniform activations: nothing added.
  PlanModel u = toy_model(2, 8, 2);
  auto up = plan_swarm(u, peers, o);
  ASSERT_TRUE(up.is_ok());
  SwarmPlan uw = *up;
  ASSERT_TRUE(add_load_replicas(u, peers, o, &uw).is_ok());
  for (const PeerRole& r : uw.roles) EXPECT_TRUE(r.copies.empty());
  // Invalid copies.
  SwarmPlan bad = *plan;
  const int owner0 = [&] {
    for (size_t i = 0; i < peers.size(); ++i)
      for (const ExpertSlice& x : plan->roles[i].experts)
        if (x.layer == 0 && x.first <= 0 && x.last >= 0) return static_cast<int>(i);
    return -1;
  }();
  ASSERT_GE(owner0, 0);
  bad.roles[static_cast<size_t>(owner0)].copies.push_back({0, 0, 0});
  Status st = evaluate_plan(m, peers, o, &bad);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("copied to a peer holding it"), std::string::npos) << st.to_string();
  bad = *plan;
  bad.roles[static_cast<size_t>(owner0)].copies.push_back({5, 0, 0});
  EXPECT_FALSE(evaluate_plan(m, peers, o, &bad).is_ok());
}

TEST(SwarmPlan, MoreTokensPerStepRaiseComputeNotTrips) {
  PlanModel m = toy_model(6, 16, 4);
  std::vector<PlanPeer> peers{{"a", 3 * whole_layer(m), 0.02, 1, 0}, {"b", 3 * whole_layer(m), 0.02, 1, 0}};
  PlanOptions one, many;
  one.backbone_memory_bytes = many.backbone_memory_bytes = m.global_bytes;
  many.tokens_per_step = 8;
  auto a = plan_swarm(m, peers, one), b = plan_swarm(m, peers, many);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_DOUBLE_EQ(a->trips_per_step, b->trips_per_step);
  EXPECT_GT(b->step_s, a->step_s);
  EXPECT_GT(b->tokens_per_s, 2 * a->tokens_per_s);
}

TEST(SwarmPlan, RejectsBadInputsByName) {
  PlanModel m = toy_model(4, 8, 2);
  std::vector<PlanPeer> peers{{"slow", kMiB, 0.01, 0, 0}};
  auto r = plan_swarm(m, peers, PlanOptions{});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("'slow'"), std::string::npos);
  PlanModel none = m;
  none.n_expert_used = 0;
  EXPECT_EQ(plan_swarm(none, {}, PlanOptions{}).status().code(), StatusCode::kInvalidArgument);
  PlanModel bad_p = m;
  bad_p.p.assign(4, std::vector<double>(8, 1.5));
  EXPECT_NE(plan_swarm(bad_p, {}, PlanOptions{}).status().message().find("outside [0,1]"), std::string::npos);
  // A hand-made plan holding an expert twice is refused.
  std::vector<PlanPeer> two{{"a", 100 * kMiB, 0.01, 1, 0}, {"b", 100 * kMiB, 0.01, 1, 0}};
  auto ex = plan_all_experts(m, two, PlanOptions{});
  ASSERT_TRUE(ex.is_ok());
  SwarmPlan twice = *ex;
  twice.roles[1].experts.push_back({0, 0, 0});
  Status s = evaluate_plan(m, two, PlanOptions{}, &twice);
  EXPECT_NE(s.message().find("held twice"), std::string::npos) << s.to_string();
}

TEST(SwarmPlan, ExpertSpecMergesLayerRuns) {
  std::vector<ExpertSlice> s{{0, 0, 15}, {1, 0, 15}, {2, 0, 15}, {3, 0, 7}, {4, 0, 7}, {6, 3, 3}};
  EXPECT_EQ(format_expert_spec(s, 16), "0-2:*,3-4:0-7,6:3");
}

}  // namespace
}  // namespace moesh
