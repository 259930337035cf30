// OpenAI request parsing/validation, response and SSE chunk shapes, and the Prometheus
// exposition of `moesh serve` — the pure parts of the gateway (src/serve/openai_api.h, metrics.h).
#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "serve/metrics.h"
#include "serve/openai_api.h"

namespace moesh::serve {
namespace {

using nlohmann::json;

ApiRequest parse_ok(Endpoint ep, const std::string& body) {
  ApiError err;
  auto r = parse_request(ep, body, &err);
  EXPECT_TRUE(r.is_ok()) << body << " -> " << r.status().to_string();
  return r.is_ok() ? *r : ApiRequest{};
}

ApiError parse_err(Endpoint ep, const std::string& body) {
  ApiError err;
  auto r = parse_request(ep, body, &err);
  EXPECT_FALSE(r.is_ok()) << body;
  return err;
}

TEST(OpenAiUsage, DraftTokensUseOpenAisPredictionFields) {
  Usage u;
  u.prompt_tokens = 10;
  u.completion_tokens = 20;
  u.cached_tokens = 4;
  json j = usage_json(u);
  EXPECT_EQ(j["total_tokens"], 30);
  EXPECT_EQ(j["prompt_tokens_details"]["cached_tokens"], 4);
  EXPECT_FALSE(j.contains("completion_tokens_details")) << "no drafting, no prediction fields";
  u.draft_tokens = 12;
  u.accepted_draft_tokens = 9;
  j = usage_json(u);
  EXPECT_EQ(j["completion_tokens_details"]["accepted_prediction_tokens"], 9);
  EXPECT_EQ(j["completion_tokens_details"]["rejected_prediction_tokens"], 3);
}

TEST(OpenAiParse, CompletionAllFields) {
  const ApiRequest r = parse_ok(Endpoint::kCompletions, R"({
    "model": "m", "prompt": "Hello", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
    "top_k": 12, "min_p": 0.05, "presence_penalty": 0.25, "frequency_penalty": -0.5,
    "repeat_penalty": 1.1, "seed": 42, "stop": ["\n", "END"], "stream": true,
    "stream_options": {"include_usage": true}, "n": 1, "echo": false, "ignore_eos": true})");
  EXPECT_EQ(r.model, "m");
  EXPECT_FALSE(r.prompt_is_tokens);
  EXPECT_EQ(r.prompt, "Hello");
  ASSERT_TRUE(r.max_tokens.has_value());
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temp, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 12);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 0.25f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.sampling.repeat_penalty, 1.1f);
  EXPECT_TRUE(r.seed_given);
  EXPECT_EQ(r.sampling.seed, 42u);
  ASSERT_EQ(r.stop.size(), 2u);
  EXPECT_EQ(r.stop[1], "END");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.ignore_eos);
}

TEST(OpenAiParse, Defaults) {
  const ApiRequest r = parse_ok(Endpoint::kCompletions, R"({"prompt": "x"})");
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FLOAT_EQ(r.sampling.temp, kDefaultTemperature);
  EXPECT_FALSE(r.seed_given);
  EXPECT_FALSE(r.stream);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FLOAT_EQ(r.sampling.top_p, 1.0f);
  // null means absent, as OpenAI clients send it
  const ApiRequest n =
      parse_ok(Endpoint::kCompletions, R"({"prompt": "x", "max_tokens": null, "stop": null, "seed": null})");
  EXPECT_FALSE(n.max_tokens.has_value());
  EXPECT_FALSE(n.seed_given);
}

TEST(OpenAiParse, PromptForms) {
  const ApiRequest a = parse_ok(Endpoint::kCompletions, R"({"prompt": [1, 2, 300]})");
  EXPECT_TRUE(a.prompt_is_tokens);
  EXPECT_EQ(a.prompt_tokens, (std::vector<int32_t>{1, 2, 300}));
  const ApiRequest b = parse_ok(Endpoint::kCompletions, R"({"prompt": [[5, 6]]})");
  EXPECT_EQ(b.prompt_tokens, (std::vector<int32_t>{5, 6}));
  const ApiRequest c = parse_ok(Endpoint::kCompletions, R"({"prompt": ["only one"]})");
  EXPECT_FALSE(c.prompt_is_tokens);
  EXPECT_EQ(c.prompt, "only one");
  const ApiRequest s = parse_ok(Endpoint::kCompletions, R"({"prompt": "x", "stop": "###"})");
  EXPECT_EQ(s.stop, (std::vector<std::string>{"###"}));
  const ApiRequest neg = parse_ok(Endpoint::kCompletions, R"({"prompt": "x", "seed": -1})");
  EXPECT_EQ(neg.sampling.seed, UINT64_MAX);
}

TEST(OpenAiParse, ChatMessagesAndMaxCompletionTokens) {
  const ApiRequest r = parse_ok(Endpoint::kChatCompletions, R"({
    "messages": [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
                 {"role": "assistant", "content": null}],
    "max_tokens": 5, "max_completion_tokens": 9})");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "Be brief.");
  EXPECT_EQ(r.messages[1].content, "Hi there");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(*r.max_tokens, 9);  // max_completion_tokens wins
}

