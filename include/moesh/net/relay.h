// `moesh relay`: meets workers that cannot be reached (behind NAT, inbound ports closed) and the
// backbones that want them. A worker dials out to the relay (`moesh worker --join RELAY`) and
// registers under its name; a backbone names it `relay://RELAY_HOST:PORT/NAME` and the relay
// splices the two streams — TCP or WebSocket, told apart by their first bytes on the same port
// (net/websocket.h) — (docs/PROTOCOL.md §3a): after the ROUTE frames it copies bytes, it
// never decodes or re-encodes a HELLO, DISPATCH or COMBINE, and it cannot read or forge the swarm-key
// exchange, which runs end to end between backbone and worker.
//
// A registered worker's idle connection is a standby: the relay answers its heartbeat PINGs
// until a backbone claims it, then sends it ROUTE SPLICED. The worker dials a fresh standby as
// soon as one is claimed, so several backbones can reach it through one relay. A CONNECT for a
// name with no standby waits (connect_wait) for one, then fails with ERROR NOT_HELD naming it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moesh/net/auth.h"
#include "moesh/net/transport.h"
#include "moesh/util/status.h"

namespace moesh::net {

struct RelayOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: any free port
  TcpOptions tcp;
  std::chrono::milliseconds route_timeout{5000};  // for the first ROUTE frame of a connection
  // A CONNECT waits this long for a standby; under the backbone's connect timeout (5 s), so it
  // gets the relay's "not registered" rather than a timeout of its own.
  std::chrono::milliseconds connect_wait{2000};
  std::chrono::milliseconds standby_idle{60000};  // a standby silent this long is dropped
  int max_connections = 1024;                     // standbys + splices + unrouted at once
  // Admission (`--swarm-key`): every worker that registers and every backbone that connects must
  // prove it holds this key (auth.h relay_auth_*) before it is registered or spliced; others are
  // refused with ERROR UNAUTHENTICATED and a log line. Null: an open relay (the end-to-end
  // handshake between backbone and worker still checks the swarm's key).
  std::shared_ptr<const SwarmKey> swarm_key;
};

struct RelayStats {
  std::atomic<uint64_t> registrations{0};  // JOINs accepted
  std::atomic<uint64_t> splices{0};        // CONNECTs matched with a standby
  std::atomic<uint64_t> refused{0};        // connections refused (no ROUTE, unknown name, limit, swarm key)
  std::atomic<uint64_t> bytes_to_workers{0}, bytes_to_backbones{0};
  std::atomic<int64_t> active_splices{0};
};

struct RelayWorker {
  std::string name;
  int standbys = 0;  // registered idle connections
  int spliced = 0;   // connections now carrying a backbone
};

class Relay {
 public:
  static Result<std::unique_ptr<Relay>> start(const RelayOptions& opts);
  ~Relay();  // stop() and join everything
  uint16_t port() const;
  // Serves until stop().
  void run();
  // Async-signal-safe: sets a flag.
  void stop();
  const RelayStats& stats() const;
  std::vector<RelayWorker> workers() const;

  struct Impl;

 private:
  explicit Relay(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The backbone's side: dials the relay and asks for worker `name` (ROUTE CONNECT), proves
// `swarm_key` when the relay asks for it, and returns once the relay says SPLICED; the stream
// then carries TLS (if used) and the usual handshake to the worker itself.
// `websocket`: reach the relay over WebSocket (net/websocket.h) instead of plain TCP.
Result<std::unique_ptr<ByteStream>> relay_connect(const std::string& relay_host, uint16_t relay_port,
                                                  const std::string& name, const TcpOptions& tcp, Deadline deadline,
                                                  bool websocket = false, const SwarmKey* swarm_key = nullptr);

}  // namespace moesh::net
