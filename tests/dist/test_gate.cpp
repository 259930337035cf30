// The gate library (include/moesh/gate/gate.h) and `moesh gate` on curated sequences:
//  * every reference model (3 archs x Q8_0/Q4_K_M), 2 real worker processes holding different
//    experts plus a local share: f16 partial, f16 exact and q8 partial PASS the default
//    thresholds on curated sequences, with every argmax equal (docs/gate.md);
//  * curation is reproducible (same seed, same tokens) and really conditioned (every position's
//    routing margin and top-1 lead, measured again by an observer, meet the thresholds), while the
//    raw uniform draw of the same seed is not;
//  * the gate still catches damage: an in-process fake worker that computes correctly-shaped
//    COMBINEs from the real experts but lies (results x 1.05, or the next expert's output) makes
//    run_gate FAIL under the lossy thresholds, while the same fake telling the truth is
//    bit-identical.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>
#include <thread>

#include "dist/dist_util.h"
#include "dist/gate_output.h"
#include "dist/worker_process.h"
#include "moesh/gate/gate.h"
#include "moesh/swarm/swarm.h"
#include "swarm/worker_internal.h"
#include "util/run_moesh.h"

namespace moesh::test {
namespace {

using std::chrono::milliseconds;

std::vector<std::string> reference_ggufs() {
  std::vector<std::string> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(MOESH_REFERENCE_DIR, ec)) return out;
  for (const auto& e : std::filesystem::directory_iterator(MOESH_REFERENCE_DIR, ec)) {
    if (e.path().extension() == ".gguf") out.push_back(e.path().string());
  }
  // One file of each further architecture (archs/): the gate's cost per file is what it is.
  for (const char* f : {"gptoss-a.MXFP4_MOE.gguf", "glm4moe-a.Q8_0.gguf", "llama4-a.Q8_0.gguf", "minimaxm2-a.Q8_0.gguf",
                        "qwen3next-a.Q8_0.gguf", "qwen35moe-a.Q8_0.gguf"}) {
    const std::string p = std::string(MOESH_REFERENCE_DIR) + "/archs/" + f;
    if (std::filesystem::exists(p, ec)) out.push_back(p);
  }
  // And of archs2/.
  for (const char* f : {"step35-a.Q8_0.gguf", "glmdsa-a.Q8_0.gguf", "kimik3-a.Q8_0.gguf", "minimaxm3-a.Q8_0.gguf"}) {
    const std::string p = std::string(MOESH_REFERENCE_DIR) + "/archs2/" + f;
    if (std::filesystem::exists(p, ec)) out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

#define SKIP_WITHOUT_REFERENCE(files)                                                                        \
  if ((files).empty()) {                                                                                     \
    GTEST_SKIP() << "\n\n*** reference folder " << MOESH_REFERENCE_DIR << " absent: gate not checked ***\n"; \
  }

// 2 workers with different thirds of the experts; the last third stays on the gate's backbone.
TEST(Gate, CuratedLossyPathsPassOnEveryReferenceModel) {
  const auto files = reference_ggufs();
  SKIP_WITHOUT_REFERENCE(files);
  for (const std::string& path : files) {
    auto model = Model::load(path);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    const int64_t ne = (*model)->hparams().n_expert;
    const int64_t third = ne / 3;
    auto a = WorkerProcess::spawn(path, fmt::format("*:0-{}", third - 1));
    auto b = WorkerProcess::spawn(path, fmt::format("*:{}-{}", third, 2 * third - 1));
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    const std::string base = "gate -m " + quoted(path) + " --worker " + (*a)->address().to_string() + " --worker " +
                             (*b)->address().to_string() + " -t 1";
    const std::string name = std::filesystem::path(path).filename().string();
    // docs/gate.md: on curated sequences every reference file PASSes all three lossy paths with
    // 160/160 argmax agreement (min cosine 0.99977-0.99993), after rejecting 68-120 draws and
    // with no ill-conditioned position.
    // kimi-k3 turns any rounding into logit noise: llama.cpp's own native and dequant-f32 runs
    // of it differ by 0.24-0.42 (reference README §6), and so do moesh's (the noise floor on
    // these sequences: min cosine per sequence 0.9987 0.8057 0.8208 0.9736, 8/160 positions
    // below 0.998). Its lossy paths keep every argmax, but q8 partial has one position at 0.9944
    // (an expert choice moved downstream). It is judged with --noise-floor: rank by rank, no
    // worse than the model's own engines (docs/gate.md, "The model's noise floor").
    const bool chaotic = name.find("kimik3") != std::string::npos;
    for (const char* mode :
         {"--wire f16 --combine partial", "--wire f16 --combine exact", "--wire q8 --combine partial"}) {
      SCOPED_TRACE(name + " " + mode);
      RunResult r = run_moesh(base + " " + mode + (chaotic ? " --noise-floor" : ""));
      const GateOutput g = parse_gate(r.out);
      std::printf("[gate] %-28s %-28s %s  argmax %lld/%lld  min cos %.6f  rejected %lld\n", name.c_str(), mode,
                  r.exit_code == 0 ? "PASS" : "FAIL", static_cast<long long>(g.agree), static_cast<long long>(g.total),
                  g.cos_min, static_cast<long long>(g.rejected));
      EXPECT_EQ(r.exit_code, 0) << "gate did not PASS\n" << r.out << r.err;
      EXPECT_EQ(g.rows, 4) << r.out << r.err;
      EXPECT_EQ(g.pass_rows, 4) << r.out;
      EXPECT_EQ(g.ill, 0) << r.out;
      EXPECT_GT(g.rejected, 0) << "curation rejected no draw\n" << r.out;
      EXPECT_EQ(g.total, 160) << r.out;
      EXPECT_EQ(g.agree, g.total) << "an argmax flipped on a curated position\n" << r.out;
      if (chaotic) {
        EXPECT_NE(r.out.find("noise floor (native vs f32-activation logits"), std::string::npos) << r.out;
        EXPECT_GE(g.cos_min, 0.99) << r.out;
      } else {
        EXPECT_GE(g.cos_min, 0.998) << r.out;
      }
    }
  }
}

TEST(Gate, CurationIsReproducibleAndConditioned) {
  const auto files = reference_ggufs();
  SKIP_WITHOUT_REFERENCE(files);
  for (const std::string& path : files) {
    auto model = Model::load(path);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    gate::CurationOptions co;
    co.n_threads = 1;
    auto c1 = gate::curate_sequences(**model, co);
    auto c2 = gate::curate_sequences(**model, co);
    ASSERT_TRUE(c1.is_ok() && c2.is_ok()) << c1.status().to_string();
    EXPECT_EQ(c1->tokens, c2->tokens) << path;
    ASSERT_EQ(c1->tokens.size(), 4u);
    EXPECT_EQ(c1->tokens[3].size(), 64u);
    EXPECT_EQ(c1->ill_conditioned, 0) << path;
    EXPECT_GT(c1->draws_rejected, 0) << path << ": uniform draws always hit some near-ties here";
    co.seed = 43;
    auto c3 = gate::curate_sequences(**model, co);
    ASSERT_TRUE(c3.is_ok());
    EXPECT_NE(c1->tokens, c3->tokens);
    // Every position, measured again by an observer in one batch, meets both thresholds.
    const double thr = gate::default_min_routing_margin((*model)->hparams());
    EXPECT_EQ(c1->min_routing_margin, thr);
    for (const auto& seq : c1->tokens) {
      auto cond = gate::measure_conditioning(**model, seq, 1);
      ASSERT_TRUE(cond.is_ok()) << cond.status().to_string();
      for (size_t p = 0; p < cond->size(); ++p) {
        EXPECT_GE((*cond)[p].routing_margin, thr) << path << " pos " << p;
        EXPECT_GE((*cond)[p].top1_lead_rel, co.min_top1_lead) << path << " pos " << p;
      }
    }
    EXPECT_GE(c1->worst.routing_margin, thr);
    EXPECT_GE(c1->worst.top1_lead_rel, co.min_top1_lead);
    // The raw draw of the same seed has near-ties: curation is what removes them.
    co.seed = 42;
    co.raw = true;
    auto raw = gate::curate_sequences(**model, co);
    ASSERT_TRUE(raw.is_ok());
    EXPECT_EQ(raw->draws_rejected, 0);
    EXPECT_TRUE(raw->worst.routing_margin < thr || raw->worst.top1_lead_rel < co.min_top1_lead)
        << path << ": raw worst margin " << raw->worst.routing_margin << ", lead " << raw->worst.top1_lead_rel;
    std::printf(
        "[curation] %s: %lld positions, %lld draws rejected; worst margin %.4f (raw %.4f), worst lead "
        "%.3f x RMS (raw %.4f)\n",
        std::filesystem::path(path).filename().c_str(), static_cast<long long>(c1->positions),
        static_cast<long long>(c1->draws_rejected), c1->worst.routing_margin, raw->worst.routing_margin,
        c1->worst.top1_lead_rel, raw->worst.top1_lead_rel);
  }
}

enum class Lie { kNone, kScale, kNextExpert };

// An in-process worker holding every expert of `path`: real handshake, real expert compute
// (swarm::detail::compute_dispatch), then the lie applied to the COMBINE before sending it.
class FakeWorker {
 public:
  FakeWorker(const std::string& path, Lie lie) : lie_(lie) {
    auto file = gguf::File::open(path);
    EXPECT_TRUE(file.is_ok());
    auto id = swarm::model_identity(**file);
    auto shape = swarm::model_shape(**file);
    EXPECT_TRUE(id.is_ok() && shape.is_ok());
    n_expert_ = shape->n_expert;
    swarm::ExpertSet all;
    for (uint32_t l : shape->moe_layers) all.ranges.push_back({l, 0, shape->n_expert});
    hello_ = swarm::make_hello(wire::PeerRole::kWorker, *id, *shape, all, "fake");
    hello_.features &= ~wire::kFeatureInfo;  // a minimal worker: no capacity report
    auto store = swarm::ExpertStore::open(std::move(*file), all);
    EXPECT_TRUE(store.is_ok()) << store.status().to_string();
    store_ = std::move(*store);
    auto l = net::TcpListener::listen("127.0.0.1", 0, net::TcpOptions{});
    EXPECT_TRUE(l.is_ok());
    listener_ = std::move(*l);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeWorker() {
    listener_->close();
    thread_.join();
  }
  uint16_t port() const { return listener_->port(); }
  int lies() const { return lies_.load(); }

 private:
  void serve() {
    auto s = listener_->accept(net::deadline_in(milliseconds(10000)));
    if (!s.is_ok()) return;
    auto conn = net::make_stream_connection(std::move(*s));
    if (!net::handshake(*conn, hello_, false, net::deadline_in(milliseconds(5000))).is_ok()) return;
    swarm::detail::ComputeScratch scratch;
    while (true) {
      auto f = conn->recv_frame(net::deadline_in(milliseconds(30000)));
      if (!f.is_ok()) return;
      if (f->type() == wire::MsgType::kPing) {
        auto p = wire::decode_ping(*f);
        wire::PongMsg pong{p->request_id, p->send_time_ns, 0, p->reply_pad_bytes};
        (void)conn->send_frame(*wire::encode_pong(pong), net::deadline_in(milliseconds(1000)));
        continue;
      }
      if (f->type() != wire::MsgType::kDispatch) return;
      auto d = wire::decode_dispatch(*f, wire::DecodeLimits{});
      if (!d.is_ok()) return;
      if (lie_ == Lie::kNextExpert) {  // a permutation, so a token's experts stay distinct
        for (auto& p : d->pairs) p.expert = static_cast<uint16_t>((p.expert + 1) % n_expert_);
      }
      auto out = swarm::detail::compute_dispatch(*store_, *d, &scratch, nullptr);
      if (!out.ok) return;
      if (lie_ == Lie::kScale) {
        const wire::WireRows& rows = out.combine.rows;
        std::vector<float> y(static_cast<size_t>(rows.n_rows) * rows.n_cols);
        wire::decode_rows(rows, y.data());
        for (float& v : y) v *= 1.05f;
        out.combine.rows = *wire::encode_rows(rows.dtype, y.data(), rows.n_rows, rows.n_cols);
      }
      if (lie_ != Lie::kNone) lies_.fetch_add(1);
      (void)conn->send_frame(*wire::encode_combine(out.combine), net::deadline_in(milliseconds(1000)));
    }
  }
  Lie lie_;
  uint32_t n_expert_ = 0;
  wire::Hello hello_;
  std::unique_ptr<swarm::ExpertStore> store_;
  std::unique_ptr<net::TcpListener> listener_;
  std::thread thread_;
  std::atomic<int> lies_{0};
};

// A liar fails the default criterion on a stable model, and the noise-floor criterion on the
// chaotic kimi-k3, where the model's own two engines are 0.81 apart in cosine at worst.
// kimi-k3 also shows what logits cannot see: routed experts scaled by 1.05 move its logits
// less (min cosine 0.9989, 160/160 argmax) than an honest q8 wire does (0.9944), within even
// the default bar; on the exact path the gate's bit-identity criterion catches that liar.
void check_liars(const std::string& path, bool with_floor) {
  SCOPED_TRACE(path);
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  gate::CurationOptions co;
  co.n_threads = 1;
  auto cur = gate::curate_sequences(**model, co);
  ASSERT_TRUE(cur.is_ok()) << cur.status().to_string();
  gate::CompareOptions lossy;  // the default thresholds 0.99 / 0.998, not bit identity
  if (with_floor) {
    LoadOptions lo;
    lo.dequant_f32 = true;
    auto f32 = Model::load(path, lo);
    ASSERT_TRUE(f32.is_ok()) << f32.status().to_string();
    auto nf = gate::noise_floor(**model, **f32, cur->tokens, 1);
    ASSERT_TRUE(nf.is_ok()) << nf.status().to_string();
    ASSERT_EQ(nf->cos.size(), cur->tokens.size());
    double lowest = 1.0;
    for (size_t i = 0; i < nf->cos.size(); ++i) {
      ASSERT_EQ(nf->cos[i].size(), cur->tokens[i].size());
      lowest = std::min(lowest, nf->min(i));
    }
    EXPECT_LT(lowest, 0.998) << "kimi-k3's own engines are further apart than the default bar";
    lossy.cosine_floor = nf->cos;
  }
  for (Lie lie : {Lie::kNone, Lie::kScale, Lie::kNextExpert}) {
    gate::CompareOptions opts = lossy;
    if (with_floor && lie == Lie::kScale) opts = gate::CompareOptions{.bitwise = true};
    FakeWorker fake(path, lie);
    auto exec = RemoteExecutor::connect(**model, {WorkerAddress{"127.0.0.1", fake.port()}}, RemoteOptions{});
    ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
    std::shared_ptr<RemoteExecutor> remote(std::move(*exec));
    ASSERT_TRUE(gate::is_bit_exact_path(*remote));
    auto rep = gate::run_gate(**model, remote, cur->tokens, opts, 1);
    ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
    std::printf("[liar] lie %d: %s, argmax %lld/%lld, min cos %.6f, %d lies told\n", static_cast<int>(lie),
                rep->pass ? "PASS" : "FAIL", static_cast<long long>(rep->argmax_same()),
                static_cast<long long>(rep->n_tokens()), rep->min_cosine(), fake.lies());
    if (lie == Lie::kNone) {
      EXPECT_TRUE(rep->pass);
      for (const auto& s : rep->sequences) EXPECT_TRUE(s.bitwise) << "an honest f32 exact worker is bit-exact";
    } else {
      EXPECT_GT(fake.lies(), 0);
      EXPECT_FALSE(rep->pass) << "the gate let a lying worker through";
      for (const auto& s : rep->sequences) EXPECT_FALSE(s.bitwise);
    }
    remote.reset();  // GOODBYE: the fake's recv fails and its thread ends
  }
}

TEST(Gate, LyingWorkerFailsTheGate) {
  const auto files = reference_ggufs();
  SKIP_WITHOUT_REFERENCE(files);
  check_liars(std::string(MOESH_REFERENCE_DIR) + "/qwen3moe-s.Q8_0.gguf", false);
  const std::string kimi = std::string(MOESH_REFERENCE_DIR) + "/archs2/kimik3-a.Q8_0.gguf";
  std::error_code ec;
  if (std::filesystem::exists(kimi, ec)) check_liars(kimi, true);
}

}  // namespace
}  // namespace moesh::test
