// TCP ByteStream and listener: non-blocking POSIX sockets, every wait a poll() bounded by the
// caller's deadline. (A blocking-with-poll design keeps each call self-contained; the process's
// event loop, when there is one, can own these fds later without changing the interface.)
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
#include <chrono>
#include <cstring>

#include "moesh/net/transport.h"

namespace moesh::net {

namespace {

// Milliseconds left until the deadline, rounded up, clamped to [0, 100]: polling in short
// slices lets close() from another thread be noticed promptly.
int poll_slice_ms(Deadline deadline) {
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, 100));
}

Status errno_status(const std::string& what, int err) {
  const StatusCode code = (err == EPIPE || err == ECONNRESET || err == ENOTCONN || err == ECONNREFUSED ||
                           err == ESHUTDOWN || err == ECONNABORTED || err == EHOSTUNREACH || err == ENETUNREACH)
                              ? StatusCode::kUnavailable
                              : StatusCode::kIoError;
  return make_error(code, "{}: {}", what, std::strerror(err));
}

// Options that must precede connect()/listen() (docs/background/netstack.md finding 2), plus TCP_NODELAY.
Status apply_pre_connect_options(int fd, const TcpOptions& o) {
  if (!o.congestion.empty()) {
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, o.congestion.data(), o.congestion.size()) != 0) {
      const int err = errno;
      if (o.require_congestion) return errno_status("TCP_CONGESTION " + o.congestion, err);
      static std::once_flag warned;
      std::call_once(warned, [&] {
        spdlog::warn("TCP_CONGESTION '{}' refused ({}); using the system default", o.congestion, std::strerror(err));
      });
    }
  }
  if (o.send_buffer_bytes > 0) (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &o.send_buffer_bytes, sizeof(int));
  if (o.recv_buffer_bytes > 0) (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &o.recv_buffer_bytes, sizeof(int));
  const int one = o.no_delay ? 1 : 0;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) return errno_status("TCP_NODELAY", errno);
  return Status::ok();
}

Status set_nonblocking(int fd) {
  const int fl = fcntl(fd, F_GETFL, 0);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) return errno_status("fcntl(O_NONBLOCK)", errno);
  return Status::ok();
}

std::string sockaddr_string(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
  }
  return fmt::format("{}:{}", host, port);
}

class TcpStream final : public ByteStream {
 public:
  TcpStream(int fd, std::string peer, int poll_us) : fd_(fd), peer_(std::move(peer)), poll_us_(poll_us) {
    // Receive timestamps (software, in the kernel's receive path): last_arrival(). A kernel
    // that refuses leaves them unknown; nothing else depends on it.
    const int one = 1;
    timestamps_ = setsockopt(fd_, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one)) == 0;
  }
  ~TcpStream() override {
    if (fd_ < 0) return;  // released
    close();
    ::close(fd_);  // only here, so no other thread can be using a reused fd number
  }
  // The socket, for another owner; this stream is then unusable.
  int release() {
    const int fd = fd_;
    fd_ = -1;
    closed_.store(true);
    return fd;
  }

  Status write_all(std::span<const uint8_t> bytes, Deadline deadline) override {
    size_t done = 0;
    while (done < bytes.size()) {
      if (closed_.load()) return make_error(StatusCode::kUnavailable, "tcp {}: closed", peer_);
      const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return errno_status("tcp send to " + peer_, errno);
      MOESH_RETURN_IF_ERROR(wait_for(POLLOUT, deadline, "write"));
    }
    return Status::ok();
  }

  Result<size_t> read_some(std::span<uint8_t> buf, Deadline deadline) override {
    bool spun = poll_us_ <= 0;
    while (true) {
      if (closed_.load()) return make_error(StatusCode::kUnavailable, "tcp {}: closed", peer_);
      const ssize_t n = timestamps_ ? recv_stamped(buf) : ::recv(fd_, buf.data(), buf.size(), 0);
      if (n > 0) return static_cast<size_t>(n);
      if (n == 0) return make_error(StatusCode::kUnavailable, "tcp {}: peer closed the connection", peer_);
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return errno_status("tcp recv from " + peer_, errno);
      if (!spun) {  // busy-poll once per read (TcpOptions::poll_us), then sleep in poll()
        spun = true;
        if (spin_until_readable(std::min(deadline, Clock::now() + std::chrono::microseconds(poll_us_)))) continue;
      }
      MOESH_RETURN_IF_ERROR(wait_for(POLLIN, deadline, "read"));
    }
  }

  void close() override {
    if (!closed_.exchange(true)) ::shutdown(fd_, SHUT_RDWR);
  }
  std::string describe() const override { return "tcp " + peer_; }
  Clock::time_point last_arrival() const override { return last_arrival_; }

  TcpSocketInfo info() const {
    TcpSocketInfo i;
    char cc[64] = {};
    socklen_t len = sizeof(cc);
    if (getsockopt(fd_, IPPROTO_TCP, TCP_CONGESTION, cc, &len) == 0) i.congestion.assign(cc, strnlen(cc, len));
    len = sizeof(int);
    (void)getsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &i.send_buffer_bytes, &len);
    len = sizeof(int);
    (void)getsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &i.recv_buffer_bytes, &len);
    int nd = 0;
    len = sizeof(int);
    (void)getsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &nd, &len);
    i.no_delay = nd != 0;
    i.peer = peer_;
    return i;
  }

 private:
  // recv() that also takes the SCM_TIMESTAMPNS control message: the kernel's receive time of the
  // newest segment read (CLOCK_REALTIME), moved onto the steady clock by the offset between the
  // two clocks now.
  ssize_t recv_stamped(std::span<uint8_t> buf) {
    iovec iov{buf.data(), buf.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(timespec))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd_, &msg, 0);
    if (n <= 0) return n;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_TIMESTAMPNS) continue;
      timespec ts;
      std::memcpy(&ts, CMSG_DATA(c), sizeof(ts));
      const auto real_now = std::chrono::system_clock::now();
      const auto steady_now = Clock::now();
      const auto stamp =
          std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec)));
      last_arrival_ = steady_now - std::chrono::duration_cast<Clock::duration>(real_now - stamp);
      return n;
    }
    last_arrival_ = {};
    return n;
  }

  // poll() with no timeout until the socket is readable (true), closed or `until` passes.
  bool spin_until_readable(Clock::time_point until) {
    while (!closed_.load() && Clock::now() < until) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 0) > 0) return true;
    }
    return false;
  }

  bool timestamps_ = false;
  Clock::time_point last_arrival_{};
  // Waits until the socket is ready for `events`, the deadline passes, or close() is called.
  Status wait_for(short events, Deadline deadline, const char* what) {
    while (true) {
      if (closed_.load()) return make_error(StatusCode::kUnavailable, "tcp {}: closed", peer_);
      if (Clock::now() >= deadline)
        return make_error(StatusCode::kTimeout, "tcp {}: {} did not complete before the deadline", peer_, what);
      pollfd p{fd_, events, 0};
      const int r = ::poll(&p, 1, poll_slice_ms(deadline));
      if (r > 0) return Status::ok();  // ready, or an error/hangup the next send/recv reports
      if (r < 0 && errno != EINTR) return errno_status("poll", errno);
    }
  }

  int fd_;
  std::string peer_;
  int poll_us_ = 0;
  std::atomic<bool> closed_{false};
};

