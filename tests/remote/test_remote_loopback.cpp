// The remote executor over in-process workers: the fan-out gets its connections from a Dialer
// (RemoteOptions::dialer), here in-process loopback pairs, some wrapped in fault injection —
// no sockets, no processes. Real worker processes over TCP are tested in tests/dist.
//   - exact dispatch is bit-identical to local with replicas, and with a worker excluded (its
//     pairs go to the replica or the backbone's copy: re-planning needs no model code);
//   - a worker that fails mid-request: its pairs go to the other holders (a replica, the
//     backbone's copy) within the same call, the bits stay, and it rejoins when it answers again;
//     with no other holder (or failover off) the layer fails naming it and the experts;
//   - the fan-out hands replies over in arrival order: a slow first worker does not hold up the
//     second (so each worker's latency is its own).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>

#include "dist/dist_util.h"
#include "moesh/model/speculative.h"
#include "moesh/net/transport.h"
#include "moesh/remote/fanout.h"
#include "moesh/remote/remote.h"
#include "moesh/swarm/swarm.h"
#include "util/nextn_model.h"

namespace moesh::test {
namespace {

// In-process workers reachable through a loopback dialer at "loop:<index+1>".
struct LoopSwarm {
  std::string path;
  std::unique_ptr<Model> model;
  std::vector<std::unique_ptr<swarm::ExpertStore>> stores;
  std::vector<std::unique_ptr<swarm::Worker>> workers;
  std::map<int, net::FaultPlan> faults;  // worker index -> faults on the worker's writes
  std::vector<WorkerAddress> addrs;

  // `file`: what the worker serves (default: the model; another file plays a lying worker).
  void add_worker(const std::string& spec, const std::string& file = "") {
    auto f = gguf::File::open(file.empty() ? path : file);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    auto shape = swarm::model_shape(**f);
    ASSERT_TRUE(shape.is_ok());
    auto held = swarm::parse_expert_spec(spec, *shape);
    ASSERT_TRUE(held.is_ok()) << held.status().to_string();
    auto st = swarm::ExpertStore::open(std::move(*f), *held);
    ASSERT_TRUE(st.is_ok()) << st.status().to_string();
    swarm::WorkerOptions wo;
    wo.n_threads = 1;
    wo.name = "w" + std::to_string(workers.size());
    auto w = swarm::Worker::start(st->get(), wo);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    stores.push_back(std::move(*st));
    workers.push_back(std::move(*w));
    addrs.push_back(WorkerAddress{"loop", static_cast<uint16_t>(workers.size())});
  }

  Dialer dialer() {
    return [this](const WorkerAddress& a, net::Deadline) -> Result<std::unique_ptr<net::Connection>> {
      const int i = a.port - 1;
      if (a.host != "loop" || i < 0 || i >= static_cast<int>(workers.size())) {
        return make_error(StatusCode::kUnavailable, "no loopback worker at {}", a.to_string());
      }
      auto [mine, theirs] = net::make_loopback_streams();
      if (auto it = faults.find(i); it != faults.end()) theirs = net::wrap_with_faults(std::move(theirs), it->second);
      workers[static_cast<size_t>(i)]->serve_connection(net::make_stream_connection(std::move(theirs)));
      return net::make_stream_connection(std::move(mine));
    };
  }

