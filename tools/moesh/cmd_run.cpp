// `moesh run -m MODEL (-p TEXT | --chat TEXT | --tokens 1,2,3) -n N [sampling options] [--stop S]
//  [--json] [--threads N]`: prefill the prompt, then generate N tokens one at a time through the
// KV cache, printing the text (or token ids) and a timing line (docs/run.md).
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "command.h"
#include "model_cli.h"
#include "moesh/model/sampling.h"
#include "moesh/model/speculative.h"
#include "moesh/text/chat.h"
#include "moesh/text/stop_matcher.h"
#include "moesh/text/tokenizer.h"
#include "swarm_cli.h"

namespace moesh::cli {
namespace {

struct RunArgs {
  LoadOptions::Memory memory = LoadOptions::Memory::kAuto;  // --mmap / --no-mmap
  std::string model, prompt, tokens;
  std::string chat, system, chat_template;  // --chat: a user message wrapped by the chat template
  std::vector<std::string> stops;
  int n_predict = 32;
  int threads = 0;
  float temp = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repeat_penalty = 1.0f;
  int repeat_last_n = 64;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  bool json = false;
  std::string draft;  // "" = no drafting; "ngram"
  int draft_max = 16;
  SwarmArgs swarm;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_run(const RunArgs& a) {
  const int n_sources = int(!a.prompt.empty()) + int(!a.tokens.empty()) + int(!a.chat.empty());
  if (n_sources != 1) {
    std::fprintf(stderr, "moesh run: error: give exactly one of -p TEXT, --chat TEXT or --tokens IDS\n");
    return 2;
  }
  if (a.chat.empty() && (!a.system.empty() || !a.chat_template.empty())) {
    std::fprintf(stderr, "moesh run: error: --system and --chat-template need --chat\n");
    return 2;
  }
  SamplingParams sp;
  sp.temp = a.temp;
  sp.top_k = a.top_k;
  sp.top_p = a.top_p;
  sp.min_p = a.min_p;
  sp.repeat_penalty = a.repeat_penalty;
  sp.penalty_last_n = a.repeat_last_n;
  sp.presence_penalty = a.presence_penalty;
  sp.frequency_penalty = a.frequency_penalty;
  sp.seed = a.seed;
  if (Status st = sp.validate(); !st.is_ok()) {
    std::fprintf(stderr, "moesh run: error: %s\n", st.message().c_str());
    return 2;
  }
  auto model = load_model_or_report(a.model, false, "run", a.memory);
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
  if ((!a.prompt.empty() || !a.chat.empty() || !a.stops.empty()) && !tok) {
    std::fprintf(stderr, "moesh run: error: this model has no tokenizer; use --tokens (and no --stop)\n");
    return 2;
  }
  std::vector<std::string> stops = a.stops;
  if (!a.chat.empty()) {
    auto tmpl = ChatTemplate::from_gguf(model->file(), chat_template_spec(*model, a.chat_template, "run"));
    if (!tmpl) {
      const bool from_file = a.chat_template.empty() && model->file().has("tokenizer.chat_template");
      std::fprintf(stderr, "moesh run: error: %s%s\n", tmpl.status().message().c_str(),
                   from_file ? " (in the file's tokenizer.chat_template; --chat-template NAME uses a built-in family "
                               "instead)"
                             : "");
      return 2;
    }
    std::vector<ChatMessage> msgs;
    if (!a.system.empty()) msgs.push_back({"system", a.system});
    msgs.push_back({"user", a.chat});
    // Special tokens only from the template: control-token text in --chat/--system stays text.
    auto ids = tokenize_chat(*tok, *tmpl, msgs, /*add_generation_prompt=*/true);
    if (!ids) {
      std::fprintf(stderr, "moesh run: error: %s\n", ids.status().to_string().c_str());
      return 2;
    }
    prompt = *ids;
    for (auto& s : tmpl->stop_strings()) stops.push_back(std::move(s));
  } else if (!a.prompt.empty()) {
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
  std::shared_ptr<SpanClient> spans;
  if (!open_spans_or_report(*model, a.swarm, "run", a.threads, &spans, remote)) return 1;
  ContextParams cp;
  cp.spans = spans;
  cp.n_threads = a.threads;
  cp.n_ctx = std::max<int64_t>(static_cast<int64_t>(prompt.size()) + a.n_predict, hp.n_ctx_train);
  cp.executor = remote;
  Context ctx(*model, cp);
  Sampler sampler(sp);
  std::unique_ptr<DraftSource> draft;
  if (!a.draft.empty()) {
    auto d = make_draft_source(a.draft, DraftEnv{model.get(), &ctx.pool(), cp.n_ctx});
    if (!d) {
      std::fprintf(stderr, "moesh run: error: --draft: %s\n", d.status().message().c_str());
      return 2;
    }
    draft = std::move(*d);
  }
  // One loop for plain and speculative decoding: without a draft source every step feeds one
  // token; with one, a step verifies the drafts in the same forward pass (the output is the same).
  SpeculativeDecoder dec(&ctx, 0, &sampler, draft.get(), SpeculativeParams{a.draft_max, true});

  auto t0 = std::chrono::steady_clock::now();
  int32_t first = -1;
  Status st = a.n_predict > 0 ? dec.start(prompt, &first)
                              : ctx.decode(0, prompt.data(), static_cast<int64_t>(prompt.size()), nullptr);
  const double t_prefill = seconds_since(t0);
  std::vector<int32_t> out;
  // Text is decoded as it is generated so a stop string can end generation early. The streaming
  // decoder holds back split UTF-8 characters; ids past the tokenizer's vocab render as U+FFFD.
  std::string text;
  std::optional<StreamDecoder> sd;
  if (tok) sd.emplace(*tok);
  StopMatcher stop(stops);
  bool finished = false;  // an end-of-generation token or a stop string (not the length limit)
  // Takes one emitted token; false once generation must end.
  auto take = [&](int32_t id) {
    out.push_back(id);
    if (sd) {
      text += stop.push(sd->push(id));
      if (stop.stopped()) {
        finished = true;
        return false;
      }
    }
    if (id == eos || (tok && tok->is_eog(id))) {
      finished = true;
      return false;
    }
    return static_cast<int>(out.size()) < a.n_predict;
  };
  t0 = std::chrono::steady_clock::now();
  bool more = st.is_ok() && a.n_predict > 0 && take(first);
  std::vector<int32_t> got;
  while (st.is_ok() && more) {
    st = dec.step(a.n_predict - static_cast<int>(out.size()), &got);
    for (size_t i = 0; st.is_ok() && more && i < got.size(); ++i) more = take(got[i]);
  }
  if (sd && !stop.stopped()) {
    text += stop.push(sd->flush());
    text += stop.flush();
    finished = finished || stop.stopped();
  }
  const double t_decode = seconds_since(t0);
  if (!st.is_ok()) {
    std::fprintf(stderr, "moesh run: error: %s\n", st.to_string().c_str());
    return 1;
  }
  // Decode timing counts the tokens after the first (which comes from the prefill's logits).
  const int n_dec = std::max<int>(0, static_cast<int>(out.size()) - 1);
  const SpeculativeStats& ss = dec.stats();
  const double pp_tps = t_prefill > 0 ? prompt.size() / t_prefill : 0.0;
  const double tg_tps = t_decode > 0 && n_dec > 0 ? n_dec / t_decode : 0.0;
  if (a.json) {
    nlohmann::json j;
    j["prompt_tokens"] = prompt;
    j["tokens"] = out;
    j["text"] = text;
    j["finish_reason"] = finished ? "stop" : "length";
    if (stop.stopped()) j["stop"] = stop.matched();
    j["timings"] = {{"prompt_n", prompt.size()},        {"prompt_ms", t_prefill * 1e3},
                    {"prompt_per_second", pp_tps},      {"predicted_n", out.size()},
                    {"predicted_ms", t_decode * 1e3},   {"predicted_per_second", tg_tps},
                    {"threads", ctx.pool().n_threads()}};
    if (draft) {
      j["draft"] = {{"source", draft->name()},
                    {"passes", ss.steps},
                    {"drafted", ss.drafted},
                    {"accepted", ss.accepted},
                    {"emitted", ss.emitted}};
    }
    if (spans) {
      const SpanStats s = spans->stats();
      nlohmann::json where = nlohmann::json::array();
      for (size_t k = 0; k < spans->spans().size(); ++k) where.push_back(spans->where(static_cast<int>(k)));
      j["spans"] = {{"steps", s.steps},
                    {"trips", s.trips},
                    {"resends", s.resends},
                    {"replayed_rows", s.replayed_rows},
                    {"failovers", s.failovers},
                    {"restored", s.restored},
                    {"loads", s.loads},
                    {"failover_loads", s.failover_loads},
                    {"idle_takeovers", s.idle_takeovers},
                    {"lane_trips", s.lane_trips},
                    {"lane_rows", s.lane_rows},
                    {"lane_failures", s.lane_failures},
                    {"local_steps", s.local_steps},
                    {"chains", s.chains},
                    {"chained_steps", s.chained_steps},
                    {"awaits", s.awaits},
                    {"chain_breaks", s.chain_breaks},
                    {"bytes_sent", s.bytes_sent},
                    {"bytes_received", s.bytes_received},
                    {"log_memory_bytes", spans->log_stats().memory_bytes},
                    {"log_file_bytes", spans->log_stats().file_bytes},
                    {"where", where}};
    }
    if (remote) {
      // Round-trip structure of the whole run (prompt and generation): what the WAN tests check.
      const RemoteTraffic t = remote->traffic();
      j["remote"] = {{"layer_calls", t.layer_calls},       {"dispatch_frames", t.dispatch_frames},
                     {"combine_frames", t.combine_frames}, {"token_layers", t.token_layers},
                     {"remote_pairs", t.remote_pairs},     {"local_pairs", t.local_pairs},
                     {"max_in_flight", t.max_in_flight},   {"dispatch_bytes", t.dispatch_bytes},
                     {"combine_bytes", t.combine_bytes}};
      // Workers named that have not answered since start-up (left out: others hold their experts).
      j["remote"]["late_workers"] = nlohmann::json::array();
      for (const RemoteExecutor::LateWorker& l : remote->late_workers())
        j["remote"]["late_workers"].push_back(l.address);
      if (a.swarm.local_experts_mb > 0) {
        const HotExpertReport h = remote->hot_experts();
        j["hot_experts"] = {{"plans", h.plans},
                            {"experts", h.experts},
                            {"layers_all_local", h.layers_all_local},
                            {"bytes", h.bytes},
                            {"budget_bytes", h.budget_bytes},
                            {"fetched", h.fetched},
                            {"fetch_failures", h.fetch_failures},
                            {"predicted_ms_none", 1e3 * h.predicted_s_none},
                            {"predicted_ms_chosen", 1e3 * h.predicted_s_chosen}};
        if (!h.last_fetch_error.empty()) j["hot_experts"]["last_fetch_error"] = h.last_fetch_error;
      }
      if (a.swarm.replicate_hot > 0 || a.swarm.rebalance > 0) {
        const HotExpertReport h = remote->hot_experts();
        j["replicas"] = {{"plans", h.replica_plans},
                         {"sent", h.replicas_sent},
                         {"bytes", h.replica_bytes_sent},
                         {"failures", h.replica_failures},
                         {"rebalance_plans", h.rebalance_plans},
                         {"rebalanced", h.rebalanced},
                         {"rebalanced_bytes", h.rebalanced_bytes},
                         {"rebalance_failures", h.rebalance_failures},
                         {"predicted_ms_before", 1e3 * h.rebalance_predicted_s_before},
                         {"predicted_ms_after", 1e3 * h.rebalance_predicted_s_after}};
      }
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    if (tok) {
      std::printf("%s\n", text.c_str());
    } else {
      for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? " " : "", out[i]);
      std::printf("\n");
    }
    std::fprintf(
        stderr,
        "prefill: %zu tokens in %.1f ms (%.2f tok/s) | decode: %d tokens in %.1f ms (%.2f tok/s) | %d thread%s\n",
        prompt.size(), t_prefill * 1e3, pp_tps, n_dec, t_decode * 1e3, tg_tps, ctx.pool().n_threads(),
        ctx.pool().n_threads() == 1 ? "" : "s");
    if (spans) print_span_stats(*spans, stderr);
    if (draft) {
      std::fprintf(stderr,
                   "draft %s: %lld forward passes for %lld tokens (%.2f per pass), %lld of %lld drafts accepted "
                   "(%.1f%%)\n",
                   draft->name().c_str(), static_cast<long long>(ss.steps), static_cast<long long>(ss.emitted),
                   ss.steps ? double(ss.emitted) / double(ss.steps) : 0.0, static_cast<long long>(ss.accepted),
                   static_cast<long long>(ss.drafted), ss.drafted ? 100.0 * ss.accepted / ss.drafted : 0.0);
    }
  }
  return 0;
}

const CommandRegistrar kRegisterRun{Command{
    "run", "Generate text or tokens from a prompt", [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<RunArgs>();
      sub->add_option("-m,--model", a->model, "GGUF model file")->required();
      add_memory_flags(sub, &a->memory);
      sub->add_option("-p,--prompt", a->prompt, "Prompt text (needs a tokenizer)");
      sub->add_option("--tokens", a->tokens, "Prompt as comma-separated token ids");
      sub->add_option("-n,--n-predict", a->n_predict, "Tokens to generate")->capture_default_str();
      sub->add_option("--temp", a->temp, "Temperature (0: greedy)")->capture_default_str();
      sub->add_option("--top-k", a->top_k, "Top-k (0: off)")->capture_default_str();
      sub->add_option("--top-p", a->top_p, "Top-p (1: off)")->capture_default_str();
      sub->add_option("--min-p", a->min_p, "Min-p: keep tokens with p >= min_p * p_max (0: off)")
          ->capture_default_str();
      sub->add_option("--repeat-penalty", a->repeat_penalty, "Repetition penalty (1: off)")->capture_default_str();
      sub->add_option("--repeat-last-n", a->repeat_last_n, "Tokens of history the penalties look at (0: off, -1: all)")
          ->capture_default_str();
      sub->add_option("--presence-penalty", a->presence_penalty, "Presence penalty (0: off)")->capture_default_str();
      sub->add_option("--frequency-penalty", a->frequency_penalty, "Frequency penalty (0: off)")->capture_default_str();
      sub->add_option("--seed", a->seed, "Sampling seed")->capture_default_str();
      sub->add_option("--stop", a->stops, "Stop generating at this text (repeatable)");
      sub->add_option("--chat", a->chat, "A user message, wrapped in the model's chat template");
      sub->add_option("--system", a->system, "System message for --chat");
      sub->add_option("--chat-template", a->chat_template,
                      "Chat template instead of the file's: a built-in family (chatml, deepseek3, deepseek2, "
                      "llama3, harmony, mistral, ...) or Jinja source to execute");
      sub->add_option("-t,--threads", a->threads, "Compute threads (default: all cores)");
      sub->add_flag("--json", a->json, "Print one JSON object instead of text");
      sub->add_option("--draft", a->draft,
                      "Speculative decoding with this draft source: ngram (prompt lookup) or nextn (the "
                      "model's own NextN/MTP head, glm4moe). The output is "
                      "the same as without; more tokens per forward pass (and per round trip)");
      sub->add_option("--draft-max", a->draft_max, "Most drafts verified per forward pass")->capture_default_str();
      add_swarm_options(sub, &a->swarm);
      return [a] { return run_run(*a); };
    }}};

}  // namespace
}  // namespace moesh::cli
