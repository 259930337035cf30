// `moesh wan-emu` end to end (root only; label slow): a hub and two peers 20 ms and 5 ms away,
// TCP round trips hub <-> each peer and peer <-> peer through the kernel's own TCP, the sysctls
// set inside the namespaces, stale-namespace clean-up, and `down` removing everything. Timing is
// asserted only as a lower bound (each round trip crosses the one-way delay twice).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <sstream>

#include "dist/dist_util.h"
#include "moesh/wan/emulator.h"
#include "moesh/wan/netns.h"
#include "util/run_moesh.h"
#include "wan/wan_test_util.h"

namespace moesh::wan {
namespace {

using namespace std::chrono_literals;

std::string skip_reason() {
  if (::geteuid() != 0) return "needs root (network namespaces and TUN devices); CI runs it as root";
  if (!std::filesystem::exists("/dev/net/tun")) return "/dev/net/tun is missing";
  if (!run_program({"ip", "-V"}).is_ok()) return "iproute2's `ip` is not installed";
  // Root in a container may still lack CAP_SYS_ADMIN: try one namespace before relying on it.
  const std::string probe = "moesh-probe-" + std::to_string(::getpid());
  if (!run_program({"ip", "netns", "add", probe}).is_ok()) return "this root cannot create network namespaces";
  (void)run_program({"ip", "netns", "del", probe});
  return "";
}

// "peer a netns=moesh-x-a hub_addr=10.77.1.1 peer_addr=10.77.1.2 ..." -> key/value map.
std::map<std::string, std::string> parse_peer_line(const std::string& line) {
  std::map<std::string, std::string> kv;
  std::istringstream in(line);
  std::string w;
  in >> w >> kv["name"];
  while (in >> w) {
    const size_t eq = w.find('=');
    if (eq != std::string::npos) kv[w.substr(0, eq)] = w.substr(eq + 1);
  }
  return kv;
}

// A listener created inside `netns` (it stays there after the thread leaves).
std::unique_ptr<net::TcpListener> listen_in(const std::string& netns, const std::string& addr) {
  auto in = ScopedNetns::enter(netns);
  EXPECT_TRUE(in.is_ok()) << in.status().to_string();
  if (!in) return nullptr;
  auto l = net::TcpListener::listen(addr, 0, {});
  EXPECT_TRUE(l.is_ok()) << l.status().to_string();
  return l.is_ok() ? std::move(*l) : nullptr;
}

// The smallest of `n` TCP round trips (64 bytes each way) from `netns` to addr:port, in ms; -1 on
// failure.
double min_rtt_ms(const std::string& netns, const std::string& addr, uint16_t port, int n) {
  auto in = ScopedNetns::enter(netns);
  EXPECT_TRUE(in.is_ok()) << in.status().to_string();
  if (!in) return -1;
  auto s = net::tcp_connect(addr, port, {}, net::deadline_in(5s));
  EXPECT_TRUE(s.is_ok()) << netns << " -> " << addr << ": " << s.status().to_string();
  if (!s) return -1;
  double best = 1e9;
  std::vector<uint8_t> msg(64, 7), buf(64);
  for (int i = 0; i < n; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!(*s)->write_all(msg, net::deadline_in(5s)).is_ok()) return -1;
    size_t got = 0;
    while (got < buf.size()) {
      auto r = (*s)->read_some({buf.data() + got, buf.size() - got}, net::deadline_in(5s));
      if (!r) {
        ADD_FAILURE() << r.status().to_string();
        return -1;
      }
      got += *r;
    }
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Reads `wan-emu up`'s peer lines until "ready".
void wait_ready(testing::MoeshChild* up, std::vector<std::map<std::string, std::string>>* peers) {
  ASSERT_TRUE(up->started());
  std::string line;
  while (up->read_line(&line, 15s) && line != "ready") {
    if (line.rfind("peer ", 0) == 0) peers->push_back(parse_peer_line(line));
  }
  ASSERT_EQ(line, "ready") << up->output();
}

TEST(WanEmu, HubAndTwoPeersWithTheirOwnDelays) {
  if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const std::string name = "t" + std::to_string(::getpid());
  // A namespace left over by a killed run of this name: `up` must remove it.
  ASSERT_TRUE(add_netns("moesh-" + name + "-stale").is_ok());

  testing::MoeshChild up({"wan-emu", "up", "--name", name, "--peer", "a:delay=20ms", "--peer", "b:delay=5ms"});
  std::vector<std::map<std::string, std::string>> peers;
  ASSERT_NO_FATAL_FAILURE(wait_ready(&up, &peers));
  EXPECT_NE(up.output().find("removed stale namespace moesh-" + name + "-stale"), std::string::npos) << up.output();
  ASSERT_EQ(peers.size(), 2u) << up.output();
  const std::string hub = hub_netns_name(name);
  EXPECT_EQ(peers[0]["netns"], "moesh-" + name + "-a");
  EXPECT_EQ(peers[0]["hub_addr"], "10.77.1.1");
  EXPECT_EQ(peers[0]["peer_addr"], "10.77.1.2");
  EXPECT_EQ(peers[1]["peer_addr"], "10.77.2.2");
  EXPECT_EQ(emu_namespaces(name).size(), 3u);
  for (const std::string& ns : {hub, peers[0]["netns"], peers[1]["netns"]}) {
    auto v = read_sysctl(ns, "net/ipv4/tcp_slow_start_after_idle");
    ASSERT_TRUE(v.is_ok()) << v.status().to_string();
    EXPECT_EQ(*v, "0") << ns;
  }

  const double one_way_ms[2] = {20, 5};
  std::vector<std::unique_ptr<testing::EchoServer>> servers;
  for (auto& p : peers) {
    auto l = listen_in(p["netns"], p["peer_addr"]);
    ASSERT_TRUE(l);
    servers.push_back(std::make_unique<testing::EchoServer>(std::move(l)));
  }
  for (size_t i = 0; i < peers.size(); ++i) {
    const double rtt = min_rtt_ms(hub, peers[i]["peer_addr"], servers[i]->port(), 5);
    EXPECT_GE(rtt, 2 * one_way_ms[i]) << "hub <-> " << peers[i]["name"];
    std::printf("hub <-> %s: min TCP round trip %.2f ms (one-way delay %.0f ms)\n", peers[i]["name"].c_str(), rtt,
                one_way_ms[i]);
  }
  // a -> b crosses both links, through the hub.
  const double ab = min_rtt_ms(peers[0]["netns"], peers[1]["peer_addr"], servers[1]->port(), 3);
  EXPECT_GE(ab, 2 * (one_way_ms[0] + one_way_ms[1]));
  std::printf("a <-> b: min TCP round trip %.2f ms\n", ab);
  servers.clear();

  const auto down = test::run_moesh("wan-emu down --name " + name);
  EXPECT_EQ(down.exit_code, 0) << down.out << down.err;
  up.drain(10s);
  EXPECT_EQ(up.wait_exit(10s), 0) << up.output();
  EXPECT_NE(up.output().find("peer a hub->peer: "), std::string::npos) << up.output();
  EXPECT_TRUE(emu_namespaces(name).empty());
  for (const auto& ns : list_netns()) EXPECT_EQ(ns.rfind("moesh-" + name + "-", 0), std::string::npos) << ns;
  EXPECT_FALSE(std::filesystem::exists(emu_pidfile(name)));
}

TEST(WanEmu, SigtermCleansUpAndASecondUpIsRefused) {
  if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const std::string name = "s" + std::to_string(::getpid());
  testing::MoeshChild up({"wan-emu", "up", "--name", name, "--peer", "w:delay=1ms,rate=100mbit,loss=0%"});
  ASSERT_TRUE(up.started());
  std::string line;
  ASSERT_TRUE(up.read_until("ready", &line, 15s)) << up.output();
  const auto again = test::run_moesh("wan-emu up --name " + name + " --peer x");
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.err.find("already up"), std::string::npos) << again.err;
  ::kill(up.pid(), SIGTERM);
  up.drain(10s);
  EXPECT_EQ(up.wait_exit(10s), 0) << up.output();
  EXPECT_TRUE(emu_namespaces(name).empty());
  // Nothing left: `down` has nothing to do and says so with success.
  EXPECT_EQ(test::run_moesh("wan-emu down --name " + name).exit_code, 0);
}

// Counts, for a local run of the same tokens, the trips the placement predicts: one per MoE layer
// call, one DISPATCH per worker owning at least one of the call's experts.
struct TripCounter final : ForwardObserver {
  int split = 0;  // experts < split: worker 0, else worker 1
  uint64_t calls = 0, dispatches = 0;
  void on_routing(int, int64_t n_tokens, int k, const int32_t* ids, const float*) override {
    bool w[2] = {false, false};
    for (int64_t i = 0; i < n_tokens * k; ++i) w[ids[i] < split ? 0 : 1] = true;
    ++calls;
    dispatches += uint64_t(w[0]) + uint64_t(w[1]);
  }
};

TEST(WanEmu, SwarmRoundTripsOverTheEmulatedWanAreWhatThePlacementPredicts) {
  if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const std::string name = "d" + std::to_string(::getpid());
  testing::MoeshChild up({"wan-emu", "up", "--name", name, "--peer", "a:delay=20ms", "--peer", "b:delay=20ms"});
  std::vector<std::map<std::string, std::string>> peers;
  ASSERT_NO_FATAL_FAILURE(wait_ready(&up, &peers));
  std::string line;
  ASSERT_EQ(peers.size(), 2u);

  const std::string model_path = test::made_qwen3moe();  // 16 experts, top-4
  auto model = Model::load(model_path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const int n_expert = static_cast<int>((*model)->hparams().n_expert);
  // Worker a holds the lower half of every layer's experts, b the upper half.
  std::vector<std::unique_ptr<testing::MoeshChild>> workers;
  std::vector<std::string> addrs;
  const std::string specs[2] = {fmt::format("*:0-{}", n_expert / 2 - 1),
                                fmt::format("*:{}-{}", n_expert / 2, n_expert - 1)};
  for (int i = 0; i < 2; ++i) {
    workers.push_back(std::make_unique<testing::MoeshChild>(
        std::vector<std::string>{"worker", "-m", model_path, "--experts", specs[i], "--listen",
                                 peers[i]["peer_addr"] + ":0", "-t", "1"},
        peers[i]["netns"]));
    std::string l;
    while (workers.back()->read_line(&l, 30s) && l.rfind("listening on ", 0) != 0) {
    }
    ASSERT_EQ(l.rfind("listening on ", 0), 0u) << workers.back()->output();
    addrs.push_back(l.substr(std::string("listening on ").size()));
  }

  // Local reference: the tokens, and the trips the placement predicts for them.
  const std::vector<int32_t> prompt = {5, 17, 99, 3, 42, 8};
  constexpr int kN = 4;
  TripCounter trips;
  trips.split = n_expert / 2;
  std::vector<int32_t> want;
  {
    Context ctx(**model, ContextParams{1, 64, nullptr});
    ctx.set_observer(&trips);
    const int64_t V = (*model)->hparams().n_vocab;
    std::vector<float> lg(static_cast<size_t>(V));
    ASSERT_TRUE(ctx.decode(0, prompt.data(), static_cast<int64_t>(prompt.size()), lg.data(), false).is_ok());
    while (static_cast<int>(want.size()) < kN) {
      want.push_back(argmax(lg.data(), V));
      if (static_cast<int>(want.size()) == kN) break;
      ASSERT_TRUE(ctx.decode(0, &want.back(), 1, lg.data(), false).is_ok());
    }
  }
  std::string toks;
  for (int32_t t : prompt) toks += (toks.empty() ? "" : ",") + std::to_string(t);
  testing::MoeshChild run({"run", "-m", model_path, "--tokens", toks, "-n", std::to_string(kN), "-t", "1", "--json",
                           "--worker", addrs[0], "--worker", addrs[1]},
                          hub_netns_name(name));
  ASSERT_TRUE(run.started());
  std::string json_line;
  while (run.read_line(&line, 120s)) {
    if (!line.empty() && line[0] == '{') json_line = line;
  }
  ASSERT_EQ(run.wait_exit(30s), 0) << run.output();
  const auto j = nlohmann::json::parse(json_line, nullptr, false);
  ASSERT_TRUE(j.is_object()) << json_line;
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), want) << "exact dispatch over the WAN changed the tokens";
  const auto& r = j["remote"];
  // Structure, not time: one star trip per MoE layer per forward pass, one DISPATCH per worker
  // the layer's routing needs, and every DISPATCH of a layer in flight together.
  EXPECT_EQ(r["layer_calls"].get<uint64_t>(), trips.calls);
  EXPECT_EQ(r["dispatch_frames"].get<uint64_t>(), trips.dispatches);
  EXPECT_EQ(r["combine_frames"].get<uint64_t>(), trips.dispatches);
  EXPECT_EQ(r["max_in_flight"].get<uint64_t>(), 2u);
  EXPECT_EQ(r["local_pairs"].get<uint64_t>(), 0u);
  std::printf("over 40 ms RTT: %llu layer calls, %llu DISPATCHes for %d tokens\n",
              static_cast<unsigned long long>(trips.calls), static_cast<unsigned long long>(trips.dispatches), kN);

