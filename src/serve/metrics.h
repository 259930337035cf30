// Prometheus metrics of `moesh serve` (GET /metrics, text exposition format 0.0.4).
//
// ServeMetrics holds what only the HTTP layer knows (requests by endpoint and status, request
// latency and time to first token); the scheduler's and the remote executor's own counters are
// read when /metrics is scraped and passed in as a MetricsSnapshot. render_metrics() is a pure
// function of the snapshot, so the exposition text is unit-tested without a server.
//
// Series (docs/serve.md lists them with their meaning):
//   moesh_http_requests_total{endpoint,status}            counter
//   moesh_request_duration_seconds{endpoint} histogram     request arrival -> last byte queued
//   moesh_time_to_first_token_seconds{endpoint} histogram  request arrival -> first text
//   moesh_prompt_tokens_total, moesh_cached_prompt_tokens_total, moesh_generated_tokens_total
//   moesh_requests_{finished,cancelled,failed,rejected}_total
//   moesh_generation_tokens_per_second   gauge: generated tokens / scheduler busy time
//   moesh_queue_depth, moesh_active_slots, moesh_slots   gauges
//   moesh_batch_steps_total, moesh_batch_tokens_total, moesh_max_batch_sequences
//   moesh_worker_dispatches_total{worker}, moesh_worker_errors_total{worker},
//   moesh_worker_bytes_sent_total{worker}, moesh_worker_bytes_received_total{worker},
//   moesh_worker_latency_seconds{worker} histogram
//   moesh_remote_layer_calls_total, moesh_remote_token_layers_total (with workers): MoE-layer
//   round trips and Σ tokens over them, so bytes / token_layers = wire bytes per token per layer
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "moesh/remote/remote.h"
#include "moesh/remote/span_client.h"
#include "moesh/serve/scheduler.h"

namespace moesh::serve {

// A fixed-bucket histogram (per-bucket counts, not cumulative; the last is +Inf).
struct Histogram {
  static constexpr std::array<double, 14> kBounds = {0.005, 0.01, 0.025, 0.05, 0.1,  0.25, 0.5,
                                                     1.0,   2.5,  5.0,   10.0, 30.0, 60.0, 120.0};
  std::array<uint64_t, kBounds.size() + 1> counts{};
  double sum = 0;
  uint64_t count = 0;
  void observe(double seconds);
};

struct MetricsSnapshot {
  std::map<std::pair<std::string, int>, uint64_t> requests;  // (endpoint, status) -> count
  std::map<std::string, Histogram> duration;                 // by endpoint
  std::map<std::string, Histogram> ttft;                     // by endpoint
  SchedulerStats sched;
  std::vector<WorkerTraffic> workers;
  bool has_remote = false;
  RemoteTraffic remote;  // the executor's totals (MoE-layer round trips, token-layers)
  bool has_spans = false;
  SpanStats spans;         // span peers (--span): steps, trips, failovers, replays
  RowStoreStats span_log;  // their input log: rows in memory and in its file
};

std::string render_metrics(const MetricsSnapshot& s);
// Prometheus label value escaping (\\, \", \n).
std::string escape_label(const std::string& v);

// The HTTP layer's counters; thread-safe.
class ServeMetrics {
 public:
  void count_request(const std::string& endpoint, int status);
  void observe_duration(const std::string& endpoint, double seconds);
  void observe_ttft(const std::string& endpoint, double seconds);
  // The HTTP part of a snapshot (the caller adds scheduler and worker figures).
  MetricsSnapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  MetricsSnapshot s_;
};

}  // namespace moesh::serve
