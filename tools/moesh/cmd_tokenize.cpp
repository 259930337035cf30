// `moesh tokenize -m MODEL.gguf -p TEXT [--ids] [--special] [--no-bos]` prints the token ids and
// pieces of TEXT; `moesh tokenize -m MODEL.gguf --detok 1,2,3` prints the text of ids
// (docs/tokenize.md). Only the GGUF metadata is read, so it works on vocab-only files too.
#include <cstdio>
#include <string>

#include "command.h"
#include "model_cli.h"
#include "moesh/gguf/gguf.h"
#include "moesh/text/tokenizer.h"

namespace moesh::cli {
namespace {

struct TokenizeArgs {
  std::string model, prompt, detok;
  bool ids_only = false;
  bool special = false;
  bool no_bos = false;
};

// A piece for display: printable UTF-8 as is, control bytes and broken UTF-8 as escapes.
std::string printable(const std::string& s) {
  std::string out;
  const bool valid = utf8_is_valid(s);
  for (unsigned char c : s) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\'')
      out += "\\'";
    else if (c < 0x20 || c == 0x7F || (!valid && c >= 0x80))
      out += fmt::format("\\x{:02x}", c);
    else
      out.push_back(static_cast<char>(c));
  }
  return out;
}

int run_tokenize(const TokenizeArgs& a) {
  if (a.prompt.empty() == a.detok.empty()) {
    std::fprintf(stderr, "moesh tokenize: error: give exactly one of -p TEXT or --detok IDS\n");
    return 2;
  }
  auto file = gguf::File::open(a.model);
  if (!file) {
    std::fprintf(stderr, "moesh tokenize: error: %s\n", file.status().to_string().c_str());
    return 1;
  }
  auto tok = Tokenizer::from_gguf(**file);
  if (!tok) {
    std::fprintf(stderr, "moesh tokenize: error: %s\n", tok.status().to_string().c_str());
    return 1;
  }
  if (!a.detok.empty()) {
    auto ids = parse_token_list(a.detok);
    if (!ids) {
      std::fprintf(stderr, "moesh tokenize: error: %s\n", ids.status().message().c_str());
      return 2;
    }
    auto text = (*tok)->decode(*ids, {.special = a.special});
    if (!text) {
      std::fprintf(stderr, "moesh tokenize: error: %s\n", text.status().to_string().c_str());
      return 2;
    }
    std::printf("%s\n", text->c_str());
    return 0;
  }
  auto ids = (*tok)->encode(a.prompt, !a.no_bos, a.special);
  if (!ids) {
    std::fprintf(stderr, "moesh tokenize: error: %s\n", ids.status().to_string().c_str());
    return 1;
  }
  if (a.ids_only) {
    for (size_t i = 0; i < ids->size(); ++i) std::printf("%s%d", i ? "," : "", (*ids)[i]);
    std::printf("\n");
    return 0;
  }
  for (int32_t id : *ids) {
    std::printf("%6d -> '%s'\n", id, printable((*tok)->token_to_piece(id, true)).c_str());
  }
  std::fprintf(stderr, "%zu tokens (%s vocabulary, %d entries)\n", ids->size(),
               (*tok)->kind() == VocabKind::kSpm ? "spm" : "bpe", (*tok)->n_vocab());
  return 0;
}

const CommandRegistrar kRegisterTokenize{
    Command{"tokenize", "Show the token ids of a text, or the text of token ids (--detok)",
            [](CLI::App* sub) -> std::function<int()> {
              auto a = std::make_shared<TokenizeArgs>();
              sub->add_option("-m,--model", a->model, "GGUF file with tokenizer metadata")->required();
              sub->add_option("-p,--prompt", a->prompt, "Text to tokenize");
              sub->add_option("--detok", a->detok, "Comma-separated token ids to turn back into text");
              sub->add_flag("--ids", a->ids_only, "Print only the ids, comma-separated");
              sub->add_flag("--special", a->special,
                            "Parse special-token text (e.g. <|im_end|>) as those tokens; with --detok, "
                            "render control tokens");
              sub->add_flag("--no-bos", a->no_bos, "Do not add BOS/EOS even if the vocabulary asks for them");
              return [a] { return run_tokenize(*a); };
            }}};

}  // namespace
}  // namespace moesh::cli
