// OpenAI request parsing/validation and response shapes (see openai_api.h).
#include "serve/openai_api.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

namespace moesh::serve {

using nlohmann::json;

namespace {

// Carries the first validation failure out of the field helpers.
struct Fail {
  ApiError* out;
  Status operator()(std::string param, std::string code, std::string message) const {
    out->http_status = 400;
    out->type = "invalid_request_error";
    out->param = std::move(param);
    out->code = std::move(code);
    out->message = std::move(message);
    return Status(StatusCode::kInvalidArgument, out->message);
  }
};

const char* json_type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::string:
      return "string";
    case json::value_t::array:
      return "array";
    case json::value_t::object:
      return "object";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "integer";
    case json::value_t::number_float:
      return "number";
    default:
      return "value";
  }
}

Status wrong_type(const Fail& fail, const std::string& key, const char* want, const json& v) {
  return fail(key, "invalid_type", fmt::format("'{}' must be {}, got {}", key, want, json_type_name(v)));
}

// Optional number field in [lo, hi]; null counts as absent.
Status get_number(const json& o, const char* key, double lo, double hi, const Fail& fail, std::optional<double>* out) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return Status::ok();
  if (!it->is_number()) return wrong_type(fail, key, "a number", *it);
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    return fail(key, "invalid_value", fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v));
  }
  *out = v;
  return Status::ok();
}

// Optional integer field in [lo, hi].
Status get_int(const json& o, const char* key, int64_t lo, int64_t hi, const Fail& fail, std::optional<int64_t>* out) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return Status::ok();
  if (!it->is_number_integer()) return wrong_type(fail, key, "an integer", *it);
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return fail(key, "invalid_value", fmt::format("'{}' must be in [{}, {}]", key, lo, hi));
  }
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) {
    return fail(key, "invalid_value", fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v));
  }
  *out = v;
  return Status::ok();
}

Status get_bool(const json& o, const char* key, const Fail& fail, bool* out) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return Status::ok();
  if (!it->is_boolean()) return wrong_type(fail, key, "a boolean", *it);
  *out = it->get<bool>();
  return Status::ok();
}

// A token id list: non-empty array of non-negative integers.
Status get_token_ids(const json& arr, const std::string& key, const Fail& fail, std::vector<int32_t>* out) {
  if (arr.empty()) return fail(key, "invalid_value", fmt::format("'{}' must not be empty", key));
  out->clear();
  for (const json& t : arr) {
    if (!t.is_number_integer()) return wrong_type(fail, key, "an array of token ids (integers)", t);
    const int64_t v = t.is_number_unsigned() && t.get<uint64_t>() > INT32_MAX ? INT64_MAX : t.get<int64_t>();
    if (v < 0 || v > INT32_MAX) {
      return fail(key, "invalid_value", fmt::format("'{}' holds a token id out of range: {}", key, v));
    }
    out->push_back(static_cast<int32_t>(v));
  }
  return Status::ok();
}

Status parse_prompt(const json& o, ApiRequest* r, const Fail& fail) {
  auto it = o.find("prompt");
  if (it == o.end() || it->is_null()) {
    return fail("prompt", "missing_required_parameter", "'prompt' is required");
  }
  const json& p = *it;
  if (p.is_string()) {
    r->prompt = p.get<std::string>();
    if (r->prompt.empty()) return fail("prompt", "invalid_value", "'prompt' must not be empty");
    return Status::ok();
  }
  if (!p.is_array()) return wrong_type(fail, "prompt", "a string or an array of token ids", p);
  if (p.empty()) return fail("prompt", "invalid_value", "'prompt' must not be empty");
  // [string], [[ids]] (a batch of one) or [ids].
  if (p[0].is_string() || p[0].is_array()) {
    if (p.size() != 1) {
      return fail("prompt", "unsupported_value", "only one prompt per request is supported");
    }
    if (p[0].is_string()) {
      r->prompt = p[0].get<std::string>();
      if (r->prompt.empty()) return fail("prompt", "invalid_value", "'prompt' must not be empty");
      return Status::ok();
    }
    r->prompt_is_tokens = true;
    return get_token_ids(p[0], "prompt", fail, &r->prompt_tokens);
  }
  r->prompt_is_tokens = true;
  return get_token_ids(p, "prompt", fail, &r->prompt_tokens);
}

