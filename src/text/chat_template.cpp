// Chat templates (see include/moesh/text/chat.h): the file's Jinja template run by the
// interpreter, and the built-in family renderers.
//
// Each render_* function reproduces what the family's official Jinja template produces for plain
// text system/user/assistant conversations, rendered the way Hugging Face does it (trim_blocks and
// lstrip_blocks on, so block tags leave no whitespace of their own). The comments name the template
// behaviour each branch mirrors, because that behaviour (not our taste) decides every byte.
#include <algorithm>
#include <cstdint>
#include <ctime>
#include <string>

#include "moesh/text/chat.h"
#include "moesh/text/jinja.h"
#include "moesh/text/tokenizer.h"

namespace moesh {
namespace {

// Special-token texts. DeepSeek's use U+FF5C (fullwidth vertical bar) and U+2581 (lower block).
constexpr std::string_view kDsBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kDsEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kDsUser = "<｜User｜>";
constexpr std::string_view kDsAssistant = "<｜Assistant｜>";

struct NameEntry {
  std::string_view name;
  ChatFormat format;
};
// Accepted names; the first entry of each format is its canonical name.
constexpr NameEntry kNames[] = {
    {"chatml", ChatFormat::kChatML},         {"qwen", ChatFormat::kChatML},
    {"qwen2", ChatFormat::kChatML},          {"qwen3", ChatFormat::kChatML},
    {"deepseek3", ChatFormat::kDeepseek3},   {"deepseek-v3", ChatFormat::kDeepseek3},
    {"deepseek-r1", ChatFormat::kDeepseek3}, {"deepseek2", ChatFormat::kDeepseek2},
    {"deepseek-v2", ChatFormat::kDeepseek2}, {"llama3", ChatFormat::kLlama3},
    {"harmony", ChatFormat::kHarmony},       {"gpt-oss", ChatFormat::kHarmony},
    {"mistral", ChatFormat::kMistral},       {"mixtral", ChatFormat::kMistral},
    {"llama4", ChatFormat::kLlama4},         {"glm4", ChatFormat::kGlm4},
    {"glm-4.5", ChatFormat::kGlm4},          {"chatglm4", ChatFormat::kGlm4},
};

bool contains(std::string_view s, std::string_view needle) {
  return s.find(needle) != std::string_view::npos;
}

Status bad(std::string msg) {
  return Status(StatusCode::kInvalidArgument, std::move(msg));
}

// Jinja's `trim` filter is Python's str.strip(): it removes Unicode whitespace, not only ASCII.
size_t whitespace_len_at(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
  auto cp_at = [&](size_t n) -> uint32_t {  // decodes a 2- or 3-byte sequence, 0 if invalid
    if (i + n > s.size()) return 0;
    const auto b1 = static_cast<unsigned char>(s[i + 1]);
    if ((b1 & 0xc0) != 0x80) return 0;
    if (n == 2) return ((c & 0x1fu) << 6) | (b1 & 0x3fu);
    const auto b2 = static_cast<unsigned char>(s[i + 2]);
    if ((b2 & 0xc0) != 0x80) return 0;
    return ((c & 0x0fu) << 12) | ((b1 & 0x3fu) << 6) | (b2 & 0x3fu);
  };
  if ((c & 0xe0) == 0xc0) {
    const uint32_t cp = cp_at(2);
    return cp == 0x85 || cp == 0xa0 ? 2 : 0;
  }
  if ((c & 0xf0) == 0xe0) {
    const uint32_t cp = cp_at(3);
    const bool ws = cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
                    cp == 0x205f || cp == 0x3000;
    return ws ? 3 : 0;
  }
  return 0;
}

std::string_view jinja_trim(std::string_view s) {
  size_t b = 0;
  while (b < s.size()) {
    const size_t n = whitespace_len_at(s, b);
    if (n == 0) break;
    b += n;
  }
  // From the end: step back over whole characters by re-scanning forward from `b`, since
  // UTF-8 cannot be decoded backwards without looking at lead bytes.
  size_t e = b, last_non_ws = b;
  while (e < s.size()) {
    const size_t n = whitespace_len_at(s, e);
    if (n) {
      e += n;
    } else {
      const auto c = static_cast<unsigned char>(s[e]);
      size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 1;
      e = std::min(s.size(), e + len);
      last_non_ws = e;
    }
  }
  return s.substr(b, last_non_ws - b);
}

// Unescapes the body of a Jinja string literal (\n, \t, \\, \', \").
std::string unescape_literal(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char c = s[++i];
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Qwen2/2.5 templates write a literal default system turn
// ('<|im_start|>system\nYou are ...<|im_end|>\n'); Qwen3's only concatenates the caller's.
std::string find_chatml_default_system(std::string_view src) {
  constexpr std::string_view kHead = "<|im_start|>system";
  for (size_t pos = src.find(kHead); pos != std::string_view::npos; pos = src.find(kHead, pos + 1)) {
    size_t body = pos + kHead.size();
    if (src.substr(body, 2) == "\\n") {
      body += 2;
    } else if (src.substr(body, 1) == "\n") {
      body += 1;
    } else {
      continue;
    }
    const size_t end = src.find("<|im_end|>", body);
    if (end == std::string_view::npos) continue;
    const std::string_view text = src.substr(body, end - body);
    // Only a plain literal qualifies: anything with quotes or Jinja syntax is an expression.
    if (text.empty() || text.find_first_of("'\"{}+") != std::string_view::npos) continue;
    return unescape_literal(text);
  }
  return {};
}

std::string today_local() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

Status check_roles(const std::vector<ChatMessage>& msgs, bool allow_developer, const char* family) {
  if (msgs.empty()) return bad("chat template: the message list is empty");
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string& r = msgs[i].role;
    if (r == "system" || r == "user" || r == "assistant" || (allow_developer && r == "developer")) {
      continue;
    }
    return bad("chat template " + std::string(family) + ": message " + std::to_string(i) + " has unknown role '" + r +
               "' (expected system, user, assistant" + (allow_developer ? ", developer)" : ")"));
  }
  return Status::ok();
}

// Collects the rendered prompt as segments: t() appends template text, c() message content.
// Adjacent pieces of the same kind merge and empty pieces vanish, so the segments are maximal.
class Segments {
 public:
  Segments& t(std::string_view s) { return add(s, false); }
  Segments& c(std::string_view s) { return add(s, true); }
  std::vector<ChatSegment> take() { return std::move(segs_); }

