// make_model's built-in BPE tokenizer: a generated model loads with Tokenizer::from_gguf,
// round-trips text, has really learned merges, ChatML specials and template, exactly n_vocab
// tokens, and is deterministic; `--vocab none` keeps the id-only file.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "make_model/make_model_internal.h"
#include "moesh/gguf/gguf.h"
#include "moesh/make_model/make_model.h"
#include "moesh/text/tokenizer.h"
#include "text/tokenizer_internal.h"
#include "util/run_moesh.h"

namespace moesh {
namespace {

using test::run_moesh;
using test::RunResult;

namespace fs = std::filesystem;

class MakeModelVocab : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("moesh_make_vocab_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string path(const std::string& name) { return (dir_ / name).string(); }
  static fs::path dir_;
};
fs::path MakeModelVocab::dir_;

std::vector<uint8_t> read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A small model of any vocabulary size (q8_0, n_embd 32) so a 151936-token file stays ~11 MB.
MakeModelSpec small_spec(int64_t n_vocab) {
  MakeModelSpec s = MakeModelSpec::defaults_for(MakeArch::kQwen3Moe);
  s.type = MakeFileType::kQ8_0;
  s.n_vocab = n_vocab;
  s.n_embd = 32;
  s.n_layer = 1;
  s.n_head = 2;
  s.n_head_kv = 1;
  s.head_dim = 16;
  s.n_expert = 2;
  s.n_expert_used = 1;
  s.n_ff_exp = 32;
  return s;
}

struct Loaded {
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<Tokenizer> tok;
};

Loaded write_and_load(const MakeModelSpec& spec, const std::string& out) {
  Loaded l;
  const Status st = make_model(spec, out);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  if (!st.is_ok()) return l;
  auto f = gguf::File::open(out);
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  if (!f.is_ok()) return l;
  l.file = std::move(*f);
  auto t = Tokenizer::from_gguf(*l.file);
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  if (t.is_ok()) l.tok = std::move(*t);
  return l;
}

std::string round_trip(const Tokenizer& tok, const std::string& text, size_t* n_tokens = nullptr) {
  auto ids = tok.encode(text);
  if (!ids.is_ok()) return "<encode failed: " + ids.status().to_string() + ">";
  if (n_tokens) *n_tokens = ids->size();
  auto back = tok.decode(*ids);
  if (!back.is_ok()) return "<decode failed: " + back.status().to_string() + ">";
  return *back;
}

const std::vector<std::string>& other_texts() {
  static const std::vector<std::string> texts = {
      "Hello, world! The quick brown fox jumps over the lazy dog.",
      "Prices rose 12.5% in 2024: from $1,299.99 to 3141592653589793.",
      "café naïve résumé — Zürich, São Paulo, Ærøskøbing, straße",
      "日本語のテキストと中文文本, 한국어 텍스트, Ελληνικά, русский текст",
      "emoji: 🙂🌊🚀👍🏽 and flags 🇳🇴 done",
      "  leading spaces, trailing spaces   \n\n\ttabs\tand\r\nCRLF lines\n",
      "it's I'm we've they'll she'd DON'T Can't",
      "<|im_start|> not parsed as special here <|im_end|>",
      "x",
      "",
  };
  return texts;
}

TEST_F(MakeModelVocab, DefaultModelLoadsAndRoundTrips) {
  const MakeModelSpec spec = MakeModelSpec::defaults_for(MakeArch::kQwen3Moe);
  ASSERT_EQ(spec.vocab, MakeVocab::kBpe);  // the default
  Loaded l = write_and_load(spec, path("default.gguf"));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& tok = *l.tok;
  EXPECT_EQ(tok.kind(), VocabKind::kBpe);
  EXPECT_EQ(tok.pre_tokenizer(), PreTokenizer::kQwen2);
  EXPECT_EQ(tok.n_vocab(), spec.n_vocab);
  EXPECT_EQ(l.file->get<std::string>("tokenizer.ggml.model").value(), "gpt2");
  EXPECT_EQ(l.file->get<std::string>("tokenizer.ggml.pre").value(), "qwen2");
  EXPECT_EQ(l.file->get<uint32_t>("qwen3moe.vocab_size").value(), 512u);
  EXPECT_FALSE(tok.add_bos());

  const std::string builtin(detail::make_vocab_builtin_text());
  ASSERT_GT(builtin.size(), 3000u);
  EXPECT_EQ(round_trip(tok, builtin), builtin);
  for (const std::string& s : other_texts()) EXPECT_EQ(round_trip(tok, s), s) << s;

  // Every digit is its own piece under qwen2, so a number is one token per digit.
  auto digits = tok.encode("2024");
  ASSERT_TRUE(digits.is_ok());
  EXPECT_EQ(digits->size(), 4u);
}

TEST_F(MakeModelVocab, MergesAreLearned) {
  Loaded l = write_and_load(MakeModelSpec::defaults_for(MakeArch::kQwen3Moe), path("m.gguf"));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& tok = *l.tok;
  // 512 - 256 - 3 = 253 learned tokens; the most common words are among them.
  for (const char* w : {" the", " and", " a", " of", " to", " she", "The"}) {
    auto ids = tok.encode(w);
    ASSERT_TRUE(ids.is_ok());
    EXPECT_EQ(ids->size(), 1u) << "'" << w << "' is not a single token";
  }
  // Words: the pre-tokenizer pieces that are an optional space and ASCII letters.
  const std::string_view builtin = detail::make_vocab_builtin_text();
  auto splitter = tok::RegexSplitter::create(PreTokenizer::kQwen2);
  ASSERT_TRUE(splitter.is_ok());
  std::vector<std::string_view> pieces;
  ASSERT_TRUE((*splitter)->split(builtin, pieces).is_ok());
  size_t n_words = 0, n_letters = 0, n_word_tokens = 0, n_single = 0;
  for (std::string_view p : pieces) {
    const std::string_view w = p.substr(p[0] == ' ' ? 1 : 0);
    if (w.empty() ||
        !std::all_of(w.begin(), w.end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); })) {
      continue;
    }
    auto ids = tok.encode(p);
    ASSERT_TRUE(ids.is_ok());
    ++n_words;
    n_letters += w.size();
    n_word_tokens += ids->size();
    n_single += ids->size() == 1;
  }
  ASSERT_GT(n_words, 800u);
  const double chars_per_word = double(n_letters) / double(n_words);
  const double tokens_per_word = double(n_word_tokens) / double(n_words);
  size_t n_tokens = 0;
  EXPECT_EQ(round_trip(tok, std::string(builtin), &n_tokens), builtin);
  std::fprintf(stderr,
               "built-in text: %zu bytes -> %zu tokens; %zu words, %.2f letters/word, "
               "%.2f tokens/word, %zu words are one token (n_vocab 512)\n",
               builtin.size(), n_tokens, n_words, chars_per_word, tokens_per_word, n_single);
  EXPECT_GT(chars_per_word, 3.5);
  // Measured with 253 merges: 1.90 tokens per word against 4.04 letters (ratio 0.47), 483 of
  // 922 words a single token, 2088 tokens for 5052 bytes. Pure byte tokens would be ratio 1.
  EXPECT_LT(tokens_per_word, 0.55 * chars_per_word);
  EXPECT_GT(n_single, n_words * 2 / 5);
  EXPECT_LT(n_tokens, builtin.size() / 2);

