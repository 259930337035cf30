// Lanes of a span through real `moesh span` processes on 127.0.0.1: two peers run the same blocks
// at once, each for its share of the sequences (one trip per lane and step, both in flight). The
// bits equal all-local; a sequence stays on its lane (prefix copies follow their source); a lane
// killed mid-generation is dropped and its sequences are replayed on the span's runner; lanes are
// added and let go of while running.
#include <gtest/gtest.h>

#include "dist/span_test_util.h"

namespace moesh::test {
namespace {

// One step of every sequence in `seqs` (token t + seq each) through ctx and local: equal bits.
void batch_step(Context& ctx, Context& local, const std::vector<int32_t>& seqs, int32_t t, int step) {
  const int64_t V = ctx.model().hparams().n_vocab;
  std::vector<Context::BatchToken> batch;
  for (int32_t s : seqs) batch.push_back({s, t + s, true});
  std::vector<float> x(seqs.size() * V), y(seqs.size() * V);
  Status st = ctx.decode_batch(batch, x.data());
  ASSERT_TRUE(st.is_ok()) << "step " << step << ": " << st.to_string();
  ASSERT_TRUE(local.decode_batch(batch, y.data()).is_ok());
  ASSERT_TRUE(same_bits(x, y)) << "step " << step;
}

void prompt_both(Context& ctx, Context& local, int32_t seq, const std::vector<int32_t>& prompt) {
  const int64_t V = ctx.model().hparams().n_vocab;
  std::vector<float> x(prompt.size() * V), y(prompt.size() * V);
  Status st = ctx.decode(seq, prompt.data(), static_cast<int64_t>(prompt.size()), x.data());
  ASSERT_TRUE(st.is_ok()) << "prompt of " << seq << ": " << st.to_string();
  ASSERT_TRUE(local.decode(seq, prompt.data(), static_cast<int64_t>(prompt.size()), y.data()).is_ok());
  ASSERT_TRUE(same_bits(x, y)) << "prompt of " << seq;
}

TEST(SpanLanes, TwoPeersShareASpansSequencesWithTheLocalBits) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  auto a = spawn_span(path, "2-4");
  auto b = spawn_span(path, "2-4");
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  SpanTarget t = target(2, 4, {a->get()});
  t.lanes.push_back((*b)->address());
  auto spans = connect_spans(m, {t});
  ASSERT_NE(spans, nullptr);
  ASSERT_EQ(spans->lanes_view().size(), 1u);
  EXPECT_NE(spans->where(0).find("+ lane"), std::string::npos) << spans->where(0);
  Context ctx = make_ctx(m, spans);
  Context local = make_ctx(m, nullptr);

  // Four prompts, one step each: new sequences alternate between the runner and the lane.
  const std::vector<std::vector<int32_t>> prompts = {{5, 6, 7}, {40, 41, 42, 43}, {9, 10}, {17, 18, 19, 20, 21}};
  for (int32_t s = 0; s < 4; ++s) ASSERT_NO_FATAL_FAILURE(prompt_both(ctx, local, s, prompts[s]));
  SpanStats st = spans->stats();
  EXPECT_EQ(st.trips, 4u);
  EXPECT_EQ(st.lane_trips, 2u);  // sequences 1 and 3
  EXPECT_EQ(st.lane_rows, prompts[1].size() + prompts[3].size());
  EXPECT_EQ(spans->lanes_view()[0].sequences, 2u);
  // Three steps of all four: one trip to the runner and one to the lane each, one span step.
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(batch_step(ctx, local, {0, 1, 2, 3}, 30 + i, i));
  st = spans->stats();
  EXPECT_EQ(st.steps, 4u + 3u);
  EXPECT_EQ(st.trips, 4u + 6u);
  EXPECT_EQ(st.lane_trips, 2u + 3u);
  EXPECT_EQ(st.lane_rows, prompts[1].size() + prompts[3].size() + 6);
  EXPECT_EQ(st.resends, 0u);
  EXPECT_EQ(st.replayed_rows, 0u);
  EXPECT_EQ(spans->lanes_view()[0].trips, 5u);

