// Worker addresses as the CLI writes them (--worker, --workers FILE).
#include "moesh/remote/address.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>

namespace moesh {

const char* worker_path_name(WorkerPath p) {
  switch (p) {
    case WorkerPath::kDirect:
      return "direct";
    case WorkerPath::kJoined:
      return "joined";
    case WorkerPath::kRelay:
      return "relay";
  }
  return "?";
}

std::string WorkerAddress::to_string() const {
  const std::string hp =
      host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  switch (path) {
    case WorkerPath::kJoined:
      return "join://" + name;
    case WorkerPath::kRelay:
      return (websocket ? "relay+ws://" : "relay://") + hp + "/" + name;
    case WorkerPath::kDirect:
      break;
  }
  return websocket ? "ws://" + hp : hp;
}

namespace {

Status check_worker_name(std::string_view name, std::string_view whole) {
  const bool ok = !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '@' || c == ':' || c == '-';
  });
  if (ok) return Status::ok();
  return make_error(StatusCode::kInvalidArgument, "worker address '{}': a worker name is 1..64 of [A-Za-z0-9._@:-]",
                    std::string(whole));
}

Result<WorkerAddress> parse_host_port(std::string_view s, bool allow_port_0 = false);

}  // namespace

Result<WorkerAddress> parse_one_path(std::string_view s);

Result<WorkerAddress> parse_worker_address(std::string_view s) {
  const size_t bar = s.find('|');
  if (bar == std::string_view::npos) return parse_one_path(s);
  MOESH_ASSIGN_OR_RETURN(WorkerAddress first, parse_one_path(s.substr(0, bar)));
  std::string_view rest = s.substr(bar + 1);
  for (;;) {
    const size_t next = rest.find('|');
    MOESH_ASSIGN_OR_RETURN(WorkerAddress alt, parse_one_path(rest.substr(0, next)));
    first.alternatives.push_back(std::move(alt));
    if (next == std::string_view::npos) break;
    rest = rest.substr(next + 1);
  }
  return first;
}

Result<WorkerAddress> parse_one_path(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  if (s.rfind("join://", 0) == 0) {
    MOESH_RETURN_IF_ERROR(check_worker_name(s.substr(7), s));
    WorkerAddress a;
    a.name = std::string(s.substr(7));
    a.path = WorkerPath::kJoined;
    return a;
  }
  const bool relay_ws = s.rfind("relay+ws://", 0) == 0;
  if (s.rfind("relay://", 0) == 0 || relay_ws) {
    const std::string_view rest = s.substr(relay_ws ? 11 : 8);
    const size_t slash = rest.find('/');
    if (slash == std::string_view::npos)
      return make_error(StatusCode::kInvalidArgument, "worker address '{}': expected relay://HOST:PORT/NAME",
                        std::string(s));
    MOESH_RETURN_IF_ERROR(check_worker_name(rest.substr(slash + 1), s));
    auto a = parse_host_port(rest.substr(0, slash));
    if (!a) return a.status();
    a->name = std::string(rest.substr(slash + 1));
    a->path = WorkerPath::kRelay;
    a->websocket = relay_ws;
    return a;
  }
  if (s.rfind("ws://", 0) == 0) {
    std::string_view hp = s.substr(5);
    if (!hp.empty() && hp.back() == '/') hp.remove_suffix(1);
    auto a = parse_host_port(hp);
    if (!a) return a.status();
    a->websocket = true;
    return a;
  }
  return parse_host_port(s);
}

namespace {

Result<WorkerAddress> parse_host_port(std::string_view s, bool allow_port_0) {
  std::string_view host, port;
  if (!s.empty() && s.front() == '[') {
    const size_t close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':') {
      return make_error(StatusCode::kInvalidArgument, "worker address '{}': expected [v6addr]:port", std::string(s));
    }
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    const size_t colon = s.rfind(':');
    if (colon == std::string_view::npos || s.find(':') != colon) {
      return make_error(StatusCode::kInvalidArgument, "worker address '{}': expected HOST:PORT", std::string(s));
    }
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  unsigned v = 0;
  auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), v);
  if (host.empty() || port.empty() || ec != std::errc() || p != port.data() + port.size() ||
      (v == 0 && !allow_port_0) || v > 65535) {
    return make_error(StatusCode::kInvalidArgument, "worker address '{}': need a host and a port in 1..65535",
                      std::string(s));
  }
  return WorkerAddress{std::string(host), static_cast<uint16_t>(v)};
}

}  // namespace

Result<WorkerAddress> parse_listen_address(std::string_view s) {
  return parse_host_port(s, /*allow_port_0=*/true);
}

Result<std::vector<WorkerAddress>> read_workers_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(StatusCode::kIoError, "cannot read workers file '{}'", path);
  std::vector<WorkerAddress> out;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    std::string_view v(line);
    if (const size_t hash = v.find('#'); hash != std::string_view::npos) v = v.substr(0, hash);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\r')) v.remove_suffix(1);
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    if (v.empty()) continue;
    auto a = parse_worker_address(v);
    if (!a) return a.status().with_context(fmt::format("{}:{}", path, lineno));
    out.push_back(*a);
  }
  if (out.empty()) return make_error(StatusCode::kInvalidArgument, "workers file '{}' lists no workers", path);
  return out;
}

}  // namespace moesh
