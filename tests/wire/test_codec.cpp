// Encode -> parse_frame -> decode round trips for every message type, dtype and combine mode.
#include <gtest/gtest.h>

#include <cstring>

#include "moesh/wire/wire.h"
#include "wire/wire_test_util.h"

namespace moesh::wire {
namespace {

using testing::make_combine_for;
using testing::make_dispatch;
using testing::make_slab;

Frame reparse(const std::vector<uint8_t>& bytes) {
  auto f = parse_frame(bytes, kDefaultMaxFrameBytes);
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  return f.is_ok() ? std::move(f).value() : Frame{};
}

TEST(WireCodec, HeaderLayoutIsLittleEndianAndFrozen) {
  const uint8_t payload[3] = {1, 2, 3};
  auto bytes = build_frame(MsgType::kPing, 0x0102030405060708ull, payload);
  ASSERT_EQ(bytes.size(), kHeaderBytes + 3);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), 4), "MOSH");
  EXPECT_EQ(bytes[4], kVersion);
  EXPECT_EQ(bytes[5], 0);
  EXPECT_EQ(bytes[6], static_cast<uint8_t>(MsgType::kPing));
  EXPECT_EQ(bytes[8], 0x08);
  EXPECT_EQ(bytes[15], 0x01);
  EXPECT_EQ(bytes[16], 3);
  for (int i = 20; i < 24; ++i) EXPECT_EQ(bytes[i], 0);
  Frame f = reparse(bytes);
  EXPECT_EQ(f.request_id(), 0x0102030405060708ull);
  EXPECT_EQ(f.payload, std::vector<uint8_t>(payload, payload + 3));
}

TEST(WireCodec, DispatchRoundTripsEveryDtypeAndMode) {
  for (uint8_t d = 0; d < static_cast<uint8_t>(WireDType::kCOUNT); ++d)
    for (uint8_t mo = 0; mo < static_cast<uint8_t>(CombineMode::kCOUNT); ++mo)
      for (uint32_t n_tokens : {1u, 5u}) {
        const auto dtype = static_cast<WireDType>(d);
        const auto mode = static_cast<CombineMode>(mo);
        DispatchMsg m = make_dispatch(40 + d * 7 + mo, 3, n_tokens, 96, 1 + n_tokens % 4, dtype, mode,
                                      static_cast<WireDType>((d + 1) % 4));
        auto bytes = encode_dispatch(m);
        ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
        EXPECT_EQ(bytes->size(), kHeaderBytes + dispatch_payload_bytes(n_tokens, m.pairs.size(), 96, dtype));
        Frame f = reparse(*bytes);
        EXPECT_EQ(f.type(), MsgType::kDispatch);
        auto got = decode_dispatch(f, DecodeLimits{.n_expert = 64, .n_layer = 8});
        ASSERT_TRUE(got.is_ok()) << got.status().to_string();
        EXPECT_EQ(got->request_id, m.request_id);
        EXPECT_EQ(got->layer, 3u);
        EXPECT_EQ(got->deadline_ms, 250u);
        EXPECT_EQ(got->mode, mode);
        EXPECT_EQ(got->return_dtype, m.return_dtype);
        EXPECT_EQ(got->pair_counts, m.pair_counts);
        EXPECT_EQ(got->pairs, m.pairs);
        EXPECT_EQ(got->hidden.dtype, dtype);
        EXPECT_EQ(got->n_tokens(), n_tokens);
        EXPECT_EQ(got->n_embd(), 96u);
        EXPECT_EQ(got->hidden.bytes, m.hidden.bytes);
        // The rows still carry their tags: token t of request r decodes near tagged_value(r, t, c).
        std::vector<float> x(size_t{n_tokens} * 96);
        decode_rows(got->hidden, x.data());
        for (uint32_t t = 0; t < n_tokens; ++t)
          for (uint32_t c = 0; c < 96; c += 17)
            ASSERT_NEAR(x[t * 96 + c], testing::tagged_value(m.request_id, t, c), 1.0f) << t << " " << c;
        // Re-encoding the decoded message gives the same bytes (canonical encoding).
        EXPECT_EQ(encode_dispatch(*got).value(), *bytes);
      }
}