  // A prefix copy of a lane's sequence runs on that lane (it copies the prefix itself): nothing
  // is replayed.
  ASSERT_TRUE(ctx.state().copy(1, 4, 5).is_ok());
  ASSERT_TRUE(local.state().copy(1, 4, 5).is_ok());
  ASSERT_NO_FATAL_FAILURE(batch_step(ctx, local, {0, 1, 2, 3, 4}, 50, 3));
  st = spans->stats();
  EXPECT_EQ(st.replayed_rows, 0u);
  EXPECT_EQ(st.lane_rows, prompts[1].size() + prompts[3].size() + 6 + 3);  // 1, 3 and 4
  EXPECT_EQ(spans->lanes_view()[0].sequences, 3u);

  // The lane is killed: the next step drops it and replays its sequences (1, 3, 4) on the runner.
  const int64_t cells_on_lane = ctx.state().seq_len(1) + ctx.state().seq_len(3) + ctx.state().seq_len(4);
  (*b)->kill_now();
  ASSERT_NO_FATAL_FAILURE(batch_step(ctx, local, {0, 1, 2, 3, 4}, 60, 4));
  st = spans->stats();
  EXPECT_EQ(st.lane_failures, 1u);
  EXPECT_EQ(st.failovers, 0u);
  EXPECT_EQ(st.local_steps, 0u);
  EXPECT_EQ(st.replayed_rows, static_cast<uint64_t>(cells_on_lane));
  EXPECT_TRUE(spans->lanes_view().empty());
  EXPECT_EQ(spans->where(0).find("+ lane"), std::string::npos) << spans->where(0);
  const uint64_t trips = st.trips;
  ASSERT_NO_FATAL_FAILURE(batch_step(ctx, local, {0, 1, 2, 3, 4}, 70, 5));
  EXPECT_EQ(spans->stats().trips - trips, 1u);  // all on the runner now
}

TEST(SpanLanes, LanesAreAddedAndLetGoOfWhileRunning) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  auto a = spawn_span(path, "1-3");
  auto c = spawn_span(path, "");  // started without blocks: it loads 1-3 when made a lane
  ASSERT_TRUE(a.is_ok() && c.is_ok());
  auto spans = connect_spans(m, {target(1, 3, {a->get()})});
  ASSERT_NE(spans, nullptr);
  Context ctx = make_ctx(m, spans);
  Context local = make_ctx(m, nullptr);
  ASSERT_NO_FATAL_FAILURE(prompt_both(ctx, local, 0, {3, 1, 4, 1, 5}));
  ASSERT_NO_FATAL_FAILURE(prompt_both(ctx, local, 1, {9, 2, 6}));