  // Byte-level text has more tokens than a merged vocabulary on unseen English as well.
  const std::string unseen = "The old man and the sea: a story of the keeper of the light.";
  auto ids = tok.encode(unseen);
  ASSERT_TRUE(ids.is_ok());
  EXPECT_LT(ids->size(), unseen.size() / 2);
}

TEST_F(MakeModelVocab, FullVocabularyMakesEveryPieceOneToken) {
  // With every learned merge, each pre-tokenizer piece of the training text is a single token.
  auto max_learned = detail::make_vocab_max_learned();
  ASSERT_TRUE(max_learned.is_ok());
  std::fprintf(stderr, "built-in text yields %lld learned tokens\n", static_cast<long long>(*max_learned));
  ASSERT_GT(*max_learned, 600);
  const int64_t n_vocab = 256 + *max_learned + 3;
  Loaded l = write_and_load(small_spec(n_vocab), path("full.gguf"));
  ASSERT_NE(l.tok, nullptr);
  auto splitter = tok::RegexSplitter::create(PreTokenizer::kQwen2);
  ASSERT_TRUE(splitter.is_ok());
  std::vector<std::string_view> pieces;
  ASSERT_TRUE((*splitter)->split(detail::make_vocab_builtin_text(), pieces).is_ok());
  auto ids = l.tok->encode(detail::make_vocab_builtin_text());
  ASSERT_TRUE(ids.is_ok());
  EXPECT_EQ(ids->size(), pieces.size());
  // No padding at this size: the token before the specials is a learned one.
  EXPECT_EQ(l.tok->token_type(static_cast<int32_t>(n_vocab - 4)), TokenType::kNormal);
  EXPECT_EQ(l.tok->token_id("<|reserved_0|>"), -1);
}

