// HTTP routes, SSE streaming and lifecycle of `moesh serve` (see http_server.h).
#include "moesh/serve/http_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>

#include "moesh/model/span.h"
#include "moesh/serve/ledger.h"
#include "moesh/swarm/swarm.h"
#include "moesh/text/json_grammar.h"
#include "moesh/text/output_grammar.h"
#include "serve/auto_replan.h"
#include "serve/dashboard.h"
#include "serve/metrics.h"
#include "serve/openai_api.h"
#include "serve/tool_grammar.h"

namespace moesh::serve {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Events of one request's choices, handed from the scheduler thread to the HTTP thread serving
// it; each tagged with its choice index (n > 1).
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<int, GenerationEvent>> events;
  std::atomic<bool> gone{false};  // the client went away: the sink tells the scheduler to cancel
};

// One choice of a request.
struct ChoiceState {
  uint64_t id = 0;  // scheduler request id; 0 until submitted
  CompletionResult res;
  std::optional<ChatOutputParser> parser;  // chat: splits content / reasoning / tool calls
  std::vector<TokenLogprob> lps;           // logprobs not yet written (all of them when not streaming)
  size_t text_bytes = 0;                   // completions: the text offset of the next token
  bool done = false;
};

// A request in progress (streaming or not): its choices, and the ones still to submit. With n > 1
// the first choice goes alone; the others are submitted once its first event shows the prompt is
// in its slot, so they copy those cells (the prefix cache) instead of computing the prompt again.
struct GenState {
  Endpoint ep = Endpoint::kCompletions;
  std::string ep_name;
  std::shared_ptr<Channel> ch;
  std::vector<ChoiceState> choices;
  std::vector<GenerationRequest> later;  // choices 1..n-1, submitted after choice 0's first event
  bool include_usage = false;
  bool started = false;
  bool got_text = false;
  bool finished = false;
  int n_done = 0;
  Clock::time_point t0;
};

// Constrained decoding (response_format, forced tool calls): one matcher per choice over the
// server's token mask. Matcher: JsonMatcher or OutputMatcher.
template <class Matcher>
class GrammarConstraint final : public TokenConstraint {
 public:
  GrammarConstraint(Matcher m, std::shared_ptr<const JsonTokenMask> mask, const char* what)
      : m_(std::move(m)), mask_(std::move(mask)), what_(what) {}
  Status allowed(std::vector<uint8_t>& a) override {
    if (mask_->fill(m_, a) == 0) {
      return make_error(StatusCode::kInvalidArgument, "no token of the vocabulary can continue the {}", what_);
    }
    return Status::ok();
  }
  Status accept(int32_t t) override {
    if (mask_->is_eog(t)) {
      if (m_.complete()) return Status::ok();
      return make_error(StatusCode::kInvalidArgument, "end of generation before the {} is complete", what_);
    }
    Matcher next = m_;
    if (!next.feed(mask_->bytes(t))) {
      return make_error(StatusCode::kInvalidArgument, "token {} does not continue the {}", t, what_);
    }
    m_ = std::move(next);
    return Status::ok();
  }

 private:
  Matcher m_;
  std::shared_ptr<const JsonTokenMask> mask_;
  const char* what_;
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

const char* endpoint_label(const std::string& path) {
  if (path == "/v1/completions") return "/v1/completions";
  if (path == "/v1/chat/completions") return "/v1/chat/completions";
  if (path == "/v1/models") return "/v1/models";
  if (path == "/health") return "/health";
  if (path == "/metrics") return "/metrics";
  return "other";
}

// The method a known path accepts ("" for unknown paths).
const char* allowed_method(const std::string& path) {
  if (path == "/v1/completions" || path == "/v1/chat/completions") return "POST";
  if (path == "/v1/models" || path == "/health" || path == "/metrics") return "GET";
  return "";
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(dump_json(error_json(e)), "application/json");
}

}  // namespace

struct HttpServer::Impl {
  ServeTarget t;
  ServerOptions opts;
  httplib::Server svr;
  ServeMetrics metrics;
  int port = 0;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> next_id{1};
  uint64_t id_salt = 0;
  int64_t started_unix = 0;
  std::chrono::steady_clock::time_point started_steady = std::chrono::steady_clock::now();
  std::unique_ptr<AutoReplanner> auto_replan;  // --auto-replan; null: off

