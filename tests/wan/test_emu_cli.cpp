// `moesh wan-emu` argument checks and its refusal without root (runs everywhere: as root the
// refusal is checked in a child that drops to an unprivileged user first).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/run_moesh.h"

namespace moesh::wan {
namespace {

TEST(WanEmuCli, UsageErrorsExit2) {
  EXPECT_EQ(test::run_moesh("wan-emu").exit_code, 2) << "up or down is required";
  EXPECT_EQ(test::run_moesh("wan-emu up --peer a").exit_code, 2) << "--name is required";
  EXPECT_EQ(test::run_moesh("wan-emu up --name x").exit_code, 2) << "--peer is required";
  auto r = test::run_moesh("wan-emu up --name x --peer a:delay=5parsecs");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown duration unit"), std::string::npos) << r.err;
  r = test::run_moesh("wan-emu up --name bad-name --peer a");
  EXPECT_EQ(r.exit_code, 2);
  r = test::run_moesh("wan-emu up --name x --peer a --peer a");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("given twice"), std::string::npos) << r.err;
  EXPECT_EQ(test::run_moesh("wan-emu up --name x --peer hub").exit_code, 2);
  EXPECT_EQ(test::run_moesh("wan-emu down --name a/b").exit_code, 2);
}

TEST(WanEmuCli, RefusesWithoutRoot) {
  const std::string bin = std::string(MOESH_BIN_DIR) + "/moesh";
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(99);
    ::execl(bin.c_str(), bin.c_str(), "wan-emu", "up", "--name", "x", "--peer", "a:delay=1ms",
            static_cast<char*>(nullptr));
    ::_exit(98);
  }
  ::close(fds[1]);
  std::string err;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) err.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 98 || WEXITSTATUS(status) == 99) {
    GTEST_SKIP() << "could not run the binary as an unprivileged user (exit " << WEXITSTATUS(status) << ")";
  }
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_NE(err.find("needs root"), std::string::npos) << err;
  EXPECT_NE(err.find("wan-proxy"), std::string::npos) << "the message names the unprivileged alternative";
}

}  // namespace
}  // namespace moesh::wan
