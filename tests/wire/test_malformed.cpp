// Malformed-frame suite: every way a frame can be wrong is rejected with a Status naming the
// problem, and 10k randomly mutated frames never crash and are only accepted when they are the
// canonical encoding of a valid message.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "moesh/wire/wire.h"
#include "wire/wire_test_util.h"

namespace moesh::wire {
namespace {

using testing::make_combine_for;
using testing::make_dispatch;
using testing::make_slab;

// Rebuilds a frame around an edited payload with a correct checksum, so the semantic checks
// behind the checksum are what gets tested.
std::vector<uint8_t> reseal(const std::vector<uint8_t>& bytes) {
  uint16_t version, type;
  uint64_t id;
  std::memcpy(&version, bytes.data() + 4, 2);
  std::memcpy(&type, bytes.data() + 6, 2);
  std::memcpy(&id, bytes.data() + 8, 8);
  std::span<const uint8_t> payload(bytes.data() + kHeaderBytes, bytes.size() - kHeaderBytes);
  return build_frame(static_cast<MsgType>(type), id, payload, version);
}

template <typename T>
void put(std::vector<uint8_t>& b, size_t payload_offset, T v) {
  std::memcpy(b.data() + kHeaderBytes + payload_offset, &v, sizeof(T));
}

Status decode_any(const std::vector<uint8_t>& bytes, const DecodeLimits& lim) {
  auto f = parse_frame(bytes, lim.max_frame_bytes);
  if (!f.is_ok()) return f.status();
  switch (f->type()) {
    case MsgType::kHello:
      return decode_hello(*f).status();
    case MsgType::kDispatch:
      return decode_dispatch(*f, lim).status();
    case MsgType::kCombine:
      return decode_combine(*f, lim).status();
    case MsgType::kPing:
      return decode_ping(*f).status();
    case MsgType::kPong:
      return decode_pong(*f).status();
    case MsgType::kGoodbye:
      return decode_goodbye(*f).status();
    case MsgType::kError:
      return decode_error(*f).status();
    case MsgType::kFetch:
      return decode_fetch(*f, lim).status();
    case MsgType::kSlab:
      return decode_slab(*f, lim).status();
    case MsgType::kAuth:
      return decode_auth(*f).status();
    case MsgType::kRoute:
      return decode_route(*f).status();
    case MsgType::kStore:
      return decode_store(*f, lim).status();
    case MsgType::kStored:
      return decode_stored(*f, lim).status();
    case MsgType::kUnstore:
      return decode_unstore(*f, lim).status();
    case MsgType::kUnstored:
      return decode_unstored(*f, lim).status();
    case MsgType::kInfo:
      return decode_info_request(*f).status();
    case MsgType::kInfoReply:
      return decode_info(*f).status();
    case MsgType::kSpanStep:
      return decode_span_step(*f, lim).status();
    case MsgType::kSpanResult:
      return decode_span_result(*f, lim).status();
    case MsgType::kSpanAwait:
      return decode_span_await(*f, lim).status();
    case MsgType::kProbe:
      return decode_probe(*f).status();
    case MsgType::kProbeReply:
      return decode_probe_reply(*f).status();
    case MsgType::kSpanHold:
      return decode_span_hold(*f).status();
    case MsgType::kSpanHeld:
      return decode_span_held(*f).status();
    case MsgType::kCOUNT:
      break;
  }
  return Status(StatusCode::kInternal, "unreachable");
}

// Re-encodes whatever decode accepted.
std::vector<uint8_t> reencode(const std::vector<uint8_t>& bytes, const DecodeLimits& lim) {
  Frame f = parse_frame(bytes, lim.max_frame_bytes).value();
  switch (f.type()) {
    case MsgType::kHello:
      return encode_hello(decode_hello(f).value()).value();
    case MsgType::kDispatch:
      return encode_dispatch(decode_dispatch(f, lim).value()).value();
    case MsgType::kCombine:
      return encode_combine(decode_combine(f, lim).value()).value();
    case MsgType::kPing:
      return encode_ping(decode_ping(f).value()).value();
    case MsgType::kPong:
      return encode_pong(decode_pong(f).value()).value();
    case MsgType::kGoodbye:
      return encode_goodbye(decode_goodbye(f).value()).value();
    case MsgType::kError:
      return encode_error(decode_error(f).value()).value();
    case MsgType::kFetch:
      return encode_fetch(decode_fetch(f, lim).value()).value();
    case MsgType::kSlab:
      return encode_slab(decode_slab(f, lim).value()).value();
    case MsgType::kAuth:
      return encode_auth(decode_auth(f).value()).value();
    case MsgType::kRoute:
      return encode_route(decode_route(f).value()).value();
    case MsgType::kStore:
      return encode_store(decode_store(f, lim).value()).value();
    case MsgType::kStored:
      return encode_stored(decode_stored(f, lim).value()).value();
    case MsgType::kUnstore:
      return encode_unstore(decode_unstore(f, lim).value()).value();
    case MsgType::kUnstored:
      return encode_unstored(decode_unstored(f, lim).value()).value();
    case MsgType::kInfo:
      return encode_info_request(decode_info_request(f).value()).value();
    case MsgType::kInfoReply:
      return encode_info(decode_info(f).value()).value();
    case MsgType::kSpanStep:
      return encode_span_step(decode_span_step(f, lim).value()).value();
    case MsgType::kSpanResult:
      return encode_span_result(decode_span_result(f, lim).value()).value();
    case MsgType::kSpanAwait:
      return encode_span_await(decode_span_await(f, lim).value()).value();
    case MsgType::kProbe:
      return encode_probe(decode_probe(f).value()).value();
    case MsgType::kProbeReply:
      return encode_probe_reply(decode_probe_reply(f).value()).value();
    case MsgType::kSpanHold:
      return encode_span_hold(decode_span_hold(f).value()).value();
    case MsgType::kSpanHeld:
      return encode_span_held(decode_span_held(f).value()).value();
    case MsgType::kCOUNT:
      break;
  }
  return {};
}

const DecodeLimits kLim{.max_frame_bytes = 1u << 20, .max_n_embd = 4096, .n_expert = 64, .n_layer = 8};

std::vector<uint8_t> good_dispatch() {
  // 3 tokens x 2 pairs, n_embd 32, f32: counts at 24 (pad to 28), pairs at 28, rows at 76.
  return encode_dispatch(make_dispatch(11, 2, 3, 32, 2, WireDType::kF32, CombineMode::kExact, WireDType::kF32)).value();
}

void expect_code(const std::vector<uint8_t>& bytes, StatusCode code, const char* needle) {
  Status st = decode_any(bytes, kLim);
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos)
      << "message '" << st.message() << "' lacks '" << needle << "'";
}

TEST(WireMalformed, BaselineIsValid) {
  EXPECT_TRUE(decode_any(good_dispatch(), kLim).is_ok());
}

// ROUTE (join / relay splice, before HELLO): known op, a name exactly where the op needs one,
// name length within the payload and at most 64, request id 0, nothing trailing.
TEST(WireMalformed, RouteFramesAreCheckedFieldByField) {
  for (uint8_t op = 1; op < RouteMsg::kOpCount; ++op) {
    RouteMsg m;
    m.op = op;
    if (op == RouteMsg::kJoin || op == RouteMsg::kConnect) m.name = "worker-7";
    const std::vector<uint8_t> good = encode_route(m).value();
    ASSERT_TRUE(decode_any(good, kLim).is_ok()) << route_op_name(op);
    EXPECT_EQ(reencode(good, kLim), good);
    EXPECT_EQ(decode_route(parse_frame(good, kLim.max_frame_bytes).value()).value().name, m.name);
  }
  auto with = [&](std::vector<uint8_t> p, uint64_t id = 0) { return build_frame(MsgType::kRoute, id, p); };
  expect_code(with({1}), StatusCode::kCorrupt, "ROUTE payload of 1 bytes shorter than 2");
  expect_code(with({0, 0}), StatusCode::kCorrupt, "ROUTE: unknown op 0");
  expect_code(with({9, 0}), StatusCode::kCorrupt, "ROUTE: unknown op 9");
  expect_code(with({1, 0}), StatusCode::kCorrupt, "JOIN: needs a worker name");
  expect_code(with({5, 1, 'x'}), StatusCode::kCorrupt, "SPLICED: carries a name");
  expect_code(with({4, 5, 'a', 'b'}), StatusCode::kCorrupt, "name of 5 bytes truncated to 2");
  expect_code(with({4, 65}), StatusCode::kCorrupt, "name length 65 over 64");
  expect_code(with({4, 1, 'a', 0}), StatusCode::kCorrupt, "trailing");
  expect_code(with({4, 1, 'a'}, 3), StatusCode::kCorrupt, "request id 3");
  RouteMsg bad;
  bad.op = RouteMsg::kJoin;
  EXPECT_FALSE(encode_route(bad).is_ok()) << "JOIN without a name";
  bad.name = std::string(65, 'n');
  EXPECT_FALSE(encode_route(bad).is_ok()) << "a name over 64 bytes";
}

// AUTH (swarm-key challenge / proof): 65 bytes exactly, known flags, request id 0.
TEST(WireMalformed, AuthFramesAreCheckedFieldByField) {
  AuthMsg a;
  a.flags = AuthMsg::kHasChallenge | AuthMsg::kHasProof;
  a.challenge[0] = 7;
  a.proof[31] = 9;
  const std::vector<uint8_t> good = encode_auth(a).value();
  ASSERT_TRUE(decode_any(good, kLim).is_ok());
  EXPECT_EQ(reencode(good, kLim), good);
  const std::vector<uint8_t> payload(good.begin() + kHeaderBytes, good.end());
  auto with = [&](std::vector<uint8_t> p, uint64_t id = 0) { return build_frame(MsgType::kAuth, id, p); };
  std::vector<uint8_t> shorter(payload.begin(), payload.end() - 1), longer = payload;
  longer.push_back(0);
  expect_code(with(shorter), StatusCode::kCorrupt, "AUTH payload of 64 bytes");
  expect_code(with(longer), StatusCode::kCorrupt, "trailing");
  std::vector<uint8_t> flags0 = payload, flags9 = payload;
  flags0[0] = 0;
  flags9[0] = 9;
  expect_code(with(flags0), StatusCode::kCorrupt, "flags 0x0");
  expect_code(with(flags9), StatusCode::kCorrupt, "flags 0x9");
  expect_code(with(payload, 5), StatusCode::kCorrupt, "request id 5");
  AuthMsg none;
  EXPECT_FALSE(encode_auth(none).is_ok());
}

TEST(WireMalformed, HeaderDamage) {
  auto b = good_dispatch();
  b[0] ^= 0xff;
  expect_code(b, StatusCode::kCorrupt, "magic");
  b = good_dispatch();
  b[4] = kVersion + 1;  // DISPATCH in a version we do not speak
  expect_code(b, StatusCode::kUnsupported, fmt::format("version {}", kVersion + 1).c_str());
  b = good_dispatch();
  b[4] = 2;  // ...nor in the pre-FETCH version 2
  expect_code(b, StatusCode::kUnsupported, "version 2");
  b = good_dispatch();
  b[4] = 1;  // ...nor in the pre-Q8K version 1
  expect_code(b, StatusCode::kUnsupported, "version 1");
  b = good_dispatch();
  b[4] = 0;
  expect_code(b, StatusCode::kCorrupt, "version 0");
  b = good_dispatch();
  b[6] = 99;
  expect_code(b, StatusCode::kCorrupt, "unknown message type 99");
  b = good_dispatch();
  b[6] = 0;
  expect_code(b, StatusCode::kCorrupt, "unknown message type 0");
  b = good_dispatch();
  b[21] = 1;
  expect_code(b, StatusCode::kCorrupt, "flags");
  b = good_dispatch();
  b.resize(20);
  expect_code(b, StatusCode::kCorrupt, "header truncated");
  b = good_dispatch();
  b.resize(b.size() - 5);
  expect_code(b, StatusCode::kCorrupt, "payload truncated");
  b = good_dispatch();
  b.push_back(0);
  expect_code(b, StatusCode::kCorrupt, "after the");
  b = good_dispatch();
  b[kHeaderBytes + 100] ^= 0x10;  // not resealed
  expect_code(b, StatusCode::kCorrupt, "checksum");
  b = good_dispatch();
  b[8] ^= 1;  // the request id is covered by the checksum too
  expect_code(b, StatusCode::kCorrupt, "checksum");
  // A length over the configured maximum is refused from the header alone (nothing allocated).
  b = good_dispatch();
  const uint32_t huge = 0xfffffff0u;
  std::memcpy(b.data() + 16, &huge, 4);
  auto h = parse_header(b, kLim.max_frame_bytes);
  ASSERT_FALSE(h.is_ok());
  EXPECT_EQ(h.status().code(), StatusCode::kOutOfRange);
  EXPECT_FALSE(parse_header(good_dispatch(), 64).is_ok());
}

TEST(WireMalformed, DispatchFields) {
  auto edit = [](auto fn) {
    auto b = good_dispatch();
    fn(b);
    return reseal(b);
  };
  expect_code(edit([](auto& b) { put<uint32_t>(b, 4, 0); }), StatusCode::kCorrupt, "n_tokens is 0");
  expect_code(edit([](auto& b) { put<uint32_t>(b, 8, 0); }), StatusCode::kCorrupt, "n_embd 0");
  expect_code(edit([](auto& b) { put<uint32_t>(b, 8, 5000); }), StatusCode::kCorrupt, "n_embd 5000");
  // Counts inconsistent with the payload length.
  expect_code(edit([](auto& b) { put<uint32_t>(b, 4, 4); }), StatusCode::kCorrupt, "payload is");
  expect_code(edit([](auto& b) { put<uint32_t>(b, 12, 7); }), StatusCode::kCorrupt, "payload is");
  expect_code(edit([](auto& b) { put<uint32_t>(b, 12, 2); }), StatusCode::kCorrupt, "impossible");
  expect_code(edit([](auto& b) { put<uint32_t>(b, 4, 0xffffffffu); }), StatusCode::kCorrupt, "impossible");
  expect_code(edit([](auto& b) { b.resize(b.size() - 4); }), StatusCode::kCorrupt, "payload is");
  expect_code(edit([](auto& b) { b.resize(kHeaderBytes + 10); }), StatusCode::kCorrupt, "fixed part");
  expect_code(edit([](auto& b) { put<uint8_t>(b, 16, 9); }), StatusCode::kCorrupt, "wire dtype 9");
  expect_code(edit([](auto& b) { put<uint8_t>(b, 17, 2); }), StatusCode::kCorrupt, "combine mode 2");
  expect_code(edit([](auto& b) { put<uint8_t>(b, 18, 5); }), StatusCode::kCorrupt, "return dtype 5");
  expect_code(edit([](auto& b) { put<uint8_t>(b, 19, 1); }), StatusCode::kCorrupt, "reserved");
  expect_code(edit([](auto& b) { put<uint32_t>(b, 0, 8); }), StatusCode::kCorrupt, "layer 8");
  // Pair counts: a zero count, or counts that do not sum to n_pairs.
  expect_code(edit([](auto& b) {
                put<uint8_t>(b, 24, 0);
                put<uint8_t>(b, 25, 4);
              }),
              StatusCode::kCorrupt, "no expert pairs");
  expect_code(edit([](auto& b) { put<uint8_t>(b, 24, 1); }), StatusCode::kCorrupt, "sum to 5");
  expect_code(edit([](auto& b) { put<uint8_t>(b, 24, 5); }), StatusCode::kCorrupt, "sum to 9");
  expect_code(edit([](auto& b) { put<uint8_t>(b, 27, 1); }), StatusCode::kCorrupt, "padding");
  // Pairs at 28: (u16 expert, u8 rank, u8 reserved, f32 weight).
  expect_code(edit([](auto& b) { put<uint16_t>(b, 28, 64); }), StatusCode::kCorrupt, "expert id 64 out of range");
  expect_code(edit([](auto& b) {
                put<uint16_t>(b, 36, b[kHeaderBytes + 28]);
                put<uint8_t>(b, 37, 0);
              }),
              StatusCode::kCorrupt, "twice");
  expect_code(edit([](auto& b) { put<uint8_t>(b, 38, b[kHeaderBytes + 30]); }), StatusCode::kCorrupt,
              "not strictly increasing");
  expect_code(edit([](auto& b) { put<uint8_t>(b, 31, 1); }), StatusCode::kCorrupt, "reserved byte");
  expect_code(edit([](auto& b) { put<float>(b, 32, std::numeric_limits<float>::quiet_NaN()); }), StatusCode::kCorrupt,
              "non-finite weight");
  expect_code(edit([](auto& b) { put<float>(b, 76 + 4 * 40, std::numeric_limits<float>::infinity()); }),
              StatusCode::kCorrupt, "non-finite f32 at row 1 column 8");
}

TEST(WireMalformed, Q8KRows) {
  // 3 tokens x 2 pairs, n_embd 300 (two Q8K blocks, the second padded): rows at 76, 520 B each.
  const auto good =
      encode_dispatch(make_dispatch(11, 2, 3, 300, 2, WireDType::kQ8K, CombineMode::kExact, WireDType::kQ8K)).value();
  ASSERT_EQ(good.size(), kHeaderBytes + 76 + 3 * 520u);
  auto dec = decode_dispatch(parse_frame(good, kLim.max_frame_bytes).value(), kLim);
  ASSERT_TRUE(dec.is_ok()) << dec.status().to_string();
  EXPECT_EQ(dec->hidden.dtype, WireDType::kQ8K);
  EXPECT_EQ(encode_dispatch(*dec).value(), good);
  auto edit = [&](auto fn) {
    auto b = good;
    fn(b);
    return reseal(b);
  };
  // Short or long by a byte, and a row count the payload cannot hold (checked before allocating).
  expect_code(edit([](auto& b) { b.resize(b.size() - 1); }), StatusCode::kCorrupt, "payload is");
  expect_code(edit([](auto& b) { b.push_back(0); }), StatusCode::kCorrupt, "payload is");
  expect_code(edit([](auto& b) { put<uint32_t>(b, 8, 4000); }), StatusCode::kCorrupt, "payload is");
  // Non-finite scales: row 1 block 0, row 2 block 1.
  expect_code(edit([](auto& b) { put<float>(b, 76 + 520, std::numeric_limits<float>::infinity()); }),
              StatusCode::kCorrupt, "non-finite q8k scale at row 1 block 0");
  expect_code(edit([](auto& b) { put<float>(b, 76 + 2 * 520 + 260, std::numeric_limits<float>::quiet_NaN()); }),
              StatusCode::kCorrupt, "non-finite q8k scale at row 2 block 1");
  // Any int8 value is a valid q (the quantizer can produce -128 for a denormal block max).
  auto ok = decode_any(edit([](auto& b) { put<int8_t>(b, 76 + 4, -128); }), kLim);
  EXPECT_TRUE(ok.is_ok()) << ok.to_string();
  // The same checks guard a COMBINE carrying Q8K rows.
  auto req = make_dispatch(12, 1, 2, 256, 1, WireDType::kF32, CombineMode::kPartial, WireDType::kQ8K);
  auto comb = encode_combine(make_combine_for(req)).value();
  ASSERT_TRUE(decode_any(comb, kLim).is_ok());
  put<float>(comb, 24 + 260, -std::numeric_limits<float>::infinity());
  expect_code(reseal(comb), StatusCode::kCorrupt, "non-finite q8k scale at row 1 block 0");
}

TEST(WireMalformed, NonFiniteAcceptedOnlyWhenAllowed) {
  auto b = good_dispatch();
  put<float>(b, 76, std::numeric_limits<float>::quiet_NaN());
  b = reseal(b);
  EXPECT_EQ(decode_any(b, kLim).code(), StatusCode::kCorrupt);
  DecodeLimits lax = kLim;
  lax.allow_non_finite = true;
  auto m = decode_dispatch(parse_frame(b, lax.max_frame_bytes).value(), lax);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  float x[32];
  decode_row(m->hidden, 0, x);
  EXPECT_TRUE(std::isnan(x[0]));
}

TEST(WireMalformed, OtherMessages) {
  DispatchMsg req = make_dispatch(12, 1, 2, 32, 3, WireDType::kF16, CombineMode::kPartial, WireDType::kBF16);
  auto c = encode_combine(make_combine_for(req)).value();
  ASSERT_TRUE(decode_any(c, kLim).is_ok());
  auto b = c;
  put<uint32_t>(b, 12, 3);  // partial with 3 rows for 2 tokens
  expect_code(reseal(b), StatusCode::kCorrupt, "payload is");
  b = c;
  put<uint32_t>(b, 4, 0);
  expect_code(reseal(b), StatusCode::kCorrupt, "n_tokens is 0");
  b = c;
  put<uint8_t>(b, 16, 0);  // exact with 2 rows for 2 tokens is fine; 1 token would not be
  put<uint32_t>(b, 4, 3);
  expect_code(reseal(b), StatusCode::kCorrupt, "impossible");

  Hello h;
  h.role = PeerRole::kWorker;
  h.dtypes = 1;
  h.modes = 1;
  h.name = "w";
  h.experts = {{0, 0, 4}};
  auto hb = encode_hello(h).value();
  ASSERT_TRUE(decode_any(hb, kLim).is_ok());
  b = hb;
  put<uint8_t>(b, 5, 20);
  expect_code(reseal(b), StatusCode::kCorrupt, "model id of 20 bytes");
  b = hb;
  put<uint16_t>(b, 64, 60000);
  expect_code(reseal(b), StatusCode::kCorrupt, "expert ranges");
  b = hb;
  put<uint16_t>(b, 66, 200);
  expect_code(reseal(b), StatusCode::kCorrupt, "left");
  b = hb;
  put<uint8_t>(b, 4, 7);
  expect_code(reseal(b), StatusCode::kCorrupt, "role");
  b = hb;
  put<uint32_t>(b, 76, 0);  // empty range
  expect_code(reseal(b), StatusCode::kCorrupt, "empty expert range");

  auto e = encode_error({.request_id = 3, .code = 4, .text = "boom"}).value();
  b = e;
  put<uint16_t>(b, 2, 50);
  expect_code(reseal(b), StatusCode::kCorrupt, "truncated");
  b = e;
  put<uint16_t>(b, 0, 0);
  expect_code(reseal(b), StatusCode::kCorrupt, "code 0");
  auto p = encode_ping({.request_id = 1, .send_time_ns = 5, .pad_bytes = 8}).value();
  b = p;
  put<uint32_t>(b, 8, 2000000);
  expect_code(reseal(b), StatusCode::kCorrupt, "padding");
  b = p;
  b.back() = 1;
  expect_code(reseal(b), StatusCode::kCorrupt, "nonzero padding");
}

TEST(WireMalformed, FetchFields) {
  const auto good = encode_fetch({.request_id = 21, .layer = 3, .expert = 5}).value();
  ASSERT_TRUE(decode_any(good, kLim).is_ok());
  auto edit = [&](auto fn) {
    auto b = good;
    fn(b);
    return reseal(b);
  };
  expect_code(edit([](auto& b) { put<uint32_t>(b, 0, 8); }), StatusCode::kCorrupt, "FETCH: layer 8 out of range");
  expect_code(edit([](auto& b) { put<uint32_t>(b, 4, 64); }), StatusCode::kCorrupt, "FETCH: expert 64 out of range");
  expect_code(edit([](auto& b) { put<uint32_t>(b, 4, 0xffffffffu); }), StatusCode::kCorrupt, "expert 4294967295");
  expect_code(edit([](auto& b) { b.pop_back(); }), StatusCode::kCorrupt, "FETCH payload is 7 bytes");
  expect_code(edit([](auto& b) { b.push_back(0); }), StatusCode::kCorrupt, "FETCH payload is 9 bytes");
  expect_code(edit([](auto& b) { std::memset(b.data() + 8, 0, 8); }), StatusCode::kCorrupt, "request id 0");
}

// The SLAB of make_slab(31, 2, 7): gate Q8_0 [64 x 3] 204 B, up Q4_K [256 x 2] 288 B, down F32
// [5 x 2] 40 B. Tensor headers at payload offsets 8, 248, 572; each: +0 type, +4 ne0, +12 ne1,
// +20 byte count, +28 hash, +36 bytes.
std::vector<uint8_t> good_slab() {
  return encode_slab(make_slab(31, 2, 7)).value();
}

TEST(WireMalformed, SlabFields) {
  const auto good = good_slab();
  ASSERT_EQ(good.size(), kHeaderBytes + 8 + 3 * 36 + 204 + 288 + 40u);
  ASSERT_TRUE(decode_any(good, kLim).is_ok());
  auto edit = [&](auto fn) {
    auto b = good;
    fn(b);
    return reseal(b);
  };
  // Fixed part and ids.
  expect_code(edit([](auto& b) { b.resize(kHeaderBytes + 6); }), StatusCode::kCorrupt, "fixed part");
  expect_code(edit([](auto& b) { put<uint32_t>(b, 0, 9); }), StatusCode::kCorrupt, "SLAB: layer 9 out of range");
  expect_code(edit([](auto& b) { put<uint32_t>(b, 4, 64); }), StatusCode::kCorrupt, "SLAB: expert 64 out of range");
  expect_code(edit([](auto& b) { std::memset(b.data() + 8, 0, 8); }), StatusCode::kCorrupt, "request id 0");
  // Truncated inside a tensor header, inside the bytes, and trailing junk.
  expect_code(edit([](auto& b) { b.resize(kHeaderBytes + 248 + 30); }), StatusCode::kCorrupt,
              "SLAB up: payload ends inside the tensor header at offset 248");
  expect_code(edit([](auto& b) { b.resize(b.size() - 1); }), StatusCode::kCorrupt,
              "SLAB down: byte count 40 at offset 592 but only 39 bytes follow");
  expect_code(edit([](auto& b) { b.push_back(0); }), StatusCode::kCorrupt, "1 unexpected trailing bytes");
  // Types and shapes.
  expect_code(edit([](auto& b) { put<uint32_t>(b, 248, 99); }), StatusCode::kCorrupt,
              "SLAB up: unknown ggml type 99 at offset 248");
  expect_code(edit([](auto& b) { put<uint32_t>(b, 8, 4); }), StatusCode::kCorrupt, "unknown ggml type 4");
  expect_code(edit([](auto& b) { put<uint64_t>(b, 12, 0); }), StatusCode::kCorrupt, "SLAB gate: ne0 0 at offset 12");
  expect_code(edit([](auto& b) { put<uint64_t>(b, 20, uint64_t{1} << 40); }), StatusCode::kCorrupt,
              "SLAB gate: ne1 1099511627776 at offset 20 outside");
  expect_code(edit([](auto& b) { put<uint64_t>(b, 252, 128); }), StatusCode::kCorrupt,
              "ne0 128 at offset 252 is not a multiple of the Q4_K block of 256");
  // A byte count that disagrees with type x shape: short, long, and absurd (never allocated).
  expect_code(edit([](auto& b) { put<uint64_t>(b, 28, 203); }), StatusCode::kCorrupt,
              "SLAB gate: byte count 203 at offset 28 but Q8_0 [64 x 3] is 204 bytes");
  expect_code(edit([](auto& b) { put<uint64_t>(b, 268, 288 + 144); }), StatusCode::kCorrupt,
              "SLAB up: byte count 432 at offset 268");
  expect_code(edit([](auto& b) { put<uint64_t>(b, 268, ~uint64_t{0}); }), StatusCode::kCorrupt,
              "SLAB up: byte count 18446744073709551615");
  // A shape and byte count that agree but claim more than the frame carries.
  expect_code(edit([](auto& b) {
                put<uint64_t>(b, 260, 1u << 20);
                put<uint64_t>(b, 268, uint64_t{144} << 20);
              }),
              StatusCode::kCorrupt, "SLAB up: byte count 150994944 at offset 268 but only");
  // Bytes that do not match their hash (a flipped byte, a flipped hash).
  expect_code(edit([](auto& b) { b[kHeaderBytes + 248 + 36 + 100] ^= 1; }), StatusCode::kCorrupt,
              "SLAB up: bytes at offset 284 hash to");
  expect_code(edit([](auto& b) { b[kHeaderBytes + 572 + 28] ^= 1; }), StatusCode::kCorrupt,
              "the hash at offset 600 says");
  // Oversized: over the receiver's frame limit, refused from the header before any allocation.
  auto h = parse_header(good, 512);
  ASSERT_FALSE(h.is_ok());
  EXPECT_EQ(h.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(h.status().message().find("SLAB payload of 648 bytes exceeds the limit of 512"), std::string::npos)
      << h.status().message();
}

// STORE carries a SLAB's payload: the same checks, named STORE. STORED: fixed 24 bytes, ids in
// range, replica bytes within the budget.
TEST(WireMalformed, UnstoreAndUnstoredFields) {
  auto edit = [](std::vector<uint8_t> b, auto fn) {
    fn(b);
    return reseal(b);
  };
  const auto un = encode_unstore({.request_id = 41, .layer = 3, .expert = 5}).value();
  EXPECT_EQ(parse_frame(un, kLim.max_frame_bytes).value().type(), MsgType::kUnstore);
  auto q = decode_unstore(parse_frame(un, kLim.max_frame_bytes).value(), kLim);
  ASSERT_TRUE(q.is_ok()) << q.status().to_string();
  EXPECT_EQ(q->layer, 3u);
  EXPECT_EQ(q->expert, 5u);
  expect_code(edit(un, [](auto& b) { put<uint32_t>(b, 0, 8); }), StatusCode::kCorrupt, "UNSTORE: layer 8 out of range");
  expect_code(edit(un, [](auto& b) { put<uint32_t>(b, 4, 64); }), StatusCode::kCorrupt,
              "UNSTORE: expert 64 out of range");
  expect_code(edit(un, [](auto& b) { b.pop_back(); }), StatusCode::kCorrupt, "UNSTORE payload is 7 bytes");
  expect_code(edit(un, [](auto& b) { std::memset(b.data() + 8, 0, 8); }), StatusCode::kCorrupt, "request id 0");
  // A FETCH is not an UNSTORE, though the payloads are alike: the type decides what is asked.
  EXPECT_FALSE(
      decode_unstore(
          parse_frame(encode_fetch({.request_id = 41, .layer = 3, .expert = 5}).value(), kLim.max_frame_bytes).value(),
          kLim)
          .is_ok());

  const auto done =
      encode_unstored({.request_id = 41, .layer = 3, .expert = 5, .replica_bytes = 0, .budget_bytes = 4096}).value();
  ASSERT_EQ(done.size(), kHeaderBytes + 24);
  auto back = decode_unstored(parse_frame(done, kLim.max_frame_bytes).value(), kLim);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_TRUE(check_unstored_matches(*q, *back).is_ok());
  EXPECT_FALSE(check_unstored_matches({.request_id = 41, .layer = 3, .expert = 6}, *back).is_ok());
  EXPECT_FALSE(check_unstored_matches({.request_id = 42, .layer = 3, .expert = 5}, *back).is_ok());
  expect_code(edit(done, [](auto& b) { put<uint64_t>(b, 8, 5000); }), StatusCode::kCorrupt,
              "UNSTORED: replica bytes 5000 at offset 8 over the budget of 4096 at offset 16");
  // A STORED is not an UNSTORED.
  EXPECT_FALSE(
      decode_unstored(
          parse_frame(
              encode_stored({.request_id = 41, .layer = 3, .expert = 5, .replica_bytes = 0, .budget_bytes = 4096})
                  .value(),
              kLim.max_frame_bytes)
              .value(),
          kLim)
          .is_ok());
}

TEST(WireMalformed, StoreAndStoredFields) {
  const auto store = encode_store(make_slab(31, 2, 7)).value();
  ASSERT_TRUE(decode_any(store, kLim).is_ok());
  EXPECT_EQ(parse_frame(store, kLim.max_frame_bytes).value().type(), MsgType::kStore);
  auto edit = [](std::vector<uint8_t> b, auto fn) {
    fn(b);
    return reseal(b);
  };
  expect_code(edit(store, [](auto& b) { put<uint32_t>(b, 0, 9); }), StatusCode::kCorrupt,
              "STORE: layer 9 out of range");
  expect_code(edit(store, [](auto& b) { b[kHeaderBytes + 248 + 36 + 100] ^= 1; }), StatusCode::kCorrupt,
              "STORE up: bytes at offset 284 hash to");
  expect_code(edit(store, [](auto& b) { put<uint64_t>(b, 28, 203); }), StatusCode::kCorrupt,
              "STORE gate: byte count 203 at offset 28 but Q8_0 [64 x 3] is 204 bytes");
  // A SLAB is not a STORE (the type decides what a frame asks for).
  Frame slab = parse_frame(good_slab(), kLim.max_frame_bytes).value();
  EXPECT_FALSE(decode_store(slab, kLim).is_ok());

  const auto stored =
      encode_stored({.request_id = 31, .layer = 2, .expert = 7, .replica_bytes = 532, .budget_bytes = 1 << 20}).value();
  ASSERT_EQ(stored.size(), kHeaderBytes + 24);
  auto back = decode_stored(parse_frame(stored, kLim.max_frame_bytes).value(), kLim);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->replica_bytes, 532u);
  EXPECT_EQ(back->budget_bytes, 1u << 20);
  EXPECT_TRUE(check_stored_matches(make_slab(31, 2, 7), *back).is_ok());
  EXPECT_FALSE(check_stored_matches(make_slab(31, 2, 8), *back).is_ok());
  expect_code(edit(stored, [](auto& b) { b.push_back(0); }), StatusCode::kCorrupt, "STORED payload is 25 bytes");
  expect_code(edit(stored, [](auto& b) { put<uint32_t>(b, 4, 64); }), StatusCode::kCorrupt,
              "STORED: expert 64 out of range");
  expect_code(edit(stored, [](auto& b) { put<uint64_t>(b, 8, uint64_t{1} << 21); }), StatusCode::kCorrupt,
              "STORED: replica bytes 2097152 at offset 8 over the budget of 1048576 at offset 16");
  expect_code(edit(stored, [](auto& b) { std::memset(b.data() + 8, 0, 8); }), StatusCode::kCorrupt, "request id 0");
  EXPECT_FALSE(
      encode_stored({.request_id = 1, .layer = 0, .expert = 0, .replica_bytes = 2, .budget_bytes = 1}).is_ok());
}

// INFO: empty payload, id != 0. INFO_REPLY: 48 bytes, threads >= 1, replicas within the budget
// and within the slabs.
TEST(WireMalformed, InfoAndInfoReplyFields) {
  const auto ask = encode_info_request(7).value();
  ASSERT_EQ(ask.size(), kHeaderBytes);
  ASSERT_TRUE(decode_any(ask, kLim).is_ok());
  EXPECT_FALSE(encode_info_request(0).is_ok());
  auto edit = [](std::vector<uint8_t> b, auto fn) {
    fn(b);
    return reseal(b);
  };
  expect_code(edit(ask, [](auto& b) { b.push_back(1); }), StatusCode::kCorrupt, "INFO payload is 1 bytes");
  const InfoMsg m{.request_id = 7,
                  .threads = 4,
                  .cores = 8,
                  .slab_bytes = 1000,
                  .replica_bytes = 100,
                  .replica_budget_bytes = 500,
                  .rss_bytes = 4096,
                  .uptime_ms = 12,
                  .mem_total_bytes = 8000,
                  .mem_available_bytes = 3000,
                  .offer_bytes = 2000};
  const auto reply = encode_info(m).value();
  ASSERT_EQ(reply.size(), kHeaderBytes + 72);
  auto back = decode_info(parse_frame(reply, kLim.max_frame_bytes).value());
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->threads, 4u);
  EXPECT_EQ(back->cores, 8u);
  EXPECT_EQ(back->slab_bytes, 1000u);
  EXPECT_EQ(back->replica_budget_bytes, 500u);
  EXPECT_EQ(back->uptime_ms, 12u);
  EXPECT_EQ(back->mem_total_bytes, 8000u);
  EXPECT_EQ(back->mem_available_bytes, 3000u);
  EXPECT_EQ(back->offer_bytes, 2000u);
  expect_code(edit(reply, [](auto& b) { b.resize(b.size() - 1); }), StatusCode::kCorrupt,
              "INFO_REPLY payload is 71 bytes (must be 72, or 48 without memory)");
  expect_code(edit(reply, [](auto& b) { b.resize(b.size() - 25); }), StatusCode::kCorrupt,
              "INFO_REPLY payload is 47 bytes");
  // An older worker's 48-byte reply: everything but the memory, which is unknown (0).
  auto v1 =
      decode_info(parse_frame(edit(reply, [](auto& b) { b.resize(b.size() - 24); }), kLim.max_frame_bytes).value());
  ASSERT_TRUE(v1.is_ok()) << v1.status().to_string();
  EXPECT_EQ(v1->slab_bytes, 1000u);
  EXPECT_EQ(v1->uptime_ms, 12u);
  EXPECT_EQ(v1->mem_total_bytes, 0u);
  EXPECT_EQ(v1->offer_bytes, 0u);
  expect_code(edit(reply, [](auto& b) { put<uint64_t>(b, 56, 9000); }), StatusCode::kCorrupt,
              "available memory 9000 over the total of 8000");
  expect_code(edit(reply, [](auto& b) { put<uint32_t>(b, 0, 0); }), StatusCode::kCorrupt, "0 compute threads");
  expect_code(edit(reply, [](auto& b) { put<uint64_t>(b, 16, 600); }), StatusCode::kCorrupt,
              "replica bytes 600 over the budget of 500");
  expect_code(edit(reply, [](auto& b) { put<uint64_t>(b, 8, 50); }), StatusCode::kCorrupt,
              "replica bytes 100 over the slab bytes of 50");
  InfoMsg bad = m;
  bad.threads = 0;
  EXPECT_FALSE(encode_info(bad).is_ok());
}