// Each message keeps its object as sent, keys in the order sent, for the model's Jinja template
// (tool_calls, reasoning_content, tool_call_id; `tojson` must match transformers); the
// chat_template_kwargs object becomes template variables.
TEST(OpenAiParse, ChatMessagesKeepTheirFieldsInOrder) {
  const ApiRequest r = parse_ok(Endpoint::kChatCompletions, R"({
    "messages": [{"role": "user", "content": "Weather?"},
                 {"role": "assistant", "reasoning_content": "use the tool", "content": null,
                  "tool_calls": [{"id": "c1", "type": "function",
                                  "function": {"name": "get", "arguments": "{\"z\": 1, \"a\": 2}"}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
    "chat_template_kwargs": {"enable_thinking": false, "b": 1, "a": 2}})");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1].fields.dump(),
            R"({"role":"assistant","reasoning_content":"use the tool","content":null,"tool_calls":[{"id":"c1",)"
            R"("type":"function","function":{"name":"get","arguments":"{\"z\": 1, \"a\": 2}"}}]})");
  EXPECT_EQ(r.messages[2].role, "tool");
  EXPECT_EQ(r.messages[2].fields["tool_call_id"], "c1");
  EXPECT_EQ(r.template_variables.dump(), R"({"enable_thinking":false,"b":1,"a":2})");
  const ApiError role = parse_err(Endpoint::kChatCompletions, R"({"messages": [{"role": "wizard", "content": "x"}]})");
  EXPECT_EQ(role.param, "messages[0].role");
  EXPECT_EQ(role.code, "invalid_value");
  const ApiError e = parse_err(Endpoint::kChatCompletions,
                               R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": [1]})");
  EXPECT_EQ(e.param, "chat_template_kwargs");
  EXPECT_EQ(e.code, "invalid_type");
}

struct BadCase {
  Endpoint ep;
  const char* body;
  const char* param;
  const char* code;
};