Status check_tool_calls(const json& calls, const std::string& where, const Fail& fail);

// `ordered`: the same body parsed keeping key order (json sorts keys), kept per message for the
// Jinja template, whose `tojson` must write the keys as the client sent them.
Status parse_messages(const json& o, const nlohmann::ordered_json& ordered, ApiRequest* r, const Fail& fail) {
  auto it = o.find("messages");
  if (it == o.end() || it->is_null()) {
    return fail("messages", "missing_required_parameter", "'messages' is required");
  }
  if (!it->is_array()) return wrong_type(fail, "messages", "an array", *it);
  if (it->empty()) return fail("messages", "invalid_value", "'messages' must not be empty");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) return wrong_type(fail, where, "an object", m);
    ChatMessage cm;
    auto role = m.find("role");
    if (role == m.end()) return fail(where + ".role", "missing_required_parameter", "'role' is required");
    if (!role->is_string()) return wrong_type(fail, where + ".role", "a string", *role);
    cm.role = role->get<std::string>();
    // OpenAI's roles. The model's Jinja template would render any string, as Jinja2 does, so
    // the API is where an unknown one is refused.
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" && cm.role != "tool" &&
        cm.role != "developer" && cm.role != "function") {
      return fail(where + ".role", "invalid_value",
                  fmt::format("unknown role '{}' (system, user, assistant, tool, developer, function)", cm.role));
    }
    if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null()) {
      if (cm.role != "assistant") {
        return fail(where + ".tool_calls", "invalid_value", "only assistant messages carry 'tool_calls'");
      }
      MOESH_RETURN_IF_ERROR(check_tool_calls(*tc, where + ".tool_calls", fail));
    }
    if (auto id = m.find("tool_call_id"); id != m.end() && !id->is_null() && !id->is_string()) {
      return wrong_type(fail, where + ".tool_call_id", "a string", *id);
    }
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      // Assistant turns may carry no content (tool calls only).
      if (cm.role != "assistant") {
        return fail(where + ".content", "missing_required_parameter", "'content' is required");
      }
    } else if (content->is_string()) {
      cm.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (size_t j = 0; j < content->size(); ++j) {
        const json& part = (*content)[j];
        const std::string pw = fmt::format("{}.content[{}]", where, j);
        if (!part.is_object()) return wrong_type(fail, pw, "an object", part);
        auto type = part.find("type");
        if (type == part.end() || !type->is_string()) {
          return fail(pw + ".type", "invalid_type", "a content part needs a string 'type'");
        }
        if (*type != "text") {
          return fail(
              pw + ".type", "unsupported_value",
              fmt::format("content parts of type '{}' are not supported (only 'text')", type->get<std::string>()));
        }
        auto text = part.find("text");
        if (text == part.end() || !text->is_string()) {
          return fail(pw + ".text", "invalid_type", "a text content part needs a string 'text'");
        }
        cm.content += text->get<std::string>();
      }
    } else {
      return wrong_type(fail, where + ".content", "a string or an array of content parts", *content);
    }
    auto om = ordered.find("messages");
    if (om != ordered.end() && om->is_array() && i < om->size()) cm.fields = (*om)[i];
    r->messages.push_back(std::move(cm));
  }
  // chat_template_kwargs (vLLM's and llama.cpp's extension): variables for the Jinja template,
  // e.g. {"enable_thinking": false}.
  auto kw = ordered.find("chat_template_kwargs");
  if (kw != ordered.end() && !kw->is_null()) {
    if (!kw->is_object()) return wrong_type(fail, "chat_template_kwargs", "an object", o["chat_template_kwargs"]);
    r->template_variables = *kw;
  }
  return Status::ok();
}

Status parse_stop(const json& o, ApiRequest* r, const Fail& fail) {
  auto it = o.find("stop");
  if (it == o.end() || it->is_null()) return Status::ok();
  auto add = [&](const json& s) -> Status {
    if (!s.is_string()) return wrong_type(fail, "stop", "a string or an array of strings", s);
    std::string v = s.get<std::string>();
    if (v.empty()) return fail("stop", "invalid_value", "stop strings must not be empty");
    r->stop.push_back(std::move(v));
    return Status::ok();
  };
  if (it->is_string()) return add(*it);
  if (!it->is_array()) return wrong_type(fail, "stop", "a string or an array of strings", *it);
  if (it->size() > kMaxStopStrings) {
    return fail("stop", "invalid_value", fmt::format("at most {} stop strings", kMaxStopStrings));
  }
  for (const json& s : *it) MOESH_RETURN_IF_ERROR(add(s));
  return Status::ok();
}

