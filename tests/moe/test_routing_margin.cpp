// routing_margins (routing.h) against its definition (reference README §5):
//  * handcrafted softmax, sigmoid+bias and group-limited cases with known margins;
//  * shift invariance of softmax margins (log-softmax = logits + a per-token constant);
//  * the margin is the decision's real distance to a flip: noise below margin/2 never changes
//    route()'s expert set, pushing the weakest chosen expert down by the margin does;
//  * on the reference models, the margins the ForwardObserver reports over seq16/seq64 match the
//    JSON's routing[*].margin and stay >= 0.05 (softmax) / 0.0125 (sigmoid) as the README promises.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "model/reference.h"
#include "moesh/model/model.h"
#include "moesh/moe/routing.h"

namespace moesh {
namespace {

float margin_of(const RouterConfig& rc, const std::vector<float>& logits) {
  float m = 0;
  std::vector<float> scratch;
  routing_margins(rc, logits.data(), 1, &m, &scratch);
  return m;
}

TEST(RoutingMargin, SoftmaxIsTheLogitGapAndShiftInvariant) {
  RouterConfig rc;
  rc.gating = GatingFunc::kSoftmax;
  rc.n_expert = 5;
  rc.k = 2;
  ASSERT_TRUE(rc.validate().is_ok());
  // chosen {0 (3.0), 2 (2.5)}; best other 1.0 -> 1.5
  EXPECT_FLOAT_EQ(margin_of(rc, {3.0f, 1.0f, 2.5f, 0.2f, -4.0f}), 1.5f);
  EXPECT_NEAR(margin_of(rc, {13.0f, 11.0f, 12.5f, 10.2f, 6.0f}), 1.5f, 1e-5f);
  // a tie at the boundary: margin 0
  EXPECT_EQ(margin_of(rc, {3.0f, 2.5f, 2.5f, 0.2f, -4.0f}), 0.0f);
  rc.gating = GatingFunc::kSoftmaxWeight;  // top-k on raw logits as well
  EXPECT_FLOAT_EQ(margin_of(rc, {3.0f, 1.0f, 2.5f, 0.2f, -4.0f}), 1.5f);
  rc.k = 5;  // every expert chosen: nothing can flip
  EXPECT_EQ(margin_of(rc, {3.0f, 1.0f, 2.5f, 0.2f, -4.0f}), std::numeric_limits<float>::infinity());
}

TEST(RoutingMargin, SigmoidScoresIncludeTheSelectionBias) {
  RouterConfig rc;
  rc.gating = GatingFunc::kSigmoid;
  rc.n_expert = 4;
  rc.k = 2;
  const std::vector<float> bias = {0.1f, -0.2f, 0.3f, 0.0f};
  rc.sel_bias = bias.data();
  ASSERT_TRUE(rc.validate().is_ok());
  const std::vector<float> lg = {0.0f, 1.0f, -1.0f, 2.0f};
  auto sg = [](float x) { return 1.0 / (1.0 + std::exp(-double(x))); };
  // scores: 0.6, 0.531, 0.569, 0.881 -> chosen {3, 0}, best other 2 (0.569)
  const double want = (sg(0.0f) + 0.1) - (sg(-1.0f) + 0.3);
  EXPECT_NEAR(margin_of(rc, lg), want, 1e-6);
  EXPECT_GT(want, 0.02);  // not a degenerate case
  rc.sel_bias = nullptr;  // without bias the order changes: {3, 1}, best other 0 (0.5)
  EXPECT_NEAR(margin_of(rc, lg), sg(1.0f) - sg(0.0f), 1e-6);
}

TEST(RoutingMargin, GroupLimitedTakesTheSmallerOfExpertAndGroupMargins) {
  RouterConfig rc;
  rc.gating = GatingFunc::kSoftmax;
  rc.n_expert = 8;
  rc.k = 2;
  rc.n_group = 4;
  rc.n_group_used = 2;
  ASSERT_TRUE(rc.validate().is_ok());
  // groups (2 experts each): g0 {5, 1} = 6, g1 {4, 3} = 7, g2 {3.8, 1.9} = 5.7, g3 {0, 0.5}
  // kept g1, g0; chosen 5 (e0), 4 (e2); best allowed other 3 (e3): expert margin 1.0.
  // group margin 6 - 5.7 = 0.3. Ungrouped the margin would be 4 - 3.8 = 0.2 (e4 is not allowed).
  const std::vector<float> lg = {5.0f, 1.0f, 4.0f, 3.0f, 3.8f, 1.9f, 0.0f, 0.5f};
  EXPECT_NEAR(margin_of(rc, lg), 0.3f, 1e-5f);
  // the group margin larger: g2 {2, 1} = 3 -> group margin 3, expert margin 1 decides
  EXPECT_NEAR(margin_of(rc, {5.0f, 1.0f, 4.0f, 3.0f, 2.0f, 1.0f, 0.0f, 0.5f}), 1.0f, 1e-5f);
  rc.n_group_used = 4;  // every group kept: no group margin, plain expert margin over all
  EXPECT_NEAR(margin_of(rc, lg), 0.2f, 1e-5f);
}

// The margin measures the real distance to a flip of route()'s decision.
TEST(RoutingMargin, NoiseBelowHalfTheMarginNeverFlipsAndTheMarginDoes) {
  RouterConfig rc;
  rc.gating = GatingFunc::kSoftmax;
  rc.n_expert = 16;
  rc.k = 4;
  ASSERT_TRUE(rc.validate().is_ok());
  const int T = 300;
  std::mt19937_64 rng(31);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  std::vector<float> lg(T * 16);
  for (auto& x : lg) x = nd(rng);
  std::vector<float> m(T), scratch;
  routing_margins(rc, lg.data(), T, m.data(), &scratch);
  std::vector<int32_t> ids(T * 4), ids2(T * 4);
  std::vector<float> w(T * 4);
  route(rc, lg.data(), T, ids.data(), w.data(), &scratch);
  float lo = 1e9f, hi = 0;
  for (float x : m) {
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  EXPECT_GT(hi, 10 * lo) << "margins should vary across tokens";

  auto set_of = [](const int32_t* p) {
    std::vector<int32_t> s(p, p + 4);
    std::sort(s.begin(), s.end());
    return s;
  };
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> noisy = lg, pushed = lg;
  for (int t = 0; t < T; ++t) {
    const float amp = 0.45f * m[t];
    for (int e = 0; e < 16; ++e) noisy[t * 16 + e] += amp * u(rng);
    pushed[t * 16 + ids[t * 4 + 3]] -= m[t] * 1.01f + 1e-4f;  // weakest chosen below the runner-up
  }
  route(rc, noisy.data(), T, ids2.data(), w.data(), &scratch);
  for (int t = 0; t < T; ++t) EXPECT_EQ(set_of(&ids[t * 4]), set_of(&ids2[t * 4])) << "token " << t;
  route(rc, pushed.data(), T, ids2.data(), w.data(), &scratch);
  for (int t = 0; t < T; ++t) EXPECT_NE(set_of(&ids[t * 4]), set_of(&ids2[t * 4])) << "token " << t;
}

class MarginRecorder : public ForwardObserver {
 public:
  std::map<int, std::vector<float>> by_layer;
  void on_routing_margins(int layer, int64_t n, const float* m) override { by_layer[layer].assign(m, m + n); }
};

// How far our margins may sit from llama.cpp's. 5e-4 everywhere but minimaxm3-a, whose native runs
// take a different path in llama.cpp than in moesh (the parity test's tolerances say the same):
//  * minimaxm3-a: seq16 is compared in LoadOptions::llama_fa_batches mode (llama.cpp's F16 flash
//    attention for short batches); seq64 Q4_K_M changes one sparse block selection between our run
//    and llama.cpp's (archs2 README §6: even llama.cpp's own native and dequant runs differ there).
double margin_tolerance(const std::string& file, const std::string& seq) {
  if (file == "archs2/minimaxm3-a.Q4_K_M.gguf" && seq == "seq64") return 1e-2;
  return 5e-4;
}

// The reference models: our margins match llama.cpp's and respect the README's thresholds.
TEST(RoutingMargin, ReferenceSequencesMatchTheJsonAndTheThresholds) {
  int checked = 0;
  for (const std::string& file : testing::reference_models()) {
    const std::string base = file.substr(0, file.size() - 5);
    if (const std::string a = testing::unsupported_reference_arch(file); !a.empty()) {
      std::printf("[margins] *** %s: architecture '%s' not implemented yet, NOT checked ***\n", file.c_str(),
                  a.c_str());
      continue;
    }
    const nlohmann::json j = testing::load_json(testing::reference_dir() + "/" + base + ".logits.json");
    ASSERT_FALSE(j.is_null()) << "reference " << base << ".logits.json missing or unreadable";
    auto model = Model::load(testing::reference_dir() + "/" + file);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    LoadOptions fa;
    fa.llama_fa_batches = true;
    const bool minimax = file.find("minimaxm3") != std::string::npos;
    std::unique_ptr<Model> fa_model;
    if (minimax) {
      auto r = Model::load(testing::reference_dir() + "/" + file, fa);
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      fa_model = std::move(*r);
    }
    const HParams& hp = (*model)->hparams();
    const double thr0 = hp.gating == GatingFunc::kSigmoid && !hp.select_on_logits ? 0.0125 : 0.05;
    size_t seq_index = 0;
    for (const auto& seq : testing::parse_sequences(j)) {
      // The README relaxes the threshold at one position (minimaxm3-a seq64, pos 63): take the JSON's
      // own minimum where it is lower.
      double thr = thr0;
      const auto& js = j["sequences"][seq_index++];
      if (js.contains("min_routing_margin") && js["min_routing_margin"].is_number() &&
          js["min_routing_margin"].get<double>() < thr0)
        thr = js["min_routing_margin"].get<double>() - 1e-3;
      const Model& m = minimax && seq.tokens.size() < 64 ? *fa_model : **model;
      ContextParams cp;
      cp.n_threads = 1;
      cp.n_ctx = static_cast<int64_t>(seq.tokens.size());
      Context ctx(m, cp);
      MarginRecorder rec;
      ctx.set_observer(&rec);
      std::vector<float> logits(seq.tokens.size() * static_cast<size_t>(hp.n_vocab));
      ASSERT_TRUE(ctx.decode(0, seq.tokens.data(), static_cast<int64_t>(seq.tokens.size()), logits.data()).is_ok());
      ASSERT_EQ(rec.by_layer.size(), seq.routing.size()) << file;
      double min_ours = 1e9, max_diff = 0;
      for (const auto& r : seq.routing) {
        ASSERT_TRUE(rec.by_layer.count(r.layer)) << file << " layer " << r.layer;
        const auto& ours = rec.by_layer[r.layer];
        ASSERT_EQ(ours.size(), r.margin.size());
        for (size_t t = 0; t < ours.size(); ++t) {
          min_ours = std::min(min_ours, double(ours[t]));
          max_diff = std::max(max_diff, std::fabs(double(ours[t]) - r.margin[t]));
        }
      }
      EXPECT_GE(min_ours, thr) << file << " " << seq.name;
      EXPECT_LT(max_diff, margin_tolerance(file, seq.name))
          << file << " " << seq.name << ": margins differ from llama.cpp's";
      std::printf("[margins] %s %s: min %.5f (threshold %.4f), max |ours - llama.cpp| %.2e\n", file.c_str(),
                  seq.name.c_str(), min_ours, thr, max_diff);
      ++checked;
    }
  }
  if (checked == 0) {
    GTEST_SKIP() << "\n\n*** reference folder " << testing::reference_dir() << " absent: margins not checked ***\n";
  }
}

}  // namespace
}  // namespace moesh
