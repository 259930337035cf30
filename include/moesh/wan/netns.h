// Network-namespace and TUN plumbing for `moesh wan-emu` (Linux, root). Namespaces are the named
// ones of iproute2 (/run/netns/NAME), so `ip netns exec NAME ...` reaches them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "moesh/util/status.h"

namespace moesh::wan {

// Runs argv[0] (searched in PATH, no shell) and waits. kIoError if it could not start or exited
// non-zero; the message holds the command line and what it printed.
Status run_program(const std::vector<std::string>& argv);
// run_program({"ip", args...}).
Status run_ip(const std::vector<std::string>& args);

// Named namespaces (the entries of /run/netns), sorted.
std::vector<std::string> list_netns();
bool netns_exists(const std::string& name);
Status add_netns(const std::string& name);  // `ip netns add`
Status del_netns(const std::string& name);  // `ip netns del`

// Moves the calling thread into a named namespace; the destructor moves it back. Sockets and TUN
// devices created meanwhile stay in that namespace after the thread leaves it.
class ScopedNetns {
 public:
  static Result<std::unique_ptr<ScopedNetns>> enter(const std::string& name);
  ~ScopedNetns();
  ScopedNetns(const ScopedNetns&) = delete;
  ScopedNetns& operator=(const ScopedNetns&) = delete;

 private:
  explicit ScopedNetns(int back_fd) : back_fd_(back_fd) {}
  int back_fd_;
};

// Creates TUN device `ifname` (IFF_TUN | IFF_NO_PI: one IP packet per read/write) inside `netns`
// and returns its non-blocking fd. The device lives as long as the fd.
Result<int> open_tun(const std::string& netns, const std::string& ifname);

// Writes /proc/sys/<key> (e.g. "net/ipv4/tcp_slow_start_after_idle") as seen from `netns`.
Status write_sysctl(const std::string& netns, const std::string& key, const std::string& value);
Result<std::string> read_sysctl(const std::string& netns, const std::string& key);

}  // namespace moesh::wan
