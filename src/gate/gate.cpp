// `moesh gate` as a library: curated token sequences and the local-vs-remote comparison
// (include/moesh/gate/gate.h, docs/gate.md).
#include "moesh/gate/gate.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "moesh/model/sampling.h"

namespace moesh::gate {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Near-tie threshold of sparse-attention selections (glm-dsa indexer-score units). The reference
// README's 0.01 (§4) keeps quantization-level differences from moving a selection; an f16 or q8
// wire moves the indexer scores further (glmdsa-a: seq 3 flipped selections at 0.01, none at 0.04).
constexpr double kMinSelectionMargin = 0.04;

// Minimum routing margin over the MoE layers of each token of the last decode call. Sparse
// attention selections (glm-dsa) count too: their margins, in routing-margin units (scaled by the
// routing threshold over kMinSelectionMargin), so one threshold covers both near-ties.
class MarginObserver final : public ForwardObserver {
 public:
  explicit MarginObserver(double min_routing_margin) : selection_scale(min_routing_margin / kMinSelectionMargin) {}
  void start(int64_t n_tokens) { min_margin.assign(static_cast<size_t>(n_tokens), kInf); }
  void on_selection_margins(int layer, int64_t n_tokens, const float* m) override {
    std::vector<float> scaled(m, m + n_tokens);
    for (float& x : scaled) x = static_cast<float>(x * selection_scale);
    on_routing_margins(layer, n_tokens, scaled.data());
  }
  double selection_scale;
  void on_routing_margins(int, int64_t n_tokens, const float* m) override {
    if (static_cast<int64_t>(min_margin.size()) < n_tokens) min_margin.resize(static_cast<size_t>(n_tokens), kInf);
    for (int64_t t = 0; t < n_tokens; ++t) {
      min_margin[static_cast<size_t>(t)] = std::min(min_margin[static_cast<size_t>(t)], static_cast<double>(m[t]));
    }
  }
  std::vector<double> min_margin;
};

// Records every MoE layer's routing decisions as sorted expert sets, keyed by (layer, the
// layer's n-th token): blocks that run on a span peer report nothing here, so only decisions
// both sides saw are compared.
class RoutingRecorder final : public ForwardObserver {
 public:
  void on_routing(int layer, int64_t n_tokens, int k, const int32_t* ids, const float*) override {
    int64_t& seen = per_layer[layer];
    for (int64_t t = 0; t < n_tokens; ++t) {
      std::vector<int32_t> s(ids + t * k, ids + (t + 1) * k);
      std::sort(s.begin(), s.end());
      decisions[{layer, seen++}] = std::move(s);
    }
  }
  std::map<std::pair<int, int64_t>, std::vector<int32_t>> decisions;
  std::map<int, int64_t> per_layer;
};

// Top-1 minus runner-up, divided by the RMS of the row (0 for an all-zero row).
double top1_lead_rel(const float* x, int64_t n) {
  float a = -std::numeric_limits<float>::infinity(), b = a;
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) {
    ss += static_cast<double>(x[i]) * x[i];
    if (x[i] > a) {
      b = a;
      a = x[i];
    } else if (x[i] > b) {
      b = x[i];
    }
  }
  const double rms = std::sqrt(ss / static_cast<double>(n));
  if (rms == 0 || n < 2) return 0;
  return (static_cast<double>(a) - b) / rms;
}

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

// The lossy criterion on one sequence's cosines: each at least min_cosine, or with the model's noise
// floor, each (sorted) at least min(min_cosine, the floor's cosine of the same rank).
bool within_floor(std::vector<double> cos, double min_cosine, const std::vector<double>* floor) {
  std::sort(cos.begin(), cos.end());
  std::vector<double> f = floor != nullptr ? *floor : std::vector<double>{};
  std::sort(f.begin(), f.end());
  for (size_t i = 0; i < cos.size(); ++i) {
    const double bar = i < f.size() ? std::min(min_cosine, f[i]) : min_cosine;
    if (cos[i] < bar) return false;
  }
  return true;
}

