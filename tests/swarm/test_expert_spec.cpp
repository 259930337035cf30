// Expert specs: the accepted forms, canonicalization, and the errors a user can make.
#include <gtest/gtest.h>

#include "moesh/swarm/swarm.h"

namespace moesh::swarm {
namespace {

using R = wire::ExpertRange;

// deepseek2-like: 5 layers, layer 0 dense, 16 experts.
ModelShape shape() {
  ModelShape s;
  s.n_layer = 5;
  s.n_expert = 16;
  s.n_embd = 64;
  s.moe_layers = {1, 2, 3, 4};
  return s;
}

ExpertSet parse_ok(const std::string& spec) {
  auto r = parse_expert_spec(spec, shape());
  EXPECT_TRUE(r.is_ok()) << spec << ": " << r.status().to_string();
  return r.is_ok() ? *r : ExpertSet{};
}

TEST(ExpertSpec, StarLayersMeanEveryMoeLayer) {
  ExpertSet s = parse_ok("*:0-7");
  EXPECT_EQ(s.ranges, (std::vector<R>{{1, 0, 8}, {2, 0, 8}, {3, 0, 8}, {4, 0, 8}}));
  EXPECT_EQ(s.n_pairs(), 32u);
  EXPECT_EQ(s.to_string(), "1-4:0-7");  // consecutive layers with the same experts: one item
}

TEST(ExpertSpec, MixedItemsAndDenseLayersInRangesAreSkipped) {
  ExpertSet s = parse_ok("0-2:*,3-4:0-7");
  EXPECT_EQ(s.ranges, (std::vector<R>{{1, 0, 16}, {2, 0, 16}, {3, 0, 8}, {4, 0, 8}}));
  EXPECT_TRUE(s.holds(1, 15));
  EXPECT_TRUE(s.holds(4, 7));
  EXPECT_FALSE(s.holds(4, 8));
  EXPECT_FALSE(s.holds(0, 0));
}

TEST(ExpertSpec, CanonicalFormMergesAndSorts) {
  ExpertSet s = parse_ok("2:9, 1:3,1:4-5,1:0,2:10-12,2:11");
  EXPECT_EQ(s.ranges, (std::vector<R>{{1, 0, 1}, {1, 3, 3}, {2, 9, 4}}));
  EXPECT_EQ(s.to_string(), "1:0,1:3-5,2:9-12");
  // The canonical text parses back to the same set, and a differently written spec of the same
  // experts compares equal.
  EXPECT_EQ(parse_ok(s.to_string()), s);
  EXPECT_EQ(parse_ok("1:5,1:4,1:3,1:0,2:9-12"), s);
  EXPECT_FALSE(s.holds(1, 1));
  EXPECT_FALSE(s.holds(1, 2));
  EXPECT_TRUE(s.holds(1, 3));
  EXPECT_FALSE(s.holds(1, 6));
  EXPECT_TRUE(s.holds(2, 12));
  EXPECT_FALSE(s.holds(3, 9));
}

TEST(ExpertSpec, CanonicalTextMergesLayersWithTheSameExperts) {
  ExpertSet s = parse_ok("1:0,1:3-5,2:0,2:3-5,3:9,4:9");
  EXPECT_EQ(s.to_string(), "1-2:0,1-2:3-5,3-4:9");
  EXPECT_EQ(parse_ok(s.to_string()), s);
  ExpertSet t = parse_ok("1:0-7,2:0-6,3:0-7");  // no merge across a different layer
  EXPECT_EQ(t.to_string(), "1:0-7,2:0-6,3:0-7");
  EXPECT_EQ(parse_ok(t.to_string()), t);
}

TEST(ExpertSpec, Contains) {
  ExpertSet big = parse_ok("*:0-7");
  EXPECT_TRUE(big.contains(parse_ok("1:2-5,4:7")));
  EXPECT_FALSE(big.contains(parse_ok("1:2-8")));
  EXPECT_FALSE(parse_ok("1:0-3,1:5-7").contains(parse_ok("1:3-5")));
  EXPECT_TRUE(big.contains(ExpertSet{}));
}

TEST(ExpertSpec, Errors) {
  struct Case {
    const char* spec;
    const char* needle;  // must appear in the message
  };
  const Case cases[] = {
      {"", "empty"},
      {"   ", "empty"},
      {"1", "LAYERS:EXPERTS"},
      {"1:2:3", "LAYERS:EXPERTS"},
      {"1:", "not a number"},
      {":1", "not a number"},
      {"a:1", "not a number"},
      {"1:x-3", "not a number"},
      {"1:0x3", "not a number"},
      {"-1:0", "not a number"},
      {"1:+3", "not a number"},
      {"1:2,", "empty item"},
      {",1:2", "empty item"},
      {"3-1:0", "reversed"},
      {"1:7-3", "reversed"},
      {"5:0", "layer 5 out of range"},
      {"1-9:0", "layer 9 out of range"},
      {"1:16", "expert 16 out of range"},
      {"*:0-99", "expert 99 out of range"},
      {"0:0", "dense"},
      {"1:99999999999", "not a number"},
  };
  for (const Case& c : cases) {
    auto r = parse_expert_spec(c.spec, shape());
    ASSERT_FALSE(r.is_ok()) << "'" << c.spec << "' was accepted as " << r->to_string();
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.spec;
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << "'" << c.spec << "': " << r.status().message();
  }
}

TEST(ExpertSpec, RangesFromHello) {
  auto ok = expert_set_from_ranges({{2, 4, 4}, {1, 0, 2}, {2, 0, 4}}, shape());
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->ranges, (std::vector<R>{{1, 0, 2}, {2, 0, 8}}));
  const std::vector<std::vector<R>> bad = {{{0, 0, 1}}, {{5, 0, 1}}, {{1, 15, 2}}, {{1, 0, 0}}};
  for (const auto& rs : bad) {
    auto r = expert_set_from_ranges(rs, shape());
    EXPECT_FALSE(r.is_ok()) << rs[0].layer << ":" << rs[0].first << "+" << rs[0].count;
  }
}

}  // namespace
}  // namespace moesh::swarm
