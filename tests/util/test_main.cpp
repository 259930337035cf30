// Shared gtest main: quiet logging so test output stays readable, and skips that ctest can see.
//
// A test that cannot run here (the llama.cpp reference folder or an npm package is absent)
// calls GTEST_SKIP with the reason. When no test failed but at least one was skipped, the
// executable exits with kSkipExit, which ctest's SKIP_RETURN_CODE turns into "Skipped" in its
// summary — never "Passed" for work that did not run. A failure always wins (exit 1).
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

namespace {
constexpr int kSkipExit = 77;  // tests/CMakeLists.txt: SKIP_RETURN_CODE
}

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  if (rc == 0 && u.skipped_test_count() > 0) {
    std::fprintf(stderr, "SKIPPED: %d of %d tests did not run here (reasons above); the other %d passed\n",
                 u.skipped_test_count(), u.test_to_run_count(), u.successful_test_count());
    return kSkipExit;
  }
  return rc;
}
