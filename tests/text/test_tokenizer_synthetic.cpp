// Tokenizers built from synthetic GGUF metadata written in memory: BPE merge order, SPM score
// order and byte fallback, special-token parsing, BOS/EOS, round trips of seeded random text,
// the streaming decoder, the pre-tokenizer families without a vocab file, and malformed metadata.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "moesh/gguf/gguf.h"
#include "moesh/text/tokenizer.h"
#include "text/tokenizer_internal.h"

namespace moesh {
namespace {

using gguf::Value;
using KVs = std::vector<std::pair<std::string, Value>>;

Result<std::unique_ptr<Tokenizer>> build(const KVs& kvs) {
  gguf::Writer w;
  w.set("general.architecture", Value::str("test"));
  for (const auto& [k, v] : kvs) w.set(k, v);
  auto bytes = w.write_bytes();
  if (!bytes) return bytes.status();
  auto f = gguf::File::from_bytes(std::move(*bytes));
  if (!f) return f.status();
  return Tokenizer::from_gguf(**f);
}

// 256 byte tokens in GPT-2 byte-unicode form, then merged tokens, then specials.
struct BpeVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;

  BpeVocab() {
    for (int b = 0; b < 256; ++b) {
      tokens.push_back(tok::byte_to_unicode(static_cast<uint8_t>(b)));
      types.push_back(1);
    }
  }
  int32_t add(const std::string& t, int32_t type = 1) {
    tokens.push_back(t);
    types.push_back(type);
    return static_cast<int32_t>(tokens.size() - 1);
  }
  // Adds merge "l r" and the merged token.
  int32_t merge(const std::string& l, const std::string& r) {
    merges.push_back(l + " " + r);
    return add(l + r);
  }
  KVs kvs(const std::string& pre = "gpt-2") const {
    return {{"tokenizer.ggml.model", Value::str("gpt2")},
            {"tokenizer.ggml.pre", Value::str(pre)},
            {"tokenizer.ggml.tokens", Value::str_array(tokens)},
            {"tokenizer.ggml.token_type", Value::i32_array(types)},
            {"tokenizer.ggml.merges", Value::str_array(merges)}};
  }
};

int32_t byte_id(char c) {
  return static_cast<uint8_t>(c);
}

TEST(TokenizerBpe, MergeRankDecidesSegmentation) {
  // "hell" has two competing first merges: (e,l) and (l,l). Whichever has the lower rank wins.
  BpeVocab a;
  const int32_t el = a.merge("e", "l");
  a.merge("l", "l");
  auto ta = build(a.kvs());
  ASSERT_TRUE(ta) << ta.status().to_string();
  EXPECT_EQ(*(*ta)->encode("hell"), (std::vector<int32_t>{byte_id('h'), el, byte_id('l')}));

  BpeVocab b;
  const int32_t ll = b.merge("l", "l");
  b.merge("e", "l");
  auto tb = build(b.kvs());
  ASSERT_TRUE(tb);
  EXPECT_EQ(*(*tb)->encode("hell"), (std::vector<int32_t>{byte_id('h'), byte_id('e'), ll}));
}

TEST(TokenizerBpe, PreTokenizerBoundsMergesAndSpecialTokens) {
  BpeVocab v;
  const std::string sp = tok::byte_to_unicode(' ');  // "Ġ"
  // Rank order matters: "Ġ h" must come before "h i" or " hi" would become Ġ + hi.
  const int32_t sp_h = v.merge(sp, "h");         // "Ġh"
  const int32_t sp_hi = v.merge(sp + "h", "i");  // "Ġhi"
  const int32_t hi = v.merge("h", "i");          // "hi"
  const int32_t im_end = v.add("<|im_end|>", 3);
  const int32_t tool = v.add("<tool>", 4);
  const int32_t ctrl = v.add("<|ctl|>", 3);
  KVs kv = v.kvs();
  kv.push_back({"tokenizer.ggml.bos_token_id", Value::u32(static_cast<uint32_t>(ctrl))});
  kv.push_back({"tokenizer.ggml.eos_token_id", Value::u32(static_cast<uint32_t>(ctrl))});
  kv.push_back({"tokenizer.ggml.add_bos_token", Value::boolean(true)});
  auto t = build(kv);
  ASSERT_TRUE(t) << t.status().to_string();
  const Tokenizer& tk = **t;
  // " hi hi": the gpt-2 regex keeps the space with the word, so each word is one token.
  EXPECT_EQ(*tk.encode(" hi hi"), (std::vector<int32_t>{sp_hi, sp_hi}));
  EXPECT_EQ(*tk.encode(" h"), (std::vector<int32_t>{sp_h}));
  // Control tokens are plain text unless parse_special; user-defined ones always match.
  auto plain = *tk.encode("hi<|im_end|>", false, false);
  EXPECT_GT(plain.size(), 2u);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), im_end), 0);
  EXPECT_EQ(*tk.encode("hi<|im_end|>", false, true), (std::vector<int32_t>{hi, im_end}));
  EXPECT_EQ(*tk.encode("hi<tool>hi", false, false), (std::vector<int32_t>{hi, tool, hi}));
  // BOS only with add_special.
  EXPECT_EQ(*tk.encode("hi", true, false), (std::vector<int32_t>{ctrl, hi}));
  // <|im_end|> is end-of-generation by its text; the eos id is too; a word is not.
  EXPECT_TRUE(tk.is_eog(im_end));
  EXPECT_TRUE(tk.is_eog(ctrl));
  EXPECT_FALSE(tk.is_eog(sp_hi));
  // Control tokens are hidden by default and rendered on request; user-defined always shown.
  const std::vector<int32_t> ids{hi, im_end, tool};
  EXPECT_EQ(*tk.decode(ids), "hi<tool>");
  EXPECT_EQ(*tk.decode(ids, {.special = true}), "hi<|im_end|><tool>");
  auto bad = tk.decode(std::vector<int32_t>{hi, 100000});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.status().code(), StatusCode::kOutOfRange);
}

