// The OpenAI-compatible HTTP API of `moesh serve`, as pure functions: request bodies in,
// validated requests out; results in, response / SSE chunk JSON out (docs/serve.md).
//
// Nothing here touches the network or the model, so every rule (which fields exist, their types
// and ranges, what is unsupported, the exact response shapes) is unit-tested on its own
// (tests/serve/test_openai_api.cpp). The HTTP layer (http_server.cpp) only glues these to the
// Scheduler.
//
// Errors follow OpenAI's body shape {"error":{"message","type","param","code"}}; every problem
// with a body is a 400 naming the offending field in `param`.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moesh/model/sampling.h"
#include "moesh/serve/scheduler.h"
#include "moesh/text/chat.h"
#include "moesh/util/status.h"
#include "serve/chat_output.h"

namespace moesh::serve {

enum class Endpoint { kCompletions, kChatCompletions };

// One error response: HTTP status plus the OpenAI error object.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" is written as null
  std::string code;   // "" is written as null
};

nlohmann::json error_json(const ApiError& e);
// Maps a Status (from the scheduler, tokenizer, chat template) to an error response:
// kUnavailable -> 503 (queue full), kInvalidArgument/kOutOfRange/kTypeMismatch/kUnsupported ->
// 400, anything else -> 500.
ApiError api_error_from_status(const Status& st, std::string param = {});

// Defaults when a field is absent (OpenAI's, except max_tokens for chat which is "the rest of
// the context" and is decided by the caller).
inline constexpr int32_t kDefaultCompletionMaxTokens = 16;
inline constexpr float kDefaultTemperature = 1.0f;
inline constexpr size_t kMaxStopStrings = 16;

// tool_choice: "auto" (default: the model may call a tool), "none" (tools are neither shown to
// the template nor parsed out), "required" or {"type":"function","function":{"name":..}} (a
// named function must be one of `tools`, and the template sees only that one); the last two are
// enforced by constrained decoding over the template family's call syntax (serve/tool_grammar.h).
enum class ToolChoice { kAuto, kNone, kRequired, kFunction };

// response_format: kText (none), {"type":"json_object"} (any JSON object), {"type":"json_schema"}
// (a value matching ApiRequest::json_schema); both by constrained decoding (json_constraint.h).
enum class ResponseFormat { kText, kJsonObject, kJsonSchema };
inline constexpr int kMaxChoices = 16;  // n

// A validated /v1/completions or /v1/chat/completions request.
struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // as sent ("" when absent); a single model is served
  // completions: the prompt as text, or as token ids when prompt_is_tokens
  bool prompt_is_tokens = false;
  std::string prompt;
  std::vector<int32_t> prompt_tokens;
  std::vector<ChatMessage> messages;                    // chat; each keeps its object as sent (ChatMessage::fields)
  nlohmann::ordered_json template_variables = nullptr;  // chat_template_kwargs: an object or null
  std::optional<int32_t> max_tokens;                    // max_tokens / max_completion_tokens (>= 1)
  SamplingParams sampling;                              // temp defaults to kDefaultTemperature
  bool seed_given = false;                              // else the caller draws a random seed
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // extension (llama.cpp server): generate past EOS
  // chat: `tools` as sent (an array of {"type":"function","function":{name, description?,
  // parameters?, strict?}}, validated) or null; what the template sees after tool_choice.
  nlohmann::ordered_json tools = nullptr;
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;     // kFunction
  bool parallel_tool_calls = true;  // a forced call may be followed by more calls
  // Test hook (`moesh serve --test-hooks` only; the HTTP layer refuses it otherwise): the
  // generated text starts with this text, whatever the model would have sampled, so tests of
  // tool calls and reasoning get a known output from a random-weight model.
  std::optional<std::string> scripted_output;
  int n = 1;              // choices, each sampled with seed + index
  int top_logprobs = -1;  // -1: no logprobs; else the alternatives per token (GenerationRequest)
  ResponseFormat response_format = ResponseFormat::kText;
  nlohmann::ordered_json json_schema = nullptr;  // kJsonSchema: the schema ({} = any value)
};

// Parses and validates a body. On failure returns the Status and fills *error (status 400, the
// field in param, a code such as "invalid_type", "invalid_value", "missing_required_parameter",
// "unsupported_value", "invalid_json").
Result<ApiRequest> parse_request(Endpoint ep, std::string_view body, ApiError* error);

// What a finished (or finishing) generation reports.
struct CompletionResult {
  std::string id;       // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
  std::string text;  // completions: the text; chat: the content (outside reasoning and calls)
  FinishReason finish = FinishReason::kStop;
  Usage usage;
  // chat: what the output parser (chat_output.h) took out of the text.
  std::string reasoning;  // "reasoning_content", left out when empty
  std::vector<ToolCall> tool_calls;
  int index = 0;                      // the choice (n > 1)
  nlohmann::json logprobs = nullptr;  // the choice's "logprobs" (logprobs_json), null when not asked
};

// The "logprobs" of a choice for these tokens: chat {"content": [{token, logprob, bytes,
// top_logprobs}], "refusal": null}; completions {"tokens", "token_logprobs", "top_logprobs",
// "text_offset"} with offsets from text_offset0. Token texts are the tokens' bytes (invalid UTF-8
// replaced in "token"; "bytes" keeps them).
nlohmann::json logprobs_json(Endpoint ep, const std::vector<TokenLogprob>& lps, const Tokenizer* tok,
                             size_t text_offset0 = 0);
// Appends b's entries to a (both from logprobs_json for the same endpoint; a may be null).
void append_logprobs(nlohmann::json& a, const nlohmann::json& b);

// OpenAI's finish_reason: "stop" or "length" ("stop" also covers a cancelled request, which no
// client sees; errors are reported as error bodies, not finish reasons).
const char* openai_finish_reason(FinishReason r);
// "tool_calls" when the result holds calls and did not run out of tokens, else as above.
const char* openai_finish_reason(const CompletionResult& r);
nlohmann::json usage_json(const Usage& u);

// Non-streaming responses: "text_completion" / "chat.completion". With several choices (n > 1)
// the id, created and model are the first's; usage counts the prompt once and every choice's
// completion tokens.
nlohmann::json completion_response(Endpoint ep, const CompletionResult& r);
nlohmann::json completion_response(Endpoint ep, const std::vector<CompletionResult>& choices);

// Streaming chunks ("text_completion" / "chat.completion.chunk"). When include_usage is on,
// every chunk carries "usage": null and usage_chunk() adds the final one with empty choices.
nlohmann::json role_chunk(const CompletionResult& r, bool include_usage);  // chat only
nlohmann::json text_chunk(Endpoint ep, const CompletionResult& r, std::string_view text, bool include_usage);
// The chunks for one parser delta (chat only): reasoning, then content, then each call as a
// chunk with index/id/type/name and empty arguments followed by chunks with its argument
// fragments (the client concatenates them). None when the delta is empty.
std::vector<nlohmann::json> delta_chunks(const CompletionResult& r, const OutputDelta& d, bool include_usage);
nlohmann::json finish_chunk(Endpoint ep, const CompletionResult& r, bool include_usage);
nlohmann::json usage_chunk(Endpoint ep, const CompletionResult& r);

// "data: <json>\n\n" (invalid UTF-8 replaced, never throws).
std::string sse_event(const nlohmann::json& j);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";
// Compact dump that replaces invalid UTF-8 instead of throwing.
std::string dump_json(const nlohmann::json& j);

// GET /v1/models.
nlohmann::json models_response(const std::string& model, int64_t created);

}  // namespace moesh::serve
