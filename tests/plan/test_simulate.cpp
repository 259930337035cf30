// The swarm simulator: with nothing random it reproduces the planner's cost model exactly (spans)
// or in expectation (expert fan-out); trips per step follow the roles; failures are survived with
// the replay the real backbone does; drafts multiply tokens per step; the large shapes load.
#include <gtest/gtest.h>

#include "moesh/plan/simulate.h"

namespace moesh {
namespace {

constexpr uint64_t kSimMiB = 1ull << 20;

PlanModel model(int n_layer) {
  PlanModel m;
  m.name = "toy";
  m.n_expert = 16;
  m.n_expert_used = 4;
  m.hidden_bytes = 4096;
  m.global_bytes = 4 * kSimMiB;
  m.global_s = 1e-4;
  for (int l = 0; l < n_layer; ++l) m.layers.push_back({true, 2 * kSimMiB, kSimMiB, kSimMiB / 4, 4e-4, 2e-4});
  return m;
}

std::vector<PlanPeer> four(double rtt) {
  std::vector<PlanPeer> p;
  for (int i = 0; i < 4; ++i) p.push_back({"p" + std::to_string(i), 1ull << 34, rtt, 1, 0});
  return p;
}

TEST(Simulate, SpansMatchThePlannerExactly) {
  const PlanModel m = model(8);
  const auto peers = four(0.02);
  PlanOptions po;
  po.message_s = 1e-4;
  auto plan = plan_all_spans(m, peers, po);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  SimOptions so;
  so.steps = 10;
  auto r = simulate(m, peers, po, *plan, so);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->steps, 10);
  EXPECT_EQ(r->tokens, 10);
  EXPECT_DOUBLE_EQ(r->trips_per_step, 4.0);
  EXPECT_EQ(r->messages, 10 * 4 * 2);
  EXPECT_NEAR(r->step_mean_s, plan->step_s, 1e-9);
  EXPECT_NEAR(r->step_p99_s, plan->step_s, 1e-9);
  EXPECT_NEAR(r->tokens_per_s, plan->tokens_per_s, 1e-6);  // the run ends with its last step
}

// Chained spans (peers 10 ms apart, 40 ms from the backbone): the simulator passes rows peer to
// peer as the plan says and its step equals the planner's chain price exactly.
TEST(Simulate, ChainedSpansMatchThePlannerExactly) {
  const PlanModel m = model(8);
  const auto peers = four(0.04);
  PlanOptions po;
  po.message_s = 1e-4;
  po.peer_rtt_s.assign(4, std::vector<double>(4, 0.01));
  auto plan = plan_all_spans(m, peers, po);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  int chained = 0;
  for (const PeerRole& r : plan->roles) chained += r.chained_after >= 0;
  EXPECT_EQ(chained, 3);
  PlanOptions star_po = po;
  star_po.chain_spans = false;
  auto star = plan_all_spans(m, peers, star_po);
  ASSERT_TRUE(star.is_ok());
  EXPECT_NEAR(star->step_s - plan->step_s, 3 * (0.04 - 0.005 + 1e-4), 1e-9);
  SimOptions so;
  so.steps = 10;
  auto r = simulate(m, peers, po, *plan, so);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->steps, 10);
  EXPECT_DOUBLE_EQ(r->trips_per_step, 4.0);
  EXPECT_EQ(r->messages, 10 * (1 + 3 + 4));  // the head, 3 hops, 4 returns (3 of them log copies)
  EXPECT_NEAR(r->step_mean_s, plan->step_s, 1e-9);
  // A peer that may fail is not chained to or from (the runtime finishes broken chains
  // star-style): p0 and p1 go star, the chain p2 -> p3 stays.
  so.failures = {{1, 1e9}};
  auto rs = simulate(m, peers, po, *plan, so);
  ASSERT_TRUE(rs.is_ok());
  EXPECT_NEAR(rs->step_mean_s, star->step_s - (0.04 - 0.005 + 1e-4), 1e-9);
}

