// Planner: who computes each (token, rank) pair — replica balance, local copies, exclusions,
// any number of workers, and re-planning a failed request's pairs onto other holders.
#include <gtest/gtest.h>

#include <vector>

#include "moesh/remote/planner.h"

namespace moesh {
namespace {

constexpr int kLayers = 2;
constexpr int kExperts = 8;

// Layer 0 dense; layer 1: worker 0 holds 0-3, worker 1 holds 2-5 (replicas of 2-3), worker 2
// holds 6; the backbone has copies of 5-7.
Placement sample() {
  Placement p(kLayers, kExperts);
  for (int e = 0; e <= 3; ++e) p.add_holder(1, e, 0);
  for (int e = 2; e <= 5; ++e) p.add_holder(1, e, 1);
  p.add_holder(1, 6, 2);
  for (int e = 5; e <= 7; ++e) p.set_local_copy(1, e, true);
  return p;
}

RoutingPlan plan_of(const std::vector<int32_t>& ids, int k) {
  std::vector<float> w(ids.size(), 0.25f);
  RoutingPlan plan;
  EXPECT_TRUE(make_plan(1, ids.data(), w.data(), static_cast<int64_t>(ids.size()) / k, k, kExperts, &plan).is_ok());
  return plan;
}

TEST(Planner, OwnersReplicasAndLocalCopies) {
  Planner pl(sample());
  // Token 0: experts 2, 3 (both on 0 and 1) -> spread: 2 to worker 0, 3 to worker 1.
  // Token 1: experts 0, 7 -> 0 to worker 0 (only holder), 7 to the backbone (copy only).
  // Token 2: experts 5, 6 -> 5 to worker 1 (a worker holder wins over the copy), 6 to worker 2.
  const RoutingPlan plan = plan_of({2, 3, 0, 7, 5, 6}, 2);
  std::vector<int32_t> who;
  ASSERT_TRUE(pl.assign(1, plan, &who).is_ok());
  EXPECT_EQ(who, (std::vector<int32_t>{0, 1, 0, Placement::kLocal, 1, 2}));
}

TEST(Planner, ATokensChoiceDoesNotDependOnTheBatch) {
  Planner pl(sample());
  const std::vector<int32_t> ids = {3, 2, 2, 3, 1, 2, 4, 3};
  std::vector<int32_t> batch;
  ASSERT_TRUE(pl.assign(1, plan_of(ids, 2), &batch).is_ok());
  for (int t = 0; t < 4; ++t) {
    std::vector<int32_t> alone;
    ASSERT_TRUE(pl.assign(1, plan_of({ids[2 * t], ids[2 * t + 1]}, 2), &alone).is_ok());
    EXPECT_EQ(alone[0], batch[2 * t]) << t;
    EXPECT_EQ(alone[1], batch[2 * t + 1]) << t;
  }
}

TEST(Planner, ExcludedHoldersAreSkipped) {
  Planner pl(sample());
  pl.set_excluded(1, true);
  EXPECT_TRUE(pl.excluded(1));
  std::vector<int32_t> who;
  // 3 -> worker 0 (the replica left); 5 -> the backbone's copy.
  ASSERT_TRUE(pl.assign(1, plan_of({3, 5}, 2), &who).is_ok());
  EXPECT_EQ(who, (std::vector<int32_t>{0, Placement::kLocal}));
  // 4 is held by worker 1 only and has no copy: an error naming it.
  Status st = pl.assign(1, plan_of({4, 0}, 2), &who);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("layer 1: no live holder for expert(s) 4"), std::string::npos) << st.message();
  pl.set_excluded(1, false);
  ASSERT_TRUE(pl.assign(1, plan_of({4, 0}, 2), &who).is_ok());
  EXPECT_EQ(who, (std::vector<int32_t>{1, 0}));
}

TEST(Planner, BadIdsAndDenseLayersAreErrors) {
  Planner pl(sample());
  std::vector<int32_t> who;
  RoutingPlan plan = plan_of({0, 1}, 2);
  EXPECT_EQ(pl.assign(0, plan, &who).code(), StatusCode::kInvalidArgument);  // dense layer
  EXPECT_EQ(pl.assign(2, plan, &who).code(), StatusCode::kInvalidArgument);  // no such layer
}

TEST(Planner, AFailedRequestsPairsMoveToOtherHolders) {
  Planner pl(sample());
  // Tokens: {2, 3}, {0, 5}, {6, 7}, {3, 4}.
  const RoutingPlan plan = plan_of({2, 3, 0, 5, 6, 7, 3, 4}, 2);
  std::vector<int32_t> who;
  ASSERT_TRUE(pl.assign(1, plan, &who).is_ok());
  EXPECT_EQ(who, (std::vector<int32_t>{0, 1, 0, 1, 2, Placement::kLocal, 0, 1}));
  // Worker 1's request failed: 3 -> worker 0, 5 -> the backbone's copy, 4 has no other holder.
  std::vector<int32_t> moved = who;
  Status st = pl.reassign(1, plan, 1, &moved);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("expert(s) 4"), std::string::npos) << st.message();
  EXPECT_EQ(moved, who);  // unchanged on failure
  // Without the expert-4 token everything finds a holder; pairs of other workers stay put.
  const RoutingPlan plan3 = plan_of({2, 3, 0, 5, 6, 7}, 2);
  ASSERT_TRUE(pl.assign(1, plan3, &who).is_ok());
  moved = who;
  ASSERT_TRUE(pl.reassign(1, plan3, 1, &moved).is_ok());
  EXPECT_EQ(moved, (std::vector<int32_t>{0, 0, 0, Placement::kLocal, 2, Placement::kLocal}));
  for (size_t s = 0; s < who.size(); ++s) {
    if (who[s] != 1) {
      EXPECT_EQ(moved[s], who[s]) << s;
    }
  }
  // Worker 2 failing moves expert 6 to the backbone's copy; worker 0 failing strands expert 0,
  // which has neither a replica nor a copy.
  moved = who;
  ASSERT_TRUE(pl.reassign(1, plan3, 2, &moved).is_ok());
  EXPECT_EQ(moved[4], Placement::kLocal);
  moved = who;
  Status st0 = pl.reassign(1, plan3, 0, &moved);
  ASSERT_FALSE(st0.is_ok());
  EXPECT_NE(st0.message().find("expert(s) 0"), std::string::npos) << st0.message();
}