// Fields OpenAI defines that this server does not implement: accepted only at their "off" value.
Status reject_unsupported(const json& o, Endpoint ep, const Fail& fail) {
  if (ep == Endpoint::kCompletions) {
    bool echo = false;
    MOESH_RETURN_IF_ERROR(get_bool(o, "echo", fail, &echo));
    if (echo) return fail("echo", "unsupported_value", "'echo' is not supported");
    std::optional<int64_t> best_of;
    MOESH_RETURN_IF_ERROR(get_int(o, "best_of", 1, 128, fail, &best_of));
    if (best_of && *best_of != 1) return fail("best_of", "unsupported_value", "only best_of = 1 is supported");
    auto suffix = o.find("suffix");
    if (suffix != o.end() && !suffix->is_null()) {
      return fail("suffix", "unsupported_value", "'suffix' is not supported");
    }
  }
  if (ep == Endpoint::kCompletions) {
    for (const char* k : {"tools", "tool_choice"}) {
      auto it = o.find(k);
      if (it != o.end() && !it->is_null()) {
        return fail(k, "unsupported_value", fmt::format("'{}' is only for /v1/chat/completions", k));
      }
    }
  }
  return Status::ok();
}

// n; logprobs / top_logprobs (chat: a boolean and 0..20 alternatives; completions: the legacy
// integer 0..5, the number of alternatives).
Status parse_choices_and_logprobs(const json& o, Endpoint ep, ApiRequest* r, const Fail& fail) {
  std::optional<int64_t> n;
  MOESH_RETURN_IF_ERROR(get_int(o, "n", 1, kMaxChoices, fail, &n));
  if (n) r->n = static_cast<int>(*n);
  if (ep == Endpoint::kCompletions) {
    std::optional<int64_t> lp;
    MOESH_RETURN_IF_ERROR(get_int(o, "logprobs", 0, 5, fail, &lp));
    if (lp) r->top_logprobs = static_cast<int>(*lp);
    return Status::ok();
  }
  bool want = false;
  MOESH_RETURN_IF_ERROR(get_bool(o, "logprobs", fail, &want));
  std::optional<int64_t> top;
  MOESH_RETURN_IF_ERROR(get_int(o, "top_logprobs", 0, kMaxTopLogprobs, fail, &top));
  if (top && !want) return fail("top_logprobs", "invalid_value", "'top_logprobs' needs 'logprobs': true");
  if (want) r->top_logprobs = top ? static_cast<int>(*top) : 0;
  return Status::ok();
}

// response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {"name",
// "schema"?, "strict"?, "description"?}}. The schema itself is checked when it is compiled.
Status parse_response_format(const json& o, const nlohmann::ordered_json& ordered, ApiRequest* r, const Fail& fail) {
  auto it = o.find("response_format");
  if (it == o.end() || it->is_null()) return Status::ok();
  if (!it->is_object()) return wrong_type(fail, "response_format", "an object", *it);
  auto type = it->find("type");
  if (type == it->end() || !type->is_string()) {
    return fail("response_format.type", "missing_required_parameter",
                "response_format needs a \"type\": \"text\", \"json_object\" or \"json_schema\"");
  }
  const std::string t = type->get<std::string>();
  if (t == "text") return Status::ok();
  if (t == "json_object") {
    r->response_format = ResponseFormat::kJsonObject;
    return Status::ok();
  }
  if (t != "json_schema") {
    return fail("response_format.type", "invalid_value",
                fmt::format("response_format type '{}' is not one of text, json_object, json_schema", t));
  }
  auto js = it->find("json_schema");
  if (js == it->end() || js->is_null()) {
    return fail("response_format.json_schema", "missing_required_parameter",
                "response_format of type json_schema needs 'json_schema'");
  }
  if (!js->is_object()) return wrong_type(fail, "response_format.json_schema", "an object", *js);
  auto name = js->find("name");
  if (name == js->end() || !name->is_string()) {
    return fail("response_format.json_schema.name", "missing_required_parameter", "json_schema needs a string 'name'");
  }
  r->response_format = ResponseFormat::kJsonSchema;
  const auto& oj = ordered["response_format"]["json_schema"];
  if (auto sc = oj.find("schema"); sc != oj.end() && !sc->is_null()) {
    if (!sc->is_object() && !sc->is_boolean()) {
      return wrong_type(fail, "response_format.json_schema.schema", "an object", (*js)["schema"]);
    }
    r->json_schema = *sc;
  } else {
    r->json_schema = nlohmann::ordered_json::object();  // any JSON value
  }
  return Status::ok();
}

