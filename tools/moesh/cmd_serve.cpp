// `moesh serve -m MODEL [--worker HOST:PORT ... | --workers FILE] [--host H --port P]
//  [--parallel N] [-c CTX] [--threads N] [--chat-template NAME|JINJA] [--batch-tokens N] [--api-key K]`:
// the OpenAI-compatible HTTP server (docs/serve.md). Loads the model, its tokenizer and chat
// template, connects to the workers like `moesh run`, starts the Scheduler and the HTTP gateway,
// and prints "listening on HOST:PORT" (with --port 0 the port the OS chose) once it accepts
// connections. SIGINT/SIGTERM stop it: the scheduler cancels what is running, then the listener
// closes.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "command.h"
#include "model_cli.h"
#include "moesh/serve/http_server.h"
#include "moesh/serve/scheduler.h"
#include "moesh/text/chat.h"
#include "moesh/text/tokenizer.h"
#include "plan_cli.h"
#include "swarm_cli.h"

namespace moesh::cli {
namespace {

struct ServeArgs {
  LoadOptions::Memory memory = LoadOptions::Memory::kAuto;  // --mmap / --no-mmap
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8080;
  int parallel = 4;
  int64_t ctx = 0;
  int threads = 0;
  std::string chat_template;
  int64_t batch_tokens = 256;
  int max_queue = 256;
  std::string api_key;
  std::string admin_key;
  double auto_replan_s = 0;
  double seconds_per_byte = 0;  // 0: the planner's default
  double row_share = 0;         // 0: --calibrate's, else 1 (linear)
  bool calibrate = false;
  std::string alias;
  int http_threads = 0;
  size_t max_body = 4u << 20;
  std::string draft;
  int draft_max = 16;
  bool test_hooks = false;
  SwarmArgs swarm;
};

// Default context per slot: the model's, capped so --parallel slots of a long-context model do
// not reserve gigabytes of KV cache nobody asked for.
constexpr int64_t kDefaultCtxCap = 4096;

int run_serve(const ServeArgs& a) {
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "moesh serve: error: %s\n", st.to_string().c_str());
    return 1;
  };
  // Signals go to a dedicated thread (sigwait) rather than a handler, so stopping may lock and
  // join. They are blocked before any other thread starts, so every thread inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGUSR1);  // our own wake-up of the signal thread at exit
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  auto model = load_model_or_report(a.model, false, "serve", a.memory);
  if (!model) return 1;
  std::unique_ptr<Tokenizer> tok;
  if (model->file().has("tokenizer.ggml.tokens")) {
    auto t = Tokenizer::from_gguf(model->file());
    if (!t) return fail(t.status());
    tok = std::move(*t);
  }
  // A chat template is optional: without one only /v1/completions works. The file's template is
  // parsed here, once; one that does not parse (or an explicit --chat-template that cannot be
  // used) is an error, not a silent fallback to a family that may format prompts differently.
  std::unique_ptr<ChatTemplate> tmpl;
  if (tok) {
    auto ct = ChatTemplate::from_gguf(model->file(), chat_template_spec(*model, a.chat_template, "serve"));
    if (ct) {
      tmpl = std::make_unique<ChatTemplate>(*ct);
    } else if (!a.chat_template.empty()) {
      return fail(ct.status());
    } else if (model->file().has("tokenizer.chat_template")) {
      return fail(Status(ct.status().code(), ct.status().message() +
                                                 " (in the file's tokenizer.chat_template; --chat-template NAME "
                                                 "uses a built-in family instead)"));
    } else {
      std::fprintf(stderr, "moesh serve: no chat template (%s); /v1/chat/completions is disabled\n",
                   ct.status().message().c_str());
    }
  } else if (!a.chat_template.empty()) {
    return fail(make_error(StatusCode::kInvalidArgument, "--chat-template needs a model with a tokenizer"));
  }

  std::shared_ptr<RemoteExecutor> remote;
  if (!open_remote_or_report(*model, a.swarm, "serve", &remote)) return 1;
  std::shared_ptr<SpanClient> spans;
  if (!open_spans_or_report(*model, a.swarm, "serve", a.threads, &spans, remote)) return 1;

