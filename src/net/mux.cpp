// RequestMux (many requests in flight per connection), the HELLO handshake, and PING.
#include "moesh/net/auth.h"
#include "moesh/net/transport.h"

namespace moesh::net {

namespace {
// A hint to the core that this is a spin-wait (frees its shared resources for a sibling thread).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace

void CompletionQueue::push(uint64_t tag, uint64_t request_id, Clock::time_point at) {
  {
    const Clock::time_point now = Clock::now();
    std::lock_guard<std::mutex> lk(mu_);
    q_.push_back(Entry{tag, request_id, at == Clock::time_point{} || at > now ? now : at});
    filed_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_one();
}

bool CompletionQueue::pop(Entry* out, Deadline deadline) {
  if (poll_us_ > 0) {
    // Spin on the counter (no lock, no syscall) for a push that comes soon.
    const size_t seen = filed_.load(std::memory_order_acquire);
    const Clock::time_point until = std::min(deadline, Clock::now() + std::chrono::microseconds(poll_us_));
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (take_locked(out)) return true;
    }
    while (filed_.load(std::memory_order_acquire) == seen && Clock::now() < until) cpu_relax();
  }
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_until(lk, deadline, [this] { return head_ < q_.size(); })) return false;
  return take_locked(out);
}

bool CompletionQueue::take_locked(Entry* out) {
  if (head_ >= q_.size()) return false;
  *out = q_[head_++];
  if (head_ == q_.size()) {  // drained: reuse the storage
    q_.clear();
    head_ = 0;
  }
  return true;
}

Status RequestMux::start(uint64_t request_id, std::span<const uint8_t> frame, Deadline send_deadline,
                         CompletionQueue* done, uint64_t tag) {
  if (request_id == 0) return make_error(StatusCode::kInvalidArgument, "request id 0 is reserved");
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!conn_error_.is_ok()) return conn_error_;
    // Registered before sending, so a reply that beats send() back is not discarded.
    Slot slot;
    slot.queue = done;
    slot.tag = tag;
    if (!slots_.emplace(request_id, std::move(slot)).second)
      return make_error(StatusCode::kInvalidArgument, "request id {} already in flight", request_id);
  }
  Status st = conn_->send_frame(frame, send_deadline);
  if (!st.is_ok()) {
    std::lock_guard<std::mutex> lk(mu_);
    slots_.erase(request_id);
    if (st.code() != StatusCode::kTimeout && conn_error_.is_ok()) fail_locked(st);
    cv_.notify_all();
  }
  return st;
}

void RequestMux::fail_locked(Status st) {
  conn_error_ = std::move(st);
  for (auto& [id, slot] : slots_) {
    if (!slot.done && slot.queue != nullptr) slot.queue->push(slot.tag, id);
  }
}

Status RequestMux::pump(Deadline deadline) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!conn_error_.is_ok()) return conn_error_;
  if (reader_active_) {
    cv_.wait_until(lk, deadline);
    return conn_error_;
  }
  read_one(lk, deadline);
  return conn_error_;
}

void RequestMux::read_one(std::unique_lock<std::mutex>& lk, Deadline deadline) {
  reader_active_ = true;
  lk.unlock();
  Result<wire::Frame> f = conn_->recv_frame(deadline);
  Clock::time_point arrived{};
  if (f.is_ok()) {
    arrived = conn_->last_frame_arrival();
    last_received_ns_.store(Clock::now().time_since_epoch().count());
    if (f->type() == wire::MsgType::kPing) {
      // The peer's heartbeat (a joined worker checks its dial-out connection is alive): answered
      // here, outside the lock, never routed as a reply.
      answer_ping(*f);
      lk.lock();
      reader_active_ = false;
      cv_.notify_all();
      return;
    }
  }
  lk.lock();
  reader_active_ = false;
  if (f.is_ok()) {
    route_locked(std::move(f).value(), arrived);
  } else if (f.status().code() != StatusCode::kTimeout && conn_error_.is_ok()) {
    fail_locked(f.status());
  }
  cv_.notify_all();
}