// PROBE: timeout, count, then per address a u16 length and its bytes; PROBE_REPLY: a count and one
// u32 per address. Every field's damage is named.
TEST(WireMalformed, ProbeAndProbeReplyFields) {
  const ProbeMsg m{.request_id = 5, .timeout_ms = 700, .targets = {"10.1.2.3:7000", "[::1]:9"}};
  const auto probe = encode_probe(m).value();
  ASSERT_EQ(probe.size(), kHeaderBytes + 8 + 2 + 13 + 2 + 7);
  auto back = decode_probe(parse_frame(probe, kLim.max_frame_bytes).value());
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(*back, m);
  auto edit = [](std::vector<uint8_t> b, auto fn) {
    fn(b);
    return reseal(b);
  };
  expect_code(edit(probe, [](auto& b) { put<uint32_t>(b, 0, 0); }), StatusCode::kCorrupt, "timeout 0 ms");
  expect_code(edit(probe, [](auto& b) { put<uint32_t>(b, 0, 60001); }), StatusCode::kCorrupt, "timeout 60001 ms");
  expect_code(edit(probe, [](auto& b) { put<uint32_t>(b, 4, 0); }), StatusCode::kCorrupt, "PROBE: 0 addresses");
  expect_code(edit(probe, [](auto& b) { put<uint32_t>(b, 4, 257); }), StatusCode::kCorrupt, "PROBE: 257 addresses");
  expect_code(edit(probe, [](auto& b) { put<uint32_t>(b, 4, 3); }), StatusCode::kCorrupt,
              "address 2 runs past the payload");
  expect_code(edit(probe, [](auto& b) { put<uint16_t>(b, 8, 200); }), StatusCode::kCorrupt,
              "address 0 runs past the payload");
  expect_code(edit(probe,
                   [](auto& b) {
                     put<uint16_t>(b, 23, 0);  // the second address empty
                     b.resize(b.size() - 7);
                   }),
              StatusCode::kCorrupt, "address 1 is 0 bytes");
  expect_code(edit(probe, [](auto& b) { put<uint8_t>(b, 12, ' '); }), StatusCode::kCorrupt, "address 0 has byte 0x20");
  expect_code(edit(probe, [](auto& b) { b.push_back(0); }), StatusCode::kCorrupt, "1 bytes after the last address");
  EXPECT_FALSE(encode_probe({.request_id = 5, .timeout_ms = 1, .targets = {}}).is_ok());
  EXPECT_FALSE(encode_probe({.request_id = 0, .timeout_ms = 1, .targets = {"a:1"}}).is_ok());

  const ProbeReplyMsg r{.request_id = 5, .rtt_us = {250, kProbeFailed}};
  const auto reply = encode_probe_reply(r).value();
  ASSERT_EQ(reply.size(), kHeaderBytes + 12);
  auto rb = decode_probe_reply(parse_frame(reply, kLim.max_frame_bytes).value());
  ASSERT_TRUE(rb.is_ok()) << rb.status().to_string();
  EXPECT_EQ(*rb, r);
  expect_code(edit(reply, [](auto& b) { put<uint32_t>(b, 0, 3); }), StatusCode::kCorrupt,
              "PROBE_REPLY payload is 12 bytes (must be 16 for 3 figures)");
  expect_code(edit(reply, [](auto& b) { put<uint32_t>(b, 0, 0); }), StatusCode::kCorrupt, "PROBE_REPLY: 0 figures");
  expect_code(edit(reply, [](auto& b) { b.resize(b.size() - 1); }), StatusCode::kCorrupt,
              "payload is 11 bytes (must be 12");
}