  Result<std::shared_ptr<RemoteExecutor>> connect(RemoteOptions o = {}) {
    o.dialer = dialer();
    o.timeout = std::chrono::milliseconds(20000);
    // A down worker is re-dialled only when a test asks (poll_rejoins(true)): however slow the
    // build, no background re-dial changes what a test counts.
    o.rejoin_backoff = std::chrono::hours(1);
    o.rejoin_backoff_max = std::chrono::hours(1);
    MOESH_ASSIGN_OR_RETURN(auto e, RemoteExecutor::connect(*model, addrs, o));
    return std::shared_ptr<RemoteExecutor>(std::move(e));
  }
};

void open_model(LoopSwarm* s) {
  s->path = made_qwen3moe();  // 16 experts, top-4
  auto m = Model::load(s->path);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  s->model = std::move(*m);
}

// Two workers splitting the 16 experts of every layer in halves.
void halves(LoopSwarm* s) {
  ASSERT_NO_FATAL_FAILURE(open_model(s));
  ASSERT_NO_FATAL_FAILURE(s->add_worker("*:0-7"));
  ASSERT_NO_FATAL_FAILURE(s->add_worker("*:8-15"));
}

std::vector<int32_t> tokens_of(const Model& m) {
  return test_tokens("", m.hparams().n_vocab, 10);
}

TEST(RemoteLoopback, ExactWithReplicasAndAnExcludedWorkerEqualsLocal) {
  LoopSwarm s;
  ASSERT_NO_FATAL_FAILURE(open_model(&s));
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:0-11"));
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:4-15"));  // 4-11 are replicas
  const auto tokens = tokens_of(*s.model);
  auto local = run_model(*s.model, tokens);
  ASSERT_TRUE(local.is_ok()) << local.status().to_string();

  auto exec = s.connect();
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  EXPECT_GT((*exec)->placement().count_replicas(1), 0);
  auto lg = run_model(*s.model, tokens, *exec);
  ASSERT_TRUE(lg.is_ok()) << lg.status().to_string();
  EXPECT_EQ(std::memcmp(lg->data(), local->data(), local->size() * sizeof(float)), 0);
  const RemoteTraffic t1 = (*exec)->traffic();
  EXPECT_EQ(t1.local_pairs, 0u);  // the workers cover every expert
  const auto wt = (*exec)->worker_traffic();
  EXPECT_GT(wt[0].requests, 0u);
  EXPECT_GT(wt[1].requests, 0u);

  // Worker 0 excluded: 4-11 go to worker 1, 0-3 to the backbone's own weights. Same bits.
  (*exec)->set_excluded(0, true);
  (*exec)->reset_traffic();
  const uint64_t before = (*exec)->worker_traffic()[0].requests;
  lg = run_model(*s.model, tokens, *exec);
  ASSERT_TRUE(lg.is_ok()) << lg.status().to_string();
  EXPECT_EQ(std::memcmp(lg->data(), local->data(), local->size() * sizeof(float)), 0);
  EXPECT_EQ((*exec)->worker_traffic()[0].requests, before) << "an excluded worker got requests";
  EXPECT_GT((*exec)->traffic().local_pairs, 0u);
}

// EXACT requests whose tokens carry ranks 0..j (one worker holding everything: every request)
// come back as one rank-order sum per token and the combine goes on from it: the same bits with
// a fraction of the bytes; raw rows (exact_prefix_sums off) give the same bits too. With the
// experts split in halves only some requests qualify, and the bits still hold.
TEST(RemoteLoopback, ExactRankPrefixSumsKeepTheBitsWithFewerBytes) {
  LoopSwarm s;
  ASSERT_NO_FATAL_FAILURE(open_model(&s));
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:*"));
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:0-7"));
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:8-15"));
  const auto tokens = tokens_of(*s.model);
  auto local = run_model(*s.model, tokens);
  ASSERT_TRUE(local.is_ok()) << local.status().to_string();
  auto run = [&](bool sums, bool one_worker) -> RemoteTraffic {
    RemoteOptions o;
    o.exact_prefix_sums = sums;
    auto exec = s.connect(o);
    EXPECT_TRUE(exec.is_ok()) << exec.status().to_string();
    if (!exec.is_ok()) return {};
    // One worker: the two halves are excluded; halves: the whole one is.
    (*exec)->set_excluded(0, !one_worker);
    (*exec)->set_excluded(1, one_worker);
    (*exec)->set_excluded(2, one_worker);
    auto lg = run_model(*s.model, tokens, *exec);
    EXPECT_TRUE(lg.is_ok()) << lg.status().to_string();
    if (lg.is_ok()) {
      EXPECT_EQ(std::memcmp(lg->data(), local->data(), local->size() * sizeof(float)), 0)
          << "sums " << sums << " one worker " << one_worker;
    }
    const RemoteTraffic t = (*exec)->traffic();
    EXPECT_EQ(t.local_pairs, 0u);
    return t;
  };
  const RemoteTraffic rows = run(false, true), sums = run(true, true);
  EXPECT_EQ(rows.prefix_sum_requests, 0u);
  EXPECT_GT(sums.dispatch_frames, 0u);
  EXPECT_EQ(sums.prefix_sum_requests, sums.dispatch_frames) << "one worker holds every rank of every token";
  EXPECT_EQ(sums.dispatch_frames, rows.dispatch_frames);
  // top-4: 4 raw rows per token against 1 sum.
  EXPECT_LT(sums.combine_bytes * 3, rows.combine_bytes);
  const RemoteTraffic split = run(true, false);
  EXPECT_GT(split.prefix_sum_requests, 0u);
  EXPECT_LT(split.prefix_sum_requests, split.dispatch_frames);
}

TEST(RemoteLoopback, AWorkerFailingMidCallIsCoveredWithinTheCallAndRejoins) {
  LoopSwarm s;
  ASSERT_NO_FATAL_FAILURE(halves(&s));
  // Worker 1's writes: 0 HELLO, 1 PONG, 2 INFO_REPLY, 3 the first COMBINE — cut off mid-frame.
  net::FaultPlan fp;
  fp.schedule = {{3, net::FaultKind::kCloseMidFrame}};
  s.faults[1] = fp;
  const auto tokens = tokens_of(*s.model);
  auto local = run_model(*s.model, tokens);
  ASSERT_TRUE(local.is_ok());

  {  // Failover off: the layer fails, naming the worker.
    RemoteOptions o;
    o.failover = false;
    auto exec = s.connect(o);
    ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
    auto bad = run_model(*s.model, tokens, *exec);
    ASSERT_FALSE(bad.is_ok());
    EXPECT_NE(bad.status().message().find("(w1)"), std::string::npos) << bad.status().message();
    EXPECT_EQ((*exec)->last_failed_workers(), std::vector<size_t>{1});
    EXPECT_GE((*exec)->worker_traffic()[1].errors, 1u);
    EXPECT_FALSE((*exec)->worker_down(1));
  }
  // Failover on (the default): worker 1's pairs of that call go to the backbone's copies in the
  // same call — nothing fails, the bits are the all-local ones — and worker 1 is left out.
  auto exec = s.connect();
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  auto lg = run_model(*s.model, tokens, *exec);
  ASSERT_TRUE(lg.is_ok()) << lg.status().to_string();
  EXPECT_EQ(std::memcmp(lg->data(), local->data(), local->size() * sizeof(float)), 0);
  EXPECT_TRUE((*exec)->worker_down(1));
  EXPECT_FALSE((*exec)->worker_down(0));
  const auto fo = (*exec)->failover_stats();
  EXPECT_EQ(fo.failures, 1u);
  EXPECT_EQ(fo.saved_calls, 1u);
  EXPECT_GT(fo.replanned_pairs, 0u);
  EXPECT_GT((*exec)->traffic().local_pairs, 0u);

  // A re-dial while it still fails (the same fault on the new connection's first COMBINE)
  // takes it back, it fails again and is covered again; once healthy it rejoins for good.
  (*exec)->poll_rejoins(/*wait=*/true);
  EXPECT_FALSE((*exec)->worker_down(1));
  EXPECT_EQ((*exec)->failover_stats().rejoins, 1u);
  lg = run_model(*s.model, tokens, *exec);
  ASSERT_TRUE(lg.is_ok()) << lg.status().to_string();
  EXPECT_EQ(std::memcmp(lg->data(), local->data(), local->size() * sizeof(float)), 0);
  EXPECT_TRUE((*exec)->worker_down(1));
  EXPECT_EQ((*exec)->failover_stats().failures, 2u);
  s.faults.erase(1);
  (*exec)->poll_rejoins(/*wait=*/true);
  EXPECT_FALSE((*exec)->worker_down(1));
  (*exec)->reset_traffic();
  const uint64_t before = (*exec)->worker_traffic()[1].requests;
  lg = run_model(*s.model, tokens, *exec);
  ASSERT_TRUE(lg.is_ok()) << lg.status().to_string();
  EXPECT_EQ(std::memcmp(lg->data(), local->data(), local->size() * sizeof(float)), 0);
  EXPECT_GT((*exec)->worker_traffic()[1].requests, before) << "the rejoined worker is used again";
  EXPECT_EQ((*exec)->traffic().local_pairs, 0u);
  EXPECT_EQ((*exec)->failover_stats().failures, 2u);
}

// A backbone slice (no expert weights of its own) and a replica worker: a failing holder's
// pairs go to the replica; with no replica left for some experts the call fails naming them.
TEST(RemoteLoopback, FailoverToAReplicaAndAClearErrorWithoutOne) {
  LoopSwarm s;
  ASSERT_NO_FATAL_FAILURE(open_model(&s));
  const auto tokens = tokens_of(*s.model);
  auto local = run_model(*s.model, tokens);
  ASSERT_TRUE(local.is_ok());
  const std::string bb = temp_dir() + "/qwen3moe-e16-backbone.gguf";
  {
    auto f = gguf::File::open(s.path);
    ASSERT_TRUE(f.is_ok());
    ASSERT_TRUE(swarm::write_backbone_slice(**f, bb).is_ok());
  }
  auto backbone = Model::load(bb);
  ASSERT_TRUE(backbone.is_ok()) << backbone.status().to_string();
  s.model = std::move(*backbone);
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:0-7"));
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:8-15"));
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:0-7"));  // worker 2: a replica of worker 0
  net::FaultPlan fp;
  fp.schedule = {
      {3, net::FaultKind::kCorrupt}};  // the first COMBINE (after HELLO, PONG, INFO_REPLY) fails its checksum
  s.faults[0] = fp;
  RemoteOptions o;
  o.worker_costs = {0.001, 0.001, 0.010};  // worker 2 is far: it gets pairs only when 0 is down
  auto exec = s.connect(o);
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  auto lg = run_model(*s.model, tokens, *exec);
  ASSERT_TRUE(lg.is_ok()) << lg.status().to_string();
  EXPECT_EQ(std::memcmp(lg->data(), local->data(), local->size() * sizeof(float)), 0);
  EXPECT_TRUE((*exec)->worker_down(0));
  EXPECT_GT((*exec)->worker_traffic()[2].requests, 0u) << "the replica took worker 0's experts";
  EXPECT_EQ((*exec)->traffic().local_pairs, 0u);

  // Worker 1 (the only holder of 8-15) failing now: nobody else has its experts.
  s.faults[1] = net::FaultPlan{};
  s.faults[1].schedule = {{3, net::FaultKind::kCloseMidFrame}};
  auto exec2 = s.connect(o);
  ASSERT_TRUE(exec2.is_ok()) << exec2.status().to_string();
  auto bad = run_model(*s.model, tokens, *exec2);
  ASSERT_FALSE(bad.is_ok());
  const std::string msg = bad.status().to_string();
  EXPECT_NE(msg.find("(w1)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("failover"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expert"), std::string::npos) << msg;
  EXPECT_EQ(bad.status().code(), StatusCode::kUnavailable) << msg;
}

TEST(RemoteLoopback, BothWorkersFailingAreBothNamedOrBothCovered) {
  LoopSwarm s;
  ASSERT_NO_FATAL_FAILURE(halves(&s));
  net::FaultPlan fp;
  fp.schedule = {
      {3, net::FaultKind::kCorrupt}};  // the first COMBINE (after HELLO, PONG, INFO_REPLY) fails its checksum
  s.faults[0] = fp;
  s.faults[1] = fp;
  RemoteOptions off;
  off.failover = false;
  auto exec = s.connect(off);
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  auto bad = run_model(*s.model, tokens_of(*s.model), *exec);
  ASSERT_FALSE(bad.is_ok());
  const std::string msg = bad.status().message();
  EXPECT_NE(msg.find("2 workers failed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(w0)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(w1)"), std::string::npos) << msg;
  EXPECT_EQ((*exec)->last_failed_workers(), (std::vector<size_t>{0, 1}));
  // With failover the backbone's copies cover both.
  auto local = run_model(*s.model, tokens_of(*s.model));
  ASSERT_TRUE(local.is_ok());
  auto exec_fo = s.connect();
  ASSERT_TRUE(exec_fo.is_ok());
  auto lg = run_model(*s.model, tokens_of(*s.model), *exec_fo);
  ASSERT_TRUE(lg.is_ok()) << lg.status().to_string();
  EXPECT_EQ(std::memcmp(lg->data(), local->data(), local->size() * sizeof(float)), 0);
  EXPECT_TRUE((*exec_fo)->worker_down(0) && (*exec_fo)->worker_down(1));
  EXPECT_EQ((*exec_fo)->failover_stats().failures, 2u);
}

TEST(RemoteLoopback, RepliesAreTakenInArrivalOrder) {
  LoopSwarm s;
  ASSERT_NO_FATAL_FAILURE(halves(&s));
  // Worker 0 (first in worker order) holds its fourth write (after HELLO, the warm-up PONG and INFO_REPLY)
  // back; worker 1 answers at once.
  net::FaultPlan fp;
  fp.schedule = {{3, net::FaultKind::kDelay}};
  fp.delay = std::chrono::milliseconds(1000);
  s.faults[0] = fp;
  RemoteOptions ro;
  ro.dialer = s.dialer();
  auto hello = backbone_hello(*s.model, ro);
  ASSERT_TRUE(hello.is_ok()) << hello.status().to_string();
  std::vector<std::unique_ptr<WorkerLink>> links;
  for (const auto& a : s.addrs) {
    auto l = connect_worker(a, *hello, ro.link_options());
    ASSERT_TRUE(l.is_ok()) << l.status().to_string();
    links.push_back(std::move(*l));
  }
  FanOut fan(std::move(links));
  std::vector<FanOut::Outstanding> reqs;
  for (size_t w = 0; w < 2; ++w) {
    wire::PingMsg p;
    p.request_id = fan.next_request_id(w);
    auto f = wire::encode_ping(p);
    ASSERT_TRUE(f.is_ok());
    ASSERT_TRUE(fan.start(w, p.request_id, *f, net::deadline_in(std::chrono::seconds(5))).is_ok());
    reqs.push_back({w, p.request_id});
  }
  std::vector<size_t> order;
  std::vector<net::Clock::time_point> at;
  fan.gather(reqs, net::deadline_in(std::chrono::seconds(20)), [&](FanOut::Reply&& r) {
    EXPECT_TRUE(r.frame.is_ok()) << r.frame.status().to_string();
    order.push_back(reqs[r.index].worker);
    at.push_back(r.arrived);
  });
  ASSERT_EQ(order, (std::vector<size_t>{1, 0})) << "replies were not handed over in arrival order";
  EXPECT_LE(at[0], at[1]);
}

// n greedy tokens after `prompt`, one plain decode per token, all local.
std::vector<int32_t> greedy_local(const Model& m, const std::vector<int32_t>& prompt, int n) {
  const int64_t V = m.hparams().n_vocab;
  Context ctx(m, ContextParams{1, 128, nullptr});
  std::vector<float> lg(static_cast<size_t>(V));
  std::vector<int32_t> out;
  Status st = ctx.decode(0, prompt.data(), static_cast<int64_t>(prompt.size()), lg.data(), false);
  while (st.is_ok() && static_cast<int>(out.size()) < n) {
    const int32_t t = argmax(lg.data(), V);
    out.push_back(t);
    st = ctx.decode(0, &t, 1, lg.data(), false);
  }
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return out;
}

// n greedy tokens after `prompt` through SpeculativeDecoder with `draft` (verifying every draft,
// at most draft_max a pass); exec's traffic then counts the generation's trips only.
std::vector<int32_t> speculate(Context& ctx, RemoteExecutor& exec, DraftSource* draft, int draft_max,
                               const std::vector<int32_t>& prompt, int n, SpeculativeStats* stats) {
  Sampler sampler(SamplingParams{});
  SpeculativeDecoder dec(&ctx, 0, &sampler, draft, SpeculativeParams{draft_max, /*adaptive=*/false});
  int32_t first = -1;
  Status st = dec.start(prompt, &first);
  exec.reset_traffic();
  std::vector<int32_t> got = {first}, step;
  while (st.is_ok() && static_cast<int>(got.size()) < n) {
    st = dec.step(n - static_cast<int>(got.size()), &step);
    got.insert(got.end(), step.begin(), step.end());
  }
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  *stats = dec.stats();
  return got;
}

// Proposes the known continuation (every draft kept) or a shifted one (every draft rejected).
class KnownDraft final : public DraftSource {
 public:
  KnownDraft(std::vector<int32_t> truth, size_t prompt_len, int shift)
      : truth_(std::move(truth)), prompt_len_(prompt_len), shift_(shift) {}
  void propose(int32_t, std::span<const int32_t> h, int max_tokens, std::vector<int32_t>* out) override {
    out->clear();
    for (size_t i = h.size() - prompt_len_; i < truth_.size() && static_cast<int>(out->size()) < max_tokens; ++i) {
      const int32_t t = truth_[i];
      out->push_back(shift_ == 0 ? t : (t == 0 ? 1 : t - 1));  // a valid id that is not the truth
    }
  }
  std::string name() const override { return "known"; }

