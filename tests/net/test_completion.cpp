// CompletionQueue + RequestMux::pump: a reader thread files replies as they arrive and the
// queue hands them over in that order, with the connection's failure reaching every pending
// request (what the remote fan-out builds on).
#include <gtest/gtest.h>

#include <thread>

#include "moesh/net/transport.h"
#include "moesh/wire/wire.h"

namespace moesh::net {
namespace {

using namespace std::chrono_literals;

Result<std::vector<uint8_t>> ping_frame(uint64_t id) {
  wire::PingMsg p;
  p.request_id = id;
  p.send_time_ns = id;
  return wire::encode_ping(p);
}

// Answers the pings it reads, last first, once it has `n` of them.
void answer_reversed(Connection* peer, int n) {
  std::vector<wire::PingMsg> got;
  while (static_cast<int>(got.size()) < n) {
    auto f = peer->recv_frame(deadline_in(10s));
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    auto p = wire::decode_ping(*f);
    ASSERT_TRUE(p.is_ok());
    got.push_back(*p);
  }
  for (auto it = got.rbegin(); it != got.rend(); ++it) {
    wire::PongMsg pong;
    pong.request_id = it->request_id;
    pong.ping_time_ns = it->send_time_ns;
    auto f = wire::encode_pong(pong);
    ASSERT_TRUE(f.is_ok());
    ASSERT_TRUE(peer->send_frame(*f, deadline_in(10s)).is_ok());
  }
}

TEST(CompletionQueue, RepliesComeOutInArrivalOrder) {
  auto [mine, theirs] = make_loopback_pair();
  RequestMux mux(mine.get());
  CompletionQueue done;
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    while (!stop && mux.pump(deadline_in(100ms)).is_ok()) {
    }
  });
  std::thread peer([&, c = theirs.get()] { answer_reversed(c, 3); });
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    const uint64_t id = mux.next_request_id();
    auto f = ping_frame(id);
    ASSERT_TRUE(f.is_ok());
    ASSERT_TRUE(mux.start(id, *f, deadline_in(10s), &done, /*tag=*/40 + i).is_ok());
    ids.push_back(id);
  }
  std::vector<uint64_t> order;
  CompletionQueue::Entry e;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(done.pop(&e, deadline_in(10s)));
    order.push_back(e.request_id);
    EXPECT_EQ(e.tag, 40 + (e.request_id - ids[0]));
    auto r = mux.wait(e.request_id, deadline_in(1s));  // filed: returns at once
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->request_id(), e.request_id);
  }
  EXPECT_EQ(order, (std::vector<uint64_t>{ids[2], ids[1], ids[0]}));
  EXPECT_FALSE(done.pop(&e, deadline_in(10ms))) << "one entry per request";
  peer.join();
  stop = true;
  reader.join();
}

// An entry carries the arrival it is given (a receive timestamp), never one in the future, and
// the filing time when none is known.
TEST(CompletionQueue, EntriesKeepAGivenArrivalTime) {
  CompletionQueue q;
  const Clock::time_point past = Clock::now() - std::chrono::seconds(3);
  const Clock::time_point before = Clock::now();
  q.push(1, 10, past);
  q.push(2, 20, Clock::now() + std::chrono::hours(1));
  q.push(3, 30);
  const Clock::time_point after = Clock::now();
  CompletionQueue::Entry e;
  ASSERT_TRUE(q.pop(&e, Clock::now()));
  EXPECT_EQ(e.at, past);
  ASSERT_TRUE(q.pop(&e, Clock::now()));
  EXPECT_GE(e.at, before);
  EXPECT_LE(e.at, after);
  ASSERT_TRUE(q.pop(&e, Clock::now()));
  EXPECT_GE(e.at, before);
  EXPECT_LE(e.at, after);
}

// A queue that busy-polls before sleeping (set_poll_us) hands over an entry filed before the
// pop, one filed while it spins and one filed long after its spin ended (it sleeps then, and
// the push wakes it), in order; with nothing filed it still ends at its deadline.
TEST(CompletionQueue, PollingHandsOverEntriesFiledBeforeDuringAndAfterTheSpin) {
  CompletionQueue q;
  q.set_poll_us(2000);
  CompletionQueue::Entry e;
  q.push(1, 11);
  ASSERT_TRUE(q.pop(&e, deadline_in(10s)));
  EXPECT_EQ(e.request_id, 11u);
  for (const auto delay : {0ms, 1ms, 200ms}) {
    std::thread pusher([&q, delay] {
      std::this_thread::sleep_for(delay);
      q.push(2, 22);
      q.push(3, 33);
    });
    ASSERT_TRUE(q.pop(&e, deadline_in(30s))) << "delay " << delay.count() << " ms";
    EXPECT_EQ(e.request_id, 22u);
    pusher.join();
    ASSERT_TRUE(q.pop(&e, deadline_in(30s)));
    EXPECT_EQ(e.request_id, 33u);
  }
  EXPECT_FALSE(q.pop(&e, deadline_in(20ms))) << "nothing filed: false at the deadline";
  EXPECT_FALSE(q.pop(&e, Clock::now())) << "a deadline already passed";
}

TEST(CompletionQueue, AConnectionFailureCompletesEveryPendingRequest) {
  auto [mine, theirs] = make_loopback_pair();
  RequestMux mux(mine.get());
  CompletionQueue done;
  std::thread reader([&] {
    while (mux.pump(deadline_in(100ms)).is_ok()) {
    }
  });
  std::vector<uint64_t> ids;
  for (int i = 0; i < 2; ++i) {
    const uint64_t id = mux.next_request_id();
    auto f = ping_frame(id);
    ASSERT_TRUE(f.is_ok());
    ASSERT_TRUE(mux.start(id, *f, deadline_in(10s), &done, 7).is_ok());
    ids.push_back(id);
  }
  theirs->close();  // the peer goes away without answering
  CompletionQueue::Entry e;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(done.pop(&e, deadline_in(30s)));
    auto r = mux.wait(e.request_id, deadline_in(1s));
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().to_string();
  }
  reader.join();  // pump returns the connection's error, so the reader ends by itself
  // Later requests fail at once.
  auto f = ping_frame(mux.next_request_id());
  ASSERT_TRUE(f.is_ok());
  EXPECT_FALSE(mux.start(99, *f, deadline_in(1s), &done, 7).is_ok());
}

}  // namespace
}  // namespace moesh::net