  workers.clear();
  const auto down = test::run_moesh("wan-emu down --name " + name);
  EXPECT_EQ(down.exit_code, 0) << down.out << down.err;
  up.drain(10s);
  EXPECT_EQ(up.wait_exit(10s), 0) << up.output();
  EXPECT_TRUE(emu_namespaces(name).empty());
}

// `moesh swarm plan` carried out over the emulated WAN: three peers (one big, two small) at 20 ms;
// the plan mixes roles (an expert peer, two spans); its processes run in the peer namespaces and
// the backbone in the hub's. The run has the all-local tokens and exactly the predicted trips.
TEST(WanEmu, APlanCarriedOutOverTheEmulatedWanHasThePredictedTrips) {
  if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const std::string name = "p" + std::to_string(::getpid());
  testing::MoeshChild up(
      {"wan-emu", "up", "--name", name, "--peer", "a:delay=10ms", "--peer", "b:delay=10ms", "--peer", "c:delay=15ms"});
  std::vector<std::map<std::string, std::string>> peers;
  ASSERT_NO_FATAL_FAILURE(wait_ready(&up, &peers));
  ASSERT_EQ(peers.size(), 3u);
  MakeModelSpec spec = MakeModelSpec::defaults_for(MakeArch::kQwen3Moe);
  spec.type = MakeFileType::kQ8_0;
  spec.seed = 13;
  spec.n_layer = 8;
  spec.n_ctx = 256;
  const std::string model = test::made_model("qwen3moe-l8-emu-plan", spec);
  const uint64_t bytes = std::filesystem::file_size(model);
  const int pct[3] = {55, 30, 30};
  const int rtt[3] = {20, 20, 30};
  std::string plan_args = "swarm plan -m '" + model + "' -c 256 --message-us 100 --json";
  for (int i = 0; i < 3; ++i)
    plan_args += fmt::format(" --peer {}:mem={},rtt={}ms,addr={}:7001", peers[static_cast<size_t>(i)]["name"],
                             bytes * pct[i] / 100, rtt[i], peers[static_cast<size_t>(i)]["peer_addr"]);
  const auto pr = test::run_moesh(plan_args);
  ASSERT_EQ(pr.exit_code, 0) << pr.err;
  const auto plan = nlohmann::json::parse(pr.out, nullptr, false);
  ASSERT_TRUE(plan.is_object()) << pr.out;
  std::vector<std::unique_ptr<testing::MoeshChild>> procs;
  std::vector<std::string> backbone = {"run", "-m", model, "--tokens", "5,6,7,8", "-n", "5", "-t", "1", "--json"};
  int roles = 0;
  for (size_t i = 0; i < 3; ++i) {
    const auto& r = plan["roles"][i];
    const std::string role = r["role"], addr = r["addr"];
    std::vector<std::string> args;
    if (role == "span") {
      args = {"span", "-m", model, "--layers", r["layers"], "--listen", addr, "-t", "1", "-c", "256"};
      backbone.insert(backbone.end(), {"--span", std::string(r["layers"]) + "@" + addr});
    } else if (role == "experts") {
      args = {"worker", "-m", model, "--experts", r["experts"], "--listen", addr, "-t", "1"};
      backbone.insert(backbone.end(), {"--worker", addr});
    } else {
      continue;
    }
    ++roles;
    procs.push_back(std::make_unique<testing::MoeshChild>(args, peers[i]["netns"]));
    std::string l;
    while (procs.back()->read_line(&l, 30s) && l.rfind("listening on ", 0) != 0) {
    }
    ASSERT_EQ(l.rfind("listening on ", 0), 0u) << procs.back()->output();
  }
  EXPECT_EQ(roles, 3) << plan.dump();
  const auto local = test::run_moesh("run -m '" + model + "' --tokens 5,6,7,8 -n 5 -t 1 --json");
  ASSERT_EQ(local.exit_code, 0) << local.err;
  testing::MoeshChild run(backbone, hub_netns_name(name));
  ASSERT_TRUE(run.started());
  std::string line, json_line;
  while (run.read_line(&line, 120s))
    if (!line.empty() && line[0] == '{') json_line = line;
  ASSERT_EQ(run.wait_exit(30s), 0) << run.output();
  const auto j = nlohmann::json::parse(json_line, nullptr, false);
  ASSERT_TRUE(j.is_object()) << json_line;
  EXPECT_EQ(j["tokens"], nlohmann::json::parse(local.out)["tokens"]);
  uint64_t trips = 0;
  if (j.contains("spans")) trips += j["spans"]["trips"].get<uint64_t>();
  if (j.contains("remote")) trips += j["remote"]["layer_calls"].get<uint64_t>();
  EXPECT_EQ(static_cast<double>(trips), plan["trips_per_step"].get<double>() * 5) << plan.dump() << j.dump();

  procs.clear();
  const auto down = test::run_moesh("wan-emu down --name " + name);
  EXPECT_EQ(down.exit_code, 0) << down.out << down.err;
  up.drain(10s);
  EXPECT_EQ(up.wait_exit(10s), 0) << up.output();
  EXPECT_TRUE(emu_namespaces(name).empty());
}

}  // namespace
}  // namespace moesh::wan
