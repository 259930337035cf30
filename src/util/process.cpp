#include "moesh/util/process.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>

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