void RequestMux::answer_ping(const wire::Frame& frame) {
  auto p = wire::decode_ping(frame);
  if (!p) return;
  auto pong = wire::encode_pong({.request_id = p->request_id,
                                 .ping_time_ns = p->send_time_ns,
                                 .reply_time_ns = static_cast<uint64_t>(Clock::now().time_since_epoch().count()),
                                 .pad_bytes = std::min<uint32_t>(p->reply_pad_bytes, 1u << 20)});
  if (pong) (void)conn_->send_frame(*pong, deadline_in(std::chrono::milliseconds(1000)));
  pings_answered_.fetch_add(1);
}

void RequestMux::route_locked(wire::Frame frame, Clock::time_point arrived) {
  const uint64_t id = frame.request_id();
  if (id == 0) {
    // Connection-level news: everything pending on this connection is lost.
    if (frame.type() == wire::MsgType::kError) {
      auto e = wire::decode_error(frame);
      fail_locked(e.is_ok() ? e->to_status() : e.status());
    } else if (frame.type() == wire::MsgType::kGoodbye) {
      auto g = wire::decode_goodbye(frame);
      fail_locked(make_error(StatusCode::kUnavailable, "{} said goodbye: {}", conn_->describe(),
                             g.is_ok() ? g->text : g.status().message()));
    } else {
      n_discarded_.fetch_add(1);
    }
    return;
  }
  auto it = slots_.find(id);
  if (it == slots_.end() || it->second.done) {
    n_discarded_.fetch_add(1);  // late reply to a request that timed out or was cancelled
    return;
  }
  it->second.done = true;
  if (frame.type() == wire::MsgType::kError) {
    auto e = wire::decode_error(frame);
    it->second.reply = e.is_ok() ? e->to_status() : e.status();
  } else {
    it->second.reply = std::move(frame);
  }
  if (it->second.queue != nullptr) it->second.queue->push(it->second.tag, id, arrived);
}

Result<wire::Frame> RequestMux::wait(uint64_t request_id, Deadline deadline) {
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    auto it = slots_.find(request_id);
    if (it == slots_.end()) return make_error(StatusCode::kInvalidArgument, "request {} is not in flight", request_id);
    if (it->second.done) {
      Result<wire::Frame> out = std::move(it->second.reply);
      slots_.erase(it);
      return out;
    }
    if (!conn_error_.is_ok()) {
      slots_.erase(it);
      return conn_error_;
    }
    if (Clock::now() >= deadline) {
      slots_.erase(it);
      return make_error(StatusCode::kTimeout, "request {} on {}: no reply before its deadline", request_id,
                        conn_->describe());
    }
    if (!reader_active_) {
      // Become the reader until a frame arrives or our own deadline passes; other waiters
      // sleep on the condition variable with their own deadlines.
      read_one(lk, deadline);
    } else {
      cv_.wait_until(lk, deadline);
    }
  }
}

void RequestMux::cancel(uint64_t request_id) {
  std::lock_guard<std::mutex> lk(mu_);
  slots_.erase(request_id);
}

size_t RequestMux::n_in_flight() const {
  std::lock_guard<std::mutex> lk(mu_);
  return slots_.size();
}

Result<std::chrono::nanoseconds> ping(RequestMux& mux, uint32_t pad_bytes, uint32_t reply_pad_bytes,
                                      Deadline deadline) {
  wire::PingMsg p;
  p.request_id = mux.next_request_id();
  p.send_time_ns = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  p.pad_bytes = pad_bytes;
  p.reply_pad_bytes = reply_pad_bytes;
  MOESH_ASSIGN_OR_RETURN(auto frame, wire::encode_ping(p));
  MOESH_RETURN_IF_ERROR(mux.start(p.request_id, frame, deadline));
  MOESH_ASSIGN_OR_RETURN(wire::Frame reply, mux.wait(p.request_id, deadline));
  MOESH_ASSIGN_OR_RETURN(wire::PongMsg pong, wire::decode_pong(reply));
  if (pong.ping_time_ns != p.send_time_ns)
    return make_error(StatusCode::kCorrupt, "PONG echoed timestamp {} for PING {}", pong.ping_time_ns, p.send_time_ns);
  if (pong.pad_bytes != reply_pad_bytes)
    return make_error(StatusCode::kCorrupt, "PONG carried {} pad bytes, {} requested", pong.pad_bytes, reply_pad_bytes);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()) -
         std::chrono::nanoseconds(p.send_time_ns);
}

