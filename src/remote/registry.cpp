// The backbone's registry of joined workers (registry.h): an accept thread, one short-lived
// thread per handshake (a slow or hostile joiner holds up nobody else), and the links held by
// name until the executor takes them.
#include "moesh/remote/registry.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <list>
#include <mutex>
#include <thread>

#include "moesh/net/tls.h"
#include "moesh/net/websocket.h"
#include "moesh/remote/address.h"

namespace moesh {

namespace {
constexpr auto kAcceptSlice = std::chrono::milliseconds(100);  // how often the accept loop looks at the stop flag
}

struct WorkerRegistry::Impl {
  wire::Hello hello;
  LinkOptions link;
  RegistryOptions opts;
  std::unique_ptr<net::TcpListener> listener;
  std::thread acceptor;
  std::atomic<bool> stopping{false};

  mutable std::mutex mu;
  mutable std::condition_variable cv;
  std::vector<JoinRecord> records;
  struct Held {
    std::string name;
    std::unique_ptr<WorkerLink> link;
  };
  std::vector<Held> held;  // in join order
  uint64_t refused = 0;
  std::string last_refusal;

  struct Handshake {
    std::thread thread;
    std::atomic<bool> done{false};
  };
  std::list<Handshake> handshakes;  // touched by the accept thread only (and close() after it ends)

  void accept_loop();
  void handshake(std::unique_ptr<net::ByteStream> stream);
  void refuse(const std::string& why) {
    spdlog::warn("registry: join refused: {}", why);
    std::lock_guard<std::mutex> lk(mu);
    ++refused;
    last_refusal = why;
  }
  void reap(bool all) {
    for (auto it = handshakes.begin(); it != handshakes.end();) {
      if (all || it->done.load()) {
        it->thread.join();
        it = handshakes.erase(it);
      } else {
        ++it;
      }
    }
  }
};

void WorkerRegistry::Impl::accept_loop() {
  while (!stopping.load()) {
    auto s = listener->accept(net::deadline_in(kAcceptSlice));
    reap(false);
    if (!s) {
      if (s.status().code() != StatusCode::kTimeout && !stopping.load()) {
        spdlog::error("registry: accept failed: {}", s.status().to_string());
        std::this_thread::sleep_for(kAcceptSlice);
      }
      continue;
    }
    if (static_cast<int>(handshakes.size()) >= opts.max_handshakes) {
      refuse(fmt::format("{} joins are already being handshaken", handshakes.size()));
      continue;  // the stream is closed as it goes out of scope
    }
    Handshake& h = handshakes.emplace_back();
    h.thread = std::thread([this, &h, st = std::move(*s)]() mutable {
      handshake(std::move(st));
      h.done.store(true);
    });
  }
}

void WorkerRegistry::Impl::handshake(std::unique_ptr<net::ByteStream> tcp) {
  std::string from = tcp->describe();
  if (from.rfind("tcp ", 0) == 0) from = from.substr(4);
  const net::Deadline deadline = net::deadline_in(link.connect_timeout);
  // A worker may join over WebSocket (`--join ws://...`): told apart by its first bytes.
  auto upgraded = net::accept_tcp_or_websocket(std::move(tcp), deadline);
  if (!upgraded) return refuse(fmt::format("{}: {}", from, upgraded.status().to_string()));
  std::unique_ptr<net::ByteStream> stream = std::move(*upgraded);
  auto reject = [&](const std::string& why) {
    auto e = wire::encode_error({.request_id = 0, .code = uint16_t(wire::WireError::kProtocol), .text = why});
    if (e) (void)stream->write_all(*e, net::deadline_in(std::chrono::milliseconds(1000)));
    refuse(fmt::format("{}: {}", from, why));
  };
  // A joining worker says JOIN with its name first (read exactly: TLS may follow on this stream);
  // the answer tells it a backbone is here.
  net::FrameReader reader;
  auto first = reader.read(*stream, deadline);
  if (!first) return refuse(fmt::format("{}: no JOIN: {}", from, first.status().to_string()));
  auto join =
      first->type() == wire::MsgType::kRoute
          ? wire::decode_route(*first)
          : Result<wire::RouteMsg>(make_error(StatusCode::kInvalidArgument, "the first frame is {}, not ROUTE JOIN",
                                              wire::msg_type_name(first->type())));
  if (!join) return reject(join.status().message());
  if (join->op != wire::RouteMsg::kJoin)
    return reject(fmt::format("ROUTE {} instead of JOIN", wire::route_op_name(join->op)));
  if (auto named = parse_worker_address("join://" + join->name); !named) return reject(named.status().message());
  auto ack = wire::encode_route({.op = wire::RouteMsg::kJoinedBackbone, .name = ""});
  if (!ack || !stream->write_all(*ack, deadline).is_ok()) return refuse(fmt::format("{}: gone after JOIN", from));
  if (link.tls_pins) {
    auto tls = net::tls_client(std::move(stream), *link.tls_pins, deadline);
    if (!tls) return refuse(fmt::format("{} ('{}'): {}", from, join->name, tls.status().to_string()));
    stream = std::move(*tls);
  }
  auto conn = net::make_stream_connection(std::move(stream));
  WorkerAddress addr;
  addr.path = WorkerPath::kJoined;
  auto l = establish_link(std::move(conn), addr, hello, link, deadline);
  if (!l) return refuse(l.status().to_string());
  std::unique_ptr<WorkerLink> lk = std::move(*l);
  const std::string name = lk->address.name;
  if (name != join->name)
    return refuse(fmt::format("{}: joined as '{}' but its HELLO says '{}'", from, join->name, name));
  std::string experts;
  for (const wire::ExpertRange& r : lk->session.peer.experts) {
    if (!experts.empty()) experts += ",";
    experts += r.count == 1 ? fmt::format("{}:{}", r.layer, r.first)
                            : fmt::format("{}:{}-{}", r.layer, r.first, r.first + r.count - 1);
  }
  spdlog::info("registry: worker '{}' joined from {} ({} expert ranges, warm-up rtt {:.3f} ms)", name, from,
               lk->session.peer.experts.size(), std::chrono::duration<double, std::milli>(lk->warmup_rtt).count());
  std::unique_ptr<WorkerLink> replaced;
  {
    std::lock_guard<std::mutex> g(mu);
    auto rec = std::find_if(records.begin(), records.end(), [&](const JoinRecord& r) { return r.name == name; });
    if (rec == records.end()) {
      records.emplace_back().name = name;
      rec = records.end() - 1;
    }
    rec->address = from.rfind("tcp ", 0) == 0 ? from.substr(4) : from;
    rec->experts = experts;
    ++rec->joins;
    rec->held = true;
    rec->warmup_rtt_ms = std::chrono::duration<double, std::milli>(lk->warmup_rtt).count();
    rec->last_join = std::chrono::steady_clock::now();
    auto h = std::find_if(held.begin(), held.end(), [&](const Held& x) { return x.name == name; });
    if (h != held.end()) {
      replaced = std::move(h->link);  // an older connection of the same worker: it went away
      held.erase(h);
    }
    held.push_back(Held{name, std::move(lk)});
  }
  cv.notify_all();
  // `replaced` is shut down here, outside the lock.
}

WorkerRegistry::WorkerRegistry(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WorkerRegistry::~WorkerRegistry() {
  close();
}

Result<std::shared_ptr<WorkerRegistry>> WorkerRegistry::listen(const wire::Hello& hello, const LinkOptions& link,
                                                               const RegistryOptions& opts) {
  auto impl = std::make_unique<Impl>();
  impl->hello = hello;
  impl->link = link;
  impl->link.registry.reset();  // a joined link is never itself a join:// address
  impl->opts = opts;
  auto l = net::TcpListener::listen(opts.host, opts.port, link.tcp);
  if (!l) return l.status().with_context(fmt::format("--accept-workers {}:{}", opts.host, opts.port));
  impl->listener = std::move(*l);
  Impl* m = impl.get();
  std::shared_ptr<WorkerRegistry> r(new WorkerRegistry(std::move(impl)));
  m->acceptor = std::thread([m] { m->accept_loop(); });
  return r;
}

uint16_t WorkerRegistry::port() const {
  return impl_->listener->port();
}

void WorkerRegistry::close() {
  if (impl_->stopping.exchange(true)) return;
  if (impl_->acceptor.joinable()) impl_->acceptor.join();
  impl_->listener->close();
  impl_->reap(/*all=*/true);
  std::vector<Impl::Held> gone;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    gone.swap(impl_->held);
    for (JoinRecord& r : impl_->records) r.held = false;
  }
  impl_->cv.notify_all();
}

std::unique_ptr<WorkerLink> WorkerRegistry::take_if_ready(const std::string& name) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  auto h = std::find_if(impl_->held.begin(), impl_->held.end(), [&](const Impl::Held& x) { return x.name == name; });
  if (h == impl_->held.end()) return nullptr;
  std::unique_ptr<WorkerLink> out = std::move(h->link);
  impl_->held.erase(h);
  for (JoinRecord& r : impl_->records)
    if (r.name == name) r.held = false;
  return out;
}

