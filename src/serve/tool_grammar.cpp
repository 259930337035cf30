// tool_call_grammar: see tool_grammar.h.
#include "serve/tool_grammar.h"

#include <fmt/format.h>

#include <string_view>

#include "moesh/text/json_grammar.h"

namespace moesh::serve {
namespace {

using ojson = nlohmann::ordered_json;

struct Tool {
  std::string name;
  std::shared_ptr<const JsonGrammar> args;
};

// Each tool's name and the grammar of its arguments. A schema constrained decoding cannot
// enforce (a `pattern`, a `format`, ...) relaxes that tool's arguments to any JSON object, named
// in *relaxed: refusing the request would break the agent that sent a tool it cannot change.
std::vector<Tool> compile_tools(const ojson& tools, std::vector<std::string>* relaxed) {
  std::vector<Tool> out;
  for (const ojson& t : tools) {
    const ojson& fn = t["function"];
    Tool tool;
    tool.name = fn["name"].get<std::string>();
    auto p = fn.find("parameters");
    ojson schema = p != fn.end() && p->is_object() ? *p : ojson{{"type", "object"}};
    if (!schema.contains("type") && !schema.contains("$ref") && !schema.contains("anyOf") &&
        !schema.contains("oneOf") && !schema.contains("enum") && !schema.contains("const")) {
      schema["type"] = "object";  // OpenAI's parameters are always an object
    }
    auto g = compile_json_schema(schema);
    if (g.is_ok()) {
      tool.args = std::move(*g);
    } else {
      relaxed->push_back(fmt::format("{}: {}", tool.name, g.status().message()));
      tool.args = json_object_grammar();
    }
    out.push_back(std::move(tool));
  }
  return out;
}

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

// Where the calls begin, after the reasoning a <think> template allows.
void add_reasoning(OutputGrammar& g, const OutputFormat& fmt, const ToolGrammarOptions& o, int32_t calls) {
  if (!fmt.think_tags || o.reasoning_closed) {
    g.start_at(calls);
    return;
  }
  const int32_t thought = g.until(std::string(kThinkClose));
  const int32_t gap = g.space(4);
  g.link(thought, gap);
  g.link(gap, calls);
  if (o.starts_in_reasoning) {
    g.start_at(thought);
    return;
  }
  const int32_t open = g.literal(std::string(kThinkOpen));
  g.link(open, thought);
  g.start_at(open);
  g.start_at(calls);
}

// One call per tool between `open` and `close` pieces: open -> head(NAME) -> ARGS -> tail -> close.
// `forbid`: the marker that ends a call for ChatOutputParser, which must not appear inside the
// arguments (in a string value it would cut the call short).
void add_calls(OutputGrammar& g, const std::vector<Tool>& tools, int32_t open, int32_t close,
               const std::string& head_before, const std::string& head_after, const std::string& tail,
               const std::string& forbid) {
  for (const Tool& t : tools) {
    const int32_t head = g.literal(head_before + t.name + head_after);
    const int32_t args = g.json(t.args, forbid);
    const int32_t end = g.literal(tail);
    g.link(open, head);
    g.link(head, args);
    g.link(args, end);
    g.link(end, close);
  }
}

// parallel_tool_calls: after a call's `close`, the `sep` piece leads to another call's `open`.
void allow_more_calls(OutputGrammar& g, const ToolGrammarOptions& o, int32_t close, int32_t sep, int32_t open) {
  if (!o.parallel) return;
  g.link(close, sep);
  g.link(sep, open);
}

}  // namespace

Result<ToolGrammar> tool_call_grammar(const OutputFormat& fmt, const ojson& tools, const ToolGrammarOptions& o) {
  if (!tools.is_array() || tools.empty()) {
    return make_error(StatusCode::kInvalidArgument, "a forced tool call needs at least one tool");
  }
  ToolGrammar out;
  const std::vector<Tool> ts = compile_tools(tools, &out.relaxed);
  auto g = std::make_shared<OutputGrammar>();
  if (fmt.harmony) {
    // One call per message: <|call|> (end of generation) ends it. No analysis message first:
    // its end marker <|end|> may be an end-of-generation token, which the mask only allows once
    // the output is complete.
    const int32_t call = g->literal("");
    const int32_t done = g->literal("");
    // Any harmony marker ends the message for the parser: none inside the arguments.
    add_calls(*g, ts, call, done, "<|channel|>commentary to=functions.", " <|constrain|>json<|message|>", "", "<|");
    g->link(done, OutputGrammar::kEnd);
    g->start_at(call);
    out.grammar = std::move(g);
    return out;
  }
  switch (fmt.tools) {
    case ToolCallFormat::kHermes: {
      const int32_t open = g->literal("<tool_call>\n");
      const int32_t close = g->literal("\n</tool_call>");
      add_calls(*g, ts, open, close, "{\"name\": \"", "\", \"arguments\": ", "}", "</tool_call>");
      g->link(close, OutputGrammar::kEnd);
      allow_more_calls(*g, o, close, g->space(2), open);
      add_reasoning(*g, fmt, o, open);
      break;
    }
    case ToolCallFormat::kLlama3Json: {
      const int32_t open = g->literal("");
      const int32_t close = g->literal("");
      add_calls(*g, ts, open, close, "{\"name\": \"", "\", \"parameters\": ", "}", "");
      g->link(close, OutputGrammar::kEnd);
      allow_more_calls(*g, o, close, g->literal("; "), open);
      add_reasoning(*g, fmt, o, open);
      break;
    }
    case ToolCallFormat::kDeepseekV3: {
      const int32_t region = g->literal("<｜tool▁calls▁begin｜>");
      const int32_t open = g->literal("<｜tool▁call▁begin｜>function<｜tool▁sep｜>");
      const int32_t close = g->literal("<｜tool▁call▁end｜>");
      const int32_t region_end = g->literal("<｜tool▁calls▁end｜>");
      g->link(region, open);
      add_calls(*g, ts, open, close, "", "\n```json\n", "\n```", "<｜tool▁call▁end｜>");
      g->link(close, region_end);
      g->link(region_end, OutputGrammar::kEnd);
      allow_more_calls(*g, o, close, g->literal("\n"), open);
      add_reasoning(*g, fmt, o, region);
      break;
    }
    case ToolCallFormat::kGlm45:
      return make_error(StatusCode::kUnsupported,
                        "GLM-4.5's tool-call syntax (argument tags) cannot be forced by a JSON grammar");
    case ToolCallFormat::kHarmony:  // handled above (fmt.harmony); reached only if the two disagree
    case ToolCallFormat::kNone:
    case ToolCallFormat::kCOUNT:
      return make_error(StatusCode::kUnsupported, "the chat template has no tool-call syntax to force");
  }
  out.grammar = std::move(g);
  return out;
}

}  // namespace moesh::serve
