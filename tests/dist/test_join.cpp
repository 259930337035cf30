// Workers that dial in (`moesh worker --join`, registry.h): real worker processes joining an
// in-process backbone's registry over TCP. Joined workers serve bit-exactly like dialled ones; a
// worker killed mid-run and restarted under its name rejoins in its old place; a worker joining
// mid-run is added to the placement and gets work; joins with the wrong swarm key, or for another
// model, are refused and counted; a joined worker's link is kept alive by its heartbeats.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "dist/dist_util.h"
#include "dist/worker_process.h"
#include "moesh/net/relay.h"
#include "moesh/net/tls.h"
#include "moesh/remote/registry.h"
#include "moesh/swarm/swarm.h"

namespace moesh::test {
namespace {

using std::chrono::milliseconds;

WorkerAddress joined(const std::string& name) {
  WorkerAddress a;
  a.path = WorkerPath::kJoined;
  a.name = name;
  return a;
}

std::shared_ptr<WorkerRegistry> open_registry(const Model& m, const RemoteOptions& o) {
  auto hello = backbone_hello(m, o);
  EXPECT_TRUE(hello.is_ok());
  auto reg = WorkerRegistry::listen(*hello, o.link_options(), RegistryOptions{});
  EXPECT_TRUE(reg.is_ok()) << reg.status().to_string();
  return reg.is_ok() ? *reg : nullptr;
}

Result<std::unique_ptr<WorkerProcess>> spawn_joining(const std::string& model, const std::string& spec,
                                                     const WorkerRegistry& reg, const std::string& name,
                                                     std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--join", "127.0.0.1:" + std::to_string(reg.port()), "--name", name};
  args.insert(args.end(), extra.begin(), extra.end());
  return WorkerProcess::spawn(model, spec, 1, milliseconds(20000), args);
}

// Polls (bounded) until `cond` holds: outcomes, not timings, are asserted.
template <typename F>
bool eventually(F cond, milliseconds limit = milliseconds(20000)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return cond();
}

uint64_t joins_of(const WorkerRegistry& reg, const std::string& name) {
  for (const JoinRecord& r : reg.records())
    if (r.name == name) return r.joins;
  return 0;
}

TEST(Join, JoinedWorkersServeExactlyRejoinUnderTheirNameAndNewOnesAreAdded) {
  const std::string path = made_qwen3moe();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  // A backbone without experts: every pair is computed by a joined worker.
  const std::string bb = temp_dir() + "/qwen3moe-e16-backbone-join.gguf";
  {
    auto f = gguf::File::open(path);
    ASSERT_TRUE(f.is_ok());
    ASSERT_TRUE(swarm::write_backbone_slice(**f, bb).is_ok());
  }
  auto backbone = Model::load(bb);
  ASSERT_TRUE(backbone.is_ok()) << backbone.status().to_string();
  const auto toks = test_tokens("", (*model)->hparams().n_vocab, 12);
  auto local = run_model(**model, toks);
  ASSERT_TRUE(local.is_ok());
  const int64_t V = (*model)->hparams().n_vocab;

  RemoteOptions o;
  o.worker_costs = {0.001, 0.001};  // equal replicas share every step
  o.rejoin_backoff = milliseconds(1);
  o.registry = open_registry(**backbone, o);
  ASSERT_NE(o.registry, nullptr);
  auto a = spawn_joining(path, "*:*", *o.registry, "ja");
  auto b = spawn_joining(path, "*:*", *o.registry, "jb");
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  ASSERT_EQ(o.registry->wait_for(2, net::deadline_in(milliseconds(20000))).size(), 2u);
  auto exec = RemoteExecutor::connect(**backbone, {joined("ja"), joined("jb")}, o);
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  std::shared_ptr<RemoteExecutor> remote(std::move(*exec));
  EXPECT_EQ(remote->worker(0).address.to_string(), "join://ja");

  ContextParams cp;
  cp.n_threads = 1;
  cp.n_ctx = 16;
  cp.executor = remote;
  Context ctx(**backbone, cp);
  std::vector<float> out(toks.size() * static_cast<size_t>(V));
  std::unique_ptr<WorkerProcess> c;
  for (size_t t = 0; t < toks.size(); ++t) {
    Status st = ctx.decode(0, &toks[t], 1, out.data() + t * V);
    ASSERT_TRUE(st.is_ok()) << "token " << t << ": " << st.to_string();
    if (t == 2) (*b)->kill_now();  // the next step fails over to ja
    if (t == 4) {                  // jb comes back under its name
      EXPECT_TRUE(remote->worker_down(1));
      b = spawn_joining(path, "*:*", *o.registry, "jb");
      ASSERT_TRUE(b.is_ok());
      ASSERT_TRUE(eventually([&] { return joins_of(*o.registry, "jb") == 2; }));
    }
    if (t == 7) {  // a new worker joins mid-run
      auto cc = spawn_joining(path, "*:*", *o.registry, "jc");
      ASSERT_TRUE(cc.is_ok());
      c = std::move(*cc);
      ASSERT_TRUE(eventually([&] { return joins_of(*o.registry, "jc") == 1; }));
    }
  }
  EXPECT_EQ(std::memcmp(out.data(), local->data(), out.size() * sizeof(float)), 0)
      << "joined workers, a failover, a rejoin and a new worker: the bits of all-local decoding";
  ASSERT_EQ(remote->n_workers(), 3u);
  const std::vector<WorkerStatus> st = remote->worker_status();
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[1].name, "jb");
  EXPECT_EQ(st[1].state, "up");
  EXPECT_EQ(st[1].rejoins, 1u);
  EXPECT_EQ(st[2].name, "jc");
  EXPECT_EQ(st[2].path, WorkerPath::kJoined);
  EXPECT_GT(st[2].requests, 0u) << "the worker that joined mid-run was given work";
  EXPECT_EQ(remote->traffic().local_pairs, 0u);
  EXPECT_EQ(remote->failover_stats().saved_calls, 1u);
}

TEST(Join, WrongKeyAndOtherModelJoinsAreRefused) {
  const std::string path = made_qwen3moe();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const std::string key = temp_dir() + "/join.key", other = temp_dir() + "/join-other.key";
  {
    std::ofstream(key) << "the swarm's own key, long enough to count\n";
    std::ofstream(other) << "a stranger's key that is also long enough\n";
  }
  RemoteOptions o;
  auto k = net::SwarmKey::load(key);
  ASSERT_TRUE(k.is_ok());
  o.swarm_key = *k;
  o.registry = open_registry(**model, o);
  ASSERT_NE(o.registry, nullptr);
  auto stranger = spawn_joining(path, "*:*", *o.registry, "stranger", {"--swarm-key", other});
  auto keyless = spawn_joining(path, "*:*", *o.registry, "keyless");
  MakeModelSpec s = MakeModelSpec::defaults_for(MakeArch::kQwen3Moe);
  s.seed = 5;
  const std::string another = made_model("qwen3moe-other-join", s);
  auto wrong_model = spawn_joining(another, "*:*", *o.registry, "wrong-model", {"--swarm-key", key});
  auto member = spawn_joining(path, "*:*", *o.registry, "member", {"--swarm-key", key});
  ASSERT_TRUE(stranger.is_ok() && keyless.is_ok() && wrong_model.is_ok() && member.is_ok());
  ASSERT_TRUE(eventually([&] { return o.registry->refused() >= 3 && joins_of(*o.registry, "member") >= 1; }));
  const std::vector<std::string> held = o.registry->held();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0], "member");
  for (const JoinRecord& r : o.registry->records()) EXPECT_EQ(r.name, "member");
  auto exec = RemoteExecutor::connect(**model, {joined("member")}, o);
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  // A name that never joins: the start-up wait ends at the connect timeout, naming it.
  RemoteOptions quick = o;
  quick.connect_timeout = milliseconds(200);
  auto ghost = RemoteExecutor::connect(**model, {joined("ghost")}, quick);
  ASSERT_FALSE(ghost.is_ok());
  EXPECT_NE(ghost.status().message().find("join://ghost"), std::string::npos) << ghost.status().to_string();
}

