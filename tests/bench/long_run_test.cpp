// bench/long_run's own code path on a short day (issue 39): 48 steps of the DeepSpeed fixture's event
// mix through the Recorder under a 4 MiB cap, so the trace is mixed (detail, then aggregates only),
// the leak is found at its line from the aggregates, and the last line says so. Its figures are not
// checked (benchmarks never fail on a number); what it says is.
#include <gtest/gtest.h>

#include <regex>

#include "../test_util.h"

TEST(LongRun, AShortDayEndsWithTheLeakFoundAndDetailForSomeSteps) {
  zt::test::TempDir dir;
  const std::string trace = dir.file("day.db");
  zt::test::CommandResult r = zt::test::run_command(std::string(ZT_BINARY_DIR) + "/bench/long_run --steps 48 --epochs 4 " +
                                                    "--max-trace 4194304 --trace " + trace + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  std::smatch m;
  const std::regex last(
      "synthetic day: 48 steps, trace ([0-9]+) MiB, leak found at Trainer\\.on_epoch_begin \\(train\\.py:412\\), "
      "detail steps ([0-9]+), info ([0-9.]+) s\\n$");
  ASSERT_TRUE(std::regex_search(r.out, m, last)) << r.out;
  const int detail = std::stoi(m[2]);
  EXPECT_GT(detail, 0) << r.out;
  EXPECT_LT(detail, 48) << "the 4 MiB cap should stop the detail: " << r.out;
  EXPECT_LE(std::stoi(m[1]), 5) << r.out;
  EXPECT_NE(r.out.find("recorded "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("leak check (exit 1)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("viewer first frame: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("steps with detail: " + std::to_string(detail) + " of 48"), std::string::npos) << r.out;
}

// Options are read strictly: a bad one is one line and exit 2, nothing recorded.
TEST(LongRun, ABadOptionIsRefused) {
  zt::test::CommandResult r = zt::test::run_command(std::string(ZT_BINARY_DIR) + "/bench/long_run --steps many 2>&1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--steps 'many'"), std::string::npos) << r.out;
}
