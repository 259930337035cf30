// The swarm commands as a user runs them: `moesh gate` against real workers (exact path must be
// bit-identical and PASS; a lossy path prints its table and lists every argmax flip it counted;
// the curation line, --raw-sequences and --sequences-from), `moesh run` through workers
// printing the same tokens as all-local, `moesh bench --timing`'s step breakdown and `bench -d`.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "dist/dist_util.h"
#include "dist/gate_output.h"
#include "dist/worker_process.h"
#include "util/run_moesh.h"

namespace moesh::test {
namespace {

TEST(CliSwarm, GateExactIsBitIdenticalAndLossyListsItsFlips) {
  const std::string model = made_qwen3moe();
  auto a = WorkerProcess::spawn(model, "*:0-7");
  auto b = WorkerProcess::spawn(model, "*:8-15");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  const std::string workers = " --worker " + (*a)->address().to_string() + " --worker " + (*b)->address().to_string();

  RunResult exact = run_moesh("gate -m " + quoted(model) + workers + " --wire f32 --combine exact -t 1");
  EXPECT_EQ(exact.exit_code, 0) << exact.out << exact.err;
  GateOutput ge = parse_gate(exact.out);
  EXPECT_EQ(ge.rows, 4) << exact.out;
  EXPECT_EQ(ge.bitwise_rows, ge.rows) << exact.out;
  EXPECT_EQ(ge.agree, ge.total);
  EXPECT_EQ(ge.flips_header, -1) << "an exact path has no flips to list";
  EXPECT_NE(exact.out.find("gate: PASS"), std::string::npos) << exact.out;

  RunResult lossy = run_moesh("gate -m " + quoted(model) + workers + " --wire q8 --combine partial -t 1");
  ASSERT_TRUE(lossy.exit_code == 0 || lossy.exit_code == 1) << lossy.err;
  GateOutput gl = parse_gate(lossy.out);
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

  // Default sequences are curated: the gate says how many draws it rejected and that no
  // position stayed ill-conditioned.
  const std::regex curated(
      R"(sequences: 4 curated \(seed 42\), 160 positions: (\d+) draws rejected .*, 0 ill-conditioned)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(exact.out, m, curated)) << exact.out;
  EXPECT_GT(std::stoll(m[1]), 0) << "uniform draws hit some near-ties on this random-weight model";
  EXPECT_NE(lossy.out.find(m[0].str()), std::string::npos) << "same seed, same curation";

  // --raw-sequences: the uniform draw of the gate before curation; exact f32 is still bit-identical.
  RunResult raw = run_moesh("gate -m " + quoted(model) + workers + " --raw-sequences -t 1");
  EXPECT_EQ(raw.exit_code, 0) << raw.out << raw.err;
  EXPECT_NE(raw.out.find("sequences: 4 raw (uniform, seed 42), 160 positions"), std::string::npos) << raw.out;
  EXPECT_EQ(parse_gate(raw.out).bitwise_rows, 4) << raw.out;

  // --sequences-from: the reference JSON format, compared as given.
  const std::string seq_file = temp_dir() + "/gate-seqs.json";
  {
    std::ofstream f(seq_file);
    f << R"({"sequences":[{"tokens":[5,6,7,8,9,10,11]},{"tokens":[100,3,42]}]})";
  }
  RunResult from = run_moesh("gate -m " + quoted(model) + workers + " --sequences-from " + quoted(seq_file) + " -t 1");
  EXPECT_EQ(from.exit_code, 0) << from.out << from.err;
  GateOutput gf = parse_gate(from.out);
  EXPECT_EQ(gf.rows, 2) << from.out;
  EXPECT_EQ(gf.total, 10) << from.out;
  EXPECT_EQ(gf.bitwise_rows, 2) << from.out;
  EXPECT_NE(from.out.find("sequences: 2 from"), std::string::npos) << from.out;
  const std::string bad_file = temp_dir() + "/gate-bad-seqs.json";
  {
    std::ofstream f(bad_file);
    f << R"({"sequences":[{"tokens":[5,6,99999999]}]})";
  }
  RunResult bad_ids =
      run_moesh("gate -m " + quoted(model) + workers + " --sequences-from " + quoted(bad_file) + " -t 1");
  EXPECT_EQ(bad_ids.exit_code, 1) << bad_ids.out << bad_ids.err;
  EXPECT_NE(bad_ids.err.find("99999999"), std::string::npos) << bad_ids.err;

  // A bad wire name is an argument error (exit 2), not a crash or a silent default; so are
  // two sources of sequences at once and a negative curation threshold.
  RunResult bad = run_moesh("gate -m " + quoted(model) + workers + " --wire f8 -t 1");
  EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;
  RunResult both = run_moesh("gate -m " + quoted(model) + workers + " --raw-sequences --sequences-from " +
                             quoted(seq_file) + " -t 1");
  EXPECT_EQ(both.exit_code, 2) << both.out << both.err;
  RunResult neg = run_moesh("gate -m " + quoted(model) + workers + " --min-top1-lead -1 -t 1");
  EXPECT_EQ(neg.exit_code, 2) << neg.out << neg.err;
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
  // Busy-polling worker and backbone (--poll-us): the same tokens.
  auto p = WorkerProcess::spawn(model, "*:*", 1, std::chrono::milliseconds(20000), {"--poll-us", "500"});
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  RunResult polled = run_moesh(common + " --poll-us 500 --worker " + (*p)->address().to_string());
  ASSERT_EQ(polled.exit_code, 0) << polled.err;
  auto pj = nlohmann::json::parse(polled.out, nullptr, false);
  ASSERT_FALSE(pj.is_discarded()) << polled.out;
  EXPECT_EQ(lj["tokens"], pj["tokens"]);
}

// `moesh bench --timing`: the experts' share of each step locally, and through two replicas of
// every expert each worker's request count, latency and reported compute (numbers, not just
// the labels: every decoded token makes one request per MoE layer, split over both replicas).
// bench -d: each pp / tg test starts from a cache already holding D tokens, prefilled once and
// untimed, so the rows carry "@ dD" and --timing / the trips line count the timed tokens only.
TEST(CliSwarm, BenchDepthStartsEachTestFromAPrefilledCache) {
  const std::string model = made_qwen3moe();
  auto w = WorkerProcess::spawn(model, "*:*");
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  auto loaded = Model::load(model);
  ASSERT_TRUE(loaded.is_ok());
  int n_moe = 0;
  for (const auto& l : (*loaded)->layers) n_moe += l.is_moe;
  RunResult r = run_moesh("bench -m " + quoted(model) + " -d 24 -p 5 -n 6 -r 2 -t 1 --timing --worker " +
                          (*w)->address().to_string());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::regex row(R"(\|\s+(pp5|tg6) @ d24 \|\s+([0-9.]+) ± )");
  int rows = 0;
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), row), end; it != end; ++it) {
    ++rows;
    EXPECT_GT(std::stod((*it)[2]), 0.0) << (*it)[0];
  }
  EXPECT_EQ(rows, 2) << r.out;
  // tg6: 6 tokens x 2 reps, one trip per MoE layer each; the 24 prefilled tokens are not counted.
  const std::regex trips(R"(trips: ([0-9.]+) per token \((\d+) layer calls)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, trips)) << r.out;
  EXPECT_EQ(std::stoll(m[2]), int64_t{6} * 2 * n_moe) << r.out;

  RunResult bad = run_moesh("bench -m " + quoted(model) + " -d -1 -p 0 -n 2 -r 1");
  EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;
  EXPECT_NE(bad.err.find("-d must be >= 0"), std::string::npos) << bad.err;
}

TEST(CliSwarm, BenchTimingBreaksDownTheStep) {
  const std::string model = made_qwen3moe();
  auto a = WorkerProcess::spawn(model, "*:*");
  auto b = WorkerProcess::spawn(model, "*:*");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  const std::string common = "bench -m " + quoted(model) + " -p 0 -n 6 -r 2 -t 1 --timing";
  const std::regex timing(
      R"(timing: ([0-9.]+) ms per token, of which routed experts ([0-9.]+) ms \(([0-9.]+)%\) in ([0-9.]+) calls of ([0-9.]+) ms)");
  // Signs allowed in every number, so a negative one is caught below rather than left unmatched.
  const std::regex worker(
      R"(worker (\d+) \S+ \(.*\): (\d+) requests, latency (-?[0-9.]+) ms = compute (-?[0-9.]+) ms \+ (-?[0-9.]+) ms other)");
  auto model_loaded = Model::load(model);
  ASSERT_TRUE(model_loaded.is_ok());
  int n_moe = 0;
  for (const auto& l : (*model_loaded)->layers) n_moe += l.is_moe;
  ASSERT_GT(n_moe, 0);

  for (bool remote : {false, true}) {
    SCOPED_TRACE(remote ? "two replicas" : "local");
    const std::string cmd =
        common + (remote ? " --worker " + (*a)->address().to_string() + " --worker " + (*b)->address().to_string()
                         : std::string());
    RunResult r = run_moesh(cmd);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m, timing)) << r.out;
    const double per_token = std::stod(m[1]), experts = std::stod(m[2]), calls = std::stod(m[4]);
    EXPECT_GT(per_token, 0);
    EXPECT_GT(experts, 0);
    EXPECT_LT(experts, per_token);
    EXPECT_DOUBLE_EQ(calls, n_moe) << "one executor call per MoE layer per decoded token";
    int64_t requests = 0;
    int workers_seen = 0;
    for (std::sregex_iterator it(r.out.begin(), r.out.end(), worker), end; it != end; ++it) {
      ++workers_seen;
      requests += std::stoll((*it)[2]);
      const double latency = std::stod((*it)[3]), compute = std::stod((*it)[4]), other = std::stod((*it)[5]);
      EXPECT_GT(latency, 0) << "latency";
      EXPECT_GE(compute, 0) << "compute";
      // The breakdown adds up (each term printed to 0.001 ms).
      EXPECT_NEAR(latency, compute + other, 0.0015 + 1e-9) << (*it)[0];
    }
    const std::regex hidden(
        R"(hidden: ([0-9.]+) ms of local work per trip of ([0-9.]+) ms, ([0-9.]+)% of the trip hidden \((\d+) trips\))");
    std::smatch h;
    if (remote) {
      // 6 tokens x 2 reps x n_moe layers; each call sends one request to every replica it uses
      // (top-k >= 2 spreads over both). The CLI prices replicas by what it measures: a warm-up
      // PING that stalled on a loaded host can make one replica "far" (more than 1.25x + 2 ms of
      // the other) until a probe PING re-measures it (about 16 steps in), so a replica may sit
      // out all of the run or only its first part (the library tests fix equal costs instead;
      // the CLI has none). So: every call reaches at least one worker, none more than all.
      EXPECT_GE(workers_seen, 1) << r.out;
      EXPECT_LE(workers_seen, 2) << r.out;
      EXPECT_GE(requests, int64_t{6} * 2 * n_moe) << r.out;
      EXPECT_LE(requests, int64_t{workers_seen} * 6 * 2 * n_moe) << r.out;
      // The hidden-trip report covers every trip of the timed runs and is a fraction.
      ASSERT_TRUE(std::regex_search(r.out, h, hidden)) << r.out;
      EXPECT_EQ(std::stoll(h[4]), int64_t{6} * 2 * n_moe);
      EXPECT_GE(std::stod(h[3]), 0.0);
      EXPECT_LE(std::stod(h[3]), 100.0);
    } else {
      EXPECT_EQ(workers_seen, 0) << r.out;
      EXPECT_FALSE(std::regex_search(r.out, h, hidden)) << "no trips without workers";
    }
  }
}

