// Chat formatting: turns a list of messages into the prompt text a model was trained on.
//
// A GGUF carries its template as Jinja source in `tokenizer.chat_template`. Rather than run
// arbitrary Jinja, moesh recognises the template families it supports from marker strings in that
// source (the way llama.cpp's llm_chat_detect_template does) and renders them with C++ code that
// reproduces the template's output byte for byte:
//
//   chatml    <|im_start|>role\ncontent<|im_end|>\n ...  (Qwen, Qwen2/3, many fine-tunes)
//   deepseek3 <｜begin▁of▁sentence｜>system<｜User｜>..<｜Assistant｜>..<｜end▁of▁sentence｜>
//   deepseek2 (DeepSeek-V2 chat) "User: ...\n\nAssistant: ..." with BOS/EOS text
//   llama3    <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
//   harmony   (gpt-oss) <|start|>role<|message|>content<|end|> ... <|start|>assistant
//   mistral   (Mixtral) [INST] ... [/INST] answer</s>
//
// `--chat-template NAME` (or a Jinja source containing a family's markers) overrides the file's
// template. An unrecognised template is an error naming the known names, not a silent fallback.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moesh/gguf/gguf.h"
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
  std::string role;  // "system" | "user" | "assistant" (| "developer" for harmony)
  std::string content;
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
  explicit ChatTemplate(ChatFormat f) : format_(f) {}
  ChatTemplate(ChatFormat f, ChatTemplateOptions opt) : format_(f), opt_(std::move(opt)) {}
  // A family name or Jinja source (the family and its options detected from it).
  static Result<ChatTemplate> from_spec(std::string_view spec);
  // From the GGUF: `override_spec` (a family name or Jinja source) when non-empty, else
  // tokenizer.chat_template. Errors: no template in the file and no override; unknown family.
  static Result<ChatTemplate> from_gguf(const gguf::File& file, std::string_view override_spec = {});

  ChatFormat format() const { return format_; }
  const ChatTemplateOptions& options() const { return opt_; }
  // The prompt text. add_generation_prompt appends the assistant turn header so the model
  // answers next. Errors (kInvalidArgument): an unknown role, an empty message list, or an
  // ordering the template itself rejects (e.g. mistral requires user/assistant alternation).
  Result<std::string> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
  // The same prompt as render() (the concatenated texts are render()'s output byte for byte;
  // render() is built on this), split into maximal runs of template text and message content.
  // Segments are never empty and neighbours always differ in is_content.
  Result<std::vector<ChatSegment>> render_segments(const std::vector<ChatMessage>& messages,
                                                   bool add_generation_prompt = true) const;
  // Texts that end an assistant turn in this format (e.g. "<|im_end|>"); generation also stops
  // on the tokenizer's end-of-generation tokens, these catch templates whose end marker is text.
  std::vector<std::string> stop_strings() const;
  // True when the rendered text already starts with the BOS text, so the caller must not add
  // a BOS token again when tokenizing.
  bool renders_bos() const;

 private:
  ChatFormat format_;
  ChatTemplateOptions opt_;
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
// when the vocabulary asks for it and the template does not render its own; EOS is never
// appended (the model is to continue the prompt).
Result<std::vector<int32_t>> tokenize_chat(const Tokenizer& tok, const ChatTemplate& tmpl,
                                           const std::vector<ChatMessage>& messages, bool add_generation_prompt = true);

}  // namespace moesh
