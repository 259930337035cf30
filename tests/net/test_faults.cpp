// The fault injector, and the transport's behaviour under each fault: nothing damaged is ever
// accepted, lost requests time out, cut connections report kUnavailable.
#include <gtest/gtest.h>

#include "net/net_test_util.h"

namespace moesh::net {
namespace {

using namespace testing;

std::vector<uint8_t> numbered_frame(uint64_t i) {
  auto m = wire::testing::make_dispatch(i + 1, 0, 2, 128, 2, wire::WireDType::kF16, wire::CombineMode::kExact,
                                        wire::WireDType::kF32);
  return wire::encode_dispatch(m).value();
}

struct FaultRig {
  std::unique_ptr<Connection> tx, rx;
  std::shared_ptr<FaultCounters> counters = std::make_shared<FaultCounters>();
  std::unique_ptr<TcpListener> listener;
};

FaultRig make_fault_rig(Link link, FaultPlan plan) {
  FaultRig r;
  StreamPair p = make_stream_pair(link);
  r.listener = std::move(p.listener);
  r.tx = make_stream_connection(wrap_with_faults(std::move(p.client), std::move(plan), r.counters));
  r.rx = make_stream_connection(std::move(p.server));
  return r;
}

class FaultTest : public ::testing::TestWithParam<Link> {};

TEST_P(FaultTest, DroppedFrameIsSimplyMissing) {
  FaultPlan plan;
  plan.schedule = {{1, FaultKind::kDrop}};
  FaultRig r = make_fault_rig(GetParam(), plan);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(r.tx->send_frame(numbered_frame(i), deadline_in(1s)).is_ok());
  EXPECT_EQ(r.rx->recv_frame(deadline_in(1s)).value().request_id(), 1u);
  EXPECT_EQ(r.rx->recv_frame(deadline_in(1s)).value().request_id(), 3u);
  EXPECT_EQ(r.rx->recv_frame(deadline_in(50ms)).status().code(), StatusCode::kTimeout);
  EXPECT_EQ(r.counters->count(FaultKind::kDrop), 1u);
  EXPECT_EQ(r.counters->writes.load(), 3u);
}

TEST_P(FaultTest, DroppedRequestTimesOutInTheMuxWhileOthersComplete) {
  FaultPlan plan;
  plan.schedule = {{2, FaultKind::kDrop}};
  FaultRig r = make_fault_rig(GetParam(), plan);
  std::thread worker([&] { serve(*r.rx, ServeOptions{}); });
  RequestMux mux(r.tx.get());
  std::vector<uint64_t> ids;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(mux.next_request_id());
    auto req = wire::testing::make_dispatch(ids.back(), 0, 1, 64, 1, wire::WireDType::kF32, wire::CombineMode::kExact,
                                            wire::WireDType::kF32);
    ASSERT_TRUE(mux.start(ids.back(), wire::encode_dispatch(req).value(), deadline_in(1s)).is_ok());
  }
  int ok = 0, timed_out = 0;
  for (uint64_t id : ids) {
    auto f = mux.wait(id, deadline_in(200ms));
    ok += f.is_ok();
    timed_out += f.status().code() == StatusCode::kTimeout;
    if (f.status().code() == StatusCode::kTimeout) {
      EXPECT_EQ(id, ids[2]);
    }
  }
  EXPECT_EQ(ok, 4);
  EXPECT_EQ(timed_out, 1);
  r.tx->close();
  worker.join();
}

TEST_P(FaultTest, CorruptedOrTruncatedFramesAreNeverAccepted) {
  for (FaultKind kind : {FaultKind::kCorrupt, FaultKind::kTruncate}) {
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      FaultPlan plan;
      plan.seed = seed;
      plan.schedule = {{1, kind}};
      FaultRig r = make_fault_rig(GetParam(), plan);
      for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(r.tx->send_frame(numbered_frame(i), deadline_in(1s)).is_ok());
      auto first = r.rx->recv_frame(deadline_in(1s));
      ASSERT_TRUE(first.is_ok());
      EXPECT_EQ(first->request_id(), 1u);
      // Frame 1 was damaged: what follows is either rejected or (a length grown by the damage)
      // never completes; it is never delivered as a frame.
      auto second = r.rx->recv_frame(deadline_in(100ms));
      ASSERT_FALSE(second.is_ok()) << "seed " << seed << " kind " << int(kind);
      const StatusCode c = second.status().code();
      EXPECT_TRUE(c == StatusCode::kCorrupt || c == StatusCode::kTimeout || c == StatusCode::kOutOfRange ||
                  c == StatusCode::kUnsupported)
          << second.status().to_string();
      EXPECT_EQ(r.counters->count(kind), 1u);
    }
  }
}

