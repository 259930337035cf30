// Splitting generated chat text into content, reasoning_content and tool_calls per template
// family (src/serve/chat_output.h): whole outputs, the same outputs streamed in arbitrary
// chunk splits, malformed calls falling back to content, and detection from the real templates.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "moesh/text/chat.h"
#include "serve/chat_output.h"

namespace moesh::serve {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

std::string read_template(const char* name) {
  std::ifstream in(fs::path(MOESH_SOURCE_DIR) / "tests" / "text" / "jinja" / "real" / name, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Parsed {
  std::string content, reasoning;
  std::vector<ToolCall> calls;
};

Parsed parse_whole(OutputFormat f, std::string_view text, bool in_reasoning = false, bool tools = true) {
  ChatOutputParser p(f, tools, in_reasoning);
  p.push(text);
  p.finish();
  return {p.content(), p.reasoning(), p.tool_calls()};
}

// The same text pushed in pieces: the deltas must add up to the totals, and equal the whole run.
Parsed parse_split(OutputFormat f, std::string_view text, std::mt19937& rng, bool in_reasoning = false) {
  ChatOutputParser p(f, true, in_reasoning);
  Parsed got;
  auto take = [&](const OutputDelta& d) {
    got.content += d.content;
    got.reasoning += d.reasoning;
    EXPECT_EQ(d.first_call_index, static_cast<int>(got.calls.size()));
    for (const ToolCall& c : d.calls) got.calls.push_back(c);
  };
  size_t at = 0;
  while (at < text.size()) {
    const size_t n = std::min<size_t>(text.size() - at, 1 + rng() % 7);
    take(p.push(text.substr(at, n)));
    at += n;
  }
  take(p.finish());
  EXPECT_EQ(got.content, p.content());
  EXPECT_EQ(got.reasoning, p.reasoning());
  EXPECT_EQ(got.calls.size(), p.tool_calls().size());
  return got;
}

void expect_same(const Parsed& a, const Parsed& b, std::string_view text) {
  EXPECT_EQ(a.content, b.content) << text;
  EXPECT_EQ(a.reasoning, b.reasoning) << text;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << text;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].id, b.calls[i].id);
    EXPECT_EQ(a.calls[i].name, b.calls[i].name);
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments);
  }
}

const OutputFormat kQwen{ToolCallFormat::kHermes, true};
const OutputFormat kDeepseek{ToolCallFormat::kDeepseekV3, true};
const OutputFormat kGlm{ToolCallFormat::kGlm45, true};
const OutputFormat kLlama{ToolCallFormat::kLlama3Json, false};

TEST(ChatOutput, DetectsTheFormatFromTheRealTemplates) {
  const OutputFormat q = detect_output_format(read_template("qwen3.jinja"));
  EXPECT_EQ(q.tools, ToolCallFormat::kHermes);
  EXPECT_TRUE(q.think_tags);
  EXPECT_EQ(detect_output_format(read_template("deepseek_v3.jinja")).tools, ToolCallFormat::kDeepseekV3);
  const OutputFormat g = detect_output_format(read_template("glm4_5.jinja"));
  EXPECT_EQ(g.tools, ToolCallFormat::kGlm45);
  EXPECT_TRUE(g.think_tags);
  EXPECT_FALSE(detect_output_format(read_template("chatml.jinja")).think_tags);
  EXPECT_EQ(detect_output_format(read_template("chatml.jinja")).tools, ToolCallFormat::kNone);
  EXPECT_EQ(detect_output_format("").tools, ToolCallFormat::kNone);
  EXPECT_EQ(detect_output_format("<|start_header_id|>ipython<|end_header_id|> {{ tools }}").tools,
            ToolCallFormat::kLlama3Json);
  EXPECT_STREQ(tool_call_format_name(ToolCallFormat::kGlm45), "glm4_5");
}

TEST(ChatOutput, HermesCalls) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  const Parsed p = parse_whole(kQwen, text);
  EXPECT_EQ(p.content, "Let me check.");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Paris","days":2})") << "key order kept, compact";
  EXPECT_EQ(p.calls[0].id, "call_0");
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  EXPECT_EQ(p.calls[1].id, "call_1");
  // Arguments the model wrote as a JSON string are the same object.
  const Parsed s = parse_whole(kQwen, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].arguments, R"({"a":1})");
  EXPECT_EQ(s.content, "");
}

