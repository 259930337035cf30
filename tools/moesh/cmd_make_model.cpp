// `moesh make-model`: writes a random-weight MoE GGUF (see include/moesh/make_model/make_model.h and
// docs/make-model.md).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "command.h"
#include "moesh/make_model/make_model.h"
#include "moesh/text/hf_vocab.h"

namespace moesh::cli {
namespace {

struct MakeModelArgs {
  std::string arch = "qwen3moe";
  std::string out;
  std::string type;  // empty: the preset's type, else f32
  std::string preset;
  std::string name;
  std::string vocab;               // empty: bpe
  std::string chat_template_file;  // empty: the built-in ChatML template
  std::string vocab_from;          // a Hugging Face tokenizer directory (hf_vocab.h)
  std::string vocab_pre;           // tokenizer.ggml.pre override for --vocab-from
  uint64_t seed = 0;
  int threads = 0;
  bool dry_run = false;
  bool nextn_oracle = false;
  bool verbose = false;
  bool tied_embeddings = false;
  // Shape overrides; applied only when given on the command line.
  std::map<std::string, int64_t> ints;
  double rope_base = 0, rms_eps = 0;
};

// Flag name -> spec field; one table so the options and the overrides cannot drift apart.
struct IntFlag {
  const char* flag;
  const char* help;
  int64_t MakeModelSpec::*field;
};
const IntFlag kIntFlags[] = {
    {"--n-vocab", "vocabulary size", &MakeModelSpec::n_vocab},
    {"--n-ctx", "context length", &MakeModelSpec::n_ctx},
    {"--n-embd", "hidden size", &MakeModelSpec::n_embd},
    {"--n-layer", "number of blocks", &MakeModelSpec::n_layer},
    {"--n-head", "query heads", &MakeModelSpec::n_head},
    {"--n-head-kv", "KV heads (qwen3moe, llama)", &MakeModelSpec::n_head_kv},
    {"--head-dim", "head size (qwen3moe, llama)", &MakeModelSpec::head_dim},
    {"--n-expert", "routed experts", &MakeModelSpec::n_expert},
    {"--n-expert-used", "experts per token (top-k)", &MakeModelSpec::n_expert_used},
    {"--n-ff-exp", "expert FFN width", &MakeModelSpec::n_ff_exp},
    {"--n-ff", "dense FFN width (deepseek2 leading dense layers)", &MakeModelSpec::n_ff},
    {"--q-lora-rank", "deepseek2 q_lora_rank", &MakeModelSpec::q_lora_rank},
    {"--kv-lora-rank", "deepseek2 kv_lora_rank", &MakeModelSpec::kv_lora_rank},
    {"--qk-nope", "deepseek2 non-rotary q/k head dims", &MakeModelSpec::qk_nope},
    {"--qk-rope", "deepseek2 rotary q/k head dims", &MakeModelSpec::qk_rope},
    {"--v-head", "deepseek2 value head dims", &MakeModelSpec::v_head},
    {"--n-expert-shared", "deepseek2 shared experts", &MakeModelSpec::n_expert_shared},
    {"--n-group", "deepseek2 expert groups", &MakeModelSpec::n_group},
    {"--n-group-used", "deepseek2 groups kept per token", &MakeModelSpec::n_group_used},
    {"--n-leading-dense", "deepseek2 leading dense blocks", &MakeModelSpec::n_leading_dense},
};

std::string size_text(uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", b / double(1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.2f} MiB", b / double(1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.1f} KiB", b / double(1ull << 10));
  return fmt::format("{} B", b);
}

std::string shape_str(const PlannedTensor& t) {
  std::string s = "[";
  for (int d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
  return s + "]";
}

void print_summary(const MakeModelSpec& spec, const ModelPlan& plan) {
  std::map<std::string, std::pair<int, uint64_t>> by_type;
  for (const auto& t : plan.tensors) {
    auto& e = by_type[type_name(t.type)];
    e.first += 1;
    e.second += t.n_bytes;
  }
  std::printf("model: %s, type %s, seed %llu, vocab %s\n", spec.arch_name().c_str(), make_file_type_name(spec.type),
              static_cast<unsigned long long>(spec.seed), make_vocab_name(spec.vocab));
  std::printf("  n_vocab %lld  n_embd %lld  n_layer %lld  n_head %lld  n_expert %lld (top-%lld)  n_ff_exp %lld\n",
              (long long)spec.n_vocab, (long long)spec.n_embd, (long long)spec.n_layer, (long long)spec.n_head,
              (long long)spec.n_expert, (long long)spec.n_expert_used, (long long)spec.n_ff_exp);
  std::printf("  %zu metadata keys, %zu tensors, %s of tensor data\n", plan.kvs.size(), plan.tensors.size(),
              size_text(plan.data_bytes).c_str());
  for (const auto& [name, e] : by_type) {
    std::printf("    %-5s x%-3d %s\n", name.c_str(), e.first, size_text(e.second).c_str());
  }
  // One line per run of consecutive MoE layers with the same expert bytes (48 equal layers: one).
  for (int il = 0; il < spec.n_layer;) {
    const uint64_t eb = plan.expert_bytes(il);
    if (eb == 0) {
      ++il;
      continue;
    }
    int last = il;
    while (last + 1 < spec.n_layer && plan.expert_bytes(last + 1) == eb) ++last;
    const std::string blk = last == il ? fmt::format("blk.{}", il) : fmt::format("blk.{}-{}", il, last);
    std::printf("  %s experts: %s%s (%s per expert)\n", blk.c_str(), size_text(eb).c_str(), last == il ? "" : " each",
                size_text(eb / static_cast<uint64_t>(spec.n_expert)).c_str());
    il = last + 1;
  }
}

int run_make_model(const MakeModelArgs& a, CLI::App* sub) {
  MakeModelSpec spec;
  if (!a.preset.empty()) {
    if (a.preset != "perf-30b-a3b") {
      std::fprintf(stderr, "make-model: unknown preset '%s' (known: perf-30b-a3b)\n", a.preset.c_str());
      return 2;
    }
    spec = MakeModelSpec::perf_30b_a3b();
  } else {
    if (!MakeModelSpec::defaults_for_name(a.arch, &spec)) {
      std::string known;
      for (const std::string& n : make_arch_names()) known += (known.empty() ? "" : ", ") + n;
      std::fprintf(stderr, "make-model: unknown --arch '%s' (%s)\n", a.arch.c_str(), known.c_str());
      return 2;
    }
  }
  if (!a.type.empty() && !make_file_type_from_name(a.type, &spec.type)) {
    std::fprintf(stderr, "make-model: unknown --type '%s' (f32, f16, q8_0, q4_k_m)\n", a.type.c_str());
    return 2;
  }
  if (!a.vocab.empty() && !make_vocab_from_name(a.vocab, &spec.vocab)) {
    std::fprintf(stderr, "make-model: unknown --vocab '%s' (bpe, none)\n", a.vocab.c_str());
    return 2;
  }
  if (!a.vocab_from.empty()) {
    if (spec.vocab != MakeVocab::kBpe) {
      std::fprintf(stderr, "make-model: --vocab-from cannot be combined with --vocab none\n");
      return 2;
    }
    HfVocabOptions vo;
    vo.pre = a.vocab_pre;
    auto v = import_hf_vocab(a.vocab_from, vo);
    if (!v) {
      std::fprintf(stderr, "make-model: --vocab-from: %s\n", v.status().to_string().c_str());
      return 2;
    }
    if (sub->count("--n-vocab") && a.ints.at("--n-vocab") != v->n_tokens) {
      std::fprintf(stderr, "make-model: --n-vocab %lld differs from the %lld tokens of --vocab-from\n",
                   static_cast<long long>(a.ints.at("--n-vocab")), static_cast<long long>(v->n_tokens));
      return 2;
    }
    std::printf("tokenizer from %s: %lld tokens, pre %s, %s chat template\n", a.vocab_from.c_str(),
                static_cast<long long>(v->n_tokens), v->pre.c_str(), v->chat_template.empty() ? "no" : "its own");
    spec.n_vocab = v->n_tokens;
    spec.imported_vocab = std::move(v->kvs);
  }
  if (sub->count("--seed")) spec.seed = a.seed;
  if (!a.name.empty()) spec.name = a.name;
  if (!a.chat_template_file.empty()) {
    if (spec.vocab != MakeVocab::kBpe) {
      std::fprintf(stderr, "make-model: --chat-template-file needs --vocab bpe\n");
      return 2;
    }
    std::ifstream in(a.chat_template_file, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in) {
      std::fprintf(stderr, "make-model: cannot read --chat-template-file '%s'\n", a.chat_template_file.c_str());
      return 2;
    }
    spec.chat_template = text.str();
  }
  spec.tied_embeddings = a.tied_embeddings;
  for (const auto& f : kIntFlags) {
    auto it = a.ints.find(f.flag);
    if (sub->count(f.flag) && it != a.ints.end()) spec.*(f.field) = it->second;
  }
  if (sub->count("--rope-base")) spec.rope_base = static_cast<float>(a.rope_base);
  if (sub->count("--rms-eps")) spec.rms_eps = static_cast<float>(a.rms_eps);
  // Mixtral has a single FFN width; let either flag set it.
  if (spec.arch == MakeArch::kLlama) {
    if (sub->count("--n-ff") && !sub->count("--n-ff-exp")) spec.n_ff_exp = spec.n_ff;
    if (sub->count("--n-ff-exp") && !sub->count("--n-ff")) spec.n_ff = spec.n_ff_exp;
  }

  auto plan = plan_model(spec);
  if (!plan) {
    std::fprintf(stderr, "make-model: %s\n", plan.status().to_string().c_str());
    return 2;
  }
  print_summary(spec, *plan);
  if (a.dry_run) return 0;
  if (a.out.empty()) {
    std::fprintf(stderr, "make-model: --out is required (or use --dry-run)\n");
    return 2;
  }

  MakeModelOptions opts;
  opts.n_threads = a.threads;
  // A line per tensor only with --verbose (a 48-layer model has ~700); otherwise one progress
  // line, rewritten in place on a terminal.
  const bool tty = isatty(fileno(stderr)) != 0;
  opts.on_progress = [verbose = a.verbose, tty](const MakeModelProgress& p) {
    const auto& t = *p.tensor;
    const double pct = p.bytes_total ? 100.0 * double(p.bytes_done) / double(p.bytes_total) : 100.0;
    if (verbose) {
      std::fprintf(stderr, "[%3zu/%zu] %-32s %-5s %-18s %10s  %5.1f%%  %.1fs\n", p.tensor_index + 1, p.n_tensors,
                   t.name.c_str(), type_name(t.type), shape_str(t).c_str(), size_text(t.n_bytes).c_str(), pct,
                   p.seconds);
    } else if (tty) {
      std::fprintf(stderr, "\rwriting tensor %zu/%zu  %5.1f%%  %.1fs", p.tensor_index + 1, p.n_tensors, pct, p.seconds);
      if (p.tensor_index + 1 == p.n_tensors) std::fprintf(stderr, "\n");
    }
  };
  const Status st = a.nextn_oracle ? make_nextn_oracle(spec, a.out) : make_model(spec, a.out, opts);
  if (!st) {
    std::fprintf(stderr, "make-model: %s\n", st.to_string().c_str());
    return 1;
  }
  std::printf("wrote %s\n", a.out.c_str());
  return 0;
}

CommandRegistrar kRegisterMakeModel{
    Command{"make-model", "Write a random-weight MoE model (GGUF) that llama.cpp also loads",
            [](CLI::App* sub) -> std::function<int()> {
              auto a = std::make_shared<MakeModelArgs>();
              std::string archs;
              for (const std::string& n : make_arch_names()) archs += (archs.empty() ? "" : " | ") + n;
              sub->add_option("--arch", a->arch, archs + " (llama: Mixtral)")->capture_default_str();
              sub->add_option("--out", a->out, "output .gguf path");
              sub->add_option("--type", a->type, "f32 | f16 | q8_0 | q4_k_m (default f32; preset: q4_k_m)");
              sub->add_option("--seed", a->seed, "weight seed (default: the reference model's seed)");
              sub->add_option("--preset", a->preset, "perf-30b-a3b: the Qwen3-30B-A3B-shaped perf model");
              sub->add_option("--name", a->name, "general.name");
              sub->add_option("--vocab", a->vocab,
                              "bpe (default): a byte-level BPE tokenizer learned from a built-in text, "
                              "with ChatML specials and chat template | none: ids only (no_vocab)");
              sub->add_option("--chat-template-file", a->chat_template_file,
                              "write this file's Jinja source as tokenizer.chat_template (--vocab bpe; "
                              "default: a ChatML template)");
              sub->add_option("--vocab-from", a->vocab_from,
                              "a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json, optional "
                              "config.json): write its tokenizer and chat template (sets n_vocab)");
              sub->add_option("--vocab-pre", a->vocab_pre,
                              "with --vocab-from: the tokenizer.ggml.pre name when the pre-tokenizer is not "
                              "detected (qwen2, llama-bpe, deepseek-v3, gpt-4o, ...)");
              sub->add_option("--threads", a->threads, "quantization threads (default: all cores)");
              sub->add_option("--rope-base", a->rope_base, "rope.freq_base");
              sub->add_option("--rms-eps", a->rms_eps, "RMSNorm epsilon");
              sub->add_flag("--tied-embeddings", a->tied_embeddings,
                            "write no output.weight (logits use token_embd, as llama.cpp does)");
              sub->add_flag("--nextn-oracle", a->nextn_oracle,
                            "glm4moe: F32, a bigram decoder and a NextN head that drafts it exactly (measures "
                            "what --draft nextn saves; not a language model)");
              sub->add_flag("--dry-run", a->dry_run, "print the summary, write nothing");
              sub->add_flag("-v,--verbose", a->verbose, "one line per tensor written");
              for (const auto& f : kIntFlags) {
                // CLI11 needs a stable target per option; the map node lives as long as `a`.
                sub->add_option(f.flag, a->ints[f.flag], f.help);
              }
              return [a, sub] { return run_make_model(*a, sub); };
            }}};

}  // namespace
}  // namespace moesh::cli
