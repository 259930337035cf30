// The gateway carrying out its own re-plan (`moesh serve --auto-replan SECONDS`): every so often it
// reads the re-plan its dashboard shows (dashboard.h replan_json: the planner's layout for the
// peers up now against the live one) and, when the plan is worth its moves (kReplanGain) and its
// span edges can be taken live, resplits the spans to it. The span peers load the blocks they are
// given first (SPAN_HOLD) and let go of the ones they lose after, so nobody runs a command.
//
// Only spans move this way, and only among the peers that can be given blocks: the span peers the
// gateway knows (in use, or idle: let go of, or added with `POST /swarm/spans/add`) and the expert
// workers on the full model (`loads_blocks`: such a worker becomes a span peer, and holds its
// experts still). A plan giving blocks to a worker on an expert slice, a peer without an address
// (it joined), or blocks the backbone runs as its own (not as `--span F-L@here`) is shown and left
// alone, saying why. Experts move by
// themselves with `--rebalance`. A layout that failed is not tried again for kRetryFailedSeconds;
// one carried out stays at least kAutoReplanDwellSeconds and is not undone for kRetryFailedSeconds.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "moesh/model/model.h"
#include "moesh/remote/remote.h"
#include "moesh/remote/span_client.h"
#include "moesh/serve/scheduler.h"

namespace moesh::serve {

// What to do with one re-plan document (replan_json): apply: the span list to resplit to
// ("F-L@HOST:PORT" or "F-L@here", block order); otherwise `why` says why not.
struct AutoReplanDecision {
  bool apply = false;
  std::vector<std::string> spans;
  double gain = 0;
  std::string why;
};
AutoReplanDecision decide_auto_replan(const nlohmann::json& replan);

inline constexpr double kRetryFailedSeconds = 600;
// After a re-plan is carried out, none other for this long (the new layout's trips are measured
// first), and none that puts the spans back as they were before it for kRetryFailedSeconds: round
// trips measured on loopback or a quiet WAN jitter by more than the 10 % a re-plan needs, and a
// gateway must not move its spans back and forth on that noise.
inline constexpr double kAutoReplanDwellSeconds = 60;

class AutoReplanner {
 public:
  AutoReplanner(Scheduler* scheduler, RemoteExecutor* remote, const Model* model, SpanClient* spans,
                std::chrono::milliseconds every);
  ~AutoReplanner();  // stop()
  void stop();
  // {"every_s", "checks", "applied", "failed", "last_why", "last": {"from", "to", "gain", "ok",
  // "error", "seconds_ago"}} (last: the last resplit tried).
  nlohmann::json status() const;

 private:
  void loop();
  void check();

  Scheduler* scheduler_;
  RemoteExecutor* remote_;
  const Model* model_;
  SpanClient* spans_;
  std::chrono::milliseconds every_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<uint64_t> checks_{0}, applied_{0}, failed_{0};
  std::string last_why_;
  nlohmann::json last_;
  std::chrono::steady_clock::time_point last_at_{};
  std::vector<std::string> failed_spans_;  // the last layout that failed, and when
  std::chrono::steady_clock::time_point failed_at_{};
  std::vector<std::string> before_spans_;  // the layout before the last re-plan carried out, and when
  std::chrono::steady_clock::time_point applied_at_{};
  std::thread thread_;
};

}  // namespace moesh::serve
