// Placement and worker-address parsing (pure functions, no sockets).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "moesh/remote.h"

namespace moesh {
namespace {

TEST(WorkerAddress, ParsesHostPortAndIpv6) {
  auto a = parse_worker_address("127.0.0.1:7070");
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 7070);
  auto b = parse_worker_address(" [::1]:65535 ");
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 65535);
  EXPECT_EQ(b->to_string(), "[::1]:65535");
  for (const char* bad : {"", "host", "host:", ":80", "host:0", "host:65536", "host:12x", "::1:80", "[::1]80"}) {
    EXPECT_FALSE(parse_worker_address(bad).is_ok()) << bad;
  }
}

TEST(WorkerAddress, WorkersFileSkipsCommentsAndNamesBadLines) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string p = (dir / ("moesh-workers-" + std::to_string(getpid()) + ".txt")).string();
  {
    std::ofstream f(p);
    f << "# the swarm\n\n10.0.0.1:9000   # gpu box\n  worker.lan:9001\n";
  }
  auto v = read_workers_file(p);
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  ASSERT_EQ(v->size(), 2u);
  EXPECT_EQ((*v)[0].to_string(), "10.0.0.1:9000");
  EXPECT_EQ((*v)[1].to_string(), "worker.lan:9001");
  {
    std::ofstream f(p);
    f << "10.0.0.1:9000\nnot-an-address\n";
  }
  auto bad = read_workers_file(p);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find(p + ":2"), std::string::npos) << bad.status().message();
  std::filesystem::remove(p);
  EXPECT_FALSE(read_workers_file(p).is_ok());
}

PlacementInput input(std::vector<bool> local) {
  PlacementInput in;
  in.n_layer = 3;
  in.n_expert = 8;
  in.moe_layer = {false, true, true};  // layer 0 dense
  in.local_layer = std::move(local);
  return in;
}

TEST(Placement, FirstWorkerWinsAndBackboneFillsTheRest) {
  PlacementInput in = input({false, true, true});
  in.worker_experts = {{{1, 0, 4}}, {{1, 2, 6}, {2, 0, 8}}};
  in.worker_names = {"a", "b"};
  auto p = build_placement(in);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->owner(0, 0), Placement::kNone);
  for (int e = 0; e < 4; ++e) EXPECT_EQ(p->owner(1, e), 0) << e;  // a wins the overlap 2-3
  for (int e = 4; e < 8; ++e) EXPECT_EQ(p->owner(1, e), 1) << e;
  for (int e = 0; e < 8; ++e) EXPECT_EQ(p->owner(2, e), 1) << e;
  EXPECT_EQ(p->count(0), 4);
  EXPECT_EQ(p->count(1), 12);
  EXPECT_EQ(p->count(Placement::kLocal), 0);
  EXPECT_EQ(p->describe(0), "layer 1: experts 0-3");
  // The overlap 2-3 of layer 1 has two holders (b is a replica); everything else one.
  for (int e = 0; e < 8; ++e) {
    const uint64_t want = e < 2 ? 1u : e < 4 ? 3u : 2u;
    EXPECT_EQ(p->holders(1, e), want) << e;
    EXPECT_EQ(p->holders(2, e), 2u) << e;
  }
  EXPECT_EQ(p->holders(0, 0), 0u);
  EXPECT_EQ(p->count_replicas(0), 0);
  EXPECT_EQ(p->count_replicas(1), 2);

  in.worker_experts = {{{1, 0, 3}}};
  in.worker_names = {"a"};
  auto q = build_placement(in);
  ASSERT_TRUE(q.is_ok());
  EXPECT_EQ(q->count(Placement::kLocal), 13);
  EXPECT_EQ(q->describe(Placement::kLocal), "layer 1: experts 3-7; layer 2: experts 0-7");
}

TEST(Placement, UncoveredExpertsAreListed) {
  PlacementInput in = input({false, false, false});  // a backbone slice
  in.worker_experts = {{{1, 0, 2}, {1, 4, 1}, {2, 0, 8}}};
  in.worker_names = {"a"};
  auto p = build_placement(in);
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.status().code(), StatusCode::kNotFound);
  EXPECT_NE(p.status().message().find("5 routed expert(s)"), std::string::npos) << p.status().message();
  EXPECT_NE(p.status().message().find("layer 1: experts 2-3,5-7"), std::string::npos) << p.status().message();
}

TEST(Placement, RejectsRangesOutsideTheModel) {
  PlacementInput in = input({false, true, true});
  in.worker_names = {"w"};
  in.worker_experts = {{{1, 6, 3}}};
  EXPECT_FALSE(build_placement(in).is_ok());
  in.worker_experts = {{{3, 0, 1}}};
  EXPECT_FALSE(build_placement(in).is_ok());
  in.worker_experts = {{{0, 0, 1}}};  // dense layer
  auto p = build_placement(in);
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("dense"), std::string::npos);
}

TEST(Placement, FormatIdRanges) {
  EXPECT_EQ(format_id_ranges({}), "");
  EXPECT_EQ(format_id_ranges({3}), "3");
  EXPECT_EQ(format_id_ranges({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
}

}  // namespace
}  // namespace moesh
