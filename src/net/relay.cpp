// The relay (net/relay.h): an accept loop, one thread per connection. Each connection is routed
// by its first frame: a worker's JOIN makes it a standby (its thread answers PINGs until claimed,
// then splices), a backbone's CONNECT claims a standby of that name and hands its stream over.
// Frames are read here with exact reads (no read-ahead), so once routed the bytes that follow are
// copied untouched.
#include "moesh/net/relay.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "moesh/net/tls.h"
#include "moesh/net/websocket.h"
#include "moesh/wire/wire.h"

namespace moesh::net {

namespace {

constexpr auto kSlice = std::chrono::milliseconds(100);  // how often waits look at the stop flag
constexpr size_t kCopyBytes = 64 * 1024;

Status send_frame_bytes(ByteStream& s, const Result<std::vector<uint8_t>>& frame) {
  if (!frame) return frame.status();
  return s.write_all(*frame, deadline_in(std::chrono::milliseconds(5000)));
}

void send_error_raw(ByteStream& s, wire::WireError code, const std::string& text) {
  (void)send_frame_bytes(s, wire::encode_error({.request_id = 0, .code = uint16_t(code), .text = text}));
}

}  // namespace

struct Relay::Impl {
  RelayOptions opts;
  std::unique_ptr<TcpListener> listener;
  std::atomic<bool> stop_flag{false};
  RelayStats stats;
  std::atomic<int> open{0};

  struct Standby {
    std::string name;
    std::unique_ptr<ByteStream> worker;
    std::unique_ptr<ByteStream> backbone;  // set by the claimant
    std::unique_ptr<FrameReader> backbone_reader;
    bool claimed = false;
  };
  mutable std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::list<Standby*>> standbys;  // unclaimed, by name
  std::map<std::string, int> spliced;                   // by name

  struct Conn {
    std::thread t;
    std::atomic<bool> done{false};
  };
  std::list<Conn> conns;  // the accept thread's

