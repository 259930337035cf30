// The host's TCP settings that decide WAN latency and that only the operator can change
// (docs/background/netstack.md §3, findings 2 and 3; docs/wan-emu.md "Socket settings").
//
// Per socket, moesh already sets TCP_NODELAY and TCP_CONGESTION (before connect()/listen();
// net::TcpOptions). Two things are host-wide:
//   net.ipv4.tcp_slow_start_after_idle  1 (the default) restarts slow start on a connection idle
//                                       for one RTO: at 80 ms RTT a 100 KB reply after 1 s idle
//                                       took 565 ms instead of 81 ms. Operators should set 0.
//   net.ipv4.tcp_allowed_congestion_control / tcp_available_congestion_control
//                                       a process without CAP_NET_ADMIN may only pick an allowed
//                                       algorithm, so "cubic" must be listed there; a missing
//                                       module makes it unavailable to everyone.
// And when a caller keeps the system default, a default of bbr paces app-limited bursts
// (12-100 KB cost 1.5-2 RTT instead of 1).
#pragma once

#include <string>
#include <vector>

namespace moesh::wan {

struct HostTcpSettings {
  int slow_start_after_idle = -1;  // -1: unreadable
  std::string congestion_control;  // the default, "" if unreadable
  std::string allowed;             // space-separated lists, "" if unreadable
  std::string available;
};

// Reads tcp_slow_start_after_idle, tcp_congestion_control, tcp_allowed_congestion_control and
// tcp_available_congestion_control from `dir` (the calling thread's network namespace by default).
HostTcpSettings read_host_tcp_settings(const std::string& dir = "/proc/sys/net/ipv4");

// Human warnings, one sentence each, with the operator's fix; empty when all is well.
// `congestion` is what the process's sockets ask for ("" = the system default); `privileged`:
// whether the process has CAP_NET_ADMIN (may choose algorithms outside the allowed list).
std::vector<std::string> tcp_settings_warnings(const HostTcpSettings& s, const std::string& congestion,
                                               bool privileged);

// Whether this process has CAP_NET_ADMIN in its effective set (/proc/self/status).
bool have_cap_net_admin();

// read_host_tcp_settings() + tcp_settings_warnings() for this process: what a worker or backbone
// should log at start-up (spdlog::warn each line).
std::vector<std::string> check_host_tcp_settings(const std::string& congestion = "cubic");

}  // namespace moesh::wan