TEST(Join, HeartbeatsKeepAJoinedLinkAndAnUnreadOneIsRedialled) {
  const std::string path = made_qwen3moe();
  auto f = gguf::File::open(path);
  ASSERT_TRUE(f.is_ok());
  auto store = swarm::ExpertStore::open(std::move(*f), {});
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  RemoteOptions o;
  o.registry = open_registry(**model, o);
  ASSERT_NE(o.registry, nullptr);
  swarm::WorkerOptions wo;
  wo.n_threads = 1;
  wo.name = "beat";
  wo.listen = false;
  wo.join = {{"127.0.0.1", o.registry->port()}};
  wo.join_idle_timeout = milliseconds(2000);  // PING after 500 ms of silence, give up after 2 s
  wo.join_backoff = milliseconds(10);
  auto worker = swarm::Worker::start(store->get(), wo);
  ASSERT_TRUE(worker.is_ok()) << worker.status().to_string();
  EXPECT_EQ((*worker)->port(), 0) << "a joining worker opens no port";
  // Nobody reads a held link: its PINGs go unanswered, so the worker drops it and joins again.
  ASSERT_TRUE(eventually([&] { return joins_of(*o.registry, "beat") >= 2; }));
  // Taken by an executor, the link is read all the time: the PINGs are answered and it stays.
  auto exec = RemoteExecutor::connect(**model, {joined("beat")}, o);
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  const uint64_t joins = (*worker)->stats().joins.load();
  ASSERT_TRUE(eventually([&] { return (*exec)->worker(0).mux->n_pings_answered() >= 3; }));
  EXPECT_EQ((*worker)->stats().joins.load(), joins) << "an answered heartbeat keeps the connection";
  EXPECT_FALSE((*exec)->worker_down(0));
  (*worker)->stop();
}