TEST_F(MakeModelVocab, SpecialsEosAndChatTemplate) {
  const MakeModelSpec spec = MakeModelSpec::defaults_for(MakeArch::kLlama);  // n_vocab 1024
  Loaded l = write_and_load(spec, path("specials.gguf"));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& tok = *l.tok;
  const int32_t n = tok.n_vocab();
  ASSERT_EQ(n, 1024);
  const int32_t endoftext = n - 3, im_start = n - 2, im_end = n - 1;
  EXPECT_EQ(tok.token_text(endoftext), "<|endoftext|>");
  EXPECT_EQ(tok.token_text(im_start), "<|im_start|>");
  EXPECT_EQ(tok.token_text(im_end), "<|im_end|>");
  for (int32_t id : {endoftext, im_start, im_end}) {
    EXPECT_EQ(tok.token_type(id), TokenType::kControl);
    EXPECT_TRUE(tok.is_special(id));
  }
  EXPECT_EQ(tok.eos(), im_end);
  EXPECT_TRUE(tok.is_eog(im_end));
  EXPECT_TRUE(tok.is_eog(endoftext));
  EXPECT_FALSE(tok.is_eog(im_start));
  EXPECT_EQ(tok.bos(), endoftext);
  EXPECT_EQ(tok.pad(), endoftext);
  EXPECT_EQ(tok.token_type(0), TokenType::kNormal);
  EXPECT_EQ(tok.token_text(' '), "Ġ");

  const std::string prompt = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n";
  auto parsed = tok.encode(prompt, false, true);
  ASSERT_TRUE(parsed.is_ok());
  ASSERT_GE(parsed->size(), 6u);
  EXPECT_EQ(parsed->front(), im_start);
  EXPECT_EQ(std::count(parsed->begin(), parsed->end(), im_start), 2);
  EXPECT_EQ(std::count(parsed->begin(), parsed->end(), im_end), 1);
  DecodeOptions with_special;
  with_special.special = true;
  EXPECT_EQ(tok.decode(*parsed, with_special).value(), prompt);
  // Without special parsing the markers are plain text.
  auto plain = tok.encode(prompt, false, false);
  ASSERT_TRUE(plain.is_ok());
  EXPECT_EQ(std::count(plain->begin(), plain->end(), im_start), 0);
  EXPECT_EQ(tok.decode(*plain).value(), prompt);

  auto tmpl = l.file->get<std::string>("tokenizer.chat_template");
  ASSERT_TRUE(tmpl.is_ok());
  EXPECT_NE(tmpl->find("<|im_start|>"), std::string::npos);
  EXPECT_NE(tmpl->find("add_generation_prompt"), std::string::npos);
  EXPECT_EQ(l.file->get<uint32_t>("tokenizer.ggml.eos_token_id").value(), uint32_t(im_end));
  EXPECT_FALSE(l.file->get<bool>("tokenizer.ggml.add_bos_token").value());
}