 private:
  Segments& add(std::string_view s, bool content) {
    if (s.empty()) return *this;
    if (!segs_.empty() && segs_.back().is_content == content) {
      segs_.back().text += s;
    } else {
      segs_.push_back({std::string(s), content});
    }
    return *this;
  }
  std::vector<ChatSegment> segs_;
};

// <|im_start|>role\ncontent<|im_end|>\n for every message, the optional default system turn first.
std::vector<ChatSegment> render_chatml(const std::vector<ChatMessage>& msgs, bool gen, const ChatTemplateOptions& o) {
  Segments out;
  if (!o.default_system.empty() && msgs[0].role != "system") {
    // The operator's configured default, not a client's words: template text.
    out.t("<|im_start|>system\n").t(o.default_system).t("<|im_end|>\n");
  }
  for (const auto& m : msgs) out.t("<|im_start|>").t(m.role).t("\n").c(m.content).t("<|im_end|>\n");
  if (gen) out.t("<|im_start|>assistant\n");
  return out.take();
}

// BOS, then the system prompt (collected from every system message, wherever it is), then the
// turns. Assistant history keeps only the text after </think>: the template drops old reasoning.
std::vector<ChatSegment> render_deepseek3(const std::vector<ChatMessage>& msgs, bool gen,
                                          const ChatTemplateOptions& o) {
  Segments out;
  out.t(kDsBos);
  // The system prompt: every system message joined by "\n\n", or only the last one.
  const ChatMessage* last_system = nullptr;
  bool first_system = true;
  for (const auto& m : msgs) {
    if (m.role != "system") continue;
    if (o.deepseek_join_systems) {
      if (!first_system) out.t("\n\n");
      out.c(m.content);
    }
    last_system = &m;
    first_system = false;
  }
  if (!o.deepseek_join_systems && last_system) out.c(last_system->content);
  bool last_user = false;
  for (const auto& m : msgs) {
    if (m.role == "user") {
      out.t(kDsUser).c(m.content);
      last_user = true;
    } else if (m.role == "assistant") {
      std::string_view content = m.content;
      if (const size_t t = content.find("</think>"); t != std::string_view::npos) {
        // V3.1 splits at the first </think> (split(.., 1)[1]); V3/R1 keep the last piece.
        content = o.deepseek_v31 ? content.substr(t + 8) : content.substr(content.rfind("</think>") + 8);
      }
      if (o.deepseek_v31) {
        if (last_user) out.t(kDsAssistant).t("</think>");
      } else {
        out.t(kDsAssistant);
      }
      out.c(content).t(kDsEos);
      last_user = false;
    }
  }
  if (gen) {
    if (!o.deepseek_v31) {
      out.t(kDsAssistant).t(o.deepseek_gen_suffix);
    } else if (last_user) {
      out.t(kDsAssistant).t("</think>");
    }
  }
  return out.take();
}

// DeepSeek-V2 chat: "User: ..\n\n", "Assistant: ..<eos>", system text as its own paragraph.
std::vector<ChatSegment> render_deepseek2(const std::vector<ChatMessage>& msgs, bool gen) {
  Segments out;
  out.t(kDsBos);
  for (const auto& m : msgs) {
    if (m.role == "user") {
      out.t("User: ").c(m.content).t("\n\n");
    } else if (m.role == "assistant") {
      out.t("Assistant: ").c(m.content).t(kDsEos);
    } else {
      out.c(m.content).t("\n\n");
    }
  }
  if (gen) out.t("Assistant:");  // no trailing space: the model writes it
  return out.take();
}

// Llama 3 and Llama 4: BOS, then per turn start + role + end + "\n\n" + the trimmed content +
// the end-of-turn token; the two differ only in those tokens.
struct HeaderTokens {
  const char* start;
  const char* end;
  const char* eot;
};
constexpr HeaderTokens kLlama3Tokens{"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
constexpr HeaderTokens kLlama4Tokens{"<|header_start|>", "<|header_end|>", "<|eot|>"};

std::vector<ChatSegment> render_header_turns(const std::vector<ChatMessage>& msgs, bool gen, const HeaderTokens& h) {
  Segments out;
  out.t("<|begin_of_text|>");
  for (const auto& m : msgs) out.t(h.start).t(m.role).t(h.end).t("\n\n").c(jinja_trim(m.content)).t(h.eot);
  if (gen) out.t(h.start).t("assistant").t(h.end).t("\n\n");
  return out.take();
}

// GLM-4 / GLM-4.5: "[gMASK]<sop>", then "<|role|>\n" + content per turn; GLM-4.5 writes an empty
// think block before a past answer and leaves the generation prompt at "<|assistant|>" (the
// model opens its own <think>).
std::vector<ChatSegment> render_glm4(const std::vector<ChatMessage>& msgs, bool gen, const ChatTemplateOptions& o) {
  Segments out;
  out.t("[gMASK]<sop>");
  for (const auto& m : msgs) {
    if (m.role == "assistant") {
      if (o.glm45) {
        out.t("<|assistant|>\n<think></think>");
        const std::string_view c = jinja_trim(m.content);
        if (!c.empty()) out.t("\n").c(c);
      } else {
        out.t("<|assistant|>\n").c(m.content);
      }
      continue;
    }
    out.t("<|").t(m.role).t("|>\n").c(m.content);
  }
  if (gen) out.t(o.glm45 ? "<|assistant|>" : "<|assistant|>\n");
  return out.take();
}

// gpt-oss: a generated system message (identity, knowledge cutoff, date, reasoning effort,
// channels), the caller's first system/developer message as the developer "# Instructions",
// then the turns. The last assistant turn ends in <|return|> when no generation prompt follows.
Result<std::vector<ChatSegment>> render_harmony(const std::vector<ChatMessage>& msgs, bool gen,
                                                const ChatTemplateOptions& o) {
  Segments out;
  out.t("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n");
  out.t("Knowledge cutoff: 2024-06\n");
  out.t("Current date: ").t(o.harmony_date.empty() ? today_local() : o.harmony_date).t("\n\n");
  out.t("Reasoning: ").t(o.harmony_reasoning).t("\n\n");
  out.t("# Valid channels: analysis, commentary, final. Channel must be included for every message.");
  out.t("<|end|>");
  size_t first = 0;
  if (msgs[0].role == "system" || msgs[0].role == "developer") {
    first = 1;
    if (!msgs[0].content.empty()) {
      out.t("<|start|>developer<|message|># Instructions\n\n").c(msgs[0].content).t("\n\n<|end|>");
    }
  }
  for (size_t i = first; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "user") {
      out.t("<|start|>user<|message|>").c(m.content).t("<|end|>");
    } else if (m.role == "assistant") {
      if (contains(m.content, "<|channel|>analysis<|message|>") || contains(m.content, "<|channel|>final<|message|>")) {
        return bad("chat template harmony: message " + std::to_string(i) +
                   " contains <|channel|> tags in its content (the template rejects this)");
      }
      const bool last = i + 1 == msgs.size();
      out.t("<|start|>assistant<|channel|>final<|message|>").c(m.content).t(last && !gen ? "<|return|>" : "<|end|>");
    } else {
      // The template silently drops a later system/developer message; dropping the caller's
      // instructions without a word would hide a bug, so this is an error instead.
      return bad("chat template harmony: message " + std::to_string(i) + " has role '" + m.role +
                 "'; a system/developer message must come first");
    }
  }
  if (gen) out.t("<|start|>assistant");
  return out.take();
}

// Mixtral: strict user/assistant alternation after an optional first system message.
Result<std::vector<ChatSegment>> render_mistral(const std::vector<ChatMessage>& msgs, const ChatTemplateOptions& o) {
  size_t first = 0;
  const std::string* system = nullptr;
  if (msgs[0].role == "system") {
    if (o.mistral_legacy) {
      return bad(
          "chat template mistral (Mixtral v0.1): the template supports only user and "
          "assistant roles, not system");
    }
    system = &msgs[0].content;
    first = 1;
  }
  Segments out;
  out.t("<s>");
  for (size_t i = first; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    const bool expect_user = (i - first) % 2 == 0;
    if ((m.role == "user") != expect_user || (m.role != "user" && m.role != "assistant")) {
      return bad("chat template mistral: message " + std::to_string(i) + " has role '" + m.role +
                 "'; after the optional system message, roles must alternate user/assistant");
    }
    if (o.mistral_legacy) {
      if (m.role == "user") {
        out.t("[INST] ").c(m.content).t(" [/INST]");
      } else {
        out.c(m.content).t("</s>");
      }
    } else if (m.role == "user") {
      out.t(" [INST] ");
      if (i == first && system) out.c(*system).t("\n\n");
      out.c(m.content).t(" [/INST]");
    } else {
      out.t(" ").c(m.content).t("</s>");
    }
  }
  // No generation prompt: " [/INST]" already hands the turn to the assistant.
  return out.take();
}

}  // namespace

const char* chat_format_name(ChatFormat f) {
  for (const auto& e : kNames) {
    if (e.format == f) return e.name.data();
  }
  return "unknown";
}

Result<ChatFormat> chat_format_from_name(std::string_view name) {
  for (const auto& e : kNames) {
    if (e.name == name) return e.format;
  }
  std::string known;
  for (const auto& e : kNames) known += (known.empty() ? "" : ", ") + std::string(e.name);
  return bad("unknown chat template name '" + std::string(name) + "' (known: " + known + ")");
}

Result<ChatFormat> detect_chat_format(std::string_view src) {
  // Most specific markers first: harmony's and DeepSeek's tokens never appear in the others,
  // while "[INST]" and "User:"/"Assistant:" can appear as text inside other templates.
  if (contains(src, "<|channel|>") || contains(src, "<|start|>")) return ChatFormat::kHarmony;
  if (contains(src, "<|im_start|>")) return ChatFormat::kChatML;
  if (contains(src, kDsAssistant) && contains(src, kDsUser)) return ChatFormat::kDeepseek3;
  if (contains(src, "[gMASK]<sop>")) return ChatFormat::kGlm4;
  if (contains(src, "<|header_start|>") && contains(src, "<|header_end|>")) return ChatFormat::kLlama4;
  if (contains(src, "<|start_header_id|>")) return ChatFormat::kLlama3;
  if (contains(src, "[INST]")) return ChatFormat::kMistral;
  if (contains(src, "Assistant:") && contains(src, "User:")) return ChatFormat::kDeepseek2;
  return Status(StatusCode::kNotFound,
                "chat template: no known family (chatml, deepseek3, deepseek2, llama3, llama4, glm4, "
                "harmony, mistral) matches the template source");
}

ChatTemplateOptions detect_chat_options(ChatFormat f, std::string_view src) {
  ChatTemplateOptions o;
  switch (f) {
    case ChatFormat::kChatML:
      o.default_system = find_chatml_default_system(src);
      break;
    case ChatFormat::kDeepseek3:
      o.deepseek_v31 = contains(src, "is_last_user") && contains(src, "'</think>'");
      // The distill template overwrites ns.system_prompt; V3/R1 accumulate with is_first_sp.
      o.deepseek_join_systems = contains(src, "is_first_sp");
      if (contains(src, "<｜Assistant｜><think>\\n") || contains(src, "<｜Assistant｜><think>\n")) {
        o.deepseek_gen_suffix = "<think>\n";
      }
      break;
    case ChatFormat::kMistral:
      o.mistral_legacy = !contains(src, "' [INST] '") && contains(src, "'[INST] ' + message['content'] + ' [/INST]'");
      break;
    case ChatFormat::kGlm4:
      o.glm45 = contains(src, "<think></think>");
      break;
    default:
      break;
  }
  return o;
}

Result<ChatTemplate> ChatTemplate::from_spec(std::string_view spec) {
  if (auto named = chat_format_from_name(spec); named) return ChatTemplate(*named);
  auto f = detect_chat_format(spec);
  if (!f) {
    // A short spec without template syntax was meant as a name: say which names exist.
    if (spec.size() < 32 && !contains(spec, "{")) return chat_format_from_name(spec).status();
    return f.status();
  }
  return ChatTemplate(*f, detect_chat_options(*f, spec));
}

Result<ChatTemplate> ChatTemplate::from_jinja(std::string_view source, std::string bos_text, std::string eos_text) {
  auto parsed = jinja::Template::parse(source);
  if (!parsed) return Status(parsed.status().code(), "chat template: " + parsed.status().message());
  auto family = detect_chat_format(source);
  ChatTemplate t(family ? *family : ChatFormat::kCOUNT);
  if (family) t.opt_ = detect_chat_options(*family, source);
  t.jinja_ = std::make_shared<const jinja::Template>(std::move(*parsed));
  t.bos_text_ = std::move(bos_text);
  t.eos_text_ = std::move(eos_text);
  t.source_ = std::string(source);
  return t;
}

namespace {
// The text of the vocabulary's token `id_key` (bos/eos), "" when the file has none.
std::string special_token_text(const gguf::File& file, const std::vector<std::string>& tokens, const char* id_key) {
  auto id = file.get_or<int64_t>(id_key, -1);
  if (!id || *id < 0 || static_cast<size_t>(*id) >= tokens.size()) return {};
  return tokens[static_cast<size_t>(*id)];
}
}  // namespace

Result<ChatTemplate> ChatTemplate::from_gguf(const gguf::File& file, std::string_view override_spec) {
  std::string source;
  if (!override_spec.empty()) {
    if (auto named = chat_format_from_name(override_spec); named) return ChatTemplate(*named);
    if (!contains(override_spec, "{{") && !contains(override_spec, "{%")) {
      return chat_format_from_name(override_spec).status();  // names the known families
    }
    source = std::string(override_spec);
  } else {
    if (!file.has("tokenizer.chat_template")) {
      return Status(StatusCode::kNotFound, "the model has no tokenizer.chat_template; name one with --chat-template");
    }
    MOESH_ASSIGN_OR_RETURN(source, file.get<std::string>("tokenizer.chat_template"));
  }
  std::vector<std::string> tokens;
  if (file.has("tokenizer.ggml.tokens")) {
    MOESH_ASSIGN_OR_RETURN(tokens, file.get<std::vector<std::string>>("tokenizer.ggml.tokens"));
  }
  return from_jinja(source, special_token_text(file, tokens, "tokenizer.ggml.bos_token_id"),
                    special_token_text(file, tokens, "tokenizer.ggml.eos_token_id"));
}

namespace {
// Splits a tracked rendering into maximal template/content segments.
std::vector<ChatSegment> segments_of(const jinja::Template::Rendered& r) {
  Segments segs;
  size_t at = 0;
  for (const jinja::TextRange& t : r.tainted) {
    segs.t(std::string_view(r.text).substr(at, t.begin - at));
    segs.c(std::string_view(r.text).substr(t.begin, t.end - t.begin));
    at = t.end;
  }
  segs.t(std::string_view(r.text).substr(at));
  return segs.take();
}

// Variables the renderer sets itself; a caller's template variables may not replace them.
constexpr std::string_view kReservedVariables[] = {"messages",  "tools",    "documents", "add_generation_prompt",
                                                   "bos_token", "eos_token"};
}  // namespace

Result<std::vector<ChatSegment>> ChatTemplate::render_jinja(const std::vector<ChatMessage>& messages,
                                                            const ChatRenderOptions& ro) const {
  if (messages.empty()) return bad("chat template: the message list is empty");
  // Everything from the request is untrusted: its strings are tainted, so the special-token texts
  // in them stay text (tokenize_chat). bos_token, eos_token and the template's literals are not.
  jinja::Value msgs = jinja::Value::list();
  for (const ChatMessage& m : messages) {
    jinja::Value d = jinja::Value::dict();
    if (m.fields.is_object()) {
      for (auto it = m.fields.begin(); it != m.fields.end(); ++it) {
        // Text parts were joined into m.content; null or absent content stays as sent.
        const bool text_parts = it.key() == "content" && it.value().is_array();
        d.set(it.key(), text_parts ? jinja::Value(m.content) : jinja::Value::from_json(it.value()));
      }
      if (!m.fields.contains("role")) d.set("role", jinja::Value(m.role));
    } else {
      d.set("role", jinja::Value(m.role));
      d.set("content", jinja::Value(m.content));
    }
    msgs.push_back(std::move(d));
  }
  jinja::Value ctx = jinja::Value::dict();
  if (ro.variables.is_object()) {
    for (auto it = ro.variables.begin(); it != ro.variables.end(); ++it) {
      for (std::string_view r : kReservedVariables) {
        if (it.key() == r) return bad("chat template: the template variable '" + it.key() + "' cannot be set");
      }
      ctx.set(it.key(), jinja::Value::from_json(it.value()));
    }
  } else if (!ro.variables.is_null()) {
    return bad("chat template: template variables must be an object");
  }
  ctx.set("messages", std::move(msgs));
  ctx.set("tools", ro.tools.is_null() ? jinja::Value::none() : jinja::Value::from_json(ro.tools));
  ctx.set("documents", jinja::Value::none());
  jinja::taint_strings(ctx);
  ctx.set("add_generation_prompt", jinja::Value(ro.add_generation_prompt));
  ctx.set("bos_token", jinja::Value(bos_text_));
  ctx.set("eos_token", jinja::Value(eos_text_));
  MOESH_ASSIGN_OR_RETURN(jinja::Template::Rendered r, jinja_->render_tracked(ctx));
  return segments_of(r);
}

Result<std::vector<ChatSegment>> ChatTemplate::render_segments(const std::vector<ChatMessage>& messages,
                                                               bool add_generation_prompt) const {
  ChatRenderOptions ro;
  ro.add_generation_prompt = add_generation_prompt;
  return render_segments(messages, ro);
}

Result<std::vector<ChatSegment>> ChatTemplate::render_segments(const std::vector<ChatMessage>& messages,
                                                               const ChatRenderOptions& ro) const {
  if (jinja_) return render_jinja(messages, ro);
  const bool add_generation_prompt = ro.add_generation_prompt;
  const bool harmony = format_ == ChatFormat::kHarmony;
  MOESH_RETURN_IF_ERROR(check_roles(messages, harmony, chat_format_name(format_)));
  switch (format_) {
    case ChatFormat::kChatML:
      return render_chatml(messages, add_generation_prompt, opt_);
    case ChatFormat::kDeepseek3:
      return render_deepseek3(messages, add_generation_prompt, opt_);
    case ChatFormat::kDeepseek2:
      return render_deepseek2(messages, add_generation_prompt);
    case ChatFormat::kLlama3:
      return render_header_turns(messages, add_generation_prompt, kLlama3Tokens);
    case ChatFormat::kHarmony:
      return render_harmony(messages, add_generation_prompt, opt_);
    case ChatFormat::kMistral:
      return render_mistral(messages, opt_);
    case ChatFormat::kLlama4:
      return render_header_turns(messages, add_generation_prompt, kLlama4Tokens);
    case ChatFormat::kGlm4:
      return render_glm4(messages, add_generation_prompt, opt_);
    case ChatFormat::kCOUNT:
      break;
  }
  return Status(StatusCode::kInternal, "chat template: invalid format");
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  ChatRenderOptions ro;
  ro.add_generation_prompt = add_generation_prompt;
  return render(messages, ro);
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages, const ChatRenderOptions& ro) const {
  MOESH_ASSIGN_OR_RETURN(std::vector<ChatSegment> segs, render_segments(messages, ro));
  std::string out;
  for (const ChatSegment& s : segs) out += s.text;
  return out;
}

Result<std::vector<int32_t>> tokenize_chat(const Tokenizer& tok, const ChatTemplate& tmpl,
                                           const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  ChatRenderOptions ro;
  ro.add_generation_prompt = add_generation_prompt;
  return tokenize_chat(tok, tmpl, messages, ro);
}

Result<std::vector<int32_t>> tokenize_chat(const Tokenizer& tok, const ChatTemplate& tmpl,
                                           const std::vector<ChatMessage>& messages, const ChatRenderOptions& ro) {
  MOESH_ASSIGN_OR_RETURN(std::vector<ChatSegment> segs, tmpl.render_segments(messages, ro));
  std::string text;
  std::vector<Tokenizer::Span> trusted;  // the template segments: where special tokens may match
  for (const ChatSegment& s : segs) {
    if (!s.is_content) trusted.push_back({text.size(), s.text.size()});
    text += s.text;
  }
  // add_special would also append EOS for add_eos vocabularies; a prompt must not end the turn.
  MOESH_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.encode_guarded(text, trusted, /*add_special=*/false));
  // The template's own BOS text became the BOS token above; adding one more would give the
  // model a prompt it never saw in training.
  // A Jinja template that writes bos_token shows it as the first id (as llama.cpp, one BOS).
  const bool has_bos = tmpl.is_jinja() ? !ids.empty() && ids[0] == tok.bos() : tmpl.renders_bos();
  if (tok.add_bos() && tok.bos() >= 0 && !has_bos) ids.insert(ids.begin(), tok.bos());
  return ids;
}