TEST(WireCodec, CombineRoundTripsAndMatchesItsRequest) {
  for (uint8_t d = 0; d < static_cast<uint8_t>(WireDType::kCOUNT); ++d)
    for (uint8_t mo = 0; mo < static_cast<uint8_t>(CombineMode::kCOUNT); ++mo) {
      const auto dtype = static_cast<WireDType>(d);
      DispatchMsg req =
          make_dispatch(900 + d * 2 + mo, 1, 4, 64, 3, WireDType::kF32, static_cast<CombineMode>(mo), dtype);
      CombineMsg c = make_combine_for(req);
      ASSERT_EQ(c.rows.n_rows, mo == 0 ? 12u : 4u);
      auto bytes = encode_combine(c);
      ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
      EXPECT_EQ(bytes->size(), kHeaderBytes + combine_payload_bytes(c.rows.n_rows, 64, dtype));
      auto got = decode_combine(reparse(*bytes), DecodeLimits{});
      ASSERT_TRUE(got.is_ok()) << got.status().to_string();
      EXPECT_EQ(got->request_id, req.request_id);
      EXPECT_EQ(got->compute_us, 1234u);
      EXPECT_EQ(got->rows.bytes, c.rows.bytes);
      EXPECT_TRUE(check_combine_matches(req, *got).is_ok());
      // A reply for a different request, layer or shape is refused.
      CombineMsg wrong = *got;
      wrong.layer = 2;
      EXPECT_EQ(check_combine_matches(req, wrong).code(), StatusCode::kCorrupt);
      wrong = *got;
      wrong.rows.n_rows -= 1;
      EXPECT_EQ(check_combine_matches(req, wrong).code(), StatusCode::kCorrupt);
    }
}

Hello sample_hello(PeerRole role, uint8_t id_bytes) {
  Hello h;
  h.role = role;
  h.model_id_bytes = id_bytes;
  for (uint8_t i = 0; i < id_bytes; ++i) h.model_id[i] = static_cast<uint8_t>(0xA0 + i * 3);
  h.n_layer = 48;
  h.n_expert = 128;
  h.n_embd = 2048;
  h.dtypes = 0xF;
  h.modes = 0x3;
  h.max_frame_bytes = 1u << 24;
  if (role == PeerRole::kWorker) h.experts = {{0, 0, 64}, {1, 64, 64}, {47, 5, 1}};
  h.name = role == PeerRole::kWorker ? "worker-α" : "backbone";
  return h;
}

TEST(WireCodec, HelloRoundTripsAndNegotiates) {
  for (uint8_t id_bytes : {16, 32}) {
    Hello w = sample_hello(PeerRole::kWorker, id_bytes);
    auto got = decode_hello(reparse(encode_hello(w).value()));
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_EQ(got->model_id, w.model_id);
    EXPECT_EQ(got->model_id_bytes, id_bytes);
    EXPECT_EQ(got->experts, w.experts);
    EXPECT_EQ(got->name, w.name);
    EXPECT_EQ(got->max_frame_bytes, 1u << 24);
    Hello b = sample_hello(PeerRole::kBackbone, id_bytes);
    b.dtypes = 0x5;  // f32 + bf16
    auto s = negotiate(b, *got);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    EXPECT_EQ(s->version, kVersion);
    EXPECT_EQ(s->dtypes, 0x5u);
    EXPECT_EQ(s->modes, 0x3u);
    EXPECT_EQ(s->peer.experts.size(), 3u);
    // Different model identity, different shape, no common version, no common dtype.
    Hello other = *got;
    other.model_id[id_bytes - 1] ^= 1;
    EXPECT_EQ(negotiate(b, other).status().code(), StatusCode::kInvalidArgument);
    other = *got;
    other.n_expert = 64;
    EXPECT_EQ(negotiate(b, other).status().code(), StatusCode::kInvalidArgument);
    other = *got;
    other.min_version = kVersion + 1;
    other.max_version = kVersion + 2;
    EXPECT_EQ(negotiate(b, other).status().code(), StatusCode::kUnsupported);
    other = *got;
    other.dtypes = 0x2;
    EXPECT_EQ(negotiate(b, other).status().code(), StatusCode::kUnsupported);
  }
}

