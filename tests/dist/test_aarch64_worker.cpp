// An x86-64 backbone (this test, in process) dispatching to an aarch64 `moesh worker` (the cross
// build, build-aarch64/bin/moesh) running under qemu-user on 127.0.0.1: in exact mode the logits
// must be bit-identical (memcmp) to all-local, with the f32 wire and with the backbone's own INT8
// activation blocks on the wire, on F16, Q8_0 and Q4_K_M make-model files (qwen3moe: SwiGLU through
// ggml's vector exp) and a gpt-oss file (its clamped SwiGLU through expf).
//
// It also reports the worker's footprint next to its slab bytes (VmRSS / VmHWM of the qemu
// process, which hosts the guest: the emulator's own code, translation cache and a second copy of
// the shared libraries are included, so it overstates a native worker) beside a native x86 worker
// on the same file, and the compute time per DISPATCH the worker reports (qemu is an emulator:
// this is not a speed figure).
//
// Skipped (exit 77, with the reason) when the cross build or qemu-aarch64 is absent: `make
// cross-aarch64` builds it, scripts/install-cross-aarch64.sh installs the toolchain and qemu.
// MOESH_AARCH64_MOESH and MOESH_QEMU_AARCH64 in the environment override where they are looked for.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>

#include "dist/dist_util.h"
#include "dist/worker_process.h"
#include "moesh/tensor/quant.h"

namespace moesh::test {
namespace {

struct Cross {
  std::string qemu, moesh;
  std::string missing;  // why the test cannot run, or empty
};

bool is_aarch64_elf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char h[20] = {};
  if (!in.read(reinterpret_cast<char*>(h), sizeof h)) return false;
  // ELF magic, 64-bit, little endian, e_machine 183 (EM_AARCH64) at offset 18.
  return std::memcmp(h,
                     "\x7f"
                     "ELF",
                     4) == 0 &&
         h[4] == 2 && h[5] == 1 && h[18] == 183 && h[19] == 0;
}

std::string find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string p = path != nullptr ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    const size_t end = std::min(p.find(':', start), p.size());
    const std::string cand = p.substr(start, end - start) + "/" + name;
    if (end > start && access(cand.c_str(), X_OK) == 0) return cand;
    start = end + 1;
  }
  return "";
}

Cross find_cross() {
  Cross c;
  const char* m = std::getenv("MOESH_AARCH64_MOESH");
  c.moesh = m != nullptr ? m : MOESH_AARCH64_MOESH;
  if (const char* q = std::getenv("MOESH_QEMU_AARCH64")) {
    c.qemu = q;
  } else {
    c.qemu = find_in_path("qemu-aarch64");
    if (c.qemu.empty()) c.qemu = find_in_path("qemu-aarch64-static");
  }
  if (access(c.moesh.c_str(), X_OK) != 0) {
    c.missing = "no aarch64 moesh at " + c.moesh + " (make cross-aarch64)";
  } else if (!is_aarch64_elf(c.moesh)) {
    c.missing = c.moesh + " is not an aarch64 ELF executable";
  } else if (c.qemu.empty() || access(c.qemu.c_str(), X_OK) != 0) {
    c.missing = "qemu-aarch64 not found (apt-get install qemu-user; scripts/install-cross-aarch64.sh)";
  } else if (access("/lib/ld-linux-aarch64.so.1", R_OK) != 0) {
    // The multiarch loader and libraries (libc6:arm64), not the cross toolchain's: see
    // cmake/toolchain-aarch64.cmake for why qemu gets no -L.
    c.missing = "no /lib/ld-linux-aarch64.so.1 (libc6:arm64; scripts/install-cross-aarch64.sh)";
  }
  return c;
}

// "slab bytes: N" from the worker's start-up lines.
uint64_t printed_slab_bytes(const std::string& out) {
  std::smatch m;
  const std::regex re(R"(slab bytes: (\d+))");
  return std::regex_search(out, m, re) ? std::stoull(m[1].str()) : 0;
}

// VmRSS / VmHWM of a process in bytes (0 if unreadable).
uint64_t proc_status_bytes(pid_t pid, const char* key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(k, 0) == 0) return std::stoull(line.substr(k.size())) * 1024;  // "  1234 kB"
  }
  return 0;
}

struct Case {
  std::string label;
  std::function<std::string()> path;
};

std::string made(const std::string& name, MakeFileType type) {
  MakeModelSpec s = MakeModelSpec::defaults_for(MakeArch::kQwen3Moe);
  s.type = type;
  s.seed = 78;
  s.n_expert = 8;
  s.n_expert_used = 2;
  s.n_embd = 256;  // a whole Q4_K/Q8_K super-block per row
  s.n_ff_exp = 256;
  s.n_head = 4;
  s.head_dim = 64;
  return made_model(name, s);
}

std::string made_gptoss() {
  MakeModelSpec s;
  EXPECT_TRUE(MakeModelSpec::defaults_for_name("gpt-oss", &s));
  s.type = MakeFileType::kQ8_0;
  return made_model("gptoss-q8", s);
}

class Aarch64Worker : public ::testing::TestWithParam<Case> {};

Result<std::vector<float>> run_remote(const Model& model, const std::vector<int32_t>& tokens, WorkerAddress addr,
                                      wire::WireDType hidden, WorkerTraffic* wt) {
  RemoteOptions o;
  o.hidden_wire = hidden;
  o.return_wire = wire::WireDType::kF32;
  o.combine = wire::CombineMode::kExact;
  o.timeout = std::chrono::milliseconds(120000);  // qemu: every DISPATCH is emulated
  MOESH_ASSIGN_OR_RETURN(auto exec, RemoteExecutor::connect(model, {addr}, o));
  std::shared_ptr<RemoteExecutor> shared(std::move(exec));
  auto lg = run_model(model, tokens, shared);
  if (wt != nullptr) {
    auto all = shared->worker_traffic();
    if (!all.empty()) *wt = all[0];
  }
  return lg;
}