TEST_F(MakeModelVocab, KeyOrderFollowsTheConverter) {
  for (MakeFileType type : {MakeFileType::kF32, MakeFileType::kQ4_K_M}) {
    MakeModelSpec spec = MakeModelSpec::defaults_for(MakeArch::kDeepseek2);
    spec.type = type;
    auto plan = plan_model(spec);
    ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
    std::vector<std::string> keys;
    for (const auto& [k, v] : plan->kvs) keys.push_back(k);
    const std::vector<std::string> tok_keys = {"tokenizer.ggml.model",
                                               "tokenizer.ggml.pre",
                                               "tokenizer.ggml.tokens",
                                               "tokenizer.ggml.token_type",
                                               "tokenizer.ggml.merges",
                                               "tokenizer.ggml.eos_token_id",
                                               "tokenizer.ggml.padding_token_id",
                                               "tokenizer.ggml.bos_token_id",
                                               "tokenizer.ggml.add_bos_token",
                                               "tokenizer.chat_template"};
    auto first = std::find(keys.begin(), keys.end(), tok_keys[0]);
    ASSERT_NE(first, keys.end());
    ASSERT_GE(keys.end() - first, static_cast<ptrdiff_t>(tok_keys.size()));
    EXPECT_EQ(std::vector<std::string>(first, first + tok_keys.size()), tok_keys);
    // Every arch key comes before the tokenizer; only the quantizer's keys come after it.
    for (auto it = keys.begin(); it != first; ++it) EXPECT_EQ(it->rfind("tokenizer.", 0), std::string::npos);
    std::vector<std::string> tail(first + tok_keys.size(), keys.end());
    if (type == MakeFileType::kQ4_K_M) {
      EXPECT_EQ(tail, (std::vector<std::string>{"general.quantization_version", "general.file_type"}));
    } else {
      EXPECT_TRUE(tail.empty());
    }
  }
}

TEST_F(MakeModelVocab, NoneKeepsTheIdOnlyFileAndTheSameWeights) {
  MakeModelSpec spec = MakeModelSpec::defaults_for(MakeArch::kQwen3Moe);
  spec.vocab = MakeVocab::kNone;
  ASSERT_TRUE(make_model(spec, path("none.gguf")).is_ok());
  auto none = gguf::File::open(path("none.gguf"));
  ASSERT_TRUE(none.is_ok());
  EXPECT_EQ((*none)->get<std::string>("tokenizer.ggml.model").value(), "no_vocab");
  for (const auto& [k, v] : (*none)->kvs()) {
    if (k != "tokenizer.ggml.model") {
      EXPECT_EQ(k.rfind("tokenizer.", 0), std::string::npos) << k;
    }
  }
  EXPECT_FALSE((*none)->has("tokenizer.ggml.tokens"));
  auto nt = Tokenizer::from_gguf(**none);
  ASSERT_TRUE(nt.is_ok());
  EXPECT_EQ((*nt)->kind(), VocabKind::kNone);
  // kNone accepts vocabularies too small for the BPE tokenizer.
  MakeModelSpec tiny = spec;
  tiny.n_vocab = 100;
  EXPECT_TRUE(tiny.validate().is_ok());

  // Same tensors, same bytes: the vocabulary changes only the metadata.
  spec.vocab = MakeVocab::kBpe;
  ASSERT_TRUE(make_model(spec, path("bpe.gguf")).is_ok());
  auto bpe = gguf::File::open(path("bpe.gguf"));
  ASSERT_TRUE(bpe.is_ok());
  const auto& a = **none;
  const auto& b = **bpe;
  EXPECT_GT(b.data_offset(), a.data_offset() + 2000);
  ASSERT_EQ(a.size() - a.data_offset(), b.size() - b.data_offset());
  EXPECT_EQ(0, std::memcmp(a.base() + a.data_offset(), b.base() + b.data_offset(), a.size() - a.data_offset()));
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    EXPECT_EQ(a.tensors()[i].name, b.tensors()[i].name);
    EXPECT_EQ(a.tensors()[i].offset, b.tensors()[i].offset);
  }
}

