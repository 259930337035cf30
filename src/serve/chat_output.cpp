// Splitting generated chat text into content, reasoning and tool calls (see chat_output.h).
#include "serve/chat_output.h"

#include <algorithm>

namespace moesh::serve {

using ojson = nlohmann::ordered_json;

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kDsRegionOpen = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsRegionClose = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallOpen = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallClose = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kHChannel = "<|channel|>";
constexpr std::string_view kHMessage = "<|message|>";
constexpr std::string_view kHStart = "<|start|>";
constexpr std::string_view kHEnd = "<|end|>";
constexpr std::string_view kHCall = "<|call|>";
constexpr std::string_view kHReturn = "<|return|>";

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

std::string_view trim_right(std::string_view s) {
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

size_t skip_ws(std::string_view s, size_t i = 0) {
  while (i < s.size() && is_ws(s[i])) ++i;
  return i;
}

// Length of the longest suffix of `s` that is a proper prefix of `marker` (text to hold back
// because the marker may be arriving).
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

// A JSON object's compact text; a string holding a JSON object is accepted as that object.
bool arguments_text(const ojson& v, std::string* out) {
  if (v.is_string()) {
    const ojson inner = ojson::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (!inner.is_object()) return false;
    *out = inner.dump(-1, ' ', false, ojson::error_handler_t::replace);
    return true;
  }
  if (!v.is_object()) return false;
  *out = v.dump(-1, ' ', false, ojson::error_handler_t::replace);
  return true;
}

// {"name": ..., "arguments" | "parameters": {...}}
bool parse_name_args_object(std::string_view text, std::string* name, std::string* arguments) {
  const ojson o = ojson::parse(trim(text), nullptr, /*allow_exceptions=*/false);
  if (!o.is_object()) return false;
  auto n = o.find("name");
  if (n == o.end() || !n->is_string() || n->get<std::string>().empty()) return false;
  auto a = o.find("arguments");
  if (a == o.end()) a = o.find("parameters");
  if (a == o.end()) {
    *arguments = "{}";
  } else if (!arguments_text(*a, arguments)) {
    return false;
  }
  *name = n->get<std::string>();
  return true;
}

bool parse_deepseek(std::string_view body, std::string* name, std::string* arguments) {
  const size_t sep = body.find(kDsSep);
  if (sep == std::string_view::npos) return false;
  const std::string_view left = trim(body.substr(0, sep));
  std::string_view right = body.substr(sep + kDsSep.size());
  std::string_view args;
  if (left.empty() || left == "function") {  // V3 / R1: NAME\n```json\n{...}\n```
    const size_t nl = right.find('\n');
    if (nl == std::string_view::npos) return false;
    *name = std::string(trim(right.substr(0, nl)));
    args = trim(right.substr(nl + 1));
    if (args.starts_with("```")) {
      const size_t first_nl = args.find('\n');
      if (first_nl == std::string_view::npos || !args.ends_with("```")) return false;
      args = trim(args.substr(first_nl + 1, args.size() - 3 - (first_nl + 1)));
    }
  } else {  // V3.1: NAME<｜tool▁sep｜>{...}
    *name = std::string(left);
    args = trim(right);
  }
  if (name->empty()) return false;
  const ojson o = ojson::parse(args, nullptr, /*allow_exceptions=*/false);
  return arguments_text(o, arguments);
}

bool parse_glm45(std::string_view body, std::string* name, std::string* arguments) {
  body.remove_prefix(skip_ws(body));
  size_t i = body.find("<arg_key>");
  const size_t nl = body.find('\n');
  const size_t name_end = std::min(i, nl);
  *name = std::string(trim(body.substr(0, name_end)));
  if (name->empty() || name->find('<') != std::string::npos || name->find('{') != std::string::npos) return false;
  ojson args = ojson::object();
  i = name_end == std::string_view::npos ? body.size() : name_end;
  for (;;) {
    i = skip_ws(body, i);
    if (i >= body.size()) break;
    if (body.substr(i, 9) != "<arg_key>") return false;
    const size_t ke = body.find("</arg_key>", i);
    if (ke == std::string_view::npos) return false;
    const std::string key(trim(body.substr(i + 9, ke - i - 9)));
    i = skip_ws(body, ke + 10);
    if (body.substr(i, 11) != "<arg_value>") return false;
    const size_t ve = body.find("</arg_value>", i);
    if (ve == std::string_view::npos) return false;
    const std::string_view raw = body.substr(i + 11, ve - i - 11);
    // The template writes strings as they are and everything else as JSON.
    ojson v = ojson::parse(raw, nullptr, /*allow_exceptions=*/false);
    args[key] = v.is_discarded() || v.is_string() ? ojson(std::string(raw)) : std::move(v);
    i = ve + 12;
  }
  *arguments = args.dump(-1, ' ', false, ojson::error_handler_t::replace);
  return true;
}

// The end of the balanced {...} starting at `i` (strings respected), npos when unbalanced.
size_t object_end(std::string_view s, size_t i) {
  int depth = 0;
  bool in_str = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (in_str) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

}  // namespace

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kNone:
      return "none";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kDeepseekV3:
      return "deepseek_v3";
    case ToolCallFormat::kGlm45:
      return "glm4_5";
    case ToolCallFormat::kHarmony:
      return "harmony";
    default:
      return "?";
  }
}

