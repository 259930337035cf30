// Layer spans through real `moesh span` processes on 127.0.0.1: blocks FIRST-LAST run on a span
// peer, one trip per span and step. Everything that works all-local must give the same bits
// across spans: prompt batches, token-by-token decoding, several sequences in one step
// (continuous batching), speculative rollback, prefix copies, every architecture; and a peer that
// is killed mid-generation is replaced (the next peer named for the span, then this process) with
// its inputs replayed, so the output does not change.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "dist/span_test_util.h"
#include "moesh/serve/scheduler.h"
#include "moesh/swarm/swarm.h"
#include "util/run_moesh.h"

namespace moesh::test {
namespace {

TEST(Span, TwoSpanPeersGiveTheLocalBitsWithOneTripPerSpanAndStep) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const Model& m = **model;
  auto a = spawn_span(path, "1-2");
  auto b = spawn_span(path, "4-4");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  const std::vector<int32_t> prompt = test_tokens(path, m.hparams().n_vocab, 10);

  Context local = make_ctx(m, nullptr);
  const std::vector<float> want = greedy_rows(local, prompt, 6);
  auto spans = connect_spans(m, {target(4, 4, {b->get()}), target(1, 2, {a->get()})});
  ASSERT_NE(spans, nullptr);
  ASSERT_EQ(spans->spans().size(), 2u);
  EXPECT_EQ(spans->spans()[0], (LayerSpan{1, 2}));  // sorted by first block
  Context ctx = make_ctx(m, spans);
  // Only the blocks that run here (0, 3, 5) keep KV cells on the backbone.
  EXPECT_EQ(ctx.kv().n_layer(), 3);
  EXPECT_EQ(local.kv().n_layer(), 6);
  EXPECT_TRUE(same_bits(greedy_rows(ctx, prompt, 6), want));
  // 7 forward passes (the prompt, then 6 tokens) x 2 spans: one trip each, nothing replayed.
  const SpanStats s = spans->stats();
  EXPECT_EQ(s.steps, 14u);
  EXPECT_EQ(s.trips, 14u);
  EXPECT_EQ(s.resends, 0u);
  EXPECT_EQ(s.replayed_rows, 0u);
  EXPECT_EQ(s.failovers, 0u);
  EXPECT_EQ(s.local_steps, 0u);
  EXPECT_GT(spans->log_bytes(), 0u);
  EXPECT_NE(spans->where(0).find("span-1-2"), std::string::npos) << spans->where(0);
}

TEST(Span, SeveralSequencesInOneStepMakeOneTripPerSpan) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  const int64_t V = m.hparams().n_vocab;
  auto a = spawn_span(path, "0-2");
  auto b = spawn_span(path, "3-5");
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  auto spans = connect_spans(m, {target(0, 2, {a->get()}), target(3, 5, {b->get()})});
  ASSERT_NE(spans, nullptr);
  Context ctx = make_ctx(m, spans);
  Context local = make_ctx(m, nullptr);
  // Three sequences of different lengths, prompts then two mixed steps.
  const std::vector<std::vector<int32_t>> prompts = {{5, 6, 7}, {40, 41, 42, 43, 44}, {9}};
  for (int32_t s = 0; s < 3; ++s) {
    std::vector<float> lg(prompts[s].size() * V), lg2(prompts[s].size() * V);
    ASSERT_TRUE(ctx.decode(s, prompts[s].data(), static_cast<int64_t>(prompts[s].size()), lg.data()).is_ok());
    ASSERT_TRUE(local.decode(s, prompts[s].data(), static_cast<int64_t>(prompts[s].size()), lg2.data()).is_ok());
    EXPECT_TRUE(same_bits(lg, lg2)) << "prompt of sequence " << s;
  }
  const uint64_t trips_before = spans->stats().trips;
  for (int step = 0; step < 2; ++step) {
    std::vector<Context::BatchToken> batch = {
        {0, 11 + step, true}, {1, 12 + step, true}, {2, 13 + step, false}, {2, 14 + step, true}};
    std::vector<float> lg(3 * V), lg2(3 * V);
    ASSERT_TRUE(ctx.decode_batch(batch, lg.data()).is_ok());
    ASSERT_TRUE(local.decode_batch(batch, lg2.data()).is_ok());
    EXPECT_TRUE(same_bits(lg, lg2)) << "step " << step;
  }
  EXPECT_EQ(spans->stats().trips - trips_before, 4u);  // 2 steps x 2 spans, all sequences in each
}

// Every architecture the reference set has: a span of its last blocks on a peer; batch and
// incremental logits bit-identical to all-local; speculative greedy with rejected and with kept
// drafts equal to plain greedy (rollback on the span).
TEST(Span, EveryArchitectureIsExactAndRollsBackAcrossASpan) {
  const std::vector<std::string> files = {
      "qwen3moe-s.Q8_0.gguf",        "mixtral-s.Q8_0.gguf",         "deepseek2-s.Q8_0.gguf",
      "archs/glm4moe-a.Q8_0.gguf",   "archs/gptoss-a.Q8_0.gguf",    "archs/llama4-a.Q8_0.gguf",
      "archs/minimaxm2-a.Q8_0.gguf", "archs/qwen35moe-a.Q8_0.gguf", "archs/qwen3next-a.Q8_0.gguf",
      "archs2/step35-a.Q8_0.gguf",   "archs2/glmdsa-a.Q8_0.gguf",   "archs2/minimaxm3-a.Q8_0.gguf",
      "archs2/kimik3-a.Q8_0.gguf"};
  if (!std::filesystem::exists(reference_path(files[0]))) GTEST_SKIP() << "no reference set at " << MOESH_REFERENCE_DIR;
  for (const std::string& f : files) {
    SCOPED_TRACE(f);
    const std::string path = reference_path(f);
    auto model = Model::load(path);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    const Model& m = **model;
    const int n_layer = static_cast<int>(m.hparams().n_layer);
    // The last blocks, from the first MoE block after block 0 (a span peer serves its experts;
    // glm-dsa: block 1, which reuses block 0's indexer selection — it crosses with the rows).
    int first = 1;
    while (first < n_layer - 1 && !m.layers[static_cast<size_t>(first)].is_moe) ++first;
    const std::string layers = std::to_string(first) + "-" + std::to_string(n_layer - 1);
    auto peer = spawn_span(path, layers);
    ASSERT_TRUE(peer.is_ok()) << peer.status().to_string();
    auto spans = connect_spans(m, {target(first, n_layer - 1, {peer->get()})}, /*fallback=*/false);
    ASSERT_NE(spans, nullptr);
    if (m.hparams().carries_selection(first)) {
      // glm-dsa's rows into block 1 carry block 0's selection (cell positions): f16 rows refused.
      SpanOptions lossy;
      lossy.hidden_wire = wire::WireDType::kF16;
      auto c = SpanClient::connect(m, {target(first, n_layer - 1, {peer->get()})}, lossy);
      ASSERT_FALSE(c.is_ok());
      EXPECT_NE(c.status().message().find("carry an indexer selection"), std::string::npos) << c.status().to_string();
    }
    const std::vector<int32_t> prompt = test_tokens(path, m.hparams().n_vocab, 8);
    Context local = make_ctx(m, nullptr);
    Context ctx = make_ctx(m, spans);
    EXPECT_TRUE(same_bits(greedy_rows(ctx, prompt, 4), greedy_rows(local, prompt, 4)));
    // A live resplit into two spans here (the second warmed with what the first computes: the
    // model's widest rows, recurrent states, indexer caches) keeps the bits.
    const int cut = first + 1;
    if (cut < n_layer) {
      Status rs = spans->resplit({{{first, cut - 1}, "here"}, {{cut, n_layer - 1}, "here"}});
      ASSERT_TRUE(rs.is_ok()) << rs.to_string();
      ASSERT_EQ(spans->spans().size(), 2u);
      int32_t t = prompt.back();
      for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
      EXPECT_EQ(spans->stats().resends, 0u);
    }

    const int n = 10;
    Context plain_ctx = make_ctx(m, nullptr);
    const std::vector<int32_t> truth = speculative_greedy(plain_ctx, prompt, n, nullptr);
    for (bool wrong : {true, false}) {
      FixedDraft draft(truth, prompt.size(), static_cast<int32_t>(m.hparams().n_vocab), wrong);
      Context sctx = make_ctx(m, spans);
      EXPECT_EQ(speculative_greedy(sctx, prompt, n, &draft), truth) << draft.name();
    }
    EXPECT_EQ(spans->stats().failovers, 0u);
    if (m.hparams().attn_res_block > 0 && n_layer - 2 > first) {
      // Cross-layer residual attention (kimi-k3): the span's rows carry the checkpoints banked
      // before it, and come back with those it banked; here the last block runs on the backbone
      // after the span, reading them.
      EXPECT_GT(m.hparams().span_row_width(n_layer - 1), m.hparams().n_embd);
      auto mid = spawn_span(path, std::to_string(first) + "-" + std::to_string(n_layer - 2));
      ASSERT_TRUE(mid.is_ok()) << mid.status().to_string();
      auto mspans = connect_spans(m, {target(first, n_layer - 2, {mid->get()})}, /*fallback=*/false);
      ASSERT_NE(mspans, nullptr);
      Context mctx = make_ctx(m, mspans);
      Context mlocal = make_ctx(m, nullptr);
      EXPECT_TRUE(same_bits(greedy_rows(mctx, prompt, 4), greedy_rows(mlocal, prompt, 4)));
    }
  }
}

