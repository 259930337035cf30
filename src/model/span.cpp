// Layer spans (span.h): the text form used by --span and --layers.
#include "moesh/model/span.h"

#include <charconv>
#include <string>

namespace moesh {
namespace {

bool parse_block(std::string_view s, int* out) {
  if (s.empty() || s.size() > 9) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && *out >= 0;
}

}  // namespace

Result<LayerSpan> parse_layer_span(const std::string& s) {
  const size_t dash = s.find('-');
  LayerSpan sp;
  const bool ok = dash == std::string::npos ? parse_block(s, &sp.first)
                                            : parse_block(std::string_view(s).substr(0, dash), &sp.first) &&
                                                  parse_block(std::string_view(s).substr(dash + 1), &sp.last);
  if (dash == std::string::npos) sp.last = sp.first;
  if (!ok || sp.last < sp.first) {
    return make_error(StatusCode::kInvalidArgument, "'{}' is not a block range FIRST-LAST (e.g. 12-23)", s);
  }
  return sp;
}

}  // namespace moesh