// Seeded random text from ASCII, Latin-1, Cyrillic, CJK and emoji code points.
std::string random_text(std::mt19937& rng, int n_chars) {
  static const std::vector<std::pair<uint32_t, uint32_t>> ranges = {{0x20, 0x7E},     {0x20, 0x20},      {0x0A, 0x0A},
                                                                    {0x30, 0x39},     {0xC0, 0xFF},      {0x410, 0x44F},
                                                                    {0x4E00, 0x4FFF}, {0x1F600, 0x1F64F}};
  std::string s;
  for (int i = 0; i < n_chars; ++i) {
    const auto& r = ranges[rng() % ranges.size()];
    tok::utf8_append(r.first + rng() % (r.second - r.first + 1), s);
  }
  return s;
}

TEST(TokenizerBpe, RandomTextRoundTripsAndStreamsValidUtf8) {
  BpeVocab v;
  const std::string sp = tok::byte_to_unicode(' ');
  v.merge(sp, "t");
  v.merge("h", "e");
  v.merge(sp + "t", "he");
  for (PreTokenizer p :
       {PreTokenizer::kGpt2, PreTokenizer::kLlama3, PreTokenizer::kQwen2, PreTokenizer::kDeepseek3,
        PreTokenizer::kGpt4o, PreTokenizer::kBailingMoe, PreTokenizer::kDefault, PreTokenizer::kDeepseekLlm}) {
    auto t = build(v.kvs(pre_tokenizer_name(p)));
    ASSERT_TRUE(t) << pre_tokenizer_name(p) << ": " << t.status().to_string();
    EXPECT_EQ((*t)->pre_tokenizer(), p);
    std::mt19937 rng(1234);
    size_t n_held = 0, n_multibyte = 0;
    for (int iter = 0; iter < 50; ++iter) {
      const std::string s = random_text(rng, 1 + static_cast<int>(rng() % 40)) + " the";
      auto ids = (*t)->encode(s);
      ASSERT_TRUE(ids);
      ASSERT_GE(ids->size(), 2u);
      EXPECT_EQ(*(*t)->decode(*ids), s) << pre_tokenizer_name(p);
      // Byte tokens only for non-ASCII, so every multi-byte character spans several tokens.
      StreamDecoder sd(**t);
      std::string streamed;
      for (int32_t id : *ids) {
        const std::string chunk = sd.push(id);
        EXPECT_TRUE(utf8_is_valid(chunk)) << "chunk with broken UTF-8";
        n_held += sd.pending_bytes() > 0;
        streamed += chunk;
      }
      streamed += sd.flush();
      EXPECT_EQ(streamed, s);
      for (unsigned char c : s) n_multibyte += c >= 0xC0;
    }
    EXPECT_GT(n_multibyte, 100u);  // the text really exercised multi-byte characters
    EXPECT_GT(n_held, 100u);       // and the decoder really had to hold bytes back
  }
}