 private:
  std::vector<int32_t> truth_;
  size_t prompt_len_;
  int shift_;
};

TEST(RemoteLoopback, SpeculativeDecodingThroughWorkersIsPlainLocalWithFewerTrips) {
  LoopSwarm s;
  ASSERT_NO_FATAL_FAILURE(halves(&s));
  const auto prompt = tokens_of(*s.model);
  constexpr int kN = 24;
  int n_moe = 0;
  for (const auto& l : s.model->layers) n_moe += l.is_moe;
  const std::vector<int32_t> want = greedy_local(*s.model, prompt, kN);  // plain greedy, all local
  for (const int shift : {0, 1}) {
    SCOPED_TRACE(shift == 0 ? "drafts always right" : "drafts always wrong");
    auto exec = s.connect();
    ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
    Context ctx(*s.model, ContextParams{1, 128, *exec});
    KnownDraft draft(want, prompt.size(), shift);
    SpeculativeStats ss;
    EXPECT_EQ(speculate(ctx, **exec, &draft, 8, prompt, kN, &ss), want);
    // One executor call (a star round trip to the workers) per MoE layer per forward pass.
    const RemoteTraffic t = (*exec)->traffic();
    EXPECT_EQ(t.layer_calls, static_cast<uint64_t>(ss.steps * n_moe));
    if (shift == 0) {
      EXPECT_LT(ss.steps * 3, kN - 1) << "right drafts should need far fewer passes";
    } else {
      EXPECT_EQ(ss.accepted, 0);
      EXPECT_EQ(ss.steps, kN - 1);
    }
  }
}

// The NextN head on a backbone that holds no decoder experts (a backbone slice; it keeps the
// head's own block and experts): the head runs on the backbone, so drafting adds no round trip —
// one executor call per MoE layer per forward pass, as without it — and the output is plain
// local decoding. The bigram model's head (util/nextn_model.h) drafts right, so the steps drop.
TEST(RemoteLoopback, NextnHeadOnABackboneSliceDraftsWithoutTrips) {
  LoopSwarm s;
  s.path = temp_dir() + "/glm4moe-bigram.gguf";
  ASSERT_TRUE(write_nextn_bigram_model(s.path).is_ok());
  auto full = Model::load(s.path);
  ASSERT_TRUE(full.is_ok()) << full.status().to_string();
  const std::string bb = temp_dir() + "/glm4moe-bigram-backbone.gguf";
  {
    auto f = gguf::File::open(s.path);
    ASSERT_TRUE(f.is_ok());
    ASSERT_TRUE(swarm::write_backbone_slice(**f, bb).is_ok());
    auto b = gguf::File::open(bb);
    ASSERT_TRUE(b.is_ok());
    EXPECT_EQ((*b)->find_tensor("blk.1.ffn_gate_exps.weight"), nullptr);
    EXPECT_NE((*b)->find_tensor("blk.3.ffn_gate_exps.weight"), nullptr) << "the head's experts stay";
  }
  auto backbone = Model::load(bb);
  ASSERT_TRUE(backbone.is_ok()) << backbone.status().to_string();
  s.model = std::move(*backbone);
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:0-3"));
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:4-7"));
  int n_moe = 0;
  for (const auto& l : s.model->layers) n_moe += l.is_moe;
  const auto prompt = tokens_of(**full);
  constexpr int kN = 20;
  const std::vector<int32_t> want = greedy_local(**full, prompt, kN);
  auto exec = s.connect();
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  Context ctx(*s.model, ContextParams{1, 128, *exec});
  auto head = make_draft_source("nextn", DraftEnv{s.model.get(), &ctx.pool(), 128});
  ASSERT_TRUE(head.is_ok()) << head.status().to_string();
  SpeculativeStats ss;
  EXPECT_EQ(speculate(ctx, **exec, head->get(), 3, prompt, kN, &ss), want);
  const RemoteTraffic t = (*exec)->traffic();
  EXPECT_EQ(t.layer_calls, static_cast<uint64_t>(ss.steps * n_moe));
  EXPECT_EQ(t.local_pairs, 0u);
  EXPECT_EQ(ss.accepted, ss.drafted);
  EXPECT_LE(ss.steps, (kN - 1 + 3) / 4);
}

// A multi-sequence run: 5 prompts of different lengths prefilled in one batch, then kSteps decode
// steps of all 5 together. Returns every logits row, in order.
Result<std::vector<float>> run_streams(const Model& m, std::shared_ptr<ExpertExecutor> exec, MicroBatching mb,
                                       int steps, MicroBatchStats* stats = nullptr) {
  constexpr int kSeqs = 5;
  Context ctx(m, ContextParams{1, 64, std::move(exec), mb});
  const int64_t V = m.hparams().n_vocab;
  std::vector<Context::BatchToken> batch;
  for (int q = 0; q < kSeqs; ++q) {
    const auto toks = test_tokens("stream" + std::to_string(q), m.hparams().n_vocab, 3 + 2 * q);
    for (size_t i = 0; i < toks.size(); ++i) batch.push_back({q, toks[i], i + 1 == toks.size()});
  }
  std::vector<float> all, lg(static_cast<size_t>(kSeqs * V));
  for (int step = 0; step <= steps; ++step) {
    MOESH_RETURN_IF_ERROR(ctx.decode_batch(batch, lg.data()));
    all.insert(all.end(), lg.begin(), lg.end());
    batch.clear();
    for (int q = 0; q < kSeqs; ++q) batch.push_back({q, argmax(lg.data() + q * V, V), true});
  }
  if (stats != nullptr) *stats = ctx.micro_batch_stats();
  return all;
}

TEST(RemoteLoopback, TwoMicroBatchesGiveTheSameBitsWithTheirTripsOverlapped) {
  LoopSwarm s;
  ASSERT_NO_FATAL_FAILURE(halves(&s));
  constexpr int kSteps = 6;
  int n_moe = 0;
  for (const auto& l : s.model->layers) n_moe += l.is_moe;
  ASSERT_EQ(n_moe, s.model->hparams().n_layer);  // the schedule below counts on every layer being MoE
  auto local = run_streams(*s.model, nullptr, MicroBatching::kOn, kSteps);  // local: never split
  ASSERT_TRUE(local.is_ok()) << local.status().to_string();

  for (const MicroBatching mb : {MicroBatching::kOff, MicroBatching::kOn, MicroBatching::kAuto}) {
    SCOPED_TRACE(static_cast<int>(mb));
    auto exec = s.connect();
    ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
    MicroBatchStats st;
    auto got = run_streams(*s.model, *exec, mb, kSteps, &st);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    ASSERT_EQ(got->size(), local->size());
    EXPECT_EQ(std::memcmp(got->data(), local->data(), local->size() * sizeof(float)), 0);
    const RemoteTraffic t = (*exec)->traffic();
    EXPECT_EQ(st.steps_whole + st.steps_split, static_cast<uint64_t>(kSteps + 1));
    // Split steps make two calls per layer; all but a step's first are submitted while the other
    // half's call is still out (pre0(0) pre1(0) | post0(l) pre0(l+1) post1(l) pre1(l+1) ...).
    EXPECT_EQ(t.layer_calls, (st.steps_whole + 2 * st.steps_split) * n_moe);
    EXPECT_EQ(t.overlapped_calls, st.steps_split * (2 * n_moe - 1));
    if (mb == MicroBatching::kOff) {
      EXPECT_EQ(st.steps_split, 0u);
    }
    if (mb == MicroBatching::kOn) {
      EXPECT_EQ(st.steps_whole, 0u);
    }
    // kAuto measures both ways before it chooses: two whole steps, then two split ones.
    if (mb == MicroBatching::kAuto) {
      EXPECT_GE(st.steps_whole, 2u);
      EXPECT_GE(st.steps_split, 2u);
    }
  }
}

TEST(RemoteLoopback, AWorkerFailingUnderTwoMicroBatchesLeavesNothingPending) {
  LoopSwarm s;
  ASSERT_NO_FATAL_FAILURE(halves(&s));
  net::FaultPlan fp;
  fp.schedule = {{5, net::FaultKind::kCloseMidFrame}};  // HELLO, PONG, INFO_REPLY, 2 COMBINEs, then cut
  s.faults[1] = fp;
  auto local = run_streams(*s.model, nullptr, MicroBatching::kOn, 2);
  ASSERT_TRUE(local.is_ok());
  RemoteOptions off;
  off.failover = false;
  auto exec = s.connect(off);
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  auto bad = run_streams(*s.model, *exec, MicroBatching::kOn, 2);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("(w1)"), std::string::npos) << bad.status().message();
  // The same executor, worker 1 excluded: nothing of the failed step is left in flight.
  (*exec)->set_excluded(1, true);
  MicroBatchStats st;
  auto good = run_streams(*s.model, *exec, MicroBatching::kOn, 2, &st);
  ASSERT_TRUE(good.is_ok()) << good.status().to_string();
  EXPECT_EQ(std::memcmp(good->data(), local->data(), local->size() * sizeof(float)), 0);
  EXPECT_EQ(st.steps_split, 3u);
  // With failover the failing half is covered inside its call, the other half's trip untouched.
  auto exec_fo = s.connect();
  ASSERT_TRUE(exec_fo.is_ok());
  MicroBatchStats st2;
  auto covered = run_streams(*s.model, *exec_fo, MicroBatching::kOn, 2, &st2);
  ASSERT_TRUE(covered.is_ok()) << covered.status().to_string();
  EXPECT_EQ(std::memcmp(covered->data(), local->data(), local->size() * sizeof(float)), 0);
  // Both halves had a request out on worker 1 when its connection was cut: both are covered.
  EXPECT_EQ((*exec_fo)->failover_stats().saved_calls, 2u);
}

// ---- hot experts kept on the backbone (--local-experts-mb) ----------------------------------------

uint64_t expert_bytes(const Model& m) {
  const ExpertWeights& w = m.layers[0].experts;
  return expert_slab_bytes(w.gate) + expert_slab_bytes(w.up) + expert_slab_bytes(w.down);
}

// The backbone slice of s's model (no routed experts), written under `name` and loaded.
void load_backbone(const LoopSwarm& s, const std::string& name, std::unique_ptr<Model>* out) {
  auto full = gguf::File::open(s.path);
  ASSERT_TRUE(full.is_ok());
  const std::string bb = temp_dir() + "/" + name;
  ASSERT_TRUE(swarm::write_backbone_slice(**full, bb).is_ok());
  auto m = Model::load(bb);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  *out = std::move(*m);
}

// Greedy decode of n tokens after `prompt` (one sequence); returns every logits row.
Result<std::vector<float>> greedy_rows(const Model& m, std::shared_ptr<ExpertExecutor> exec, int n,
                                       const std::function<void(int)>& after_step = {}) {
  Context ctx(m, ContextParams{1, 128, std::move(exec)});
  const int64_t V = m.hparams().n_vocab;
  const auto prompt = tokens_of(m);
  std::vector<float> lg(static_cast<size_t>(V)), all;
  MOESH_RETURN_IF_ERROR(ctx.decode(0, prompt.data(), static_cast<int64_t>(prompt.size()), lg.data(), false));
  all = lg;
  for (int i = 0; i < n; ++i) {
    const int32_t t = argmax(lg.data(), V);
    MOESH_RETURN_IF_ERROR(ctx.decode(0, &t, 1, lg.data(), false));
    all.insert(all.end(), lg.begin(), lg.end());
    if (after_step) after_step(i);
  }
  return all;
}

TEST(RemoteLoopback, HotExpertsWithinABudgetTakeAWholeLayerOffTheWireAndKeepTheBits) {
  LoopSwarm s;
  ASSERT_NO_FATAL_FAILURE(halves(&s));
  const int n_moe = static_cast<int>(s.model->hparams().n_layer);
  const int64_t E = s.model->hparams().n_expert;
  auto local = greedy_rows(*s.model, nullptr, 12);
  ASSERT_TRUE(local.is_ok());
  for (const LocalExpertPolicy pol : {LocalExpertPolicy::kTripAware, LocalExpertPolicy::kHottest}) {
    SCOPED_TRACE(pol == LocalExpertPolicy::kTripAware ? "trip-aware" : "hottest");
    RemoteOptions o;
    o.local_experts_bytes = static_cast<uint64_t>(E) * expert_bytes(*s.model);  // one layer's worth
    o.local_policy = pol;
    o.hot_plan_after_tokens = 8;      // the prompt's 10 tokens are enough
    o.worker_costs = {0.010, 0.010};  // equal links (measured loopback latencies are noise)
    auto exec = s.connect(o);
    ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
    RemoteTraffic before_plan, after_plan;
    auto got = greedy_rows(*s.model, *exec, 12, [&](int i) {
      if (i == 3) (*exec)->reset_traffic();
      if (i == 11) after_plan = (*exec)->traffic();
    });
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    // Exact mode: where an expert runs never changes the bits.
    EXPECT_EQ(std::memcmp(got->data(), local->data(), local->size() * sizeof(float)), 0);
    const HotExpertReport h = (*exec)->hot_experts();
    EXPECT_GE(h.plans, 1u);
    EXPECT_GT(h.experts, 0);
    EXPECT_LE(h.bytes, o.local_experts_bytes);
    EXPECT_EQ(h.fetched, 0u);  // a backbone on the full model maps them from its own file
    EXPECT_GT(after_plan.local_pairs, 0u);
    // Counted activations: every token of every layer, k each.
    uint64_t pairs = 0;
    for (const uint64_t c : (*exec)->activation_counts()) pairs += c;
    EXPECT_EQ(pairs, (*exec)->routed_tokens()[0] * n_moe * s.model->hparams().n_expert_used);
    if (pol == LocalExpertPolicy::kTripAware) {
      // Uniform-ish activations, 8 experts per worker: scattered hot experts cannot remove a trip,
      // a whole local layer removes one per token — the trip-aware planner takes the layer.
      EXPECT_EQ(h.layers_all_local, 1);
      EXPECT_EQ(after_plan.layer_calls, static_cast<uint64_t>(8 * (n_moe - 1)));  // 8 tokens after the reset
      EXPECT_LT(h.predicted_s_chosen, h.predicted_s_none);
    }
  }
}

TEST(RemoteLoopback, ABackboneSliceFetchesHotExpertsAndChecksThemAgainstTheModelsHashes) {
  LoopSwarm s;
  ASSERT_NO_FATAL_FAILURE(halves(&s));
  std::unique_ptr<Model> bbm;
  ASSERT_NO_FATAL_FAILURE(load_backbone(s, "hot-backbone.gguf", &bbm));
  auto local = greedy_rows(*s.model, nullptr, 10);
  ASSERT_TRUE(local.is_ok());

  RemoteOptions o;
  o.local_experts_bytes = 16 * expert_bytes(*s.model);
  o.hot_plan_after_tokens = 8;
  o.worker_costs = {0.010, 0.010};
  o.dialer = s.dialer();
  auto e = RemoteExecutor::connect(*bbm, s.addrs, o);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  std::shared_ptr<RemoteExecutor> exec(std::move(*e));
  auto got = greedy_rows(*bbm, exec, 10);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(std::memcmp(got->data(), local->data(), local->size() * sizeof(float)), 0);
  const HotExpertReport h = exec->hot_experts();
  EXPECT_EQ(h.fetch_failures, 0u) << h.last_fetch_error;
  EXPECT_EQ(h.fetched, 16u);
  EXPECT_EQ(h.fetched_bytes, 16 * expert_bytes(*s.model));
  EXPECT_EQ(h.layers_all_local, 1);
  EXPECT_GT(exec->traffic().local_pairs, 0u);
}

// A copy of the model with some bytes of every gate expert changed: the same metadata (so the
// same identity in HELLO), other weights — a worker serving it lies. "" on failure.
std::string write_liar(const LoopSwarm& s) {
  const std::string liar = temp_dir() + "/qwen3moe-e16-other-weights.gguf";
  auto f = gguf::File::open(s.path);
  if (!f.is_ok()) return "";
  std::ifstream in(s.path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (int l = 0; l < s.model->hparams().n_layer; ++l) {
    const gguf::TensorInfo* ti = (*f)->find_tensor(fmt::format("blk.{}.ffn_gate_exps.weight", l));
    if (ti == nullptr) return "";
    const size_t at = (*f)->data_offset() + ti->offset;
    for (size_t i = 0; i < ti->n_bytes; i += 64) bytes[at + i] ^= 0x11;  // every expert's slab
  }
  std::ofstream(liar, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return liar;
}

// --verify-rate: a worker returning other results is caught by the backbone's recomputation,
// evicted for good, and its pairs are recomputed — the output is the all-local one.
TEST(RemoteLoopback, ALyingWorkerIsCaughtByVerificationAndEvicted) {
  LoopSwarm s;
  ASSERT_NO_FATAL_FAILURE(open_model(&s));
  const std::string liar = write_liar(s);
  ASSERT_FALSE(liar.empty());
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:0-7"));
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:8-15", liar));
  const auto tokens = tokens_of(*s.model);
  auto local = run_model(*s.model, tokens);
  ASSERT_TRUE(local.is_ok());
  {  // Every request verified: the first lie is caught, nothing wrong gets into the output.
    RemoteOptions o;
    o.verify_rate = 1.0;
    auto exec = s.connect(o);
    ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
    auto lg = run_model(*s.model, tokens, *exec);
    ASSERT_TRUE(lg.is_ok()) << lg.status().to_string();
    EXPECT_EQ(std::memcmp(lg->data(), local->data(), local->size() * sizeof(float)), 0);
    const auto fo = (*exec)->failover_stats();
    EXPECT_EQ(fo.evictions, 1u);
    EXPECT_EQ(fo.mismatches, 1u);
    EXPECT_GT(fo.verified, 1u);
    EXPECT_TRUE((*exec)->worker_down(1));
    EXPECT_FALSE((*exec)->worker_down(0));
    const auto wt = (*exec)->worker_traffic();
    EXPECT_TRUE(wt[1].evicted);
    EXPECT_EQ(wt[1].requests, 1u) << "evicted at its first request";
    EXPECT_EQ(wt[0].mismatches, 0u);
    (*exec)->poll_rejoins(/*wait=*/true);
    EXPECT_TRUE((*exec)->worker_down(1)) << "an evicted worker is not re-dialled";
  }
  {  // At 5 %: caught within 100 of its requests (seeded, so the same calls are checked each run).
    RemoteOptions o;
    o.verify_rate = 0.05;
    o.verify_seed = 7;
    auto exec = s.connect(o);
    ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
    auto rows = greedy_rows(*s.model, *exec, 100);
    ASSERT_TRUE(rows.is_ok()) << rows.status().to_string();
    const auto wt = (*exec)->worker_traffic();
    EXPECT_TRUE(wt[1].evicted);
    EXPECT_LE(wt[1].requests, 100u);
    EXPECT_EQ((*exec)->failover_stats().evictions, 1u);
  }
}

// A backbone slice holds no expert to recompute with: --verify-rate asks a second holder, and a
// third decides a disagreement. With two honest replicas and a liar the liar is evicted and the
// output is the all-local one; with one honest worker and a liar (no third opinion) the call
// fails, saying why, rather than use an answer that may be wrong.
TEST(RemoteLoopback, ABackboneSliceVerifiesOnASecondReplicaAndAThirdDecides) {
  LoopSwarm s;
  ASSERT_NO_FATAL_FAILURE(open_model(&s));
  const std::string liar = write_liar(s);
  ASSERT_FALSE(liar.empty());
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:*"));
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:*", liar));
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:*"));
  std::unique_ptr<Model> bbm;
  ASSERT_NO_FATAL_FAILURE(load_backbone(s, "verify-backbone.gguf", &bbm));
  const auto tokens = tokens_of(*s.model);
  auto local = run_model(*s.model, tokens);
  ASSERT_TRUE(local.is_ok());
  RemoteOptions o;
  o.dialer = s.dialer();
  o.verify_rate = 1.0;
  o.worker_costs = {0.001, 0.001, 0.001};  // all three share the work
  {
    auto e = RemoteExecutor::connect(*bbm, s.addrs, o);
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    std::shared_ptr<RemoteExecutor> exec(std::move(*e));
    auto lg = run_model(*bbm, tokens, exec);
    ASSERT_TRUE(lg.is_ok()) << lg.status().to_string();
    EXPECT_EQ(std::memcmp(lg->data(), local->data(), local->size() * sizeof(float)), 0);
    const auto fo = exec->failover_stats();
    EXPECT_EQ(fo.evictions, 1u);
    EXPECT_GT(fo.verified, 1u);
    const auto wt = exec->worker_traffic();
    EXPECT_FALSE(wt[0].evicted);
    EXPECT_TRUE(wt[1].evicted) << "the liar, outvoted";
    EXPECT_FALSE(wt[2].evicted);
    EXPECT_EQ(exec->traffic().local_pairs, 0u);
  }
  {  // Only the honest worker and the liar: no third opinion.
    std::vector<WorkerAddress> two = {s.addrs[0], s.addrs[1]};
    RemoteOptions o2 = o;
    o2.worker_costs = {0.001, 0.001};
    auto e = RemoteExecutor::connect(*bbm, two, o2);
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    auto lg = run_model(*bbm, tokens, std::shared_ptr<RemoteExecutor>(std::move(*e)));
    ASSERT_FALSE(lg.is_ok());
    EXPECT_NE(lg.status().message().find("no third holder of these experts can tell which is right"), std::string::npos)
        << lg.status().to_string();
  }
}

// A straggler: of two replicas of every expert, one turns slow after the start (its replies wait
// 30 ms from its 12th write on). The median of its recent trips becomes its cost, so it is taken
// off the hot path and the other replica computes everything; the bits stay the all-local ones.
TEST(RemoteLoopback, AWorkerThatTurnsSlowIsTakenOffTheHotPath) {
  LoopSwarm s;
  ASSERT_NO_FATAL_FAILURE(open_model(&s));
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:*"));
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:*"));
  net::FaultPlan slow;
  slow.delay = std::chrono::milliseconds(30);
  for (uint64_t n = 13; n < 4000; ++n) slow.schedule.emplace_back(n, net::FaultKind::kDelay);
  s.faults[1] = slow;
  std::unique_ptr<Model> bbm;
  ASSERT_NO_FATAL_FAILURE(load_backbone(s, "straggler-backbone.gguf", &bbm));
  auto local = greedy_rows(*s.model, nullptr, 64);
  ASSERT_TRUE(local.is_ok());
  RemoteOptions o;  // measured costs (no worker_costs): the planner follows what the trips cost
  o.dialer = s.dialer();
  o.planner.near_slack_s = 0.005;
  auto e = RemoteExecutor::connect(*bbm, s.addrs, o);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  std::shared_ptr<RemoteExecutor> exec(std::move(*e));
  uint64_t slow_at_48 = 0;
  auto got = greedy_rows(*bbm, exec, 64, [&](int i) {
    if (i == 47) slow_at_48 = exec->worker_traffic()[1].requests;
  });
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(std::memcmp(got->data(), local->data(), local->size() * sizeof(float)), 0);
  const auto wt = exec->worker_traffic();
  EXPECT_GT(wt[1].requests, 0u) << "it was used while it was fast";
  EXPECT_EQ(wt[1].requests, slow_at_48) << "no requests in the last 16 steps: demoted";
  EXPECT_GT(wt[0].requests, wt[1].requests);
  EXPECT_EQ(wt[1].errors, 0u) << "slow, not failed";
  // What /swarm/status reports and the planner prices it by (plan/live.h): each of its recent
  // trips waited the injected 30 ms, which its fastest (from before) did not.
  const auto ws = exec->worker_status();
  EXPECT_GE(ws[1].recent_trip_ms - ws[1].min_latency_ms, 30.0 * 0.9) << ws[1].recent_trip_ms;
}

TEST(RemoteLoopback, AReplicaJudgedFarByItsWarmUpIsProbedAndUsedWhenNear) {
  // A loaded host can blow up the one padded warm-up PING: a near replica then looks far, gets no
  // trip and so nothing measured. An idle probe PING (check_stragglers) re-measures it. A replica
  // that is really far answers the probe slowly too and stays off the hot path.
  for (const bool really_far : {false, true}) {
    SCOPED_TRACE(really_far ? "really far" : "a slow warm-up only");
    LoopSwarm s;
    ASSERT_NO_FATAL_FAILURE(open_model(&s));
    ASSERT_NO_FATAL_FAILURE(s.add_worker("*:*"));
    ASSERT_NO_FATAL_FAILURE(s.add_worker("*:*"));
    net::FaultPlan slow;
    slow.delay = std::chrono::milliseconds(80);
    if (really_far) {
      slow.p_delay = 1.0;  // every frame it writes
    } else {
      // Writes 0-2: HELLO, the warm-up PONG, INFO_REPLY; its trips are fast.
      slow.schedule = {{0, net::FaultKind::kDelay}, {1, net::FaultKind::kDelay}, {2, net::FaultKind::kDelay}};
    }
    s.faults[1] = slow;
    std::unique_ptr<Model> bbm;
    ASSERT_NO_FATAL_FAILURE(load_backbone(s, "probe-backbone.gguf", &bbm));
    auto local = greedy_rows(*s.model, nullptr, 40);
    ASSERT_TRUE(local.is_ok());
    RemoteOptions o;  // measured costs: the planner follows what the trips cost
    o.dialer = s.dialer();
    o.planner.near_slack_s = 0.020;
    auto e = RemoteExecutor::connect(*bbm, s.addrs, o);
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    std::shared_ptr<RemoteExecutor> exec(std::move(*e));
    uint64_t used_before_probe = 0;
    auto got = greedy_rows(*bbm, exec, 40, [&](int i) {
      if (i == 10) used_before_probe = exec->worker_traffic()[1].requests;
    });
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_EQ(std::memcmp(got->data(), local->data(), local->size() * sizeof(float)), 0);
    const auto wt = exec->worker_traffic();
    EXPECT_EQ(used_before_probe, 0u) << "judged far by its warm-up";
    EXPECT_EQ(wt[1].probes, 1u) << "probed once, at the first check it was idle";
    if (really_far) {
      EXPECT_EQ(wt[1].requests, 0u) << "the probe confirmed it is far";
    } else {
      EXPECT_GT(wt[1].requests, 0u) << "the probe found it near: it shares the load";
    }
    EXPECT_EQ(wt[1].errors, 0u);
  }
}

TEST(RemoteLoopback, AWorkerServingOtherWeightsIsCaughtByTheHashAndItsExpertsStayRemote) {
  LoopSwarm s;
  ASSERT_NO_FATAL_FAILURE(open_model(&s));
  const std::string liar = write_liar(s);
  ASSERT_FALSE(liar.empty());
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:*", liar));
  std::unique_ptr<Model> bbm;
  ASSERT_NO_FATAL_FAILURE(load_backbone(s, "hot-backbone-liar.gguf", &bbm));
  RemoteOptions o;
  o.local_experts_bytes = 16 * expert_bytes(*s.model);
  o.hot_plan_after_tokens = 8;
  o.dialer = s.dialer();
  auto e = RemoteExecutor::connect(*bbm, s.addrs, o);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  std::shared_ptr<RemoteExecutor> exec(std::move(*e));
  auto got = greedy_rows(*bbm, exec, 4);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  const HotExpertReport h = exec->hot_experts();
  EXPECT_EQ(h.fetched, 0u);
  EXPECT_GT(h.fetch_failures, 0u);
  EXPECT_NE(h.last_fetch_error.find("not the model's weights"), std::string::npos) << h.last_fetch_error;
  EXPECT_EQ(h.experts, 0);
  EXPECT_EQ(exec->traffic().local_pairs, 0u);  // nothing computed with unchecked weights
}

TEST(RemoteLoopback, ANearReplicaTakesTheLoadOffAFarHolder) {
  LoopSwarm s;
  ASSERT_NO_FATAL_FAILURE(open_model(&s));
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:0-7"));   // worker 0: far
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:0-15"));  // worker 1: near, replicas of all of worker 0's
  auto local = run_model(*s.model, tokens_of(*s.model));
  ASSERT_TRUE(local.is_ok());
  auto exec = s.connect();
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  // Measured costs (as the executor sets them from trip latencies): 80 ms vs 10 ms.
  (*exec)->set_worker_costs({0.080, 0.010});
  auto lg = run_model(*s.model, tokens_of(*s.model), *exec);
  ASSERT_TRUE(lg.is_ok()) << lg.status().to_string();
  EXPECT_EQ(std::memcmp(lg->data(), local->data(), local->size() * sizeof(float)), 0);
  EXPECT_EQ((*exec)->worker_traffic()[0].requests, 0u);  // the far trip is never made
  EXPECT_GT((*exec)->worker_traffic()[1].requests, 0u);
  // Equal costs: the replicas share the load again.
  (*exec)->set_worker_costs({0.010, 0.0105});
  lg = run_model(*s.model, tokens_of(*s.model), *exec);
  ASSERT_TRUE(lg.is_ok());
  EXPECT_GT((*exec)->worker_traffic()[0].requests, 0u);
}

TEST(RemoteLoopback, OneWorkerIsReadByTheWaitingThreadAndItsFailureIsStillNamed) {
  // One link: the fan-out has no reader thread, gather() reads the connection itself.
  LoopSwarm s;
  ASSERT_NO_FATAL_FAILURE(open_model(&s));
  ASSERT_NO_FATAL_FAILURE(s.add_worker("*:*"));
  const auto tokens = tokens_of(*s.model);
  auto local = run_model(*s.model, tokens);
  ASSERT_TRUE(local.is_ok());
  {
    auto exec = s.connect();
    ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
    auto lg = run_model(*s.model, tokens, *exec);
    ASSERT_TRUE(lg.is_ok()) << lg.status().to_string();
    EXPECT_EQ(std::memcmp(lg->data(), local->data(), local->size() * sizeof(float)), 0);
    EXPECT_GT((*exec)->worker_traffic()[0].requests, 0u);
  }
  net::FaultPlan fp;
  fp.schedule = {{4, net::FaultKind::kCloseMidFrame}};  // HELLO, PONG, INFO_REPLY, one COMBINE, then cut
  s.faults[0] = fp;
  RemoteOptions off;  // (with failover the backbone's copies would cover it)
  off.failover = false;
  auto exec = s.connect(off);
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  auto bad = run_model(*s.model, tokens, *exec);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("(w0)"), std::string::npos) << bad.status().message();
  EXPECT_EQ((*exec)->last_failed_workers(), std::vector<size_t>{0});
}

}  // namespace
}  // namespace moesh::test
