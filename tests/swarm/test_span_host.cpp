// The span peer's compute in-process (span_host.h): a step's rows equal what a whole local
// forward pass has after the span's last block, given what it had before its first; cells are
// kept, cut and copied by hash chain; a step that cannot start says what is missing and changes
// nothing; bad steps get errors naming the problem; sequences beyond max_seqs are dropped, the
// least recently used first.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <thread>

#include "moesh/swarm/span_host.h"
#include "swarm/swarm_test_util.h"

namespace moesh::swarm {
namespace {

using testing::small_model;

// Keeps the residual stream after every block of the last decode.
class Taps final : public ForwardObserver {
 public:
  void on_layer_out(int layer, int64_t n, int64_t d, const float* h) override {
    if (static_cast<size_t>(layer) >= out.size()) out.resize(static_cast<size_t>(layer) + 1);
    out[static_cast<size_t>(layer)].assign(h, h + n * d);
  }
  std::vector<std::vector<float>> out;
};

struct Fixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<SpanHost> host;
};

Fixture make(int first, int last, size_t max_seqs = 16) {
  Fixture f;
  auto m = Model::load(small_model(MakeArch::kDeepseek2, MakeFileType::kQ8_0, 5));
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  f.model = std::move(*m);
  SpanHostOptions o;
  o.span = {first, last};
  o.n_threads = 1;
  o.max_seqs = max_seqs;
  auto h = SpanHost::create(*f.model, o);
  EXPECT_TRUE(h.is_ok()) << h.status().to_string();
  f.host = std::move(*h);
  return f;
}

// One sequence's step: rows [n][D] at positions pos0.., after `start` cells with `chain`.
wire::SpanStepMsg step_of(int32_t seq, uint64_t start, const SpanChain& chain, const std::vector<float>& rows,
                          int64_t D, int64_t pos0, uint32_t n_replay = 0) {
  wire::SpanStepMsg m;
  m.request_id = 1;
  m.first = 1;
  m.last = 2;
  const uint32_t n = static_cast<uint32_t>(rows.size() / static_cast<size_t>(D));
  m.seqs = {{.seq = seq, .n_replay = n_replay, .n_new = n - n_replay, .start = start, .chain = chain}};
  for (uint32_t i = 0; i < n; ++i) {
    m.pos.push_back(pos0 + i);
    m.cut.push_back(0);
  }
  m.hidden = wire::encode_rows(wire::WireDType::kF32, rows.data(), n, static_cast<uint32_t>(D)).value();
  return m;
}

SpanChain chain_of(const std::vector<float>& rows, int64_t D, int64_t n, int64_t pos0 = 0) {
  SpanChain c{};
  for (int64_t i = 0; i < n; ++i) c = span_chain_next(c, pos0 + i, rows.data() + i * D, D);
  return c;
}

std::vector<float> rows_of(const wire::SpanResultMsg& r) {
  std::vector<float> v(static_cast<size_t>(r.rows.n_rows) * r.rows.n_cols);
  wire::decode_rows(r.rows, v.data());
  return v;
}

TEST(SpanHost, StepsEqualTheWholeForwardPassBetweenTheSpansEnds) {
  Fixture f = make(1, 2);
  const Model& m = *f.model;
  const int64_t D = m.hparams().n_embd;
  ContextParams cp;
  cp.n_threads = 1;
  Context local(m, cp);
  Taps taps;
  local.set_observer(&taps);
  const std::vector<int32_t> prompt = {3, 9, 27, 17};
  ASSERT_TRUE(local.decode(0, prompt.data(), 4, nullptr).is_ok());
  const std::vector<float> in = taps.out[0], want = taps.out[2];

  auto r = f.host->step("bb", step_of(0, 0, {}, in, D, 0));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_TRUE(r->need.empty());
  const std::vector<float> got = rows_of(*r);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);

  // The next token continues the held cells (start 4, the chain of the prompt's rows).
  const int32_t next = 40;
  ASSERT_TRUE(local.decode(0, &next, 1, nullptr).is_ok());
  auto r2 = f.host->step("bb", step_of(0, 4, chain_of(in, D, 4), taps.out[0], D, 4));
  ASSERT_TRUE(r2.is_ok()) << r2.status().to_string();
  const std::vector<float> got2 = rows_of(*r2);
  EXPECT_EQ(std::memcmp(got2.data(), taps.out[2].data(), got2.size() * sizeof(float)), 0);
  EXPECT_EQ(f.host->stats().steps.load(), 2u);
  EXPECT_EQ(f.host->stats().needs.load(), 0u);

