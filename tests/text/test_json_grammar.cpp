// Constrained decoding's JSON Schema matcher (moesh/text/json_grammar.h).
//
// The property that matters: whatever the matcher lets through and calls complete parses as JSON
// and matches the schema. Random walks check it — from an empty matcher, pick a random byte among
// those allowed, stop at a random complete point — against an independent validator of the
// subset (validate() below) and nlohmann's parser, for every schema in the table. Hand-written
// documents check acceptance and refusal, and the compiler names the path of what it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "moesh/make_model/make_model.h"
#include "moesh/text/json_grammar.h"

namespace moesh {
namespace {

using ojson = nlohmann::ordered_json;

// An independent validator of the supported subset.
bool validate(const ojson& v, const ojson& s, const ojson& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    const std::string sec = ref.rfind("#/$defs/", 0) == 0 ? "$defs" : "definitions";
    return validate(v, root[sec][ref.substr(ref.find('/', 2) + 1)], root);
  }
  if (s.contains("const") && v != s["const"]) return false;
  if (s.contains("enum")) {
    bool any = false;
    for (const ojson& e : s["enum"]) any = any || e == v;
    if (!any) return false;
  }
  for (const char* k : {"anyOf", "oneOf"}) {
    if (!s.contains(k)) continue;
    int n = 0;
    for (const ojson& a : s[k]) n += validate(v, a, root);
    if (n == 0 || (std::string(k) == "oneOf" && n != 1)) return false;
  }
  if (s.contains("type")) {
    std::vector<std::string> types;
    if (s["type"].is_string()) types.push_back(s["type"]);
    for (const ojson& t : s["type"].is_array() ? s["type"] : ojson::array()) types.push_back(t);
    bool ok = false;
    for (const std::string& t : types) {
      if (t == "null") ok = ok || v.is_null();
      if (t == "boolean") ok = ok || v.is_boolean();
      if (t == "string") ok = ok || v.is_string();
      if (t == "integer")
        ok = ok || v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
      if (t == "number") ok = ok || v.is_number();
      if (t == "array") ok = ok || v.is_array();
      if (t == "object") ok = ok || v.is_object();
    }
    if (!ok) return false;
  }
  if (v.is_string()) {
    const std::string str = v.get<std::string>();
    int64_t cps = 0;
    for (unsigned char c : str) cps += (c & 0xC0) != 0x80;
    if (s.contains("minLength") && cps < s["minLength"].get<int64_t>()) return false;
    if (s.contains("maxLength") && cps > s["maxLength"].get<int64_t>()) return false;
  }
  if (v.is_number()) {
    if (s.contains("minimum") && v.get<double>() < s["minimum"].get<double>()) return false;
    if (s.contains("maximum") && v.get<double>() > s["maximum"].get<double>()) return false;
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    if (s.contains("items"))
      for (const ojson& e : v)
        if (!validate(e, s["items"], root)) return false;
  }
  if (v.is_object()) {
    if (s.contains("required"))
      for (const ojson& r : s["required"])
        if (!v.contains(r.get<std::string>())) return false;
    const ojson props = s.value("properties", ojson::object());
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (props.contains(it.key())) {
        if (!validate(it.value(), props[it.key()], root)) return false;
      } else if (s.contains("additionalProperties")) {
        if (!validate(it.value(), s["additionalProperties"], root)) return false;
      }
    }
  }
  return true;
}

