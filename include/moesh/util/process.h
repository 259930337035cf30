// Facts about the running process that commands report (e.g. `moesh worker` prints how much of
// its memory the mapped expert slabs account for).
#pragma once

#include <cstddef>
#include <cstdint>

namespace moesh {

// Resident set size of this process in bytes (/proc/self/statm), 0 if unavailable.
uint64_t resident_bytes();

// The machine's memory as this process may use it: MemTotal and MemAvailable (/proc/meminfo),
// each lowered to the cgroup's limit (cgroup v2 memory.max, less memory.current for what is
// available) when a container sets one. 0 where unknown.
struct SystemMemory {
  uint64_t total_bytes = 0;
  uint64_t available_bytes = 0;
};
SystemMemory system_memory();

// Makes glibc's malloc keep freed memory for reuse instead of handing it back to the kernel after
// every large free (trimming the heap top above 128 KiB, unmapping chunks above its mmap
// threshold). Why: every request of a worker or backbone allocates and frees its frame, row and
// combine buffers (64 KiB per MoE call of a 30B-A3B-shaped decode step); with trimming each one
// came back as fresh pages, i.e. a page fault per 4 KiB on every trip, and in a virtual machine
// a fault is expensive — measured 0.45 -> 0.19 ms per loopback trip beyond compute
// (docs/PERFORMANCE.md). Kept at most `trim_bytes` at the heap top; blocks from `mmap_bytes` up
// still get their own mapping. Does nothing when GLIBC_TUNABLES sets malloc options (the
// operator's choice wins) or without glibc.
void keep_freed_memory(size_t trim_bytes = size_t{64} << 20, size_t mmap_bytes = size_t{32} << 20);

}  // namespace moesh
