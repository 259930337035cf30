// RTT-aware local-expert planner: the expected-latency formula against a simulation of routed
// tokens, the planner against brute force on small cases (exhaustive and greedy regimes), and
// the case load balancing misses — a whole local layer beats hot experts spread over layers.
#include <gtest/gtest.h>

#include <random>

#include "moesh/remote/trip_planner.h"

namespace moesh {
namespace {

TripProblem random_problem(uint64_t seed, int n_layer, int n_expert, int n_workers, uint64_t budget) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  TripProblem pb;
  pb.n_layer = n_layer;
  pb.n_expert = n_expert;
  pb.p.assign(n_layer, std::vector<double>(n_expert));
  pb.bytes.assign(n_layer, std::vector<uint64_t>(n_expert));
  for (int l = 0; l < n_layer; ++l) {
    for (int e = 0; e < n_expert; ++e) {
      pb.p[l][e] = 0.6 * u(rng) * u(rng);  // a few hot experts, many cold
      pb.bytes[l][e] = 1 + rng() % 3;
    }
  }
  for (int w = 0; w < n_workers; ++w) {
    TripWorker tw;
    tw.rtt_s = 0.005 + 0.1 * u(rng);
    tw.compute_s = 0.001;
    tw.experts.resize(n_layer);
    pb.workers.push_back(tw);
  }
  for (int l = 0; l < n_layer; ++l) {
    for (int e = 0; e < n_expert; ++e) pb.workers[rng() % n_workers].experts[l].push_back(e);
  }
  pb.budget_bytes = budget;
  return pb;
}

// The optimum over every subset of (layer, expert) pairs within the budget.
double brute_force(const TripProblem& pb) {
  const int n = pb.n_layer * pb.n_expert;
  double best = expected_trip_latency(pb, {});
  std::vector<std::vector<bool>> local(pb.n_layer, std::vector<bool>(pb.n_expert, false));
  for (uint32_t mask = 1; mask < (1u << n); ++mask) {
    uint64_t bytes = 0;
    for (int i = 0; i < n; ++i) {
      if (mask >> i & 1u) bytes += pb.bytes[i / pb.n_expert][i % pb.n_expert];
    }
    if (bytes > pb.budget_bytes) continue;
    for (int i = 0; i < n; ++i) local[i / pb.n_expert][i % pb.n_expert] = (mask >> i & 1u) != 0;
    best = std::min(best, expected_trip_latency(pb, local));
  }
  return best;
}

TEST(TripPlanner, ExpectedLatencyMatchesSimulatedTokens) {
  const TripProblem pb = random_problem(3, 3, 6, 3, 0);
  std::vector<std::vector<bool>> local(3, std::vector<bool>(6, false));
  local[1][2] = local[2][0] = true;
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double sum = 0;
  constexpr int kTokens = 200000;
  for (int t = 0; t < kTokens; ++t) {
    for (int l = 0; l < 3; ++l) {
      double worst = 0;
      for (const TripWorker& w : pb.workers) {
        bool need = false;
        for (int32_t e : w.experts[l]) need = (u(rng) < pb.p[l][e] && !local[l][e]) || need;
        if (need) worst = std::max(worst, w.rtt_s + w.compute_s);
      }
      sum += worst;
    }
  }
  const double simulated = sum / kTokens, formula = expected_trip_latency(pb, local);
  EXPECT_NEAR(simulated, formula, 0.01 * formula) << "simulated " << simulated << " formula " << formula;
}

TEST(TripPlanner, ExactOnSmallProblems) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const TripProblem pb = random_problem(seed, 2, 6, 2, 5);  // 12 candidates: exhaustive
    auto plan = plan_local_experts(pb);
    ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
    EXPECT_LE(plan->bytes, pb.budget_bytes);
    EXPECT_NEAR(plan->expected_latency_s, expected_trip_latency(pb, plan->local), 1e-12);
    EXPECT_NEAR(plan->expected_latency_s, brute_force(pb), 1e-12) << "seed " << seed;
  }
}

TEST(TripPlanner, GreedyIsCloseToTheOptimumBeyondTheExhaustiveSize) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    const TripProblem pb = random_problem(seed, 2, 9, 3, 8);  // 18 candidates: greedy
    auto plan = plan_local_experts(pb);
    ASSERT_TRUE(plan.is_ok());
    EXPECT_LE(plan->bytes, pb.budget_bytes);
    const double opt = brute_force(pb), none = expected_trip_latency(pb, {});
    EXPECT_LE(plan->expected_latency_s, none);
    EXPECT_LE(plan->expected_latency_s, 1.10 * opt)
        << "seed " << seed << ": greedy " << plan->expected_latency_s << " vs optimum " << opt;
  }
}

