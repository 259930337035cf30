// Worker addresses as the CLI writes them (--worker, --workers FILE).
#include "moesh/remote/address.h"

#include <fmt/format.h>

#include <charconv>
#include <fstream>

namespace moesh {

std::string WorkerAddress::to_string() const {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

Result<WorkerAddress> parse_worker_address(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
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
  if (host.empty() || port.empty() || ec != std::errc() || p != port.data() + port.size() || v == 0 || v > 65535) {
    return make_error(StatusCode::kInvalidArgument, "worker address '{}': need a host and a port in 1..65535",
                      std::string(s));
  }
  return WorkerAddress{std::string(host), static_cast<uint16_t>(v)};
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
