// The live dashboard of `moesh serve` (GET /dashboard, data from GET /swarm/dashboard.json):
// workers on a map of RTTs and paths, their state, an expert-activation heatmap per layer,
// tokens/s and trips per token over time. One static page; its script polls the JSON once a
// second, so the page needs nothing but the gateway (no CDN, works offline).
#pragma once

#include <nlohmann/json.hpp>

#include "moesh/model/model.h"
#include "moesh/plan/swarm_plan.h"
#include "moesh/remote/remote.h"
#include "moesh/remote/span_client.h"
#include "moesh/serve/scheduler.h"

namespace moesh::serve {

const char* dashboard_html();
// {"status": swarm_status_json, "time_s", "generated_tokens", "requests_finished",
//  "requests_failed", "layer_calls", "token_layers", "heatmap": {"n_expert", "layers":
//  [{"layer", "tokens", "share": [per expert: pairs / tokens]}]},
//  "plan": plan_card_json} ; remote null: no workers.
nlohmann::json dashboard_json(const SchedulerStats& sched, const RemoteExecutor* remote, double time_s,
                              const Model* model = nullptr, const SpanClient* spans = nullptr,
                              const PlanCosts& costs = {});

// The live layout priced by the planner's cost model (plan/swarm_plan.h) beside what it
// measures: every worker an expert peer holding what it announced (RTT: its fastest trip seen,
// else the warm-up round trip),
// every span a span peer, the backbone's own copies local; tokens per step as the scheduler's
// mean. {"predicted_step_ms", "measured_step_ms", "ratio", "tokens_per_step", "trips_per_step",
// "seconds_per_byte", "peers": [{"name", "role", "what", "rtt_ms", "measured_trip_ms"}],
// "replan": replan_json (with workers or span peers)} or {"error"} when the layout cannot be
// priced; null without a model. `status_doc` / `heatmap`: the dashboard's own (null: read anew /
// uniform).
nlohmann::json plan_card_json(const SchedulerStats& sched, const RemoteExecutor* remote, const Model* model,
                              const SpanClient* spans, const nlohmann::json* status_doc = nullptr,
                              const nlohmann::json* heatmap = nullptr, const PlanCosts& costs = {});

// The gateway re-plans by itself: the planner's layout for the workers and span peers up now, from
// the inputs `moesh swarm plan -m MODEL --status URL` reads (plan/live.h: each peer's memory, warm-up
// RTT and measured peer RTTs, the expert activation counts; the backbone keeps the experts it
// holds; `remote` null: no expert workers, the backbone holds every expert outside the spans),
// beside the live layout priced with the same inputs. Recomputed on every dashboard read, so it
// follows workers joining, leaving and their RTTs. {"predicted_step_ms", "live_step_ms", "gain"
// (1 - predicted / live), "replan" (gain >= kReplanGain), "trips_per_step", "activation_tokens",
// "args" (the `swarm plan` options giving the same figures), "backbone_experts", "peers": [{"name",
// "role", "what", "changes"}], "live": the live layout as a plan document ({"roles": [{"peer",
// "role", "experts" or "layers", "addr"}], "predicted_step_ms"}: `swarm plan --from live`), "plan":
// the planner's layout as the same kind of document (what --auto-replan carries out)} or
// {"error", ...}. spans_allowed false: experts only (`swarm plan --no-spans`: what a gateway
// running no spans can carry out; its --auto-replan plans so).
inline constexpr int kReplanContext = 4096;          // context priced: `moesh swarm plan`'s --n-ctx default
inline constexpr double kReplanGain = 0.10;          // a re-plan is worth its moves from 10 % faster on
inline constexpr double kReplanRefreshSeconds = 10;  // under load, new counts wait this long
// What a step carries, as the scheduler measured it (averages over its steps): the rows the
// planner prices (prompt chunks count) and the sequences, which span lanes split.
struct ReplanLoad {
  int tokens_per_step = 1;
  int streams = 1;
  PlanCosts costs;  // the compute costs priced (the gateway's --seconds-per-byte, --row-share)
};
nlohmann::json replan_json(const Model& model, const RemoteExecutor* remote, const nlohmann::json& status,
                           const nlohmann::json& heatmap, ReplanLoad load, bool spans_allowed = true);

}  // namespace moesh::serve