// A relay between backbones and workers that only dial out: exact bits through it, two
// backbones reaching the same worker through it at once (each gets its own splice), and a name
// nobody registered refused by the relay with a message naming it.
TEST(Relay, WorkersBehindARelayServeExactlyAndSeveralBackbones) {
  SliceSetup su = slice_setup("relay", 8);
  ASSERT_TRUE(su.backbone && !su.local.empty());

  auto relay = net::Relay::start(net::RelayOptions{});
  ASSERT_TRUE(relay.is_ok()) << relay.status().to_string();
  std::thread relay_thread([&] { (*relay)->run(); });
  const std::string rp = "127.0.0.1:" + std::to_string((*relay)->port());
  auto a = WorkerProcess::spawn(su.path, "*:0-7", 1, milliseconds(20000), {"--join", rp, "--name", "ra"});
  auto b = WorkerProcess::spawn(su.path, "*:8-15", 1, milliseconds(20000), {"--join", rp, "--name", "rb"});
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  auto registered = [&](const std::string& n) {
    for (const net::RelayWorker& w : (*relay)->workers())
      if (w.name == n && w.standbys > 0) return true;
    return false;
  };
  ASSERT_TRUE(eventually([&] { return registered("ra") && registered("rb"); }));
  auto via = [&](const std::string& n) { return parse_worker_address("relay://" + rp + "/" + n).value(); };
  RemoteOptions o;
  auto e1 = RemoteExecutor::connect(*su.backbone, {via("ra"), via("rb")}, o);
  ASSERT_TRUE(e1.is_ok()) << e1.status().to_string();
  EXPECT_EQ((*e1)->worker(0).address.path, WorkerPath::kRelay);
  // A second backbone through the same relay to the same workers (their next standbys).
  ASSERT_TRUE(eventually([&] { return registered("ra") && registered("rb"); }));
  auto e2 = RemoteExecutor::connect(*su.backbone, {via("ra"), via("rb")}, o);
  ASSERT_TRUE(e2.is_ok()) << e2.status().to_string();
  // Both backbones decode at the same time through the same two workers.
  expect_concurrent_runs_exact(su, {std::move(*e1), std::move(*e2)}, "through the relay");
  EXPECT_GE((*relay)->stats().splices.load(), 2u);
  EXPECT_GT((*relay)->stats().bytes_to_workers.load(), 0u);
  EXPECT_GT((*relay)->stats().bytes_to_backbones.load(), 0u);

  auto ghost = RemoteExecutor::connect(*su.backbone, {via("ghost")}, o);
  ASSERT_FALSE(ghost.is_ok());
  EXPECT_NE(ghost.status().message().find("'ghost' is not registered at this relay"), std::string::npos)
      << ghost.status().to_string();
  (*relay)->stop();
  relay_thread.join();
}

