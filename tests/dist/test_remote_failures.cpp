// Failures of remote dispatch, real worker processes over TCP. With failover (the default) a
// worker killed mid-generation, one that stops answering (at its deadline) or one whose COMBINE
// answers the wrong layer is covered by the other holders — a replica, the backbone's copies —
// and the tokens are those of all-local decoding; with no other holder, or failover off, each
// ends in a clear Status naming the worker, never a hang. A worker gone before start-up and one
// serving another model are refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "dist/dist_util.h"
#include "dist/worker_process.h"
#include "moesh/swarm/swarm.h"

namespace moesh::test {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::vector<int32_t> some_tokens(const Model& m, size_t n) {
  return test_tokens("", m.hparams().n_vocab, n);
}

TEST(RemoteFailures, WorkerGoneBeforeStartup) {
  const std::string path = made_qwen3moe();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  auto w = WorkerProcess::spawn(path, "*:*");
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  const WorkerAddress addr = (*w)->address();
  (*w)->kill_now();
  RemoteOptions o;
  o.connect_timeout = milliseconds(30000);
  // The refused connect is the answer (kUnavailable, naming the worker); waiting out the
  // connect timeout would have been kTimeout.
  auto exec = RemoteExecutor::connect(**model, {addr}, o);
  ASSERT_FALSE(exec.is_ok());
  EXPECT_NE(exec.status().message().find(addr.to_string()), std::string::npos) << exec.status().to_string();
  EXPECT_EQ(exec.status().code(), StatusCode::kUnavailable) << exec.status().to_string();
}

// Several workers named and one down at start-up: with failover the backbone starts without it
// when the others (a replica) still hold every expert, as if it had failed mid-run — the bits
// are the all-local ones — and takes it in once it answers; when its experts would have no
// holder, or with failover off, the dead worker is the error. A worker asked for while running
// (dial_worker) is taken in the same way.
TEST(RemoteFailures, AWorkerDownAtStartIsLeftOutWhileItsExpertsHaveAnotherHolder) {
  SliceSetup su = slice_setup("late", 8);
  ASSERT_TRUE(su.backbone != nullptr);
  auto gone = WorkerProcess::spawn(su.path, "*:*");
  ASSERT_TRUE(gone.is_ok()) << gone.status().to_string();
  const WorkerAddress dead = (*gone)->address();
  (*gone)->kill_now();
  auto replica = WorkerProcess::spawn(su.path, "*:*");
  ASSERT_TRUE(replica.is_ok()) << replica.status().to_string();
  RemoteOptions o;
  o.rejoin_backoff = milliseconds(60000);  // only poll_rejoins(true) dials it again here
  auto exec = RemoteExecutor::connect(*su.backbone, {dead, (*replica)->address()}, o);
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  std::shared_ptr<RemoteExecutor> remote(std::move(*exec));
  ASSERT_EQ(remote->late_workers().size(), 1u);
  EXPECT_EQ(remote->late_workers()[0].address, dead.to_string());
  EXPECT_EQ(remote->late_workers()[0].attempts, 1u);
  EXPECT_NE(remote->late_workers()[0].last_error.find(dead.to_string()), std::string::npos);
  EXPECT_EQ(remote->worker_status().size(), 1u);
  auto got = run_model(*su.backbone, su.toks, remote);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(std::memcmp(got->data(), su.local.data(), got->size() * sizeof(float)), 0);
  EXPECT_EQ(remote->traffic().local_pairs, 0u);
  // Still down: a try changes nothing but the count. Back on its port: it joins.
  remote->poll_rejoins(true);
  ASSERT_EQ(remote->late_workers().size(), 1u);
  EXPECT_EQ(remote->late_workers()[0].attempts, 2u);
  auto back = WorkerProcess::spawn_command(
      {"worker", "-m", su.path, "--experts", "*:*", "--listen", dead.to_string(), "-t", "1"}, "worker");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  remote->poll_rejoins(true);
  EXPECT_TRUE(remote->late_workers().empty());
  ASSERT_EQ(remote->worker_status().size(), 2u);
  EXPECT_EQ(remote->failover_stats().rejoins, 1u);
  auto again = run_model(*su.backbone, su.toks, remote);
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(std::memcmp(again->data(), su.local.data(), again->size() * sizeof(float)), 0);
  (*back)->kill_now();
  // A worker asked for while running (the gateway's POST /swarm/workers/add) is dialled between
  // calls and added; one already there, or already asked for, is refused.
  auto third = WorkerProcess::spawn(su.path, "*:0-7");
  ASSERT_TRUE(third.is_ok()) << third.status().to_string();
  ASSERT_TRUE(remote->dial_worker((*third)->address()).is_ok());
  EXPECT_FALSE(remote->dial_worker((*third)->address()).is_ok());
  EXPECT_FALSE(remote->dial_worker((*replica)->address()).is_ok());
  ASSERT_EQ(remote->late_workers().size(), 1u);
  EXPECT_EQ(remote->late_workers()[0].last_error, "not dialled yet");
  remote->poll_rejoins(true);
  EXPECT_TRUE(remote->late_workers().empty());
  EXPECT_EQ(remote->worker_status().size(), 3u);
  auto with_third = run_model(*su.backbone, su.toks, remote);
  ASSERT_TRUE(with_third.is_ok()) << with_third.status().to_string();
  EXPECT_EQ(std::memcmp(with_third->data(), su.local.data(), with_third->size() * sizeof(float)), 0);

  // The other worker holds half the experts: the dead one is the error, with what nobody holds.
  auto half = WorkerProcess::spawn(su.path, "*:0-3");
  ASSERT_TRUE(half.is_ok()) << half.status().to_string();
  auto uncovered = RemoteExecutor::connect(*su.backbone, {dead, (*half)->address()}, o);
  ASSERT_FALSE(uncovered.is_ok());
  EXPECT_EQ(uncovered.status().code(), StatusCode::kUnavailable) << uncovered.status().to_string();
  EXPECT_NE(uncovered.status().message().find(dead.to_string()), std::string::npos) << uncovered.status().to_string();
  EXPECT_NE(uncovered.status().message().find("4-"), std::string::npos) << uncovered.status().to_string();
  // Failover off: any worker that does not answer is the error.
  RemoteOptions strict;
  strict.failover = false;
  auto refused = RemoteExecutor::connect(*su.backbone, {dead, (*replica)->address()}, strict);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find(dead.to_string()), std::string::npos) << refused.status().to_string();
}

