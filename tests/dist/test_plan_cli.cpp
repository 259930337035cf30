// `moesh swarm plan` and `moesh simulate` from the CLI, and a plan carried out by real processes
// on 127.0.0.1: the roles it prints are started (`moesh span`, `moesh worker`), the backbone runs
// with the arguments it prints, and the run has the tokens of an all-local run and exactly the
// trips per pass the plan predicts (structure, not time).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "dist/dist_util.h"
#include "dist/worker_process.h"
#include "moesh/gguf/gguf.h"
#include "moesh/model/model.h"
#include "moesh/plan/swarm_plan.h"
#include "util/run_moesh.h"

namespace moesh::test {
namespace {

std::string eight_block_model() {
  MakeModelSpec s = MakeModelSpec::defaults_for(MakeArch::kQwen3Moe);
  s.type = MakeFileType::kQ8_0;
  s.seed = 13;
  s.n_layer = 8;
  s.n_ctx = 256;
  return made_model("qwen3moe-l8-plan", s);
}

uint64_t file_bytes(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

nlohmann::json json_of(const RunResult& r) {
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out << r.err;
  return j;
}

// Starts the plan's roles and runs the backbone with them; checks tokens and trips. Standbys are
// named after every primary; `primaries_down`: the span and expert peers that have a standby or a
// replica are not started (their address answers nothing), so those serve instead — and the
// backbone runs no span itself.
// `first_standby_down`: the first standby of each span primary that has two or more answers
// nothing either (a plan with --standbys 2: the second serves).
void carry_out(const std::string& model, const nlohmann::json& plan, const nlohmann::json& local, int n,
               bool primaries_down = false, bool first_standby_down = false) {
  std::vector<std::unique_ptr<WorkerProcess>> procs;
  std::string backbone, standbys;
  std::set<std::string> covered, first_down;
  std::map<std::string, int> n_standbys;
  for (const auto& r : plan["roles"])
    if (r["role"] == "standby" || r["role"] == "replica") {
      covered.insert(r["standby_for"].get<std::string>());
      ++n_standbys[r["standby_for"].get<std::string>()];
    }
  int spans = 0, down_workers = 0;
  for (const auto& r : plan["roles"]) {
    const std::string role = r["role"];
    if (primaries_down && role == "span" && covered.count(r["peer"].get<std::string>()) != 0) {
      backbone += " --span " + std::string(r["layers"]) + "@127.0.0.1:1";
      ++spans;
      continue;
    }
    if (primaries_down && role == "experts" && covered.count(r["peer"].get<std::string>()) != 0) {
      backbone += " --worker 127.0.0.1:1";  // down from the start: its replica holds its experts
      ++down_workers;
      continue;
    }
    if (role == "standby" && first_standby_down && n_standbys[r["standby_for"].get<std::string>()] >= 2 &&
        first_down.insert(r["standby_for"].get<std::string>()).second) {
      standbys += " --span " + std::string(r["layers"]) + "@127.0.0.1:1";
      continue;
    }
    if (role == "standby") {
      auto p = WorkerProcess::spawn_command(
          {"span", "-m", model, "--layers", r["layers"], "--listen", "127.0.0.1:0", "-t", "1", "-c", "256"}, "standby");
      ASSERT_TRUE(p.is_ok()) << p.status().to_string();
      standbys += " --span " + std::string(r["layers"]) + "@" + (*p)->address().to_string();
      procs.push_back(std::move(*p));
    } else if (role == "span") {
      auto p = WorkerProcess::spawn_command(
          {"span", "-m", model, "--layers", r["layers"], "--listen", "127.0.0.1:0", "-t", "1", "-c", "256"}, "span");
      ASSERT_TRUE(p.is_ok()) << p.status().to_string();
      backbone += " --span " + std::string(r["layers"]) + "@" + (*p)->address().to_string();
      procs.push_back(std::move(*p));
      ++spans;
    } else if (role == "experts" || role == "replica") {
      auto p = WorkerProcess::spawn_command(
          {"worker", "-m", model, "--experts", r["experts"], "--listen", "127.0.0.1:0", "-t", "1"}, "worker");
      ASSERT_TRUE(p.is_ok()) << p.status().to_string();
      backbone += " --worker " + (*p)->address().to_string();
      procs.push_back(std::move(*p));
    }
  }
  backbone += standbys;
  RunResult run =
      run_moesh("run -m " + quoted(model) + " --tokens 5,6,7,8 -n " + std::to_string(n) + " -t 1 --json" + backbone);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json j = json_of(run);
  EXPECT_EQ(j["tokens"], local["tokens"]) << "plan " << plan.dump();
  // n passes (the prompt, then n-1 tokens); every layer on expert peers needs one (no local
  // experts: certain), every span one.
  int64_t trips = 0;
  if (j.contains("spans")) trips += j["spans"]["trips"].get<int64_t>();
  if (j.contains("remote")) trips += j["remote"]["layer_calls"].get<int64_t>();
  EXPECT_EQ(static_cast<double>(trips), plan["trips_per_step"].get<double>() * n) << plan.dump() << "\n" << j.dump();
  if (spans > 0) EXPECT_EQ(j["spans"]["failovers"], 0);
  if (spans > 0) EXPECT_EQ(j["spans"]["local_steps"], 0);
  if (j.contains("remote")) {
    EXPECT_EQ(j["remote"]["local_pairs"], 0) << "every pair went to an expert peer or a replica";
    EXPECT_EQ(j["remote"]["late_workers"].size(), static_cast<size_t>(down_workers)) << j.dump();
  }
}

TEST(PlanCli, APlanCarriedOutByRealPeersHasTheLocalTokensAndThePredictedTrips) {
  const std::string model = eight_block_model();
  const uint64_t bytes = file_bytes(model);
  ASSERT_GT(bytes, 0u);
  const int n = 6;
  RunResult local = run_moesh("run -m " + quoted(model) + " --tokens 5,6,7,8 -n " + std::to_string(n) + " -t 1 --json");
  ASSERT_EQ(local.exit_code, 0) << local.err;
  const nlohmann::json lj = json_of(local);
  // Three peers: one holds about half the model, two less than a third each: the plan mixes
  // roles (the big one holds experts of the backbone's layers, the small ones are spans).
  auto peers = [&](int big, int small) {
    return " --peer big:mem=" + std::to_string(bytes * big / 100) +
           ",rtt=20ms --peer s1:mem=" + std::to_string(bytes * small / 100) +
           ",rtt=20ms --peer s2:mem=" + std::to_string(bytes * small / 100) + ",rtt=30ms";
  };
  const std::string opts = " -c 256 --message-us 100 --json";
  const std::string tight = "swarm plan -m " + quoted(model) + peers(55, 30) + opts;
  const std::string roomy = "swarm plan -m " + quoted(model) + peers(60, 60) + opts;
  {
    RunResult pr = run_moesh(tight);
    ASSERT_EQ(pr.exit_code, 0) << pr.err;
    const nlohmann::json plan = json_of(pr);
    ASSERT_EQ(plan["roles"].size(), 3u);
    EXPECT_EQ(plan["n_layer"], 8);
    EXPECT_EQ(plan["roles"][0]["role"], "experts") << plan.dump();
    EXPECT_EQ(plan["roles"][1]["role"], "span") << plan.dump();
    EXPECT_EQ(plan["roles"][2]["role"], "span") << plan.dump();
    EXPECT_FALSE(plan["compare"].contains("experts"));  // neither fixed layout fits these peers
    EXPECT_FALSE(plan["compare"].contains("spans"));
    carry_out(model, plan, lj, n);
  }
  for (const std::string layout : {"plan", "experts", "spans"}) {
    SCOPED_TRACE(layout);
    RunResult pr = run_moesh(roomy + " --layout " + layout);
    ASSERT_EQ(pr.exit_code, 0) << pr.err;
    const nlohmann::json plan = json_of(pr);
    ASSERT_EQ(plan["roles"].size(), 3u);
    EXPECT_GT(plan["predicted_tokens_per_s"].get<double>(), 0);
    if (layout == std::string("spans")) {
      for (const auto& r : plan["roles"]) EXPECT_EQ(r["role"], "span");
      EXPECT_EQ(plan["roles"][0]["layers"], "0-1");
      EXPECT_EQ(plan["trips_per_step"], 3.0);
    }
    if (layout == std::string("experts")) {
      for (const auto& r : plan["roles"]) EXPECT_EQ(r["role"], "experts");
      EXPECT_EQ(plan["trips_per_step"], 8.0);
    }
    if (layout == std::string("plan")) {
      // Its prediction is no worse than either fixed layout's.
      ASSERT_TRUE(plan["compare"].contains("experts") && plan["compare"].contains("spans")) << plan.dump();
      EXPECT_LE(plan["predicted_step_ms"].get<double>(), plan["compare"]["experts"]["step_ms"].get<double>() + 1e-9);
      EXPECT_LE(plan["predicted_step_ms"].get<double>(), plan["compare"]["spans"]["step_ms"].get<double>() + 1e-9);
    }
    carry_out(model, plan, lj, n);
  }
  // A backbone that may hold only the globals: the layers must all go to spans or expert peers,
  // and the plan says so.
  RunResult small_bb = run_moesh(roomy + " --backbone-mem " + std::to_string(bytes * 8 / 100));
  ASSERT_EQ(small_bb.exit_code, 0) << small_bb.err;
  const nlohmann::json tj = json_of(small_bb);
  EXPECT_LE(tj["backbone_bytes"].get<uint64_t>(), bytes * 8 / 100);
  carry_out(model, tj, lj, n);
  // A third peer too far to pay as a span stands by for one: with the backbone unable to hold a
  // span, its failure would stop the swarm. Carried out with that span's peer down from the start,
  // the standby serves it: the same tokens and trips, nothing run on the backbone.
  const std::string far = "swarm plan -m " + quoted(model) + " --peer big:mem=" + std::to_string(bytes * 60 / 100) +
                          ",rtt=20ms --peer s1:mem=" + std::to_string(bytes * 60 / 100) +
                          ",rtt=20ms --peer far:mem=" + std::to_string(bytes * 60 / 100) + ",rtt=80ms" + opts +
                          " --backbone-mem " + std::to_string(bytes * 8 / 100);
  RunResult sb = run_moesh(far);
  ASSERT_EQ(sb.exit_code, 0) << sb.err;
  const nlohmann::json sj = json_of(sb);
  ASSERT_EQ(sj["standbys"].size(), 1u) << sj.dump();
  EXPECT_EQ(sj["standbys"][0]["peer"], "far");
  EXPECT_TRUE(sj["standbys"][0]["fallback_step_ms"].is_null()) << sj.dump();
  EXPECT_GT(sj["standbys"][0]["failover_step_ms"].get<double>(), sj["predicted_step_ms"].get<double>());
  EXPECT_EQ(sj["roles"][2]["role"], "standby") << sj.dump();
  carry_out(model, sj, lj, n);
  carry_out(model, sj, lj, n, /*primaries_down=*/true);
  // Two standbys (--standbys 2; three idle peers farther still for the two spans): the first round
  // gives each span one, the second gives the span whose failure costs most a second. Carried out
  // with every primary and that first standby down from the start, the standbys serve: the same
  // tokens, nothing on the backbone.
  std::string idle3;
  for (const char* name : {"far2", "far3"})
    idle3 += std::string(" --peer ") + name + ":mem=" + std::to_string(bytes * 60 / 100) + ",rtt=90ms";
  RunResult sb2 = run_moesh(far + idle3 + " --standbys 2");
  ASSERT_EQ(sb2.exit_code, 0) << sb2.err;
  const nlohmann::json s2j = json_of(sb2);
  ASSERT_EQ(s2j["standbys"].size(), 3u) << s2j.dump();
  std::map<std::string, std::vector<std::string>> per_primary;
  for (const auto& x : s2j["standbys"]) per_primary[x["standby_for"]].push_back(x["peer"]);
  ASSERT_EQ(per_primary.size(), 2u) << s2j.dump();
  const auto twice =
      std::find_if(per_primary.begin(), per_primary.end(), [](const auto& kv) { return kv.second.size() == 2; });
  ASSERT_NE(twice, per_primary.end()) << s2j.dump();
  carry_out(model, s2j, lj, n, /*primaries_down=*/true, /*first_standby_down=*/true);
  RunResult sb1 = run_moesh(far + idle3);
  ASSERT_EQ(sb1.exit_code, 0) << sb1.err;
  std::set<std::string> primaries;
  for (const auto& x : json_of(sb1)["standbys"])
    EXPECT_TRUE(primaries.insert(x["standby_for"].get<std::string>()).second) << "one standby per primary by default";
  RunResult none = run_moesh(far + " --no-standby");
  ASSERT_EQ(none.exit_code, 0) << none.err;
  EXPECT_TRUE(json_of(none)["standbys"].empty());
  EXPECT_EQ(json_of(none)["roles"][2]["role"], "idle");
  RunResult text = run_moesh(far.substr(0, far.find(" --json")) + " --backbone-mem " + std::to_string(bytes * 8 / 100));
  EXPECT_NE(text.out.find("(standby for "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("if "), std::string::npos) << text.out;
  // An expert peer gets a replica from a peer the plan leaves idle (the backbone cannot hold its
  // experts): a second worker with the same experts. Carried out, the tokens and trips are the
  // plan's (the replica shares the pairs on loopback, where every holder is near).
  RunResult rp = run_moesh("swarm plan -m " + quoted(model) + peers(55, 30) +
                           " --peer idle:mem=" + std::to_string(bytes * 60 / 100) + ",rtt=60ms" + opts +
                           " --backbone-mem " + std::to_string(bytes * 8 / 100));
  ASSERT_EQ(rp.exit_code, 0) << rp.err;
  const nlohmann::json rj = json_of(rp);
  int replicas = 0;
  for (const auto& r : rj["roles"]) {
    if (r["role"] != "replica") continue;
    ++replicas;
    for (const auto& q : rj["roles"])
      if (q["peer"] == r["standby_for"]) {
        EXPECT_EQ(q["role"], "experts");
        EXPECT_EQ(q["experts"], r["experts"]);
      }
  }
  ASSERT_EQ(replicas, 1) << rj.dump();
  EXPECT_TRUE(rj["standbys"][0]["fallback_step_ms"].is_null()) << rj.dump();
  EXPECT_EQ(rj["standbys"][0]["role"], "replica");
  carry_out(model, rj, lj, n);
  carry_out(model, rj, lj, n, /*primaries_down=*/true);
}

// Span rows follow the architecture: a 6-block glm-dsa whose odd blocks reuse the even blocks'
// indexer selection may be split anywhere, and rows entering an odd block carry that selection
// (1 + top_k floats more), which the planner prices at its width; the plan's spans, real span peers,
// give the local tokens. kimi-k3 rows carry residual checkpoints, priced the same way.
TEST(PlanCli, SpanEdgesAndRowWidthsFollowTheArchitecture) {
  MakeModelSpec s;
  ASSERT_TRUE(MakeModelSpec::defaults_for_name("glm-dsa", &s));
  s.type = MakeFileType::kQ8_0;
  s.n_layer = 6;
  s.n_ctx = 256;
  const std::string model = made_model("glmdsa-l6-plan", s);
  auto f = gguf::File::open(model);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  auto pm = plan_model_from_gguf(**f, 256, kDefaultSecondsPerByte);
  ASSERT_TRUE(pm.is_ok()) << pm.status().to_string();
  auto gm = Model::load(model);
  ASSERT_TRUE(gm.is_ok()) << gm.status().to_string();
  const int64_t d = (*gm)->hparams().n_embd, top_k = (*gm)->hparams().indexer_top_k;
  ASSERT_GT(top_k, 0);
  for (int b = 0; b <= 6; ++b) {
    EXPECT_EQ(pm->row_bytes_at(b), static_cast<uint64_t>(4 * (d + (b % 2 == 1 ? 1 + top_k : 0)))) << "boundary " << b;
  }
  const uint64_t bytes = file_bytes(model);
  const int n = 4;
  RunResult local = run_moesh("run -m " + quoted(model) + " --tokens 5,6,7,8 -n " + std::to_string(n) + " -t 1 --json");
  ASSERT_EQ(local.exit_code, 0) << local.err;
  // Three peers that hold about a third of the model each, a backbone that holds only globals:
  // every block goes to a span.
  std::string peers;
  for (int i = 0; i < 3; ++i)
    peers += " --peer p" + std::to_string(i) + ":mem=" + std::to_string(bytes * 45 / 100) + ",rtt=20ms";
  for (const std::string layout : {"plan", "spans"}) {
    SCOPED_TRACE(layout);
    RunResult pr = run_moesh("swarm plan -m " + quoted(model) + peers + " -c 256 --json --layout " + layout +
                             " --backbone-mem " + std::to_string(bytes * 10 / 100));
    ASSERT_EQ(pr.exit_code, 0) << pr.err;
    const nlohmann::json plan = json_of(pr);
    int spans = 0;
    for (const auto& r : plan["roles"]) spans += r["role"] == "span";
    EXPECT_GE(spans, layout == std::string("spans") ? 3 : 1) << plan.dump();
    carry_out(model, plan, json_of(local), n);
  }
  // Spans that start at odd blocks (rows carrying the selection in and out), as real peers.
  nlohmann::json odd = {{"roles", nlohmann::json::array()}, {"trips_per_step", 2.0}};
  odd["roles"].push_back({{"peer", "p0"}, {"role", "span"}, {"layers", "1-2"}});
  odd["roles"].push_back({{"peer", "p1"}, {"role", "span"}, {"layers", "3-5"}});
  carry_out(model, odd, json_of(local), n);

  MakeModelSpec k;
  ASSERT_TRUE(MakeModelSpec::defaults_for_name("kimi-k3", &k));
  k.type = MakeFileType::kQ8_0;
  const std::string kimi = made_model("kimik3-plan", k);
  auto kf = gguf::File::open(kimi);
  ASSERT_TRUE(kf.is_ok()) << kf.status().to_string();
  auto km = plan_model_from_gguf(**kf, 256, kDefaultSecondsPerByte);
  ASSERT_TRUE(km.is_ok()) << km.status().to_string();
  auto hp = load_hparams(**kf);
  ASSERT_TRUE(hp.is_ok()) << hp.status().to_string();
  ASSERT_GT(hp->attn_res_block, 0);
  uint64_t widest = 0;
  for (int b = 0; b <= km->n_layer(); ++b) {
    EXPECT_EQ(km->row_bytes_at(b), static_cast<uint64_t>(hp->span_row_width(b)) * 4) << "boundary " << b;
    widest = std::max(widest, km->row_bytes_at(b));
  }
  EXPECT_GT(widest, km->hidden_bytes);
}

// Re-planning after a peer left and another joined: the moves name every changed role and the
// slice to cut for it; a peer that left is "gone".
TEST(PlanCli, ReplanningListsTheMovesFromThePreviousPlan) {
  const std::string model = eight_block_model();
  const uint64_t bytes = file_bytes(model);
  auto peer = [&](const std::string& name, int pct, int rtt) {
    return " --peer " + name + ":mem=" + std::to_string(bytes * pct / 100) + ",rtt=" + std::to_string(rtt) + "ms";
  };
  const std::string base = "swarm plan -m " + quoted(model) + " -c 256";
  RunResult before = run_moesh(base + peer("big", 55, 20) + peer("s1", 30, 20) + peer("s2", 30, 30) + " --json");
  ASSERT_EQ(before.exit_code, 0) << before.err;
  const std::string old_path = temp_dir() + "/plan-before.json";
  { std::ofstream(old_path) << before.out; }
  RunResult same = run_moesh(base + peer("big", 55, 20) + peer("s1", 30, 20) + peer("s2", 30, 30) + " --json --from " +
                             quoted(old_path));
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_TRUE(json_of(same)["moves"].empty()) << same.out;
  RunResult after = run_moesh(base + peer("big", 55, 20) + peer("s1", 30, 20) + peer("s3", 60, 25) + " --json --from " +
                              quoted(old_path));
  ASSERT_EQ(after.exit_code, 0) << after.err;
  const nlohmann::json moves = json_of(after)["moves"];
  ASSERT_FALSE(moves.empty());
  bool s2_gone = false, s3_new = false;
  for (const auto& mv : moves) {
    if (mv["peer"] == "s2") s2_gone = mv["to"] == "gone";
    if (mv["peer"] == "s3") {
      s3_new = std::string(mv["from"]).rfind("absent", 0) == 0;
      EXPECT_NE(std::string(mv["slice"]).find("moesh slice -m"), std::string::npos) << mv.dump();
    }
  }
  EXPECT_TRUE(s2_gone) << moves.dump();
  EXPECT_TRUE(s3_new) << moves.dump();
  RunResult text = run_moesh(base + peer("big", 55, 20) + peer("s3", 60, 25) + " --from " + quoted(old_path));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("moves from"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("transfer: moesh slice"), std::string::npos) << text.out;
  // A span whose blocks the gateway already runs moves to a new peer live: the move names the
  // `moesh swarm move` that does it (with --status, against that gateway); new span edges do not.
  const std::string spans = base + " --layout spans";
  RunResult two = run_moesh(spans + peer("a", 60, 20) + peer("b", 60, 20) + " --json");
  ASSERT_EQ(two.exit_code, 0) << two.err;
  const std::string two_path = temp_dir() + "/plan-two-spans.json";
  { std::ofstream(two_path) << two.out; }
  RunResult swapped = run_moesh(spans + peer("c", 60, 20) + ",addr=10.0.0.7:7001" + peer("b", 60, 20) +
                                " --json --from " + quoted(two_path));
  ASSERT_EQ(swapped.exit_code, 0) << swapped.err;
  std::string a_layers;
  const nlohmann::json two_plan = json_of(two), swapped_plan = json_of(swapped);
  for (const auto& r : two_plan["roles"])
    if (r["peer"] == "a") a_layers = r["layers"].get<std::string>();
  ASSERT_FALSE(a_layers.empty()) << two.out;
  bool c_switch = false;
  for (const auto& mv : swapped_plan["moves"]) {
    if (mv["peer"] != "c") continue;
    ASSERT_TRUE(mv.contains("switch")) << mv.dump();
    EXPECT_EQ(mv["switch"],
              "moesh swarm move http://GATEWAY:PORT --span " + a_layers + "@10.0.0.7:7001 --admin-key KEY");
    EXPECT_EQ(mv["fetch"], "moesh span --fetch http://GATEWAY:PORT --admin-key KEY --layers " + a_layers +
                               " --listen 10.0.0.7:7001");
    c_switch = true;
  }
  EXPECT_TRUE(c_switch) << swapped.out;
  RunResult three = run_moesh(spans + peer("a", 40, 20) + peer("b", 40, 20) + peer("c", 40, 20) + peer("d", 40, 20) +
                              " --json --from " + quoted(two_path));
  ASSERT_EQ(three.exit_code, 0) << three.err;
  const nlohmann::json three_plan = json_of(three);
  for (const auto& mv : three_plan["moves"])
    EXPECT_FALSE(mv.contains("switch")) << "four equal spans have new edges: " << mv.dump();
  // The new edges cover the same blocks: the gateway takes them live, all spans in one resplit.
  EXPECT_FALSE(swapped_plan.contains("resplit")) << "the same edges: per-span switches only";
  ASSERT_TRUE(three_plan.contains("resplit")) << three.out;
  EXPECT_TRUE(three_plan["resplit"]["live"]) << three_plan["resplit"].dump();
  std::string want = "moesh swarm move http://GATEWAY:PORT";
  int n_spans = 0;
  std::vector<std::pair<int, std::string>> span_roles;
  for (const auto& r : three_plan["roles"]) {
    if (r["role"] != "span") continue;
    const std::string layers = r["layers"];
    span_roles.emplace_back(std::stoi(layers), layers);
  }
  std::sort(span_roles.begin(), span_roles.end());
  for (const auto& [first, layers] : span_roles) want += " --span " + layers + "@HOST:PORT", ++n_spans;
  EXPECT_GT(n_spans, 2);
  EXPECT_EQ(three_plan["resplit"]["command"], want + " --admin-key KEY");
  RunResult three_text = run_moesh(spans + peer("a", 40, 20) + peer("b", 40, 20) + peer("c", 40, 20) +
                                   peer("d", 40, 20) + " --from " + quoted(two_path));
  EXPECT_NE(three_text.out.find("new span edges, live once the span peers run: " + want), std::string::npos)
      << three_text.out;
  // A gateway that runs b's blocks as a span here (`--span F-L@here`, its live layout's "here")
  // takes the four spans live too, though only a's blocks were on a peer; without "here" that
  // needs a restart. And a plan with fewer span blocks leaves the rest here, live.
  {
    nlohmann::json old = two_plan;
    std::string b_layers;
    nlohmann::json roles = nlohmann::json::array();
    for (const auto& r : old["roles"]) {
      if (r["peer"] == "b") {
        b_layers = r["layers"].get<std::string>();
      } else {
        roles.push_back(r);
      }
    }
    ASSERT_FALSE(b_layers.empty()) << two.out;
    old["roles"] = roles;
    const std::string only_a = temp_dir() + "/plan-a-span.json";
    { std::ofstream(only_a) << old.dump(); }
    RunResult restart = run_moesh(spans + peer("a", 40, 20) + peer("b", 40, 20) + peer("c", 40, 20) +
                                  peer("d", 40, 20) + " --json --from " + quoted(only_a));
    ASSERT_EQ(restart.exit_code, 0) << restart.err;
    const nlohmann::json rj = json_of(restart)["resplit"];
    EXPECT_FALSE(rj["live"]) << rj.dump();
    EXPECT_NE(rj["why"].get<std::string>().find("--span F-L@here"), std::string::npos) << rj.dump();
    old["here"] = nlohmann::json::array({b_layers});
    const std::string a_here = temp_dir() + "/plan-a-span-b-here.json";
    { std::ofstream(a_here) << old.dump(); }
    RunResult live = run_moesh(spans + peer("a", 40, 20) + peer("b", 40, 20) + peer("c", 40, 20) + peer("d", 40, 20) +
                               " --json --from " + quoted(a_here));
    ASSERT_EQ(live.exit_code, 0) << live.err;
    EXPECT_TRUE(json_of(live)["resplit"]["live"]) << live.out;
    EXPECT_EQ(json_of(live)["resplit"]["command"], want + " --admin-key KEY");
    // A plan without spans (one big expert peer) for a gateway running every block as spans:
    // the blocks go back to the backbone live, as one span here.
    old["here"] = nlohmann::json::array({"0-7"});
    const std::string all_here = temp_dir() + "/plan-all-here.json";
    { std::ofstream(all_here) << old.dump(); }
    RunResult one = run_moesh(base + peer("a", 100, 20) + " --json --from " + quoted(all_here));
    ASSERT_EQ(one.exit_code, 0) << one.err;
    const nlohmann::json one_plan = json_of(one);
    for (const auto& r : one_plan["roles"]) EXPECT_NE(r["role"], "span") << one.out;
    ASSERT_TRUE(one_plan.contains("resplit")) << one.out;
    EXPECT_TRUE(one_plan["resplit"]["live"]) << one.out;
    EXPECT_EQ(one_plan["resplit"]["command"],
              "moesh swarm move http://GATEWAY:PORT --span 0-7@here --resplit --admin-key KEY");
  }
  // A new expert peer's move names the command that has the gateway take it in live (no --status
  // gateway accepting joins: no `join`).
  RunResult ex_before = run_moesh(base + " --layout experts" + peer("big", 200, 20) + " --json");
  ASSERT_EQ(ex_before.exit_code, 0) << ex_before.err;
  const std::string ex_path = temp_dir() + "/plan-experts.json";
  { std::ofstream(ex_path) << ex_before.out; }
  RunResult ex_after = run_moesh(base + " --layout experts" + peer("big", 200, 20) + peer("e2", 200, 20) +
                                 ",addr=10.0.0.9:7002 --json --from " + quoted(ex_path));
  ASSERT_EQ(ex_after.exit_code, 0) << ex_after.err;
  bool e2_switch = false;
  const nlohmann::json ex_moves = json_of(ex_after)["moves"];
  for (const auto& mv : ex_moves) {
    if (mv["peer"] != "e2") continue;
    EXPECT_EQ(mv["switch"], "moesh swarm move http://GATEWAY:PORT --worker 10.0.0.9:7002 --admin-key KEY") << mv.dump();
    EXPECT_FALSE(mv.contains("join")) << mv.dump();
    e2_switch = true;
  }
  EXPECT_TRUE(e2_switch) << ex_after.out;
  // big's experts change: its new worker runs beside the old one (another port), which is stopped
  // once the gateway took the new one in.
  for (const auto& mv : ex_moves)
    if (mv["peer"] == "big")
      EXPECT_EQ(mv["switch"], "moesh swarm move http://GATEWAY:PORT --worker HOST:NEW_PORT --admin-key KEY")
          << mv.dump();
  RunResult missing = run_moesh(base + peer("big", 200, 20) + " --from /nonexistent/plan.json");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("cannot open"), std::string::npos) << missing.err;
}

TEST(PlanCli, TheTextPlanListsRolesComparisonsAndCommands) {
  const std::string model = eight_block_model();
  RunResult r = run_moesh("swarm plan -m " + quoted(model) +
                          " --calibrate --peer a:mem=1GiB,rtt=20ms,addr=10.0.0.2:7001 --peer b:mem=1GiB,rtt=50ms");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("measured here"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("predicted:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("experts on every peer"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("moesh span -m"), std::string::npos) << r.out;  // 1 GiB holds the whole model
  EXPECT_NE(r.out.find("--listen 10.0.0.2:7001"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("backbone: moesh run -m"), std::string::npos) << r.out;
}

// A gateway started from its backbone slice (no routed experts, only their layouts) plans the
// same swarm as one started from the full file: same roles, bytes and predicted step.
TEST(PlanCli, ABackboneSlicePlansLikeTheFullFile) {
  const std::string model = eight_block_model();
  const std::string slice = ::testing::TempDir() + "plan-backbone.gguf";
  RunResult cut = run_moesh("slice -m " + quoted(model) + " --backbone --out " + quoted(slice));
  ASSERT_EQ(cut.exit_code, 0) << cut.err;
  ASSERT_LT(file_bytes(slice), file_bytes(model) / 2);  // the experts really are left out
  const std::string peers = " --peer a:mem=30MiB,rtt=20ms --peer b:mem=30MiB,rtt=30ms --peer c:mem=2MiB,rtt=5ms";
  const std::string mem = " --backbone-mem 16MiB";
  nlohmann::json full = json_of(run_moesh("swarm plan -m " + quoted(model) + peers + mem + " --json"));
  nlohmann::json part = json_of(run_moesh("swarm plan -m " + quoted(slice) + peers + mem + " --json"));
  ASSERT_TRUE(full.contains("roles") && part.contains("roles")) << full.dump() << part.dump();
  EXPECT_EQ(part["roles"], full["roles"]);
  EXPECT_EQ(part["backbone_bytes"], full["backbone_bytes"]);
  EXPECT_EQ(part["predicted_step_ms"], full["predicted_step_ms"]);
  EXPECT_EQ(part["trips_per_step"], full["trips_per_step"]);
  // Its commands start the peers from the full file (the slice has no experts to serve) and the
  // backbone from the slice.
  RunResult text = run_moesh("swarm plan -m " + quoted(slice) + peers + mem);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find(" -m FULL_MODEL.gguf --"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("backbone: moesh run -m " + slice), std::string::npos) << text.out;
  // --calibrate on the slice times its dense parts alone (the routed sums as zeros): a cost per
  // byte of this machine, and a row share.
  RunResult cal = run_moesh("swarm plan -m " + quoted(slice) + " --calibrate" + peers);
  ASSERT_EQ(cal.exit_code, 0) << cal.err;
  EXPECT_NE(cal.out.find("measured here, of the backbone's dense parts"), std::string::npos) << cal.out;
  EXPECT_NE(cal.out.find("each more row adds"), std::string::npos) << cal.out;
}

TEST(PlanCli, BadInputsGetClearErrors) {
  const std::string model = eight_block_model();
  const std::string m = "swarm plan -m " + quoted(model);
  RunResult none = run_moesh(m);
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("no --peer"), std::string::npos) << none.err;
  RunResult bad_mem = run_moesh(m + " --peer a:mem=lots");
  EXPECT_EQ(bad_mem.exit_code, 2);
  EXPECT_NE(bad_mem.err.find("not a size"), std::string::npos) << bad_mem.err;
  RunResult bad_key = run_moesh(m + " --peer a:mem=1GiB,colour=red");
  EXPECT_EQ(bad_key.exit_code, 2);
  EXPECT_NE(bad_key.err.find("unknown key 'colour'"), std::string::npos) << bad_key.err;
  RunResult small = run_moesh(m + " --peer a:mem=1KiB --backbone-mem 1KiB");
  EXPECT_EQ(small.exit_code, 1);
  EXPECT_NE(small.err.find("no assignment holds every layer"), std::string::npos) << small.err;
  RunResult both = run_moesh(m + " --shape deepseek-v3 --peer a:mem=1GiB");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("exactly one of"), std::string::npos) << both.err;
  RunResult layout = run_moesh(m + " --peer a:mem=1GiB --layout ring");
  EXPECT_EQ(layout.exit_code, 2);
  EXPECT_NE(layout.err.find("plan, experts or spans"), std::string::npos) << layout.err;
  RunResult bad_pair = run_moesh(m + " --peer a:mem=1GiB --peer b:mem=1GiB --peer-rtt a:c=10ms");
  EXPECT_EQ(bad_pair.exit_code, 2);
  EXPECT_NE(bad_pair.err.find("two different --peer names"), std::string::npos) << bad_pair.err;
  RunResult bad_rtt = run_moesh(m + " --peer a:mem=1GiB --peer b:mem=1GiB --peer-rtt a:b=soon");
  EXPECT_EQ(bad_rtt.exit_code, 2);
  EXPECT_NE(bad_rtt.err.find("--peer-rtt 'a:b=soon'"), std::string::npos) << bad_rtt.err;
}

// Peers far from the backbone and close to each other: with their RTT given, the equal spans are
// priced as one chain (each after the one before) and predicted faster than star; the simulator
// agrees with the planner exactly.
TEST(PlanCli, PeerRttsPriceAdjacentSpansAsAChain) {
  const std::string model = eight_block_model();
  const std::string common =
      "-m " + quoted(model) +
      " --peer a:mem=1GiB,rtt=100ms --peer b:mem=1GiB,rtt=100ms --layout spans --seconds-per-byte "
      "0.25e-9 --message-us 100 --json";
  RunResult star = run_moesh("swarm plan " + common);
  RunResult chain = run_moesh("swarm plan " + common + " --peer-rtt 20ms");
  RunResult off = run_moesh("swarm plan " + common + " --peer-rtt a:b=20ms --no-chain");
  ASSERT_EQ(star.exit_code, 0) << star.err;
  ASSERT_EQ(chain.exit_code, 0) << chain.err;
  ASSERT_EQ(off.exit_code, 0) << off.err;
  const nlohmann::json s = json_of(star), c = json_of(chain), o = json_of(off);
  EXPECT_FALSE(s["roles"][1].contains("chained_after"));
  EXPECT_EQ(c["roles"][1]["chained_after"], "a");
  // One hop saves 1/2 (100 + 100 - 20) ms and one message (0.1 ms).
  EXPECT_NEAR(s["predicted_step_ms"].get<double>() - c["predicted_step_ms"].get<double>(), 90.1, 1e-6);
  EXPECT_NEAR(o["predicted_step_ms"].get<double>(), s["predicted_step_ms"].get<double>(), 1e-9);
  RunResult sim = run_moesh("simulate " + common + " --peer-rtt 20ms --steps 4");
  ASSERT_EQ(sim.exit_code, 0) << sim.err;
  EXPECT_NEAR(json_of(sim)["simulated"]["step_mean_ms"].get<double>(), c["predicted_step_ms"].get<double>(), 1e-6);
}

// Activation counts from a gateway (a saved /swarm/dashboard.json): the backbone's budget keeps
// the hot experts, the far peer serves only cold ones, so fewer steps need a trip than the same
// budget planned with uniform activations; the simulator draws from the same counts.
TEST(PlanCli, ActivationCountsKeepTheHotExpertsOnTheBackbone) {
  MakeModelSpec spec = MakeModelSpec::defaults_for(MakeArch::kQwen3Moe);
  spec.type = MakeFileType::kQ8_0;
  spec.seed = 13;
  spec.n_layer = 2;
  spec.n_ctx = 256;
  const std::string model = made_model("qwen3moe-l2-hot", spec);
  auto f = gguf::File::open(model);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  auto pm = plan_model_from_gguf(**f, 256, kDefaultSecondsPerByte);
  ASSERT_TRUE(pm.is_ok()) << pm.status().to_string();
  const int E = pm->n_expert, k = pm->n_expert_used;
  ASSERT_GE(E, 4);
  ASSERT_GT(k, 1);
  const uint64_t eb = pm->layers[1].expert_bytes;
  // The two highest ids take 0.9 of a layer's tokens each; the others share the rest.
  const double cold = (k - 1.8) / (E - 2);
  nlohmann::json layers = nlohmann::json::array();
  for (int l = 0; l < 2; ++l) {
    nlohmann::json share = nlohmann::json::array();
    for (int e = 0; e < E; ++e) share.push_back(e >= E - 2 ? 0.9 : cold);
    layers.push_back({{"layer", l}, {"tokens", 100000}, {"share", share}});
  }
  const std::string counts = ::testing::TempDir() + "plan-activations.json";
  std::ofstream(counts) << nlohmann::json{{"time_s", 1}, {"heatmap", {{"n_expert", E}, {"layers", layers}}}}.dump();
  // The backbone keeps E + 2 experts (layer 0 whole and two of layer 1); one far peer the rest.
  const std::string common = "-m " + quoted(model) + " --peer far:mem=" + std::to_string((E - 2) * eb) +
                             "B,rtt=50ms --local-experts-mb " + std::to_string((E + 2) * eb) + "B --json";
  RunResult uni = run_moesh("swarm plan " + common + " --activations uniform");
  RunResult hot = run_moesh("swarm plan " + common + " --activations " + quoted(counts));
  ASSERT_EQ(uni.exit_code, 0) << uni.err;
  ASSERT_EQ(hot.exit_code, 0) << hot.err;
  const nlohmann::json u = json_of(uni), h = json_of(hot);
  EXPECT_TRUE(u["activations"].is_null());
  EXPECT_EQ(h["activations"]["layers"], 2);
  EXPECT_EQ(h["activations"]["tokens"], 200000);
  EXPECT_EQ(u["backbone_experts"], "0:*,1:0-1");
  EXPECT_EQ(h["backbone_experts"], fmt::format("0:*,1:{}-{}", E - 2, E - 1)) << h.dump();
  ASSERT_EQ(h["roles"][0]["role"], "experts") << h.dump();
  EXPECT_EQ(h["roles"][0]["experts"], fmt::format("1:0-{}", E - 3));
  // Layer 1 makes a trip when a token needs a cold expert: 1 - (1 - p)^(E - 2), p smoothed by 16
  // uniform pseudo-tokens; with uniform activations nearly every step does.
  const double p = (cold * 100000 + 16.0 * k / E) / (100000 + 16);
  EXPECT_NEAR(h["trips_per_step"].get<double>(), 1 - std::pow(1 - p, E - 2), 1e-9);
  EXPECT_LT(h["trips_per_step"].get<double>(), u["trips_per_step"].get<double>());
  EXPECT_LT(h["predicted_step_ms"].get<double>(), u["predicted_step_ms"].get<double>());
  RunResult text = run_moesh("swarm plan " + common.substr(0, common.size() - 7) + " --activations " + quoted(counts));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("activations: counted, 200000 token(s) over 2 layer(s)"), std::string::npos) << text.out;
  // The simulator draws each token's experts from the same counts.
  RunResult su = run_moesh("simulate " + common + " --activations uniform --steps 200");
  RunResult sh = run_moesh("simulate " + common + " --activations " + quoted(counts) + " --steps 200");
  ASSERT_EQ(su.exit_code, 0) << su.err;
  ASSERT_EQ(sh.exit_code, 0) << sh.err;
  EXPECT_LT(json_of(sh)["simulated"]["trips_per_step"].get<double>(),
            json_of(su)["simulated"]["trips_per_step"].get<double>() - 0.1);
  // Counts of another model, or malformed ones, are refused by name.
  const std::string other = ::testing::TempDir() + "plan-activations-other.json";
  std::ofstream(other) << nlohmann::json{{"n_expert", E + 1}, {"layers", layers}}.dump();
  RunResult wrong = run_moesh("swarm plan " + common + " --activations " + quoted(other));
  EXPECT_EQ(wrong.exit_code, 2);
  EXPECT_NE(wrong.err.find("heatmap.n_expert is " + std::to_string(E + 1)), std::string::npos) << wrong.err;
  layers[1]["share"][3] = 1.5;
  std::ofstream(other) << nlohmann::json{{"n_expert", E}, {"layers", layers}}.dump();
  RunResult share = run_moesh("swarm plan " + common + " --activations " + quoted(other));
  EXPECT_EQ(share.exit_code, 2);
  EXPECT_NE(share.err.find("heatmap.layers[1].share[3] is not a share"), std::string::npos) << share.err;
  RunResult missing = run_moesh("swarm plan " + common + " --activations /nonexistent.json");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("cannot open it"), std::string::npos) << missing.err;
}

TEST(SimulateCli, ADeepSeekSizedSwarmOfHundredsOfPeersWithAFailure) {
  RunResult r = run_moesh(
      "simulate --shape deepseek-v3 --peers 200 --peer-memory 8GiB --rtt-median 30ms --rtt-sigma 0.5 "
      "--backbone-mem 64GiB --steps 6 --fail g5@1s --timeout 2s --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = json_of(r);
  EXPECT_EQ(j["model"], "deepseek-v3");
  EXPECT_EQ(j["n_layer"], 61);
  EXPECT_EQ(j["roles"].size(), 200u);
  EXPECT_EQ(j["simulated"]["steps"], 6);
  EXPECT_EQ(j["simulated"]["tokens"], 6);
  EXPECT_GT(j["simulated"]["trips_per_step"].get<double>(), 0);
  RunResult text = run_moesh(
      "simulate --shape qwen3-30b-a3b --peer a:mem=64GiB,rtt=20ms --peer b:mem=64GiB,rtt=20ms "
      "--layout spans --steps 8 --draft 3 --accept 0.5");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("simulated: 8 steps"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("2 span peer(s)"), std::string::npos) << text.out;
  RunResult unknown = run_moesh("simulate --shape gpt-9 --peers 2");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.err.find("known: qwen3-30b-a3b"), std::string::npos) << unknown.err;
  RunResult bad_fail = run_moesh("simulate --shape kimi-k2 --peers 2 --peer-memory 1TiB --fail nobody@1s");
  EXPECT_EQ(bad_fail.exit_code, 2);
  EXPECT_NE(bad_fail.err.find("--fail 'nobody@1s'"), std::string::npos) << bad_fail.err;
}

}  // namespace
}  // namespace moesh::test
