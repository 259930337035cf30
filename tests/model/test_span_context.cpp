// The forward pass with layer spans, in-process (model/span.h): a SpanRunner that runs its
// blocks on a second context's decode_layers gives the bits of the plain forward pass for
// batches, several sequences and rollbacks, and hears of every cut, copy and removal; a context
// restricted to some blocks (a span peer's) keeps only their state and refuses the rest.
#include <gtest/gtest.h>

#include <cstring>

#include "moesh/make_model/make_model.h"
#include "moesh/model/model.h"

namespace moesh {
namespace {

std::string model_path() {
  static const std::string path = [] {
    MakeModelSpec s = MakeModelSpec::defaults_for(MakeArch::kQwen3Moe);
    s.type = MakeFileType::kQ8_0;
    s.n_layer = 4;
    s.seed = 12;
    const std::string p = testing::TempDir() + "/span-context.gguf";
    EXPECT_TRUE(make_model(s, p).is_ok());
    return p;
  }();
  return path;
}

// Runs blocks [first, last] on its own context, which keeps only their state; records the
// state events it hears.
class InProcessSpan final : public SpanRunner {
 public:
  InProcessSpan(const Model& m, LayerSpan sp) : spans_{sp} {
    ContextParams cp;
    cp.n_threads = 1;
    cp.layers = sp;
    ctx_ = std::make_unique<Context>(m, cp);
  }
  const std::vector<LayerSpan>& spans() const override { return spans_; }
  Status run(int k, const SpanBatch& b, float* h) override {
    // The peer's cells follow the backbone's: cut each sequence back to where the step starts.
    std::vector<Context::LayerToken> toks;
    for (int64_t i = 0; i < b.n; ++i) {
      if (ctx_->state().seq_len(b.seq[i]) > b.cell[i])
        MOESH_RETURN_IF_ERROR(ctx_->state().truncate(b.seq[i], b.cell[i]));
      toks.push_back({b.seq[i], b.pos[i], b.logits != nullptr && b.logits[i] != 0});
    }
    ++runs;
    return ctx_->decode_layers(toks, spans_[static_cast<size_t>(k)].first, spans_[static_cast<size_t>(k)].last, h);
  }
  void on_truncate(int32_t seq, int64_t n) override {
    events.push_back("truncate " + std::to_string(seq) + " " + std::to_string(n));
  }
  void on_copy(int32_t s, int32_t d, int64_t n) override {
    events.push_back("copy " + std::to_string(s) + " " + std::to_string(d) + " " + std::to_string(n));
    (void)ctx_->state().copy(s, d, n);
  }
  void on_remove(int32_t seq) override { events.push_back("remove " + std::to_string(seq)); }
  void on_clear() override { events.push_back("clear"); }

