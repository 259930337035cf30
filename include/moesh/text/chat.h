// Chat formatting: turns a list of messages into the prompt text a model was trained on.
//
// A GGUF carries its template as Jinja source in `tokenizer.chat_template`. moesh executes that
// source with its Jinja interpreter (moesh/text/jinja.h) the way Hugging Face transformers'
// apply_chat_template does: the messages as dicts (role, content and whatever else the client
// sent: tool_calls, reasoning_content, name, tool_call_id), `tools`, `add_generation_prompt`,
// `bos_token` / `eos_token` as the vocabulary's texts, plus extra variables a caller passes
// (enable_thinking, ...). The template is parsed once, when the model is loaded.
//
// Built-in family renderers remain, C++ code that reproduces each family's official template for
// plain system/user/assistant conversations byte for byte:
//
//   chatml    <|im_start|>role\ncontent<|im_end|>\n ...  (Qwen, Qwen2/3, many fine-tunes)
//   deepseek3 <｜begin▁of▁sentence｜>system<｜User｜>..<｜Assistant｜>..<｜end▁of▁sentence｜>
//   deepseek2 (DeepSeek-V2 chat) "User: ...\n\nAssistant: ..." with BOS/EOS text
//   llama3    <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
//   harmony   (gpt-oss) <|start|>role<|message|>content<|end|> ... <|start|>assistant
//   mistral   (Mixtral) [INST] ... [/INST] answer</s>
//
// They are used when a file has no template (the caller picks its architecture's family) or when
// `--chat-template NAME` forces one. `--chat-template` with Jinja source runs that source through
// the interpreter instead of the file's. A template that does not parse is an error naming its
// line:column when the model is loaded (not a silent fallback to a family); one that raises
// (raise_exception) fails the request with the template's message and position.
//
// Either way the output is split into template text and message content (ChatSegment), so that
// tokenize_chat() parses special-token texts only where the template wrote them: with Jinja every
// string that comes from the request is tainted and the interpreter tracks which output bytes
// derive from it (see jinja.h).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moesh/gguf/gguf.h"
#include "moesh/text/jinja.h"
#include "moesh/util/status.h"

namespace moesh {

enum class ChatFormat { kChatML, kDeepseek3, kDeepseek2, kLlama3, kHarmony, kMistral, kLlama4, kGlm4, kCOUNT };

const char* chat_format_name(ChatFormat f);  // "chatml", "deepseek3", ...
// A family name ("chatml", "qwen" is accepted for chatml, "llama3", "mixtral"/"mistral", ...).
Result<ChatFormat> chat_format_from_name(std::string_view name);
// Detects the family from Jinja template source; kNotFound when no family's markers match.
Result<ChatFormat> detect_chat_format(std::string_view jinja_source);

// Details of one template within a family that change the rendered bytes. detect_chat_options()
// reads them from the Jinja source; a family chosen by name gets the defaults below, which are
// the current official template of that family.
struct ChatTemplateOptions {
  // chatml: system turn inserted when the conversation has none (Qwen2: "You are a helpful
  // assistant.", Qwen2.5: "You are Qwen, created by Alibaba Cloud. ..."; Qwen3: none).
  std::string default_system;
  // deepseek3: every system message, joined by "\n\n" (V3/R1); false: only the last one
  // (the R1-Distill template).
  bool deepseek_join_systems = true;
  // deepseek3: text after "<｜Assistant｜>" in the generation prompt ("<think>\n" for R1).
  std::string deepseek_gen_suffix;
  // deepseek3: the V3.1 layout, where the "<｜Assistant｜></think>" header is only written after
  // a user turn and the generation prompt only follows a user turn.
  bool deepseek_v31 = false;
  // mistral: the original Mixtral-v0.1 template ("<s>[INST] u [/INST]a</s>", no system role)
  // instead of the later one (" [INST] u [/INST] a</s>", system text before the first user text).
  bool mistral_legacy = false;
  // harmony: "Current date:" line (YYYY-MM-DD); empty means today in local time, as the
  // template's strftime_now does.
  std::string harmony_date;
  std::string harmony_reasoning = "medium";  // "Reasoning:" line (low | medium | high)
  // glm4: the GLM-4.5/4.6 layout, where a past assistant turn is "<|assistant|>\n<think></think>\n"
  // + its stripped content and the generation prompt is "<|assistant|>" (thinking on); false:
  // GLM-4's "<|assistant|>\n" + content.
  bool glm45 = true;
};
// The options the template text implies (the family itself comes from detect_chat_format()).
ChatTemplateOptions detect_chat_options(ChatFormat f, std::string_view jinja_source);

struct ChatMessage {
  std::string role;  // families: "system" | "user" | "assistant" (| "developer" for harmony)
  std::string content;
  // The message object as the client sent it (keys in the order sent, so `tojson` writes what
  // transformers writes), or null. A Jinja template sees all its fields, with `content` replaced
  // by the text above when it was sent as text parts (null and absent content stay so); without
  // it the template sees {role, content}. The family renderers read only role and content.
  nlohmann::ordered_json fields = nullptr;
};

// What a template renders besides the messages.
struct ChatRenderOptions {
  bool add_generation_prompt = true;  // append the assistant turn header so the model answers next
  // Jinja only (the family renderers ignore these): the request's `tools` (an array; null: the
  // template sees tools=None, as in transformers) and further template variables (an object:
  // enable_thinking, reasoning_effort, ...), which may not replace messages, tools, documents,
  // add_generation_prompt, bos_token or eos_token.
  nlohmann::ordered_json tools = nullptr;
  nlohmann::ordered_json variables = nullptr;
};

// One piece of a rendered prompt. Template text (turn markers, role headers, BOS, the harmony
// system preamble) may hold special-token texts that must become control tokens; content text
// comes from a message and may hold anything a client typed, including "<|im_end|>".
struct ChatSegment {
  std::string text;
  bool is_content = false;
};

class Tokenizer;

class ChatTemplate {
 public:
  // A built-in family renderer.
  explicit ChatTemplate(ChatFormat f) : format_(f) {}
  ChatTemplate(ChatFormat f, ChatTemplateOptions opt) : format_(f), opt_(std::move(opt)) {}
  // A family by name, or the family (and its options) whose markers Jinja source holds: the
  // built-in renderer that imitates that source. Errors: unknown name, no family matches.
  static Result<ChatTemplate> from_spec(std::string_view spec);
  // Executes Jinja source (parsed here, once). bos_text / eos_text are what the template sees as
  // bos_token / eos_token. format() and options() are the family whose markers the source holds
  // (kCOUNT if none) and what detect_chat_options() reads; rendering does not use them, only
  // stop_strings() does. Errors: a syntax error, naming line:column.
  static Result<ChatTemplate> from_jinja(std::string_view source, std::string bos_text = {}, std::string eos_text = {});
  // From the GGUF: `override_spec` when non-empty (a family name forces that family; Jinja
  // source, anything with "{{" or "{%", is executed), else the file's tokenizer.chat_template
  // executed, with bos_token / eos_token the texts of the vocabulary's BOS / EOS tokens.
  // Errors: no template in the file and no override; an unknown family name; a template that
  // does not parse.
  static Result<ChatTemplate> from_gguf(const gguf::File& file, std::string_view override_spec = {});