TEST_F(MakeModelVocab, ExactVocabularySizeAndPadding) {
  auto max_learned = detail::make_vocab_max_learned();
  ASSERT_TRUE(max_learned.is_ok());
  const int64_t full = 256 + *max_learned + 3;
  for (int64_t n_vocab :
       {int64_t{259}, int64_t{260}, int64_t{512}, full - 1, full, full + 1, full + 1000, int64_t{151936}}) {
    SCOPED_TRACE("n_vocab " + std::to_string(n_vocab));
    MakeModelSpec spec = small_spec(n_vocab);
    auto plan = plan_model(spec);
    ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
    const gguf::Value* tokens = nullptr;
    const gguf::Value* types = nullptr;
    const gguf::Value* merges = nullptr;
    for (const auto& [k, v] : plan->kvs) {
      if (k == "tokenizer.ggml.tokens") tokens = &v;
      if (k == "tokenizer.ggml.token_type") types = &v;
      if (k == "tokenizer.ggml.merges") merges = &v;
    }
    ASSERT_TRUE(tokens && types && merges);
    const auto& tv = std::get<gguf::Array>(tokens->v).items;
    const auto& yv = std::get<gguf::Array>(types->v).items;
    ASSERT_EQ(static_cast<int64_t>(tv.size()), n_vocab);
    ASSERT_EQ(yv.size(), tv.size());
    const int64_t n_learned = std::min(n_vocab - 259, *max_learned);
    const int64_t n_pad = n_vocab - 259 - n_learned;
    std::set<std::string> distinct;
    int64_t n_unused = 0, n_control = 0;
    for (size_t i = 0; i < tv.size(); ++i) {
      distinct.insert(std::get<std::string>(tv[i].v));
      const auto type = static_cast<TokenType>(std::get<int64_t>(yv[i].v));
      n_unused += type == TokenType::kUnused;
      n_control += type == TokenType::kControl;
    }
    EXPECT_EQ(distinct.size(), tv.size()) << "duplicate token texts";
    EXPECT_EQ(n_unused, n_pad);
    EXPECT_EQ(n_control, 3);
    EXPECT_EQ(std::get<std::string>(tv[tv.size() - 1].v), "<|im_end|>");
    EXPECT_EQ(std::get<std::string>(tv[tv.size() - 3].v), "<|endoftext|>");
    if (n_pad > 0) {
      EXPECT_EQ(std::get<std::string>(tv[static_cast<size_t>(256 + n_learned)].v), "<|reserved_0|>");
      EXPECT_EQ(std::get<std::string>(tv[tv.size() - 4].v), "<|reserved_" + std::to_string(n_pad - 1) + "|>");
    }
    // Merges only grow with the vocabulary, and each one's result is a token.
    const auto& mv = std::get<gguf::Array>(merges->v).items;
    if (n_vocab == 259) {
      EXPECT_EQ(mv.size(), 0u);
    }
    if (n_vocab >= full) {
      EXPECT_GE(static_cast<int64_t>(mv.size()), *max_learned);
    }
    for (const auto& m : mv) {
      std::string s = std::get<std::string>(m.v);
      const size_t sp = s.find(' ', 1);
      ASSERT_NE(sp, std::string::npos) << s;
      s.erase(sp, 1);
      EXPECT_TRUE(distinct.count(s)) << "merge result '" << s << "' is not a token";
    }
  }

  MakeModelSpec small = small_spec(258);
  const Status st = small.validate();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.to_string().find("--vocab none"), std::string::npos) << st.to_string();
  EXPECT_NE(st.to_string().find("258"), std::string::npos) << st.to_string();
}

