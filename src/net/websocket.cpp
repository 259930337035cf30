// WebSocket transport (net/websocket.h) on Boost.Beast. Each stream runs its own io_context on
// one thread: a read loop fills an inbox that read_some() drains, and writes are queued and
// written one message at a time, so a reader blocked in read_some() and writers on other threads
// never touch the Beast stream concurrently (it is not thread-safe). Deadlines are the callers':
// read_some() and write_all() wait on a condition variable until theirs.
#include "moesh/net/websocket.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <sys/socket.h>
#include <unistd.h>

// GCC 12 + Boost 1.74: asio's headers use std::exchange without including <utility>.
#include <utility>
// clang-format off
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
// clang-format on
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

namespace moesh::net {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;

constexpr size_t kInboxPause = 8u << 20;  // stop reading ahead past this many unread bytes

std::string peer_of(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[64] = {};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
    return fmt::format("[{}]:{}", host, port);
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
  ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
  port = ntohs(a->sin_port);
  return fmt::format("{}:{}", host, port);
}

class WsStream final : public ByteStream {
 public:
  WsStream() : guard_(asio::make_work_guard(ioc_)), ws_(ioc_) {}

  ~WsStream() override {
    close();
    guard_.reset();
    if (thread_.joinable()) thread_.join();
  }

  // Takes the socket and applies the tuning; false (with *err) when the fd cannot be adopted.
  bool adopt(int fd, const WsOptions& o, Status* err) {
    peer_ = peer_of(fd);
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    (void)::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    beast::error_code ec;
    ws_.next_layer().assign(ss.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), fd, ec);
    if (ec) {
      ::close(fd);
      *err = make_error(StatusCode::kIoError, "ws {}: {}", peer_, ec.message());
      return false;
    }
    ws_.binary(true);
    ws_.auto_fragment(false);
    ws_.write_buffer_bytes(256 * 1024);
    ws_.secure_prng(false);
    ws_.read_message_max(o.max_message_bytes);
    return true;
  }

  // Runs the io_context on this thread until `done` or the deadline (the upgrade, before the
  // stream has its own thread).
  Status run_until(const bool& done, Deadline deadline, const char* what) {
    while (!done && Clock::now() < deadline) {
      ioc_.run_one_until(deadline);
    }
    if (!done) {
      beast::error_code ec;
      ws_.next_layer().close(ec);
      ioc_.run();  // let the cancelled operation finish before anything is destroyed
      return make_error(StatusCode::kTimeout, "ws {}: {} did not complete before the deadline", peer_, what);
    }
    return Status::ok();
  }

  // Runs one upgrade operation (`start(handler)`: async_handshake or async_accept) to completion
  // on this thread before the deadline; *ec is its outcome.
  template <typename Start>
  Status upgrade(Start start, Deadline deadline, beast::error_code* ec) {
    bool done = false;
    start([&done, ec](beast::error_code e) {
      *ec = e;
      done = true;
    });
    return run_until(done, deadline, "the WebSocket upgrade");
  }

  websocket::stream<tcp::socket>& ws() { return ws_; }
  const std::string& peer() const { return peer_; }

  // After the upgrade: the stream's own thread and the read loop.
  void start() {
    ioc_.restart();
    asio::post(ioc_, [this] { read_more(); });
    thread_ = std::thread([this] { ioc_.run(); });
  }