  bool stopping() const { return stop_flag.load(std::memory_order_relaxed); }
  void route(std::unique_ptr<ByteStream> s);
  void standby(std::string name, std::unique_ptr<ByteStream> worker, FrameReader reader);
  void connect(const std::string& name, std::unique_ptr<ByteStream> backbone, std::unique_ptr<FrameReader> r);
  void splice(Standby& sb, FrameReader& worker_reader);
  void copy(ByteStream& from, ByteStream& to, std::atomic<uint64_t>* counter);
  void reap(bool all) {
    for (auto it = conns.begin(); it != conns.end();) {
      if (all || it->done.load()) {
        it->t.join();
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
  }
};

void Relay::Impl::route(std::unique_ptr<ByteStream> tcp) {
  const std::string who = tcp->describe();
  const Deadline until = deadline_in(opts.route_timeout);
  // TCP or WebSocket (an HTTP upgrade), on the same port.
  auto upgraded = accept_tcp_or_websocket(std::move(tcp), until);
  if (!upgraded) {
    stats.refused.fetch_add(1);
    spdlog::warn("relay: {}: refused: {}", who, upgraded.status().to_string());
    return;
  }
  std::unique_ptr<ByteStream> s = std::move(*upgraded);
  auto reader = std::make_unique<FrameReader>();
  Result<wire::Frame> f = Status(StatusCode::kTimeout, "");
  while (!stopping()) {
    f = reader->read(*s, std::min(until, deadline_in(kSlice)), wire::kDefaultMaxFrameBytes);
    if (f.is_ok() || f.status().code() != StatusCode::kTimeout || Clock::now() >= until) break;
  }
  auto refuse = [&](const std::string& why) {
    stats.refused.fetch_add(1);
    spdlog::warn("relay: {}: refused: {}", who, why);
    send_error_raw(*s, wire::WireError::kProtocol, why);
    s->close();
  };
  if (!f) return refuse("no ROUTE frame: " + f.status().to_string());
  if (f->type() != wire::MsgType::kRoute)
    return refuse(fmt::format("the first frame is {}, not ROUTE (is this a backbone or worker port?)",
                              wire::msg_type_name(f->type())));
  auto r = wire::decode_route(*f);
  if (!r) return refuse(r.status().to_string());
  if (opts.swarm_key && (r->op == wire::RouteMsg::kJoin || r->op == wire::RouteMsg::kConnect)) {
    // Admission: nobody is registered or spliced without the key.
    if (Status st = relay_auth_accept(*s, *reader, *opts.swarm_key, r->name, until); !st.is_ok()) {
      stats.refused.fetch_add(1);
      spdlog::warn("relay: {} ({} '{}'): refused: {}", who, wire::route_op_name(r->op), r->name, st.to_string());
      s->close();
      return;
    }
  }
  if (r->op == wire::RouteMsg::kJoin) {
    if (Status st = send_frame_bytes(*s, wire::encode_route({.op = wire::RouteMsg::kJoinedRelay, .name = ""}));
        !st.is_ok())
      return;
    stats.registrations.fetch_add(1);
    spdlog::info("relay: worker '{}' registered from {}", r->name, who);
    return standby(r->name, std::move(s), std::move(*reader));
  }
  if (r->op == wire::RouteMsg::kConnect) return connect(r->name, std::move(s), std::move(reader));
  refuse(fmt::format("ROUTE {} is not for a relay", wire::route_op_name(r->op)));
}

void Relay::Impl::standby(std::string name, std::unique_ptr<ByteStream> worker, FrameReader reader) {
  Standby sb;
  sb.name = name;
  sb.worker = std::move(worker);
  {
    std::lock_guard<std::mutex> lk(mu);
    standbys[name].push_back(&sb);
  }
  cv.notify_all();
  auto last_heard = Clock::now();
  bool claimed = false;
  while (!stopping()) {
    {
      std::lock_guard<std::mutex> lk(mu);
      claimed = sb.claimed;
    }
    if (claimed) break;
    auto f = reader.read(*sb.worker, deadline_in(kSlice), wire::kDefaultMaxFrameBytes);
    if (!f) {
      if (f.status().code() == StatusCode::kTimeout && Clock::now() - last_heard < opts.standby_idle) continue;
      break;  // gone, damaged, or silent too long
    }
    last_heard = Clock::now();
    if (f->type() == wire::MsgType::kPing) {  // the worker's heartbeat
      auto p = wire::decode_ping(*f);
      if (p) {
        (void)send_frame_bytes(
            *sb.worker,
            wire::encode_pong(
                {.request_id = p->request_id, .ping_time_ns = p->send_time_ns, .reply_time_ns = 0, .pad_bytes = 0}));
      }
      continue;
    }
    spdlog::warn("relay: standby '{}' sent {} before any backbone: dropped", name, wire::msg_type_name(f->type()));
    break;
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    claimed = sb.claimed;
    auto& l = standbys[name];
    l.remove(&sb);
    if (l.empty()) standbys.erase(name);
    if (claimed) ++spliced[name];
  }
  if (claimed) {
    splice(sb, reader);
    std::lock_guard<std::mutex> lk(mu);
    if (--spliced[name] == 0) spliced.erase(name);
  }
  sb.worker->close();
  if (sb.backbone) sb.backbone->close();
}

void Relay::Impl::connect(const std::string& name, std::unique_ptr<ByteStream> backbone,
                          std::unique_ptr<FrameReader> r) {
  const std::string who = backbone->describe();
  std::unique_lock<std::mutex> lk(mu);
  const Deadline until = deadline_in(opts.connect_wait);
  Standby* sb = nullptr;
  while (!stopping()) {
    auto it = standbys.find(name);
    if (it != standbys.end()) {
      for (Standby* s : it->second) {
        if (!s->claimed) {
          sb = s;
          break;
        }
      }
    }
    if (sb != nullptr || Clock::now() >= until) break;
    cv.wait_until(lk, std::min(until, deadline_in(kSlice)));
  }
  if (sb == nullptr) {
    lk.unlock();
    stats.refused.fetch_add(1);
    spdlog::warn("relay: {} asked for worker '{}', which is not registered here", who, name);
    send_error_raw(
        *backbone, wire::WireError::kNotHeld,
        fmt::format("worker '{}' is not registered at this relay (moesh worker --join RELAY --name {})", name, name));
    backbone->close();
    return;
  }
  sb->claimed = true;
  sb->backbone = std::move(backbone);
  sb->backbone_reader = std::move(r);
  stats.splices.fetch_add(1);
  spdlog::info("relay: {} spliced to worker '{}'", who, name);
  // The standby's thread notices within one slice and does the splice.
}

void Relay::Impl::copy(ByteStream& from, ByteStream& to, std::atomic<uint64_t>* counter) {
  std::vector<uint8_t> buf(kCopyBytes);
  while (!stopping()) {
    auto n = from.read_some(buf, deadline_in(kSlice * 5));
    if (!n) {
      if (n.status().code() == StatusCode::kTimeout) continue;
      break;
    }
    if (!to.write_all(std::span<const uint8_t>(buf.data(), *n), deadline_in(std::chrono::milliseconds(30000))).is_ok())
      break;
    counter->fetch_add(*n);
  }
  from.close();
  to.close();
}

void Relay::Impl::splice(Standby& sb, FrameReader& worker_reader) {
  stats.active_splices.fetch_add(1);
  // Both learn the splice is made (the backbone then starts its TLS or HELLO, the worker waits for
  // it); after that backbone bytes flow to the worker untouched.
  auto spliced = wire::encode_route({.op = wire::RouteMsg::kSpliced, .name = ""});
  if (send_frame_bytes(*sb.backbone, spliced).is_ok() && send_frame_bytes(*sb.worker, spliced).is_ok()) {
    std::thread down([&] { copy(*sb.backbone, *sb.worker, &stats.bytes_to_workers); });
    // Worker -> backbone: heartbeats still in flight from the standby are dropped here until the
    // worker's first other frame (its HELLO), or its first bytes that are not a frame (a TLS
    // handshake), which go on byte for byte with everything after.
    bool forwarded = false;
    while (!stopping() && !forwarded) {
      auto f = worker_reader.read(*sb.worker, deadline_in(kSlice * 5), wire::kDefaultMaxFrameBytes);
      if (!f) {
        if (f.status().code() == StatusCode::kTimeout) continue;
        const StatusCode c = f.status().code();
        if (c != StatusCode::kCorrupt && c != StatusCode::kUnsupported && c != StatusCode::kOutOfRange) break;
        const std::span<const uint8_t> bytes = worker_reader.pending();
        if (!sb.backbone->write_all(bytes, deadline_in(std::chrono::milliseconds(30000))).is_ok()) break;
        stats.bytes_to_backbones.fetch_add(bytes.size());
        forwarded = true;
        break;
      }
      if (f->type() == wire::MsgType::kPing) continue;  // the relay's standby answered PINGs; this one is late
      if (!sb.backbone->write_all(worker_reader.last_bytes(), deadline_in(std::chrono::milliseconds(30000))).is_ok())
        break;
      stats.bytes_to_backbones.fetch_add(worker_reader.last_bytes().size());
      forwarded = true;
    }
    if (forwarded) copy(*sb.worker, *sb.backbone, &stats.bytes_to_backbones);
    sb.worker->close();
    sb.backbone->close();
    down.join();
  }
  stats.active_splices.fetch_sub(1);
}

Relay::Relay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Relay::~Relay() {
  stop();
  impl_->listener->close();
  impl_->reap(/*all=*/true);
}

Result<std::unique_ptr<Relay>> Relay::start(const RelayOptions& opts) {
  auto impl = std::make_unique<Impl>();
  impl->opts = opts;
  auto l = TcpListener::listen(opts.host, opts.port, opts.tcp);
  if (!l) return l.status().with_context(fmt::format("relay: listening on {}:{}", opts.host, opts.port));
  impl->listener = std::move(*l);
  return std::unique_ptr<Relay>(new Relay(std::move(impl)));
}

uint16_t Relay::port() const {
  return impl_->listener->port();
}

void Relay::stop() {
  impl_->stop_flag.store(true, std::memory_order_relaxed);
}

const RelayStats& Relay::stats() const {
  return impl_->stats;
}

std::vector<RelayWorker> Relay::workers() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::map<std::string, RelayWorker> by;
  for (const auto& [name, l] : impl_->standbys) {
    by[name].name = name;
    by[name].standbys = static_cast<int>(l.size());
  }
  for (const auto& [name, n] : impl_->spliced) {
    by[name].name = name;
    by[name].spliced = n;
  }
  std::vector<RelayWorker> out;
  for (auto& [n, w] : by) out.push_back(w);
  return out;
}

void Relay::run() {
  Impl& m = *impl_;
  while (!m.stopping()) {
    auto s = m.listener->accept(deadline_in(kSlice));
    m.reap(false);
    if (!s) {
      if (s.status().code() != StatusCode::kTimeout) std::this_thread::sleep_for(kSlice);
      continue;
    }
    if (static_cast<int>(m.conns.size()) >= m.opts.max_connections) {
      m.stats.refused.fetch_add(1);
      send_error_raw(**s, wire::WireError::kOverloaded, "relay: too many connections");
      (*s)->close();
      continue;
    }
    Impl::Conn& c = m.conns.emplace_back();
    c.t = std::thread([&m, &c, st = std::move(*s)]() mutable {
      m.route(std::move(st));
      c.done.store(true);
    });
  }
  m.listener->close();
  m.cv.notify_all();
  m.reap(/*all=*/true);
}

Result<std::unique_ptr<ByteStream>> relay_connect(const std::string& relay_host, uint16_t relay_port,
                                                  const std::string& name, const TcpOptions& tcp, Deadline deadline,
                                                  bool websocket, const SwarmKey* swarm_key) {
  auto s = websocket ? ws_connect(relay_host, relay_port, tcp, deadline)
                     : tcp_connect(relay_host, relay_port, tcp, deadline);
  if (!s) return s.status();
  const std::string where = fmt::format("relay {}:{}", relay_host, relay_port);
  auto f = wire::encode_route({.op = wire::RouteMsg::kConnect, .name = name});
  if (!f) return f.status();
  MOESH_RETURN_IF_ERROR((*s)->write_all(*f, deadline));
  // The relay answers SPLICED once a standby of the worker is ours, after AUTH if it admits only
  // holders of the swarm key, or ERROR. Frames are read exactly: TLS may follow at once.
  FrameReader reader;
  for (;;) {
    auto a = reader.read(**s, deadline);
    if (!a) return a.status().with_context(where);
    if (a->type() == wire::MsgType::kError) {
      auto e = wire::decode_error(*a);
      return e ? e->to_status().with_context(where) : e.status();
    }
    if (a->type() == wire::MsgType::kAuth) {
      if (swarm_key == nullptr)
        return make_error(StatusCode::kUnauthenticated, "{} admits only holders of the swarm key (--swarm-key)", where);
      MOESH_RETURN_IF_ERROR(relay_auth_dial(**s, reader, *a, *swarm_key, name, deadline));
      continue;
    }
    auto r = a->type() == wire::MsgType::kRoute
                 ? wire::decode_route(*a)
                 : Result<wire::RouteMsg>(make_error(StatusCode::kCorrupt, "{} sent {} instead of ROUTE SPLICED", where,
                                                     wire::msg_type_name(a->type())));
    if (!r) return r.status();
    if (r->op != wire::RouteMsg::kSpliced)
      return make_error(StatusCode::kCorrupt, "{} answered CONNECT with ROUTE {}", where, wire::route_op_name(r->op));
    return std::move(*s);
  }
}

}  // namespace moesh::net