std::vector<std::string> ChatTemplate::stop_strings() const {
  switch (format_) {
    case ChatFormat::kChatML:
      return {"<|im_end|>"};
    case ChatFormat::kDeepseek3:
    case ChatFormat::kDeepseek2:
      return {std::string(kDsEos)};
    case ChatFormat::kLlama3:
      return {"<|eot_id|>"};
    // <|end|> closes the analysis channel mid-answer; only these two end the assistant's turn.
    case ChatFormat::kHarmony:
      return {"<|return|>", "<|call|>"};
    case ChatFormat::kMistral:
      return {"</s>"};
    case ChatFormat::kLlama4:
      return {"<|eot|>", "<|eom|>"};
    // GLM ends a turn by starting the next role (its generation config's EOS list).
    case ChatFormat::kGlm4:
      return {"<|user|>", "<|observation|>", "<|endoftext|>"};
    case ChatFormat::kCOUNT:
      break;
  }
  return {};
}

bool ChatTemplate::renders_bos() const {
  if (jinja_) return false;
  switch (format_) {
    case ChatFormat::kDeepseek3:
    case ChatFormat::kDeepseek2:
    case ChatFormat::kLlama3:
    case ChatFormat::kLlama4:
    case ChatFormat::kMistral:
      return true;
    default:
      return false;
  }
}

}  // namespace moesh
