// The planner's inputs from a running gateway's reports (plan/live.h): which workers become
// peers, with what memory and RTT, and the activation counts.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "moesh/plan/live.h"

namespace moesh {
namespace {

nlohmann::json worker(const std::string& name, const std::string& state) {
  return {{"name", name},
          {"label", "127.0.0.1:1 (" + name + ")"},
          {"state", state},
          {"path", "direct"},
          {"address", "127.0.0.1:1"},
          {"warmup_rtt_ms", 20.0},
          {"min_latency_ms", 21.0},
          {"slab_bytes", 1000},
          {"replica_budget_bytes", 0},
          {"mem_available_bytes", 8000},
          {"offer_bytes", 0}};
}

TEST(LivePlan, UpWorkersBecomePeersAndOneThatSlowedDownCostsItsRecentTrips) {
  nlohmann::json st{{"workers", nlohmann::json::array()}};
  nlohmann::json a = worker("a", "up");  // holds 1000, half of 8000 free: 5000
  nlohmann::json b = worker("b", "up");
  b["offer_bytes"] = 3000;                        // an offer is its memory
  b["recent_trip_ms"] = 71.0;                     // its trips now take 50 ms more than its best
  b["peer_rtt_ms"] = {{"127.0.0.1:1 (a)", 4.0}};  // measured to a
  nlohmann::json c = worker("c", "down");         // not a peer
  nlohmann::json d = worker("d", "up");
  d["recent_trip_ms"] = 15.0;  // faster than its best seen (no new minimum yet): not slowed
  st["workers"] = {a, b, c, d};
  auto peers = peers_from_status(st);
  ASSERT_TRUE(peers.is_ok()) << peers.status().to_string();
  ASSERT_EQ(peers->size(), 3u);
  EXPECT_EQ((*peers)[0].peer.name, "a");
  EXPECT_EQ((*peers)[0].peer.memory_bytes, 5000u);
  EXPECT_DOUBLE_EQ((*peers)[0].peer.rtt_s, 20e-3);
  EXPECT_EQ((*peers)[0].addr, "127.0.0.1:1");
  EXPECT_EQ((*peers)[1].peer.name, "b");
  EXPECT_EQ((*peers)[1].peer.memory_bytes, 3000u);
  EXPECT_DOUBLE_EQ((*peers)[1].slowed_s, 50e-3);
  EXPECT_DOUBLE_EQ((*peers)[1].peer.rtt_s, 20e-3 + 50e-3);
  EXPECT_EQ((*peers)[2].peer.name, "d");
  EXPECT_EQ((*peers)[2].slowed_s, 0.0);
  const auto rtt = measured_peer_rtts(*peers);
  ASSERT_EQ(rtt.size(), 3u);
  EXPECT_DOUBLE_EQ(rtt[0][1], 4e-3);
  EXPECT_DOUBLE_EQ(rtt[1][0], 4e-3);
  EXPECT_EQ(rtt[0][2], -1.0);

  EXPECT_EQ(peers_from_status(nlohmann::json{{"workers", 3}}).status().code(), StatusCode::kCorrupt);
  // A field of the wrong type (a hostile or broken gateway): an error naming the document.
  nlohmann::json odd = st;
  odd["workers"][0]["compute_pairs"] = "many";
  auto bad = peers_from_status(odd);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(bad.status().message().find("/swarm/status"), std::string::npos) << bad.status().to_string();
}

// Span peers follow the workers: the blocks they run, the same memory rule, the warm-up RTT; one
// the backbone runs itself ("here") is not a peer; a malformed block range is named.
TEST(LivePlan, SpanPeersBecomePeersWithTheirBlocks) {
  nlohmann::json st{{"workers", {worker("a", "up")}}};
  st["spans"] = {{{"layers", "1-2"},
                  {"label", "127.0.0.1:9 (s1)"},
                  {"state", "up"},
                  {"address", "127.0.0.1:9"},
                  {"warmup_rtt_ms", 7.0},
                  {"slab_bytes", 2000},
                  {"mem_available_bytes", 6000},
                  {"offer_bytes", 0},
                  {"replica_budget_bytes", 0}},
                 {{"layers", "3-3"}, {"label", "here"}, {"state", "here"}}};
  auto peers = peers_from_status(st);
  ASSERT_TRUE(peers.is_ok()) << peers.status().to_string();
  ASSERT_EQ(peers->size(), 2u);
  EXPECT_EQ((*peers)[0].first, -1);  // the worker
  const LivePeer& s = (*peers)[1];
  EXPECT_EQ(s.peer.name, "127.0.0.1:9 (s1)");
  EXPECT_EQ(s.first, 1);
  EXPECT_EQ(s.last, 2);
  EXPECT_EQ(s.peer.memory_bytes, 2000u + 3000u);  // what it holds plus half its machine's free memory
  EXPECT_DOUBLE_EQ(s.peer.rtt_s, 7e-3);
  EXPECT_EQ(s.addr, "127.0.0.1:9");
  for (const char* bad : {"2-1", "x", "1-2-3", "-1-2"}) {
    st["spans"][0]["layers"] = bad;
    auto r = peers_from_status(st);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_NE(r.status().message().find("spans[0].layers"), std::string::npos) << r.status().to_string();
  }
}

// A lane (/swarm/status state "lane"): a span peer with the span's blocks, marked as a lane.
TEST(LivePlan, ALaneIsAPeerRunningItsSpansBlocks) {
  nlohmann::json st{{"workers", nlohmann::json::array()}};
  st["spans"] = {{{"layers", "1-2"}, {"label", "s1"}, {"state", "up"}, {"address", "127.0.0.1:9"}},
                 {{"layers", "1-2"}, {"label", "s2"}, {"state", "lane"}, {"address", "127.0.0.1:10"}}};
  auto peers = peers_from_status(st);
  ASSERT_TRUE(peers.is_ok()) << peers.status().to_string();
  ASSERT_EQ(peers->size(), 2u);
  EXPECT_FALSE((*peers)[0].lane);
  EXPECT_TRUE((*peers)[1].lane);
  EXPECT_TRUE((*peers)[1].span_peer);
  EXPECT_EQ((*peers)[1].first, 1);
  EXPECT_EQ((*peers)[1].last, 2);
  st["spans"][1]["layers"] = "x";
  EXPECT_FALSE(peers_from_status(st).is_ok());
}

// A worker on the full model may be given blocks (loads_blocks): it is a span peer for the
// planner, and when it runs a span (a re-plan gave it one) the span entry at its address is the
// same peer with those blocks, not a second one; so is an idle span entry there.
TEST(LivePlan, AWorkerThatLoadsBlocksIsOnePeerWithItsSpan) {
  nlohmann::json w = worker("w", "up");
  w["loads_blocks"] = true;
  nlohmann::json other = worker("x", "up");
  other["address"] = "127.0.0.1:2";
  nlohmann::json st{{"workers", nlohmann::json::array({w, other})}};
  auto peers = peers_from_status(st);
  ASSERT_TRUE(peers.is_ok()) << peers.status().to_string();
  ASSERT_EQ(peers->size(), 2u);
  EXPECT_TRUE((*peers)[0].span_peer);
  EXPECT_FALSE((*peers)[1].span_peer);  // no loads_blocks: an expert slice
  for (const char* state : {"up", "idle"}) {
    st["spans"] = nlohmann::json::array(
        {{{"layers", "0-3"}, {"label", "127.0.0.1:1 (w)"}, {"state", state}, {"address", "127.0.0.1:1"}}});
    peers = peers_from_status(st);
    ASSERT_TRUE(peers.is_ok()) << peers.status().to_string();
    ASSERT_EQ(peers->size(), 2u) << state;
    EXPECT_EQ((*peers)[0].peer.name, "w");
    EXPECT_TRUE((*peers)[0].span_peer);
    EXPECT_EQ((*peers)[0].first, std::string(state) == "up" ? 0 : -1);
    EXPECT_EQ((*peers)[0].last, std::string(state) == "up" ? 3 : -1);
  }
}

TEST(LivePlan, ActivationCountsAreSmoothedAndAMalformedHeatmapIsNamed) {
  PlanModel m;
  m.name = "t";
  m.n_expert = 4;
  m.n_expert_used = 1;
  m.layers.resize(2);
  nlohmann::json h{{"n_expert", 4},
                   {"layers", {{{"layer", 1}, {"tokens", uint64_t{48}}, {"share", {1.0, 0.0, 0.0, 0.0}}}}}};
  ActivationInfo info;
  ASSERT_TRUE(apply_activations(h, "test", &m, &info).is_ok());
  EXPECT_EQ(info.layers, 1);
  EXPECT_EQ(info.tokens, 48u);
  // Layer 1: (1 * 48 + 16 * 0.25) / 64; layer 0 (not counted) stays k/n.
  EXPECT_DOUBLE_EQ(m.p_at(1, 0), (48.0 + 16 * 0.25) / 64);
  EXPECT_DOUBLE_EQ(m.p_at(1, 1), (16 * 0.25) / 64);
  EXPECT_DOUBLE_EQ(m.p_at(0, 2), 0.25);
  h["layers"][0]["share"][2] = 1.5;
  const Status bad = apply_activations(h, "test", &m, &info);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("heatmap.layers[0].share[2]"), std::string::npos) << bad.message();
}

// Measured compute speeds (apply_measured_speeds): a worker's pairs and a span peer's steps
// against what the model's costs predict for them.
TEST(LivePlan, PeersArePricedAtTheirMeasuredComputeSpeed) {
  PlanModel m;
  m.n_expert = 8;
  m.n_expert_used = 2;
  m.row_share = 0.5;
  for (int l = 0; l < 4; ++l) m.layers.push_back(PlanLayer{.moe = true, .dense_s = 1e-3, .expert_s = 1e-4});
  nlohmann::json a = worker("a", "up"), b = worker("b", "up"), c = worker("c", "up"), d = worker("d", "up");
  // a: 100 pairs in 10 ms, as the costs say (speed 1); b: 12 % slower (jitter); c: 4x slower;
  // d: too few pairs to tell.
  a["compute_pairs"] = 100, a["compute_seconds"] = 0.010;
  b["compute_pairs"] = 100, b["compute_seconds"] = 0.0112;
  c["compute_pairs"] = 200, c["compute_seconds"] = 0.080;
  d["compute_pairs"] = kMinMeasuredPairs - 1, d["compute_seconds"] = 1.0;
  nlohmann::json st{{"workers", {a, b, c, d}}};
  // A span peer of blocks 1-2: a row costs 2 x (1 ms + 2 x 0.1 ms) = 2.4 ms at speed 1; 10 steps
  // of 30 rows are 10 + 0.5 x 20 = 20 rows' worth, 48 ms; it took 24 ms: twice as fast.
  st["spans"] = {{{"layers", "1-2"},
                  {"label", "s"},
                  {"state", "up"},
                  {"address", "127.0.0.1:9"},
                  {"compute_seconds", 0.024},
                  {"compute_steps", 10},
                  {"compute_rows", 30}}};
  auto peers = peers_from_status(st);
  ASSERT_TRUE(peers.is_ok()) << peers.status().to_string();
  ASSERT_EQ(peers->size(), 5u);
  EXPECT_EQ((*peers)[4].steps, 10u);
  EXPECT_EQ((*peers)[4].rows, 30u);

  // Costs measured or given for these machines: the ratios are the speeds.
  std::vector<LivePeer> abs = *peers;
  EXPECT_EQ(apply_measured_speeds(m, &abs, true), 4);
  EXPECT_NEAR(abs[0].peer.speed, 1.0, 1e-9);
  EXPECT_NEAR(abs[1].peer.speed, 1 / 1.12, 1e-9);
  EXPECT_NEAR(abs[2].peer.speed, 0.25, 1e-9);
  EXPECT_EQ(abs[3].peer.speed, 1.0);  // not measured enough
  EXPECT_NEAR(abs[4].peer.speed, 2.0, 1e-9);

  // Default costs (a guess): relative to the median measured peer (a, at ratio 1); b's 12 % is
  // jitter and stays 1.
  std::vector<LivePeer> rel = *peers;
  EXPECT_EQ(apply_measured_speeds(m, &rel, false), 4);
  EXPECT_EQ(rel[0].peer.speed, 1.0);
  EXPECT_EQ(rel[1].peer.speed, 1.0);
  EXPECT_NEAR(rel[2].peer.speed, 0.25, 1e-9);
  EXPECT_EQ(rel[3].peer.speed, 1.0);
  EXPECT_NEAR(rel[4].peer.speed, 2.0, 1e-9);

  // Nothing measured: nothing changes; an absurd figure is clamped.
  std::vector<LivePeer> none = *peers;
  for (LivePeer& p : none) p.pairs = p.steps = 0;
  EXPECT_EQ(apply_measured_speeds(m, &none, true), 0);
  for (const LivePeer& p : none) EXPECT_EQ(p.peer.speed, 1.0);
  std::vector<LivePeer> odd = *peers;
  odd[0].pair_seconds = 1e-12;
  apply_measured_speeds(m, &odd, true);
  EXPECT_EQ(odd[0].peer.speed, kMaxSpeed);
}

}  // namespace
}  // namespace moesh
