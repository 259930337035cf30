// Placement and worker-address parsing (pure functions, no sockets).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "moesh/remote/address.h"
#include "moesh/remote/placement.h"

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
  using V = std::vector<int32_t>;
  auto holders = [&](int l, int e) { return V(p->holders(l, e).begin(), p->holders(l, e).end()); };
  for (int e = 0; e < 8; ++e) {
    const V want = e < 2 ? V{0} : e < 4 ? V{0, 1} : V{1};
    EXPECT_EQ(holders(1, e), want) << e;
    EXPECT_EQ(holders(2, e), V{1}) << e;
  }
  EXPECT_TRUE(holders(0, 0).empty());
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

TEST(Placement, AnyNumberOfWorkersHoldReplicas) {
  // 100 workers all holding expert 5 of layer 1: every one is recorded (a 64-bit mask used to
  // drop workers 64 and up silently).
  PlacementInput in = input({false, true, true});
  for (int w = 0; w < 100; ++w) {
    in.worker_experts.push_back({{1, 5, 1}});
    in.worker_names.push_back("w" + std::to_string(w));
  }
  auto p = build_placement(in);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  ASSERT_EQ(p->holders(1, 5).size(), 100u);
  EXPECT_EQ(p->holders(1, 5).back(), 99);
  EXPECT_EQ(p->n_workers(), 100);
  EXPECT_EQ(p->owner(1, 5), 0);
  EXPECT_EQ(p->count_replicas(99), 1);
  EXPECT_EQ(p->owner(1, 4), Placement::kLocal);
}

TEST(Placement, LocalCopiesPerExpert) {
  // The backbone holds only expert 3 of layer 2 (not the whole layer); workers hold the rest.
  PlacementInput in = input({false, false, false});
  in.local_expert.assign(3 * 8, false);
  in.local_expert[2 * 8 + 3] = true;
  in.worker_experts = {{{1, 0, 8}, {2, 0, 3}, {2, 4, 4}}};
  in.worker_names = {"a"};
  auto p = build_placement(in);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->owner(2, 3), Placement::kLocal);
  EXPECT_TRUE(p->local_copy(2, 3));
  EXPECT_FALSE(p->local_copy(2, 2));
  EXPECT_EQ(p->describe(Placement::kLocal), "layer 2: experts 3");
  in.local_expert.assign(5, false);  // wrong size
  EXPECT_FALSE(build_placement(in).is_ok());
}

TEST(Placement, DescribeMergesLayersWithTheSameExperts) {
  PlacementInput in;
  in.n_layer = 48;
  in.n_expert = 64;
  in.moe_layer.assign(48, true);
  in.local_layer.assign(48, true);
  std::vector<wire::ExpertRange> a;
  for (uint32_t l = 0; l < 48; ++l) a.push_back({l, 0, l < 40 ? 32u : 16u});
  in.worker_experts = {a};
  in.worker_names = {"a"};
  auto p = build_placement(in);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->describe(0), "layers 0-39: experts 0-31; layers 40-47: experts 0-15");
  EXPECT_EQ(p->describe(Placement::kLocal), "layers 0-39: experts 32-63; layers 40-47: experts 16-63");
  EXPECT_EQ(p->describe(7), "nothing");
}

TEST(Placement, FormatIdRanges) {
  EXPECT_EQ(format_id_ranges({}), "");
  EXPECT_EQ(format_id_ranges({3}), "3");
  EXPECT_EQ(format_id_ranges({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
}

}  // namespace
}  // namespace moesh
