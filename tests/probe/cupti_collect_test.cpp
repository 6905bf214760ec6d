// The CUPTI collector linked into a program (as in `zt train --cupti`), on any machine: start()
// answers with a reason when it cannot trace (here: no driver) and leaves nothing behind, stop()
// is idempotent, a process starts once, and the recorder closes cleanly afterwards. Plus the
// guard the collector shares with the host hooks (interpose/guard.h).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <thread>

#include "../test_util.h"
#include "interpose/guard.h"
#include "probe_run_util.h"
#include "zt/probe/cupti_collector.h"

using namespace zt;
using namespace zt::probe;

namespace {
bool driver_loadable() {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h) dlclose(h);
  return h != nullptr;
}
}  // namespace

TEST(CuptiCollect, StartSaysWhyOrRunsAndStopIsIdempotent) {
  test::TempDir dir;
  const std::string path = dir.file("c.db");
  std::unique_ptr<Recorder> rec;
  RecorderOptions o;
  o.path = path;
  o.command_line = "cupti_collect_test";
  ASSERT_TRUE(Recorder::open(o, &rec).ok());
  rec->add_rank(0, 1);
  cupti::CollectorOptions co;
  co.recorder = rec.get();
  co.host_device = rec->add_device(0, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false);

  cupti::stop();  // before any start: nothing to do
  const std::string why = cupti::start(co);
  if (!driver_loadable()) {
    // No driver: CUPTI itself only says "unknown"; the reason names the driver.
    ASSERT_FALSE(why.empty());
    EXPECT_NE(why.find("no CUDA driver"), std::string::npos) << why;
    EXPECT_NE(why.find("libcuda.so.1"), std::string::npos) << why;
    // A failed start left nothing behind: it may be tried again, and says the same.
    EXPECT_EQ(cupti::start(co), why);
  } else if (why.empty()) {
    cupti::stop();
    EXPECT_NE(cupti::start(co).find("starts once"), std::string::npos);
  }
  cupti::stop();
  cupti::stop();
  ASSERT_TRUE(rec->close().ok());
  rec.reset();
  // Nothing refers to the destroyed recorder: a late stop (atexit's) is still harmless.
  cupti::stop();
  EXPECT_EQ(test::sql_int(path, "SELECT count(*) FROM run WHERE status = 1"), 1);
  if (!driver_loadable()) {
    EXPECT_EQ(test::sql_int(path, "SELECT count(*) FROM allocation"), 0);
  }
}

TEST(CuptiCollect, StartWithoutARecorderIsRefused) {
  EXPECT_EQ(cupti::start(cupti::CollectorOptions{}), "no trace to record into");
}

TEST(CuptiCollect, GuardMarksAndRestoresTheThread) {
  using namespace zt::probe::interpose;
  std::thread([] {
    EXPECT_EQ(t_state, kUnknown);
    {
      ScopedGuard a;
      EXPECT_EQ(t_state, kUnknown | kGuardBit);
      {
        ScopedGuard b;
        EXPECT_EQ(t_state, kUnknown | kGuardBit);
      }
      EXPECT_EQ(t_state, kUnknown | kGuardBit);
    }
    EXPECT_EQ(t_state, kUnknown);
    t_state = kApp;
    {
      ScopedGuard g;
      EXPECT_EQ(t_state, kApp | kGuardBit);
    }
    EXPECT_EQ(t_state, kApp);
    mark_probe_thread();
    EXPECT_EQ(t_state, kProbeThread);
  }).join();
  std::thread([] { EXPECT_EQ(t_state, kUnknown); }).join();  // per thread
}
