// RequestMux: many requests in flight per connection, per-request deadlines, replies routed by
// id (out of order), ERROR/GOODBYE/close handling, the HELLO handshake and PING warm-up.
#include <gtest/gtest.h>

#include <future>

#include "moesh/net/auth.h"
#include "net/net_test_util.h"

namespace moesh::net {
namespace {

using namespace testing;

struct Rig {
  std::unique_ptr<Connection> client, server;
  std::unique_ptr<TcpListener> listener;
  std::thread worker;
  ~Rig() {
    if (client) client->close();
    if (worker.joinable()) worker.join();
  }
};

std::unique_ptr<Rig> make_rig(Link link, ServeOptions o) {
  auto r = std::make_unique<Rig>();
  StreamPair p = make_stream_pair(link);
  r->listener = std::move(p.listener);
  r->client = make_stream_connection(std::move(p.client));
  r->server = make_stream_connection(std::move(p.server));
  r->worker = std::thread([srv = r->server.get(), o] { serve(*srv, o); });
  return r;
}

class MuxTest : public ::testing::TestWithParam<Link> {};

TEST_P(MuxTest, ManyRequestsInFlightAreRoutedById) {
  auto rig = make_rig(GetParam(), ServeOptions{.batch = 8});
  RequestMux mux(rig->client.get());
  constexpr int kThreads = 4, kRounds = 6, kInFlight = 8;
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        std::vector<wire::DispatchMsg> reqs;
        for (int i = 0; i < kInFlight; ++i) {
          const uint64_t id = mux.next_request_id();
          const auto mode = (id % 2) ? wire::CombineMode::kExact : wire::CombineMode::kPartial;
          reqs.push_back(wire::testing::make_dispatch(id, static_cast<uint32_t>(t), 1 + id % 5, 256, 1 + id % 8,
                                                      wire::WireDType::kBF16, mode, wire::WireDType::kF32));
          ASSERT_TRUE(mux.start(id, wire::encode_dispatch(reqs.back()).value(), deadline_in(5s)).is_ok());
        }
        // Wait in a different order than sent; the worker also answers in reverse batches.
        for (int i = kInFlight - 1; i >= 0; --i) {
          const auto& req = reqs[(i * 5) % kInFlight];
          auto f = mux.wait(req.request_id, deadline_in(10s));
          ASSERT_TRUE(f.is_ok()) << f.status().to_string();
          auto rep = wire::decode_combine(*f, wire::DecodeLimits{});
          ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
          ASSERT_TRUE(wire::check_combine_matches(req, *rep).is_ok());
          std::vector<float> y(256);
          wire::decode_row(rep->rows, rep->rows.n_rows - 1, y.data());
          ASSERT_EQ(y[3], wire::testing::tagged_value(req.request_id * 31 + req.layer, rep->rows.n_rows - 1, 3));
          ++good;
        }
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(good.load(), kThreads * kRounds * kInFlight);
  EXPECT_EQ(mux.n_in_flight(), 0u);
  EXPECT_EQ(mux.n_discarded(), 0u);
}

TEST_P(MuxTest, DeadlinesFireWhenThePeerNeverAnswers) {
  // Each waiter must time out at its own deadline, not at another waiter's: one request (the
  // "leader") waits with a long deadline while three others wait with short ones. The peer
  // answers the leader only after all three short waits have returned kTimeout, so if a short
  // waiter were held until the leader's deadline (or until a frame arrived), the leader would
  // time out too instead of getting its reply. Asserted: status codes and that order, not times.
  StreamPair p = make_stream_pair(GetParam());
  auto client = make_stream_connection(std::move(p.client));
  auto server = make_stream_connection(std::move(p.server));
  RequestMux mux(client.get());
  auto make_req = [&](uint64_t id) {
    return wire::testing::make_dispatch(id, 0, 2, 64, 2, wire::WireDType::kF32, wire::CombineMode::kExact,
                                        wire::WireDType::kF32);
  };
  const uint64_t leader = mux.next_request_id();
  const wire::DispatchMsg leader_req = make_req(leader);
  ASSERT_TRUE(mux.start(leader, wire::encode_dispatch(leader_req).value(), deadline_in(1s)).is_ok());
  std::promise<void> short_waits_done;
  std::thread peer([&, done = short_waits_done.get_future()]() mutable {
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(server->recv_frame(deadline_in(10s)).is_ok());
    ASSERT_EQ(done.wait_for(30s), std::future_status::ready);
    ASSERT_TRUE(
        server->send_frame(wire::encode_combine(wire::testing::make_combine_for(leader_req)).value(), deadline_in(5s))
            .is_ok());
  });
  Result<wire::Frame> leader_reply = Status(StatusCode::kInternal, "unset");
  std::thread leader_waiter([&] { leader_reply = mux.wait(leader, deadline_in(20s)); });

  const int deadlines_ms[3] = {60, 20, 40};
  std::vector<std::thread> threads;
  std::atomic<int> timed_out{0};
  for (int d : deadlines_ms)
    threads.emplace_back([&, d] {
      const uint64_t id = mux.next_request_id();
      ASSERT_TRUE(mux.start(id, wire::encode_dispatch(make_req(id)).value(), deadline_in(1s)).is_ok());
      const Deadline deadline = deadline_in(std::chrono::milliseconds(d));
      auto f = mux.wait(id, deadline);
      EXPECT_EQ(f.status().code(), StatusCode::kTimeout) << f.status().to_string();
      // The contract's lower bound (a deadline cannot be beaten), not a speed claim.
      EXPECT_GE(Clock::now(), deadline) << "deadline " << d << " ms: returned kTimeout before it";
      timed_out += f.status().code() == StatusCode::kTimeout;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(timed_out.load(), 3);
  // Only now does the peer answer the leader, which must still be waiting for it.
  short_waits_done.set_value();
  leader_waiter.join();
  peer.join();
  ASSERT_TRUE(leader_reply.is_ok()) << "the leader's wait ended before its reply: "
                                    << leader_reply.status().to_string();
  auto rep = wire::decode_combine(*leader_reply, wire::DecodeLimits{});
  ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
  EXPECT_TRUE(wire::check_combine_matches(leader_req, *rep).is_ok());
  EXPECT_EQ(mux.n_in_flight(), 0u);
  EXPECT_EQ(mux.n_discarded(), 0u);
}

TEST_P(MuxTest, LateRepliesAreDiscardedAndTheConnectionStaysUsable) {
  auto rig = make_rig(GetParam(), ServeOptions{.reply_delay = std::chrono::milliseconds(150)});
  RequestMux mux(rig->client.get());
  auto send = [&](uint64_t id) {
    auto req = wire::testing::make_dispatch(id, 0, 1, 64, 1, wire::WireDType::kQ8, wire::CombineMode::kPartial,
                                            wire::WireDType::kF16);
    EXPECT_TRUE(mux.start(id, wire::encode_dispatch(req).value(), deadline_in(1s)).is_ok());
  };
  const uint64_t a = mux.next_request_id();
  send(a);
  EXPECT_EQ(mux.wait(a, deadline_in(30ms)).status().code(), StatusCode::kTimeout);
  const uint64_t b = mux.next_request_id();
  send(b);
  auto f = mux.wait(b, deadline_in(5s));  // reads (and discards) a's late reply on the way
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->request_id(), b);
  EXPECT_EQ(mux.n_discarded(), 1u);
}

TEST_P(MuxTest, ErrorRepliesBecomeTheRequestsStatus) {
  auto rig = make_rig(GetParam(), ServeOptions{.error_code = static_cast<uint16_t>(wire::WireError::kNotHeld)});
  RequestMux mux(rig->client.get());
  const uint64_t id = mux.next_request_id();
  auto req = wire::testing::make_dispatch(id, 0, 1, 64, 1, wire::WireDType::kF32, wire::CombineMode::kExact,
                                          wire::WireDType::kF32);
  ASSERT_TRUE(mux.start(id, wire::encode_dispatch(req).value(), deadline_in(1s)).is_ok());
  auto f = mux.wait(id, deadline_in(5s));
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find("no such expert"), std::string::npos);
  // A ping on the same connection still works afterwards.
  auto rtt = ping(mux, 0, 0, deadline_in(5s));
  ASSERT_TRUE(rtt.is_ok()) << rtt.status().to_string();
}

TEST_P(MuxTest, PeerGoingAwayFailsPendingRequestsPromptly) {
  StreamPair p = make_stream_pair(GetParam());
  auto client = make_stream_connection(std::move(p.client));
  auto server = make_stream_connection(std::move(p.server));
  RequestMux mux(client.get());
  const uint64_t id = mux.next_request_id();
  ASSERT_TRUE(mux.start(id, wire::encode_ping({.request_id = id, .send_time_ns = 1}).value(), deadline_in(1s)).is_ok());
  std::thread bye([&] {
    ASSERT_TRUE(server->recv_frame(deadline_in(5s)).is_ok());
    ASSERT_TRUE(
        server->send_frame(wire::encode_goodbye({.reason = 8, .text = "draining"}).value(), deadline_in(1s)).is_ok());
    server->close();
  });
  // "Promptly": the GOODBYE ends the wait (kUnavailable naming the reason), not its deadline
  // (which would be kTimeout).
  auto f = mux.wait(id, deadline_in(30s));
  bye.join();
  EXPECT_EQ(f.status().code(), StatusCode::kUnavailable) << f.status().to_string();
  EXPECT_NE(f.status().message().find("draining"), std::string::npos);
  // New requests fail at once too.
  EXPECT_EQ(mux.start(mux.next_request_id(), wire::encode_ping({.request_id = 99}).value(), deadline_in(1s)).code(),
            StatusCode::kUnavailable);
}

TEST_P(MuxTest, WarmUpPingCarriesPaddingBothWays) {
  auto rig = make_rig(GetParam(), ServeOptions{});
  RequestMux mux(rig->client.get());
  const auto before = Clock::now();
  auto rtt = ping(mux, 100000, 100000, deadline_in(5s));
  const auto after = Clock::now();
  ASSERT_TRUE(rtt.is_ok()) << rtt.status().to_string();  // ping() checks the echo and both paddings
  // The reported round trip is one measured inside the call (not a speed claim).
  EXPECT_GT(rtt->count(), 0);
  EXPECT_LE(*rtt, after - before);
}

INSTANTIATE_TEST_SUITE_P(Links, MuxTest, ::testing::Values(Link::kLoopback, Link::kTcp, Link::kTcpPolling),
                         [](const auto& info) { return std::string(link_name(info.param)); });

wire::Hello hello(wire::PeerRole role, uint8_t model_byte) {
  wire::Hello h;
  h.role = role;
  h.model_id.fill(0);
  h.model_id[0] = model_byte;
  h.n_layer = 4;
  h.n_expert = 16;
  h.n_embd = 64;
  h.dtypes = 0xf;
  h.modes = 0x3;
  h.name = role == wire::PeerRole::kWorker ? "w0" : "bb";
  if (role == wire::PeerRole::kWorker) h.experts = {{0, 0, 8}, {3, 8, 8}};
  return h;
}

struct HandshakeOutcome {
  Result<wire::Session> initiator = Status(StatusCode::kInternal, "unset");
  Result<wire::Session> acceptor = Status(StatusCode::kInternal, "unset");
};

HandshakeOutcome run_handshake(Link link, const wire::Hello& backbone, const wire::Hello& worker,
                               const SwarmKey* backbone_key = nullptr, const SwarmKey* worker_key = nullptr) {
  StreamPair p = make_stream_pair(link);
  auto c = make_stream_connection(std::move(p.client));
  auto s = make_stream_connection(std::move(p.server));
  HandshakeOutcome out;
  std::thread acc([&] { out.acceptor = handshake(*s, worker, false, deadline_in(2s), worker_key); });
  out.initiator = handshake(*c, backbone, true, deadline_in(2s), backbone_key);
  acc.join();
  return out;
}

TEST_P(MuxTest, HandshakeAgreesOrBothSidesSayWhy) {
  auto ok = run_handshake(GetParam(), hello(wire::PeerRole::kBackbone, 1), hello(wire::PeerRole::kWorker, 1));
  ASSERT_TRUE(ok.initiator.is_ok()) << ok.initiator.status().to_string();
  ASSERT_TRUE(ok.acceptor.is_ok()) << ok.acceptor.status().to_string();
  EXPECT_EQ(ok.initiator->peer.experts.size(), 2u);
  EXPECT_EQ(ok.initiator->peer.name, "w0");
  EXPECT_EQ(ok.acceptor->peer.name, "bb");

  auto model = run_handshake(GetParam(), hello(wire::PeerRole::kBackbone, 1), hello(wire::PeerRole::kWorker, 2));
  EXPECT_EQ(model.acceptor.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(model.initiator.status().code(), StatusCode::kInvalidArgument);  // from the ERROR reply
  EXPECT_NE(model.initiator.status().message().find("model mismatch"), std::string::npos)
      << model.initiator.status().message();

  auto newer = hello(wire::PeerRole::kWorker, 1);
  newer.min_version = wire::kVersion + 1;
  newer.max_version = wire::kVersion + 1;
  auto ver = run_handshake(GetParam(), hello(wire::PeerRole::kBackbone, 1), newer);
  EXPECT_EQ(ver.acceptor.status().code(), StatusCode::kUnsupported);
  EXPECT_EQ(ver.initiator.status().code(), StatusCode::kUnsupported);
}

// Swarm keys (net/auth.h): the same key on both sides passes; another key, or a key on one side
// only, is refused by both, each saying why, before any request could be served.
TEST_P(MuxTest, SwarmKeyHandshakeAdmitsOnlyTheSameKey) {
  SwarmKey k1, k2;
  k1.bytes.assign(32, 0x11);
  k2.bytes.assign(32, 0x22);
  const auto bb = hello(wire::PeerRole::kBackbone, 1), w = hello(wire::PeerRole::kWorker, 1);
  auto same = run_handshake(GetParam(), bb, w, &k1, &k1);
  ASSERT_TRUE(same.initiator.is_ok()) << same.initiator.status().to_string();
  ASSERT_TRUE(same.acceptor.is_ok()) << same.acceptor.status().to_string();
  EXPECT_NE(same.initiator->features & wire::kFeatureAuth, 0u);

  auto other = run_handshake(GetParam(), bb, w, &k2, &k1);
  EXPECT_EQ(other.acceptor.status().code(), StatusCode::kUnauthenticated) << other.acceptor.status().to_string();
  EXPECT_NE(other.acceptor.status().message().find("key differs"), std::string::npos)
      << other.acceptor.status().message();
  EXPECT_EQ(other.initiator.status().code(), StatusCode::kUnauthenticated) << other.initiator.status().to_string();
  EXPECT_NE(other.initiator.status().message().find("swarm key mismatch"), std::string::npos)
      << other.initiator.status().message();

  auto open_backbone = run_handshake(GetParam(), bb, w, nullptr, &k1);
  EXPECT_EQ(open_backbone.acceptor.status().code(), StatusCode::kUnauthenticated);
  EXPECT_NE(open_backbone.acceptor.status().message().find("has no swarm key"), std::string::npos)
      << open_backbone.acceptor.status().message();
  EXPECT_EQ(open_backbone.initiator.status().code(), StatusCode::kUnauthenticated);

  auto open_worker = run_handshake(GetParam(), bb, w, &k1, nullptr);
  EXPECT_EQ(open_worker.acceptor.status().code(), StatusCode::kUnauthenticated);
  EXPECT_NE(open_worker.acceptor.status().message().find("requires a swarm key"), std::string::npos)
      << open_worker.acceptor.status().message();
  EXPECT_EQ(open_worker.initiator.status().code(), StatusCode::kUnauthenticated);
}

TEST(SwarmKey, LoadsAFileAndRefusesShortOrMissingOnes) {
  const std::string dir = ::testing::TempDir();
  const std::string good = dir + "/moesh-key-good", shortk = dir + "/moesh-key-short";
  {
    std::FILE* f = std::fopen(good.c_str(), "w");
    std::fputs("0123456789abcdef0123456789abcdef\n", f);
    std::fclose(f);
    f = std::fopen(shortk.c_str(), "w");
    std::fputs("tooshort\n", f);
    std::fclose(f);
  }
  auto k = SwarmKey::load(good);
  ASSERT_TRUE(k.is_ok()) << k.status().to_string();
  EXPECT_EQ((*k)->bytes.size(), 32u) << "the trailing newline is not part of the key";
  EXPECT_EQ((*k)->fingerprint().size(), 16u);
  SwarmKey other;
  other.bytes.assign(32, 1);
  EXPECT_NE((*k)->fingerprint(), other.fingerprint());
  auto s = SwarmKey::load(shortk);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("at least 16"), std::string::npos) << s.status().message();
  auto missing = SwarmKey::load(dir + "/moesh-no-such-key");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace moesh::net