Status wait_fd(int fd, short events, Deadline deadline, const std::atomic<bool>* closed, const char* what) {
  while (true) {
    if (closed && closed->load()) return make_error(StatusCode::kUnavailable, "{}: closed", what);
    if (Clock::now() >= deadline) return make_error(StatusCode::kTimeout, "{}: deadline passed", what);
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, poll_slice_ms(deadline));
    if (r > 0) return Status::ok();
    if (r < 0 && errno != EINTR) return errno_status("poll", errno);
  }
}

}  // namespace

Result<std::unique_ptr<ByteStream>> tcp_connect(const std::string& host, uint16_t port, const TcpOptions& opts,
                                                Deadline deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res); rc != 0)
    return make_error(StatusCode::kUnavailable, "resolving {}: {}", host, gai_strerror(rc));
  Status last = make_error(StatusCode::kUnavailable, "no address for {}", host);
  std::unique_ptr<ByteStream> out;
  for (addrinfo* ai = res; ai && !out; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last = errno_status("socket", errno);
      continue;
    }
    const std::string peer = sockaddr_string(ai->ai_addr);
    Status st = apply_pre_connect_options(fd, opts);
    if (st.is_ok()) st = set_nonblocking(fd);
    if (st.is_ok() && ::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        st = errno_status("connect to " + peer, errno);
      } else {
        st = wait_fd(fd, POLLOUT, deadline, nullptr, ("connect to " + peer).c_str());
        if (st.is_ok()) {
          int err = 0;
          socklen_t len = sizeof(err);
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          if (err != 0) st = errno_status("connect to " + peer, err);
        }
      }
    }
    if (!st.is_ok()) {
      ::close(fd);
      last = st;
      continue;
    }
    out = std::make_unique<TcpStream>(fd, peer, opts.poll_us);
  }
  freeaddrinfo(res);
  if (!out) return last;
  return out;
}

