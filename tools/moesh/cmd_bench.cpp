// `moesh bench -m MODEL [-p 512] [-n 128] [-t N] [-r reps]`: llama-bench-style throughput
// (docs/bench.md). ppN: one batch of N prompt tokens into an empty cache; tgN: N tokens decoded
// one at a time from an empty cache. Tokens are drawn with a fixed seed. Mean ± std over reps.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "command.h"
#include "model_cli.h"
#include "moesh/model/sampling.h"
#include "moesh/model/speculative.h"
#include "swarm_cli.h"

namespace moesh::cli {
namespace {

struct BenchArgs {
  LoadOptions::Memory memory = LoadOptions::Memory::kAuto;  // --mmap / --no-mmap
  std::string model;
  int n_prompt = 512;
  int n_gen = 128;
  int depth = 0;  // tokens already in the cache before each pp / tg test (llama-bench's -d)
  int threads = 0;
  int reps = 3;
  bool timing = false;
  std::string draft;  // "" = no speculative rows
  int draft_max = 16;
  int streams = 1;                     // > 1: also a tgNxS row, S sequences decoded together
  bool compare_micro_batches = false;  // the tgNxS row with micro-batching off and on, alternated
  SwarmArgs swarm;
};

// Wraps the expert executor to time each MoE call from submit() to the end of wait(): the
// part of a step the routed experts (local compute, or the remote round trip) keep the backbone
// waiting. `--timing` prints it next to the step time, so local and swarm runs can be compared
// stage by stage instead of only by their totals.
class TimedExecutor final : public ExpertExecutor {
 public:
  explicit TimedExecutor(std::shared_ptr<ExpertExecutor> inner) : inner_(std::move(inner)) {}
  Ticket submit(int layer, const float* x, int64_t n_tokens, const RoutingPlan& plan) override {
    const auto now = std::chrono::steady_clock::now();
    const Ticket t = inner_->submit(layer, x, n_tokens, plan);
    started_.emplace_back(t, now);
    return t;
  }
  Result<std::span<const float>> wait(Ticket t) override {
    auto r = inner_->wait(t);
    // Two micro-batches have two calls out at once; each is timed from its own submit().
    for (size_t i = 0; i < started_.size(); ++i) {
      if (started_[i].first != t) continue;
      seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - started_[i].second).count();
      started_.erase(started_.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
    ++calls_;
    return r;
  }
  void set_pool(ThreadPool* pool) override { inner_->set_pool(pool); }
  bool overlaps_submits() const override { return inner_->overlaps_submits(); }
  void reset() {
    seconds_ = 0;
    calls_ = 0;
  }
  double seconds() const { return seconds_; }
  uint64_t calls() const { return calls_; }

 private:
  std::shared_ptr<ExpertExecutor> inner_;
  std::vector<std::pair<Ticket, std::chrono::steady_clock::time_point>> started_;
  double seconds_ = 0;
  uint64_t calls_ = 0;
};

struct Stat {
  double mean = 0, std = 0;
};

Stat stats(const std::vector<double>& v) {
  Stat s;
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  if (v.size() > 1) {
    for (double x : v) s.std += (x - s.mean) * (x - s.mean);
    s.std = std::sqrt(s.std / static_cast<double>(v.size() - 1));
  }
  return s;
}

// Where the timed steps went: the experts' share (submit -> wait done) per token and per MoE
// call, and for a swarm each worker's mean DISPATCH -> COMBINE latency next to the compute time
// it reported (the difference is network, framing and wake-ups).
void print_timing(const TimedExecutor& t, const RemoteExecutor* remote, const std::vector<WorkerTraffic>& before,
                  double wall_s, double tokens) {
  const double calls = static_cast<double>(std::max<uint64_t>(t.calls(), 1));
  std::printf("  timing: %.3f ms per token, of which routed experts %.3f ms (%.1f%%) in %.1f calls of %.3f ms\n",
              1e3 * wall_s / tokens, 1e3 * t.seconds() / tokens, 100.0 * t.seconds() / wall_s, calls / tokens,
              1e3 * t.seconds() / calls);
  if (remote == nullptr) return;
  const auto now = remote->worker_traffic();
  for (size_t i = 0; i < now.size() && i < before.size(); ++i) {
    const double req = static_cast<double>(now[i].requests - before[i].requests);
    if (req == 0) continue;
    const double lat = (now[i].latency_sum_seconds - before[i].latency_sum_seconds) / req;
    const double comp = (now[i].compute_sum_seconds - before[i].compute_sum_seconds) / req;
    std::printf("  worker %zu %s: %.0f requests, latency %.3f ms = compute %.3f ms + %.3f ms other\n", i,
                now[i].label.c_str(), req, 1e3 * lat, 1e3 * comp, 1e3 * (lat - comp));
  }
  // How much of the trips the backbone's own work (shared experts, dense work, its routed
  // experts) covered: the hidden fraction.
  const RemoteTraffic tr = remote->traffic();
  if (tr.layer_calls > 0 && tr.trip_seconds > 0) {
    std::printf("  hidden: %.3f ms of local work per trip of %.3f ms, %.1f%% of the trip hidden (%.0f trips)\n",
                1e3 * tr.local_seconds / tr.layer_calls, 1e3 * tr.trip_seconds / tr.layer_calls,
                100.0 * tr.hidden_seconds / tr.trip_seconds, static_cast<double>(tr.layer_calls));
  }
}

int run_bench(const BenchArgs& a) {
  if (a.n_prompt < 0 || a.n_gen < 0 || a.depth < 0 || a.reps < 1 || a.streams < 1) {
    std::fprintf(stderr, "moesh bench: error: -p, -n and -d must be >= 0, -r and --streams >= 1\n");
    return 2;
  }
  auto model = load_model_or_report(a.model, false, "bench", a.memory);
  if (!model) return 1;
  const HParams& hp = model->hparams();
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(hp.n_vocab - 1));
  std::vector<int32_t> toks(static_cast<size_t>(a.depth + std::max(a.n_prompt, a.n_gen)));
  for (auto& t : toks) t = dist(rng);