  Status write_all(std::span<const uint8_t> bytes, Deadline deadline) override {
    auto w = std::make_shared<Write>();
    w->bytes.assign(bytes.begin(), bytes.end());
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (closed_) return closed_status();
    }
    asio::post(ioc_, [this, w] {
      writes_.push_back(w);
      if (writes_.size() == 1) write_next();
    });
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_until(lk, deadline, [&] { return w->done || closed_; })) {
      lk.unlock();
      close();  // part of it may be on the wire: the stream is no longer aligned
      return make_error(StatusCode::kTimeout, "ws {}: write did not complete before the deadline", peer_);
    }
    if (w->done) return w->status;
    return closed_status();
  }

  Result<size_t> read_some(std::span<uint8_t> buf, Deadline deadline) override {
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_until(lk, deadline, [&] { return inbox_.size() > inbox_at_ || closed_; }))
      return make_error(StatusCode::kTimeout, "ws {}: nothing to read before the deadline", peer_);
    const size_t avail = inbox_.size() - inbox_at_;
    if (avail == 0) return closed_status();
    const size_t n = std::min(avail, buf.size());
    std::memcpy(buf.data(), inbox_.data() + inbox_at_, n);
    inbox_at_ += n;
    if (inbox_at_ == inbox_.size()) {
      inbox_.clear();
      inbox_at_ = 0;
    }
    if (paused_ && inbox_.size() - inbox_at_ < kInboxPause / 2) {
      paused_ = false;
      asio::post(ioc_, [this] { read_more(); });
    }
    return n;
  }

  void close() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (closed_) return;
      closed_ = true;
      if (error_.is_ok()) error_ = make_error(StatusCode::kUnavailable, "ws {}: closed", peer_);
    }
    cv_.notify_all();
    // On the stream's thread: shutting the socket down fails the pending read and write.
    asio::post(ioc_, [this] {
      beast::error_code ec;
      ws_.next_layer().shutdown(tcp::socket::shutdown_both, ec);
      ws_.next_layer().close(ec);
    });
  }

  std::string describe() const override { return "ws " + peer_; }

 private:
  struct Write {
    std::vector<uint8_t> bytes;
    bool done = false;
    Status status;
  };

  Status closed_status() const { return error_.is_ok() ? make_error(StatusCode::kUnavailable, "ws closed") : error_; }

  void fail(const beast::error_code& ec, const char* what) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!closed_) {
        closed_ = true;
        error_ = ec == websocket::error::closed || ec == asio::error::eof
                     ? make_error(StatusCode::kUnavailable, "ws {}: peer closed the connection", peer_)
                     : make_error(StatusCode::kUnavailable, "ws {}: {}: {}", peer_, what, ec.message());
      }
    }
    cv_.notify_all();
  }

  // io thread only.
  void read_more() {
    ws_.async_read(rbuf_, [this](beast::error_code ec, size_t) {
      if (ec) return fail(ec, "read");
      if (!ws_.got_binary()) return fail(websocket::error::bad_opcode, "text message on a binary stream");
      bool more = true;
      {
        std::lock_guard<std::mutex> lk(mu_);
        // A flat_buffer holds the message contiguously.
        const asio::const_buffer data = rbuf_.data();
        const auto* p = static_cast<const uint8_t*>(data.data());
        inbox_.insert(inbox_.end(), p, p + data.size());
        if (inbox_.size() - inbox_at_ >= kInboxPause) {
          paused_ = true;
          more = false;
        }
      }
      rbuf_.consume(rbuf_.size());
      cv_.notify_all();
      if (more) read_more();
    });
  }

  // io thread only; writes_.front() is the message on the wire.
  void write_next() {
    ws_.async_write(asio::buffer(writes_.front()->bytes), [this](beast::error_code ec, size_t) {
      std::shared_ptr<Write> w = writes_.front();
      writes_.pop_front();
      {
        std::lock_guard<std::mutex> lk(mu_);
        w->done = true;
        if (ec) w->status = make_error(StatusCode::kUnavailable, "ws {}: write: {}", peer_, ec.message());
      }
      cv_.notify_all();
      if (ec) {
        fail(ec, "write");
        for (auto& rest : writes_) rest->done = true, rest->status = w->status;
        writes_.clear();
        cv_.notify_all();
        return;
      }
      if (!writes_.empty()) write_next();
    });
  }

  asio::io_context ioc_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_;
  websocket::stream<tcp::socket> ws_;
  std::thread thread_;
  std::string peer_;
  beast::flat_buffer rbuf_;
  std::deque<std::shared_ptr<Write>> writes_;  // io thread only

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint8_t> inbox_;  // received, not yet read from inbox_at_
  size_t inbox_at_ = 0;
  bool paused_ = false;
  bool closed_ = false;
  Status error_;
};

class PrefixStream final : public ByteStream {
 public:
  PrefixStream(std::unique_ptr<ByteStream> inner, std::vector<uint8_t> prefix)
      : inner_(std::move(inner)), prefix_(std::move(prefix)) {}
  Status write_all(std::span<const uint8_t> bytes, Deadline deadline) override {
    return inner_->write_all(bytes, deadline);
  }
  Result<size_t> read_some(std::span<uint8_t> buf, Deadline deadline) override {
    if (at_ < prefix_.size()) {
      const size_t n = std::min(buf.size(), prefix_.size() - at_);
      std::memcpy(buf.data(), prefix_.data() + at_, n);
      at_ += n;
      return n;
    }
    return inner_->read_some(buf, deadline);
  }
  void close() override { inner_->close(); }
  std::string describe() const override { return inner_->describe(); }

