// `moesh run -m MODEL (-p TEXT | --tokens 1,2,3) -n N [--temp T --top-k K --top-p P --seed S]
//  [--json] [--threads N]`: prefill the prompt, then generate N tokens one at a time through the
// KV cache, printing the token ids and a timing line (docs/run.md).
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>

#include "command.h"
#include "model_cli.h"
#include "swarm_cli.h"
#include "moesh/sampling.h"
#include "moesh/tokenizer.h"

namespace moesh::cli {
namespace {

struct RunArgs {
  std::string model, prompt, tokens;
  int n_predict = 32;
  int threads = 0;
  float temp = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  bool json = false;
  SwarmArgs swarm;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_run(const RunArgs& a) {
  if (a.prompt.empty() == a.tokens.empty()) {
    std::fprintf(stderr, "moesh run: error: give exactly one of -p TEXT or --tokens IDS\n");
    return 2;
  }
  auto model = load_model_or_report(a.model, false, "run");
  if (!model) return 1;
  std::vector<int32_t> prompt;
  // A GGUF with a vocabulary gets a tokenizer: text prompts, end-of-generation tokens, text out.
  std::unique_ptr<Tokenizer> tok;
  if (model->file().has("tokenizer.ggml.tokens")) {
    auto t = Tokenizer::from_gguf(model->file());
    if (!t) {
      std::fprintf(stderr, "moesh run: error: %s\n", t.status().to_string().c_str());
      return 2;
    }
    tok = std::move(*t);
  }
  if (!a.prompt.empty()) {
    if (!tok) {
      std::fprintf(stderr, "moesh run: error: this model has no tokenizer; use --tokens\n");
      return 2;
    }
    auto ids = tok->encode(a.prompt, /*add_special=*/true, /*parse_special=*/true);
    if (!ids) {
      std::fprintf(stderr, "moesh run: error: %s\n", ids.status().to_string().c_str());
      return 2;
    }
    prompt = *ids;
  } else {
    auto toks = parse_token_list(a.tokens);
    if (!toks) {
      std::fprintf(stderr, "moesh run: error: %s\n", toks.status().message().c_str());
      return 2;
    }
    prompt = *toks;
  }
  if (prompt.empty()) {
    std::fprintf(stderr, "moesh run: error: the prompt is empty\n");
    return 2;
  }
  if (a.n_predict < 0) {
    std::fprintf(stderr, "moesh run: error: -n must be >= 0\n");
    return 2;
  }
  const HParams& hp = model->hparams();
  int64_t eos = -1;  // stop early on the model's end-of-sequence token, if it names one
  if (auto r = model->file().get_or<int64_t>("tokenizer.ggml.eos_token_id", -1); r) eos = *r;
  std::shared_ptr<RemoteExecutor> remote;
  if (!open_remote_or_report(*model, a.swarm, "run", &remote)) return 1;
  ContextParams cp;
  cp.n_threads = a.threads;
  cp.n_ctx = std::max<int64_t>(static_cast<int64_t>(prompt.size()) + a.n_predict, hp.n_ctx_train);
  cp.executor = remote;
  Context ctx(*model, cp);
  if (remote) remote->set_pool(&ctx.pool());
  SamplingParams sp;
  sp.temp = a.temp;
  sp.top_k = a.top_k;
  sp.top_p = a.top_p;
  sp.seed = a.seed;
  Sampler sampler(sp);
  std::vector<float> logits(static_cast<size_t>(hp.n_vocab));

  auto t0 = std::chrono::steady_clock::now();
  Status st = ctx.decode(0, prompt.data(), static_cast<int64_t>(prompt.size()), logits.data(),
                         /*all_logits=*/false);
  const double t_prefill = seconds_since(t0);
  std::vector<int32_t> out;
  t0 = std::chrono::steady_clock::now();
  while (st.is_ok() && static_cast<int>(out.size()) < a.n_predict) {
    const int32_t id = sampler.sample(logits.data(), hp.n_vocab);
    out.push_back(id);
    if (id == eos || (tok && tok->is_eog(id)) || static_cast<int>(out.size()) == a.n_predict) break;
    st = ctx.decode(0, &id, 1, logits.data(), false);
  }
  const double t_decode = seconds_since(t0);
  if (!st.is_ok()) {
    std::fprintf(stderr, "moesh run: error: %s\n", st.to_string().c_str());
    return 1;
  }
  // Decode timing counts the forward passes of generated tokens (n - 1: the first comes from
  // the prefill's logits).
  const int n_dec = std::max<int>(0, static_cast<int>(out.size()) - 1);
  const double pp_tps = t_prefill > 0 ? prompt.size() / t_prefill : 0.0;
  const double tg_tps = t_decode > 0 && n_dec > 0 ? n_dec / t_decode : 0.0;
  std::string text;
  if (tok) {  // streaming decoder: ids past the tokenizer's vocab render as U+FFFD, not an error
    StreamDecoder sd(*tok);
    for (int32_t id : out) text += sd.push(id);
    text += sd.flush();
  }
  if (a.json) {
    nlohmann::json j;
    j["prompt_tokens"] = prompt;
    j["tokens"] = out;
    j["text"] = text;
    j["timings"] = {{"prompt_n", prompt.size()}, {"prompt_ms", t_prefill * 1e3},
                    {"prompt_per_second", pp_tps}, {"predicted_n", out.size()},
                    {"predicted_ms", t_decode * 1e3}, {"predicted_per_second", tg_tps},
                    {"threads", ctx.pool().n_threads()}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    if (tok) {
      std::printf("%s\n", text.c_str());
    } else {
      for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? " " : "", out[i]);
      std::printf("\n");
    }
    std::fprintf(stderr, "prefill: %zu tokens in %.1f ms (%.2f tok/s) | decode: %d tokens in %.1f ms (%.2f tok/s) | %d threads\n",
                 prompt.size(), t_prefill * 1e3, pp_tps, n_dec, t_decode * 1e3, tg_tps,
                 ctx.pool().n_threads());
  }
  return 0;
}

const CommandRegistrar k_reg{Command{
    "run", "Generate tokens from a prompt of token ids",
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<RunArgs>();
      sub->add_option("-m,--model", a->model, "GGUF model file")->required();
      sub->add_option("-p,--prompt", a->prompt, "Prompt text (needs a tokenizer)");
      sub->add_option("--tokens", a->tokens, "Prompt as comma-separated token ids");
      sub->add_option("-n,--n-predict", a->n_predict, "Tokens to generate")->capture_default_str();
      sub->add_option("--temp", a->temp, "Temperature (0: greedy)")->capture_default_str();
      sub->add_option("--top-k", a->top_k, "Top-k (0: off)")->capture_default_str();
      sub->add_option("--top-p", a->top_p, "Top-p (1: off)")->capture_default_str();
      sub->add_option("--seed", a->seed, "Sampling seed")->capture_default_str();
      sub->add_option("-t,--threads", a->threads, "Compute threads (default: all cores)");
      sub->add_flag("--json", a->json, "Print one JSON object instead of text");
      add_swarm_options(sub, &a->swarm);
      return [a] { return run_run(*a); };
    }}};

}  // namespace
}  // namespace moesh::cli