TEST(OpenAiParse, ErrorsNameTheField) {
  const BadCase cases[] = {
      {Endpoint::kCompletions, "{not json", "", "invalid_json"},
      {Endpoint::kCompletions, "[1,2]", "", "invalid_type"},
      {Endpoint::kCompletions, R"({})", "prompt", "missing_required_parameter"},
      {Endpoint::kCompletions, R"({"prompt": 5})", "prompt", "invalid_type"},
      {Endpoint::kCompletions, R"({"prompt": ""})", "prompt", "invalid_value"},
      {Endpoint::kCompletions, R"({"prompt": []})", "prompt", "invalid_value"},
      {Endpoint::kCompletions, R"({"prompt": [1, "a"]})", "prompt", "invalid_type"},
      {Endpoint::kCompletions, R"({"prompt": [1, -3]})", "prompt", "invalid_value"},
      {Endpoint::kCompletions, R"({"prompt": ["a", "b"]})", "prompt", "unsupported_value"},
      {Endpoint::kCompletions, R"({"prompt": "x", "max_tokens": "10"})", "max_tokens", "invalid_type"},
      {Endpoint::kCompletions, R"({"prompt": "x", "max_tokens": 1.5})", "max_tokens", "invalid_type"},
      {Endpoint::kCompletions, R"({"prompt": "x", "max_tokens": 0})", "max_tokens", "invalid_value"},
      {Endpoint::kCompletions, R"({"prompt": "x", "temperature": "hot"})", "temperature", "invalid_type"},
      {Endpoint::kCompletions, R"({"prompt": "x", "temperature": 3})", "temperature", "invalid_value"},
      {Endpoint::kCompletions, R"({"prompt": "x", "top_p": 0})", "top_p", "invalid_value"},
      {Endpoint::kCompletions, R"({"prompt": "x", "top_k": 2.5})", "top_k", "invalid_type"},
      {Endpoint::kCompletions, R"({"prompt": "x", "presence_penalty": 2.5})", "presence_penalty", "invalid_value"},
      {Endpoint::kCompletions, R"({"prompt": "x", "repeat_penalty": 0})", "repeat_penalty", "invalid_value"},
      {Endpoint::kCompletions, R"({"prompt": "x", "seed": "7"})", "seed", "invalid_type"},
      {Endpoint::kCompletions, R"({"prompt": "x", "stop": 3})", "stop", "invalid_type"},
      {Endpoint::kCompletions, R"({"prompt": "x", "stop": ["a", 1]})", "stop", "invalid_type"},
      {Endpoint::kCompletions, R"({"prompt": "x", "stop": [""]})", "stop", "invalid_value"},
      {Endpoint::kCompletions, R"({"prompt": "x", "stream": "yes"})", "stream", "invalid_type"},
      {Endpoint::kCompletions, R"({"prompt": "x", "stream_options": {"include_usage": 1}})",
       "stream_options.include_usage", "invalid_type"},
      {Endpoint::kCompletions, R"({"prompt": "x", "n": 17})", "n", "invalid_value"},
      {Endpoint::kCompletions, R"({"prompt": "x", "n": 0})", "n", "invalid_value"},
      {Endpoint::kCompletions, R"({"prompt": "x", "logprobs": 6})", "logprobs", "invalid_value"},
      {Endpoint::kCompletions, R"({"prompt": "x", "logprobs": true})", "logprobs", "invalid_type"},
      {Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",
       "top_logprobs", "invalid_value"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})", "top_logprobs",
       "invalid_value"},
      {Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 1})", "logprobs",
       "invalid_type"},
      {Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}], "response_format": 1})",
       "response_format", "invalid_type"},
      {Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}], "response_format": {}})",
       "response_format.type", "missing_required_parameter"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}})",
       "response_format.type", "invalid_value"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}})",
       "response_format.json_schema", "missing_required_parameter"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {}}})",
       "response_format.json_schema.name", "missing_required_parameter"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": 3}}})",
       "response_format.json_schema.schema", "invalid_type"},
      {Endpoint::kCompletions, R"({"prompt": "x", "echo": true})", "echo", "unsupported_value"},
      {Endpoint::kCompletions, R"({"prompt": "x", "model": 3})", "model", "invalid_type"},
      {Endpoint::kChatCompletions, R"({"prompt": "x"})", "messages", "missing_required_parameter"},
      {Endpoint::kChatCompletions, R"({"messages": {}})", "messages", "invalid_type"},
      {Endpoint::kChatCompletions, R"({"messages": []})", "messages", "invalid_value"},
      {Endpoint::kChatCompletions, R"({"messages": [{"content": "x"}]})", "messages[0].role",
       "missing_required_parameter"},
      {Endpoint::kChatCompletions, R"({"messages": [{"role": 1, "content": "x"}]})", "messages[0].role",
       "invalid_type"},
      {Endpoint::kChatCompletions, R"({"messages": [{"role": "user"}]})", "messages[0].content",
       "missing_required_parameter"},
      {Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": 4}]})", "messages[0].content",
       "invalid_type"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
       "messages[0].content[0].type", "unsupported_value"},
      {Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1})",
       "max_completion_tokens", "invalid_value"},
  };
  for (const BadCase& c : cases) {
    const ApiError e = parse_err(c.ep, c.body);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error") << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_EQ(e.code, c.code) << c.body;
    EXPECT_FALSE(e.message.empty()) << c.body;
  }
}

// Random bytes and mutated valid bodies: parsing never crashes and always decides.
TEST(OpenAiParse, FuzzedBodiesNeverCrash) {
  std::mt19937 rng(1234);
  const std::string valid =
      R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stop":["a"],"temperature":0.2})";
  int accepted = 0, rejected = 0;
  for (int it = 0; it < 3000; ++it) {
    std::string body = valid;
    const int n_mut = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < n_mut; ++m) {
      const size_t pos = rng() % body.size();
      switch (rng() % 3) {
        case 0:
          body[pos] = static_cast<char>(rng() % 256);
          break;
        case 1:
          body.erase(pos, 1);
          break;
        default:
          body.insert(pos, 1, "{}[]\",:0-e"[rng() % 10]);
          break;
      }
    }
    ApiError err;
    auto r = parse_request(Endpoint::kChatCompletions, body, &err);
    if (r.is_ok()) {
      ++accepted;
    } else {
      ++rejected;
      EXPECT_EQ(err.http_status, 400);
      EXPECT_FALSE(err.message.empty());
    }
  }
  // Not degenerate: some mutations keep the body valid (e.g. inside the content string),
  // most break it.
  EXPECT_GT(accepted, 20);
  EXPECT_GT(rejected, 1000);
}