void add_traffic(RemoteTraffic* into, const RemoteTraffic& t) {
  into->dispatch_frames += t.dispatch_frames;
  into->dispatch_bytes += t.dispatch_bytes;
  into->combine_frames += t.combine_frames;
  into->combine_bytes += t.combine_bytes;
  into->layer_calls += t.layer_calls;
  into->token_layers += t.token_layers;
  into->remote_pairs += t.remote_pairs;
  into->local_pairs += t.local_pairs;
}

// How far a position is above the thresholds, as one number: the smaller of the two ratios
// (criterion / threshold); >= 1 means well-conditioned. A zero threshold disables its criterion.
double condition_score(const Conditioning& c, double min_margin, double min_lead) {
  double s = kInf;
  if (min_margin > 0) s = std::min(s, c.routing_margin / min_margin);
  if (min_lead > 0) s = std::min(s, c.top1_lead_rel / min_lead);
  return s;
}

}  // namespace

double default_min_routing_margin(const HParams& hp) {
  // Sigmoid scores (+ bias) are what sigmoid gating selects on, except where the top-k is taken
  // on the raw logits (llama4): margins are then in logit units, like softmax's.
  return hp.gating == GatingFunc::kSigmoid && !hp.select_on_logits ? 0.0125 : 0.05;
}

std::vector<int64_t> sequence_lengths(int n, int64_t n_ctx) {
  std::vector<int64_t> out;
  for (int s = 0; s < n; ++s) out.push_back(std::min<int64_t>(16 + 16 * (s % 4), std::max<int64_t>(n_ctx, 2)));
  return out;
}

Result<CuratedSequences> curate_sequences(const Model& model, const CurationOptions& opts) {
  if (opts.n_sequences < 1) return make_error(StatusCode::kInvalidArgument, "need at least one sequence");
  if (opts.max_tries < 1) return make_error(StatusCode::kInvalidArgument, "max_tries must be >= 1");
  const HParams& hp = model.hparams();
  CuratedSequences out;
  out.min_routing_margin = opts.min_routing_margin >= 0 ? opts.min_routing_margin : default_min_routing_margin(hp);
  out.min_top1_lead = opts.min_top1_lead;
  out.worst = {kInf, kInf};
  const std::vector<int64_t> lens = sequence_lengths(opts.n_sequences, hp.n_ctx_train);
  std::mt19937_64 rng(opts.seed);
  std::uniform_int_distribution<int32_t> draw(0, static_cast<int32_t>(hp.n_vocab - 1));
  out.rejected_per_sequence.assign(lens.size(), 0);
  if (opts.raw) {
    for (int64_t len : lens) {
      std::vector<int32_t> v(static_cast<size_t>(len));
      for (auto& t : v) t = draw(rng);
      out.positions += len;
      MOESH_ASSIGN_OR_RETURN(auto cond, measure_conditioning(model, v, opts.n_threads));
      for (const Conditioning& c : cond) {
        out.worst.routing_margin = std::min(out.worst.routing_margin, c.routing_margin);
        out.worst.top1_lead_rel = std::min(out.worst.top1_lead_rel, c.top1_lead_rel);
      }
      out.tokens.push_back(std::move(v));
    }
    return out;
  }

  ContextParams cp;
  cp.n_threads = opts.n_threads;
  cp.n_ctx = *std::max_element(lens.begin(), lens.end());
  Context ctx(model, cp);
  MarginObserver obs(out.min_routing_margin);
  ctx.set_observer(&obs);
  const int64_t V = hp.n_vocab;
  std::vector<float> logits(static_cast<size_t>(V));
  // One position: decode `tok` after the cached prefix and measure it.
  auto try_token = [&](int32_t tok, Conditioning* c) -> Status {
    obs.start(1);
    MOESH_RETURN_IF_ERROR(ctx.decode(0, &tok, 1, logits.data()));
    c->routing_margin = obs.min_margin[0];
    c->top1_lead_rel = top1_lead_rel(logits.data(), V);
    return Status::ok();
  };
  for (size_t si = 0; si < lens.size(); ++si) {
    ctx.state().clear();
    std::vector<int32_t> seq;
    for (int64_t p = 0; p < lens[si]; ++p) {
      int32_t best_tok = -1;
      double best_score = -kInf;
      Conditioning best{}, c{};
      bool accepted = false;
      for (int attempt = 0; attempt < opts.max_tries; ++attempt) {
        const int32_t tok = draw(rng);
        MOESH_RETURN_IF_ERROR(try_token(tok, &c));
        if (condition_score(c, out.min_routing_margin, out.min_top1_lead) >= 1.0) {
          seq.push_back(tok);
          best = c;
          accepted = true;
          break;
        }
        ++out.draws_rejected;
        ++out.rejected_per_sequence[si];
        const double score = condition_score(c, out.min_routing_margin, out.min_top1_lead);
        if (score > best_score) {
          best_score = score;
          best_tok = tok;
          best = c;
        }
        MOESH_RETURN_IF_ERROR(ctx.rewind(0, p, seq));  // drop the rejected token
      }
      if (!accepted) {
        // Every draw made a near-tie: keep the best one (its KV must be recomputed) and say so.
        ++out.ill_conditioned;
        MOESH_RETURN_IF_ERROR(try_token(best_tok, &c));
        seq.push_back(best_tok);
      }
      out.worst.routing_margin = std::min(out.worst.routing_margin, best.routing_margin);
      out.worst.top1_lead_rel = std::min(out.worst.top1_lead_rel, best.top1_lead_rel);
    }
    out.positions += lens[si];
    out.tokens.push_back(std::move(seq));
  }
  return out;
}

