// The gateway carrying out its own re-plan (`moesh serve --auto-replan SECONDS`): every so often it
// reads the re-plan its dashboard shows (dashboard.h replan_json: the planner's layout for the
// peers up now against the live one) and, when the plan is worth its moves (kReplanGain) and its
// span edges can be taken live, resplits the spans to it. The span peers load the blocks they are
// given first (SPAN_HOLD) and let go of the ones they lose after, so nobody runs a command.
//
// Span lanes the plan adds or removes are added (the peer loads the blocks) or let go of too.
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
#include "moesh/plan/swarm_plan.h"
#include "moesh/remote/remote.h"
#include "moesh/remote/span_client.h"
#include "moesh/serve/scheduler.h"

namespace moesh::serve {

// What to do with one re-plan document (replan_json): apply: the span list to resplit to
// ("F-L@HOST:PORT" or "F-L@here", block order) and/or the expert roles to give; otherwise `why`
// says why not. A plan whose spans cannot be carried out is left alone whole.
struct AutoReplanExperts {
  std::string peer, addr;  // the plan's role: its peer name and address ("" when it joined)
  std::string experts;     // what it is to hold: an expert spec ("0-3:0-7,5:1")
};
// A lane of the plan (role "lane"): the span's layers and the peer's address.
struct AutoReplanLane {
  std::string layers, peer, addr;
  bool operator==(const AutoReplanLane& o) const { return layers == o.layers && addr == o.addr; }
};
struct AutoReplanDecision {
  bool apply = false;
  std::vector<std::string> spans;  // empty: the spans stay as they are
  // Expert roles that change (a peer given experts it did not have, e.g. a span peer made an
  // expert holder): their experts are copied to them (RemoteExecutor::request_experts).
  std::vector<AutoReplanExperts> experts;
  // Lanes to let go of and to add (after the resplit, which lets go of the lanes of spans that
  // change): SpanClient::drop_lane / add_lane.
  std::vector<AutoReplanLane> drop_lanes, add_lanes;
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
                std::chrono::milliseconds every, PlanCosts costs = {});
  ~AutoReplanner();  // stop()
  void stop();
  // {"every_s", "checks", "applied", "failed", "last_why", "last": {"from", "to", "gain", "ok",
  // "error", "seconds_ago", "experts"}} (last: the last re-plan tried), "experts": the executor's
  // ExpertRequestReport (requests, done, failed, pending, copies, copied_bytes, dropped, kept, last_error).
  nlohmann::json status() const;

 private:
  struct ExpertAsk;
  void loop();
  void check();
  // The decision's expert roles as requests to the executor: only the experts each peer lacks;
  // an error when a peer cannot be given any (no workers here, no address).
  Result<std::vector<ExpertAsk>> expert_asks(const std::vector<AutoReplanExperts>& changes) const;
  std::string experts_outcome() const;  // what the executor made of the requests so far

  Scheduler* scheduler_;
  RemoteExecutor* remote_;
  const Model* model_;
  SpanClient* spans_;
  std::chrono::milliseconds every_;
  PlanCosts costs_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<uint64_t> checks_{0}, applied_{0}, failed_{0};
  std::string last_why_;
  nlohmann::json last_;
  std::chrono::steady_clock::time_point last_at_{};
  std::vector<std::string> failed_key_;  // the last re-plan that failed (spans and expert asks), and when
  std::chrono::steady_clock::time_point failed_at_{};
  std::vector<std::string> applied_key_;   // the last re-plan carried out
  std::vector<std::string> before_spans_;  // the layout before the last re-plan carried out, and when
  std::chrono::steady_clock::time_point applied_at_{};
  std::thread thread_;
};

}  // namespace moesh::serve
