// Forced tool calls (src/serve/tool_grammar.h over src/text/output_grammar.h): random walks through
// each family's grammar always end as calls that ChatOutputParser parses, naming a given tool,
// with arguments that match its schema (checked here independently); a named function gives only
// it; parallel_tool_calls false gives one call; prose is refused from the first byte.
#include <gtest/gtest.h>

#include <random>

#include "moesh/text/output_grammar.h"
#include "serve/chat_output.h"
#include "serve/tool_grammar.h"

namespace moesh::serve {
namespace {

using ojson = nlohmann::ordered_json;

ojson two_tools() {
  return ojson::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
      "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
      "properties": {"tz": {"type": "string", "maxLength": 8}}, "required": ["tz"], "additionalProperties": false}}}
  ])");
}

// The arguments a call may carry, checked without the grammar code.
bool args_match(const std::string& name, const ojson& a) {
  if (!a.is_object()) return false;
  if (name == "get_weather") {
    if (!a.contains("city") || (a["city"] != "Paris" && a["city"] != "Oslo")) return false;
    for (auto it = a.begin(); it != a.end(); ++it) {
      if (it.key() == "days") {
        if (!it->is_number_integer() || *it < 1 || *it > 7) return false;
      } else if (it.key() != "city") {
        return false;
      }
    }
    return true;
  }
  if (name == "get_time") {
    if (a.size() != 1 || !a.contains("tz") || !a["tz"].is_string()) return false;
    // maxLength counts code points.
    const std::string s = a["tz"].get<std::string>();
    size_t cps = 0;
    for (unsigned char c : s) cps += (c & 0xC0) != 0x80;
    return cps <= 8;
  }
  return false;
}

// A random walk over chunks (each family's markers whole, JSON structure, every ASCII byte); late in
// the walk the closing chunks win, so most walks end.
bool random_output(const std::shared_ptr<const OutputGrammar>& g, std::mt19937_64& rng, std::string* out) {
  static const std::vector<std::string> alphabet = [] {
    std::vector<std::string> a = {"<tool_call>\n",
                                  "\n</tool_call>",
                                  "<think>",
                                  "</think>",
                                  "\n",
                                  " ",
                                  "{",
                                  "}",
                                  "\"",
                                  ":",
                                  ",",
                                  "; ",
                                  "-",
                                  "é",
                                  "<｜tool▁calls▁begin｜>",
                                  "<｜tool▁call▁begin｜>function<｜tool▁sep｜>",
                                  "\n```json\n",
                                  "\n```",
                                  "<｜tool▁call▁end｜>",
                                  "<｜tool▁calls▁end｜>",
                                  "<|channel|>",
                                  "<|message|>",
                                  "<|end|>",
                                  "<|start|>assistant",
                                  "commentary to=functions.",
                                  "analysis",
                                  " <|constrain|>json",
                                  "get_weather",
                                  "get_time",
                                  "Paris",
                                  "Oslo",
                                  "{\"name\": \"",
                                  "\", \"arguments\": ",
                                  "\", \"parameters\": ",
                                  "city",
                                  "days",
                                  "tz"};
    // Every printable ASCII byte, so any marker can also be spelled a byte at a time.
    for (char c = ' '; c <= '~'; ++c) a.emplace_back(1, c);
    a.emplace_back("｜");  // DeepSeek's markers' own characters
    a.emplace_back("▁");
    return a;
  }();
  static const std::vector<std::string> closing = {
      "}", "\"", "\n</tool_call>", "</think>", "\n```", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "<|end|>", "1"};
  OutputMatcher m(g);
  out->clear();
  for (int step = 0; step < 1000; ++step) {
    if (m.complete() && (step > 60 || std::uniform_int_distribution<int>(0, 2)(rng) == 0)) return true;
    std::vector<size_t> ok;
    for (size_t i = 0; i < alphabet.size(); ++i) {
      OutputMatcher c = m;
      if (c.feed(alphabet[i])) ok.push_back(i);
    }
    if (ok.empty()) return m.complete();
    size_t pick = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
    if (step > 60) {
      std::vector<size_t> closers;
      for (size_t i : ok) {
        if (std::find(closing.begin(), closing.end(), alphabet[i]) != closing.end()) closers.push_back(i);
      }
      if (!closers.empty()) pick = closers[std::uniform_int_distribution<size_t>(0, closers.size() - 1)(rng)];
    }
    EXPECT_TRUE(m.feed(alphabet[pick]));
    *out += alphabet[pick];
  }
  return m.complete();
}