  // Rolled back to 2 cells (the chain of the first two rows): cut, then the same bits as a
  // local context that holds those 2 cells.
  std::vector<float> two(in.begin(), in.begin() + 2 * D), third(in.begin() + 2 * D, in.begin() + 3 * D);
  auto r3 = f.host->step("bb", step_of(0, 2, chain_of(two, D, 2), third, D, 2));
  ASSERT_TRUE(r3.is_ok()) << r3.status().to_string();
  ASSERT_TRUE(r3->need.empty());
  EXPECT_EQ(std::memcmp(rows_of(*r3).data(), want.data() + 2 * D, D * sizeof(float)), 0);
}

TEST(SpanHost, AStepThatCannotStartSaysWhatIsMissingAndChangesNothing) {
  Fixture f = make(1, 2);
  const int64_t D = f.model->hparams().n_embd;
  std::vector<float> rows(static_cast<size_t>(3 * D));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
  ASSERT_TRUE(f.host->step("bb", step_of(7, 0, {}, rows, D, 0)).is_ok());
  const std::vector<float> one(rows.begin(), rows.begin() + D);
  // Unknown sequence at start 2 after inputs no sequence has: nothing matches.
  std::vector<float> unseen(rows.begin(), rows.begin() + 2 * D);
  unseen[5] += 1.0f;
  auto r = f.host->step("bb", step_of(8, 2, chain_of(unseen, D, 2), one, D, 2));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->need.size(), 1u);
  EXPECT_EQ(r->need[0], (wire::SpanHave{8, 0}));
  EXPECT_EQ(r->rows.n_rows, 0u);
  // A chain that does not match what sequence 7 holds: 0 usable cells, nothing cut.
  SpanChain other = chain_of(rows, D, 3);
  other[3] ^= 1;
  auto r2 = f.host->step("bb", step_of(7, 3, other, one, D, 3));
  ASSERT_TRUE(r2.is_ok());
  ASSERT_EQ(r2->need.size(), 1u);
  EXPECT_EQ(r2->need[0], (wire::SpanHave{7, 0}));
  // Another backbone's sequence 7 is another sequence.
  auto r3 = f.host->step("other", step_of(7, 3, chain_of(rows, D, 3), one, D, 3));
  ASSERT_TRUE(r3.is_ok());
  EXPECT_EQ(r3->need.size(), 1u);
  // Sequence 7 still holds its 3 cells: the right chain continues it.
  auto r4 = f.host->step("bb", step_of(7, 3, chain_of(rows, D, 3), one, D, 3));
  ASSERT_TRUE(r4.is_ok()) << r4.status().to_string();
  EXPECT_TRUE(r4->need.empty());
  // Sequence 9 starting with sequence 7's first 2 rows: copied from it, no inputs needed.
  auto r5 = f.host->step("bb", step_of(9, 2, chain_of(rows, D, 2), one, D, 2));
  ASSERT_TRUE(r5.is_ok()) << r5.status().to_string();
  EXPECT_TRUE(r5->need.empty());
  EXPECT_EQ(f.host->stats().prefix_copies.load(), 1u);
  // The replay form: sequence 8 with its 2 missing rows sent before its new one.
  std::vector<float> replay(rows.begin(), rows.begin() + 3 * D);
  auto r6 = f.host->step("bb", step_of(8, 0, {}, replay, D, 0, /*n_replay=*/2));
  ASSERT_TRUE(r6.is_ok()) << r6.status().to_string();
  EXPECT_EQ(r6->rows.n_rows, 1u);  // rows for the new token only
  EXPECT_EQ(f.host->stats().replayed_rows.load(), 2u);
}

TEST(SpanHost, BadStepsAreRefusedWithTheReason) {
  Fixture f = make(1, 2);
  const int64_t D = f.model->hparams().n_embd;
  std::vector<float> rows(static_cast<size_t>(D), 0.5f);
  wire::SpanStepMsg m = step_of(0, 0, {}, rows, D, 0);
  m.last = 1;
  auto r = f.host->step("bb", m);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("runs blocks 1-2, the step asks for 1-1"), std::string::npos)
      << r.status().to_string();
  std::vector<float> narrow(8, 0.5f);
  auto r2 = f.host->step("bb", step_of(0, 0, {}, narrow, 8, 0));
  EXPECT_EQ(r2.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r2.status().message().find("rows of width 8"), std::string::npos) << r2.status().to_string();
  // Positions must continue the sequence's cells.
  ASSERT_TRUE(f.host->step("bb", step_of(0, 0, {}, rows, D, 5)).is_ok());
  auto r3 = f.host->step("bb", step_of(0, 1, chain_of(rows, D, 1, 5), rows, D, 5));
  EXPECT_FALSE(r3.is_ok());
  EXPECT_EQ(f.host->stats().errors.load(), 3u);
  EXPECT_FALSE(SpanHost::create(*f.model, SpanHostOptions{.span = {2, 9}}).is_ok());
}