// The backbone's prefix cache copies a sequence's cells to another: the peer finds the copied
// prefix by its hash chain and copies it too (no inputs replayed); and a peer that dropped a
// sequence (--max-seqs 1, two sequences taking turns) says what it lacks and gets it replayed.
TEST(Span, PrefixCopiesAndEvictedSequencesStayExact) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  const int64_t V = m.hparams().n_vocab;
  auto a = spawn_span(path, "1-4");
  ASSERT_TRUE(a.is_ok());
  auto spans = connect_spans(m, {target(1, 4, {a->get()})});
  ASSERT_NE(spans, nullptr);
  Context ctx = make_ctx(m, spans);
  Context local = make_ctx(m, nullptr);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  std::vector<float> lg(prompt.size() * V), lg2(prompt.size() * V);
  ASSERT_TRUE(ctx.decode(0, prompt.data(), 8, lg.data()).is_ok());
  ASSERT_TRUE(local.decode(0, prompt.data(), 8, lg2.data()).is_ok());
  ASSERT_TRUE(ctx.state().copy(0, 1, 5).is_ok());
  ASSERT_TRUE(local.state().copy(0, 1, 5).is_ok());
  const std::vector<int32_t> tail = {7, 7, 8};
  std::vector<float> t1(3 * V), t2(3 * V);
  ASSERT_TRUE(ctx.decode(1, tail.data(), 3, t1.data()).is_ok());
  ASSERT_TRUE(local.decode(1, tail.data(), 3, t2.data()).is_ok());
  EXPECT_TRUE(same_bits(t1, t2));
  EXPECT_EQ(spans->stats().resends, 0u);
  EXPECT_EQ(spans->stats().replayed_rows, 0u);
  // A removed sequence id used again starts from nothing.
  ctx.state().remove(1);
  local.state().remove(1);
  ASSERT_TRUE(ctx.decode(1, tail.data(), 3, t1.data()).is_ok());
  ASSERT_TRUE(local.decode(1, tail.data(), 3, t2.data()).is_ok());
  EXPECT_TRUE(same_bits(t1, t2));

  auto small = spawn_span(path, "1-4", {"--max-seqs", "1"});
  ASSERT_TRUE(small.is_ok());
  auto evicting = connect_spans(m, {target(1, 4, {small->get()})});
  ASSERT_NE(evicting, nullptr);
  Context ectx = make_ctx(m, evicting);
  Context elocal = make_ctx(m, nullptr);
  for (int round = 0; round < 3; ++round) {
    for (int32_t s = 0; s < 2; ++s) {
      const int32_t t = 20 + 3 * round + s;
      std::vector<float> x(V), y(V);
      ASSERT_TRUE(ectx.decode(s, &t, 1, x.data()).is_ok());
      ASSERT_TRUE(elocal.decode(s, &t, 1, y.data()).is_ok());
      EXPECT_TRUE(same_bits(x, y)) << "round " << round << " sequence " << s;
    }
  }
  const SpanStats es = evicting->stats();
  EXPECT_GE(es.resends, 4u);  // every turn after the first two finds the other sequence dropped
  EXPECT_GT(es.replayed_rows, 0u);
  EXPECT_EQ(es.failovers, 0u);
}

// kill -9 of a span peer mid-generation: the span moves to the next peer named for it (its
// inputs replayed), and when that one dies too, to this process; the tokens do not change.
TEST(Span, KilledPeersAreReplacedAndTheirInputsReplayed) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  const int64_t V = m.hparams().n_vocab;
  auto a = spawn_span(path, "2-4");
  auto a2 = spawn_span(path, "2-4");
  ASSERT_TRUE(a.is_ok() && a2.is_ok());
  // The log keeps its rows in its file: the replays read them back from there.
  auto spans = connect_spans(m, {target(2, 4, {a->get(), a2->get()})}, true, SpanChainMode::kAuto, /*spill_log=*/true);
  ASSERT_NE(spans, nullptr);
  Context ctx = make_ctx(m, spans);
  Context local = make_ctx(m, nullptr);
  const std::vector<int32_t> prompt = {8, 16, 32, 64, 128, 3};
  std::vector<float> x(prompt.size() * V), y(prompt.size() * V);
  ASSERT_TRUE(ctx.decode(0, prompt.data(), 6, x.data()).is_ok());
  ASSERT_TRUE(local.decode(0, prompt.data(), 6, y.data()).is_ok());
  int32_t t = 1;
  for (int i = 0; i < 12; ++i) {
    if (i == 3) (*a)->kill_now();   // the first peer dies
    if (i == 8) (*a2)->kill_now();  // and its replacement
    ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  }
  const SpanStats s = spans->stats();
  EXPECT_EQ(s.failovers, 2u);
  EXPECT_EQ(s.local_steps, 4u);  // tokens 8..11 ran here
  // The replacement got the 6 + 3 cells before it; this process the 6 + 8.
  EXPECT_EQ(s.replayed_rows, 9u + 14u);
  EXPECT_EQ(spans->where(0), "2-4 here");
  const RowStoreStats ls = spans->log_stats();
  EXPECT_TRUE(ls.spill_error.empty()) << ls.spill_error;
  EXPECT_EQ(ls.memory_bytes, 0u);  // 18 cells: 9 full chunks of 2, all in the file
  EXPECT_EQ(ls.file_bytes, 18 * m.hparams().n_embd * sizeof(float));
  EXPECT_EQ(ls.read_back_chunks, 4u + 7u);  // the full chunks of the two replays came from the file

  // Without the fallback, losing the last peer fails the step clearly and changes nothing.
  auto b = spawn_span(path, "2-4");
  ASSERT_TRUE(b.is_ok());
  auto strict = connect_spans(m, {target(2, 4, {b->get()})}, /*fallback=*/false);
  ASSERT_NE(strict, nullptr);
  Context sctx = make_ctx(m, strict);
  ASSERT_TRUE(sctx.decode(0, prompt.data(), 6, x.data()).is_ok());
  (*b)->kill_now();
  Status st = sctx.decode(0, &t, 1, x.data());
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  EXPECT_NE(st.message().find("span 2-4"), std::string::npos) << st.to_string();
  EXPECT_EQ(sctx.state().seq_len(0), 6);
}

