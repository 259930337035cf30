// DelayLine: the model of one direction of a WAN link, shared by `moesh wan-emu` (IP packets
// between TUN devices) and `moesh wan-proxy` (chunks of a TCP byte stream).
//
// A unit (packet or chunk) arriving at time t is, in this order:
//   1. lost with probability `loss` (drawn from a generator seeded with `seed`, so runs repeat);
//   2. dropped (drop-tail) when the bottleneck queue already holds `queue_packets` units that
//      have not finished serialising at t, or when the line holds `max_held_bytes` in total;
//   3. otherwise released at
//        tx_end  = max(t, link_free) + size * 8 / rate      (link_free = tx_end; no rate: t)
//        release = max(tx_end + delay + U[0, jitter], previous release)
//      so `delay` is a lower bound, jitter only adds, and release times never decrease: units
//      leave in the order they came (no reordering, like a single path).
//
// The line is pure: callers pass the arrival time and ask what is due at a time they choose, so
// tests drive it with a fake clock. Not thread-safe (one owner, or the caller's lock).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <random>
#include <vector>

namespace moesh::wan {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;
using Nanos = std::chrono::nanoseconds;

// One direction of a link.
struct LinkSpec {
  Nanos delay{0};                            // one-way propagation delay (minimum)
  Nanos jitter{0};                           // extra delay, uniform in [0, jitter]; never reorders
  double rate_bps = 0;                       // serialisation rate in bits per second; 0: unlimited
  double loss = 0;                           // probability in [0, 1] that a unit is lost
  size_t queue_packets = 1000;               // bottleneck queue bound (units); 0: unbounded
  size_t max_held_bytes = size_t{64} << 20;  // everything in the line, in flight included; 0: unbounded
  uint64_t seed = 1;                         // loss and jitter draws
};

enum class Verdict : uint8_t {
  kQueued = 0,
  kLost,       // random loss
  kQueueFull,  // drop-tail: the bottleneck queue is at queue_packets
  kOverflow,   // the line holds max_held_bytes already
};

const char* verdict_name(Verdict v);

struct DelayLineStats {
  uint64_t queued = 0, queued_bytes = 0;
  uint64_t released = 0, released_bytes = 0;
  uint64_t lost = 0, queue_full = 0, overflow = 0;
  uint64_t dropped() const { return lost + queue_full + overflow; }
};

class DelayLine {
 public:
  explicit DelayLine(LinkSpec spec);

  // Decides the fate of a unit of `bytes` arriving at `arrival` and, when it is queued, its
  // release time. This commits: a queued unit occupies the link (later units serialise behind
  // it) and the draws are consumed. The unit itself stays with the caller; push() keeps it in the
  // line instead. Arrival times must not decrease (an earlier one is treated as the latest).
  struct Decision {
    Verdict verdict = Verdict::kQueued;
    TimePoint release{};
  };
  Decision offer(size_t bytes, TimePoint arrival);

  // offer() and, when queued, keeps `unit` until its release time.
  Verdict push(std::vector<uint8_t> unit, TimePoint arrival);

  // Release time of the oldest held unit, if any.
  std::optional<TimePoint> next_release() const;
  // Takes the oldest held unit if its release time is <= now.
  bool pop_due(TimePoint now, std::vector<uint8_t>* out);

  size_t held_units() const { return held_.size(); }
  size_t held_bytes() const { return held_bytes_; }
  const DelayLineStats& stats() const { return stats_; }
  const LinkSpec& spec() const { return spec_; }

 private:
  struct Held {
    TimePoint release;
    std::vector<uint8_t> data;
  };
  LinkSpec spec_;
  std::mt19937_64 rng_;
  TimePoint last_arrival_{};
  TimePoint link_free_{};          // when the serialiser finishes its current backlog
  TimePoint last_release_{};       // release times never go below this
  std::deque<TimePoint> tx_ends_;  // serialisation end of units still in the bottleneck queue
  std::deque<Held> held_;
  size_t held_bytes_ = 0;
  DelayLineStats stats_;
};

}  // namespace moesh::wan