TEST(OpenAiResponse, ErrorBody) {
  ApiError e;
  e.message = "bad";
  e.param = "max_tokens";
  e.code = "invalid_value";
  const json j = error_json(e);
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "max_tokens");
  EXPECT_EQ(j["error"]["code"], "invalid_value");
  ApiError bare;
  bare.message = "x";
  EXPECT_TRUE(error_json(bare)["error"]["param"].is_null());
  EXPECT_TRUE(error_json(bare)["error"]["code"].is_null());

  EXPECT_EQ(api_error_from_status(Status(StatusCode::kUnavailable, "queue full")).http_status, 503);
  EXPECT_EQ(api_error_from_status(Status(StatusCode::kOutOfRange, "too long")).http_status, 400);
  EXPECT_EQ(api_error_from_status(Status(StatusCode::kInternal, "bug")).http_status, 500);
}

CompletionResult sample_result() {
  CompletionResult r;
  r.id = "chatcmpl-1";
  r.created = 1700000000;
  r.model = "tiny";
  r.text = "héllo";
  r.finish = FinishReason::kLength;
  r.usage.prompt_tokens = 11;
  r.usage.completion_tokens = 4;
  r.usage.cached_tokens = 3;
  return r;
}

TEST(OpenAiResponse, NonStreamingShapes) {
  const CompletionResult r = sample_result();
  const json chat = completion_response(Endpoint::kChatCompletions, r);
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["id"], "chatcmpl-1");
  EXPECT_EQ(chat["created"], 1700000000);
  EXPECT_EQ(chat["model"], "tiny");
  ASSERT_EQ(chat["choices"].size(), 1u);
  EXPECT_EQ(chat["choices"][0]["index"], 0);
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], "héllo");
  EXPECT_EQ(chat["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(chat["usage"]["prompt_tokens"], 11);
  EXPECT_EQ(chat["usage"]["completion_tokens"], 4);
  EXPECT_EQ(chat["usage"]["total_tokens"], 15);
  EXPECT_EQ(chat["usage"]["prompt_tokens_details"]["cached_tokens"], 3);

  CompletionResult c = r;
  c.finish = FinishReason::kStop;
  const json comp = completion_response(Endpoint::kCompletions, c);
  EXPECT_EQ(comp["object"], "text_completion");
  EXPECT_EQ(comp["choices"][0]["text"], "héllo");
  EXPECT_EQ(comp["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(comp["choices"][0].contains("message"));
}

TEST(OpenAiParse, ChoicesLogprobsAndResponseFormat) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  auto r = parse_request(Endpoint::kChatCompletions, "{" + msgs + R"(, "n": 3, "logprobs": true, "top_logprobs": 5,
    "response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": true,
    "schema": {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}}}})",
                         nullptr);
  ASSERT_TRUE(r) << r.status().to_string();
  EXPECT_EQ(r->n, 3);
  EXPECT_EQ(r->top_logprobs, 5);
  EXPECT_EQ(r->response_format, ResponseFormat::kJsonSchema);
  // The schema keeps its property order (the order the output is written in).
  EXPECT_EQ(r->json_schema["properties"].begin().key(), "b");
  auto plain = parse_request(Endpoint::kChatCompletions, "{" + msgs + R"(, "logprobs": true})", nullptr);
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->top_logprobs, 0);
  EXPECT_EQ(plain->n, 1);
  auto off = parse_request(Endpoint::kChatCompletions, "{" + msgs + R"(, "logprobs": false,
    "response_format": {"type": "text"}})",
                           nullptr);
  ASSERT_TRUE(off);
  EXPECT_EQ(off->top_logprobs, -1);
  EXPECT_EQ(off->response_format, ResponseFormat::kText);
  auto obj = parse_request(Endpoint::kChatCompletions, "{" + msgs + R"(, "response_format": {"type": "json_object"}})",
                           nullptr);
  ASSERT_TRUE(obj);
  EXPECT_EQ(obj->response_format, ResponseFormat::kJsonObject);
  auto comp = parse_request(Endpoint::kCompletions, R"({"prompt": "x", "logprobs": 2, "n": 2})", nullptr);
  ASSERT_TRUE(comp);
  EXPECT_EQ(comp->top_logprobs, 2);
  EXPECT_EQ(comp->n, 2);
}

