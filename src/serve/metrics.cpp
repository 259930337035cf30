// Prometheus text exposition for `moesh serve` (see metrics.h).
#include "serve/metrics.h"

#include <algorithm>

namespace moesh::serve {

void Histogram::observe(double seconds) {
  const size_t b = static_cast<size_t>(std::lower_bound(kBounds.begin(), kBounds.end(), seconds) - kBounds.begin());
  ++counts[b];
  sum += seconds;
  ++count;
}

std::string escape_label(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

namespace {

void header(std::string& o, const char* name, const char* type, const char* help) {
  o += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

// Bucket lines (cumulative, as Prometheus wants), _sum and _count for one label set.
template <size_t N>
void histogram_lines(std::string& o, const char* name, const std::string& labels, const std::array<double, N>& bounds,
                     const uint64_t* counts, double sum) {
  uint64_t cum = 0;
  const std::string sep = labels.empty() ? "" : ",";
  for (size_t i = 0; i < N; ++i) {
    cum += counts[i];
    o += fmt::format("{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep, bounds[i], cum);
  }
  cum += counts[N];
  o += fmt::format("{}_bucket{{{}{}le=\"+Inf\"}} {}\n", name, labels, sep, cum);
  const std::string lb = labels.empty() ? "" : "{" + labels + "}";
  o += fmt::format("{}_sum{} {}\n{}_count{} {}\n", name, lb, sum, name, lb, cum);
}

void counter(std::string& o, const char* name, const char* help, uint64_t v) {
  header(o, name, "counter", help);
  o += fmt::format("{} {}\n", name, v);
}

void gauge(std::string& o, const char* name, const char* help, double v) {
  header(o, name, "gauge", help);
  o += fmt::format("{} {}\n", name, v);
}

}  // namespace

std::string render_metrics(const MetricsSnapshot& s) {
  std::string o;
  header(o, "moesh_http_requests_total", "counter", "HTTP requests by endpoint and status code");
  for (const auto& [key, n] : s.requests) {
    o += fmt::format("moesh_http_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", escape_label(key.first),
                     key.second, n);
  }
  header(o, "moesh_request_duration_seconds", "histogram",
         "Generation request latency: arrival to the last byte of the response");
  for (const auto& [ep, h] : s.duration) {
    histogram_lines(o, "moesh_request_duration_seconds", fmt::format("endpoint=\"{}\"", escape_label(ep)),
                    Histogram::kBounds, h.counts.data(), h.sum);
  }
  header(o, "moesh_time_to_first_token_seconds", "histogram",
         "Generation request latency: arrival to the first generated text");
  for (const auto& [ep, h] : s.ttft) {
    histogram_lines(o, "moesh_time_to_first_token_seconds", fmt::format("endpoint=\"{}\"", escape_label(ep)),
                    Histogram::kBounds, h.counts.data(), h.sum);
  }
  const SchedulerStats& st = s.sched;
  counter(o, "moesh_prompt_tokens_total", "Prompt tokens of admitted requests", st.prompt_tokens);
  counter(o, "moesh_cached_prompt_tokens_total", "Prompt tokens served from the prefix cache", st.cached_prompt_tokens);
  counter(o, "moesh_generated_tokens_total", "Generated tokens", st.generated_tokens);
  counter(o, "moesh_draft_tokens_total", "Drafted tokens verified (speculative decoding)", st.draft_tokens);
  counter(o, "moesh_draft_accepted_tokens_total", "Drafted tokens kept (each saved a forward pass)",
          st.accepted_draft_tokens);
  counter(o, "moesh_split_steps_total", "Forward passes run as two micro-batches (remote trips overlapped)",
          st.split_steps);
  counter(o, "moesh_requests_submitted_total", "Requests accepted by the scheduler", st.requests_submitted);
  counter(o, "moesh_requests_finished_total", "Requests that ran to a stop or length limit", st.requests_finished);
  counter(o, "moesh_requests_cancelled_total", "Requests cancelled (client gone)", st.requests_cancelled);
  counter(o, "moesh_requests_failed_total", "Requests that failed with an error", st.requests_failed);
  counter(o, "moesh_requests_rejected_total", "Requests refused (queue full or invalid)", st.requests_rejected);
  counter(o, "moesh_batch_steps_total", "Forward passes run by the scheduler", st.steps);
  counter(o, "moesh_batch_tokens_total", "Tokens carried by those forward passes", st.batch_tokens);
  gauge(o, "moesh_max_batch_sequences", "Most sequences seen in one forward pass",
        static_cast<double>(st.max_batch_seen));
  gauge(o, "moesh_generation_tokens_per_second", "Generated tokens per second of scheduler busy time",
        st.busy_seconds > 0 ? st.generated_tokens / st.busy_seconds : 0.0);
  gauge(o, "moesh_scheduler_busy_seconds", "Time spent in forward passes", st.busy_seconds);
  gauge(o, "moesh_queue_depth", "Requests waiting for a slot", st.queued);
  gauge(o, "moesh_active_slots", "Slots running a request", st.active);
  gauge(o, "moesh_slots", "Slots (--parallel)", st.n_slots);

  if (s.has_remote) {
    header(o, "moesh_remote_layer_calls_total", "counter",
           "MoE-layer executor calls that involved a worker (one round trip each, all workers in parallel)");
    o += fmt::format("moesh_remote_layer_calls_total {}\n", s.remote.layer_calls);
    header(o, "moesh_remote_token_layers_total", "counter", "Sum of tokens over those calls");
    o += fmt::format("moesh_remote_token_layers_total {}\n", s.remote.token_layers);
  }
  if (s.has_spans) {
    const std::pair<const char*, uint64_t> counters[] = {{"steps", s.spans.steps},
                                                         {"trips", s.spans.trips},
                                                         {"failovers", s.spans.failovers},
                                                         {"replayed_rows", s.spans.replayed_rows},
                                                         {"local_steps", s.spans.local_steps},
                                                         {"moves", s.spans.moves},
                                                         {"move_rows", s.spans.move_rows},
                                                         {"resplits", s.spans.resplits},
                                                         {"resplit_rows", s.spans.resplit_rows},
                                                         {"loads", s.spans.loads},
                                                         {"drops", s.spans.drops},
                                                         {"failover_loads", s.spans.failover_loads},
                                                         {"idle_takeovers", s.spans.idle_takeovers},
                                                         {"lane_trips", s.spans.lane_trips},
                                                         {"lane_rows", s.spans.lane_rows},
                                                         {"lane_failures", s.spans.lane_failures}};
    const char* help[] = {"Span steps completed (one per span and forward pass)",
                          "SPAN_STEP round trips made (resends and failovers included)",
                          "Spans moved to their next peer (or to this process)",
                          "Logged span inputs sent again to a peer that lacked them",
                          "Span steps run on this process (every peer of the span failed, or moved here)",
                          "Planned span moves (POST /swarm/spans/move) completed",
                          "Logged span inputs sent to warm the new runner of a planned move",
                          "Span resplits (POST /swarm/spans/resplit: new span edges) completed",
                          "Rows sent to warm the new runners of a resplit",
                          "Spans a peer loaded at this gateway's word before a move or resplit (SPAN_HOLD)",
                          "Spans a peer let go of at this gateway's word after a move or resplit",
                          "Failed spans whose replacement loaded the blocks first (counted in loads)",
                          "Failed spans taken over by an idle span peer",
                          "SPAN_STEP round trips to span lanes (peers sharing a span's sequences; counted in trips)",
                          "Rows computed by span lanes",
                          "Span lanes dropped because they failed (their sequences went back to the span's runner)"};
    for (size_t i = 0; i < std::size(counters); ++i) {
      const std::string name = fmt::format("moesh_span_{}_total", counters[i].first);
      header(o, name.c_str(), "counter", help[i]);
      o += fmt::format("{} {}\n", name, counters[i].second);
    }
    header(o, "moesh_span_log_bytes", "gauge",
           "Rows kept to replay span inputs to a replacement peer, in memory and in the log's file");
    o += fmt::format("moesh_span_log_bytes{{where=\"memory\"}} {}\nmoesh_span_log_bytes{{where=\"file\"}} {}\n",
                     s.span_log.memory_bytes, s.span_log.file_bytes);
  }
  header(o, "moesh_worker_dispatches_total", "counter", "DISPATCH requests sent to each worker");
  for (const auto& w : s.workers) {
    o += fmt::format("moesh_worker_dispatches_total{{worker=\"{}\"}} {}\n", escape_label(w.label), w.requests);
  }
  header(o, "moesh_worker_errors_total", "counter", "Failed requests per worker");
  for (const auto& w : s.workers) {
    o += fmt::format("moesh_worker_errors_total{{worker=\"{}\"}} {}\n", escape_label(w.label), w.errors);
  }
  header(o, "moesh_worker_up", "gauge",
         "1 while the worker is planned with, 0 while it is down (failed, being re-dialled)");
  for (const auto& w : s.workers) {
    o += fmt::format("moesh_worker_up{{worker=\"{}\"}} {}\n", escape_label(w.label), w.down ? 0 : 1);
  }
  header(o, "moesh_worker_failovers_total", "counter",
         "Calls in which the worker failed and its pairs were recomputed by other holders");
  for (const auto& w : s.workers) {
    o += fmt::format("moesh_worker_failovers_total{{worker=\"{}\"}} {}\n", escape_label(w.label), w.failovers);
  }
  header(o, "moesh_worker_verified_total", "counter",
         "Requests of the worker recomputed by the backbone and compared (--verify-rate)");
  for (const auto& w : s.workers) {
    o += fmt::format("moesh_worker_verified_total{{worker=\"{}\"}} {}\n", escape_label(w.label), w.verified);
  }
  header(o, "moesh_worker_mismatches_total", "counter",
         "Verified requests whose result differed (the worker is evicted)");
  for (const auto& w : s.workers) {
    o += fmt::format("moesh_worker_mismatches_total{{worker=\"{}\"}} {}\n", escape_label(w.label), w.mismatches);
  }
  header(o, "moesh_worker_rejoins_total", "counter", "Times the worker came back after being down");
  for (const auto& w : s.workers) {
    o += fmt::format("moesh_worker_rejoins_total{{worker=\"{}\"}} {}\n", escape_label(w.label), w.rejoins);
  }
  header(o, "moesh_worker_probes_total", "counter",
         "Small PINGs sent to re-measure a replica that has had no trip (judged far at connect)");
  for (const auto& w : s.workers) {
    o += fmt::format("moesh_worker_probes_total{{worker=\"{}\"}} {}\n", escape_label(w.label), w.probes);
  }
  header(o, "moesh_worker_compute_seconds_total", "counter",
         "Compute time the worker reported for its requests (latency minus this = network, framing, wake-ups)");
  for (const auto& w : s.workers) {
    o += fmt::format("moesh_worker_compute_seconds_total{{worker=\"{}\"}} {}\n", escape_label(w.label),
                     w.compute_sum_seconds);
  }
  header(o, "moesh_worker_bytes_sent_total", "counter", "Bytes sent to each worker (frames, headers included)");
  for (const auto& w : s.workers) {
    o += fmt::format("moesh_worker_bytes_sent_total{{worker=\"{}\"}} {}\n", escape_label(w.label), w.bytes_sent);
  }
  header(o, "moesh_worker_bytes_received_total", "counter", "Bytes received from each worker");
  for (const auto& w : s.workers) {
    o +=
        fmt::format("moesh_worker_bytes_received_total{{worker=\"{}\"}} {}\n", escape_label(w.label), w.bytes_received);
  }
  header(o, "moesh_worker_latency_seconds", "histogram", "DISPATCH to COMBINE latency per worker");
  for (const auto& w : s.workers) {
    histogram_lines(o, "moesh_worker_latency_seconds", fmt::format("worker=\"{}\"", escape_label(w.label)),
                    WorkerTraffic::kLatencyBounds, w.latency_counts.data(), w.latency_sum_seconds);
  }
  return o;
}

void ServeMetrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lk(mu_);
  ++s_.requests[{endpoint, status}];
}

void ServeMetrics::observe_duration(const std::string& endpoint, double seconds) {
  std::lock_guard<std::mutex> lk(mu_);
  s_.duration[endpoint].observe(seconds);
}

void ServeMetrics::observe_ttft(const std::string& endpoint, double seconds) {
  std::lock_guard<std::mutex> lk(mu_);
  s_.ttft[endpoint].observe(seconds);
}

MetricsSnapshot ServeMetrics::snapshot() const {
  std::lock_guard<std::mutex> lk(mu_);
  return s_;
}

}  // namespace moesh::serve