// OpenAI's rule for function names.
bool valid_function_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (char c : n) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') return false;
  }
  return true;
}

// tools: [{"type":"function","function":{"name","description"?,"parameters"?,"strict"?}}];
// tool_choice: "auto" | "none" | "required" | {"type":"function","function":{"name"}}.
Status parse_tools(const json& o, const nlohmann::ordered_json& ordered, ApiRequest* r, const Fail& fail) {
  auto it = o.find("tools");
  std::vector<std::string> names;
  if (it != o.end() && !it->is_null()) {
    if (!it->is_array()) return wrong_type(fail, "tools", "an array", *it);
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      const std::string where = fmt::format("tools[{}]", i);
      if (!t.is_object()) return wrong_type(fail, where, "an object", t);
      auto type = t.find("type");
      if (type == t.end() || !type->is_string()) {
        return fail(where + ".type", "missing_required_parameter", "a tool needs \"type\": \"function\"");
      }
      if (*type != "function") {
        return fail(where + ".type", "unsupported_value",
                    fmt::format("tools of type '{}' are not supported (only 'function')", type->get<std::string>()));
      }
      auto fn = t.find("function");
      if (fn == t.end() || fn->is_null()) {
        return fail(where + ".function", "missing_required_parameter", "a function tool needs 'function'");
      }
      if (!fn->is_object()) return wrong_type(fail, where + ".function", "an object", *fn);
      auto name = fn->find("name");
      if (name == fn->end() || name->is_null()) {
        return fail(where + ".function.name", "missing_required_parameter", "a function needs a 'name'");
      }
      if (!name->is_string()) return wrong_type(fail, where + ".function.name", "a string", *name);
      const std::string n = name->get<std::string>();
      if (!valid_function_name(n)) {
        return fail(where + ".function.name", "invalid_value",
                    fmt::format("function name '{}' must be 1-64 characters of a-z, A-Z, 0-9, '_', '-', '.'", n));
      }
      if (auto d = fn->find("description"); d != fn->end() && !d->is_null() && !d->is_string()) {
        return wrong_type(fail, where + ".function.description", "a string", *d);
      }
      if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null() && !p->is_object()) {
        return wrong_type(fail, where + ".function.parameters", "an object (a JSON Schema)", *p);
      }
      if (auto st = fn->find("strict"); st != fn->end() && !st->is_null() && !st->is_boolean()) {
        return wrong_type(fail, where + ".function.strict", "a boolean", *st);
      }
      names.push_back(n);
    }
    if (!it->empty()) r->tools = ordered["tools"];
  }
  MOESH_RETURN_IF_ERROR(get_bool(o, "parallel_tool_calls", fail, &r->parallel_tool_calls));
  auto tc = o.find("tool_choice");
  if (tc == o.end() || tc->is_null()) return Status::ok();
  if (tc->is_string()) {
    const std::string v = tc->get<std::string>();
    if (v == "auto") {
      r->tool_choice = ToolChoice::kAuto;
    } else if (v == "none") {
      r->tool_choice = ToolChoice::kNone;
    } else if (v == "required") {
      r->tool_choice = ToolChoice::kRequired;
    } else {
      return fail("tool_choice", "invalid_value",
                  fmt::format("'tool_choice' must be \"auto\", \"none\", \"required\" or a function, got '{}'", v));
    }
  } else if (tc->is_object()) {
    auto fn = tc->find("function");
    auto type = tc->find("type");
    if (type == tc->end() || *type != "function" || fn == tc->end() || !fn->is_object() || !fn->contains("name") ||
        !(*fn)["name"].is_string()) {
      return fail("tool_choice", "invalid_value",
                  "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    r->tool_choice = ToolChoice::kFunction;
    r->tool_choice_name = (*fn)["name"].get<std::string>();
    if (std::find(names.begin(), names.end(), r->tool_choice_name) == names.end()) {
      return fail("tool_choice", "invalid_value",
                  fmt::format("'tool_choice' names function '{}', which is not in 'tools'", r->tool_choice_name));
    }
    nlohmann::ordered_json only = nlohmann::ordered_json::array();
    for (const auto& t : r->tools) {
      if (t["function"]["name"] == r->tool_choice_name) only.push_back(t);
    }
    r->tools = std::move(only);
  } else {
    return wrong_type(fail, "tool_choice", "a string or an object", *tc);
  }
  if ((r->tool_choice == ToolChoice::kRequired) && r->tools.is_null()) {
    return fail("tool_choice", "invalid_value", "'tool_choice' \"required\" needs 'tools'");
  }
  if (r->tool_choice == ToolChoice::kNone) r->tools = nullptr;
  return Status::ok();
}

// An assistant message's tool_calls: [{"id"?, "type": "function", "function": {"name",
// "arguments": a JSON string (as OpenAI sends it) or an object}}].
Status check_tool_calls(const json& calls, const std::string& where, const Fail& fail) {
  if (!calls.is_array()) return wrong_type(fail, where, "an array", calls);
  for (size_t j = 0; j < calls.size(); ++j) {
    const json& c = calls[j];
    const std::string w = fmt::format("{}[{}]", where, j);
    if (!c.is_object()) return wrong_type(fail, w, "an object", c);
    if (auto id = c.find("id"); id != c.end() && !id->is_null() && !id->is_string()) {
      return wrong_type(fail, w + ".id", "a string", *id);
    }
    if (auto type = c.find("type"); type != c.end() && !type->is_null() && *type != "function") {
      return fail(w + ".type", "unsupported_value", "only tool calls of type 'function' are supported");
    }
    auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object()) {
      return fail(w + ".function", "missing_required_parameter", "a tool call needs a 'function' object");
    }
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) {
      return fail(w + ".function.name", "missing_required_parameter", "a tool call needs a string 'name'");
    }
    auto args = fn->find("arguments");
    if (args == fn->end() || args->is_null()) continue;
    if (args->is_string()) {
      const json a = json::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (!a.is_object()) {
        return fail(w + ".function.arguments", "invalid_value", "'arguments' must be a JSON object as a string");
      }
    } else if (!args->is_object()) {
      return wrong_type(fail, w + ".function.arguments", "a string (JSON) or an object", *args);
    }
  }
  return Status::ok();
}

}  // namespace