// WebSocket (for networks that only let HTTP out): a worker joins the relay with --join ws://,
// backbones reach it through the relay over TCP and over WebSocket (relay+ws://), and a worker's
// own port takes ws:// as well — the same frames, the all-local bits on every path.
TEST(Relay, WebSocketJoinsAndPathsCarryTheSameFrames) {
  SliceSetup su = slice_setup("ws", 8);
  ASSERT_TRUE(su.backbone && !su.local.empty());
  auto relay = net::Relay::start(net::RelayOptions{});
  ASSERT_TRUE(relay.is_ok()) << relay.status().to_string();
  std::thread relay_thread([&] { (*relay)->run(); });
  const std::string rp = "127.0.0.1:" + std::to_string((*relay)->port());
  auto a =
      WorkerProcess::spawn(su.path, "*:0-7", 1, milliseconds(20000), {"--join", "ws://" + rp + "/", "--name", "wsa"});
  auto b = WorkerProcess::spawn(su.path, "*:8-15", 1, milliseconds(20000));  // listening: reached by ws://
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  auto registered = [&](const std::string& n) {
    for (const net::RelayWorker& w : (*relay)->workers())
      if (w.name == n && w.standbys > 0) return true;
    return false;
  };
  ASSERT_TRUE(eventually([&] { return registered("wsa"); }));
  const std::string direct_ws = "ws://127.0.0.1:" + std::to_string((*b)->port());
  RemoteOptions o;
  for (const std::string relay_path : {"relay://", "relay+ws://"}) {
    ASSERT_TRUE(eventually([&] { return registered("wsa"); }));
    auto addr_a = parse_worker_address(relay_path + rp + "/wsa");
    auto addr_b = parse_worker_address(direct_ws);
    ASSERT_TRUE(addr_a.is_ok() && addr_b.is_ok());
    EXPECT_EQ(addr_a->websocket, relay_path == std::string("relay+ws://"));
    EXPECT_TRUE(addr_b->websocket);
    EXPECT_EQ(addr_b->to_string(), direct_ws);
    auto e = RemoteExecutor::connect(*su.backbone, {*addr_a, *addr_b}, o);
    ASSERT_TRUE(e.is_ok()) << relay_path << ": " << e.status().to_string();
    expect_concurrent_runs_exact(su, {std::move(*e)}, std::string("worker a through ") + relay_path + ", b by ws://");
  }
  EXPECT_GE((*relay)->stats().splices.load(), 2u);
  (*relay)->stop();
  relay_thread.join();
}

// Admission at a relay started with a swarm key: a worker proving the key registers (over TCP and
// over WebSocket), one with another key or none is refused before it is registered, and so is a
// backbone without the key, with a message saying the relay wants one; a backbone with the key
// gets the all-local bits.
TEST(Relay, ASwarmKeyRelayAdmitsOnlyKeyHolders) {
  SliceSetup su = slice_setup("relay-key", 8);
  ASSERT_TRUE(su.backbone && !su.local.empty());
  const std::string key = temp_dir() + "/relay.key", other = temp_dir() + "/relay-other.key";
  {
    std::ofstream(key) << "the relay's swarm key, long enough to count\n";
    std::ofstream(other) << "a stranger's key that is also long enough\n";
  }
  auto k = net::SwarmKey::load(key);
  ASSERT_TRUE(k.is_ok());
  net::RelayOptions ro;
  ro.swarm_key = *k;
  auto relay = net::Relay::start(ro);
  ASSERT_TRUE(relay.is_ok()) << relay.status().to_string();
  std::thread relay_thread([&] { (*relay)->run(); });
  const std::string rp = "127.0.0.1:" + std::to_string((*relay)->port());
  auto member = WorkerProcess::spawn(su.path, "*:0-7", 1, milliseconds(20000),
                                     {"--join", rp, "--name", "km", "--swarm-key", key});
  auto member_ws = WorkerProcess::spawn(su.path, "*:8-15", 1, milliseconds(20000),
                                        {"--join", "ws://" + rp, "--name", "kw", "--swarm-key", key});
  auto stranger = WorkerProcess::spawn(su.path, "*:*", 1, milliseconds(20000),
                                       {"--join", rp, "--name", "stranger", "--swarm-key", other});
  auto keyless = WorkerProcess::spawn(su.path, "*:*", 1, milliseconds(20000), {"--join", rp, "--name", "keyless"});
  ASSERT_TRUE(member.is_ok() && member_ws.is_ok() && stranger.is_ok() && keyless.is_ok());
  auto registered = [&](const std::string& n) {
    for (const net::RelayWorker& w : (*relay)->workers())
      if (w.name == n && w.standbys > 0) return true;
    return false;
  };
  ASSERT_TRUE(eventually([&] { return registered("km") && registered("kw"); }));
  ASSERT_TRUE(eventually([&] { return (*relay)->stats().refused.load() >= 2; }));
  EXPECT_FALSE(registered("stranger"));
  EXPECT_FALSE(registered("keyless"));
  auto via = [&](const std::string& n) { return parse_worker_address("relay://" + rp + "/" + n).value(); };
  // Without the key: refused by the relay itself.
  RemoteOptions open;
  auto refused = RemoteExecutor::connect(*su.backbone, {via("km"), via("kw")}, open);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("admits only holders of the swarm key"), std::string::npos)
      << refused.status().to_string();
  RemoteOptions o;
  o.swarm_key = *k;
  auto e = RemoteExecutor::connect(*su.backbone, {via("km"), via("kw")}, o);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  expect_concurrent_runs_exact(su, {std::move(*e)}, "through a keyed relay");
  (*relay)->stop();
  relay_thread.join();
}

