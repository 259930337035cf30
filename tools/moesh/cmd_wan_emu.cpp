// `moesh wan-emu up|down`: a packet-level WAN between network namespaces on one machine
// (docs/wan-emu.md). Needs root.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "command.h"
#include "moesh/wan/emulator.h"
#include "moesh/wan/spec.h"

namespace moesh::cli {
namespace {

struct WanEmuArgs {
  std::string name;
  std::vector<std::string> peers;
  uint64_t seed = 1;
  int mtu = 1500;
  int slow_start_after_idle = 0;
  double down_timeout_s = 10;
};

std::atomic<bool> g_stop{false};
wan::Emulator* g_emu = nullptr;

extern "C" void on_emu_signal(int) {
  g_stop.store(true);
  if (g_emu != nullptr) g_emu->stop();
}

int fail(const char* verb, const Status& s) {
  std::fprintf(stderr, "moesh wan-emu %s: error: %s\n", verb, s.to_string().c_str());
  return 1;
}

bool require_root(const char* verb) {
  if (::geteuid() == 0) return true;
  std::fprintf(stderr,
               "moesh wan-emu %s: needs root: it creates network namespaces and TUN devices (CAP_SYS_ADMIN, "
               "CAP_NET_ADMIN). Run it as root, or use the unprivileged `moesh wan-proxy` (a delaying TCP proxy; "
               "docs/wan-proxy.md).\n",
               verb);
  return false;
}

// The pid in the emulator's pidfile if that process is alive and is moesh, else 0.
pid_t live_owner(const std::string& name) {
  std::ifstream f(wan::emu_pidfile(name));
  long pid = 0;
  if (!(f >> pid) || pid <= 0) return 0;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return 0;
  // "pid (comm) S ...": a zombie has already exited.
  const size_t close = line.rfind(')');
  if (close == std::string::npos || line.find("(moesh)") == std::string::npos) return 0;
  if (close + 2 < line.size() && line[close + 2] == 'Z') return 0;
  return static_cast<pid_t>(pid);
}

Status write_pidfile(const std::string& name) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(wan::emu_pidfile(name)).parent_path(), ec);
  std::ofstream f(wan::emu_pidfile(name), std::ios::trunc);
  if (!(f << ::getpid() << "\n")) {
    return make_error(StatusCode::kIoError, "cannot write {}", wan::emu_pidfile(name));
  }
  return Status::ok();
}

void install_signals() {
  struct sigaction sa = {};
  sa.sa_handler = on_emu_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
}

void print_stats(const wan::Emulator& e) {
  for (size_t i = 0; i < e.peers().size(); ++i) {
    for (int d = 0; d < 2; ++d) {
      const auto s = e.stats(i, d);
      std::printf("peer %s %s: %llu packets (%llu bytes), dropped %llu lost + %llu queue-full + %llu overflow\n",
                  e.peers()[i].name.c_str(), d == 0 ? "hub->peer" : "peer->hub",
                  static_cast<unsigned long long>(s.line.released),
                  static_cast<unsigned long long>(s.line.released_bytes), static_cast<unsigned long long>(s.line.lost),
                  static_cast<unsigned long long>(s.line.queue_full), static_cast<unsigned long long>(s.line.overflow));
    }
  }
}