const std::vector<ojson>& schemas() {
  static const std::vector<ojson> all = {
      ojson::parse(R"({"type": "object"})"),
      ojson::parse(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150}, "admin": {"type": "boolean"}},
        "required": ["name", "age"], "additionalProperties": false})"),
      ojson::parse(R"({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue", 7, null]},
        "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 4}, "minItems": 1,
        "maxItems": 3}, "score": {"type": "number", "minimum": -2.5, "maximum": 99}}, "required": ["color", "tags"]})"),
      ojson::parse(R"({"type": "array", "items": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"},
        {"type": "integer", "minimum": -20, "maximum": 20}]}, "maxItems": 4})"),
      ojson::parse(R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0,
        "maximum": 9}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v", "next"]}},
        "$ref": "#/$defs/node"})"),
      ojson::parse(R"({"type": "object", "additionalProperties": {"type": ["integer", "null"], "minimum": 1,
        "maximum": 3}})"),
      ojson::parse(R"({"const": {"ok": true, "n": [1, 2]}})"),
      ojson::parse(R"({"type": "integer", "minimum": 10, "maximum": 12})"),
      ojson::parse(R"({"type": "string", "minLength": 2, "maxLength": 2})"),
  };
  return all;
}

// A random walk through the matcher over bytes; ends at a complete point (or gives up).
bool random_document(const std::shared_ptr<const JsonGrammar>& g, std::mt19937_64& rng, std::string* out) {
  JsonMatcher m(g);
  out->clear();
  // A byte alphabet that covers JSON's structure plus a few UTF-8 sequences.
  static const std::vector<std::string> alphabet = [] {
    std::vector<std::string> a;
    for (const char* s :
         {"{", "}", "[", "]", ",", ":", "\"", "\\", "-", ".", "+", " ", "\n", "é", "€", "😀", "E", "\t", "\r"}) {
      a.emplace_back(s);
    }
    for (char c = 'a'; c <= 'z'; ++c) a.emplace_back(1, c);
    for (char c = '0'; c <= '9'; ++c) a.emplace_back(1, c);
    return a;
  }();
  for (int step = 0; step < 400; ++step) {
    if (m.complete() && std::uniform_int_distribution<int>(0, 3)(rng) == 0) return true;
    std::vector<size_t> ok;
    for (size_t i = 0; i < alphabet.size(); ++i) {
      JsonMatcher c = m;
      if (c.feed(alphabet[i])) ok.push_back(i);
    }
    if (ok.empty()) return m.complete();
    // Prefer structure that closes things as the walk gets long, so most walks finish.
    size_t pick = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
    if (step > 200) {
      for (size_t i : ok) {
        const std::string& b = alphabet[i];
        if (b == "}" || b == "]" || b == "\"" || b == "n" || b == "1") pick = i;
      }
    }
    EXPECT_TRUE(m.feed(alphabet[pick]));
    *out += alphabet[pick];
  }
  return m.complete();
}

TEST(JsonGrammar, RandomWalksAlwaysParseAndMatch) {
  std::mt19937_64 rng(20261203);
  for (size_t si = 0; si < schemas().size(); ++si) {
    const ojson& s = schemas()[si];
    auto g = compile_json_schema(s);
    ASSERT_TRUE(g) << si << ": " << g.status().to_string();
    int complete = 0;
    for (int walk = 0; walk < 150; ++walk) {
      std::string doc;
      if (!random_document(*g, rng, &doc)) {
        if (walk == 0) std::printf("schema %zu: walk ended incomplete at %s\n", si, doc.c_str());
        continue;
      }
      ++complete;
      const ojson v = ojson::parse(doc, nullptr, false);
      ASSERT_FALSE(v.is_discarded()) << "schema " << si << " let through unparseable " << doc;
      EXPECT_TRUE(validate(v, s, s)) << "schema " << si << " let through " << doc << " for " << s.dump();
    }
    EXPECT_GE(complete, 100) << "schema " << si << ": most walks should end complete";
  }
}

bool accepts(const ojson& schema, std::string_view doc) {
  auto g = compile_json_schema(schema);
  EXPECT_TRUE(g) << g.status().to_string();
  JsonMatcher m(*g);
  return m.feed(doc) && m.complete();
}

