// The delaying TCP proxy over loopback: pipelined bytes arrive complete and in order, several
// clients at once, an end of stream is passed on, backpressure bounds what the proxy holds, and
// the round trip is at least twice the one-way delay (the only timing asserted: a lower bound).
// Then the `moesh wan-proxy` command itself.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <thread>

#include "moesh/wan/proxy.h"
#include "moesh/wan/spec.h"
#include "util/run_moesh.h"
#include "wan/wan_test_util.h"

namespace moesh::wan {
namespace {

using namespace std::chrono_literals;
using testing::EchoServer;
using testing::pattern_byte;

constexpr auto kDelay = 30ms;

std::unique_ptr<net::TcpListener> listen_local(const net::TcpOptions& o = {}) {
  auto l = net::TcpListener::listen("127.0.0.1", 0, o);
  EXPECT_TRUE(l.is_ok()) << l.status().to_string();
  return l.is_ok() ? std::move(*l) : nullptr;
}

std::unique_ptr<TcpProxy> start_proxy(uint16_t target_port, Nanos delay, ProxyOptions o = {}) {
  o.target_host = "127.0.0.1";
  o.target_port = target_port;
  o.to_target.delay = delay;
  o.to_client.delay = delay;
  auto p = TcpProxy::start(o);
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return p.is_ok() ? std::move(*p) : nullptr;
}

std::unique_ptr<net::ByteStream> connect_local(uint16_t port) {
  auto s = net::tcp_connect("127.0.0.1", port, {}, net::deadline_in(5s));
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? std::move(*s) : nullptr;
}

// Sends `n_msgs` messages of growing size without waiting for replies while another thread reads
// the echo; returns how many echoed bytes matched, in order.
uint64_t pipelined_echo(net::ByteStream& s, uint32_t tag, int n_msgs, uint64_t* total_out) {
  uint64_t total = 0;
  for (int i = 0; i < n_msgs; ++i) total += 1 + (static_cast<uint64_t>(i) * 7919) % 20000;
  *total_out = total;
  std::thread tx([&] {
    uint64_t off = 0;
    for (int i = 0; i < n_msgs; ++i) {
      std::vector<uint8_t> m(1 + (static_cast<uint64_t>(i) * 7919) % 20000);
      for (auto& b : m) b = pattern_byte(tag, off++);
      ASSERT_TRUE(s.write_all(m, net::deadline_in(10s)).is_ok());
    }
  });
  uint64_t got = 0;
  std::vector<uint8_t> buf(1 << 16);
  while (got < total) {
    auto n = s.read_some(buf, net::deadline_in(10s));
    if (!n) {
      ADD_FAILURE() << "stream " << tag << " after " << got << " of " << total << " bytes: " << n.status().to_string();
      break;
    }
    for (size_t k = 0; k < *n; ++k, ++got) {
      if (buf[k] != pattern_byte(tag, got)) {
        ADD_FAILURE() << "stream " << tag << ": byte " << got << " differs (reordered or corrupted)";
        tx.join();
        return got;
      }
    }
  }
  tx.join();
  return got;
}

TEST(WanProxy, PipelinedBytesArriveCompleteAndInOrder) {
  EchoServer echo(listen_local());
  auto proxy = start_proxy(echo.port(), kDelay);
  ASSERT_TRUE(proxy);
  auto s = connect_local(proxy->port());
  ASSERT_TRUE(s);
  uint64_t total = 0;
  EXPECT_EQ(pipelined_echo(*s, 1, 300, &total), total);
  // The proxy counts a chunk after its send returns, which may be after the client read it: wait
  // (bounded) for the counters to catch up before comparing.
  auto settled = [&](const std::atomic<uint64_t>& c) {
    for (int i = 0; i < 500 && c.load() < total; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return c.load();
  };
  EXPECT_EQ(settled(proxy->stats().bytes_to_target), total);
  EXPECT_EQ(settled(proxy->stats().bytes_to_client), total);
}

TEST(WanProxy, RoundTripIsAtLeastTwiceTheDelay) {
  EchoServer echo(listen_local());
  auto proxy = start_proxy(echo.port(), kDelay);
  ASSERT_TRUE(proxy);
  auto s = connect_local(proxy->port());
  ASSERT_TRUE(s);
  for (int i = 0; i < 3; ++i) {
    const uint8_t ping[8] = {1, 2, 3, 4, 5, 6, 7, static_cast<uint8_t>(i)};
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(s->write_all(ping, net::deadline_in(5s)).is_ok());
    size_t got = 0;
    uint8_t buf[8];
    while (got < sizeof(buf)) {
      auto n = s->read_some({buf + got, sizeof(buf) - got}, net::deadline_in(5s));
      ASSERT_TRUE(n.is_ok()) << n.status().to_string();
      got += *n;
    }
    const auto rtt = std::chrono::steady_clock::now() - t0;
    EXPECT_GE(rtt, 2 * kDelay) << "round trip " << std::chrono::duration<double, std::milli>(rtt).count() << " ms";
    EXPECT_EQ(buf[7], i);
  }
}

TEST(WanProxy, SeveralClientsAtOnce) {
  EchoServer echo(listen_local());
  ProxyOptions o;
  o.to_target.jitter = 5ms;  // jitter too: still no reordering
  o.to_client.jitter = 5ms;
  auto proxy = start_proxy(echo.port(), 10ms, o);
  ASSERT_TRUE(proxy);
  constexpr int kClients = 4;
  std::vector<std::thread> ts;
  std::atomic<int> good{0};
  for (int c = 0; c < kClients; ++c) {
    ts.emplace_back([&, c] {
      auto s = connect_local(proxy->port());
      if (!s) return;
      uint64_t total = 0;
      if (pipelined_echo(*s, 100 + c, 120, &total) == total) ++good;
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(good.load(), kClients);
  EXPECT_EQ(proxy->stats().connections.load(), uint64_t{kClients});
}

TEST(WanProxy, RateCapKeepsBytesInOrder) {
  EchoServer echo(listen_local());
  ProxyOptions o;
  o.to_target.rate_bps = 200e6;
  o.to_client.rate_bps = 200e6;
  auto proxy = start_proxy(echo.port(), 5ms, o);
  ASSERT_TRUE(proxy);
  auto s = connect_local(proxy->port());
  ASSERT_TRUE(s);
  uint64_t total = 0;
  EXPECT_EQ(pipelined_echo(*s, 9, 100, &total), total);
}

TEST(WanProxy, EndOfStreamIsPassedOnAfterTheData) {
  EchoServer echo(listen_local());
  auto proxy = start_proxy(echo.port(), 5ms);
  ASSERT_TRUE(proxy);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(proxy->port());
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const std::string msg = "hello over a slow link";
  ASSERT_EQ(::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL), static_cast<ssize_t>(msg.size()));
  ASSERT_EQ(::shutdown(fd, SHUT_WR), 0);  // half-close: the echo must still come back
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string got;
  char buf[256];
  ssize_t n = 0;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) got.append(buf, static_cast<size_t>(n));
  ::close(fd);
  EXPECT_EQ(got, msg);
}

TEST(WanProxy, UnreachableTargetClosesTheClient) {
  uint16_t dead_port = 0;
  {
    auto l = listen_local();
    ASSERT_TRUE(l);
    dead_port = l->port();
  }  // closed: nothing listens there now
  auto proxy = start_proxy(dead_port, 1ms);
  ASSERT_TRUE(proxy);
  auto s = connect_local(proxy->port());
  ASSERT_TRUE(s);
  uint8_t buf[16];
  auto n = s->read_some(buf, net::deadline_in(10s));
  ASSERT_FALSE(n.is_ok());
  EXPECT_EQ(n.status().code(), StatusCode::kUnavailable) << n.status().to_string();
  EXPECT_EQ(proxy->stats().connect_failures.load(), 1u);
}

TEST(WanProxy, BackpressureBoundsWhatTheProxyHolds) {
  // A receiver that reads nothing: the proxy must stop reading at its bound, and the sender's
  // writes must stall instead of the proxy buffering without limit.
  net::TcpOptions small;
  small.send_buffer_bytes = 64 << 10;
  small.recv_buffer_bytes = 64 << 10;
  EchoServer stalled(listen_local(small), /*echo=*/false);
  ProxyOptions o;
  o.queue_bytes = 256 << 10;
  o.chunk_bytes = 16 << 10;
  o.socket = small;
  auto proxy = start_proxy(stalled.port(), 1ms, o);
  ASSERT_TRUE(proxy);
  auto s = net::tcp_connect("127.0.0.1", proxy->port(), small, net::deadline_in(5s));
  ASSERT_TRUE(s.is_ok());
  const std::vector<uint8_t> big(size_t{32} << 20, 0x5a);
  const Status st = (*s)->write_all(big, net::deadline_in(1500ms));
  EXPECT_EQ(st.code(), StatusCode::kTimeout) << "32 MiB went into a receiver that reads nothing";
  EXPECT_LE(proxy->stats().peak_held_bytes.load(), o.queue_bytes + o.chunk_bytes);
  EXPECT_GT(proxy->stats().peak_held_bytes.load(), 0u);
  stalled.release();
}

TEST(WanProxy, StopClosesLiveConnections) {
  EchoServer echo(listen_local());
  auto proxy = start_proxy(echo.port(), 1ms);
  ASSERT_TRUE(proxy);
  auto s = connect_local(proxy->port());
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->write_all(std::vector<uint8_t>(10, 1), net::deadline_in(1s)).is_ok());
  proxy->stop();
  uint8_t buf[64];
  // Whatever echo made it back before the stop, the stream then ends.
  Status last;
  for (int i = 0; i < 10; ++i) {
    auto n = s->read_some(buf, net::deadline_in(5s));
    if (!n) {
      last = n.status();
      break;
    }
  }
  EXPECT_EQ(last.code(), StatusCode::kUnavailable) << last.to_string();
}

// ---- the command ----

TEST(WanProxyCli, ForwardsWithDelayAndStopsOnSigterm) {
  EchoServer echo(listen_local());
  testing::MoeshChild child({"wan-proxy", "--listen", "127.0.0.1:0", "--to", "127.0.0.1:" + std::to_string(echo.port()),
                             "--delay-ms", "30", "--jitter-ms", "1"});
  ASSERT_TRUE(child.started());
  std::string line;
  ASSERT_TRUE(child.read_until("listening on ", &line, 10s)) << child.output();
  const auto hp = parse_host_port(line.substr(std::string("listening on ").size()));
  ASSERT_TRUE(hp.is_ok()) << line;
  auto s = connect_local(hp->second);
  ASSERT_TRUE(s);
  uint64_t total = 0;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(pipelined_echo(*s, 3, 50, &total), total);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 2 * kDelay);
  s->close();
  ::kill(child.pid(), SIGTERM);
  child.drain(10s);
  EXPECT_EQ(child.wait_exit(10s), 0);
  EXPECT_NE(child.output().find("wan-proxy stopped: 1 connections"), std::string::npos) << child.output();
}

TEST(WanProxyCli, UsageErrorsExit2) {
  EXPECT_EQ(test::run_moesh("wan-proxy --to 127.0.0.1:9 ").exit_code, 2) << "--delay-ms is required";
  EXPECT_EQ(test::run_moesh("wan-proxy --delay-ms 5").exit_code, 2) << "--to is required";
  const auto r = test::run_moesh("wan-proxy --to nowhere --delay-ms 5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("HOST:PORT"), std::string::npos) << r.err;
  EXPECT_EQ(test::run_moesh("wan-proxy --to 127.0.0.1:9 --delay-ms -1").exit_code, 2);
  EXPECT_EQ(test::run_moesh("wan-proxy --to 127.0.0.1:9 --delay-ms 5 --listen bad").exit_code, 2);
}

}  // namespace
}  // namespace moesh::wan