  bool authorized(const httplib::Request& req, httplib::Response& res);
  // The admin routes (span moves, slices): only with --admin-key, and only to its bearer; `what`
  // names the routes in the 403.
  bool admin(const httplib::Request& req, httplib::Response& res, const char* what);
  OutputFormat out_fmt;                            // how the chat template's model writes reasoning and tool calls
  bool object_args = false;                        // the template wants tool-call arguments as objects
  bool no_null_content = false;                    // the template fails on content null (tool-call turns)
  std::shared_ptr<const JsonTokenMask> json_mask;  // response_format; built at start-up with a tokenizer
  // Forced tool calls: json_mask, or for harmony templates one that writes control tokens' text
  // (their call markers are control tokens).
  std::shared_ptr<const JsonTokenMask> call_mask;
  // For chat, *starts_in_reasoning tells whether the rendered prompt left a <think> open.
  Result<GenerationRequest> build_generation(const ApiRequest& r, ApiError* err, bool* starts_in_reasoning) const;
  void handle_generate(Endpoint ep, const httplib::Request& req, const std::string& body, httplib::Response& res);
  bool stream_step(GenState& s, httplib::DataSink& sink);
  // Waits for at least one event (or shutdown); moves them out.
  bool wait_events(Channel& ch, std::deque<std::pair<int, GenerationEvent>>* out);
  // Submits choice i (its sink tags events with i).
  Result<uint64_t> submit_choice(GenState& g, int i, GenerationRequest req);
  // After choice 0's first event: submits the rest. An error cancels every choice.
  Status submit_later(GenState& g);
  void cancel_all(GenState& g);
  // Folds one event into its choice: text through the parser, logprobs. Returns the chunks to
  // stream (empty when not streaming).
  std::vector<nlohmann::json> absorb(GenState& g, int i, GenerationEvent& ev, bool streaming);
  std::string make_id(Endpoint ep) {
    return fmt::format("{}-{:016x}{:08x}", ep == Endpoint::kChatCompletions ? "chatcmpl" : "cmpl", id_salt,
                       next_id.fetch_add(1));
  }
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() {
  stop();
}
int HttpServer::port() const {
  return impl_->port;
}

bool HttpServer::Impl::authorized(const httplib::Request& req, httplib::Response& res) {
  if (opts.api_key.empty()) return true;
  if (req.get_header_value("Authorization") == "Bearer " + opts.api_key) return true;
  ApiError e;
  e.http_status = 401;
  e.message = "invalid or missing API key (send 'Authorization: Bearer <key>')";
  e.code = "invalid_api_key";
  send_error(res, e);
  return false;
}

namespace {
void send_admin_error(httplib::Response& res, int http, const std::string& code, const std::string& msg) {
  ApiError e;
  e.type = "invalid_request_error";
  e.http_status = http;
  e.code = code;
  e.message = msg;
  send_error(res, e);
}
}  // namespace

bool HttpServer::Impl::admin(const httplib::Request& req, httplib::Response& res, const char* what) {
  if (opts.admin_key.empty()) {
    send_admin_error(res, 403, "admin_off", fmt::format("{} are off: start moesh serve with --admin-key KEY", what));
    return false;
  }
  if (req.get_header_value("Authorization") == "Bearer " + opts.admin_key) return true;
  send_admin_error(res, 401, "invalid_admin_key",
                   "invalid or missing admin key (send 'Authorization: Bearer <admin key>')");
  return false;
}

Result<GenerationRequest> HttpServer::Impl::build_generation(const ApiRequest& r, ApiError* err,
                                                             bool* starts_in_reasoning) const {
  auto fail = [err](int http, std::string param, std::string code, std::string msg) -> Status {
    err->http_status = http;
    err->type = "invalid_request_error";
    err->param = std::move(param);
    err->code = std::move(code);
    err->message = std::move(msg);
    return Status(StatusCode::kInvalidArgument, err->message);
  };
  GenerationRequest g;
  bool reasoning_closed = false;  // the rendered prompt ends with a closed <think> block
  const char* prompt_param = r.endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
  if (r.endpoint == Endpoint::kChatCompletions) {
    if (t.chat_template == nullptr || t.tokenizer == nullptr) {
      return fail(400, "messages", "unsupported_value",
                  "this model has no tokenizer or chat template; use /v1/completions with token ids");
    }
    // Special tokens only from the template: "<|im_end|>" typed in a message stays text.
    // A template error (raise_exception included) names its line:column and answers 400.
    if (!r.tools.is_null() && !t.chat_template->is_jinja()) {
      return fail(400, "tools", "unsupported_value",
                  fmt::format("this model's chat template (the built-in '{}' renderer) cannot show tools to the "
                              "model; use a model whose GGUF has a Jinja chat template, or --chat-template SOURCE",
                              chat_format_name(t.chat_template->format())));
    }
    ChatRenderOptions ro;
    ro.add_generation_prompt = true;
    ro.variables = r.template_variables;
    ro.tools = r.tools;
    // Arguments arrive as JSON strings (OpenAI's shape); a template that iterates them or writes
    // them with tojson gets the object, as llama.cpp does for such templates.
    std::vector<ChatMessage> messages = r.messages;
    if (object_args) tool_call_arguments_to_objects(&messages);
    if (no_null_content) null_content_to_empty(&messages);
    auto ids = tokenize_chat(*t.tokenizer, *t.chat_template, messages, ro);
    if (!ids) return fail(400, "messages", "invalid_value", ids.status().message());
    g.prompt = std::move(*ids);
    if (out_fmt.think_tags) {
      auto text = t.chat_template->render(messages, ro);
      *starts_in_reasoning = text.is_ok() && prompt_opens_reasoning(*text);
      reasoning_closed = text.is_ok() && prompt_closes_reasoning(*text);
    }
    if (r.scripted_output) {
      if (!opts.test_hooks) {
        return fail(400, "moesh_scripted_output", "unsupported_value",
                    "'moesh_scripted_output' is a test hook; start the server with --test-hooks");
      }
      auto forced = t.tokenizer->encode(*r.scripted_output, /*add_special=*/false, /*parse_special=*/true);
      if (!forced) return fail(400, "moesh_scripted_output", "invalid_value", forced.status().message());
      g.scripted_tokens = std::move(*forced);
    }
    for (std::string& s : t.chat_template->stop_strings()) g.stop.push_back(std::move(s));
    g.render_special = out_fmt.harmony;  // the parser reads harmony's markers
  } else if (r.prompt_is_tokens) {
    const int64_t n_vocab = t.model->hparams().n_vocab;
    for (int32_t id : r.prompt_tokens) {
      if (id >= n_vocab) {
        return fail(400, "prompt", "invalid_value",
                    fmt::format("token id {} is outside the vocabulary (n_vocab {})", id, n_vocab));
      }
    }
    g.prompt = r.prompt_tokens;
  } else {
    if (t.tokenizer == nullptr) {
      return fail(400, "prompt", "unsupported_value", "this model has no tokenizer; send the prompt as token ids");
    }
    auto ids = t.tokenizer->encode(r.prompt, /*add_special=*/true, /*parse_special=*/true);
    if (!ids) return fail(400, "prompt", "invalid_value", ids.status().message());
    g.prompt = std::move(*ids);
  }
  if (g.prompt.empty()) return fail(400, prompt_param, "invalid_value", "the prompt is empty after tokenization");
  const int64_t n_ctx = t.scheduler->n_ctx();
  const int64_t n_prompt = static_cast<int64_t>(g.prompt.size());
  if (n_prompt >= n_ctx) {
    return fail(
        400, prompt_param, "context_length_exceeded",
        fmt::format("This model's maximum context length is {} tokens; the prompt has {} tokens", n_ctx, n_prompt));
  }
  if (r.max_tokens) {
    if (n_prompt + *r.max_tokens > n_ctx) {
      return fail(400, "max_tokens", "context_length_exceeded",
                  fmt::format("This model's maximum context length is {} tokens. However, you requested {} "
                              "tokens ({} in the prompt, {} for the completion)",
                              n_ctx, n_prompt + *r.max_tokens, n_prompt, *r.max_tokens));
    }
    g.max_tokens = *r.max_tokens;
  } else {
    // Completions default to OpenAI's 16 tokens, chat to the rest of the context.
    const int64_t room = n_ctx - n_prompt;
    g.max_tokens = static_cast<int32_t>(
        r.endpoint == Endpoint::kCompletions ? std::min<int64_t>(kDefaultCompletionMaxTokens, room) : room);
  }
  g.sampling = r.sampling;
  if (!r.seed_given) g.sampling.seed = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ next_id.load();
  for (const std::string& s : r.stop) g.stop.push_back(s);
  g.ignore_eos = r.ignore_eos;
  g.top_logprobs = r.top_logprobs;
  if (r.response_format != ResponseFormat::kText) {
    if (json_mask == nullptr) {
      return fail(400, "response_format", "unsupported_value",
                  "response_format needs a model with a tokenizer (constrained decoding works on token texts)");
    }
    std::shared_ptr<const JsonGrammar> grammar = json_object_grammar();
    if (r.response_format == ResponseFormat::kJsonSchema) {
      auto compiled = compile_json_schema(r.json_schema);
      if (!compiled) {
        return fail(400, "response_format.json_schema.schema",
                    compiled.status().code() == StatusCode::kUnsupported ? "unsupported_value" : "invalid_value",
                    compiled.status().message());
      }
      grammar = std::move(*compiled);
    }
    g.constraint =
        std::make_shared<GrammarConstraint<JsonMatcher>>(JsonMatcher(std::move(grammar)), json_mask, "JSON output");
  }
  const bool forced_call = r.endpoint == Endpoint::kChatCompletions && !r.tools.is_null() &&
                           (r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kFunction);
  if (forced_call && call_mask != nullptr) {
    ToolGrammarOptions to;
    to.parallel = r.parallel_tool_calls && r.tool_choice == ToolChoice::kRequired;
    to.starts_in_reasoning = *starts_in_reasoning;
    to.reasoning_closed = reasoning_closed;
    auto tg = tool_call_grammar(out_fmt, r.tools, to);
    if (tg.is_ok()) {
      for (const std::string& why : tg->relaxed) {
        spdlog::warn("tool_choice: arguments of {} are forced to be a JSON object only", why);
      }
      // A forced call outranks response_format: the answer is the call.
      g.constraint = std::make_shared<GrammarConstraint<OutputMatcher>>(OutputMatcher(std::move(tg->grammar)),
                                                                        call_mask, "forced tool call");
    } else if (tg.status().code() != StatusCode::kUnsupported) {
      return fail(400, "tools", "invalid_value", tg.status().message());
    } else {
      spdlog::warn("tool_choice is not enforced: {}", tg.status().message());
    }
  }
  return g;
}

bool HttpServer::Impl::wait_events(Channel& ch, std::deque<std::pair<int, GenerationEvent>>* out) {
  std::unique_lock<std::mutex> lk(ch.mu);
  // The timeout only exists to notice a server shutdown; events wake us at once.
  while (ch.events.empty()) {
    if (stopping.load()) return false;
    ch.cv.wait_for(lk, std::chrono::milliseconds(200));
  }
  out->swap(ch.events);
  return true;
}

Result<uint64_t> HttpServer::Impl::submit_choice(GenState& g, int i, GenerationRequest req) {
  auto sink = [ch = g.ch, i](const GenerationEvent& e) {
    if (ch->gone.load()) return false;
    {
      std::lock_guard<std::mutex> lk(ch->mu);
      ch->events.emplace_back(i, e);
    }
    ch->cv.notify_one();
    return true;
  };
  auto id = t.scheduler->submit(std::move(req), sink);
  if (id) g.choices[static_cast<size_t>(i)].id = *id;
  return id;
}

Status HttpServer::Impl::submit_later(GenState& g) {
  for (size_t k = 0; k < g.later.size(); ++k) {
    auto id = submit_choice(g, static_cast<int>(k + 1), std::move(g.later[k]));
    if (!id) {
      g.later.clear();
      cancel_all(g);
      return id.status();
    }
  }
  g.later.clear();
  return Status::ok();
}

void HttpServer::Impl::cancel_all(GenState& g) {
  g.ch->gone = true;
  for (const ChoiceState& c : g.choices) {
    if (c.id != 0 && !c.done) t.scheduler->cancel(c.id);
  }
}

std::vector<nlohmann::json> HttpServer::Impl::absorb(GenState& g, int i, GenerationEvent& ev, bool streaming) {
  ChoiceState& c = g.choices[static_cast<size_t>(i)];
  std::vector<json> chunks;
  if (!ev.logprobs.empty()) c.lps.insert(c.lps.end(), ev.logprobs.begin(), ev.logprobs.end());
  if (!ev.text.empty() && !g.got_text) {
    g.got_text = true;
    metrics.observe_ttft(g.ep_name, seconds_since(g.t0));
  }
  if (!streaming) {
    c.res.text += ev.text;
    return chunks;
  }
  if (!ev.text.empty()) {
    if (c.parser) {
      chunks = delta_chunks(c.res, c.parser->push(ev.text), g.include_usage);
    } else {
      chunks.push_back(text_chunk(g.ep, c.res, ev.text, g.include_usage));
    }
  }
  // Logprobs ride on the first chunk of the event that produced them; text held back (a stop
  // string in the making, a tool call being parsed) carries them to the next chunk.
  if (!chunks.empty() && !c.lps.empty()) {
    chunks.front()["choices"][0]["logprobs"] = logprobs_json(g.ep, c.lps, t.tokenizer, c.text_bytes);
    for (const TokenLogprob& lp : c.lps) {
      c.text_bytes += t.tokenizer != nullptr ? t.tokenizer->token_to_piece(lp.token, true).size() : 0;
    }
    c.lps.clear();
  }
  return chunks;
}

void HttpServer::Impl::handle_generate(Endpoint ep, const httplib::Request& req, const std::string& body,
                                       httplib::Response& res) {
  const Clock::time_point t0 = Clock::now();
  const std::string ep_name = endpoint_label(req.path);
  if (!authorized(req, res)) return;
  ApiError err;
  auto parsed = parse_request(ep, body, &err);
  if (!parsed) return send_error(res, err);
  bool in_reasoning = false;
  std::vector<GenerationRequest> gens;
  for (int i = 0; i < parsed->n; ++i) {
    auto gen = build_generation(*parsed, &err, &in_reasoning);
    if (!gen) return send_error(res, err);
    // Choice i samples with seed + i: different answers, each reproducible with a given seed.
    if (i > 0) gen->sampling.seed = gens.front().sampling.seed + static_cast<uint64_t>(i);
    gens.push_back(std::move(*gen));
  }

  auto g = std::make_shared<GenState>();
  g->ep = ep;
  g->ep_name = ep_name;
  g->ch = std::make_shared<Channel>();
  g->include_usage = parsed->include_usage;
  g->t0 = t0;
  const std::string id_text = make_id(ep);
  for (int i = 0; i < parsed->n; ++i) {
    ChoiceState c;
    c.res.id = id_text;
    c.res.created = static_cast<int64_t>(std::time(nullptr));
    c.res.model = opts.model_name;
    c.res.index = i;
    if (ep == Endpoint::kChatCompletions) {
      c.parser.emplace(out_fmt, !parsed->tools.is_null(), in_reasoning,
                       "call_" + id_text.substr(id_text.find('-') + 1) + "_" + (i > 0 ? std::to_string(i) + "_" : ""));
    }
    g->choices.push_back(std::move(c));
  }
  for (size_t i = 1; i < gens.size(); ++i) g->later.push_back(std::move(gens[i]));
  if (auto id = submit_choice(*g, 0, std::move(gens.front())); !id) {
    return send_error(res, api_error_from_status(id.status()));
  }
  const bool want_logprobs = parsed->top_logprobs >= 0;

  if (!parsed->stream) {
    std::deque<std::pair<int, GenerationEvent>> evs;
    for (;;) {
      if (!wait_events(*g->ch, &evs)) {
        cancel_all(*g);
        ApiError e;
        e.http_status = 503;
        e.type = "server_error";
        e.code = "shutting_down";
        e.message = "the server is shutting down";
        return send_error(res, e);
      }
      for (auto& [i, ev] : evs) {
        if (!g->later.empty()) {
          if (Status st = submit_later(*g); !st.is_ok()) return send_error(res, api_error_from_status(st));
        }
        ChoiceState& c = g->choices[static_cast<size_t>(i)];
        absorb(*g, i, ev, /*streaming=*/false);
        if (!ev.done) continue;
        c.done = true;
        if (ev.finish == FinishReason::kError || ev.finish == FinishReason::kCancelled) {
          cancel_all(*g);
          ApiError e;
          e.http_status = ev.finish == FinishReason::kError ? 500 : 503;
          e.type = "server_error";
          e.code = ev.finish == FinishReason::kError ? "generation_failed" : "cancelled";
          e.message = ev.finish == FinishReason::kError ? ev.error.message() : "the request was cancelled";
          return send_error(res, e);
        }
        c.res.finish = ev.finish;
        c.res.usage = ev.usage;
        if (c.parser) {
          c.parser->push(c.res.text);
          c.parser->finish();
          c.res.text = c.parser->content();
          c.res.reasoning = c.parser->reasoning();
          c.res.tool_calls = c.parser->tool_calls();
        }
        if (want_logprobs) c.res.logprobs = logprobs_json(ep, c.lps, t.tokenizer);
        if (++g->n_done < static_cast<int>(g->choices.size())) continue;
        std::vector<CompletionResult> results;
        for (ChoiceState& x : g->choices) results.push_back(std::move(x.res));
        res.set_content(dump_json(completion_response(ep, results)), "application/json");
        metrics.observe_duration(ep_name, seconds_since(t0));
        return;
      }
      evs.clear();
    }
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream", [this, g](size_t /*offset*/, httplib::DataSink& sink) { return stream_step(*g, sink); },
      [this, g](bool success) {
        // The response is gone without a finished stream (client went away, write error,
        // shutdown): free the slots now instead of generating for nobody.
        if (!success || !g->finished) cancel_all(*g);
      });
}

bool HttpServer::Impl::stream_step(GenState& s, httplib::DataSink& sink) {
  auto write = [&](const std::string& data) {
    if (sink.write(data.data(), data.size())) return true;
    cancel_all(s);
    return false;
  };
  if (!s.started) {
    s.started = true;
    if (s.ep == Endpoint::kChatCompletions) {
      for (const ChoiceState& c : s.choices) {
        if (!write(sse_event(role_chunk(c.res, s.include_usage)))) return false;
      }
    }
  }
  std::deque<std::pair<int, GenerationEvent>> evs;
  if (!wait_events(*s.ch, &evs)) {
    cancel_all(s);
    return false;
  }
  for (auto& [i, ev] : evs) {
    if (!s.later.empty()) {
      if (Status st = submit_later(s); !st.is_ok()) {
        s.finished = true;
        const ApiError e = api_error_from_status(st);
        (void)write(sse_event(error_json(e)));
        return false;
      }
    }
    ChoiceState& c = s.choices[static_cast<size_t>(i)];
    for (const json& chunk : absorb(s, i, ev, /*streaming=*/true)) {
      if (!write(sse_event(chunk))) return false;
    }
    if (!ev.done) continue;
    c.done = true;
    if (ev.finish == FinishReason::kError || ev.finish == FinishReason::kCancelled) {
      s.finished = true;
      cancel_all(s);
      ApiError e;
      e.http_status = 500;
      e.type = "server_error";
      e.code = ev.finish == FinishReason::kError ? "generation_failed" : "cancelled";
      e.message = ev.finish == FinishReason::kError ? ev.error.message() : "the request was cancelled";
      if (!write(sse_event(error_json(e)))) return false;
      if (!write(std::string(kSseDone))) return false;
      sink.done();
      return true;
    }
    c.res.finish = ev.finish;
    c.res.usage = ev.usage;
    std::vector<json> tail;
    if (c.parser) {
      tail = delta_chunks(c.res, c.parser->finish(), s.include_usage);
      c.res.tool_calls = c.parser->tool_calls();
    }
    tail.push_back(finish_chunk(s.ep, c.res, s.include_usage));
    if (!c.lps.empty()) {
      tail.front()["choices"][0]["logprobs"] = logprobs_json(s.ep, c.lps, t.tokenizer, c.text_bytes);
      c.lps.clear();
    }
    for (const json& chunk : tail) {
      if (!write(sse_event(chunk))) return false;
    }
    if (++s.n_done < static_cast<int>(s.choices.size())) continue;
    s.finished = true;
    if (s.include_usage) {
      CompletionResult total = s.choices.front().res;
      for (size_t k = 1; k < s.choices.size(); ++k) {
        total.usage.completion_tokens += s.choices[k].res.usage.completion_tokens;
        total.usage.draft_tokens += s.choices[k].res.usage.draft_tokens;
        total.usage.accepted_draft_tokens += s.choices[k].res.usage.accepted_draft_tokens;
      }
      if (!write(sse_event(usage_chunk(s.ep, total)))) return false;
    }
    if (!write(std::string(kSseDone))) return false;
    metrics.observe_duration(s.ep_name, seconds_since(s.t0));
    sink.done();
    return true;
  }
  return true;
}

Result<std::unique_ptr<HttpServer>> HttpServer::create(const ServeTarget& target, const ServerOptions& opts) {
  if (target.scheduler == nullptr || target.model == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "http server: a scheduler and a model are required");
  }
  auto impl = std::make_unique<Impl>();
  impl->t = target;
  impl->opts = opts;
  impl->id_salt = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  impl->started_unix = static_cast<int64_t>(std::time(nullptr));
  if (target.chat_template != nullptr && target.chat_template->is_jinja()) {
    impl->out_fmt = detect_output_format(target.chat_template->jinja_source());
    impl->object_args = template_wants_object_arguments(*target.chat_template);
    impl->no_null_content = template_rejects_null_content(*target.chat_template);
  }
  if (target.tokenizer != nullptr) {
    impl->json_mask = std::make_shared<const JsonTokenMask>(*target.tokenizer);
    impl->call_mask = impl->out_fmt.harmony
                          ? std::make_shared<const JsonTokenMask>(*target.tokenizer, /*control_text=*/true)
                          : impl->json_mask;
  }
  Impl* m = impl.get();
  httplib::Server& svr = m->svr;