TEST(WireCodec, NewerHelloIsReadableThroughItsFrozenPrefix) {
  // A newer peer may append HELLO fields and offer capabilities we do not know; we still read
  // it (its unknown bits dropped) and talk our version when its range includes it.
  Hello w = sample_hello(PeerRole::kWorker, 32);
  w.max_version = kVersion + 1;
  w.layer_act.assign(w.n_layer, kNoActDType);
  w.features = kFeatureFetch;
  auto bytes = encode_hello(w).value();
  Frame f = reparse(bytes);
  f.payload.insert(f.payload.end(), {9, 9, 9, 9});
  f.header.version = kVersion + 1;
  f.payload[52] |= 0x80;                  // dtype bit 7: unknown to us
  f.payload[f.payload.size() - 11] = 42;  // last activation entry: a dtype id we do not know
  f.payload[f.payload.size() - 8] = 1;    // features bit 16: unknown to us (then v4's 2 expert bytes)
  auto got = decode_hello(f);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(got->max_version, kVersion + 1);
  EXPECT_EQ(got->dtypes, 0x1Fu & w.dtypes);
  EXPECT_EQ(got->features, kFeatureFetch);
  ASSERT_EQ(got->layer_act.size(), w.n_layer);
  EXPECT_EQ(got->layer_act.back(), kNoActDType);
  auto s = negotiate(sample_hello(PeerRole::kBackbone, 32), *got);
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(s->version, kVersion);
  // The same bytes claiming our own version are malformed (our sizes are exact).
  f.header.version = kVersion;
  EXPECT_EQ(decode_hello(f).status().code(), StatusCode::kCorrupt);
}

TEST(WireCodec, HelloActivationTable) {
  // v2 appends one byte per layer: the INT8 wire dtype the worker's gate/up consume there (then
  // v3's 4-byte features field).
  Hello w = sample_hello(PeerRole::kWorker, 16);
  w.dtypes = 0x1F;
  w.layer_act.assign(w.n_layer, kNoActDType);
  w.layer_act[0] = static_cast<uint8_t>(WireDType::kQ8K);
  w.layer_act[1] = static_cast<uint8_t>(WireDType::kQ8);
  auto bytes = encode_hello(w).value();
  EXPECT_EQ(bytes.size(), kHeaderBytes + 68 + 12 * 3 + w.name.size() + 2 + 48 + 4 + 2);
  auto got = decode_hello(reparse(bytes));
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(got->layer_act, w.layer_act);
  // A backbone's table is empty: 2 bytes.
  Hello b = sample_hello(PeerRole::kBackbone, 16);
  EXPECT_EQ(encode_hello(b).value().size(), kHeaderBytes + 68 + b.name.size() + 2 + 4 + 2);
  EXPECT_TRUE(decode_hello(reparse(encode_hello(b).value()))->layer_act.empty());
  // Wrong table length, an entry that is not q8/q8k/none, a truncated table.
  Hello bad = w;
  bad.layer_act.resize(47);
  EXPECT_EQ(encode_hello(bad).status().code(), StatusCode::kInvalidArgument);
  bad = w;
  bad.layer_act[5] = static_cast<uint8_t>(WireDType::kF16);
  EXPECT_EQ(encode_hello(bad).status().code(), StatusCode::kInvalidArgument);
  Frame f = reparse(bytes);
  const size_t table = f.payload.size() - 2 - 4 - 48;  // the table, the features, the expert FFN
  f.payload[table + 7] = 2;                            // bf16 is no activation format
  Status st = decode_hello(f).status();
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("layer 7 activation dtype 2"), std::string::npos) << st.message();
  f = reparse(bytes);
  f.payload.resize(table + 47);
  st = decode_hello(f).status();
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("activation table of 48 layers"), std::string::npos) << st.message();
  f.payload.resize(table - 2);  // no count at all
  EXPECT_EQ(decode_hello(f).status().code(), StatusCode::kCorrupt);
}

