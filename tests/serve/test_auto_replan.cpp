// What the gateway's own re-plan carries out (serve/auto_replan.h decide_auto_replan): the span
// list a plan worth its moves resplits to, and why any other plan is left alone.
#include <gtest/gtest.h>

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
// given more experts, and a span peer made an expert holder (its blocks come here).
TEST(AutoReplan, ExpertRolesThatChangeAreGiven) {
  const json live = {role("A", "span", "0-1", "h:1"), role("W", "experts", "2-3:0-3", "h:3"),
                     role("V", "experts", "2-3:4-7", "h:4")};
  AutoReplanDecision d = decide_auto_replan(replan(
      live, {role("A", "span", "0-1", "h:1"), role("W", "experts", "2-3:*", "h:3"), role("V", "idle", "", "h:4")}));
  ASSERT_TRUE(d.apply) << d.why;
  EXPECT_TRUE(d.spans.empty());
  ASSERT_EQ(d.experts.size(), 1u);
  EXPECT_EQ(d.experts[0].peer, "W");
  EXPECT_EQ(d.experts[0].addr, "h:3");
  EXPECT_EQ(d.experts[0].experts, "2-3:*");
  d = decide_auto_replan(replan(live, {role("A", "experts", "2-3:0-3", "h:1"), role("W", "experts", "2-3:0-3", "h:3"),
                                       role("V", "experts", "2-3:4-7", "h:4")}));
  ASSERT_TRUE(d.apply) << d.why;
  EXPECT_EQ(d.spans, std::vector<std::string>{"0-1@here"});
  ASSERT_EQ(d.experts.size(), 1u);
  EXPECT_EQ(d.experts[0].peer, "A");
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