OutputFormat detect_output_format(std::string_view src) {
  OutputFormat f;
  auto has = [&](std::string_view m) { return src.find(m) != std::string_view::npos; };
  f.think_tags = has(kThinkClose);
  f.harmony = has(kHChannel) && has(kHMessage);
  if (f.harmony) {
    f.think_tags = false;
    if (has("to=functions") || has("functions.")) f.tools = ToolCallFormat::kHarmony;
  } else if (has("<arg_key>")) {
    f.tools = ToolCallFormat::kGlm45;
  } else if (has(kDsCallOpen)) {
    f.tools = ToolCallFormat::kDeepseekV3;
  } else if (has(kHermesOpen)) {
    f.tools = ToolCallFormat::kHermes;
  } else if (has("<|start_header_id|>") && (has(kPythonTag) || has("\"parameters\"") || has("ipython"))) {
    f.tools = ToolCallFormat::kLlama3Json;
  }
  return f;
}

bool prompt_opens_reasoning(std::string_view rendered_prompt) {
  const std::string_view t = trim(rendered_prompt);
  return t.ends_with(kThinkOpen);
}

bool prompt_closes_reasoning(std::string_view rendered_prompt) {
  const std::string_view t = trim(rendered_prompt);
  return t.ends_with(kThinkClose);
}

bool template_wants_object_arguments(const ChatTemplate& tmpl) {
  if (!tmpl.is_jinja()) return false;
  auto render = [&](const ojson& args) -> std::string {
    ChatMessage user{"user", "Hey", ojson{{"role", "user"}, {"content", "Hey"}}};
    ojson call = {{"id", "call_1___"}, {"type", "function"}, {"function", {{"name", "ipython"}, {"arguments", args}}}};
    ChatMessage asst{"assistant", "",
                     ojson{{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array({call})}}};
    ChatRenderOptions ro;
    ro.add_generation_prompt = false;
    auto out = tmpl.render({user, asst}, ro);
    return out.is_ok() ? *out : std::string();
  };
  const ojson obj = {{"argument_needle", "print('Hello, World!')"}};
  const std::string with_str = render(obj.dump());
  const std::string with_obj = render(obj);
  const bool str_ok = with_str.find("{\"argument_needle\":") != std::string::npos;
  const bool obj_ok = with_obj.find("argument_needle") != std::string::npos;
  // An object written other than as JSON (GLM-4.5's <arg_key>k</arg_key>) means the template
  // iterates it; a string then only reaches a fallback branch.
  const bool obj_iterated = obj_ok && with_obj.find("\"argument_needle\"") == std::string::npos;
  return obj_ok && (!str_ok || obj_iterated);
}

bool template_rejects_null_content(const ChatTemplate& tmpl) {
  if (!tmpl.is_jinja()) return false;
  auto renders = [&](const ojson& content) {
    ojson call = {
        {"id", "call_1___"}, {"type", "function"}, {"function", {{"name", "ipython"}, {"arguments", R"({"a": 1})"}}}};
    ChatMessage user{"user", "Hey", ojson{{"role", "user"}, {"content", "Hey"}}};
    ChatMessage asst{"assistant", "",
                     ojson{{"role", "assistant"}, {"content", content}, {"tool_calls", ojson::array({call})}}};
    ChatRenderOptions ro;
    ro.add_generation_prompt = false;
    return tmpl.render({user, asst}, ro).is_ok();
  };
  return !renders(nullptr) && renders("");
}

void null_content_to_empty(std::vector<ChatMessage>* messages) {
  for (ChatMessage& m : *messages) {
    if (!m.fields.is_object()) continue;
    auto c = m.fields.find("content");
    if (c == m.fields.end() || c->is_null()) m.fields["content"] = "";
  }
}

