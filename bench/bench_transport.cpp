// WebSocket framing cost vs raw TCP for dispatch-sized messages: a round trip of one frame each
// way (a PING padded to the size, answered by a PONG padded the same) over loopback, through the
// transports a worker uses — plain TCP, and the Beast WebSocket stream (net/websocket.h) — each
// wrapped in the same frame connection. Sizes: one decode token's DISPATCH at n_embd 2048/4096
// in F16 (4 KiB, 8 KiB), a 16-token step (64 KiB), a prefill chunk (1 MiB).
//
//   build/bin/bench_transport --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <thread>

#include "moesh/net/transport.h"
#include "moesh/net/websocket.h"
#include "moesh/wire/wire.h"

namespace moesh::net {
namespace {

using std::chrono::milliseconds;

struct Pair {
  std::unique_ptr<Connection> client, server;
};

Pair connect_pair(bool websocket) {
  Pair p;
  auto l = TcpListener::listen("127.0.0.1", 0, TcpOptions{});
  if (!l) return p;
  Result<std::unique_ptr<ByteStream>> server = Status(StatusCode::kInternal, "");
  std::thread t([&] {
    auto s = (*l)->accept(deadline_in(milliseconds(5000)));
    server = s ? accept_tcp_or_websocket(std::move(*s), deadline_in(milliseconds(5000))) : s.status();
  });
  auto client = websocket ? ws_connect("127.0.0.1", (*l)->port(), TcpOptions{}, deadline_in(milliseconds(5000)))
                          : tcp_connect("127.0.0.1", (*l)->port(), TcpOptions{}, deadline_in(milliseconds(5000)));
  t.join();
  if (!client || !server) return p;
  ConnectionOptions o;
  o.max_frame_bytes = 4u << 20;
  p.client = make_stream_connection(std::move(*client), o);
  p.server = make_stream_connection(std::move(*server), o);
  return p;
}

void round_trip(benchmark::State& state, bool websocket) {
  const uint32_t bytes = static_cast<uint32_t>(state.range(0));
  Pair p = connect_pair(websocket);
  if (!p.client) {
    state.SkipWithError("could not connect");
    return;
  }
  std::atomic<bool> stop{false};
  // The echo side: answers every PING with a PONG carrying the requested padding.
  std::thread echo([&] {
    while (!stop.load()) {
      auto f = p.server->recv_frame(deadline_in(milliseconds(100)));
      if (!f) {
        if (f.status().code() == StatusCode::kTimeout) continue;
        return;
      }
      auto ping = wire::decode_ping(*f);
      if (!ping) return;
      auto pong = wire::encode_pong({.request_id = ping->request_id,
                                     .ping_time_ns = ping->send_time_ns,
                                     .reply_time_ns = 0,
                                     .pad_bytes = ping->reply_pad_bytes});
      if (!pong || !p.server->send_frame(*pong, deadline_in(milliseconds(5000))).is_ok()) return;
    }
  });
  uint64_t id = 0;
  for (auto _ : state) {
    auto ping =
        wire::encode_ping({.request_id = ++id, .send_time_ns = 0, .pad_bytes = bytes, .reply_pad_bytes = bytes});
    if (!ping || !p.client->send_frame(*ping, deadline_in(milliseconds(5000))).is_ok()) {
      state.SkipWithError("send failed");
      break;
    }
    auto f = p.client->recv_frame(deadline_in(milliseconds(5000)));
    if (!f || f->request_id() != id) {
      state.SkipWithError("no PONG");
      break;
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * bytes);
  stop.store(true);
  echo.join();
  p.client->close();
  p.server->close();
}

void BM_RoundTripTcp(benchmark::State& state) {
  round_trip(state, false);
}
void BM_RoundTripWebSocket(benchmark::State& state) {
  round_trip(state, true);
}
BENCHMARK(BM_RoundTripTcp)->Arg(4096)->Arg(8192)->Arg(65536)->Arg(1 << 20)->UseRealTime();
BENCHMARK(BM_RoundTripWebSocket)->Arg(4096)->Arg(8192)->Arg(65536)->Arg(1 << 20)->UseRealTime();

}  // namespace
}  // namespace moesh::net

BENCHMARK_MAIN();