// A replacement need not hold the blocks: a standby named for the span that runs other blocks
// loads them when the primary dies, and when it dies too an idle span peer this backbone knows
// takes the span over (it loads them as well) instead of this process. The bits stay all-local.
TEST(Span, ReplacementsLoadTheBlocksAndIdlePeersTakeFailedSpansOver) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  auto a = spawn_span(path, "2-4");
  auto standby = spawn_span(path, "0-0");  // named for 2-4, runs block 0 only
  auto idle = spawn_span(path, "5-5");
  ASSERT_TRUE(a.is_ok() && standby.is_ok() && idle.is_ok());
  auto spans = connect_spans(m, {target(2, 4, {a->get(), standby->get()})});
  ASSERT_NE(spans, nullptr);
  ASSERT_TRUE(spans->add_idle((*idle)->address().to_string()).is_ok());
  Context ctx = make_ctx(m, spans);
  Context local = make_ctx(m, nullptr);
  int32_t t = 2;
  ASSERT_NO_FATAL_FAILURE(start_two_sequences(ctx, local, &t));
  for (int i = 2; i < 12; ++i) {
    if (i == 4) (*a)->kill_now();
    if (i == 8) (*standby)->kill_now();
    ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
    if (i == 4) {
      EXPECT_NE(spans->where(0).find((*standby)->address().to_string()), std::string::npos) << spans->where(0);
      EXPECT_EQ(spans->stats().failover_loads, 1u);
      EXPECT_EQ(spans->stats().idle_takeovers, 0u);
    }
  }
  const SpanStats s = spans->stats();
  EXPECT_EQ(s.failovers, 2u);
  EXPECT_EQ(s.failover_loads, 2u);
  EXPECT_EQ(s.idle_takeovers, 1u);
  EXPECT_EQ(s.loads, 2u);
  EXPECT_EQ(s.local_steps, 0u);  // never here
  EXPECT_NE(spans->where(0).find((*idle)->address().to_string()), std::string::npos) << spans->where(0);
  EXPECT_TRUE(spans->idle_view().empty());  // the idle peer runs a span now
}

// A replacement that is not ready at once (SpanOptions::failover_load_wait; 0 here) keeps loading
// while the span runs here, and the span moves to it once it holds the blocks — exact throughout.
// Without a fallback a replacement is waited for: the step that found the failure is late, not lost.
TEST(Span, ASpanRunsHereWhileItsReplacementLoadsThenMovesThere) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  for (const bool fallback : {true, false}) {
    SCOPED_TRACE(fallback ? "with the local fallback" : "without it");
    auto a = spawn_span(path, "1-3");
    auto idle = spawn_span(path, "5-5");
    ASSERT_TRUE(a.is_ok() && idle.is_ok());
    SpanOptions o;
    o.local_threads = 1;
    o.local_fallback = fallback;
    o.timeout = std::chrono::milliseconds(20000);
    o.failover_load_wait = std::chrono::milliseconds(0);
    auto c = SpanClient::connect(m, {target(1, 3, {a->get()})}, o);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    std::shared_ptr<SpanClient> spans = *c;
    ASSERT_TRUE(spans->add_idle((*idle)->address().to_string()).is_ok());
    Context ctx = make_ctx(m, spans);
    Context local = make_ctx(m, nullptr);
    int32_t t = 2;
    ASSERT_NO_FATAL_FAILURE(start_two_sequences(ctx, local, &t));
    (*a)->kill_now();
    const std::string there = (*idle)->address().to_string();
    int i = 2;
    // Steps until the span is on the idle peer (a bounded number: loading a span from the model
    // file takes milliseconds), then two more there.
    for (; i < 200 && spans->where(0).find(there) == std::string::npos; ++i)
      ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
    ASSERT_NE(spans->where(0).find(there), std::string::npos) << spans->where(0);
    for (int j = 0; j < 2; ++j, ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
    const SpanStats s = spans->stats();
    EXPECT_EQ(s.failovers, 1u);
    EXPECT_EQ(s.failover_loads, 1u);
    EXPECT_EQ(s.idle_takeovers, 1u);
    if (fallback) {
      EXPECT_GE(s.local_steps, 1u);  // the step that found the failure ran here
    } else {
      EXPECT_EQ(s.local_steps, 0u);
    }
  }
}

// The backbone's between-call work (dialling a worker asked for, re-dials, hot plans, expert
// requests) runs at the first MoE layer it computes in a pass — here block 2, span peers running
// blocks 0-1 — not only at the model's first.
TEST(Span, AWorkerAskedForIsTakenInWhileASpanPeerRunsTheFirstBlocks) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  auto a = spawn_span(path, "0-1");
  auto w = WorkerProcess::spawn(path, "*:*");
  auto w2 = WorkerProcess::spawn(path, "2-5:0-3");
  ASSERT_TRUE(a.is_ok() && w.is_ok() && w2.is_ok());
  auto exec = RemoteExecutor::connect(m, {(*w)->address()}, RemoteOptions{});
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  std::shared_ptr<RemoteExecutor> remote(std::move(*exec));
  auto spans = connect_spans(m, {target(0, 1, {a->get()})});
  ASSERT_NE(spans, nullptr);
  ContextParams cp;
  cp.n_threads = 1;
  cp.n_ctx = 256;
  cp.spans = spans;
  cp.executor = remote;
  Context ctx(m, cp);
  Context local = make_ctx(m, nullptr);
  ASSERT_TRUE(remote->dial_worker((*w2)->address()).is_ok());
  int32_t t = 2;
  ASSERT_NO_FATAL_FAILURE(start_two_sequences(ctx, local, &t));
  for (int i = 2; i < 5; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  // The dial runs in the background: on a loaded host it may take more steps to be taken in.
  for (int i = 5; i < 100 && !remote->late_workers().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  }
  EXPECT_TRUE(remote->late_workers().empty());
  EXPECT_EQ(remote->worker_status().size(), 2u);
  EXPECT_EQ(spans->stats().local_steps, 0u);
}

// A failed primary that comes back (restarted on its address) gets the span back at the next
// retry: its inputs are replayed from the log and the bits stay those of all-local.
TEST(Span, AFailedPrimaryGetsTheSpanBackWhenItReturns) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  const int64_t V = m.hparams().n_vocab;
  auto a = spawn_span(path, "1-3");
  ASSERT_TRUE(a.is_ok());
  const std::string addr = (*a)->address().to_string();
  SpanOptions o;
  o.local_threads = 1;
  o.timeout = std::chrono::milliseconds(20000);
  o.retry_preferred = std::chrono::milliseconds(0);  // before every step
  auto c = SpanClient::connect(m, {target(1, 3, {a->get()})}, o);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  std::shared_ptr<SpanClient> spans = *c;
  Context ctx = make_ctx(m, spans);
  Context local = make_ctx(m, nullptr);
  const std::vector<int32_t> prompt = {4, 9, 27, 81, 5};
  std::vector<float> x(prompt.size() * V), y(prompt.size() * V);
  ASSERT_TRUE(ctx.decode(0, prompt.data(), 5, x.data()).is_ok());
  ASSERT_TRUE(local.decode(0, prompt.data(), 5, y.data()).is_ok());
  std::unique_ptr<WorkerProcess> back;
  int32_t t = 2;
  for (int i = 0; i < 10; ++i) {
    if (i == 2) (*a)->kill_now();  // tokens 2..5 run here (the primary refuses connections)
    if (i == 6) {                  // the primary is back on its address
      auto b = spawn_span(path, "1-3", {"--listen", addr});
      ASSERT_TRUE(b.is_ok()) << b.status().to_string();
      back = std::move(*b);
    }
    ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  }
  const SpanStats s = spans->stats();
  EXPECT_EQ(s.failovers, 1u);
  EXPECT_EQ(s.restored, 1u);
  EXPECT_EQ(s.local_steps, 4u);
  // Here: the 5 + 2 cells before the failure; back on the primary: all 5 + 6 of them.
  EXPECT_EQ(s.replayed_rows, 7u + 11u);
  EXPECT_NE(spans->where(0).find(addr), std::string::npos) << spans->where(0);
}

