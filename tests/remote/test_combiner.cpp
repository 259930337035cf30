// Combiner: exact sums are rank_sum_step in router rank order wherever each row came from;
// partial sums add the backbone's own pairs first, then each worker's partial in worker order.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "moesh/remote/combiner.h"

namespace moesh {
namespace {

constexpr int64_t kD = 16;

RoutingPlan plan_of(const std::vector<int32_t>& ids, const std::vector<float>& w, int k) {
  RoutingPlan plan;
  EXPECT_TRUE(make_plan(0, ids.data(), w.data(), static_cast<int64_t>(ids.size()) / k, k, 8, &plan).is_ok());
  return plan;
}

std::vector<float> random_rows(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  std::vector<float> v(n * kD);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(Combiner, ExactIsTheRankOrderSumWhereverRowsLive) {
  const std::vector<int32_t> ids = {3, 1, 0, 5, 7, 2};
  const std::vector<float> w = {0.7f, 0.3f, 0.55f, 0.45f, 0.9f, 0.1f};
  const RoutingPlan plan = plan_of(ids, w, 2);
  // Rows scattered over two buffers (as if from the backbone and a worker), in any order.
  const auto a = random_rows(3, 1), b = random_rows(3, 2);
  const std::vector<const float*> slot = {b.data() + 2 * kD, a.data(),      a.data() + kD,
                                          b.data(),          b.data() + kD, a.data() + 2 * kD};
  std::vector<float> out(3 * kD), want(3 * kD);
  ThreadPool pool(2);
  combine_exact(plan, slot, kD, out.data(), &pool);
  for (int t = 0; t < 3; ++t) {
    for (int r = 0; r < 2; ++r) rank_sum_step(want.data() + t * kD, slot[t * 2 + r], w[t * 2 + r], kD, r == 0);
  }
  EXPECT_EQ(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)), 0);
  std::vector<float> serial(3 * kD);
  combine_exact(plan, slot, kD, serial.data(), nullptr);
  EXPECT_EQ(std::memcmp(out.data(), serial.data(), out.size() * sizeof(float)), 0) << "depends on threads";
}

TEST(Combiner, PartialAddsTheBackboneFirstThenWorkersInOrder) {
  // Token 0: ranks on the backbone and worker 0; token 1: workers 0 and 1; token 2: worker 1.
  const std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5};
  const std::vector<float> w = {0.6f, 0.4f, 0.5f, 0.5f, 0.8f, 0.2f};
  const RoutingPlan plan = plan_of(ids, w, 2);
  const std::vector<int32_t> local_slots = {0};
  const auto ylocal = random_rows(1, 3);
  const auto p0 = random_rows(2, 4), p1 = random_rows(2, 5);
  const std::vector<int32_t> t0 = {0, 1}, t1 = {1, 2};
  const std::vector<PartialRows> workers = {{t0, p0.data()}, {t1, p1.data()}};
  std::vector<float> out(3 * kD);
  std::vector<uint8_t> seen;
  combine_partial(plan, local_slots, ylocal.data(), workers, kD, out.data(), &seen);
  for (int64_t d = 0; d < kD; ++d) {
    const float tok0 = ylocal[d] * w[0] + p0[d];
    const float tok1 = p0[kD + d] + p1[d];
    const float tok2 = p1[kD + d];
    EXPECT_EQ(out[d], tok0) << d;
    EXPECT_EQ(out[kD + d], tok1) << d;
    EXPECT_EQ(out[2 * kD + d], tok2) << d;
  }
}

}  // namespace
}  // namespace moesh
