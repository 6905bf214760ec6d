// `zt train --device cuda --cupti` on a real GPU: one trace holds the trainer's own rows (source
// api) and CUPTI's (source cupti: cudaMalloc segments, copies, kernels), written by the collector
// inside the trainer. Label gpu: skips, saying why, where cuda_available() is false. Whether the
// two kinds of rows are matched is the trace's finishing step's business (tested in db/).
#include <gtest/gtest.h>

#include "../test_util.h"
#include "cuda/runtime.h"
#include "probe_run_util.h"

using namespace zt::test;

TEST(TrainCuptiGpu, OneTraceHoldsTheTrainersRowsAndCuptis) {
  std::string why;
  if (!zt::cuda::cuda_available(&why)) GTEST_SKIP() << "no usable GPU: " << why;
  TempDir dir;
  const std::string out = dir.file("t.db");
  // timeout: a hang at start or stop must fail the test, not stall the suite.
  CommandResult r = run_command("env -u RANK -u WORLD_SIZE -u LOCAL_RANK timeout 600 " + std::string(ZT_EXE) +
                                " train --device cuda --cupti --model tiny --steps 2 --seq-len 32 -q --trace " + out +
                                " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("CUDA tracing (--cupti) is off"), std::string::npos) << r.out;
  auto n = [&](const std::string& q) { return sql_int(out, q); };
  EXPECT_EQ(n("SELECT count(*) FROM error WHERE kind LIKE 'cuda_tracing%'"), 0);
  EXPECT_EQ(n("SELECT coalesce(sum(events), 0) FROM dropped"), 0);
  EXPECT_EQ(n("SELECT count(*) FROM run WHERE status = 1"), 1);
  // The trainer's allocator rows and CUPTI's, side by side.
  EXPECT_GT(n("SELECT count(*) FROM allocation WHERE source = 0"), 0);
  EXPECT_GT(n("SELECT count(*) FROM allocation WHERE source = 1"), 0);
  EXPECT_GT(n("SELECT count(*) FROM allocation_v WHERE source = 'cupti' AND memory_kind = 'device'"), 0);
  EXPECT_GT(n("SELECT count(*) FROM kernel WHERE source = 1"), 0);
  EXPECT_GT(n("SELECT count(*) FROM transfer WHERE source = 1"), 0);
  // Every CUPTI row is rank 0's (the process's rank without a launcher).
  EXPECT_EQ(n("SELECT count(*) FROM allocation WHERE source = 1 AND rank != 0"), 0);
}