TEST(WireMalformed, SpanHoldAndSpanHeldFields) {
  auto edit = [](std::vector<uint8_t> b, auto fn) {
    fn(b);
    return reseal(b);
  };
  const SpanHoldMsg m{.request_id = 7, .op = SpanHoldOp::kLoad, .first = 3, .last = 11};
  const auto hold = encode_span_hold(m).value();
  ASSERT_EQ(hold.size(), kHeaderBytes + 9);
  auto back = decode_span_hold(parse_frame(hold, kLim.max_frame_bytes).value());
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(*back, m);
  expect_code(edit(hold, [](auto& b) { put<uint8_t>(b, 0, 3); }), StatusCode::kCorrupt, "SPAN_HOLD: unknown op 3");
  expect_code(edit(hold, [](auto& b) { put<uint32_t>(b, 1, 12); }), StatusCode::kCorrupt,
              "blocks 12-11 end before they start");
  expect_code(edit(hold, [](auto& b) { put<uint8_t>(b, 0, 0); }), StatusCode::kCorrupt,
              "a list names no blocks (got 3-11)");
  expect_code(edit(hold, [](auto& b) { b.push_back(0); }), StatusCode::kCorrupt, "SPAN_HOLD payload is 10 bytes");
  expect_code(edit(hold, [](auto& b) { b.resize(b.size() - 1); }), StatusCode::kCorrupt, "payload is 8 bytes");
  EXPECT_FALSE(encode_span_hold({.request_id = 0, .op = SpanHoldOp::kList}).is_ok());
  EXPECT_FALSE(encode_span_hold({.request_id = 1, .op = SpanHoldOp::kDrop, .first = 5, .last = 4}).is_ok());
  EXPECT_TRUE(encode_span_hold({.request_id = 1, .op = SpanHoldOp::kList}).is_ok());

  // 0-2 ready, 0-5 loading beside it (overlapping spans are listed by first, then last block), 6-7
  // failed with its reason.
  const SpanHeldMsg h{.request_id = 7,
                      .spans = {{0, 2, SpanHeldState::kReady, ""},
                                {0, 5, SpanHeldState::kLoading, ""},
                                {6, 7, SpanHeldState::kFailed, "no space"}}};
  const auto held = encode_span_held(h).value();
  ASSERT_EQ(held.size(), kHeaderBytes + 4 + 3 * 11 + 8);
  auto hb = decode_span_held(parse_frame(held, kLim.max_frame_bytes).value());
  ASSERT_TRUE(hb.is_ok()) << hb.status().to_string();
  EXPECT_EQ(*hb, h);
  expect_code(edit(held, [](auto& b) { put<uint32_t>(b, 0, 1025); }), StatusCode::kCorrupt,
              "1025 spans (at most 1024)");
  expect_code(edit(held, [](auto& b) { put<uint32_t>(b, 0, 4); }), StatusCode::kCorrupt,
              "span 3 runs past the payload");
  expect_code(edit(held, [](auto& b) { put<uint32_t>(b, 0, 2); }), StatusCode::kCorrupt,
              "19 bytes after the last span");
  expect_code(edit(held, [](auto& b) { put<uint32_t>(b, 4, 3); }), StatusCode::kCorrupt,
              "span 0 is blocks 3-2: ends before it starts");
  expect_code(edit(held, [](auto& b) { put<uint8_t>(b, 12, 9); }), StatusCode::kCorrupt, "span 0 has unknown state 9");
  expect_code(edit(held, [](auto& b) { put<uint32_t>(b, 19, 2); }), StatusCode::kCorrupt,
              "span 1 (blocks 0-2) is not after span 0 (0-2) in block order");
  expect_code(edit(held, [](auto& b) { put<uint8_t>(b, 34, 0); }), StatusCode::kCorrupt,
              "span 2 is not failed but carries an error");
  expect_code(edit(held, [](auto& b) { put<uint16_t>(b, 35, 9); }), StatusCode::kCorrupt,
              "span 2 runs past the payload");
  SpanHeldMsg unordered = h;
  std::swap(unordered.spans[0], unordered.spans[2]);
  EXPECT_FALSE(encode_span_held(unordered).is_ok());
  SpanHeldMsg empty{.request_id = 2, .spans = {}};
  EXPECT_TRUE(encode_span_held(empty).is_ok());  // a peer that let go of everything
}

