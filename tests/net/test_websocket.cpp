// The WebSocket transport (net/websocket.h) over real loopback TCP sockets: frames of every size
// from 1 byte to 4 MiB cross it both ways at once, in order, byte for byte, as they would over
// TCP; a plain TCP client on the same listening port gets its bytes back untouched (the sniffing
// puts them back); read deadlines consume nothing; close wakes a blocked reader; an HTTP request
// that is not an upgrade, and a client that talks WebSocket to a plain frame port, are refused
// with a message saying so; an oversized message fails the stream instead of growing memory.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "moesh/net/transport.h"
#include "moesh/net/websocket.h"
#include "moesh/wire/wire.h"

namespace moesh::net {
namespace {

using std::chrono::milliseconds;

struct Listener {
  std::unique_ptr<TcpListener> l;
  uint16_t port = 0;
};
Listener listen_any() {
  Listener out;
  auto l = TcpListener::listen("127.0.0.1", 0, TcpOptions{});
  EXPECT_TRUE(l.is_ok()) << l.status().to_string();
  if (!l.is_ok()) return out;
  out.port = (*l)->port();
  out.l = std::move(*l);
  return out;
}

// Accepts one connection and passes it through accept_tcp_or_websocket.
Result<std::unique_ptr<ByteStream>> accept_one(TcpListener& l, const WsOptions& o = {}) {
  MOESH_ASSIGN_OR_RETURN(auto s, l.accept(deadline_in(milliseconds(5000))));
  return accept_tcp_or_websocket(std::move(s), deadline_in(milliseconds(5000)), o);
}

// A WebSocket client connected to the listener, and the server side of it (accepted on a thread).
struct WsPair {
  Result<std::unique_ptr<ByteStream>> server = Status(StatusCode::kInternal, "not accepted");
  Result<std::unique_ptr<ByteStream>> client = Status(StatusCode::kInternal, "not connected");
};
WsPair ws_pair(const Listener& L, const WsOptions& server_opts = {}) {
  WsPair p;
  std::thread t([&] { p.server = accept_one(*L.l, server_opts); });
  p.client = ws_connect("127.0.0.1", L.port, TcpOptions{}, deadline_in(milliseconds(5000)));
  t.join();
  return p;
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> b(n);
  std::mt19937 rng(seed);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

Status read_exact(ByteStream& s, uint8_t* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    MOESH_ASSIGN_OR_RETURN(size_t k,
                           s.read_some(std::span<uint8_t>(out + got, n - got), deadline_in(milliseconds(10000))));
    got += k;
  }
  return Status::ok();
}

TEST(WebSocket, CarriesBytesBothWaysInOrderAtEverySize) {
  Listener L = listen_any();
  ASSERT_NE(L.l, nullptr);
  WsPair pair = ws_pair(L);
  auto& server = pair.server;
  auto& client = pair.client;
  ASSERT_TRUE(client.is_ok()) << client.status().to_string();
  ASSERT_TRUE(server.is_ok()) << server.status().to_string();
  EXPECT_TRUE(is_websocket(**client));
  EXPECT_TRUE(is_websocket(**server));
  EXPECT_EQ((*client)->describe().rfind("ws 127.0.0.1:", 0), 0u) << (*client)->describe();

  const std::vector<size_t> sizes = {1, 2, 31, 32, 100, 4096, 65535, 65536, 65537, 300000, 4u << 20};
  // Each side writes every size from its own thread while the other side reads: a reader blocked
  // in read_some and a writer on another thread share the stream.
  auto pump = [&](ByteStream& out, uint32_t seed) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      const auto b = pattern(sizes[i], seed + static_cast<uint32_t>(i));
      ASSERT_TRUE(out.write_all(b, deadline_in(milliseconds(10000))).is_ok());
    }
  };
  auto drain = [&](ByteStream& in, uint32_t seed) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<uint8_t> got(sizes[i]);
      Status rs = read_exact(in, got.data(), got.size());
      ASSERT_TRUE(rs.is_ok()) << "size " << sizes[i] << ": " << rs.to_string();
      EXPECT_EQ(got, pattern(sizes[i], seed + static_cast<uint32_t>(i))) << "size " << sizes[i];
    }
  };
  std::thread w1([&] { pump(**client, 100); });
  std::thread w2([&] { pump(**server, 200); });
  std::thread r1([&] { drain(**server, 100); });
  drain(**client, 200);
  w1.join();
  w2.join();
  r1.join();

  // A deadline with nothing to read consumes nothing; then the next bytes arrive whole.
  uint8_t one = 0;
  auto none = (*client)->read_some(std::span<uint8_t>(&one, 1), deadline_in(milliseconds(50)));
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().code(), StatusCode::kTimeout);
  const uint8_t hi[3] = {'h', 'i', '!'};
  ASSERT_TRUE((*server)->write_all(hi, deadline_in(milliseconds(5000))).is_ok());
  uint8_t got[3] = {};
  ASSERT_TRUE(read_exact(**client, got, 3).is_ok());
  EXPECT_EQ(std::memcmp(got, hi, 3), 0);

  // Frames over it, through the usual connection.
  auto cc = make_stream_connection(std::move(*client));
  auto sc = make_stream_connection(std::move(*server));
  auto ping = wire::encode_ping({.request_id = 5, .send_time_ns = 9, .pad_bytes = 1000, .reply_pad_bytes = 0});
  ASSERT_TRUE(cc->send_frame(*ping, deadline_in(milliseconds(5000))).is_ok());
  auto f = sc->recv_frame(deadline_in(milliseconds(5000)));
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->type(), wire::MsgType::kPing);
  EXPECT_EQ(f->request_id(), 5u);

  // Closing one end: a reader blocked on the other wakes with kUnavailable, well before its deadline.
  std::thread closer([&] {
    std::this_thread::sleep_for(milliseconds(100));
    cc->close();
  });
  auto after = sc->recv_frame(deadline_in(milliseconds(20000)));
  closer.join();
  ASSERT_FALSE(after.is_ok());
  EXPECT_EQ(after.status().code(), StatusCode::kUnavailable) << after.status().to_string();
}

