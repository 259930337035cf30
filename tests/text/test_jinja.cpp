// The Jinja interpreter (moesh/text/jinja.h).
//
// JinjaReference.*: byte-for-byte against Debian's python3-jinja2 rendering the way HF
// transformers does (tests/text/jinja_ref.py): every feature template in tests/text/jinja/features
// with its context under both whitespace settings, and every real chat template in
// tests/text/jinja/real over every conversation in tests/text/jinja/conversations. Where Jinja2
// raises, moesh must return an error too. Without python3 or jinja2 these report Skipped.
//
// Jinja.*: what needs no reference — the API, exact strings for the whitespace options, error
// positions and messages, the sandbox's immutability, strftime_now, limits.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moesh/text/jinja.h"
#include "text/jinja_ref_util.h"

namespace moesh::jinja {
namespace {

namespace fs = std::filesystem;
using test::python;
using test::read_file;
using test::run_capture;
using test::ShellRun;
using test::write_file;
using ojson = nlohmann::ordered_json;

const fs::path kJinjaDir = fs::path(MOESH_SOURCE_DIR) / "tests" / "text" / "jinja";

// Why the reference cannot run here, or "" when it can.
std::string reference_unavailable() {
  const ShellRun r = run_capture(python() + " -c 'import jinja2; print(jinja2.__version__)' 2>&1");
  if (r.exit_code != 0) {
    return "python3 with jinja2 is not available (" + python() + ": " + r.out +
           "); install python3-jinja2 (scripts/install-deps.sh)";
  }
  return "";
}

fs::path temp_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("moesh_jinja_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

Result<std::string> render_file(const fs::path& tpl, const ojson& ctx, const Options& opt) {
  auto t = Template::parse(read_file(tpl), opt);
  if (!t.is_ok()) return t.status();
  return t->render(Value::from_json(ctx));
}

struct Job {
  std::string name;
  fs::path tpl;
  fs::path ctx_path;
  ojson ctx;
  Options opt;
};

// Renders every job with Jinja2 (one batch) and with moesh; they must agree.
void compare_with_reference(const std::vector<Job>& jobs, int* n_same_text, int* n_both_error) {
  ojson batch = ojson::array();
  for (const auto& j : jobs) {
    batch.push_back({{"template", j.tpl.string()},
                     {"context", j.ctx_path.string()},
                     {"trim_blocks", j.opt.trim_blocks},
                     {"lstrip_blocks", j.opt.lstrip_blocks}});
  }
  const fs::path batch_path = temp_dir() / "jobs.json";
  write_file(batch_path, batch.dump());
  const fs::path script = fs::path(MOESH_SOURCE_DIR) / "tests" / "text" / "jinja_ref.py";
  const ShellRun r = run_capture(python() + " '" + script.string() + "' --batch '" + batch_path.string() + "'");
  ASSERT_EQ(r.exit_code, 0) << "jinja_ref.py failed: " << r.out;
  const ojson results = ojson::parse(r.out);
  ASSERT_EQ(results.size(), jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& j = jobs[i];
    const ojson& ref = results[i];
    const Result<std::string> got = render_file(j.tpl, j.ctx, j.opt);
    if (ref["ok"].get<bool>()) {
      if (!got.is_ok()) {
        ADD_FAILURE() << j.name << ": Jinja2 renders, moesh fails: " << got.status().to_string();
        continue;
      }
      const std::string want = ref["out"].get<std::string>();
      if (*got != want) {
        size_t k = 0;
        while (k < want.size() && k < got->size() && want[k] == (*got)[k]) ++k;
        ADD_FAILURE() << j.name << ": differs at byte " << k
                      << "\n  jinja2: " << ojson(want.substr(k > 40 ? k - 40 : 0, 120)).dump()
                      << "\n  moesh:  " << ojson(got->substr(k > 40 ? k - 40 : 0, 120)).dump();
        continue;
      }
      ++*n_same_text;
    } else {
      if (got.is_ok()) {
        ADD_FAILURE() << j.name << ": Jinja2 raises (" << ref["error"].get<std::string>() << "), moesh renders "
                      << ojson(*got).dump();
        continue;
      }
      ++*n_both_error;
    }
  }
}

TEST(JinjaReference, FeatureTemplates) {
  const std::string why = reference_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  const fs::path dir = kJinjaDir / "features";
  const fs::path ctx_path = dir / "context.json";
  const ojson ctx = ojson::parse(read_file(ctx_path));
  std::vector<fs::path> templates;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".jinja") templates.push_back(e.path());
  std::sort(templates.begin(), templates.end());
  ASSERT_GE(templates.size(), 15u);
  std::vector<Job> jobs;
  for (const auto& t : templates) {
    for (int mode = 0; mode < 3; ++mode) {
      Job j{t.filename().string(), t, ctx_path, ctx, {}};
      j.opt.trim_blocks = mode == 0;
      j.opt.lstrip_blocks = mode != 2;
      j.name += mode == 0 ? " [trim+lstrip]" : mode == 1 ? " [lstrip only]" : " [no trim, no lstrip]";
      jobs.push_back(std::move(j));
    }
  }
  int same = 0, both_error = 0;
  compare_with_reference(jobs, &same, &both_error);
  std::printf("feature templates: %zu jobs, %d identical renderings, %d raised by both\n", jobs.size(), same,
              both_error);
  EXPECT_GE(same, 30);
  EXPECT_GE(both_error, 20);  // the err_*.jinja templates, under each setting
}

// MOESH_JINJA_REAL_DIR replaces tests/text/jinja/real (tests/text/hf/run_hf_vocab_test.sh points
// it at the real tokenizer packages' own templates), MOESH_JINJA_MIN_TEMPLATES the count expected.
TEST(JinjaReference, RealTemplatesOverConversations) {
  const std::string why = reference_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  const char* env_dir = std::getenv("MOESH_JINJA_REAL_DIR");
  const char* env_min = std::getenv("MOESH_JINJA_MIN_TEMPLATES");
  const fs::path real_dir = env_dir != nullptr ? fs::path(env_dir) : kJinjaDir / "real";
  const size_t min_templates = env_min != nullptr ? std::strtoul(env_min, nullptr, 10) : 8u;
  const ojson tokens = ojson::parse(read_file(real_dir / "tokens.json"));
  std::vector<fs::path> templates, conversations;
  for (const auto& e : fs::directory_iterator(real_dir))
    if (e.path().extension() == ".jinja") templates.push_back(e.path());
  for (const auto& e : fs::directory_iterator(kJinjaDir / "conversations"))
    if (e.path().extension() == ".json") conversations.push_back(e.path());
  std::sort(templates.begin(), templates.end());
  std::sort(conversations.begin(), conversations.end());
  ASSERT_GE(templates.size(), min_templates) << real_dir;
  ASSERT_GE(conversations.size(), 10u);
  std::vector<Job> jobs;
  for (const auto& t : templates) {
    const std::string stem = t.stem().string();
    ASSERT_TRUE(tokens.contains(stem)) << "tokens.json lacks " << stem;
    for (const auto& c : conversations) {
      ojson ctx = ojson::parse(read_file(c));
      for (const auto& kv : tokens[stem].items()) ctx[kv.key()] = kv.value();
      const fs::path ctx_path = temp_dir() / (stem + "__" + c.filename().string());
      write_file(ctx_path, ctx.dump());
      jobs.push_back(Job{stem + " × " + c.stem().string(), t, ctx_path, ctx, {}});
    }
  }
  int same = 0, both_error = 0;
  compare_with_reference(jobs, &same, &both_error);
  std::printf("real templates × conversations: %zu pairs, %d identical renderings, %d raised by both\n", jobs.size(),
              same, both_error);
  // Most pairs render; a few raise in both (Mixtral's alternation rule, DeepSeek's string arguments).
  EXPECT_GE(same, static_cast<int>(jobs.size()) * 2 / 3);
}

// ---- no reference needed ----------------------------------------------------------------------

std::string render_or_die(std::string_view src, const Value& ctx = Value::dict(), const Options& opt = {}) {
  auto t = Template::parse(src, opt);
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  if (!t.is_ok()) return "<parse error>";
  auto r = t->render(ctx);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : "<render error>";
}

Status render_error(std::string_view src, const Value& ctx = Value::dict(), const Options& opt = {}) {
  auto t = Template::parse(src, opt);
  if (!t.is_ok()) return t.status();
  auto r = t->render(ctx);
  if (r.is_ok()) return Status::ok();
  return r.status();
}

TEST(Jinja, WhitespaceOptions) {
  const std::string src = "<ul>\n  {% for x in [1, 2] %}\n  <li>{{ x }}</li>\n  {% endfor %}\n</ul>\n";
  Options hf;  // trim_blocks + lstrip_blocks, as transformers renders
  EXPECT_EQ(render_or_die(src, Value::dict(), hf), "<ul>\n  <li>1</li>\n  <li>2</li>\n</ul>");
  Options plain;
  plain.trim_blocks = false;
  plain.lstrip_blocks = false;
  EXPECT_EQ(render_or_die(src, Value::dict(), plain), "<ul>\n  \n  <li>1</li>\n  \n  <li>2</li>\n  \n</ul>");
  Options keep = hf;
  keep.keep_trailing_newline = true;
  EXPECT_EQ(render_or_die("a\n", Value::dict(), keep), "a\n");
  EXPECT_EQ(render_or_die("a\n"), "a");
  // Explicit control wins over the options: "-" strips, "+" keeps.
  EXPECT_EQ(render_or_die("a  {%- if true -%}  b  {%- endif %}\nc"), "abc");
  EXPECT_EQ(render_or_die("  {%+ if true %}x{% endif +%}\ny"), "  x\ny");
  EXPECT_EQ(render_or_die("{{ 'a' }}\n{{- 'b' -}}\n  c"), "abc");
}

TEST(Jinja, ValuesFromJsonKeepOrder) {
  const auto j = nlohmann::ordered_json::parse(R"({"z": 1, "a": [true, null, 2.5, "é"], "m": {"y": 1, "b": 2}})");
  const Value v = Value::from_json(j);
  auto s = to_json(v);
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(*s, R"({"z": 1, "a": [true, null, 2.5, "é"], "m": {"y": 1, "b": 2}})");
  JsonOptions indent;
  indent.indent = 2;
  EXPECT_EQ(*to_json(Value::from_json(nlohmann::ordered_json::parse(R"({"a": [1, {}], "b": []})")), indent),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}");
  EXPECT_EQ(v.str(), "{'z': 1, 'a': [True, None, 2.5, 'é'], 'm': {'y': 1, 'b': 2}}");
  EXPECT_FALSE(to_json(Value::undefined()).is_ok());
  EXPECT_EQ(Value(1.0).str(), "1.0");
  EXPECT_EQ(Value(1e16).str(), "1e+16");
  EXPECT_EQ(Value(0.1).str(), "0.1");
  EXPECT_EQ(Value(1e-5).str(), "1e-05");
  EXPECT_EQ(Value(123456789.0).str(), "123456789.0");
  EXPECT_EQ(Value("it's").repr(), "\"it's\"");
}

TEST(Jinja, SyntaxErrorsNameLineAndColumn) {
  Status st = render_error("line one\n{% if flag %}\n  {{ name + }}\n{% endif %}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("line 3:13"), std::string::npos) << st.message();  // the "}}"
  EXPECT_NE(st.message().find("syntax error"), std::string::npos) << st.message();