TEST(WireCodec, Version1HelloIsReadButNotSpoken) {
  // A v1 peer's HELLO (no activation table) is read through the frozen prefix, and refused
  // with "no common version" rather than misparsed.
  Hello old = sample_hello(PeerRole::kWorker, 16);
  old.min_version = 1;
  old.max_version = 1;
  old.dtypes = 0xF;
  auto bytes = encode_hello(old).value();
  EXPECT_EQ(bytes.size(), kHeaderBytes + 68 + 12 * 3 + old.name.size());
  auto got = decode_hello(reparse(bytes));
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_TRUE(got->layer_act.empty());
  auto s = negotiate(sample_hello(PeerRole::kBackbone, 16), *got);
  EXPECT_EQ(s.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(s.status().message().find("no common protocol version"), std::string::npos);
}

TEST(WireCodec, Version2HelloIsReadButNotSpoken) {
  // A v2 peer (activation table, no features field) is refused the same way.
  Hello old = sample_hello(PeerRole::kWorker, 16);
  old.min_version = 2;
  old.max_version = 2;
  old.layer_act.assign(old.n_layer, kNoActDType);
  auto bytes = encode_hello(old).value();
  EXPECT_EQ(bytes.size(), kHeaderBytes + 68 + 12 * 3 + old.name.size() + 2 + 48);
  auto got = decode_hello(reparse(bytes));
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(got->features, 0u);
  auto s = negotiate(sample_hello(PeerRole::kBackbone, 16), *got);
  EXPECT_EQ(s.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(s.status().message().find("no common protocol version"), std::string::npos);
  // A v2 HELLO has no features field to carry them.
  old.features = kFeatureFetch;
  EXPECT_EQ(encode_hello(old).status().code(), StatusCode::kInvalidArgument);
}

TEST(WireCodec, HelloFeaturesAreNegotiatedByIntersection) {
  // v3 appends u32 features after the activation table; FETCH needs the bit on both sides.
  Hello w = sample_hello(PeerRole::kWorker, 16);
  w.features = kFeatureFetch;
  auto bytes = encode_hello(w).value();
  uint32_t on_wire = 0;
  std::memcpy(&on_wire, bytes.data() + bytes.size() - 6, 4);  // v4's two expert FFN bytes follow
  EXPECT_EQ(on_wire, kFeatureFetch);
  auto got = decode_hello(reparse(bytes));
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(got->features, kFeatureFetch);
  Hello b = sample_hello(PeerRole::kBackbone, 16);
  b.features = kFeatureFetch;
  EXPECT_EQ(negotiate(b, *got)->features, kFeatureFetch);
  b.features = 0;  // a backbone that will not fetch: the session has no feature, and still works
  auto s = negotiate(b, *got);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->features, 0u);
  // Bits this build does not define are never sent, and a peer's are ignored (a later build's
  // feature): the HELLO decodes with them cleared, so the session never uses them.
  Hello bad = w;
  bad.features = 1u << 9;
  EXPECT_EQ(encode_hello(bad).status().code(), StatusCode::kInvalidArgument);
  Frame f = reparse(bytes);
  f.payload[f.payload.size() - 5] = 0x02;  // bit 9
  auto later = decode_hello(f);
  ASSERT_TRUE(later.is_ok()) << later.status().to_string();
  EXPECT_EQ(later->features, kFeatureFetch);
  b.features = kAllFeatures;
  EXPECT_EQ(negotiate(b, *later)->features, kFeatureFetch);
  Status st;
  // A HELLO cut inside its features field.
  f = reparse(bytes);
  f.payload.resize(f.payload.size() - 4);
  st = decode_hello(f).status();
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("features field"), std::string::npos) << st.message();
}

