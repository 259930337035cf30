// `moesh simulate`: runs a plan (the planner's, or a fixed layout) through the discrete-event
// swarm simulator and prints what it predicts: tokens/s, step times, trips, bytes, failovers
// (docs/simulate.md).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "command.h"
#include "plan_cli.h"

namespace moesh::cli {
namespace {

struct SimArgs {
  PlanCliArgs plan;
  int steps = 32;
  int prompt_rows = 0;
  std::string jitter = "0", timeout = "60s";
  std::vector<std::string> failures;  // NAME@SECONDS
};

int run_simulate(const SimArgs& a) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "moesh simulate: error: %s\n", s.to_string().c_str());
    return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kNotFound ? 2 : 1;
  };
  auto setup = resolve_plan_setup(a.plan);
  if (!setup) return fail(setup.status());
  if (setup->peers.empty()) return fail(make_error(StatusCode::kInvalidArgument, "no peers (--peer or --peers N)"));
  auto plan = plan_for_layout(*setup, a.plan.layout);
  if (!plan) return fail(plan.status());
  if (a.plan.layout == "plan" && !a.plan.no_lanes) {  // lanes for many streams, as swarm plan adds them
    Status ln = add_span_lanes(setup->model, setup->plan_peers, setup->opts, &*plan);
    if (!ln.is_ok()) return fail(ln);
  }
  if (!a.plan.no_standby) {  // a failed span goes to its standby, as the runtime does
    Status sb = add_standbys(setup->model, setup->plan_peers, setup->opts, &*plan);
    if (!sb.is_ok()) return fail(sb);
  }
  SimOptions so;
  so.steps = a.steps;
  so.streams = a.plan.streams;
  so.draft = a.plan.draft;
  so.accept = a.plan.accept;
  so.prompt_rows = a.prompt_rows;
  so.seed = a.plan.seed;
  auto j = wan::parse_duration(a.jitter);
  if (!j) return fail(j.status().with_context("--jitter"));
  so.jitter_s = static_cast<double>(j->count()) * 1e-9;
  auto t = wan::parse_duration(a.timeout);
  if (!t) return fail(t.status().with_context("--timeout"));
  so.timeout_s = static_cast<double>(t->count()) * 1e-9;
  for (const std::string& f : a.failures) {
    const size_t at = f.find('@');
    int peer = -1;
    for (size_t i = 0; i < setup->peers.size() && at != std::string::npos; ++i)
      if (setup->peers[i].peer.name == f.substr(0, at)) peer = static_cast<int>(i);
    if (peer < 0) return fail(make_error(StatusCode::kInvalidArgument, "--fail '{}': NAME@SECONDS of a peer", f));
    auto d = wan::parse_duration(f.substr(at + 1));
    if (!d) return fail(d.status().with_context("--fail"));
    so.failures.push_back({peer, static_cast<double>(d->count()) * 1e-9});
  }
  auto r = simulate(setup->model, setup->plan_peers, setup->opts, *plan, so);
  if (!r) return fail(r.status());
  if (a.plan.json) {
    nlohmann::json out = plan_to_json(*setup, *plan);
    out["layout"] = a.plan.layout;
    out["simulated"] = {{"seconds", r->seconds},
                        {"steps", r->steps},
                        {"tokens", r->tokens},
                        {"tokens_per_s", r->tokens_per_s},
                        {"step_mean_ms", r->step_mean_s * 1e3},
                        {"step_p50_ms", r->step_p50_s * 1e3},
                        {"step_p99_ms", r->step_p99_s * 1e3},
                        {"trips_per_step", r->trips_per_step},
                        {"messages", r->messages},
                        {"bytes", r->bytes},
                        {"failovers", r->failovers},
                        {"replayed_rows", r->replayed_rows}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  const PlanModel& m = setup->model;
  std::printf("model %s: %d layers, %d experts top-%d; %zu peers; layout %s; %d stream(s), %d draft(s)\n",
              m.name.c_str(), m.n_layer(), m.n_expert, m.n_expert_used, setup->peers.size(), a.plan.layout.c_str(),
              a.plan.streams, a.plan.draft);
  if (setup->peers.size() <= 24) std::printf("%s", render_plan(m, setup->plan_peers, *plan).c_str());
  int n_span = 0, n_exp = 0;
  for (const PeerRole& role : plan->roles) {
    n_span += role.kind == RoleKind::kSpan;
    n_exp += role.kind == RoleKind::kExperts;
  }
  std::printf("roles: %d span peer(s), %d expert peer(s), %zu idle\n", n_span, n_exp,
              setup->peers.size() - n_span - n_exp);
  std::printf(
      "simulated: %d steps in %.3f s: %.2f tokens/s; step mean %.1f ms, p50 %.1f ms, p99 %.1f ms; "
      "%.2f trips per step; %lld messages, %.1f MiB\n",
      r->steps, r->seconds, r->tokens_per_s, r->step_mean_s * 1e3, r->step_p50_s * 1e3, r->step_p99_s * 1e3,
      r->trips_per_step, static_cast<long long>(r->messages), r->bytes / 1048576.0);
  if (!so.failures.empty())
    std::printf("failures: %d failover(s), %lld row(s) replayed\n", r->failovers,
                static_cast<long long>(r->replayed_rows));
  std::printf("planner's cost model: %.1f ms per step, %.2f tokens/s\n", plan->step_s * 1e3, plan->tokens_per_s);
  return 0;
}

const CommandRegistrar kRegisterSimulate{Command{
    "simulate", "Simulate a swarm running a plan: tokens/s, step times, trips, failures (discrete events)",
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<SimArgs>();
      add_plan_options(sub, &a->plan, true);
      sub->add_option("--steps", a->steps, "Decode steps to simulate");
      sub->add_option("--prompt-rows", a->prompt_rows, "Rows each span already holds per stream (replayed on failure)");
      sub->add_option("--jitter", a->jitter, "One-way jitter, uniform in [0, J], never reordering");
      sub->add_option("--timeout", a->timeout, "How long the backbone waits for a lost reply");
      sub->add_option("--fail", a->failures, "NAME@TIME: the peer stops answering at TIME (repeatable)");
      return [a]() -> int { return run_simulate(*a); };
    }}};

}  // namespace
}  // namespace moesh::cli
