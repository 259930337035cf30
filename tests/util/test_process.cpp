// util/process.h: keep_freed_memory makes a large free stay in the heap for the next request
// (no trim, no own mapping), which is what spares every trip its page faults.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "moesh/util/process.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define MOESH_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOESH_TEST_ASAN 1
#endif
#endif

namespace moesh {
namespace {

TEST(Process, ResidentBytesIsReported) {
  EXPECT_GT(resident_bytes(), 0u);
}

// The machine's memory as /proc/meminfo (and a cgroup limit) give it: both known on Linux, what
// is available within the total, the total at least what this process has resident.
TEST(Process, SystemMemoryIsReported) {
  const SystemMemory m = system_memory();
  EXPECT_GT(m.total_bytes, 0u);
  EXPECT_GT(m.available_bytes, 0u);
  EXPECT_LE(m.available_bytes, m.total_bytes);
  EXPECT_GE(m.total_bytes, resident_bytes());
}

TEST(Process, FreedMemoryIsKeptForReuse) {
#if !defined(__GLIBC__) || defined(MOESH_TEST_ASAN)
  GTEST_SKIP() << "SKIPPED: glibc's malloc is not the allocator here";
#else
  const char* t = std::getenv("GLIBC_TUNABLES");
  if (t != nullptr && std::strstr(t, "glibc.malloc.") != nullptr)
    GTEST_SKIP() << "SKIPPED: GLIBC_TUNABLES sets malloc options";
  constexpr size_t kBlock = size_t{8} << 20;  // above glibc's default mmap and trim thresholds
  keep_freed_memory(size_t{64} << 20, size_t{32} << 20);
  const struct mallinfo2 before = mallinfo2();
  void* p = std::malloc(kBlock);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, kBlock);
  const struct mallinfo2 held = mallinfo2();
  EXPECT_EQ(held.hblkhd, before.hblkhd) << "an 8 MiB block got its own mapping";
  std::free(p);
  const struct mallinfo2 after = mallinfo2();
  EXPECT_GE(after.fordblks, kBlock) << "the freed 8 MiB went back to the kernel";
  // The next request of that size is served from what was kept: the heap does not grow.
  void* q = std::malloc(kBlock);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(mallinfo2().arena, after.arena);
  std::free(q);
#endif
}

}  // namespace
}  // namespace moesh