TEST(SpanHost, SequencesBeyondMaxSeqsAreDroppedLeastRecentlyUsedFirst) {
  Fixture f = make(1, 2, /*max_seqs=*/2);
  const int64_t D = f.model->hparams().n_embd;
  // Each sequence its own inputs (equal ones would be found as prefix copies of each other).
  auto rows_for = [D](int32_t s) {
    return std::vector<float>(static_cast<size_t>(D), 0.25f * static_cast<float>(s + 1));
  };
  for (int32_t s : {0, 1, 0, 2}) {
    auto r = f.host->step("bb", step_of(s, 0, {}, rows_for(s), D, 0));
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  }
  const std::vector<float> rows = rows_for(0);
  EXPECT_EQ(f.host->n_sequences(), 2u);
  EXPECT_EQ(f.host->stats().evictions.load(), 1u);
  // 1 was the least recently used: gone; 0 is still there.
  auto gone = f.host->step("bb", step_of(1, 1, chain_of(rows_for(1), D, 1), rows, D, 1));
  ASSERT_TRUE(gone.is_ok());
  EXPECT_EQ(gone->need.size(), 1u);
  auto kept = f.host->step("bb", step_of(0, 1, chain_of(rows, D, 1), rows, D, 1));
  ASSERT_TRUE(kept.is_ok());
  EXPECT_TRUE(kept->need.empty());
}