// A re-plan that gives a peer experts (RemoteExecutor::request_experts): a span peer keeping
// replicas is dialled as a worker and sent copies of layer 1's experts — a span peer made an
// expert holder — between calls, checked by hash; the bits stay all-local. A worker that keeps no
// replicas, or none at all by that name, is refused with the reason.
TEST(RemoteFailures, ExpertsGivenToAPeerAreCopiedToItBetweenCalls) {
  SliceSetup su = slice_setup("given", 8);
  ASSERT_TRUE(su.backbone != nullptr);
  const int n_expert = static_cast<int>(su.model->hparams().n_expert);
  auto w = WorkerProcess::spawn(su.path, "*:*");
  auto plain = WorkerProcess::spawn(su.path, "0:0");
  const std::string dir = temp_dir() + "/given-replicas";
  auto span_peer = WorkerProcess::spawn_command({"span", "-m", su.path, "--layers", "0-0", "-t", "1", "--listen",
                                                 "127.0.0.1:0", "--replica-dir", dir, "--replica-mb", "64"},
                                                "span 0-0");
  ASSERT_TRUE(w.is_ok() && plain.is_ok() && span_peer.is_ok());
  auto exec = RemoteExecutor::connect(*su.backbone, {(*w)->address(), (*plain)->address()}, RemoteOptions{});
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  std::shared_ptr<RemoteExecutor> remote(std::move(*exec));
  const std::string sp = (*span_peer)->address().to_string();
  ASSERT_TRUE(remote->dial_worker((*span_peer)->address()).is_ok());
  remote->request_experts(sp, {{1, 0, static_cast<uint32_t>(n_expert)}});
  remote->request_experts((*plain)->address().to_string(), {{1, 0, 2}});
  remote->request_experts("nobody:1", {{1, 0, 1}});
  EXPECT_EQ(remote->expert_requests().pending, 3u);
  // Pass 1: the span peer is being dialled (its request waits); the others are answered. Once it
  // is a worker it gets the copies before a pass's dispatches. The dial runs in the background,
  // so on a loaded host that may take more passes than the usual two.
  for (int pass = 0; pass < 3 || (remote->expert_requests().pending > 0 && pass < 300); ++pass) {
    if (pass >= 3) std::this_thread::sleep_for(milliseconds(10));
    auto got = run_model(*su.backbone, su.toks, remote);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_EQ(std::memcmp(got->data(), su.local.data(), got->size() * sizeof(float)), 0) << "pass " << pass;
  }
  const ExpertRequestReport r = remote->expert_requests();
  EXPECT_EQ(r.requests, 3u);
  EXPECT_EQ(r.done, 1u);
  EXPECT_EQ(r.failed, 2u);
  EXPECT_EQ(r.pending, 0u);
  EXPECT_EQ(r.sent, static_cast<uint64_t>(n_expert));
  EXPECT_GT(r.sent_bytes, 0u);
  std::string held;
  for (const WorkerStatus& s : remote->worker_status())
    if (s.address == sp) held = s.experts;
  EXPECT_EQ(held, fmt::format("0-1:0-{}", n_expert - 1));  // its span's layer, and layer 1 now
  EXPECT_NE(r.last_error.find("nobody:1"), std::string::npos) << r.last_error;
  remote->request_experts((*plain)->address().to_string(), {{1, 0, 2}});
  ASSERT_TRUE(run_model(*su.backbone, su.toks, remote).is_ok());
  EXPECT_NE(remote->expert_requests().last_error.find("keeps no replicas"), std::string::npos)
      << remote->expert_requests().last_error;
}