  std::shared_ptr<RemoteExecutor> remote;
  if (!open_remote_or_report(*model, a.swarm, "bench", &remote)) return 1;
  std::shared_ptr<SpanClient> spans;
  if (!open_spans_or_report(*model, a.swarm, "bench", a.threads, &spans, remote)) return 1;
  ContextParams cp;
  cp.spans = spans;
  cp.n_threads = a.threads;
  // Speculative rows generate greedily after a grounded prompt: a 16-token phrase said 4 times.
  std::vector<int32_t> grounded;
  for (int r = 0; r < 4; ++r)
    grounded.insert(grounded.end(), toks.begin(), toks.begin() + std::min<size_t>(16, toks.size()));
  cp.n_ctx =
      std::max<int64_t>(a.depth + std::max(a.n_prompt, a.n_gen), static_cast<int64_t>(grounded.size()) + a.n_gen) + 1;
  cp.executor = remote;
  cp.micro_batching = micro_batching_of(a.swarm);
  std::shared_ptr<TimedExecutor> timed;
  if (a.timing) {
    std::shared_ptr<ExpertExecutor> inner = remote;
    if (!inner) inner = std::make_shared<LocalExecutor>(model->expert_weights(), nullptr);
    timed = std::make_shared<TimedExecutor>(inner);
    cp.executor = timed;
  }
  Context ctx(*model, cp);
  std::vector<float> logits(static_cast<size_t>(hp.n_vocab));
  using clock = std::chrono::steady_clock;

  // With --depth, each pp / tg test starts where a long conversation would: `depth` tokens in the
  // cache (attention reads depth cells per token). They are prefilled once, untimed, into a spare
  // sequence, and each test starts from a copy of it (KV cells, recurrent state; span peers
  // follow the copy), so --timing and the trips line count only the timed tokens.
  constexpr int32_t kDepthSeq = 1;
  ctx.state().clear();
  if (a.depth > 0) {
    if (Status st = ctx.decode(kDepthSeq, toks.data(), a.depth, logits.data(), false); !st.is_ok()) {
      std::fprintf(stderr, "moesh bench: error: prefilling --depth %d: %s\n", a.depth, st.to_string().c_str());
      return 1;
    }
  }
  auto fill_depth = [&]() -> Status {
    ctx.state().remove(0);
    if (a.depth > 0) return ctx.state().copy(kDepthSeq, 0, a.depth);
    return Status::ok();
  };
  const int32_t* after = toks.data() + a.depth;
  auto time_pp = [&]() -> Result<double> {
    MOESH_RETURN_IF_ERROR(fill_depth());
    const auto t0 = clock::now();
    MOESH_RETURN_IF_ERROR(ctx.decode(0, after, a.n_prompt, logits.data(), false));
    return a.n_prompt / std::chrono::duration<double>(clock::now() - t0).count();
  };
  auto time_tg = [&]() -> Result<double> {
    MOESH_RETURN_IF_ERROR(fill_depth());
    const auto t0 = clock::now();
    for (int i = 0; i < a.n_gen; ++i) {
      MOESH_RETURN_IF_ERROR(ctx.decode(0, &after[i], 1, logits.data(), false));
    }
    return a.n_gen / std::chrono::duration<double>(clock::now() - t0).count();
  };

