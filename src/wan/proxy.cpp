// The delaying TCP proxy: blocking sockets, two threads per direction (reader, writer) per
// connection, one acceptor. A connection's threads are woken for shutdown by shutdown(2) on its
// sockets and by its condition variables.
#include "moesh/wan/proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <vector>

namespace moesh::wan {

namespace {

Status errno_error(const std::string& what, int err) {
  return make_error(StatusCode::kIoError, "{}: {}", what, std::strerror(err));
}

// Congestion control and buffers before connect()/listen() (docs/background/netstack.md,
// finding 2), TCP_NODELAY too.
void apply_socket_options(int fd, const net::TcpOptions& o) {
  if (!o.congestion.empty() &&
      ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, o.congestion.data(), o.congestion.size()) != 0) {
    static std::once_flag warned;
    const int err = errno;
    std::call_once(warned, [&] {
      spdlog::warn("wan-proxy: TCP_CONGESTION '{}' refused ({}); using the system default", o.congestion,
                   std::strerror(err));
    });
  }
  if (o.send_buffer_bytes > 0) (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &o.send_buffer_bytes, sizeof(int));
  if (o.recv_buffer_bytes > 0) (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &o.recv_buffer_bytes, sizeof(int));
  const int nd = o.no_delay ? 1 : 0;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nd, sizeof(nd));
}

// A blocking socket connected to host:port, or an error after `timeout`.
Result<int> connect_to(const std::string& host, uint16_t port, const net::TcpOptions& o,
                       std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res); rc != 0) {
    return make_error(StatusCode::kUnavailable, "resolving {}: {}", host, gai_strerror(rc));
  }
  Status last = make_error(StatusCode::kUnavailable, "no address for {}", host);
  int out = -1;
  for (addrinfo* ai = res; ai != nullptr && out < 0; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      last = errno_error("socket", errno);
      continue;
    }
    apply_socket_options(fd, o);
    int err = 0;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        const int r = ::poll(&p, 1, static_cast<int>(timeout.count()));
        if (r == 1) {
          socklen_t len = sizeof(err);
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        } else {
          err = r == 0 ? ETIMEDOUT : errno;
        }
      }
    }
    if (err != 0) {
      ::close(fd);
      last = make_error(StatusCode::kUnavailable, "connect to {}:{}: {}", host, port, std::strerror(err));
      continue;
    }
    const int fl = ::fcntl(fd, F_GETFL, 0);
    (void)::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    out = fd;
  }
  ::freeaddrinfo(res);
  if (out < 0) return last;
  return out;
}

bool send_all(int fd, const std::vector<uint8_t>& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return false;
    }
  }
  return true;
}

void update_max(std::atomic<uint64_t>& m, uint64_t v) {
  uint64_t cur = m.load();
  while (v > cur && !m.compare_exchange_weak(cur, v)) {
  }
}

}  // namespace

// One direction of a connection.
struct ProxyPipe {
  explicit ProxyPipe(LinkSpec l) : line(l) {}
  int src = -1, dst = -1;
  DelayLine line;
  std::mutex mu;
  std::condition_variable cv;
  bool eof = false;  // src ended; the writer passes it on once the line is empty
  std::atomic<uint64_t>* bytes = nullptr;
};

struct TcpProxy::Conn {
  Conn(int c, int t, const ProxyOptions& o) : cfd(c), tfd(t), up(o.to_target), down(o.to_client) {
    up.src = cfd;
    up.dst = tfd;
    down.src = tfd;
    down.dst = cfd;
  }
  ~Conn() {
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
    ::close(cfd);
    ::close(tfd);
  }
  // Closes both sides: every thread of this connection returns soon.
  void abort() {
    if (aborted.exchange(true)) return;
    ::shutdown(cfd, SHUT_RDWR);
    ::shutdown(tfd, SHUT_RDWR);
    for (ProxyPipe* p : {&up, &down}) {
      std::lock_guard<std::mutex> lk(p->mu);
      p->cv.notify_all();
    }
  }

  int cfd, tfd;
  ProxyPipe up, down;  // client -> target, target -> client
  std::atomic<bool> aborted{false};
  std::atomic<int> running{0};
  std::thread threads[4];
};

namespace {

struct Running {
  std::atomic<int>* n;
  ~Running() { n->fetch_sub(1); }
};

void read_loop(TcpProxy::Conn& c, ProxyPipe& p, const ProxyOptions& o, ProxyStats& st) {
  std::vector<uint8_t> buf(o.chunk_bytes);
  while (true) {
    {
      std::unique_lock<std::mutex> lk(p.mu);
      p.cv.wait(lk, [&] { return c.aborted.load() || p.line.held_bytes() < o.queue_bytes; });
      if (c.aborted.load()) return;
    }
    const ssize_t n = ::recv(p.src, buf.data(), buf.size(), 0);
    if (n > 0) {
      std::lock_guard<std::mutex> lk(p.mu);
      p.line.push(std::vector<uint8_t>(buf.begin(), buf.begin() + n), Clock::now());
      update_max(st.peak_held_bytes, p.line.held_bytes());
      p.cv.notify_all();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      std::lock_guard<std::mutex> lk(p.mu);
      p.eof = true;
      p.cv.notify_all();
      return;
    }
    c.abort();  // reset or error
    return;
  }
}

void write_loop(TcpProxy::Conn& c, ProxyPipe& p) {
  std::vector<uint8_t> chunk;
  while (true) {
    {
      std::unique_lock<std::mutex> lk(p.mu);
      while (true) {
        if (c.aborted.load()) return;
        const auto next = p.line.next_release();
        if (!next) {
          if (p.eof) {
            lk.unlock();
            ::shutdown(p.dst, SHUT_WR);  // the end of stream, after every byte before it
            return;
          }
          p.cv.wait(lk);
          continue;
        }
        if (p.line.pop_due(Clock::now(), &chunk)) break;
        p.cv.wait_until(lk, *next);
      }
      p.cv.notify_all();  // the reader may be waiting for room
    }
    if (!send_all(p.dst, chunk)) {
      c.abort();
      return;
    }
    p.bytes->fetch_add(chunk.size());
  }
}

}  // namespace

