// The HTTP gateway of `moesh serve`: OpenAI-compatible routes on cpp-httplib, feeding the
// Scheduler and streaming its events back as Server-Sent Events (docs/serve.md).
//
// Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
// GET /metrics. Unknown paths are 404, a known path with the wrong method 405, a body over
// max_body_bytes 413, a full scheduler queue 503; every error has OpenAI's error body.
//
// Threads: cpp-httplib runs each connection on a pool thread, and a streaming response keeps its
// thread for the whole generation (its chunked content provider blocks on the request's event
// queue), so the pool is sized for the number of concurrent clients, not for the cores. The HTTP
// threads never touch the model: they tokenize, submit to the Scheduler, and wait for events.
//
// A client that goes away mid-stream makes the next chunk write fail; the request is then
// cancelled at once, so its slot is freed for the queue (also when the response is dropped before
// streaming began: the content provider's releaser cancels it).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "moesh/model/model.h"
#include "moesh/plan/swarm_plan.h"
#include "moesh/remote/remote.h"
#include "moesh/remote/span_client.h"
#include "moesh/serve/scheduler.h"
#include "moesh/text/chat.h"
#include "moesh/text/tokenizer.h"
#include "moesh/util/status.h"

namespace moesh::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                   // 0: any free port (see HttpServer::port())
  std::string model_name = "moesh";  // reported by /v1/models and in every response
  std::string api_key;               // non-empty: /v1/* need "Authorization: Bearer <key>"
  // Non-empty: POST /swarm/spans/move (re-planning while serving) with "Authorization: Bearer
  // <key>"; empty: that route answers 403 (it sends hidden states wherever it is told).
  std::string admin_key;
  size_t max_body_bytes = 4u << 20;  // larger bodies get 413
  int http_threads = 0;              // <= 0: max(64, 4 * slots + 16)
  int io_timeout_s = 30;             // socket read/write timeout of a connection
  // Test hooks (`--test-hooks`): chat requests may carry moesh_scripted_output, the text the
  // generation starts with (openai_api.h). Off: such requests get 400.
  bool test_hooks = false;
  // `--auto-replan S`: every S seconds the gateway carries out its own re-plan of its spans when
  // worth it (serve/auto_replan.h); 0: the re-plan is advice on the dashboard only.
  double auto_replan_s = 0;
  // The compute costs the plan card and the re-plan price (`--seconds-per-byte`, `--row-share`).
  PlanCosts plan_costs;
};

// What the gateway serves. Everything must outlive the HttpServer.
struct ServeTarget {
  Scheduler* scheduler = nullptr;
  const Model* model = nullptr;
  const Tokenizer* tokenizer = nullptr;         // null: token-id prompts only, no text out
  const ChatTemplate* chat_template = nullptr;  // null: /v1/chat/completions answers 400
  RemoteExecutor* remote = nullptr;             // null: no per-worker metrics (and no worker added live)
  SpanClient* spans = nullptr;                  // null: no span peers (the dashboard's plan card, moves)
};

class HttpServer {
 public:
  // Sets up the routes and binds the listening socket (so port() is known before run()).
  static Result<std::unique_ptr<HttpServer>> create(const ServeTarget& target, const ServerOptions& opts);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Serves until stop(); returns an error if the listener failed.
  Status run();
  // Thread-safe, idempotent. Streams in progress end (without [DONE]); call
  // Scheduler::shutdown() first to have them finish with a cancelled event instead.
  void stop();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moesh::serve
