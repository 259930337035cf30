// Text forms of WAN link parameters, shared by `moesh wan-emu` and `moesh wan-proxy`
// (docs/wan-emu.md, docs/wan-proxy.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "moesh/util/status.h"
#include "moesh/wan/delay_line.h"

namespace moesh::wan {

// "40ms", "250us", "1.5s", "800ns", "0". A bare number is milliseconds.
Result<Nanos> parse_duration(std::string_view s);
// Bits per second from "100mbit", "1gbit", "512kbit", "9600bit" (tc's units, powers of 1000).
Result<double> parse_rate(std::string_view s);
// "0.1%" or a fraction "0.001"; must lie in [0, 1].
Result<double> parse_probability(std::string_view s);
// "HOST:PORT" or "[v6]:PORT".
Result<std::pair<std::string, uint16_t>> parse_host_port(std::string_view s);

// One peer of the emulator: a name and its link to the hub (the same model each way).
struct PeerSpec {
  std::string name;
  LinkSpec link;
};

// "NAME:key=value,key=value,...", keys delay, jitter, rate, loss, queue (packets); all optional
// ("NAME" alone is a link with no delay). NAME: 1-12 of [a-z0-9_], not "hub".
Result<PeerSpec> parse_peer_spec(std::string_view s);

// Peer names as above; emulator names: 1-16 of [A-Za-z0-9_] (no '-', so "moesh-NAME-PEER" parses
// back unambiguously).
bool valid_peer_name(std::string_view s);
bool valid_emu_name(std::string_view s);

// "delay 40ms, jitter 0ms, rate 100mbit, loss 0.1%, queue 1000" — for banners.
std::string describe_link(const LinkSpec& l);
std::string format_duration(Nanos d);
std::string format_rate(double bps);

}  // namespace moesh::wan
