// Federation: several backbones share one pool of workers. Two backbones decoding at the same time
// through the same three TCP workers each get exactly their solo (all-local) logits, the workers
// compute their concurrent requests for the same layer in shared passes (counted), and each
// worker's ledger keeps the two backbones apart.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <thread>

#include "dist/dist_util.h"
#include "moesh/swarm/swarm.h"

namespace moesh::test {
namespace {

using std::chrono::milliseconds;

// An in-process worker on a real TCP port, run on its own thread.
struct TcpWorker {
  std::unique_ptr<swarm::ExpertStore> store;
  std::unique_ptr<swarm::Worker> worker;
  std::thread thread;
  ~TcpWorker() {
    if (worker) worker->stop();
    if (thread.joinable()) thread.join();
  }
};

std::unique_ptr<TcpWorker> start_worker(const std::string& path, const std::string& spec, const std::string& name,
                                        std::chrono::microseconds window, const std::string& replica_dir = "",
                                        uint64_t replica_budget = 0, uint16_t port = 0) {
  auto w = std::make_unique<TcpWorker>();
  auto f = gguf::File::open(path);
  EXPECT_TRUE(f.is_ok());
  if (!f.is_ok()) return nullptr;
  auto shape = swarm::model_shape(**f);
  auto held = swarm::parse_expert_spec(spec, *shape);
  EXPECT_TRUE(held.is_ok());
  auto st = swarm::ExpertStore::open(std::move(*f), *held);
  EXPECT_TRUE(st.is_ok()) << st.status().to_string();
  if (!st.is_ok()) return nullptr;
  w->store = std::move(*st);
  swarm::WorkerOptions wo;
  wo.n_threads = 1;
  wo.name = name;
  wo.batch_window = window;
  wo.replica_dir = replica_dir;
  wo.replica_budget_bytes = replica_budget;
  wo.port = port;
  auto started = swarm::Worker::start(w->store.get(), wo);
  EXPECT_TRUE(started.is_ok()) << started.status().to_string();
  if (!started.is_ok()) return nullptr;
  w->worker = std::move(*started);
  w->thread = std::thread([p = w->worker.get()] { p->run(); });
  return w;
}

TEST(Federation, TwoBackbonesShareThreeWorkersEachGetsItsSoloBitsInSharedPasses) {
  SliceSetup su = slice_setup("federation", 8);
  ASSERT_TRUE(su.backbone && !su.local.empty());
  // A pass waits up to 50 ms for the other backbone's request of the same layer, so the two
  // streams meet on the workers however their threads are scheduled.
  const std::chrono::microseconds window(50000);
  std::vector<std::unique_ptr<TcpWorker>> workers;
  workers.push_back(start_worker(su.path, "*:0-7", "fa", window));
  workers.push_back(start_worker(su.path, "*:8-15", "fb", window));
  workers.push_back(start_worker(su.path, "*:0-15", "fc", window));
  std::vector<WorkerAddress> addrs;
  for (const auto& w : workers) {
    ASSERT_NE(w, nullptr);
    addrs.push_back(WorkerAddress{"127.0.0.1", w->worker->port()});
  }
  RemoteOptions o1, o2;
  o1.name = "bb-one";
  o2.name = "bb-two";
  auto e1 = RemoteExecutor::connect(*su.backbone, addrs, o1);
  auto e2 = RemoteExecutor::connect(*su.backbone, addrs, o2);
  ASSERT_TRUE(e1.is_ok()) << e1.status().to_string();
  ASSERT_TRUE(e2.is_ok()) << e2.status().to_string();
  std::shared_ptr<RemoteExecutor> r1(std::move(*e1)), r2(std::move(*e2));
  for (int round = 0; round < 3; ++round)
    expect_concurrent_runs_exact(su, {r1, r2}, "a backbone sharing the workers, round " + std::to_string(round));
  uint64_t batched = 0, passes = 0, dispatches = 0;
  for (const auto& w : workers) {
    const swarm::WorkerStats& st = w->worker->stats();
    batched += st.batched.load();
    passes += st.computes.load();
    dispatches += st.dispatches.load();
    EXPECT_EQ(st.errors.load(), 0u);
  }
  EXPECT_GT(batched, 0u) << "concurrent same-layer requests of the two backbones are computed together";
  EXPECT_LT(passes, dispatches) << "shared passes: fewer passes than requests";
  // Each worker that was used accounts for the two backbones separately.
  for (const auto& w : workers) {
    const std::vector<swarm::LedgerEntry> led = w->worker->ledger();
    uint64_t requests = 0;
    for (const swarm::LedgerEntry& e : led) {
      EXPECT_TRUE(e.peer == "bb-one" || e.peer == "bb-two") << e.peer;
      EXPECT_EQ(e.dispatches, e.requests) << w->worker->name() << " / " << e.peer;
      requests += e.requests;
    }
    if (requests > 0) EXPECT_EQ(led.size(), 2u) << w->worker->name();
  }
}

// Replicas of hot experts: a backbone on a backbone slice (no expert weights of its own) sends the
// experts only worker A holds to worker B (--replica-dir): FETCHed from A, checked against the
// backbone slice's hashes, STOREd on B, checked again there and mapped from B's disk. B becomes a
// holder: with A then left out, B alone serves every expert the sequence routes to, bit-exactly.
// B restarted on the same folder maps the replicas again.
TEST(Replicas, HotExpertsAreCopiedToASecondWorkerWhichThenServesThem) {
  SliceSetup su = slice_setup("replicas", 8);
  ASSERT_TRUE(su.backbone && !su.local.empty());
  const std::string dir = temp_dir() + "/replicas-b";
  std::filesystem::remove_all(dir);
  auto a = start_worker(su.path, "*:0-15", "ra", {});
  auto b = start_worker(su.path, "*:0-3", "rb", {}, dir, uint64_t{64} << 20);
  ASSERT_TRUE(a && b);
  RemoteOptions o;
  o.replicate_hot = 64;  // every activated expert that only A holds
  o.hot_plan_after_tokens = 1;
  o.hot_replan_every_tokens = 1;
  o.worker_costs = {0.002, 0.001};  // B nearer: a replica there is used
  auto e = RemoteExecutor::connect(
      *su.backbone, {WorkerAddress{"127.0.0.1", a->worker->port()}, WorkerAddress{"127.0.0.1", b->worker->port()}}, o);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  std::shared_ptr<RemoteExecutor> r(std::move(*e));
  // Twice: the second run's first plan has seen every expert the sequence routes to.
  expect_concurrent_runs_exact(su, {r}, "while replicating");
  expect_concurrent_runs_exact(su, {r}, "while replicating, again");
  const HotExpertReport h = r->hot_experts();
  EXPECT_GT(h.replicas_sent, 0u);
  EXPECT_EQ(h.replica_failures, 0u) << h.last_replica_error;
  EXPECT_EQ(b->worker->stats().stores.load(), h.replicas_sent);
  EXPECT_GT(a->worker->stats().fetches.load(), 0u) << "the copies came from A through the backbone";
  // The registry shows what each offers (INFO at connect, STOREDs since).
  {
    const std::vector<WorkerStatus> ws = r->worker_status();
    ASSERT_EQ(ws.size(), 2u);
    EXPECT_EQ(ws[0].threads, 1u);
    EXPECT_GT(ws[0].cores, 0u);
    EXPECT_GT(ws[0].rss_bytes, 0u);
    EXPECT_EQ(ws[0].slab_bytes, a->store->slab_bytes());
    EXPECT_EQ(ws[0].replica_budget_bytes, 0u) << "A keeps no replicas";
    EXPECT_EQ(ws[1].replica_budget_bytes, uint64_t{64} << 20);
    EXPECT_EQ(ws[1].replica_bytes, b->worker->stats().replica_bytes.load());
    EXPECT_EQ(ws[1].slab_bytes, b->store->slab_bytes());
  }
  // Every activated expert now has B as a holder.
  const auto counts = r->activation_counts();
  const int E = r->placement().n_expert();
  for (int l = 0; l < r->placement().n_layer(); ++l) {
    for (int e2 = 0; e2 < E; ++e2) {
      if (counts[static_cast<size_t>(l) * E + e2] == 0) continue;
      const auto hs = r->placement().holders(l, e2);
      EXPECT_NE(std::find(hs.begin(), hs.end(), 1), hs.end()) << "layer " << l << " expert " << e2;
    }
  }
  // A left out: B serves everything, with the same bits.
  const uint64_t b_before = b->worker->stats().dispatches.load();
  r->set_excluded(0, true);
  expect_concurrent_runs_exact(su, {r}, "B alone, on its replicas");
  EXPECT_GT(b->worker->stats().dispatches.load(), b_before);
  const uint64_t replicas = b->store->held().n_pairs();
  const uint16_t b_port = b->worker->port();
  b.reset();
  // B gone: A takes its pairs back within the same calls.
  r->set_excluded(0, false);
  expect_concurrent_runs_exact(su, {r}, "B gone, A covering");
  EXPECT_TRUE(r->worker_down(1));
  // Restarted on the folder and the same port: the replicas are mapped again, B announces more
  // than it did at start-up, and the backbone takes it back with them.
  auto b2 = start_worker(su.path, "*:0-3", "rb", {}, dir, uint64_t{64} << 20, b_port);
  ASSERT_TRUE(b2);
  EXPECT_EQ(b2->store->held().n_pairs(), replicas);
  EXPECT_GT(b2->worker->stats().replica_bytes.load(), 0u);
  r->poll_rejoins(/*wait=*/true);
  ASSERT_FALSE(r->worker_down(1)) << "a worker that announces its replicas as well rejoins";
  EXPECT_EQ(r->worker_status()[1].replica_bytes, b2->worker->stats().replica_bytes.load());
  r->set_excluded(0, true);
  const uint64_t b2_before = b2->worker->stats().dispatches.load();
  expect_concurrent_runs_exact(su, {r}, "B restarted, alone, on its re-mapped replicas");
  EXPECT_GT(b2->worker->stats().dispatches.load(), b2_before);
}

// Live re-placement (--rebalance): a far worker A holds every expert, a near worker B joins with
// experts 0-3 and replica room for exactly the other twelve experts of ONE layer. The backbone,
// from the activations it counted and the costs it measured, moves a whole layer there (a layer
// B then serves alone makes no trip to A) rather than hot experts scattered over every layer;
// the copies are checked by hash on both ends before B serves them, and every run keeps the
// all-local bits.
TEST(Replicas, RebalanceMovesAWholeLayerToTheNearerWorker) {
  SliceSetup su = slice_setup("rebalance", 8);
  ASSERT_TRUE(su.backbone && !su.local.empty());
  const int L = static_cast<int>(su.model->hparams().n_layer);
  const int E = static_cast<int>(su.model->hparams().n_expert);
  auto f = gguf::File::open(su.path);
  ASSERT_TRUE(f.is_ok());
  uint64_t slab = 0;  // one expert's gate + up + down of a layer (every layer alike)
  for (const char* t : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"})
    slab += (*f)->find_tensor(fmt::format("blk.0.{}.weight", t))->n_bytes / static_cast<uint64_t>(E);
  const std::string dir = temp_dir() + "/rebalance-b";
  std::filesystem::remove_all(dir);
  auto a = start_worker(su.path, "*:0-15", "far", {});
  auto b = start_worker(su.path, "*:0-3", "near", {}, dir, slab * 12);
  ASSERT_TRUE(a && b);
  RemoteOptions o;
  o.rebalance = 64;
  o.hot_plan_after_tokens = 4;
  o.hot_replan_every_tokens = 1;
  o.worker_costs = {0.050, 0.005};  // A far, B near
  auto e = RemoteExecutor::connect(
      *su.backbone, {WorkerAddress{"127.0.0.1", a->worker->port()}, WorkerAddress{"127.0.0.1", b->worker->port()}}, o);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  std::shared_ptr<RemoteExecutor> r(std::move(*e));
  expect_concurrent_runs_exact(su, {r}, "while rebalancing");
  const HotExpertReport h = r->hot_experts();
  EXPECT_EQ(h.rebalanced, 12u) << h.last_rebalance_error;
  EXPECT_EQ(h.rebalanced_bytes, 12 * slab);
  EXPECT_EQ(h.rebalance_failures, 0u) << h.last_rebalance_error;
  EXPECT_LT(h.rebalance_predicted_s_after, h.rebalance_predicted_s_before);
  EXPECT_EQ(b->worker->stats().stores.load(), 12u);
  EXPECT_EQ(a->worker->stats().fetches.load(), 12u) << "the copies came from A through the backbone";
  // One layer is B's alone now; the others kept their holders.
  int whole = -1;
  for (int l = 0; l < L; ++l) {
    int on_b = 0;
    for (int x = 0; x < E; ++x) {
      const auto hs = r->placement().holders(l, x);
      on_b += std::find(hs.begin(), hs.end(), 1) != hs.end();
    }
    if (on_b == E) {
      EXPECT_EQ(whole, -1) << "two whole layers cannot fit B's room";
      whole = l;
    } else {
      EXPECT_EQ(on_b, 4) << "layer " << l;
    }
  }
  ASSERT_GE(whole, 0) << "a whole layer moved, not scattered experts";
  // From now on that layer makes no trip to A: at most L - 1 of A's requests per pass.
  const uint64_t a_before = a->worker->stats().dispatches.load();
  const uint64_t b_before = b->worker->stats().dispatches.load();
  expect_concurrent_runs_exact(su, {r}, "after the move");
  const uint64_t passes = 1 + (su.toks.size() - std::max<size_t>(1, 2 * su.toks.size() / 3));
  EXPECT_LE(a->worker->stats().dispatches.load() - a_before, passes * static_cast<uint64_t>(L - 1));
  EXPECT_GE(b->worker->stats().dispatches.load() - b_before, passes) << "B serves its whole layer every pass";
  EXPECT_EQ(r->hot_experts().rebalanced, 12u) << "B is full: nothing more to move";
}

}  // namespace
}  // namespace moesh::test