  // Refused: here, an unknown span, the span's own runner.
  EXPECT_EQ(spans->add_lane({1, 3}, "here").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(spans->add_lane({1, 2}, (*c)->address().to_string()).code(), StatusCode::kNotFound);
  EXPECT_EQ(spans->add_lane({1, 3}, (*a)->address().to_string()).code(), StatusCode::kInvalidArgument);

  const std::string lane = (*c)->address().to_string();
  ASSERT_TRUE(spans->add_lane({1, 3}, lane).is_ok());
  EXPECT_EQ(spans->add_lane({1, 3}, lane).code(), StatusCode::kInvalidArgument);  // a lane already
  EXPECT_EQ(spans->move({1, 3}, lane).code(), StatusCode::kInvalidArgument);      // the span onto its lane
  EXPECT_EQ(spans->add_idle(lane).code(), StatusCode::kInvalidArgument);          // busy, not idle
  EXPECT_EQ(spans->stats().lanes_added, 1u);
  EXPECT_EQ(spans->stats().loads, 1u);
  // The running sequences stay on the runner; the next two new ones go to the lane (fewest).
  ASSERT_NO_FATAL_FAILURE(prompt_both(ctx, local, 2, {8, 8, 8}));
  ASSERT_NO_FATAL_FAILURE(prompt_both(ctx, local, 3, {7, 6}));
  EXPECT_EQ(spans->stats().lane_rows, 5u);
  ASSERT_EQ(spans->lanes_view().size(), 1u);
  EXPECT_EQ(spans->lanes_view()[0].sequences, 2u);
  for (int i = 0; i < 2; ++i) ASSERT_NO_FATAL_FAILURE(batch_step(ctx, local, {0, 1, 2, 3}, 20 + i, i));
  EXPECT_EQ(spans->stats().replayed_rows, 0u);

  // Let go of: its sequences are replayed on the runner, the peer is idle (it let go of 1-3).
  EXPECT_EQ(spans->drop_lane({1, 3}, "127.0.0.1:1").code(), StatusCode::kNotFound);
  ASSERT_TRUE(spans->drop_lane({1, 3}, lane).is_ok());
  EXPECT_TRUE(spans->lanes_view().empty());
  EXPECT_EQ(spans->stats().drops, 1u);
  ASSERT_EQ(spans->idle_view().size(), 1u);
  EXPECT_EQ(spans->idle_view()[0].address, lane);
  const int64_t moved = ctx.state().seq_len(2) + ctx.state().seq_len(3);
  ASSERT_NO_FATAL_FAILURE(batch_step(ctx, local, {0, 1, 2, 3}, 40, 2));
  EXPECT_EQ(spans->stats().replayed_rows, static_cast<uint64_t>(moved));
  EXPECT_EQ(spans->stats().lane_failures, 0u);
}

// The span's own peer dies: its part fails over (here: this process) while the lane goes on with
// its sequences; a resplit that changes the span lets its lane go. The bits stay all-local.
TEST(SpanLanes, TheRunnerFailsOverWhileItsLaneGoesOnAndAResplitLetsLanesGo) {
  const std::string path = six_block_model();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const Model& m = **model;
  auto a = spawn_span(path, "2-4");
  auto b = spawn_span(path, "2-4");
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  SpanTarget t = target(2, 4, {a->get()});
  t.lanes.push_back((*b)->address());
  auto spans = connect_spans(m, {t});
  ASSERT_NE(spans, nullptr);
  Context ctx = make_ctx(m, spans);
  Context local = make_ctx(m, nullptr);
  ASSERT_NO_FATAL_FAILURE(prompt_both(ctx, local, 0, {1, 2, 3}));  // the runner
  ASSERT_NO_FATAL_FAILURE(prompt_both(ctx, local, 1, {4, 5, 6}));  // the lane
  ASSERT_NO_FATAL_FAILURE(batch_step(ctx, local, {0, 1}, 10, 0));
  (*a)->kill_now();
  for (int i = 1; i < 4; ++i) ASSERT_NO_FATAL_FAILURE(batch_step(ctx, local, {0, 1}, 10 + i, i));
  SpanStats st = spans->stats();
  EXPECT_EQ(st.failovers, 1u);
  EXPECT_EQ(st.local_steps, 3u);  // the runner's part here
  EXPECT_EQ(st.lane_failures, 0u);
  EXPECT_EQ(st.lane_rows, 3u + 4u);  // sequence 1 throughout
  ASSERT_EQ(spans->lanes_view().size(), 1u);
  EXPECT_NE(spans->where(0).find("2-4 here + lane"), std::string::npos) << spans->where(0);
  // New edges: the lane of 2-4 is let go (it ran the old blocks); the bits stay.
  ASSERT_TRUE(spans->resplit({{{2, 3}, "here"}, {{4, 4}, "here"}}).is_ok());
  EXPECT_TRUE(spans->lanes_view().empty());
  for (int i = 4; i < 6; ++i) ASSERT_NO_FATAL_FAILURE(batch_step(ctx, local, {0, 1}, 10 + i, i));
}

TEST(SpanLanes, ALaneNeedsItsSpan) {
  auto lane = parse_span_lane("2-4@127.0.0.1:7001");
  ASSERT_TRUE(lane.is_ok()) << lane.status().to_string();
  EXPECT_TRUE(lane->peers.empty());
  ASSERT_EQ(lane->lanes.size(), 1u);
  EXPECT_EQ(parse_span_lane("2-4@here").status().code(), StatusCode::kInvalidArgument);
  auto none = merge_span_targets({*lane});
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("no --span names"), std::string::npos) << none.status().to_string();
  auto span = parse_span_target("2-4@127.0.0.1:7000");
  ASSERT_TRUE(span.is_ok());
  // Given before its span, or on a span here: it joins that span.
  auto merged = merge_span_targets({*lane, *span});
  ASSERT_TRUE(merged.is_ok()) << merged.status().to_string();
  ASSERT_EQ(merged->size(), 1u);
  EXPECT_EQ((*merged)[0].peers.size(), 1u);
  EXPECT_EQ((*merged)[0].lanes.size(), 1u);
  auto here = merge_span_targets({*lane, *parse_span_target("2-4@here")});
  ASSERT_TRUE(here.is_ok()) << here.status().to_string();
  EXPECT_TRUE((*here)[0].here);
  EXPECT_EQ((*here)[0].lanes.size(), 1u);
}

}  // namespace
}  // namespace moesh::test
