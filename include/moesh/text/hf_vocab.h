// Hugging Face tokenizer -> GGUF tokenizer metadata, the way llama.cpp's converter writes it.
//
// What it is for: giving a model file a real tokenizer and chat template (`moesh make-model
// --vocab-from DIR`) from the two files every HF model repository carries, tokenizer.json and
// tokenizer_config.json (plus config.json's vocab_size and special ids when present), so tests
// and users can run Qwen3's, DeepSeek-V3's, Llama 3's or gpt-oss's tokenizer without a real GGUF.
//
// The keys follow convert_hf_to_gguf.py (get_vocab_base + SpecialVocab):
//  * tokenizer.ggml.model = "gpt2" (byte-level BPE is the only model kind accepted);
//  * tokenizer.ggml.pre: detected from the pre_tokenizer's Split regexes (a table of the known
//    families: qwen2, llama-bpe, deepseek-v3, gpt-4o, gpt-2), or given by the caller;
//  * tokens by id, ids missing from both the vocabulary and added_tokens are "[PAD<id>]" UNUSED;
//    added tokens marked special, or looking special (<|...|>, <｜...｜>, <pad>, <mask>, ...), are
//    CONTROL, other added tokens USER_DEFINED, the rest NORMAL;
//  * merges as "a b" strings (tokenizer.json holds either that or ["a", "b"] pairs);
//  * bos/eos/unk/padding/sep/cls/mask ids from tokenizer_config.json's *_token (a string or an
//    AddedToken object), config.json's *_token_id filling what is missing; add_bos_token /
//    add_eos_token from tokenizer_config.json, else from a TemplateProcessing post-processor;
//  * tokenizer.chat_template from tokenizer_config.json (a string, or the named-template list
//    whose "default" entry is taken).
// Everything read is untrusted: errors name the file and the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moesh/gguf/gguf.h"
#include "moesh/util/status.h"

namespace moesh {

struct HfVocabOptions {
  // tokenizer.ggml.pre to write; empty: detect from the pre_tokenizer (an error when unknown).
  std::string pre;
  // Number of tokens; 0: config.json's vocab_size, else the highest id + 1. Ids without a token
  // become "[PAD<id>]" (UNUSED), as the converter does for vocab_size > len(vocab).
  int64_t n_vocab = 0;
};

struct HfVocab {
  std::vector<std::pair<std::string, gguf::Value>> kvs;  // in the converter's key order
  int64_t n_tokens = 0;
  std::string pre;            // the tokenizer.ggml.pre written
  std::string chat_template;  // empty when the tokenizer has none
};

// Reads DIR/tokenizer.json, DIR/tokenizer_config.json (optional) and DIR/config.json (optional).
Result<HfVocab> import_hf_vocab(const std::filesystem::path& dir, const HfVocabOptions& opt = {});
// The same from the files' contents; an empty config text means the file is absent.
Result<HfVocab> import_hf_vocab_text(std::string_view tokenizer_json, std::string_view tokenizer_config_json,
                                     std::string_view config_json, const HfVocabOptions& opt = {});

// The pre-tokenizer name for a tokenizer.json pre_tokenizer's Split regexes, in order ("" when
// unknown). Exposed for tests and for the error message listing what was found.
std::string hf_pre_tokenizer_name(const std::vector<std::string>& split_regexes, bool byte_level_regex);

}  // namespace moesh
