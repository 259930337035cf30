// Speculative decoding: the n-gram draft source, and the decoder's contract — its output is the
// plain decoding output token for token (greedy and seeded sampling, every architecture),
// whatever the drafts are (always right, always wrong, n-gram), and rejected drafts leave no KV
// cells behind.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <functional>
#include <map>
#include <random>

#include "moesh/make_model/make_model.h"
#include "moesh/model/model.h"
#include "moesh/model/sampling.h"
#include "moesh/model/speculative.h"

namespace moesh {
namespace {

TEST(NgramDraft, ProposesWhatFollowedTheLongestEarlierMatch) {
  NgramDraft d(2, 4);
  std::vector<int32_t> out;
  // Suffix "7 8 9" occurred at 1..3 (followed by 4 5) and "8 9" also at 5..6 (followed by 1):
  // the longest match wins.
  const std::vector<int32_t> h = {6, 7, 8, 9, 4, 5, 8, 9, 1, 7, 8, 9};
  d.propose(0, h, 8, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{4, 5, 8, 9, 1, 7, 8, 9}));
  d.propose(0, h, 2, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{4, 5}));
  // The most recent earlier occurrence of the 2-gram "1 2"; past the present the period (3) goes on.
  d.propose(0, std::vector<int32_t>{1, 2, 3, 1, 2, 4, 1, 2}, 4, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{4, 1, 2, 4}));
  // A loop of period 2 keeps looping for as many tokens as asked.
  d.propose(0, std::vector<int32_t>{9, 5, 6, 5, 6}, 7, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{5, 6, 5, 6, 5, 6, 5}));
  // No earlier occurrence: nothing.
  d.propose(0, std::vector<int32_t>{1, 2, 3, 4, 5}, 4, &out);
  EXPECT_TRUE(out.empty());
  d.propose(0, std::vector<int32_t>{1, 2, 1, 2}, 0, &out);
  EXPECT_TRUE(out.empty());
  EXPECT_FALSE(make_draft_source("eagle").is_ok());
  EXPECT_TRUE(make_draft_source("ngram").is_ok());
}