// --swarm-key: a worker started with a key serves only a backbone proving the same key; one
// without a key or with another is refused before any request, and the worker says why.
TEST(CliSwarm, SwarmKeyAdmitsOnlyBackbonesWithTheSameKey) {
  const std::string model = made_qwen3moe();
  const std::string key = temp_dir() + "/swarm.key", other = temp_dir() + "/other.key";
  {
    std::ofstream(key) << "correct horse battery staple 0123456789\n";
    std::ofstream(other) << "another key entirely, also long enough\n";
  }
  auto w = WorkerProcess::spawn(model, "*:*", 1, std::chrono::milliseconds(20000), {"--swarm-key", key});
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_NE((*w)->output().find("swarm key: "), std::string::npos) << (*w)->output();
  const std::string common =
      "run -m " + quoted(model) + " --tokens 5,6,7,8 -n 6 -t 1 --json --worker " + (*w)->address().to_string();
  RunResult local = run_moesh("run -m " + quoted(model) + " --tokens 5,6,7,8 -n 6 -t 1 --json");
  RunResult with_key = run_moesh(common + " --swarm-key " + quoted(key));
  ASSERT_EQ(with_key.exit_code, 0) << with_key.err;
  auto lj = nlohmann::json::parse(local.out, nullptr, false), rj = nlohmann::json::parse(with_key.out, nullptr, false);
  ASSERT_FALSE(lj.is_discarded() || rj.is_discarded()) << local.out << with_key.out;
  EXPECT_EQ(lj["tokens"], rj["tokens"]);

  RunResult none = run_moesh(common);
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("swarm key"), std::string::npos) << none.err;
  RunResult wrong = run_moesh(common + " --swarm-key " + quoted(other));
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.err.find("swarm key mismatch"), std::string::npos) << wrong.err;
  RunResult missing = run_moesh(common + " --swarm-key " + quoted(temp_dir() + "/no-such.key"));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("no-such.key"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace moesh::test