// A planned move (re-planning while running): the new peer is sent every sequence's logged inputs
// before it takes a step, so the steps after the move replay nothing and the bits stay those of
// all-local; the old peer is let go (killing it changes nothing). A move to a peer that runs other
// blocks, to no peer, or of a span that does not exist fails and changes nothing; "here" takes the
// span onto this process and keeps it there (no retry of the preferred peer) until moved again.
TEST(Span, APlannedMoveReplaysTheLogFirstAndKeepsTheBits) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  const int64_t V = m.hparams().n_vocab;
  auto a = spawn_span(path, "1-3");
  auto b = spawn_span(path, "1-3");
  auto other = spawn_span_slice(path, "0-2");  // runs 0-2 only
  ASSERT_TRUE(a.is_ok() && b.is_ok() && other.is_ok());
  SpanOptions o;
  o.local_threads = 1;
  o.timeout = std::chrono::milliseconds(20000);
  o.retry_preferred = std::chrono::milliseconds(0);  // before every step: "here" must stay anyway
  auto c = SpanClient::connect(m, {target(1, 3, {a->get()})}, o);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  std::shared_ptr<SpanClient> spans = *c;
  Context ctx = make_ctx(m, spans);
  Context local = make_ctx(m, nullptr);
  // Two sequences: 5 + 2 cells in sequence 0, 3 in sequence 1.
  int32_t t = 2;
  ASSERT_NO_FATAL_FAILURE(start_two_sequences(ctx, local, &t));

  const std::string was = spans->where(0);
  Status st = spans->move({1, 3}, (*other)->address().to_string());
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  EXPECT_NE(st.message().find("runs blocks 0-2 and cannot load 1-3"), std::string::npos) << st.to_string();
  st = spans->move({2, 3}, (*b)->address().to_string());
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.to_string();
  EXPECT_NE(st.message().find("the spans are 1-3"), std::string::npos) << st.to_string();
  EXPECT_FALSE(spans->move({1, 3}, "127.0.0.1:1").is_ok());
  EXPECT_FALSE(spans->move({1, 3}, "not an address").is_ok());
  EXPECT_EQ(spans->where(0), was);
  EXPECT_EQ(spans->stats().moves, 0u);
  ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, 2));

  ASSERT_TRUE(spans->move({1, 3}, (*b)->address().to_string()).is_ok());
  SpanStats s = spans->stats();
  EXPECT_EQ(s.moves, 1u);
  EXPECT_EQ(s.move_rows, 5u + 3u + 3u);  // every logged input of both sequences
  EXPECT_NE(spans->where(0).find((*b)->address().to_string()), std::string::npos) << spans->where(0);
  (*a)->kill_now();  // let go: its death is not noticed
  for (int i = 3; i < 7; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  s = spans->stats();
  EXPECT_EQ(s.resends, 0u) << "the new peer held every input before its first step";
  EXPECT_EQ(s.replayed_rows, 0u);
  EXPECT_EQ(s.failovers, 0u);

  ASSERT_TRUE(spans->move({1, 3}, "here").is_ok());
  EXPECT_EQ(spans->where(0), "1-3 here");
  for (int i = 7; i < 10; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  EXPECT_EQ(spans->where(0), "1-3 here") << "a span moved here stays here";
  s = spans->stats();
  EXPECT_EQ(s.local_steps, 3u);
  EXPECT_EQ(s.restored, 0u);
  EXPECT_EQ(s.move_rows, 11u + 12u + 3u);  // sequence 0 now holds 5 + 7 cells

  ASSERT_TRUE(spans->move({1, 3}, (*b)->address().to_string()).is_ok());
  for (int i = 10; i < 12; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  s = spans->stats();
  EXPECT_EQ(s.moves, 3u);
  EXPECT_EQ(s.resends, 0u);
  EXPECT_EQ(s.local_steps, 3u);
  // Sequence 1 goes on where it was, on the peer it was never sent to directly since the moves.
  std::vector<float> p(V), q(V);
  const int32_t u = 6;
  ASSERT_TRUE(ctx.decode(1, &u, 1, p.data()).is_ok());
  ASSERT_TRUE(local.decode(1, &u, 1, q.data()).is_ok());
  EXPECT_TRUE(same_bits(p, q));

  // The replay runs beside the steps (from a snapshot of the log): whatever the interleaving, the
  // steps during and after the move keep all-local's bits, and the new peer takes the span.
  auto c2 = spawn_span(path, "1-3");
  ASSERT_TRUE(c2.is_ok());
  Status moved = Status::ok();
  std::thread mover([&] { moved = spans->move({1, 3}, (*c2)->address().to_string()); });
  for (int i = 12; i < 24; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  mover.join();
  ASSERT_TRUE(moved.is_ok()) << moved.to_string();
  for (int i = 24; i < 27; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  EXPECT_NE(spans->where(0).find((*c2)->address().to_string()), std::string::npos) << spans->where(0);
  EXPECT_EQ(spans->stats().failovers, 0u);
}

// New span edges while running (SpanClient::resplit): refused layouts change nothing; a span
// starting inside an old one is warmed with the rows the new span before it computes, so after
// the switch no step replays anything, the old peers' deaths go unnoticed, and every token keeps
// the all-local bits — also while the main thread decodes during the resplit.
TEST(Span, AResplitMovesSpanEdgesLiveAndKeepsTheBits) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  const int64_t V = m.hparams().n_vocab;
  auto a = spawn_span_slice(path, "1-2");  // runs 1-2 only
  auto b = spawn_span(path, "3-5");
  auto c = spawn_span(path, "1-3");
  auto d = spawn_span(path, "4-5");
  ASSERT_TRUE(a.is_ok() && b.is_ok() && c.is_ok() && d.is_ok());
  auto spans = connect_spans(m, {target(1, 2, {a->get()}), target(3, 5, {b->get()})}, true, SpanChainMode::kOff);
  ASSERT_NE(spans, nullptr);
  Context ctx = make_ctx(m, spans);
  Context local = make_ctx(m, nullptr);
  int32_t t = 2;
  ASSERT_NO_FATAL_FAILURE(start_two_sequences(ctx, local, &t));  // 7 cells in sequence 0, 3 in 1

  auto at = [](const std::string& span, const WorkerProcess& p) { return span + "@" + p.address().to_string(); };
  auto placements = [](std::vector<std::string> v) {
    std::vector<SpanPlacement> out;
    for (const std::string& s : v) {
      auto p = parse_span_placement(s);
      EXPECT_TRUE(p.is_ok()) << s;
      if (p.is_ok()) out.push_back(*p);
    }
    return out;
  };
  const std::vector<std::string> was = spans->where_all();
  Status st = spans->resplit(placements({at("0-2", **c), at("3-5", **b)}));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("do not cover"), std::string::npos) << st.to_string();
  st = spans->resplit(placements({at("1-3", **c)}));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  st = spans->resplit(placements({at("1-3", **c), at("3-5", **b)}));
  EXPECT_NE(st.message().find("overlap"), std::string::npos) << st.to_string();
  // A peer that runs other blocks and cannot load these says so; an unreachable one fails its dial.
  st = spans->resplit(placements({at("1-3", **a), at("4-5", **d)}));
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("runs blocks 1-2 and cannot load 1-3"), std::string::npos) << st.to_string();
  EXPECT_FALSE(spans->resplit(placements({"1-3@127.0.0.1:1", at("4-5", **d)})).is_ok());
  EXPECT_FALSE(parse_span_placement("1-3@not an address").is_ok());
  EXPECT_TRUE(spans->resplit(placements({at("1-2", **a), at("3-5", **b)})).is_ok());  // the same: no change
  EXPECT_EQ(spans->where_all(), was);
  EXPECT_EQ(spans->stats().resplits, 0u);
  ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, 2));

  // 1-2, 3-5 -> 1-3 on c (from the log of 1-2), 4-5 on d (fed what c computes for block 4).
  ASSERT_TRUE(spans->resplit(placements({at("1-3", **c), at("4-5", **d)})).is_ok());
  SpanStats s = spans->stats();
  EXPECT_EQ(s.resplits, 1u);
  EXPECT_EQ(s.resplit_rows, 2u * (8u + 3u));  // both sequences' cells through both new spans
  ASSERT_EQ(spans->spans().size(), 2u);
  EXPECT_EQ(spans->spans()[0], (LayerSpan{1, 3}));
  EXPECT_EQ(spans->spans()[1], (LayerSpan{4, 5}));
  EXPECT_NE(spans->where(0).find((*c)->address().to_string()), std::string::npos) << spans->where(0);
  (*a)->kill_now();
  (*b)->kill_now();
  const uint64_t trips = s.trips;
  for (int i = 3; i < 7; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  s = spans->stats();
  EXPECT_EQ(s.trips - trips, 4u * 2u) << "one trip per span and pass";
  EXPECT_EQ(s.resends, 0u) << "the new peers held every input before their first step";
  EXPECT_EQ(s.replayed_rows, 0u);
  EXPECT_EQ(s.failovers, 0u);
  std::vector<float> p(V), q(V);
  const int32_t u = 6;
  ASSERT_TRUE(ctx.decode(1, &u, 1, p.data()).is_ok());  // sequence 1 goes on where it was
  ASSERT_TRUE(local.decode(1, &u, 1, q.data()).is_ok());
  EXPECT_TRUE(same_bits(p, q));

  // Three spans, one kept as it is (c: no rows), one here, one on a new peer fed from it.
  auto e = spawn_span(path, "5");
  ASSERT_TRUE(e.is_ok());
  const uint64_t rows_before = spans->stats().resplit_rows;
  ASSERT_TRUE(spans->resplit(placements({at("1-3", **c), "4-4@here", at("5-5", **e)})).is_ok());
  EXPECT_EQ(spans->stats().resplit_rows - rows_before, 2u * (12u + 4u));  // through 4 here and 5 on e
  EXPECT_EQ(spans->where(1), "4-4 here");
  (*d)->kill_now();
  for (int i = 7; i < 10; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  EXPECT_EQ(spans->stats().resends, 0u);
  EXPECT_EQ(spans->stats().failovers, 0u);

  // Back to two spans on fresh peers while the main thread decodes: whatever the interleaving, the
  // steps keep all-local's bits (what they add during the warm-up is fed at the switch).
  auto f = spawn_span(path, "1-2");
  auto g = spawn_span(path, "3-5");
  ASSERT_TRUE(f.is_ok() && g.is_ok());
  Status moved = Status::ok();
  std::thread mover([&] { moved = spans->resplit(placements({at("1-2", **f), at("3-5", **g)})); });
  for (int i = 10; i < 22; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  mover.join();
  ASSERT_TRUE(moved.is_ok()) << moved.to_string();
  for (int i = 22; i < 25; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  const std::vector<std::string> now = spans->where_all();
  ASSERT_EQ(now.size(), 2u);
  EXPECT_NE(now[0].find((*f)->address().to_string()), std::string::npos) << now[0];
  EXPECT_NE(now[1].find((*g)->address().to_string()), std::string::npos) << now[1];
  EXPECT_EQ(spans->stats().resplits, 3u);
  EXPECT_EQ(spans->stats().failovers, 0u);
}

// A backbone started from its slice holds no routed experts: a span here (named here, moved here,
// or a fallback) sends its blocks' experts to the backbone's workers (SpanOptions::here_executor,
// borrowed), so it runs where the backbone's own blocks do, with all-local bits.
TEST(Span, ASpanHereOnABackboneSliceSendsItsExpertsToTheWorkers) {
  const std::string path = six_block_model();
  auto full = Model::load(path);
  ASSERT_TRUE(full.is_ok());
  const std::string bb_path = temp_dir() + "/qwen3moe-l6-backbone.gguf";
  auto f = gguf::File::open(path);
  ASSERT_TRUE(f.is_ok() && swarm::write_backbone_slice(**f, bb_path).is_ok());
  auto bb = Model::load(bb_path);
  ASSERT_TRUE(bb.is_ok()) << bb.status().to_string();
  auto w = WorkerProcess::spawn(path, "*:*");
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  auto exec = RemoteExecutor::connect(**bb, {(*w)->address()}, RemoteOptions{});
  ASSERT_TRUE(exec.is_ok()) << exec.status().to_string();
  std::shared_ptr<RemoteExecutor> remote(std::move(*exec));
  SpanOptions o;
  o.local_threads = 1;
  o.chain = SpanChainMode::kOff;
  o.here_executor = remote;
  auto spans = SpanClient::connect(**bb, {*parse_span_target("1-3@here")}, o);
  ASSERT_TRUE(spans.is_ok()) << spans.status().to_string();
  ContextParams cp;
  cp.n_threads = 1;
  cp.n_ctx = 256;
  cp.executor = remote;
  cp.spans = *spans;
  Context ctx(**bb, cp);
  Context local = make_ctx(**full, nullptr);
  int32_t t = 2;
  ASSERT_NO_FATAL_FAILURE(start_two_sequences(ctx, local, &t));
  for (int i = 2; i < 5; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  // 7 passes (two prompts, five tokens), each dispatching all 6 MoE blocks to the worker: the
  // span's three too.
  const RemoteTraffic tr = remote->traffic();
  EXPECT_EQ(tr.local_pairs, 0u);
  EXPECT_EQ(tr.layer_calls, 6u * 7u) << "the span's blocks dispatch to the worker too";
  EXPECT_GT((*spans)->stats().local_steps, 0u);
  // New edges while the main thread decodes: the new spans here are warmed through the same
  // executor, each warm-up step between two passes (never two dispatches on it at once), and
  // then moved back into one: all-local bits throughout.
  auto placements = [](std::vector<std::string> v) {
    std::vector<SpanPlacement> out;
    for (const std::string& x : v) out.push_back(*parse_span_placement(x));
    return out;
  };
  for (const auto& layout : {std::vector<std::string>{"1-1@here", "2-3@here"}, std::vector<std::string>{"1-3@here"}}) {
    Status moved = Status::ok();
    std::thread mover([&] { moved = (*spans)->resplit(placements(layout)); });
    for (int i = 0; i < 6; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
    mover.join();
    ASSERT_TRUE(moved.is_ok()) << moved.to_string();
    ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, 6));
    EXPECT_EQ((*spans)->where_all().size(), layout.size());
  }
  EXPECT_EQ(remote->traffic().local_pairs, 0u);
  // Without the backbone's executor the span here has no experts to run, and says so.
  SpanOptions bare = o;
  bare.here_executor = nullptr;
  auto lone = SpanClient::connect(**bb, {*parse_span_target("1-3@here")}, bare);
  ASSERT_TRUE(lone.is_ok());
  cp.spans = *lone;
  Context ctx2(**bb, cp);
  std::vector<float> lg((*bb)->hparams().n_vocab);
  const int32_t one = 4;
  Status st = ctx2.decode(0, &one, 1, lg.data());
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("no experts"), std::string::npos) << st.to_string();
}

// The blocks a backbone runs itself, named as spans here ("0-2@here"), keep their inputs like any
// span, so a resplit hands them to a peer live and takes a peer's blocks back: every block of the
// model can move without a restart (docs/span.md, "Blocks here").
TEST(Span, BlocksNamedHereMoveToAPeerAndBackLive) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  // Parsing: "here" is a target without peers; a span both here and on a peer is refused.
  auto h = parse_span_target("0-2@here");
  ASSERT_TRUE(h.is_ok()) << h.status().to_string();
  EXPECT_TRUE(h->here);
  EXPECT_TRUE(h->peers.empty());
  auto mixed = merge_span_targets({*h, *parse_span_target("0-2@127.0.0.1:9")});
  ASSERT_FALSE(mixed.is_ok());
  EXPECT_NE(mixed.status().message().find("both here and on a peer"), std::string::npos) << mixed.status().to_string();

  auto b = spawn_span(path, "3-5");
  auto c = spawn_span(path, "0-3");
  ASSERT_TRUE(b.is_ok() && c.is_ok());
  // No fallback: a span named here runs here all the same.
  auto spans = connect_spans(m, {*h, target(3, 5, {b->get()})}, /*fallback=*/false, SpanChainMode::kOff);
  ASSERT_NE(spans, nullptr);
  EXPECT_EQ(spans->where(0), "0-2 here");
  EXPECT_EQ(spans->stats().failovers, 0u);
  Context ctx = make_ctx(m, spans);
  Context local = make_ctx(m, nullptr);
  int32_t t = 2;
  ASSERT_NO_FATAL_FAILURE(start_two_sequences(ctx, local, &t));
  ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, 2));
  EXPECT_GT(spans->stats().local_steps, 0u);

  auto at = [](const std::string& span, const WorkerProcess& p) { return span + "@" + p.address().to_string(); };
  auto placements = [](std::vector<std::string> v) {
    std::vector<SpanPlacement> out;
    for (const std::string& x : v) out.push_back(*parse_span_placement(x));
    return out;
  };
  // The backbone's blocks 0-2 and the peer's block 3 to c (fed the here span's log); 4-5 back
  // here (fed what c computes for block 4). Then b is gone and nothing replays.
  ASSERT_TRUE(spans->resplit(placements({at("0-3", **c), "4-5@here"})).is_ok());
  ASSERT_EQ(spans->where_all().size(), 2u);
  EXPECT_NE(spans->where(0).find((*c)->address().to_string()), std::string::npos) << spans->where(0);
  EXPECT_EQ(spans->where(1), "4-5 here");
  (*b)->kill_now();
  for (int i = 3; i < 7; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  EXPECT_EQ(spans->stats().resends, 0u);
  EXPECT_EQ(spans->stats().failovers, 0u);
  // And everything back here, in one span: the peer's blocks too.
  ASSERT_TRUE(spans->resplit(placements({"0-5@here"})).is_ok());
  EXPECT_EQ(spans->where_all(), std::vector<std::string>{"0-5 here"});
  (*c)->kill_now();
  for (int i = 7; i < 10; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  EXPECT_EQ(spans->stats().resplits, 2u);
  EXPECT_EQ(spans->stats().failovers, 0u);
}

// Span peers that load blocks on the backbone's word (SPAN_HOLD, docs/span.md#loading-blocks): a
// peer started on the full model for block 0 is given 0-2 at connect, 0-3 by a resplit, 4-5 by a
// move; each time it loads the blocks before the switch, and the peer that ran them before lets
// go of them after it. The bits stay all-local's, nothing is resent or failed over. A peer started
// from a slice without --fetch cannot load: the resplit fails naming why, and nothing changes.
TEST(Span, PeersLoadTheBlocksAResplitOrMoveGivesThemAndLetGoOfTheOld) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  auto a = spawn_span(path, "0-0");
  auto b = spawn_span(path, "3-5");
  const std::string slice = temp_dir() + "/six-span-4-5.gguf";
  RunResult cut = run_moesh("slice -m " + quoted(path) + " --layers 4-5 -o " + quoted(slice));
  ASSERT_EQ(cut.exit_code, 0) << cut.err;
  auto fixed = spawn_span(slice, "4-5");
  ASSERT_TRUE(a.is_ok() && b.is_ok() && fixed.is_ok());
  auto spans =
      connect_spans(m, {target(0, 2, {a->get()}), target(3, 5, {b->get()})}, /*fallback=*/false, SpanChainMode::kOff);
  ASSERT_NE(spans, nullptr);
  EXPECT_EQ(spans->stats().loads, 1u);  // a loaded 0-2 at connect
  EXPECT_NE(spans->where(0).find((*a)->address().to_string()), std::string::npos) << spans->where(0);
  // A span peer made known runs nothing of ours: idle, with what it reported (its RTT, memory).
  ASSERT_TRUE(spans->add_idle((*fixed)->address().to_string()).is_ok());
  Status busy = spans->add_idle((*a)->address().to_string());
  EXPECT_EQ(busy.code(), StatusCode::kInvalidArgument) << busy.to_string();
  EXPECT_NE(busy.message().find("runs span 0-2"), std::string::npos) << busy.to_string();
  auto idle_labels = [&] {
    std::vector<std::string> out;
    for (const SpanPeerView& v : spans->idle_view()) out.push_back(v.label.substr(v.label.find('(')));
    std::sort(out.begin(), out.end());
    return out;
  };
  EXPECT_EQ(idle_labels(), std::vector<std::string>{"(span-4-5)"});
  EXPECT_GT(spans->idle_view()[0].mem_total_bytes, 0u);
  Context ctx = make_ctx(m, spans);
  Context local = make_ctx(m, nullptr);
  int32_t t = 2;
  ASSERT_NO_FATAL_FAILURE(start_two_sequences(ctx, local, &t));
  ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, 2));

  auto at = [](const std::string& span, const WorkerProcess& p) { return span + "@" + p.address().to_string(); };
  auto placements = [](std::vector<std::string> v) {
    std::vector<SpanPlacement> out;
    for (const std::string& x : v) out.push_back(*parse_span_placement(x));
    return out;
  };
  // a: 0-2 -> 0-3 (loaded, fed 0-2's log); b: 3-5 -> 4-5 (loaded, fed what a computes for block 3).
  Status st = spans->resplit(placements({at("0-3", **a), at("4-5", **b)}));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(spans->stats().loads, 3u);
  EXPECT_EQ(spans->stats().drops, 2u);                               // a let go of 0-2, b of 3-5
  EXPECT_EQ(idle_labels(), std::vector<std::string>{"(span-4-5)"});  // a and b run spans still
  for (int i = 3; i < 6; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  // 4-5 to a as well: loaded there, let go of on b.
  st = spans->move({4, 5}, (*a)->address().to_string());
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(spans->stats().loads, 4u);
  EXPECT_EQ(spans->stats().drops, 3u);
  EXPECT_EQ(idle_labels(), (std::vector<std::string>{"(span-3-5)", "(span-4-5)"}));  // b runs none now
  (*b)->kill_now();                                                                  // holds nothing of ours any more
  for (int i = 6; i < 9; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));

  // A peer on a slice of 4-5 without --fetch cannot load 0-3: the resplit says so, and nothing
  // changes (it could take 4-5 alone).
  st = spans->resplit(placements({at("0-3", **fixed), at("4-5", **a)}));
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("cannot load 0-3"), std::string::npos) << st.to_string();
  EXPECT_NE(spans->where(0).find((*a)->address().to_string()), std::string::npos) << spans->where(0);
  for (int i = 9; i < 11; ++i) ASSERT_NO_FATAL_FAILURE(step_both(ctx, local, &t, i));
  const SpanStats s = spans->stats();
  EXPECT_EQ(s.resplits, 1u);
  EXPECT_EQ(s.moves, 1u);
  EXPECT_EQ(s.resends, 0u);
  EXPECT_EQ(s.failovers, 0u);
  EXPECT_EQ(s.local_steps, 0u);
}

