// Writes the fuzz seed corpus: one valid input of each kind per file, DIR/wire/* and DIR/gguf/*.
// The corpus in tests/fuzz/corpus was written by `fuzz_make_seeds tests/fuzz/corpus`; rerun it
// when a message layout changes.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "moesh/gguf/gguf.h"
#include "wire/wire_test_util.h"

using namespace moesh;
using namespace moesh::wire;

namespace {

void put(const std::filesystem::path& dir, const std::string& name, const Result<std::vector<uint8_t>>& bytes) {
  if (!bytes.is_ok()) {
    std::fprintf(stderr, "seed %s: %s\n", name.c_str(), bytes.status().to_string().c_str());
    std::exit(1);
  }
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes->data()), static_cast<std::streamsize>(bytes->size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds DIR\n");
    return 2;
  }
  const std::filesystem::path wdir = std::filesystem::path(argv[1]) / "wire",
                              gdir = std::filesystem::path(argv[1]) / "gguf";
  Hello bb;
  bb.role = PeerRole::kBackbone;
  bb.n_layer = 16, bb.n_expert = 64, bb.n_embd = 64;
  bb.dtypes = 0x1f, bb.modes = 0x3, bb.features = kFeatureFetch | kFeatureAuth;
  bb.name = "backbone";
  put(wdir, "hello-backbone", encode_hello(bb));
  Hello w = bb;
  w.role = PeerRole::kWorker;
  w.name = "w0";
  w.experts = {{0, 0, 32}, {3, 8, 8}};
  w.layer_act.assign(16, 3);
  put(wdir, "hello-worker", encode_hello(w));
  AuthMsg a;
  a.flags = AuthMsg::kHasChallenge | AuthMsg::kHasProof;
  a.challenge.fill(0x5a);
  a.proof.fill(0xa5);
  put(wdir, "auth", encode_auth(a));
  put(wdir, "route-join", encode_route({.op = RouteMsg::kJoin, .name = "w0"}));
  put(wdir, "route-connect", encode_route({.op = RouteMsg::kConnect, .name = "phone-1"}));
  put(wdir, "route-spliced", encode_route({.op = RouteMsg::kSpliced, .name = ""}));
  for (WireDType dt : {WireDType::kF32, WireDType::kF16, WireDType::kQ8, WireDType::kQ8K}) {
    for (CombineMode mode : {CombineMode::kExact, CombineMode::kPartial}) {
      const DispatchMsg d = testing::make_dispatch(7, 2, 3, 64, 2, dt, mode, dt);
      const std::string tag = std::string(wire_dtype_name(dt)) + "-" + combine_mode_name(mode);
      put(wdir, "dispatch-" + tag, encode_dispatch(d));
      put(wdir, "combine-" + tag, encode_combine(testing::make_combine_for(d)));
    }
  }
  put(wdir, "fetch", encode_fetch(FetchMsg{9, 1, 5}));
  put(wdir, "slab", encode_slab(testing::make_slab(9, 1, 5)));
  put(wdir, "store", encode_store(testing::make_slab(10, 1, 6)));
  put(wdir, "stored", encode_stored(StoredMsg{10, 1, 6, 532, 4096}));
  put(wdir, "unstore", encode_unstore(UnstoreMsg{13, 1, 6}));
  put(wdir, "unstored", encode_unstored(StoredMsg{13, 1, 6, 0, 4096}));
  put(wdir, "info", encode_info_request(11));
  put(wdir, "info-reply", encode_info(InfoMsg{11, 2, 8, 4096, 532, 8192, 1 << 20, 1234}));
  {
    SpanStepMsg st;
    st.request_id = 12;
    st.first = 2;
    st.last = 5;
    SpanSeq q0{.seq = 0, .n_replay = 0, .n_new = 2, .start = 0};
    SpanSeq q1{.seq = 3, .n_replay = 1, .n_new = 1, .start = 4};
    q1.chain.fill(0x3c);
    st.seqs = {q0, q1};
    st.pos = {0, 1, 4, 5};
    st.cut = {0, 1, 0, 1};
    std::vector<float> rows(4 * 64);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = 0.01f * static_cast<float>(i);
    st.hidden = encode_rows(WireDType::kF32, rows.data(), 4, 64).value();
    put(wdir, "span-step", encode_span_step(st));
    SpanResultMsg res;
    res.request_id = 12;
    res.compute_us = 99;
    res.rows = encode_rows(WireDType::kF16, rows.data(), 3, 64).value();
    put(wdir, "span-result", encode_span_result(res));
    SpanResultMsg need;
    need.request_id = 12;
    need.need = {{3, 2}};
    put(wdir, "span-need", encode_span_result(need));
    // Chained: two hops after blocks 2-5, f16 between them; a forwarded hop; an await.
    SpanStepMsg ch = st;
    ch.seqs[1].n_replay = 0;
    ch.seqs[1].n_new = 2;
    ch.seqs[1].start = 5;
    ch.chain_id = 21;
    ch.hop_dtype = WireDType::kF16;
    SpanHop h1{.address = "127.0.0.1:7001", .first = 6, .last = 6, .start = {0, 5}, .chain = {}};
    h1.chain.resize(2);
    h1.chain[1].fill(0x5a);
    SpanHop h2 = h1;
    h2.address = "127.0.0.1:7002";
    h2.first = h2.last = 7;
    ch.next = {h1, h2};
    put(wdir, "span-step-chained", encode_span_step(ch));
    ch.origin = "backbone";
    ch.next = {h2};
    ch.first = ch.last = 6;
    put(wdir, "span-step-forwarded", encode_span_step(ch));
    SpanResultMsg ferr = res;
    ferr.forward_error = "127.0.0.1:7002: connection refused";
    put(wdir, "span-result-forward-error", encode_span_result(ferr));
    put(wdir, "span-await", encode_span_await(SpanAwaitMsg{13, 21, 6, 6, 30000}));
    put(wdir, "probe", encode_probe(ProbeMsg{14, 800, {"127.0.0.1:7001", "[::1]:7002"}}));
    put(wdir, "probe-reply", encode_probe_reply(ProbeReplyMsg{14, {350, kProbeFailed}}));
    put(wdir, "span-hold", encode_span_hold(SpanHoldMsg{15, SpanHoldOp::kLoad, 4, 9}));
    put(wdir, "span-held",
        encode_span_held(SpanHeldMsg{15,
                                     {{0, 3, SpanHeldState::kReady, ""},
                                      {4, 9, SpanHeldState::kLoading, ""},
                                      {10, 11, SpanHeldState::kFailed, "HTTP 401: admin key"}}}));
  }
  put(wdir, "ping", encode_ping(PingMsg{3, 123456789, 16, 8}));
  put(wdir, "pong", encode_pong(PongMsg{3, 123456789, 987654321, 8}));
  put(wdir, "goodbye", encode_goodbye(GoodbyeMsg{0, "bye"}));
  put(wdir, "error", encode_error(ErrorMsg{4, static_cast<uint16_t>(WireError::kNotHeld), "expert 5 not held"}));

  gguf::Writer g;
  g.set("general.architecture", gguf::Value::str("qwen3moe"));
  g.set("qwen3moe.block_count", gguf::Value::u32(2));
  g.set("qwen3moe.rope.freq_base", gguf::Value::f32(1e6f));
  g.set("general.flag", gguf::Value::boolean(true));
  std::vector<int32_t> ints = {1, 2, 3};
  g.set("moesh.slice.moe_layers", gguf::Value::i32_array(ints));
  std::vector<float> t(64 * 4, 0.5f);
  if (!g.add_tensor_copy("blk.0.attn_norm.weight", GgmlType::F32, {64}, t.data()).is_ok() ||
      !g.add_tensor_copy("blk.0.ffn_gate_exps.weight", GgmlType::F32, {8, 8, 4}, t.data()).is_ok()) {
    return 1;
  }
  put(gdir, "small", g.write_bytes());
  gguf::Writer e;
  e.set("general.architecture", gguf::Value::str("llama"));
  put(gdir, "no-tensors", e.write_bytes());
  std::printf("seeds written to %s\n", argv[1]);
  return 0;
}