// The other way (RemoteExecutor::drop_experts, a re-plan moving experts off a peer): replicas
// leave the placement, then their worker (UNSTORE), which deletes them; never the last holder of
// an expert, never an expert of the worker's own file. Drops queued beside copies go first, and
// one that was the last holder is tried again after the copies. The bits stay all-local.
TEST(RemoteFailures, ReplicasLetGoOfLeaveThePlacementButNeverTheLastHolder) {
  SliceSetup su = slice_setup("drop", 8);
  ASSERT_TRUE(su.backbone != nullptr);
  ASSERT_EQ(su.model->hparams().n_layer, 2u);
  // a: everything but layer 1 expert 0, which only b holds (its own file); c and d keep replicas.
  const std::string all_but = "0:*,1:1-15";
  const std::string dir_c = temp_dir() + "/drop-c", dir_d = temp_dir() + "/drop-d";
  std::filesystem::remove_all(dir_c);
  std::filesystem::remove_all(dir_d);
  auto a = WorkerProcess::spawn(su.path, all_but);
  auto b = WorkerProcess::spawn(su.path, "1:0");
  auto c = WorkerProcess::spawn(su.path, "0:0", 1, std::chrono::milliseconds(20000),
                                {"--replica-dir", dir_c, "--replica-mb", "64"});
  auto d = WorkerProcess::spawn(su.path, "0:1", 1, std::chrono::milliseconds(20000),
                                {"--replica-dir", dir_d, "--replica-mb", "64"});
  ASSERT_TRUE(a.is_ok() && b.is_ok() && c.is_ok() && d.is_ok());
  const std::string ca = (*c)->address().to_string(), da = (*d)->address().to_string();
  // Equal costs: every holder is near and shares the pairs, so d gets some and its death is seen
  // (measured ones could make d "far" on a loaded host: no pair, and no failure to notice).
  RemoteOptions o;
  o.worker_costs = {0.001, 0.001, 0.001, 0.001};
  auto exec =
      RemoteExecutor::connect(*su.backbone, {(*a)->address(), (*b)->address(), (*c)->address(), (*d)->address()}, o);
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  std::shared_ptr<RemoteExecutor> remote(std::move(*exec));
  auto holders = [&](int l, int e) {
    const auto hs = remote->placement().holders(l, e);
    return std::vector<int32_t>(hs.begin(), hs.end());
  };
  auto pass_is_local = [&](const char* what) {
    auto got = run_model(*su.backbone, su.toks, remote);
    ASSERT_TRUE(got.is_ok()) << what << ": " << got.status().to_string();
    EXPECT_EQ(std::memcmp(got->data(), su.local.data(), got->size() * sizeof(float)), 0) << what;
  };
  // c gets copies of 1:0 (from b) and 0:3 (from a).
  remote->request_experts(ca, {{1, 0, 1}, {0, 3, 1}});
  pass_is_local("copies");
  EXPECT_EQ(holders(1, 0), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(holders(0, 3), (std::vector<int32_t>{0, 2}));
  EXPECT_TRUE(std::filesystem::exists(dir_c + "/replica-0-3.gguf"));

  // c lets go of 0:3 (a holds it); its own 0:0 is kept (the worker refuses: not a replica), and so
  // is a's 0:0 (a keeps no replicas: it lets go of nothing).
  remote->drop_experts(ca, {{0, 3, 1}, {0, 0, 1}});
  remote->drop_experts((*a)->address().to_string(), {{0, 0, 1}});
  pass_is_local("drops");
  EXPECT_EQ(holders(0, 3), (std::vector<int32_t>{0}));
  EXPECT_EQ(holders(0, 0), (std::vector<int32_t>{0, 2}));
  EXPECT_FALSE(std::filesystem::exists(dir_c + "/replica-0-3.gguf"));
  ExpertRequestReport r = remote->expert_requests();
  EXPECT_EQ(r.dropped, 1u);
  EXPECT_EQ(r.kept, 2u);
  EXPECT_EQ(r.failed, 2u);
  EXPECT_EQ(r.pending, 0u);
  std::string held_c;
  for (const WorkerStatus& s : remote->worker_status())
    if (s.address == ca) held_c = s.experts;
  EXPECT_EQ(held_c, "0-1:0");  // its own 0:0 and the replica 1:0

  // A worker that comes back with fewer experts than it had (d lost a replica while down: another
  // backbone had it let go of, or its disk) is taken in while someone else holds what it lacks.
  remote->request_experts(da, {{0, 3, 1}});
  pass_is_local("copy to d");
  ASSERT_EQ(holders(0, 3), (std::vector<int32_t>{0, 3}));
  (*d)->kill_now();
  ASSERT_TRUE(std::filesystem::remove(dir_d + "/replica-0-3.gguf"));
  for (int i = 0; i < 8 && !remote->worker_down(3); ++i) pass_is_local("d gone");
  ASSERT_TRUE(remote->worker_down(3));
  auto d2 = WorkerProcess::spawn_command({"worker", "-m", su.path, "--experts", "0:1", "--listen", da, "-t", "1",
                                          "--replica-dir", dir_d, "--replica-mb", "64"},
                                         "worker d");
  ASSERT_TRUE(d2.is_ok()) << d2.status().to_string();
  remote->poll_rejoins(true);
  ASSERT_FALSE(remote->worker_down(3));
  EXPECT_EQ(holders(0, 3), (std::vector<int32_t>{0}));
  pass_is_local("d back");

  // b is killed: c's replica of 1:0 is its only holder now, and is kept when asked to go.
  (*b)->kill_now();
  pass_is_local("b gone");
  remote->drop_experts(ca, {{1, 0, 1}});
  pass_is_local("last holder");
  r = remote->expert_requests();
  EXPECT_EQ(r.dropped, 1u);
  EXPECT_EQ(r.kept, 3u);
  EXPECT_NE(r.last_error.find("no other live worker holds them"), std::string::npos) << r.last_error;
  EXPECT_TRUE(std::filesystem::exists(dir_c + "/replica-1-0.gguf"));
  // Asked in one go with a copy to d: the drop waits for the copy, then goes (a move c -> d).
  remote->drop_experts(ca, {{1, 0, 1}});
  remote->request_experts(da, {{1, 0, 1}});
  pass_is_local("move");
  EXPECT_EQ(holders(1, 0), (std::vector<int32_t>{1, 3}));  // b (1) is down
  EXPECT_FALSE(std::filesystem::exists(dir_c + "/replica-1-0.gguf"));
  EXPECT_TRUE(std::filesystem::exists(dir_d + "/replica-1-0.gguf"));
  r = remote->expert_requests();
  EXPECT_EQ(r.dropped, 2u);
  EXPECT_EQ(r.pending, 0u);
  // Asked again for its own 0:0: not sent (refused before), kept.
  remote->drop_experts(ca, {{0, 0, 1}});
  pass_is_local("own again");
  EXPECT_EQ(remote->expert_requests().kept, 4u);
  EXPECT_EQ(holders(0, 0), (std::vector<int32_t>{0, 2}));
}

// Two backbones share a worker (federation); one has it let go of a replica the other still routes
// to. The other's DISPATCH is answered NOT_HELD naming that expert: the pairs fail over to another
// holder in the same call (the bits stay all-local), that expert alone leaves the worker's holders,
// and the worker stays up for its others (no re-dial). When it is dialled again (a restart), it is
// taken in with the experts it announces, without the one it let go of.
TEST(RemoteFailures, ABackboneWhoseReplicaAnotherLetGoOfFailsOverAndTakesTheWorkerBack) {
  SliceSetup su = slice_setup("fed-drop", 8);
  ASSERT_TRUE(su.backbone != nullptr);
  const int E = static_cast<int>(su.model->hparams().n_expert);
  const std::string dir = temp_dir() + "/fed-drop";
  std::filesystem::remove_all(dir);
  auto a = WorkerProcess::spawn(su.path, "*:*");
  auto c = WorkerProcess::spawn(su.path, "0:0", 1, std::chrono::milliseconds(20000),
                                {"--replica-dir", dir, "--replica-mb", "64"});
  ASSERT_TRUE(a.is_ok() && c.is_ok());
  auto one = RemoteExecutor::connect(*su.backbone, {(*a)->address(), (*c)->address()}, RemoteOptions{});
  ASSERT_TRUE(one.is_ok()) << one.status().to_string();
  std::shared_ptr<RemoteExecutor> r1(std::move(*one));
  auto pass_is_local = [&](const std::shared_ptr<RemoteExecutor>& r, const char* what) {
    auto got = run_model(*su.backbone, su.toks, r);
    ASSERT_TRUE(got.is_ok()) << what << ": " << got.status().to_string();
    EXPECT_EQ(std::memcmp(got->data(), su.local.data(), got->size() * sizeof(float)), 0) << what;
  };
  pass_is_local(r1, "counting");
  // The most routed expert of layer 0 (the tokens are fixed, so the choice is too), not c's own.
  const std::vector<uint64_t> counts = r1->activation_counts();
  int hot = 1;
  for (int e = 1; e < E; ++e)
    if (counts[static_cast<size_t>(e)] > counts[static_cast<size_t>(hot)]) hot = e;
  ASSERT_GT(counts[static_cast<size_t>(hot)], 0u);
  r1->request_experts((*c)->address().to_string(), {{0, static_cast<uint32_t>(hot), 1}});
  pass_is_local(r1, "copy");
  ASSERT_EQ(r1->expert_requests().done, 1u) << r1->expert_requests().last_error;
  // The second backbone finds c holding it, and c is its cheaper holder: its pairs go there.
  RemoteOptions o2;
  o2.worker_costs = {1.0, 0.001};
  auto two = RemoteExecutor::connect(*su.backbone, {(*a)->address(), (*c)->address()}, o2);
  ASSERT_TRUE(two.is_ok()) << two.status().to_string();
  std::shared_ptr<RemoteExecutor> r2(std::move(*two));
  ASSERT_EQ(r2->placement().holders(0, hot).size(), 2u);
  r1->drop_experts((*c)->address().to_string(), {{0, static_cast<uint32_t>(hot), 1}});
  pass_is_local(r1, "drop");
  ASSERT_EQ(r1->expert_requests().dropped, 1u) << r1->expert_requests().last_error;
  pass_is_local(r2, "the other backbone, after the drop");
  EXPECT_EQ(r2->failover_stats().lacking, 1u);
  EXPECT_EQ(r2->failover_stats().failures, 0u);
  EXPECT_FALSE(r2->worker_down(1));
  EXPECT_EQ(r2->placement().holders(0, hot).size(), 1u);
  const auto c_holds = [&](const std::shared_ptr<RemoteExecutor>& r, int e) {
    const auto hs = r->placement().holders(0, e);
    return std::find(hs.begin(), hs.end(), 1) != hs.end();
  };
  EXPECT_TRUE(c_holds(r2, 0));  // its own expert: still its
  std::string held;
  for (const WorkerStatus& s : r2->worker_status())
    if (s.index == 1) held = s.experts;
  EXPECT_EQ(held, "0:0");
  const uint64_t replanned = r2->failover_stats().replanned_pairs;
  pass_is_local(r2, "after");
  EXPECT_EQ(r2->failover_stats().replanned_pairs, replanned);  // nothing fails any more
  EXPECT_EQ(r2->failover_stats().lacking, 1u);
  // Dialled again (a restart at the same address): taken in with what it announces.
  (*c)->kill_now();
  for (int i = 0; i < 8 && !r2->worker_down(1); ++i) pass_is_local(r2, "c gone");
  auto c2 =
      WorkerProcess::spawn_command({"worker", "-m", su.path, "--experts", "0:0", "--listen",
                                    (*c)->address().to_string(), "-t", "1", "--replica-dir", dir, "--replica-mb", "64"},
                                   "worker c");
  ASSERT_TRUE(c2.is_ok()) << c2.status().to_string();
  r2->poll_rejoins(true);
  ASSERT_FALSE(r2->worker_down(1));
  EXPECT_EQ(r2->placement().holders(0, hot).size(), 1u);
  EXPECT_TRUE(c_holds(r2, 0));
  pass_is_local(r2, "taken back");
}

TEST(RemoteFailures, WorkerKilledMidRunFailsWithinDeadlineWithoutFailover) {
  const std::string path = made_qwen3moe();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  auto w = WorkerProcess::spawn(path, "*:*");
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  RemoteOptions o;
  o.timeout = milliseconds(30000);
  o.failover = false;
  auto exec = RemoteExecutor::connect(**model, {(*w)->address()}, o);
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  std::shared_ptr<RemoteExecutor> remote(std::move(*exec));
  ContextParams cp;
  cp.n_threads = 1;
  cp.n_ctx = 16;
  cp.executor = remote;
  Context ctx(**model, cp);
  const auto toks = some_tokens(**model, 8);
  std::vector<float> logits(static_cast<size_t>((*model)->hparams().n_vocab) * 4);
  ASSERT_TRUE(ctx.decode(0, toks.data(), 4, logits.data()).is_ok());
  (*w)->kill_now();  // SIGKILL and reaped: the kernel has closed the worker's end
  // The dead connection is noticed (kUnavailable); only waiting out the 30 s request timeout
  // would have given kTimeout.
  Status st = ctx.decode(0, toks.data() + 4, 1, logits.data());
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  EXPECT_NE(st.message().find((*w)->address().to_string()), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("layer"), std::string::npos) << st.to_string();
  // Later steps keep failing with the same kind of error instead of hanging until the deadline.
  Status again = ctx.decode(0, toks.data() + 5, 1, logits.data());
  ASSERT_FALSE(again.is_ok());
  EXPECT_EQ(again.code(), StatusCode::kUnavailable) << again.to_string();
}

TEST(RemoteFailures, SilentWorkerTimesOutAtTheDeadlineWithoutFailover) {
  const std::string path = made_qwen3moe();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  auto w = WorkerProcess::spawn(path, "*:*");
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  RemoteOptions o;
  o.timeout = milliseconds(400);
  o.failover = false;
  auto exec = RemoteExecutor::connect(**model, {(*w)->address()}, o);
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  std::shared_ptr<RemoteExecutor> remote(std::move(*exec));
  ContextParams cp;
  cp.n_threads = 1;
  cp.n_ctx = 16;
  cp.executor = remote;
  Context ctx(**model, cp);
  const auto toks = some_tokens(**model, 4);
  std::vector<float> logits(static_cast<size_t>((*model)->hparams().n_vocab));
  ASSERT_TRUE(ctx.decode(0, toks.data(), 1, logits.data()).is_ok());
  (*w)->pause();  // alive, socket open, never answers
  const auto t0 = Clock::now();
  Status st = ctx.decode(0, toks.data() + 1, 1, logits.data());
  const auto returned = Clock::now();
  (*w)->resume();
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.to_string();
  // At the deadline, not before: each layer's requests get a deadline of timeout from their
  // submit, which is after t0 (the contract's lower bound; no upper bound: "no hang" is the
  // deadline itself plus ctest's TIMEOUT).
  EXPECT_GE(returned - t0, o.timeout);
  EXPECT_NE(st.message().find("request"), std::string::npos) << st.to_string();
}

TEST(RemoteFailures, WorkerOfAnotherModelIsRejectedByName) {
  MakeModelSpec other = MakeModelSpec::defaults_for(MakeArch::kQwen3Moe);
  other.seed = 99;  // same shape, different weights -> different identity
  other.n_expert = 16;
  other.n_expert_used = 4;
  other.n_embd = 128;
  other.n_ff_exp = 128;
  other.n_head = 4;
  other.head_dim = 32;
  other.name = "another-model";
  const std::string other_path = made_model("qwen3moe-other", other);
  auto model = Model::load(made_qwen3moe());
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  auto w = WorkerProcess::spawn(other_path, "*:*");
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  auto exec = RemoteExecutor::connect(**model, {(*w)->address()}, RemoteOptions{});
  ASSERT_FALSE(exec.is_ok());
  EXPECT_NE(exec.status().message().find((*w)->address().to_string()), std::string::npos) << exec.status().to_string();
  EXPECT_NE(exec.status().message().find("model"), std::string::npos) << exec.status().to_string();
}

// An in-process fake worker: correct handshake and PONG, then COMBINEs that answer a different
// layer than asked (or a different number of rows). The backbone must reject them.
TEST(RemoteFailures, CombineForTheWrongLayerIsCaught) {
  const std::string path = made_qwen3moe();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  auto file = gguf::File::open(path);
  ASSERT_TRUE(file.is_ok());
  auto id = swarm::model_identity(**file);
  auto shape = swarm::model_shape(**file);
  ASSERT_TRUE(id.is_ok() && shape.is_ok());
  swarm::ExpertSet all;
  for (uint32_t l : shape->moe_layers) all.ranges.push_back({l, 0, shape->n_expert});
  wire::Hello hello = swarm::make_hello(wire::PeerRole::kWorker, *id, *shape, all, "liar");
  hello.features &= ~wire::kFeatureInfo;  // a minimal worker: no capacity report (the backbone asks none)
  auto listener = net::TcpListener::listen("127.0.0.1", 0, net::TcpOptions{});
  ASSERT_TRUE(listener.is_ok());
  const uint16_t port = (*listener)->port();
  std::atomic<int> answered{0};
  std::thread fake([&] {
    auto s = (*listener)->accept(net::deadline_in(milliseconds(5000)));
    if (!s.is_ok()) return;
    auto conn = net::make_stream_connection(std::move(*s));
    if (!net::handshake(*conn, hello, false, net::deadline_in(milliseconds(5000))).is_ok()) return;
    while (true) {
      auto f = conn->recv_frame(net::deadline_in(milliseconds(5000)));
      if (!f.is_ok()) return;
      if (f->type() == wire::MsgType::kPing) {
        auto p = wire::decode_ping(*f);
        wire::PongMsg pong{p->request_id, p->send_time_ns, 0, p->reply_pad_bytes};
        (void)conn->send_frame(*wire::encode_pong(pong), net::deadline_in(milliseconds(1000)));
      } else if (f->type() == wire::MsgType::kDispatch) {
        auto d = wire::decode_dispatch(*f, wire::DecodeLimits{});
        if (!d.is_ok()) return;
        wire::CombineMsg c;
        c.request_id = d->request_id;
        c.layer = d->layer + 1;  // the lie
        c.n_tokens = d->n_tokens();
        c.mode = d->mode;
        std::vector<float> rows(static_cast<size_t>(d->n_result_rows()) * d->n_embd(), 0.25f);
        c.rows = *wire::encode_rows(d->return_dtype, rows.data(), d->n_result_rows(), d->n_embd());
        // Count before sending: the backbone may fail (and the test read the counter) before
        // this thread runs again after send_frame returns.
        answered.fetch_add(1);
        (void)conn->send_frame(*wire::encode_combine(c), net::deadline_in(milliseconds(1000)));
      } else {
        return;
      }
    }
  });
  {
    RemoteOptions o;
    o.failover = false;
    auto exec = RemoteExecutor::connect(**model, {WorkerAddress{"127.0.0.1", port}}, o);
    EXPECT_TRUE(exec.is_ok()) << exec.status().to_string();
    if (exec.is_ok()) {
      std::shared_ptr<RemoteExecutor> remote(std::move(*exec));
      auto lg = run_model(**model, some_tokens(**model, 3), remote);
      EXPECT_FALSE(lg.is_ok());
      EXPECT_NE(lg.status().message().find(fmt::format("127.0.0.1:{} (liar)", port)), std::string::npos)
          << lg.status().to_string();
      EXPECT_NE(lg.status().message().find("layer"), std::string::npos) << lg.status().to_string();
      EXPECT_EQ(answered.load(), 1);
    }
  }  // the executor says GOODBYE; the fake's next recv fails and it exits
  (*listener)->close();
  fake.join();
}

// With failover: a worker killed (SIGKILL) mid-run, one that stops answering, a replica that
// covers a dead holder on a backbone slice — the logits are the all-local ones, bit for bit.
TEST(RemoteFailures, KilledOrSilentWorkersAreCoveredAndTheBitsStay) {
  const std::string path = made_qwen3moe();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const auto toks = some_tokens(**model, 10);
  auto local = run_model(**model, toks);
  ASSERT_TRUE(local.is_ok());
  const int64_t V = (*model)->hparams().n_vocab;
  // Decodes the tokens one step at a time, calling `between` after the first step.
  auto run = [&](const Model& m, std::shared_ptr<RemoteExecutor> remote, const std::function<void()>& between) {
    ContextParams cp;
    cp.n_threads = 1;
    cp.n_ctx = 16;
    cp.executor = std::move(remote);
    Context ctx(m, cp);
    std::vector<float> out(toks.size() * static_cast<size_t>(V));
    for (size_t t = 0; t < toks.size(); ++t) {
      Status st = ctx.decode(0, &toks[t], 1, out.data() + t * V);
      EXPECT_TRUE(st.is_ok()) << "token " << t << ": " << st.to_string();
      if (!st.is_ok()) break;
      if (t == 0) between();
    }
    return out;
  };
  {  // The only worker killed: the backbone's copies take its experts.
    auto w = WorkerProcess::spawn(path, "*:*");
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    auto exec = RemoteExecutor::connect(**model, {(*w)->address()}, RemoteOptions{});
    ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
    std::shared_ptr<RemoteExecutor> remote(std::move(*exec));
    const auto got = run(**model, remote, [&] { (*w)->kill_now(); });
    EXPECT_EQ(std::memcmp(got.data(), local->data(), got.size() * sizeof(float)), 0);
    EXPECT_TRUE(remote->worker_down(0));
    EXPECT_EQ(remote->failover_stats().saved_calls, 1u);
  }
  {  // A silent worker: covered at its deadline.
    auto w = WorkerProcess::spawn(path, "*:*");
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    RemoteOptions o;
    o.timeout = milliseconds(300);
    auto exec = RemoteExecutor::connect(**model, {(*w)->address()}, o);
    ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
    std::shared_ptr<RemoteExecutor> remote(std::move(*exec));
    const auto got = run(**model, remote, [&] { (*w)->pause(); });
    (*w)->resume();
    EXPECT_EQ(std::memcmp(got.data(), local->data(), got.size() * sizeof(float)), 0);
    EXPECT_TRUE(remote->worker_down(0));
  }
  {  // A backbone slice and two workers holding every expert: one killed, the other covers it.
    const std::string bb = temp_dir() + "/qwen3moe-e16-backbone-dist.gguf";
    auto f = gguf::File::open(path);
    ASSERT_TRUE(f.is_ok());
    ASSERT_TRUE(swarm::write_backbone_slice(**f, bb).is_ok());
    auto backbone = Model::load(bb);
    ASSERT_TRUE(backbone.is_ok()) << backbone.status().to_string();
    auto a = WorkerProcess::spawn(path, "*:*");
    auto b = WorkerProcess::spawn(path, "*:*");
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    RemoteOptions o;
    o.worker_costs = {0.001, 0.001};  // equal replicas share every step (no RTT noise making one "far")
    auto exec = RemoteExecutor::connect(**backbone, {(*a)->address(), (*b)->address()}, o);
    ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
    std::shared_ptr<RemoteExecutor> remote(std::move(*exec));
    const auto got = run(**backbone, remote, [&] { (*a)->kill_now(); });
    EXPECT_EQ(std::memcmp(got.data(), local->data(), got.size() * sizeof(float)), 0);
    EXPECT_TRUE(remote->worker_down(0));
    EXPECT_FALSE(remote->worker_down(1));
    EXPECT_EQ(remote->traffic().local_pairs, 0u);
  }
}

}  // namespace
}  // namespace moesh::test
