// Helpers for the wan tests: a `moesh` child process whose stdout is read line by line with a
// deadline, and a TCP echo server built on moesh's own net code.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "moesh/net/transport.h"

namespace moesh::wan::testing {

// `moesh ARGS...` with stdout on a pipe (stderr passes through to the test's).
class MoeshChild {
 public:
  // With `netns`, runs inside that network namespace (`ip netns exec NETNS moesh ...`).
  explicit MoeshChild(const std::vector<std::string>& args, const std::string& netns = "") {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    std::vector<std::string> argv;
    if (!netns.empty()) argv = {"/usr/sbin/ip", "netns", "exec", netns};
    argv.push_back(std::string(MOESH_BIN_DIR) + "/moesh");
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    fd_ = fds[0];
  }
  ~MoeshChild() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      (void)wait_exit(std::chrono::seconds(5));
    }
    if (fd_ >= 0) ::close(fd_);
  }
  MoeshChild(const MoeshChild&) = delete;
  MoeshChild& operator=(const MoeshChild&) = delete;

  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0 && fd_ >= 0; }

  // The next line of stdout (without '\n'); false at EOF or when the timeout passes.
  bool read_line(std::string* line, std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        *line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        all_ += *line + "\n";
        return true;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char b[4096];
      const ssize_t n = ::read(fd_, b, sizeof(b));
      if (n <= 0) return false;
      buf_.append(b, static_cast<size_t>(n));
    }
  }
  // Reads lines until one starts with `prefix` (returned in *line).
  bool read_until(const std::string& prefix, std::string* line, std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !read_line(line, left)) return false;
      if (line->rfind(prefix, 0) == 0) return true;
    }
  }
  // Everything read so far, lines included.
  const std::string& output() const { return all_; }
  // Reads the rest of stdout (until EOF or the timeout).
  void drain(std::chrono::milliseconds timeout) {
    std::string line;
    while (read_line(&line, timeout)) {
    }
  }

  // The exit code, or -1 if it did not exit in time (or died of a signal).
  int wait_exit(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (true) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      if (r < 0 || std::chrono::steady_clock::now() >= until) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  std::string buf_, all_;
};

// Accepts connections on `listener` and echoes every byte back, one thread per connection,
// until destroyed.
class EchoServer {
 public:
  explicit EchoServer(std::unique_ptr<net::TcpListener> listener, bool echo = true)
      : listener_(std::move(listener)), echo_(echo) {
    acceptor_ = std::thread([this] {
      while (!stop_.load()) {
        auto s = listener_->accept(net::deadline_in(std::chrono::milliseconds(100)));
        if (!s) continue;
        std::lock_guard<std::mutex> lk(mu_);
        auto* raw = s->get();
        streams_.push_back(std::move(*s));
        workers_.emplace_back([this, raw] { serve(raw); });
      }
    });
  }
  ~EchoServer() {
    stop_.store(true);
    listener_->close();
    acceptor_.join();
    for (auto& s : streams_) s->close();
    for (auto& t : workers_) t.join();
  }
  uint16_t port() const { return listener_->port(); }
  // With echo=false the server reads nothing until release() (a stalled receiver).
  void release() { released_.store(true); }

 private:
  void serve(net::ByteStream* s) {
    std::vector<uint8_t> buf(64 << 10);
    while (!stop_.load()) {
      if (!echo_ && !released_.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      auto n = s->read_some(buf, net::deadline_in(std::chrono::milliseconds(100)));
      if (!n) {
        if (n.status().code() == StatusCode::kTimeout) continue;
        s->close();  // the peer ended (or failed): end ours too, as an echo service would
        return;
      }
      if (echo_ && !s->write_all({buf.data(), *n}, net::deadline_in(std::chrono::seconds(10))).is_ok()) return;
    }
  }

  std::unique_ptr<net::TcpListener> listener_;
  bool echo_;
  std::atomic<bool> stop_{false}, released_{false};
  std::mutex mu_;
  std::list<std::unique_ptr<net::ByteStream>> streams_;
  std::list<std::thread> workers_;
  std::thread acceptor_;
};

// Deterministic bytes of stream `tag` at offset i.
inline uint8_t pattern_byte(uint32_t tag, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t{tag} << 40);
  x ^= x >> 29;
  return static_cast<uint8_t>(x);
}

}  // namespace moesh::wan::testing