TEST(OpenAiResponse, LogprobsAndSeveralChoices) {
  const std::vector<TokenLogprob> lps = {{7, -0.5f, {{7, -0.5f}, {9, -1.25f}}}, {9, -2.0f, {{3, -0.1f}, {9, -2.0f}}}};
  // Without a tokenizer the token texts are empty; the numbers and shapes are what is checked.
  const json chat = logprobs_json(Endpoint::kChatCompletions, lps, nullptr);
  ASSERT_EQ(chat["content"].size(), 2u);
  EXPECT_EQ(chat["content"][0]["logprob"], -0.5);
  EXPECT_EQ(chat["content"][0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(chat["content"][0]["top_logprobs"][1]["logprob"], -1.25);
  EXPECT_TRUE(chat["content"][1]["bytes"].is_array());
  EXPECT_TRUE(chat["refusal"].is_null());
  const json comp = logprobs_json(Endpoint::kCompletions, lps, nullptr, 5);
  EXPECT_EQ(comp["token_logprobs"], json::array({-0.5, -2.0}));
  EXPECT_EQ(comp["text_offset"], json::array({5, 5}));
  EXPECT_EQ(comp["top_logprobs"].size(), 2u);
  json acc = nullptr;
  append_logprobs(acc, chat);
  append_logprobs(acc, chat);
  EXPECT_EQ(acc["content"].size(), 4u);

  CompletionResult a = sample_result(), b = sample_result();
  b.index = 1;
  b.text = "other";
  b.usage.completion_tokens = 6;
  b.logprobs = chat;
  const json two = completion_response(Endpoint::kChatCompletions, std::vector<CompletionResult>{a, b});
  ASSERT_EQ(two["choices"].size(), 2u);
  EXPECT_EQ(two["choices"][1]["index"], 1);
  EXPECT_EQ(two["choices"][1]["message"]["content"], "other");
  EXPECT_TRUE(two["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(two["choices"][1]["logprobs"]["content"].size(), 2u);
  EXPECT_EQ(two["usage"]["prompt_tokens"], 11);  // once
  EXPECT_EQ(two["usage"]["completion_tokens"], 10);
  const json chunk = text_chunk(Endpoint::kChatCompletions, b, "x", false);
  EXPECT_EQ(chunk["choices"][0]["index"], 1);
}

TEST(OpenAiResponse, StreamingChunks) {
  const CompletionResult r = sample_result();
  const json role = role_chunk(r, false);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(role["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(role.contains("usage"));

  const json t = text_chunk(Endpoint::kChatCompletions, r, "ab", true);
  EXPECT_EQ(t["choices"][0]["delta"]["content"], "ab");
  EXPECT_FALSE(t["choices"][0]["delta"].contains("role"));
  EXPECT_TRUE(t.contains("usage"));
  EXPECT_TRUE(t["usage"].is_null());

  const json f = finish_chunk(Endpoint::kChatCompletions, r, true);
  EXPECT_EQ(f["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(f["choices"][0]["delta"].empty());

  const json u = usage_chunk(Endpoint::kChatCompletions, r);
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 15);

  const json ct = text_chunk(Endpoint::kCompletions, r, "cd", false);
  EXPECT_EQ(ct["object"], "text_completion");
  EXPECT_EQ(ct["choices"][0]["text"], "cd");

  const std::string ev = sse_event(json{{"a", 1}});
  EXPECT_EQ(ev, "data: {\"a\":1}\n\n");
  // Invalid UTF-8 never throws; it is replaced.
  const std::string bad = sse_event(text_chunk(Endpoint::kCompletions, r, "\xff\xfe", false));
  EXPECT_NE(bad.find("\xEF\xBF\xBD"), std::string::npos);
}

// tools / tool_choice: accepted and validated; what the template sees follows tool_choice.
TEST(OpenAiTools, ToolsAndToolChoice) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "Weather in Paris?"}])";
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
                   {"type": "function", "function": {"name": "get_time"}}])";
  ApiRequest r = parse_ok(Endpoint::kChatCompletions, "{" + msgs + "," + tools + "}");
  ASSERT_TRUE(r.tools.is_array());
  ASSERT_EQ(r.tools.size(), 2u);
  EXPECT_EQ(r.tools[0]["function"]["name"], "get_weather");
  EXPECT_EQ(r.tools[0]["function"].begin().key(), "name") << "keys as sent, for tojson";
  EXPECT_EQ(r.tool_choice, ToolChoice::kAuto);
  r = parse_ok(Endpoint::kChatCompletions, "{" + msgs + "," + tools + R"(, "tool_choice": "none"})");
  EXPECT_EQ(r.tool_choice, ToolChoice::kNone);
  EXPECT_TRUE(r.tools.is_null()) << "none: the model is not shown the tools";
  r = parse_ok(Endpoint::kChatCompletions, "{" + msgs + "," + tools + R"(, "tool_choice": "required"})");
  EXPECT_EQ(r.tool_choice, ToolChoice::kRequired);
  EXPECT_EQ(r.tools.size(), 2u);
  r = parse_ok(
      Endpoint::kChatCompletions,
      "{" + msgs + "," + tools + R"(, "tool_choice": {"type": "function", "function": {"name": "get_time"}}})");
  EXPECT_EQ(r.tool_choice, ToolChoice::kFunction);
  EXPECT_EQ(r.tool_choice_name, "get_time");
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0]["function"]["name"], "get_time");
  // An empty list is no tools; the test hook field is parsed (the server decides whether to honour it).
  r = parse_ok(Endpoint::kChatCompletions, "{" + msgs + R"(, "tools": [], "moesh_scripted_output": "x"})");
  EXPECT_TRUE(r.tools.is_null());
  EXPECT_EQ(r.scripted_output.value_or(""), "x");
  // History with tool calls and tool results.
  r = parse_ok(Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]})");
  EXPECT_EQ(r.messages.size(), 3u);

  const std::string m = R"({"messages": [{"role": "user", "content": "x"}], )";
  const BadCase cases[] = {
      {Endpoint::kChatCompletions, R"("tools": {}})", "tools", "invalid_type"},
      {Endpoint::kChatCompletions, R"("tools": [3]})", "tools[0]", "invalid_type"},
      {Endpoint::kChatCompletions, R"("tools": [{"function": {"name": "f"}}]})", "tools[0].type",
       "missing_required_parameter"},
      {Endpoint::kChatCompletions, R"("tools": [{"type": "retrieval"}]})", "tools[0].type", "unsupported_value"},
      {Endpoint::kChatCompletions, R"("tools": [{"type": "function"}]})", "tools[0].function",
       "missing_required_parameter"},
      {Endpoint::kChatCompletions, R"("tools": [{"type": "function", "function": {}}]})", "tools[0].function.name",
       "missing_required_parameter"},
      {Endpoint::kChatCompletions, R"("tools": [{"type": "function", "function": {"name": "a b"}}]})",
       "tools[0].function.name", "invalid_value"},
      {Endpoint::kChatCompletions, R"("tools": [{"type": "function", "function": {"name": 5}}]})",
       "tools[0].function.name", "invalid_type"},
      {Endpoint::kChatCompletions, R"("tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]})",
       "tools[0].function.parameters", "invalid_type"},
      {Endpoint::kChatCompletions, R"("tools": [{"type": "function", "function": {"name": "f", "description": 1}}]})",
       "tools[0].function.description", "invalid_type"},
      {Endpoint::kChatCompletions, R"("tool_choice": "sometimes"})", "tool_choice", "invalid_value"},
      {Endpoint::kChatCompletions, R"("tool_choice": 3})", "tool_choice", "invalid_type"},
      {Endpoint::kChatCompletions, R"("tool_choice": "required"})", "tool_choice", "invalid_value"},
      {Endpoint::kChatCompletions,
       R"("tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}})",
       "tool_choice", "invalid_value"},
      {Endpoint::kChatCompletions, R"("tool_choice": {"type": "function"}})", "tool_choice", "invalid_value"},
      {Endpoint::kChatCompletions, R"("moesh_scripted_output": 1})", "moesh_scripted_output", "invalid_type"},
  };
  for (const BadCase& c : cases) {
    const ApiError e = parse_err(c.ep, m + c.body);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_EQ(e.code, c.code) << c.body;
  }
  // Completions has no tools.
  EXPECT_EQ(parse_err(Endpoint::kCompletions, R"({"prompt": "x", "tools": [{"type": "function"}]})").param, "tools");
  // Bad tool calls in the history name their field.
  const BadCase hist[] = {
      {Endpoint::kChatCompletions, R"({"messages": [{"role": "assistant", "tool_calls": {}}]})",
       "messages[0].tool_calls", "invalid_type"},
      {Endpoint::kChatCompletions, R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function"}]}]})",
       "messages[0].tool_calls[0].function", "missing_required_parameter"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]})",
       "messages[0].tool_calls[0].function.arguments", "invalid_value"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]})",
       "messages[0].tool_calls[0].function.arguments", "invalid_type"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]})",
       "messages[0].tool_calls", "invalid_value"},
      {Endpoint::kChatCompletions, R"({"messages": [{"role": "tool", "tool_call_id": 7, "content": "x"}]})",
       "messages[0].tool_call_id", "invalid_type"},
  };
  for (const BadCase& c : hist) {
    const ApiError e = parse_err(c.ep, c.body);
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_EQ(e.code, c.code) << c.body;
  }
}

