// The probe on a real CUDA program (tests/probe/cuda_workload.cu), through `zt probe`: the
// trace holds exactly the program's allocations, copies, memsets, kernels and NVTX ranges.
// Label gpu: it skips cleanly where there is no driver or no device.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include "../test_util.h"
#include "probe_run_util.h"

using namespace zt::test;

namespace {
// A driver with at least one device, asked directly (no CUDA runtime linked here).
bool have_gpu(std::string* why) {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!h) {
    *why = "no CUDA driver (libcuda.so.1 not found)";
    return false;
  }
  auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(h, "cuInit"));
  auto count = reinterpret_cast<int (*)(int*)>(dlsym(h, "cuDeviceGetCount"));
  int n = 0;
  if (!init || !count || init(0) != 0 || count(&n) != 0 || n == 0) {
    *why = "the CUDA driver sees no device";
    return false;
  }
  return true;
}
}  // namespace

TEST(ProbeGpu, CudaProgramCountsAndBytes) {
  std::string why;
  if (!have_gpu(&why)) GTEST_SKIP() << why;
  TempDir dir;
  std::string out = dir.file("cuda.db");
  RunResult r = run_program({ZT_EXE, "probe", "-o", out, "--", ZT_CUDA_WORKLOAD}, {{"LD_PRELOAD", nullptr}});
  if (r.code == 77) GTEST_SKIP() << "the workload found no CUDA device";
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("CUDA tracing was off"), std::string::npos) << r.err;
  auto n = [&](const std::string& q) { return sql_int(out, q); };
  EXPECT_EQ(n("SELECT count(*) FROM error WHERE kind LIKE 'cuda_tracing%'"), 0);
  EXPECT_EQ(n("SELECT coalesce(sum(events), 0) FROM dropped"), 0);

  // Allocations (CUPTI rows): device segments 1, 2, 4 MiB with zt_cuda_allocate in the stack;
  // pinned 1 + 2 MiB on the cpu device; managed 1 MiB; a 256 KiB pool block. All freed.
  const std::string cupti = "source = 'cupti' AND ";  // allocation_v names the source
  EXPECT_EQ(n("SELECT count(*) FROM allocation_v WHERE " + cupti +
              "memory_kind = 'device' AND level = 'segment' AND bytes IN (1048576, 2097152, 4194304)"),
            3);
  EXPECT_EQ(allocations_in(out, "zt_cuda_allocate", "source = 1 AND memory_kind = 1").size(), 3u);
  EXPECT_EQ(n("SELECT count(*) FROM allocation_v WHERE " + cupti +
              "memory_kind = 'pinned_host' AND device = 'cpu' AND bytes IN (1048576, 2097152)"),
            2);
  EXPECT_EQ(n("SELECT count(*) FROM allocation_v WHERE " + cupti + "memory_kind = 'managed' AND bytes = 1048576"), 1);
  EXPECT_EQ(n("SELECT count(*) FROM allocation_v WHERE " + cupti + "level = 'block' AND bytes = 262144"), 1);
  EXPECT_EQ(n("SELECT count(*) FROM allocation WHERE source = 1 AND t_free IS NULL AND bytes >= 262144"), 0);

  // Copies: one per direction and host memory kind, with their bytes.
  auto copies = [&](const char* kind, const char* pinned) {
    return sql(out, std::string("SELECT count(*), coalesce(sum(bytes), 0) FROM transfer_v WHERE source = 'cupti' AND "
                                "kind = '") + kind + "' AND " + pinned);
  };
  EXPECT_EQ(copies("H2D", "pinned = 0"), (std::vector<std::vector<std::string>>{{"1", "1048576"}}));
  EXPECT_EQ(copies("H2D", "pinned = 1"), (std::vector<std::vector<std::string>>{{"1", "1048576"}}));
  EXPECT_EQ(copies("D2H", "pinned = 0"), (std::vector<std::vector<std::string>>{{"1", "1048576"}}));
  EXPECT_EQ(copies("D2H", "pinned = 1"), (std::vector<std::vector<std::string>>{{"1", "2097152"}}));
  EXPECT_EQ(copies("D2D", "1"), (std::vector<std::vector<std::string>>{{"1", "524288"}}));
  EXPECT_EQ(n("SELECT count(*) FROM transfer WHERE source = 1 AND correlation_id IS NULL"), 0);

  // Memsets and kernels.
  EXPECT_EQ(n("SELECT count(*) FROM kernel_v WHERE name = 'memset 1048576 B'"), 1);
  EXPECT_EQ(n("SELECT count(*) FROM kernel_v WHERE name = 'memset 2097152 B'"), 1);
  EXPECT_EQ(n("SELECT count(*) FROM kernel k JOIN string s ON s.id = k.name_id WHERE s.text LIKE 'zt_scale%' AND "
              "k.grid = '256,1,1' AND k.block = '256,1,1'"),
            3);

  // NVTX ranges and the mark.
  EXPECT_EQ(n("SELECT count(*) FROM marker_v WHERE name = 'zt_phase_copies' AND t_end > t_start"), 1);
  EXPECT_EQ(n("SELECT count(*) FROM marker_v WHERE name = 'zt_phase_compute' AND t_end > t_start"), 1);
  EXPECT_EQ(n("SELECT count(*) FROM marker_v WHERE name = 'zt_mark'"), 1);

  // The runtime API rows join the copies by correlation id; CUPTI times are on our clock.
  EXPECT_EQ(n("SELECT count(*) FROM transfer t JOIN marker m ON m.value = t.correlation_id WHERE t.source = 1"), 5);
  EXPECT_EQ(n("SELECT count(*) FROM transfer t, run r WHERE t.source = 1 AND (t.t_start < r.t_start OR "
              "t.t_start > r.t_end)"),
            0);
}