void tool_call_arguments_to_objects(std::vector<ChatMessage>* messages) {
  for (ChatMessage& m : *messages) {
    if (m.role != "assistant" || !m.fields.is_object()) continue;
    auto tc = m.fields.find("tool_calls");
    if (tc == m.fields.end() || !tc->is_array()) continue;
    for (ojson& call : *tc) {
      if (!call.is_object()) continue;
      auto fn = call.find("function");
      if (fn == call.end() || !fn->is_object()) continue;
      auto a = fn->find("arguments");
      if (a == fn->end() || !a->is_string()) continue;
      ojson o = ojson::parse(a->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (o.is_object()) *a = std::move(o);
    }
  }
}

bool parse_tool_call_body(ToolCallFormat format, std::string_view body, std::string* name, std::string* arguments) {
  switch (format) {
    case ToolCallFormat::kHermes:
    case ToolCallFormat::kLlama3Json:
      return parse_name_args_object(body, name, arguments);
    case ToolCallFormat::kDeepseekV3:
      return parse_deepseek(body, name, arguments);
    case ToolCallFormat::kGlm45:
      return parse_glm45(body, name, arguments);
    default:
      return false;
  }
}

ChatOutputParser::ChatOutputParser(OutputFormat format, bool parse_tools, bool starts_in_reasoning,
                                   std::string id_prefix)
    : fmt_(format),
      parse_tools_(parse_tools && format.tools != ToolCallFormat::kNone),
      id_prefix_(std::move(id_prefix)),
      mode_(starts_in_reasoning ? Mode::kReasoning : Mode::kStart) {}

OutputDelta ChatOutputParser::push(std::string_view text) {
  OutputDelta d;
  d.first_call_index = static_cast<int>(calls_.size());
  buf_ += text;
  step(&d, false);
  return d;
}

OutputDelta ChatOutputParser::finish() {
  OutputDelta d;
  d.first_call_index = static_cast<int>(calls_.size());
  step(&d, true);
  if (!held_ws_.empty() && content_started_) {
    d.content += held_ws_;
    content_ += held_ws_;
  }
  held_ws_.clear();
  mode_ = Mode::kDone;
  return d;
}

void ChatOutputParser::emit_content(OutputDelta* d, std::string_view s) {
  if (!content_started_) {
    // Whitespace after </think> or between calls is layout, not an answer.
    if (strip_leading_) s.remove_prefix(skip_ws(s));
    if (s.empty()) return;
    content_started_ = true;
  }
  const size_t end = s.find_last_not_of(" \t\r\n");
  if (end == std::string_view::npos) {
    held_ws_ += s;
    return;
  }
  std::string out = std::move(held_ws_);
  out += s.substr(0, end + 1);
  held_ws_ = std::string(s.substr(end + 1));
  d->content += out;
  content_ += out;
}

void ChatOutputParser::emit_reasoning(OutputDelta* d, std::string_view s) {
  if (reasoning_.empty()) s.remove_prefix(skip_ws(s));
  d->reasoning += s;
  reasoning_ += s;
}

bool ChatOutputParser::add_call(OutputDelta* d, std::string_view body) {
  ToolCall c;
  if (!parse_tool_call_body(fmt_.tools, body, &c.name, &c.arguments)) return false;
  c.id = id_prefix_ + std::to_string(calls_.size());
  calls_.push_back(c);
  d->calls.push_back(std::move(c));
  // Whitespace held before the call belonged to the layout around it.
  held_ws_.clear();
  content_started_ = false;
  strip_leading_ = true;
  return true;
}

void ChatOutputParser::step_harmony(OutputDelta* d, bool final) {
  static constexpr std::string_view kEnds[] = {kHEnd, kHCall, kHReturn, kHStart, kHChannel};
  for (;;) {
    if (h_part_ == HarmonyPart::kHeader) {
      // A header starts with <|start|>, <|channel|> or " to="; anything else is plain text the
      // model wrote outside the format: content, up to the next marker.
      auto starts_header = [&](std::string_view b) {
        for (std::string_view m : {kHStart, kHChannel, std::string_view(" to=")}) {
          if (b.substr(0, std::min(b.size(), m.size())) == m.substr(0, std::min(b.size(), m.size()))) return true;
        }
        return false;
      };
      if (buf_.empty()) return;
      if (!starts_header(buf_)) {
        h_part_ = HarmonyPart::kBody;
        h_kind_ = HarmonyKind::kContent;
        continue;
      }
      const size_t at = buf_.find(kHMessage);
      if (at == std::string::npos) {
        if (!final) return;
        buf_.clear();  // a header the output ended in: nothing to show
        return;
      }
      const std::string_view header = std::string_view(buf_).substr(0, at);
      std::string channel;
      if (size_t c = header.find(kHChannel); c != std::string_view::npos) {
        size_t i = c + kHChannel.size(), j = i;
        while (j < header.size() && !is_ws(header[j]) && header[j] != '<') ++j;
        channel = std::string(header.substr(i, j - i));
      }
      std::string recipient;
      if (size_t t = header.find("to="); t != std::string_view::npos) {
        size_t i = t + 3, j = i;
        while (j < header.size() && !is_ws(header[j]) && header[j] != '<') ++j;
        recipient = std::string(header.substr(i, j - i));
      }
      if (parse_tools_ && recipient.rfind("functions.", 0) == 0) {
        h_kind_ = HarmonyKind::kCall;
        h_call_name_ = recipient.substr(10);
        h_call_body_.clear();
      } else {
        h_kind_ = channel == "analysis" ? HarmonyKind::kReasoning : HarmonyKind::kContent;
      }
      buf_.erase(0, at + kHMessage.size());
      h_part_ = HarmonyPart::kBody;
      continue;
    }
    // Body: up to the first end marker (a <|start|> or <|channel|> also ends a body whose <|end|>
    // the model left out).
    size_t at = std::string::npos, len = 0;
    for (std::string_view m : kEnds) {
      const size_t p = buf_.find(m);
      if (p < at) {
        at = p;
        len = m == kHStart || m == kHChannel ? 0 : m.size();
      }
    }
    size_t take = at;
    if (at == std::string::npos) {
      size_t hold = 0;
      if (!final) {
        for (std::string_view m : kEnds) hold = std::max(hold, partial_suffix(buf_, m));
      }
      take = buf_.size() - hold;
    }
    const std::string_view body = std::string_view(buf_).substr(0, take);
    switch (h_kind_) {
      case HarmonyKind::kReasoning:
        emit_reasoning(d, body);
        break;
      case HarmonyKind::kContent:
        emit_content(d, body);
        break;
      case HarmonyKind::kCall:
        h_call_body_ += body;
        break;
    }
    buf_.erase(0, take);
    if (at == std::string::npos && !final) return;
    if (h_kind_ == HarmonyKind::kCall) {
      // The body is the arguments object; one that does not parse comes back as content.
      const ojson v = ojson::parse(trim(h_call_body_), nullptr, /*allow_exceptions=*/false);
      ToolCall c;
      c.name = h_call_name_;
      if (!h_call_name_.empty() && arguments_text(v, &c.arguments)) {
        c.id = id_prefix_ + std::to_string(calls_.size());
        calls_.push_back(c);
        d->calls.push_back(std::move(c));
      } else {
        emit_content(d, h_call_body_);
      }
      h_call_body_.clear();
    }
    buf_.erase(0, len);
    h_part_ = HarmonyPart::kHeader;
    h_kind_ = HarmonyKind::kContent;
    if (at == std::string::npos) return;
  }
}

void ChatOutputParser::step(OutputDelta* d, bool final) {
  if (fmt_.harmony) {
    step_harmony(d, final);
    return;
  }
  for (;;) {
    switch (mode_) {
      case Mode::kDone:
        buf_.clear();
        return;
      case Mode::kStart: {
        // Before the first word: <think> opens reasoning, a JSON object is a Llama 3 call.
        const size_t i = skip_ws(buf_);
        const std::string_view rest = std::string_view(buf_).substr(i);
        if (fmt_.think_tags && rest.starts_with(kThinkOpen)) {
          buf_.erase(0, i + kThinkOpen.size());
          mode_ = Mode::kReasoning;
          continue;
        }
        if (parse_tools_ && fmt_.tools == ToolCallFormat::kLlama3Json &&
            (rest.starts_with("{") || rest.starts_with(kPythonTag))) {
          mode_ = Mode::kJsonCalls;
          continue;
        }
        const bool maybe = (fmt_.think_tags && kThinkOpen.starts_with(rest)) ||
                           (parse_tools_ && fmt_.tools == ToolCallFormat::kLlama3Json && kPythonTag.starts_with(rest));
        if (maybe && !final) return;  // all whitespace, or a marker's beginning: wait
        mode_ = Mode::kContent;
        continue;
      }
      case Mode::kReasoning: {
        const size_t at = buf_.find(kThinkClose);
        if (at != std::string::npos) {
          emit_reasoning(d, trim_right(std::string_view(buf_).substr(0, at)));
          buf_.erase(0, at + kThinkClose.size());
          mode_ = Mode::kContent;
          strip_leading_ = true;
          continue;
        }
        if (final) {
          emit_reasoning(d, trim_right(buf_));
          buf_.clear();
          return;
        }
        // Trailing whitespace waits: it is dropped if </think> follows.
        size_t n = buf_.size() - partial_suffix(buf_, kThinkClose);
        while (n > 0 && is_ws(buf_[n - 1])) --n;
        emit_reasoning(d, std::string_view(buf_).substr(0, n));
        buf_.erase(0, n);
        return;
      }
      case Mode::kContent: {
        if (!parse_tools_ || fmt_.tools == ToolCallFormat::kLlama3Json) {
          emit_content(d, buf_);
          buf_.clear();
          return;
        }
        const bool ds = fmt_.tools == ToolCallFormat::kDeepseekV3;
        std::vector<std::string_view> markers;
        if (ds) {
          markers = {kDsCallOpen, kDsRegionOpen};
          if (in_region_) markers.push_back(kDsRegionClose);
        } else {
          markers = {kHermesOpen};
        }
        size_t at = std::string::npos;
        std::string_view which;
        for (std::string_view m : markers) {
          const size_t p = buf_.find(m);
          if (p < at) at = p, which = m;
        }
        if (at == std::string::npos) {
          size_t hold = 0;
          if (!final)
            for (std::string_view m : markers) hold = std::max(hold, partial_suffix(buf_, m));
          emit_content(d, std::string_view(buf_).substr(0, buf_.size() - hold));
          buf_.erase(0, buf_.size() - hold);
          return;
        }
        emit_content(d, std::string_view(buf_).substr(0, at));
        buf_.erase(0, at + which.size());
        if (which == kDsRegionOpen || which == kDsRegionClose) {
          in_region_ = which == kDsRegionOpen;
          held_ws_.clear();  // the region marker is layout, like a call
          if (!content_started_) strip_leading_ = true;
          continue;
        }
        call_open_ = std::string(which);
        ws_before_call_ = std::move(held_ws_);
        held_ws_.clear();
        mode_ = Mode::kCall;
        continue;
      }
      case Mode::kCall: {
        const std::string_view close = fmt_.tools == ToolCallFormat::kDeepseekV3 ? kDsCallClose : kHermesClose;
        const size_t at = buf_.find(close);
        if (at == std::string::npos && !final) return;
        const std::string_view body = std::string_view(buf_).substr(0, at == std::string::npos ? buf_.size() : at);
        const size_t consumed = at == std::string::npos ? buf_.size() : at + close.size();
        if (!add_call(d, body)) {
          // Not a call after all: the text as the model wrote it.
          held_ws_ = std::move(ws_before_call_);
          std::string raw = call_open_;
          raw += std::string_view(buf_).substr(0, consumed);
          if (!content_started_ && !held_ws_.empty()) content_started_ = true;
          emit_content(d, raw);
        }
        ws_before_call_.clear();
        buf_.erase(0, consumed);
        mode_ = Mode::kContent;
        if (final && buf_.empty()) return;
        continue;
      }
      case Mode::kJsonCalls: {
        if (!final) return;
        // {"name":..,"parameters":..} objects, separated by ';' or whitespace.
        std::string_view s = buf_;
        size_t i = skip_ws(s);
        if (s.substr(i).starts_with(kPythonTag)) i += kPythonTag.size();
        OutputDelta tmp;
        std::vector<ToolCall> before = calls_;
        bool ok = true;
        for (;;) {
          i = skip_ws(s, i);
          if (i < s.size() && s[i] == ';') i = skip_ws(s, i + 1);
          if (i >= s.size()) break;
          const size_t e = s[i] == '{' ? object_end(s, i) : std::string_view::npos;
          if (e == std::string_view::npos || !add_call(&tmp, s.substr(i, e - i))) {
            ok = false;
            break;
          }
          i = e;
        }
        if (ok && !tmp.calls.empty()) {
          for (ToolCall& c : tmp.calls) d->calls.push_back(std::move(c));
        } else {
          calls_ = std::move(before);
          content_started_ = false;
          strip_leading_ = false;
          emit_content(d, buf_);
        }
        buf_.clear();
        mode_ = Mode::kDone;
        return;
      }
    }
  }
}

}  // namespace moesh::serve
