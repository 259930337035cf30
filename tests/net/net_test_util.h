// A minimal in-test worker loop (accept -> handshake -> recv/decode/compute/encode/send) and
// helpers to build connected pairs over loopback or real TCP on 127.0.0.1.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "moesh/net/transport.h"
#include "moesh/wire/wire.h"
#include "wire/wire_test_util.h"

namespace moesh::net::testing {

using namespace std::chrono_literals;

// kTcpPolling: TCP whose receives busy-poll before sleeping (TcpOptions::poll_us), both ends.
enum class Link { kLoopback, kTcp, kTcpPolling };
inline const char* link_name(Link l) {
  return l == Link::kLoopback ? "loopback" : l == Link::kTcp ? "tcp" : "tcp_polling";
}

struct StreamPair {
  std::unique_ptr<ByteStream> client, server;
  std::unique_ptr<TcpListener> listener;  // kept alive for TCP
};

inline StreamPair make_stream_pair(Link link) {
  StreamPair p;
  if (link == Link::kLoopback) {
    auto [a, b] = make_loopback_streams();
    p.client = std::move(a);
    p.server = std::move(b);
    return p;
  }
  TcpOptions o;
  if (link == Link::kTcpPolling) o.poll_us = 500;
  auto l = TcpListener::listen("127.0.0.1", 0, o);
  EXPECT_TRUE(l.is_ok()) << l.status().to_string();
  p.listener = std::move(l).value();
  std::thread acceptor([&] {
    auto s = p.listener->accept(deadline_in(5s));
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    if (s.is_ok()) p.server = std::move(s).value();
  });
  auto c = tcp_connect("127.0.0.1", p.listener->port(), o, deadline_in(5s));
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  if (c.is_ok()) p.client = std::move(c).value();
  acceptor.join();
  return p;
}

struct ServeOptions {
  bool answer = true;                        // false: swallow every request (a hung worker)
  size_t batch = 1;                          // answer in reverse order, `batch` at a time
  std::chrono::milliseconds reply_delay{0};  // wait before answering each batch
  uint16_t error_code = 0;                   // != 0: answer DISPATCH with this ERROR
};

// Serves until the peer leaves. Answers DISPATCH with a tagged COMBINE and PING with PONG.
// Returns the number of requests seen.
inline int serve(Connection& conn, ServeOptions o) {
  int seen = 0;
  std::vector<std::vector<uint8_t>> pending;
  while (true) {
    auto f = conn.recv_frame(deadline_in(pending.empty() ? 10s : 20ms));
    if (!f.is_ok()) {
      if (f.status().code() == StatusCode::kTimeout && !pending.empty()) {
        std::reverse(pending.begin(), pending.end());
        for (auto& r : pending) (void)conn.send_frame(r, deadline_in(5s));
        pending.clear();
        continue;
      }
      return seen;
    }
    ++seen;
    std::vector<uint8_t> reply;
    if (f->type() == wire::MsgType::kDispatch) {
      auto req = wire::decode_dispatch(*f, wire::DecodeLimits{});
      if (!req.is_ok()) {
        send_error(conn, f->request_id(), wire::WireError::kMalformed, req.status().message(), deadline_in(1s));
        continue;
      }
      if (o.error_code != 0) {
        reply =
            wire::encode_error({.request_id = req->request_id, .code = o.error_code, .text = "no such expert"}).value();
      } else {
        reply = wire::encode_combine(wire::testing::make_combine_for(*req)).value();
      }
    } else if (f->type() == wire::MsgType::kPing) {
      auto p = wire::decode_ping(*f).value();
      reply = wire::encode_pong({.request_id = p.request_id,
                                 .ping_time_ns = p.send_time_ns,
                                 .reply_time_ns = 1,
                                 .pad_bytes = p.reply_pad_bytes})
                  .value();
    } else if (f->type() == wire::MsgType::kGoodbye) {
      return seen;
    } else {
      continue;
    }
    if (!o.answer) continue;
    pending.push_back(std::move(reply));
    if (pending.size() >= o.batch) {
      if (o.reply_delay.count() > 0) std::this_thread::sleep_for(o.reply_delay);
      std::reverse(pending.begin(), pending.end());
      for (auto& r : pending) (void)conn.send_frame(r, deadline_in(5s));
      pending.clear();
    }
  }
}

inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace moesh::net::testing