  // tgNxS: S sequences decoded together, one token each per step (continuous batching's decode).
  auto time_tg_streams = [&]() -> Result<double> {
    ctx.state().clear();
    std::vector<Context::BatchToken> batch(static_cast<size_t>(a.streams));
    const auto t0 = clock::now();
    for (int i = 0; i < a.n_gen; ++i) {
      for (int q = 0; q < a.streams; ++q) {
        batch[q] = {q, toks[(static_cast<size_t>(i) * a.streams + q) % toks.size()], false};
      }
      MOESH_RETURN_IF_ERROR(ctx.decode_batch(batch, nullptr));
    }
    return static_cast<double>(a.n_gen) * a.streams / std::chrono::duration<double>(clock::now() - t0).count();
  };

  // gen: greedy generation of n_gen tokens after the grounded prompt, plain (no source) or with
  // drafts; the same SpeculativeDecoder path, so the two rows differ only in the drafting.
  std::unique_ptr<DraftSource> draft;
  if (!a.draft.empty()) {
    auto d = make_draft_source(a.draft, DraftEnv{model.get(), &ctx.pool(), 0});
    if (!d) {
      std::fprintf(stderr, "moesh bench: error: --draft: %s\n", d.status().message().c_str());
      return 2;
    }
    draft = std::move(*d);
  }
  SpeculativeStats last_spec;
  auto time_gen = [&](DraftSource* src) -> Result<double> {
    ctx.state().clear();
    if (src != nullptr) src->forget(0);  // a model-based source's state follows the cells
    Sampler greedy(SamplingParams{});
    SpeculativeDecoder dec(&ctx, 0, &greedy, src, SpeculativeParams{a.draft_max, true});
    int32_t first = -1;
    MOESH_RETURN_IF_ERROR(dec.start(grounded, &first));
    const auto t0 = clock::now();
    int64_t n = 1;
    std::vector<int32_t> got;
    while (n < a.n_gen) {
      MOESH_RETURN_IF_ERROR(dec.step(static_cast<int>(a.n_gen - n), &got));
      n += static_cast<int64_t>(got.size());
    }
    last_spec = dec.stats();
    return static_cast<double>(a.n_gen - 1) / std::chrono::duration<double>(clock::now() - t0).count();
  };