nlohmann::json error_json(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return json{{"error", err}};
}

ApiError api_error_from_status(const Status& st, std::string param) {
  ApiError e;
  e.message = st.message();
  e.param = std::move(param);
  switch (st.code()) {
    case StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "server_error";
      e.code = "server_busy";
      break;
    case StatusCode::kInvalidArgument:
    case StatusCode::kTypeMismatch:
      e.code = "invalid_value";
      break;
    case StatusCode::kOutOfRange:
      e.code = "invalid_value";
      break;
    case StatusCode::kUnsupported:
      e.code = "unsupported_value";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      e.code = "internal_error";
  }
  return e;
}

Result<ApiRequest> parse_request(Endpoint ep, std::string_view body, ApiError* error) {
  ApiError scratch;
  Fail fail{error ? error : &scratch};
  json o = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (o.is_discarded()) {
    Status st = fail("", "invalid_json", "the request body is not valid JSON");
    return st;
  }
  if (!o.is_object()) {
    Status st = fail("", "invalid_type", "the request body must be a JSON object");
    return st;
  }
  ApiRequest r;
  r.endpoint = ep;
  r.sampling.temp = kDefaultTemperature;
  if (auto m = o.find("model"); m != o.end() && !m->is_null()) {
    if (!m->is_string()) return wrong_type(fail, "model", "a string", *m);
    r.model = m->get<std::string>();
  }
  MOESH_RETURN_IF_ERROR(reject_unsupported(o, ep, fail));
  MOESH_RETURN_IF_ERROR(parse_choices_and_logprobs(o, ep, &r, fail));
  const auto ordered = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  MOESH_RETURN_IF_ERROR(parse_response_format(o, ordered, &r, fail));
  if (ep == Endpoint::kCompletions) {
    MOESH_RETURN_IF_ERROR(parse_prompt(o, &r, fail));
  } else {
    MOESH_RETURN_IF_ERROR(parse_messages(o, ordered, &r, fail));
    MOESH_RETURN_IF_ERROR(parse_tools(o, ordered, &r, fail));
    if (auto so = o.find("moesh_scripted_output"); so != o.end() && !so->is_null()) {
      if (!so->is_string()) return wrong_type(fail, "moesh_scripted_output", "a string", *so);
      r.scripted_output = so->get<std::string>();
    }
  }

  std::optional<int64_t> max_tokens;
  MOESH_RETURN_IF_ERROR(get_int(o, "max_tokens", 1, INT32_MAX, fail, &max_tokens));
  if (ep == Endpoint::kChatCompletions) {
    std::optional<int64_t> mct;
    MOESH_RETURN_IF_ERROR(get_int(o, "max_completion_tokens", 1, INT32_MAX, fail, &mct));
    if (mct) max_tokens = mct;  // the newer name wins, as in OpenAI's API
  }
  if (max_tokens) r.max_tokens = static_cast<int32_t>(*max_tokens);

  std::optional<double> d;
  MOESH_RETURN_IF_ERROR(get_number(o, "temperature", 0.0, 2.0, fail, &d));
  if (d) r.sampling.temp = static_cast<float>(*d);
  d.reset();
  MOESH_RETURN_IF_ERROR(get_number(o, "top_p", 0.0, 1.0, fail, &d));
  if (d) {
    if (*d <= 0.0) return fail("top_p", "invalid_value", "'top_p' must be in (0, 1]");
    r.sampling.top_p = static_cast<float>(*d);
  }
  d.reset();
  MOESH_RETURN_IF_ERROR(get_number(o, "min_p", 0.0, 1.0, fail, &d));
  if (d) r.sampling.min_p = static_cast<float>(*d);
  d.reset();
  MOESH_RETURN_IF_ERROR(get_number(o, "presence_penalty", -2.0, 2.0, fail, &d));
  if (d) r.sampling.presence_penalty = static_cast<float>(*d);
  d.reset();
  MOESH_RETURN_IF_ERROR(get_number(o, "frequency_penalty", -2.0, 2.0, fail, &d));
  if (d) r.sampling.frequency_penalty = static_cast<float>(*d);
  d.reset();
  MOESH_RETURN_IF_ERROR(get_number(o, "repeat_penalty", 0.0, 10.0, fail, &d));
  if (d) {
    if (*d <= 0.0) return fail("repeat_penalty", "invalid_value", "'repeat_penalty' must be > 0");
    r.sampling.repeat_penalty = static_cast<float>(*d);
  }
  std::optional<int64_t> i;
  MOESH_RETURN_IF_ERROR(get_int(o, "top_k", -1, INT32_MAX, fail, &i));
  if (i) r.sampling.top_k = static_cast<int>(*i);
  i.reset();
  if (auto s = o.find("seed"); s != o.end() && !s->is_null()) {
    if (!s->is_number_integer()) return wrong_type(fail, "seed", "an integer", *s);
    // OpenAI allows negative seeds; the bits are what matter for the generator.
    r.sampling.seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
    r.seed_given = true;
  }
  MOESH_RETURN_IF_ERROR(parse_stop(o, &r, fail));
  MOESH_RETURN_IF_ERROR(get_bool(o, "stream", fail, &r.stream));
  MOESH_RETURN_IF_ERROR(get_bool(o, "ignore_eos", fail, &r.ignore_eos));
  if (auto so = o.find("stream_options"); so != o.end() && !so->is_null()) {
    if (!so->is_object()) return wrong_type(fail, "stream_options", "an object", *so);
    if (auto iu = so->find("include_usage"); iu != so->end() && !iu->is_null()) {
      if (!iu->is_boolean()) return wrong_type(fail, "stream_options.include_usage", "a boolean", *iu);
      r.include_usage = iu->get<bool>();
    }
  }
  // Backstop: the sampler's own range rules (e.g. penalty_last_n) must agree with the above.
  if (Status st = r.sampling.validate(); !st.is_ok()) return fail("", "invalid_value", st.message());
  return r;
}