// Polls SPAN_HOLD kList until blocks sp are no longer loading (a few seconds at most).
wire::SpanHolding wait_loaded(SpanHosts& hosts, LayerSpan sp) {
  for (int i = 0; i < 500; ++i) {
    for (const wire::SpanHolding& h : hosts.list()) {
      if (static_cast<int>(h.first) == sp.first && static_cast<int>(h.last) == sp.last &&
          h.state != wire::SpanHeldState::kLoading)
        return h;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return {};
}

// A span peer's hosts (SpanHosts): blocks loaded on a backbone's word run like the first ones; a
// load is reported as loading, then ready or failed with its reason (and may be asked again); a
// drop refuses while another backbone's sequences are there; a peer without a loader says so.
TEST(SpanHosts, LoadsStepsAndLetsGoOfBlocksOnABackbonesWord) {
  Fixture f = make(1, 2);
  const Model& m = *f.model;
  const int64_t D = m.hparams().n_embd;
  std::promise<void> go;
  std::shared_future<void> gate = go.get_future().share();
  int calls = 0;
  SpanLoader loader = [&, gate](const LayerSpan& sp) -> Result<std::shared_ptr<SpanHost>> {
    gate.wait();
    if (++calls == 1) return make_error(StatusCode::kIoError, "disk full");
    SpanHostOptions o;
    o.span = sp;
    o.n_threads = 1;
    MOESH_ASSIGN_OR_RETURN(auto h, SpanHost::create(m, o));
    return std::shared_ptr<SpanHost>(std::move(h));
  };
  SpanHosts hosts(std::shared_ptr<SpanHost>(std::move(f.host)), loader);
  EXPECT_TRUE(hosts.can_load());
  EXPECT_EQ(hosts.max_row_width(), m.hparams().max_span_row_width());

  ContextParams cp;
  cp.n_threads = 1;
  Context local(m, cp);
  Taps taps;
  local.set_observer(&taps);
  const std::vector<int32_t> prompt = {3, 9, 27};
  ASSERT_TRUE(local.decode(0, prompt.data(), 3, nullptr).is_ok());
  const std::vector<float> in = taps.out[0];

  // Block 2 alone is not held: the step says which are.
  wire::SpanStepMsg s13 = step_of(0, 0, {}, taps.out[1], D, 0);
  s13.first = 2;
  auto none = hosts.step("bb", s13);
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("runs blocks 1-2, the step asks for 2-2"), std::string::npos)
      << none.status().to_string();
  ASSERT_TRUE(hosts.step("bb", step_of(0, 0, {}, in, D, 0)).is_ok());  // 1-2, for "bb"

  // A load: loading until the loader returns; its failure is kept with the reason.
  auto started = hosts.hold("bb", {.request_id = 1, .op = wire::SpanHoldOp::kLoad, .first = 2, .last = 2});
  ASSERT_TRUE(started.is_ok()) << started.status().to_string();
  EXPECT_EQ(started->request_id, 1u);
  ASSERT_EQ(started->spans.size(), 2u);
  EXPECT_EQ(started->spans[0], (wire::SpanHolding{1, 2, wire::SpanHeldState::kReady, ""}));
  EXPECT_EQ(started->spans[1], (wire::SpanHolding{2, 2, wire::SpanHeldState::kLoading, ""}));
  EXPECT_NE(hosts.describe().find("2-2 (loading)"), std::string::npos) << hosts.describe();
  // Asked again while it loads: still one load.
  ASSERT_TRUE(hosts.hold("bb", {.request_id = 2, .op = wire::SpanHoldOp::kLoad, .first = 2, .last = 2}).is_ok());
  auto busy = hosts.hold("bb", {.request_id = 3, .op = wire::SpanHoldOp::kDrop, .first = 2, .last = 2});
  ASSERT_FALSE(busy.is_ok());
  EXPECT_NE(busy.status().message().find("still loading"), std::string::npos) << busy.status().to_string();
  go.set_value();
  wire::SpanHolding failed = wait_loaded(hosts, {2, 2});
  EXPECT_EQ(failed.state, wire::SpanHeldState::kFailed);
  EXPECT_NE(failed.error.find("disk full"), std::string::npos) << failed.error;
  EXPECT_EQ(calls, 1);
  // Asked again after a failure: a new try, which works; the loaded blocks compute the local bits.
  ASSERT_TRUE(hosts.hold("bb", {.request_id = 4, .op = wire::SpanHoldOp::kLoad, .first = 2, .last = 2}).is_ok());
  EXPECT_EQ(wait_loaded(hosts, {2, 2}).state, wire::SpanHeldState::kReady);
  EXPECT_EQ(calls, 2);
  auto r = hosts.step("bb", s13);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const std::vector<float> got = rows_of(*r);
  ASSERT_EQ(got.size(), taps.out[2].size());
  EXPECT_EQ(std::memcmp(got.data(), taps.out[2].data(), got.size() * sizeof(float)), 0);

  // Dropping 1-2: refused for another backbone while "bb" holds a sequence there; "bb" may.
  auto other = hosts.hold("cc", {.request_id = 5, .op = wire::SpanHoldOp::kDrop, .first = 1, .last = 2});
  ASSERT_FALSE(other.is_ok());
  EXPECT_EQ(other.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(other.status().message().find("another backbone"), std::string::npos) << other.status().to_string();
  auto dropped = hosts.hold("bb", {.request_id = 6, .op = wire::SpanHoldOp::kDrop, .first = 1, .last = 2});
  ASSERT_TRUE(dropped.is_ok()) << dropped.status().to_string();
  ASSERT_EQ(dropped->spans.size(), 1u);
  EXPECT_EQ(dropped->spans[0].first, 2u);
  EXPECT_EQ(dropped->spans[0].last, 2u);
  EXPECT_FALSE(hosts.step("bb", step_of(0, 0, {}, in, D, 0)).is_ok());
  auto again = hosts.hold("bb", {.request_id = 7, .op = wire::SpanHoldOp::kDrop, .first = 1, .last = 2});
  EXPECT_EQ(again.status().code(), StatusCode::kNotFound);
  auto listed = hosts.hold("bb", {.request_id = 8, .op = wire::SpanHoldOp::kList});
  ASSERT_TRUE(listed.is_ok());
  EXPECT_EQ(listed->spans.size(), 1u);

  // Without a loader: loads are refused, saying what to do.
  SpanHosts fixed(nullptr, nullptr);
  EXPECT_FALSE(fixed.can_load());
  auto no = fixed.hold("bb", {.request_id = 9, .op = wire::SpanHoldOp::kLoad, .first = 0, .last = 1});
  ASSERT_FALSE(no.is_ok());
  EXPECT_EQ(no.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(no.status().message().find("--fetch"), std::string::npos) << no.status().to_string();
  // ... and it keeps the blocks it was started with: it could not load them back.
  Fixture g = make(1, 2);
  SpanHosts from_slice(std::shared_ptr<SpanHost>(std::move(g.host)), nullptr);
  auto kept = from_slice.hold("bb", {.request_id = 10, .op = wire::SpanHoldOp::kDrop, .first = 1, .last = 2});
  ASSERT_FALSE(kept.is_ok());
  EXPECT_NE(kept.status().message().find("could not load them again"), std::string::npos) << kept.status().to_string();
  EXPECT_TRUE(from_slice.find({1, 2}) != nullptr);
}

}  // namespace
}  // namespace moesh::swarm
