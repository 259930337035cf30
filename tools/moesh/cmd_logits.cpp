// `moesh logits -m MODEL --tokens 1,2,3 [--threads N] [--incremental] [--dequant-f32] --out F`:
// decodes the tokens at positions 0..n-1 and writes every position's logits as JSON
// (docs/logits.md): {"tokens": [...], "argmax": [...], "logits": [[...n_vocab], ...]}.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "command.h"
#include "model_cli.h"
#include "moesh/model/sampling.h"
#include "swarm_cli.h"

namespace moesh::cli {
namespace {

struct LogitsArgs {
  LoadOptions::Memory memory = LoadOptions::Memory::kAuto;  // --mmap / --no-mmap
  std::string model, tokens, out;
  int threads = 0;
  bool incremental = false;
  bool dequant_f32 = false;
  SwarmArgs swarm;
};

int run_logits(const LogitsArgs& a) {
  auto toks = parse_token_list(a.tokens);
  if (!toks) {
    std::fprintf(stderr, "moesh logits: error: %s\n", toks.status().message().c_str());
    return 2;
  }
  auto model = load_model_or_report(a.model, a.dequant_f32, "logits", a.memory);
  if (!model) return 1;
  const int64_t V = model->hparams().n_vocab;
  const int64_t T = static_cast<int64_t>(toks->size());
  std::shared_ptr<RemoteExecutor> remote;
  if (!open_remote_or_report(*model, a.swarm, "logits", &remote)) return 1;
  std::shared_ptr<SpanClient> spans;
  if (!open_spans_or_report(*model, a.swarm, "logits", a.threads, &spans, remote)) return 1;
  ContextParams cp;
  cp.spans = spans;
  cp.n_threads = a.threads;
  cp.n_ctx = std::max<int64_t>(T, model->hparams().n_ctx_train);
  cp.executor = remote;
  Context ctx(*model, cp);
  std::vector<float> logits(static_cast<size_t>(T * V));
  Status st;
  if (a.incremental) {
    for (int64_t t = 0; t < T && st.is_ok(); ++t) {
      st = ctx.decode(0, toks->data() + t, 1, logits.data() + t * V);
    }
  } else {
    st = ctx.decode(0, toks->data(), T, logits.data());
  }
  if (!st.is_ok()) {
    std::fprintf(stderr, "moesh logits: error: %s\n", st.to_string().c_str());
    return 1;
  }
  nlohmann::json j;
  j["tokens"] = *toks;
  std::vector<int32_t> am(static_cast<size_t>(T));
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t t = 0; t < T; ++t) {
    am[t] = argmax(logits.data() + t * V, V);
    rows.push_back(std::vector<float>(logits.begin() + t * V, logits.begin() + (t + 1) * V));
  }
  j["argmax"] = am;
  j["logits"] = std::move(rows);
  std::ofstream out(a.out);
  if (!out) {
    std::fprintf(stderr, "moesh logits: error: cannot write '%s'\n", a.out.c_str());
    return 1;
  }
  out << j.dump() << "\n";
  std::printf("wrote %lld x %lld logits to %s\n", static_cast<long long>(T), static_cast<long long>(V), a.out.c_str());
  return out.good() ? 0 : 1;
}

const CommandRegistrar kRegisterLogits{
    Command{"logits", "Decode token ids and write the logits of every position as JSON",
            [](CLI::App* sub) -> std::function<int()> {
              auto a = std::make_shared<LogitsArgs>();
              sub->add_option("-m,--model", a->model, "GGUF model file")->required();
              add_memory_flags(sub, &a->memory);
              sub->add_option("--tokens", a->tokens, "Comma-separated token ids")->required();
              sub->add_option("--out", a->out, "Output JSON file")->required();
              sub->add_option("-t,--threads", a->threads, "Compute threads (default: all cores)");
              sub->add_flag("--incremental", a->incremental, "Decode one token at a time through the KV cache");
              sub->add_flag("--dequant-f32", a->dequant_f32, "Dequantize every weight to F32 at load (debug)");
              add_swarm_options(sub, &a->swarm);
              return [a] { return run_logits(*a); };
            }}};

}  // namespace
}  // namespace moesh::cli