// The CLI: `moesh run --span` prints the all-local tokens and reports one trip per span and
// pass; bad --span values are refused with exit 2 or a clear error.
TEST(Span, RunWithSpansPrintsTheLocalTokens) {
  const std::string path = six_block_model();
  auto a = spawn_span(path, "1-2");
  auto b = spawn_span(path, "3-5");
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  const std::string common = "run -m " + quoted(path) + " --tokens 5,6,7,8 -n 8 -t 1 --json";
  RunResult local = run_moesh(common);
  RunResult spans =
      run_moesh(common + " --span 1-2@" + (*a)->address().to_string() + " --span 3-5@" + (*b)->address().to_string());
  ASSERT_EQ(local.exit_code, 0) << local.err;
  ASSERT_EQ(spans.exit_code, 0) << spans.err;
  auto lj = nlohmann::json::parse(local.out, nullptr, false);
  auto sj = nlohmann::json::parse(spans.out, nullptr, false);
  ASSERT_FALSE(lj.is_discarded()) << local.out;
  ASSERT_FALSE(sj.is_discarded()) << spans.out;
  EXPECT_EQ(lj["tokens"], sj["tokens"]);
  EXPECT_EQ(sj["spans"]["trips"], 16);  // 8 passes (the prompt, then 7 tokens) x 2 spans
  EXPECT_EQ(sj["spans"]["failovers"], 0);
  EXPECT_GT(sj["spans"]["log_memory_bytes"], 0);  // 11 cells of 2 spans: under the default budget
  EXPECT_EQ(sj["spans"]["log_file_bytes"], 0);

  RunResult overlap =
      run_moesh(common + " --span 1-3@" + (*a)->address().to_string() + " --span 3-5@" + (*b)->address().to_string());
  EXPECT_EQ(overlap.exit_code, 1) << overlap.err;
  EXPECT_NE(overlap.err.find("overlap"), std::string::npos) << overlap.err;
  // A peer started on the full model for 1-2 and named for 1-3 loads them at connect.
  RunResult loads = run_moesh(common + " --span 1-3@" + (*a)->address().to_string() + " --no-span-fallback");
  ASSERT_EQ(loads.exit_code, 0) << loads.err;
  auto nj = nlohmann::json::parse(loads.out, nullptr, false);
  ASSERT_FALSE(nj.is_discarded()) << loads.out;
  EXPECT_EQ(lj["tokens"], nj["tokens"]);
  EXPECT_EQ(nj["spans"]["loads"], 1);
  EXPECT_EQ(nj["spans"]["local_steps"], 0);
  // One on a slice of 1-2 cannot: the run fails saying so.
  auto fixed = spawn_span_slice(path, "1-2");
  ASSERT_TRUE(fixed.is_ok()) << fixed.status().to_string();
  RunResult wrong = run_moesh(common + " --span 1-3@" + (*fixed)->address().to_string() + " --no-span-fallback");
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.err.find("runs blocks 1-2 and cannot load 1-3"), std::string::npos) << wrong.err;
  RunResult garbage = run_moesh(common + " --span 1-x@127.0.0.1:1");
  EXPECT_EQ(garbage.exit_code, 1) << garbage.err;
  EXPECT_NE(garbage.err.find("FIRST-LAST"), std::string::npos) << garbage.err;
  RunResult q8 = run_moesh(common + " --span 1-2@" + (*a)->address().to_string() + " --span-wire q8");
  EXPECT_EQ(q8.exit_code, 2) << q8.err;
}

