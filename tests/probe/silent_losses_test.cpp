// Issue 40's silent losses in the host recording path, on a real program under libzt_probe.so
// (tests/probe/edge_workload.cpp): the program's own signals never land on a probe thread, and a
// free the hooks did not see leaves neither a stale open row nor a silent guess.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "probe_run_util.h"

using namespace zt::test;

namespace {

RunResult run_probed(const std::string& out, const std::vector<std::string>& args) {
  std::vector<std::string> argv{ZT_EDGE_WORKLOAD};
  argv.insert(argv.end(), args.begin(), args.end());
  static std::string lib = probe_library();
  // The RSS sampler runs (every 10 ms), as does the recorder's writer: both are probe threads.
  return run_program(argv, {{"LD_PRELOAD", lib.c_str()},
                            {"ZT_PROBE_OUTPUT", out.c_str()},
                            {"ZT_PROBE_QUIET", "1"},
                            {"ZT_PROBE_RSS_MS", "10"}});
}

}  // namespace

// heaptrack's bug 378494: a process-directed signal meant for the program's sigwait thread was
// delivered to a probe thread that had it unblocked, and its default action killed the program.
TEST(SilentLosses, TheProgramsSignalsNeverLandOnAProbeThread) {
  TempDir dir;
  std::string out = dir.file("sigwait.db");
  RunResult r = run_probed(out, {"sigwait", "3000"});
  ASSERT_EQ(r.code, 0) << "killed by signal " << (r.code > 128 ? r.code - 128 : 0) << ": " << r.err;
  EXPECT_NE(r.err.find("received "), std::string::npos) << r.err;
  EXPECT_EQ(sql_int(out, "SELECT status FROM run"), 1) << "the run ended normally";
}

// An address allocated again while its row is open (its free went past the hooks): the older row
// was replaced in the live table and stayed open for ever, a leak that never was. It is closed
// when the address comes back, and the guess is counted in `dropped`.
TEST(SilentLosses, AFreeTheHooksDidNotSeeIsClosedAndCounted) {
  TempDir dir;
  std::string out = dir.file("unseen.db");
  RunResult r = run_probed(out, {"unseen-free"});
  if (r.code == 5) GTEST_SKIP() << "the kernel gave the mapping another address: " << r.err;
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string mine = "requested_bytes = " + std::to_string((2 << 20) + 4096);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE " + mine), 2);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE " + mine + " AND t_free IS NULL"), 0)
      << "the row whose free was not seen stayed open";
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation a JOIN allocation b ON b." + mine + " AND b.id > a.id"
                         " WHERE a." + mine + " AND a.t_free = b.t_alloc"), 1)
      << "closed when its address came back";
  EXPECT_EQ(sql_int(out, "SELECT sum(events) FROM dropped WHERE reason LIKE 'host frees not seen%'"), 1);
}
