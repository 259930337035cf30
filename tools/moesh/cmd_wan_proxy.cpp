// `moesh wan-proxy`: a TCP proxy that delays each direction, the unprivileged WAN stand-in
// (docs/wan-proxy.md).
#include <csignal>
#include <cstdio>
#include <string>

#include "command.h"
#include "moesh/wan/host_tcp.h"
#include "moesh/wan/proxy.h"
#include "moesh/wan/spec.h"

namespace moesh::cli {
namespace {

struct WanProxyArgs {
  std::string listen = "127.0.0.1:0";
  std::string to;
  double delay_ms = 0;
  double jitter_ms = 0;
  double rate_mbit = 0;
  size_t queue_kib = 4096;
  std::string congestion = "cubic";
};

wan::TcpProxy* g_proxy = nullptr;

extern "C" void on_proxy_signal(int) {
  if (g_proxy != nullptr) g_proxy->request_stop();
}

int usage(const std::string& msg) {
  std::fprintf(stderr, "moesh wan-proxy: %s\n", msg.c_str());
  return 2;
}

int run_wan_proxy(const WanProxyArgs& a) {
  auto listen = wan::parse_host_port(a.listen);
  if (!listen) return usage("--listen: " + listen.status().message());
  auto to = wan::parse_host_port(a.to);
  if (!to || to->second == 0) return usage("--to: '" + a.to + "' is not HOST:PORT (port 1-65535)");
  if (a.delay_ms < 0 || a.jitter_ms < 0 || a.rate_mbit < 0) return usage("delays and rates must be >= 0");
  if (a.queue_kib == 0) return usage("--queue-kib must be positive");

  wan::ProxyOptions o;
  o.listen_host = listen->first;
  o.listen_port = listen->second;
  o.target_host = to->first;
  o.target_port = to->second;
  wan::LinkSpec l;
  l.delay = wan::Nanos(static_cast<int64_t>(a.delay_ms * 1e6));
  l.jitter = wan::Nanos(static_cast<int64_t>(a.jitter_ms * 1e6));
  l.rate_bps = a.rate_mbit * 1e6;
  o.to_target = l;
  o.to_client = l;
  o.queue_bytes = a.queue_kib << 10;
  o.socket.congestion = a.congestion;

  std::signal(SIGPIPE, SIG_IGN);
  auto proxy = wan::TcpProxy::start(o);
  if (!proxy) {
    std::fprintf(stderr, "moesh wan-proxy: error: %s\n", proxy.status().to_string().c_str());
    return 1;
  }
  for (const auto& w : wan::check_host_tcp_settings(a.congestion)) {
    std::fprintf(stderr, "moesh wan-proxy: warning: %s\n", w.c_str());
  }
  std::printf("each direction: %s\n", wan::describe_link((*proxy)->options().to_target).c_str());
  std::printf("forwarding to %s:%u\n", o.target_host.c_str(), static_cast<unsigned>(o.target_port));
  std::printf("listening on %s:%u\n", o.listen_host.c_str(), static_cast<unsigned>((*proxy)->port()));
  std::fflush(stdout);

  g_proxy = proxy->get();
  struct sigaction sa = {};
  sa.sa_handler = on_proxy_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  (*proxy)->wait();
  (*proxy)->stop();
  g_proxy = nullptr;
  const auto& st = (*proxy)->stats();
  std::printf(
      "wan-proxy stopped: %llu connections (%llu target connects failed), %llu bytes to the target, %llu to "
      "clients\n",
      static_cast<unsigned long long>(st.connections.load()),
      static_cast<unsigned long long>(st.connect_failures.load()),
      static_cast<unsigned long long>(st.bytes_to_target.load()),
      static_cast<unsigned long long>(st.bytes_to_client.load()));
  std::fflush(stdout);
  return 0;
}

const CommandRegistrar kRegisterWanProxy{
    Command{"wan-proxy", "Delay each direction of TCP connections to a target (unprivileged WAN stand-in)",
            [](CLI::App* sub) -> std::function<int()> {
              auto a = std::make_shared<WanProxyArgs>();
              sub->add_option("--listen", a->listen, "HOST:PORT to accept clients on (port 0: any free port)");
              sub->add_option("--to", a->to, "HOST:PORT of the target every client is connected to")->required();
              sub->add_option("--delay-ms", a->delay_ms, "One-way delay added to each direction, ms")
                  ->required()
                  ->check(CLI::NonNegativeNumber);
              sub->add_option("--jitter-ms", a->jitter_ms, "Extra delay, uniform in [0, J] ms; never reorders")
                  ->check(CLI::NonNegativeNumber);
              sub->add_option("--rate-mbit", a->rate_mbit, "Rate cap per direction, Mbit/s (0: none)")
                  ->check(CLI::NonNegativeNumber);
              sub->add_option("--queue-kib", a->queue_kib,
                              "Bytes one direction may hold before it stops reading (backpressure), KiB");
              sub->add_option("--congestion", a->congestion, "TCP congestion control of both sides (\"\": default)");
              return [a] { return run_wan_proxy(*a); };
            }}};

}  // namespace
}  // namespace moesh::cli