// Path policy: a worker reachable directly and through a relay ("A|B") is measured on both and
// reached directly; when the direct address does not answer, the relay carries it. Both give the
// all-local bits.
TEST(Relay, DirectWhenReachableRelayedOtherwiseBothMeasured) {
  SliceSetup su = slice_setup("paths", 8);
  ASSERT_TRUE(su.backbone && !su.local.empty());
  auto relay = net::Relay::start(net::RelayOptions{});
  ASSERT_TRUE(relay.is_ok());
  std::thread relay_thread([&] { (*relay)->run(); });
  const std::string rp = "127.0.0.1:" + std::to_string((*relay)->port());
  // Listens (direct path) and keeps standbys at the relay (relayed path).
  auto w = WorkerProcess::spawn(su.path, "*:*", 1, milliseconds(20000), {"--join", rp, "--name", "pw"});
  ASSERT_TRUE(w.is_ok());
  auto standby = [&] {
    for (const net::RelayWorker& x : (*relay)->workers())
      if (x.name == "pw" && x.standbys > 0) return true;
    return false;
  };
  auto run = [&](const std::string& spec) -> std::vector<WorkerStatus> {
    EXPECT_TRUE(eventually(standby));
    auto a = parse_worker_address(spec);
    EXPECT_TRUE(a.is_ok()) << a.status().to_string();
    RemoteOptions o;
    o.connect_timeout = milliseconds(3000);
    auto e = RemoteExecutor::connect(*su.backbone, {*a}, o);
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    if (!e.is_ok()) return {};
    std::shared_ptr<RemoteExecutor> exec(std::move(*e));
    auto got = run_model(*su.backbone, su.toks, exec);
    EXPECT_TRUE(got.is_ok()) << got.status().to_string();
    if (got.is_ok()) EXPECT_EQ(std::memcmp(got->data(), su.local.data(), got->size() * sizeof(float)), 0) << spec;
    return exec->worker_status();
  };
  const std::string relayed = "relay://" + rp + "/pw";
  std::vector<WorkerStatus> st = run((*w)->address().to_string() + "|" + relayed);
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].path, WorkerPath::kDirect);
  ASSERT_EQ(st[0].paths.size(), 2u);
  EXPECT_TRUE(st[0].paths[0].ok && st[0].paths[0].used);
  EXPECT_TRUE(st[0].paths[1].ok) << "the relayed path was measured too: " << st[0].paths[1].error;
  EXPECT_FALSE(st[0].paths[1].used);
  // The direct address of a worker that is gone (a closed port): the relay carries it.
  const uint16_t dead = [] {
    auto l = net::TcpListener::listen("127.0.0.1", 0, net::TcpOptions{});
    return l.is_ok() ? (*l)->port() : uint16_t{1};
  }();
  st = run("127.0.0.1:" + std::to_string(dead) + "|" + relayed);
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].path, WorkerPath::kRelay);
  ASSERT_EQ(st[0].paths.size(), 2u);
  EXPECT_FALSE(st[0].paths[0].ok);
  EXPECT_TRUE(st[0].paths[1].used);
  (*relay)->stop();
  relay_thread.join();
}

