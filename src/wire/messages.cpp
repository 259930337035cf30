// DISPATCH / COMBINE / FETCH / SLAB / STORE / STORED / PING / PONG / GOODBYE / ERROR payload codecs (PROTOCOL.md §4).
//
// Each message has one validate_* routine shared by its encoder (a bad message is the caller's
// bug: kInvalidArgument) and its decoder (a bad frame is the peer's: kCorrupt), so what we send
// and what we accept can never drift apart.
#include <xxhash.h>

#include <cmath>
#include <cstring>

#include "moesh/wire/wire.h"
#include "wire/bytes.h"

namespace moesh::wire {

namespace detail {
Status check_rows(StatusCode code, const char* what, const WireRows& rows, const DecodeLimits& lim) {
  if (static_cast<uint8_t>(rows.dtype) >= static_cast<uint8_t>(WireDType::kCOUNT))
    return make_error(code, "{}: unknown wire dtype {}", what, static_cast<int>(rows.dtype));
  const size_t want = wire_row_bytes(rows.dtype, rows.n_cols) * rows.n_rows;
  if (rows.bytes.size() != want)
    return make_error(code, "{}: rows hold {} bytes, {}x{} {} needs {}", what, rows.bytes.size(), rows.n_rows,
                      rows.n_cols, wire_dtype_name(rows.dtype), want);
  if (!lim.allow_non_finite) {
    Status st = check_rows_finite(rows);
    if (!st.is_ok()) return Status(code, fmt::format("{}: {}", what, st.message()));
  }
  return Status::ok();
}

}  // namespace detail

using detail::check_rows;

namespace {

using detail::ByteReader;
using detail::ByteWriter;

constexpr size_t kDispatchFixedBytes = 24;
constexpr size_t kCombineFixedBytes = 24;
constexpr size_t kPairBytes = 8;
constexpr size_t kFetchBytes = 8;
constexpr size_t kSlabFixedBytes = 8;
constexpr size_t kInfoBytesV1 = 48;            // u32 threads, u32 cores, 5 x u64
constexpr size_t kInfoBytes = 72;              // and memory: total, available, offered
constexpr size_t kStoredBytes = 24;            // u32 layer, u32 expert, u64 replica bytes, u64 budget
constexpr size_t kSlabTensorHeaderBytes = 36;  // u32 type, u64 ne0, ne1, byte count, hash
constexpr const char* kSlabTensorNames[3] = {"gate", "up", "down"};

size_t align4(size_t n) {
  return (n + 3) & ~size_t{3};
}

bool dtype_ok(uint8_t v) {
  return v < static_cast<uint8_t>(WireDType::kCOUNT);
}
bool mode_ok(uint8_t v) {
  return v < static_cast<uint8_t>(CombineMode::kCOUNT);
}

Status check_type(const Frame& f, MsgType want) {
  if (f.type() != want)
    return make_error(StatusCode::kInvalidArgument, "expected a {} frame, got {}", msg_type_name(want),
                      msg_type_name(f.type()));
  return Status::ok();
}

Status check_shape(StatusCode code, const char* what, uint32_t n_tokens, uint32_t n_embd, const DecodeLimits& lim) {
  if (n_tokens == 0) return make_error(code, "{}: n_tokens is 0", what);
  if (n_embd == 0 || n_embd > lim.max_n_embd)
    return make_error(code, "{}: n_embd {} outside 1..{}", what, n_embd, lim.max_n_embd);
  return Status::ok();
}

Status check_layer(StatusCode code, const char* what, uint32_t layer, const DecodeLimits& lim) {
  if (lim.n_layer != 0 && layer >= lim.n_layer)
    return make_error(code, "{}: layer {} out of range (model has {})", what, layer, lim.n_layer);
  return Status::ok();
}

// Everything about a DISPATCH except the byte count of the frame itself.
Status validate_dispatch(const DispatchMsg& m, const DecodeLimits& lim, StatusCode code) {
  if (m.request_id == 0) return make_error(code, "DISPATCH: request id 0 is reserved");
  if (!mode_ok(static_cast<uint8_t>(m.mode)))
    return make_error(code, "DISPATCH: unknown combine mode {}", static_cast<int>(m.mode));
  if (!dtype_ok(static_cast<uint8_t>(m.return_dtype)))
    return make_error(code, "DISPATCH: unknown return dtype {}", static_cast<int>(m.return_dtype));
  MOESH_RETURN_IF_ERROR(check_layer(code, "DISPATCH", m.layer, lim));
  MOESH_RETURN_IF_ERROR(check_shape(code, "DISPATCH", m.n_tokens(), m.n_embd(), lim));
  if (m.pair_counts.size() != m.n_tokens())
    return make_error(code, "DISPATCH: {} pair counts for {} tokens", m.pair_counts.size(), m.n_tokens());
  size_t total = 0;
  for (uint32_t t = 0; t < m.n_tokens(); ++t) {
    if (m.pair_counts[t] == 0) return make_error(code, "DISPATCH: token {} has no expert pairs", t);
    total += m.pair_counts[t];
  }
  if (total != m.pairs.size())
    return make_error(code, "DISPATCH: pair counts sum to {} but {} pairs sent", total, m.pairs.size());
  size_t at = 0;
  for (uint32_t t = 0; t < m.n_tokens(); ++t) {
    const uint32_t k = m.pair_counts[t];
    for (uint32_t i = 0; i < k; ++i) {
      const ExpertPair& p = m.pairs[at + i];
      if (lim.n_expert != 0 && p.expert >= lim.n_expert)
        return make_error(code, "DISPATCH: token {} expert id {} out of range (layer has {})", t, p.expert,
                          lim.n_expert);
      if (!lim.allow_non_finite && !std::isfinite(p.weight))
        return make_error(code, "DISPATCH: token {} expert {} has non-finite weight", t, p.expert);
      for (uint32_t j = 0; j < i; ++j) {
        const ExpertPair& q = m.pairs[at + j];
        if (q.expert == p.expert) return make_error(code, "DISPATCH: token {} lists expert {} twice", t, p.expert);
      }
      // Ranks strictly increase within a token: the partial sum and the backbone's exact sum
      // both run in rank order, and a duplicate rank would make that order ambiguous.
      if (i > 0 && p.rank <= m.pairs[at + i - 1].rank)
        return make_error(code, "DISPATCH: token {} ranks not strictly increasing ({} after {})", t, p.rank,
                          m.pairs[at + i - 1].rank);
    }
    at += k;
  }
  return check_rows(code, "DISPATCH hidden", m.hidden, lim);
}

Status validate_combine(const CombineMsg& m, const DecodeLimits& lim, StatusCode code) {
  if (m.request_id == 0) return make_error(code, "COMBINE: request id 0 is reserved");
  if (!mode_ok(static_cast<uint8_t>(m.mode)))
    return make_error(code, "COMBINE: unknown combine mode {}", static_cast<int>(m.mode));
  MOESH_RETURN_IF_ERROR(check_layer(code, "COMBINE", m.layer, lim));
  MOESH_RETURN_IF_ERROR(check_shape(code, "COMBINE", m.n_tokens, m.rows.n_cols, lim));
  const uint64_t n_rows = m.rows.n_rows;
  if (m.mode == CombineMode::kPartial && n_rows != m.n_tokens)
    return make_error(code, "COMBINE partial: {} rows for {} tokens", n_rows, m.n_tokens);
  if (m.mode == CombineMode::kExact && (n_rows < m.n_tokens || n_rows > uint64_t{m.n_tokens} * kMaxPairsPerToken))
    return make_error(code, "COMBINE exact: {} rows impossible for {} tokens", n_rows, m.n_tokens);
  return check_rows(code, "COMBINE rows", m.rows, lim);
}

// Expert ids are u32 in FETCH/SLAB; without a model shape the HELLO range bound applies.
Status check_expert(StatusCode code, const char* what, uint32_t expert, const DecodeLimits& lim) {
  const uint64_t n = lim.n_expert != 0 ? lim.n_expert : 65536u;
  if (expert >= n) return make_error(code, "{}: expert {} out of range (layer has {})", what, expert, n);
  return Status::ok();
}

// The header of one SLAB tensor starting at payload offset `at` (byte count and hash follow at
// at+20 and at+28). The byte count must be exactly what the type and shape need, so a frame can
// neither hide extra bytes nor claim a slab it does not carry.
Status check_slab_tensor(StatusCode code, const char* what, int t, size_t at, uint32_t type, uint64_t ne0, uint64_t ne1,
                         uint64_t n_bytes) {
  const char* name = kSlabTensorNames[t];
  if (!type_is_known(type)) return make_error(code, "{} {}: unknown ggml type {} at offset {}", what, name, type, at);
  const GgmlType gt = static_cast<GgmlType>(type);
  if (ne0 == 0 || ne0 > kMaxSlabDim)
    return make_error(code, "{} {}: ne0 {} at offset {} outside 1..{}", what, name, ne0, at + 4, kMaxSlabDim);
  if (ne1 == 0 || ne1 > kMaxSlabDim)
    return make_error(code, "{} {}: ne1 {} at offset {} outside 1..{}", what, name, ne1, at + 12, kMaxSlabDim);
  if (ne0 % static_cast<uint64_t>(type_block_size(gt)) != 0)
    return make_error(code, "{} {}: ne0 {} at offset {} is not a multiple of the {} block of {}", what, name, ne0,
                      at + 4, type_name(gt), type_block_size(gt));
  // ne0 < 2^32 keeps a row under 2^35 bytes, and the check divides rather than multiplies, so a
  // hostile ne1 cannot overflow it.
  const uint64_t row = type_row_bytes(gt, static_cast<int64_t>(ne0));
  if (n_bytes % row != 0 || n_bytes / row != ne1) {
    const std::string need = row > UINT64_MAX / ne1 ? "over 2^64" : std::to_string(row * ne1);
    return make_error(code, "{} {}: byte count {} at offset {} but {} [{} x {}] is {} bytes", what, name, n_bytes,
                      at + 20, type_name(gt), ne0, ne1, need);
  }
  return Status::ok();
}

uint64_t slab_bytes_hash(std::span<const uint8_t> b) {
  return XXH3_64bits(b.data(), b.size());
}

Status check_text(StatusCode code, const char* what, const std::string& s, size_t max) {
  if (s.size() > max) return make_error(code, "{}: text of {} bytes exceeds {}", what, s.size(), max);
  return Status::ok();
}

// Reads a u16-length-prefixed text (the length already read into n).
bool read_text(ByteReader& r, size_t n, std::string* out) {
  std::span<const uint8_t> v;
  if (!r.view(n, &v)) return false;
  out->assign(reinterpret_cast<const char*>(v.data()), v.size());
  return true;
}

Status trailing(const char* what, const ByteReader& r) {
  if (r.remaining() != 0)
    return make_error(StatusCode::kCorrupt, "{}: {} unexpected trailing bytes", what, r.remaining());
  return Status::ok();
}

// Padding is zero so every accepted frame is the canonical encoding of its message.
Status check_zero_pad(const char* what, ByteReader& r) {
  std::span<const uint8_t> pad;
  (void)r.view(r.remaining(), &pad);
  for (uint8_t b : pad)
    if (b != 0) return make_error(StatusCode::kCorrupt, "{}: nonzero padding byte", what);
  return Status::ok();
}

}  // namespace

uint32_t DispatchMsg::n_result_rows() const {
  return mode == CombineMode::kPartial ? n_tokens() : static_cast<uint32_t>(pairs.size());
}

size_t dispatch_payload_bytes(uint32_t n_tokens, uint32_t n_pairs, uint32_t n_embd, WireDType t) {
  return kDispatchFixedBytes + align4(n_tokens) + kPairBytes * n_pairs + wire_row_bytes(t, n_embd) * n_tokens;
}

size_t combine_payload_bytes(uint32_t n_rows, uint32_t n_embd, WireDType t) {
  return kCombineFixedBytes + wire_row_bytes(t, n_embd) * n_rows;
}

size_t slab_payload_bytes(uint64_t gate_bytes, uint64_t up_bytes, uint64_t down_bytes) {
  return kSlabFixedBytes + 3 * kSlabTensorHeaderBytes + gate_bytes + up_bytes + down_bytes;
}

// ---- DISPATCH ----

Result<std::vector<uint8_t>> encode_dispatch(const DispatchMsg& m) {
  MOESH_RETURN_IF_ERROR(validate_dispatch(
      m, DecodeLimits{.max_frame_bytes = UINT32_MAX, .max_n_embd = UINT32_MAX, .allow_non_finite = true},
      StatusCode::kInvalidArgument));
  const uint32_t n_tokens = m.n_tokens();
  const size_t bytes =
      dispatch_payload_bytes(n_tokens, static_cast<uint32_t>(m.pairs.size()), m.n_embd(), m.hidden.dtype);
  if (bytes > UINT32_MAX)
    return make_error(StatusCode::kOutOfRange, "DISPATCH payload of {} bytes is too large", bytes);
  std::vector<uint8_t> payload;
  payload.reserve(bytes);
  ByteWriter w(&payload);
  w.u32(m.layer);
  w.u32(n_tokens);
  w.u32(m.n_embd());
  w.u32(static_cast<uint32_t>(m.pairs.size()));
  w.u8(static_cast<uint8_t>(m.hidden.dtype));
  w.u8(static_cast<uint8_t>(m.mode));
  w.u8(static_cast<uint8_t>(m.return_dtype));
  w.u8(0);
  w.u32(m.deadline_ms);
  w.raw(m.pair_counts.data(), n_tokens);
  w.zeros(align4(n_tokens) - n_tokens);
  for (const ExpertPair& p : m.pairs) {
    w.u16(p.expert);
    w.u8(p.rank);
    w.u8(0);
    w.f32(p.weight);
  }
  w.raw(m.hidden.bytes.data(), m.hidden.bytes.size());
  return build_frame(MsgType::kDispatch, m.request_id, payload);
}

Result<DispatchMsg> decode_dispatch(const Frame& f, const DecodeLimits& lim) {
  MOESH_RETURN_IF_ERROR(check_type(f, MsgType::kDispatch));
  ByteReader r(f.payload);
  DispatchMsg m;
  m.request_id = f.request_id();
  uint32_t n_tokens = 0, n_embd = 0, n_pairs = 0;
  uint8_t dtype = 0, mode = 0, rdtype = 0, reserved = 0;
  if (!r.u32(&m.layer) || !r.u32(&n_tokens) || !r.u32(&n_embd) || !r.u32(&n_pairs) || !r.u8(&dtype) || !r.u8(&mode) ||
      !r.u8(&rdtype) || !r.u8(&reserved) || !r.u32(&m.deadline_ms))
    return make_error(StatusCode::kCorrupt, "DISPATCH payload of {} bytes shorter than its {}-byte fixed part",
                      f.payload.size(), kDispatchFixedBytes);
  if (!dtype_ok(dtype)) return make_error(StatusCode::kCorrupt, "DISPATCH: unknown wire dtype {}", dtype);
  if (!mode_ok(mode)) return make_error(StatusCode::kCorrupt, "DISPATCH: unknown combine mode {}", mode);
  if (!dtype_ok(rdtype)) return make_error(StatusCode::kCorrupt, "DISPATCH: unknown return dtype {}", rdtype);
  if (reserved != 0) return make_error(StatusCode::kCorrupt, "DISPATCH: reserved byte is {}", reserved);
  MOESH_RETURN_IF_ERROR(check_shape(StatusCode::kCorrupt, "DISPATCH", n_tokens, n_embd, lim));
  if (n_pairs < n_tokens || uint64_t{n_pairs} > uint64_t{n_tokens} * kMaxPairsPerToken)
    return make_error(StatusCode::kCorrupt, "DISPATCH: {} pairs impossible for {} tokens", n_pairs, n_tokens);
  // The exact size follows from the counts; check it before allocating anything.
  const size_t want = dispatch_payload_bytes(n_tokens, n_pairs, n_embd, static_cast<WireDType>(dtype));
  if (f.payload.size() != want)
    return make_error(StatusCode::kCorrupt,
                      "DISPATCH payload is {} bytes but {} tokens, {} pairs, n_embd {} {} need {}", f.payload.size(),
                      n_tokens, n_pairs, n_embd, wire_dtype_name(static_cast<WireDType>(dtype)), want);
  m.mode = static_cast<CombineMode>(mode);
  m.return_dtype = static_cast<WireDType>(rdtype);
  m.pair_counts.resize(n_tokens);
  (void)r.raw(m.pair_counts.data(), n_tokens);
  for (size_t i = n_tokens; i < align4(n_tokens); ++i) {
    uint8_t pad = 0;
    (void)r.u8(&pad);
    if (pad != 0) return make_error(StatusCode::kCorrupt, "DISPATCH: nonzero padding after pair counts");
  }
  m.pairs.resize(n_pairs);
  for (ExpertPair& p : m.pairs) {
    uint8_t pad = 0;
    (void)r.u16(&p.expert);
    (void)r.u8(&p.rank);
    (void)r.u8(&pad);
    (void)r.f32(&p.weight);
    if (pad != 0) return make_error(StatusCode::kCorrupt, "DISPATCH: nonzero reserved byte in a pair");
  }
  m.hidden.dtype = static_cast<WireDType>(dtype);
  m.hidden.n_rows = n_tokens;
  m.hidden.n_cols = n_embd;
  std::span<const uint8_t> rows;
  (void)r.view(r.remaining(), &rows);
  m.hidden.bytes.assign(rows.begin(), rows.end());
  MOESH_RETURN_IF_ERROR(validate_dispatch(m, lim, StatusCode::kCorrupt));
  return m;
}

// ---- COMBINE ----

Result<std::vector<uint8_t>> encode_combine(const CombineMsg& m) {
  MOESH_RETURN_IF_ERROR(validate_combine(
      m, DecodeLimits{.max_frame_bytes = UINT32_MAX, .max_n_embd = UINT32_MAX, .allow_non_finite = true},
      StatusCode::kInvalidArgument));
  const size_t bytes = combine_payload_bytes(m.rows.n_rows, m.rows.n_cols, m.rows.dtype);
  if (bytes > UINT32_MAX) return make_error(StatusCode::kOutOfRange, "COMBINE payload of {} bytes is too large", bytes);
  std::vector<uint8_t> payload;
  payload.reserve(bytes);
  ByteWriter w(&payload);
  w.u32(m.layer);
  w.u32(m.n_tokens);
  w.u32(m.rows.n_cols);
  w.u32(m.rows.n_rows);
  w.u8(static_cast<uint8_t>(m.mode));
  w.u8(static_cast<uint8_t>(m.rows.dtype));
  w.u16(0);
  w.u32(m.compute_us);
  w.raw(m.rows.bytes.data(), m.rows.bytes.size());
  return build_frame(MsgType::kCombine, m.request_id, payload);
}

Result<CombineMsg> decode_combine(const Frame& f, const DecodeLimits& lim) {
  MOESH_RETURN_IF_ERROR(check_type(f, MsgType::kCombine));
  ByteReader r(f.payload);
  CombineMsg m;
  m.request_id = f.request_id();
  uint32_t n_embd = 0, n_rows = 0;
  uint8_t mode = 0, dtype = 0;
  uint16_t reserved = 0;
  if (!r.u32(&m.layer) || !r.u32(&m.n_tokens) || !r.u32(&n_embd) || !r.u32(&n_rows) || !r.u8(&mode) || !r.u8(&dtype) ||
      !r.u16(&reserved) || !r.u32(&m.compute_us))
    return make_error(StatusCode::kCorrupt, "COMBINE payload of {} bytes shorter than its {}-byte fixed part",
                      f.payload.size(), kCombineFixedBytes);
  if (!mode_ok(mode)) return make_error(StatusCode::kCorrupt, "COMBINE: unknown combine mode {}", mode);
  if (!dtype_ok(dtype)) return make_error(StatusCode::kCorrupt, "COMBINE: unknown wire dtype {}", dtype);
  if (reserved != 0) return make_error(StatusCode::kCorrupt, "COMBINE: reserved field is {}", reserved);
  MOESH_RETURN_IF_ERROR(check_shape(StatusCode::kCorrupt, "COMBINE", m.n_tokens, n_embd, lim));
  const size_t want = combine_payload_bytes(n_rows, n_embd, static_cast<WireDType>(dtype));
  if (f.payload.size() != want)
    return make_error(StatusCode::kCorrupt, "COMBINE payload is {} bytes but {} rows of n_embd {} {} need {}",
                      f.payload.size(), n_rows, n_embd, wire_dtype_name(static_cast<WireDType>(dtype)), want);
  m.mode = static_cast<CombineMode>(mode);
  m.rows.dtype = static_cast<WireDType>(dtype);
  m.rows.n_rows = n_rows;
  m.rows.n_cols = n_embd;
  std::span<const uint8_t> rows;
  (void)r.view(r.remaining(), &rows);
  m.rows.bytes.assign(rows.begin(), rows.end());
  MOESH_RETURN_IF_ERROR(validate_combine(m, lim, StatusCode::kCorrupt));
  return m;
}

Status check_combine_matches(const DispatchMsg& req, const CombineMsg& reply) {
  auto bad = [&](const std::string& what) {
    return make_error(StatusCode::kCorrupt, "COMBINE for request {} does not match its DISPATCH: {}", req.request_id,
                      what);
  };
  if (reply.request_id != req.request_id) return bad(fmt::format("request id {}", reply.request_id));
  if (reply.layer != req.layer) return bad(fmt::format("layer {} vs {}", reply.layer, req.layer));
  if (reply.mode != req.mode) return bad(fmt::format("mode {}", combine_mode_name(reply.mode)));
  if (reply.rows.dtype != req.return_dtype)
    return bad(fmt::format("dtype {} vs {}", wire_dtype_name(reply.rows.dtype), wire_dtype_name(req.return_dtype)));
  if (reply.n_tokens != req.n_tokens()) return bad(fmt::format("n_tokens {} vs {}", reply.n_tokens, req.n_tokens()));
  if (reply.rows.n_cols != req.n_embd()) return bad(fmt::format("n_embd {} vs {}", reply.rows.n_cols, req.n_embd()));
  if (reply.rows.n_rows != req.n_result_rows())
    return bad(fmt::format("{} rows vs {}", reply.rows.n_rows, req.n_result_rows()));
  return Status::ok();
}

// ---- FETCH / SLAB ----

namespace {

// FETCH and UNSTORE carry the same payload (u32 layer, u32 expert); `what` names the type in errors.
Result<std::vector<uint8_t>> encode_expert_ref(MsgType type, const char* what, const FetchMsg& m) {
  if (m.request_id == 0) return make_error(StatusCode::kInvalidArgument, "{}: request id 0 is reserved", what);
  MOESH_RETURN_IF_ERROR(check_expert(StatusCode::kInvalidArgument, what, m.expert, DecodeLimits{}));
  std::vector<uint8_t> payload;
  ByteWriter w(&payload);
  w.u32(m.layer);
  w.u32(m.expert);
  return build_frame(type, m.request_id, payload);
}

Result<FetchMsg> decode_expert_ref(MsgType type, const char* what, const Frame& f, const DecodeLimits& lim) {
  MOESH_RETURN_IF_ERROR(check_type(f, type));
  if (f.request_id() == 0) return make_error(StatusCode::kCorrupt, "{}: request id 0 is reserved", what);
  if (f.payload.size() != kFetchBytes)
    return make_error(StatusCode::kCorrupt, "{} payload is {} bytes (must be {})", what, f.payload.size(), kFetchBytes);
  ByteReader r(f.payload);
  FetchMsg m;
  m.request_id = f.request_id();
  (void)(r.u32(&m.layer) && r.u32(&m.expert));
  MOESH_RETURN_IF_ERROR(check_layer(StatusCode::kCorrupt, what, m.layer, lim));
  MOESH_RETURN_IF_ERROR(check_expert(StatusCode::kCorrupt, what, m.expert, lim));
  return m;
}

}  // namespace

Result<std::vector<uint8_t>> encode_fetch(const FetchMsg& m) {
  return encode_expert_ref(MsgType::kFetch, "FETCH", m);
}

Result<FetchMsg> decode_fetch(const Frame& f, const DecodeLimits& lim) {
  return decode_expert_ref(MsgType::kFetch, "FETCH", f, lim);
}

Result<std::vector<uint8_t>> encode_unstore(const UnstoreMsg& m) {
  return encode_expert_ref(MsgType::kUnstore, "UNSTORE", m);
}

Result<UnstoreMsg> decode_unstore(const Frame& f, const DecodeLimits& lim) {
  return decode_expert_ref(MsgType::kUnstore, "UNSTORE", f, lim);
}

namespace {

// SLAB and STORE carry the same payload (one expert's three slabs); `what` names the type in errors.
Result<std::vector<uint8_t>> encode_slab_frame(MsgType type, const char* what, const SlabMsg& m) {
  constexpr StatusCode kBad = StatusCode::kInvalidArgument;
  if (m.request_id == 0) return make_error(kBad, "{}: request id 0 is reserved", what);
  MOESH_RETURN_IF_ERROR(check_expert(kBad, what, m.expert, DecodeLimits{}));
  size_t at = kSlabFixedBytes;
  for (int t = 0; t < 3; ++t) {
    const SlabTensor& s = m.tensors[t];
    MOESH_RETURN_IF_ERROR(
        check_slab_tensor(kBad, what, t, at, static_cast<uint32_t>(s.type), s.ne0, s.ne1, s.bytes.size()));
    // The hash is not recomputed here: the sender may have cached it, and decode_slab checks it.
    at += kSlabTensorHeaderBytes + s.bytes.size();
  }
  const size_t bytes =
      slab_payload_bytes(m.tensors[0].bytes.size(), m.tensors[1].bytes.size(), m.tensors[2].bytes.size());
  if (bytes > UINT32_MAX)
    return make_error(StatusCode::kOutOfRange, "{} payload of {} bytes is too large", what, bytes);
  std::vector<uint8_t> payload;
  payload.reserve(bytes);
  ByteWriter w(&payload);
  w.u32(m.layer);
  w.u32(m.expert);
  for (const SlabTensor& s : m.tensors) {
    w.u32(static_cast<uint32_t>(s.type));
    w.u64(s.ne0);
    w.u64(s.ne1);
    w.u64(s.bytes.size());
    w.u64(s.hash);
    w.raw(s.bytes.data(), s.bytes.size());
  }
  return build_frame(type, m.request_id, payload);
}

Result<SlabMsg> decode_slab_frame(MsgType type, const char* what, const Frame& f, const DecodeLimits& lim) {
  MOESH_RETURN_IF_ERROR(check_type(f, type));
  if (f.request_id() == 0) return make_error(StatusCode::kCorrupt, "{}: request id 0 is reserved", what);
  ByteReader r(f.payload);
  SlabMsg m;
  m.request_id = f.request_id();
  if (!r.u32(&m.layer) || !r.u32(&m.expert))
    return make_error(StatusCode::kCorrupt, "{} payload of {} bytes shorter than its {}-byte fixed part", what,
                      f.payload.size(), kSlabFixedBytes);
  MOESH_RETURN_IF_ERROR(check_layer(StatusCode::kCorrupt, what, m.layer, lim));
  MOESH_RETURN_IF_ERROR(check_expert(StatusCode::kCorrupt, what, m.expert, lim));
  for (int t = 0; t < 3; ++t) {
    SlabTensor& s = m.tensors[t];
    const size_t at = r.pos();
    uint32_t type = 0;
    uint64_t n_bytes = 0;
    if (!r.u32(&type) || !r.u64(&s.ne0) || !r.u64(&s.ne1) || !r.u64(&n_bytes) || !r.u64(&s.hash))
      return make_error(StatusCode::kCorrupt, "{} {}: payload ends inside the tensor header at offset {}", what,
                        kSlabTensorNames[t], at);
    MOESH_RETURN_IF_ERROR(check_slab_tensor(StatusCode::kCorrupt, what, t, at, type, s.ne0, s.ne1, n_bytes));
    // Only bytes that are present are looked at (and only they are ever allocated).
    std::span<const uint8_t> data;
    if (!r.view(n_bytes, &data))
      return make_error(StatusCode::kCorrupt, "{} {}: byte count {} at offset {} but only {} bytes follow", what,
                        kSlabTensorNames[t], n_bytes, at + 20, r.remaining());
    const uint64_t h = slab_bytes_hash(data);
    if (h != s.hash)
      return make_error(StatusCode::kCorrupt,
                        "{} {}: bytes at offset {} hash to {:016x}, the hash at offset {} says {:016x}", what,
                        kSlabTensorNames[t], at + kSlabTensorHeaderBytes, h, at + 28, s.hash);
    s.type = static_cast<GgmlType>(type);
    s.bytes.assign(data.begin(), data.end());
  }
  MOESH_RETURN_IF_ERROR(trailing(what, r));
  return m;
}

}  // namespace

Result<std::vector<uint8_t>> encode_slab(const SlabMsg& m) {
  return encode_slab_frame(MsgType::kSlab, "SLAB", m);
}

Result<SlabMsg> decode_slab(const Frame& f, const DecodeLimits& lim) {
  return decode_slab_frame(MsgType::kSlab, "SLAB", f, lim);
}

// ---- STORE / STORED ----

Result<std::vector<uint8_t>> encode_store(const SlabMsg& m) {
  return encode_slab_frame(MsgType::kStore, "STORE", m);
}

Result<SlabMsg> decode_store(const Frame& f, const DecodeLimits& lim) {
  return decode_slab_frame(MsgType::kStore, "STORE", f, lim);
}

namespace {

// STORED and UNSTORED carry the same payload; `what` names the type in errors.
Result<std::vector<uint8_t>> encode_replica_figures(MsgType type, const char* what, const StoredMsg& m) {
  if (m.request_id == 0) return make_error(StatusCode::kInvalidArgument, "{}: request id 0 is reserved", what);
  MOESH_RETURN_IF_ERROR(check_expert(StatusCode::kInvalidArgument, what, m.expert, DecodeLimits{}));
  if (m.replica_bytes > m.budget_bytes)
    return make_error(StatusCode::kInvalidArgument, "{}: replica bytes {} over the budget of {}", what, m.replica_bytes,
                      m.budget_bytes);
  std::vector<uint8_t> payload;
  ByteWriter w(&payload);
  w.u32(m.layer);
  w.u32(m.expert);
  w.u64(m.replica_bytes);
  w.u64(m.budget_bytes);
  return build_frame(type, m.request_id, payload);
}

Result<StoredMsg> decode_replica_figures(MsgType type, const char* what, const Frame& f, const DecodeLimits& lim) {
  MOESH_RETURN_IF_ERROR(check_type(f, type));
  if (f.request_id() == 0) return make_error(StatusCode::kCorrupt, "{}: request id 0 is reserved", what);
  if (f.payload.size() != kStoredBytes)
    return make_error(StatusCode::kCorrupt, "{} payload is {} bytes (must be {})", what, f.payload.size(),
                      kStoredBytes);
  ByteReader r(f.payload);
  StoredMsg m;
  m.request_id = f.request_id();
  (void)(r.u32(&m.layer) && r.u32(&m.expert) && r.u64(&m.replica_bytes) && r.u64(&m.budget_bytes));
  MOESH_RETURN_IF_ERROR(check_layer(StatusCode::kCorrupt, what, m.layer, lim));
  MOESH_RETURN_IF_ERROR(check_expert(StatusCode::kCorrupt, what, m.expert, lim));
  if (m.replica_bytes > m.budget_bytes)
    return make_error(StatusCode::kCorrupt, "{}: replica bytes {} at offset 8 over the budget of {} at offset 16", what,
                      m.replica_bytes, m.budget_bytes);
  return m;
}

}  // namespace

Result<std::vector<uint8_t>> encode_stored(const StoredMsg& m) {
  return encode_replica_figures(MsgType::kStored, "STORED", m);
}

Result<StoredMsg> decode_stored(const Frame& f, const DecodeLimits& lim) {
  return decode_replica_figures(MsgType::kStored, "STORED", f, lim);
}

Result<std::vector<uint8_t>> encode_unstored(const StoredMsg& m) {
  return encode_replica_figures(MsgType::kUnstored, "UNSTORED", m);
}

Result<StoredMsg> decode_unstored(const Frame& f, const DecodeLimits& lim) {
  return decode_replica_figures(MsgType::kUnstored, "UNSTORED", f, lim);
}

// ---- INFO / INFO_REPLY ----

Result<std::vector<uint8_t>> encode_info_request(uint64_t request_id) {
  if (request_id == 0) return make_error(StatusCode::kInvalidArgument, "INFO: request id 0 is reserved");
  return build_frame(MsgType::kInfo, request_id, {});
}

Result<uint64_t> decode_info_request(const Frame& f) {
  MOESH_RETURN_IF_ERROR(check_type(f, MsgType::kInfo));
  if (f.request_id() == 0) return make_error(StatusCode::kCorrupt, "INFO: request id 0 is reserved");
  if (!f.payload.empty())
    return make_error(StatusCode::kCorrupt, "INFO payload is {} bytes (must be empty)", f.payload.size());
  return f.request_id();
}

namespace {
Status check_info(StatusCode code, const InfoMsg& m) {
  if (m.threads == 0) return make_error(code, "INFO_REPLY: 0 compute threads");
  if (m.replica_bytes > m.replica_budget_bytes)
    return make_error(code, "INFO_REPLY: replica bytes {} over the budget of {}", m.replica_bytes,
                      m.replica_budget_bytes);
  if (m.replica_bytes > m.slab_bytes)
    return make_error(code, "INFO_REPLY: replica bytes {} over the slab bytes of {}", m.replica_bytes, m.slab_bytes);
  if (m.mem_available_bytes > m.mem_total_bytes)
    return make_error(code, "INFO_REPLY: available memory {} over the total of {}", m.mem_available_bytes,
                      m.mem_total_bytes);
  return Status::ok();
}
}  // namespace

Result<std::vector<uint8_t>> encode_info(const InfoMsg& m) {
  if (m.request_id == 0) return make_error(StatusCode::kInvalidArgument, "INFO_REPLY: request id 0 is reserved");
  MOESH_RETURN_IF_ERROR(check_info(StatusCode::kInvalidArgument, m));
  std::vector<uint8_t> payload;
  ByteWriter w(&payload);
  w.u32(m.threads);
  w.u32(m.cores);
  w.u64(m.slab_bytes);
  w.u64(m.replica_bytes);
  w.u64(m.replica_budget_bytes);
  w.u64(m.rss_bytes);
  w.u64(m.uptime_ms);
  w.u64(m.mem_total_bytes);
  w.u64(m.mem_available_bytes);
  w.u64(m.offer_bytes);
  return build_frame(MsgType::kInfoReply, m.request_id, payload);
}

Result<InfoMsg> decode_info(const Frame& f) {
  MOESH_RETURN_IF_ERROR(check_type(f, MsgType::kInfoReply));
  if (f.request_id() == 0) return make_error(StatusCode::kCorrupt, "INFO_REPLY: request id 0 is reserved");
  if (f.payload.size() != kInfoBytes && f.payload.size() != kInfoBytesV1)
    return make_error(StatusCode::kCorrupt, "INFO_REPLY payload is {} bytes (must be {}, or {} without memory)",
                      f.payload.size(), kInfoBytes, kInfoBytesV1);
  ByteReader r(f.payload);
  InfoMsg m;
  m.request_id = f.request_id();
  (void)(r.u32(&m.threads) && r.u32(&m.cores) && r.u64(&m.slab_bytes) && r.u64(&m.replica_bytes) &&
         r.u64(&m.replica_budget_bytes) && r.u64(&m.rss_bytes) && r.u64(&m.uptime_ms));
  if (f.payload.size() == kInfoBytes)
    (void)(r.u64(&m.mem_total_bytes) && r.u64(&m.mem_available_bytes) && r.u64(&m.offer_bytes));
  MOESH_RETURN_IF_ERROR(check_info(StatusCode::kCorrupt, m));
  return m;
}

Status check_stored_matches(const SlabMsg& req, const StoredMsg& reply) {
  if (reply.request_id != req.request_id || reply.layer != req.layer || reply.expert != req.expert)
    return make_error(StatusCode::kCorrupt,
                      "STORED for request {} (layer {} expert {}) does not answer STORE {} of layer {} expert {}",
                      reply.request_id, reply.layer, reply.expert, req.request_id, req.layer, req.expert);
  return Status::ok();
}

Status check_unstored_matches(const UnstoreMsg& req, const StoredMsg& reply) {
  if (reply.request_id != req.request_id || reply.layer != req.layer || reply.expert != req.expert)
    return make_error(StatusCode::kCorrupt,
                      "UNSTORED for request {} (layer {} expert {}) does not answer UNSTORE {} of layer {} expert {}",
                      reply.request_id, reply.layer, reply.expert, req.request_id, req.layer, req.expert);
  return Status::ok();
}

Status check_slab_matches(const FetchMsg& req, const SlabMsg& reply) {
  if (reply.request_id != req.request_id || reply.layer != req.layer || reply.expert != req.expert)
    return make_error(StatusCode::kCorrupt,
                      "SLAB for request {} (layer {} expert {}) does not answer FETCH {} of layer {} expert {}",
                      reply.request_id, reply.layer, reply.expert, req.request_id, req.layer, req.expert);
  return Status::ok();
}

// ---- PING / PONG ----

Result<std::vector<uint8_t>> encode_ping(const PingMsg& m) {
  if (m.pad_bytes > kMaxPingPadBytes || m.reply_pad_bytes > kMaxPingPadBytes)
    return make_error(StatusCode::kInvalidArgument, "PING padding over {} bytes", kMaxPingPadBytes);
  std::vector<uint8_t> payload;
  ByteWriter w(&payload);
  w.u64(m.send_time_ns);
  w.u32(m.pad_bytes);
  w.u32(m.reply_pad_bytes);
  w.zeros(m.pad_bytes);
  return build_frame(MsgType::kPing, m.request_id, payload);
}

Result<PingMsg> decode_ping(const Frame& f) {
  MOESH_RETURN_IF_ERROR(check_type(f, MsgType::kPing));
  ByteReader r(f.payload);
  PingMsg m;
  m.request_id = f.request_id();
  if (!r.u64(&m.send_time_ns) || !r.u32(&m.pad_bytes) || !r.u32(&m.reply_pad_bytes))
    return make_error(StatusCode::kCorrupt, "PING payload of {} bytes shorter than 16", f.payload.size());
  if (m.pad_bytes > kMaxPingPadBytes || m.reply_pad_bytes > kMaxPingPadBytes)
    return make_error(StatusCode::kCorrupt, "PING padding over {} bytes", kMaxPingPadBytes);
  if (r.remaining() != m.pad_bytes)
    return make_error(StatusCode::kCorrupt, "PING declares {} pad bytes but carries {}", m.pad_bytes, r.remaining());
  MOESH_RETURN_IF_ERROR(check_zero_pad("PING", r));
  return m;
}

Result<std::vector<uint8_t>> encode_pong(const PongMsg& m) {
  if (m.pad_bytes > kMaxPingPadBytes)
    return make_error(StatusCode::kInvalidArgument, "PONG padding over {} bytes", kMaxPingPadBytes);
  std::vector<uint8_t> payload;
  ByteWriter w(&payload);
  w.u64(m.ping_time_ns);
  w.u64(m.reply_time_ns);
  w.u32(m.pad_bytes);
  w.u32(0);
  w.zeros(m.pad_bytes);
  return build_frame(MsgType::kPong, m.request_id, payload);
}

Result<PongMsg> decode_pong(const Frame& f) {
  MOESH_RETURN_IF_ERROR(check_type(f, MsgType::kPong));
  ByteReader r(f.payload);
  PongMsg m;
  m.request_id = f.request_id();
  uint32_t reserved = 0;
  if (!r.u64(&m.ping_time_ns) || !r.u64(&m.reply_time_ns) || !r.u32(&m.pad_bytes) || !r.u32(&reserved))
    return make_error(StatusCode::kCorrupt, "PONG payload of {} bytes shorter than 24", f.payload.size());
  if (reserved != 0) return make_error(StatusCode::kCorrupt, "PONG: reserved field is {}", reserved);
  if (m.pad_bytes > kMaxPingPadBytes || r.remaining() != m.pad_bytes)
    return make_error(StatusCode::kCorrupt, "PONG declares {} pad bytes but carries {}", m.pad_bytes, r.remaining());
  MOESH_RETURN_IF_ERROR(check_zero_pad("PONG", r));
  return m;
}

// ---- GOODBYE / ERROR ----

namespace {

std::vector<uint8_t> code_and_text(uint16_t code, const std::string& text) {
  std::vector<uint8_t> payload;
  ByteWriter w(&payload);
  w.u16(code);
  w.u16(static_cast<uint16_t>(text.size()));
  w.raw(text.data(), text.size());
  return payload;
}

Status read_code_and_text(const char* what, const Frame& f, uint16_t* code, std::string* text) {
  ByteReader r(f.payload);
  uint16_t len = 0;
  if (!r.u16(code) || !r.u16(&len))
    return make_error(StatusCode::kCorrupt, "{} payload of {} bytes shorter than 4", what, f.payload.size());
  if (len > kMaxTextBytes)
    return make_error(StatusCode::kCorrupt, "{}: text length {} over {}", what, len, kMaxTextBytes);
  if (!read_text(r, len, text))
    return make_error(StatusCode::kCorrupt, "{}: text of {} bytes truncated to {}", what, len, r.remaining());
  return trailing(what, r);
}

}  // namespace

Result<std::vector<uint8_t>> encode_auth(const AuthMsg& m) {
  if (m.flags == 0 || (m.flags & ~(AuthMsg::kHasChallenge | AuthMsg::kHasProof)) != 0)
    return make_error(StatusCode::kInvalidArgument, "AUTH: flags 0x{:x} (challenge 1, proof 2)", m.flags);
  std::vector<uint8_t> payload;
  ByteWriter w(&payload);
  w.u8(m.flags);
  w.raw(m.challenge.data(), m.challenge.size());
  w.raw(m.proof.data(), m.proof.size());
  return build_frame(MsgType::kAuth, 0, payload);
}

Result<AuthMsg> decode_auth(const Frame& f) {
  MOESH_RETURN_IF_ERROR(check_type(f, MsgType::kAuth));
  if (f.request_id() != 0)
    return make_error(StatusCode::kCorrupt, "AUTH with request id {} (must be 0)", f.request_id());
  ByteReader r(f.payload);
  AuthMsg m;
  if (!r.u8(&m.flags) || !r.raw(m.challenge.data(), m.challenge.size()) || !r.raw(m.proof.data(), m.proof.size()))
    return make_error(StatusCode::kCorrupt, "AUTH payload of {} bytes, expected 65", f.payload.size());
  if (m.flags == 0 || (m.flags & ~(AuthMsg::kHasChallenge | AuthMsg::kHasProof)) != 0)
    return make_error(StatusCode::kCorrupt, "AUTH: flags 0x{:x} (challenge 1, proof 2)", m.flags);
  MOESH_RETURN_IF_ERROR(trailing("AUTH", r));
  return m;
}

const char* route_op_name(uint8_t op) {
  switch (op) {
    case RouteMsg::kJoin:
      return "JOIN";
    case RouteMsg::kJoinedBackbone:
      return "JOINED_BACKBONE";
    case RouteMsg::kJoinedRelay:
      return "JOINED_RELAY";
    case RouteMsg::kConnect:
      return "CONNECT";
    case RouteMsg::kSpliced:
      return "SPLICED";
    default:
      return "?";
  }
}

namespace {
constexpr size_t kMaxRouteName = 64;
bool route_needs_name(uint8_t op) {
  return op == RouteMsg::kJoin || op == RouteMsg::kConnect;
}
}  // namespace

Result<std::vector<uint8_t>> encode_route(const RouteMsg& m) {
  if (m.op == 0 || m.op >= RouteMsg::kOpCount)
    return make_error(StatusCode::kInvalidArgument, "ROUTE: op {} (1..{})", m.op, RouteMsg::kOpCount - 1);
  if (route_needs_name(m.op) != !m.name.empty() || m.name.size() > kMaxRouteName)
    return make_error(StatusCode::kInvalidArgument, "ROUTE {}: name of {} bytes ({} needs 1..{})", route_op_name(m.op),
                      m.name.size(), route_needs_name(m.op) ? "it" : "only JOIN/CONNECT", kMaxRouteName);
  MOESH_RETURN_IF_ERROR(check_text(StatusCode::kInvalidArgument, "ROUTE", m.name, kMaxRouteName));
  std::vector<uint8_t> payload;
  ByteWriter w(&payload);
  w.u8(m.op);
  w.u8(static_cast<uint8_t>(m.name.size()));
  w.raw(reinterpret_cast<const uint8_t*>(m.name.data()), m.name.size());
  return build_frame(MsgType::kRoute, 0, payload);
}

Result<RouteMsg> decode_route(const Frame& f) {
  MOESH_RETURN_IF_ERROR(check_type(f, MsgType::kRoute));
  if (f.request_id() != 0)
    return make_error(StatusCode::kCorrupt, "ROUTE with request id {} (must be 0)", f.request_id());
  ByteReader r(f.payload);
  RouteMsg m;
  uint8_t len = 0;
  if (!r.u8(&m.op) || !r.u8(&len))
    return make_error(StatusCode::kCorrupt, "ROUTE payload of {} bytes shorter than 2", f.payload.size());
  if (m.op == 0 || m.op >= RouteMsg::kOpCount) return make_error(StatusCode::kCorrupt, "ROUTE: unknown op {}", m.op);
  if (len > kMaxRouteName) return make_error(StatusCode::kCorrupt, "ROUTE: name length {} over {}", len, kMaxRouteName);
  if (!read_text(r, len, &m.name))
    return make_error(StatusCode::kCorrupt, "ROUTE: name of {} bytes truncated to {}", len, r.remaining());
  if (route_needs_name(m.op) == m.name.empty())
    return make_error(StatusCode::kCorrupt, "ROUTE {}: {}", route_op_name(m.op),
                      m.name.empty() ? "needs a worker name" : "carries a name it must not have");
  MOESH_RETURN_IF_ERROR(trailing("ROUTE", r));
  return m;
}

Result<std::vector<uint8_t>> encode_goodbye(const GoodbyeMsg& m) {
  MOESH_RETURN_IF_ERROR(check_text(StatusCode::kInvalidArgument, "GOODBYE", m.text, kMaxTextBytes));
  return build_frame(MsgType::kGoodbye, 0, code_and_text(m.reason, m.text));
}

Result<GoodbyeMsg> decode_goodbye(const Frame& f) {
  MOESH_RETURN_IF_ERROR(check_type(f, MsgType::kGoodbye));
  if (f.request_id() != 0)
    return make_error(StatusCode::kCorrupt, "GOODBYE with request id {} (must be 0)", f.request_id());
  GoodbyeMsg m;
  MOESH_RETURN_IF_ERROR(read_code_and_text("GOODBYE", f, &m.reason, &m.text));
  return m;
}

Result<std::vector<uint8_t>> encode_error(const ErrorMsg& m) {
  MOESH_RETURN_IF_ERROR(check_text(StatusCode::kInvalidArgument, "ERROR", m.text, kMaxTextBytes));
  if (m.code == 0) return make_error(StatusCode::kInvalidArgument, "ERROR: code 0 is not an error");
  return build_frame(MsgType::kError, m.request_id, code_and_text(m.code, m.text));
}

Result<ErrorMsg> decode_error(const Frame& f) {
  MOESH_RETURN_IF_ERROR(check_type(f, MsgType::kError));
  ErrorMsg m;
  m.request_id = f.request_id();
  MOESH_RETURN_IF_ERROR(read_code_and_text("ERROR", f, &m.code, &m.text));
  if (m.code == 0) return make_error(StatusCode::kCorrupt, "ERROR: code 0");
  return m;
}

}  // namespace moesh::wire