void send_error(Connection& conn, uint64_t request_id, wire::WireError code, const std::string& text,
                Deadline deadline) {
  wire::ErrorMsg e;
  e.request_id = request_id;
  e.code = static_cast<uint16_t>(code);
  e.text = text.size() > wire::kMaxTextBytes ? text.substr(0, wire::kMaxTextBytes) : text;
  auto frame = wire::encode_error(e);
  if (frame.is_ok()) (void)conn.send_frame(*frame, deadline);
}

namespace {

wire::WireError handshake_error_code(StatusCode c) {
  switch (c) {
    case StatusCode::kUnsupported:
      return wire::WireError::kVersionMismatch;
    case StatusCode::kInvalidArgument:
      return wire::WireError::kModelMismatch;
    default:
      return wire::WireError::kMalformed;
  }
}

// Receives the peer's HELLO: an ERROR becomes its status; anything else is a protocol error.
Result<wire::Hello> recv_hello(Connection& conn, Deadline deadline) {
  auto fr = conn.recv_frame(deadline);
  if (!fr.is_ok()) {
    const StatusCode c = fr.status().code();
    if (c == StatusCode::kUnsupported)
      send_error(conn, 0, wire::WireError::kVersionMismatch, fr.status().message(), deadline);
    else if (c == StatusCode::kCorrupt || c == StatusCode::kOutOfRange)
      send_error(conn, 0, wire::WireError::kMalformed, fr.status().message(), deadline);
    return fr.status();
  }
  wire::Frame f = std::move(fr).value();
  if (f.type() == wire::MsgType::kError) {
    auto e = wire::decode_error(f);
    return e.is_ok() ? e->to_status().with_context("handshake rejected") : e.status();
  }
  if (f.type() != wire::MsgType::kHello) {
    Status st = make_error(StatusCode::kCorrupt, "expected HELLO first, got {}", wire::msg_type_name(f.type()));
    send_error(conn, 0, wire::WireError::kProtocol, st.message(), deadline);
    return st;
  }
  auto h = wire::decode_hello(f);
  if (!h.is_ok()) send_error(conn, 0, wire::WireError::kMalformed, h.status().message(), deadline);
  return h;
}

}  // namespace

Result<wire::Session> handshake(Connection& conn, const wire::Hello& local_in, bool initiator, Deadline deadline,
                                const SwarmKey* key) {
  wire::Hello local = local_in;
  if (key != nullptr) local.features |= wire::kFeatureAuth;
  MOESH_ASSIGN_OR_RETURN(auto hello_frame, wire::encode_hello(local));
  if (initiator) MOESH_RETURN_IF_ERROR(conn.send_frame(hello_frame, deadline));
  auto peer = recv_hello(conn, deadline);
  if (!peer.is_ok()) return peer.status().with_context("handshake with " + conn.describe());
  auto session = wire::negotiate(local, *peer);
  // Both sides hold a key, or neither: a keyed side never serves (or uses) an open one.
  const bool they = (peer->features & wire::kFeatureAuth) != 0;
  if (session.is_ok() && key != nullptr && !they) {
    session = make_error(StatusCode::kUnauthenticated,
                         "peer '{}' has no swarm key; this side requires one (start it with --swarm-key)", peer->name);
  } else if (session.is_ok() && key == nullptr && they) {
    session = make_error(StatusCode::kUnauthenticated,
                         "peer '{}' requires a swarm key; this side has none (--swarm-key)", peer->name);
  }
  if (!session.is_ok()) {
    const wire::WireError code = session.status().code() == StatusCode::kUnauthenticated
                                     ? wire::WireError::kUnauthenticated
                                     : handshake_error_code(session.status().code());
    send_error(conn, 0, code, session.status().message(), deadline);
    return session.status().with_context("handshake with " + conn.describe());
  }
  if (!initiator) MOESH_RETURN_IF_ERROR(conn.send_frame(hello_frame, deadline));
  if (key != nullptr) {
    Status st = authenticate(conn, *key, local, *peer, initiator, deadline);
    if (!st.is_ok()) return st.with_context("handshake with " + conn.describe());
  }
  return session;
}

}  // namespace moesh::net