TEST(WireCodec, HelloV4CarriesTheExpertFfnAndMismatchesAreRefused) {
  // v4 appends the model's expert FFN definition (activation, flags); both ends must agree.
  Hello w = sample_hello(PeerRole::kWorker, 16);
  w.expert_act = kExpertActSwigluOai;
  w.expert_flags = kExpertFlagBiases;
  auto bytes = encode_hello(w).value();
  EXPECT_EQ(bytes[bytes.size() - 2], kExpertActSwigluOai);
  EXPECT_EQ(bytes[bytes.size() - 1], kExpertFlagBiases);
  auto got = decode_hello(reparse(bytes));
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(got->expert_act, kExpertActSwigluOai);
  EXPECT_EQ(got->expert_flags, kExpertFlagBiases);
  Hello b = sample_hello(PeerRole::kBackbone, 16);
  b.expert_act = kExpertActSwigluOai;
  b.expert_flags = kExpertFlagBiases;
  EXPECT_TRUE(negotiate(b, *got).is_ok());
  // The same model id but another expert function (a worker built for another definition).
  b.expert_flags = kExpertFlagBiases | kExpertFlagInputScaled;
  Status st = negotiate(b, *got).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("swiglu-oai+bias"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("weight on input"), std::string::npos) << st.message();
  b.expert_act = kExpertActSilu;
  b.expert_flags = 0;
  EXPECT_FALSE(negotiate(b, *got).is_ok());
  // step35's per-layer SwiGLU limits: a worker that would compute the plain SwiGLU is refused.
  Hello wl = sample_hello(PeerRole::kWorker, 16);
  wl.expert_flags = kExpertFlagSwigluLimit;
  auto wl_got = decode_hello(reparse(encode_hello(wl).value()));
  ASSERT_TRUE(wl_got.is_ok()) << wl_got.status().to_string();
  EXPECT_EQ(wl_got->expert_flags, kExpertFlagSwigluLimit);
  Hello bl = sample_hello(PeerRole::kBackbone, 16);
  bl.expert_flags = kExpertFlagSwigluLimit;
  EXPECT_TRUE(negotiate(bl, *wl_got).is_ok());
  bl.expert_flags = 0;
  st = negotiate(bl, *wl_got).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("clamped per layer"), std::string::npos) << st.message();
  // Unknown definitions are malformed, and a v3 peer (no definition) is refused, saying why.
  Hello bad = w;
  bad.expert_act = 7;
  EXPECT_EQ(encode_hello(bad).status().code(), StatusCode::kInvalidArgument);
  Frame f = reparse(bytes);
  f.payload.back() = 0x80;
  EXPECT_EQ(decode_hello(f).status().code(), StatusCode::kCorrupt);
  f = reparse(bytes);
  f.payload.resize(f.payload.size() - 1);
  st = decode_hello(f).status();
  EXPECT_NE(st.message().find("expert FFN definition"), std::string::npos) << st.message();
  Hello v3 = sample_hello(PeerRole::kWorker, 16);
  v3.min_version = v3.max_version = 3;
  st = negotiate(b, v3).status();
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("upgrade the peer"), std::string::npos) << st.message();
}