TEST(Planner, PreferLocalKeepsCopiesOnTheBackbone) {
  Planner pl(sample(), PlannerPolicy{.prefer_local = true});
  std::vector<int32_t> who;
  ASSERT_TRUE(pl.assign(1, plan_of({5, 4}, 2), &who).is_ok());
  EXPECT_EQ(who, (std::vector<int32_t>{Placement::kLocal, 1}));
}

TEST(Planner, WorkersBeyondSixtyFour) {
  Placement p(kLayers, kExperts);
  for (int e = 0; e < kExperts; ++e) p.add_holder(1, e, 64 + e);  // workers 64..71
  Planner pl(std::move(p));
  std::vector<int32_t> who;
  ASSERT_TRUE(pl.assign(1, plan_of({7, 0, 3, 4}, 2), &who).is_ok());
  EXPECT_EQ(who, (std::vector<int32_t>{71, 64, 67, 68}));
  pl.set_excluded(71, true);
  EXPECT_FALSE(pl.assign(1, plan_of({7, 0}, 2), &who).is_ok());
}

TEST(Planner, NearReplicasTakeTheLoadAndFarOnesOnlyStandIn) {
  Planner pl(sample());
  std::vector<int32_t> who;
  // Experts 2-3 are on workers 0 and 1. Worker 0 far (80 ms), worker 1 near (10 ms): all to 1.
  pl.set_worker_costs({0.080, 0.010, 0.010});
  ASSERT_TRUE(pl.assign(1, plan_of({2, 3, 3, 2}, 2), &who).is_ok());
  EXPECT_EQ(who, (std::vector<int32_t>{1, 1, 1, 1}));
  // The near one excluded: the far replica stands in.
  pl.set_excluded(1, true);
  ASSERT_TRUE(pl.assign(1, plan_of({2, 3}, 2), &who).is_ok());
  EXPECT_EQ(who, (std::vector<int32_t>{0, 0}));
  pl.set_excluded(1, false);
  // Costs within the slack (LAN noise): balanced again, one pair each.
  pl.set_worker_costs({0.0100, 0.0104, 0.010});
  ASSERT_TRUE(pl.assign(1, plan_of({2, 3}, 2), &who).is_ok());
  EXPECT_EQ(who, (std::vector<int32_t>{0, 1}));
}

TEST(Planner, ExpertsChosenToBeComputedLocallyGoToTheBackboneWhenItHasThem) {
  Planner pl(sample());
  std::vector<uint8_t> mask(kLayers * kExperts, 0);
  mask[1 * kExperts + 5] = 1;  // has a copy
  mask[1 * kExperts + 2] = 1;  // no copy: stays on its worker
  pl.set_computed_locally(mask);
  std::vector<int32_t> who;
  ASSERT_TRUE(pl.assign(1, plan_of({5, 2, 6, 7}, 2), &who).is_ok());
  EXPECT_EQ(who, (std::vector<int32_t>{Placement::kLocal, 0, 2, Placement::kLocal}));
  EXPECT_TRUE(pl.computed_locally(1, 5));
  EXPECT_FALSE(pl.computed_locally(1, 6));
}

}  // namespace
}  // namespace moesh
