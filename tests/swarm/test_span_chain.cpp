// Chained spans on the peer, in process (swarm/span_chain.h): the step passed on to the next hop
// carries exactly what the backbone would have sent star-style, and forwarded results meet the
// backbone's SPAN_AWAITs whichever comes first, with timeouts, bounds and closed connections
// handled. The real peer-to-peer chain is tested through `moesh span` processes in
// tests/dist/test_span_chain.cpp.
#include <gtest/gtest.h>

#include <cstring>

#include "moesh/swarm/span_chain.h"

namespace moesh::swarm {
namespace {

using wire::WireDType;

constexpr uint32_t kD = 8;

// Blocks 2-3, chained to 4-4 then 5-6: sequence 3 starts fresh with 2 new rows, sequence 8 holds
// 5 cells and replays 1 before its 1 new row.
wire::SpanStepMsg head_step() {
  wire::SpanStepMsg m;
  m.request_id = 7;
  m.first = 2;
  m.last = 3;
  m.return_dtype = WireDType::kF32;
  m.seqs = {{.seq = 3, .n_replay = 0, .n_new = 2, .start = 0}, {.seq = 8, .n_replay = 1, .n_new = 1, .start = 4}};
  m.seqs[1].chain.fill(0x42);
  m.pos = {0, 1, 4, 5};
  m.cut = {0, 1, 0, 1};
  std::vector<float> rows(4 * kD, 0.5f);
  m.hidden = wire::encode_rows(WireDType::kF32, rows.data(), 4, kD).value();
  m.chain_id = 99;
  m.hop_dtype = WireDType::kF16;
  wire::SpanHop a{.address = "127.0.0.1:7002", .first = 4, .last = 4, .start = {0, 5}, .chain = {}};
  a.chain.resize(2);
  a.chain[1].fill(0x17);
  wire::SpanHop b{.address = "127.0.0.1:7003", .first = 5, .last = 6, .start = {0, 5}, .chain = a.chain};
  b.chain[1].fill(0x18);
  m.next = {a, b};
  return m;
}

// The head's result: one row per new row (3), values that f16 rounds.
wire::SpanResultMsg head_result() {
  std::vector<float> out(3 * kD);
  for (size_t i = 0; i < out.size(); ++i) out[i] = 1.0f / 3.0f + static_cast<float>(i);
  wire::SpanResultMsg r;
  r.request_id = 7;
  r.rows = wire::encode_rows(WireDType::kF32, out.data(), 3, kD).value();
  return r;
}

TEST(SpanChain, TheHopStepCarriesWhatTheBackboneWouldSend) {
  const wire::SpanStepMsg head = head_step();
  const wire::SpanResultMsg res = head_result();
  auto hop = make_hop_step(head, "backbone-x", res);
  ASSERT_TRUE(hop.is_ok()) << hop.status().to_string();
  EXPECT_EQ(hop->first, 4u);
  EXPECT_EQ(hop->last, 4u);
  EXPECT_EQ(hop->chain_id, 99u);
  EXPECT_EQ(hop->origin, "backbone-x");
  ASSERT_EQ(hop->next.size(), 1u);
  EXPECT_EQ(hop->next[0], head.next[1]);
  ASSERT_EQ(hop->seqs.size(), 2u);
  // The new rows only (the head's replayed row is not passed on), starting where the hop holds.
  EXPECT_EQ(hop->seqs[0].n_new, 2u);
  EXPECT_EQ(hop->seqs[0].start, 0u);
  EXPECT_EQ(hop->seqs[1].n_replay, 0u);
  EXPECT_EQ(hop->seqs[1].n_new, 1u);
  EXPECT_EQ(hop->seqs[1].start, 5u);
  EXPECT_EQ(hop->seqs[1].chain, head.next[0].chain[1]);
  EXPECT_EQ(hop->pos, (std::vector<int64_t>{0, 1, 5}));
  EXPECT_EQ(hop->cut, (std::vector<uint8_t>{0, 1, 1}));
  // Rows: the result decoded and encoded in the hop dtype, bit for bit what the backbone sends.
  std::vector<float> out(3 * kD), want(3 * kD), got(3 * kD);
  wire::decode_rows(res.rows, out.data());
  auto enc = wire::encode_rows(WireDType::kF16, out.data(), 3, kD).value();
  EXPECT_EQ(hop->hidden.dtype, WireDType::kF16);
  EXPECT_EQ(hop->hidden.bytes, enc.bytes);
  // It is a valid forwarded step on the wire.
  hop->request_id = 1;
  EXPECT_TRUE(wire::encode_span_step(*hop).is_ok());

  // The last hop: no next, nothing after it.
  wire::SpanStepMsg last = *hop;
  auto end = make_hop_step(last, "backbone-x", res);
  ASSERT_TRUE(end.is_ok()) << end.status().to_string();
  EXPECT_EQ(end->first, 5u);
  EXPECT_TRUE(end->next.empty());

  // Refusals: no next hop, a result without rows, rows that do not match the new rows.
  EXPECT_FALSE(make_hop_step(*end, "b", res).is_ok());
  wire::SpanResultMsg need;
  need.need = {{3, 0}};
  EXPECT_FALSE(make_hop_step(head, "b", need).is_ok());
  wire::SpanResultMsg two = res;
  std::vector<float> small(2 * kD, 1.0f);
  two.rows = wire::encode_rows(WireDType::kF32, small.data(), 2, kD).value();
  EXPECT_EQ(make_hop_step(head, "b", two).status().code(), StatusCode::kInternal);
}

// Reads one frame from `c` (the backbone's end) within a second.
Result<wire::Frame> next_frame(net::Connection& c) {
  return c.recv_frame(net::deadline_in(std::chrono::milliseconds(1000)));
}

TEST(SpanChain, ForwardedResultsMeetTheirAwaitsWhicheverComesFirst) {
  auto [peer_end, backbone_end] = net::make_loopback_pair();
  SpanAwaits aw;
  const wire::SpanResultMsg res = head_result();
  const wire::DecodeLimits lim;

  // The await first: answered when the result arrives, with the await's request id.
  aw.await(peer_end.get(), "bb", {.request_id = 31, .chain_id = 5, .first = 4, .last = 4, .timeout_ms = 10000});
  EXPECT_EQ(aw.n_waiting(), 1u);
  EXPECT_TRUE(aw.deliver("bb", 5, 4, res));
  auto f = next_frame(*backbone_end);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->request_id(), 31u);
  auto got = wire::decode_span_result(*f, lim);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(got->rows.bytes, res.rows.bytes);
  EXPECT_EQ(aw.n_waiting(), 0u);

