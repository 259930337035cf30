#include "moesh/wan/emulator.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "moesh/wan/netns.h"

namespace moesh::wan {

namespace {

constexpr size_t kMaxPacket = 65536;
constexpr int kReadBatch = 64;  // packets read from one fd before looking at the others

}  // namespace

std::string hub_netns_name(const std::string& emu) {
  return "moesh-" + emu + "-hub";
}
std::string peer_netns_name(const std::string& emu, const std::string& peer) {
  return "moesh-" + emu + "-" + peer;
}
std::string emu_pidfile(const std::string& emu) {
  return "/run/moesh-wan/" + emu + ".pid";
}

std::vector<std::string> emu_namespaces(const std::string& emu) {
  std::vector<std::string> out;
  const std::string prefix = "moesh-" + emu + "-";
  for (const auto& n : list_netns()) {
    if (n.rfind(prefix, 0) != 0) continue;
    const std::string rest = n.substr(prefix.size());
    if (!rest.empty() && rest.find('-') == std::string::npos) out.push_back(n);
  }
  return out;
}

Result<std::vector<std::string>> remove_emu_namespaces(const std::string& emu) {
  std::vector<std::string> removed;
  for (const auto& n : emu_namespaces(emu)) {
    MOESH_RETURN_IF_ERROR(del_netns(n));
    removed.push_back(n);
  }
  return removed;
}

Emulator::Emulator(EmuSpec spec) : spec_(std::move(spec)), hub_netns_(hub_netns_name(spec_.name)) {}

Emulator::~Emulator() {
  (void)destroy();
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

Result<std::unique_ptr<Emulator>> Emulator::create(EmuSpec spec) {
  if (!valid_emu_name(spec.name)) {
    return make_error(StatusCode::kInvalidArgument, "emulator name '{}' must be 1-16 of [A-Za-z0-9_]", spec.name);
  }
  if (spec.peers.empty() || spec.peers.size() > 250) {
    return make_error(StatusCode::kInvalidArgument, "need 1-250 peers, got {}", spec.peers.size());
  }
  std::set<std::string> names;
  for (const auto& p : spec.peers) {
    if (!valid_peer_name(p.name)) {
      return make_error(StatusCode::kInvalidArgument, "peer name '{}' must be 1-12 of [a-z0-9_], not 'hub'", p.name);
    }
    if (!names.insert(p.name).second) {
      return make_error(StatusCode::kInvalidArgument, "peer '{}' given twice", p.name);
    }
  }
  if (spec.mtu < 576 || spec.mtu > 65535) {
    return make_error(StatusCode::kInvalidArgument, "mtu {} out of range [576, 65535]", spec.mtu);
  }
  std::unique_ptr<Emulator> e(new Emulator(std::move(spec)));
  e->stop_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (e->stop_fd_ < 0) return make_error(StatusCode::kIoError, "eventfd: {}", std::strerror(errno));
  Status st = e->setup();
  if (!st.is_ok()) {
    (void)e->destroy();
    return st;
  }
  return e;
}

Status Emulator::setup() {
  if (netns_exists(hub_netns_)) {
    return make_error(StatusCode::kInvalidArgument, "namespace {} already exists", hub_netns_);
  }
  MOESH_RETURN_IF_ERROR(add_netns(hub_netns_));
  created_ns_.push_back(hub_netns_);
  MOESH_RETURN_IF_ERROR(run_ip({"-n", hub_netns_, "link", "set", "lo", "up"}));
  MOESH_RETURN_IF_ERROR(write_sysctl(hub_netns_, "net/ipv4/ip_forward", "1"));
  const std::string mtu = std::to_string(spec_.mtu), qlen = std::to_string(spec_.txqueuelen);
  const std::string ssai = std::to_string(spec_.slow_start_after_idle);
  MOESH_RETURN_IF_ERROR(write_sysctl(hub_netns_, "net/ipv4/tcp_slow_start_after_idle", ssai));

  for (size_t i = 0; i < spec_.peers.size(); ++i) {
    const PeerSpec& ps = spec_.peers[i];
    const int idx = static_cast<int>(i) + 1;
    EmuPeer p;
    p.name = ps.name;
    p.netns = peer_netns_name(spec_.name, ps.name);
    p.hub_if = "wan" + std::to_string(idx);
    p.peer_if = "wan0";
    const std::string net = "10.77." + std::to_string(idx) + ".";
    p.hub_addr = net + "1";
    p.peer_addr = net + "2";
    p.link = ps.link;
    if (netns_exists(p.netns)) return make_error(StatusCode::kInvalidArgument, "namespace {} already exists", p.netns);
    MOESH_RETURN_IF_ERROR(add_netns(p.netns));
    created_ns_.push_back(p.netns);
    MOESH_RETURN_IF_ERROR(run_ip({"-n", p.netns, "link", "set", "lo", "up"}));
    MOESH_RETURN_IF_ERROR(write_sysctl(p.netns, "net/ipv4/tcp_slow_start_after_idle", ssai));

    auto hub_fd = open_tun(hub_netns_, p.hub_if);
    if (!hub_fd) return hub_fd.status();
    hub_fds_.push_back(*hub_fd);
    auto peer_fd = open_tun(p.netns, p.peer_if);
    if (!peer_fd) return peer_fd.status();
    peer_fds_.push_back(*peer_fd);

    MOESH_RETURN_IF_ERROR(run_ip({"-n", hub_netns_, "addr", "add", p.hub_addr + "/30", "dev", p.hub_if}));
    MOESH_RETURN_IF_ERROR(
        run_ip({"-n", hub_netns_, "link", "set", "dev", p.hub_if, "mtu", mtu, "txqueuelen", qlen, "up"}));
    MOESH_RETURN_IF_ERROR(run_ip({"-n", p.netns, "addr", "add", p.peer_addr + "/30", "dev", p.peer_if}));
    MOESH_RETURN_IF_ERROR(
        run_ip({"-n", p.netns, "link", "set", "dev", p.peer_if, "mtu", mtu, "txqueuelen", qlen, "up"}));
    MOESH_RETURN_IF_ERROR(run_ip({"-n", p.netns, "route", "add", "10.77.0.0/16", "via", p.hub_addr, "dev", p.peer_if}));
    peers_.push_back(std::move(p));
  }

  // Two directions per peer, each with its own draws.
  dirs_.reserve(2 * peers_.size());
  for (size_t i = 0; i < peers_.size(); ++i) {
    for (int d = 0; d < 2; ++d) {
      LinkSpec l = peers_[i].link;
      l.seed = spec_.seed * 1000003u + 2 * i + static_cast<uint64_t>(d);
      Direction dir(l);
      dir.in_fd = d == 0 ? hub_fds_[i] : peer_fds_[i];
      dir.out_fd = d == 0 ? peer_fds_[i] : hub_fds_[i];
      dirs_.push_back(std::move(dir));
    }
  }
  return Status::ok();
}

void Emulator::stop() {
  const uint64_t one = 1;
  if (stop_fd_ >= 0) (void)!::write(stop_fd_, &one, sizeof(one));
}

Status Emulator::run() {
  // Release times are met to within the timer slack: ask for 1 us instead of the default 50 us.
  (void)::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  // pfds[0] is the stop eventfd; pfds[1 + k] reads dirs_[k].in_fd.
  std::vector<pollfd> pfds(1 + dirs_.size());
  pfds[0] = pollfd{stop_fd_, POLLIN, 0};
  for (size_t k = 0; k < dirs_.size(); ++k) pfds[1 + k] = pollfd{dirs_[k].in_fd, POLLIN, 0};
  std::vector<uint8_t> buf(kMaxPacket);
  std::vector<uint8_t> out;
  while (true) {
    // 1. Send what is due; find the next release.
    TimePoint now = Clock::now();
    std::optional<TimePoint> next;
    for (auto& d : dirs_) {
      while (d.line.pop_due(now, &out)) {
        const ssize_t n = ::write(d.out_fd, out.data(), out.size());
        if (n != static_cast<ssize_t>(out.size())) ++d.write_errors;
      }
      if (auto r = d.line.next_release(); r && (!next || *r < *next)) next = r;
    }
    // 2. Wait for a packet, the next release, or stop.
    timespec ts{0, 200'000'000};
    if (next) {
      const auto left = std::max<Nanos>(Nanos(0), std::chrono::duration_cast<Nanos>(*next - Clock::now()));
      ts.tv_sec = static_cast<time_t>(left.count() / 1'000'000'000);
      ts.tv_nsec = static_cast<long>(left.count() % 1'000'000'000);
    }
    const int r = ::ppoll(pfds.data(), pfds.size(), &ts, nullptr);
    if (r < 0) {
      if (errno == EINTR) continue;
      return make_error(StatusCode::kIoError, "ppoll: {}", std::strerror(errno));
    }
    if (r == 0) continue;
    if (pfds[0].revents & POLLIN) return Status::ok();
    // 3. Take in what arrived, stamped when read.
    for (size_t k = 0; k < dirs_.size(); ++k) {
      const short ev = pfds[1 + k].revents;
      if (ev == 0) continue;
      Direction& d = dirs_[k];
      if (ev & (POLLERR | POLLHUP | POLLNVAL)) {
        return make_error(StatusCode::kUnavailable, "TUN of peer '{}' failed", peers_[k / 2].name);
      }
      for (int b = 0; b < kReadBatch; ++b) {
        const ssize_t n = ::read(d.in_fd, buf.data(), buf.size());
        if (n > 0) {
          d.line.push(std::vector<uint8_t>(buf.begin(), buf.begin() + n), Clock::now());
          continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
        return make_error(StatusCode::kUnavailable, "reading the TUN of peer '{}': {}", peers_[k / 2].name,
                          n == 0 ? "end of file" : std::strerror(errno));
      }
    }
  }
}

Status Emulator::destroy() {
  if (destroyed_) return Status::ok();
  destroyed_ = true;
  for (int fd : hub_fds_) ::close(fd);
  for (int fd : peer_fds_) ::close(fd);
  hub_fds_.clear();
  peer_fds_.clear();
  for (auto& d : dirs_) d.in_fd = d.out_fd = -1;
  Status first;
  for (auto it = created_ns_.rbegin(); it != created_ns_.rend(); ++it) {
    if (!netns_exists(*it)) continue;  // `down` from another process got there first
    Status st = del_netns(*it);
    if (!st.is_ok() && first.is_ok()) first = st;
  }
  created_ns_.clear();
  return first;
}

EmuDirectionStats Emulator::stats(size_t peer, int direction) const {
  const Direction& d = dirs_.at(2 * peer + static_cast<size_t>(direction));
  return EmuDirectionStats{d.line.stats(), d.write_errors};
}

}  // namespace moesh::wan
