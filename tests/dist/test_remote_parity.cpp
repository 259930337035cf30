// Remote dispatch through real `moesh worker` processes on 127.0.0.1, for every architecture:
// the reference files (skipped loudly when absent) and a make-model model.
//   exact + f32 wire  -> logits bit-identical (memcmp) to all-local, with 1, 2 and 3 workers and
//                        some experts left on the backbone;
//   exact + hidden q8 + f32 return -> bit-identical too, on every model whose expert gate/up take
//                        Q8_0 (Q8_0 files) or Q8_K (Q4_K_M files) activations: the worker gets
//                        the backbone's own INT8 blocks (Q8 / Q8K) and does not re-quantize;
//   partial + f32     -> cosine >= 0.99999 on every position;
//   f16 / bf16 / q8 / q8,f16 / q8,q8k -> the gate's lossy thresholds (argmax agreement >= 99%, cosine >= 0.998),
//                        argmax judged where the local top-1 leads by > 0.05 (near-ties may swap).
// A backbone started from a `--backbone` slice, with every expert on a worker, gives the bits of
// the full local model; with experts left uncovered it refuses to start and lists them.
#include <gtest/gtest.h>

#include <cstring>

#include "dist/dist_util.h"
#include "dist/worker_process.h"
#include "moesh/swarm/swarm.h"
#include "moesh/tensor/quant.h"
#include "util/run_moesh.h"

namespace moesh::test {
namespace {

struct Case {
  std::string label;
  std::string file;  // reference file name, or "" for the make-model model
};

std::string case_path(const Case& c) {
  return c.file.empty() ? made_qwen3moe() : reference_path(c.file);
}

class RemoteParity : public ::testing::TestWithParam<Case> {};

struct Swarm {
  std::unique_ptr<Model> model;
  std::vector<int32_t> tokens;
  std::vector<float> local;
  int first_moe = -1;
  std::vector<std::unique_ptr<WorkerProcess>> workers;  // all, B, C, D
};

// Connects to `idx` of the spawned workers, runs the tokens, returns logits and the traffic.
// hidden, ret: the two directions' dtypes. *exact_hidden (if given) gets hidden_is_exact().
Result<std::vector<float>> run_remote(Swarm& s, const std::vector<int>& idx, wire::WireDType hidden,
                                      wire::WireDType ret, wire::CombineMode mode, RemoteTraffic* traffic = nullptr,
                                      bool* exact_hidden = nullptr, std::vector<wire::WireDType>* layer_dt = nullptr) {
  std::vector<WorkerAddress> addrs;
  for (int i : idx) addrs.push_back(s.workers[i]->address());
  RemoteOptions o;
  o.hidden_wire = hidden;
  o.return_wire = ret;
  o.combine = mode;
  o.timeout = std::chrono::milliseconds(20000);
  MOESH_ASSIGN_OR_RETURN(auto exec, RemoteExecutor::connect(*s.model, addrs, o));
  std::shared_ptr<RemoteExecutor> shared(std::move(exec));
  if (exact_hidden != nullptr) *exact_hidden = shared->hidden_is_exact();
  if (layer_dt != nullptr) {
    layer_dt->clear();
    for (size_t l = 0; l < s.model->layers.size(); ++l)
      layer_dt->push_back(shared->hidden_dtype(0, static_cast<int>(l)));
  }
  auto lg = run_model(*s.model, s.tokens, shared);
  if (traffic != nullptr) *traffic = shared->traffic();
  return lg;
}

Result<std::vector<float>> run_remote(Swarm& s, const std::vector<int>& idx, wire::WireDType dt, wire::CombineMode mode,
                                      RemoteTraffic* traffic = nullptr) {
  return run_remote(s, idx, dt, dt, mode, traffic);
}

// The INT8 wire format of a layer's gate/up activations (what "q8" should pick), or kF32 when
// there is none (F16/F32 weights, or gate and up disagree).
wire::WireDType int8_format(const LayerWeights& lw) {
  const GgmlType g = quant::vec_dot_type(lw.experts.gate.type);
  if (g != quant::vec_dot_type(lw.experts.up.type)) return wire::WireDType::kF32;
  if (g == GgmlType::Q8_0) return wire::WireDType::kQ8;
  if (g == GgmlType::Q8_K) return wire::WireDType::kQ8K;
  return wire::WireDType::kF32;
}

TEST_P(RemoteParity, AllModesAgainstLocal) {
  const Case c = GetParam();
  const std::string path = case_path(c);
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << "SKIPPED: reference file " << path << " is absent (see ../shared/reference/README.md)";
  }
  Swarm s;
  auto m = Model::load(path);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  s.model = std::move(*m);
  const HParams& hp = s.model->hparams();
  const int64_t V = hp.n_vocab;
  const int n = static_cast<int>(hp.n_expert);
  ASSERT_GE(n, 4);
  for (size_t l = 0; l < s.model->layers.size() && s.first_moe < 0; ++l) {
    if (s.model->layers[l].is_moe) s.first_moe = static_cast<int>(l);
  }
  ASSERT_GE(s.first_moe, 0);
  s.tokens = test_tokens(path, V);
  auto local = run_model(*s.model, s.tokens);
  ASSERT_TRUE(local.is_ok()) << local.status().to_string();
  s.local = std::move(*local);
  expect_not_degenerate(s.local, V);
  {
    int64_t clear = 0;
    for (size_t t = 0; t < s.tokens.size(); ++t) clear += top2_margin(s.local.data() + t * V, V) > 0.05;
    EXPECT_GE(clear * 2, static_cast<int64_t>(s.tokens.size())) << "too many near-tied positions to judge argmax";
  }

