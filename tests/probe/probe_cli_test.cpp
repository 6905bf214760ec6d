// `zt probe` as a user meets it: the trace, the exit code passed through, clear usage errors.
#include <gtest/gtest.h>

#include <filesystem>

#include "../test_util.h"
#include "probe_run_util.h"

using namespace zt::test;

namespace {
RunResult zt_probe(const std::vector<std::string>& args) {
  std::vector<std::string> argv{ZT_EXE, "probe"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_program(argv, {{"LD_PRELOAD", nullptr}, {"OMP_WAIT_POLICY", "passive"}});
}
}  // namespace

TEST(ProbeCommand, TrueIsRecordedAndCudaOffIsSaidOnce) {
  TempDir dir;
  std::string out = dir.file("true.db");
  RunResult r = zt_probe({"-o", out, "--", "/bin/true"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("trace written to " + out), std::string::npos) << r.err;
  // No GPU, or not a CUDA program: one line says so, and the trace says it too.
  size_t first = r.err.find("CUDA tracing was off");
  ASSERT_NE(first, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("CUDA tracing was off", first + 1), std::string::npos) << r.err;
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM error WHERE kind = 'cuda_tracing_off'"), 1);
  EXPECT_EQ(sql_int(out, "SELECT exit_code FROM run"), 0);
  EXPECT_EQ(sql_int(out, "SELECT status FROM run"), 1);
  auto cmd = sql(out, "SELECT command_line FROM run");
  ASSERT_FALSE(cmd.empty());
  EXPECT_EQ(cmd[0][0], "/bin/true");
}

TEST(ProbeCommand, ExitCodeIsPassedThroughAndWrittenToTheRun) {
  TempDir dir;
  std::string out = dir.file("fail.db");
  RunResult r = zt_probe({"-o", out, "--", "/bin/sh", "-c", "exit 3"});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_EQ(sql_int(out, "SELECT exit_code FROM run"), 3);
  EXPECT_EQ(sql_int(out, "SELECT status FROM run"), 2);  // failed
  EXPECT_FALSE(std::filesystem::exists(out + "-wal"));
  EXPECT_EQ(zt_probe({"-o", dir.file("false.db"), "--", "false"}).code, 1);
}

TEST(ProbeCommand, KilledBySignalIs128PlusSignal) {
  TempDir dir;
  std::string out = dir.file("killed.db");
  RunResult r = zt_probe({"-o", out, "--", "/bin/sh", "-c", "kill -TERM $$"});
  EXPECT_EQ(r.code, 128 + 15) << r.err;
  EXPECT_EQ(sql_int(out, "SELECT exit_code FROM run"), 143);
  EXPECT_EQ(sql_int(out, "SELECT status FROM run"), 3);  // signal
}

TEST(ProbeCommand, MissingCommandIsAUsageError) {
  TempDir dir;
  RunResult r = zt_probe({"-o", dir.file("x.db"), "--", "/no/such/program"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("/no/such/program: command not found"), std::string::npos) << r.err;
  r = zt_probe({"-o", dir.file("x.db"), "--", "zt-no-such-command-anywhere"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("command not found"), std::string::npos) << r.err;
  r = zt_probe({"-o", dir.file("x.db")});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("no command given"), std::string::npos) << r.err;
  r = zt_probe({"-o", "/no/such/dir/x.db", "--", "/bin/true"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
  r = zt_probe({"--host-threshold", "lots", "--", "/bin/true"});
  EXPECT_EQ(r.code, 2);
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.db")));
}

TEST(ProbeCommand, RecordsAProgramsLeaksWithStacks) {
  TempDir dir;
  std::string out = dir.file("leak.db");
  RunResult r = zt_probe({"-o", out, "--host-threshold", "1MiB", "--", ZT_PROBE_WORKLOAD, "leak", "4",
                          std::to_string(2 << 20)});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(allocations_in(out, "zt_test_leak_buffers", "t_free IS NULL").size(), 4u);
  EXPECT_NE(r.err.find("5 live at exit"), std::string::npos) << r.err;  // 4 + the one before main

  std::string plain = dir.file("plain.db");
  r = zt_probe({"-o", plain, "--no-stacks", "--", ZT_PROBE_WORKLOAD, "leak", "4", std::to_string(2 << 20)});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(sql_int(plain, "SELECT count(*) FROM allocation WHERE t_free IS NULL"), 5);
  EXPECT_EQ(sql_int(plain, "SELECT count(*) FROM allocation WHERE stack_id IS NOT NULL"), 0);
}
