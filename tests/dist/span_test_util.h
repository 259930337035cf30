// Helpers of the span dist tests (test_span.cpp, test_span_chain.cpp): real `moesh span`
// processes on 127.0.0.1, a backbone's SpanClient to them, and the all-local comparisons.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "dist/dist_util.h"
#include "dist/worker_process.h"
#include "moesh/model/speculative.h"
#include "moesh/remote/span_client.h"
#include "moesh/swarm/swarm.h"

namespace moesh::test {

// qwen3moe, 6 blocks, Q8_0: enough blocks for two spans with local blocks before, between and
// after them.
inline std::string six_block_model() {
  MakeModelSpec s = MakeModelSpec::defaults_for(MakeArch::kQwen3Moe);
  s.type = MakeFileType::kQ8_0;
  s.seed = 91;
  s.n_layer = 6;
  s.n_ctx = 512;
  return made_model("qwen3moe-l6", s);
}

inline Result<std::unique_ptr<WorkerProcess>> spawn_span(const std::string& model, const std::string& layers,
                                                         std::vector<std::string> extra = {}) {
  // layers "": no --layers (a peer that runs the blocks a backbone gives it).
  std::vector<std::string> args = {"span", "-m", model, "-t", "1"};
  if (!layers.empty()) args.insert(args.begin() + 3, {"--layers", layers});
  if (std::find(extra.begin(), extra.end(), "--listen") == extra.end())
    extra.insert(extra.end(), {"--listen", "127.0.0.1:0"});
  args.insert(args.end(), extra.begin(), extra.end());
  return WorkerProcess::spawn_command(std::move(args), "span " + layers);
}

// A span peer on a slice of its blocks (`moesh slice --layers`) and no --fetch: it runs those
// blocks only, and says so when a backbone asks it to load others.
inline Result<std::unique_ptr<WorkerProcess>> spawn_span_slice(const std::string& model, const std::string& layers) {
  auto f = gguf::File::open(model);
  if (!f) return f.status();
  auto sp = parse_layer_span(layers);
  if (!sp) return sp.status();
  const std::string out = model + ".span-" + layers + ".gguf";
  if (!std::filesystem::exists(out)) {
    const std::string part = out + ".part." + std::to_string(::getpid());
    MOESH_RETURN_IF_ERROR(swarm::write_span_slice(**f, sp->first, sp->last, part));
    std::filesystem::rename(part, out);
  }
  return spawn_span(out, layers);
}

inline SpanTarget target(int first, int last, std::vector<const WorkerProcess*> peers) {
  SpanTarget t;
  t.span = {first, last};
  for (const WorkerProcess* p : peers) t.peers.push_back(p->address());
  return t;
}

// spill_log: the input log keeps no rows in memory past chunks of 2 rows (util/row_log.h), so
// replays read their rows back from its file.
inline std::shared_ptr<SpanClient> connect_spans(const Model& m, std::vector<SpanTarget> targets, bool fallback = true,
                                                 SpanChainMode chain = SpanChainMode::kAuto, bool spill_log = false) {
  SpanOptions o;
  o.chain = chain;
  if (spill_log) {
    o.log_memory_bytes = 0;
    o.log_chunk_rows = 2;
  }
  o.local_fallback = fallback;
  o.local_threads = 1;
  o.timeout = std::chrono::milliseconds(20000);
  auto c = SpanClient::connect(m, std::move(targets), o);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return c.is_ok() ? *c : nullptr;
}

inline Context make_ctx(const Model& m, std::shared_ptr<SpanRunner> spans, int64_t n_ctx = 256) {
  ContextParams cp;
  cp.n_threads = 1;
  cp.n_ctx = n_ctx;
  cp.spans = std::move(spans);
  return Context(m, cp);
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One greedy token through `ctx` (spans) and `local`: the logits bits must be equal; *t becomes
// the next token.
inline void step_both(Context& ctx, Context& local, int32_t* t, int i) {
  const int64_t V = ctx.model().hparams().n_vocab;
  std::vector<float> p(V), q(V);
  Status st = ctx.decode(0, t, 1, p.data());
  ASSERT_TRUE(st.is_ok()) << "token " << i << ": " << st.to_string();
  ASSERT_TRUE(local.decode(0, t, 1, q.data()).is_ok());
  ASSERT_TRUE(same_bits(p, q)) << "token " << i;
  *t = static_cast<int32_t>(std::max_element(q.begin(), q.end()) - q.begin());
}

// Sequence 0 gets a 5-token prompt and two greedy tokens (from *t), sequence 1 a 3-token prompt,
// through `ctx` and `local` with equal bits: 7 cells and 3.
inline void start_two_sequences(Context& ctx, Context& local, int32_t* t) {
  const int64_t V = ctx.model().hparams().n_vocab;
  const std::vector<int32_t> prompt = {4, 9, 27, 81, 5}, other_prompt = {7, 11, 13};
  std::vector<float> x(prompt.size() * V), y(prompt.size() * V);
  ASSERT_TRUE(ctx.decode(0, prompt.data(), 5, x.data()).is_ok());
  ASSERT_TRUE(local.decode(0, prompt.data(), 5, y.data()).is_ok());
  ASSERT_TRUE(ctx.decode(1, other_prompt.data(), 3, x.data()).is_ok());
  ASSERT_TRUE(local.decode(1, other_prompt.data(), 3, y.data()).is_ok());
  ASSERT_TRUE(same_bits(x, y));
  for (int i = 0; i < 2; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, t, i));
}

// A prompt as one batch, then `n_dec` greedy tokens one at a time; every logits row kept.
inline std::vector<float> greedy_rows(Context& ctx, const std::vector<int32_t>& prompt, int n_dec, int32_t seq = 0) {
  const int64_t V = ctx.model().hparams().n_vocab;
  const int64_t P = static_cast<int64_t>(prompt.size());
  std::vector<float> rows(static_cast<size_t>((P + n_dec) * V));
  Status st = ctx.decode(seq, prompt.data(), P, rows.data());
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  for (int i = 0; i < n_dec && st.is_ok(); ++i) {
    const float* last = rows.data() + (P + i - 1) * V;
    const int32_t t = static_cast<int32_t>(std::max_element(last, last + V) - last);
    st = ctx.decode(seq, &t, 1, rows.data() + (P + i) * V);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  return rows;
}

// A draft source that proposes wrong tokens (every draft rejected: a rollback on every span
// each step) or the true continuation (every draft kept).
class FixedDraft final : public DraftSource {
 public:
  FixedDraft(std::vector<int32_t> truth, size_t prompt_len, int32_t n_vocab, bool wrong)
      : truth_(std::move(truth)), prompt_len_(prompt_len), n_vocab_(n_vocab), wrong_(wrong) {}
  void propose(int32_t, std::span<const int32_t> h, int max_tokens, std::vector<int32_t>* out) override {
    out->clear();
    for (size_t i = h.size() - prompt_len_; i < truth_.size() && static_cast<int>(out->size()) < max_tokens; ++i) {
      out->push_back(wrong_ ? (truth_[i] + 1) % n_vocab_ : truth_[i]);
    }
  }
  std::string name() const override { return wrong_ ? "wrong" : "oracle"; }

 private:
  std::vector<int32_t> truth_;
  size_t prompt_len_;
  int32_t n_vocab_;
  bool wrong_;
};

inline std::vector<int32_t> speculative_greedy(Context& ctx, const std::vector<int32_t>& prompt, int n,
                                               DraftSource* draft) {
  SamplingParams sp;
  sp.temp = 0;
  Sampler sampler(sp);
  SpeculativeDecoder dec(&ctx, 0, &sampler, draft, SpeculativeParams{4, false});
  std::vector<int32_t> out;
  int32_t first = -1;
  Status st = dec.start(prompt, &first);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  out.push_back(first);
  std::vector<int32_t> got;
  while (st.is_ok() && static_cast<int>(out.size()) < n) {
    st = dec.step(n - static_cast<int>(out.size()), &got);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    out.insert(out.end(), got.begin(), got.end());
  }
  return out;
}

}  // namespace moesh::test
