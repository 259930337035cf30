#include "moesh/wan/netns.h"

#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace moesh::wan {

namespace {

constexpr const char* kNetnsDir = "/run/netns";

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& a : v) {
    if (!s.empty()) s += ' ';
    s += a;
  }
  return s;
}

}  // namespace

Status run_program(const std::vector<std::string>& argv) {
  if (argv.empty()) return make_error(StatusCode::kInvalidArgument, "run_program: no command");
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return make_error(StatusCode::kIoError, "pipe: {}", std::strerror(errno));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    return make_error(StatusCode::kIoError, "fork: {}", std::strerror(errno));
  }
  if (pid == 0) {
    ::dup2(pipefd[1], STDOUT_FILENO);
    ::dup2(pipefd[1], STDERR_FILENO);
    ::execvp(args[0], args.data());
    const char msg[] = "exec failed\n";
    (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  ::close(pipefd[1]);
  std::string out;
  char buf[1024];
  while (true) {
    const ssize_t n = ::read(pipefd[0], buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  ::close(pipefd[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::ok();
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return make_error(StatusCode::kIoError, "'{}' failed (exit {}){}{}", join(argv), code, out.empty() ? "" : ": ", out);
}

Status run_ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv{"ip"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_program(argv);
}

std::vector<std::string> list_netns() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(kNetnsDir, ec)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

bool netns_exists(const std::string& name) {
  std::error_code ec;
  return std::filesystem::exists(std::string(kNetnsDir) + "/" + name, ec);
}

Status add_netns(const std::string& name) {
  return run_ip({"netns", "add", name});
}
Status del_netns(const std::string& name) {
  return run_ip({"netns", "del", name});
}

Result<std::unique_ptr<ScopedNetns>> ScopedNetns::enter(const std::string& name) {
  const int back = ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (back < 0) return make_error(StatusCode::kIoError, "open /proc/thread-self/ns/net: {}", std::strerror(errno));
  const std::string path = std::string(kNetnsDir) + "/" + name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    ::close(back);
    return make_error(err == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError, "open {}: {}", path,
                      std::strerror(err));
  }
  const int rc = ::setns(fd, CLONE_NEWNET);
  const int err = errno;
  ::close(fd);
  if (rc != 0) {
    ::close(back);
    return make_error(StatusCode::kIoError, "setns into {}: {}", name, std::strerror(err));
  }
  return std::unique_ptr<ScopedNetns>(new ScopedNetns(back));
}

ScopedNetns::~ScopedNetns() {
  // Going back can only fail if the original namespace fd is invalid, which it cannot be here.
  (void)::setns(back_fd_, CLONE_NEWNET);
  ::close(back_fd_);
}

Result<int> open_tun(const std::string& netns, const std::string& ifname) {
  if (ifname.empty() || ifname.size() >= IFNAMSIZ) {
    return make_error(StatusCode::kInvalidArgument, "TUN name '{}' must be 1-{} characters", ifname, IFNAMSIZ - 1);
  }
  auto in = ScopedNetns::enter(netns);
  if (!in) return in.status();
  // The TUN device joins the namespace of the thread that opens /dev/net/tun.
  const int fd = ::open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return make_error(StatusCode::kIoError, "open /dev/net/tun: {}", std::strerror(errno));
  ifreq ifr{};
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  std::strncpy(ifr.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
  if (::ioctl(fd, TUNSETIFF, &ifr) != 0) {
    const int err = errno;
    ::close(fd);
    return make_error(StatusCode::kIoError, "TUNSETIFF {} in {}: {}", ifname, netns, std::strerror(err));
  }
  return fd;
}

Status write_sysctl(const std::string& netns, const std::string& key, const std::string& value) {
  auto in = ScopedNetns::enter(netns);
  if (!in) return in.status();
  const std::string path = "/proc/sys/" + key;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return make_error(StatusCode::kIoError, "open {} in {}: {}", path, netns, std::strerror(errno));
  const ssize_t n = ::write(fd, value.data(), value.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(value.size())) {
    return make_error(StatusCode::kIoError, "writing '{}' to {} in {}: {}", value, path, netns, std::strerror(err));
  }
  return Status::ok();
}

Result<std::string> read_sysctl(const std::string& netns, const std::string& key) {
  auto in = ScopedNetns::enter(netns);
  if (!in) return in.status();
  const std::string path = "/proc/sys/" + key;
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) return make_error(StatusCode::kIoError, "reading {} in {}", path, netns);
  return line;
}

}  // namespace moesh::wan
