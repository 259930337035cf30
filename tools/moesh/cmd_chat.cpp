// `moesh chat --url http://HOST:PORT [MESSAGE]`: a small OpenAI-API client for `moesh serve`.
//
// With a MESSAGE it sends one chat request (streamed by default, printing the answer as it
// arrives) and exits; without one it reads user turns from stdin and keeps the conversation, so a
// gateway's prefix cache and slot affinity get exercised the way a chat UI would. --summary adds
// the request's usage and speed and, from the gateway's /metrics, the swarm traffic it caused
// (dispatch round trips and wire bytes per token per MoE layer). docs/chat.md.
#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "command.h"
#include "moesh/util/status.h"

namespace moesh::cli {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct ChatArgs {
  std::string url = "http://127.0.0.1:8080";
  std::string message, system, api_key;
  int max_tokens = 64;
  float temp = 0.0f;
  int64_t seed = -1;
  bool no_stream = false;
  bool summary = false;
  int timeout_s = 120;
};

// Sum of every sample of each metric family in a Prometheus text page (labels ignored).
std::map<std::string, double> scrape_totals(const std::string& text) {
  std::map<std::string, double> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t e = text.find('\n', i);
    if (e == std::string::npos) e = text.size();
    const std::string line = text.substr(i, e - i);
    i = e + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    const size_t val = line.rfind(' ');
    if (name_end == std::string::npos || val == std::string::npos) continue;
    try {
      out[line.substr(0, name_end)] += std::stod(line.substr(val + 1));
    } catch (...) {
      // a malformed sample line is skipped, not fatal: the summary is best effort
    }
  }
  return out;
}

struct Turn {
  std::string text;
  json usage;
  std::string finish;
  double ttft_s = 0, total_s = 0;
  int chunks = 0;
};

class Client {
 public:
  explicit Client(const ChatArgs& a) : a_(a), cli_(a.url) {
    cli_.set_connection_timeout(5, 0);
    cli_.set_read_timeout(a.timeout_s, 0);
    cli_.set_write_timeout(a.timeout_s, 0);
    if (!a.api_key.empty()) cli_.set_bearer_token_auth(a.api_key);
  }
  bool valid() const { return cli_.is_valid(); }

  Result<Turn> send(const json& messages, bool echo) {
    json body = {{"model", "moesh"},
                 {"messages", messages},
                 {"max_tokens", a_.max_tokens},
                 {"temperature", a_.temp},
                 {"stream", !a_.no_stream}};
    if (a_.seed >= 0) body["seed"] = a_.seed;
    if (!a_.no_stream) body["stream_options"] = {{"include_usage", true}};
    Turn turn;
    const auto t0 = Clock::now();
    if (a_.no_stream) {
      auto res = cli_.Post("/v1/chat/completions", body.dump(), "application/json");
      if (!res) return make_error(StatusCode::kUnavailable, "{}: {}", a_.url, httplib::to_string(res.error()));
      auto j = json::parse(res->body, nullptr, false);
      if (res->status != 200 || j.is_discarded()) {
        return make_error(StatusCode::kUnavailable, "HTTP {}: {}", res->status, res->body);
      }
      turn.text = j["choices"][0]["message"]["content"].get<std::string>();
      turn.finish = j["choices"][0].value("finish_reason", "");
      turn.usage = j.value("usage", json::object());
      turn.total_s = turn.ttft_s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (echo) std::printf("%s", turn.text.c_str());
      return turn;
    }
    std::string buf, err_body;
    bool first = true;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.set_header("Accept", "text/event-stream");
    int status = 0;
    req.response_handler = [&](const httplib::Response& r) {
      status = r.status;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (status != 200) {
        err_body.append(data, n);
        return true;
      }
      buf.append(data, n);
      size_t end;
      while ((end = buf.find("\n\n")) != std::string::npos) {
        const std::string event = buf.substr(0, end);
        buf.erase(0, end + 2);
        if (event.rfind("data: ", 0) != 0) continue;
        const std::string payload = event.substr(6);
        if (payload == "[DONE]") continue;
        auto j = json::parse(payload, nullptr, false);
        if (j.is_discarded()) continue;
        if (j.contains("usage") && j["usage"].is_object()) turn.usage = j["usage"];
        if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) continue;
        const json& c = j["choices"][0];
        if (c.contains("finish_reason") && c["finish_reason"].is_string()) turn.finish = c["finish_reason"];
        if (c.contains("delta") && c["delta"].contains("content") && c["delta"]["content"].is_string()) {
          const std::string piece = c["delta"]["content"];
          if (piece.empty()) continue;
          if (first) {
            turn.ttft_s = std::chrono::duration<double>(Clock::now() - t0).count();
            first = false;
          }
          ++turn.chunks;
          turn.text += piece;
          if (echo) {
            std::fwrite(piece.data(), 1, piece.size(), stdout);
            std::fflush(stdout);
          }
        }
      }
      return true;
    };
    httplib::Response res;
    httplib::Error e = httplib::Error::Success;
    if (!cli_.send(req, res, e)) {
      return make_error(StatusCode::kUnavailable, "{}: {}", a_.url, httplib::to_string(e));
    }
    if (status != 200) return make_error(StatusCode::kUnavailable, "HTTP {}: {}", status, err_body);
    turn.total_s = std::chrono::duration<double>(Clock::now() - t0).count();
    return turn;
  }

  std::optional<std::map<std::string, double>> metrics() {
    auto res = cli_.Get("/metrics");
    if (!res || res->status != 200) return std::nullopt;
    return scrape_totals(res->body);
  }

 private:
  const ChatArgs& a_;
  httplib::Client cli_;
};

