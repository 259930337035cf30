// One backbone -> worker connection: how it is dialed, the HELLO handshake, the warm-up PING,
// and an orderly GOODBYE when it is dropped.
//
// The transport comes from a Dialer, so the executor does not care what carries the frames:
// TCP (tcp_dialer, the socket policy of docs/PROTOCOL.md: NODELAY, congestion control set before
// connect, large buffers), the in-process loopback or fault-injecting transports in tests, and
// later relays or WebSocket.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "moesh/net/auth.h"
#include "moesh/net/tls.h"
#include "moesh/net/transport.h"
#include "moesh/remote/address.h"
#include "moesh/util/status.h"
#include "moesh/wire/wire.h"

namespace moesh {

class WorkerRegistry;

// A connected frame transport to `addr`, made before the deadline.
using Dialer =
    std::function<Result<std::unique_ptr<net::Connection>>(const WorkerAddress& addr, net::Deadline deadline)>;
// TCP (or through a relay for relay:// addresses); with pins, TLS to the worker on top (net/tls.h).
// `swarm_key`: proven to a relay that admits only holders of it (net/relay.h).
Dialer tcp_dialer(net::TcpOptions tcp, std::shared_ptr<const net::TlsPins> tls_pins = nullptr,
                  std::shared_ptr<const net::SwarmKey> swarm_key = nullptr);

struct LinkOptions {
  Dialer dialer;                                    // empty: tcp_dialer(tcp)
  net::TcpOptions tcp;                              // congestion control, buffers, NODELAY
  std::chrono::milliseconds connect_timeout{5000};  // connect + handshake + warm-up
  uint32_t warmup_pad_bytes = 100 * 1024;           // warm-up PING padding each way
  // What the worker must speak (checked after the handshake; errors name the worker).
  uint32_t need_dtypes = 0;  // bit per wire::WireDType
  uint32_t need_modes = 0;   // bit per wire::CombineMode
  // The swarm key to prove and require (net/auth.h); null: none.
  std::shared_ptr<const net::SwarmKey> swarm_key;
  // Where "join://NAME" workers come from (registry.h); null: such addresses are refused.
  std::shared_ptr<WorkerRegistry> registry;
  // TLS to every worker, accepting only these certificate fingerprints (net/tls.h); null: plain TCP.
  std::shared_ptr<const net::TlsPins> tls_pins;
};

// One connected, handshaken worker.
struct WorkerLink {
  WorkerAddress address;  // the path in use
  WorkerAddress dialed;   // what connect_worker was given (every path): what a re-dial uses
  std::string label;      // "host:port (name)", used in every message
  std::unique_ptr<net::Connection> conn;
  std::unique_ptr<net::RequestMux> mux;
  wire::Session session;      // negotiated; session.peer is the worker's HELLO
  wire::DecodeLimits limits;  // for decoding its COMBINEs
  std::chrono::nanoseconds warmup_rtt{0};
  // With alternative paths (WorkerAddress::alternatives): what each path measured at connect, in
  // order of preference; the link uses the first that worked.
  struct Probe {
    std::string address;
    bool ok = false;
    double rtt_ms = 0;  // warm-up round trip when ok
    std::string error;  // why not, otherwise
    bool used = false;
  };
  std::vector<Probe> probes;
  // What the worker said it offers (INFO_REPLY after the warm-up; zero when it lacks the feature).
  wire::InfoMsg capacity;
  // Its round trips to the other workers (probe_peer_rtts): per other worker's label, in ms; a
  // worker it could not reach, or did not ask about (no direct address), is absent.
  std::vector<std::pair<std::string, double>> peer_rtt_ms;
  // Sends GOODBYE (best effort) and closes the connection, waking a thread blocked reading it;
  // idempotent. The objects stay until destruction, so a reader may still touch them.
  void shut_down();
  ~WorkerLink();  // shut_down()

 private:
  bool shut_ = false;
};

// Dials one worker and runs handshake + warm-up. Errors name the address. A "join://NAME"
// address waits (connect_timeout) for that worker to join the registry instead.
Result<std::unique_ptr<WorkerLink>> connect_worker(const WorkerAddress& addr, const wire::Hello& local,
                                                   const LinkOptions& opts);
// Handshake, capability checks and warm-up over an already connected transport (what
// connect_worker does after dialling; the registry's joins). A kJoined `addr` takes its name
// from the worker's HELLO.
Result<std::unique_ptr<WorkerLink>> establish_link(std::unique_ptr<net::Connection> conn, WorkerAddress addr,
                                                   const wire::Hello& local, const LinkOptions& opts,
                                                   net::Deadline deadline);

// Asks every worker of `ask` that speaks PROBE for its TCP round trip to every other worker of
// `peers` dialled directly (the backbone's address for it), all at once, and fills its
// peer_rtt_ms: the peer-to-peer RTTs the planner prices chained spans with (docs/swarm.md#plan).
// Nothing may be reading the asked links meanwhile (wait() reads them itself). Best effort: a
// worker that fails or does not answer before the deadline gets no figures (logged), nothing
// else changes.
void probe_peer_rtts(const std::vector<WorkerLink*>& ask, const std::vector<const WorkerLink*>& peers,
                     net::Deadline deadline);

}  // namespace moesh