// A span of dense blocks only (deepseek2's leading dense block): its peer serves no experts and
// runs the block; from the full model or from its own slice, the bits are all-local's. The
// planner may now give such a span too.
TEST(Span, ASpanOfDenseBlocksOnlyIsExact) {
  MakeModelSpec spec = MakeModelSpec::defaults_for(MakeArch::kDeepseek2);
  spec.type = MakeFileType::kQ8_0;
  spec.seed = 77;
  spec.n_layer = 4;
  spec.n_leading_dense = 2;
  spec.n_ctx = 256;
  const std::string path = made_model("deepseek2-l4-d2", spec);
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const Model& m = **model;
  ASSERT_FALSE(m.layers[0].is_moe);
  ASSERT_FALSE(m.layers[1].is_moe);
  const std::string slice = temp_dir() + "/ds2-span-0-1.gguf";
  RunResult cut = run_moesh("slice -m " + quoted(path) + " --layers 0-1 -o " + quoted(slice));
  ASSERT_EQ(cut.exit_code, 0) << cut.err;
  auto dense = spawn_span(path, "0-1");
  auto dense_slice = spawn_span(slice, "0-1");
  auto moe = spawn_span(path, "2-3");
  ASSERT_TRUE(dense.is_ok()) << dense.status().to_string();
  ASSERT_TRUE(dense_slice.is_ok()) << dense_slice.status().to_string();
  ASSERT_TRUE(moe.is_ok()) << moe.status().to_string();
  const std::vector<int32_t> prompt = test_tokens(path, m.hparams().n_vocab, 7);
  Context local = make_ctx(m, nullptr);
  const std::vector<float> want = greedy_rows(local, prompt, 5);
  for (const WorkerProcess* d : {dense->get(), dense_slice->get()}) {
    auto spans = connect_spans(m, {target(0, 1, {d}), target(2, 3, {moe->get()})}, /*fallback=*/false);
    ASSERT_NE(spans, nullptr);
    Context ctx = make_ctx(m, spans);
    EXPECT_TRUE(same_bits(greedy_rows(ctx, prompt, 5), want)) << spans->where(0);
    EXPECT_EQ(spans->stats().trips, 12u);  // 6 passes x 2 spans
    EXPECT_EQ(spans->stats().local_steps, 0u);
  }
}