struct Family {
  const char* name;
  OutputFormat fmt;
  bool starts_in_reasoning;
};

std::vector<Family> families() {
  OutputFormat hermes{ToolCallFormat::kHermes, true, false};
  OutputFormat llama{ToolCallFormat::kLlama3Json, false, false};
  OutputFormat ds{ToolCallFormat::kDeepseekV3, true, false};
  OutputFormat ds_plain{ToolCallFormat::kDeepseekV3, false, false};
  OutputFormat harmony{ToolCallFormat::kHarmony, false, true};
  return {{"hermes+think", hermes, false},  {"hermes open think", hermes, true}, {"llama3_json", llama, false},
          {"deepseek_v3+think", ds, false}, {"deepseek_v3", ds_plain, false},    {"harmony", harmony, false}};
}

void check_walks(const Family& f, const ojson& tools, bool parallel, std::mt19937_64& rng, int* multi_calls) {
  ToolGrammarOptions o;
  o.parallel = parallel;
  o.starts_in_reasoning = f.starts_in_reasoning;
  auto tg = tool_call_grammar(f.fmt, tools, o);
  ASSERT_TRUE(tg) << f.name << ": " << tg.status().to_string();
  EXPECT_TRUE(tg->relaxed.empty());
  int complete = 0;
  for (int walk = 0; walk < 120; ++walk) {
    std::string text;
    if (!random_output(tg->grammar, rng, &text)) continue;
    ++complete;
    ChatOutputParser p(f.fmt, true, f.starts_in_reasoning);
    p.push(text);
    p.finish();
    const auto& calls = p.tool_calls();
    ASSERT_GE(calls.size(), 1u) << f.name << ": " << text;
    if (!parallel) {
      EXPECT_EQ(calls.size(), 1u) << f.name << ": " << text;
    }
    if (calls.size() > 1) ++*multi_calls;
    EXPECT_TRUE(p.content().empty()) << f.name << ": content '" << p.content() << "' in " << text;
    for (const ToolCall& c : calls) {
      bool known = false;
      for (const ojson& t : tools) known |= t["function"]["name"] == c.name;
      EXPECT_TRUE(known) << f.name << ": " << c.name;
      const ojson a = ojson::parse(c.arguments, nullptr, false);
      EXPECT_TRUE(args_match(c.name, a)) << f.name << ": " << c.name << " " << c.arguments << " in " << text;
    }
  }
  EXPECT_GE(complete, 80) << f.name << ": most walks should end complete";
}

TEST(ToolGrammar, RandomWalksAreCallsThatParseAndMatch) {
  std::mt19937_64 rng(20261203);
  for (const Family& f : families()) {
    int multi = 0;
    check_walks(f, two_tools(), /*parallel=*/true, rng, &multi);
    // Harmony ends a message at its one call; the others may repeat.
    if (!f.fmt.harmony) {
      EXPECT_GT(multi, 0) << f.name << ": parallel walks should sometimes make several calls";
    }
    int none = 0;
    check_walks(f, two_tools(), /*parallel=*/false, rng, &none);
    EXPECT_EQ(none, 0);
  }
}

TEST(ToolGrammar, NamedFunctionGivesOnlyIt) {
  std::mt19937_64 rng(7);
  ojson only = ojson::array({two_tools()[1]});
  for (const Family& f : families()) {
    auto tg = tool_call_grammar(f.fmt, only, ToolGrammarOptions{false, f.starts_in_reasoning});
    ASSERT_TRUE(tg);
    for (int walk = 0; walk < 30; ++walk) {
      std::string text;
      if (!random_output(tg->grammar, rng, &text)) continue;
      ChatOutputParser p(f.fmt, true, f.starts_in_reasoning);
      p.push(text);
      p.finish();
      ASSERT_EQ(p.tool_calls().size(), 1u) << text;
      EXPECT_EQ(p.tool_calls()[0].name, "get_time");
    }
  }
}

