// Host TCP settings: warnings from fake /proc/sys/net/ipv4 folders.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "moesh/wan/host_tcp.h"

namespace moesh::wan {
namespace {

namespace fs = std::filesystem;

class HostTcp : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("moesh_host_tcp_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void put(const std::string& name, const std::string& value) { std::ofstream(dir_ / name) << value << "\n"; }
  void host(const std::string& ssai, const std::string& cc, const std::string& allowed, const std::string& avail) {
    put("tcp_slow_start_after_idle", ssai);
    put("tcp_congestion_control", cc);
    put("tcp_allowed_congestion_control", allowed);
    put("tcp_available_congestion_control", avail);
  }
  HostTcpSettings read() { return read_host_tcp_settings(dir_.string()); }
  fs::path dir_;
};

bool any_contains(const std::vector<std::string>& w, const std::string& s) {
  for (const auto& x : w) {
    if (x.find(s) != std::string::npos) return true;
  }
  return false;
}

TEST_F(HostTcp, ReadsTheFiles) {
  host("1", "bbr", "reno bbr", "reno bbr cubic");
  const auto s = read();
  EXPECT_EQ(s.slow_start_after_idle, 1);
  EXPECT_EQ(s.congestion_control, "bbr");
  EXPECT_EQ(s.allowed, "reno bbr");
  EXPECT_EQ(s.available, "reno bbr cubic");
}

TEST_F(HostTcp, TunedHostHasNoWarnings) {
  host("0", "cubic", "reno cubic", "reno cubic bbr");
  EXPECT_TRUE(tcp_settings_warnings(read(), "cubic", false).empty());
  EXPECT_TRUE(tcp_settings_warnings(read(), "", false).empty());
}

TEST_F(HostTcp, SlowStartAfterIdleIsReported) {
  host("1", "cubic", "reno cubic", "reno cubic");
  const auto w = tcp_settings_warnings(read(), "cubic", true);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("sysctl -w net.ipv4.tcp_slow_start_after_idle=0"), std::string::npos) << w[0];
}

TEST_F(HostTcp, CubicNotAllowedMattersOnlyWithoutCapNetAdmin) {
  host("0", "bbr", "reno bbr", "reno bbr cubic");
  const auto w = tcp_settings_warnings(read(), "cubic", false);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("tcp_allowed_congestion_control='reno bbr cubic'"), std::string::npos) << w[0];
  EXPECT_TRUE(tcp_settings_warnings(read(), "cubic", true).empty());
}

TEST_F(HostTcp, CubicUnavailableNeedsTheModule) {
  host("0", "bbr", "reno bbr", "reno bbr");
  const auto w = tcp_settings_warnings(read(), "cubic", true);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(any_contains(w, "modprobe tcp_cubic"));
}

TEST_F(HostTcp, SystemDefaultBbrIsReportedWhenSocketsKeepIt) {
  host("0", "bbr", "reno bbr", "reno bbr cubic");
  EXPECT_TRUE(any_contains(tcp_settings_warnings(read(), "", false), "paces app-limited bursts"));
}

TEST_F(HostTcp, UnreadableSettingsGiveNoWarnings) {
  const auto s = read_host_tcp_settings((dir_ / "missing").string());
  EXPECT_EQ(s.slow_start_after_idle, -1);
  EXPECT_TRUE(tcp_settings_warnings(s, "cubic", false).empty());
}

TEST(HostTcpLive, ThisHostCanBeChecked) {
  // Whatever the host says, the check runs and each warning is a sentence with a fix.
  for (const auto& w : check_host_tcp_settings("cubic")) EXPECT_NE(w.find("operator"), std::string::npos) << w;
}

}  // namespace
}  // namespace moesh::wan
