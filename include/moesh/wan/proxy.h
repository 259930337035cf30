// `moesh wan-proxy`: an unprivileged WAN stand-in, a TCP proxy that delays each direction
// (docs/wan-proxy.md).
//
// Every accepted connection gets its own connection to the target. Each direction has a reader
// that keeps reading (pipelining: later bytes are read while earlier ones wait) and stamps every
// chunk with a release time from a DelayLine (delay, jitter, optional rate cap; never reordered),
// and a writer that sends each chunk when it is due, so byte order is kept. A direction holding
// `queue_bytes` stops reading until the writer catches up: backpressure reaches the sender
// through TCP's own flow control. An end of stream is passed on (shutdown(SHUT_WR)) after the
// bytes before it; a reset or a failed write closes both sides.
//
// Because the proxy terminates TCP, the kernel's congestion control sees two loopback-fast
// connections, not the delayed path: slow start, pacing and idle restart are hidden. Use
// `moesh wan-emu` (root) when those matter.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "moesh/net/transport.h"
#include "moesh/util/status.h"
#include "moesh/wan/delay_line.h"

namespace moesh::wan {

struct ProxyOptions {
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;  // 0: any free port (see TcpProxy::port())
  std::string target_host;
  uint16_t target_port = 0;
  // Client -> target and target -> client. A byte stream cannot lose data, so loss and the
  // packet queue bound are ignored (forced to 0); the byte bound below applies instead.
  LinkSpec to_target;
  LinkSpec to_client;
  size_t queue_bytes = size_t{4} << 20;   // per direction, before reading stops
  size_t chunk_bytes = size_t{64} << 10;  // largest read
  net::TcpOptions socket;                 // both sides: congestion control, buffers, TCP_NODELAY
  std::chrono::milliseconds connect_timeout{5000};
};

struct ProxyStats {
  std::atomic<uint64_t> connections{0};       // accepted
  std::atomic<uint64_t> connect_failures{0};  // target unreachable: the client was closed
  std::atomic<uint64_t> active{0};
  std::atomic<uint64_t> bytes_to_target{0};
  std::atomic<uint64_t> bytes_to_client{0};
  std::atomic<uint64_t> peak_held_bytes{0};  // the most one direction held (<= queue_bytes + chunk_bytes)
};

class TcpProxy {
 public:
  static Result<std::unique_ptr<TcpProxy>> start(ProxyOptions opts);
  ~TcpProxy();  // stop()
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  uint16_t port() const { return port_; }
  const ProxyOptions& options() const { return opts_; }
  const ProxyStats& stats() const { return stats_; }
  // Stops accepting, closes every connection and joins all threads. Idempotent; not from a
  // signal handler (use request_stop() there, then call stop()).
  void stop();
  // Async-signal-safe: wait() returns.
  void request_stop() { stop_requested_.store(true); }
  // Blocks until request_stop() or stop().
  void wait();

  struct Conn;  // one client connection (proxy.cpp)

 private:
  TcpProxy(ProxyOptions opts, int listen_fd, uint16_t port);
  void accept_loop();
  void reap(bool all);

  ProxyOptions opts_;
  int listen_fd_;
  uint16_t port_;
  ProxyStats stats_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stop_requested_{false};
  std::mutex mu_;
  std::list<std::unique_ptr<Conn>> conns_;
  std::thread acceptor_;
  std::once_flag stopped_;
};

}  // namespace moesh::wan