// The INT8 wire format the experts' gate/up consume (Q8_0 files: kQ8; K-quant files: kQ8K), or
// kF32 when there is none.
wire::WireDType int8_format(const Model& m) {
  for (const auto& lw : m.layers) {
    if (!lw.is_moe) continue;
    const GgmlType g = quant::vec_dot_type(lw.experts.gate.type);
    if (g != quant::vec_dot_type(lw.experts.up.type)) return wire::WireDType::kF32;
    if (g == GgmlType::Q8_0) return wire::WireDType::kQ8;
    if (g == GgmlType::Q8_K) return wire::WireDType::kQ8K;
    return wire::WireDType::kF32;
  }
  return wire::WireDType::kF32;
}

TEST_P(Aarch64Worker, ExactLogitsBitIdenticalToLocal) {
  const Cross cross = find_cross();
  if (!cross.missing.empty()) GTEST_SKIP() << "SKIPPED: " << cross.missing;
  const Case c = GetParam();
  const std::string path = c.path();
  auto m = Model::load(path);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  const Model& model = **m;
  const int64_t V = model.hparams().n_vocab;
  const auto tokens = test_tokens(path, V, 8);
  auto local = run_model(model, tokens);
  ASSERT_TRUE(local.is_ok()) << local.status().to_string();
  expect_not_degenerate(*local, V);

  auto arm = WorkerProcess::spawn_program(
      {cross.qemu, cross.moesh, "worker", "-m", path, "--experts", "*:*", "--listen", "127.0.0.1:0", "--threads", "1"},
      "aarch64 *:*", std::chrono::milliseconds(120000));
  ASSERT_TRUE(arm.is_ok()) << arm.status().to_string();
  const uint64_t slab = printed_slab_bytes((*arm)->output());
  EXPECT_GT(slab, 0u) << (*arm)->output();
  const uint64_t rss_start = proc_status_bytes((*arm)->pid(), "VmRSS");

  std::vector<wire::WireDType> wires = {wire::WireDType::kF32};
  if (int8_format(model) != wire::WireDType::kF32) wires.push_back(int8_format(model));
  WorkerTraffic wt;
  for (wire::WireDType w : wires) {
    SCOPED_TRACE(fmt::format("hidden wire {}", wire::wire_dtype_name(w)));
    auto lg = run_remote(model, tokens, (*arm)->address(), w, &wt);
    ASSERT_TRUE(lg.is_ok()) << lg.status().to_string() << "\nworker output:\n" << (*arm)->output();
    ASSERT_EQ(lg->size(), local->size());
    EXPECT_EQ(std::memcmp(lg->data(), local->data(), local->size() * sizeof(float)), 0)
        << "logits from the aarch64 worker differ from all-local";
    EXPECT_GT(wt.requests, 0u);
    EXPECT_EQ(wt.errors, 0u);
  }
  const uint64_t arm_rss = proc_status_bytes((*arm)->pid(), "VmRSS");
  const uint64_t arm_hwm = proc_status_bytes((*arm)->pid(), "VmHWM");

  // The same file on a native worker, for the footprint next to it.
  auto x86 = WorkerProcess::spawn(path, "*:*");
  ASSERT_TRUE(x86.is_ok()) << x86.status().to_string();
  auto lg = run_remote(model, tokens, (*x86)->address(), wire::WireDType::kF32, nullptr);
  ASSERT_TRUE(lg.is_ok()) << lg.status().to_string();
  EXPECT_EQ(std::memcmp(lg->data(), local->data(), local->size() * sizeof(float)), 0);
  const uint64_t x86_hwm = proc_status_bytes((*x86)->pid(), "VmHWM");

  const double mib = 1048576.0;
  std::printf(
      "[aarch64 worker] %s: slab %.2f MiB; qemu RSS %.2f MiB at start, %.2f MiB after dispatch (peak %.2f MiB, "
      "peak - slab %.2f MiB); native x86 worker peak %.2f MiB; %llu DISPATCHes, compute %.3f ms each under qemu "
      "(latency %.3f ms)\n",
      c.label.c_str(), slab / mib, rss_start / mib, arm_rss / mib, arm_hwm / mib,
      (static_cast<double>(arm_hwm) - static_cast<double>(slab)) / mib, x86_hwm / mib,
      static_cast<unsigned long long>(wt.requests), wt.requests ? 1e3 * wt.compute_sum_seconds / wt.requests : 0.0,
      wt.requests ? 1e3 * wt.latency_sum_seconds / wt.requests : 0.0);
  RecordProperty("aarch64_peak_rss_bytes", std::to_string(arm_hwm));
  RecordProperty("slab_bytes", std::to_string(slab));
}

INSTANTIATE_TEST_SUITE_P(
    Models, Aarch64Worker,
    ::testing::Values(Case{"qwen3moe_f16", [] { return made("arm-qwen3moe-f16", MakeFileType::kF16); }},
                      Case{"qwen3moe_q8_0", [] { return made("arm-qwen3moe-q8", MakeFileType::kQ8_0); }},
                      Case{"qwen3moe_q4_k_m", [] { return made("arm-qwen3moe-q4km", MakeFileType::kQ4_K_M); }},
                      Case{"gptoss_q8_0", [] { return made_gptoss(); }}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.label; });

}  // namespace
}  // namespace moesh::test
