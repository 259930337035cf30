#include "moesh/wan/delay_line.h"

#include <algorithm>
#include <cmath>

namespace moesh::wan {

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kQueued:
      return "queued";
    case Verdict::kLost:
      return "lost";
    case Verdict::kQueueFull:
      return "queue-full";
    case Verdict::kOverflow:
      return "overflow";
  }
  return "?";
}

DelayLine::DelayLine(LinkSpec spec) : spec_(spec), rng_(spec.seed) {}

DelayLine::Decision DelayLine::offer(size_t bytes, TimePoint arrival) {
  Decision d;
  // Arrivals are monotone for a real clock; a fake one that steps back is clamped.
  arrival = std::max(arrival, last_arrival_);
  last_arrival_ = arrival;
  if (spec_.loss > 0) {
    // Drawn for every unit, so the loss pattern depends only on the seed and the unit count.
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    if (u < spec_.loss) {
      ++stats_.lost;
      d.verdict = Verdict::kLost;
      return d;
    }
  }
  while (!tx_ends_.empty() && tx_ends_.front() <= arrival) tx_ends_.pop_front();
  if (spec_.queue_packets > 0 && tx_ends_.size() >= spec_.queue_packets) {
    ++stats_.queue_full;
    d.verdict = Verdict::kQueueFull;
    return d;
  }
  if (spec_.max_held_bytes > 0 && held_bytes_ + bytes > spec_.max_held_bytes && !held_.empty()) {
    ++stats_.overflow;
    d.verdict = Verdict::kOverflow;
    return d;
  }
  TimePoint tx_end = arrival;
  if (spec_.rate_bps > 0) {
    const double secs = static_cast<double>(bytes) * 8.0 / spec_.rate_bps;
    const auto ser = Nanos(static_cast<int64_t>(std::llround(secs * 1e9)));
    tx_end = std::max(arrival, link_free_) + ser;
    link_free_ = tx_end;
  }
  tx_ends_.push_back(tx_end);
  Nanos extra{0};
  if (spec_.jitter.count() > 0) {
    extra = Nanos(std::uniform_int_distribution<int64_t>(0, spec_.jitter.count())(rng_));
  }
  d.release = std::max(tx_end + spec_.delay + extra, last_release_);
  last_release_ = d.release;
  ++stats_.queued;
  stats_.queued_bytes += bytes;
  return d;
}

Verdict DelayLine::push(std::vector<uint8_t> unit, TimePoint arrival) {
  const Decision d = offer(unit.size(), arrival);
  if (d.verdict != Verdict::kQueued) return d.verdict;
  held_bytes_ += unit.size();
  held_.push_back(Held{d.release, std::move(unit)});
  return Verdict::kQueued;
}

std::optional<TimePoint> DelayLine::next_release() const {
  if (held_.empty()) return std::nullopt;
  return held_.front().release;
}

bool DelayLine::pop_due(TimePoint now, std::vector<uint8_t>* out) {
  if (held_.empty() || held_.front().release > now) return false;
  *out = std::move(held_.front().data);
  held_.pop_front();
  held_bytes_ -= out->size();
  ++stats_.released;
  stats_.released_bytes += out->size();
  return true;
}

}  // namespace moesh::wan