TcpProxy::TcpProxy(ProxyOptions opts, int listen_fd, uint16_t port)
    : opts_(std::move(opts)), listen_fd_(listen_fd), port_(port) {}

TcpProxy::~TcpProxy() {
  stop();
}

Result<std::unique_ptr<TcpProxy>> TcpProxy::start(ProxyOptions opts) {
  if (opts.target_host.empty() || opts.target_port == 0) {
    return make_error(StatusCode::kInvalidArgument, "wan-proxy: no target (HOST:PORT)");
  }
  if (opts.queue_bytes == 0 || opts.chunk_bytes == 0) {
    return make_error(StatusCode::kInvalidArgument, "wan-proxy: queue and chunk sizes must be positive");
  }
  for (LinkSpec* l : {&opts.to_target, &opts.to_client}) {
    l->loss = 0;
    l->queue_packets = 0;
    l->max_held_bytes = 0;
  }
  opts.to_client.seed = opts.to_target.seed + 1;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(opts.listen_port);
  const char* host = opts.listen_host.empty() ? nullptr : opts.listen_host.c_str();
  if (int rc = ::getaddrinfo(host, port_s.c_str(), &hints, &res); rc != 0) {
    return make_error(StatusCode::kInvalidArgument, "resolving listen address {}: {}", opts.listen_host,
                      gai_strerror(rc));
  }
  const int fd = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, res->ai_protocol);
  if (fd < 0) {
    ::freeaddrinfo(res);
    return errno_error("socket", errno);
  }
  const int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  apply_socket_options(fd, opts.socket);
  Status st;
  if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0) {
    st = errno_error(fmt::format("bind {}:{}", opts.listen_host, opts.listen_port), errno);
  }
  ::freeaddrinfo(res);
  if (st.is_ok() && ::listen(fd, 128) != 0) st = errno_error("listen", errno);
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (st.is_ok() && ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    st = errno_error("getsockname", errno);
  }
  if (!st.is_ok()) {
    ::close(fd);
    return st;
  }
  const uint16_t port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                                 : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  std::unique_ptr<TcpProxy> p(new TcpProxy(std::move(opts), fd, port));
  p->acceptor_ = std::thread([q = p.get()] { q->accept_loop(); });
  return p;
}

void TcpProxy::accept_loop() {
  while (!stopping_.load()) {
    reap(false);
    pollfd pfd{listen_fd_, POLLIN, 0};
    const int r = ::poll(&pfd, 1, 100);
    if (r <= 0) continue;
    const int cfd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (cfd < 0) continue;  // EAGAIN, ECONNABORTED, EINTR, EMFILE: try again
    const int nd = opts_.socket.no_delay ? 1 : 0;
    (void)::setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &nd, sizeof(nd));
    stats_.connections.fetch_add(1);
    auto tfd = connect_to(opts_.target_host, opts_.target_port, opts_.socket, opts_.connect_timeout);
    if (!tfd) {
      stats_.connect_failures.fetch_add(1);
      spdlog::warn("wan-proxy: {}; closing the client", tfd.status().message());
      ::close(cfd);
      continue;
    }
    auto c = std::make_unique<Conn>(cfd, *tfd, opts_);
    c->up.bytes = &stats_.bytes_to_target;
    c->down.bytes = &stats_.bytes_to_client;
    c->running.store(4);
    Conn* raw = c.get();
    raw->threads[0] = std::thread([this, raw] {
      Running r{&raw->running};
      read_loop(*raw, raw->up, opts_, stats_);
    });
    raw->threads[1] = std::thread([raw] {
      Running r{&raw->running};
      write_loop(*raw, raw->up);
    });
    raw->threads[2] = std::thread([this, raw] {
      Running r{&raw->running};
      read_loop(*raw, raw->down, opts_, stats_);
    });
    raw->threads[3] = std::thread([raw] {
      Running r{&raw->running};
      write_loop(*raw, raw->down);
    });
    std::lock_guard<std::mutex> lk(mu_);
    conns_.push_back(std::move(c));
    stats_.active.store(conns_.size());
  }
}

void TcpProxy::reap(bool all) {
  std::list<std::unique_ptr<Conn>> done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (all) (*it)->abort();
      if (all || (*it)->running.load() == 0) {
        done.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
    stats_.active.store(conns_.size());
  }
  done.clear();  // joins and closes outside the lock
}

void TcpProxy::stop() {
  std::call_once(stopped_, [this] {
    stopping_.store(true);
    stop_requested_.store(true);
    if (acceptor_.joinable()) acceptor_.join();
    reap(true);
    ::close(listen_fd_);
  });
}

void TcpProxy::wait() {
  while (!stop_requested_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

}  // namespace moesh::wan
