// Shared gtest main: quiet logging so test output stays readable, and skips that ctest can see.
//
// A test that cannot run here (the llama.cpp reference folder or an npm package is absent)
// calls GTEST_SKIP with the reason. When no test failed but at least one was skipped, the
// executable exits with kSkipExit, which ctest's SKIP_RETURN_CODE turns into "Skipped" in its
// summary — never "Passed" for work that did not run. A failure always wins (exit 1).
//
// Temporary files: every test executable gets a directory of its own under $TMPDIR (or /tmp),
// made the TMPDIR of this process and of every process it starts, so models, slices, keys and
// certificates the tests write land there; it is removed at the end when every test passed, and
// kept (its path printed) when one failed, for a look at what it left.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace {
constexpr int kSkipExit = 77;  // tests/CMakeLists.txt: SKIP_RETURN_CODE
}

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  ::testing::InitGoogleTest(&argc, argv);
  const char* parent = std::getenv("TMPDIR");
  std::string tmpl = std::string(parent != nullptr && *parent != '\0' ? parent : "/tmp") + "/moesh-test-XXXXXX";
  const char* dir = ::mkdtemp(tmpl.data());
  if (dir != nullptr) ::setenv("TMPDIR", dir, 1);
  const int rc = RUN_ALL_TESTS();
  if (dir != nullptr) {
    std::error_code ec;
    if (rc == 0) {
      std::filesystem::remove_all(dir, ec);
    } else {
      std::fprintf(stderr, "temporary files of this run kept in %s\n", dir);
    }
  }
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  if (rc == 0 && u.skipped_test_count() > 0) {
    std::fprintf(stderr, "SKIPPED: %d of %d tests did not run here (reasons above); the other %d passed\n",
                 u.skipped_test_count(), u.test_to_run_count(), u.successful_test_count());
    return kSkipExit;
  }
  return rc;
}