TEST(ChatOutput, ReasoningThenAnswerOrCall) {
  // Qwen3 with thinking: the model opens <think> itself.
  Parsed p = parse_whole(kQwen, "<think>\nThe user wants weather.\n</think>\n\nIt is sunny.");
  EXPECT_EQ(p.reasoning, "The user wants weather.");
  EXPECT_EQ(p.content, "It is sunny.");
  // A generation prompt that opened <think> (DeepSeek-R1, GLM-4.5 style): output starts inside.
  p = parse_whole(kDeepseek, "hmm, think\n</think>\n\nAnswer", /*in_reasoning=*/true);
  EXPECT_EQ(p.reasoning, "hmm, think");
  EXPECT_EQ(p.content, "Answer");
  // Reasoning, then a call, no content.
  p = parse_whole(kQwen,
                  "<think>\nneed a tool\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": "
                  "\"é\"}}\n</tool_call>");
  EXPECT_EQ(p.reasoning, "need a tool");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, R"({"x":"é"})");
  // Output cut inside reasoning: all of it is reasoning.
  p = parse_whole(kQwen, "<think>\nstill going", false);
  EXPECT_EQ(p.reasoning, "still going");
  EXPECT_EQ(p.content, "");
  // A template without think tags leaves <think> as content.
  p = parse_whole(OutputFormat{ToolCallFormat::kHermes, false}, "<think>x</think>y");
  EXPECT_EQ(p.content, "<think>x</think>y");
}

TEST(ChatOutput, DeepseekCalls) {
  const std::string v3 =
      "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
      "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n"
      "```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  Parsed p = parse_whole(kDeepseek, v3);
  EXPECT_EQ(p.content, "Sure.");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(p.calls[1].name, "get_time");
  // V3.1 layout.
  p = parse_whole(kDeepseek,
                  "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": [1, 2]}<｜tool▁call▁end｜>"
                  "<｜tool▁calls▁end｜>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "f");
  EXPECT_EQ(p.calls[0].arguments, R"({"a":[1,2]})");
  EXPECT_EQ(p.content, "");
}

TEST(ChatOutput, Glm45Calls) {
  const std::string text =
      "<think>look it up</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
      "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{\"u\": "
      "\"c\"}</arg_value>\n</tool_call>";
  const Parsed p = parse_whole(kGlm, text);
  EXPECT_EQ(p.reasoning, "look it up");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Paris","days":3,"opts":{"u":"c"}})");
}

TEST(ChatOutput, Llama3JsonCalls) {
  Parsed p = parse_whole(kLlama, R"({"name": "get_weather", "parameters": {"city": "Paris"}})");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(p.content, "");
  p = parse_whole(kLlama, R"(<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"k": "}"}})");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[1].name, "b");
  EXPECT_EQ(p.calls[1].arguments, R"({"k":"}"})");
  // Plain answers and JSON that is no call stay content.
  p = parse_whole(kLlama, "It is sunny in Paris.");
  EXPECT_EQ(p.content, "It is sunny in Paris.");
  EXPECT_TRUE(p.calls.empty());
  p = parse_whole(kLlama, R"({"answer": 42})");
  EXPECT_EQ(p.content, R"({"answer": 42})");
  EXPECT_TRUE(p.calls.empty());
}

