// Fault-injecting ByteStream: lets tests make the network drop, delay, corrupt, truncate and
// cut frames, deterministically from a seed, inside one process or over real TCP.
#include <random>
#include <thread>

#include "moesh/net/transport.h"

namespace moesh::net {

namespace {

class FaultStream final : public ByteStream {
 public:
  FaultStream(std::unique_ptr<ByteStream> inner, FaultPlan plan, std::shared_ptr<FaultCounters> counters)
      : inner_(std::move(inner)), plan_(std::move(plan)), counters_(std::move(counters)), rng_(plan_.seed) {}

  Status write_all(std::span<const uint8_t> bytes, Deadline deadline) override {
    std::lock_guard<std::mutex> lk(mu_);  // keeps the draw order, and so the run, reproducible
    const uint64_t index = counters_->writes.fetch_add(1);
    const FaultKind kind = pick(index);
    counters_->by_kind[static_cast<int>(kind)].fetch_add(1);
    std::uniform_int_distribution<size_t> pos(0, bytes.empty() ? 0 : bytes.size() - 1);
    switch (kind) {
      case FaultKind::kNone:
      case FaultKind::kCOUNT:
        return inner_->write_all(bytes, deadline);
      case FaultKind::kDrop:
        return Status::ok();
      case FaultKind::kDelay: {
        const Deadline until = std::min(deadline, Clock::now() + plan_.delay);
        std::this_thread::sleep_until(until);
        if (Clock::now() >= deadline)
          return make_error(StatusCode::kTimeout, "{}: injected delay ran past the write deadline", describe());
        return inner_->write_all(bytes, deadline);
      }
      case FaultKind::kCorrupt: {
        std::vector<uint8_t> copy(bytes.begin(), bytes.end());
        if (!copy.empty()) copy[pos(rng_)] ^= static_cast<uint8_t>(1u << (rng_() % 8));
        return inner_->write_all(copy, deadline);
      }
      case FaultKind::kTruncate:
        return inner_->write_all(bytes.first(bytes.empty() ? 0 : pos(rng_)), deadline);
      case FaultKind::kCloseMidFrame: {
        Status st = inner_->write_all(bytes.first(bytes.empty() ? 0 : pos(rng_)), deadline);
        inner_->close();
        if (!st.is_ok()) return st;
        return make_error(StatusCode::kUnavailable, "{}: injected close mid-frame", describe());
      }
    }
    return Status::ok();
  }

  Result<size_t> read_some(std::span<uint8_t> buf, Deadline deadline) override {
    return inner_->read_some(buf, deadline);
  }
  void close() override { inner_->close(); }
  std::string describe() const override { return "faulty " + inner_->describe(); }
  Clock::time_point last_arrival() const override { return inner_->last_arrival(); }

 private:
  FaultKind pick(uint64_t index) {
    for (const auto& [at, kind] : plan_.schedule)
      if (at == index) return kind;
    // One uniform draw per write, walked through the cumulative probabilities.
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    double acc = 0;
    const std::pair<double, FaultKind> table[] = {{plan_.p_drop, FaultKind::kDrop},
                                                  {plan_.p_delay, FaultKind::kDelay},
                                                  {plan_.p_corrupt, FaultKind::kCorrupt},
                                                  {plan_.p_truncate, FaultKind::kTruncate},
                                                  {plan_.p_close, FaultKind::kCloseMidFrame}};
    for (const auto& [p, kind] : table) {
      acc += p;
      if (u < acc) return kind;
    }
    return FaultKind::kNone;
  }

  std::unique_ptr<ByteStream> inner_;
  FaultPlan plan_;
  std::shared_ptr<FaultCounters> counters_;
  std::mutex mu_;
  std::mt19937_64 rng_;
};

}  // namespace

std::unique_ptr<ByteStream> wrap_with_faults(std::unique_ptr<ByteStream> inner, FaultPlan plan,
                                             std::shared_ptr<FaultCounters> counters) {
  if (!counters) counters = std::make_shared<FaultCounters>();
  return std::make_unique<FaultStream>(std::move(inner), std::move(plan), std::move(counters));
}

}  // namespace moesh::net