  std::unique_ptr<Context> ctx_;
  std::vector<LayerSpan> spans_;
  std::vector<std::string> events;
  int runs = 0;
};

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(SpanContext, ASpanOnAnotherContextGivesThePlainBits) {
  auto model = Model::load(model_path());
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const Model& m = **model;
  const int64_t V = m.hparams().n_vocab;
  auto span = std::make_shared<InProcessSpan>(m, LayerSpan{1, 2});
  EXPECT_EQ(span->ctx_->kv().n_layer(), 2);  // only the span's KV layers
  ContextParams cp;
  cp.n_threads = 1;
  Context plain(m, cp);
  cp.spans = span;
  Context ctx(m, cp);
  const std::vector<int32_t> prompt = {4, 8, 15, 16, 23, 42};
  std::vector<float> a(6 * V), b(6 * V);
  ASSERT_TRUE(plain.decode(0, prompt.data(), 6, a.data()).is_ok());
  ASSERT_TRUE(ctx.decode(0, prompt.data(), 6, b.data()).is_ok());
  EXPECT_TRUE(same(a, b));
  EXPECT_EQ(span->runs, 1);
  // Several sequences in one step, then a rollback and a different continuation.
  ASSERT_TRUE(plain.state().copy(0, 1, 4).is_ok());
  ASSERT_TRUE(ctx.state().copy(0, 1, 4).is_ok());
  std::vector<Context::BatchToken> batch = {{0, 7, true}, {1, 9, false}, {1, 10, true}};
  std::vector<float> x(2 * V), y(2 * V);
  ASSERT_TRUE(plain.decode_batch(batch, x.data()).is_ok());
  ASSERT_TRUE(ctx.decode_batch(batch, y.data()).is_ok());
  EXPECT_TRUE(same(x, y));
  ASSERT_TRUE(plain.rewind(0, 5, prompt).is_ok());
  ASSERT_TRUE(ctx.rewind(0, 5, prompt).is_ok());
  const int32_t t = 31;
  std::vector<float> p(V), q(V);
  ASSERT_TRUE(plain.decode(0, &t, 1, p.data()).is_ok());
  ASSERT_TRUE(ctx.decode(0, &t, 1, q.data()).is_ok());
  EXPECT_TRUE(same(p, q));
  ctx.state().remove(1);
  ctx.state().clear();
  EXPECT_EQ(span->events, (std::vector<std::string>{"copy 0 1 4", "truncate 0 5", "remove 1", "clear"}));
}

TEST(SpanContext, BadSpansAndRestrictedContextsAreRefused) {
  auto model = Model::load(model_path());
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  const int32_t tok = 3;
  for (LayerSpan bad : {LayerSpan{2, 5}, LayerSpan{3, 1}}) {
    ContextParams cp;
    cp.n_threads = 1;
    cp.spans = std::make_shared<InProcessSpan>(m, LayerSpan{1, 1});
    static_cast<InProcessSpan*>(cp.spans.get())->spans_ = {bad};
    Context ctx(m, cp);
    Status st = ctx.decode(0, &tok, 1, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  }
  ContextParams cp;
  cp.n_threads = 1;
  cp.layers = {1, 2};
  Context part(m, cp);
  EXPECT_EQ(part.decode(0, &tok, 1, nullptr).code(), StatusCode::kInvalidArgument);
  std::vector<float> h(static_cast<size_t>(m.hparams().n_embd), 0.1f);
  std::vector<Context::LayerToken> toks = {{0, 0, false}};
  EXPECT_EQ(part.decode_layers(toks, 0, 2, h.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(part.decode_layers(toks, 1, 2, h.data()).is_ok());
  // Positions must continue the sequence.
  EXPECT_FALSE(part.decode_layers(toks, 1, 2, h.data()).is_ok());
  EXPECT_EQ(part.state().seq_len(0), 1);
}

// kimi-k3's cross-layer residual attention: blocks read checkpoints banked by earlier blocks, so a
// span's rows carry them ([p | c_0 | ...], span_row_width). Every span of a 6-block model (B = 2
// here) gives all-local's logits bits, whatever the checkpoints before and after it; the rows a
// span returns are as wide as its end needs.
TEST(SpanContext, ResidualAttentionRowsCarryTheCheckpoints) {
  MakeModelSpec s;
  ASSERT_TRUE(MakeModelSpec::defaults_for_name("kimi-k3", &s));
  s.type = MakeFileType::kQ8_0;
  s.vocab = MakeVocab::kNone;
  s.n_layer = 6;
  const std::string p = testing::TempDir() + "/span-context-kimi.gguf";
  ASSERT_TRUE(make_model(s, p).is_ok());
  auto model = Model::load(p);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const Model& m = **model;
  const HParams& hp = m.hparams();
  ASSERT_GT(hp.attn_res_block, 0);
  const int64_t D = hp.n_embd, B = hp.attn_res_block, V = hp.n_vocab;
  EXPECT_EQ(hp.span_row_width(0), D);
  EXPECT_EQ(hp.span_row_width(1), 2 * D);
  EXPECT_EQ(hp.span_row_width(B + 1), 3 * D);
  const std::vector<int32_t> prompt = {4, 8, 15, 16, 23};
  ContextParams cp;
  cp.n_threads = 1;
  Context plain(m, cp);
  std::vector<float> want(prompt.size() * V);
  ASSERT_TRUE(plain.decode(0, prompt.data(), static_cast<int64_t>(prompt.size()), want.data()).is_ok());
  const int32_t next = 7;
  std::vector<float> want_next(V);
  ASSERT_TRUE(plain.decode(0, &next, 1, want_next.data()).is_ok());
  for (int first = 0; first < 6; ++first) {
    for (int last = first; last < 6; ++last) {
      SCOPED_TRACE("span " + std::to_string(first) + "-" + std::to_string(last));
      ContextParams sp = cp;
      sp.spans = std::make_shared<InProcessSpan>(m, LayerSpan{first, last});
      Context ctx(m, sp);
      std::vector<float> got(prompt.size() * V), got_next(V);
      ASSERT_TRUE(ctx.decode(0, prompt.data(), static_cast<int64_t>(prompt.size()), got.data()).is_ok());
      ASSERT_TRUE(ctx.decode(0, &next, 1, got_next.data()).is_ok());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(got_next.data(), want_next.data(), got_next.size() * sizeof(float)), 0);
    }
  }
  // decode_layers takes and gives the wide rows: a block run alone from the stream only differs
  // from one given the checkpoints (they are read, not ignored).
  ContextParams pp = cp;
  pp.layers = {1, 2};
  Context a(m, pp), b2(m, pp);
  std::vector<float> h(static_cast<size_t>(hp.span_row_width(3)), 0.25f), g = h;
  for (int64_t i = D; i < 2 * D; ++i) g[static_cast<size_t>(i)] = -0.5f;  // another checkpoint 0
  std::vector<Context::LayerToken> toks = {{0, 0, false}};
  ASSERT_TRUE(a.decode_layers(toks, 1, 2, h.data()).is_ok());
  ASSERT_TRUE(b2.decode_layers(toks, 1, 2, g.data()).is_ok());
  EXPECT_NE(std::memcmp(h.data(), g.data(), static_cast<size_t>(D) * sizeof(float)), 0);
}

}  // namespace
}  // namespace moesh