TEST(Simulate, ExpertFanOutMatchesThePlannerInExpectation) {
  const PlanModel m = model(8);
  auto peers = four(0.02);
  peers[3].rtt_s = 0.05;  // one far peer: the expected max matters
  PlanOptions po;
  po.message_s = 1e-4;
  auto plan = plan_all_experts(m, peers, po);
  ASSERT_TRUE(plan.is_ok());
  SimOptions so;
  so.steps = 400;
  auto r = simulate(m, peers, po, *plan, so);
  ASSERT_TRUE(r.is_ok());
  EXPECT_DOUBLE_EQ(r->trips_per_step, 8.0);  // every MoE layer needs a peer
  EXPECT_NEAR(r->step_mean_s / plan->step_s, 1.0, 0.03) << r->step_mean_s << " vs " << plan->step_s;
}

TEST(Simulate, LocalLayersMakeNoTrips) {
  const PlanModel m = model(4);
  const auto peers = four(0.02);
  PlanOptions po;
  po.local_experts_bytes = 4 * 16 * kSimMiB;
  auto plan = plan_swarm(m, peers, po);
  ASSERT_TRUE(plan.is_ok());
  auto r = simulate(m, peers, po, *plan, SimOptions{});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->messages, 0);
  EXPECT_DOUBLE_EQ(r->trips_per_step, 0.0);
}

TEST(Simulate, AFailedSpanPeerIsReplayedOnTheBackbone) {
  const PlanModel m = model(8);
  const auto peers = four(0.02);
  PlanOptions po;
  auto plan = plan_all_spans(m, peers, po);
  ASSERT_TRUE(plan.is_ok());
  SimOptions so;
  so.steps = 20;
  so.prompt_rows = 16;
  so.timeout_s = 0.5;
  so.failures = {{2, 0.3}};
  auto r = simulate(m, peers, po, *plan, so);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->steps, 20);
  EXPECT_EQ(r->tokens, 20);
  EXPECT_EQ(r->failovers, 1);
  EXPECT_GE(r->replayed_rows, 16);    // the prompt and the tokens before the failure
  EXPECT_LT(r->trips_per_step, 4.0);  // span 2 runs on the backbone afterwards
  EXPECT_GT(r->step_p99_s, 0.5);      // the step that waited for the timeout
}

// Span lanes (add_span_lanes): with 8 streams a span of every layer on p0 and its lane on p1 each
// take 4 streams in flight at once — the step equals the planner's price exactly, one wait per
// step. A lane that stops answering is dropped after the timeout: its streams' rows so far are
// replayed on the span's peer, which then takes every stream.
TEST(Simulate, LanesShareTheStreamsAsThePlannerPricesThem) {
  const PlanModel m = model(4);
  std::vector<PlanPeer> peers = four(0.02);
  peers.resize(2);
  PlanOptions po;
  po.message_s = 1e-4;
  po.tokens_per_step = 8;
  po.backbone_memory_bytes = 8 * kSimMiB;  // the globals only: the layers go to a span
  auto plan = plan_swarm(m, peers, po);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  ASSERT_TRUE(add_span_lanes(m, peers, po, &*plan).is_ok());
  int lanes = 0;
  for (const PeerRole& r : plan->roles) lanes += r.lane_of >= 0;
  ASSERT_EQ(lanes, 1) << render_plan(m, peers, *plan);
  SimOptions so;
  so.steps = 10;
  so.streams = 8;
  auto r = simulate(m, peers, po, *plan, so);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->tokens, 80);
  EXPECT_DOUBLE_EQ(r->trips_per_step, 1.0);
  EXPECT_EQ(r->messages, 10 * 2 * 2);  // both holders, there and back
  EXPECT_NEAR(r->step_mean_s, plan->step_s, 1e-9);
  EXPECT_NEAR(r->peer_busy_s[0], r->peer_busy_s[1], 1e-12);  // 4 streams each
  // The lane fails at 0.3 s (a 0.5 s timeout): its 4 streams go to the span's peer.
  const int lane = plan->roles[0].lane_of >= 0 ? 0 : 1;
  so.steps = 20;
  so.prompt_rows = 16;
  so.timeout_s = 0.5;
  so.failures = {{lane, 0.3}};
  r = simulate(m, peers, po, *plan, so);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->steps, 20);
  EXPECT_EQ(r->tokens, 160);
  EXPECT_EQ(r->failovers, 1);
  EXPECT_GE(r->replayed_rows, 4 * 16);  // its streams' prompts at least
  EXPECT_GT(r->step_p99_s, 0.5);        // the step that waited for the timeout
  EXPECT_GT(r->peer_busy_s[static_cast<size_t>(1 - lane)], r->peer_busy_s[static_cast<size_t>(lane)]);
}