// Path policy while connected: a worker first reached through the relay because its direct
// address did not answer is moved to the direct path once that answers (between calls), and the
// bits stay the all-local ones before and after.
TEST(Relay, ALinkMovesToTheDirectPathWhenItStartsAnswering) {
  SliceSetup su = slice_setup("path-switch", 8);
  ASSERT_TRUE(su.backbone && !su.local.empty());
  auto relay = net::Relay::start(net::RelayOptions{});
  ASSERT_TRUE(relay.is_ok());
  std::thread relay_thread([&] { (*relay)->run(); });
  const std::string rp = "127.0.0.1:" + std::to_string((*relay)->port());
  auto w = WorkerProcess::spawn(su.path, "*:*", 1, milliseconds(20000), {"--join", rp, "--name", "sw"});
  ASSERT_TRUE(w.is_ok());
  ASSERT_TRUE(eventually([&] {
    for (const net::RelayWorker& x : (*relay)->workers())
      if (x.name == "sw" && x.standbys > 0) return true;
    return false;
  }));
  const uint16_t later = [] {
    auto l = net::TcpListener::listen("127.0.0.1", 0, net::TcpOptions{});
    return l.is_ok() ? (*l)->port() : uint16_t{1};
  }();
  auto a = parse_worker_address("127.0.0.1:" + std::to_string(later) + "|relay://" + rp + "/sw");
  ASSERT_TRUE(a.is_ok());
  RemoteOptions o;
  o.connect_timeout = milliseconds(3000);
  auto e = RemoteExecutor::connect(*su.backbone, {*a}, o);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  std::shared_ptr<RemoteExecutor> exec(std::move(*e));
  EXPECT_EQ(exec->worker_status()[0].path, WorkerPath::kRelay);
  expect_concurrent_runs_exact(su, {exec}, "relayed");
  // Still unreachable: a try changes nothing.
  exec->poll_rejoins(/*wait=*/true);
  EXPECT_EQ(exec->worker_status()[0].path, WorkerPath::kRelay);
  EXPECT_EQ(exec->failover_stats().path_switches, 0u);
  // The same worker (name, experts) now answers on the direct address.
  auto f = gguf::File::open(su.path);
  ASSERT_TRUE(f.is_ok());
  auto store = swarm::ExpertStore::open(std::move(*f), {});
  ASSERT_TRUE(store.is_ok());
  swarm::WorkerOptions wo;
  wo.n_threads = 1;
  wo.name = "sw";
  wo.port = later;
  auto direct = swarm::Worker::start(store->get(), wo);
  ASSERT_TRUE(direct.is_ok()) << direct.status().to_string();
  std::thread direct_thread([&] { (*direct)->run(); });
  exec->poll_rejoins(/*wait=*/true);
  EXPECT_EQ(exec->failover_stats().path_switches, 1u);
  EXPECT_EQ(exec->worker_status()[0].path, WorkerPath::kDirect);
  const uint64_t before = (*direct)->stats().dispatches.load();
  expect_concurrent_runs_exact(su, {exec}, "after moving to the direct path");
  EXPECT_GT((*direct)->stats().dispatches.load(), before) << "the direct path carries the requests now";
  exec.reset();
  (*direct)->stop();
  direct_thread.join();
  (*relay)->stop();
  relay_thread.join();
}

