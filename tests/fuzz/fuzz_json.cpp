// libFuzzer target: response_format's JSON Schema compiler and matcher (text/json_grammar.h), which
// a stranger reaches through /v1/chat/completions. The input is a schema, a NUL byte, then bytes
// fed to a matcher of it. Whatever the bytes: no crash, no undefined behaviour, no runaway stack;
// and when the matcher takes every byte and calls the text complete, the text parses as JSON.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "moesh/text/json_grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t cut = in.find('\0');
  const std::string_view schema_text = in.substr(0, cut);
  const std::string_view doc = cut == std::string_view::npos ? std::string_view() : in.substr(cut + 1);
  const auto schema = nlohmann::ordered_json::parse(schema_text, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return 0;
  auto g = moesh::compile_json_schema(schema);
  if (!g.is_ok()) {
    if (g.status().message().empty()) std::abort();
    return 0;
  }
  moesh::JsonMatcher m(*g);
  size_t taken = 0;
  while (taken < doc.size()) {
    moesh::JsonMatcher next = m;
    if (!next.feed(static_cast<unsigned char>(doc[taken]))) break;
    m = next;
    ++taken;
  }
  if (m.complete()) {
    const auto v = nlohmann::json::parse(doc.substr(0, taken), nullptr, /*allow_exceptions=*/false);
    if (v.is_discarded()) std::abort();  // the matcher let through text that is not JSON
  }
  return 0;
}
