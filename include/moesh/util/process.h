// Facts about the running process that commands report (e.g. `moesh worker` prints how much of
// its memory the mapped expert slabs account for).
#pragma once

#include <cstdint>

namespace moesh {

// Resident set size of this process in bytes (/proc/self/statm), 0 if unavailable.
uint64_t resident_bytes();

}  // namespace moesh
