// libFuzzer target: the body of an OpenAI request as `moesh serve` receives it
// (/v1/completions and /v1/chat/completions, serve::parse_request). Whatever the bytes: no
// crash, no undefined behaviour; a body is either a validated request or an HTTP 4xx/5xx error
// with a message, whose error body serializes.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "serve/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (const auto ep : {moesh::serve::Endpoint::kCompletions, moesh::serve::Endpoint::kChatCompletions}) {
    moesh::serve::ApiError err;
    auto r = moesh::serve::parse_request(ep, body, &err);
    if (!r.is_ok()) {
      if (err.http_status < 400 || err.http_status > 599 || err.message.empty()) std::abort();
      (void)moesh::serve::error_json(err).dump();
    }
  }
  return 0;
}