Result<std::unique_ptr<WorkerLink>> WorkerRegistry::take(const std::string& name, net::Deadline deadline) {
  for (;;) {
    if (auto l = take_if_ready(name)) return l;
    std::unique_lock<std::mutex> lk(impl_->mu);
    const bool ready = impl_->cv.wait_until(lk, deadline, [&] {
      return impl_->stopping.load() ||
             std::any_of(impl_->held.begin(), impl_->held.end(), [&](const Impl::Held& x) { return x.name == name; });
    });
    if (impl_->stopping.load())
      return make_error(StatusCode::kUnavailable, "worker join://{}: the registry is closed", name);
    if (!ready) return make_error(StatusCode::kTimeout, "worker join://{} has not joined (yet)", name);
  }
}

std::vector<std::string> WorkerRegistry::held() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::vector<std::string> out;
  for (const Impl::Held& h : impl_->held) out.push_back(h.name);
  return out;
}

std::vector<std::string> WorkerRegistry::wait_for(size_t n, net::Deadline deadline) const {
  std::unique_lock<std::mutex> lk(impl_->mu);
  impl_->cv.wait_until(lk, deadline, [&] { return impl_->stopping.load() || impl_->held.size() >= n; });
  std::vector<std::string> out;
  for (const Impl::Held& h : impl_->held) out.push_back(h.name);
  return out;
}

std::vector<JoinRecord> WorkerRegistry::records() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->records;
}

uint64_t WorkerRegistry::refused() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->refused;
}

std::string WorkerRegistry::last_refusal() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->last_refusal;
}

}  // namespace moesh