  SchedulerOptions so;
  so.n_slots = a.parallel;
  const int64_t n_ctx_model = model->hparams().n_ctx_train > 0 ? model->hparams().n_ctx_train : kDefaultCtxCap;
  so.n_ctx = a.ctx > 0 ? a.ctx : std::min(n_ctx_model, kDefaultCtxCap);
  so.n_threads = a.threads;
  so.executor = remote;
  so.max_batch_tokens = a.batch_tokens;
  so.max_queue = a.max_queue;
  so.draft = a.draft;
  so.draft_max = a.draft_max;
  so.micro_batching = micro_batching_of(a.swarm);
  so.spans = spans;
  auto sched = Scheduler::create(*model, tok.get(), so);
  if (!sched) return fail(sched.status());

  serve::ServerOptions ho;
  ho.host = a.host;
  ho.port = a.port;
  ho.api_key = a.api_key;
  ho.admin_key = a.admin_key;
  ho.auto_replan_s = a.auto_replan_s;
  if (a.seconds_per_byte > 0) ho.plan_costs.seconds_per_byte = a.seconds_per_byte;
  ho.plan_costs.row_share = a.row_share > 0 ? a.row_share : 1.0;
  if (a.calibrate && (a.seconds_per_byte <= 0 || a.row_share <= 0)) {
    // This machine's own costs (its dense parts when the file is a backbone slice), so the plan
    // prices the backbone as measured and its peers at their measured speeds (plan/live.h).
    auto f = gguf::File::open(a.model);
    if (!f) return fail(f.status().with_context("--calibrate"));
    auto pm = plan_model_from_gguf(**f, 0, kDefaultSecondsPerByte);
    if (!pm) return fail(pm.status().with_context("--calibrate"));
    const int threads = a.threads > 0 ? a.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    auto cal = cli::calibrate_costs(a.model, threads, *pm, 8);
    if (!cal) return fail(cal.status().with_context("--calibrate"));
    if (a.seconds_per_byte <= 0) ho.plan_costs.seconds_per_byte = cal->seconds_per_byte;
    if (a.row_share <= 0) ho.plan_costs.row_share = cal->row_share;
    std::fprintf(stderr,
                 "moesh serve: calibrated here%s: %.3f ns per byte (a step of 1 row %.3f ms, of %d rows %.3f ms: each "
                 "more row adds %.2f of one); the plan prices %.3f ns per byte, row share %.2f\n",
                 cal->dense_only ? " (the backbone's dense parts)" : "", cal->seconds_per_byte * 1e9,
                 cal->one_row_s * 1e3, cal->batch, cal->batch_s * 1e3, cal->row_share,
                 ho.plan_costs.seconds_per_byte * 1e9, ho.plan_costs.row_share);
  }
  ho.http_threads = a.http_threads;
  ho.max_body_bytes = a.max_body;
  ho.test_hooks = a.test_hooks;
  ho.model_name = !a.alias.empty() ? a.alias : std::filesystem::path(a.model).filename().string();
  serve::ServeTarget target;
  target.scheduler = sched->get();
  target.model = model.get();
  target.tokenizer = tok.get();
  target.chat_template = tmpl.get();
  target.remote = remote.get();
  target.spans = spans.get();

  auto server = serve::HttpServer::create(target, ho);
  if (!server) return fail(server.status());
  serve::HttpServer* srv = server->get();
  Scheduler* sch = sched->get();
  std::thread sig_thread([sigs, srv, sch] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (sig == SIGUSR1) return;
    std::fprintf(stderr, "moesh serve: signal %d, stopping\n", sig);
    sch->shutdown();
    srv->stop();
  });
  std::fprintf(stderr, "moesh serve: model %s, %d slots x %lld ctx, batch %lld tokens, %s%s\n", ho.model_name.c_str(),
               so.n_slots, static_cast<long long>(sch->n_ctx()), static_cast<long long>(so.max_batch_tokens),
               tmpl ? chat_format_name(tmpl->format()) : "no chat template",
               so.draft.empty() ? "" : fmt::format(", draft {} (up to {})", so.draft, so.draft_max).c_str());
  std::printf("listening on %s:%d\n", ho.host.c_str(), srv->port());
  std::fflush(stdout);
  Status st = srv->run();
  pthread_kill(sig_thread.native_handle(), SIGUSR1);
  sig_thread.join();
  sch->shutdown();
  if (!st.is_ok()) return fail(st);
  std::printf("stopped\n");
  return 0;
}