Result<std::vector<Conditioning>> measure_conditioning(const Model& model, const std::vector<int32_t>& tokens,
                                                       int n_threads) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t V = model.hparams().n_vocab;
  if (T == 0) return std::vector<Conditioning>{};
  ContextParams cp;
  cp.n_threads = n_threads;
  cp.n_ctx = T;
  Context ctx(model, cp);
  MarginObserver obs(default_min_routing_margin(model.hparams()));
  obs.start(T);
  ctx.set_observer(&obs);
  std::vector<float> logits(static_cast<size_t>(T * V));
  MOESH_RETURN_IF_ERROR(ctx.decode(0, tokens.data(), T, logits.data()));
  std::vector<Conditioning> out(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    out[static_cast<size_t>(t)] = {obs.min_margin[static_cast<size_t>(t)], top1_lead_rel(logits.data() + t * V, V)};
  }
  return out;
}

Result<std::vector<std::vector<int32_t>>> load_sequences_json(const std::string& path, int64_t n_vocab) {
  std::ifstream in(path);
  if (!in) return make_error(StatusCode::kNotFound, "cannot open {}", path);
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("sequences") || !j["sequences"].is_array()) {
    return make_error(StatusCode::kInvalidArgument, "{}: expected {{\"sequences\": [{{\"tokens\": [...]}}, ...]}}",
                      path);
  }
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < j["sequences"].size(); ++i) {
    const auto& s = j["sequences"][i];
    if (!s.is_object() || !s.contains("tokens") || !s["tokens"].is_array() || s["tokens"].empty()) {
      return make_error(StatusCode::kInvalidArgument, "{}: sequence {} has no \"tokens\" array", path, i);
    }
    std::vector<int32_t> v;
    for (const auto& t : s["tokens"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab) {
        return make_error(StatusCode::kInvalidArgument, "{}: sequence {}: token {} is not an id in [0, {})", path, i,
                          t.dump(), n_vocab);
      }
      v.push_back(t.get<int32_t>());
    }
    out.push_back(std::move(v));
  }
  if (out.empty()) return make_error(StatusCode::kInvalidArgument, "{}: no sequences", path);
  return out;
}

bool is_bit_exact_path(const RemoteExecutor& remote) {
  const RemoteOptions& o = remote.options();
  return o.combine == wire::CombineMode::kExact && o.return_wire == wire::WireDType::kF32 &&
         (o.hidden_wire == wire::WireDType::kF32 || remote.hidden_is_exact());
}

