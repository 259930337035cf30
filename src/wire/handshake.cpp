// HELLO codec and version/capability negotiation (PROTOCOL.md §3).
#include <algorithm>
#include <cstring>
#include <string>

#include "moesh/wire/wire.h"
#include "wire/bytes.h"

namespace moesh::wire {

namespace {

using detail::ByteReader;
using detail::ByteWriter;

constexpr size_t kHelloFixedBytes = 68;
constexpr size_t kRangeBytes = 12;
constexpr uint32_t kAllDtypes = (1u << static_cast<uint32_t>(WireDType::kCOUNT)) - 1;
constexpr uint32_t kAllModes = (1u << static_cast<uint32_t>(CombineMode::kCOUNT)) - 1;

Status validate_hello(const Hello& m, StatusCode code) {
  if (m.min_version == 0 || m.min_version > m.max_version)
    return make_error(code, "HELLO: version range {}..{} invalid", m.min_version, m.max_version);
  if (m.role != PeerRole::kBackbone && m.role != PeerRole::kWorker)
    return make_error(code, "HELLO: unknown role {}", static_cast<int>(m.role));
  if (m.model_id_bytes != 16 && m.model_id_bytes != 32)
    return make_error(code, "HELLO: model id of {} bytes (16 or 32 allowed)", m.model_id_bytes);
  for (size_t i = m.model_id_bytes; i < m.model_id.size(); ++i)
    if (m.model_id[i] != 0) return make_error(code, "HELLO: model id bytes past {} not zero", m.model_id_bytes);
  if ((m.dtypes & ~kAllDtypes) != 0 || (m.modes & ~kAllModes) != 0)
    return make_error(code, "HELLO: unknown capability bits (dtypes 0x{:x}, modes 0x{:x})", m.dtypes, m.modes);
  if ((m.features & ~kAllFeatures) != 0)
    return make_error(code, "HELLO: unknown feature bits 0x{:x}", m.features & ~kAllFeatures);
  // A HELLO claiming an older max_version has that version's layout, which has no features field.
  if (m.features != 0 && m.max_version < 3)
    return make_error(code, "HELLO: features 0x{:x} in a v{} HELLO (the field is v3)", m.features, m.max_version);
  if (m.expert_act > kExpertActSitu ||
      (m.expert_flags & ~(kExpertFlagBiases | kExpertFlagInputScaled | kExpertFlagSwigluLimit)) != 0)
    return make_error(code, "HELLO: unknown expert FFN (activation {}, flags 0x{:x})", m.expert_act, m.expert_flags);
  if ((m.expert_act != 0 || m.expert_flags != 0) && m.max_version < 4)
    return make_error(code, "HELLO: an expert FFN definition in a v{} HELLO (the field is v4)", m.max_version);
  if (m.experts.size() > kMaxExpertRanges)
    return make_error(code, "HELLO: {} expert ranges (max {})", m.experts.size(), kMaxExpertRanges);
  if (m.name.size() > kMaxNameBytes)
    return make_error(code, "HELLO: name of {} bytes (max {})", m.name.size(), kMaxNameBytes);
  if (!m.layer_act.empty() && m.n_layer != 0 && m.layer_act.size() != m.n_layer)
    return make_error(code, "HELLO: activation table of {} layers for a {}-layer model", m.layer_act.size(), m.n_layer);
  if (m.layer_act.size() > 0xFFFF)
    return make_error(code, "HELLO: activation table of {} entries (max 65535)", m.layer_act.size());
  for (size_t l = 0; l < m.layer_act.size(); ++l) {
    const uint8_t a = m.layer_act[l];
    if (a != kNoActDType && a != static_cast<uint8_t>(WireDType::kQ8) && a != static_cast<uint8_t>(WireDType::kQ8K))
      return make_error(code, "HELLO: layer {} activation dtype {} is not q8, q8k or none (0xff)", l, a);
  }
  if (m.max_frame_bytes < 4096)
    return make_error(code, "HELLO: max frame of {} bytes is below the 4096 minimum", m.max_frame_bytes);
  for (const ExpertRange& r : m.experts) {
    if (r.count == 0) return make_error(code, "HELLO: empty expert range in layer {}", r.layer);
    if (m.n_layer != 0 && r.layer >= m.n_layer)
      return make_error(code, "HELLO: expert range layer {} past n_layer {}", r.layer, m.n_layer);
    if (uint64_t{r.first} + r.count > (m.n_expert != 0 ? m.n_expert : 65536u))
      return make_error(code, "HELLO: experts {}..{} of layer {} out of range", r.first,
                        uint64_t{r.first} + r.count - 1, r.layer);
  }
  return Status::ok();
}

}  // namespace

Result<std::vector<uint8_t>> encode_hello(const Hello& m) {
  MOESH_RETURN_IF_ERROR(validate_hello(m, StatusCode::kInvalidArgument));
  std::vector<uint8_t> payload;
  payload.reserve(kHelloFixedBytes + kRangeBytes * m.experts.size() + m.name.size());
  ByteWriter w(&payload);
  w.u16(m.min_version);
  w.u16(m.max_version);
  w.u8(static_cast<uint8_t>(m.role));
  w.u8(m.model_id_bytes);
  w.u16(0);
  w.raw(m.model_id.data(), m.model_id.size());
  w.u32(m.n_layer);
  w.u32(m.n_expert);
  w.u32(m.n_embd);
  w.u32(m.dtypes);
  w.u32(m.modes);
  w.u32(m.max_frame_bytes);
  w.u16(static_cast<uint16_t>(m.experts.size()));
  w.u16(static_cast<uint16_t>(m.name.size()));
  for (const ExpertRange& r : m.experts) {
    w.u32(r.layer);
    w.u32(r.first);
    w.u32(r.count);
  }
  w.raw(m.name.data(), m.name.size());
  // v2: the activation table (a HELLO claiming only v1 has the v1 layout, for tests of old peers).
  if (m.max_version >= 2) {
    w.u16(static_cast<uint16_t>(m.layer_act.size()));
    w.raw(m.layer_act.data(), m.layer_act.size());
  }
  if (m.max_version >= 3) w.u32(m.features);
  if (m.max_version >= 4) {
    w.u8(m.expert_act);
    w.u8(m.expert_flags);
  }
  // The frame header carries our highest version: a newer peer reads our HELLO that way.
  return build_frame(MsgType::kHello, 0, payload, m.max_version);
}

Result<Hello> decode_hello(const Frame& f) {
  if (f.type() != MsgType::kHello)
    return make_error(StatusCode::kInvalidArgument, "expected a HELLO frame, got {}", msg_type_name(f.type()));
  if (f.request_id() != 0)
    return make_error(StatusCode::kCorrupt, "HELLO with request id {} (must be 0)", f.request_id());
  ByteReader r(f.payload);
  Hello m;
  uint8_t role = 0;
  uint16_t reserved = 0, n_ranges = 0, name_len = 0;
  if (!r.u16(&m.min_version) || !r.u16(&m.max_version) || !r.u8(&role))
    return make_error(StatusCode::kCorrupt, "HELLO payload of {} bytes too short for its version prefix",
                      f.payload.size());
  m.role = static_cast<PeerRole>(role);
  if (!r.u8(&m.model_id_bytes) || !r.u16(&reserved) || !r.raw(m.model_id.data(), m.model_id.size()) ||
      !r.u32(&m.n_layer) || !r.u32(&m.n_expert) || !r.u32(&m.n_embd) || !r.u32(&m.dtypes) || !r.u32(&m.modes) ||
      !r.u32(&m.max_frame_bytes) || !r.u16(&n_ranges) || !r.u16(&name_len))
    return make_error(StatusCode::kCorrupt, "HELLO payload of {} bytes shorter than its {}-byte fixed part",
                      f.payload.size(), kHelloFixedBytes);
  if (reserved != 0) return make_error(StatusCode::kCorrupt, "HELLO: reserved field is {}", reserved);
  // The header of a HELLO carries the sender's highest version (that is how a newer layout is
  // recognised before the payload is read), so the two must agree.
  if (f.header.version != m.max_version)
    return make_error(StatusCode::kCorrupt, "HELLO header version {} but payload max_version {}", f.header.version,
                      m.max_version);
  if (n_ranges > kMaxExpertRanges)
    return make_error(StatusCode::kCorrupt, "HELLO: {} expert ranges (max {})", n_ranges, kMaxExpertRanges);
  if (name_len > kMaxNameBytes)
    return make_error(StatusCode::kCorrupt, "HELLO: name of {} bytes (max {})", name_len, kMaxNameBytes);
  const size_t need = size_t{kRangeBytes} * n_ranges + name_len;
  if (r.remaining() < need)
    return make_error(StatusCode::kCorrupt, "HELLO: {} ranges and a {}-byte name need {} bytes, {} left", n_ranges,
                      name_len, need, r.remaining());
  // A v1 HELLO ends after the name (it is still read, so negotiation can say which versions the
  // peer speaks).
  if (f.header.version < 2 && r.remaining() != need)
    return make_error(StatusCode::kCorrupt, "HELLO: {} unexpected trailing bytes", r.remaining() - need);
  m.experts.resize(n_ranges);
  for (ExpertRange& e : m.experts) (void)(r.u32(&e.layer) && r.u32(&e.first) && r.u32(&e.count));
  m.name.resize(name_len);
  (void)r.raw(m.name.data(), name_len);
  if (f.header.version >= 2) {
    uint16_t n_act = 0;
    if (!r.u16(&n_act))
      return make_error(StatusCode::kCorrupt, "HELLO v{} without its activation table count", f.header.version);
    if (r.remaining() < n_act)
      return make_error(StatusCode::kCorrupt, "HELLO: activation table of {} layers needs {} bytes, {} left", n_act,
                        n_act, r.remaining());
    m.layer_act.resize(n_act);
    (void)r.raw(m.layer_act.data(), n_act);
  }
  if (f.header.version >= 3 && !r.u32(&m.features))
    return make_error(StatusCode::kCorrupt, "HELLO v{}: payload ends before its features field", f.header.version);
  if (f.header.version >= 4 && !(r.u8(&m.expert_act) && r.u8(&m.expert_flags)))
    return make_error(StatusCode::kCorrupt, "HELLO v{}: payload ends before its expert FFN definition",
                      f.header.version);
  // A newer version may append fields after ours; the layouts up to our own are exact.
  if (f.header.version <= kVersion && r.remaining() != 0)
    return make_error(StatusCode::kCorrupt, "HELLO: {} unexpected trailing bytes", r.remaining());
  // Feature bits we do not know of are a newer build's to offer, at any version: the intersection
  // in negotiate() simply never picks them (so a worker of a later build, with a feature added
  // since, still serves this backbone, and the other way round).
  m.features &= kAllFeatures;
  if (f.header.version > kVersion) {
    // Capabilities we do not know of are a newer peer's to offer, not an error.
    m.dtypes &= kAllDtypes;
    m.modes &= kAllModes;
    for (uint8_t& a : m.layer_act)
      if (a != static_cast<uint8_t>(WireDType::kQ8) && a != static_cast<uint8_t>(WireDType::kQ8K)) a = kNoActDType;
  }
  Status st = validate_hello(m, StatusCode::kCorrupt);
  if (!st.is_ok()) return st;
  return m;
}

std::string expert_ffn_name(uint8_t act, uint8_t flags) {
  std::string s = act == kExpertActSilu        ? "silu"
                  : act == kExpertActSwigluOai ? "swiglu-oai"
                  : act == kExpertActSitu      ? "situ"
                                               : "activation " + std::to_string(act);
  if (flags & kExpertFlagBiases) s += "+bias";
  if (flags & kExpertFlagInputScaled) s += ", weight on input";
  if (flags & kExpertFlagSwigluLimit) s += ", clamped per layer";
  return s;
}

Result<Session> negotiate(const Hello& local, const Hello& peer) {
  const uint16_t lo = std::max(local.min_version, peer.min_version);
  const uint16_t hi = std::min(local.max_version, peer.max_version);
  if (lo > hi)
    return make_error(StatusCode::kUnsupported, "no common protocol version: we speak {}..{}, peer '{}' {}..{}{}",
                      local.min_version, local.max_version, peer.name, peer.min_version, peer.max_version,
                      peer.max_version < 4 && local.min_version >= 4
                          ? " (v4 puts the model's expert FFN definition in the handshake, which a "
                            "worker must agree to: upgrade the peer)"
                          : "");
  if (local.model_id_bytes != peer.model_id_bytes ||
      std::memcmp(local.model_id.data(), peer.model_id.data(), local.model_id_bytes) != 0)
    return make_error(StatusCode::kInvalidArgument, "peer '{}' serves a different model (identity hash differs)",
                      peer.name);
  if (local.n_layer != peer.n_layer || local.n_expert != peer.n_expert || local.n_embd != peer.n_embd)
    return make_error(StatusCode::kInvalidArgument,
                      "peer '{}' model shape {} layers x {} experts x {} embd, ours {} x {} x {}", peer.name,
                      peer.n_layer, peer.n_expert, peer.n_embd, local.n_layer, local.n_expert, local.n_embd);
  if (local.role == peer.role)
    return make_error(StatusCode::kInvalidArgument, "peer '{}' has the same role as we do", peer.name);
  if (hi >= 4 && (local.expert_act != peer.expert_act || local.expert_flags != peer.expert_flags))
    return make_error(StatusCode::kInvalidArgument,
                      "peer '{}' computes routed experts as {}, our model defines them as {}: refusing a "
                      "worker that would return another function",
                      peer.name, expert_ffn_name(peer.expert_act, peer.expert_flags),
                      expert_ffn_name(local.expert_act, local.expert_flags));
  Session s;
  s.version = hi;
  s.dtypes = local.dtypes & peer.dtypes;
  s.modes = local.modes & peer.modes;
  if (s.dtypes == 0 || s.modes == 0)
    return make_error(StatusCode::kUnsupported,
                      "no common wire dtype/combine mode with peer '{}' (dtypes 0x{:x}/0x{:x}, modes 0x{:x}/0x{:x})",
                      peer.name, local.dtypes, peer.dtypes, local.modes, peer.modes);
  s.max_send_bytes = peer.max_frame_bytes;
  // Optional: a session without common features still works (DISPATCH/COMBINE need none).
  s.features = local.features & peer.features;
  s.peer = peer;
  return s;
}

}  // namespace moesh::wire