TEST(ToolGrammar, ProseAndOtherToolsAreRefused) {
  const OutputFormat hermes{ToolCallFormat::kHermes, false, false};
  auto tg = tool_call_grammar(hermes, two_tools(), {});
  ASSERT_TRUE(tg);
  OutputMatcher m(tg->grammar);
  EXPECT_FALSE(m.complete());  // an empty answer is not a call
  EXPECT_FALSE(OutputMatcher(m).feed("Sure"));
  EXPECT_FALSE(OutputMatcher(m).feed("<tool_call>\n{\"name\": \"get_stock\""));
  EXPECT_FALSE(OutputMatcher(m).feed("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": 3"));
  OutputMatcher ok = m;
  ASSERT_TRUE(ok.feed("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"));
  EXPECT_TRUE(ok.complete());
  EXPECT_FALSE(OutputMatcher(ok).feed("and then some prose"));
  // The end-of-call marker may not hide inside an argument string (the parser would cut there).
  EXPECT_FALSE(OutputMatcher(m).feed("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"</tool_call>"));
  EXPECT_TRUE(OutputMatcher(m).feed("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"</tool_"));
  auto harmony = tool_call_grammar(OutputFormat{ToolCallFormat::kHarmony, false, true}, two_tools(), {});
  ASSERT_TRUE(harmony);
  OutputMatcher h(harmony->grammar);
  EXPECT_TRUE(
      OutputMatcher(h).feed("<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"tz\": \"<"));
  EXPECT_FALSE(
      OutputMatcher(h).feed("<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"tz\": \"<|"));
}

TEST(ToolGrammar, UnenforceableSchemaRelaxesToAnObject) {
  ojson tools = two_tools();
  tools[1]["function"]["parameters"]["properties"]["tz"]["pattern"] = "^[A-Z]+$";
  auto tg = tool_call_grammar(OutputFormat{ToolCallFormat::kHermes, false, false}, tools, {});
  ASSERT_TRUE(tg);
  ASSERT_EQ(tg->relaxed.size(), 1u);
  EXPECT_NE(tg->relaxed[0].find("get_time"), std::string::npos);
  EXPECT_NE(tg->relaxed[0].find("pattern"), std::string::npos);
  OutputMatcher m(tg->grammar);
  EXPECT_TRUE(m.feed("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": [1]}}\n</tool_call>"));
  EXPECT_TRUE(m.complete());
}

TEST(ToolGrammar, FamiliesWithoutJsonCallsAreUnsupported) {
  auto glm = tool_call_grammar(OutputFormat{ToolCallFormat::kGlm45, true, false}, two_tools(), {});
  EXPECT_EQ(glm.status().code(), StatusCode::kUnsupported);
  auto none = tool_call_grammar(OutputFormat{}, two_tools(), {});
  EXPECT_EQ(none.status().code(), StatusCode::kUnsupported);
  EXPECT_FALSE(tool_call_grammar(OutputFormat{ToolCallFormat::kHermes, false, false}, ojson::array(), {}));
}

// The NFA's pieces on their own.
TEST(OutputGrammar, UntilFindsOverlappingMarkersAndSpaceIsBounded) {
  auto g = std::make_shared<OutputGrammar>();
  const int32_t u = g->until("aab");
  const int32_t s = g->space(2);
  const int32_t l = g->literal("x");
  g->link(u, s);
  g->link(s, l);
  g->link(l, OutputGrammar::kEnd);
  g->start_at(u);
  OutputMatcher m(g);
  EXPECT_TRUE(m.feed("zaaaab"));  // the marker ends inside a longer run of 'a'
  OutputMatcher two = m;
  EXPECT_TRUE(two.feed("  x"));
  EXPECT_TRUE(two.complete());
  EXPECT_FALSE(OutputMatcher(m).feed("   x"));  // three spaces: over the bound
  OutputMatcher none = m;
  EXPECT_TRUE(none.feed("x"));
  EXPECT_TRUE(none.complete());
  EXPECT_FALSE(OutputMatcher(none).feed("x"));
}

}  // namespace
}  // namespace moesh::serve