// A batch reads a layer's weights once (PlanModel::row_share < 1): a span's compute of T rows is
// 1 + r (T - 1) rows', in the planner and the simulator alike, so a lane (each holder half the
// rows) gains less than with linear compute, and the simulated step still equals the planned one.
TEST(Simulate, ARowShareBelowOnePricesBatchesAsThePlannerDoes) {
  PlanModel m = model(4);
  std::vector<PlanPeer> peers = four(0.02);
  peers.resize(2);
  PlanOptions po;
  po.message_s = 1e-4;
  po.tokens_per_step = 8;
  po.backbone_memory_bytes = 8 * kSimMiB;
  auto linear = plan_swarm(m, peers, po);
  ASSERT_TRUE(linear.is_ok());
  m.row_share = 0.5;
  EXPECT_DOUBLE_EQ(m.rows_cost(8), 4.5);
  EXPECT_DOUBLE_EQ(m.rows_cost(1), 1.0);
  EXPECT_DOUBLE_EQ(m.rows_cost(0.5), 0.5);
  auto plan = plan_swarm(m, peers, po);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  // The span's compute shrinks from 8 rows' to 4.5 rows'; its trip and wire do not.
  double per_row = 0;
  for (const PlanLayer& L : m.layers) per_row += L.dense_s + (L.moe ? m.n_expert_used * L.expert_s : 0.0);
  EXPECT_NEAR(linear->step_s - plan->step_s, per_row * 3.5 + m.global_s * 3.5, 1e-12);
  const double before = plan->step_s;
  ASSERT_TRUE(add_span_lanes(m, peers, po, &*plan).is_ok());
  int lanes = 0;
  for (const PeerRole& r : plan->roles) lanes += r.lane_of >= 0;
  ASSERT_EQ(lanes, 1) << render_plan(m, peers, *plan);
  // Each holder computes 4 rows: 1 + 0.5 x 3 = 2.5 rows' compute, not 4.5 / 2.
  EXPECT_NEAR(before - plan->step_s, per_row * (4.5 - 2.5), 1e-12);
  SimOptions so;
  so.steps = 10;
  so.streams = 8;
  auto r = simulate(m, peers, po, *plan, so);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_NEAR(r->step_mean_s, plan->step_s, 1e-9);
}

// With a standby in the plan (add_standbys), the failed span goes to it, not to the
// backbone: the rows it was sent are replayed there, the later steps cost what the planner priced
// for the failover, and the backbone computes none of the span.
TEST(Simulate, AFailedSpanPeerFailsOverToItsStandby) {
  const PlanModel m = model(8);
  const auto peers = four(0.02);  // one holds every layer as a span (fewest trips), the rest idle
  PlanOptions po;
  po.message_s = 1e-4;
  po.backbone_memory_bytes = m.global_bytes;  // the backbone cannot take a span over
  auto plan = plan_swarm(m, peers, po);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  ASSERT_TRUE(add_standbys(m, peers, po, &*plan).is_ok());
  ASSERT_EQ(plan->standbys.size(), 1u) << render_plan(m, peers, *plan);
  const Standby sb = plan->standbys[0];
  ASSERT_EQ(plan->roles[static_cast<size_t>(sb.peer)].kind, RoleKind::kIdle);
  SimOptions so;
  so.steps = 30;
  so.prompt_rows = 16;
  so.timeout_s = 0.5;
  so.failures = {{sb.primary, 0.3}};
  auto r = simulate(m, peers, po, *plan, so);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->steps, 30);
  EXPECT_EQ(r->failovers, 1);
  EXPECT_GE(r->replayed_rows, 16);
  EXPECT_GT(r->peer_busy_s[static_cast<size_t>(sb.peer)], 0.0) << "the standby serves the span";
  EXPECT_DOUBLE_EQ(r->trips_per_step, plan->trips_per_step) << "one trip per span and step, as before";
  // The typical step after the failover is what the planner priced for it (the failure comes
  // within the first few steps).
  EXPECT_NEAR(r->step_p50_s, sb.failover_step_s, 1e-9);
  // Without the standby the span lands on the backbone, which computes it from then on.
  SwarmPlan bare = *plan;
  bare.standbys.clear();
  auto b = simulate(m, peers, po, bare, so);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->peer_busy_s[static_cast<size_t>(sb.peer)], 0.0);
  EXPECT_GT(b->backbone_busy_s, r->backbone_busy_s);
  EXPECT_LT(b->trips_per_step, r->trips_per_step);
}