// Both runs share one schedule: the first half as one batch, the rest one token at a time.
static Status run_sequence(Context& ctx, const std::vector<int32_t>& toks, std::vector<float>* logits,
                           RemoteExecutor* remote, RemoteTraffic* traffic) {
  const int64_t T = static_cast<int64_t>(toks.size());
  const int64_t V = ctx.model().hparams().n_vocab;
  logits->assign(static_cast<size_t>(T * V), 0.0f);
  ctx.state().clear();
  const int64_t n_pre = std::max<int64_t>(1, T / 2);
  auto take = [&](RemoteTraffic* into) {
    if (remote == nullptr) return;
    const RemoteTraffic t = remote->traffic();
    remote->reset_traffic();
    if (into != nullptr) add_traffic(into, t);
  };
  if (remote != nullptr) remote->reset_traffic();
  MOESH_RETURN_IF_ERROR(ctx.decode(0, toks.data(), n_pre, logits->data()));
  take(traffic);
  for (int64_t t = n_pre; t < T; ++t) {
    MOESH_RETURN_IF_ERROR(ctx.decode(0, toks.data() + t, 1, logits->data() + t * V));
  }
  take(traffic != nullptr ? traffic + 1 : nullptr);
  return Status::ok();
}

Result<SequenceResult> compare_sequence(Context& local, Context& remote, const std::vector<int32_t>& tokens,
                                        const CompareOptions& opts, size_t seq_index, RemoteExecutor* remote_exec,
                                        RemoteTraffic* traffic) {
  if (tokens.empty()) return make_error(StatusCode::kInvalidArgument, "empty sequence {}", seq_index);
  const int64_t V = local.model().hparams().n_vocab;
  RoutingRecorder rec_local, rec_remote;
  local.set_observer(&rec_local);
  remote.set_observer(&rec_remote);
  std::vector<float> lg_local, lg_remote;
  const auto t0 = std::chrono::steady_clock::now();
  Status st = run_sequence(local, tokens, &lg_local, nullptr, nullptr);
  const auto t1 = std::chrono::steady_clock::now();
  if (st.is_ok()) st = run_sequence(remote, tokens, &lg_remote, remote_exec, traffic);
  const auto t2 = std::chrono::steady_clock::now();
  local.set_observer(nullptr);
  remote.set_observer(nullptr);
  if (!st.is_ok()) return st.with_context(fmt::format("sequence {}", seq_index));

  SequenceResult r;
  r.local_seconds = std::chrono::duration<double>(t1 - t0).count();
  r.remote_seconds = std::chrono::duration<double>(t2 - t1).count();
  r.n_tokens = static_cast<int64_t>(tokens.size());
  r.bitwise = std::memcmp(lg_local.data(), lg_remote.data(), lg_local.size() * sizeof(float)) == 0;
  double cos_sum = 0;
  std::vector<double> cos;
  for (int64_t t = 0; t < r.n_tokens; ++t) {
    const float* x = lg_local.data() + t * V;
    const float* y = lg_remote.data() + t * V;
    const int32_t ax = argmax(x, V), ay = argmax(y, V);
    r.argmax_same += ax == ay;
    if (ax != ay) r.flips.push_back({seq_index, t, ax, ay, x[ax] - x[ay]});
    const double c = cosine(x, y, V);
    r.cos_min = std::min(r.cos_min, c);
    cos_sum += c;
    cos.push_back(c);
    r.below_min_cosine += c < opts.min_cosine;
  }
  r.cos_mean = cos_sum / static_cast<double>(r.n_tokens);
  for (const auto& [key, set] : rec_remote.decisions) {
    auto it = rec_local.decisions.find(key);
    if (it == rec_local.decisions.end()) continue;
    ++r.routing_total;
    r.routing_same += it->second == set ? 1 : 0;
  }
  r.pass = opts.bitwise
               ? r.bitwise
               : (r.argmax_frac() >= opts.min_argmax &&
                  within_floor(cos, opts.min_cosine,
                               seq_index < opts.cosine_floor.size() ? &opts.cosine_floor[seq_index] : nullptr));
  return r;
}

