// libFuzzer target: every wire frame a stranger can send (HELLO, AUTH, DISPATCH, COMBINE, FETCH,
// SLAB, PING, PONG, GOODBYE, ERROR). Whatever the bytes: no crash, no undefined behaviour, no
// allocation beyond what the payload implies; a frame that decodes re-encodes to the same bytes
// (the codec's canonical-encoding rule), and its rows decode.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "moesh/wire/wire.h"

using namespace moesh::wire;

namespace {

template <typename T>
void check_roundtrip(const std::vector<uint8_t>& in, const moesh::Result<T>& m,
                     moesh::Result<std::vector<uint8_t>> (*enc)(const T&)) {
  if (!m.is_ok()) return;
  auto out = enc(*m);
  // A decoded message of this build's version must encode back to exactly the input.
  if (!out.is_ok() || *out != in) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> in(data, data + size);
  DecodeLimits lim;
  lim.max_frame_bytes = 1u << 20;
  lim.max_n_embd = 4096;
  lim.n_expert = 64;
  lim.n_layer = 16;
  auto f = parse_frame(in, lim.max_frame_bytes);
  if (!f.is_ok()) return 0;
  const bool own_version = f->header.version == kVersion;
  std::vector<float> rows;
  switch (f->type()) {
    case MsgType::kHello: {
      auto m = decode_hello(*f);
      // Feature bits this build does not know are ignored: such a HELLO encodes back with them
      // cleared (same length), and that encoding is canonical.
      if (own_version && m.is_ok()) {
        auto out = encode_hello(*m);
        if (!out.is_ok() || out->size() != in.size()) std::abort();
        if (*out != in)
          check_roundtrip(*out, decode_hello(parse_frame(*out, lim.max_frame_bytes).value()), encode_hello);
      }
      break;
    }
    case MsgType::kDispatch: {
      auto m = decode_dispatch(*f, lim);
      if (m.is_ok()) {
        rows.resize(static_cast<size_t>(m->hidden.n_rows) * m->hidden.n_cols);
        decode_rows(m->hidden, rows.data());
      }
      check_roundtrip(in, m, encode_dispatch);
      break;
    }
    case MsgType::kCombine: {
      auto m = decode_combine(*f, lim);
      if (m.is_ok()) {
        rows.resize(static_cast<size_t>(m->rows.n_rows) * m->rows.n_cols);
        decode_rows(m->rows, rows.data());
      }
      check_roundtrip(in, m, encode_combine);
      break;
    }
    case MsgType::kFetch:
      check_roundtrip(in, decode_fetch(*f, lim), encode_fetch);
      break;
    case MsgType::kSlab:
      (void)decode_slab(*f, lim);  // re-encoding trusts the hashes decode just checked
      break;
    case MsgType::kPing:
      check_roundtrip(in, decode_ping(*f), encode_ping);
      break;
    case MsgType::kPong:
      check_roundtrip(in, decode_pong(*f), encode_pong);
      break;
    case MsgType::kGoodbye:
      check_roundtrip(in, decode_goodbye(*f), encode_goodbye);
      break;
    case MsgType::kError:
      check_roundtrip(in, decode_error(*f), encode_error);
      break;
    case MsgType::kAuth:
      check_roundtrip(in, decode_auth(*f), encode_auth);
      break;
    case MsgType::kRoute:
      check_roundtrip(in, decode_route(*f), encode_route);
      break;
    case MsgType::kStore:
      (void)decode_store(*f, lim);  // as SLAB
      break;
    case MsgType::kStored:
      check_roundtrip(in, decode_stored(*f, lim), encode_stored);
      break;
    case MsgType::kUnstore:
      check_roundtrip(in, decode_unstore(*f, lim), encode_unstore);
      break;
    case MsgType::kUnstored:
      check_roundtrip(in, decode_unstored(*f, lim), encode_unstored);
      break;
    case MsgType::kInfo: {
      auto id = decode_info_request(*f);
      if (id.is_ok()) {
        auto out = encode_info_request(*id);
        if (!out.is_ok() || *out != in) std::abort();
      }
      break;
    }
    case MsgType::kInfoReply: {
      auto m = decode_info(*f);
      // A 48-byte reply of an older worker decodes (memory unknown) but encodes as 72 bytes.
      if (f->payload.size() == 48) {
        if (m.is_ok() && (m->mem_total_bytes | m->mem_available_bytes | m->offer_bytes) != 0) std::abort();
      } else {
        check_roundtrip(in, m, encode_info);
      }
      break;
    }
    case MsgType::kSpanStep:
      check_roundtrip(in, decode_span_step(*f, lim), encode_span_step);
      break;
    case MsgType::kSpanResult:
      check_roundtrip(in, decode_span_result(*f, lim), encode_span_result);
      break;
    case MsgType::kSpanAwait:
      check_roundtrip(in, decode_span_await(*f, lim), encode_span_await);
      break;
    case MsgType::kProbe:
      check_roundtrip(in, decode_probe(*f), encode_probe);
      break;
    case MsgType::kProbeReply:
      check_roundtrip(in, decode_probe_reply(*f), encode_probe_reply);
      break;
    case MsgType::kSpanHold:
      check_roundtrip(in, decode_span_hold(*f), encode_span_hold);
      break;
    case MsgType::kSpanHeld:
      check_roundtrip(in, decode_span_held(*f), encode_span_held);
      break;
    case MsgType::kCOUNT:
      break;
  }
  return 0;
}
