// Where a worker listens, as the CLI names it (--worker HOST:PORT, --workers FILE).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "moesh/util/status.h"

namespace moesh {

struct WorkerAddress {
  std::string host;  // numeric IPv4/IPv6 or a name (IPv6 written "[::1]:port")
  uint16_t port = 0;
  std::string to_string() const;
};

// "host:port" or "[v6addr]:port"; port 1..65535.
Result<WorkerAddress> parse_worker_address(std::string_view s);
// One HOST:PORT per line; blank lines and '#' comments (whole-line or trailing) are ignored.
// Errors name the file and line.
Result<std::vector<WorkerAddress>> read_workers_file(const std::string& path);

}  // namespace moesh