// TLS with pinning on every path: a worker with a certificate is reached directly, by joining and
// through a relay, each with the bits of all-local decoding; a backbone pinning another
// certificate and one without TLS are refused with messages saying what to change.
TEST(Tls, PinnedTlsOnDirectJoinedAndRelayedPaths) {
  const std::string dir = temp_dir();
  const std::string cert = dir + "/w.crt", key = dir + "/w.key", cert2 = dir + "/o.crt", key2 = dir + "/o.key";
  for (const auto& [c, k] : {std::pair{cert, key}, std::pair{cert2, key2}}) {
    const std::string cmd =
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "
        "/CN=moesh-dist -days 2 -keyout '" +
        k + "' -out '" + c + "' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "the openssl tool is missing";
  }
  auto id = net::TlsIdentity::load(cert, key);
  auto other = net::TlsIdentity::load(cert2, key2);
  ASSERT_TRUE(id.is_ok() && other.is_ok());
  SliceSetup su = slice_setup("tls", 8);
  ASSERT_TRUE(su.backbone && !su.local.empty());
  const std::vector<std::string> tls_args = {"--tls-cert", cert, "--tls-key", key};

  RemoteOptions o;
  o.tls_pins = std::make_shared<const net::TlsPins>(*net::TlsPins::parse({(*id)->fingerprint()}));
  auto expect_exact = [&](const std::vector<WorkerAddress>& addrs, const RemoteOptions& ro, const char* what) {
    auto e = RemoteExecutor::connect(*su.backbone, addrs, ro);
    ASSERT_TRUE(e.is_ok()) << what << ": " << e.status().to_string();
    EXPECT_EQ((*e)->worker(0).conn->describe().rfind("tls ", 0), 0u) << what;
    auto got = run_model(*su.backbone, su.toks, std::shared_ptr<RemoteExecutor>(std::move(*e)));
    ASSERT_TRUE(got.is_ok()) << what << ": " << got.status().to_string();
    EXPECT_EQ(std::memcmp(got->data(), su.local.data(), got->size() * sizeof(float)), 0) << what;
  };

  // Direct.
  auto w = WorkerProcess::spawn(su.path, "*:*", 1, milliseconds(20000), tls_args);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_NE((*w)->output().find("tls: certificate sha256 " + (*id)->fingerprint()), std::string::npos)
      << (*w)->output();
  expect_exact({(*w)->address()}, o, "direct");
  RemoteOptions wrong = o;
  wrong.tls_pins = std::make_shared<const net::TlsPins>(*net::TlsPins::parse({(*other)->fingerprint()}));
  auto refused = RemoteExecutor::connect(*su.backbone, {(*w)->address()}, wrong);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("is not pinned"), std::string::npos) << refused.status().to_string();
  RemoteOptions plain;
  plain.connect_timeout = milliseconds(3000);
  auto no_tls = RemoteExecutor::connect(*su.backbone, {(*w)->address()}, plain);
  ASSERT_FALSE(no_tls.is_ok()) << "a TLS worker does not talk to a plain backbone";

  // Joined: the registry starts TLS after the ROUTE exchange.
  RemoteOptions jo = o;
  jo.registry = open_registry(*su.backbone, jo);
  ASSERT_NE(jo.registry, nullptr);
  std::vector<std::string> jargs = tls_args;
  jargs.insert(jargs.end(), {"--join", "127.0.0.1:" + std::to_string(jo.registry->port()), "--name", "tj"});
  auto j = WorkerProcess::spawn(su.path, "*:*", 1, milliseconds(20000), jargs);
  ASSERT_TRUE(j.is_ok());
  ASSERT_EQ(jo.registry->wait_for(1, net::deadline_in(milliseconds(20000))).size(), 1u);
  expect_exact({joined("tj")}, jo, "joined");

  // Relayed: TLS runs end to end through the relay's splice.
  auto relay = net::Relay::start(net::RelayOptions{});
  ASSERT_TRUE(relay.is_ok());
  std::thread relay_thread([&] { (*relay)->run(); });
  const std::string rp = "127.0.0.1:" + std::to_string((*relay)->port());
  std::vector<std::string> rargs = tls_args;
  rargs.insert(rargs.end(), {"--join", rp, "--name", "tr"});
  auto r = WorkerProcess::spawn(su.path, "*:*", 1, milliseconds(20000), rargs);
  ASSERT_TRUE(r.is_ok());
  ASSERT_TRUE(eventually([&] {
    for (const net::RelayWorker& x : (*relay)->workers())
      if (x.name == "tr" && x.standbys > 0) return true;
    return false;
  }));
  expect_exact({parse_worker_address("relay://" + rp + "/tr").value()}, o, "relayed");
  (*relay)->stop();
  relay_thread.join();
}

}  // namespace
}  // namespace moesh::test
