// Tokenizer construction from GGUF metadata, special-token partitioning, encode and decode.
#include "moesh/text/tokenizer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "text/tokenizer_internal.h"

namespace moesh {
namespace {

// Flags that a pre-tokenizer name carries besides its regex family.
struct PreInfo {
  PreTokenizer family = PreTokenizer::kDefault;
  bool ignore_merges = false;
  bool add_bos = false;
  bool no_bos = false;  // chatglm: the vocabulary has no BOS
};

Result<PreInfo> pre_info_for(std::string_view n) {
  PreInfo p;
  auto in = [&](std::initializer_list<std::string_view> names) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  if (in({"default"})) {
    p.family = PreTokenizer::kDefault;
  } else if (in({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"})) {
    p = {PreTokenizer::kLlama3, true, true, false};
  } else if (in({"dbrx", "smaug-bpe"})) {
    p.family = PreTokenizer::kLlama3;
  } else if (in({"glm4", "chatglm-bpe"})) {
    p.family = PreTokenizer::kLlama3;
    p.no_bos = true;
  } else if (in({"qwen2", "deepseek-r1-qwen", "kormo", "megrez", "hunyuan", "stablelm2"})) {
    p.family = PreTokenizer::kQwen2;
  } else if (in({"deepseek-llm"})) {
    p.family = PreTokenizer::kDeepseekLlm;
  } else if (in({"deepseek-v3", "hunyuan-dense"})) {
    p.family = PreTokenizer::kDeepseek3;
  } else if (in({"gpt-4o", "llama4", "minimax-m2"})) {
    p.family = PreTokenizer::kGpt4o;
  } else if (in({"bailingmoe", "bailingmoe2", "llada-moe"})) {
    p.family = PreTokenizer::kBailingMoe;
  } else if (in({"gpt-2", "phi-2", "roberta-bpe", "mellum", "exaone4"}) || n.substr(0, 5) == "jina-") {
    p.family = PreTokenizer::kGpt2;
  } else {
    return make_error(StatusCode::kUnsupported, "tokenizer.ggml.pre '{}' is not a supported pre-tokenizer",
                      std::string(n));
  }
  return p;
}

// Token texts that end a turn in the chat formats we know (docs §1, end-of-generation set).
constexpr std::string_view k_eog_texts[] = {"<|eot_id|>", "<|im_end|>",    "<|end|>",         "<|return|>",
                                            "<|call|>",   "<end_of_turn>", "<|endoftext|>",   "<|eom_id|>",
                                            "<EOT>",      "_<EOT>",        "<|end_of_text|>", "<end_of_utterance>"};

// Reads an optional special-token id. Missing -> `def`; UINT32_MAX / negative -> none (-1);
// anything else must name a token.
Status read_special_id(const gguf::File& f, const char* key, int32_t n_vocab, int32_t& id) {
  if (!f.has(key)) return Status::ok();
  auto r = f.get<int64_t>(key);
  if (!r) return r.status();
  const int64_t v = *r;
  if (v < 0 || v == std::numeric_limits<uint32_t>::max()) {
    id = -1;
    return Status::ok();
  }
  if (v >= n_vocab) {
    return make_error(StatusCode::kCorrupt, "{} = {} is outside the vocabulary ({} tokens)", key, v, n_vocab);
  }
  id = static_cast<int32_t>(v);
  return Status::ok();
}

bool is_special_type(TokenType t) {
  return t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown;
}

Status load(const gguf::File& f, Tokenizer::Impl& t) {
  MOESH_ASSIGN_OR_RETURN(std::string model, f.get<std::string>("tokenizer.ggml.model"));
  if (model == "gpt2") {
    t.kind = VocabKind::kBpe;
  } else if (model == "llama") {
    t.kind = VocabKind::kSpm;
  } else if (model == "no_vocab" || model == "none") {
    t.kind = VocabKind::kNone;
    return Status::ok();
  } else {
    return make_error(StatusCode::kUnsupported, "tokenizer.ggml.model '{}' is not supported (gpt2, llama, no_vocab)",
                      model);
  }

  MOESH_ASSIGN_OR_RETURN(t.text, f.get<std::vector<std::string>>("tokenizer.ggml.tokens"));
  if (t.text.empty()) return make_error(StatusCode::kCorrupt, "tokenizer.ggml.tokens is empty");
  if (t.text.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return make_error(StatusCode::kOutOfRange, "tokenizer.ggml.tokens has {} entries", t.text.size());
  }
  const size_t n = t.text.size();
  const auto n_vocab = static_cast<int32_t>(n);
  if (f.has("tokenizer.ggml.scores")) {
    MOESH_ASSIGN_OR_RETURN(t.scores, f.get<std::vector<float>>("tokenizer.ggml.scores"));
    if (t.scores.size() != n) {
      return make_error(StatusCode::kCorrupt, "tokenizer.ggml.scores has {} entries but tokenizer.ggml.tokens has {}",
                        t.scores.size(), n);
    }
  } else {
    t.scores.assign(n, 0.0f);
  }
  t.types.assign(n, TokenType::kNormal);
  if (f.has("tokenizer.ggml.token_type")) {
    MOESH_ASSIGN_OR_RETURN(std::vector<int32_t> types, f.get<std::vector<int32_t>>("tokenizer.ggml.token_type"));
    if (types.size() != n) {
      return make_error(StatusCode::kCorrupt,
                        "tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}", types.size(), n);
    }
    for (size_t i = 0; i < n; ++i) {
      if (types[i] < 0 || types[i] >= static_cast<int32_t>(TokenType::kCOUNT)) {
        return make_error(StatusCode::kCorrupt, "tokenizer.ggml.token_type[{}] = {} is not a token type", i, types[i]);
      }
      t.types[i] = static_cast<TokenType>(types[i]);
    }
  }
  t.text_to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    // llama.cpp names empty tokens so they stay addressable and never match text.
    if (t.text[i].empty()) t.text[i] = fmt::format("[EMPTY_{}]", i);
    // Duplicate texts keep the first id, which is what a lookup by text can reach.
    t.text_to_id.emplace(t.text[i], static_cast<int32_t>(i));
  }

  PreInfo pre;
  if (t.kind == VocabKind::kBpe) {
    if (f.has("tokenizer.ggml.pre")) {
      MOESH_ASSIGN_OR_RETURN(std::string pre_name, f.get<std::string>("tokenizer.ggml.pre"));
      MOESH_ASSIGN_OR_RETURN(pre, pre_info_for(pre_name));
    } else {
      spdlog::warn("tokenizer: no tokenizer.ggml.pre key, using the 'default' pre-tokenizer");
    }
    t.pre = pre.family;
    t.ignore_merges = pre.ignore_merges;
    t.add_bos = pre.add_bos;
    MOESH_ASSIGN_OR_RETURN(std::vector<std::string> merges, f.get<std::vector<std::string>>("tokenizer.ggml.merges"));
    t.merge_rank.reserve(merges.size());
    for (size_t r = 0; r < merges.size(); ++r) {
      const std::string& m = merges[r];
      const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
      if (sp == std::string::npos || sp + 1 >= m.size()) {
        return make_error(StatusCode::kCorrupt, "tokenizer.ggml.merges[{}] = '{}' is not two space-separated tokens", r,
                          m);
      }
      const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
      if (!t.text_to_id.count(left) || !t.text_to_id.count(right)) {
        return make_error(StatusCode::kCorrupt,
                          "tokenizer.ggml.merges[{}] = '{}' names a token that is not in the "
                          "vocabulary ('{}')",
                          r, m, t.text_to_id.count(left) ? right : left);
      }
      t.merge_rank.emplace(m, static_cast<int32_t>(r));  // first (lowest) rank wins
    }
    MOESH_ASSIGN_OR_RETURN(t.splitter, tok::RegexSplitter::create(t.pre));
  } else {  // SPM defaults (llama.cpp): <unk>=0, <s>=1, </s>=2, BOS added, space prefix.
    t.unk = 0;
    t.bos = n_vocab > 1 ? 1 : -1;
    t.eos = n_vocab > 2 ? 2 : -1;
    t.add_bos = true;
    t.add_space_prefix = true;
    t.byte_token.fill(-1);
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
      t.byte_token[b] = t.find(buf);
    }
  }

  MOESH_RETURN_IF_ERROR(read_special_id(f, "tokenizer.ggml.bos_token_id", n_vocab, t.bos));
  MOESH_RETURN_IF_ERROR(read_special_id(f, "tokenizer.ggml.eos_token_id", n_vocab, t.eos));
  MOESH_RETURN_IF_ERROR(read_special_id(f, "tokenizer.ggml.eot_token_id", n_vocab, t.eot));
  MOESH_RETURN_IF_ERROR(read_special_id(f, "tokenizer.ggml.eom_token_id", n_vocab, t.eom));
  MOESH_RETURN_IF_ERROR(read_special_id(f, "tokenizer.ggml.unknown_token_id", n_vocab, t.unk));
  MOESH_RETURN_IF_ERROR(read_special_id(f, "tokenizer.ggml.padding_token_id", n_vocab, t.pad));
  if (pre.no_bos) t.bos = -1;
  MOESH_ASSIGN_OR_RETURN(t.add_bos, f.get_or<bool>("tokenizer.ggml.add_bos_token", t.add_bos));
  MOESH_ASSIGN_OR_RETURN(t.add_eos, f.get_or<bool>("tokenizer.ggml.add_eos_token", t.add_eos));
  MOESH_ASSIGN_OR_RETURN(t.add_space_prefix, f.get_or<bool>("tokenizer.ggml.add_space_prefix", t.add_space_prefix));
  if (t.add_bos && t.bos < 0) t.add_bos = false;
  if (t.add_eos && t.eos < 0) t.add_eos = false;

  // End-of-generation set.
  t.eog.assign(n, 0);
  for (int32_t id : {t.eos, t.eot, t.eom}) {
    if (id >= 0) t.eog[id] = 1;
  }
  for (const char* key :
       {"tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id"}) {
    int32_t id = -1;
    MOESH_RETURN_IF_ERROR(read_special_id(f, key, n_vocab, id));
    if (id >= 0) t.eog[id] = 1;
  }
  for (std::string_view s : k_eog_texts) {
    const int32_t id = t.find(s);
    if (id < 0) continue;
    t.eog[id] = 1;
    t.types[id] = TokenType::kControl;  // so it is never produced from plain text
    if (t.eot < 0 && s != "<|endoftext|>") t.eot = id;
  }
  // gpt-oss harmony: <|end|> closes a message but not the generation.
  if (t.find("<|return|>") >= 0 && t.find("<|call|>") >= 0) {
    if (int32_t id = t.find("<|end|>"); id >= 0) t.eog[id] = 0;
  }

  for (int32_t i = 0; i < n_vocab; ++i) {
    if (is_special_type(t.types[i])) t.special_by_length.push_back(i);
  }
  std::stable_sort(t.special_by_length.begin(), t.special_by_length.end(),
                   [&](int32_t a, int32_t b) { return t.text[a].size() > t.text[b].size(); });
  return Status::ok();
}

// A run of plain text or one special token, produced by splitting on special-token texts.
struct Fragment {
  int32_t token;  // -1 for text
  size_t off, len;
};

// `guard` (optional) restricts where CONTROL/UNKNOWN texts may match: only wholly inside one of
// its sorted spans (Tokenizer::encode_guarded).
std::vector<Fragment> partition(const Tokenizer::Impl& t, std::string_view text, bool parse_special,
                                std::span<const Tokenizer::Span> guard = {}, bool guarded = false) {
  // Empty input has no fragments at all (an SPM run would otherwise become a lone prefix space).
  std::vector<Fragment> frags, next;
  if (!text.empty()) frags.push_back({-1, 0, text.size()});
  auto allowed = [&](int32_t id, size_t hit, size_t len) {
    if (!guarded || t.types[id] == TokenType::kUserDefined) return true;
    auto it = std::upper_bound(guard.begin(), guard.end(), hit,
                               [](size_t h, const Tokenizer::Span& sp) { return h < sp.offset; });
    if (it == guard.begin()) return false;
    --it;
    return hit + len <= it->offset + it->length;
  };
  for (int32_t id : t.special_by_length) {
    // Without special parsing only USER_DEFINED tokens are matched (llama.cpp / HF behaviour).
    if (!parse_special && t.types[id] != TokenType::kUserDefined) continue;
    const std::string& s = t.text[id];
    if (text.find(s) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& fr : frags) {
      if (fr.token >= 0) {
        next.push_back(fr);
        continue;
      }
      size_t pos = fr.off, run = fr.off;  // run: start of the text not yet emitted
      const size_t end = fr.off + fr.len;
      while (pos < end) {
        const size_t hit = text.substr(0, end).find(s, pos);
        if (hit == std::string_view::npos) break;
        if (!allowed(id, hit, s.size())) {
          pos = hit + 1;
          continue;
        }
        if (hit > run) next.push_back({-1, run, hit - run});
        next.push_back({id, hit, s.size()});
        pos = run = hit + s.size();
      }
      if (run < end) next.push_back({-1, run, end - run});
    }
    frags.swap(next);
  }
  return frags;
}

}  // namespace

Result<PreTokenizer> pre_tokenizer_for(std::string_view name) {
  MOESH_ASSIGN_OR_RETURN(PreInfo p, pre_info_for(name));
  return p.family;
}

const char* pre_tokenizer_name(PreTokenizer p) {
  switch (p) {
    case PreTokenizer::kDefault:
      return "default";
    case PreTokenizer::kGpt2:
      return "gpt-2";
    case PreTokenizer::kLlama3:
      return "llama3";
    case PreTokenizer::kQwen2:
      return "qwen2";
    case PreTokenizer::kDeepseekLlm:
      return "deepseek-llm";
    case PreTokenizer::kDeepseek3:
      return "deepseek-v3";
    case PreTokenizer::kGpt4o:
      return "gpt-4o";
    case PreTokenizer::kBailingMoe:
      return "bailingmoe";
    case PreTokenizer::kCOUNT:
      break;
  }
  return "?";
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const gguf::File& file) {
  auto impl = std::make_unique<Impl>();
  Status st = load(file, *impl);
  if (!st.is_ok()) return st.with_context("tokenizer");
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

namespace {
// encode() with an optional guard on where special-token texts may match (encode_guarded).
Result<std::vector<int32_t>> encode_impl(const Tokenizer::Impl& t, std::string_view text, bool add_special,
                                         bool parse_special, std::span<const Tokenizer::Span> guard, bool guarded) {
  if (t.kind == VocabKind::kNone) {
    return make_error(StatusCode::kUnsupported, "this model has no vocabulary (no_vocab)");
  }
  std::vector<int32_t> out;
  if (add_special && t.add_bos) out.push_back(t.bos);
  bool prev_special = true;  // SPM: a text run at the start or after a special token gets a space
  std::string escaped;
  for (const Fragment& fr : partition(t, text, parse_special, guard, guarded)) {
    if (fr.token >= 0) {
      out.push_back(fr.token);
      prev_special = true;
      continue;
    }
    std::string_view run = text.substr(fr.off, fr.len);
    if (t.kind == VocabKind::kBpe) {
      MOESH_RETURN_IF_ERROR(t.bpe_encode(run, out));
    } else {
      escaped.clear();
      if (t.add_space_prefix && prev_special) escaped = "\xE2\x96\x81";
      for (char c : run) {
        if (c == ' ')
          escaped += "\xE2\x96\x81";
        else
          escaped.push_back(c);
      }
      t.spm_encode(escaped, out);
    }
    prev_special = false;
  }
  if (add_special && t.add_eos) out.push_back(t.eos);
  return out;
}
}  // namespace

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  return encode_impl(*impl_, text, add_special, parse_special, {}, false);
}

Result<std::vector<int32_t>> Tokenizer::encode_guarded(std::string_view text, std::span<const Span> special_spans,
                                                       bool add_special) const {
  for (size_t i = 0; i < special_spans.size(); ++i) {
    const Span& sp = special_spans[i];
    if (sp.offset > text.size() || sp.length > text.size() - sp.offset ||
        (i > 0 && sp.offset < special_spans[i - 1].offset + special_spans[i - 1].length)) {
      return Status(StatusCode::kInvalidArgument,
                    "encode_guarded: span " + std::to_string(i) + " is out of order or outside the text");
    }
  }
  return encode_impl(*impl_, text, add_special, true, special_spans, true);
}

std::string Tokenizer::Impl::piece(int32_t id, bool special) const {
  if (id < 0 || static_cast<size_t>(id) >= text.size()) return {};
  const std::string& s = text[id];
  std::string out;
  switch (types[id]) {
    case TokenType::kControl:
      if (special) out = s;
      break;
    case TokenType::kUserDefined:
      out = s;
      break;
    case TokenType::kUnknown:
      if (kind == VocabKind::kSpm)
        out = "\xE2\x96\x85";  // llama.cpp renders <unk> as U+2585
      else if (special)
        out = s;
      break;
    case TokenType::kByte:
      if (kind == VocabKind::kSpm && s.size() == 6 && s.compare(0, 3, "<0x") == 0) {
        out.push_back(static_cast<char>(std::stoi(s.substr(3, 2), nullptr, 16)));
      } else {
        out = s;
      }
      break;
    case TokenType::kNormal:
      if (kind == VocabKind::kSpm) {
        for (size_t i = 0; i < s.size(); ++i) {
          if (s.compare(i, 3, "\xE2\x96\x81") == 0) {
            out.push_back(' ');
            i += 2;
          } else {
            out.push_back(s[i]);
          }
        }
      } else {
        // Byte-unicode characters back to bytes; a character outside the table (only in a
        // malformed vocabulary) is kept as its UTF-8.
        size_t i = 0;
        while (i < s.size()) {
          const size_t start = i;
          uint32_t cp;
          if (!tok::utf8_next(s, i, cp)) {
            out.push_back(s[i++]);
            continue;
          }
          const int b = tok::unicode_to_byte(cp);
          if (b >= 0)
            out.push_back(static_cast<char>(b));
          else
            out.append(s, start, i - start);
        }
      }
      break;
    default:  // undefined / unused tokens render as nothing, as in llama.cpp
      break;
  }
  return out;
}

Result<std::string> Tokenizer::decode(std::span<const int32_t> ids, DecodeOptions opt) const {
  const Impl& t = *impl_;
  std::string out;
  // Mirror of encode(): SPM text runs at the start or after a special token got a prefix space.
  const bool strip = opt.remove_space_prefix && t.kind == VocabKind::kSpm && t.add_space_prefix;
  bool at_run_start = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= n_vocab()) {
      return make_error(StatusCode::kOutOfRange,
                        "token id {} at position {} is outside the "
                        "vocabulary ({} tokens)",
                        id, i, n_vocab());
    }
    std::string p = t.piece(id, opt.special);
    if (is_special(id)) {
      at_run_start = true;
    } else {
      if (strip && at_run_start && !p.empty() && p[0] == ' ') p.erase(0, 1);
      at_run_start = false;
    }
    out += p;
  }
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id, bool special) const {
  return impl_->piece(id, special);
}

