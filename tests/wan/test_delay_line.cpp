// DelayLine under a fake clock: delay, jitter without reordering, rate-cap spacing, seeded loss,
// drop-tail queue bound, held-byte bound.
#include <gtest/gtest.h>

#include "moesh/wan/delay_line.h"

namespace moesh::wan {
namespace {

using namespace std::chrono_literals;

const TimePoint kT0 = TimePoint{} + 1000s;

TEST(DelayLine, ReleaseIsArrivalPlusDelayWithoutARate) {
  LinkSpec l;
  l.delay = 40ms;
  DelayLine d(l);
  const auto a = d.offer(1500, kT0);
  const auto b = d.offer(100, kT0 + 1ms);
  ASSERT_EQ(a.verdict, Verdict::kQueued);
  ASSERT_EQ(b.verdict, Verdict::kQueued);
  EXPECT_EQ(a.release, kT0 + 40ms);
  EXPECT_EQ(b.release, kT0 + 41ms);
}

TEST(DelayLine, JitterAddsWithinBoundsAndNeverReorders) {
  LinkSpec l;
  l.delay = 10ms;
  l.jitter = 20ms;
  l.seed = 7;
  DelayLine d(l);
  TimePoint prev{};
  Nanos max_extra{0};
  for (int i = 0; i < 20000; ++i) {
    const TimePoint arrival = kT0 + i * 100us;  // much denser than the jitter: clamping matters
    const auto r = d.offer(1000, arrival);
    ASSERT_EQ(r.verdict, Verdict::kQueued);
    ASSERT_GE(r.release, prev) << "packet " << i << " would overtake the one before it";
    ASSERT_GE(r.release, arrival + l.delay);
    ASSERT_LE(r.release, arrival + l.delay + l.jitter);
    const Nanos extra = r.release - arrival - l.delay;
    max_extra = std::max(max_extra, extra);
    prev = r.release;
  }
  // Packets this close together mostly inherit a predecessor's larger draw (the clamp that keeps
  // them in order), so the extra delay sits near the top of the range; SparseJitterIsUniformOverTheRange checks
  // the spread.
  EXPECT_GT(max_extra, 18ms);
}

TEST(DelayLine, SparseJitterIsUniformOverTheRange) {
  LinkSpec l;
  l.delay = 5ms;
  l.jitter = 10ms;
  DelayLine d(l);
  double sum_ms = 0;
  const int n = 5000;
  for (int i = 0; i < n; ++i) {
    const TimePoint arrival = kT0 + i * 100ms;  // far apart: no clamping
    const auto r = d.offer(100, arrival);
    sum_ms += std::chrono::duration<double, std::milli>(r.release - arrival - l.delay).count();
  }
  EXPECT_NEAR(sum_ms / n, 5.0, 0.3);
}

TEST(DelayLine, RateCapSpacesPacketsBySerialisationTime) {
  LinkSpec l;
  l.delay = 20ms;
  l.rate_bps = 12e6;  // 1500 bytes = 1 ms
  l.queue_packets = 0;
  DelayLine d(l);
  for (int k = 1; k <= 10; ++k) {
    const auto r = d.offer(1500, kT0);  // a burst: all arrive together
    ASSERT_EQ(r.verdict, Verdict::kQueued);
    EXPECT_EQ(r.release, kT0 + k * 1ms + 20ms) << "packet " << k;
  }
  // After the backlog drains the link is idle again: no serialisation debt carries over.
  const auto r = d.offer(750, kT0 + 100ms);
  EXPECT_EQ(r.release, kT0 + 100ms + 500us + 20ms);
  // A packet arriving while the link is busy waits for it.
  const auto busy1 = d.offer(1500, kT0 + 200ms);
  const auto busy2 = d.offer(1500, kT0 + 200ms + 200us);
  EXPECT_EQ(busy1.release, kT0 + 200ms + 1ms + 20ms);
  EXPECT_EQ(busy2.release, kT0 + 200ms + 2ms + 20ms);
}

TEST(DelayLine, LossFollowsTheProbabilityAndTheSeed) {
  auto pattern = [](uint64_t seed) {
    LinkSpec l;
    l.loss = 0.1;
    l.seed = seed;
    DelayLine d(l);
    std::vector<bool> lost;
    for (int i = 0; i < 100000; ++i) lost.push_back(d.offer(100, kT0 + i * 1us).verdict == Verdict::kLost);
    EXPECT_EQ(d.stats().lost, static_cast<uint64_t>(std::count(lost.begin(), lost.end(), true)));
    return lost;
  };
  const auto a = pattern(42), b = pattern(42), c = pattern(43);
  const double rate = static_cast<double>(std::count(a.begin(), a.end(), true)) / a.size();
  EXPECT_NEAR(rate, 0.1, 0.005);
  EXPECT_EQ(a, b) << "the same seed must lose the same packets";
  EXPECT_NE(a, c);
}

TEST(DelayLine, NoLossWhenProbabilityIsZeroAndAllWhenOne) {
  LinkSpec l;
  DelayLine none(l);
  l.loss = 1.0;
  DelayLine all(l);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(none.offer(100, kT0).verdict, Verdict::kQueued);
    EXPECT_EQ(all.offer(100, kT0).verdict, Verdict::kLost);
  }
}

TEST(DelayLine, QueueLimitDropsTheTail) {
  LinkSpec l;
  l.delay = 10ms;
  l.rate_bps = 12e6;  // 1 ms per 1500-byte packet
  l.queue_packets = 4;
  DelayLine d(l);
  int queued = 0, full = 0;
  for (int i = 0; i < 10; ++i) {
    const auto r = d.offer(1500, kT0);
    (r.verdict == Verdict::kQueued ? queued : full)++;
    if (i < 4) {
      EXPECT_EQ(r.verdict, Verdict::kQueued);
    }
  }
  EXPECT_EQ(queued, 4);
  EXPECT_EQ(full, 6);
  EXPECT_EQ(d.stats().queue_full, 6u);
  // 2 ms later two packets have left the bottleneck (the delay does not hold queue slots).
  EXPECT_EQ(d.offer(1500, kT0 + 2ms).verdict, Verdict::kQueued);
  EXPECT_EQ(d.offer(1500, kT0 + 2ms).verdict, Verdict::kQueued);
  EXPECT_EQ(d.offer(1500, kT0 + 2ms).verdict, Verdict::kQueueFull);
}

TEST(DelayLine, WithoutARateTheQueueNeverFills) {
  LinkSpec l;
  l.delay = 50ms;
  l.queue_packets = 4;
  DelayLine d(l);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(d.offer(1500, kT0 + i * 1us).verdict, Verdict::kQueued);
}

TEST(DelayLine, PushAndPopDueKeepOrderAndBytes) {
  LinkSpec l;
  l.delay = 30ms;
  l.jitter = 5ms;
  DelayLine d(l);
  for (uint8_t i = 0; i < 50; ++i) {
    ASSERT_EQ(d.push(std::vector<uint8_t>(10 + i, i), kT0 + i * 1ms), Verdict::kQueued);
  }
  EXPECT_EQ(d.held_units(), 50u);
  size_t expect_bytes = 0;
  for (int i = 0; i < 50; ++i) expect_bytes += 10 + i;
  EXPECT_EQ(d.held_bytes(), expect_bytes);
  std::vector<uint8_t> out;
  EXPECT_FALSE(d.pop_due(kT0 + 29ms, &out)) << "nothing is due before the delay";
  ASSERT_TRUE(d.next_release().has_value());
  EXPECT_GE(*d.next_release(), kT0 + 30ms);
  uint8_t expect = 0;
  for (TimePoint now = kT0; now < kT0 + 200ms; now += 1ms) {
    while (d.pop_due(now, &out)) {
      ASSERT_EQ(out.size(), 10u + expect);
      ASSERT_EQ(out[0], expect);
      ++expect;
    }
  }
  EXPECT_EQ(expect, 50);
  EXPECT_EQ(d.held_bytes(), 0u);
  EXPECT_EQ(d.stats().released, 50u);
  EXPECT_EQ(d.stats().released_bytes, expect_bytes);
  EXPECT_FALSE(d.next_release().has_value());
}

TEST(DelayLine, HeldByteBoundOverflows) {
  LinkSpec l;
  l.delay = 100ms;
  l.max_held_bytes = 10000;
  DelayLine d(l);
  int queued = 0;
  for (int i = 0; i < 20; ++i) queued += d.push(std::vector<uint8_t>(1000), kT0) == Verdict::kQueued;
  EXPECT_EQ(queued, 10);
  EXPECT_EQ(d.stats().overflow, 10u);
}

}  // namespace
}  // namespace moesh::wan
