// The backbone's connections to workers: dial (through the Dialer), HELLO handshake, warm-up
// PING, and an orderly GOODBYE when the link is dropped.
#include "moesh/remote/link.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <future>

#include "moesh/net/relay.h"
#include "moesh/net/websocket.h"
#include "moesh/remote/registry.h"

namespace moesh {

Dialer tcp_dialer(net::TcpOptions tcp, std::shared_ptr<const net::TlsPins> tls_pins,
                  std::shared_ptr<const net::SwarmKey> swarm_key) {
  return [tcp, tls_pins, swarm_key](const WorkerAddress& addr,
                                    net::Deadline deadline) -> Result<std::unique_ptr<net::Connection>> {
    // Through a relay: ROUTE CONNECT names the worker, then TLS and the handshake go to it end to end.
    // ws:// and relay+ws://: the same bytes as binary WebSocket messages (net/websocket.h).
    auto stream = addr.path == WorkerPath::kRelay ? net::relay_connect(addr.host, addr.port, addr.name, tcp, deadline,
                                                                       addr.websocket, swarm_key.get())
                  : addr.websocket                ? net::ws_connect(addr.host, addr.port, tcp, deadline)
                                                  : net::tcp_connect(addr.host, addr.port, tcp, deadline);
    if (!stream) return stream.status();
    if (tls_pins) {
      auto tls = net::tls_client(std::move(*stream), *tls_pins, deadline);
      if (!tls) return tls.status();
      return net::make_stream_connection(std::move(*tls));
    }
    return net::make_stream_connection(std::move(*stream));
  };
}

void WorkerLink::shut_down() {
  if (shut_ || !conn) return;
  shut_ = true;
  wire::GoodbyeMsg g;
  g.text = "backbone closing";
  auto f = wire::encode_goodbye(g);
  if (f.is_ok()) (void)conn->send_frame(*f, net::deadline_in(std::chrono::milliseconds(200)));
  conn->close();
}

WorkerLink::~WorkerLink() {
  shut_down();
}

Result<std::unique_ptr<WorkerLink>> connect_one_path(const WorkerAddress& addr, const wire::Hello& local,
                                                     const LinkOptions& opts);

Result<std::unique_ptr<WorkerLink>> connect_worker(const WorkerAddress& addr, const wire::Hello& local,
                                                   const LinkOptions& opts) {
  if (addr.alternatives.empty()) return connect_one_path(addr, local, opts);
  // Path policy: every path is tried and measured (so the registry can show both), the first in
  // order of preference that works is used, the others are closed.
  std::vector<WorkerAddress> paths = {addr};
  paths[0].alternatives.clear();
  paths.insert(paths.end(), addr.alternatives.begin(), addr.alternatives.end());
  std::vector<std::future<Result<std::unique_ptr<WorkerLink>>>> tries;
  for (const WorkerAddress& p : paths)
    tries.push_back(std::async(std::launch::async, [&local, &opts, p] { return connect_one_path(p, local, opts); }));
  std::unique_ptr<WorkerLink> chosen;
  std::vector<WorkerLink::Probe> probes;
  std::string errors;
  std::string name;
  for (size_t i = 0; i < tries.size(); ++i) {
    Result<std::unique_ptr<WorkerLink>> l = tries[i].get();
    WorkerLink::Probe& pr = probes.emplace_back();
    pr.address = paths[i].to_string();
    if (!l) {
      pr.error = l.status().to_string();
      errors += (errors.empty() ? "" : "; ") + pr.error;
      continue;
    }
    pr.ok = true;
    pr.rtt_ms = std::chrono::duration<double, std::milli>((*l)->warmup_rtt).count();
    if (name.empty()) name = (*l)->session.peer.name;
    if ((*l)->session.peer.name != name) {
      pr.ok = false;
      pr.error =
          fmt::format("{} answers as '{}', not '{}': not the same worker", pr.address, (*l)->session.peer.name, name);
      continue;
    }
    if (!chosen) {
      chosen = std::move(*l);
      pr.used = true;
    }  // else: measured, then closed (GOODBYE) as it goes out of scope
  }
  if (!chosen) return make_error(StatusCode::kUnavailable, "worker {}: no path works: {}", addr.to_string(), errors);
  chosen->probes = std::move(probes);
  chosen->dialed = addr;  // a re-dial tries every path again, in the same order
  return chosen;
}

Result<std::unique_ptr<WorkerLink>> connect_one_path(const WorkerAddress& addr, const wire::Hello& local,
                                                     const LinkOptions& opts) {
  const std::string where = "worker " + addr.to_string();
  const net::Deadline deadline = net::deadline_in(opts.connect_timeout);
  if (addr.path == WorkerPath::kJoined) {
    if (!opts.registry)
      return make_error(StatusCode::kInvalidArgument, "{}: joined workers need --accept-workers on this side", where);
    return opts.registry->take(addr.name, deadline);
  }
  auto conn =
      opts.dialer ? opts.dialer(addr, deadline) : tcp_dialer(opts.tcp, opts.tls_pins, opts.swarm_key)(addr, deadline);
  if (!conn) return conn.status().with_context(where + ": connect");
  return establish_link(std::move(*conn), addr, local, opts, deadline);
}

Result<std::unique_ptr<WorkerLink>> establish_link(std::unique_ptr<net::Connection> conn, WorkerAddress addr,
                                                   const wire::Hello& local, const LinkOptions& opts,
                                                   net::Deadline deadline) {
  const std::string from = conn->describe();
  std::string where = "worker " + (addr.path == WorkerPath::kJoined ? "joining from " + from : addr.to_string());
  auto link = std::make_unique<WorkerLink>();
  link->conn = std::move(conn);
  auto session = net::handshake(*link->conn, local, /*initiator=*/true, deadline, opts.swarm_key.get());
  if (!session) {
    link->conn->close();
    link->conn.reset();
    return session.status().with_context(where + ": handshake");
  }
  link->session = std::move(*session);
  const wire::Hello& peer = link->session.peer;
  if (addr.path == WorkerPath::kJoined) addr.name = peer.name;
  link->address = addr;
  link->dialed = addr;
  link->label = addr.to_string();
  if (addr.path == WorkerPath::kJoined) {
    link->label += " (" + from + ")";
  } else if (!peer.name.empty()) {
    link->label += " (" + peer.name + ")";
  }
  if (peer.role != wire::PeerRole::kWorker) {
    return make_error(StatusCode::kInvalidArgument, "{} is not a worker (role {})", link->label,
                      static_cast<int>(peer.role));
  }
  for (int dt = 0; dt < 32; ++dt) {
    if ((opts.need_dtypes >> dt & 1u) != 0 && (link->session.dtypes >> dt & 1u) == 0) {
      return make_error(StatusCode::kUnsupported, "{} does not speak wire dtype {}", link->label,
                        wire::wire_dtype_name(static_cast<wire::WireDType>(dt)));
    }
  }
  for (int m = 0; m < 32; ++m) {
    if ((opts.need_modes >> m & 1u) != 0 && (link->session.modes >> m & 1u) == 0) {
      return make_error(StatusCode::kUnsupported, "{} does not support combine mode {}", link->label,
                        wire::combine_mode_name(static_cast<wire::CombineMode>(m)));
    }
  }
  link->limits.max_frame_bytes = local.max_frame_bytes;
  link->limits.n_layer = local.n_layer;
  link->limits.n_expert = local.n_expert;
  link->limits.max_n_embd = std::max<uint32_t>(local.n_embd, 1);
  link->mux = std::make_unique<net::RequestMux>(link->conn.get());
  // Warm-up: opens the congestion window before the first real layer (docs/PROTOCOL.md) and
  // proves the worker answers requests, not just HELLO.
  auto rtt = net::ping(*link->mux, opts.warmup_pad_bytes, opts.warmup_pad_bytes, deadline);
  if (!rtt) return rtt.status().with_context(link->label + ": warm-up ping");
  link->warmup_rtt = *rtt;
  if ((link->session.features & wire::kFeatureInfo) != 0) {
    // Its capacity, for the registry (`moesh swarm status`): threads, memory, replica room.
    const uint64_t id = link->mux->next_request_id();
    MOESH_ASSIGN_OR_RETURN(auto ask, wire::encode_info_request(id));
    MOESH_RETURN_IF_ERROR(link->mux->start(id, ask, deadline).with_context(link->label + ": INFO"));
    auto reply = link->mux->wait(id, deadline);
    if (!reply) return reply.status().with_context(link->label + ": INFO");
    auto info = wire::decode_info(*reply);
    if (!info) return info.status().with_context(link->label + ": INFO_REPLY");
    link->capacity = *info;
  }
  return link;
}

namespace {
constexpr int64_t kProbeTimeoutMs = 1000;
}  // namespace

void probe_peer_rtts(const std::vector<WorkerLink*>& ask, const std::vector<const WorkerLink*>& peers,
                     net::Deadline deadline) {
  struct Asked {
    WorkerLink* link;
    uint64_t id;
    std::vector<size_t> targets;  // indices into peers
  };
  std::vector<Asked> asked;
  for (WorkerLink* l : ask) {
    if ((l->session.features & wire::kFeatureProbe) == 0) continue;
    wire::ProbeMsg m;
    Asked a{l, 0, {}};
    for (size_t j = 0; j < peers.size(); ++j) {
      const WorkerAddress& to = peers[j]->address;
      if (peers[j] == l || to.path != WorkerPath::kDirect || to.websocket) continue;
      a.targets.push_back(j);
      m.targets.push_back(to.to_string());
    }
    if (m.targets.empty() || m.targets.size() > wire::kMaxProbeTargets) continue;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - net::Clock::now()).count();
    if (left < 1) break;
    // At most a second: a peer further than that is no use in a chain, and a firewall that drops
    // the SYNs must not hold up the backbone's start for long.
    m.timeout_ms = static_cast<uint32_t>(std::min<int64_t>(left / 2 + 1, kProbeTimeoutMs));
    m.request_id = l->mux->next_request_id();
    auto frame = wire::encode_probe(m);
    if (!frame || !l->mux->start(m.request_id, *frame, deadline).is_ok()) continue;
    a.id = m.request_id;
    asked.push_back(std::move(a));
  }
  for (Asked& a : asked) {
    auto reply = a.link->mux->wait(a.id, deadline);
    Result<wire::ProbeReplyMsg> r =
        reply ? wire::decode_probe_reply(*reply) : Result<wire::ProbeReplyMsg>(reply.status());
    if (r.is_ok() && r->rtt_us.size() != a.targets.size())
      r = make_error(StatusCode::kCorrupt, "{} figures for {} addresses", r->rtt_us.size(), a.targets.size());
    if (!r.is_ok()) {
      spdlog::info("{}: no peer round trips ({})", a.link->label, r.status().to_string());
      continue;
    }
    a.link->peer_rtt_ms.clear();
    for (size_t k = 0; k < a.targets.size(); ++k) {
      if (r->rtt_us[k] == wire::kProbeFailed) continue;
      a.link->peer_rtt_ms.emplace_back(peers[a.targets[k]]->label, r->rtt_us[k] / 1000.0);
    }
  }
}

}  // namespace moesh
