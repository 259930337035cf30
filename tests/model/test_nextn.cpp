// The NextN/MTP head as a draft source (src/model/nextn.cpp): which models have one and why the
// others are refused, that decoding through it is plain decoding token for token, and that the
// head's own state follows exactly the positions the decoder kept (a fresh head fed the kept
// history in one batch proposes the same drafts, bit for bit, as the head that went through the
// decoder's steps, rejections and cuts).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "moesh/make_model/make_model.h"
#include "moesh/model/model.h"
#include "moesh/model/sampling.h"
#include "moesh/model/speculative.h"
#include "reference.h"
#include "util/nextn_model.h"

namespace moesh {
namespace {

std::filesystem::path tmp_dir() {
  const auto dir = std::filesystem::temp_directory_path() / ("moesh-nextn-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

std::string model_path(const std::string& arch) {
  static std::map<std::string, std::string> cache;
  if (auto it = cache.find(arch); it != cache.end()) return it->second;
  MakeModelSpec s;
  EXPECT_TRUE(MakeModelSpec::defaults_for_name(arch, &s)) << arch;
  s.type = MakeFileType::kQ8_0;
  s.n_ctx = 256;
  s.vocab = MakeVocab::kNone;
  const std::string path = (tmp_dir() / (arch + ".gguf")).string();
  Status st = make_model(s, path);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return cache[arch] = path;
}

std::unique_ptr<Model> load(const std::string& path) {
  auto m = Model::load(path);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(*m) : nullptr;
}

std::vector<int32_t> prompt_of(int64_t n_vocab) {
  std::vector<int32_t> p;
  for (int32_t t : {11, 42, 7, 99, 3, 58, 11, 42, 17, 5, 230, 64}) p.push_back(t % static_cast<int32_t>(n_vocab));
  return p;
}

struct GenRun {
  std::vector<int32_t> tokens;
  SpeculativeStats stats;
  int64_t cells = 0;
};

// n tokens after the prompt, through SpeculativeDecoder with `draft` (null: plain decoding).
GenRun generate(const Model& m, const std::vector<int32_t>& prompt, int n, const SamplingParams& sp,
                std::unique_ptr<DraftSource>* draft, Context* ctx_out = nullptr) {
  Context own(m, ContextParams{1, 256, nullptr});
  Context& ctx = ctx_out != nullptr ? *ctx_out : own;
  Sampler sampler(sp);
  if (draft != nullptr) {
    auto d = make_draft_source("nextn", DraftEnv{&m, &ctx.pool(), 256});
    EXPECT_TRUE(d.is_ok()) << d.status().to_string();
    if (d.is_ok()) *draft = std::move(*d);
  }
  // adaptive off: every step verifies what the head proposes, so the accept and reject paths run.
  SpeculativeDecoder dec(&ctx, 0, &sampler, draft != nullptr ? draft->get() : nullptr, SpeculativeParams{3, false});
  GenRun r;
  int32_t first = -1;
  Status st = dec.start(prompt, &first);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  r.tokens.push_back(first);
  std::vector<int32_t> got;
  while (st.is_ok() && static_cast<int>(r.tokens.size()) < n) {
    st = dec.step(n - static_cast<int>(r.tokens.size()), &got);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    r.tokens.insert(r.tokens.end(), got.begin(), got.end());
  }
  r.stats = dec.stats();
  r.cells = ctx.kv().seq_len(0);
  return r;
}

TEST(Nextn, Glm4moeLoadsItsHeadAndOthersAreRefusedByName) {
  auto glm = load(model_path("glm4moe"));
  ASSERT_TRUE(glm);
  EXPECT_EQ(glm->hparams().n_layer, 3);  // the decoder; blk.3 is the head
  EXPECT_EQ(glm->hparams().n_nextn, 1);
  ASSERT_EQ(glm->nextn.size(), 1u);
  EXPECT_TRUE(glm->nextn_status.is_ok());
  EXPECT_TRUE(glm->nextn[0].block.is_moe);
  EXPECT_EQ(glm->layers.size(), 3u);
  ThreadPool pool(1);
  auto d = make_draft_source("nextn", DraftEnv{glm.get(), &pool, 64});
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ((*d)->name(), "nextn");
  EXPECT_TRUE((*d)->needs_hidden());
  EXPECT_TRUE(make_draft_source("mtp", DraftEnv{glm.get(), &pool, 64}).is_ok());

  // Without the model it drafts for, and for a model without a head: refused, saying why.
  auto none = make_draft_source("nextn");
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  auto qwen = load(model_path("qwen3moe"));
  ASSERT_TRUE(qwen);
  auto no_head = make_draft_source("nextn", DraftEnv{qwen.get(), &pool, 64});
  ASSERT_FALSE(no_head.is_ok());
  EXPECT_EQ(no_head.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(no_head.status().message().find("qwen3moe.nextn_predict_layers = 0"), std::string::npos)
      << no_head.status().message();
  EXPECT_NE(no_head.status().message().find("glm4moe"), std::string::npos) << no_head.status().message();
  auto unknown = make_draft_source("eagle3", DraftEnv{glm.get(), &pool, 64});
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.status().message().find("nextn"), std::string::npos);
}

TEST(Nextn, ABrokenHeadTakesOnlyTheDraftSourceAway) {
  // The same file without blk.3.nextn.hnorm: the model loads and decodes; the head is refused
  // naming the missing tensor.
  auto src = gguf::File::open(model_path("glm4moe"));
  ASSERT_TRUE(src.is_ok());
  gguf::Writer w;
  for (const auto& [k, v] : (*src)->kvs()) w.set(k, v);
  for (const auto& t : (*src)->tensors()) {
    if (t.name == "blk.3.nextn.hnorm.weight") continue;
    const TensorView v = (*src)->view(t);
    ASSERT_TRUE(w.add_tensor(t.name, t.type, std::vector<int64_t>(v.ne, v.ne + t.n_dims), v.data).is_ok());
  }
  const std::string path = (tmp_dir() / "glm4moe-no-hnorm.gguf").string();
  ASSERT_TRUE(w.write_file(path).is_ok());
  auto m = load(path);
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->nextn.empty());
  EXPECT_FALSE(m->nextn_status.is_ok());
  ThreadPool pool(1);
  auto d = make_draft_source("nextn", DraftEnv{m.get(), &pool, 64});
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().message().find("blk.3.nextn.hnorm.weight"), std::string::npos) << d.status().message();
  const auto prompt = prompt_of(m->hparams().n_vocab);
  EXPECT_EQ(generate(*m, prompt, 4, SamplingParams{}, nullptr).tokens.size(), 4u);
}

TEST(Nextn, DecodingThroughTheHeadIsPlainDecoding) {
  for (const char* arch : {"glm4moe", "step35", "glm-dsa"}) {
    auto m = load(model_path(arch));
    ASSERT_TRUE(m);
    const auto prompt = prompt_of(m->hparams().n_vocab);
    constexpr int kN = 20;
    for (const bool sampled : {false, true}) {
      SCOPED_TRACE(std::string(arch) + (sampled ? " sampled (temp 0.8, seed 3)" : " greedy"));
      SamplingParams sp;
      if (sampled) sp.temp = 0.8f, sp.seed = 3;
      const GenRun want = generate(*m, prompt, kN, sp, nullptr);
      std::unique_ptr<DraftSource> head;
      const GenRun got = generate(*m, prompt, kN, sp, &head);
      ASSERT_TRUE(head);
      EXPECT_EQ(got.tokens, want.tokens);
      EXPECT_EQ(got.cells, static_cast<int64_t>(prompt.size() + kN - 1)) << "rejected drafts left cells behind";
      EXPECT_GT(got.stats.drafted, 0) << "the head proposed nothing";
      const auto& hs = static_cast<NextnDraft&>(*head).stats();
      EXPECT_EQ(hs.failures, 0) << static_cast<NextnDraft&>(*head).last_error().to_string();
      EXPECT_GT(hs.runs, 0);
    }
  }
}

TEST(Nextn, HeadStateIsAFunctionOfTheKeptHistory) {
  auto m = load(model_path("glm4moe"));
  ASSERT_TRUE(m);
  const auto prompt = prompt_of(m->hparams().n_vocab);
  Context ctx(*m, ContextParams{1, 256, nullptr});
  std::unique_ptr<DraftSource> followed;
  const GenRun r = generate(*m, prompt, 16, SamplingParams{}, &followed, &ctx);
  ASSERT_TRUE(followed);
  std::vector<int32_t> history = prompt;
  history.insert(history.end(), r.tokens.begin(), r.tokens.end());
  std::vector<int32_t> a, b;
  followed->propose(0, history, 3, &a);
  ASSERT_FALSE(a.empty());

  // A fresh head fed every kept position at once (hidden states from one batch decode).
  Context fresh_ctx(*m, ContextParams{1, 256, nullptr});
  fresh_ctx.set_keep_hidden(true);
  const int64_t n = static_cast<int64_t>(history.size()) - 1;
  ASSERT_TRUE(fresh_ctx.decode(0, history.data(), n, nullptr).is_ok());
  ASSERT_EQ(fresh_ctx.hidden().size(), static_cast<size_t>(n * m->hparams().n_embd));
  auto fresh = make_draft_source("nextn", DraftEnv{m.get(), &fresh_ctx.pool(), 256});
  ASSERT_TRUE(fresh.is_ok());
  (*fresh)->on_hidden(0, 0, n, fresh_ctx.hidden().data(), history.data() + 1);
  (*fresh)->propose(0, history, 3, &b);
  EXPECT_EQ(a, b);

  // Proposing again without new positions proposes the same (temporary slots were cut).
  std::vector<int32_t> again;
  followed->propose(0, history, 3, &again);
  EXPECT_EQ(again, a);
  // A history the head has not seen the end of: nothing (never a draft for the wrong position).
  std::vector<int32_t> other = history;
  other.back() = (other.back() + 1) % static_cast<int32_t>(m->hparams().n_vocab);
  (*fresh)->propose(0, other, 3, &b);
  EXPECT_TRUE(b.empty());
  // Another sequence, a gap, a re-reported prefix and forget(): drafts stay well formed.
  const int64_t D = m->hparams().n_embd;
  (*fresh)->on_hidden(7, 5, 4, fresh_ctx.hidden().data() + 5 * D, history.data() + 6);
  (*fresh)->propose(7, std::span<const int32_t>(history.data(), 10), 2, &b);
  ASSERT_EQ(b.size(), 2u);
  for (int32_t t : b) EXPECT_LT(t, m->hparams().n_vocab);
  (*fresh)->on_hidden(7, 2, 3, fresh_ctx.hidden().data() + 2 * D, history.data() + 3);
  (*fresh)->propose(7, std::span<const int32_t>(history.data(), 6), 2, &b);
  EXPECT_EQ(b.size(), 2u);
  (*fresh)->forget(7);
  (*fresh)->propose(7, std::span<const int32_t>(history.data(), 6), 2, &b);
  EXPECT_TRUE(b.empty());
}

// The bigram model of util/nextn_model.h: a head that computes the model's own map one token
// ahead drafts exactly what the model generates.
TEST(Nextn, AHeadThatKnowsTheModelDraftsWhatItGenerates) {
  const std::string path = (tmp_dir() / "glm4moe-bigram.gguf").string();
  Status made = test::write_nextn_bigram_model(path);
  ASSERT_TRUE(made.is_ok()) << made.to_string();
  auto m = load(path);
  ASSERT_TRUE(m);
  const auto prompt = prompt_of(m->hparams().n_vocab);
  constexpr int kN = 24;
  const GenRun want = generate(*m, prompt, kN, SamplingParams{}, nullptr);
  std::unique_ptr<DraftSource> head;
  const GenRun got = generate(*m, prompt, kN, SamplingParams{}, &head);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_GT(got.stats.drafted, 0);
  EXPECT_EQ(got.stats.accepted, got.stats.drafted) << "a head computing the model's own map was rejected";
  EXPECT_LE(got.stats.steps, (kN - 1 + 3) / 4) << "3 drafts kept per pass: 4 tokens each";
}

// The reference glm4moe, step35 and glm-dsa files (written by llama.cpp's tools, with their NextN
// tensors; glm-dsa's NextN block has no indexer and attends densely).
TEST(Nextn, ReferenceFileDraftsAndDecodesLikePlain) {
  for (const char* file : {"/archs/glm4moe-a.Q8_0.gguf", "/archs2/step35-a.Q8_0.gguf", "/archs2/glmdsa-a.Q8_0.gguf"}) {
    SCOPED_TRACE(file);
    const std::string path = testing::reference_dir() + file;
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "reference set absent: " << path;
    auto m = load(path);
    ASSERT_TRUE(m);
    ASSERT_EQ(m->nextn.size(), 1u) << m->nextn_status.to_string();
    const auto prompt = prompt_of(m->hparams().n_vocab);
    const GenRun want = generate(*m, prompt, 16, SamplingParams{}, nullptr);
    std::unique_ptr<DraftSource> head;
    const GenRun got = generate(*m, prompt, 16, SamplingParams{}, &head);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_GT(got.stats.drafted, 0);
  }
}

}  // namespace
}  // namespace moesh
