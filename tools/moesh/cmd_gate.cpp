// `moesh gate -m MODEL (--worker H:P ... | --workers FILE) [--wire D] [--combine M] [--threads N]
//  [--sequences N] [--seed S] [--raw-sequences | --sequences-from FILE.json]
//  [--min-routing-margin F] [--min-top1-lead F] [--min-argmax F] [--min-cosine F] [--noise-floor] [--no-bitwise]`:
// the validation gate of a remote dispatch path (docs/gate.md). Curates seeded, well-conditioned
// token sequences (no routing or top-1 near-ties, as the llama.cpp reference set), runs them
// through the full model all-local and through the workers, and compares per sequence: argmax
// agreement, min/mean cosine of the logits, top-k expert agreement and bitwise equality. The
// logic is the gate library (include/moesh/gate/gate.h); this file parses arguments and prints.
// Exit 0 = PASS, 1 = FAIL or error, 2 = bad arguments.
#include <fmt/format.h>

#include <cstdio>

#include "command.h"
#include "model_cli.h"
#include "moesh/gate/gate.h"
#include "moesh/util/process.h"
#include "swarm_cli.h"

namespace moesh::cli {
namespace {

struct GateArgs {
  LoadOptions::Memory memory = LoadOptions::Memory::kAuto;  // --mmap / --no-mmap
  std::string model;
  int threads = 0;
  int n_seq = 4;
  uint64_t seed = 42;
  bool raw = false;
  std::string sequences_from;
  double min_routing_margin = -1.0;  // < 0: the gating's default
  double min_top1_lead = 0.1;
  double min_argmax = 0.99;
  double min_cosine = 0.998;
  bool no_bitwise = false;
  bool noise_floor = false;  // --noise-floor: cosines held, rank by rank, to the model's own noise floor
  SwarmArgs swarm;
};

void print_traffic(const char* what, const RemoteTraffic& tr) {
  const double tl = static_cast<double>(std::max<uint64_t>(tr.token_layers, 1));
  std::printf(
      "traffic %s: %llu DISPATCH (%llu B) + %llu COMBINE (%llu B) over %llu token-layers: "
      "%.1f + %.1f = %.1f B per token per layer; %llu pairs remote, %llu local\n",
      what, static_cast<unsigned long long>(tr.dispatch_frames), static_cast<unsigned long long>(tr.dispatch_bytes),
      static_cast<unsigned long long>(tr.combine_frames), static_cast<unsigned long long>(tr.combine_bytes),
      static_cast<unsigned long long>(tr.token_layers), tr.dispatch_bytes / tl, tr.combine_bytes / tl,
      (tr.dispatch_bytes + tr.combine_bytes) / tl, static_cast<unsigned long long>(tr.remote_pairs),
      static_cast<unsigned long long>(tr.local_pairs));
}

// "wire f16" (one place that names the path's wire dtype).
std::string wire_description(const RemoteOptions& ro) {
  if (ro.hidden_wire == ro.return_wire) return fmt::format("wire {}", wire::wire_dtype_name(ro.hidden_wire));
  return fmt::format("wire {}/{}", wire::wire_dtype_name(ro.hidden_wire), wire::wire_dtype_name(ro.return_wire));
}

int run_gate(const GateArgs& a) {
  if (!a.swarm.enabled() && a.swarm.spans.empty()) {
    std::fprintf(stderr, "moesh gate: error: give the remote path to check with --worker, --workers or --span\n");
    return 2;
  }
  if (a.n_seq < 1) {
    std::fprintf(stderr, "moesh gate: error: --sequences must be >= 1\n");
    return 2;
  }
  if (a.raw && !a.sequences_from.empty()) {
    std::fprintf(stderr, "moesh gate: error: --raw-sequences and --sequences-from exclude each other\n");
    return 2;
  }
  auto model = load_model_or_report(a.model, false, "gate", a.memory);
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

  // The sequences: from a file, uniform (raw), or curated.
  std::vector<std::vector<int32_t>> seqs;
  std::string curation_line;
  if (!a.sequences_from.empty()) {
    auto s = gate::load_sequences_json(a.sequences_from, hp.n_vocab);
    if (!s) {
      std::fprintf(stderr, "moesh gate: error: --sequences-from: %s\n", s.status().to_string().c_str());
      return 1;
    }
    seqs = std::move(*s);
    curation_line = fmt::format("sequences: {} from {} (not curated)", seqs.size(), a.sequences_from);
  } else {
    gate::CurationOptions co;
    co.n_sequences = a.n_seq;
    co.seed = a.seed;
    co.raw = a.raw;
    co.min_routing_margin = a.min_routing_margin;
    co.min_top1_lead = a.min_top1_lead;
    co.n_threads = a.threads;
    auto cur = gate::curate_sequences(*model, co);
    if (!cur) {
      std::fprintf(stderr, "moesh gate: error: curating sequences: %s\n", cur.status().to_string().c_str());
      return 1;
    }
    seqs = cur->tokens;
    if (a.raw) {
      curation_line = fmt::format(
          "sequences: {} raw (uniform, seed {}), {} positions; worst routing margin {:.4f}, worst top-1 lead "
          "{:.4f} x RMS",
          seqs.size(), a.seed, cur->positions, cur->worst.routing_margin, cur->worst.top1_lead_rel);
    } else {
      curation_line = fmt::format(
          "sequences: {} curated (seed {}), {} positions: {} draws rejected (routing margin < {:.4g} or top-1 "
          "lead < {:.3g} x RMS), {} ill-conditioned positions; worst routing margin {:.4f}, worst top-1 lead "
          "{:.4f} x RMS",
          seqs.size(), a.seed, cur->positions, cur->draws_rejected, cur->min_routing_margin, cur->min_top1_lead,
          cur->ill_conditioned, cur->worst.routing_margin, cur->worst.top1_lead_rel);
    }
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (static_cast<int64_t>(seqs[i].size()) > std::max<int64_t>(hp.n_ctx_train, 2)) {
      std::fprintf(stderr, "moesh gate: error: sequence %zu has %zu tokens, more than the context (%lld)\n", i,
                   seqs[i].size(), static_cast<long long>(hp.n_ctx_train));
      return 1;
    }
  }

  std::shared_ptr<RemoteExecutor> remote;
  if (!open_remote_or_report(*model, a.swarm, "gate", &remote)) return 1;
  std::shared_ptr<SpanClient> spans;
  if (!open_spans_or_report(*model, a.swarm, "gate", a.threads, &spans, remote)) return 1;
  gate::CompareOptions cmp;
  cmp.min_argmax = a.min_argmax;
  cmp.min_cosine = a.min_cosine;
  // Exact: f32 between spans and (with workers) the executor's exact path.
  cmp.bitwise =
      !a.no_bitwise && (!remote || gate::is_bit_exact_path(*remote)) && (!spans || a.swarm.span_wire == "f32");

  std::string path;
  if (remote) {
    const RemoteOptions& ro = remote->options();
    path = fmt::format("{}, combine {}, {} worker(s)", wire_description(ro), wire::combine_mode_name(ro.combine),
                       remote->n_workers());
  }
  if (spans) {
    path +=
        fmt::format("{}{} span(s), span wire {}", path.empty() ? "" : "; ", spans->spans().size(), a.swarm.span_wire);
  }
  std::printf("gate: %s | %s | criterion: %s\n", a.model.c_str(), path.c_str(),
              cmp.bitwise ? "bit-identical logits"
                          : fmt::format("argmax agreement >= {:.4f}, {} >= {:.6f}{}", a.min_argmax,
                                        a.noise_floor ? "cosines" : "min cosine", a.min_cosine,
                                        a.noise_floor ? " or, rank by rank, the model's noise floor" : "")
                                .c_str());
  std::printf("%s\n", curation_line.c_str());
  if (a.noise_floor && !cmp.bitwise) {
    // The same file again with f32 activations (llama.cpp's dequant-f32 mode): how far the model's
    // own two engines are apart on these sequences is as far as a lossy wire may move it.
    // Refused up front where the f32 copies cannot fit (a big model's dequantized weights are 4-8x
    // its file): the floor is a small-model or a big-machine check.
    uint64_t f32_bytes = 0;
    for (const gguf::TensorInfo& t : model->file().tensors()) {
      if (t.type != GgmlType::F32) f32_bytes += 4ull * static_cast<uint64_t>(t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]);
    }
    const SystemMemory mem = system_memory();
    if (mem.available_bytes > 0 && f32_bytes > mem.available_bytes) {
      std::fprintf(stderr,
                   "moesh gate: error: --noise-floor needs the model's weights in f32 (%.1f GiB), more than the %.1f "
                   "GiB available\n",
                   f32_bytes / 1073741824.0, mem.available_bytes / 1073741824.0);
      return 1;
    }
    auto f32 = load_model_or_report(a.model, true, "gate", a.memory);
    if (!f32) return 1;
    auto nf = gate::noise_floor(*model, *f32, seqs, a.threads);
    if (!nf) {
      std::fprintf(stderr, "moesh gate: error: noise floor: %s\n", nf.status().to_string().c_str());
      return 1;
    }
    cmp.cosine_floor = nf->cos;
    int64_t same = 0, total = 0, below = 0;
    std::string per;
    for (size_t i = 0; i < seqs.size(); ++i) {
      same += nf->argmax_same[i];
      total += static_cast<int64_t>(seqs[i].size());
      below += nf->below(i, a.min_cosine);
      per += fmt::format("{}{:.6f}", i ? " " : "", nf->min(i));
    }
    std::printf(
        "noise floor (native vs f32-activation logits of this model): min cosine per sequence %s; "
        "%lld/%lld positions below %.6f; argmax %lld/%lld\n",
        per.c_str(), static_cast<long long>(below), static_cast<long long>(total), a.min_cosine,
        static_cast<long long>(same), static_cast<long long>(total));
  }
  auto rep = gate::run_gate(*model, remote, seqs, cmp, a.threads, spans);
  if (!rep) {
    std::fprintf(stderr, "moesh gate: error: %s\n", rep.status().to_string().c_str());
    return 1;
  }
  const bool show_floor = !cmp.cosine_floor.empty();
  std::printf("%-4s %7s %16s %10s %10s%s %12s %8s  %s\n", "seq", "tokens", "argmax agree", "cos min", "cos mean",
              show_floor ? " <min-cos" : "", "top-k agree", "bitwise", "result");
  std::vector<gate::Flip> flips;
  double local_s = 0, remote_s = 0;
  for (size_t si = 0; si < rep->sequences.size(); ++si) {
    const gate::SequenceResult& r = rep->sequences[si];
    std::printf("%-4zu %7lld %7lld/%-3lld %4.0f%% %10.6f %10.6f%s %11.2f%% %8s  %s\n", si,
                static_cast<long long>(r.n_tokens), static_cast<long long>(r.argmax_same),
                static_cast<long long>(r.n_tokens), 100.0 * r.argmax_frac(), r.cos_min, r.cos_mean,
                show_floor ? fmt::format(" {:8}", r.below_min_cosine).c_str() : "", 100.0 * r.routing_frac(),
                r.bitwise ? "yes" : "no", r.pass ? "PASS" : "FAIL");
    flips.insert(flips.end(), r.flips.begin(), r.flips.end());
    local_s += r.local_seconds;
    remote_s += r.remote_seconds;
  }
  if (!flips.empty()) {
    // How close each flip was to a tie in the LOCAL logits: the local winner's lead over the
    // token the remote path picked. On curated sequences every local top-1 leads by >= the
    // --min-top1-lead fraction of the row's RMS, so a flip here means the path moved logits.
    std::printf("argmax flips: %zu; local lead of the local top-1 over the remote's pick (logit units):\n",
                flips.size());
    for (size_t i = 0; i < flips.size() && i < 12; ++i) {
      const gate::Flip& f = flips[i];
      std::printf("  seq %zu pos %lld: local %d, remote %d, lead %.5f\n", f.seq, static_cast<long long>(f.pos),
                  f.local_id, f.remote_id, f.lead);
    }
    if (flips.size() > 12) std::printf("  ... %zu more\n", flips.size() - 12);
  }
  if (remote) {
    print_traffic("(batches)", rep->traffic[0]);
    print_traffic("(1-token steps)", rep->traffic[1]);
  }
  if (spans) print_span_stats(*spans, stdout);
  std::printf("time: local %.3f s, remote %.3f s\n", local_s, remote_s);
  std::printf("gate: %s\n", rep->pass ? "PASS" : "FAIL");
  return rep->pass ? 0 : 1;
}

const CommandRegistrar kRegisterGate{Command{
    "gate", "Check a remote dispatch path against local execution (PASS/FAIL)",
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<GateArgs>();
      sub->add_option("-m,--model", a->model, "Full GGUF model file (local reference)")->required();
      add_memory_flags(sub, &a->memory);
      sub->add_option("-t,--threads", a->threads, "Compute threads (default: all cores)");
      sub->add_option("--sequences", a->n_seq, "Token sequences to compare")->capture_default_str();
      sub->add_option("--seed", a->seed, "Seed of the token sequences")->capture_default_str();
      sub->add_flag("--raw-sequences", a->raw, "Uniform random tokens, no curation (positions may be near-ties)");
      sub->add_option("--sequences-from", a->sequences_from,
                      "Compare these sequences instead (JSON {\"sequences\":[{\"tokens\":[...]}]})");
      sub->add_option("--min-routing-margin", a->min_routing_margin,
                      "Curation: reject a token whose routing margin is below this (default 0.05 for "
                      "softmax gating, 0.0125 for sigmoid)")
          ->check(CLI::NonNegativeNumber);
      sub->add_option("--min-top1-lead", a->min_top1_lead,
                      "Curation: reject a token whose top-1 logit leads by less than this x the row's RMS")
          ->check(CLI::NonNegativeNumber)
          ->capture_default_str();
      sub->add_option("--min-argmax", a->min_argmax, "Lossy paths: minimum argmax agreement (fraction)")
          ->capture_default_str();
      sub->add_option("--min-cosine", a->min_cosine, "Lossy paths: minimum cosine of any logits row")
          ->capture_default_str();
      sub->add_flag("--noise-floor", a->noise_floor,
                    "Lossy paths: hold each sequence's cosines, sorted, to min(--min-cosine, the model's own at "
                    "the same rank: its native vs f32-activation logits on that sequence); loads the model a "
                    "second time with every weight in f32");
      sub->add_flag("--no-bitwise", a->no_bitwise, "Judge exact+f32 by the lossy thresholds instead of bit identity");
      add_swarm_options(sub, &a->swarm);
      return [a] { return run_gate(*a); };
    }}};

}  // namespace
}  // namespace moesh::cli
