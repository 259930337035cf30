// SPAN_STEP / SPAN_RESULT payload codecs (PROTOCOL.md "Span peers").
//
// As in messages.cpp, one validate_* routine per message serves its encoder (a bad message is our
// bug: kInvalidArgument) and its decoder (a bad frame is the peer's: kCorrupt).
#include <set>

#include "moesh/wire/wire.h"
#include "wire/bytes.h"

namespace moesh::wire {

namespace {

using detail::ByteReader;
using detail::ByteWriter;

constexpr size_t kSpanStepFixedBytes = 24;  // first, last, n_seq, n_rows, n_embd, dtype, rdtype, u16 0
constexpr size_t kSpanSeqBytes = 40;        // i32 seq, u32 n_replay, u32 n_new, u32 0, u64 start, chain
constexpr size_t kSpanResultFixedBytes = 20;
constexpr size_t kSpanHaveBytes = 16;           // i32 seq, u32 0, u64 have
constexpr uint64_t kMaxSpanCells = 1ull << 40;  // keeps start + rows arithmetic far from overflow
constexpr uint16_t kSpanChained = 1;            // SPAN_STEP flags: the chain section follows the rows
constexpr size_t kSpanAwaitBytes = 24;          // u64 chain_id, u32 first, u32 last, u32 timeout_ms, u32 0

size_t align4(size_t n) {
  return (n + 3) & ~size_t{3};
}

Status check_span_rows(StatusCode code, const char* what, const WireRows& rows, const DecodeLimits& lim) {
  if (rows.n_cols == 0 || rows.n_cols > lim.max_n_embd)
    return make_error(code, "{}: n_embd {} outside 1..{}", what, rows.n_cols, lim.max_n_embd);
  return detail::check_rows(code, what, rows, lim);
}

// The chain fields of a SPAN_STEP (SpanStepMsg::chain_id and after).
Status validate_span_chain(const SpanStepMsg& m, const DecodeLimits& lim, StatusCode code) {
  if (m.chain_id == 0) {
    if (!m.origin.empty() || !m.next.empty())
      return make_error(code, "SPAN_STEP: origin or next hops without a chain id");
    return Status::ok();
  }
  if (m.origin.size() > kMaxNameBytes)
    return make_error(code, "SPAN_STEP: origin of {} bytes over {}", m.origin.size(), kMaxNameBytes);
  if (m.hop_dtype != WireDType::kF32 && m.hop_dtype != WireDType::kF16 && m.hop_dtype != WireDType::kBF16)
    return make_error(code, "SPAN_STEP: hop dtype {} is not f32, f16 or bf16", static_cast<int>(m.hop_dtype));
  if (m.next.size() > kMaxSpanHops)
    return make_error(code, "SPAN_STEP: {} next hops over {}", m.next.size(), kMaxSpanHops);
  if (m.origin.empty() && m.next.empty()) return make_error(code, "SPAN_STEP: a chained step with no next hop");
  if (!m.origin.empty()) {
    for (const SpanSeq& q : m.seqs) {
      if (q.n_replay != 0) return make_error(code, "SPAN_STEP: forwarded step replays sequence {}", q.seq);
    }
  }
  uint32_t prev_last = m.last;
  for (size_t h = 0; h < m.next.size(); ++h) {
    const SpanHop& hop = m.next[h];
    if (hop.address.empty() || hop.address.size() > kMaxNameBytes)
      return make_error(code, "SPAN_STEP: hop {} address of {} bytes outside 1..{}", h, hop.address.size(),
                        kMaxNameBytes);
    if (hop.first != prev_last + 1 || hop.last < hop.first)
      return make_error(code, "SPAN_STEP: hop {} blocks {}-{} do not follow block {}", h, hop.first, hop.last,
                        prev_last);
    if (lim.n_layer != 0 && hop.last >= lim.n_layer)
      return make_error(code, "SPAN_STEP: hop {} block {} out of range (model has {})", h, hop.last, lim.n_layer);
    if (hop.start.size() != m.seqs.size() || hop.chain.size() != m.seqs.size())
      return make_error(code, "SPAN_STEP: hop {} has {} starts and {} chains for {} sequences", h, hop.start.size(),
                        hop.chain.size(), m.seqs.size());
    for (size_t k = 0; k < hop.start.size(); ++k) {
      if (hop.start[k] > kMaxSpanCells)
        return make_error(code, "SPAN_STEP: hop {} start {} too large", h, hop.start[k]);
      if ((hop.start[k] == 0) != (hop.chain[k] == std::array<uint8_t, 16>{}))
        return make_error(code, "SPAN_STEP: hop {} sequence {}: the chain is zero exactly when start is 0", h,
                          m.seqs[k].seq);
    }
    prev_last = hop.last;
  }
  return Status::ok();
}

Status validate_span_step(const SpanStepMsg& m, const DecodeLimits& lim, StatusCode code) {
  if (m.request_id == 0) return make_error(code, "SPAN_STEP: request id 0 is reserved");
  if (m.last < m.first) return make_error(code, "SPAN_STEP: blocks {}-{} are backwards", m.first, m.last);
  if (lim.n_layer != 0 && m.last >= lim.n_layer)
    return make_error(code, "SPAN_STEP: block {} out of range (model has {})", m.last, lim.n_layer);
  if (static_cast<uint8_t>(m.return_dtype) >= static_cast<uint8_t>(WireDType::kCOUNT))
    return make_error(code, "SPAN_STEP: unknown return dtype {}", static_cast<int>(m.return_dtype));
  if (m.seqs.empty() || m.seqs.size() > kMaxSpanSeqs)
    return make_error(code, "SPAN_STEP: {} sequences outside 1..{}", m.seqs.size(), kMaxSpanSeqs);
  const uint32_t n_rows = m.n_rows();
  if (m.pos.size() != n_rows || m.cut.size() != n_rows)
    return make_error(code, "SPAN_STEP: {} positions and {} cut flags for {} rows", m.pos.size(), m.cut.size(), n_rows);
  std::set<int32_t> seen;
  uint64_t row = 0;
  for (size_t k = 0; k < m.seqs.size(); ++k) {
    const SpanSeq& q = m.seqs[k];
    if (!seen.insert(q.seq).second) return make_error(code, "SPAN_STEP: sequence {} listed twice", q.seq);
    if (q.n_new == 0) return make_error(code, "SPAN_STEP: sequence {} has no new rows", q.seq);
    if (q.start > kMaxSpanCells || uint64_t{q.n_replay} + q.n_new > kMaxSpanCells)
      return make_error(code, "SPAN_STEP: sequence {} cell counts too large", q.seq);
    const bool zero_chain = q.chain == std::array<uint8_t, 16>{};
    if ((q.start == 0) != zero_chain)
      return make_error(code, "SPAN_STEP: sequence {}: the chain is zero exactly when start is 0", q.seq);
    const uint64_t end = row + q.n_replay + q.n_new;
    if (end > n_rows) return make_error(code, "SPAN_STEP: sequences claim more than the {} rows", n_rows);
    for (uint64_t r = row; r < end; ++r) {
      if (m.cut[r] > 1) return make_error(code, "SPAN_STEP: cut flag of row {} is {}", r, m.cut[r]);
      if (m.pos[r] < 0 || (r > row && m.pos[r] <= m.pos[r - 1]))
        return make_error(code, "SPAN_STEP: row {} of sequence {}: position {} not increasing", r, q.seq, m.pos[r]);
    }
    row = end;
  }
  if (row != n_rows) return make_error(code, "SPAN_STEP: sequences cover {} of {} rows", row, n_rows);
  if (n_rows == 0) return make_error(code, "SPAN_STEP: no rows");
  MOESH_RETURN_IF_ERROR(validate_span_chain(m, lim, code));
  return check_span_rows(code, "SPAN_STEP", m.hidden, lim);
}

Status validate_span_result(const SpanResultMsg& m, const DecodeLimits& lim, StatusCode code) {
  if (m.request_id == 0) return make_error(code, "SPAN_RESULT: request id 0 is reserved");
  if (m.need.size() > kMaxSpanSeqs)
    return make_error(code, "SPAN_RESULT: {} sequences over {}", m.need.size(), kMaxSpanSeqs);
  if (m.forward_error.size() > kMaxTextBytes)
    return make_error(code, "SPAN_RESULT: forward error of {} bytes over {}", m.forward_error.size(), kMaxTextBytes);
  if (!m.need.empty()) {
    if (m.rows.n_rows != 0) return make_error(code, "SPAN_RESULT: rows beside a list of missing inputs");
    std::set<int32_t> seen;
    for (const SpanHave& h : m.need) {
      if (!seen.insert(h.seq).second) return make_error(code, "SPAN_RESULT: sequence {} listed twice", h.seq);
      if (h.have > kMaxSpanCells) return make_error(code, "SPAN_RESULT: sequence {} holds too many cells", h.seq);
    }
    return Status::ok();
  }
  if (m.rows.n_rows == 0) return make_error(code, "SPAN_RESULT: neither rows nor missing inputs");
  return check_span_rows(code, "SPAN_RESULT", m.rows, lim);
}

DecodeLimits encoder_limits() {
  return DecodeLimits{.max_frame_bytes = UINT32_MAX, .max_n_embd = UINT32_MAX, .allow_non_finite = true};
}

// The chain section after a chained SPAN_STEP's rows; it must end the payload exactly.
Status decode_span_chain(ByteReader& r, SpanStepMsg* m) {
  auto corrupt = [](std::string_view what) {
    return make_error(StatusCode::kCorrupt, "SPAN_STEP: chain section ends inside {}", what);
  };
  uint8_t hop_dtype = 0, origin_len = 0;
  uint16_t n_next = 0;
  if (!r.u64(&m->chain_id) || !r.u8(&hop_dtype) || !r.u8(&origin_len) || !r.u16(&n_next))
    return corrupt("its fixed part");
  if (m->chain_id == 0) return make_error(StatusCode::kCorrupt, "SPAN_STEP: chained with chain id 0");
  if (hop_dtype >= static_cast<uint8_t>(WireDType::kCOUNT))
    return make_error(StatusCode::kCorrupt, "SPAN_STEP: unknown hop dtype {}", hop_dtype);
  m->hop_dtype = static_cast<WireDType>(hop_dtype);
  if (n_next > kMaxSpanHops)
    return make_error(StatusCode::kCorrupt, "SPAN_STEP: {} next hops over {}", n_next, kMaxSpanHops);
  auto text = [&](size_t n, std::string* out) {
    std::span<const uint8_t> v;
    if (!r.view(align4(n), &v)) return false;
    out->assign(reinterpret_cast<const char*>(v.data()), n);
    for (size_t i = n; i < v.size(); ++i) {
      if (v[i] != 0) return false;
    }
    return true;
  };
  if (!text(origin_len, &m->origin)) return corrupt("the origin");
  // Each hop needs at least 12 bytes plus 24 per sequence: bound the count before allocating.
  if (r.remaining() < size_t{n_next} * (12 + m->seqs.size() * 24)) return corrupt("the hops");
  m->next.resize(n_next);
  for (SpanHop& hop : m->next) {
    uint16_t len = 0, pad = 0;
    if (!r.u32(&hop.first) || !r.u32(&hop.last) || !r.u16(&len) || !r.u16(&pad)) return corrupt("a hop");
    if (pad != 0) return make_error(StatusCode::kCorrupt, "SPAN_STEP: nonzero reserved field of a hop");
    if (!text(len, &hop.address)) return corrupt("a hop address");
    hop.start.resize(m->seqs.size());
    hop.chain.resize(m->seqs.size());
    for (size_t k = 0; k < m->seqs.size(); ++k) {
      if (!r.u64(&hop.start[k]) || !r.raw(hop.chain[k].data(), hop.chain[k].size())) return corrupt("a hop's cells");
    }
  }
  if (r.remaining() != 0)
    return make_error(StatusCode::kCorrupt, "SPAN_STEP: {} bytes after the chain section", r.remaining());
  return Status::ok();
}

}  // namespace

Result<std::vector<uint8_t>> encode_span_step(const SpanStepMsg& m) {
  MOESH_RETURN_IF_ERROR(validate_span_step(m, encoder_limits(), StatusCode::kInvalidArgument));
  const uint32_t n_rows = m.n_rows();
  const size_t bytes =
      kSpanStepFixedBytes + m.seqs.size() * kSpanSeqBytes + size_t{n_rows} * 8 + align4(n_rows) + m.hidden.bytes.size();
  if (bytes > UINT32_MAX)
    return make_error(StatusCode::kOutOfRange, "SPAN_STEP payload of {} bytes is too large", bytes);
  std::vector<uint8_t> payload;
  payload.reserve(bytes);
  ByteWriter w(&payload);
  w.u32(m.first);
  w.u32(m.last);
  w.u32(static_cast<uint32_t>(m.seqs.size()));
  w.u32(n_rows);
  w.u32(m.hidden.n_cols);
  w.u8(static_cast<uint8_t>(m.hidden.dtype));
  w.u8(static_cast<uint8_t>(m.return_dtype));
  w.u16(m.chain_id != 0 ? kSpanChained : 0);
  for (const SpanSeq& q : m.seqs) {
    w.u32(static_cast<uint32_t>(q.seq));
    w.u32(q.n_replay);
    w.u32(q.n_new);
    w.u32(0);
    w.u64(q.start);
    w.raw(q.chain.data(), q.chain.size());
  }
  for (int64_t p : m.pos) w.u64(static_cast<uint64_t>(p));
  w.raw(m.cut.data(), m.cut.size());
  w.zeros(align4(n_rows) - n_rows);
  w.raw(m.hidden.bytes.data(), m.hidden.bytes.size());
  if (m.chain_id != 0) {
    // u64 id, u8 hop dtype, u8 origin length, u16 hops, origin (padded to 4); per hop: u32 first,
    // u32 last, u16 address length, u16 0, address (padded to 4), per sequence u64 start + chain.
    w.u64(m.chain_id);
    w.u8(static_cast<uint8_t>(m.hop_dtype));
    w.u8(static_cast<uint8_t>(m.origin.size()));
    w.u16(static_cast<uint16_t>(m.next.size()));
    w.raw(m.origin.data(), m.origin.size());
    w.zeros(align4(m.origin.size()) - m.origin.size());
    for (const SpanHop& hop : m.next) {
      w.u32(hop.first);
      w.u32(hop.last);
      w.u16(static_cast<uint16_t>(hop.address.size()));
      w.u16(0);
      w.raw(hop.address.data(), hop.address.size());
      w.zeros(align4(hop.address.size()) - hop.address.size());
      for (size_t k = 0; k < hop.start.size(); ++k) {
        w.u64(hop.start[k]);
        w.raw(hop.chain[k].data(), hop.chain[k].size());
      }
    }
  }
  if (payload.size() > UINT32_MAX)
    return make_error(StatusCode::kOutOfRange, "SPAN_STEP payload of {} bytes is too large", payload.size());
  return build_frame(MsgType::kSpanStep, m.request_id, payload);
}

Result<SpanStepMsg> decode_span_step(const Frame& f, const DecodeLimits& lim) {
  if (f.type() != MsgType::kSpanStep)
    return make_error(StatusCode::kInvalidArgument, "expected a SPAN_STEP frame, got {}", msg_type_name(f.type()));
  ByteReader r(f.payload);
  SpanStepMsg m;
  m.request_id = f.request_id();
  uint32_t n_seq = 0, n_rows = 0, n_embd = 0;
  uint8_t dtype = 0, rdtype = 0;
  uint16_t reserved = 0;
  if (!r.u32(&m.first) || !r.u32(&m.last) || !r.u32(&n_seq) || !r.u32(&n_rows) || !r.u32(&n_embd) || !r.u8(&dtype) ||
      !r.u8(&rdtype) || !r.u16(&reserved))
    return make_error(StatusCode::kCorrupt, "SPAN_STEP payload of {} bytes shorter than its {}-byte fixed part",
                      f.payload.size(), kSpanStepFixedBytes);
  if ((reserved & ~kSpanChained) != 0)
    return make_error(StatusCode::kCorrupt, "SPAN_STEP: reserved flag bits 0x{:x}", reserved & ~kSpanChained);
  const bool chained = (reserved & kSpanChained) != 0;
  if (dtype >= static_cast<uint8_t>(WireDType::kCOUNT))
    return make_error(StatusCode::kCorrupt, "SPAN_STEP: unknown wire dtype {}", dtype);
  if (n_seq == 0 || n_seq > kMaxSpanSeqs)
    return make_error(StatusCode::kCorrupt, "SPAN_STEP: {} sequences outside 1..{}", n_seq, kMaxSpanSeqs);
  if (n_embd == 0 || n_embd > lim.max_n_embd)
    return make_error(StatusCode::kCorrupt, "SPAN_STEP: n_embd {} outside 1..{}", n_embd, lim.max_n_embd);
  // The exact size follows from the counts; check it before allocating anything.
  const uint64_t want = kSpanStepFixedBytes + uint64_t{n_seq} * kSpanSeqBytes + uint64_t{n_rows} * 8 + align4(n_rows) +
                        uint64_t{n_rows} * wire_row_bytes(static_cast<WireDType>(dtype), n_embd);
  if (chained ? f.payload.size() < want : f.payload.size() != want)
    return make_error(StatusCode::kCorrupt, "SPAN_STEP payload is {} bytes but {} sequences, {} rows of {} {} need {}",
                      f.payload.size(), n_seq, n_rows, n_embd, wire_dtype_name(static_cast<WireDType>(dtype)), want);
  m.return_dtype = static_cast<WireDType>(rdtype);
  m.seqs.resize(n_seq);
  for (SpanSeq& q : m.seqs) {
    uint32_t seq = 0, pad = 0;
    (void)r.u32(&seq);
    (void)r.u32(&q.n_replay);
    (void)r.u32(&q.n_new);
    (void)r.u32(&pad);
    (void)r.u64(&q.start);
    (void)r.raw(q.chain.data(), q.chain.size());
    q.seq = static_cast<int32_t>(seq);
    if (pad != 0) return make_error(StatusCode::kCorrupt, "SPAN_STEP: nonzero reserved field of sequence {}", q.seq);
  }
  m.pos.resize(n_rows);
  for (int64_t& p : m.pos) {
    uint64_t v = 0;
    (void)r.u64(&v);
    p = static_cast<int64_t>(v);
  }
  m.cut.resize(n_rows);
  (void)r.raw(m.cut.data(), n_rows);
  for (size_t i = n_rows; i < align4(n_rows); ++i) {
    uint8_t pad = 0;
    (void)r.u8(&pad);
    if (pad != 0) return make_error(StatusCode::kCorrupt, "SPAN_STEP: nonzero padding after cut flags");
  }
  m.hidden.dtype = static_cast<WireDType>(dtype);
  m.hidden.n_rows = n_rows;
  m.hidden.n_cols = n_embd;
  std::span<const uint8_t> rows;
  (void)r.view(static_cast<size_t>(uint64_t{n_rows} * wire_row_bytes(m.hidden.dtype, n_embd)), &rows);
  m.hidden.bytes.assign(rows.begin(), rows.end());
  if (chained) MOESH_RETURN_IF_ERROR(decode_span_chain(r, &m));
  MOESH_RETURN_IF_ERROR(validate_span_step(m, lim, StatusCode::kCorrupt));
  return m;
}

Result<std::vector<uint8_t>> encode_span_result(const SpanResultMsg& m) {
  MOESH_RETURN_IF_ERROR(validate_span_result(m, encoder_limits(), StatusCode::kInvalidArgument));
  const size_t bytes =
      kSpanResultFixedBytes + m.need.size() * kSpanHaveBytes + m.rows.bytes.size() + m.forward_error.size();
  if (bytes > UINT32_MAX)
    return make_error(StatusCode::kOutOfRange, "SPAN_RESULT payload of {} bytes is too large", bytes);
  std::vector<uint8_t> payload;
  payload.reserve(bytes);
  ByteWriter w(&payload);
  w.u32(static_cast<uint32_t>(m.need.size()));
  w.u32(m.rows.n_rows);
  w.u32(m.rows.n_cols);
  w.u8(static_cast<uint8_t>(m.rows.dtype));
  w.u8(0);
  w.u16(static_cast<uint16_t>(m.forward_error.size()));
  w.u32(m.compute_us);
  for (const SpanHave& h : m.need) {
    w.u32(static_cast<uint32_t>(h.seq));
    w.u32(0);
    w.u64(h.have);
  }
  w.raw(m.rows.bytes.data(), m.rows.bytes.size());
  w.raw(m.forward_error.data(), m.forward_error.size());
  return build_frame(MsgType::kSpanResult, m.request_id, payload);
}

Result<SpanResultMsg> decode_span_result(const Frame& f, const DecodeLimits& lim) {
  if (f.type() != MsgType::kSpanResult)
    return make_error(StatusCode::kInvalidArgument, "expected a SPAN_RESULT frame, got {}", msg_type_name(f.type()));
  ByteReader r(f.payload);
  SpanResultMsg m;
  m.request_id = f.request_id();
  uint32_t n_need = 0, n_rows = 0, n_embd = 0;
  uint8_t dtype = 0, pad8 = 0;
  uint16_t pad16 = 0;
  if (!r.u32(&n_need) || !r.u32(&n_rows) || !r.u32(&n_embd) || !r.u8(&dtype) || !r.u8(&pad8) || !r.u16(&pad16) ||
      !r.u32(&m.compute_us))
    return make_error(StatusCode::kCorrupt, "SPAN_RESULT payload of {} bytes shorter than its {}-byte fixed part",
                      f.payload.size(), kSpanResultFixedBytes);
  if (pad8 != 0) return make_error(StatusCode::kCorrupt, "SPAN_RESULT: nonzero reserved bytes");
  const uint16_t error_len = pad16;  // the forward error's length
  if (error_len > kMaxTextBytes)
    return make_error(StatusCode::kCorrupt, "SPAN_RESULT: forward error of {} bytes over {}", error_len, kMaxTextBytes);
  if (dtype >= static_cast<uint8_t>(WireDType::kCOUNT))
    return make_error(StatusCode::kCorrupt, "SPAN_RESULT: unknown wire dtype {}", dtype);
  if (n_need > kMaxSpanSeqs)
    return make_error(StatusCode::kCorrupt, "SPAN_RESULT: {} sequences over {}", n_need, kMaxSpanSeqs);
  if (n_embd > lim.max_n_embd)
    return make_error(StatusCode::kCorrupt, "SPAN_RESULT: n_embd {} over {}", n_embd, lim.max_n_embd);
  const uint64_t want = kSpanResultFixedBytes + uint64_t{n_need} * kSpanHaveBytes +
                        uint64_t{n_rows} * wire_row_bytes(static_cast<WireDType>(dtype), n_embd) + error_len;
  if (f.payload.size() != want)
    return make_error(StatusCode::kCorrupt,
                      "SPAN_RESULT payload is {} bytes but {} sequences, {} rows of {} {} need {}", f.payload.size(),
                      n_need, n_rows, n_embd, wire_dtype_name(static_cast<WireDType>(dtype)), want);
  m.need.resize(n_need);
  for (SpanHave& h : m.need) {
    uint32_t seq = 0, pad = 0;
    (void)r.u32(&seq);
    (void)r.u32(&pad);
    (void)r.u64(&h.have);
    h.seq = static_cast<int32_t>(seq);
    if (pad != 0) return make_error(StatusCode::kCorrupt, "SPAN_RESULT: nonzero reserved field of sequence {}", h.seq);
  }
  m.rows.dtype = static_cast<WireDType>(dtype);
  m.rows.n_rows = n_rows;
  m.rows.n_cols = n_embd;
  std::span<const uint8_t> rows;
  (void)r.view(r.remaining() - error_len, &rows);
  m.rows.bytes.assign(rows.begin(), rows.end());
  std::span<const uint8_t> text;
  (void)r.view(error_len, &text);
  m.forward_error.assign(reinterpret_cast<const char*>(text.data()), text.size());
  MOESH_RETURN_IF_ERROR(validate_span_result(m, lim, StatusCode::kCorrupt));
  return m;
}

namespace {

Status validate_span_await(const SpanAwaitMsg& m, const DecodeLimits& lim, StatusCode code) {
  if (m.request_id == 0) return make_error(code, "SPAN_AWAIT: request id 0 is reserved");
  if (m.chain_id == 0) return make_error(code, "SPAN_AWAIT: chain id 0");
  if (m.last < m.first) return make_error(code, "SPAN_AWAIT: blocks {}-{} are backwards", m.first, m.last);
  if (lim.n_layer != 0 && m.last >= lim.n_layer)
    return make_error(code, "SPAN_AWAIT: block {} out of range (model has {})", m.last, lim.n_layer);
  if (m.timeout_ms == 0 || m.timeout_ms > kMaxSpanAwaitMs)
    return make_error(code, "SPAN_AWAIT: timeout {} ms outside 1..{}", m.timeout_ms, kMaxSpanAwaitMs);
  return Status::ok();
}

}  // namespace

Result<std::vector<uint8_t>> encode_span_await(const SpanAwaitMsg& m) {
  MOESH_RETURN_IF_ERROR(validate_span_await(m, encoder_limits(), StatusCode::kInvalidArgument));
  std::vector<uint8_t> payload;
  payload.reserve(kSpanAwaitBytes);
  ByteWriter w(&payload);
  w.u64(m.chain_id);
  w.u32(m.first);
  w.u32(m.last);
  w.u32(m.timeout_ms);
  w.u32(0);
  return build_frame(MsgType::kSpanAwait, m.request_id, payload);
}

Result<SpanAwaitMsg> decode_span_await(const Frame& f, const DecodeLimits& lim) {
  if (f.type() != MsgType::kSpanAwait)
    return make_error(StatusCode::kInvalidArgument, "expected a SPAN_AWAIT frame, got {}", msg_type_name(f.type()));
  if (f.payload.size() != kSpanAwaitBytes)
    return make_error(StatusCode::kCorrupt, "SPAN_AWAIT payload is {} bytes, not {}", f.payload.size(),
                      kSpanAwaitBytes);
  ByteReader r(f.payload);
  SpanAwaitMsg m;
  m.request_id = f.request_id();
  uint32_t pad = 0;
  (void)r.u64(&m.chain_id);
  (void)r.u32(&m.first);
  (void)r.u32(&m.last);
  (void)r.u32(&m.timeout_ms);
  (void)r.u32(&pad);
  if (pad != 0) return make_error(StatusCode::kCorrupt, "SPAN_AWAIT: reserved field is {}", pad);
  MOESH_RETURN_IF_ERROR(validate_span_await(m, lim, StatusCode::kCorrupt));
  return m;
}

}  // namespace moesh::wire