TEST(ChatOutput, MalformedCallsFallBackToContent) {
  const char* cases[] = {
      "before <tool_call>{not json}</tool_call> after",
      "<tool_call>\n{\"arguments\": {}}\n</tool_call>",  // no name
      "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",
      "text <tool_call>\n{\"name\": \"f\", \"argu",  // cut off
      "<tool_call>",
      "<tool_call></tool_call>",
  };
  for (const char* c : cases) {
    const Parsed p = parse_whole(kQwen, c);
    EXPECT_TRUE(p.calls.empty()) << c;
    EXPECT_EQ(p.content, c) << "the text as written";
  }
  // A good call next to a bad one: the good one is a call, the bad one text.
  const Parsed p = parse_whole(kQwen, "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{x}</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, "<tool_call>{x}</tool_call>");
  // An unclosed call whose JSON is complete still counts (the model stopped at EOS).
  const Parsed u = parse_whole(kQwen, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n");
  ASSERT_EQ(u.calls.size(), 1u);
  EXPECT_EQ(u.content, "");
  // DeepSeek and GLM bodies that do not parse.
  EXPECT_TRUE(parse_whole(kDeepseek, "<｜tool▁call▁begin｜>nothing here<｜tool▁call▁end｜>").calls.empty());
  EXPECT_TRUE(parse_whole(kGlm, "<tool_call>f\n<arg_key>a</arg_key>oops</tool_call>").calls.empty());
}

TEST(ChatOutput, WithoutToolsCallSyntaxIsContent) {
  const std::string text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  const Parsed p = parse_whole(kQwen, text, false, /*tools=*/false);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, text);
  // Plain text is returned byte for byte, leading and trailing whitespace included.
  EXPECT_EQ(parse_whole(kQwen, "  hello \n").content, "  hello \n");
  EXPECT_EQ(parse_whole(OutputFormat{}, "\n\nx  ").content, "\n\nx  ");
}

TEST(ChatOutput, HarmonyChannels) {
  const std::string tmpl = [] {
    std::ifstream in(fs::path(MOESH_SOURCE_DIR) / "tests" / "serve" / "server" / "harmony.jinja", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }();
  const OutputFormat f = detect_output_format(tmpl);
  EXPECT_TRUE(f.harmony);
  EXPECT_EQ(f.tools, ToolCallFormat::kHarmony);
  EXPECT_FALSE(f.think_tags);
  struct Case {
    std::string text, content, reasoning;
    std::vector<std::pair<std::string, std::string>> calls;
  };
  const std::vector<Case> cases = {
      {"<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Answer.",
       "Answer.",
       "Think.",
       {}},
      {"<|channel|>final<|message|>Just the answer.", "Just the answer.", "", {}},
      {"<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
       "<|constrain|>json<|message|>{\"city\": \"Paris\"}",
       "",
       "Hm.",
       {{"get_weather", R"({"city":"Paris"})"}}},
      // The recipient in the role header, two calls, then the answer.
      {"<|start|>assistant to=functions.a<|channel|>commentary json<|message|>{\"x\": 1}<|call|>"
       "<|start|>assistant to=functions.b<|channel|>commentary json<|message|>{}<|call|>",
       "",
       "",
       {{"a", R"({"x":1})"}, {"b", "{}"}}},
      // A call whose body is not an object is content; plain text outside the format is content.
      {"<|channel|>commentary to=functions.a<|message|>not json<|call|>", "not json", "", {}},
      {"Plain words, no markers.", "Plain words, no markers.", "", {}},
      // A missing <|end|> before the next header still ends the analysis.
      {"<|channel|>analysis<|message|>A<|start|>assistant<|channel|>final<|message|>B", "B", "A", {}},
  };
  std::mt19937 rng(5);
  for (const Case& c : cases) {
    const Parsed whole = parse_whole(f, c.text);
    EXPECT_EQ(whole.content, c.content) << c.text;
    EXPECT_EQ(whole.reasoning, c.reasoning) << c.text;
    ASSERT_EQ(whole.calls.size(), c.calls.size()) << c.text;
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(whole.calls[i].name, c.calls[i].first) << c.text;
      EXPECT_EQ(whole.calls[i].arguments, c.calls[i].second) << c.text;
    }
    for (int k = 0; k < 20; ++k) expect_same(parse_split(f, c.text, rng), whole, c.text);
  }
  // Without tools a commentary call's body is content.
  const Parsed no_tools = parse_whole(f, cases[2].text, false, /*tools=*/false);
  EXPECT_TRUE(no_tools.calls.empty());
  EXPECT_EQ(no_tools.content, R"({"city": "Paris"})");
}

TEST(ChatOutput, StreamedInAnySplitEqualsWhole) {
  const std::vector<std::pair<OutputFormat, std::string>> corpus = {
      {kQwen,
       "<think>\nThe user wants weather.\n</think>\n\nI'll check.\n<tool_call>\n{\"name\": \"get_weather\", "
       "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"t\", \"arguments\": "
       "{}}\n</tool_call>"},
      {kQwen, "plain answer with a < sign and <tool_ and </think> words  "},
      {kQwen, "a <tool_call>{bad}</tool_call> b <tool_call>{\"name\": \"f\"}</tool_call>  c "},
      {kDeepseek,
       "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
       "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {kGlm, "<think>x</think><tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>"},
      {kLlama, "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": \"日本\"}}"},
      {kLlama, "not a call"},
  };
  std::mt19937 rng(1234);
  for (const auto& [fmt, text] : corpus) {
    const Parsed whole = parse_whole(fmt, text);
    for (int rep = 0; rep < 50; ++rep) expect_same(parse_split(fmt, text, rng), whole, text);
  }
  // Starting in reasoning, split too.
  const std::string r = "  step one\n\nstep two \n</think>\n\nDone.";
  const Parsed whole = parse_whole(kQwen, r, true);
  EXPECT_EQ(whole.reasoning, "step one\n\nstep two");
  EXPECT_EQ(whole.content, "Done.");
  for (int rep = 0; rep < 50; ++rep) expect_same(parse_split(kQwen, r, rng, true), whole, r);
}

// Random mixes of markers and text: never a crash, and the streamed deltas add up.
TEST(ChatOutput, FuzzedOutputsNeverCrash) {
  const std::vector<std::string> pieces = {"<tool_call>",
                                           "</tool_call>",
                                           "<think>",
                                           "</think>",
                                           "{",
                                           "}",
                                           "\"name\"",
                                           ":",
                                           "\"f\"",
                                           ",",
                                           "\"arguments\"",
                                           " ",
                                           "\n",
                                           "x",
                                           "<｜tool▁call▁begin｜>",
                                           "<｜tool▁sep｜>",
                                           "<｜tool▁call▁end｜>",
                                           "<｜tool▁calls▁begin｜>",
                                           "<arg_key>",
                                           "</arg_key>",
                                           "<arg_value>",
                                           "</arg_value>",
                                           "\xff",
                                           "```",
                                           "<|channel|>",
                                           "<|message|>",
                                           "<|start|>",
                                           "<|end|>",
                                           "<|call|>",
                                           "analysis",
                                           "final",
                                           " to=functions.f",
                                           "commentary"};
  std::mt19937 rng(99);
  OutputFormat harmony;
  harmony.harmony = true;
  harmony.tools = ToolCallFormat::kHarmony;
  for (const OutputFormat f : {kQwen, kDeepseek, kGlm, kLlama, harmony}) {
    for (int i = 0; i < 300; ++i) {
      std::string text;
      const int n = 1 + static_cast<int>(rng() % 20);
      for (int k = 0; k < n; ++k) text += pieces[rng() % pieces.size()];
      const bool in_r = rng() % 2 == 0;
      const Parsed whole = parse_whole(f, text, in_r);
      expect_same(parse_split(f, text, rng, in_r), whole, text);
    }
  }
}

TEST(ChatOutput, PromptOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
}

// Which templates want a call's arguments as an object (they iterate or tojson them), found by
// rendering; and the conversion of the OpenAI string form.
TEST(ChatOutput, ObjectArgumentsFollowTheTemplate) {
  auto tmpl = [](const char* name) {
    auto t = ChatTemplate::from_jinja(read_template(name));
    EXPECT_TRUE(t.is_ok()) << name;
    return std::move(*t);
  };
  EXPECT_FALSE(template_wants_object_arguments(tmpl("qwen3.jinja"))) << "writes a string as is";
  EXPECT_FALSE(template_wants_object_arguments(tmpl("deepseek_v3.jinja"))) << "concatenates the string";
  EXPECT_TRUE(template_wants_object_arguments(tmpl("glm4_5.jinja"))) << "iterates arguments.items()";
  EXPECT_FALSE(template_wants_object_arguments(ChatTemplate(ChatFormat::kChatML)));
  EXPECT_TRUE(template_rejects_null_content(tmpl("qwen3.jinja"))) << "'</think>' in content";
  EXPECT_FALSE(template_rejects_null_content(tmpl("deepseek_v3.jinja"))) << "tests content is none";

  std::vector<ChatMessage> msgs(2);
  msgs[0].role = "assistant";
  msgs[0].fields = ojson::parse(
      R"({"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"b\": 1, \"a\": 2}"}},
          {"function":{"name":"g","arguments":"not json"}}]})");
  msgs[1].role = "user";
  msgs[1].fields = ojson::parse(R"({"role":"user","content":"{\"a\": 1}"})");
  tool_call_arguments_to_objects(&msgs);
  EXPECT_EQ(msgs[0].fields["tool_calls"][0]["function"]["arguments"].dump(), R"({"b":1,"a":2})");
  EXPECT_EQ(msgs[0].fields["tool_calls"][1]["function"]["arguments"], "not json");
  EXPECT_EQ(msgs[1].fields["content"], "{\"a\": 1}");

  // GLM-4.5 renders the converted call with its keys and values.
  const ChatTemplate glm = tmpl("glm4_5.jinja");
  std::vector<ChatMessage> conv = {{"user", "Weather?", ojson{{"role", "user"}, {"content", "Weather?"}}}, msgs[0]};
  conv[1].fields["tool_calls"].erase(1);
  auto out = glm.render(conv, false);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_NE(out->find("<arg_key>b</arg_key>"), std::string::npos) << *out;
}

}  // namespace
}  // namespace moesh::serve