VocabKind Tokenizer::kind() const {
  return impl_->kind;
}
PreTokenizer Tokenizer::pre_tokenizer() const {
  return impl_->pre;
}
int32_t Tokenizer::n_vocab() const {
  return static_cast<int32_t>(impl_->text.size());
}
const std::string& Tokenizer::token_text(int32_t id) const {
  static const std::string k_empty;
  return id >= 0 && id < n_vocab() ? impl_->text[id] : k_empty;
}
TokenType Tokenizer::token_type(int32_t id) const {
  return id >= 0 && id < n_vocab() ? impl_->types[id] : TokenType::kUndefined;
}
int32_t Tokenizer::token_id(std::string_view text) const {
  return impl_->find(text);
}
int32_t Tokenizer::bos() const {
  return impl_->bos;
}
int32_t Tokenizer::eos() const {
  return impl_->eos;
}
int32_t Tokenizer::eot() const {
  return impl_->eot;
}
int32_t Tokenizer::unk() const {
  return impl_->unk;
}
int32_t Tokenizer::pad() const {
  return impl_->pad;
}
bool Tokenizer::add_bos() const {
  return impl_->add_bos;
}
bool Tokenizer::add_eos() const {
  return impl_->add_eos;
}
bool Tokenizer::is_eog(int32_t id) const {
  return id >= 0 && id < n_vocab() && impl_->eog[id] != 0;
}
bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < n_vocab() && is_special_type(impl_->types[id]);
}

}  // namespace moesh
