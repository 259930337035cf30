// SPAN_HOLD / SPAN_HELD payload codecs (PROTOCOL.md "SPAN_HOLD"): a backbone asking a span peer to
// load or let go of blocks, and the peer's list of what it runs.
//
// As in messages.cpp, one validate_* routine per message serves its encoder (a bad message is our
// bug: kInvalidArgument) and its decoder (a bad frame is the peer's: kCorrupt).
#include "moesh/wire/wire.h"
#include "wire/bytes.h"

namespace moesh::wire {

namespace {

using detail::ByteReader;
using detail::ByteWriter;

Status validate_span_hold(const SpanHoldMsg& m, StatusCode code) {
  if (m.request_id == 0) return make_error(code, "SPAN_HOLD: request id 0 is reserved");
  if (static_cast<uint8_t>(m.op) > static_cast<uint8_t>(SpanHoldOp::kDrop))
    return make_error(code, "SPAN_HOLD: unknown op {}", static_cast<unsigned>(m.op));
  if (m.op == SpanHoldOp::kList && (m.first != 0 || m.last != 0))
    return make_error(code, "SPAN_HOLD: a list names no blocks (got {}-{})", m.first, m.last);
  if (m.first > m.last) return make_error(code, "SPAN_HOLD: blocks {}-{} end before they start", m.first, m.last);
  return Status::ok();
}

Status validate_span_held(const SpanHeldMsg& m, StatusCode code) {
  if (m.request_id == 0) return make_error(code, "SPAN_HELD: request id 0 is reserved");
  if (m.spans.size() > kMaxSpanHolds)
    return make_error(code, "SPAN_HELD: {} spans (at most {})", m.spans.size(), kMaxSpanHolds);
  for (size_t i = 0; i < m.spans.size(); ++i) {
    const SpanHolding& h = m.spans[i];
    if (h.first > h.last)
      return make_error(code, "SPAN_HELD: span {} is blocks {}-{}: ends before it starts", i, h.first, h.last);
    if (static_cast<uint8_t>(h.state) > static_cast<uint8_t>(SpanHeldState::kFailed))
      return make_error(code, "SPAN_HELD: span {} has unknown state {}", i, static_cast<unsigned>(h.state));
    if (h.error.size() > kMaxTextBytes)
      return make_error(code, "SPAN_HELD: span {}'s error is {} bytes (at most {})", i, h.error.size(), kMaxTextBytes);
    if (h.state != SpanHeldState::kFailed && !h.error.empty())
      return make_error(code, "SPAN_HELD: span {} is not failed but carries an error", i);
    const SpanHolding* prev = i > 0 ? &m.spans[i - 1] : nullptr;
    if (prev != nullptr && (h.first < prev->first || (h.first == prev->first && h.last <= prev->last)))
      return make_error(code, "SPAN_HELD: span {} (blocks {}-{}) is not after span {} ({}-{}) in block order", i,
                        h.first, h.last, i - 1, prev->first, prev->last);
  }
  return Status::ok();
}

}  // namespace

Result<std::vector<uint8_t>> encode_span_hold(const SpanHoldMsg& m) {
  MOESH_RETURN_IF_ERROR(validate_span_hold(m, StatusCode::kInvalidArgument));
  std::vector<uint8_t> payload;
  ByteWriter w(&payload);
  w.u8(static_cast<uint8_t>(m.op));
  w.u32(m.first);
  w.u32(m.last);
  return build_frame(MsgType::kSpanHold, m.request_id, payload);
}

Result<SpanHoldMsg> decode_span_hold(const Frame& f) {
  if (f.type() != MsgType::kSpanHold)
    return make_error(StatusCode::kInvalidArgument, "expected a SPAN_HOLD frame, got {}", msg_type_name(f.type()));
  if (f.payload.size() != 9)
    return make_error(StatusCode::kCorrupt, "SPAN_HOLD payload is {} bytes (must be 9)", f.payload.size());
  ByteReader r(f.payload);
  SpanHoldMsg m;
  m.request_id = f.request_id();
  uint8_t op = 0;
  (void)r.u8(&op);
  (void)r.u32(&m.first);
  (void)r.u32(&m.last);
  m.op = static_cast<SpanHoldOp>(op);
  MOESH_RETURN_IF_ERROR(validate_span_hold(m, StatusCode::kCorrupt));
  return m;
}

Result<std::vector<uint8_t>> encode_span_held(const SpanHeldMsg& m) {
  MOESH_RETURN_IF_ERROR(validate_span_held(m, StatusCode::kInvalidArgument));
  std::vector<uint8_t> payload;
  ByteWriter w(&payload);
  w.u32(static_cast<uint32_t>(m.spans.size()));
  for (const SpanHolding& h : m.spans) {
    w.u32(h.first);
    w.u32(h.last);
    w.u8(static_cast<uint8_t>(h.state));
    w.u16(static_cast<uint16_t>(h.error.size()));
    w.raw(h.error.data(), h.error.size());
  }
  return build_frame(MsgType::kSpanHeld, m.request_id, payload);
}

Result<SpanHeldMsg> decode_span_held(const Frame& f) {
  if (f.type() != MsgType::kSpanHeld)
    return make_error(StatusCode::kInvalidArgument, "expected a SPAN_HELD frame, got {}", msg_type_name(f.type()));
  ByteReader r(f.payload);
  SpanHeldMsg m;
  m.request_id = f.request_id();
  uint32_t n = 0;
  if (!r.u32(&n))
    return make_error(StatusCode::kCorrupt, "SPAN_HELD payload is {} bytes (at least 4)", f.payload.size());
  if (n > kMaxSpanHolds) return make_error(StatusCode::kCorrupt, "SPAN_HELD: {} spans (at most {})", n, kMaxSpanHolds);
  for (uint32_t i = 0; i < n; ++i) {
    SpanHolding h;
    uint8_t state = 0;
    uint16_t len = 0;
    std::span<const uint8_t> text;
    if (!r.u32(&h.first) || !r.u32(&h.last) || !r.u8(&state) || !r.u16(&len) || !r.view(len, &text))
      return make_error(StatusCode::kCorrupt, "SPAN_HELD: span {} runs past the payload (offset {})", i, r.pos());
    h.state = static_cast<SpanHeldState>(state);
    h.error.assign(reinterpret_cast<const char*>(text.data()), text.size());
    m.spans.push_back(std::move(h));
  }
  if (r.remaining() != 0)
    return make_error(StatusCode::kCorrupt, "SPAN_HELD: {} bytes after the last span", r.remaining());
  MOESH_RETURN_IF_ERROR(validate_span_held(m, StatusCode::kCorrupt));
  return m;
}

}  // namespace moesh::wire
