// What the gateway's own re-plan carries out (serve/auto_replan.h decide_auto_replan): the span
// list a plan worth its moves resplits to, and why any other plan is left alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "moesh/make_model/make_model.h"
#include "serve/auto_replan.h"
#include "serve/dashboard.h"

namespace moesh::serve {
namespace {

using nlohmann::json;

json role(const std::string& peer, const std::string& kind, const std::string& what, const std::string& addr) {
  json r{{"peer", peer}, {"role", kind}};
  if (kind == "span") r["layers"] = what;
  if (kind == "experts") r["experts"] = what;
  if (!addr.empty()) r["addr"] = addr;
  return r;
}

// Arrays built with json::array(): a one-element braced list is an array to one compiler and the
// element itself to another.
json replan(json live_roles, json plan_roles, json here = json::array(), double gain = 0.5) {
  return {{"replan", gain >= kReplanGain},
          {"gain", gain},
          {"live", {{"roles", std::move(live_roles)}, {"here", std::move(here)}}},
          {"plan", {{"roles", std::move(plan_roles)}}}};
}

TEST(AutoReplan, TwoSpansMergedOntoOnePeerAreResplit) {
  const json r = replan({role("A", "span", "0-1", "h:1"), role("B", "span", "2-3", "h:2")},
                        {role("A", "idle", "", "h:1"), role("B", "span", "0-3", "h:2")});
  const AutoReplanDecision d = decide_auto_replan(r);
  ASSERT_TRUE(d.apply) << d.why;
  EXPECT_EQ(d.spans, std::vector<std::string>{"0-3@h:2"});
  EXPECT_DOUBLE_EQ(d.gain, 0.5);
}

TEST(AutoReplan, BlocksRunHereFillWhatNoNewSpanTakes) {
  const json live = json::array({role("A", "span", "2-3", "h:1")});
  AutoReplanDecision d =
      decide_auto_replan(replan(live, json::array({role("A", "span", "1-3", "h:1")}), json::array({"0-1"})));
  ASSERT_TRUE(d.apply) << d.why;
  EXPECT_EQ(d.spans, (std::vector<std::string>{"0-0@here", "1-3@h:1"}));
  // Same edges, another peer: a resplit moves it.
  d = decide_auto_replan(replan({role("A", "span", "0-3", "h:1"), role("B", "idle", "", "h:2")},
                                {role("A", "idle", "", "h:1"), role("B", "span", "0-3", "h:2")}));
  EXPECT_FALSE(d.apply);  // B is not a span peer now: the gateway does not know it runs spans
  EXPECT_NE(d.why.find("not a span peer"), std::string::npos) << d.why;
  d = decide_auto_replan(replan({role("A", "span", "0-1", "h:1"), role("B", "span", "2-3", "h:2")},
                                {role("A", "span", "2-3", "h:1"), role("B", "span", "0-1", "h:2")}));
  ASSERT_TRUE(d.apply) << d.why;
  EXPECT_EQ(d.spans, (std::vector<std::string>{"0-1@h:2", "2-3@h:1"}));
}

TEST(AutoReplan, OtherPlansAreLeftAloneSayingWhy) {
  const json live = {role("A", "span", "0-1", "h:1"), role("B", "span", "2-3", "h:2"),
                     role("W", "experts", "4-5:0-7", "h:3")};
  // Not worth its moves.
  AutoReplanDecision d =
      decide_auto_replan(replan(live, json::array({role("B", "span", "0-3", "h:2")}), json::array(), 0.04));
  EXPECT_FALSE(d.apply);
  EXPECT_NE(d.why.find("4.0 % faster"), std::string::npos) << d.why;
  // An error, or nothing yet.
  EXPECT_FALSE(decide_auto_replan(json{{"error", "no worker or span peer is up"}}).apply);
  EXPECT_FALSE(decide_auto_replan(json()).apply);
  // Blocks to an expert worker.
  d = decide_auto_replan(replan(live, {role("A", "span", "0-1", "h:1"), role("W", "span", "2-3", "h:3")}));
  EXPECT_FALSE(d.apply);
  EXPECT_NE(d.why.find("gives blocks 2-3 to W, which is not a span peer"), std::string::npos) << d.why;
  // Blocks the backbone runs as its own (4-5 are no span's).
  d = decide_auto_replan(replan(live, {role("A", "span", "0-1", "h:1"), role("B", "span", "2-5", "h:2")}));
  EXPECT_FALSE(d.apply);
  EXPECT_NE(d.why.find("restart"), std::string::npos) << d.why;
  // A span peer without an address (it joined).
  d = decide_auto_replan(replan({role("A", "span", "0-1", ""), role("B", "span", "2-3", "h:2")},
                                {role("A", "span", "0-3", ""), role("B", "idle", "", "h:2")}));
  EXPECT_FALSE(d.apply);
  EXPECT_NE(d.why.find("does not know"), std::string::npos) << d.why;
  // The roles are the live ones already: the gain is in where pairs go.
  d = decide_auto_replan(replan(live, {role("A", "span", "0-1", "h:1"), role("B", "span", "2-3", "h:2"),
                                       role("W", "experts", "4-5:0-7", "h:3")}));
  EXPECT_FALSE(d.apply);
  EXPECT_NE(d.why.find("already"), std::string::npos) << d.why;
  // A plan whose spans cannot be carried out is left alone whole, its experts too.
  d = decide_auto_replan(replan(live, {role("A", "span", "0-1", "h:1"), role("B", "span", "2-5", "h:2"),
                                       role("W", "experts", "4-5:0-3", "h:4")}));
  EXPECT_FALSE(d.apply);
  EXPECT_TRUE(d.experts.empty());
  // A malformed document is refused, never thrown on.
  for (const json& bad :
       {json{{"replan", "yes"}}, json{{"replan", true}, {"gain", "x"}, {"live", 3}, {"plan", "p"}},
        json{{"replan", true}, {"live", {{"roles", "A"}, {"here", 5}}}, {"plan", {{"roles", {1, 2}}}}}}) {
    EXPECT_FALSE(decide_auto_replan(bad).apply) << bad.dump();
  }
}

// An idle span peer (let go of, or made known) may be given blocks; an expert worker may not.
TEST(AutoReplan, IdleSpanPeersMayBeGivenBlocks) {
  json idle = role("C", "idle", "", "h:3");
  idle["span_peer"] = true;
  const json live = {role("A", "span", "0-3", "h:1"), idle};
  const AutoReplanDecision d =
      decide_auto_replan(replan(live, {role("A", "span", "0-1", "h:1"), role("C", "span", "2-3", "h:3")}));
  ASSERT_TRUE(d.apply) << d.why;
  EXPECT_EQ(d.spans, (std::vector<std::string>{"0-1@h:1", "2-3@h:3"}));
}

// A worker on the full model (marked span_peer: it loads blocks from its file) may be made a span
// peer: the blocks run here as a span go to it.
TEST(AutoReplan, AnExpertWorkerThatLoadsBlocksMayBecomeASpanPeer) {
  json w = role("W", "experts", "0-3:0-7", "h:3");
  w["span_peer"] = true;
  AutoReplanDecision d = decide_auto_replan(
      replan(json::array({w}), json::array({role("W", "span", "0-3", "h:3")}), json::array({"0-3"})));
  ASSERT_TRUE(d.apply) << d.why;
  EXPECT_EQ(d.spans, std::vector<std::string>{"0-3@h:3"});
  // Without the mark (a worker on an expert slice) it is left alone, saying so.
  d = decide_auto_replan(replan(json::array({role("W", "experts", "0-3:0-7", "h:3")}),
                                json::array({role("W", "span", "0-3", "h:3")}), json::array({"0-3"})));
  EXPECT_FALSE(d.apply);
  EXPECT_NE(d.why.find("cannot load blocks"), std::string::npos) << d.why;
}

// Expert roles that change are given to their peers (the spans staying as they are): a worker
// given more experts, a worker the plan leaves idle (to hold nothing: its replicas are let go of),
// and a span peer made an expert holder (its blocks come here).
TEST(AutoReplan, ExpertRolesThatChangeAreGiven) {
  const json live = {role("A", "span", "0-1", "h:1"), role("W", "experts", "2-3:0-3", "h:3"),
                     role("V", "experts", "2-3:4-7", "h:4")};
  AutoReplanDecision d = decide_auto_replan(replan(
      live, {role("A", "span", "0-1", "h:1"), role("W", "experts", "2-3:*", "h:3"), role("V", "idle", "", "h:4")}));
  ASSERT_TRUE(d.apply) << d.why;
  EXPECT_TRUE(d.spans.empty());
  ASSERT_EQ(d.experts.size(), 2u);
  EXPECT_EQ(d.experts[0].peer, "W");
  EXPECT_EQ(d.experts[0].addr, "h:3");
  EXPECT_EQ(d.experts[0].experts, "2-3:*");
  EXPECT_EQ(d.experts[1].peer, "V");
  EXPECT_EQ(d.experts[1].experts, "");
  // A worker given fewer experts is listed with what it is to keep.
  d = decide_auto_replan(replan(live, {role("A", "span", "0-1", "h:1"), role("W", "experts", "2-3:*", "h:3"),
                                       role("V", "experts", "2:4-7", "h:4")}));
  ASSERT_TRUE(d.apply) << d.why;
  ASSERT_EQ(d.experts.size(), 2u);
  EXPECT_EQ(d.experts[1].peer, "V");
  EXPECT_EQ(d.experts[1].experts, "2:4-7");
  d = decide_auto_replan(replan(live, {role("A", "experts", "2-3:0-3", "h:1"), role("W", "experts", "2-3:0-3", "h:3"),
                                       role("V", "experts", "2-3:4-7", "h:4")}));
  ASSERT_TRUE(d.apply) << d.why;
  EXPECT_EQ(d.spans, std::vector<std::string>{"0-1@here"});
  ASSERT_EQ(d.experts.size(), 1u);
  EXPECT_EQ(d.experts[0].peer, "A");
}

// Lanes (many streams): an idle span peer the plan makes a lane of a span is added as one (the
// spans staying as they are); a live lane the plan drops is let go of; a lane given to a peer
// that cannot load blocks leaves the plan alone.
TEST(AutoReplan, LanesThePlanAddsOrDropsAreCarriedOut) {
  json idle = role("C", "idle", "", "h:3");
  idle["span_peer"] = true;
  json lane = role("C", "span", "0-3", "h:3");
  lane["role"] = "lane";
  lane["lane_of"] = "A";
  const json live = json::array({role("A", "span", "0-3", "h:1"), idle});
  AutoReplanDecision d = decide_auto_replan(replan(live, json::array({role("A", "span", "0-3", "h:1"), lane})));
  ASSERT_TRUE(d.apply) << d.why;
  EXPECT_TRUE(d.spans.empty());
  ASSERT_EQ(d.add_lanes.size(), 1u);
  EXPECT_EQ(d.add_lanes[0].layers, "0-3");
  EXPECT_EQ(d.add_lanes[0].addr, "h:3");
  EXPECT_TRUE(d.drop_lanes.empty());
  // Live already: nothing to do.
  json live_lane = lane;
  live_lane["span_peer"] = true;
  d = decide_auto_replan(replan(json::array({role("A", "span", "0-3", "h:1"), live_lane}),
                                json::array({role("A", "span", "0-3", "h:1"), lane})));
  EXPECT_FALSE(d.apply);
  // Dropped by the plan: let go of.
  d = decide_auto_replan(replan(json::array({role("A", "span", "0-3", "h:1"), live_lane}),
                                json::array({role("A", "span", "0-3", "h:1"), role("C", "idle", "", "h:3")})));
  ASSERT_TRUE(d.apply) << d.why;
  ASSERT_EQ(d.drop_lanes.size(), 1u);
  EXPECT_EQ(d.drop_lanes[0].addr, "h:3");
  EXPECT_TRUE(d.add_lanes.empty());
  // The plan's span peer and lane the other way round from the live span: no move, a lane.
  json c_span = role("C", "span", "0-3", "h:3");
  json a_lane = role("A", "span", "0-3", "h:1");
  a_lane["role"] = "lane";
  a_lane["lane_of"] = "C";
  d = decide_auto_replan(replan(live, json::array({a_lane, c_span})));
  ASSERT_TRUE(d.apply) << d.why;
  EXPECT_TRUE(d.spans.empty());
  ASSERT_EQ(d.add_lanes.size(), 1u);
  EXPECT_EQ(d.add_lanes[0].addr, "h:3");
  // A worker on an expert slice cannot be a lane.
  d = decide_auto_replan(replan(json::array({role("A", "span", "0-3", "h:1"), role("C", "experts", "0-3:*", "h:3")}),
                                json::array({role("A", "span", "0-3", "h:1"), lane})));
  EXPECT_FALSE(d.apply);
  EXPECT_NE(d.why.find("cannot load blocks"), std::string::npos) << d.why;
}

// The gateway's re-plan on a real model file: with many streams per step an idle span peer is
// made a lane of the span (and the decision adds it); with one stream, or rows from long prompts
// of one stream, none is.
TEST(AutoReplan, ManyStreamsMakeAnIdleSpanPeerALane) {
  const auto dir = std::filesystem::temp_directory_path() / ("moesh-replan-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "m.gguf").string();
  MakeModelSpec spec = MakeModelSpec::defaults_for(MakeArch::kQwen3Moe);
  spec.n_layer = 4;
  spec.vocab = MakeVocab::kNone;
  ASSERT_TRUE(make_model(spec, path).is_ok());
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const json span = {{"layers", "0-3"},
                     {"label", "s0"},
                     {"state", "up"},
                     {"address", "h:1"},
                     {"warmup_rtt_ms", 0.2},
                     {"slab_bytes", 1 << 20},
                     {"mem_available_bytes", 1ull << 30}};
  const json idle = {{"layers", ""},
                     {"label", "s1"},
                     {"state", "idle"},
                     {"address", "h:2"},
                     {"warmup_rtt_ms", 0.2},
                     {"slab_bytes", 0},
                     {"mem_available_bytes", 1ull << 30}};
  const json status = {{"workers", json::array()}, {"spans", json::array({span, idle})}};
  const json many = replan_json(**model, nullptr, status, json(), ReplanLoad{8, 8});
  ASSERT_FALSE(many.contains("error")) << many.dump();
  bool lane = false;
  for (const json& r : many["plan"]["roles"])
    if (r.value("role", "") == "lane") lane = r.value("peer", "") == "s1" && r.value("lane_of", "") == "s0";
  EXPECT_TRUE(lane) << many["plan"].dump();
  EXPECT_NE(many["args"].get<std::string>().find("--streams 8 --tokens-per-step 8"), std::string::npos);
  const AutoReplanDecision d = decide_auto_replan(many);
  ASSERT_TRUE(d.apply) << d.why << " " << many.dump();
  EXPECT_TRUE(d.spans.empty());
  ASSERT_EQ(d.add_lanes.size(), 1u);
  EXPECT_EQ(d.add_lanes[0].layers, "0-3");
  EXPECT_EQ(d.add_lanes[0].addr, "h:2");
  // Once it is a lane (/swarm/status "lane"), the live layout has it and nothing changes.
  json with_lane = status;
  with_lane["spans"][1]["state"] = "lane";
  with_lane["spans"][1]["layers"] = "0-3";
  const json again = replan_json(**model, nullptr, with_lane, json(), ReplanLoad{8, 8});
  ASSERT_FALSE(again.contains("error")) << again.dump();
  EXPECT_FALSE(decide_auto_replan(again).apply) << again.dump();
  // One stream (8 rows of its prompt, or one row): no lane.
  for (const ReplanLoad load : {ReplanLoad{8, 1}, ReplanLoad{1, 1}}) {
    const json one = replan_json(**model, nullptr, status, json(), load);
    ASSERT_FALSE(one.contains("error")) << one.dump();
    for (const json& r : one["plan"]["roles"]) EXPECT_NE(r.value("role", ""), "lane") << one.dump();
  }
  // The gateway's own costs (`serve --seconds-per-byte --row-share`) are priced and said in the
  // args, so `swarm plan --status` with them gives the same plan: a batch of 8 rows at row share
  // 0.5 costs 4.5 rows' compute, and a step's prediction drops accordingly.
  const json cheap = replan_json(**model, nullptr, status, json(),
                                 ReplanLoad{8, 8, PlanCosts{.seconds_per_byte = 1e-10, .row_share = 0.5}});
  ASSERT_FALSE(cheap.contains("error")) << cheap.dump();
  EXPECT_NE(cheap["args"].get<std::string>().find("--seconds-per-byte 1e-10 --row-share 0.5"), std::string::npos)
      << cheap["args"];
  EXPECT_EQ(many["args"].get<std::string>().find("--row-share"), std::string::npos) << many["args"];
  EXPECT_LT(cheap["live_step_ms"].get<double>(), many["live_step_ms"].get<double>());

  // Measured compute (/swarm/status compute_*): with the costs given for these machines, a span
  // peer whose steps took 20x what they say is priced at speed 1/20, and the plan moves its blocks
  // to the idle peer (unmeasured: speed 1), leaving it at most a lane.
  json slow = status;
  const PlanCosts given{.seconds_per_byte = 1e-10, .row_share = 1};
  const json fast = replan_json(**model, nullptr, slow, json(), ReplanLoad{1, 1, given});
  ASSERT_FALSE(fast.contains("error")) << fast.dump();
  EXPECT_EQ(fast["measured_speeds"], 0);
  const double one_step_ms = fast["live_step_ms"].get<double>();
  slow["spans"][0]["compute_steps"] = 100;
  slow["spans"][0]["compute_rows"] = 100;
  slow["spans"][0]["compute_seconds"] = 0.0;  // the compute the model predicts, times 20: below
  auto pm = plan_model_from_gguf((*model)->file(), 0, given.seconds_per_byte);
  ASSERT_TRUE(pm.is_ok());
  double row_s = 0;
  for (const PlanLayer& L : pm->layers) row_s += L.dense_s + (L.moe ? pm->n_expert_used * L.expert_s : 0.0);
  slow["spans"][0]["compute_seconds"] = 20 * 100 * row_s;
  const json measured = replan_json(**model, nullptr, slow, json(), ReplanLoad{1, 1, given});
  ASSERT_FALSE(measured.contains("error")) << measured.dump();
  EXPECT_EQ(measured["measured_speeds"], 1);
  EXPECT_GT(measured["live_step_ms"].get<double>(), one_step_ms);
  bool moved = false;
  for (const json& r : measured["peers"]) {
    if (r.value("name", "") == "s0") EXPECT_NEAR(r["speed"].get<double>(), 1.0 / 20, 1e-6) << r.dump();
    if (r.value("name", "") == "s1") moved = r.value("what", "") == "layers 0-3" && r.value("role", "") == "span";
  }
  EXPECT_TRUE(moved) << measured["peers"].dump();
  EXPECT_TRUE(decide_auto_replan(measured).apply) << measured.dump();
  // Default costs: one measured peer has no other to be compared with, and stays speed 1.
  const json guess = replan_json(**model, nullptr, slow, json(), ReplanLoad{1, 1});
  ASSERT_FALSE(guess.contains("error")) << guess.dump();
  for (const json& r : guess["peers"]) EXPECT_EQ(r["speed"].get<double>(), 1.0) << r.dump();
  std::filesystem::remove_all(dir);
}

// A plan without spans gives their blocks back to the backbone: a resplit to spans here.
TEST(AutoReplan, APlanWithoutSpansBringsTheirBlocksHere) {
  const json live = {role("A", "span", "0-1", "h:1"), role("B", "span", "2-3", "h:2")};
  const AutoReplanDecision d = decide_auto_replan(replan(live, json::array({role("W", "experts", "0-3:0-7", "h:3")})));
  ASSERT_TRUE(d.apply) << d.why;
  EXPECT_EQ(d.spans, std::vector<std::string>{"0-3@here"});
}

}  // namespace
}  // namespace moesh::serve
