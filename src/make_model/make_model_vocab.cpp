// make_model's built-in tokenizer: a byte-level BPE vocabulary (llama.cpp `gpt2` model, `qwen2`
// pre-tokenizer) learned from a small English text embedded below, plus the ChatML specials and
// chat template, so random-weight models can be prompted with text.
//
// Training (deterministic, done once per process): the text is split with the same qwen2
// pre-tokenizer the Tokenizer uses, each piece becomes its GPT-2 byte-unicode characters (one
// symbol per byte), and the most frequent adjacent symbol pair over all pieces is merged again
// and again, ties broken by the (left, right) token texts in byte order, until every piece is a
// single symbol. A vocabulary of n_vocab tokens takes the first merges, so a bigger vocabulary
// extends a smaller one instead of changing it.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "make_model/make_model_internal.h"
#include "moesh/text/bpe_text.h"
#include "moesh/text/tokenizer.h"

namespace moesh::detail {
namespace {

// Written for this purpose: varied everyday prose, numbers and dates (every digit is its own
// piece under qwen2), punctuation, contractions, a few accented words, dashes, quotes and emoji,
// so the byte tokens beyond ASCII are exercised and common English words become single tokens.
constexpr std::string_view kBuiltinText = R"TXT(The Lighthouse Keeper's Notebook

On the first morning of spring, the keeper climbed the one hundred and twelve steps of the tower and wrote in her notebook: "Wind from the west, sea calm, two ships before noon." She had kept the light for 27 years, and in all that time she had never missed a single night. The town below called her stubborn; she called it being careful.

There is a small café at the end of the harbour road where the fishermen drink their coffee at 5:30 in the morning. The owner, a naïve young man from the city, once asked them why they got up so early. "Because the fish don't wait for us," the oldest one said, "and the weather doesn't either." Everyone laughed, but it was true. By 7 o'clock the boats were already out past the rocks, and the café was empty again.

People often think that a quiet life is an empty one. It is not. A quiet life is full of small things that need to be done at the right time and in the right order: the lamp must be cleaned, the clock must be wound, the log must be written, and the stairs must be swept. If you do these things well, nobody notices. If you forget them, everyone does.

In 1998 a storm broke three windows in the lantern room. The keeper repaired them herself with glass that came on the ferry from the mainland, at a cost of 340 pounds and 15 pence. She kept the receipt in the notebook, next to a pressed flower and a list of the birds she had seen that year: gulls, terns, a heron, two cormorants and, once, a puffin. "It's not much of a list," she wrote, "but it's mine."

Here are some rules she wrote on the inside cover:
1. Check the weather three times a day.
2. Never let the oil run low.
3. Answer every letter, even the strange ones.
4. When in doubt, light the lamp early.
5. Tea first, then everything else.

Children from the school visited the tower every summer. They asked the same questions every year — how high is it, how far can you see, are you ever lonely — and she gave the same answers every year: 38 metres, about 20 miles on a clear day, and no, not really. Then she let them look through the big lens, and they would go quiet, because the world looks different when it is upside down and full of light.

The keeper's brother lived in a city far away and wrote to her every month. His letters were long and full of news about trains, prices, politics and the weather, which he always described as "grey". Hers were short. "The sea is blue today. The sea was green yesterday. I think it will be grey tomorrow, so you will feel at home." He said that her letters were the only ones he read twice.

Numbers mattered to her. She counted the flashes of the light (one every 10 seconds), the ships that passed (4,312 in the year 2003, her record), and the cups of tea she drank (she stopped counting after 20,000). She liked that numbers did not argue. A number is what it is: 3 is 3, 100 is 100, and 0.5 is exactly half of 1.

One winter evening a stranger knocked at the door. He was wet, tired and lost, and he spoke with an accent she could not place. She gave him soup, a blanket and a chair by the stove. He told her about his home, a village in the mountains where the snow came in October and left in May, and where everyone played music in the long evenings. In the morning the storm had passed. He thanked her, left a small wooden bird on the table, and walked down the hill toward the harbour. She never saw him again, but the bird stayed on the shelf above her desk for the rest of her life.

What does it mean to keep a light? It means that you are awake when others are asleep. It means that you care about people you will never meet. It means that you trust the work, even on the nights when nothing happens, because the night when something does happen is the one that counts. "A lighthouse," she once said, "is a promise that somebody is still watching."

When the light was finally automated, the keeper moved into a small house in the town. She still walked up the hill every evening at sunset to see the lamp come on by itself. "It doesn't need me any more," she told the owner of the café, "and that's fine. Good work should outlast the worker." He poured her a coffee and didn't charge her for it. 🙂

Later, a museum asked for her notebooks. There were 43 of them, every page dated and numbered, from 12/03/1971 to 30/09/2014. The curator said they were the most complete record of the coast that anyone had ever kept. The keeper was pleased, though she did not say so. She only asked that they keep the pressed flower where it was — on page 118 of notebook 17 — because that was where it belonged.

Some résumé of facts, for those who like facts: the tower is white with one red band; the lens weighs about 2 tonnes; the light can be seen from 20 miles away; the island has no trees, 3 houses and roughly 1,500 sheep. The water is cold all year (between 8 and 14 degrees), the wind is strong, and the people are kind. Tourists say "wow" and "amazing" and "so beautiful", and then they go home. The keeper stayed. 🌊
)TXT";

// Qwen's ChatML template (as in Qwen2 chat models): a default system turn when the caller gives
// none, each message as <|im_start|>role\ncontent<|im_end|>\n, then the assistant header.
constexpr const char* kChatTemplate =
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// The full merge sequence of the built-in text.
struct TrainedBpe {
  Status status;
  // Tokens beyond the 256 byte tokens, in creation order.
  std::vector<std::string> learned;
  // Merges in rank order, as "left right".
  std::vector<std::string> merges;
  // merges_for[k]: how many merges a vocabulary with the first k learned tokens takes (all the
  // merges up to the one that created token k; a merge whose result already exists creates none).
  std::vector<size_t> merges_for;
};

TrainedBpe train() {
  TrainedBpe out;
  auto splitter = tok::RegexSplitter::create(PreTokenizer::kQwen2);
  if (!splitter.is_ok()) {
    out.status = splitter.status();
    return out;
  }
  std::vector<std::string_view> pieces;
  out.status = (*splitter)->split(kBuiltinText, pieces);
  if (!out.status.is_ok()) return out;

  // Token texts by id: 0..255 are the bytes, in byte order.
  std::vector<std::string> text;
  std::unordered_map<std::string, int32_t> id_of;
  for (int b = 0; b < 256; ++b) {
    text.push_back(tok::byte_to_unicode(static_cast<uint8_t>(b)));
    id_of.emplace(text.back(), b);
  }
  // Distinct pieces (std::map: a fixed order) with their counts, as symbol-id sequences.
  std::map<std::string, int64_t> piece_count;
  for (std::string_view p : pieces) ++piece_count[std::string(p)];
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> counts;
  for (const auto& [p, c] : piece_count) {
    std::vector<int32_t> w;
    for (char ch : p) w.push_back(static_cast<uint8_t>(ch));
    if (w.size() < 2) continue;  // nothing to merge
    words.push_back(std::move(w));
    counts.push_back(c);
  }

  out.merges_for.push_back(0);
  std::unordered_map<uint64_t, int64_t> pair_count;
  auto key = [](int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  };
  while (true) {
    // Recounting from scratch each round keeps this simple; the text is a few KB, so the whole
    // training is a few thousand rounds over a few thousand symbols.
    pair_count.clear();
    for (size_t w = 0; w < words.size(); ++w) {
      for (size_t i = 0; i + 1 < words[w].size(); ++i) {
        pair_count[key(words[w][i], words[w][i + 1])] += counts[w];
      }
    }
    if (pair_count.empty()) break;
    int32_t best_l = -1, best_r = -1;
    int64_t best_c = 0;
    for (const auto& [k, c] : pair_count) {
      const auto l = static_cast<int32_t>(k >> 32), r = static_cast<int32_t>(k & 0xFFFFFFFFu);
      bool better = c > best_c;
      if (!better && c == best_c) {
        const int cmp = text[l].compare(text[best_l]);
        better = cmp < 0 || (cmp == 0 && text[r] < text[best_r]);
      }
      if (better) {
        best_c = c;
        best_l = l;
        best_r = r;
      }
    }
    const std::string merged = text[best_l] + text[best_r];
    out.merges.push_back(text[best_l] + " " + text[best_r]);
    int32_t merged_id;
    if (auto it = id_of.find(merged); it != id_of.end()) {
      merged_id = it->second;
    } else {
      merged_id = static_cast<int32_t>(text.size());
      text.push_back(merged);
      id_of.emplace(merged, merged_id);
      out.learned.push_back(merged);
      out.merges_for.push_back(out.merges.size());
    }
    for (auto& w : words) {
      size_t o = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == best_l && w[i + 1] == best_r) {
          w[o++] = merged_id;
          ++i;
        } else {
          w[o++] = w[i];
        }
      }
      w.resize(o);
    }
    // Pieces that became one symbol can take no further part.
    for (size_t w = 0; w < words.size();) {
      if (words[w].size() < 2) {
        words[w].swap(words.back());
        counts[w] = counts.back();
        words.pop_back();
        counts.pop_back();
      } else {
        ++w;
      }
    }
  }
  // Merges after the last new token add nothing a truncated vocabulary could use, but the full
  // vocabulary keeps them.
  out.merges_for.back() = out.merges.size();
  return out;
}

