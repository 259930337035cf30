// Where a worker listens, as the CLI names it (--worker HOST:PORT, --workers FILE).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "moesh/util/status.h"

namespace moesh {

// How the backbone reaches a worker (docs/operations.md):
//   direct — it dials HOST:PORT;
//   joined — the worker dialled in to this backbone's --accept-workers port (`moesh worker
//            --join`), so it is known by the name it announced: "join://NAME";
//   relay  — through a relay the worker dialled out to: "relay://HOST:PORT/NAME".
enum class WorkerPath : uint8_t { kDirect = 0, kJoined, kRelay };
const char* worker_path_name(WorkerPath p);  // "direct", "joined", "relay"

struct WorkerAddress {
  std::string host;  // numeric IPv4/IPv6 or a name (IPv6 written "[::1]:port"); the relay's for kRelay
  uint16_t port = 0;
  std::string name;  // kJoined, kRelay: the worker's announced name
  WorkerPath path = WorkerPath::kDirect;
  // Other paths to the same worker, in order of preference after this one ("A|B": direct when
  // reachable, relayed otherwise). connect_worker tries every path, uses the first that works and
  // reports what each measured (WorkerLink::probes).
  std::vector<WorkerAddress> alternatives;
  // Over WebSocket (net/websocket.h) instead of plain TCP: "ws://HOST:PORT" to a worker's port,
  // "relay+ws://HOST:PORT/NAME" to a relay (both accept either on the same port).
  bool websocket = false;
  std::string to_string() const;  // this path only
};

// "host:port" or "[v6addr]:port" (port 1..65535), "join://NAME", or "relay://HOST:PORT/NAME";
// several of them joined by '|' are alternative paths to one worker, the first preferred.
// A NAME is 1..64 characters of [A-Za-z0-9._@:-].
Result<WorkerAddress> parse_worker_address(std::string_view s);
// A HOST:PORT to listen on: port 0 (any free port) allowed.
Result<WorkerAddress> parse_listen_address(std::string_view s);
// One HOST:PORT per line; blank lines and '#' comments (whole-line or trailing) are ignored.
// Errors name the file and line.
Result<std::vector<WorkerAddress>> read_workers_file(const std::string& path);

}  // namespace moesh
