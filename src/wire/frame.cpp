// Frame header codec, checksum, and the names/mappings of the wire enums.
// The streaming state struct is only defined with XXH_STATIC_LINKING_ONLY; it lives on the stack.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "moesh/wire/wire.h"
#include "wire/bytes.h"

namespace moesh::wire {

const char* msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::kHello:
      return "HELLO";
    case MsgType::kDispatch:
      return "DISPATCH";
    case MsgType::kCombine:
      return "COMBINE";
    case MsgType::kPing:
      return "PING";
    case MsgType::kPong:
      return "PONG";
    case MsgType::kGoodbye:
      return "GOODBYE";
    case MsgType::kError:
      return "ERROR";
    case MsgType::kFetch:
      return "FETCH";
    case MsgType::kSlab:
      return "SLAB";
    case MsgType::kAuth:
      return "AUTH";
    case MsgType::kSpanStep:
      return "SPAN_STEP";
    case MsgType::kSpanResult:
      return "SPAN_RESULT";
    case MsgType::kSpanAwait:
      return "SPAN_AWAIT";
    case MsgType::kProbe:
      return "PROBE";
    case MsgType::kProbeReply:
      return "PROBE_REPLY";
    case MsgType::kSpanHold:
      return "SPAN_HOLD";
    case MsgType::kSpanHeld:
      return "SPAN_HELD";
    case MsgType::kUnstore:
      return "UNSTORE";
    case MsgType::kUnstored:
      return "UNSTORED";
    case MsgType::kRoute:
      return "ROUTE";
    case MsgType::kStore:
      return "STORE";
    case MsgType::kStored:
      return "STORED";
    case MsgType::kInfo:
      return "INFO";
    case MsgType::kInfoReply:
      return "INFO_REPLY";
    case MsgType::kCOUNT:
      break;
  }
  return "?";
}

bool msg_type_is_known(uint16_t raw) {
  return raw >= static_cast<uint16_t>(MsgType::kHello) && raw < static_cast<uint16_t>(MsgType::kCOUNT);
}

const char* wire_dtype_name(WireDType t) {
  switch (t) {
    case WireDType::kF32:
      return "f32";
    case WireDType::kF16:
      return "f16";
    case WireDType::kBF16:
      return "bf16";
    case WireDType::kQ8:
      return "q8";
    case WireDType::kQ8K:
      return "q8k";
    case WireDType::kCOUNT:
      break;
  }
  return "?";
}

const char* combine_mode_name(CombineMode m) {
  switch (m) {
    case CombineMode::kExact:
      return "exact";
    case CombineMode::kPartial:
      return "partial";
    case CombineMode::kCOUNT:
      break;
  }
  return "?";
}

const char* wire_error_name(uint16_t code) {
  switch (static_cast<WireError>(code)) {
    case WireError::kMalformed:
      return "malformed";
    case WireError::kVersionMismatch:
      return "version mismatch";
    case WireError::kModelMismatch:
      return "model mismatch";
    case WireError::kUnsupported:
      return "unsupported";
    case WireError::kNotHeld:
      return "not held";
    case WireError::kDeadlineExceeded:
      return "deadline exceeded";
    case WireError::kOverloaded:
      return "overloaded";
    case WireError::kShuttingDown:
      return "shutting down";
    case WireError::kNonFinite:
      return "non-finite result";
    case WireError::kInternal:
      return "internal";
    case WireError::kProtocol:
      return "protocol";
    case WireError::kUnauthenticated:
      return "unauthenticated";
    case WireError::kCOUNT:
      break;
  }
  return "unknown";
}

StatusCode wire_error_to_status_code(uint16_t code) {
  switch (static_cast<WireError>(code)) {
    case WireError::kMalformed:
      return StatusCode::kCorrupt;
    case WireError::kVersionMismatch:
      return StatusCode::kUnsupported;
    case WireError::kModelMismatch:
      return StatusCode::kInvalidArgument;
    case WireError::kUnsupported:
      return StatusCode::kUnsupported;
    case WireError::kNotHeld:
      return StatusCode::kNotFound;
    case WireError::kDeadlineExceeded:
      return StatusCode::kTimeout;
    case WireError::kOverloaded:
      return StatusCode::kUnavailable;
    case WireError::kShuttingDown:
      return StatusCode::kUnavailable;
    case WireError::kNonFinite:
      return StatusCode::kOutOfRange;
    case WireError::kInternal:
      return StatusCode::kInternal;
    case WireError::kProtocol:
      return StatusCode::kCorrupt;
    case WireError::kUnauthenticated:
      return StatusCode::kUnauthenticated;
    case WireError::kCOUNT:
      break;
  }
  // An error we do not know is still a failure of the peer: treat it like an unreachable one,
  // so the executor retries elsewhere instead of trusting a result.
  return StatusCode::kUnavailable;
}