const TrainedBpe& trained() {
  static const TrainedBpe t = train();
  return t;
}

gguf::Value u32(int64_t v) {
  return gguf::Value::u32(static_cast<uint32_t>(v));
}

}  // namespace

std::string_view make_vocab_builtin_text() {
  return kBuiltinText;
}

Result<int64_t> make_vocab_max_learned() {
  const TrainedBpe& t = trained();
  MOESH_RETURN_IF_ERROR(t.status);
  return static_cast<int64_t>(t.learned.size());
}

Status validate_make_vocab(const MakeModelSpec& s) {
  if (s.vocab >= MakeVocab::kCOUNT) {
    return make_error(StatusCode::kInvalidArgument, "unknown vocab kind");
  }
  if (s.vocab == MakeVocab::kNone) return Status::ok();
  if (!s.imported_vocab.empty()) {
    const gguf::Value* tokens = nullptr;
    for (const auto& [k, v] : s.imported_vocab) {
      if (k == "tokenizer.ggml.tokens") tokens = &v;
    }
    if (tokens == nullptr || !std::holds_alternative<gguf::Array>(tokens->v)) {
      return make_error(StatusCode::kInvalidArgument, "the imported vocabulary has no tokenizer.ggml.tokens");
    }
    const auto n = static_cast<int64_t>(std::get<gguf::Array>(tokens->v).items.size());
    if (s.n_vocab != n) {
      return make_error(StatusCode::kInvalidArgument, "n_vocab {} differs from the imported vocabulary's {} tokens",
                        s.n_vocab, n);
    }
    return Status::ok();
  }
  if (s.n_vocab < kMakeVocabMinTokens) {
    return make_error(StatusCode::kInvalidArgument,
                      "n_vocab {} is too small for the built-in BPE tokenizer, which needs at "
                      "least {} tokens (256 byte tokens + 3 special tokens); use --vocab none "
                      "(MakeVocab::kNone) for an id-only model",
                      s.n_vocab, kMakeVocabMinTokens);
  }
  if (s.n_vocab > kMakeVocabMaxTokens) {
    return make_error(StatusCode::kInvalidArgument,
                      "n_vocab {} is larger than the {} tokens the built-in BPE tokenizer is "
                      "written for; use --vocab none (MakeVocab::kNone) for an id-only model",
                      s.n_vocab, kMakeVocabMaxTokens);
  }
  return trained().status;
}

