#include "moesh/util/process.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace moesh {

uint64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

namespace {
// A cgroup v2 file holding one number ("max" or unreadable: 0).
uint64_t cgroup_value(const char* path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s) || s == "max") return 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  return end != nullptr && *end == '\0' ? static_cast<uint64_t>(v) : 0;
}
}  // namespace

SystemMemory system_memory() {
  SystemMemory m;
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemTotal:") m.total_bytes = kb * 1024;
    if (key == "MemAvailable:") m.available_bytes = kb * 1024;
  }
  const uint64_t limit = cgroup_value("/sys/fs/cgroup/memory.max");
  if (limit > 0) {
    const uint64_t used = cgroup_value("/sys/fs/cgroup/memory.current");
    if (m.total_bytes == 0 || limit < m.total_bytes) m.total_bytes = limit;
    const uint64_t room = limit > used ? limit - used : 0;
    if (m.available_bytes == 0 || room < m.available_bytes) m.available_bytes = room;
  }
  return m;
}

void keep_freed_memory(size_t trim_bytes, size_t mmap_bytes) {
#if defined(__GLIBC__)
  const char* t = std::getenv("GLIBC_TUNABLES");
  if (t != nullptr && std::strstr(t, "glibc.malloc.") != nullptr) return;
  auto clamp = [](size_t v) { return static_cast<int>(v > size_t{INT_MAX} ? size_t{INT_MAX} : v); };
  // Setting either disables glibc's dynamic thresholds, which is the point: they stay put.
  (void)mallopt(M_MMAP_THRESHOLD, clamp(mmap_bytes));
  (void)mallopt(M_TRIM_THRESHOLD, clamp(trim_bytes));
#else
  (void)trim_bytes;
  (void)mmap_bytes;
#endif
}

}  // namespace moesh