TEST(WireCodec, FetchAndSlabRoundTrip) {
  const DecodeLimits lim{.n_expert = 64, .n_layer = 8};
  FetchMsg q{.request_id = 0x1234567890ull, .layer = 7, .expert = 63};
  auto qb = encode_fetch(q);
  ASSERT_TRUE(qb.is_ok()) << qb.status().to_string();
  ASSERT_EQ(qb->size(), kHeaderBytes + 8);
  EXPECT_EQ((*qb)[6], static_cast<uint8_t>(MsgType::kFetch));
  EXPECT_EQ((*qb)[kHeaderBytes], 7);
  EXPECT_EQ((*qb)[kHeaderBytes + 4], 63);
  auto qg = decode_fetch(reparse(*qb), lim);
  ASSERT_TRUE(qg.is_ok()) << qg.status().to_string();
  EXPECT_EQ(qg->request_id, q.request_id);
  EXPECT_EQ(qg->layer, 7u);
  EXPECT_EQ(qg->expert, 63u);

  SlabMsg m = make_slab(q.request_id, 7, 63);
  auto sb = encode_slab(m);
  ASSERT_TRUE(sb.is_ok()) << sb.status().to_string();
  const size_t n0 = 34 * 2 * 3, n1 = 144 * 2, n2 = 4 * 5 * 2;  // Q8_0, Q4_K, F32 slabs
  ASSERT_EQ(m.tensors[0].bytes.size(), n0);
  ASSERT_EQ(m.tensors[1].bytes.size(), n1);
  ASSERT_EQ(sb->size(), kHeaderBytes + slab_payload_bytes(n0, n1, n2));
  EXPECT_EQ(slab_payload_bytes(n0, n1, n2), 8 + 3 * 36 + n0 + n1 + n2);
  // Layout: tensor headers at 8, 44 + n0, 80 + n0 + n1 (u32 type, u64 ne0, ne1, bytes, hash).
  const uint8_t* p = sb->data() + kHeaderBytes;
  auto u64_at = [&](size_t off) {
    uint64_t v;
    std::memcpy(&v, p + off, 8);
    return v;
  };
  EXPECT_EQ(p[8], static_cast<uint8_t>(GgmlType::Q8_0));
  EXPECT_EQ(u64_at(12), 64u);
  EXPECT_EQ(u64_at(20), 3u);
  EXPECT_EQ(u64_at(28), n0);
  EXPECT_EQ(u64_at(36), m.tensors[0].hash);
  EXPECT_EQ(std::memcmp(p + 44, m.tensors[0].bytes.data(), n0), 0);
  EXPECT_EQ(p[44 + n0], static_cast<uint8_t>(GgmlType::Q4_K));
  EXPECT_EQ(p[80 + n0 + n1], static_cast<uint8_t>(GgmlType::F32));
  auto got = decode_slab(reparse(*sb), lim);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(got->request_id, q.request_id);
  EXPECT_EQ(got->layer, 7u);
  EXPECT_EQ(got->expert, 63u);
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(got->tensors[t].type, m.tensors[t].type) << t;
    EXPECT_EQ(got->tensors[t].ne0, m.tensors[t].ne0) << t;
    EXPECT_EQ(got->tensors[t].ne1, m.tensors[t].ne1) << t;
    EXPECT_EQ(got->tensors[t].hash, m.tensors[t].hash) << t;
    EXPECT_EQ(got->tensors[t].bytes, m.tensors[t].bytes) << t;
  }
  EXPECT_EQ(encode_slab(*got).value(), *sb);  // canonical
  EXPECT_TRUE(check_slab_matches(*qg, *got).is_ok());
  SlabMsg wrong = *got;
  wrong.expert = 62;
  EXPECT_EQ(check_slab_matches(*qg, wrong).code(), StatusCode::kCorrupt);
  wrong = *got;
  wrong.request_id += 1;
  EXPECT_EQ(check_slab_matches(*qg, wrong).code(), StatusCode::kCorrupt);
}

