// What a chat model generated, split the way OpenAI clients want it: the answer (`content`), the
// thinking before it (`reasoning_content`) and the function calls it asked for (`tool_calls`).
//
// Models write all three as plain text in their own template family's syntax:
//
//   reasoning  <think> ... </think> answer           (Qwen3, DeepSeek-R1, GLM-4.5, MiniMax-M2); a
//              template whose generation prompt already opens <think> makes the output start
//              inside reasoning (starts_in_reasoning)
//   kHermes    <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>     (Qwen2.5/3, Hermes)
//   kLlama3Json the whole answer is {"name": "f", "parameters": {...}}, optionally after
//              <|python_tag|>; several calls separated by ';'            (Llama 3.1/3.2/3.3)
//   kDeepseekV3 <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{...}\n```
//              <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>   (also V3.1's "f<｜tool▁sep｜>{...}")
//   kGlm45     <tool_call>f\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>...</tool_call>
//
// (llama.cpp's common/chat.cpp names these formats "Hermes 2 Pro", "Llama 3.x", "DeepSeek R1 /
// V3.1" and "GLM 4.5"; the code here is our own.) The format is chosen from markers in the
// template source (detect_output_format). gpt-oss's harmony channels are not parsed: their
// markers are control tokens, which the server's detokenizer does not write out.
//
// ChatOutputParser is incremental: push() takes the text as it streams and returns what can be
// said for sure so far; finish() returns the rest. Pushing a text in any split gives the same
// totals as pushing it whole. A call that does not parse (bad JSON, no name, no closing marker)
// is returned as content, as written — never an error.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "moesh/text/chat.h"

namespace moesh::serve {

enum class ToolCallFormat { kNone, kHermes, kLlama3Json, kDeepseekV3, kGlm45, kHarmony, kCOUNT };
const char* tool_call_format_name(ToolCallFormat f);  // "none", "hermes", "llama3_json", ...

// How a template's model writes its output.
struct OutputFormat {
  ToolCallFormat tools = ToolCallFormat::kNone;
  bool think_tags = false;  // the template knows <think>...</think>
  // gpt-oss's harmony format: <|channel|>analysis|commentary|final<|message|>...<|end|>, calls as
  // "to=functions.NAME" on a commentary message ending in <|call|>. Its markers are control
  // tokens, so the generation's text must render special tokens (GenerationRequest).
  bool harmony = false;
};
// From Jinja template source; a family renderer (no source) gets {kNone, false}.
OutputFormat detect_output_format(std::string_view template_source);

// True when the rendered generation prompt ends inside an open <think> (after trailing
// whitespace), so the model's first words are reasoning.
bool prompt_opens_reasoning(std::string_view rendered_prompt);
// True when it ends with a closed, empty reasoning block (Qwen3 with enable_thinking false:
// "<think>\n\n</think>\n\n"): the model answers without thinking.
bool prompt_closes_reasoning(std::string_view rendered_prompt);

// True when the template wants an assistant tool call's `arguments` as an object: it renders a
// string not at all or not as JSON (tojson of a string, Llama 3.1) or it iterates an object's
// items (GLM-4.5, whose string branch is a debugging fallback); false when it writes a string
// as is (Qwen3, DeepSeek-V3). Found by rendering a probe call both ways (as llama.cpp's minja
// does); templates without tool calls give false.
bool template_wants_object_arguments(const ChatTemplate& tmpl);
// Replaces every assistant tool call's `function.arguments` given as a JSON string by the object
// it holds (messages' fields; strings that are not a JSON object stay strings).
void tool_call_arguments_to_objects(std::vector<ChatMessage>* messages);

// True when the template fails on an assistant message whose content is null (OpenAI's shape
// for a turn that only calls tools; Qwen3's tests `'</think>' in content`) but renders it with
// "" — then null_content_to_empty() makes such contents "" (llama.cpp's polyfill). Templates
// that tell null from "" (DeepSeek-V3) keep null.
bool template_rejects_null_content(const ChatTemplate& tmpl);
void null_content_to_empty(std::vector<ChatMessage>* messages);

struct ToolCall {
  std::string id;  // "call_..."
  std::string name;
  std::string arguments;  // JSON text of an object
};

// What one push()/finish() adds. Calls come whole: a call is only known once its closing marker
// arrives, so a streamed call is one delta (the caller may split its arguments into fragments).
struct OutputDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> calls;
  int first_call_index = 0;  // the index of calls[0] among all of this output's calls
  bool empty() const { return content.empty() && reasoning.empty() && calls.empty(); }
};

class ChatOutputParser {
 public:
  // parse_tools false: tool-call syntax stays content. id_prefix: ids are id_prefix + index.
  ChatOutputParser(OutputFormat format, bool parse_tools, bool starts_in_reasoning, std::string id_prefix = "call_");

  OutputDelta push(std::string_view text);
  OutputDelta finish();

  // Totals so far.
  const std::string& content() const { return content_; }
  const std::string& reasoning() const { return reasoning_; }
  const std::vector<ToolCall>& tool_calls() const { return calls_; }

 private:
  enum class Mode { kStart, kReasoning, kContent, kCall, kJsonCalls, kDone };
  void step(OutputDelta* d, bool final);
  // harmony: a message header until <|message|>, then its body until an end marker.
  enum class HarmonyPart { kHeader, kBody };
  enum class HarmonyKind { kContent, kReasoning, kCall };
  void step_harmony(OutputDelta* d, bool final);
  void emit_content(OutputDelta* d, std::string_view s);
  void emit_reasoning(OutputDelta* d, std::string_view s);
  bool add_call(OutputDelta* d, std::string_view body);

  OutputFormat fmt_;
  bool parse_tools_;
  std::string id_prefix_;
  Mode mode_;
  std::string buf_;      // text not yet classified
  std::string held_ws_;  // trailing whitespace of content, written when more content follows
  bool content_started_ = false;
  bool strip_leading_ = false;  // drop whitespace before the next content (after </think>, a call)
  std::string ws_before_call_;  // restored when the call turns out not to parse
  bool in_region_ = false;      // DeepSeek: inside <｜tool▁calls▁begin｜> ... <｜tool▁calls▁end｜>
  std::string call_open_;       // the marker that opened the current call (for the fallback)
  std::string content_, reasoning_;
  std::vector<ToolCall> calls_;
  HarmonyPart h_part_ = HarmonyPart::kHeader;
  HarmonyKind h_kind_ = HarmonyKind::kContent;
  std::string h_call_name_, h_call_body_;
};

// One parsed call body (without its markers) in `format`; false when it does not parse.
bool parse_tool_call_body(ToolCallFormat format, std::string_view body, std::string* name, std::string* arguments);

}  // namespace moesh::serve