TEST(OpenAiTools, ResponseWithToolCallsAndReasoning) {
  CompletionResult r = sample_result();
  r.finish = FinishReason::kStop;
  r.text = "";
  r.reasoning = "need the weather";
  r.tool_calls = {{"call_0", "get_weather", R"({"city":"Paris"})"}};
  json j = completion_response(Endpoint::kChatCompletions, r);
  const json& msg = j["choices"][0]["message"];
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(msg["content"].is_null());
  EXPECT_EQ(msg["reasoning_content"], "need the weather");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["id"], "call_0");
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})") << "a JSON string";
  // Cut off by max_tokens: "length" wins; no calls, no reasoning: the plain shape.
  r.finish = FinishReason::kLength;
  EXPECT_EQ(completion_response(Endpoint::kChatCompletions, r)["choices"][0]["finish_reason"], "length");
  const json plain = completion_response(Endpoint::kChatCompletions, sample_result());
  EXPECT_FALSE(plain["choices"][0]["message"].contains("tool_calls"));
  EXPECT_FALSE(plain["choices"][0]["message"].contains("reasoning_content"));
  EXPECT_EQ(plain["choices"][0]["message"]["content"], "héllo");
}

// Streamed deltas: reasoning, content, then per call a header chunk and argument fragments that
// concatenate to the arguments (as the openai client assembles them).
TEST(OpenAiTools, StreamedDeltas) {
  CompletionResult r = sample_result();
  OutputDelta d;
  d.reasoning = "hm";
  d.content = "ok";
  d.first_call_index = 1;
  d.calls = {{"call_1", "f", R"({"city":"Zürich, a long name to split"})"}};
  const std::vector<json> chunks = delta_chunks(r, d, true);
  ASSERT_GE(chunks.size(), 5u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["reasoning_content"], "hm");
  EXPECT_EQ(chunks[1]["choices"][0]["delta"]["content"], "ok");
  const json& head = chunks[2]["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(head["index"], 1);
  EXPECT_EQ(head["id"], "call_1");
  EXPECT_EQ(head["type"], "function");
  EXPECT_EQ(head["function"]["name"], "f");
  std::string args;
  for (size_t i = 3; i < chunks.size(); ++i) {
    const json& tc = chunks[i]["choices"][0]["delta"]["tool_calls"][0];
    EXPECT_EQ(tc["index"], 1);
    EXPECT_FALSE(tc.contains("id"));
    EXPECT_TRUE(chunks[i]["choices"][0]["finish_reason"].is_null());
    EXPECT_TRUE(chunks[i].contains("usage"));
    args += tc["function"]["arguments"].get<std::string>();
    EXPECT_NO_THROW(chunks[i].dump()) << "fragments cut at UTF-8 boundaries";
  }
  EXPECT_EQ(args, d.calls[0].arguments);
  EXPECT_TRUE(delta_chunks(r, OutputDelta{}, false).empty());
  r.tool_calls = d.calls;
  r.finish = FinishReason::kStop;
  EXPECT_EQ(finish_chunk(Endpoint::kChatCompletions, r, false)["choices"][0]["finish_reason"], "tool_calls");
}

TEST(OpenAiResponse, ModelsList) {
  const json j = models_response("tiny.gguf", 5);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "tiny.gguf");
  EXPECT_EQ(j["data"][0]["object"], "model");
}