// Two standbys per span (PlanOptions::standbys_per_primary): the primary fails, then its first
// standby; the second serves the span, so the backbone computes none of it — with one standby it
// would run the span from the second failure on.
TEST(Simulate, ASpanSurvivesTwoFailuresWithTwoStandbys) {
  const PlanModel m = model(8);
  const auto peers = four(0.02);  // one holds every layer as a span, the rest idle
  PlanOptions po;
  po.message_s = 1e-4;
  po.backbone_memory_bytes = m.global_bytes;
  po.standbys_per_primary = 2;
  auto plan = plan_swarm(m, peers, po);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  ASSERT_TRUE(add_standbys(m, peers, po, &*plan).is_ok());
  ASSERT_EQ(plan->standbys.size(), 2u) << render_plan(m, peers, *plan);
  const Standby first = plan->standbys[0], second = plan->standbys[1];
  EXPECT_EQ(first.primary, second.primary);
  EXPECT_NE(first.peer, second.peer);
  EXPECT_LE(first.failover_step_s, second.failover_step_s) << "the faster failover is tried first";
  SimOptions so;
  so.steps = 40;
  so.prompt_rows = 16;
  so.timeout_s = 0.5;
  so.failures = {{first.primary, 0.3}, {first.peer, 1.5}};
  auto r = simulate(m, peers, po, *plan, so);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->steps, 40);
  EXPECT_EQ(r->failovers, 2);
  EXPECT_GT(r->peer_busy_s[static_cast<size_t>(first.peer)], 0.0);
  EXPECT_GT(r->peer_busy_s[static_cast<size_t>(second.peer)], 0.0) << "the second standby serves the span";
  EXPECT_DOUBLE_EQ(r->trips_per_step, plan->trips_per_step) << "one trip per span and step throughout";
  // One standby per primary: the second failure puts the span on the backbone.
  SwarmPlan one = *plan;
  one.standbys.resize(1);
  auto b = simulate(m, peers, po, one, so);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->peer_busy_s[static_cast<size_t>(second.peer)], 0.0);
  EXPECT_GT(b->backbone_busy_s, r->backbone_busy_s);
  // And the planner's default gives one.
  PlanOptions po1 = po;
  po1.standbys_per_primary = 1;
  auto p1 = plan_swarm(m, peers, po1);
  ASSERT_TRUE(p1.is_ok());
  ASSERT_TRUE(add_standbys(m, peers, po1, &*p1).is_ok());
  EXPECT_EQ(p1->standbys.size(), 1u);
}

// An expert peer's replica (add_standbys) takes its pairs when it fails: the steps after the
// failover cost what the planner priced for it, and the backbone computes no routed expert.
TEST(Simulate, AFailedExpertPeerFailsOverToItsReplica) {
  const PlanModel m = model(8);
  auto peers = four(0.02);
  peers[1].rtt_s = 0.05;  // the nearest holds every expert; the others are idle
  peers[2].rtt_s = 0.06;
  peers[3].rtt_s = 0.07;
  PlanOptions po;
  po.spans = false;
  po.message_s = 1e-4;
  po.backbone_memory_bytes = m.global_bytes + 8 * (2 * kSimMiB + kSimMiB / 4);  // its layers, not the experts
  auto plan = plan_swarm(m, peers, po);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  ASSERT_EQ(plan->roles[0].kind, RoleKind::kExperts) << render_plan(m, peers, *plan);
  ASSERT_TRUE(add_standbys(m, peers, po, &*plan).is_ok());
  ASSERT_EQ(plan->standbys.size(), 1u) << render_plan(m, peers, *plan);
  const Standby sb = plan->standbys[0];
  ASSERT_TRUE(sb.replica());
  EXPECT_EQ(sb.peer, 1);  // the nearest idle peer
  SimOptions so;
  so.steps = 30;
  so.timeout_s = 0.5;
  so.failures = {{0, 0.2}};
  auto r = simulate(m, peers, po, *plan, so);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->steps, 30);
  EXPECT_EQ(r->failovers, 1);
  EXPECT_GT(r->peer_busy_s[1], 0.0) << "the replica serves the experts";
  EXPECT_DOUBLE_EQ(r->trips_per_step, plan->trips_per_step) << "one trip per layer, as before";
  // One holder of every expert: each layer's trip is certain, so the typical step after the
  // failover is exactly the planner's failover price.
  EXPECT_NEAR(r->step_p50_s, sb.failover_step_s, 1e-9);
  // Without the replica the backbone computes the failed peer's pairs (from a full file).
  SwarmPlan bare = *plan;
  bare.standbys.clear();
  auto b = simulate(m, peers, po, bare, so);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->peer_busy_s[1], 0.0);
  EXPECT_GT(b->backbone_busy_s, r->backbone_busy_s);
}

