// The grammar of a forced tool call: what `tool_choice: "required"` or a named function lets the
// model write, in its chat template family's own call syntax (chat_output.h), so the answer is
// always a call that ChatOutputParser parses, with arguments matching the tool's JSON Schema.
//
// Per family (one alternative per tool, NAME fixed, ARGS the tool's `parameters` schema):
//   hermes       <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>   [ws, more calls]
//   llama3_json  {"name": "NAME", "parameters": ARGS}                               [; more calls]
//   deepseek_v3  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS
//                \n```<｜tool▁call▁end｜>[\n more calls]<｜tool▁calls▁end｜>
//   harmony      <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS  (then the
//                end-of-generation <|call|>)
// Reasoning comes first where the template knows <think>: free text up to </think> (when the
// prompt opened it) or an optional <think>...</think> block (none when the prompt closed it). GLM-4.5's argument tags
// are not JSON: that family is kUnsupported (the call is then parsed, not forced).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moesh/text/output_grammar.h"
#include "moesh/util/status.h"
#include "serve/chat_output.h"

namespace moesh::serve {

struct ToolGrammarOptions {
  bool parallel = true;              // parallel_tool_calls: more calls may follow the first
  bool starts_in_reasoning = false;  // the prompt left a <think> open
  bool reasoning_closed = false;     // the prompt closed reasoning: no <think> block before the call
};

struct ToolGrammar {
  std::shared_ptr<const OutputGrammar> grammar;
  // Tools whose `parameters` use schema keywords constrained decoding cannot enforce: their
  // arguments are only forced to be a JSON object ("get_weather: schema.properties.x.pattern").
  std::vector<std::string> relaxed;
};

// tools: the request's validated `tools` (after tool_choice: a named function leaves only it).
Result<ToolGrammar> tool_call_grammar(const OutputFormat& fmt, const nlohmann::ordered_json& tools,
                                      const ToolGrammarOptions& o);

}  // namespace moesh::serve