TEST(StreamDecoder, InvalidBytesBecomeReplacementCharacters) {
  BpeVocab v;
  auto t = build(v.kvs());
  ASSERT_TRUE(t);
  StreamDecoder sd(**t);
  // A stray continuation byte, then an emoji cut short by an ASCII byte, then a truncated tail.
  std::string out;
  for (int b : {0x80, 0xF0, 0x9F, 0x61, 0xE4, 0xB8}) out += sd.push(b);
  EXPECT_EQ(sd.pending_bytes(), 2u);
  out += sd.flush();
  EXPECT_EQ(out,
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "a\xEF\xBF\xBD");
  EXPECT_TRUE(utf8_is_valid(out));
  EXPECT_EQ(utf8_complete_prefix("ab\xE4\xB8"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xE4\xB8\xAD"), 5u);
  EXPECT_EQ(utf8_complete_prefix("\xED\xA0"), 2u);  // surrogate half: never completes
}

// SPM: <unk> <s> </s>, 256 byte tokens, then pieces with scores.
struct SpmVocab {
  std::vector<std::string> tokens{"<unk>", "<s>", "</s>"};
  std::vector<float> scores{0, 0, 0};
  std::vector<int32_t> types{2, 3, 3};
  SpmVocab() {
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
      tokens.push_back(buf);
      scores.push_back(0);
      types.push_back(6);
    }
  }
  int32_t add(const std::string& t, float score) {
    tokens.push_back(t);
    scores.push_back(score);
    types.push_back(1);
    return static_cast<int32_t>(tokens.size() - 1);
  }
  KVs kvs() const {
    return {{"tokenizer.ggml.model", Value::str("llama")},
            {"tokenizer.ggml.tokens", Value::str_array(tokens)},
            {"tokenizer.ggml.scores", Value::f32_array(scores)},
            {"tokenizer.ggml.token_type", Value::i32_array(types)}};
  }
};

TEST(TokenizerSpm, ScoresSpacePrefixAndByteFallback) {
  const std::string u = "\xE2\x96\x81";  // U+2581
  SpmVocab v;
  const int32_t w = v.add(u, -1), a = v.add("a", -2), b = v.add("b", -2), c = v.add("c", -2);
  const int32_t ab = v.add("ab", -5), bc = v.add("bc", -3), wa = v.add(u + "a", -4);
  auto t = build(v.kvs());
  ASSERT_TRUE(t) << t.status().to_string();
  const Tokenizer& tk = **t;
  // "abc" -> "▁abc": bc (-3) beats ▁a (-4) beats ab (-5).
  EXPECT_EQ(*tk.encode("abc"), (std::vector<int32_t>{wa, bc}));
  EXPECT_EQ(*tk.encode("ab"), (std::vector<int32_t>{wa, b}));
  // BOS is added by default for SPM; "é" has no token: two byte tokens.
  EXPECT_EQ(*tk.encode("c\xC3\xA9", true), (std::vector<int32_t>{1, w, c, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(*tk.decode(*tk.encode("c\xC3\xA9 ab", true)), "c\xC3\xA9 ab");
  // A special token restarts the space prefix, and decode mirrors that.
  auto ids = *tk.encode("a</s>a", false, true);
  EXPECT_EQ(ids, (std::vector<int32_t>{wa, 2, wa}));
  EXPECT_EQ(*tk.decode(ids, {.special = true}), "a</s>a");
  // Streaming generated text keeps the leading space (it continues a prompt).
  StreamDecoder sd(tk);
  EXPECT_EQ(sd.push(wa), " a");
  EXPECT_EQ(sd.push(3 + 0xC3), "");
  EXPECT_EQ(sd.push(3 + 0xA9), "\xC3\xA9");
  EXPECT_EQ(tk.token_to_piece(0), "\xE2\x96\x85");  // <unk> renders as U+2585
  EXPECT_TRUE(tk.is_eog(2));
  EXPECT_EQ(tk.bos(), 1);
  (void)a;
  (void)ab;
}

// Pre-tokenizer families whose vocabularies are not in the reference set: check the splits
// that distinguish them (digit grouping, contractions, CJK runs).
std::vector<std::string> split(PreTokenizer p, std::string_view text) {
  auto s = tok::RegexSplitter::create(p);
  EXPECT_TRUE(s) << s.status().to_string();
  std::vector<std::string_view> pieces;
  EXPECT_TRUE((*s)->split(text, pieces).is_ok());
  return {pieces.begin(), pieces.end()};
}

TEST(PreTokenizer, FamiliesSplitAsSpecified) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split(PreTokenizer::kLlama3, "x 12345 I'M"), (V{"x", " ", "123", "45", " I", "'M"}));
  EXPECT_EQ(split(PreTokenizer::kQwen2, "a1234"), (V{"a", "1", "2", "3", "4"}));
  EXPECT_EQ(split(PreTokenizer::kGpt2, "I'M ok  "), (V{"I", "'", "M", " ok", "  "}));
  EXPECT_EQ(split(PreTokenizer::kLlama3, "a\n\n b"), (V{"a", "\n\n", " b"}));
  EXPECT_EQ(split(PreTokenizer::kDeepseek3,
                  "\xE6\x88\x91\xE6\x83\xB3"
                  "apple12345"),
            (V{"\xE6\x88\x91\xE6\x83\xB3", "apple", "123", "45"}));
  EXPECT_EQ(split(PreTokenizer::kGpt4o, "HelloWorld ok"), (V{"Hello", "World", " ok"}));
  EXPECT_EQ(split(PreTokenizer::kBailingMoe, "we'll 42"), (V{"we", "'ll", " ", "4", "2"}));
  // Pieces always tile the input exactly.
  std::mt19937 rng(7);
  for (int p = 0; p < static_cast<int>(PreTokenizer::kCOUNT); ++p) {
    const std::string s = random_text(rng, 64);
    std::string joined;
    for (const auto& piece : split(static_cast<PreTokenizer>(p), s)) {
      EXPECT_FALSE(piece.empty());
      joined += piece;
    }
    EXPECT_EQ(joined, s);
  }
}

// ---- malformed metadata: every case is a Status naming the problem, never a crash ----

void expect_error(const KVs& kvs, StatusCode code, const std::string& needle) {
  auto t = build(kvs);
  ASSERT_FALSE(t) << "accepted metadata that should fail (" << needle << ")";
  EXPECT_EQ(t.status().code(), code) << t.status().to_string();
  EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status().to_string();
}

KVs without(KVs kv, const std::string& key) {
  std::erase_if(kv, [&](const auto& p) { return p.first == key; });
  return kv;
}

KVs with(KVs kv, const std::string& key, Value v) {
  kv = without(kv, key);
  kv.emplace_back(key, std::move(v));
  return kv;
}

TEST(TokenizerMalformed, ClearErrors) {
  BpeVocab v;
  v.merge("a", "b");
  const KVs good = v.kvs();
  ASSERT_TRUE(build(good));
  expect_error(without(good, "tokenizer.ggml.model"), StatusCode::kNotFound, "tokenizer.ggml.model");
  expect_error(with(good, "tokenizer.ggml.model", Value::str("wordpiece?")), StatusCode::kUnsupported, "wordpiece?");
  expect_error(without(good, "tokenizer.ggml.tokens"), StatusCode::kNotFound, "tokenizer.ggml.tokens");
  expect_error(with(good, "tokenizer.ggml.tokens", Value::i32_array({1, 2})), StatusCode::kTypeMismatch,
               "tokenizer.ggml.tokens");
  expect_error(with(good, "tokenizer.ggml.tokens", Value::str_array({})), StatusCode::kCorrupt, "empty");
  expect_error(without(good, "tokenizer.ggml.merges"), StatusCode::kNotFound, "tokenizer.ggml.merges");
  expect_error(with(good, "tokenizer.ggml.merges", Value::str_array({"a b", "a zz"})), StatusCode::kCorrupt, "'zz'");
  expect_error(with(good, "tokenizer.ggml.merges", Value::str_array({"ab"})), StatusCode::kCorrupt, "merges[0]");
  expect_error(with(good, "tokenizer.ggml.scores", Value::f32_array({1.0f, 2.0f})), StatusCode::kCorrupt,
               "scores has 2 entries but tokenizer.ggml.tokens has 257");
  expect_error(with(good, "tokenizer.ggml.token_type", Value::i32_array({1})), StatusCode::kCorrupt,
               "token_type has 1 entries");
  std::vector<int32_t> types(257, 1);
  types[5] = 42;
  expect_error(with(good, "tokenizer.ggml.token_type", Value::i32_array(types)), StatusCode::kCorrupt,
               "token_type[5] = 42");
  expect_error(with(good, "tokenizer.ggml.pre", Value::str("klingon")), StatusCode::kUnsupported, "klingon");
  expect_error(with(good, "tokenizer.ggml.eos_token_id", Value::u32(999)), StatusCode::kCorrupt, "eos_token_id = 999");
  expect_error(with(good, "tokenizer.ggml.add_bos_token", Value::str("yes")), StatusCode::kTypeMismatch,
               "add_bos_token");
  SpmVocab s;
  expect_error(with(s.kvs(), "tokenizer.ggml.scores", Value::f32_array({0.0f})), StatusCode::kCorrupt,
               "scores has 1 entries");

  // no_vocab loads but cannot encode.
  auto nv = build({{"tokenizer.ggml.model", Value::str("no_vocab")}});
  ASSERT_TRUE(nv);
  auto e = (*nv)->encode("x");
  ASSERT_FALSE(e);
  EXPECT_EQ(e.status().code(), StatusCode::kUnsupported);
}

TEST(TokenizerMalformed, RandomMergeListsNeverCrash) {
  // Random merge strings over a tiny alphabet: each either loads (and then encodes arbitrary
  // bytes) or fails with kCorrupt.
  std::mt19937 rng(99);
  const std::vector<std::string> known = {"a", "b", "c", "ab"};
  const std::string alphabet = "ab cz";
  int n_ok = 0, n_err = 0;
  for (int iter = 0; iter < 200; ++iter) {
    BpeVocab v;
    v.merge("a", "b");
    std::vector<std::string> merges = v.merges;
    // Half the time a well-formed pair of known tokens, otherwise random characters.
    std::string s;
    if (rng() % 2) {
      s = known[rng() % known.size()] + " " + known[rng() % known.size()];
    } else {
      for (int k = 0, n = static_cast<int>(rng() % 5); k < n; ++k) s += alphabet[rng() % 5];
    }
    merges.push_back(s);
    auto t = build(with(v.kvs(), "tokenizer.ggml.merges", Value::str_array(merges)));
    if (!t) {
      EXPECT_EQ(t.status().code(), StatusCode::kCorrupt);
      ++n_err;
      continue;
    }
    ++n_ok;
    std::string junk;
    for (int k = 0; k < 32; ++k) junk.push_back(static_cast<char>(rng()));
    auto ids = (*t)->encode(junk);
    ASSERT_TRUE(ids);
    EXPECT_TRUE(utf8_is_valid(*(*t)->decode(*ids)));  // invalid input became U+FFFD
  }
  EXPECT_GT(n_ok, 5);
  EXPECT_GT(n_err, 5);
}

// With the reference GPT-2 vocabulary: emoji/CJK streamed token by token stay valid UTF-8, and
// <|endoftext|> is parsed only when asked.
TEST(TokenizerReference, Gpt2StreamingAndSpecial) {
  const std::filesystem::path p = std::filesystem::path(MOESH_REFERENCE_DIR) / "vocab" / "ggml-vocab-gpt-2.gguf";
  if (!std::filesystem::exists(p)) GTEST_SKIP() << "SKIP: " << p << " not found";
  auto f = gguf::File::open(p.string());
  ASSERT_TRUE(f);
  auto t = Tokenizer::from_gguf(**f);
  ASSERT_TRUE(t);
  const Tokenizer& tk = **t;
  const std::string text =
      "Emoji \xF0\x9F\xA6\x99\xF0\x9F\x98\x81 and \xE6\x88\x91\xE6\x83\xB3\xE5\x9C\xA8 "
      "\xE1\x9E\x80\xE1\x9E\xB6 ok";
  auto ids = *tk.encode(text);
  StreamDecoder sd(tk);
  std::string streamed;
  int n_empty = 0;
  for (int32_t id : ids) {
    const std::string chunk = sd.push(id);
    EXPECT_TRUE(utf8_is_valid(chunk));
    n_empty += chunk.empty();
    streamed += chunk;
  }
  streamed += sd.flush();
  EXPECT_EQ(streamed, text);
  EXPECT_GT(n_empty, 0);  // some emoji/CJK characters really were split across tokens
  const int32_t eot = tk.token_id("<|endoftext|>");
  ASSERT_EQ(eot, 50256);
  EXPECT_TRUE(tk.is_eog(eot));
  EXPECT_EQ(*tk.encode("a<|endoftext|>", false, true), (std::vector<int32_t>{64, 50256}));
  EXPECT_GT(tk.encode("a<|endoftext|>", false, false)->size(), 2u);
}

}  // namespace
}  // namespace moesh