void print_summary(const Turn& t, const std::optional<std::map<std::string, double>>& before,
                   const std::optional<std::map<std::string, double>>& after) {
  const int64_t completion = t.usage.value("completion_tokens", 0);
  const int64_t prompt = t.usage.value("prompt_tokens", 0);
  int64_t cached = 0;
  if (t.usage.contains("prompt_tokens_details") && t.usage["prompt_tokens_details"].is_object()) {
    cached = t.usage["prompt_tokens_details"].value("cached_tokens", 0);
  }
  const double gen_s = t.total_s - t.ttft_s;
  std::printf("summary: prompt %lld tokens (%lld from the prefix cache), answer %lld tokens, finish %s\n",
              static_cast<long long>(prompt), static_cast<long long>(cached), static_cast<long long>(completion),
              t.finish.c_str());
  std::printf("summary: first token after %.1f ms, %.1f tok/s after it, %.2f s in all\n", t.ttft_s * 1e3,
              completion > 1 && gen_s > 0 ? (completion - 1) / gen_s : 0.0, t.total_s);
  if (!before || !after) return;
  auto get = [](const std::map<std::string, double>& m, const char* name) {
    auto it = m.find(name);
    return it == m.end() ? 0.0 : it->second;
  };
  auto delta = [&](const char* name) { return get(*after, name) - get(*before, name); };
  const double calls = delta("moesh_remote_layer_calls_total");
  const double token_layers = delta("moesh_remote_token_layers_total");
  const double sent = delta("moesh_worker_bytes_sent_total");
  const double recv = delta("moesh_worker_bytes_received_total");
  const double reqs = delta("moesh_worker_dispatches_total");
  if (reqs <= 0) {
    std::printf("summary: no remote dispatches (every expert ran on the gateway)\n");
    return;
  }
  std::printf("summary: %.0f MoE-layer round trips (%.0f worker requests), %.1f tokens per trip\n", calls, reqs,
              calls > 0 ? token_layers / calls : 0.0);
  std::printf("summary: wire bytes per token per layer: %.0f dispatch + %.0f combine = %.0f\n",
              token_layers > 0 ? sent / token_layers : 0.0, token_layers > 0 ? recv / token_layers : 0.0,
              token_layers > 0 ? (sent + recv) / token_layers : 0.0);
}

int run_chat(const ChatArgs& a) {
  Client client(a);
  if (!client.valid()) {
    std::fprintf(stderr, "moesh chat: error: '%s' is not a usable URL (http://HOST:PORT)\n", a.url.c_str());
    return 2;
  }
  json messages = json::array();
  if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
  const bool once = !a.message.empty();
  std::string line;
  while (true) {
    std::string user = a.message;
    if (!once) {
      std::printf("> ");
      std::fflush(stdout);
      if (!std::getline(std::cin, line)) break;
      if (line.empty()) continue;
      user = line;
    }
    messages.push_back({{"role", "user"}, {"content", user}});
    auto before = a.summary ? client.metrics() : std::nullopt;
    auto turn = client.send(messages, /*echo=*/true);
    if (!turn) {
      std::fprintf(stderr, "\nmoesh chat: error: %s\n", turn.status().message().c_str());
      return 1;
    }
    std::printf("\n");
    if (a.summary) print_summary(*turn, before, client.metrics());
    messages.push_back({{"role", "assistant"}, {"content", turn->text}});
    if (once) break;
  }
  return 0;
}

CommandRegistrar kRegisterChat{
    Command{"chat", "Talk to a `moesh serve` gateway (OpenAI chat API, streamed)", [](CLI::App* sub) {
              auto a = std::make_shared<ChatArgs>();
              sub->add_option("message", a->message, "One user message (omit: read turns from stdin)");
              sub->add_option("--url", a->url, "Gateway base URL")->capture_default_str();
              sub->add_option("-s,--system", a->system, "System message");
              sub->add_option("-n,--max-tokens", a->max_tokens, "Most tokens per answer")->capture_default_str();
              sub->add_option("--temp", a->temp, "Temperature (0: greedy)")->capture_default_str();
              sub->add_option("--seed", a->seed, "Sampling seed");
              sub->add_option("--api-key", a->api_key, "Bearer token, when the gateway wants one");
              sub->add_option("--timeout", a->timeout_s, "Seconds to wait for the answer")->capture_default_str();
              sub->add_flag("--no-stream", a->no_stream, "One JSON response instead of SSE");
              sub->add_flag("--summary", a->summary, "Print usage, speed and the swarm traffic of each answer");
              return [a] { return run_chat(*a); };
            }}};

}  // namespace
}  // namespace moesh::cli
