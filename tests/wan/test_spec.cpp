// Text forms of link parameters and peer specs.
#include <gtest/gtest.h>

#include "moesh/wan/spec.h"

namespace moesh::wan {
namespace {

using namespace std::chrono_literals;

TEST(WanSpec, Durations) {
  EXPECT_EQ(parse_duration("40ms").value(), 40ms);
  EXPECT_EQ(parse_duration("40").value(), 40ms);
  EXPECT_EQ(parse_duration("250us").value(), 250us);
  EXPECT_EQ(parse_duration("1.5s").value(), 1500ms);
  EXPECT_EQ(parse_duration("0").value(), 0ms);
  EXPECT_FALSE(parse_duration("").is_ok());
  EXPECT_FALSE(parse_duration("-5ms").is_ok());
  EXPECT_FALSE(parse_duration("5 ms").is_ok());
  EXPECT_FALSE(parse_duration("5min").is_ok());
}

TEST(WanSpec, Rates) {
  EXPECT_DOUBLE_EQ(parse_rate("100mbit").value(), 100e6);
  EXPECT_DOUBLE_EQ(parse_rate("1gbit").value(), 1e9);
  EXPECT_DOUBLE_EQ(parse_rate("512kbit").value(), 512e3);
  EXPECT_DOUBLE_EQ(parse_rate("9600bit").value(), 9600);
  EXPECT_FALSE(parse_rate("100").is_ok()) << "a rate needs its unit";
  EXPECT_FALSE(parse_rate("100mbps").is_ok());
}

TEST(WanSpec, Probabilities) {
  EXPECT_DOUBLE_EQ(parse_probability("0.1%").value(), 0.001);
  EXPECT_DOUBLE_EQ(parse_probability("0.25").value(), 0.25);
  EXPECT_FALSE(parse_probability("150%").is_ok());
  EXPECT_FALSE(parse_probability("2").is_ok());
  EXPECT_FALSE(parse_probability("x").is_ok());
}

TEST(WanSpec, HostPort) {
  EXPECT_EQ(parse_host_port("127.0.0.1:7001").value(), std::make_pair(std::string("127.0.0.1"), uint16_t{7001}));
  EXPECT_EQ(parse_host_port("[::1]:0").value(), std::make_pair(std::string("::1"), uint16_t{0}));
  EXPECT_FALSE(parse_host_port("localhost").is_ok());
  EXPECT_FALSE(parse_host_port(":80").is_ok());
  EXPECT_FALSE(parse_host_port("h:70000").is_ok());
  EXPECT_FALSE(parse_host_port("h:8x").is_ok());
}

TEST(WanSpec, PeerSpecs) {
  auto p = parse_peer_spec("b:delay=40ms,rate=100mbit,loss=0.1%,jitter=2ms,queue=500");
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->name, "b");
  EXPECT_EQ(p->link.delay, 40ms);
  EXPECT_EQ(p->link.jitter, 2ms);
  EXPECT_DOUBLE_EQ(p->link.rate_bps, 100e6);
  EXPECT_DOUBLE_EQ(p->link.loss, 0.001);
  EXPECT_EQ(p->link.queue_packets, 500u);
  auto bare = parse_peer_spec("w_1");
  ASSERT_TRUE(bare.is_ok());
  EXPECT_EQ(bare->link.delay, 0ms);
  EXPECT_EQ(bare->link.queue_packets, 1000u);

  for (const char* bad : {"", "hub:delay=1ms", "A:delay=1ms", "a-b:delay=1ms", "averyveryverylongname", "a:delay",
                          "a:speed=1", "a:rate=10", "a:queue=x", "a:loss=200%"}) {
    EXPECT_FALSE(parse_peer_spec(bad).is_ok()) << bad;
  }
  EXPECT_NE(parse_peer_spec("a:speed=1").status().message().find("unknown key 'speed'"), std::string::npos);
}

TEST(WanSpec, Names) {
  EXPECT_TRUE(valid_emu_name("ci_Run7"));
  EXPECT_FALSE(valid_emu_name("a-b"));
  EXPECT_FALSE(valid_emu_name(""));
  EXPECT_FALSE(valid_emu_name("x/y"));
  EXPECT_TRUE(valid_peer_name("worker_12"));
  EXPECT_FALSE(valid_peer_name("hub"));
}

TEST(WanSpec, Describe) {
  LinkSpec l;
  l.delay = 40ms;
  l.rate_bps = 100e6;
  l.loss = 0.001;
  EXPECT_EQ(describe_link(l), "delay 40ms, jitter 0ms, rate 100mbit, loss 0.1%, queue 1000");
}

}  // namespace
}  // namespace moesh::wan
