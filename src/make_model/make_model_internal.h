// Internal pieces of make_model shared by its translation units (not a public API).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moesh/gguf/gguf.h"
#include "moesh/make_model/make_model.h"
#include "moesh/model/make_arch.h"

namespace moesh::detail {

// Tensor names, shapes, init and types in file order (offsets/n_bytes filled). Assumes the
// structural checks of MakeModelSpec::validate passed; block-size checks are done on its result.
std::vector<PlannedTensor> make_model_layout(const MakeModelSpec& spec);

// The registry's description of a MakeArch::kRegistry spec (make_model_registry.cpp).
Result<ArchMakePlan> registry_make_plan(const MakeModelSpec& spec);

// Metadata in the order llama.cpp's tools write it.
std::vector<std::pair<std::string, gguf::Value>> make_model_kvs(const MakeModelSpec& spec);

// ---- built-in BPE vocabulary (make_model_vocab.cpp)

// Special tokens of the built-in vocabulary, always its last three ids in this order.
inline constexpr const char* kMakeVocabSpecials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
inline constexpr int64_t kMakeVocabMinTokens = 256 + 3;
// Largest n_vocab the BPE vocabulary is written for (token ids are int32, and every token is a
// metadata string held in memory while planning); real vocabularies are below 300k.
inline constexpr int64_t kMakeVocabMaxTokens = int64_t{1} << 22;

// The English text the merges are learned from.
std::string_view make_vocab_builtin_text();
// The number of merges the built-in text yields before every piece is one token (the most
// learned tokens a vocabulary can have; larger n_vocab is padded with <|reserved_N|>).
// Trains once per process; kInternal if the pre-tokenizer cannot be built.
Result<int64_t> make_vocab_max_learned();
// n_vocab within [kMakeVocabMinTokens, kMakeVocabMaxTokens] for kBpe, with an error naming
// --vocab none otherwise; kNone accepts any n_vocab.
Status validate_make_vocab(const MakeModelSpec& spec);
// Appends the tokenizer keys for spec.vocab == kBpe in the converter's order:
// tokenizer.ggml.{model,pre,tokens,token_type,merges,eos_token_id,padding_token_id,
// bos_token_id,add_bos_token}, tokenizer.chat_template. Requires validate_make_vocab to pass.
void append_make_vocab_kvs(const MakeModelSpec& spec, std::vector<std::pair<std::string, gguf::Value>>& kvs);

// Checks only the spec's own fields (counts, divisibility, arch rules), not tensor block sizes.
Status validate_spec_fields(const MakeModelSpec& spec);

}  // namespace moesh::detail
