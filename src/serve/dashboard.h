// The live dashboard of `moesh serve` (GET /dashboard, data from GET /swarm/dashboard.json):
// workers on a map of RTTs and paths, their state, an expert-activation heatmap per layer,
// tokens/s and trips per token over time. One static page; its script polls the JSON once a
// second, so the page needs nothing but the gateway (no CDN, works offline).
#pragma once

#include <nlohmann/json.hpp>

#include "moesh/remote/remote.h"
#include "moesh/serve/scheduler.h"

namespace moesh::serve {

const char* dashboard_html();
// {"status": swarm_status_json, "time_s", "generated_tokens", "requests_finished",
//  "requests_failed", "layer_calls", "token_layers", "heatmap": {"n_expert", "layers":
//  [{"layer", "tokens", "share": [per expert: pairs / tokens]}]}}; remote null: no workers.
nlohmann::json dashboard_json(const SchedulerStats& sched, const RemoteExecutor* remote, double time_s);

}  // namespace moesh::serve