 private:
  std::unique_ptr<ByteStream> inner_;
  std::vector<uint8_t> prefix_;
  size_t at_ = 0;
};

// The socket of a connected TCP stream, adopted by a new WebSocket stream (upgrade still to do).
Result<std::unique_ptr<WsStream>> open_ws(std::unique_ptr<ByteStream> tcp_stream, const WsOptions& o) {
  MOESH_ASSIGN_OR_RETURN(int fd, tcp_release_fd(std::move(tcp_stream)));
  auto ws = std::make_unique<WsStream>();
  Status err;
  if (!ws->adopt(fd, o, &err)) return err;
  return ws;
}

}  // namespace

Result<std::unique_ptr<ByteStream>> ws_connect(const std::string& host, uint16_t port, const TcpOptions& tcp_opts,
                                               Deadline deadline, const WsOptions& o) {
  MOESH_ASSIGN_OR_RETURN(std::unique_ptr<ByteStream> s, tcp_connect(host, port, tcp_opts, deadline));
  MOESH_ASSIGN_OR_RETURN(std::unique_ptr<WsStream> ws, open_ws(std::move(s), o));
  ws->ws().set_option(websocket::stream_base::decorator(
      [](websocket::request_type& req) { req.set(beast::http::field::user_agent, "moesh"); }));
  beast::error_code hec;
  const std::string authority =
      host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  MOESH_RETURN_IF_ERROR(ws->upgrade(
      [&](auto handler) { ws->ws().async_handshake(authority, o.path, std::move(handler)); }, deadline, &hec));
  if (hec)
    return make_error(StatusCode::kUnavailable, "ws {}{}: the WebSocket upgrade failed: {}", authority, o.path,
                      hec.message());
  ws->start();
  return std::unique_ptr<ByteStream>(std::move(ws));
}

Result<std::unique_ptr<ByteStream>> ws_accept(std::unique_ptr<ByteStream> tcp_stream, std::span<const uint8_t> first,
                                              Deadline deadline, const WsOptions& o) {
  MOESH_ASSIGN_OR_RETURN(std::unique_ptr<WsStream> ws, open_ws(std::move(tcp_stream), o));
  ws->ws().set_option(websocket::stream_base::decorator(
      [](websocket::response_type& res) { res.set(beast::http::field::server, "moesh"); }));
  beast::error_code aec;
  MOESH_RETURN_IF_ERROR(ws->upgrade(
      [&](auto handler) { ws->ws().async_accept(asio::buffer(first.data(), first.size()), std::move(handler)); },
      deadline, &aec));
  if (aec) return make_error(StatusCode::kUnavailable, "ws {}: not a WebSocket upgrade: {}", ws->peer(), aec.message());
  ws->start();
  return std::unique_ptr<ByteStream>(std::move(ws));
}

Result<std::unique_ptr<ByteStream>> accept_tcp_or_websocket(std::unique_ptr<ByteStream> s, Deadline deadline,
                                                            const WsOptions& o) {
  static constexpr uint8_t kGet[4] = {'G', 'E', 'T', ' '};
  std::vector<uint8_t> first(4096);
  size_t have = 0;
  while (have < 4) {
    auto n = s->read_some(std::span<uint8_t>(first.data() + have, first.size() - have), deadline);
    if (!n) {
      if (n.status().code() == StatusCode::kTimeout) break;  // the caller's own reads will say so
      if (have == 0 && n.status().code() == StatusCode::kUnavailable)
        return make_error(StatusCode::kUnavailable, "{}", kClosedBeforeAByte);
      return n.status();
    }
    have += *n;
  }
  first.resize(have);
  if (have >= 4 && std::memcmp(first.data(), kGet, 4) == 0) return ws_accept(std::move(s), first, deadline, o);
  return with_prefix(std::move(s), std::move(first));
}

std::unique_ptr<ByteStream> with_prefix(std::unique_ptr<ByteStream> inner, std::vector<uint8_t> prefix) {
  if (prefix.empty()) return inner;
  return std::make_unique<PrefixStream>(std::move(inner), std::move(prefix));
}

bool is_websocket(const ByteStream& s) {
  return dynamic_cast<const WsStream*>(&s) != nullptr;
}

}  // namespace moesh::net
