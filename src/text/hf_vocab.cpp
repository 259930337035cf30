// Hugging Face tokenizer.json / tokenizer_config.json -> GGUF tokenizer keys (hf_vocab.h).
#include "moesh/text/hf_vocab.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "moesh/text/tokenizer.h"

namespace moesh {
namespace {

using json = nlohmann::json;

// The Split regexes of the pre-tokenizer families a byte-level BPE tokenizer.json carries, as
// they appear in the files (JSON-decoded), and the tokenizer.ggml.pre name llama.cpp's converter
// gives them. One entry per family: the converter's own detection hashes the encoding of a test
// text, which needs the HF tokenizer itself; the regexes decide the same thing for these.
struct PreEntry {
  const char* name;
  std::vector<std::string> regexes;
};

const std::vector<PreEntry>& pre_table() {
  static const std::vector<PreEntry> table = {
      {"qwen2",
       {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
        "\\s+(?!\\S)|\\s+"}},
      {"llama-bpe",
       {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
        "\\s+(?!\\S)|\\s+"}},
      {"deepseek-v3",
       {"\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
        "?[\\p{P}\\p{S}]+"
        "[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}},
      {"gpt-4o",
       {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|"
        "'ll|'"
        "d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'"
        "ve|'m|'"
        "ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
  };
  return table;
}

Result<json> parse_json(std::string_view text, const char* file) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error(StatusCode::kInvalidArgument, "{}: not valid JSON", file);
  if (!j.is_object()) return make_error(StatusCode::kInvalidArgument, "{}: the top level is not an object", file);
  return j;
}

// A *_token entry: a string, an AddedToken object {"content": ...}, or null/absent ("").
Result<std::string> token_content(const json& cfg, const std::string& key) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return make_error(StatusCode::kInvalidArgument, "tokenizer_config.json: {} is neither a string nor an AddedToken",
                    key);
}

// convert_hf_to_gguf.py's does_token_look_special.
bool looks_special(std::string_view t) {
  auto starts = [&](std::string_view p) { return t.size() >= p.size() && t.substr(0, p.size()) == p; };
  auto ends = [&](std::string_view p) { return t.size() >= p.size() && t.substr(t.size() - p.size()) == p; };
  if (t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]") return true;
  if (starts("<|") && ends("|>") && t.size() >= 4) return true;
  if (starts("<\xef\xbd\x9c") && ends("\xef\xbd\x9c>") && t.size() >= 8) return true;  // <｜ ... ｜>
  return starts("<unused") && ends(">");
}

Status collect_splits(const json& pre, std::vector<std::string>& regexes, bool& byte_level_regex, int depth) {
  if (depth > 8) return make_error(StatusCode::kInvalidArgument, "tokenizer.json: pre_tokenizer nests too deep");
  if (pre.is_null()) return Status::ok();
  if (!pre.is_object())
    return make_error(StatusCode::kInvalidArgument, "tokenizer.json: pre_tokenizer is not an object");
  const std::string type = pre.value("type", "");
  if (type == "Sequence") {
    auto it = pre.find("pretokenizers");
    if (it == pre.end() || !it->is_array()) {
      return make_error(StatusCode::kInvalidArgument, "tokenizer.json: pre_tokenizer Sequence has no pretokenizers");
    }
    for (const json& p : *it) MOESH_RETURN_IF_ERROR(collect_splits(p, regexes, byte_level_regex, depth + 1));
  } else if (type == "Split") {
    auto pat = pre.find("pattern");
    if (pat == pre.end() || !pat->is_object()) {
      return make_error(StatusCode::kInvalidArgument, "tokenizer.json: pre_tokenizer Split has no pattern");
    }
    auto rx = pat->find("Regex");
    if (rx == pat->end()) rx = pat->find("String");
    if (rx == pat->end() || !rx->is_string()) {
      return make_error(StatusCode::kInvalidArgument, "tokenizer.json: pre_tokenizer Split pattern is not a string");
    }
    regexes.push_back(rx->get<std::string>());
  } else if (type == "ByteLevel") {
    if (pre.value("use_regex", true)) byte_level_regex = true;
  } else if (type != "Digits" && type != "Punctuation" && type != "WhitespaceSplit") {
    return make_error(StatusCode::kUnsupported, "tokenizer.json: pre_tokenizer type '{}' is not supported", type);
  }
  return Status::ok();
}

void put(HfVocab& v, std::string key, gguf::Value val) {
  v.kvs.emplace_back(std::move(key), std::move(val));
}

}  // namespace

std::string hf_pre_tokenizer_name(const std::vector<std::string>& split_regexes, bool byte_level_regex) {
  if (split_regexes.empty()) return byte_level_regex ? "gpt-2" : "";
  for (const PreEntry& e : pre_table()) {
    if (e.regexes == split_regexes) return e.name;
  }
  return "";
}

Result<HfVocab> import_hf_vocab_text(std::string_view tokenizer_json, std::string_view tokenizer_config_json,
                                     std::string_view config_json, const HfVocabOptions& opt) {
  MOESH_ASSIGN_OR_RETURN(json tok, parse_json(tokenizer_json, "tokenizer.json"));
  json cfg = json::object(), model_cfg = json::object();
  if (!tokenizer_config_json.empty()) {
    MOESH_ASSIGN_OR_RETURN(cfg, parse_json(tokenizer_config_json, "tokenizer_config.json"));
  }
  if (!config_json.empty()) {
    MOESH_ASSIGN_OR_RETURN(model_cfg, parse_json(config_json, "config.json"));
  }

  auto mit = tok.find("model");
  if (mit == tok.end() || !mit->is_object()) {
    return make_error(StatusCode::kInvalidArgument, "tokenizer.json: no model object");
  }
  const json& model = *mit;
  const std::string mtype = model.value("type", "");
  if (mtype != "BPE") {
    return make_error(StatusCode::kUnsupported,
                      "tokenizer.json: model.type '{}' is not supported (only byte-level BPE: gpt2 in GGUF)", mtype);
  }
  if (model.value("byte_fallback", false)) {
    return make_error(StatusCode::kUnsupported,
                      "tokenizer.json: model.byte_fallback is a SentencePiece-style BPE, not supported");
  }
  auto vit = model.find("vocab");
  if (vit == model.end() || !vit->is_object() || vit->empty()) {
    return make_error(StatusCode::kInvalidArgument, "tokenizer.json: model.vocab is missing or empty");
  }

  // id -> (text, type). Ids are bounded: a hostile file must not make us allocate 2^31 strings.
  constexpr int64_t kMaxTokens = int64_t{1} << 22;
  std::map<int64_t, std::pair<std::string, TokenType>> by_id;
  for (auto it = vit->begin(); it != vit->end(); ++it) {
    if (!it->is_number_integer()) {
      return make_error(StatusCode::kInvalidArgument, "tokenizer.json: model.vocab['{}'] is not an integer id",
                        it.key());
    }
    const int64_t id = it->get<int64_t>();
    if (id < 0 || id >= kMaxTokens) {
      return make_error(StatusCode::kInvalidArgument, "tokenizer.json: model.vocab['{}'] = {} is out of range",
                        it.key(), id);
    }
    if (!by_id.emplace(id, std::make_pair(it.key(), TokenType::kNormal)).second) {
      return make_error(StatusCode::kInvalidArgument, "tokenizer.json: model.vocab gives id {} twice", id);
    }
  }
  if (auto at = tok.find("added_tokens"); at != tok.end() && !at->is_null()) {
    if (!at->is_array()) return make_error(StatusCode::kInvalidArgument, "tokenizer.json: added_tokens is not a list");
    for (size_t i = 0; i < at->size(); ++i) {
      const json& a = (*at)[i];
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string()) {
        return make_error(StatusCode::kInvalidArgument,
                          "tokenizer.json: added_tokens[{}] needs an integer id and a "
                          "string content",
                          i);
      }
      const int64_t id = a["id"].get<int64_t>();
      if (id < 0 || id >= kMaxTokens) {
        return make_error(StatusCode::kInvalidArgument, "tokenizer.json: added_tokens[{}].id {} is out of range", i,
                          id);
      }
      std::string content = a["content"].get<std::string>();
      const bool special = a.value("special", false) || looks_special(content);
      by_id[id] = {std::move(content), special ? TokenType::kControl : TokenType::kUserDefined};
    }
  }
  int64_t n = by_id.rbegin()->first + 1;
  if (auto vs = model_cfg.find("vocab_size"); vs != model_cfg.end() && vs->is_number_integer()) {
    n = std::max(n, vs->get<int64_t>());
  }
  if (opt.n_vocab > 0) {
    if (opt.n_vocab < by_id.rbegin()->first + 1) {
      return make_error(StatusCode::kInvalidArgument, "n_vocab {} is below the tokenizer's highest id {} + 1",
                        opt.n_vocab, by_id.rbegin()->first);
    }
    n = opt.n_vocab;
  }
  if (n > kMaxTokens) return make_error(StatusCode::kInvalidArgument, "vocabulary of {} tokens is too large", n);

  // Merges: "a b" strings or ["a", "b"] pairs.
  std::vector<gguf::Value> merges;
  if (auto mg = model.find("merges"); mg != model.end() && !mg->is_null()) {
    if (!mg->is_array()) return make_error(StatusCode::kInvalidArgument, "tokenizer.json: model.merges is not a list");
    merges.reserve(mg->size());
    for (size_t i = 0; i < mg->size(); ++i) {
      const json& m = (*mg)[i];
      if (m.is_string()) {
        merges.push_back(gguf::Value::str(m.get<std::string>()));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.push_back(gguf::Value::str(m[0].get<std::string>() + " " + m[1].get<std::string>()));
      } else {
        return make_error(StatusCode::kInvalidArgument,
                          "tokenizer.json: model.merges[{}] is neither \"a b\" nor [\"a\", \"b\"]", i);
      }
    }
  }

  HfVocab out;
  out.n_tokens = n;
  if (!opt.pre.empty()) {
    out.pre = opt.pre;
  } else {
    std::vector<std::string> regexes;
    bool byte_level_regex = false;
    if (auto pt = tok.find("pre_tokenizer"); pt != tok.end()) {
      MOESH_RETURN_IF_ERROR(collect_splits(*pt, regexes, byte_level_regex, 0));
    }
    out.pre = hf_pre_tokenizer_name(regexes, byte_level_regex);
    if (out.pre.empty()) {
      std::string shown;
      for (const std::string& r : regexes) shown += (shown.empty() ? "" : ", ") + json(r).dump();
      return make_error(StatusCode::kUnsupported,
                        "tokenizer.json: pre_tokenizer Split regexes [{}] are not a family moesh knows (qwen2, "
                        "llama-bpe, deepseek-v3, gpt-4o, gpt-2); name one explicitly (--vocab-pre)",
                        shown);
    }
  }

  std::vector<gguf::Value> tokens, types;
  tokens.reserve(static_cast<size_t>(n));
  types.reserve(static_cast<size_t>(n));
  std::map<std::string, int64_t, std::less<>> id_of;
  for (int64_t id = 0; id < n; ++id) {
    auto it = by_id.find(id);
    if (it == by_id.end()) {
      tokens.push_back(gguf::Value::str("[PAD" + std::to_string(id) + "]"));
      types.push_back(gguf::Value::i32(static_cast<int32_t>(TokenType::kUnused)));
      continue;
    }
    id_of.emplace(it->second.first, id);
    tokens.push_back(gguf::Value::str(it->second.first));
    types.push_back(gguf::Value::i32(static_cast<int32_t>(it->second.second)));
  }

  put(out, "tokenizer.ggml.model", gguf::Value::str("gpt2"));
  put(out, "tokenizer.ggml.pre", gguf::Value::str(out.pre));
  put(out, "tokenizer.ggml.tokens", gguf::Value::array(gguf::ValueType::STRING, std::move(tokens)));
  put(out, "tokenizer.ggml.token_type", gguf::Value::array(gguf::ValueType::INT32, std::move(types)));
  put(out, "tokenizer.ggml.merges", gguf::Value::array(gguf::ValueType::STRING, std::move(merges)));

  // Special ids: tokenizer_config.json names them by text; config.json's ids fill the gaps.
  const std::pair<const char*, const char*> kinds[] = {{"bos", "bos"},       {"eos", "eos"},     {"unk", "unknown"},
                                                       {"sep", "seperator"}, {"pad", "padding"}, {"cls", "cls"},
                                                       {"mask", "mask"}};
  for (const auto& [hf, gg] : kinds) {
    MOESH_ASSIGN_OR_RETURN(std::string text, token_content(cfg, std::string(hf) + "_token"));
    int64_t id = -1;
    if (!text.empty()) {
      auto it = id_of.find(text);
      if (it == id_of.end()) {
        return make_error(StatusCode::kInvalidArgument, "tokenizer_config.json: {}_token '{}' is not in the vocabulary",
                          hf, text);
      }
      id = it->second;
    } else if (auto c = model_cfg.find(std::string(hf) + "_token_id"); c != model_cfg.end() && c->is_number_integer()) {
      id = c->get<int64_t>();
      if (id < 0 || id >= n) {
        return make_error(StatusCode::kInvalidArgument, "config.json: {}_token_id {} is outside the vocabulary", hf,
                          id);
      }
    }
    if (id >= 0)
      put(out, std::string("tokenizer.ggml.") + gg + "_token_id", gguf::Value::u32(static_cast<uint32_t>(id)));
  }

  // add_bos / add_eos: tokenizer_config.json's flags, else what a TemplateProcessing
  // post-processor adds around a single sequence.
  std::optional<bool> add_bos, add_eos;
  if (auto b = cfg.find("add_bos_token"); b != cfg.end() && b->is_boolean()) add_bos = b->get<bool>();
  if (auto e = cfg.find("add_eos_token"); e != cfg.end() && e->is_boolean()) add_eos = e->get<bool>();
  if (!add_bos || !add_eos) {
    const json* tp = nullptr;
    if (auto pp = tok.find("post_processor"); pp != tok.end() && pp->is_object()) {
      if (pp->value("type", "") == "TemplateProcessing") tp = &*pp;
      if (pp->value("type", "") == "Sequence" && pp->contains("processors") && (*pp)["processors"].is_array()) {
        for (const json& p : (*pp)["processors"]) {
          if (p.is_object() && p.value("type", "") == "TemplateProcessing") tp = &p;
        }
      }
    }
    if (tp != nullptr && tp->contains("single") && (*tp)["single"].is_array() && !(*tp)["single"].empty()) {
      const json& single = (*tp)["single"];
      if (!add_bos) add_bos = single.front().is_object() && single.front().contains("SpecialToken");
      if (!add_eos) add_eos = single.size() > 1 && single.back().is_object() && single.back().contains("SpecialToken");
    }
  }
  if (add_bos) put(out, "tokenizer.ggml.add_bos_token", gguf::Value::boolean(*add_bos));
  if (add_eos) put(out, "tokenizer.ggml.add_eos_token", gguf::Value::boolean(*add_eos));

  if (auto ct = cfg.find("chat_template"); ct != cfg.end() && !ct->is_null()) {
    if (ct->is_string()) {
      out.chat_template = ct->get<std::string>();
    } else if (ct->is_array()) {
      // [{"name": "default", "template": ...}, {"name": "tool_use", ...}]: the default one.
      for (const json& e : *ct) {
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string()) {
          out.chat_template = e["template"].get<std::string>();
        }
      }
      if (out.chat_template.empty()) {
        return make_error(StatusCode::kInvalidArgument,
                          "tokenizer_config.json: chat_template is a list without a \"default\" entry");
      }
    } else {
      return make_error(StatusCode::kInvalidArgument, "tokenizer_config.json: chat_template is not a string");
    }
    put(out, "tokenizer.chat_template", gguf::Value::str(out.chat_template));
  }
  return out;
}

Result<HfVocab> import_hf_vocab(const std::filesystem::path& dir, const HfVocabOptions& opt) {
  auto slurp = [](const std::filesystem::path& p, std::string* out) {
    std::ifstream in(p, std::ios::binary);
    if (!in) return false;
    std::ostringstream ss;
    ss << in.rdbuf();
    *out = ss.str();
    return true;
  };
  std::string tok, cfg, model_cfg;
  if (!slurp(dir / "tokenizer.json", &tok)) {
    return make_error(StatusCode::kNotFound, "cannot read {}", (dir / "tokenizer.json").string());
  }
  slurp(dir / "tokenizer_config.json", &cfg);
  slurp(dir / "config.json", &model_cfg);
  auto r = import_hf_vocab_text(tok, cfg, model_cfg, opt);
  if (!r) return r.status().with_context(dir.string());
  return r;
}

}  // namespace moesh
