// PROBE / PROBE_REPLY payload codecs (PROTOCOL.md "PROBE"): a worker's round trips to other peers.
//
// As in messages.cpp, one validate_* routine per message serves its encoder (a bad message is our
// bug: kInvalidArgument) and its decoder (a bad frame is the peer's: kCorrupt).
#include "moesh/wire/wire.h"
#include "wire/bytes.h"

namespace moesh::wire {

namespace {

using detail::ByteReader;
using detail::ByteWriter;

Status validate_probe(const ProbeMsg& m, StatusCode code) {
  if (m.request_id == 0) return make_error(code, "PROBE: request id 0 is reserved");
  if (m.timeout_ms == 0 || m.timeout_ms > kMaxProbeMs)
    return make_error(code, "PROBE: timeout {} ms outside 1..{}", m.timeout_ms, kMaxProbeMs);
  if (m.targets.empty() || m.targets.size() > kMaxProbeTargets)
    return make_error(code, "PROBE: {} addresses (1..{})", m.targets.size(), kMaxProbeTargets);
  for (size_t i = 0; i < m.targets.size(); ++i) {
    const std::string& t = m.targets[i];
    if (t.empty() || t.size() > kMaxProbeAddressBytes)
      return make_error(code, "PROBE: address {} is {} bytes (1..{})", i, t.size(), kMaxProbeAddressBytes);
    for (const char c : t) {
      if (c < 0x21 || c > 0x7e)
        return make_error(code, "PROBE: address {} has byte 0x{:02x}", i, static_cast<uint8_t>(c));
    }
  }
  return Status::ok();
}

Status validate_probe_reply(const ProbeReplyMsg& m, StatusCode code) {
  if (m.request_id == 0) return make_error(code, "PROBE_REPLY: request id 0 is reserved");
  if (m.rtt_us.empty() || m.rtt_us.size() > kMaxProbeTargets)
    return make_error(code, "PROBE_REPLY: {} figures (1..{})", m.rtt_us.size(), kMaxProbeTargets);
  return Status::ok();
}

}  // namespace

Result<std::vector<uint8_t>> encode_probe(const ProbeMsg& m) {
  MOESH_RETURN_IF_ERROR(validate_probe(m, StatusCode::kInvalidArgument));
  std::vector<uint8_t> payload;
  ByteWriter w(&payload);
  w.u32(m.timeout_ms);
  w.u32(static_cast<uint32_t>(m.targets.size()));
  for (const std::string& t : m.targets) {
    w.u16(static_cast<uint16_t>(t.size()));
    w.raw(t.data(), t.size());
  }
  return build_frame(MsgType::kProbe, m.request_id, payload);
}

Result<ProbeMsg> decode_probe(const Frame& f) {
  if (f.type() != MsgType::kProbe)
    return make_error(StatusCode::kInvalidArgument, "expected a PROBE frame, got {}", msg_type_name(f.type()));
  ByteReader r(f.payload);
  ProbeMsg m;
  m.request_id = f.request_id();
  uint32_t n = 0;
  if (!r.u32(&m.timeout_ms) || !r.u32(&n))
    return make_error(StatusCode::kCorrupt, "PROBE payload is {} bytes (at least 8)", f.payload.size());
  if (n == 0 || n > kMaxProbeTargets)
    return make_error(StatusCode::kCorrupt, "PROBE: {} addresses (1..{})", n, kMaxProbeTargets);
  for (uint32_t i = 0; i < n; ++i) {
    uint16_t len = 0;
    std::span<const uint8_t> bytes;
    if (!r.u16(&len) || !r.view(len, &bytes))
      return make_error(StatusCode::kCorrupt, "PROBE: address {} runs past the payload (offset {})", i, r.pos());
    m.targets.emplace_back(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  if (r.remaining() != 0)
    return make_error(StatusCode::kCorrupt, "PROBE: {} bytes after the last address", r.remaining());
  MOESH_RETURN_IF_ERROR(validate_probe(m, StatusCode::kCorrupt));
  return m;
}

Result<std::vector<uint8_t>> encode_probe_reply(const ProbeReplyMsg& m) {
  MOESH_RETURN_IF_ERROR(validate_probe_reply(m, StatusCode::kInvalidArgument));
  std::vector<uint8_t> payload;
  ByteWriter w(&payload);
  w.u32(static_cast<uint32_t>(m.rtt_us.size()));
  for (const uint32_t v : m.rtt_us) w.u32(v);
  return build_frame(MsgType::kProbeReply, m.request_id, payload);
}

Result<ProbeReplyMsg> decode_probe_reply(const Frame& f) {
  if (f.type() != MsgType::kProbeReply)
    return make_error(StatusCode::kInvalidArgument, "expected a PROBE_REPLY frame, got {}", msg_type_name(f.type()));
  ByteReader r(f.payload);
  ProbeReplyMsg m;
  m.request_id = f.request_id();
  uint32_t n = 0;
  if (!r.u32(&n) || n == 0 || n > kMaxProbeTargets)
    return make_error(StatusCode::kCorrupt, "PROBE_REPLY: {} figures (1..{})", n, kMaxProbeTargets);
  if (r.remaining() != size_t{4} * n)
    return make_error(StatusCode::kCorrupt, "PROBE_REPLY payload is {} bytes (must be {} for {} figures)",
                      f.payload.size(), 4 + size_t{4} * n, n);
  m.rtt_us.resize(n);
  for (uint32_t& v : m.rtt_us) (void)r.u32(&v);
  MOESH_RETURN_IF_ERROR(validate_probe_reply(m, StatusCode::kCorrupt));
  return m;
}

}  // namespace moesh::wire
