// Federation: several backbones share one pool of workers. Two backbones decoding at the same time
// through the same three TCP workers each get exactly their solo (all-local) logits, the workers
// compute their concurrent requests for the same layer in shared passes (counted), and each
// worker's ledger keeps the two backbones apart.
#include <gtest/gtest.h>

#include <cstring>
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
                                        std::chrono::microseconds window) {
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

}  // namespace
}  // namespace moesh::test