  // A holds everything; B the first half; C the second half minus the last two experts; D the
  // last two experts of the first MoE layer only. With B+C the last two experts run on the
  // backbone; with B+C+D only those of the later layers do.
  const int h = n / 2;
  const std::vector<std::string> specs = {"*:*", fmt::format("*:0-{}", h - 1), fmt::format("*:{}-{}", h, n - 3),
                                          fmt::format("{}:{}-{}", s.first_moe, n - 2, n - 1)};
  for (const auto& sp : specs) {
    auto w = WorkerProcess::spawn(path, sp);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    s.workers.push_back(std::move(*w));
  }

  const std::vector<std::vector<int>> configs = {{0}, {1, 2}, {1, 2, 3}};
  for (const auto& cfg : configs) {
    SCOPED_TRACE(fmt::format("{} worker(s), exact f32", cfg.size()));
    RemoteTraffic tr;
    auto lg = run_remote(s, cfg, wire::WireDType::kF32, wire::CombineMode::kExact, &tr);
    ASSERT_TRUE(lg.is_ok()) << lg.status().to_string();
    ASSERT_EQ(lg->size(), s.local.size());
    EXPECT_EQ(std::memcmp(lg->data(), s.local.data(), s.local.size() * sizeof(float)), 0)
        << "exact remote logits differ from local";
    EXPECT_GT(tr.remote_pairs, 0u);
    EXPECT_GT(tr.dispatch_frames, 0u);
    EXPECT_EQ(tr.dispatch_frames, tr.combine_frames);
    if (cfg.size() == 1) {
      EXPECT_EQ(tr.local_pairs, 0u);
    } else if (cfg.size() == 2) {
      EXPECT_GT(tr.local_pairs, 0u) << "the split should leave work on the backbone";
    }
  }
  // Replicas: A holds every expert and B the first half, so each first-half expert has two
  // holders and a token's pairs are spread over both. Exact mode must still give the local bits;
  // in partial mode the spread depends only on the token's own routing, so a token's result
  // must not depend on the batch it came in (all tokens in one batch = the run_model schedule).
  {
    SCOPED_TRACE("replicas: A = every expert, B = first half");
    std::vector<WorkerAddress> addrs = {s.workers[0]->address(), s.workers[1]->address()};
    RemoteOptions o;
    o.timeout = std::chrono::milliseconds(20000);
    // Equal, fixed trip costs: both replicas are "near" whatever a loaded host measures, so the
    // spread (and this structural check) depends on the routing alone.
    o.worker_costs = {1e-3, 1e-3};
    auto exec = RemoteExecutor::connect(*s.model, addrs, o);
    ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
    std::shared_ptr<RemoteExecutor> shared(std::move(*exec));
    EXPECT_GT(shared->placement().count_replicas(1), 0);
    auto lg = run_model(*s.model, s.tokens, shared);
    ASSERT_TRUE(lg.is_ok()) << lg.status().to_string();
    EXPECT_EQ(std::memcmp(lg->data(), s.local.data(), s.local.size() * sizeof(float)), 0)
        << "exact remote logits with replicas differ from local";
    const auto wt = shared->worker_traffic();
    ASSERT_EQ(wt.size(), 2u);
    EXPECT_GT(wt[0].requests, 0u);
    // Input-scaled experts (llama4) reach the executor as one row per (token, expert) with k = 1,
    // so there is no second pair of a token to spread to the other replica.
    if (!hp.expert_ffn.input_scaled) {
      EXPECT_GT(wt[1].requests, 0u) << "the replica holder got no work";
    }

    o.combine = wire::CombineMode::kPartial;
    auto pexec = RemoteExecutor::connect(*s.model, addrs, o);
    ASSERT_TRUE(pexec.is_ok()) << pexec.status().to_string();
    std::shared_ptr<RemoteExecutor> pshared(std::move(*pexec));
    ContextParams cp;
    cp.n_threads = 1;
    cp.n_ctx = static_cast<int64_t>(s.tokens.size());
    cp.executor = pshared;
    Context ctx(*s.model, cp);
    const int64_t T = static_cast<int64_t>(s.tokens.size());
    std::vector<float> batch(static_cast<size_t>(T * V)), single(static_cast<size_t>(T * V));
    ASSERT_TRUE(ctx.decode(0, s.tokens.data(), T, batch.data()).is_ok());
    ctx.state().clear();
    for (int64_t t = 0; t < T; ++t) ASSERT_TRUE(ctx.decode(0, &s.tokens[t], 1, single.data() + t * V).is_ok());
    EXPECT_EQ(std::memcmp(batch.data(), single.data(), batch.size() * sizeof(float)), 0)
        << "partial sums over replicas depend on the batch a token came in";
    EXPECT_GE(compare_logits(s.local, batch, V).min_cosine, 0.99999);
  }
  // Hidden q8 (the worker's INT8 activation blocks) + f32 return + exact combine.
  {
    bool all_int8 = true;
    bool any_q8k = false;
    for (const LayerWeights& lw : s.model->layers) {
      if (!lw.is_moe) continue;
      all_int8 &= int8_format(lw) != wire::WireDType::kF32;
      any_q8k |= int8_format(lw) == wire::WireDType::kQ8K;
    }
    for (const auto& cfg : {std::vector<int>{0}, std::vector<int>{1, 2, 3}}) {
      SCOPED_TRACE(fmt::format("{} worker(s), hidden q8, return f32, exact", cfg.size()));
      bool exact_hidden = false;
      std::vector<wire::WireDType> layer_dt;
      RemoteTraffic tr;
      auto lg = run_remote(s, cfg, wire::WireDType::kQ8, wire::WireDType::kF32, wire::CombineMode::kExact, &tr,
                           &exact_hidden, &layer_dt);
      ASSERT_TRUE(lg.is_ok()) << lg.status().to_string();
      ASSERT_EQ(lg->size(), s.local.size());
      EXPECT_EQ(exact_hidden, all_int8);
      if (cfg.size() == 1) {
        // Worker 0 holds every layer: "q8" picks the layer's own activation format.
        for (size_t l = 0; l < s.model->layers.size(); ++l) {
          const wire::WireDType want =
              s.model->layers[l].is_moe ? int8_format(s.model->layers[l]) : wire::WireDType::kQ8;
          EXPECT_EQ(layer_dt[l], want == wire::WireDType::kF32 ? wire::WireDType::kQ8 : want) << "layer " << l;
        }
      }
      const bool same = std::memcmp(lg->data(), s.local.data(), s.local.size() * sizeof(float)) == 0;
      if (all_int8) {
        EXPECT_TRUE(same) << "hidden q8 + f32 return + exact combine must be bit-identical on "
                          << (any_q8k ? "Q8_K" : "Q8_0") << "-activation experts";
      } else {
        EXPECT_FALSE(same) << "f16/f32 experts re-quantize nothing: q8 rows must be lossy here";
        EXPECT_GE(compare_logits(s.local, *lg, V).min_cosine, 0.998);
      }
      // Q8K hidden rows are 260 B per 256 values, Q8 ones 34 B per 32: the traffic shows which.
      EXPECT_GT(tr.dispatch_frames, 0u);
    }
  }
  {
    SCOPED_TRACE("partial f32, 3 workers");
    auto lg = run_remote(s, {1, 2, 3}, wire::WireDType::kF32, wire::CombineMode::kPartial);
    ASSERT_TRUE(lg.is_ok()) << lg.status().to_string();
    const Agreement g = compare_logits(s.local, *lg, V);
    EXPECT_GE(g.min_cosine, 0.99999);
    EXPECT_EQ(g.argmax_frac, 1.0);
  }
  struct Lossy {
    wire::WireDType dt;
    wire::CombineMode mode;
    wire::WireDType ret;
  };
  for (const Lossy& l : {Lossy{wire::WireDType::kF16, wire::CombineMode::kExact, wire::WireDType::kF16},
                         Lossy{wire::WireDType::kBF16, wire::CombineMode::kPartial, wire::WireDType::kBF16},
                         Lossy{wire::WireDType::kQ8, wire::CombineMode::kExact, wire::WireDType::kQ8},
                         Lossy{wire::WireDType::kQ8, wire::CombineMode::kPartial, wire::WireDType::kQ8},
                         Lossy{wire::WireDType::kQ8, wire::CombineMode::kPartial, wire::WireDType::kF16},
                         Lossy{wire::WireDType::kQ8, wire::CombineMode::kPartial, wire::WireDType::kQ8K}}) {
    SCOPED_TRACE(fmt::format("{},{} {}", wire::wire_dtype_name(l.dt), wire::wire_dtype_name(l.ret),
                             wire::combine_mode_name(l.mode)));
    RemoteTraffic tr;
    auto lg = run_remote(s, {1, 2, 3}, l.dt, l.ret, l.mode, &tr);
    ASSERT_TRUE(lg.is_ok()) << lg.status().to_string();
    // The gate's thresholds. The tiny random reference models have near-tied top logits at some
    // positions (gaps of 0.004-0.03 logits were seen flipping under q8/f16), so argmax agreement
    // is judged on the positions whose top-1 leads by more than kTieMargin; everything else
    // (cosine) is judged on all positions.
    constexpr double kTieMargin = 0.05;
    const Agreement g = compare_logits(s.local, *lg, V, kTieMargin);
    EXPECT_GE(g.argmax_frac_clear, 0.99) << "max top-2 margin at a flip " << g.max_flip_margin;
    EXPECT_LE(g.max_flip_margin, kTieMargin);
    EXPECT_GE(g.min_cosine, 0.998);
    // Lossy means lossy: the path really changed the numbers (so the check above measures it).
    EXPECT_NE(std::memcmp(lg->data(), s.local.data(), s.local.size() * sizeof(float)), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, RemoteParity,
    ::testing::Values(
        Case{"make_qwen3moe_f16", ""}, Case{"qwen3moe_Q8_0", "qwen3moe-s.Q8_0.gguf"},
        Case{"qwen3moe_Q4_K_M", "qwen3moe-s.Q4_K_M.gguf"}, Case{"mixtral_Q8_0", "mixtral-s.Q8_0.gguf"},
        Case{"mixtral_Q4_K_M", "mixtral-s.Q4_K_M.gguf"}, Case{"deepseek2_Q8_0", "deepseek2-s.Q8_0.gguf"},
        Case{"deepseek2_Q4_K_M", "deepseek2-s.Q4_K_M.gguf"}, Case{"gptoss_MXFP4_MOE", "archs/gptoss-a.MXFP4_MOE.gguf"},
        Case{"glm4moe_Q4_K_M", "archs/glm4moe-a.Q4_K_M.gguf"}, Case{"llama4_Q8_0", "archs/llama4-a.Q8_0.gguf"},
        Case{"minimaxm2_Q8_0", "archs/minimaxm2-a.Q8_0.gguf"}, Case{"qwen3next_Q8_0", "archs/qwen3next-a.Q8_0.gguf"},
        Case{"qwen35moe_Q4_K_M", "archs/qwen35moe-a.Q4_K_M.gguf"}, Case{"step35_Q8_0", "archs2/step35-a.Q8_0.gguf"},
        Case{"glmdsa_Q8_0", "archs2/glmdsa-a.Q8_0.gguf"}, Case{"kimik3_Q8_0", "archs2/kimik3-a.Q8_0.gguf"},
        Case{"minimaxm3_Q8_0", "archs2/minimaxm3-a.Q8_0.gguf"},
        Case{"minimaxm3_Q4_K_M", "archs2/minimaxm3-a.Q4_K_M.gguf"}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.label; });

// `--wire HIDDEN,RETURN` through the CLI: q8,f16 runs and prints both dtypes; hidden q8 with an
// f32 return and exact combine passes the gate's bit-identical criterion on a k-quant model;
// malformed pairs are usage errors (exit 2).
TEST(RemoteWireCli, HiddenAndReturnDtypes) {
  const std::string ref = reference_path("qwen3moe-s.Q4_K_M.gguf");
  const bool have_ref = std::filesystem::exists(ref);
  if (!have_ref) std::fprintf(stderr, "NOTE: %s absent; the CLI wire test uses the make-model model\n", ref.c_str());
  const std::string path = have_ref ? ref : made_qwen3moe();
  auto w = WorkerProcess::spawn(path, "*:*");
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  const std::string base = "gate -m '" + path + "' --worker " + (*w)->address().to_string() + " -t 1 --sequences 2";
  RunResult mixed = run_moesh(base + " --wire q8,f16 --combine partial");
  ASSERT_TRUE(mixed.exit_code == 0 || mixed.exit_code == 1) << mixed.out << mixed.err;
  EXPECT_NE(mixed.out.find("wire q8/f16, combine partial"), std::string::npos) << mixed.out;
  EXPECT_NE(mixed.err.find("remote dispatch: wire q8/f16"), std::string::npos) << mixed.err;
  if (have_ref) {
    RunResult exact = run_moesh(base + " --wire q8,f32 --combine exact");
    EXPECT_EQ(exact.exit_code, 0) << exact.out << exact.err;
    EXPECT_NE(exact.out.find("bit-identical"), std::string::npos) << exact.out;
    EXPECT_NE(exact.out.find("gate: PASS"), std::string::npos) << exact.out;
  }
  for (const char* bad : {"q8,f16,bf16", "q8,", ",f16", "q8;f16", "q4"}) {
    RunResult r = run_moesh(base + " --wire '" + std::string(bad) + "'");
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.out << r.err;
  }
}

// The realistic deployment: the backbone file has no routed experts at all.
TEST(RemoteBackbone, BackboneSliceWithAllExpertsRemoteMatchesFullModel) {
  const std::string full_path = reference_path("deepseek2-s.Q4_K_M.gguf");
  const std::string path = std::filesystem::exists(full_path) ? full_path : made_qwen3moe();
  auto full = Model::load(path);
  ASSERT_TRUE(full.is_ok()) << full.status().to_string();
  const std::string bb_path = temp_dir() + "/backbone.gguf";
  ASSERT_TRUE(swarm::write_backbone_slice((*full)->file(), bb_path).is_ok());
  auto bb = Model::load(bb_path);
  ASSERT_TRUE(bb.is_ok()) << bb.status().to_string();
  for (const LayerWeights& lw : (*bb)->layers) EXPECT_FALSE(lw.experts.valid());
  EXPECT_LT(std::filesystem::file_size(bb_path), std::filesystem::file_size(path));

  const auto tokens = test_tokens(path, (*full)->hparams().n_vocab);
  auto local = run_model(**full, tokens);
  ASSERT_TRUE(local.is_ok()) << local.status().to_string();
  // Without workers the backbone slice cannot compute a MoE layer, and says so.
  auto alone = run_model(**bb, tokens);
  EXPECT_FALSE(alone.is_ok());

  const int n = static_cast<int>((*full)->hparams().n_expert);
  auto w_all = WorkerProcess::spawn(path, "*:*");
  ASSERT_TRUE(w_all.is_ok()) << w_all.status().to_string();
  RemoteOptions o;
  auto exec = RemoteExecutor::connect(**bb, {(*w_all)->address()}, o);
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  std::shared_ptr<RemoteExecutor> shared(std::move(*exec));
  EXPECT_EQ(shared->placement().count(Placement::kLocal), 0);
  auto remote = run_model(**bb, tokens, shared);
  ASSERT_TRUE(remote.is_ok()) << remote.status().to_string();
  EXPECT_EQ(std::memcmp(remote->data(), local->data(), local->size() * sizeof(float)), 0);
  EXPECT_EQ(shared->traffic().local_pairs, 0u);

  // A worker holding only part of the experts: the backbone has nothing to fall back on.
  auto w_part = WorkerProcess::spawn(path, fmt::format("*:0-{}", n - 3));
  ASSERT_TRUE(w_part.is_ok()) << w_part.status().to_string();
  auto bad = RemoteExecutor::connect(**bb, {(*w_part)->address()}, o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find(fmt::format("experts {}-{}", n - 2, n - 1)), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace moesh::test
