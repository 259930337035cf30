// `moesh gate -m MODEL (--worker H:P ... | --workers FILE) [--wire D] [--combine M] [--threads N]
//  [--sequences N] [--seed S] [--min-argmax F] [--min-cosine F] [--no-bitwise]`:
// the validation gate of a remote dispatch path (docs/gate.md). Runs a fixed set of seeded token
// sequences through the full model twice — all-local (LocalExecutor) and through the workers —
// and compares, per sequence: argmax agreement, min/mean cosine of the logits, top-k expert
// agreement (each layer's routing decision of each token), and bitwise equality. Exact combine
// over the f32 wire must be bit-identical; lossy paths must meet the thresholds. Exit 0 = PASS.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "command.h"
#include "model_cli.h"
#include "moesh/sampling.h"
#include "swarm_cli.h"

namespace moesh::cli {
namespace {

struct GateArgs {
  std::string model;
  int threads = 0;
  int n_seq = 4;
  uint64_t seed = 42;
  double min_argmax = 0.99;
  double min_cosine = 0.998;
  bool no_bitwise = false;
  SwarmArgs swarm;
};

// Records every MoE layer's routing decisions as sorted expert sets, in call order.
class RoutingRecorder final : public ForwardObserver {
 public:
  void on_routing(int layer, int64_t n_tokens, int k, const int32_t* ids, const float*) override {
    for (int64_t t = 0; t < n_tokens; ++t) {
      std::vector<int32_t> s(ids + t * k, ids + (t + 1) * k);
      std::sort(s.begin(), s.end());
      decisions.push_back(std::move(s));
    }
  }
  std::vector<std::vector<int32_t>> decisions;
};

struct Flip {
  size_t seq = 0;
  int64_t pos = 0;
  int32_t local_id = 0, remote_id = 0;
  float lead = 0;  // local logit of local_id minus local logit of remote_id
};

struct SeqResult {
  int64_t n_tokens = 0;
  int64_t argmax_same = 0;
  double cos_min = 1.0, cos_mean = 0.0;
  int64_t routing_same = 0, routing_total = 0;
  bool bitwise = false;
  bool pass = false;
};

double cosine(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  if (aa == 0 && bb == 0) return 1.0;
  if (aa == 0 || bb == 0) return 0.0;
  return ab / std::sqrt(aa * bb);
}

// The first half of the sequence as one batch, the rest one token at a time through the KV
// cache: the gate covers both DISPATCH shapes (n_tokens > 1 and n_tokens = 1).
// With `remote`, the traffic of the batch and of the one-token steps is added to traffic[0/1].
Status run_sequence(Context& ctx, const std::vector<int32_t>& toks, std::vector<float>* logits,
                    RemoteExecutor* remote = nullptr, RemoteTraffic* traffic = nullptr) {
  const int64_t T = static_cast<int64_t>(toks.size());
  const int64_t V = ctx.model().hparams().n_vocab;
  logits->assign(static_cast<size_t>(T * V), 0.0f);
  ctx.kv().clear();
  const int64_t n_pre = std::max<int64_t>(1, T / 2);
  auto take = [&](RemoteTraffic* into) {
    if (remote == nullptr) return;
    const RemoteTraffic t = remote->traffic();
    remote->reset_traffic();
    into->dispatch_frames += t.dispatch_frames;
    into->dispatch_bytes += t.dispatch_bytes;
    into->combine_frames += t.combine_frames;
    into->combine_bytes += t.combine_bytes;
    into->layer_calls += t.layer_calls;
    into->token_layers += t.token_layers;
    into->remote_pairs += t.remote_pairs;
    into->local_pairs += t.local_pairs;
  };
  if (remote != nullptr) remote->reset_traffic();
  MOESH_RETURN_IF_ERROR(ctx.decode(0, toks.data(), n_pre, logits->data()));
  take(traffic);
  for (int64_t t = n_pre; t < T; ++t) {
    MOESH_RETURN_IF_ERROR(ctx.decode(0, toks.data() + t, 1, logits->data() + t * V));
  }
  take(traffic + 1);
  return Status::ok();
}

void print_traffic(const char* what, const RemoteTraffic& tr) {
  const double tl = static_cast<double>(std::max<uint64_t>(tr.token_layers, 1));
  std::printf("traffic %s: %llu DISPATCH (%llu B) + %llu COMBINE (%llu B) over %llu token-layers: "
              "%.1f + %.1f = %.1f B per token per layer; %llu pairs remote, %llu local\n",
              what, static_cast<unsigned long long>(tr.dispatch_frames),
              static_cast<unsigned long long>(tr.dispatch_bytes),
              static_cast<unsigned long long>(tr.combine_frames),
              static_cast<unsigned long long>(tr.combine_bytes),
              static_cast<unsigned long long>(tr.token_layers), tr.dispatch_bytes / tl,
              tr.combine_bytes / tl, (tr.dispatch_bytes + tr.combine_bytes) / tl,
              static_cast<unsigned long long>(tr.remote_pairs),
              static_cast<unsigned long long>(tr.local_pairs));
}

int run_gate(const GateArgs& a) {
  if (!a.swarm.enabled()) {
    std::fprintf(stderr, "moesh gate: error: give the remote path to check with --worker or --workers\n");
    return 2;
  }
  if (a.n_seq < 1) {
    std::fprintf(stderr, "moesh gate: error: --sequences must be >= 1\n");
    return 2;
  }
  auto model = load_model_or_report(a.model, false, "gate");
  if (!model) return 1;
  const HParams& hp = model->hparams();
  for (size_t il = 0; il < model->layers.size(); ++il) {
    if (model->layers[il].is_moe && !model->layers[il].experts.valid()) {
      std::fprintf(stderr,
                   "moesh gate: error: layer %zu has no routed-expert weights in %s; the gate "
                   "compares against local execution and needs the full model\n",
                   il, a.model.c_str());
      return 1;
    }
  }
  std::shared_ptr<RemoteExecutor> remote;
  if (!open_remote_or_report(*model, a.swarm, "gate", &remote)) return 1;
  const RemoteOptions& ro = remote->options();
  const bool bitwise = !a.no_bitwise && ro.combine == wire::CombineMode::kExact &&
                       ro.wire == wire::WireDType::kF32;

  // Fixed sequences: lengths 16, 32, 48, 64, ... (within the context), seeded random ids.
  std::mt19937_64 rng(a.seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(hp.n_vocab - 1));
  std::vector<std::vector<int32_t>> seqs;
  int64_t max_len = 0;
  for (int s = 0; s < a.n_seq; ++s) {
    const int64_t len = std::min<int64_t>(16 + 16 * (s % 4), std::max<int64_t>(hp.n_ctx_train, 2));
    std::vector<int32_t> v(static_cast<size_t>(len));
    for (auto& t : v) t = tok(rng);
    max_len = std::max(max_len, len);
    seqs.push_back(std::move(v));
  }

  ContextParams cp;
  cp.n_threads = a.threads;
  cp.n_ctx = max_len;
  Context local_ctx(*model, cp);
  cp.executor = remote;
  Context remote_ctx(*model, cp);

  std::printf("gate: %s | wire %s, combine %s, %zu worker(s) | criterion: %s\n", a.model.c_str(),
              wire::wire_dtype_name(ro.wire), wire::combine_mode_name(ro.combine), remote->n_workers(),
              bitwise ? "bit-identical logits"
                      : fmt::format("argmax agreement >= {:.4f}, min cosine >= {:.6f}", a.min_argmax,
                                    a.min_cosine).c_str());
  std::printf("%-4s %7s %16s %10s %10s %12s %8s  %s\n", "seq", "tokens", "argmax agree", "cos min",
              "cos mean", "top-k agree", "bitwise", "result");
  const int64_t V = hp.n_vocab;
  bool all_pass = true;
  std::vector<Flip> flips;
  double local_s = 0, remote_s = 0;
  std::vector<float> lg_local, lg_remote;
  RemoteTraffic traffic[2];  // batches, one-token steps
  for (size_t si = 0; si < seqs.size(); ++si) {
    RoutingRecorder rec_local, rec_remote;
    local_ctx.set_observer(&rec_local);
    remote_ctx.set_observer(&rec_remote);
    auto t0 = std::chrono::steady_clock::now();
    Status st = run_sequence(local_ctx, seqs[si], &lg_local);
    auto t1 = std::chrono::steady_clock::now();
    if (st.is_ok()) st = run_sequence(remote_ctx, seqs[si], &lg_remote, remote.get(), traffic);
    auto t2 = std::chrono::steady_clock::now();
    if (!st.is_ok()) {
      std::fprintf(stderr, "moesh gate: error: sequence %zu: %s\n", si, st.to_string().c_str());
      return 1;
    }
    local_s += std::chrono::duration<double>(t1 - t0).count();
    remote_s += std::chrono::duration<double>(t2 - t1).count();
    SeqResult r;
    r.n_tokens = static_cast<int64_t>(seqs[si].size());
    r.bitwise = std::memcmp(lg_local.data(), lg_remote.data(), lg_local.size() * sizeof(float)) == 0;
    double cos_sum = 0;
    for (int64_t t = 0; t < r.n_tokens; ++t) {
      const float* x = lg_local.data() + t * V;
      const float* y = lg_remote.data() + t * V;
      const int32_t ax = argmax(x, V), ay = argmax(y, V);
      r.argmax_same += ax == ay;
      if (ax != ay) flips.push_back({si, t, ax, ay, x[ax] - x[ay]});
      const double c = cosine(x, y, V);
      r.cos_min = std::min(r.cos_min, c);
      cos_sum += c;
    }
    r.cos_mean = cos_sum / static_cast<double>(r.n_tokens);
    r.routing_total = static_cast<int64_t>(std::min(rec_local.decisions.size(), rec_remote.decisions.size()));
    for (int64_t i = 0; i < r.routing_total; ++i) r.routing_same += rec_local.decisions[i] == rec_remote.decisions[i];
    const double argmax_frac = static_cast<double>(r.argmax_same) / static_cast<double>(r.n_tokens);
    const double routing_frac = r.routing_total > 0 ? static_cast<double>(r.routing_same) / r.routing_total : 1.0;
    r.pass = bitwise ? r.bitwise : (argmax_frac >= a.min_argmax && r.cos_min >= a.min_cosine);
    all_pass = all_pass && r.pass;
    std::printf("%-4zu %7lld %7lld/%-3lld %4.0f%% %10.6f %10.6f %11.2f%% %8s  %s\n", si,
                static_cast<long long>(r.n_tokens), static_cast<long long>(r.argmax_same),
                static_cast<long long>(r.n_tokens), 100.0 * argmax_frac, r.cos_min, r.cos_mean,
                100.0 * routing_frac, r.bitwise ? "yes" : "no", r.pass ? "PASS" : "FAIL");
  }
  if (!flips.empty()) {
    // How close each flip was to a tie in the LOCAL logits: the local winner's lead over the
    // token the remote path picked. Leads far below the logit noise of the lossy dtype mean
    // near-ties (random-weight models have many); large leads mean real damage.
    std::printf("argmax flips: %zu; local lead of the local top-1 over the remote's pick (logit units):\n",
                flips.size());
    for (size_t i = 0; i < flips.size() && i < 12; ++i) {
      const Flip& f = flips[i];
      std::printf("  seq %zu pos %lld: local %d, remote %d, lead %.5f\n", f.seq, static_cast<long long>(f.pos),
                  f.local_id, f.remote_id, f.lead);
    }
    if (flips.size() > 12) std::printf("  ... %zu more\n", flips.size() - 12);
  }
  print_traffic("(batches)", traffic[0]);
  print_traffic("(1-token steps)", traffic[1]);
  std::printf("time: local %.3f s, remote %.3f s\n", local_s, remote_s);
  std::printf("gate: %s\n", all_pass ? "PASS" : "FAIL");
  return all_pass ? 0 : 1;
}

const CommandRegistrar k_reg{Command{
    "gate", "Check a remote dispatch path against local execution (PASS/FAIL)",
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<GateArgs>();
      sub->add_option("-m,--model", a->model, "Full GGUF model file (local reference)")->required();
      sub->add_option("-t,--threads", a->threads, "Compute threads (default: all cores)");
      sub->add_option("--sequences", a->n_seq, "Token sequences to compare")->capture_default_str();
      sub->add_option("--seed", a->seed, "Seed of the token sequences")->capture_default_str();
      sub->add_option("--min-argmax", a->min_argmax, "Lossy paths: minimum argmax agreement (fraction)")
          ->capture_default_str();
      sub->add_option("--min-cosine", a->min_cosine, "Lossy paths: minimum cosine of any logits row")
          ->capture_default_str();
      sub->add_flag("--no-bitwise", a->no_bitwise,
                    "Judge exact+f32 by the lossy thresholds instead of bit identity");
      add_swarm_options(sub, &a->swarm);
      return [a] { return run_gate(*a); };
    }}};

}  // namespace
}  // namespace moesh::cli