const char* openai_finish_reason(FinishReason r) {
  return r == FinishReason::kLength ? "length" : "stop";
}

const char* openai_finish_reason(const CompletionResult& r) {
  if (!r.tool_calls.empty() && r.finish != FinishReason::kLength) return "tool_calls";
  return openai_finish_reason(r.finish);
}

nlohmann::json usage_json(const Usage& u) {
  json j{{"prompt_tokens", u.prompt_tokens},
         {"completion_tokens", u.completion_tokens},
         {"total_tokens", u.prompt_tokens + u.completion_tokens},
         {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  // Speculative decoding (moesh serve --draft): OpenAI's names for predicted-output tokens.
  if (u.draft_tokens > 0) {
    j["completion_tokens_details"] = {{"accepted_prediction_tokens", u.accepted_draft_tokens},
                                      {"rejected_prediction_tokens", u.draft_tokens - u.accepted_draft_tokens}};
  }
  return j;
}

namespace {

json chunk_base(Endpoint ep, const CompletionResult& r, bool include_usage) {
  json j = {{"id", r.id},
            {"object", ep == Endpoint::kChatCompletions ? "chat.completion.chunk" : "text_completion"},
            {"created", r.created},
            {"model", r.model}};
  if (ep == Endpoint::kChatCompletions) j["system_fingerprint"] = "moesh";
  if (include_usage) j["usage"] = nullptr;
  return j;
}

}  // namespace

nlohmann::json completion_response(Endpoint ep, const CompletionResult& r) {
  json choice = {{"index", r.index}, {"logprobs", r.logprobs}, {"finish_reason", openai_finish_reason(r)}};
  json j = {{"id", r.id}, {"created", r.created}, {"model", r.model}};
  if (ep == Endpoint::kChatCompletions) {
    j["object"] = "chat.completion";
    j["system_fingerprint"] = "moesh";
    json msg = {{"role", "assistant"}};
    // With calls and nothing else said, content is null (as OpenAI answers).
    msg["content"] = r.text.empty() && !r.tool_calls.empty() ? json(nullptr) : json(r.text);
    if (!r.reasoning.empty()) msg["reasoning_content"] = r.reasoning;
    if (!r.tool_calls.empty()) {
      json calls = json::array();
      for (const ToolCall& c : r.tool_calls) {
        calls.push_back(
            {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      }
      msg["tool_calls"] = std::move(calls);
    }
    choice["message"] = std::move(msg);
  } else {
    j["object"] = "text_completion";
    choice["text"] = r.text;
  }
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(r.usage);
  return j;
}

nlohmann::json completion_response(Endpoint ep, const std::vector<CompletionResult>& choices) {
  if (choices.empty()) return json::object();
  json j = completion_response(ep, choices.front());
  Usage u = choices.front().usage;
  for (size_t i = 1; i < choices.size(); ++i) {
    j["choices"].push_back(completion_response(ep, choices[i])["choices"][0]);
    u.completion_tokens += choices[i].usage.completion_tokens;
    u.draft_tokens += choices[i].usage.draft_tokens;
    u.accepted_draft_tokens += choices[i].usage.accepted_draft_tokens;
  }
  j["usage"] = usage_json(u);
  return j;
}

nlohmann::json logprobs_json(Endpoint ep, const std::vector<TokenLogprob>& lps, const Tokenizer* tok,
                             size_t text_offset0) {
  auto piece = [&](int32_t id) { return tok != nullptr ? tok->token_to_piece(id, /*special=*/true) : std::string(); };
  auto bytes = [](const std::string& p) {
    json b = json::array();
    for (unsigned char c : p) b.push_back(static_cast<int>(c));
    return b;
  };
  if (ep == Endpoint::kChatCompletions) {
    json content = json::array();
    for (const TokenLogprob& lp : lps) {
      const std::string p = piece(lp.token);
      json top = json::array();
      for (const auto& [id, l] : lp.top) {
        const std::string tp = piece(id);
        top.push_back({{"token", tp}, {"logprob", l}, {"bytes", bytes(tp)}});
      }
      content.push_back({{"token", p}, {"logprob", lp.logprob}, {"bytes", bytes(p)}, {"top_logprobs", std::move(top)}});
    }
    return json{{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  size_t at = text_offset0;
  for (const TokenLogprob& lp : lps) {
    const std::string p = piece(lp.token);
    tokens.push_back(p);
    token_lps.push_back(lp.logprob);
    json top = json::object();
    for (const auto& [id, l] : lp.top) top[piece(id)] = l;
    tops.push_back(std::move(top));
    offsets.push_back(at);
    at += p.size();
  }
  return json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_lps)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}

void append_logprobs(nlohmann::json& a, const nlohmann::json& b) {
  if (b.is_null()) return;
  if (a.is_null()) {
    a = b;
    return;
  }
  if (b.contains("content")) {
    for (const json& e : b["content"]) a["content"].push_back(e);
    return;
  }
  for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (const json& e : b[k]) a[k].push_back(e);
  }
}

nlohmann::json role_chunk(const CompletionResult& r, bool include_usage) {
  json j = chunk_base(Endpoint::kChatCompletions, r, include_usage);
  j["choices"] = json::array({{{"index", r.index},
                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}});
  return j;
}

nlohmann::json text_chunk(Endpoint ep, const CompletionResult& r, std::string_view text, bool include_usage) {
  json j = chunk_base(ep, r, include_usage);
  json choice = {{"index", r.index}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (ep == Endpoint::kChatCompletions)
    choice["delta"] = {{"content", std::string(text)}};
  else
    choice["text"] = std::string(text);
  j["choices"] = json::array({choice});
  return j;
}

std::vector<nlohmann::json> delta_chunks(const CompletionResult& r, const OutputDelta& d, bool include_usage) {
  std::vector<json> out;
  auto add = [&](json delta) {
    json j = chunk_base(Endpoint::kChatCompletions, r, include_usage);
    j["choices"] = json::array(
        {{{"index", r.index}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
    out.push_back(std::move(j));
  };
  if (!d.reasoning.empty()) add({{"reasoning_content", d.reasoning}});
  if (!d.content.empty()) add({{"content", d.content}});
  for (size_t i = 0; i < d.calls.size(); ++i) {
    const ToolCall& c = d.calls[i];
    const int index = d.first_call_index + static_cast<int>(i);
    add({{"tool_calls", json::array({{{"index", index},
                                      {"id", c.id},
                                      {"type", "function"},
                                      {"function", {{"name", c.name}, {"arguments", ""}}}}})}});
    // Arguments in fragments, cut at UTF-8 character boundaries, as a streaming model sends them.
    const std::string_view a = c.arguments;
    size_t at = 0;
    while (at < a.size()) {
      size_t end = std::min(a.size(), at + 8);
      while (end < a.size() && (static_cast<unsigned char>(a[end]) & 0xC0) == 0x80) ++end;
      add({{"tool_calls",
            json::array({{{"index", index}, {"function", {{"arguments", std::string(a.substr(at, end - at))}}}}})}});
      at = end;
    }
  }
  return out;
}

nlohmann::json finish_chunk(Endpoint ep, const CompletionResult& r, bool include_usage) {
  json j = chunk_base(ep, r, include_usage);
  json choice = {{"index", r.index}, {"logprobs", nullptr}, {"finish_reason", openai_finish_reason(r)}};
  if (ep == Endpoint::kChatCompletions)
    choice["delta"] = json::object();
  else
    choice["text"] = "";
  j["choices"] = json::array({choice});
  return j;
}

nlohmann::json usage_chunk(Endpoint ep, const CompletionResult& r) {
  json j = chunk_base(ep, r, false);
  j["choices"] = json::array();
  j["usage"] = usage_json(r.usage);
  return j;
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const nlohmann::json& j) {
  std::string s = "data: ";
  s += dump_json(j);
  s += "\n\n";
  return s;
}

nlohmann::json models_response(const std::string& model, int64_t created) {
  return json{
      {"object", "list"},
      {"data", json::array({{{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "moesh"}}})}};
}

}  // namespace moesh::serve
