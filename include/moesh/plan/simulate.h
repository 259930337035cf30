// A discrete-event simulator of a swarm running a plan (swarm_plan.h), so placements and the
// round-trip techniques can be judged at a scale one machine cannot emulate: hundreds of peers,
// DeepSeek-V3/Kimi-sized models, RTT distributions, failures (docs/simulate.md).
//
// What it models, message by message: the backbone's CPU, each peer's CPU and each link direction
// are FIFO servers. A link delivers a message after its serialisation (bytes / rate, queued behind
// the messages before it), the one-way delay (RTT / 2) and a jitter draw that never reorders. A
// decode step walks the layers in order: a span is one message to its peer, its layers' compute
// there, one message back; a backbone MoE layer computes its dense part, draws each token's k
// distinct experts from the activation shares, sends one DISPATCH to every holder it needs at
// once (star fan-out), computes its own pairs meanwhile, and waits for every COMBINE. A failed
// peer answers nothing: the backbone notices after the timeout and computes the work itself (an
// expert peer's pairs; a span's layers, replaying every row the span was sent before), as the
// real backbone does. Costs come from PlanModel (measured per byte on this code) and
// PlanOptions::message_s (measured per message).
#pragma once

#include <cstdint>
#include <vector>

#include "moesh/plan/swarm_plan.h"
#include "moesh/util/status.h"

namespace moesh {

struct SimFailure {
  int peer = 0;
  double at_s = 0;  // it stops answering from this time on
};

struct SimOptions {
  int steps = 32;           // decode steps
  int streams = 1;          // sequences per step (continuous batching)
  int draft = 0;            // draft tokens per stream per step (speculative decoding)
  double accept = 0;        // chance each draft token is accepted, until the first rejection
  int prompt_rows = 0;      // rows every span already holds per stream (replayed on failure)
  double jitter_s = 0;      // one-way jitter, uniform in [0, jitter_s], never reordering
  double timeout_s = 60.0;  // how long a lost reply is waited for (--span-timeout-ms' default)
  std::vector<SimFailure> failures;
  uint64_t seed = 1;
};

struct SimResult {
  double seconds = 0;
  int steps = 0;
  int64_t tokens = 0;  // accepted tokens over all streams
  double tokens_per_s = 0;
  double step_mean_s = 0, step_p50_s = 0, step_p99_s = 0;
  double trips_per_step = 0;  // network waits per step (a fan-out to several holders is one)
  int64_t messages = 0;
  uint64_t bytes = 0;  // on every link, both directions
  int failovers = 0;
  int64_t replayed_rows = 0;
  std::vector<double> peer_busy_s;  // compute time per peer
  double backbone_busy_s = 0;
};

// kInvalidArgument for an invalid plan (evaluate_plan's checks) or options.
Result<SimResult> simulate(const PlanModel& m, const std::vector<PlanPeer>& peers, const PlanOptions& po,
                           const SwarmPlan& plan, const SimOptions& so);

// Model shapes of the seed's large targets (byte sizes at Q4_K_M-like 4.85 bits per weight),
// for `moesh simulate --shape`: "qwen3-30b-a3b", "deepseek-v3", "kimi-k2", "glm-4.5".
// Costs from seconds_per_byte. kNotFound lists the known names.
Result<PlanModel> plan_model_shape(const std::string& name, int n_ctx, double seconds_per_byte);

}  // namespace moesh
