#include "moesh/wan/spec.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <vector>

namespace moesh::wan {

namespace {

// A non-negative decimal number followed by a unit suffix (letters and '%').
bool split_number(std::string_view s, double* value, std::string* unit) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return false;
  const std::string num(s.substr(0, i));
  char* end = nullptr;
  const double v = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(v) || v < 0) return false;
  *value = v;
  unit->clear();
  for (char c : s.substr(i)) unit->push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  return true;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

bool name_ok(std::string_view s, size_t max_len, bool upper) {
  if (s.empty() || s.size() > max_len) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || (upper && c >= 'A' && c <= 'Z');
    if (!ok) return false;
  }
  return true;
}

}  // namespace

Result<Nanos> parse_duration(std::string_view s) {
  double v = 0;
  std::string unit;
  if (!split_number(s, &v, &unit)) {
    return make_error(StatusCode::kInvalidArgument, "'{}' is not a duration (e.g. 40ms, 250us, 1s)", s);
  }
  double scale = 0;
  if (unit.empty() || unit == "ms") {
    scale = 1e6;
  } else if (unit == "us") {
    scale = 1e3;
  } else if (unit == "ns") {
    scale = 1;
  } else if (unit == "s") {
    scale = 1e9;
  } else {
    return make_error(StatusCode::kInvalidArgument, "'{}': unknown duration unit '{}' (ns, us, ms, s)", s, unit);
  }
  const double ns = v * scale;
  if (ns > 3600e9) return make_error(StatusCode::kInvalidArgument, "'{}': longer than an hour", s);
  return Nanos(static_cast<int64_t>(std::llround(ns)));
}

Result<double> parse_rate(std::string_view s) {
  double v = 0;
  std::string unit;
  if (!split_number(s, &v, &unit)) {
    return make_error(StatusCode::kInvalidArgument, "'{}' is not a rate (e.g. 100mbit, 1gbit)", s);
  }
  double scale = 0;
  if (unit == "bit") {
    scale = 1;
  } else if (unit == "kbit") {
    scale = 1e3;
  } else if (unit == "mbit") {
    scale = 1e6;
  } else if (unit == "gbit") {
    scale = 1e9;
  } else {
    return make_error(StatusCode::kInvalidArgument, "'{}': rate needs a unit: bit, kbit, mbit or gbit", s);
  }
  return v * scale;
}

Result<double> parse_probability(std::string_view s) {
  double v = 0;
  std::string unit;
  if (!split_number(s, &v, &unit) || (!unit.empty() && unit != "%")) {
    return make_error(StatusCode::kInvalidArgument, "'{}' is not a probability (e.g. 0.1% or 0.001)", s);
  }
  if (unit == "%") v /= 100.0;
  if (v > 1.0) return make_error(StatusCode::kInvalidArgument, "'{}': a probability is at most 100%", s);
  return v;
}

Result<std::pair<std::string, uint16_t>> parse_host_port(std::string_view s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 >= s.size()) {
    return make_error(StatusCode::kInvalidArgument, "'{}' is not HOST:PORT", s);
  }
  std::string host(s.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string_view ps = s.substr(colon + 1);
  unsigned port = 0;
  const auto [ptr, ec] = std::from_chars(ps.data(), ps.data() + ps.size(), port);
  if (ec != std::errc() || ptr != ps.data() + ps.size() || port > 65535 || host.empty()) {
    return make_error(StatusCode::kInvalidArgument, "'{}' is not HOST:PORT", s);
  }
  return std::make_pair(host, static_cast<uint16_t>(port));
}

bool valid_peer_name(std::string_view s) {
  return name_ok(s, 12, false) && s != "hub";
}
bool valid_emu_name(std::string_view s) {
  return name_ok(s, 16, true);
}

Result<PeerSpec> parse_peer_spec(std::string_view s) {
  PeerSpec p;
  const size_t colon = s.find(':');
  p.name = std::string(s.substr(0, colon));
  if (!valid_peer_name(p.name)) {
    return make_error(StatusCode::kInvalidArgument,
                      "--peer '{}': the name '{}' must be 1-12 of [a-z0-9_] and not 'hub'", s, p.name);
  }
  if (colon == std::string_view::npos) return p;
  for (std::string_view item : split(s.substr(colon + 1), ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return make_error(StatusCode::kInvalidArgument, "--peer '{}': '{}' is not key=value", s, item);
    }
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    auto ctx = [&](const Status& st) { return st.with_context(fmt::format("--peer '{}'", s)); };
    if (key == "delay") {
      auto d = parse_duration(value);
      if (!d) return ctx(d.status());
      p.link.delay = *d;
    } else if (key == "jitter") {
      auto d = parse_duration(value);
      if (!d) return ctx(d.status());
      p.link.jitter = *d;
    } else if (key == "rate") {
      auto r = parse_rate(value);
      if (!r) return ctx(r.status());
      p.link.rate_bps = *r;
    } else if (key == "loss") {
      auto l = parse_probability(value);
      if (!l) return ctx(l.status());
      p.link.loss = *l;
    } else if (key == "queue") {
      size_t q = 0;
      const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), q);
      if (ec != std::errc() || ptr != value.data() + value.size()) {
        return make_error(StatusCode::kInvalidArgument, "--peer '{}': queue '{}' is not a packet count", s, value);
      }
      p.link.queue_packets = q;
    } else {
      return make_error(StatusCode::kInvalidArgument,
                        "--peer '{}': unknown key '{}' (delay, jitter, rate, loss, queue)", s, key);
    }
  }
  return p;
}

std::string format_duration(Nanos d) {
  const double ms = static_cast<double>(d.count()) / 1e6;
  return fmt::format("{:g}ms", ms);
}

std::string format_rate(double bps) {
  if (bps <= 0) return "unlimited";
  if (bps >= 1e9) return fmt::format("{:g}gbit", bps / 1e9);
  if (bps >= 1e6) return fmt::format("{:g}mbit", bps / 1e6);
  if (bps >= 1e3) return fmt::format("{:g}kbit", bps / 1e3);
  return fmt::format("{:g}bit", bps);
}

std::string describe_link(const LinkSpec& l) {
  std::string q = l.queue_packets == 0 ? "unbounded" : std::to_string(l.queue_packets);
  return fmt::format("delay {}, jitter {}, rate {}, loss {:g}%, queue {}", format_duration(l.delay),
                     format_duration(l.jitter), format_rate(l.rate_bps), l.loss * 100.0, q);
}

}  // namespace moesh::wan
