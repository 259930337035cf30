#include "moesh/wan/host_tcp.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

namespace moesh::wan {

namespace {

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) return "";
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
  return line;
}

bool listed(const std::string& list, const std::string& name) {
  std::istringstream in(list);
  std::string w;
  while (in >> w) {
    if (w == name) return true;
  }
  return false;
}

}  // namespace

HostTcpSettings read_host_tcp_settings(const std::string& dir) {
  HostTcpSettings s;
  const std::string ss = read_line(dir + "/tcp_slow_start_after_idle");
  if (ss == "0" || ss == "1") s.slow_start_after_idle = ss == "1" ? 1 : 0;
  s.congestion_control = read_line(dir + "/tcp_congestion_control");
  s.allowed = read_line(dir + "/tcp_allowed_congestion_control");
  s.available = read_line(dir + "/tcp_available_congestion_control");
  return s;
}

std::vector<std::string> tcp_settings_warnings(const HostTcpSettings& s, const std::string& congestion,
                                               bool privileged) {
  std::vector<std::string> w;
  if (s.slow_start_after_idle == 1) {
    w.push_back(
        "net.ipv4.tcp_slow_start_after_idle=1: a connection idle for longer than its retransmission timeout "
        "restarts slow start, so the first large message after a pause costs several round trips (100 KB at "
        "80 ms RTT: 565 ms instead of 81 ms); the operator should run "
        "'sysctl -w net.ipv4.tcp_slow_start_after_idle=0'");
  }
  if (!congestion.empty()) {
    if (!s.available.empty() && !listed(s.available, congestion)) {
      w.push_back(fmt::format(
          "TCP congestion control '{}' is not available in this kernel (available: {}); sockets fall back to "
          "the default '{}'; the operator should load it ('modprobe tcp_{}')",
          congestion, s.available, s.congestion_control, congestion));
    } else if (!privileged && !s.allowed.empty() && !listed(s.allowed, congestion)) {
      w.push_back(fmt::format(
          "TCP congestion control '{}' is not in net.ipv4.tcp_allowed_congestion_control ({}), so this "
          "unprivileged process cannot select it per socket and keeps the default '{}'; the operator should run "
          "\"sysctl -w net.ipv4.tcp_allowed_congestion_control='{} {}'\" (or grant CAP_NET_ADMIN)",
          congestion, s.allowed, s.congestion_control, s.allowed, congestion));
    }
  } else if (s.congestion_control == "bbr") {
    w.push_back(
        "the system default TCP congestion control is bbr, which paces app-limited bursts: a 12-100 KB message "
        "costs 1.5-2 round trips instead of 1; choose cubic per socket (before connect/listen) or as the default "
        "('sysctl -w net.ipv4.tcp_congestion_control=cubic')");
  }
  return w;
}

bool have_cap_net_admin() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      unsigned long long caps = 0;
      std::istringstream in(line.substr(7));
      in >> std::hex >> caps;
      return (caps >> 12) & 1;  // CAP_NET_ADMIN = 12
    }
  }
  return false;
}

std::vector<std::string> check_host_tcp_settings(const std::string& congestion) {
  return tcp_settings_warnings(read_host_tcp_settings(), congestion, have_cap_net_admin());
}

}  // namespace moesh::wan