TEST(JsonGrammar, AcceptsAndRefuses) {
  const ojson person = schemas()[1];
  EXPECT_TRUE(accepts(person, R"({"name": "Ann", "age": 31})"));
  EXPECT_TRUE(accepts(person, "{\n  \"name\": \"Ann\",\n  \"age\": 0,\n  \"admin\": false\n}"));
  EXPECT_FALSE(accepts(person, R"({"age": 31, "name": "Ann"})"));              // declared order
  EXPECT_FALSE(accepts(person, R"({"name": "Ann"})"));                         // age required
  EXPECT_FALSE(accepts(person, R"({"name": "Ann", "age": 151})"));             // maximum
  EXPECT_FALSE(accepts(person, R"({"name": "Ann", "age": -1})"));              // minimum
  EXPECT_FALSE(accepts(person, R"({"name": "Ann", "age": 3.5})"));             // integer
  EXPECT_FALSE(accepts(person, R"({"name": "Annabelle-Louise", "age": 3})"));  // maxLength
  EXPECT_FALSE(accepts(person, R"({"name": "Ann", "age": 3, "x": 1})"));       // additionalProperties
  EXPECT_FALSE(accepts(person, R"( {"name": "A", "age": 3})"));                // nothing before the value
  EXPECT_FALSE(accepts(person, R"({"name": "A", "age": 3} )"));                // nor after it
  EXPECT_FALSE(accepts(person, "{\"name\": \"a\nb\", \"age\": 3}"));           // raw control character
  EXPECT_TRUE(accepts(person, R"({"name": "a\nb\u00e9", "age": 3})"));
  EXPECT_FALSE(accepts(person, R"({"name": "\ud800", "age": 3})"));           // lone surrogate
  EXPECT_FALSE(accepts(person, "{\"name\": \"\xC3\", \"age\": 3}"));          // broken UTF-8
  EXPECT_FALSE(accepts(person, "{\"name\": \"\xE0\x80\x80\", \"age\": 3}"));  // overlong
  // Whitespace: none, one space, or one or two newlines and up to kMaxIndent spaces/tabs.
  EXPECT_FALSE(accepts(person, "{  \"name\": \"A\", \"age\": 3}"));
  EXPECT_FALSE(accepts(person, "{\n\n\n\"name\": \"A\", \"age\": 3}"));
  EXPECT_FALSE(accepts(person, "{\t\"name\": \"A\", \"age\": 3}"));
  EXPECT_FALSE(accepts(person, "{\r\n\"name\": \"A\", \"age\": 3}"));
  EXPECT_TRUE(accepts(person, "{\n\n\t\t\"name\" : \"A\" ,\n \"age\":3\n}"));
  EXPECT_TRUE(accepts(person, "{\n" + std::string(kMaxIndent, ' ') + "\"name\": \"A\", \"age\": 3}"));
  EXPECT_FALSE(accepts(person, "{\n" + std::string(kMaxIndent + 1, ' ') + "\"name\": \"A\", \"age\": 3}"));

  const ojson any = ojson::parse(R"({"type": "object"})");
  EXPECT_TRUE(accepts(any, R"({"a": [1, -2.5e3, true, null, {"b": "c"}], "d": {}})"));
  EXPECT_FALSE(accepts(any, R"([1])"));
  EXPECT_FALSE(accepts(any, R"({"a": 01})"));
  EXPECT_FALSE(accepts(any, R"({"a": 1,})"));

  // Nesting is capped: any value may nest, but not deeper than kMaxNesting.
  const ojson arrays = ojson::parse(R"({"type": "array"})");
  EXPECT_TRUE(accepts(arrays, std::string(kMaxNesting, '[') + std::string(kMaxNesting, ']')));
  EXPECT_FALSE(accepts(arrays, std::string(kMaxNesting + 1, '[') + std::string(kMaxNesting + 1, ']')));

  EXPECT_TRUE(accepts(schemas()[7], "11"));
  EXPECT_FALSE(accepts(schemas()[7], "13"));
  EXPECT_FALSE(accepts(schemas()[7], "9"));
  JsonMatcher m(*compile_json_schema(schemas()[7]));
  EXPECT_FALSE(m.feed('2'));  // no integer in [10, 12] starts with 2

  const ojson e = schemas()[2];
  EXPECT_TRUE(accepts(e, R"({"color": 7, "tags": ["a"]})"));
  EXPECT_TRUE(accepts(e, R"({"color": null, "tags": ["abcd", "b"], "score": -2.5})"));
  EXPECT_FALSE(accepts(e, R"({"color": "purple", "tags": ["a"]})"));
  EXPECT_FALSE(accepts(e, R"({"color": 7, "tags": []})"));
  EXPECT_FALSE(accepts(e, R"({"color": 7, "tags": ["a"], "score": 99.5})"));
}

