// `moesh relay`: lets backbones reach workers that cannot accept connections (docs/relay.md).
#include <csignal>
#include <cstdio>
#include <string>

#include "command.h"
#include "moesh/net/relay.h"
#include "moesh/remote/address.h"

namespace moesh::cli {
namespace {

net::Relay* g_relay = nullptr;

extern "C" void on_relay_signal(int) {
  if (g_relay != nullptr) g_relay->stop();
}

struct RelayArgs {
  std::string listen = "127.0.0.1:0";
  std::string congestion = "cubic";
  int connect_wait_ms = 2000;
  std::string swarm_key;  // --swarm-key FILE
};

int run_relay(const RelayArgs& a) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "moesh relay: error: %s\n", s.to_string().c_str());
    return 1;
  };
  auto where = parse_listen_address(a.listen);
  if (!where) return fail(where.status());
  net::RelayOptions o;
  o.host = where->host;
  o.port = where->port;
  o.tcp.congestion = a.congestion;
  o.connect_wait = std::chrono::milliseconds(a.connect_wait_ms);
  if (!a.swarm_key.empty()) {
    auto key = net::SwarmKey::load(a.swarm_key);
    if (!key) return fail(key.status());
    o.swarm_key = std::move(*key);
  }
  auto relay = net::Relay::start(o);
  if (!relay) return fail(relay.status());
  std::printf(
      "relay: workers join with --join %s:%u (or ws://%s:%u/), backbones name them relay://%s:%u/NAME (or "
      "relay+ws://)\n",
      o.host.c_str(), static_cast<unsigned>((*relay)->port()), o.host.c_str(), static_cast<unsigned>((*relay)->port()),
      o.host.c_str(), static_cast<unsigned>((*relay)->port()));
  if (o.swarm_key)
    std::printf("swarm key: %s (only workers and backbones proving it are registered or spliced)\n",
                o.swarm_key->fingerprint().c_str());
  std::printf("listening on %s:%u\n", o.host.c_str(), static_cast<unsigned>((*relay)->port()));
  std::fflush(stdout);
  g_relay = relay->get();
  struct sigaction sa = {};
  sa.sa_handler = on_relay_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  (*relay)->run();
  g_relay = nullptr;
  const net::RelayStats& st = (*relay)->stats();
  std::printf(
      "relay stopped: %llu registrations, %llu splices, %llu refused, %llu bytes to workers, %llu to backbones\n",
      static_cast<unsigned long long>(st.registrations.load()), static_cast<unsigned long long>(st.splices.load()),
      static_cast<unsigned long long>(st.refused.load()), static_cast<unsigned long long>(st.bytes_to_workers.load()),
      static_cast<unsigned long long>(st.bytes_to_backbones.load()));
  return 0;
}

const CommandRegistrar kRegisterRelay{
    Command{"relay", "Relay between backbones and workers that cannot accept connections",
            [](CLI::App* sub) -> std::function<int()> {
              auto a = std::make_shared<RelayArgs>();
              sub->add_option("--listen", a->listen, "HOST:PORT (port 0: any free port)")->capture_default_str();
              sub->add_option("--connect-wait-ms", a->connect_wait_ms,
                              "How long a backbone's CONNECT waits for the named worker")
                  ->capture_default_str();
              sub->add_option("--congestion", a->congestion, "TCP congestion control")->capture_default_str();
              sub->add_option("--swarm-key", a->swarm_key,
                              "Admit only workers and backbones proving this swarm key (mutual HMAC challenge after "
                              "their ROUTE frame)");
              return [a] { return run_relay(*a); };
            }}};

}  // namespace
}  // namespace moesh::cli