std::string model_path(const std::string& arch) {
  static std::map<std::string, std::string> cache;
  auto it = cache.find(arch);
  if (it != cache.end()) return it->second;
  const auto dir = std::filesystem::temp_directory_path() / ("moesh-spec-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  MakeModelSpec s;
  EXPECT_TRUE(MakeModelSpec::defaults_for_name(arch, &s)) << arch;
  s.type = MakeFileType::kQ8_0;
  s.n_ctx = 256;
  s.vocab = MakeVocab::kNone;
  const std::string path = (dir / (arch + ".gguf")).string();
  Status st = make_model(s, path);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  cache[arch] = path;
  return path;
}

// A repetitive prompt, so n-gram drafts have something to match.
std::vector<int32_t> prompt_of(int64_t n_vocab) {
  std::vector<int32_t> p;
  for (int r = 0; r < 4; ++r) {
    for (int32_t t : {11, 42, 7, 99, 3, 58}) p.push_back(t % static_cast<int32_t>(n_vocab));
  }
  return p;
}

// Plain decoding: one token per forward pass.
std::vector<int32_t> plain(const Model& m, const std::vector<int32_t>& prompt, int n, const SamplingParams& sp) {
  const int64_t V = m.hparams().n_vocab;
  Context ctx(m, ContextParams{1, 256, nullptr});
  Sampler sampler(sp);
  std::vector<float> lg(static_cast<size_t>(V));
  EXPECT_TRUE(ctx.decode(0, prompt.data(), static_cast<int64_t>(prompt.size()), lg.data(), false).is_ok());
  std::vector<int32_t> hist = prompt, out;
  while (static_cast<int>(out.size()) < n) {
    const int32_t t = sampler.sample(lg.data(), V, hist);
    out.push_back(t);
    hist.push_back(t);
    if (static_cast<int>(out.size()) == n) break;
    EXPECT_TRUE(ctx.decode(0, &t, 1, lg.data(), false).is_ok());
  }
  return out;
}

// Proposes a fixed continuation: the true one (every draft kept) or a wrong one (every draft
// rejected), to drive the accept and the rollback paths on purpose.
class ScriptedDraft final : public DraftSource {
 public:
  ScriptedDraft(std::vector<int32_t> truth, size_t prompt_len, bool wrong)
      : truth_(std::move(truth)), prompt_len_(prompt_len), wrong_(wrong) {}
  void propose(int32_t, std::span<const int32_t> h, int max_tokens, std::vector<int32_t>* out) override {
    out->clear();
    const size_t done = h.size() - prompt_len_;  // tokens emitted so far
    for (size_t i = done; i < truth_.size() && static_cast<int>(out->size()) < max_tokens; ++i) {
      out->push_back(wrong_ ? (truth_[i] + 1) % 50 : truth_[i]);
    }
  }
  std::string name() const override { return wrong_ ? "wrong" : "oracle"; }

 private:
  std::vector<int32_t> truth_;
  size_t prompt_len_;
  bool wrong_;
};

struct SpecRun {
  std::vector<int32_t> tokens;
  SpeculativeStats stats;
  int64_t cells = 0;
};

SpecRun speculative(const Model& m, const std::vector<int32_t>& prompt, int n, const SamplingParams& sp,
                    DraftSource* draft, bool adaptive, int draft_max = 8, int step_checkpoints = 32,
                    std::function<double(int64_t)> step_cost = nullptr) {
  ContextParams cp{1, 256, nullptr};
  cp.checkpoints.step_tokens = step_checkpoints;
  Context ctx(m, cp);
  Sampler sampler(sp);
  SpeculativeDecoder dec(&ctx, 0, &sampler, draft, SpeculativeParams{draft_max, adaptive, std::move(step_cost)});
  SpecRun r;
  int32_t first = -1;
  EXPECT_TRUE(dec.start(prompt, &first).is_ok());
  r.tokens.push_back(first);
  std::vector<int32_t> got;
  while (static_cast<int>(r.tokens.size()) < n) {
    Status st = dec.step(n - static_cast<int>(r.tokens.size()), &got);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) break;
    EXPECT_GE(got.size(), 1u);
    r.tokens.insert(r.tokens.end(), got.begin(), got.end());
  }
  r.stats = dec.stats();
  r.cells = ctx.kv().seq_len(0);
  return r;
}

class Speculative : public ::testing::TestWithParam<std::string> {};

TEST_P(Speculative, OutputEqualsPlainDecodingWhateverTheDrafts) {
  auto m = Model::load(model_path(GetParam()));
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const auto prompt = prompt_of((*m)->hparams().n_vocab);
  // 24 tokens: enough for every draft case to accept, reject and roll back several times, and
  // the suite (9 architectures) stays within the sanitizer build's time.
  constexpr int kN = 24;
  for (const bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "sampled (temp 0.9, seed 5)" : "greedy");
    SamplingParams sp;
    if (sampled) {
      sp.temp = 0.9f;
      sp.seed = 5;
    }
    const auto want = plain(**m, prompt, kN, sp);
    ASSERT_EQ(want.size(), static_cast<size_t>(kN));
    ScriptedDraft oracle(want, prompt.size(), false), wrong(want, prompt.size(), true);
    NgramDraft ngram(2, 4);
    struct Case {
      const char* name;
      DraftSource* src;
      bool adaptive;
      int step_checkpoints = 32;
    };
    // Hybrids: with no checkpoints inside a step, dropping drafts recomputes the kept tokens
    // from the step's start (Context::rewind) — the output must not change either.
    const bool hybrid = (*m)->hparams().n_rec_layer > 0;
    for (const Case& c : {Case{"none", nullptr, true}, Case{"oracle", &oracle, false}, Case{"wrong", &wrong, false},
                          Case{"ngram", &ngram, false}, Case{"ngram adaptive", &ngram, true},
                          Case{"wrong, recomputed rollback", &wrong, false, 0}}) {
      if (c.step_checkpoints == 0 && !hybrid) continue;  // only a recurrent state has checkpoints
      SCOPED_TRACE(c.name);
      const SpecRun r = speculative(**m, prompt, kN, sp, c.src, c.adaptive, 8, c.step_checkpoints);
      EXPECT_EQ(r.tokens, want);
      // The last emitted token is not in the cache yet: prompt + n - 1 cells, no rejected ones.
      EXPECT_EQ(r.cells, static_cast<int64_t>(prompt.size() + kN - 1));
      EXPECT_EQ(r.stats.emitted, kN - 1);
      if (c.src == &oracle) {
        EXPECT_EQ(r.stats.accepted, r.stats.drafted);
        EXPECT_GT(r.stats.accepted, 0);
        EXPECT_LT(r.stats.steps, kN / 4) << "an always-right draft should need few passes";
      }
      if (c.src == &wrong) {
        EXPECT_GT(r.stats.drafted, 0);
        EXPECT_EQ(r.stats.accepted, 0);
      }
      // (Whether n-gram drafts occur depends on what a random model generates; the draft source's
      // matching is tested above, and the oracle/wrong cases drive acceptance and rollback.)
    }
  }
}

