// Parses the text `moesh gate` prints (docs/gate.md): the per-sequence table, the curation line
// and the argmax-flip list, so CLI tests can assert on numbers rather than on substrings.
#pragma once

#include <algorithm>
#include <cstdint>
#include <regex>
#include <sstream>
#include <string>

namespace moesh::test {

struct GateOutput {
  int64_t rows = 0, pass_rows = 0, bitwise_rows = 0;
  int64_t agree = 0, total = 0;               // sums of the "N/M" argmax-agree column
  double cos_min = 1.0;                       // min of the "cos min" column
  int64_t rejected = -1, ill = -1;            // curation line; -1 when absent
  int64_t flips_header = -1, flip_lines = 0;  // "argmax flips: N;" and the listed flips
};

inline GateOutput parse_gate(const std::string& out) {
  GateOutput g;
  std::istringstream in(out);
  std::string line;
  const std::regex row(R"(^(\d+)\s+(\d+)\s+(\d+)/(\d+)\s+\d+%\s+([0-9.]+)\s.*\s(yes|no)\s+(PASS|FAIL)\s*$)");
  const std::regex cur(R"(^sequences: \d+ curated .*: (\d+) draws rejected .*, (\d+) ill-conditioned)");
  const std::regex flips(R"(^argmax flips: (\d+);)");
  const std::regex flip_line(R"(^  seq \d+ pos \d+: local \d+, remote \d+, lead -?[0-9.]+$)");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, row)) {
      ++g.rows;
      g.agree += std::stoll(m[3]);
      g.total += std::stoll(m[4]);
      g.cos_min = std::min(g.cos_min, std::stod(m[5]));
      g.bitwise_rows += m[6] == "yes";
      g.pass_rows += m[7] == "PASS";
    } else if (std::regex_search(line, m, cur)) {
      g.rejected = std::stoll(m[1]);
      g.ill = std::stoll(m[2]);
    } else if (std::regex_search(line, m, flips)) {
      g.flips_header = std::stoll(m[1]);
    } else if (std::regex_match(line, flip_line)) {
      ++g.flip_lines;
    }
  }
  return g;
}

}  // namespace moesh::test