void append_make_vocab_kvs(const MakeModelSpec& s, std::vector<std::pair<std::string, gguf::Value>>& kvs) {
  if (!s.imported_vocab.empty()) {
    bool have_template = false;
    for (const auto& [k, v] : s.imported_vocab) {
      if (k == "tokenizer.chat_template" && !s.chat_template.empty()) {
        kvs.emplace_back(k, gguf::Value::str(s.chat_template));
        have_template = true;
      } else {
        kvs.emplace_back(k, v);
      }
    }
    if (!have_template && !s.chat_template.empty())
      kvs.emplace_back("tokenizer.chat_template", gguf::Value::str(s.chat_template));
    return;
  }
  const TrainedBpe& t = trained();
  const int64_t n_special = std::size(kMakeVocabSpecials);
  const int64_t budget = s.n_vocab - 256 - n_special;
  const int64_t n_learned = std::min<int64_t>(budget, static_cast<int64_t>(t.learned.size()));
  const size_t n_merges = t.merges_for[static_cast<size_t>(n_learned)];

  // Built directly as gguf::Values: the perf-sized vocabulary has 150k entries, and going
  // through std::vector<std::string> first would copy each one twice more.
  std::vector<gguf::Value> tokens, types, merges;
  tokens.reserve(static_cast<size_t>(s.n_vocab));
  types.reserve(static_cast<size_t>(s.n_vocab));
  merges.reserve(n_merges);
  auto add = [&](std::string text, TokenType type) {
    tokens.push_back(gguf::Value::str(std::move(text)));
    types.push_back(gguf::Value::i32(static_cast<int32_t>(type)));
  };
  for (int b = 0; b < 256; ++b) add(tok::byte_to_unicode(static_cast<uint8_t>(b)), TokenType::kNormal);
  for (int64_t i = 0; i < n_learned; ++i) add(t.learned[static_cast<size_t>(i)], TokenType::kNormal);
  for (int64_t i = 0; i < budget - n_learned; ++i) {
    add("<|reserved_" + std::to_string(i) + "|>", TokenType::kUnused);
  }
  const int64_t first_special = static_cast<int64_t>(tokens.size());
  for (const char* sp : kMakeVocabSpecials) add(sp, TokenType::kControl);
  for (size_t i = 0; i < n_merges; ++i) merges.push_back(gguf::Value::str(t.merges[i]));

  const int64_t endoftext = first_special, im_end = first_special + 2;
  auto put = [&](std::string key, gguf::Value v) { kvs.emplace_back(std::move(key), std::move(v)); };
  put("tokenizer.ggml.model", gguf::Value::str("gpt2"));
  put("tokenizer.ggml.pre", gguf::Value::str("qwen2"));
  put("tokenizer.ggml.tokens", gguf::Value::array(gguf::ValueType::STRING, std::move(tokens)));
  put("tokenizer.ggml.token_type", gguf::Value::array(gguf::ValueType::INT32, std::move(types)));
  put("tokenizer.ggml.merges", gguf::Value::array(gguf::ValueType::STRING, std::move(merges)));
  put("tokenizer.ggml.eos_token_id", u32(im_end));
  put("tokenizer.ggml.padding_token_id", u32(endoftext));
  put("tokenizer.ggml.bos_token_id", u32(endoftext));
  put("tokenizer.ggml.add_bos_token", gguf::Value::boolean(false));
  put("tokenizer.chat_template", gguf::Value::str(s.chat_template.empty() ? kChatTemplate : s.chat_template));
}

}  // namespace moesh::detail