int run_up(const WanEmuArgs& a) {
  if (!wan::valid_emu_name(a.name)) {
    std::fprintf(stderr, "moesh wan-emu up: --name '%s' must be 1-16 of [A-Za-z0-9_]\n", a.name.c_str());
    return 2;
  }
  wan::EmuSpec spec;
  spec.name = a.name;
  spec.seed = a.seed;
  spec.mtu = a.mtu;
  spec.slow_start_after_idle = a.slow_start_after_idle;
  for (const auto& p : a.peers) {
    auto ps = wan::parse_peer_spec(p);
    if (!ps) {
      std::fprintf(stderr, "moesh wan-emu up: %s\n", ps.status().message().c_str());
      return 2;
    }
    for (const auto& q : spec.peers) {
      if (q.name == ps->name) {
        std::fprintf(stderr, "moesh wan-emu up: peer '%s' given twice\n", q.name.c_str());
        return 2;
      }
    }
    spec.peers.push_back(std::move(*ps));
  }
  if (spec.peers.size() > 250) {
    std::fprintf(stderr, "moesh wan-emu up: at most 250 peers\n");
    return 2;
  }
  if (!require_root("up")) return 1;

  if (const pid_t owner = live_owner(a.name); owner != 0 && owner != ::getpid()) {
    std::fprintf(stderr, "moesh wan-emu up: '%s' is already up (pid %d); `moesh wan-emu down --name %s` first\n",
                 a.name.c_str(), static_cast<int>(owner), a.name.c_str());
    return 1;
  }
  install_signals();
  // A previous run that was killed (SIGKILL, a crash) leaves its namespaces: remove them.
  auto stale = wan::remove_emu_namespaces(a.name);
  if (!stale) return fail("up", stale.status());
  for (const auto& n : *stale) std::printf("removed stale namespace %s\n", n.c_str());
  if (Status st = write_pidfile(a.name); !st.is_ok()) return fail("up", st);
  auto cleanup_pidfile = [&] { std::remove(wan::emu_pidfile(a.name).c_str()); };

  auto emu = wan::Emulator::create(spec);
  if (!emu) {
    cleanup_pidfile();
    return fail("up", emu.status());
  }
  g_emu = emu->get();
  if (g_stop.load()) g_emu->stop();  // a signal during set-up

  const wan::Emulator& e = **emu;
  std::printf("wan-emu %s: hub namespace %s\n", a.name.c_str(), e.hub_netns().c_str());
  for (const auto& p : e.peers()) {
    std::printf("peer %s netns=%s hub_addr=%s peer_addr=%s hub_if=%s peer_if=%s (%s)\n", p.name.c_str(),
                p.netns.c_str(), p.hub_addr.c_str(), p.peer_addr.c_str(), p.hub_if.c_str(), p.peer_if.c_str(),
                wan::describe_link(p.link).c_str());
  }
  std::printf("net.ipv4.tcp_slow_start_after_idle=%d in every namespace; the hub forwards between peers\n",
              a.slow_start_after_idle);
  const auto& p0 = e.peers().front();
  std::printf("e.g. ip netns exec %s moesh worker --listen %s:7001 ...   (backbone: ip netns exec %s ...)\n",
              p0.netns.c_str(), p0.peer_addr.c_str(), e.hub_netns().c_str());
  std::printf("stop: Ctrl-C, SIGTERM or `moesh wan-emu down --name %s`\n", a.name.c_str());
  std::printf("ready\n");
  std::fflush(stdout);

  Status run = (*emu)->run();
  g_emu = nullptr;
  Status down = (*emu)->destroy();
  cleanup_pidfile();
  print_stats(e);
  std::printf("wan-emu %s: namespaces removed\n", a.name.c_str());
  std::fflush(stdout);
  if (!run.is_ok()) return fail("up", run);
  if (!down.is_ok()) return fail("up", down);
  return 0;
}

int run_down(const WanEmuArgs& a) {
  if (!wan::valid_emu_name(a.name)) {
    std::fprintf(stderr, "moesh wan-emu down: --name '%s' must be 1-16 of [A-Za-z0-9_]\n", a.name.c_str());
    return 2;
  }
  if (!require_root("down")) return 1;
  if (const pid_t owner = live_owner(a.name); owner != 0) {
    // The running `up` removes its own namespaces when signalled; wait for it.
    ::kill(owner, SIGTERM);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(a.down_timeout_s);
    while (live_owner(a.name) == owner && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (live_owner(a.name) == owner) {
      std::fprintf(stderr, "moesh wan-emu down: pid %d did not stop; removing its namespaces anyway\n",
                   static_cast<int>(owner));
    } else {
      std::printf("stopped wan-emu up (pid %d)\n", static_cast<int>(owner));
    }
  }
  auto removed = wan::remove_emu_namespaces(a.name);
  if (!removed) return fail("down", removed.status());
  for (const auto& n : *removed) std::printf("removed namespace %s\n", n.c_str());
  std::remove(wan::emu_pidfile(a.name).c_str());
  std::printf("wan-emu %s: down\n", a.name.c_str());
  std::fflush(stdout);
  return 0;
}

const CommandRegistrar kRegisterWanEmu{Command{
    "wan-emu", "Packet-level WAN between network namespaces: delay, jitter, rate, loss per peer (root)",
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<WanEmuArgs>();
      sub->require_subcommand(1);
      CLI::App* up = sub->add_subcommand("up", "Create the hub and peer namespaces and forward until signalled");
      up->add_option("--name", a->name, "Emulator name: namespaces moesh-NAME-hub, moesh-NAME-PEER")->required();
      up->add_option("--peer", a->peers,
                     "NAME:delay=40ms,jitter=2ms,rate=100mbit,loss=0.1%,queue=1000 (repeat per peer; each key "
                     "optional, the same model each way)")
          ->required();
      up->add_option("--seed", a->seed, "Seed of the loss and jitter draws");
      up->add_option("--mtu", a->mtu, "MTU of the TUN links");
      up->add_option("--slow-start-after-idle", a->slow_start_after_idle,
                     "net.ipv4.tcp_slow_start_after_idle inside the namespaces (0: keep the window across idle)")
          ->check(CLI::Range(0, 1));
      CLI::App* down = sub->add_subcommand("down", "Stop a running `up` of this name and remove its namespaces");
      down->add_option("--name", a->name, "Emulator name")->required();
      down->add_option("--timeout", a->down_timeout_s, "Seconds to wait for the running `up` to exit");
      return [a, up, down]() -> int {
        if (up->parsed()) return run_up(*a);
        if (down->parsed()) return run_down(*a);
        return 2;
      };
    }}};

}  // namespace
}  // namespace moesh::cli