// Returns the value of the exposition line that starts with `series ` ("" when absent).
std::string series_value(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return line.substr(series.size() + 1);
  }
  return "";
}

TEST(Metrics, Exposition) {
  ServeMetrics m;
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/completions", 400);
  m.count_request("other", 404);
  m.observe_duration("/v1/completions", 0.003);  // first bucket
  m.observe_duration("/v1/completions", 0.3);    // le=0.5
  m.observe_duration("/v1/completions", 500.0);  // +Inf only
  m.observe_ttft("/v1/completions", 0.02);
  MetricsSnapshot s = m.snapshot();
  s.sched.generated_tokens = 300;
  s.sched.busy_seconds = 1.5;
  s.sched.queued = 3;
  s.sched.active = 2;
  s.sched.n_slots = 4;
  s.sched.prompt_tokens = 77;
  WorkerTraffic w;
  w.label = "127.0.0.1:9000 (w\"1)";
  w.requests = 10;
  w.bytes_sent = 1000;
  w.bytes_received = 2000;
  w.errors = 1;
  w.latency_counts[0] = 4;  // <= 0.5 ms
  w.latency_counts[5] = 6;  // <= 25 ms
  w.latency_sum_seconds = 0.1;
  s.workers.push_back(w);
  const std::string t = render_metrics(s);

  EXPECT_EQ(series_value(t, "moesh_http_requests_total{endpoint=\"/v1/completions\",status=\"200\"}"), "2");
  EXPECT_EQ(series_value(t, "moesh_http_requests_total{endpoint=\"/v1/completions\",status=\"400\"}"), "1");
  EXPECT_EQ(series_value(t, "moesh_http_requests_total{endpoint=\"other\",status=\"404\"}"), "1");
  EXPECT_EQ(series_value(t, "moesh_request_duration_seconds_bucket{endpoint=\"/v1/completions\",le=\"0.005\"}"), "1");
  EXPECT_EQ(series_value(t, "moesh_request_duration_seconds_bucket{endpoint=\"/v1/completions\",le=\"0.5\"}"), "2");
  EXPECT_EQ(series_value(t, "moesh_request_duration_seconds_bucket{endpoint=\"/v1/completions\",le=\"120\"}"), "2");
  EXPECT_EQ(series_value(t, "moesh_request_duration_seconds_bucket{endpoint=\"/v1/completions\",le=\"+Inf\"}"), "3");
  EXPECT_EQ(series_value(t, "moesh_request_duration_seconds_count{endpoint=\"/v1/completions\"}"), "3");
  EXPECT_EQ(series_value(t, "moesh_time_to_first_token_seconds_count{endpoint=\"/v1/completions\"}"), "1");
  EXPECT_EQ(series_value(t, "moesh_generated_tokens_total"), "300");
  EXPECT_EQ(series_value(t, "moesh_prompt_tokens_total"), "77");
  EXPECT_EQ(series_value(t, "moesh_generation_tokens_per_second"), "200");
  EXPECT_EQ(series_value(t, "moesh_queue_depth"), "3");
  EXPECT_EQ(series_value(t, "moesh_active_slots"), "2");
  EXPECT_EQ(series_value(t, "moesh_slots"), "4");
  const std::string wl = "worker=\"127.0.0.1:9000 (w\\\"1)\"";
  EXPECT_EQ(series_value(t, "moesh_worker_dispatches_total{" + wl + "}"), "10");
  EXPECT_EQ(series_value(t, "moesh_worker_bytes_sent_total{" + wl + "}"), "1000");
  EXPECT_EQ(series_value(t, "moesh_worker_bytes_received_total{" + wl + "}"), "2000");
  EXPECT_EQ(series_value(t, "moesh_worker_errors_total{" + wl + "}"), "1");
  EXPECT_EQ(series_value(t, "moesh_worker_latency_seconds_bucket{" + wl + ",le=\"0.0005\"}"), "4");
  EXPECT_EQ(series_value(t, "moesh_worker_latency_seconds_bucket{" + wl + ",le=\"0.01\"}"), "4");
  EXPECT_EQ(series_value(t, "moesh_worker_latency_seconds_bucket{" + wl + ",le=\"0.025\"}"), "10");
  EXPECT_EQ(series_value(t, "moesh_worker_latency_seconds_bucket{" + wl + ",le=\"+Inf\"}"), "10");
  EXPECT_EQ(series_value(t, "moesh_worker_latency_seconds_count{" + wl + "}"), "10");
  // Every series has its TYPE line.
  EXPECT_NE(t.find("# TYPE moesh_worker_latency_seconds histogram"), std::string::npos);
  EXPECT_NE(t.find("# TYPE moesh_queue_depth gauge"), std::string::npos);
  EXPECT_EQ(t.find("moesh_span_"), std::string::npos);  // no spans: no span series

  s.has_spans = true;
  s.spans.steps = 40;
  s.spans.trips = 43;
  s.spans.failovers = 1;
  s.spans.replayed_rows = 9;
  s.spans.local_steps = 2;
  s.span_log.memory_bytes = 4096;
  s.span_log.file_bytes = 65536;
  const std::string u = render_metrics(s);
  EXPECT_EQ(series_value(u, "moesh_span_steps_total"), "40");
  EXPECT_EQ(series_value(u, "moesh_span_trips_total"), "43");
  EXPECT_EQ(series_value(u, "moesh_span_failovers_total"), "1");
  EXPECT_EQ(series_value(u, "moesh_span_replayed_rows_total"), "9");
  EXPECT_EQ(series_value(u, "moesh_span_local_steps_total"), "2");
  EXPECT_EQ(series_value(u, "moesh_span_log_bytes{where=\"memory\"}"), "4096");
  EXPECT_EQ(series_value(u, "moesh_span_log_bytes{where=\"file\"}"), "65536");
  EXPECT_NE(u.find("# TYPE moesh_span_log_bytes gauge"), std::string::npos);
  EXPECT_NE(u.find("# TYPE moesh_span_trips_total counter"), std::string::npos);
}

TEST(Metrics, HistogramBuckets) {
  Histogram h;
  h.observe(Histogram::kBounds[0]);         // exactly on a bound: that bucket (le is inclusive)
  h.observe(Histogram::kBounds[0] * 1.01);  // next bucket
  h.observe(1e9);
  EXPECT_EQ(h.counts[0], 1u);
  EXPECT_EQ(h.counts[1], 1u);
  EXPECT_EQ(h.counts[Histogram::kBounds.size()], 1u);
  EXPECT_EQ(h.count, 3u);
}

}  // namespace
}  // namespace moesh::serve