// `moesh slice --layers` cuts the file a span peer needs: its blocks (and the small globals), no
// embedding or head. A peer on it gives the same bits; the slice refuses to run anything else.
TEST(Span, ASpanSliceIsAllASpanPeerNeeds) {
  const std::string path = six_block_model();
  const std::string slice = temp_dir() + "/span-2-4.gguf";
  RunResult cut = run_moesh("slice -m " + quoted(path) + " --layers 2-4 -o " + quoted(slice));
  ASSERT_EQ(cut.exit_code, 0) << cut.err;
  EXPECT_LT(std::filesystem::file_size(slice), std::filesystem::file_size(path) * 3 / 4);
  auto sliced = Model::load(slice);
  ASSERT_TRUE(sliced.is_ok()) << sliced.status().to_string();
  EXPECT_EQ((*sliced)->blocks(), (LayerSpan{2, 4}));
  EXPECT_FALSE((*sliced)->tok_embd.valid());
  auto peer = spawn_span(slice, "2-4");
  ASSERT_TRUE(peer.is_ok()) << peer.status().to_string();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  auto spans = connect_spans(**model, {target(2, 4, {peer->get()})}, /*fallback=*/false);
  ASSERT_NE(spans, nullptr);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  Context ctx = make_ctx(**model, spans);
  Context local = make_ctx(**model, nullptr);
  EXPECT_TRUE(same_bits(greedy_rows(ctx, prompt, 3), greedy_rows(local, prompt, 3)));
  // Blocks outside the slice, a run of the slice itself, a slice of a slice: refused.
  RunResult outside = run_moesh("span -m " + quoted(slice) + " --layers 1-4 --listen 127.0.0.1:0");
  EXPECT_EQ(outside.exit_code, 1);
  EXPECT_NE(outside.err.find("holds 2-4 only"), std::string::npos) << outside.err;
  RunResult run = run_moesh("run -m " + quoted(slice) + " --tokens 1,2 -n 1");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.err.find("span slice"), std::string::npos) << run.err;
  RunResult again = run_moesh("slice -m " + quoted(slice) + " --layers 2-3 -o " + quoted(slice + ".2"));
  EXPECT_EQ(again.exit_code, 1);
  RunResult beyond = run_moesh("slice -m " + quoted(path) + " --layers 4-9 -o " + quoted(slice + ".3"));
  EXPECT_EQ(beyond.exit_code, 1);
  EXPECT_NE(beyond.err.find("not within the model's 0-5"), std::string::npos) << beyond.err;
  // A damaged span slice (one bit of an attention matrix) is refused at start-up, naming the tensor.
  {
    std::vector<uint8_t> bytes;
    {
      std::ifstream in(slice, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    const gguf::TensorInfo* ti = (*sliced)->file().find_tensor("blk.3.attn_k.weight");
    ASSERT_NE(ti, nullptr);
    bytes[(*sliced)->file().data_offset() + ti->offset + ti->n_bytes / 3] ^= 0x20;
    const std::string bad = temp_dir() + "/span-2-4-damaged.gguf";
    std::ofstream(bad, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    RunResult damaged = run_moesh("span -m " + quoted(bad) + " --layers 2-4 --listen 127.0.0.1:0");
    EXPECT_EQ(damaged.exit_code, 1);
    EXPECT_NE(damaged.err.find("blk.3.attn_k.weight"), std::string::npos) << damaged.err;
    EXPECT_NE(damaged.err.find("fails its hash"), std::string::npos) << damaged.err;
  }
}

// One span; two chained spans; one span with a lane (a second peer sharing its streams).
enum class SchedulerSpans { kOne, kChained, kLane };
void scheduler_across_spans(SchedulerSpans mode);

// The server's scheduler over spans: continuous batching (several streams per step, one trip
// per span for all of them), the prefix cache (a repeated prompt copied, not recomputed, on the
// backbone and on the peer), n-gram drafts; every stream's tokens equal greedy decoding alone.
// Once with one span, once with two adjacent spans chained (one chain per step).
TEST(Span, TheSchedulerBatchesStreamsAcrossSpans) {
  for (SchedulerSpans mode : {SchedulerSpans::kOne, SchedulerSpans::kChained, SchedulerSpans::kLane}) {
    SCOPED_TRACE(mode == SchedulerSpans::kChained ? "two chained spans"
                 : mode == SchedulerSpans::kLane  ? "one span with a lane"
                                                  : "one span");
    ASSERT_NO_FATAL_FAILURE(scheduler_across_spans(mode));
  }
}

void scheduler_across_spans(SchedulerSpans mode) {
  const bool chained = mode == SchedulerSpans::kChained;
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  auto a = spawn_span(path, chained ? "1-2" : "1-3");
  ASSERT_TRUE(a.is_ok());
  std::vector<SpanTarget> targets = {target(1, chained ? 2 : 3, {a->get()})};
  Result<std::unique_ptr<WorkerProcess>> b = make_error(StatusCode::kNotFound, "no second span");
  if (chained) {
    b = spawn_span(path, "3-4");
    ASSERT_TRUE(b.is_ok());
    targets.push_back(target(3, 4, {b->get()}));
  }
  if (mode == SchedulerSpans::kLane) {
    b = spawn_span(path, "1-3");
    ASSERT_TRUE(b.is_ok());
    targets[0].lanes.push_back((*b)->address());
  }
  auto spans = connect_spans(m, std::move(targets), true, chained ? SpanChainMode::kOn : SpanChainMode::kAuto);
  ASSERT_NE(spans, nullptr);
  SchedulerOptions o;
  o.n_slots = 3;
  o.n_ctx = 128;
  o.n_threads = 1;
  o.draft = "ngram";
  o.spans = spans;
  auto sched = Scheduler::create(m, nullptr, o);
  ASSERT_TRUE(sched.is_ok()) << sched.status().to_string();
  const std::vector<std::vector<int32_t>> prompts = {
      {5, 6, 7, 8, 5, 6, 7, 8, 5, 6}, {40, 41, 42}, {5, 6, 7, 8, 5, 6, 7, 8, 5, 6}, {9, 10, 11, 12}};
  struct Out {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<int32_t> tokens;
    bool done = false;
    Status error;
  };
  std::vector<std::shared_ptr<Out>> outs;
  auto submit = [&](const std::vector<int32_t>& p) {
    auto out = std::make_shared<Out>();
    outs.push_back(out);
    GenerationRequest r;
    r.prompt = p;
    r.max_tokens = 12;
    r.ignore_eos = true;
    auto id = (*sched)->submit(std::move(r), [out](const GenerationEvent& ev) {
      std::lock_guard<std::mutex> lk(out->mu);
      out->tokens.insert(out->tokens.end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.done) {
        out->done = true;
        out->error = ev.error;
      }
      out->cv.notify_all();
      return true;
    });
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
  };
  auto check = [&](size_t i, const std::vector<int32_t>& prompt) {
    std::unique_lock<std::mutex> lk(outs[i]->mu);
    ASSERT_TRUE(outs[i]->cv.wait_for(lk, std::chrono::minutes(3), [&] { return outs[i]->done; }));
    ASSERT_TRUE(outs[i]->error.is_ok()) << outs[i]->error.to_string();
    Context alone = make_ctx(m, nullptr);
    std::vector<float> rows = greedy_rows(alone, prompt, 11);
    const int64_t V = m.hparams().n_vocab, P = static_cast<int64_t>(prompt.size());
    std::vector<int32_t> want;
    for (int k = 0; k < 12; ++k) {
      const float* row = rows.data() + (P - 1 + k) * V;
      want.push_back(static_cast<int32_t>(std::max_element(row, row + V) - row));
    }
    EXPECT_EQ(outs[i]->tokens, want) << "request " << i;
  };
  for (const auto& p : prompts) submit(p);
  for (size_t i = 0; i < prompts.size(); ++i) check(i, prompts[i]);
  // Once they are done, a prompt seen before is served from the prefix cache.
  submit(prompts[0]);
  check(prompts.size(), prompts[0]);
  const SchedulerStats st = (*sched)->stats();
  EXPECT_GE(st.max_batch_seen, 2u);
  EXPECT_GT(st.cached_prompt_tokens, 0u);  // the repeated prompt
  if (mode == SchedulerSpans::kLane) {
    // A trip to the runner and one to the lane per step at most: the streams were shared.
    const SpanStats ss = spans->stats();
    EXPECT_GT(ss.lane_trips, 0u);
    EXPECT_GT(ss.lane_rows, 0u);
    EXPECT_LE(ss.trips, 2 * st.steps + ss.resends);
    EXPECT_EQ(ss.steps, st.steps);
    EXPECT_EQ(ss.lane_failures, 0u);
    EXPECT_EQ(ss.failovers, 0u);
    (*sched)->shutdown();
    return;
  }
  // One trip per span and step, whatever the number of streams in it (nothing was lost); chained,
  // every step is one chain (its head trip and one await).
  const uint64_t n_spans = chained ? 2 : 1;
  EXPECT_EQ(spans->stats().trips, n_spans * st.steps);
  EXPECT_EQ(spans->stats().chains, chained ? st.steps : 0u);
  EXPECT_EQ(spans->stats().chain_breaks, 0u);
  EXPECT_EQ(spans->stats().failovers, 0u);
  (*sched)->shutdown();
}

// `moesh gate --span`: exact across spans is bit-identical (PASS); f16 between spans is judged
// by argmax and cosine.
TEST(Span, GateChecksTheWireBetweenSpans) {
  const std::string path = six_block_model();
  auto a = spawn_span(path, "2-5");
  ASSERT_TRUE(a.is_ok());
  const std::string common =
      "gate -m " + quoted(path) + " --span 2-5@" + (*a)->address().to_string() + " --sequences 2 -t 1 --raw-sequences";
  RunResult exact = run_moesh(common);
  EXPECT_EQ(exact.exit_code, 0) << exact.out << exact.err;
  EXPECT_NE(exact.out.find("criterion: bit-identical logits"), std::string::npos) << exact.out;
  EXPECT_NE(exact.out.find("1 span(s), span wire f32"), std::string::npos) << exact.out;
  EXPECT_NE(exact.out.find("gate: PASS"), std::string::npos) << exact.out;
  RunResult f16 = run_moesh(common + " --span-wire f16 --min-argmax 0.5 --min-cosine 0.99");
  EXPECT_EQ(f16.exit_code, 0) << f16.out << f16.err;
  EXPECT_NE(f16.out.find("criterion: argmax agreement"), std::string::npos) << f16.out;
  EXPECT_NE(f16.out.find("span 2-5 on"), std::string::npos) << f16.out;
}

}  // namespace
}  // namespace moesh::test
