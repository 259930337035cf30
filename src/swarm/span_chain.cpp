// Chained spans on the peer (span_chain.h): the step passed on to the next hop, and the meeting
// point of forwarded results and the backbone's SPAN_AWAITs.
#include "moesh/swarm/span_chain.h"

#include <vector>

namespace moesh::swarm {

namespace {

// A reply sent from a thread other than the connection's reader: bounded like every other send.
constexpr auto kAnswerTimeout = std::chrono::seconds(10);

}  // namespace

Result<wire::SpanStepMsg> make_hop_step(const wire::SpanStepMsg& head, const std::string& origin,
                                        const wire::SpanResultMsg& result) {
  if (head.next.empty()) return make_error(StatusCode::kInvalidArgument, "the step has no next hop");
  if (!result.need.empty() || result.rows.n_rows == 0)
    return make_error(StatusCode::kInvalidArgument, "the step's result has no rows to pass on");
  const wire::SpanHop& hop = head.next.front();
  wire::SpanStepMsg m;
  m.first = hop.first;
  m.last = hop.last;
  m.return_dtype = head.return_dtype;
  m.chain_id = head.chain_id;
  m.origin = origin;
  m.hop_dtype = head.hop_dtype;
  m.next.assign(head.next.begin() + 1, head.next.end());
  // The new rows only: a hop never replays (its peer held every earlier cell when the backbone
  // chained the step).
  size_t row = 0;
  uint32_t n_new = 0;
  for (size_t k = 0; k < head.seqs.size(); ++k) {
    const wire::SpanSeq& q = head.seqs[k];
    wire::SpanSeq h;
    h.seq = q.seq;
    h.n_new = q.n_new;
    h.start = hop.start[k];
    h.chain = hop.chain[k];
    m.seqs.push_back(h);
    row += q.n_replay;
    for (uint32_t j = 0; j < q.n_new; ++j, ++row) {
      m.pos.push_back(head.pos[row]);
      m.cut.push_back(head.cut[row]);
    }
    n_new += q.n_new;
  }
  if (result.rows.n_rows != n_new)
    return make_error(StatusCode::kInternal, "the result has {} rows for {} new rows", result.rows.n_rows, n_new);
  // As the backbone would: its rows decoded from the return encoding, then encoded for the hop.
  std::vector<float> rows(static_cast<size_t>(n_new) * result.rows.n_cols);
  wire::decode_rows(result.rows, rows.data());
  MOESH_ASSIGN_OR_RETURN(m.hidden, wire::encode_rows(head.hop_dtype, rows.data(), n_new, result.rows.n_cols));
  return m;
}

void SpanAwaits::answer(const Waiting& w, const Result<wire::SpanResultMsg>& r) {
  const net::Deadline deadline = net::deadline_in(kAnswerTimeout);
  if (r.is_ok()) {
    wire::SpanResultMsg msg = *r;
    msg.request_id = w.request_id;
    auto frame = wire::encode_span_result(msg);
    if (frame) {
      (void)w.conn->send_frame(*frame, deadline);
      return;
    }
    net::send_error(*w.conn, w.request_id, wire::WireError::kInternal, frame.status().message(), deadline);
    return;
  }
  net::send_error(*w.conn, w.request_id, wire::status_code_to_wire_error(r.status().code()), r.status().message(),
                  deadline);
}

void SpanAwaits::await(net::Connection* conn, const std::string& origin, const wire::SpanAwaitMsg& m) {
  std::lock_guard<std::mutex> lk(mu_);
  const Key key{origin, m.chain_id, m.first};
  const Waiting w{conn, m.request_id, net::Clock::now() + std::chrono::milliseconds(m.timeout_ms)};
  auto it = ready_.find(key);
  if (it != ready_.end()) {
    answer(w, it->second.r);
    ready_.erase(it);
    return;
  }
  // A second await for the same step replaces the first (its backbone gave up on that one).
  waiting_[key] = w;
}

bool SpanAwaits::deliver(const std::string& origin, uint64_t chain_id, uint32_t first, Result<wire::SpanResultMsg> r) {
  std::lock_guard<std::mutex> lk(mu_);
  const Key key{origin, chain_id, first};
  auto it = waiting_.find(key);
  if (it != waiting_.end()) {
    answer(it->second, r);
    waiting_.erase(it);
    return true;
  }
  if (ready_.size() >= kMaxResults) {
    auto oldest = ready_.begin();
    for (auto i = ready_.begin(); i != ready_.end(); ++i) {
      if (i->second.until < oldest->second.until) oldest = i;
    }
    ready_.erase(oldest);
  }
  ready_[key] = Ready{std::move(r), net::Clock::now() + kResultKeep};
  return false;
}

void SpanAwaits::sweep(net::Connection* conn) {
  std::lock_guard<std::mutex> lk(mu_);
  const auto now = net::Clock::now();
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->second.conn == conn && it->second.until <= now) {
      answer(it->second, make_error(StatusCode::kTimeout, "no forwarded step {} for blocks from {} arrived in time",
                                    std::get<1>(it->first), std::get<2>(it->first)));
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = ready_.begin(); it != ready_.end();) {
    it = it->second.until <= now ? ready_.erase(it) : std::next(it);
  }
}

void SpanAwaits::drop(net::Connection* conn) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    it = it->second.conn == conn ? waiting_.erase(it) : std::next(it);
  }
}

size_t SpanAwaits::n_waiting() const {
  std::lock_guard<std::mutex> lk(mu_);
  return waiting_.size();
}

size_t SpanAwaits::n_results() const {
  std::lock_guard<std::mutex> lk(mu_);
  return ready_.size();
}

}  // namespace moesh::swarm