  std::printf("| %-40s | %10s | %7s | %16s | %20s |\n", "model", "size", "threads", "test", "t/s");
  std::printf("| %s | %s | %s | %s | %s |\n", std::string(40, '-').c_str(), std::string(10, '-').c_str(),
              std::string(7, '-').c_str(), std::string(16, '-').c_str(), std::string(20, '-').c_str());
  const double mib = static_cast<double>(model->file().size()) / (1024.0 * 1024.0);
  std::string shown = model->file().path();
  if (shown.size() > 40) shown = "..." + shown.substr(shown.size() - 37);
  double tg_mean = 0;
  for (int which = 0; which < 2; ++which) {
    const int n = which == 0 ? a.n_prompt : a.n_gen;
    if (n == 0) continue;
    // One untimed warm-up run (page faults of the mapped weights, buffer growth).
    auto warm = which == 0 ? time_pp() : time_tg();
    if (!warm) {
      std::fprintf(stderr, "moesh bench: error: %s\n", warm.status().to_string().c_str());
      return 1;
    }
    std::vector<double> tps;
    if (timed) timed->reset();
    std::vector<WorkerTraffic> before;
    if (remote) {
      before = remote->worker_traffic();
      remote->reset_traffic();
    }
    double wall = 0;
    for (int r = 0; r < a.reps; ++r) {
      auto x = which == 0 ? time_pp() : time_tg();
      if (!x) {
        std::fprintf(stderr, "moesh bench: error: %s\n", x.status().to_string().c_str());
        return 1;
      }
      tps.push_back(*x);
      wall += n / *x;
    }
    const Stat s = stats(tps);
    std::printf(
        "| %-40s | %6.2f MiB | %7d | %16s | %20s |\n", shown.c_str(), mib, ctx.pool().n_threads(),
        fmt::format("{}{}{}", which == 0 ? "pp" : "tg", n, a.depth > 0 ? fmt::format(" @ d{}", a.depth) : "").c_str(),
        fmt::format("{:.2f} ± {:.2f}", s.mean, s.std).c_str());
    if (timed) print_timing(*timed, remote.get(), before, wall, static_cast<double>(n) * a.reps);
    if (which == 1) tg_mean = s.mean;
    if (remote && which == 1) {
      // Round trips per generated token (one per MoE layer call that went to a worker).
      std::printf("  trips: %.2f per token (%llu layer calls to workers, %llu pairs local, %llu remote)\n",
                  static_cast<double>(remote->traffic().layer_calls) / (static_cast<double>(n) * a.reps),
                  static_cast<unsigned long long>(remote->traffic().layer_calls),
                  static_cast<unsigned long long>(remote->traffic().local_pairs),
                  static_cast<unsigned long long>(remote->traffic().remote_pairs));
    }
  }
  if (remote && a.swarm.local_experts_mb > 0) {
    const HotExpertReport h = remote->hot_experts();
    std::printf(
        "hot experts: %lld computed here (%.2f of %.2f MiB), %d MoE layers without a trip; predicted trip "
        "latency %.3f -> %.3f ms per token; %llu fetched, %llu failed%s%s\n",
        static_cast<long long>(h.experts), h.bytes / 1048576.0, h.budget_bytes / 1048576.0, h.layers_all_local,
        1e3 * h.predicted_s_none, 1e3 * h.predicted_s_chosen, static_cast<unsigned long long>(h.fetched),
        static_cast<unsigned long long>(h.fetch_failures), h.last_fetch_error.empty() ? "" : ": ",
        h.last_fetch_error.c_str());
  }
  if (a.streams > 1 && a.n_gen > 0) {
    // Micro-batching off and on alternated rep by rep (--compare-micro-batches), or as configured.
    const std::vector<MicroBatching> modes =
        a.compare_micro_batches
            ? std::vector<MicroBatching>{MicroBatching::kOff, MicroBatching::kOn, MicroBatching::kAuto}
            : std::vector<MicroBatching>{ctx.micro_batching()};
    std::vector<std::vector<double>> tps(modes.size());
    std::vector<MicroBatchStats> mb(modes.size());
    if (remote) remote->reset_traffic();
    for (int r = 0; r <= a.reps; ++r) {  // rep 0 warms up
      for (size_t m = 0; m < modes.size(); ++m) {
        ctx.set_micro_batching(modes[m]);
        const MicroBatchStats before = ctx.micro_batch_stats();
        auto x = time_tg_streams();
        if (!x) {
          std::fprintf(stderr, "moesh bench: error: %s\n", x.status().to_string().c_str());
          return 1;
        }
        if (r == 0) continue;
        tps[m].push_back(*x);
        mb[m].steps_split += ctx.micro_batch_stats().steps_split - before.steps_split;
        mb[m].steps_whole += ctx.micro_batch_stats().steps_whole - before.steps_whole;
      }
    }
    static const char* kMbName[] = {"off", "on", "auto"};
    std::vector<Stat> st;
    for (size_t m = 0; m < modes.size(); ++m) {
      st.push_back(stats(tps[m]));
      std::string test = fmt::format("tg{}x{}", a.n_gen, a.streams);
      if (remote) test += fmt::format(" mb={}", kMbName[static_cast<int>(modes[m])]);
      std::printf("| %-40s | %6.2f MiB | %7d | %16s | %20s |\n", shown.c_str(), mib, ctx.pool().n_threads(),
                  test.c_str(), fmt::format("{:.2f} ± {:.2f}", st[m].mean, st[m].std).c_str());
    }
    for (size_t m = 0; m < modes.size(); ++m) {
      std::printf("streams: %d streams give %.2fx the single-stream token rate (mb=%s: %llu of %llu steps split)\n",
                  a.streams, tg_mean > 0 ? st[m].mean / tg_mean : 0.0, kMbName[static_cast<int>(modes[m])],
                  static_cast<unsigned long long>(mb[m].steps_split),
                  static_cast<unsigned long long>(mb[m].steps_split + mb[m].steps_whole));
    }
    if (modes.size() == 3 && st[0].mean > 0) {
      std::printf("micro-batches: on/off = %.3fx, auto/off = %.3fx\n", st[1].mean / st[0].mean,
                  st[2].mean / st[0].mean);
    }
    ctx.set_micro_batching(micro_batching_of(a.swarm));
  }
  if (draft && a.n_gen > 1) {
    // Plain and drafted greedy generation, alternated rep by rep so drift hits both alike.
    std::vector<double> plain_tps, spec_tps;
    int64_t drafted = 0, accepted = 0, passes = 0, emitted = 0;
    for (int r = 0; r <= a.reps; ++r) {  // rep 0 warms up
      auto p = time_gen(nullptr);
      auto q = p ? time_gen(draft.get()) : Result<double>(p.status());
      if (!q) {
        std::fprintf(stderr, "moesh bench: error: %s\n", q.status().to_string().c_str());
        return 1;
      }
      if (r == 0) continue;
      plain_tps.push_back(*p);
      spec_tps.push_back(*q);
      drafted += last_spec.drafted;
      accepted += last_spec.accepted;
      passes += last_spec.steps;
      emitted += last_spec.emitted;
    }
    const Stat sp = stats(plain_tps), sq = stats(spec_tps);
    const std::string base = fmt::format("gen{}", a.n_gen);
    std::printf("| %-40s | %6.2f MiB | %7d | %16s | %20s |\n", shown.c_str(), mib, ctx.pool().n_threads(), base.c_str(),
                fmt::format("{:.2f} ± {:.2f}", sp.mean, sp.std).c_str());
    std::printf("| %-40s | %6.2f MiB | %7d | %16s | %20s |\n", shown.c_str(), mib, ctx.pool().n_threads(),
                (base + "+" + draft->name()).c_str(), fmt::format("{:.2f} ± {:.2f}", sq.mean, sq.std).c_str());
    std::printf("draft %s: %.2fx plain; %.2f tokens per forward pass, %lld of %lld drafts accepted\n",
                draft->name().c_str(), sp.mean > 0 ? sq.mean / sp.mean : 0.0,
                passes ? double(emitted) / double(passes) : 0.0, static_cast<long long>(accepted),
                static_cast<long long>(drafted));
  }
  // Span peers: trips, replays and failovers over every run above (warm-ups included).
  if (spans) print_span_stats(*spans, stdout);
  return 0;
}

const CommandRegistrar kRegisterBench{Command{
    "bench", "Prompt-processing and generation throughput (llama-bench style)",
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<BenchArgs>();
      sub->add_option("-m,--model", a->model, "GGUF model file")->required();
      add_memory_flags(sub, &a->memory);
      sub->add_option("-p,--n-prompt", a->n_prompt, "Prompt tokens (pp test; 0: skip)")->capture_default_str();
      sub->add_option("-n,--n-gen", a->n_gen, "Generated tokens (tg test; 0: skip)")->capture_default_str();
      sub->add_option("-d,--depth", a->depth,
                      "Tokens already in the KV cache before each pp / tg test (prefilled untimed; rows "
                      "ppN @ dD, tgN @ dD)")
          ->capture_default_str();
      sub->add_option("-t,--threads", a->threads, "Compute threads (default: all cores)");
      sub->add_option("-r,--repetitions", a->reps, "Timed repetitions")->capture_default_str();
      sub->add_flag("--timing", a->timing,
                    "Also print where each step's time went (routed experts; per worker latency vs compute)");
      sub->add_option("--draft", a->draft,
                      "Also time greedy generation after a grounded (repeated) prompt, plain vs with "
                      "this draft source (ngram, or nextn: the model's own NextN/MTP head): rows genN and "
                      "genN+SOURCE");
      sub->add_option("--draft-max", a->draft_max, "Most drafts per forward pass")->capture_default_str();
      sub->add_option("--streams", a->streams,
                      "Also time S sequences decoded together (row tgNxS) and its ratio to tgN")
          ->capture_default_str();
      sub->add_flag("--compare-micro-batches", a->compare_micro_batches,
                    "With --streams and workers: the tgNxS row with --micro-batches off, on and auto, alternated");
      add_swarm_options(sub, &a->swarm);
      return [a] { return run_bench(*a); };
    }}};

}  // namespace
}  // namespace moesh::cli
