// WebSocket (RFC 6455, Boost.Beast) as a ByteStream, so a worker whose network only lets HTTP out
// can still join a relay or a backbone: `moesh worker --join ws://RELAY:PORT/`. The stream carries
// exactly the bytes a TCP stream would — the same frames, TLS on top when used — as binary
// WebSocket messages; every message is one write_all, and a reader sees the bytes in order, so
// frame boundaries need not match message boundaries. The listening side does not need a
// second port: accept_tcp_or_websocket() tells an HTTP upgrade ("GET ") from a frame stream by
// its first bytes.
//
// Tuned as netstack.md measured: no auto-fragmentation, a 256 KiB write buffer, no secure PRNG
// for client masks (the mask is a proxy-cache guard, not secrecy; TLS carries secrets).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moesh/net/transport.h"
#include "moesh/util/status.h"

namespace moesh::net {

struct WsOptions {
  std::string path = "/moesh";                // request target of the upgrade
  uint64_t max_message_bytes = 256ull << 20;  // larger incoming messages fail the stream
};

// Connects over TCP (with `tcp`'s socket settings) and completes the client upgrade before the
// deadline. kUnavailable naming the peer when the upgrade is refused (e.g. not a WebSocket port).
Result<std::unique_ptr<ByteStream>> ws_connect(const std::string& host, uint16_t port, const TcpOptions& tcp,
                                               Deadline deadline, const WsOptions& ws = {});

// The server side of an upgrade on an accepted TCP stream whose first bytes, `first`, have
// already been read from it (the start of the HTTP request). kUnavailable when the request is
// not a valid upgrade (Beast answers it with an HTTP error first).
Result<std::unique_ptr<ByteStream>> ws_accept(std::unique_ptr<ByteStream> tcp, std::span<const uint8_t> first,
                                              Deadline deadline, const WsOptions& ws = {});

// Reads the first bytes of an accepted TCP stream: an HTTP upgrade is completed (ws_accept),
// anything else is returned as a stream that yields those bytes again before the rest. A peer
// that closes before sending a byte (a round-trip probe, a health check) is kUnavailable with
// the message kClosedBeforeAByte.
inline constexpr std::string_view kClosedBeforeAByte = "closed before sending a byte";
Result<std::unique_ptr<ByteStream>> accept_tcp_or_websocket(std::unique_ptr<ByteStream> tcp, Deadline deadline,
                                                            const WsOptions& ws = {});

// A stream that yields `prefix` before reading from `inner`.
std::unique_ptr<ByteStream> with_prefix(std::unique_ptr<ByteStream> inner, std::vector<uint8_t> prefix);

// True for a ByteStream made by ws_connect/ws_accept.
bool is_websocket(const ByteStream& s);

}  // namespace moesh::net