// The chosen experts going to a worker (--rebalance) instead of the backbone: that worker is one
// more holder with its own trip cost. The formula against simulated tokens, the planner against
// brute force, and the plan never moves an expert to a holder dearer than the one it is on.
TEST(TripPlanner, AChosenHolderWithATripCostIsPricedAsOneMoreWorker) {
  TripProblem pb = random_problem(5, 3, 6, 3, 0);
  pb.local_cost_s = 0.02;
  std::vector<std::vector<bool>> local(3, std::vector<bool>(6, false));
  local[0][1] = local[0][4] = local[2][3] = true;
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double sum = 0;
  constexpr int kTokens = 200000;
  for (int t = 0; t < kTokens; ++t) {
    for (int l = 0; l < 3; ++l) {
      double worst = 0;
      for (const TripWorker& w : pb.workers) {
        for (int32_t e : w.experts[l]) {
          if (u(rng) >= pb.p[l][e]) continue;
          worst = std::max(worst, local[l][e] ? pb.local_cost_s : w.rtt_s + w.compute_s);
        }
      }
      sum += worst;
    }
  }
  const double simulated = sum / kTokens, formula = expected_trip_latency(pb, local);
  EXPECT_NEAR(simulated, formula, 0.01 * formula) << "simulated " << simulated << " formula " << formula;
  int moved = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    TripProblem q = random_problem(seed, 2, 6, 2, 5);
    q.local_cost_s = 0.03;
    auto plan = plan_local_experts(q);
    ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
    EXPECT_NEAR(plan->expected_latency_s, brute_force(q), 1e-12) << "seed " << seed;
    for (const TripWorker& w : q.workers)
      for (int l = 0; l < 2; ++l)
        for (int32_t e : w.experts[l]) {
          if (!plan->local[l][e]) continue;
          ++moved;
          EXPECT_GT(w.rtt_s + w.compute_s, q.local_cost_s) << "seed " << seed << ": moved to a dearer holder";
        }
  }
  EXPECT_GT(moved, 0);
}

TEST(TripPlanner, AWholeLocalLayerBeatsScatteredHotExperts) {
  // Two layers of 4 equally hot experts on one far worker; room for 4 local experts. Hot experts
  // spread over both layers leave both trips (some expert of each layer is still remote for
  // almost every token); one whole local layer removes a trip outright.
  TripProblem pb;
  pb.n_layer = 2;
  pb.n_expert = 4;
  pb.p.assign(2, std::vector<double>(4, 0.5));
  pb.bytes.assign(2, std::vector<uint64_t>(4, 1));
  TripWorker far;
  far.rtt_s = 0.1;
  far.experts = {{0, 1, 2, 3}, {0, 1, 2, 3}};
  pb.workers = {far};
  pb.budget_bytes = 4;
  auto plan = plan_local_experts(pb);
  ASSERT_TRUE(plan.is_ok());
  const bool layer0 = plan->local[0] == std::vector<bool>(4, true);
  const bool layer1 = plan->local[1] == std::vector<bool>(4, true);
  EXPECT_TRUE(layer0 != layer1) << "expected one whole local layer";
  EXPECT_NEAR(plan->expected_latency_s, 0.1 * (1 - 0.5 * 0.5 * 0.5 * 0.5), 1e-12);
  // The greedy path finds it too (bundle move): same problem padded past the exhaustive size.
  TripProblem big = pb;
  big.n_layer = 5;
  big.p.assign(5, std::vector<double>(4, 0.5));
  big.bytes.assign(5, std::vector<uint64_t>(4, 1));
  big.workers[0].experts.assign(5, {0, 1, 2, 3});
  auto g = plan_local_experts(big);
  ASSERT_TRUE(g.is_ok());
  int whole = 0;
  for (int l = 0; l < 5; ++l) whole += g->local[l] == std::vector<bool>(4, true);
  EXPECT_EQ(whole, 1);
}

TEST(TripPlanner, RejectsInconsistentProblems) {
  TripProblem pb = random_problem(1, 2, 4, 2, 3);
  pb.p[1][2] = 1.5;
  EXPECT_EQ(plan_local_experts(pb).status().code(), StatusCode::kInvalidArgument);
  pb = random_problem(1, 2, 4, 2, 3);
  pb.bytes.pop_back();
  EXPECT_FALSE(plan_local_experts(pb).is_ok());
  pb = random_problem(1, 2, 4, 2, 3);
  pb.workers[0].experts[0].push_back(9);
  EXPECT_FALSE(plan_local_experts(pb).is_ok());
}

}  // namespace
}  // namespace moesh