TEST_P(FaultTest, CloseMidFrameIsUnavailableOnBothSides) {
  FaultPlan plan;
  plan.schedule = {{1, FaultKind::kCloseMidFrame}};
  FaultRig r = make_fault_rig(GetParam(), plan);
  ASSERT_TRUE(r.tx->send_frame(numbered_frame(0), deadline_in(1s)).is_ok());
  EXPECT_EQ(r.tx->send_frame(numbered_frame(1), deadline_in(1s)).code(), StatusCode::kUnavailable);
  EXPECT_EQ(r.tx->send_frame(numbered_frame(2), deadline_in(1s)).code(), StatusCode::kUnavailable);
  ASSERT_TRUE(r.rx->recv_frame(deadline_in(1s)).is_ok());
  auto f = r.rx->recv_frame(deadline_in(2s));
  EXPECT_EQ(f.status().code(), StatusCode::kUnavailable) << f.status().to_string();
}

TEST_P(FaultTest, DelayedFrameArrivesLate) {
  FaultPlan plan;
  plan.delay = std::chrono::milliseconds(120);
  plan.schedule = {{0, FaultKind::kDelay}};
  FaultRig r = make_fault_rig(GetParam(), plan);
  const auto t0 = Clock::now();
  std::thread tx([&] { EXPECT_TRUE(r.tx->send_frame(numbered_frame(0), deadline_in(1s)).is_ok()); });
  // The write starts after t0 and sleeps plan.delay first: nothing can arrive by t0 + 50 ms.
  EXPECT_EQ(r.rx->recv_frame(t0 + 50ms).status().code(), StatusCode::kTimeout);
  auto f = r.rx->recv_frame(deadline_in(2s));
  tx.join();
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->request_id(), 1u);
  // The injected delay cannot be beaten (a lower bound from the contract, not a speed claim).
  EXPECT_GE(Clock::now() - t0, plan.delay);
  // A delay longer than the write's own deadline turns into a timeout.
  plan.schedule = {{0, FaultKind::kDelay}};
  FaultRig r2 = make_fault_rig(GetParam(), plan);
  EXPECT_EQ(r2.tx->send_frame(numbered_frame(0), deadline_in(30ms)).code(), StatusCode::kTimeout);
}

INSTANTIATE_TEST_SUITE_P(Links, FaultTest, ::testing::Values(Link::kLoopback, Link::kTcp, Link::kTcpPolling),
                         [](const auto& info) { return std::string(link_name(info.param)); });

TEST(Faults, RandomPlanIsReproducibleAndHitsItsRates) {
  auto run = [](uint64_t seed) {
    FaultPlan plan;
    plan.seed = seed;
    plan.p_drop = 0.1;
    plan.p_corrupt = 0.1;
    plan.p_truncate = 0.05;
    auto counters = std::make_shared<FaultCounters>();
    auto [a, b] = make_loopback_streams(size_t{64} << 20);
    auto s = wrap_with_faults(std::move(a), plan, counters);
    const uint8_t payload[64] = {1};
    for (int i = 0; i < 1000; ++i) EXPECT_TRUE(s->write_all(payload, deadline_in(1s)).is_ok());
    return std::array<uint64_t, 4>{counters->count(FaultKind::kNone), counters->count(FaultKind::kDrop),
                                   counters->count(FaultKind::kCorrupt), counters->count(FaultKind::kTruncate)};
  };
  const auto a = run(42), b = run(42), c = run(43);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(a[0] + a[1] + a[2] + a[3], 1000u);
  EXPECT_NEAR(double(a[1]), 100, 40);
  EXPECT_NEAR(double(a[2]), 100, 40);
  EXPECT_NEAR(double(a[3]), 50, 30);
}

TEST(Faults, RandomSoakNeverDeliversADamagedFrame) {
  // Frames go through random corruption/truncation; the receiver either gets a frame that is
  // byte-identical to the one sent with that id, or an error that ends the stream.
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    FaultPlan plan;
    plan.seed = seed;
    plan.p_corrupt = 0.03;
    plan.p_truncate = 0.02;
    auto counters = std::make_shared<FaultCounters>();
    auto [a, b] = make_loopback_streams(size_t{64} << 20);
    auto tx = make_stream_connection(wrap_with_faults(std::move(a), plan, counters));
    auto rx = make_stream_connection(std::move(b));
    std::vector<std::vector<uint8_t>> sent;
    for (uint64_t i = 0; i < 200; ++i) {
      sent.push_back(numbered_frame(i));
      ASSERT_TRUE(tx->send_frame(sent.back(), deadline_in(1s)).is_ok());
    }
    int delivered = 0;
    while (true) {
      auto f = rx->recv_frame(deadline_in(50ms));
      if (!f.is_ok()) break;
      const uint64_t id = f->request_id();
      ASSERT_GE(id, 1u);
      ASSERT_LE(id, 200u);
      std::vector<uint8_t> again = wire::build_frame(f->type(), id, f->payload);
      ASSERT_EQ(again, sent[id - 1]) << "seed " << seed << " frame " << id;
      ++delivered;
    }
    EXPECT_GT(counters->count(FaultKind::kCorrupt) + counters->count(FaultKind::kTruncate), 0u);
    EXPECT_LT(delivered, 200);
  }
}

}  // namespace
}  // namespace moesh::net