// Two sequences of 2 new rows each: seq 4 starts fresh, seq 9 after the 5 cells its chain names.
// n_embd 8, f16 rows. Layout: fixed 24, sequences at 24 and 64 (40 each), positions at 104, cut
// flags at 136, rows at 140.
SpanStepMsg good_span_step_msg() {
  SpanStepMsg m;
  m.request_id = 41;
  m.first = 2;
  m.last = 5;
  m.return_dtype = WireDType::kBF16;
  SpanSeq a{.seq = 4, .n_replay = 0, .n_new = 2, .start = 0};
  SpanSeq b{.seq = 9, .n_replay = 0, .n_new = 2, .start = 5};
  b.chain.fill(0xab);
  m.seqs = {a, b};
  m.pos = {0, 1, 5, 6};
  m.cut = {0, 1, 0, 1};
  std::vector<float> rows(4 * 8);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = 0.25f * static_cast<float>(i) - 3.0f;
  m.hidden = encode_rows(WireDType::kF16, rows.data(), 4, 8).value();
  return m;
}

// SPAN_STEP / SPAN_RESULT: round trips and every field check, naming the field.
TEST(WireMalformed, SpanStepAndResultFields) {
  const SpanStepMsg m = good_span_step_msg();
  const auto step = encode_span_step(m).value();
  ASSERT_EQ(step.size(), kHeaderBytes + 24 + 2 * 40 + 4 * 8 + 4 + 4 * 16);
  auto back = decode_span_step(parse_frame(step, kLim.max_frame_bytes).value(), kLim);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->first, 2u);
  EXPECT_EQ(back->last, 5u);
  EXPECT_EQ(back->return_dtype, WireDType::kBF16);
  EXPECT_EQ(back->seqs, m.seqs);
  EXPECT_EQ(back->pos, m.pos);
  EXPECT_EQ(back->cut, m.cut);
  EXPECT_EQ(back->hidden.bytes, m.hidden.bytes);
  EXPECT_EQ(reencode(step, kLim), step);
  auto edit = [](std::vector<uint8_t> b, auto fn) {
    fn(b);
    return reseal(b);
  };
  expect_code(edit(step, [](auto& b) { put<uint32_t>(b, 4, 8); }), StatusCode::kCorrupt,
              "SPAN_STEP: block 8 out of range (model has 8)");
  expect_code(edit(step, [](auto& b) { put<uint32_t>(b, 0, 6); }), StatusCode::kCorrupt, "blocks 6-5 are backwards");
  expect_code(edit(step, [](auto& b) { put<uint32_t>(b, 8, 0); }), StatusCode::kCorrupt, "0 sequences");
  expect_code(edit(step, [](auto& b) { put<uint32_t>(b, 16, 9000); }), StatusCode::kCorrupt, "n_embd 9000");
  expect_code(edit(step, [](auto& b) { b.push_back(0); }), StatusCode::kCorrupt, "SPAN_STEP payload is");
  expect_code(edit(step, [](auto& b) { put<uint16_t>(b, 22, 2); }), StatusCode::kCorrupt, "reserved flag bits 0x2");
  // The chained flag with no chain section after the rows.
  expect_code(edit(step, [](auto& b) { put<uint16_t>(b, 22, 1); }), StatusCode::kCorrupt,
              "chain section ends inside its fixed part");
  // Sequence fields: a duplicate id, no new rows, a chain that is zero with start > 0.
  expect_code(edit(step, [](auto& b) { put<uint32_t>(b, 64, 4); }), StatusCode::kCorrupt, "sequence 4 listed twice");
  expect_code(edit(step, [](auto& b) { put<uint32_t>(b, 32, 0); }), StatusCode::kCorrupt, "sequence 4 has no new rows");
  expect_code(edit(step, [](auto& b) { std::memset(b.data() + kHeaderBytes + 64 + 24, 0, 16); }), StatusCode::kCorrupt,
              "sequence 9: the chain is zero exactly when start is 0");
  expect_code(edit(step, [](auto& b) { put<uint32_t>(b, 36, 1); }), StatusCode::kCorrupt,
              "nonzero reserved field of sequence 4");
  expect_code(edit(step, [](auto& b) { put<uint32_t>(b, 32, 3); }), StatusCode::kCorrupt,
              "sequences claim more than the 4 rows");
  expect_code(edit(step, [](auto& b) { put<uint32_t>(b, 32, 1); }), StatusCode::kCorrupt,
              "sequences cover 3 of 4 rows");
  // Rows: positions, cut flags, padding.
  expect_code(edit(step, [](auto& b) { put<uint64_t>(b, 104 + 8, 0); }), StatusCode::kCorrupt,
              "row 1 of sequence 4: position 0 not increasing");
  expect_code(edit(step, [](auto& b) { b[kHeaderBytes + 136 + 1] = 2; }), StatusCode::kCorrupt,
              "cut flag of row 1 is 2");
  expect_code(edit(step, [](auto& b) { put<uint32_t>(b, 12, 5); }), StatusCode::kCorrupt, "SPAN_STEP payload is");
  SpanStepMsg bad = m;
  bad.request_id = 0;
  EXPECT_FALSE(encode_span_step(bad).is_ok());
  bad = m;
  bad.cut.pop_back();
  EXPECT_FALSE(encode_span_step(bad).is_ok());
  bad = m;
  std::vector<float> inf(4 * 8, std::numeric_limits<float>::infinity());
  bad.hidden = encode_rows(WireDType::kF32, inf.data(), 4, 8).value();
  const auto inf_step = encode_span_step(bad).value();        // the encoder lets a caller send them ...
  expect_code(inf_step, StatusCode::kCorrupt, "SPAN_STEP:");  // ... the receiver refuses them

  // SPAN_RESULT: rows, or the missing inputs (never both).
  SpanResultMsg r;
  r.request_id = 41;
  r.compute_us = 1234;
  std::vector<float> out(4 * 8, 0.5f);
  r.rows = encode_rows(WireDType::kBF16, out.data(), 4, 8).value();
  const auto res = encode_span_result(r).value();
  ASSERT_EQ(res.size(), kHeaderBytes + 20 + 4 * 16);
  auto rb = decode_span_result(parse_frame(res, kLim.max_frame_bytes).value(), kLim);
  ASSERT_TRUE(rb.is_ok()) << rb.status().to_string();
  EXPECT_EQ(rb->compute_us, 1234u);
  EXPECT_EQ(rb->rows.bytes, r.rows.bytes);
  EXPECT_TRUE(rb->need.empty());
  EXPECT_EQ(reencode(res, kLim), res);
  SpanResultMsg need;
  need.request_id = 42;
  need.need = {{9, 3}, {4, 0}};
  const auto nres = encode_span_result(need).value();
  ASSERT_EQ(nres.size(), kHeaderBytes + 20 + 2 * 16);
  auto nb = decode_span_result(parse_frame(nres, kLim.max_frame_bytes).value(), kLim);
  ASSERT_TRUE(nb.is_ok()) << nb.status().to_string();
  EXPECT_EQ(nb->need, need.need);
  EXPECT_EQ(reencode(nres, kLim), nres);
  expect_code(edit(nres, [](auto& b) { put<uint32_t>(b, 20 + 16, 9); }), StatusCode::kCorrupt,
              "sequence 9 listed twice");
  expect_code(edit(nres, [](auto& b) { put<uint32_t>(b, 0, 0); }), StatusCode::kCorrupt, "SPAN_RESULT payload is");
  expect_code(edit(res, [](auto& b) { put<uint8_t>(b, 12, 7); }), StatusCode::kCorrupt, "unknown wire dtype 7");
  expect_code(edit(res, [](auto& b) { put<uint8_t>(b, 13, 1); }), StatusCode::kCorrupt, "nonzero reserved bytes");
  SpanResultMsg empty;
  empty.request_id = 5;
  EXPECT_FALSE(encode_span_result(empty).is_ok());  // neither rows nor missing inputs
  SpanResultMsg both = r;
  both.need = {{1, 0}};
  EXPECT_FALSE(encode_span_result(both).is_ok());
}