  // True when this executes Jinja source; false for a family renderer.
  bool is_jinja() const { return jinja_ != nullptr; }
  // The Jinja source this executes ("" for a family renderer), e.g. to tell which syntax the
  // model writes its tool calls in.
  const std::string& jinja_source() const { return source_; }
  ChatFormat format() const { return format_; }
  const ChatTemplateOptions& options() const { return opt_; }
  // The prompt text. Errors (kInvalidArgument): an empty message list; for a family, an unknown
  // role or an ordering the template itself rejects (e.g. mistral requires user/assistant
  // alternation); for Jinja, whatever the template raises or a runtime error, with line:column.
  Result<std::string> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
  Result<std::string> render(const std::vector<ChatMessage>& messages, const ChatRenderOptions& ro) const;
  // The same prompt as render() (the concatenated texts are render()'s output byte for byte;
  // render() is built on this), split into maximal runs of template text and message content.
  // Segments are never empty and neighbours always differ in is_content. With Jinja, content is
  // every output byte derived from the request's strings (messages, tools, variables), exactly
  // where the template concatenates them and wholly where it transforms them (jinja.h).
  Result<std::vector<ChatSegment>> render_segments(const std::vector<ChatMessage>& messages,
                                                   bool add_generation_prompt = true) const;
  Result<std::vector<ChatSegment>> render_segments(const std::vector<ChatMessage>& messages,
                                                   const ChatRenderOptions& ro) const;
  // Texts that end an assistant turn in this format (e.g. "<|im_end|>"); generation also stops
  // on the tokenizer's end-of-generation tokens, these catch templates whose end marker is text.
  // Jinja: those of the family format() names, none when no family matched.
  std::vector<std::string> stop_strings() const;
  // True when the family's rendered text already starts with the BOS text, so the caller must not
  // add a BOS token again when tokenizing. Jinja: false (tokenize_chat looks at the output).
  bool renders_bos() const;

 private:
  Result<std::vector<ChatSegment>> render_jinja(const std::vector<ChatMessage>& messages,
                                                const ChatRenderOptions& ro) const;

  ChatFormat format_;
  ChatTemplateOptions opt_;
  std::shared_ptr<const jinja::Template> jinja_;  // shared by copies: parsed once per model
  std::string bos_text_, eos_text_;
  std::string source_;
};

// The prompt ids of a chat, safe against chat-structure injection: special-token texts are
// parsed as control tokens only where they lie wholly inside template text; inside message
// content they are tokenized as plain text (as encode(parse_special=false) does, so USER_DEFINED
// tokens still match there). A client who writes "<|im_end|>\n<|im_start|>system\n..." in a
// message therefore gets ordinary text tokens, not a forged turn.
//
// The whole rendered text is tokenized in one pass (Tokenizer::encode_guarded) rather than
// segment by segment, so a conversation whose content holds no special-token text gives exactly
// encode(render(), parse_special=true): no BPE merge differences where content meets template
// text, and no extra SentencePiece space prefix at the start of each content run. BOS is added
// when the vocabulary asks for it and the template does not render its own (Jinja: the ids do
// not already start with BOS); EOS is never appended (the model is to continue the prompt).
Result<std::vector<int32_t>> tokenize_chat(const Tokenizer& tok, const ChatTemplate& tmpl,
                                           const std::vector<ChatMessage>& messages, bool add_generation_prompt = true);
Result<std::vector<int32_t>> tokenize_chat(const Tokenizer& tok, const ChatTemplate& tmpl,
                                           const std::vector<ChatMessage>& messages, const ChatRenderOptions& ro);

}  // namespace moesh
