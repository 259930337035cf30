// Text <-> token ids, built from a GGUF's tokenizer metadata (docs/background/sampling-and-tokenizers.md).
//
// Two vocabulary kinds are supported, matching llama.cpp token for token:
//  - `gpt2`  : byte-level BPE. Text is first split around special tokens, then by the
//              pre-tokenizer regexes of the `tokenizer.ggml.pre` family (PCRE2 with Unicode
//              properties), each piece is mapped to GPT-2 byte-unicode characters and merged by
//              merge rank.
//  - `llama` : SentencePiece-style. Spaces become U+2581 (with a leading one added to each text
//              run that starts the input or follows a special token), characters are merged by
//              score, and characters without a token fall back to <0xXX> byte tokens.
//  - `no_vocab` / `none`: a tokenizer with no tokens; encode/decode report kUnsupported.
//
// Everything in the metadata is untrusted: wrong types, arrays of mismatched lengths, merges that
// name unknown tokens and out-of-range special ids are Status errors from from_gguf(), never a
// crash. A Tokenizer is immutable after construction and safe to share between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moesh/gguf/gguf.h"
#include "moesh/util/status.h"

namespace moesh {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
  kCOUNT = 7
};

enum class VocabKind { kNone, kBpe, kSpm };

// The pre-tokenizer families (tokenizer.ggml.pre names map onto these; see pre_tokenizer_for()).
enum class PreTokenizer {
  kDefault,      // `default` or missing key
  kGpt2,         // gpt-2, phi-2, roberta-bpe, jina-*, ...
  kLlama3,       // llama3, llama-bpe, dbrx, smaug-bpe, glm4, ... (digits in groups of 1-3)
  kQwen2,        // qwen2, deepseek-r1-qwen, hunyuan, ... (every digit separate)
  kDeepseekLlm,  // deepseek-llm
  kDeepseek3,    // deepseek-v3, hunyuan-dense
  kGpt4o,        // gpt-4o, llama4, minimax-m2 (o200k style)
  kBailingMoe,   // bailingmoe, bailingmoe2, llada-moe
  kCOUNT
};

struct DecodeOptions {
  // Render CONTROL tokens (BOS, <|im_end|>, ...) as their text; off by default like llama.cpp.
  bool special = false;
  // SPM vocabularies prefix the input with a space when encoding; drop it again from the start
  // of the decoded text so decode(encode(s)) == s. Off for continuations (generated text).
  bool remove_space_prefix = true;
};

class Tokenizer {
 public:
  // Reads tokenizer.ggml.* keys. Errors name the key and what was wrong with it.
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const gguf::File& file);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // add_special: prepend BOS / append EOS when the vocabulary asks for it (add_bos/add_eos).
  // parse_special: CONTROL token texts in `text` become those tokens; otherwise they are plain
  // text (USER_DEFINED tokens are always matched, as in llama.cpp). Invalid UTF-8 in BPE input is
  // replaced by U+FFFD, as llama.cpp does.
  Result<std::vector<int32_t>> encode(std::string_view text, bool add_special = false,
                                      bool parse_special = false) const;
  // A byte range [offset, offset + length) of a text.
  struct Span {
    size_t offset = 0;
    size_t length = 0;
  };
  // encode(text, add_special, parse_special=true), except that a CONTROL/UNKNOWN token text is
  // only recognised where it lies wholly inside one of `special_spans` (sorted, disjoint);
  // elsewhere it is plain text. For prompts assembled from trusted template text and untrusted
  // user text (tokenize_chat in chat.h): one pass, so text runs that cross span edges are
  // tokenized exactly as in encode().
  Result<std::vector<int32_t>> encode_guarded(std::string_view text, std::span<const Span> special_spans,
                                              bool add_special = false) const;
  // Concatenated pieces; kOutOfRange names the first id outside the vocabulary.
  Result<std::string> decode(std::span<const int32_t> ids, DecodeOptions opt = {}) const;
  // The bytes one token stands for (may be a partial UTF-8 sequence; see StreamDecoder).
  // An out-of-range id gives an empty string.
  std::string token_to_piece(int32_t id, bool special = false) const;

  VocabKind kind() const;
  PreTokenizer pre_tokenizer() const;
  int32_t n_vocab() const;
  // Raw token text as stored in the GGUF (byte-unicode or U+2581 form); "" when out of range.
  const std::string& token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;
  // Exact vocabulary lookup of a token's stored text; -1 when absent.
  int32_t token_id(std::string_view text) const;

  // Special ids, -1 when the vocabulary has none.
  int32_t bos() const;
  int32_t eos() const;
  int32_t eot() const;
  int32_t unk() const;
  int32_t pad() const;
  bool add_bos() const;
  bool add_eos() const;
  // End of generation: EOS, EOT, EOM, FIM pad/rep/sep and the known end-of-turn token texts.
  bool is_eog(int32_t id) const;
  // CONTROL / USER_DEFINED / UNKNOWN tokens, which decode() hides unless asked.
  bool is_special(int32_t id) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// tokenizer.ggml.pre name -> family; kNotFound-free: unknown names give an error Status.
Result<PreTokenizer> pre_tokenizer_for(std::string_view name);
const char* pre_tokenizer_name(PreTokenizer p);

// Turns a stream of generated token ids into text chunks that are always valid UTF-8: bytes of a
// multi-byte character split across tokens are held back until the character is complete.
// Bytes that can never form a valid character are emitted as U+FFFD.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool special = false) : tok_(tok), special_(special) {}
  // Text that became complete with this token (possibly empty).
  std::string push(int32_t id);
  // Whatever is still held back, with an unfinished character rendered as U+FFFD.
  std::string flush();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tok_;
  bool special_;
  std::string pending_;
};

// UTF-8 helpers shared by the tokenizer and its users.
// Length of the longest prefix of `s` that ends on a character boundary, treating a trailing
// *incomplete but still completable* sequence as not yet part of it.
size_t utf8_complete_prefix(std::string_view s);
// `s` with every invalid byte sequence replaced by U+FFFD.
std::string utf8_sanitize(std::string_view s);
bool utf8_is_valid(std::string_view s);

}  // namespace moesh