// Every architecture make-model writes, the hybrids (recurrent state with checkpoints) included.
INSTANTIATE_TEST_SUITE_P(Arch, Speculative, ::testing::ValuesIn(make_arch_names()), [](const auto& info) {
  std::string n = info.param;
  for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return n;
});

TEST(SpeculativeCostModel, StopsDraftingWhenDraftsAreNeverKept) {
  auto m = Model::load(model_path("qwen3moe"));
  ASSERT_TRUE(m.is_ok());
  const auto prompt = prompt_of((*m)->hparams().n_vocab);
  SamplingParams sp;
  const auto want = plain(**m, prompt, 80, sp);
  ScriptedDraft wrong(want, prompt.size(), true);
  // A pass costs 10 ms plus 3 ms per extra token (a fixed cost model, not this machine's clock, so
  // the decisions do not depend on how busy the machine is).
  auto cost = [](int64_t n) { return 0.010 + 0.003 * static_cast<double>(n - 1); };
  const SpecRun r = speculative(**m, prompt, 80, sp, &wrong, /*adaptive=*/true, 8, 32, cost);
  EXPECT_EQ(r.tokens, want);
  // Each rejected position lowers its estimate; after a few steps the model stops drafting and
  // only probes one draft every 32 steps. (Structure, not time: counts of drafted tokens.)
  EXPECT_LT(r.stats.drafted, 12) << "kept drafting although nothing was ever accepted";
  EXPECT_GT(r.stats.drafted, 0) << "never tried a draft";
}

// The step-time model: a pass with more tokens is never predicted cheaper than a smaller one
// that was measured (a noisy sample must not make drafts look free), and with drafts that are
// never kept, one more token per pass stops being worth it once its keep estimate falls below
// what the extra token costs.
TEST(SpeculativeCostModel, LargerPassesAreNeverPredictedCheaper) {
  StepTimeModel t;
  t.record(1, 0.010);
  t.record(2, 0.009);  // noise: the 2-token pass happened to be timed faster
  EXPECT_DOUBLE_EQ(t.predict(2), 0.010);
  EXPECT_GE(t.predict(5), 0.010);
  StepTimeModel u;
  u.record(1, 0.010);
  u.record(2, 0.013);
  DraftAcceptance a;
  EXPECT_EQ(choose_draft_length(u, a, 4, 1), 1);  // keep(1) = 1/2: 1.5 tokens for 1.3x the time
  a.record(1, false);
  a.record(1, false);  // keep(1) = 1/4: 1.25 tokens for 1.3x the time
  EXPECT_EQ(choose_draft_length(u, a, 4, 1), 0);
}

}  // namespace
}  // namespace moesh