TEST_F(MakeModelVocab, Qwen3SizedVocabularyPlansAndLoads) {
  // Qwen2/3's vocabulary size: mostly <|reserved_N|> padding. That padding must not make
  // planning slow, but speed is a benchmark's job (docs/PERFORMANCE.md), not a test's: here the
  // plan of the perf preset at that size must be complete and consistent.
  MakeModelSpec perf = MakeModelSpec::perf_30b_a3b();
  perf.n_vocab = 151936;
  auto plan = plan_model(perf);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  const gguf::Value* tokens = nullptr;
  for (const auto& [k, v] : plan->kvs) {
    if (k == "tokenizer.ggml.tokens") tokens = &v;
  }
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(std::get<gguf::Array>(tokens->v).items.size(), 151936u);
  int n_vocab_tensors = 0;
  for (const PlannedTensor& t : plan->tensors) {
    if (t.name == "token_embd.weight" || t.name == "output.weight") {
      ++n_vocab_tensors;
      EXPECT_EQ(t.ne[1], 151936) << t.name;
    }
  }
  EXPECT_EQ(n_vocab_tensors, 2);
  EXPECT_GT(plan->data_bytes, 0u);

  const MakeModelSpec spec = small_spec(151936);
  Loaded l = write_and_load(spec, path("big.gguf"));
  ASSERT_NE(l.tok, nullptr);
  EXPECT_EQ(l.tok->n_vocab(), 151936);
  EXPECT_EQ(l.tok->eos(), 151935);
  EXPECT_EQ(l.tok->token_type(151932), TokenType::kUnused);
  for (const std::string& s : other_texts()) EXPECT_EQ(round_trip(*l.tok, s), s) << s;
  const std::string builtin(detail::make_vocab_builtin_text());
  EXPECT_EQ(round_trip(*l.tok, builtin), builtin);
}

TEST_F(MakeModelVocab, Deterministic) {
  MakeModelSpec spec = MakeModelSpec::defaults_for(MakeArch::kDeepseek2);
  spec.type = MakeFileType::kQ8_0;
  ASSERT_TRUE(make_model(spec, path("d1.gguf")).is_ok());
  ASSERT_TRUE(make_model(spec, path("d2.gguf")).is_ok());
  const auto a = read_all(path("d1.gguf")), b = read_all(path("d2.gguf"));
  ASSERT_GT(a.size(), 100000u);
  EXPECT_TRUE(a == b) << "two runs gave different bytes";
}

TEST_F(MakeModelVocab, CliVocabFlag) {
  // --vocab none from the command line is the library's kNone file, byte for byte.
  RunResult r = run_moesh("make-model --arch llama --vocab none --threads 1 --out '" + path("cli_none.gguf") + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  MakeModelSpec spec = MakeModelSpec::defaults_for(MakeArch::kLlama);
  spec.vocab = MakeVocab::kNone;
  ASSERT_TRUE(make_model(spec, path("lib_none.gguf")).is_ok());
  EXPECT_TRUE(read_all(path("cli_none.gguf")) == read_all(path("lib_none.gguf")));

  r = run_moesh("make-model --arch llama --out '" + path("cli_bpe.gguf") + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("vocab bpe"), std::string::npos) << r.out;
  spec.vocab = MakeVocab::kBpe;
  ASSERT_TRUE(make_model(spec, path("lib_bpe.gguf")).is_ok());
  EXPECT_TRUE(read_all(path("cli_bpe.gguf")) == read_all(path("lib_bpe.gguf")));

  r = run_moesh("make-model --arch llama --vocab words --dry-run");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--vocab"), std::string::npos) << r.err;
  r = run_moesh("make-model --arch llama --n-vocab 100 --dry-run");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--vocab none"), std::string::npos) << r.err;
  r = run_moesh("make-model --arch llama --n-vocab 100 --vocab none --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace moesh