const CommandRegistrar kRegisterServe{Command{
    "serve", "OpenAI-compatible HTTP server (continuous batching, optional remote experts)",
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<ServeArgs>();
      sub->add_option("-m,--model", a->model, "GGUF model file")->required();
      add_memory_flags(sub, &a->memory);
      sub->add_option("--host", a->host, "Address to listen on")->capture_default_str();
      sub->add_option("--port", a->port, "Port (0: any free port; printed on start)")
          ->check(CLI::Range(0, 65535))
          ->capture_default_str();
      sub->add_option("--parallel", a->parallel, "Slots: sequences decoded together")
          ->check(CLI::Range(1, 256))
          ->capture_default_str();
      sub->add_option("-c,--ctx-size", a->ctx, "Context (cells) per slot (default: model's, at most 4096)");
      sub->add_option("-t,--threads", a->threads, "Compute threads (default: all cores)");
      sub->add_option("--chat-template", a->chat_template,
                      "Chat template instead of the file's: a built-in family (chatml, llama3, deepseek3, ...) "
                      "or Jinja source to execute");
      sub->add_option("--draft", a->draft,
                      "Speculative decoding for every request with this draft source: ngram or nextn (the "
                      "model's NextN/MTP head; same output, "
                      "more tokens per forward pass; usage reports accepted drafts)");
      sub->add_option("--draft-max", a->draft_max, "Most drafts a request verifies per step")
          ->check(CLI::Range(0, 256))
          ->capture_default_str();
      sub->add_option("--batch-tokens", a->batch_tokens, "Tokens per forward pass (decode first, then prefill)")
          ->check(CLI::Range(1, 1 << 20))
          ->capture_default_str();
      sub->add_option("--max-queue", a->max_queue, "Waiting requests beyond this get 503")
          ->check(CLI::Range(0, 1 << 20))
          ->capture_default_str();
      sub->add_option("--api-key", a->api_key, "Require 'Authorization: Bearer KEY' on /v1/*");
      sub->add_option("--admin-key", a->admin_key,
                      "Offer POST /swarm/spans/move (move a span to another peer or here while serving) to "
                      "'Authorization: Bearer KEY'; without it that route answers 403");
      sub->add_option("--auto-replan", a->auto_replan_s,
                      "Every SECONDS, carry out the dashboard's re-plan when it is worth its moves: the span peers "
                      "load the blocks they are given (SPAN_HOLD), then one resplit; peers given experts get copies "
                      "of those they lack (STORE; they need --replica-dir). Without --span: experts only (0: advice "
                      "only)")
          ->check(CLI::Range(0.0, 86400.0))
          ->capture_default_str();
      sub->add_option("--seconds-per-byte", a->seconds_per_byte,
                      "Compute cost per weight byte the plan card and the re-plan price (e.g. what `moesh swarm plan "
                      "--calibrate` measured on a peer's machine; default 0.25 ns)")
          ->check(CLI::Range(1e-15, 1e-3));
      sub->add_option("--row-share", a->row_share,
                      "Of one row's compute, what each more row of a step adds in the plan card and the re-plan "
                      "(default: --calibrate's, else 1: linear)")
          ->check(CLI::Range(0.01, 2.0));
      sub->add_flag("--calibrate", a->calibrate,
                    "Measure this machine's compute cost per byte and row share at start (its dense parts when "
                    "the file is a backbone slice) and price the plan card and re-plans with them; peers are then "
                    "priced at their measured speeds in absolute terms");
      sub->add_option("--alias", a->alias, "Model name reported by the API (default: file name)");
      sub->add_option("--http-threads", a->http_threads,
                      "HTTP threads = most concurrent connections (default: max(64, 4*parallel+16))");
      sub->add_option("--max-body", a->max_body, "Largest request body in bytes (413 beyond)")->capture_default_str();
      sub->add_flag("--test-hooks", a->test_hooks,
                    "Tests only: accept 'moesh_scripted_output' (the text a chat answer starts with)");
      add_swarm_options(sub, &a->swarm);
      return [a] { return run_serve(*a); };
    }}};

}  // namespace
}  // namespace moesh::cli