  // The result first: kept, and answered the moment its await comes.
  EXPECT_FALSE(aw.deliver("bb", 6, 4, res));
  EXPECT_EQ(aw.n_results(), 1u);
  aw.await(peer_end.get(), "bb", {.request_id = 32, .chain_id = 6, .first = 4, .last = 4, .timeout_ms = 10000});
  f = next_frame(*backbone_end);
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(f->request_id(), 32u);
  EXPECT_EQ(f->type(), wire::MsgType::kSpanResult);
  EXPECT_EQ(aw.n_results(), 0u);

  // A failed forwarded step reaches its await as an ERROR with the status code.
  aw.await(peer_end.get(), "bb", {.request_id = 33, .chain_id = 7, .first = 4, .last = 4, .timeout_ms = 10000});
  aw.deliver("bb", 7, 4, make_error(StatusCode::kNotFound, "this span peer runs blocks 4-4"));
  f = next_frame(*backbone_end);
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(f->type(), wire::MsgType::kError);
  EXPECT_EQ(f->request_id(), 33u);
  auto e = wire::decode_error(*f);
  ASSERT_TRUE(e.is_ok());
  EXPECT_NE(e->text.find("runs blocks 4-4"), std::string::npos) << e->text;

  // Keys keep backbones, chains and spans apart: another origin's result does not answer it.
  aw.await(peer_end.get(), "bb", {.request_id = 34, .chain_id = 8, .first = 4, .last = 4, .timeout_ms = 1});
  EXPECT_FALSE(aw.deliver("other", 8, 4, res));
  EXPECT_FALSE(aw.deliver("bb", 8, 5, res));
  EXPECT_EQ(aw.n_waiting(), 1u);
  // Expired: sweep answers ERROR TIMEOUT on its own connection only.
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  aw.sweep(backbone_end.get());  // not its connection: nothing happens
  EXPECT_EQ(aw.n_waiting(), 1u);
  aw.sweep(peer_end.get());
  EXPECT_EQ(aw.n_waiting(), 0u);
  f = next_frame(*backbone_end);
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(f->type(), wire::MsgType::kError);
  EXPECT_EQ(f->request_id(), 34u);
  e = wire::decode_error(*f);
  ASSERT_TRUE(e.is_ok());
  EXPECT_EQ(e->to_status().code(), StatusCode::kTimeout) << e->text;

  // A closing connection's awaits are forgotten: a later result is kept, not sent on it.
  aw.await(peer_end.get(), "bb", {.request_id = 35, .chain_id = 9, .first = 4, .last = 4, .timeout_ms = 10000});
  aw.drop(peer_end.get());
  EXPECT_EQ(aw.n_waiting(), 0u);
  EXPECT_FALSE(aw.deliver("bb", 9, 4, res));

  // Unclaimed results are bounded: the oldest go first.
  for (uint64_t id = 100; id < 100 + SpanAwaits::kMaxResults + 10; ++id) aw.deliver("bb", id, 4, res);
  EXPECT_EQ(aw.n_results(), SpanAwaits::kMaxResults);
}

}  // namespace
}  // namespace moesh::swarm