TEST(Simulate, AFailedExpertPeerFallsBackToTheBackbone) {
  const PlanModel m = model(8);
  const auto peers = four(0.02);
  PlanOptions po;
  auto plan = plan_all_experts(m, peers, po);
  ASSERT_TRUE(plan.is_ok());
  SimOptions so;
  so.steps = 12;
  so.failures = {{1, 0.5}};
  auto r = simulate(m, peers, po, *plan, so);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->steps, 12);
  EXPECT_EQ(r->failovers, 1);
}

TEST(Simulate, DraftsMultiplyTokensNotTrips) {
  const PlanModel m = model(8);
  const auto peers = four(0.02);
  PlanOptions po;
  auto plan = plan_all_spans(m, peers, po);
  ASSERT_TRUE(plan.is_ok());
  SimOptions so;
  so.steps = 8;
  so.draft = 4;
  so.accept = 1.0;
  auto r = simulate(m, peers, po, *plan, so);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->tokens, 8 * 5);
  EXPECT_DOUBLE_EQ(r->trips_per_step, 4.0);
  so.accept = 0.0;
  auto none = simulate(m, peers, po, *plan, so);
  ASSERT_TRUE(none.is_ok());
  EXPECT_EQ(none->tokens, 8);
}

TEST(Simulate, ALowRateLinkCostsSerialisation) {
  const PlanModel m = model(4);
  auto peers = four(0.02);
  PlanOptions po;
  auto plan = plan_all_spans(m, peers, po);
  ASSERT_TRUE(plan.is_ok());
  SimOptions so;
  so.steps = 4;
  so.streams = 32;
  auto fast = simulate(m, peers, po, *plan, so);
  for (auto& p : peers) p.rate_bps = 10e6;
  auto slow = simulate(m, peers, po, *plan, so);
  ASSERT_TRUE(fast.is_ok() && slow.is_ok());
  // 32 rows x 4 KiB each way per span = ~0.2 s at 10 Mbit/s, four spans.
  EXPECT_GT(slow->step_mean_s - fast->step_mean_s, 4 * 2 * 32 * 4096 * 8 / 10e6 * 0.95);
}

TEST(Simulate, LargeShapesLoadAndRunAtScale) {
  auto ds = plan_model_shape("deepseek-v3", 4096, 1e-10);
  ASSERT_TRUE(ds.is_ok());
  uint64_t total = ds->global_bytes;
  for (const PlanLayer& L : ds->layers) total += L.dense_bytes + (L.moe ? L.expert_bytes * ds->n_expert : 0);
  // 671 B parameters at 4.85 bits: ~407 GB.
  EXPECT_NEAR(total / 1e9, 407, 25);
  std::vector<PlanPeer> peers;
  for (int i = 0; i < 200; ++i) peers.push_back({"p" + std::to_string(i), 8ull << 30, 0.01 + 0.0005 * i, 1, 0});
  PlanOptions po;
  po.backbone_memory_bytes = 64ull << 30;
  auto plan = plan_swarm(*ds, peers, po);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  SimOptions so;
  so.steps = 4;
  auto r = simulate(*ds, peers, po, *plan, so);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->steps, 4);
  EXPECT_GT(r->tokens_per_s, 0);
  EXPECT_FALSE(plan_model_shape("gpt-5", 1, 1).is_ok());
}

}  // namespace
}  // namespace moesh