double NoiseFloor::min(size_t seq) const {
  double m = 1.0;
  for (double c : cos.at(seq)) m = std::min(m, c);
  return m;
}

int64_t NoiseFloor::below(size_t seq, double c) const {
  int64_t n = 0;
  for (double x : cos.at(seq)) n += x < c;
  return n;
}

Result<NoiseFloor> noise_floor(const Model& native, const Model& f32_reference,
                               const std::vector<std::vector<int32_t>>& sequences, int n_threads) {
  const int64_t V = native.hparams().n_vocab;
  if (f32_reference.hparams().n_vocab != V || f32_reference.layers.size() != native.layers.size())
    return make_error(StatusCode::kInvalidArgument, "the noise floor needs two loads of the same model");
  int64_t max_len = 1;
  for (const auto& s : sequences) max_len = std::max<int64_t>(max_len, static_cast<int64_t>(s.size()));
  ContextParams cp;
  cp.n_threads = n_threads;
  cp.n_ctx = max_len;
  Context a(native, cp), b(f32_reference, cp);
  NoiseFloor out;
  std::vector<float> la, lb;
  for (size_t si = 0; si < sequences.size(); ++si) {
    if (sequences[si].empty()) return make_error(StatusCode::kInvalidArgument, "empty sequence {}", si);
    MOESH_RETURN_IF_ERROR(run_sequence(a, sequences[si], &la, nullptr, nullptr));
    MOESH_RETURN_IF_ERROR(run_sequence(b, sequences[si], &lb, nullptr, nullptr));
    std::vector<double> cos;
    int64_t same = 0;
    for (size_t t = 0; t < sequences[si].size(); ++t) {
      const float* x = la.data() + t * V;
      const float* y = lb.data() + t * V;
      cos.push_back(cosine(x, y, V));
      same += argmax(x, V) == argmax(y, V);
    }
    out.cos.push_back(std::move(cos));
    out.argmax_same.push_back(same);
  }
  return out;
}

double GateReport::min_cosine() const {
  double m = 1.0;
  for (const auto& s : sequences) m = std::min(m, s.cos_min);
  return m;
}

int64_t GateReport::argmax_same() const {
  int64_t n = 0;
  for (const auto& s : sequences) n += s.argmax_same;
  return n;
}

int64_t GateReport::n_tokens() const {
  int64_t n = 0;
  for (const auto& s : sequences) n += s.n_tokens;
  return n;
}

Result<GateReport> run_gate(const Model& model, const std::shared_ptr<RemoteExecutor>& remote,
                            const std::vector<std::vector<int32_t>>& sequences, const CompareOptions& opts,
                            int n_threads, std::shared_ptr<SpanRunner> spans) {
  if (remote == nullptr && spans == nullptr)
    return make_error(StatusCode::kInvalidArgument, "the gate needs a remote executor or span peers");
  if (sequences.empty()) return make_error(StatusCode::kInvalidArgument, "no sequences to compare");
  for (size_t il = 0; il < model.layers.size(); ++il) {
    if (model.layers[il].is_moe && !model.layers[il].experts.valid()) {
      return make_error(StatusCode::kInvalidArgument,
                        "layer {} has no routed-expert weights; the gate compares against local execution "
                        "and needs the full model",
                        il);
    }
  }
  int64_t max_len = 0;
  for (const auto& s : sequences) max_len = std::max<int64_t>(max_len, static_cast<int64_t>(s.size()));
  ContextParams cp;
  cp.n_threads = n_threads;
  cp.n_ctx = max_len;
  Context local_ctx(model, cp);
  cp.executor = remote;
  cp.spans = std::move(spans);
  Context remote_ctx(model, cp);
  GateReport rep;
  rep.pass = true;
  for (size_t si = 0; si < sequences.size(); ++si) {
    MOESH_ASSIGN_OR_RETURN(SequenceResult r,
                           compare_sequence(local_ctx, remote_ctx, sequences[si], opts, si, remote.get(), rep.traffic));
    rep.pass = rep.pass && r.pass;
    rep.sequences.push_back(std::move(r));
  }
  return rep;
}

}  // namespace moesh::gate