std::vector<double> connect_rtts(const std::vector<std::string>& targets, int rounds, Deadline deadline) {
  std::vector<double> best(targets.size(), -1.0);
  // Resolved once, before any timing.
  std::vector<sockaddr_storage> addrs(targets.size());
  std::vector<socklen_t> lens(targets.size(), 0);
  for (size_t i = 0; i < targets.size(); ++i) {
    const std::string& t = targets[i];
    const size_t colon = t.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == t.size()) continue;
    std::string host = t.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    const std::string port = t.substr(colon + 1);
    if (port.find_first_not_of("0123456789") != std::string::npos) continue;
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) continue;
    std::memcpy(&addrs[i], res->ai_addr, res->ai_addrlen);
    lens[i] = res->ai_addrlen;
    freeaddrinfo(res);
  }
  // The smallest connect time seen per address.
  auto keep = [&best](size_t i, Clock::time_point start, Clock::time_point done) {
    const double s = std::chrono::duration<double>(done - start).count();
    best[i] = best[i] < 0 ? s : std::min(best[i], s);
  };
  for (int round = 0; round < rounds && Clock::now() < deadline; ++round) {
    struct Pending {
      size_t i;
      int fd;
      Clock::time_point start;
    };
    std::vector<Pending> pending;
    for (size_t i = 0; i < targets.size(); ++i) {
      if (lens[i] == 0) continue;
      const int fd = ::socket(addrs[i].ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      const Clock::time_point start = Clock::now();
      if (::connect(fd, reinterpret_cast<const sockaddr*>(&addrs[i]), lens[i]) == 0) {
        keep(i, start, Clock::now());
        ::close(fd);
      } else if (errno == EINPROGRESS) {
        pending.push_back(Pending{i, fd, start});
      } else {
        ::close(fd);
      }
    }
    while (!pending.empty() && Clock::now() < deadline) {
      std::vector<pollfd> p;
      for (const Pending& q : pending) p.push_back(pollfd{q.fd, POLLOUT, 0});
      const int r = ::poll(p.data(), p.size(), poll_slice_ms(deadline));
      if (r < 0 && errno != EINTR) break;
      const Clock::time_point now = Clock::now();
      for (size_t k = p.size(); k-- > 0;) {
        if (p[k].revents == 0) continue;
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(pending[k].fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err == 0) keep(pending[k].i, pending[k].start, now);
        ::close(pending[k].fd);
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
    for (const Pending& q : pending) ::close(q.fd);
  }
  return best;
}

Result<int> tcp_release_fd(std::unique_ptr<ByteStream> stream) {
  auto* tcp = dynamic_cast<TcpStream*>(stream.get());
  if (tcp == nullptr) return make_error(StatusCode::kInvalidArgument, "{} is not a TCP stream", stream->describe());
  return tcp->release();
}

Result<TcpSocketInfo> tcp_socket_info(const ByteStream& stream) {
  auto* tcp = dynamic_cast<const TcpStream*>(&stream);
  if (!tcp) return make_error(StatusCode::kInvalidArgument, "{} is not a TCP stream", stream.describe());
  return tcp->info();
}

TcpListener::TcpListener(int fd, uint16_t port, TcpOptions opts) : fd_(fd), port_(port), opts_(std::move(opts)) {}

TcpListener::~TcpListener() {
  close();
  ::close(fd_);
}

void TcpListener::close() {
  if (!closed_.exchange(true)) ::shutdown(fd_, SHUT_RDWR);
}

Result<std::unique_ptr<TcpListener>> TcpListener::listen(const std::string& host, uint16_t port, const TcpOptions& opts,
                                                         int backlog) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_s.c_str(), &hints, &res); rc != 0)
    return make_error(StatusCode::kInvalidArgument, "resolving listen address {}: {}", host, gai_strerror(rc));
  const int fd = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
  if (fd < 0) {
    freeaddrinfo(res);
    return errno_status("socket", errno);
  }
  const int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  Status st = apply_pre_connect_options(fd, opts);
  if (st.is_ok() && ::bind(fd, res->ai_addr, res->ai_addrlen) != 0)
    st = errno_status("bind " + host + ":" + port_s, errno);
  freeaddrinfo(res);
  if (st.is_ok() && ::listen(fd, backlog) != 0) st = errno_status("listen", errno);
  if (st.is_ok()) st = set_nonblocking(fd);
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (st.is_ok() && getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    st = errno_status("getsockname", errno);
  if (!st.is_ok()) {
    ::close(fd);
    return st;
  }
  const uint16_t bound = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                                  : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return std::unique_ptr<TcpListener>(new TcpListener(fd, bound, opts));
}

Result<std::unique_ptr<ByteStream>> TcpListener::accept(Deadline deadline) {
  while (true) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (closed_.load()) return make_error(StatusCode::kUnavailable, "listener on port {} closed", port_);
    const int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      // Congestion control and buffers are inherited from the listening socket; NODELAY is set
      // again because not every kernel propagates it.
      const int nd = opts_.no_delay ? 1 : 0;
      (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nd, sizeof(nd));
      return std::unique_ptr<ByteStream>(
          std::make_unique<TcpStream>(fd, sockaddr_string(reinterpret_cast<sockaddr*>(&ss)), opts_.poll_us));
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      if (closed_.load()) return make_error(StatusCode::kUnavailable, "listener on port {} closed", port_);
      return errno_status("accept", errno);
    }
    MOESH_RETURN_IF_ERROR(wait_fd(fd_, POLLIN, deadline, &closed_, "accept"));
  }
}

}  // namespace moesh::net