TEST(WireCodec, FetchAndSlabEncodersRejectInvalidMessages) {
  EXPECT_EQ(encode_fetch({.request_id = 0, .layer = 1, .expert = 2}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(encode_fetch({.request_id = 1, .layer = 1, .expert = 65536}).status().code(), StatusCode::kInvalidArgument);
  const SlabMsg good = make_slab(5, 1, 2);
  SlabMsg bad = good;
  bad.request_id = 0;
  EXPECT_EQ(encode_slab(bad).status().code(), StatusCode::kInvalidArgument);
  bad = good;
  bad.tensors[1].bytes.pop_back();  // no longer Q4_K [256 x 2]
  Status st = encode_slab(bad).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("SLAB up: byte count 287"), std::string::npos) << st.message();
  bad = good;
  bad.tensors[0].ne0 = 48;  // not a whole number of Q8_0 blocks
  st = encode_slab(bad).status();
  EXPECT_NE(st.message().find("not a multiple"), std::string::npos) << st.message();
  bad = good;
  bad.tensors[2].type = static_cast<GgmlType>(4);  // an id ggml removed
  st = encode_slab(bad).status();
  EXPECT_NE(st.message().find("SLAB down: unknown ggml type 4"), std::string::npos) << st.message();
}

TEST(WireCodec, PingPongGoodbyeErrorRoundTrip) {
  PingMsg p{.request_id = 77, .send_time_ns = 123456789012345ull, .pad_bytes = 1000, .reply_pad_bytes = 5000};
  auto pb = encode_ping(p).value();
  EXPECT_EQ(pb.size(), kHeaderBytes + 16 + 1000);
  auto pg = decode_ping(reparse(pb));
  ASSERT_TRUE(pg.is_ok());
  EXPECT_EQ(pg->request_id, 77u);
  EXPECT_EQ(pg->send_time_ns, p.send_time_ns);
  EXPECT_EQ(pg->reply_pad_bytes, 5000u);

  PongMsg q{.request_id = 77, .ping_time_ns = p.send_time_ns, .reply_time_ns = 42, .pad_bytes = 5000};
  auto qg = decode_pong(reparse(encode_pong(q).value()));
  ASSERT_TRUE(qg.is_ok());
  EXPECT_EQ(qg->ping_time_ns, p.send_time_ns);
  EXPECT_EQ(qg->reply_time_ns, 42u);
  EXPECT_EQ(qg->pad_bytes, 5000u);

  auto gg = decode_goodbye(reparse(encode_goodbye({.reason = 8, .text = "draining"}).value()));
  ASSERT_TRUE(gg.is_ok());
  EXPECT_EQ(gg->reason, 8);
  EXPECT_EQ(gg->text, "draining");

  ErrorMsg e{.request_id = 5, .code = static_cast<uint16_t>(WireError::kNotHeld), .text = "expert 9 of layer 2"};
  auto eg = decode_error(reparse(encode_error(e).value()));
  ASSERT_TRUE(eg.is_ok());
  EXPECT_EQ(eg->request_id, 5u);
  EXPECT_EQ(eg->text, e.text);
  EXPECT_EQ(eg->to_status().code(), StatusCode::kNotFound);
  EXPECT_NE(eg->to_status().message().find("expert 9 of layer 2"), std::string::npos);
  // Unknown future error codes still read as failures.
  EXPECT_EQ(wire_error_to_status_code(999), StatusCode::kUnavailable);
  // Text over the limit is refused by the encoder.
  EXPECT_FALSE(encode_error({.request_id = 1, .code = 1, .text = std::string(kMaxTextBytes + 1, 'x')}).is_ok());
}

TEST(WireCodec, EncodersRejectInvalidMessages) {
  DispatchMsg m = make_dispatch(1, 0, 2, 32, 2, WireDType::kF32, CombineMode::kExact, WireDType::kF32);
  DispatchMsg bad = m;
  bad.request_id = 0;
  EXPECT_EQ(encode_dispatch(bad).status().code(), StatusCode::kInvalidArgument);
  bad = m;
  bad.pairs[1].rank = bad.pairs[0].rank;
  EXPECT_EQ(encode_dispatch(bad).status().code(), StatusCode::kInvalidArgument);
  bad = m;
  bad.pair_counts[0] = 0;
  EXPECT_EQ(encode_dispatch(bad).status().code(), StatusCode::kInvalidArgument);
  bad = m;
  bad.hidden.bytes.pop_back();
  EXPECT_EQ(encode_dispatch(bad).status().code(), StatusCode::kInvalidArgument);
  CombineMsg c = make_combine_for(m);
  c.mode = CombineMode::kPartial;  // 4 rows but partial needs 2
  EXPECT_EQ(encode_combine(c).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moesh::wire