  st = render_error("{% for x in y %}\n{{ x }}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("endfor"), std::string::npos) << st.message();

  st = render_error("{{ 'unterminated }}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("line 1:4"), std::string::npos) << st.message();

  st = render_error("ok\n{% frobnicate %}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("line 2:4"), std::string::npos) << st.message();

  st = render_error("{# never closed");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("comment"), std::string::npos) << st.message();
}

TEST(Jinja, RuntimeErrorsNamePositionAndMessage) {
  Value ctx = Value::dict();
  ctx.set("name", "x").set("n", 3);
  Status st = render_error(
      "{% for i in range(3) %}\n{% if i == 2 %}{{ raise_exception('bad turn ' ~ i) }}{% endif %}{% endfor %}", ctx);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("bad turn 2"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("raised"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("line 2:"), std::string::npos) << st.message();

  st = render_error("ab\ncd {{ name + n }}", ctx);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("line 2:"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("can only concatenate str (not \"int\") to str"), std::string::npos) << st.message();

  st = render_error("{{ name | frobnicate }}", ctx);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("frobnicate"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("line 1:11"), std::string::npos) << st.message();

  st = render_error("{{ missing.attr }}", ctx);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("'missing' is undefined"), std::string::npos) << st.message();

  st = render_error("{{ x is frobnicated }}", ctx);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
}

TEST(Jinja, SandboxImmutabilityIsAnOption) {
  const std::string src = "{% set l = [1] %}{% set _ = l.append(2) %}{{ l }}";
  Status st = render_error(src);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("unsafe"), std::string::npos) << st.message();
  Options mutable_opt;
  mutable_opt.immutable = false;
  EXPECT_EQ(render_or_die(src, Value::dict(), mutable_opt), "[1, 2]");
  EXPECT_EQ(render_or_die("{% set d = {'a': 1} %}{% set _ = d.update({'b': 2}) %}{{ d }}", Value::dict(), mutable_opt),
            "{'a': 1, 'b': 2}");
}

TEST(Jinja, StrftimeNowAndGlobals) {
  Options opt;
  std::tm tm{};
  tm.tm_year = 2025 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 4;
  opt.now = tm;
  EXPECT_EQ(render_or_die("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d') }}", Value::dict(), opt),
            "04 Jul 2025|2025-07-04");
  EXPECT_EQ(render_or_die("{% set j = joiner('+') %}{% for x in range(3) %}{{ j() }}{{ x }}{% endfor %}"), "0+1+2");
  EXPECT_FALSE(render_error("{{ range(200000) | length }}").is_ok());  // the sandbox's MAX_RANGE
}

TEST(Jinja, LimitsStopRunawayTemplates) {
  Options opt;
  opt.max_output_bytes = 1000;
  Status st = render_error("{% for i in range(10000) %}xxxxxxxxxx{% endfor %}", Value::dict(), opt);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  st = render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("depth"), std::string::npos) << st.message();
}

// Every prefix of every real template (a parser's malformed-input suite): an error or a rendering,
// never a crash; and the whole templates do parse.
TEST(Jinja, TruncatedTemplatesFailCleanly) {
  const ojson conv = ojson::parse(read_file(kJinjaDir / "conversations" / "tools_call.json"));
  const Value ctx = Value::from_json(conv);
  int n_parsed = 0, n_rejected = 0;
  for (const auto& e : fs::directory_iterator(kJinjaDir / "real")) {
    if (e.path().extension() != ".jinja") continue;
    const std::string src = read_file(e.path());
    ASSERT_TRUE(Template::parse(src).is_ok()) << e.path();
    for (size_t len = 0; len < src.size(); len += 5) {
      auto t = Template::parse(std::string_view(src).substr(0, len));
      if (!t.is_ok()) {
        EXPECT_NE(t.status().message().find("line "), std::string::npos) << t.status().message();
        ++n_rejected;
        continue;
      }
      ++n_parsed;
      (void)t->render(ctx);
    }
  }
  EXPECT_GT(n_parsed, 10);
  EXPECT_GT(n_rejected, 100);
}

TEST(Jinja, ContextMustBeADict) {
  auto t = Template::parse("x");
  ASSERT_TRUE(t.is_ok());
  EXPECT_FALSE(t->render(Value(3)).is_ok());
  EXPECT_EQ(*t->render(Value::dict()), "x");
}

}  // namespace
}  // namespace moesh::jinja