TEST(WebSocket, PlainTcpOnTheSamePortKeepsItsBytes) {
  Listener L = listen_any();
  ASSERT_NE(L.l, nullptr);
  Result<std::unique_ptr<ByteStream>> server = Status(StatusCode::kInternal, "");
  std::thread t([&] { server = accept_one(*L.l); });
  auto client = tcp_connect("127.0.0.1", L.port, TcpOptions{}, deadline_in(milliseconds(5000)));
  ASSERT_TRUE(client.is_ok());
  const auto b = pattern(10000, 7);
  ASSERT_TRUE((*client)->write_all(b, deadline_in(milliseconds(5000))).is_ok());
  t.join();
  ASSERT_TRUE(server.is_ok()) << server.status().to_string();
  EXPECT_FALSE(is_websocket(**server));
  std::vector<uint8_t> got(b.size());
  ASSERT_TRUE(read_exact(**server, got.data(), got.size()).is_ok());
  EXPECT_EQ(got, b) << "the sniffed first bytes are read again";
  // Fewer than 4 bytes before the sniffing gives up: still delivered.
  Result<std::unique_ptr<ByteStream>> s2 = Status(StatusCode::kInternal, "");
  std::thread t2([&] {
    auto s = L.l->accept(deadline_in(milliseconds(5000)));
    s2 = s ? accept_tcp_or_websocket(std::move(*s), deadline_in(milliseconds(300))) : s.status();
  });
  auto c2 = tcp_connect("127.0.0.1", L.port, TcpOptions{}, deadline_in(milliseconds(5000)));
  ASSERT_TRUE(c2.is_ok());
  const uint8_t two[2] = {0x4d, 0x4f};
  ASSERT_TRUE((*c2)->write_all(two, deadline_in(milliseconds(5000))).is_ok());
  t2.join();
  ASSERT_TRUE(s2.is_ok()) << s2.status().to_string();
  uint8_t back[2] = {};
  ASSERT_TRUE(read_exact(**s2, back, 2).is_ok());
  EXPECT_EQ(std::memcmp(back, two, 2), 0);
}

TEST(WebSocket, NonUpgradesAndWrongPortsAreRefusedClearly) {
  Listener L = listen_any();
  ASSERT_NE(L.l, nullptr);
  // An HTTP GET that is not an upgrade (a browser, a health checker).
  Result<std::unique_ptr<ByteStream>> server = Status(StatusCode::kInternal, "");
  std::thread t([&] { server = accept_one(*L.l); });
  auto client = tcp_connect("127.0.0.1", L.port, TcpOptions{}, deadline_in(milliseconds(5000)));
  ASSERT_TRUE(client.is_ok());
  const std::string get = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_TRUE((*client)
                  ->write_all(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(get.data()), get.size()),
                              deadline_in(milliseconds(5000)))
                  .is_ok());
  t.join();
  ASSERT_FALSE(server.is_ok());
  EXPECT_EQ(server.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(server.status().message().find("not a WebSocket upgrade"), std::string::npos) << server.status().message();
  // The client got an HTTP answer, not silence.
  uint8_t buf[64] = {};
  auto n = (*client)->read_some(buf, deadline_in(milliseconds(5000)));
  ASSERT_TRUE(n.is_ok()) << n.status().to_string();
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buf), 5), "HTTP/");

  // A WebSocket client at a port that speaks only frames: the upgrade fails, naming the peer.
  std::thread t2([&] {
    auto s = L.l->accept(deadline_in(milliseconds(5000)));
    if (!s) return;
    auto e = wire::encode_error({.request_id = 0, .code = 11, .text = "not HTTP"});
    (void)(*s)->write_all(*e, deadline_in(milliseconds(2000)));
    std::this_thread::sleep_for(milliseconds(200));
  });
  auto ws = ws_connect("127.0.0.1", L.port, TcpOptions{}, deadline_in(milliseconds(3000)));
  t2.join();
  ASSERT_FALSE(ws.is_ok());
  EXPECT_NE(ws.status().message().find("the WebSocket upgrade failed"), std::string::npos) << ws.status().to_string();
  // Nobody listening: a clear connect error, within the deadline.
  L.l->close();
  auto gone = ws_connect("127.0.0.1", L.port, TcpOptions{}, deadline_in(milliseconds(2000)));
  EXPECT_FALSE(gone.is_ok());
}

TEST(WebSocket, AnOversizedMessageFailsTheStream) {
  Listener L = listen_any();
  ASSERT_NE(L.l, nullptr);
  WsOptions small;
  small.max_message_bytes = 1024;
  WsPair pair = ws_pair(L, small);
  auto& server = pair.server;
  auto& client = pair.client;
  ASSERT_TRUE(client.is_ok() && server.is_ok());
  const auto big = pattern(4096, 3);
  (void)(*client)->write_all(big, deadline_in(milliseconds(5000)));
  uint8_t buf[16];
  auto r = (*server)->read_some(buf, deadline_in(milliseconds(5000)));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().to_string();
}

}  // namespace
}  // namespace moesh::net
