// The swarm commands as a user runs them: `moesh gate` against real workers (exact path must be
// bit-identical and PASS; a lossy path prints its table and lists every argmax flip it counted),
// and `moesh run` through workers printing the same tokens as all-local.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include "dist/dist_util.h"
#include "dist/worker_process.h"
#include "util/run_moesh.h"

namespace moesh::test {
namespace {

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// Sum of the "N/M" argmax-agree column over the gate table, and the flip lines listed.
struct GateTable {
  int64_t agree = 0, total = 0, rows = 0, bitwise_rows = 0;
  int64_t flips_header = -1, flip_lines = 0;
};

GateTable parse_gate(const std::string& out) {
  GateTable g;
  std::istringstream in(out);
  std::string line;
  const std::regex row(R"(^(\d+)\s+(\d+)\s+(\d+)/(\d+)\s+\d+%.*\s(yes|no)\s+(PASS|FAIL)\s*$)");
  const std::regex flips(R"(^argmax flips: (\d+);)");
  const std::regex flip_line(R"(^  seq \d+ pos \d+: local \d+, remote \d+, lead -?[0-9.]+$)");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, row)) {
      ++g.rows;
      g.agree += std::stoll(m[3]);
      g.total += std::stoll(m[4]);
      g.bitwise_rows += m[5] == "yes";
    } else if (std::regex_search(line, m, flips)) {
      g.flips_header = std::stoll(m[1]);
    } else if (std::regex_match(line, flip_line)) {
      ++g.flip_lines;
    }
  }
  return g;
}

TEST(CliSwarm, GateExactIsBitIdenticalAndLossyListsItsFlips) {
  const std::string model = made_qwen3moe();
  auto a = WorkerProcess::spawn(model, "*:0-7");
  auto b = WorkerProcess::spawn(model, "*:8-15");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  const std::string workers =
      " --worker " + (*a)->address().to_string() + " --worker " + (*b)->address().to_string();

  RunResult exact = run_moesh("gate -m " + quoted(model) + workers + " --wire f32 --combine exact -t 1");
  EXPECT_EQ(exact.exit_code, 0) << exact.out << exact.err;
  GateTable ge = parse_gate(exact.out);
  EXPECT_EQ(ge.rows, 4) << exact.out;
  EXPECT_EQ(ge.bitwise_rows, ge.rows) << exact.out;
  EXPECT_EQ(ge.agree, ge.total);
  EXPECT_EQ(ge.flips_header, -1) << "an exact path has no flips to list";
  EXPECT_NE(exact.out.find("gate: PASS"), std::string::npos) << exact.out;

  RunResult lossy = run_moesh("gate -m " + quoted(model) + workers + " --wire q8 --combine partial -t 1");
  ASSERT_TRUE(lossy.exit_code == 0 || lossy.exit_code == 1) << lossy.err;
  GateTable gl = parse_gate(lossy.out);
  EXPECT_EQ(gl.rows, 4) << lossy.out;
  EXPECT_EQ(gl.bitwise_rows, 0) << "q8 + partial cannot be bit-identical";
  const int64_t n_flips = gl.total - gl.agree;
  if (n_flips == 0) {
    EXPECT_EQ(gl.flips_header, -1) << lossy.out;
  } else {
    EXPECT_EQ(gl.flips_header, n_flips) << lossy.out;
    EXPECT_EQ(gl.flip_lines, std::min<int64_t>(n_flips, 12)) << lossy.out;
  }
  EXPECT_EQ(lossy.exit_code == 0, lossy.out.find("gate: PASS") != std::string::npos) << lossy.out;

  // A bad wire name is an argument error (exit 2), not a crash or a silent default.
  RunResult bad = run_moesh("gate -m " + quoted(model) + workers + " --wire f8 -t 1");
  EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;
}

TEST(CliSwarm, RunThroughWorkersPrintsTheLocalTokens) {
  const std::string model = made_qwen3moe();
  auto a = WorkerProcess::spawn(model, "*:*");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  const std::string common = "run -m " + quoted(model) + " --tokens 5,6,7,8 -n 12 -t 1 --json";
  RunResult local = run_moesh(common);
  RunResult remote = run_moesh(common + " --worker " + (*a)->address().to_string());
  ASSERT_EQ(local.exit_code, 0) << local.err;
  ASSERT_EQ(remote.exit_code, 0) << remote.err;
  auto lj = nlohmann::json::parse(local.out, nullptr, false);
  auto rj = nlohmann::json::parse(remote.out, nullptr, false);
  ASSERT_FALSE(lj.is_discarded()) << local.out;
  ASSERT_FALSE(rj.is_discarded()) << remote.out;
  EXPECT_EQ(lj["tokens"], rj["tokens"]);
  EXPECT_EQ(lj["tokens"].size(), 12u);
}

}  // namespace
}  // namespace moesh::test