WireError status_code_to_wire_error(StatusCode code) {
  switch (code) {
    case StatusCode::kCorrupt:
      return WireError::kMalformed;
    case StatusCode::kUnsupported:
      return WireError::kUnsupported;
    case StatusCode::kNotFound:
      return WireError::kNotHeld;
    case StatusCode::kTimeout:
      return WireError::kDeadlineExceeded;
    case StatusCode::kUnavailable:
      return WireError::kOverloaded;
    case StatusCode::kOutOfRange:
      return WireError::kNonFinite;
    case StatusCode::kInvalidArgument:
      return WireError::kMalformed;
    default:
      return WireError::kInternal;
  }
}

Status ErrorMsg::to_status() const {
  return Status(wire_error_to_status_code(code),
                fmt::format("peer error {} ({}) on request {}: {}", code, wire_error_name(code), request_id, text));
}

namespace {

constexpr size_t kChecksumOffset = 24;

uint64_t frame_checksum(std::span<const uint8_t> header_prefix, std::span<const uint8_t> payload) {
  // One streaming hash over header[0..24) ++ payload: the checksum also guards the request id
  // and the type, not just the payload.
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, header_prefix.data(), kChecksumOffset);
  if (!payload.empty()) XXH3_64bits_update(&state, payload.data(), payload.size());
  return XXH3_64bits_digest(&state);
}

}  // namespace

Result<FrameHeader> parse_header(std::span<const uint8_t> bytes, uint32_t max_payload_bytes) {
  if (bytes.size() < kHeaderBytes)
    return make_error(StatusCode::kCorrupt, "frame header truncated: {} of {} bytes", bytes.size(), kHeaderBytes);
  detail::ByteReader r(bytes);
  uint32_t magic = 0;
  uint16_t type = 0;
  FrameHeader h;
  (void)r.u32(&magic);
  (void)r.u16(&h.version);
  (void)r.u16(&type);
  (void)r.u64(&h.request_id);
  (void)r.u32(&h.payload_bytes);
  (void)r.u32(&h.flags);
  (void)r.u64(&h.checksum);
  if (magic != kMagic) return make_error(StatusCode::kCorrupt, "bad frame magic 0x{:08x}", magic);
  if (h.version == 0) return make_error(StatusCode::kCorrupt, "frame version 0");
  if (!msg_type_is_known(type)) return make_error(StatusCode::kCorrupt, "unknown message type {}", type);
  h.type = static_cast<MsgType>(type);
  // A newer peer's HELLO is readable (its frozen prefix says which versions it speaks); any other
  // frame must already be in our version.
  if (h.version != kVersion && h.type != MsgType::kHello)
    return make_error(StatusCode::kUnsupported, "{} frame of protocol version {} (we speak {})", msg_type_name(h.type),
                      h.version, kVersion);
  if (h.flags != 0) return make_error(StatusCode::kCorrupt, "frame flags 0x{:x} set (none defined)", h.flags);
  if (h.payload_bytes > max_payload_bytes)
    return make_error(StatusCode::kOutOfRange, "{} payload of {} bytes exceeds the limit of {}", msg_type_name(h.type),
                      h.payload_bytes, max_payload_bytes);
  return h;
}

Status verify_checksum(std::span<const uint8_t> header_bytes, std::span<const uint8_t> payload, uint64_t expected) {
  if (header_bytes.size() < kHeaderBytes) return make_error(StatusCode::kCorrupt, "frame header truncated");
  const uint64_t got = frame_checksum(header_bytes, payload);
  if (got != expected)
    return make_error(StatusCode::kCorrupt, "frame checksum mismatch (computed {:016x}, header {:016x})", got,
                      expected);
  return Status::ok();
}

std::vector<uint8_t> build_frame(MsgType type, uint64_t request_id, std::span<const uint8_t> payload,
                                 uint16_t version) {
  std::vector<uint8_t> out;
  out.reserve(kHeaderBytes + payload.size());
  detail::ByteWriter w(&out);
  w.u32(kMagic);
  w.u16(version);
  w.u16(static_cast<uint16_t>(type));
  w.u64(request_id);
  w.u32(static_cast<uint32_t>(payload.size()));
  w.u32(0);
  w.u64(0);
  w.raw(payload.data(), payload.size());
  const uint64_t sum = frame_checksum(std::span<const uint8_t>(out.data(), kHeaderBytes), payload);
  std::memcpy(out.data() + kChecksumOffset, &sum, 8);
  return out;
}

Result<Frame> parse_frame(std::span<const uint8_t> bytes, uint32_t max_payload_bytes) {
  MOESH_ASSIGN_OR_RETURN(FrameHeader h, parse_header(bytes, max_payload_bytes));
  const size_t have = bytes.size() - kHeaderBytes;
  if (have < h.payload_bytes)
    return make_error(StatusCode::kCorrupt, "{} payload truncated: {} of {} bytes", msg_type_name(h.type), have,
                      h.payload_bytes);
  if (have > h.payload_bytes)
    return make_error(StatusCode::kCorrupt, "{} bytes after the {} payload", have - h.payload_bytes,
                      msg_type_name(h.type));
  auto payload = bytes.subspan(kHeaderBytes, h.payload_bytes);
  MOESH_RETURN_IF_ERROR(verify_checksum(bytes.first(kHeaderBytes), payload, h.checksum));
  Frame f;
  f.header = h;
  f.payload.assign(payload.begin(), payload.end());
  return f;
}

}  // namespace moesh::wire