// A chained SPAN_STEP (good_span_step_msg plus two hops) and SPAN_AWAIT: round trips and every
// field check of the chain section, naming the field.
SpanStepMsg good_chained_step_msg() {
  SpanStepMsg m = good_span_step_msg();  // blocks 2-5, sequences 4 (start 0) and 9 (start 5)
  m.chain_id = 77;
  m.hop_dtype = WireDType::kF16;
  SpanHop a{.address = "10.0.0.3:7070", .first = 6, .last = 6, .start = {0, 5}, .chain = {}};
  a.chain.resize(2);
  a.chain[1].fill(0x11);
  SpanHop b{.address = "peer-b:7071", .first = 7, .last = 7, .start = {0, 5}, .chain = a.chain};
  m.next = {a, b};
  return m;
}

TEST(WireMalformed, SpanChainAndAwaitFields) {
  const SpanStepMsg m = good_chained_step_msg();
  const auto step = encode_span_step(m).value();
  // The plain step's bytes, then 12 bytes (id, dtype, origin length, hops), no origin, and per hop
  // 12 + the address padded to 4 + 2 x 24.
  const size_t base = kHeaderBytes + 24 + 2 * 40 + 4 * 8 + 4 + 4 * 16;
  ASSERT_EQ(step.size(), base + 12 + (12 + 16 + 48) + (12 + 12 + 48));
  auto back = decode_span_step(parse_frame(step, kLim.max_frame_bytes).value(), kLim);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->chain_id, 77u);
  EXPECT_EQ(back->hop_dtype, WireDType::kF16);
  EXPECT_TRUE(back->origin.empty());
  EXPECT_EQ(back->next, m.next);
  EXPECT_EQ(back->hidden.bytes, m.hidden.bytes);
  EXPECT_EQ(reencode(step, kLim), step);
  // A forwarded step: an origin, no replays.
  SpanStepMsg fwd = m;
  fwd.origin = "backbone-1";
  fwd.next.pop_back();
  const auto fstep = encode_span_step(fwd).value();
  auto fb = decode_span_step(parse_frame(fstep, kLim.max_frame_bytes).value(), kLim);
  ASSERT_TRUE(fb.is_ok()) << fb.status().to_string();
  EXPECT_EQ(fb->origin, "backbone-1");
  EXPECT_EQ(reencode(fstep, kLim), fstep);

  auto edit = [](std::vector<uint8_t> b, auto fn) {
    fn(b);
    return reseal(b);
  };
  const size_t ext = base - kHeaderBytes;  // payload offset of the chain section
  expect_code(edit(step, [&](auto& b) { put<uint64_t>(b, ext, 0); }), StatusCode::kCorrupt, "chain id 0");
  expect_code(edit(step, [&](auto& b) { put<uint8_t>(b, ext + 8, 9); }), StatusCode::kCorrupt, "unknown hop dtype 9");
  expect_code(edit(step, [&](auto& b) { put<uint8_t>(b, ext + 8, 3); }), StatusCode::kCorrupt,
              "hop dtype 3 is not f32, f16 or bf16");
  expect_code(edit(step, [&](auto& b) { put<uint16_t>(b, ext + 10, 65); }), StatusCode::kCorrupt,
              "65 next hops over 64");
  expect_code(edit(step, [&](auto& b) { put<uint16_t>(b, ext + 10, 3); }), StatusCode::kCorrupt,
              "chain section ends inside the hops");
  expect_code(edit(step, [&](auto& b) { put<uint16_t>(b, ext + 10, 1); }), StatusCode::kCorrupt,
              "bytes after the chain section");
  expect_code(edit(step, [&](auto& b) { put<uint32_t>(b, ext + 12, 7); }), StatusCode::kCorrupt,
              "hop 0 blocks 7-6 do not follow block 5");
  expect_code(edit(step, [&](auto& b) { put<uint16_t>(b, ext + 12 + 10, 1); }), StatusCode::kCorrupt,
              "nonzero reserved field of a hop");
  // Hop 0's second sequence: start 5 with a zero chain.
  expect_code(edit(step, [&](auto& b) { std::memset(b.data() + kHeaderBytes + ext + 12 + 28 + 24 + 8, 0, 16); }),
              StatusCode::kCorrupt, "hop 0 sequence 9: the chain is zero exactly when start is 0");
  expect_code(edit(step, [&](auto& b) { put<uint32_t>(b, ext + 12 + 76 + 4, 8); }), StatusCode::kCorrupt,
              "hop 1 block 8 out of range");
  // Encoder-side rules.
  SpanStepMsg bad = m;
  bad.next.clear();
  EXPECT_FALSE(encode_span_step(bad).is_ok());  // chained, no hop, no origin
  bad = m;
  bad.chain_id = 0;
  EXPECT_FALSE(encode_span_step(bad).is_ok());  // hops without a chain id
  bad = fwd;
  bad.seqs[1].n_replay = 1;
  bad.seqs[1].n_new = 1;
  EXPECT_FALSE(encode_span_step(bad).is_ok());  // a forwarded step never replays
  bad = m;
  bad.next[0].address.clear();
  auto no_addr = encode_span_step(bad);
  ASSERT_FALSE(no_addr.is_ok());
  EXPECT_NE(no_addr.status().message().find("hop 0 address of 0 bytes"), std::string::npos);
  bad = m;
  bad.next[0].start.pop_back();
  EXPECT_FALSE(encode_span_step(bad).is_ok());
  bad = m;
  bad.origin.assign(300, 'x');
  EXPECT_FALSE(encode_span_step(bad).is_ok());

  // SPAN_RESULT's forward error.
  SpanResultMsg r;
  r.request_id = 41;
  std::vector<float> out(4 * 8, 0.5f);
  r.rows = encode_rows(WireDType::kF32, out.data(), 4, 8).value();
  r.forward_error = "10.0.0.3:7070: connection refused";
  const auto res = encode_span_result(r).value();
  ASSERT_EQ(res.size(), kHeaderBytes + 20 + 4 * 32 + r.forward_error.size());
  auto rb = decode_span_result(parse_frame(res, kLim.max_frame_bytes).value(), kLim);
  ASSERT_TRUE(rb.is_ok()) << rb.status().to_string();
  EXPECT_EQ(rb->forward_error, r.forward_error);
  EXPECT_EQ(rb->rows.bytes, r.rows.bytes);
  EXPECT_EQ(reencode(res, kLim), res);
  expect_code(edit(res, [](auto& b) { put<uint16_t>(b, 14, 2000); }), StatusCode::kCorrupt,
              "forward error of 2000 bytes over 1024");
  expect_code(edit(res, [](auto& b) { put<uint16_t>(b, 14, 3); }), StatusCode::kCorrupt, "SPAN_RESULT payload is");

  // SPAN_AWAIT.
  const SpanAwaitMsg aw{.request_id = 9, .chain_id = 77, .first = 6, .last = 6, .timeout_ms = 30000};
  const auto awb = encode_span_await(aw).value();
  ASSERT_EQ(awb.size(), kHeaderBytes + 24);
  auto ab = decode_span_await(parse_frame(awb, kLim.max_frame_bytes).value(), kLim);
  ASSERT_TRUE(ab.is_ok()) << ab.status().to_string();
  EXPECT_EQ(*ab, aw);
  EXPECT_EQ(reencode(awb, kLim), awb);
  expect_code(edit(awb, [](auto& b) { put<uint64_t>(b, 0, 0); }), StatusCode::kCorrupt, "SPAN_AWAIT: chain id 0");
  expect_code(edit(awb, [](auto& b) { put<uint32_t>(b, 12, 8); }), StatusCode::kCorrupt, "block 8 out of range");
  expect_code(edit(awb, [](auto& b) { put<uint32_t>(b, 8, 7); }), StatusCode::kCorrupt, "blocks 7-6 are backwards");
  expect_code(edit(awb, [](auto& b) { put<uint32_t>(b, 16, 0); }), StatusCode::kCorrupt, "timeout 0 ms");
  expect_code(edit(awb, [](auto& b) { put<uint32_t>(b, 20, 1); }), StatusCode::kCorrupt, "reserved field is 1");
  expect_code(edit(awb, [](auto& b) { b.push_back(0); }), StatusCode::kCorrupt, "SPAN_AWAIT payload is 25 bytes");
  SpanAwaitMsg bad_aw = aw;
  bad_aw.request_id = 0;
  EXPECT_FALSE(encode_span_await(bad_aw).is_ok());
}