TEST(JsonGrammar, CompileErrorsNameThePath) {
  struct Case {
    const char* schema;
    const char* expect;
  };
  const Case cases[] = {
      {R"({"type": "string", "pattern": "^a"})", "schema.pattern"},
      {R"({"type": "object", "properties": {"x": {"type": "string", "format": "date"}}})",
       "schema.properties.x.format"},
      {R"({"anyOf": [{"type": "object"}, {"type": "object", "properties": {}}]})", "begin with the same"},
      {R"({"$ref": "#/components/x"})", "does not name"},
      {R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})", "only refers to itself"},
      {R"({"type": "wat"})", "'wat'"},
      {R"({"type": "integer", "minimum": 5, "maximum": 1})", "minimum > maximum"},
      {R"({"type": "object", "required": ["x"]})", "'x' has no entry"},
      {R"({"enum": []})", "schema.enum"},
      {R"(false)", "matches nothing"},
      {R"([1])", "must be an object"},
  };
  for (const Case& c : cases) {
    auto r = compile_json_schema(ojson::parse(c.schema));
    ASSERT_FALSE(r) << c.schema;
    EXPECT_NE(r.status().to_string().find(c.expect), std::string::npos) << c.schema << " -> " << r.status().to_string();
  }
}

// The token mask over a real BPE vocabulary (make-model's): what it allows is exactly the tokens
// whose bytes the matcher accepts; EOS only when complete; control tokens never as text.
TEST(JsonGrammar, TokenMaskOverAVocabulary) {
  MakeModelSpec s = MakeModelSpec::defaults_for(MakeArch::kQwen3Moe);
  s.n_layer = 1;
  const auto path = std::filesystem::temp_directory_path() / ("moesh-jsonmask-" + std::to_string(getpid()) + ".gguf");
  ASSERT_TRUE(make_model(s, path.string()).is_ok());
  auto f = gguf::File::open(path.string());
  ASSERT_TRUE(f);
  auto tok = Tokenizer::from_gguf(**f);
  ASSERT_TRUE(tok);
  std::filesystem::remove(path);
  const JsonTokenMask mask(**tok);
  auto g = compile_json_schema(schemas()[1]);
  ASSERT_TRUE(g);
  JsonMatcher m(*g);
  std::vector<uint8_t> allowed(static_cast<size_t>((*tok)->n_vocab()));
  const int64_t n0 = mask.fill(m, allowed);
  EXPECT_GT(n0, 0);
  for (int32_t t = 0; t < (*tok)->n_vocab(); ++t) {
    const std::string p = (*tok)->token_to_piece(t);
    const bool want = !(*tok)->is_special(t) && !p.empty() && p[0] == '{' && [&] {
      JsonMatcher c = m;
      return c.feed(p);
    }();
    EXPECT_EQ(allowed[static_cast<size_t>(t)] != 0, want) << t << " '" << p << "'";
  }
  ASSERT_TRUE(m.feed(std::string_view(R"({"name": "x", "age": 4})")));
  mask.fill(m, allowed);
  const int32_t eos = (*tok)->eos();
  EXPECT_EQ(allowed[static_cast<size_t>(eos)], 1);
  int64_t others = 0;
  for (size_t t = 0; t < allowed.size(); ++t) others += allowed[t] && !(*tok)->is_eog(static_cast<int32_t>(t));
  EXPECT_EQ(others, 0) << "after a complete value only end-of-generation tokens";
}

}  // namespace
}  // namespace moesh