  const int slots = target.scheduler->options().n_slots;
  const int n_threads = opts.http_threads > 0 ? opts.http_threads : std::max(64, 4 * slots + 16);
  svr.new_task_queue = [n_threads] { return new httplib::ThreadPool(static_cast<size_t>(n_threads)); };
  svr.set_payload_max_length(opts.max_body_bytes);
  svr.set_read_timeout(opts.io_timeout_s, 0);
  svr.set_write_timeout(opts.io_timeout_s, 0);
  svr.set_tcp_nodelay(true);

  svr.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    const std::string allowed = allowed_method(req.path);
    if (allowed.empty() || req.method == allowed || (allowed == "GET" && req.method == "HEAD")) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    ApiError e;
    e.http_status = 405;
    e.message = fmt::format("{} {} is not allowed; use {}", req.method, req.path, allowed);
    e.code = "method_not_allowed";
    send_error(res, e);
    res.set_header("Allow", allowed);
    return httplib::Server::HandlerResponse::Handled;
  });
  // Errors httplib produces itself (404 unknown path, 413 body too large, 400 unparsable HTTP)
  // get an OpenAI error body too; responses that already have one are left alone.
  svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.http_status = res.status;
    if (res.status == 404) {
      e.message = fmt::format("unknown path {}", req.path);
      e.code = "not_found";
    } else if (res.status == 413) {
      e.message = "the request body is too large";
      e.code = "payload_too_large";
    } else {
      e.message = fmt::format("HTTP error {}", res.status);
      if (res.status >= 500) e.type = "server_error";
    }
    res.set_content(dump_json(error_json(e)), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    ApiError e;
    e.http_status = 500;
    e.type = "server_error";
    e.code = "internal_error";
    e.message = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& ex) {
      e.message = std::string("internal error: ") + ex.what();
    } catch (...) {
    }
    send_error(res, e);
  });
  svr.set_logger([m](const httplib::Request& req, const httplib::Response& res) {
    m->metrics.count_request(endpoint_label(req.path), res.status);
  });

  // The body is read through a content reader: httplib's own body reading would treat a body
  // sent as application/x-www-form-urlencoded (curl -d's default) as a form and refuse it above
  // 8 KiB with 413. The reader still enforces max_body_bytes (httplib sets 413).
  auto generate_route = [m](Endpoint ep) {
    return [m, ep](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
      std::string body;
      bool too_large = false;
      const size_t limit = m->opts.max_body_bytes;
      // httplib checks the limit against Content-Length; a chunked body is checked here.
      const bool read = reader([&](const char* data, size_t n) {
        if (body.size() + n > limit) {
          too_large = true;
          return false;
        }
        body.append(data, n);
        return true;
      });
      if (too_large) {
        res.status = 413;  // the error handler writes the body
        return;
      }
      if (!read) {
        if (res.status < 400) res.status = 400;
        return;
      }
      m->handle_generate(ep, req, body, res);
    };
  };
  svr.Post("/v1/completions", generate_route(Endpoint::kCompletions));
  svr.Post("/v1/chat/completions", generate_route(Endpoint::kChatCompletions));
  svr.Get("/v1/models", [m](const httplib::Request& req, httplib::Response& res) {
    if (!m->authorized(req, res)) return;
    res.set_content(dump_json(models_response(m->opts.model_name, m->started_unix)), "application/json");
  });
  svr.Get("/health", [m](const httplib::Request&, httplib::Response& res) {
    const SchedulerStats st = m->t.scheduler->stats();
    json j = {{"status", "ok"},
              {"model", m->opts.model_name},
              {"slots_total", st.n_slots},
              {"slots_active", st.active},
              {"slots_idle", st.n_slots - st.active},
              {"queue_depth", st.queued},
              {"n_ctx", m->t.scheduler->n_ctx()}};
    res.set_content(dump_json(j), "application/json");
  });
  svr.Get("/metrics", [m](const httplib::Request&, httplib::Response& res) {
    MetricsSnapshot snap = m->metrics.snapshot();
    snap.sched = m->t.scheduler->stats();
    if (m->t.remote != nullptr) {
      snap.workers = m->t.remote->worker_traffic();
      snap.has_remote = true;
      snap.remote = m->t.remote->traffic();
    }
    if (m->t.spans != nullptr) {
      snap.has_spans = true;
      snap.spans = m->t.spans->stats();
      snap.span_log = m->t.spans->log_stats();
    }
    res.set_content(render_metrics(snap), "text/plain; version=0.0.4");
  });
  // The registry: every worker with its path, state, experts, latencies and when it was last
  // heard from, plus the joins seen (`moesh swarm status` reads it; docs/swarm.md).
  svr.Get("/swarm/status", [m](const httplib::Request&, httplib::Response& res) {
    json j = swarm_status_json(m->t.remote, m->t.spans);
    if (m->auto_replan) j["auto_replan"] = m->auto_replan->status();
    res.set_content(j.dump(2), "application/json");
  });
  // The live dashboard (serve/dashboard.h): a static page polling its JSON.
  svr.Get("/dashboard", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(dashboard_html(), "text/html; charset=utf-8");
  });
  svr.Get("/swarm/dashboard.json", [m](const httplib::Request&, httplib::Response& res) {
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - m->started_steady).count();
    json j = dashboard_json(m->t.scheduler->stats(), m->t.remote, t, m->t.model, m->t.spans, m->opts.plan_costs);
    if (m->auto_replan) j["auto_replan"] = m->auto_replan->status();
    res.set_content(j.dump(), "application/json");
  });
  // The slice a span peer needs (`moesh span --fetch`; docs/serve.md#moving-a-span): cut from this
  // gateway's model file into a temporary file, streamed, its XXH3-128 in X-Moesh-Slice-Hash so the
  // peer can check its download. Admin only: it hands out weights.
  svr.Get("/swarm/slice", [m](const httplib::Request& req, httplib::Response& res) {
    auto fail = [&](int http, std::string code, std::string msg) { send_admin_error(res, http, code, msg); };
    if (!m->admin(req, res, "slices")) return;
    auto sp = parse_layer_span(req.get_param_value("layers"));
    if (!sp) return fail(400, "invalid_layers", sp.status().message());
    const char* tmp = std::getenv("TMPDIR");
    std::string path = std::string(tmp != nullptr && *tmp != 0 ? tmp : "/var/tmp") + "/moesh-slice-XXXXXX";
    const int fd = ::mkstemp(path.data());
    if (fd < 0) return fail(500, "slice_failed", fmt::format("cannot make a temporary file {}", path));
    ::close(fd);
    Status st = swarm::write_span_slice(m->t.model->file(), sp->first, sp->last, path);
    auto hash = st.is_ok() ? swarm::file_hash_hex(path) : Result<std::string>(st);
    std::error_code ec;
    const uint64_t size = hash ? std::filesystem::file_size(path, ec) : 0;
    if (!hash || ec) {
      std::filesystem::remove(path, ec);
      return fail(hash.status().code() == StatusCode::kInvalidArgument ? 409 : 500, "slice_failed",
                  hash ? std::string("cannot size the slice") : hash.status().message());
    }
    res.set_header("X-Moesh-Slice-Hash", *hash);
    auto in = std::make_shared<std::ifstream>(path, std::ios::binary);
    res.set_content_provider(
        size, "application/octet-stream",
        [in](size_t offset, size_t length, httplib::DataSink& sink) {
          std::vector<char> buf(std::min<size_t>(length, size_t{1} << 20));
          in->seekg(static_cast<std::streamoff>(offset));
          in->read(buf.data(), static_cast<std::streamsize>(buf.size()));
          const std::streamsize got = in->gcount();
          return got > 0 && sink.write(buf.data(), static_cast<size_t>(got));
        },
        [path](bool) {
          std::error_code rm;
          std::filesystem::remove(path, rm);
        });
  });
  // A planned move of a span (re-planning while serving, docs/serve.md#moving-a-span): body
  // {"layers": "12-23", "to": "HOST:PORT" | "here"}. Only with --admin-key: it redirects hidden
  // states, so an open gateway must not offer it.
  svr.Post("/swarm/spans/move", [m](const httplib::Request& req, httplib::Response& res) {
    auto fail = [&](int http, std::string code, std::string msg) { send_admin_error(res, http, code, msg); };
    if (!m->admin(req, res, "span moves")) return;
    if (m->t.spans == nullptr) return fail(404, "no_spans", "this gateway runs no layer spans (--span)");
    const json body = json::parse(req.body, nullptr, false);
    if (!body.is_object() || !body.contains("layers") || !body["layers"].is_string() || !body.contains("to") ||
        !body["to"].is_string()) {
      return fail(400, "invalid_body",
                  "the body must be {\"layers\": \"FIRST-LAST\", \"to\": \"HOST:PORT\" or \"here\"}");
    }
    auto sp = parse_layer_span(body["layers"].get<std::string>());
    if (!sp) return fail(400, "invalid_layers", sp.status().message());
    Status st = m->t.spans->move(*sp, body["to"].get<std::string>());
    if (!st.is_ok()) {
      const bool bad = st.code() == StatusCode::kNotFound || st.code() == StatusCode::kInvalidArgument;
      return fail(bad ? 400 : 502, bad ? "invalid_move" : "move_failed", st.message());
    }
    json out;
    for (const std::string& w : m->t.spans->where_all()) out["spans"].push_back(w);
    const SpanStats ss = m->t.spans->stats();
    out["moves"] = ss.moves;
    out["move_rows"] = ss.move_rows;
    out["loads"] = ss.loads;
    out["drops"] = ss.drops;
    res.set_content(out.dump(2), "application/json");
  });
  // New span edges while serving (SpanClient::resplit): the spans become the given list, which
  // covers the blocks the spans cover now; new spans are warmed before the switch.
  svr.Post("/swarm/spans/resplit", [m](const httplib::Request& req, httplib::Response& res) {
    auto err = [&](int http, std::string code, std::string msg) { send_admin_error(res, http, code, msg); };
    if (!m->admin(req, res, "span resplits")) return;
    if (m->t.spans == nullptr) return err(404, "no_spans", "this gateway runs no layer spans (--span)");
    const json body = json::parse(req.body, nullptr, false);
    const bool ok_shape =
        body.is_object() && body.contains("spans") && body["spans"].is_array() && !body["spans"].empty() &&
        std::all_of(body["spans"].begin(), body["spans"].end(), [](const json& x) { return x.is_string(); });
    if (!ok_shape) {
      return err(400, "invalid_body",
                 "the body must be {\"spans\": [\"FIRST-LAST@HOST:PORT\" or \"FIRST-LAST@here\", ...]}");
    }
    std::vector<SpanPlacement> want;
    for (const json& x : body["spans"]) {
      auto p = parse_span_placement(x.get<std::string>());
      if (!p) return err(400, "invalid_spans", p.status().message());
      want.push_back(*p);
    }
    Status st = m->t.spans->resplit(want);
    if (!st.is_ok()) {
      const bool bad = st.code() == StatusCode::kInvalidArgument;
      return err(bad ? 400 : 502, bad ? "invalid_resplit" : "resplit_failed", st.message());
    }
    json out;
    for (const std::string& w : m->t.spans->where_all()) out["spans"].push_back(w);
    const SpanStats ss = m->t.spans->stats();
    out["resplits"] = ss.resplits;
    out["resplit_rows"] = ss.resplit_rows;
    out["loads"] = ss.loads;
    out["drops"] = ss.drops;
    res.set_content(out.dump(2), "application/json");
  });
  // A lane of a span while serving (`moesh swarm move URL --lane F-L@HOST:PORT`; SpanClient::add_lane):
  // body {"layers": "12-23", "to": "HOST:PORT"} adds one, {"layers": "12-23", "drop": "HOST:PORT"}
  // lets one go. Admin only: it redirects hidden states.
  svr.Post("/swarm/spans/lane", [m](const httplib::Request& req, httplib::Response& res) {
    auto err = [&](int http, std::string code, std::string msg) { send_admin_error(res, http, code, msg); };
    if (!m->admin(req, res, "span lanes")) return;
    if (m->t.spans == nullptr) return err(404, "no_spans", "this gateway runs no layer spans (--span)");
    const json body = json::parse(req.body, nullptr, false);
    const bool add = body.is_object() && body.contains("to") && body["to"].is_string();
    const bool drop = body.is_object() && body.contains("drop") && body["drop"].is_string();
    if (!body.is_object() || !body.contains("layers") || !body["layers"].is_string() || add == drop) {
      return err(400, "invalid_body",
                 "the body must be {\"layers\": \"FIRST-LAST\", \"to\": \"HOST:PORT\"} (a new lane) or "
                 "{\"layers\": \"FIRST-LAST\", \"drop\": \"HOST:PORT\"} (let one go)");
    }
    auto sp = parse_layer_span(body["layers"].get<std::string>());
    if (!sp) return err(400, "invalid_layers", sp.status().message());
    Status st = add ? m->t.spans->add_lane(*sp, body["to"].get<std::string>())
                    : m->t.spans->drop_lane(*sp, body["drop"].get<std::string>());
    if (!st.is_ok()) {
      const bool bad = st.code() == StatusCode::kNotFound || st.code() == StatusCode::kInvalidArgument;
      return err(bad ? 400 : 502, bad ? "invalid_lane" : "lane_failed", st.message());
    }
    json out;
    for (const std::string& w : m->t.spans->where_all()) out["spans"].push_back(w);
    const SpanStats ss = m->t.spans->stats();
    out["lanes_added"] = ss.lanes_added;
    out["lane_trips"] = ss.lane_trips;
    out["loads"] = ss.loads;
    out["drops"] = ss.drops;
    res.set_content(out.dump(2), "application/json");
  });
  // A span peer made known while serving (`moesh swarm move URL --span-peer HOST:PORT`, `moesh span
  // --offer`): dialled to learn its round trip and memory, then listed as idle, so a re-plan (and
  // --auto-replan) may give it blocks. Admin only: it adds a place hidden states may go.
  svr.Post("/swarm/spans/add", [m](const httplib::Request& req, httplib::Response& res) {
    auto err = [&](int http, std::string code, std::string msg) { send_admin_error(res, http, code, msg); };
    if (!m->admin(req, res, "span peer additions")) return;
    if (m->t.spans == nullptr) return err(404, "no_spans", "this gateway runs no layer spans (--span)");
    const json body = json::parse(req.body, nullptr, false);
    if (!body.is_object() || !body.contains("address") || !body["address"].is_string())
      return err(400, "invalid_body", "the body must be {\"address\": \"HOST:PORT\"}");
    Status st = m->t.spans->add_idle(body["address"].get<std::string>());
    if (!st.is_ok()) {
      const bool bad = st.code() == StatusCode::kInvalidArgument;
      return err(bad ? 400 : 502, bad ? "invalid_address" : "span_peer_failed", st.message());
    }
    json out;
    out["idle"] = json::array();
    for (const SpanPeerView& v : m->t.spans->idle_view()) out["idle"].push_back(v.label);
    res.set_content(out.dump(2), "application/json");
  });
  // A worker taken in while serving (a new expert peer or a replica; `moesh swarm move URL
  // --worker HOST:PORT`): dialled between calls, listed under "late" in /swarm/status until it
  // answers, then added with the experts it announces. Admin only: it changes who computes.
  svr.Post("/swarm/workers/add", [m](const httplib::Request& req, httplib::Response& res) {
    auto err = [&](int http, std::string code, std::string msg) { send_admin_error(res, http, code, msg); };
    if (!m->admin(req, res, "worker additions")) return;
    if (m->t.remote == nullptr)
      return err(404, "no_workers",
                 "this gateway dispatches to no workers (start it with --worker or --accept-workers)");
    const json body = json::parse(req.body, nullptr, false);
    if (!body.is_object() || !body.contains("address") || !body["address"].is_string())
      return err(400, "invalid_body", "the body must be {\"address\": \"HOST:PORT\"}");
    auto addr = parse_worker_address(body["address"].get<std::string>());
    if (!addr) return err(400, "invalid_address", addr.status().message());
    if (Status st = m->t.remote->dial_worker(*addr); !st.is_ok()) return err(409, "already_dialled", st.message());
    res.status = 202;
    res.set_content(json{{"dialing", addr->to_string()}}.dump(2), "application/json");
  });
  // Experts given to a worker, or replicas it is to let go of, while serving (`moesh swarm move URL
  // --experts SPEC@HOST:PORT` / `--drop-experts`; RemoteExecutor::request_experts / drop_experts):
  // body {"worker": W, "give": SPEC} or {"worker": W, "drop": SPEC}, W its address, name or label.
  // Carried out between calls (202); /swarm/status "expert_requests" tells the outcome. Admin only:
  // it changes who computes and what workers keep.
  svr.Post("/swarm/workers/experts", [m](const httplib::Request& req, httplib::Response& res) {
    auto err = [&](int http, std::string code, std::string msg) { send_admin_error(res, http, code, msg); };
    if (!m->admin(req, res, "expert moves")) return;
    if (m->t.remote == nullptr)
      return err(404, "no_workers",
                 "this gateway dispatches to no workers (start it with --worker or --accept-workers)");
    const json body = json::parse(req.body, nullptr, false);
    const bool give = body.is_object() && body.contains("give") && body["give"].is_string();
    const bool drop = body.is_object() && body.contains("drop") && body["drop"].is_string();
    if (!body.is_object() || !body.contains("worker") || !body["worker"].is_string() || give == drop)
      return err(400, "invalid_body",
                 "the body must be {\"worker\": \"HOST:PORT\", \"give\": \"SPEC\"} (copies of those experts) or "
                 "{\"worker\": \"HOST:PORT\", \"drop\": \"SPEC\"} (let go of its replicas of them)");
    auto shape = swarm::model_shape(m->t.model->file());
    if (!shape) return err(500, "model_shape", shape.status().message());
    const std::string spec = body[give ? "give" : "drop"].get<std::string>();
    auto set = swarm::parse_expert_spec(spec, *shape);
    if (!set) return err(400, "invalid_experts", set.status().message());
    const std::string worker = body["worker"].get<std::string>();
    if (give)
      m->t.remote->request_experts(worker, set->ranges);
    else
      m->t.remote->drop_experts(worker, set->ranges);
    res.status = 202;
    res.set_content(json{{give ? "giving" : "dropping", set->to_string()}, {"worker", worker}}.dump(2),
                    "application/json");
  });
  // The backbone's side of the work ledger (serve/ledger.h); `moesh swarm ledger` reads it.
  svr.Get("/swarm/ledger", [m](const httplib::Request&, httplib::Response& res) {
    const RemoteExecutor* r = m->t.remote;
    const json j = r != nullptr ? ledger_json("backbone", r->options().name, r->ledger())
                                : ledger_json("backbone", "backbone", {});
    res.set_content(j.dump(2), "application/json");
  });

  if (opts.port == 0) {
    m->port = svr.bind_to_any_port(opts.host);
    if (m->port <= 0) return make_error(StatusCode::kIoError, "cannot listen on {}: no free port", opts.host);
  } else {
    if (opts.port < 0 || opts.port > 65535 || !svr.bind_to_port(opts.host, opts.port)) {
      return make_error(StatusCode::kIoError, "cannot listen on {}:{}", opts.host, opts.port);
    }
    m->port = opts.port;
  }
  if (opts.auto_replan_s > 0) {
    if (target.spans == nullptr && target.remote == nullptr)
      return make_error(StatusCode::kInvalidArgument,
                        "--auto-replan re-plans layer spans and expert workers: give --span or --worker");
    m->auto_replan = std::make_unique<AutoReplanner>(
        target.scheduler, target.remote, target.model, target.spans,
        std::chrono::milliseconds(static_cast<int64_t>(std::max(opts.auto_replan_s, 0.05) * 1000)), opts.plan_costs);
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

Status HttpServer::run() {
  if (impl_->stopping.load()) return Status::ok();
  if (!impl_->svr.listen_after_bind() && !impl_->stopping.load()) {
    return make_error(StatusCode::kIoError, "http server on port {} stopped listening", impl_->port);
  }
  return Status::ok();
}

void HttpServer::stop() {
  if (impl_->auto_replan) impl_->auto_replan->stop();
  impl_->stopping = true;
  impl_->svr.stop();
}

}  // namespace moesh::serve
