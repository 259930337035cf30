// Pre-tokenizer regexes per tokenizer.ggml.pre family, run with PCRE2 (UTF + Unicode properties).
//
// The patterns restate docs/background/sampling-and-tokenizers.md §2. Splitting semantics follow
// llama.cpp: every regex re-splits each current fragment into matches *and* unmatched gaps, and a
// regex only sees its fragment, so `$` and `(?!\S)` treat a fragment's end as the text's end.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <string>
#include <vector>

#include "text/tokenizer_internal.h"

namespace moesh {
namespace {

// Contractions with explicit case classes (llama.cpp's rewrite of HF's `(?i:'s|...)`).
#define MOESH_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

const char* const k_gpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";

const char* const k_llama3 = MOESH_CONTRACTIONS
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)|\\s+";

const char* const k_qwen2 = MOESH_CONTRACTIONS
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)|\\s+";

// o200k: U = upper/title-case-ish letters, L = lower-case-ish letters. llama.cpp evaluates this
// with all non-ASCII letters collapsed into one class, so U is "a letter other than a-z" and L "a
// letter other than A-Z"; we use the same approximation to tokenize as it does.
#define MOESH_O200K_U "(?:(?=\\p{L})[^a-z])"
#define MOESH_O200K_L "(?:(?=\\p{L})[^A-Z])"
const char* const k_gpt4o = "[^\\r\\n\\p{L}\\p{N}]?" MOESH_O200K_U "*" MOESH_O200K_L "+" MOESH_CONTRACTIONS
                            "?"
                            "|[^\\r\\n\\p{L}\\p{N}]?" MOESH_O200K_U "+" MOESH_O200K_L "*" MOESH_CONTRACTIONS
                            "?"
                            "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const char* const k_bailing =
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";

// DeepSeek-LLM: explicit letter ranges (cased scripts), ASCII/full-width punctuation, trailing
// whitespace, CJK/Hangul runs and numbers, applied one after the other.
const char* const k_deepseek_llm_letters =
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}"
    "\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}"
    "\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}"
    "\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"
    "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}"
    "\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}"
    "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}"
    "\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}"
    "\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}"
    "\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}"
    "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}"
    "\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}"
    "\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+";

std::vector<std::string> regexes_for(PreTokenizer p) {
  switch (p) {
    case PreTokenizer::kDefault:
      return {"[\\p{P}\\$\\+<=>\\^~\\|]+", k_gpt2, "\\p{N}+", "[0-9][0-9][0-9]"};
    case PreTokenizer::kGpt2:
      return {k_gpt2};
    case PreTokenizer::kLlama3:
      return {k_llama3};
    case PreTokenizer::kQwen2:
      return {k_qwen2};
    case PreTokenizer::kDeepseekLlm:
      return {"[\\r\\n]",
              k_deepseek_llm_letters,
              "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}"
              "\\x{3000}-\\x{3002}]+",
              "\\s+$",
              "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+",
              "\\p{N}+"};
    case PreTokenizer::kDeepseek3:
      return {"\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
              "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
              "|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*"
              "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
    case PreTokenizer::kGpt4o:
      return {k_gpt4o};
    case PreTokenizer::kBailingMoe:
      return {k_bailing};
    case PreTokenizer::kCOUNT:
      break;
  }
  return {};
}

}  // namespace

namespace tok {

Result<std::unique_ptr<RegexSplitter>> RegexSplitter::create(PreTokenizer family) {
  std::unique_ptr<RegexSplitter> s(new RegexSplitter());
  for (const std::string& re : regexes_for(family)) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    // DOLLAR_ENDONLY: `$` means the end of the fragment, not "before a final newline".
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(re.data()), re.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY | PCRE2_NO_UTF_CHECK, &err, &err_off, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return make_error(StatusCode::kInternal, "pre-tokenizer '{}': regex does not compile at {}: {}",
                        pre_tokenizer_name(family), err_off, reinterpret_cast<const char*>(msg));
    }
    // JIT is an optimisation only; without it (unsupported CPU/build) the interpreter runs.
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    s->codes_.push_back(code);
  }
  return s;
}

RegexSplitter::~RegexSplitter() {
  for (void* c : codes_) pcre2_code_free(static_cast<pcre2_code*>(c));
}

Status RegexSplitter::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  pieces.clear();
  if (text.empty()) return Status::ok();
  std::vector<std::string_view> cur{text}, next;
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  if (md == nullptr) return make_error(StatusCode::kInternal, "pcre2: out of memory");
  Status st;
  for (void* vcode : codes_) {
    const auto* code = static_cast<const pcre2_code*>(vcode);
    next.clear();
    for (std::string_view frag : cur) {
      const auto* subj = reinterpret_cast<PCRE2_SPTR>(frag.data());
      size_t pos = 0, gap_start = 0;
      while (pos < frag.size()) {
        // The input was validated once up front, so each match skips PCRE2's UTF check.
        const int rc = pcre2_match(code, subj, frag.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          PCRE2_UCHAR msg[256];
          pcre2_get_error_message(rc, msg, sizeof(msg));
          st = make_error(StatusCode::kInternal, "pre-tokenizer regex failed: {}", reinterpret_cast<const char*>(msg));
          break;
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {
          // None of our patterns can match empty; step one character to stay safe regardless.
          pos = ms + utf8_len_from_lead(static_cast<uint8_t>(frag[ms]));
          continue;
        }
        if (ms > gap_start) next.push_back(frag.substr(gap_start, ms - gap_start));
        next.push_back(frag.substr(ms, me - ms));
        gap_start = pos = me;
      }
      if (!st.is_ok()) break;
      if (gap_start < frag.size()) next.push_back(frag.substr(gap_start));
    }
    if (!st.is_ok()) break;
    cur.swap(next);
  }
  pcre2_match_data_free(md);
  MOESH_RETURN_IF_ERROR(st);
  pieces = std::move(cur);
  return Status::ok();
}

}  // namespace tok
}  // namespace moesh