// Mutations: bit flips, byte overwrites, truncation, extension, header field edits; half of
// them resealed so they get past the checksum to the field checks.
TEST(WireMalformed, FuzzTenThousandMutatedFrames) {
  std::vector<std::vector<uint8_t>> seeds;
  for (uint8_t d = 0; d < 4; ++d) {
    auto req = make_dispatch(100 + d, d, 1 + d, 64, 1 + d, static_cast<WireDType>(d), static_cast<CombineMode>(d % 2),
                             static_cast<WireDType>(3 - d));
    seeds.push_back(encode_dispatch(req).value());
    seeds.push_back(encode_combine(make_combine_for(req)).value());
  }
  Hello h;
  h.role = PeerRole::kWorker;
  h.dtypes = 0xf;
  h.modes = 3;
  h.n_layer = 8;
  h.n_expert = 64;
  h.name = "fuzz";
  h.experts = {{1, 0, 8}, {2, 8, 8}};
  h.features = kFeatureFetch;
  seeds.push_back(encode_hello(h).value());
  seeds.push_back(encode_ping({.request_id = 9, .send_time_ns = 1, .pad_bytes = 16, .reply_pad_bytes = 4}).value());
  seeds.push_back(encode_pong({.request_id = 9, .ping_time_ns = 1, .reply_time_ns = 2, .pad_bytes = 8}).value());
  seeds.push_back(encode_goodbye({.reason = 0, .text = "bye"}).value());
  seeds.push_back(encode_error({.request_id = 4, .code = 2, .text = "nope"}).value());
  seeds.push_back(encode_fetch({.request_id = 6, .layer = 3, .expert = 9}).value());
  seeds.push_back(good_slab());
  seeds.push_back(encode_store(make_slab(32, 1, 3)).value());
  seeds.push_back(
      encode_stored({.request_id = 32, .layer = 1, .expert = 3, .replica_bytes = 9, .budget_bytes = 99}).value());
  seeds.push_back(encode_info_request(33).value());
  seeds.push_back(encode_info({.request_id = 33, .threads = 2, .slab_bytes = 9, .replica_budget_bytes = 1}).value());
  seeds.push_back(encode_span_step(good_span_step_msg()).value());
  seeds.push_back(encode_span_step(good_chained_step_msg()).value());
  seeds.push_back(encode_span_await({.request_id = 35, .chain_id = 3, .first = 1, .last = 2, .timeout_ms = 9}).value());
  seeds.push_back(encode_probe({.request_id = 36, .timeout_ms = 500, .targets = {"10.0.0.2:7000", "[::1]:9"}}).value());
  seeds.push_back(encode_probe_reply({.request_id = 36, .rtt_us = {1200, kProbeFailed}}).value());
  {
    SpanResultMsg need;
    need.request_id = 34;
    need.need = {{2, 7}};
    seeds.push_back(encode_span_result(need).value());
  }
  for (const auto& s : seeds) ASSERT_TRUE(decode_any(s, kLim).is_ok());

  std::mt19937_64 rng(20240611);
  int rejected = 0, accepted = 0, unsealed_rejected = 0, unsealed = 0;
  for (int iter = 0; iter < 10000; ++iter) {
    const std::vector<uint8_t>& original = seeds[rng() % seeds.size()];
    std::vector<uint8_t> b = original;
    const bool do_reseal = iter % 2 == 0;
    const int op = static_cast<int>(rng() % 6);
    std::uniform_int_distribution<size_t> any(0, b.size() - 1);
    switch (op) {
      case 0:  // 1..4 random bit flips
        for (int k = 0, n = 1 + rng() % 4; k < n; ++k) b[any(rng)] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 1:  // overwrite a byte in the first 96 (header + fixed fields) with a random value
        b[std::min<size_t>(rng() % 96, b.size() - 1)] = static_cast<uint8_t>(rng());
        break;
      case 2:  // truncate
        b.resize(rng() % b.size());
        break;
      case 3:  // extend with junk
        for (int k = 0, n = 1 + rng() % 16; k < n; ++k) b.push_back(static_cast<uint8_t>(rng()));
        break;
      case 4: {  // a random u32 written over a payload count/offset field
        const size_t at = kHeaderBytes + 4 * (rng() % 8);
        if (at + 4 <= b.size()) {
          const uint32_t v = rng() % 3 == 0 ? static_cast<uint32_t>(rng()) : static_cast<uint32_t>(rng() % 70);
          std::memcpy(b.data() + at, &v, 4);
        }
        break;
      }
      case 5: {  // a wrong type or version in the header
        const uint16_t v = static_cast<uint16_t>(rng() % 10);
        std::memcpy(b.data() + (rng() % 2 ? 4 : 6), &v, 2);
        break;
      }
    }
    // A reseal needs a whole header, and the payload-length field must describe the new size.
    if (do_reseal && b.size() >= kHeaderBytes) {
      const uint32_t len = static_cast<uint32_t>(b.size() - kHeaderBytes);
      std::memcpy(b.data() + 16, &len, 4);
      uint16_t type;
      std::memcpy(&type, b.data() + 6, 2);
      if (msg_type_is_known(type)) b = reseal(b);
    }
    Status st = decode_any(b, kLim);
    if (st.is_ok()) {
      ++accepted;
      // Anything accepted is exactly the canonical encoding of the message it decodes to; an
      // older worker's 48-byte INFO_REPLY is the 72-byte one's first 48 bytes, memory unknown.
      const Frame f = parse_frame(b, kLim.max_frame_bytes).value();
      if (f.type() == MsgType::kHello && f.header.version == kVersion) {
        // Unknown feature bits are ignored: the re-encoding clears them and is a fixed point.
        const std::vector<uint8_t> again = reencode(b, kLim);
        ASSERT_EQ(again.size(), b.size()) << "iteration " << iter;
        ASSERT_EQ(reencode(again, kLim), again) << "iteration " << iter;
      } else if (f.type() == MsgType::kInfoReply && f.payload.size() == 48) {
        const std::vector<uint8_t> again = reencode(b, kLim);
        ASSERT_EQ(again.size(), b.size() + 24) << "iteration " << iter;
        EXPECT_TRUE(std::equal(b.begin() + kHeaderBytes, b.end(), again.begin() + kHeaderBytes));
        EXPECT_TRUE(std::all_of(again.end() - 24, again.end(), [](uint8_t v) { return v == 0; }));
      } else {
        ASSERT_EQ(reencode(b, kLim), b) << "iteration " << iter;
      }
    } else {
      ++rejected;
      ASSERT_FALSE(st.message().empty());
    }
    if (!do_reseal && b != original) {
      ++unsealed;
      unsealed_rejected += !st.is_ok();
    }
  }
  // Damage that was not resealed never gets through: the checksum or the length catches it.
  EXPECT_EQ(unsealed_rejected, unsealed);
  EXPECT_GT(rejected, 5000);
  EXPECT_GT(accepted, 100);  // resealed flips inside row data are valid messages
  std::printf("fuzz: %d rejected, %d accepted (canonical), %d/%d unsealed rejected\n", rejected, accepted,
              unsealed_rejected, unsealed);
}

}  // namespace
}  // namespace moesh::wire
