// PyTorch's caching allocator in a probed program's trace (python/zerotrace/hooks/torch_memory.py,
// zt/db/torch_snapshot.h): a training loop (tests/probe/torch_loop.py) under `zt probe` on a GPU.
// At each of its marks the trace's allocated and reserved (PyTorch's block and segment rows alive
// at the NVTX mark) equal what the program read from torch.cuda.memory_allocated() and
// memory_reserved(); the planted leak is three 16 MiB blocks named by their Python line; the
// out-of-memory error at the end keeps them alive in the trace and zt check names them.
// Label gpu: skips cleanly without torch or without a CUDA device. Python: $ZT_TEST_PYTHON, else
// python3 on PATH.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "../test_util.h"
#include "probe_run_util.h"

using namespace zt::test;

namespace {

std::string python() {
  const char* p = std::getenv("ZT_TEST_PYTHON");
  return p && *p ? p : "python3";
}

// The line of torch_loop.py that keeps a tensor each epoch.
int leak_line(const std::string& script) {
  std::ifstream f(script);
  std::string line;
  for (int n = 1; std::getline(f, line); ++n)
    if (line.find("# LEAK") != std::string::npos) return n;
  return -1;
}

}  // namespace

TEST(TorchGpu, BlocksMatchTorchAtEveryMarkAndTheOomKeepsTheLeak) {
  auto probe = run_command(python() + " -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)' 2>&1");
  if (probe.code != 0) GTEST_SKIP() << "no PyTorch with CUDA here (" << python() << "): " << probe.out;
  TempDir dir;
  const std::string script = std::string(ZT_SOURCE_DIR) + "/tests/probe/torch_loop.py";
  const std::string out = dir.file("torch.db"), marks = dir.file("marks.txt");
  auto which = run_command("command -v " + python());
  std::string py = which.out.substr(0, which.out.find('\n'));
  RunResult r = run_program({ZT_EXE, "probe", "-o", out, "--", py, script, marks, "--oom"}, {{"LD_PRELOAD", nullptr}});
  // The program dies of torch.OutOfMemoryError: exit code 1.
  ASSERT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("OutOfMemoryError"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("PyTorch's allocator history added"), std::string::npos) << r.err;
  std::cout << r.err.substr(r.err.rfind("zt probe:") == std::string::npos ? 0 : r.err.find("zt probe:")) << "\n";

  // Every mark: the trace's figures at the NVTX mark equal the program's own.
  std::ifstream f(marks);
  std::string line;
  int compared = 0;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string a, b;
    int64_t allocated = 0, reserved = 0;
    in >> a >> b >> allocated >> reserved;
    const std::string name = a + " " + b;
    const int64_t t = sql_int(out, "SELECT m.t_start FROM marker m JOIN string s ON s.id = m.name_id WHERE s.text = '" +
                                       name + "' ORDER BY m.t_start LIMIT 1");
    ASSERT_GT(t, 0) << "no NVTX mark " << name << " in the trace";
    const std::string alive = " AND t_alloc <= " + std::to_string(t) + " AND (t_free IS NULL OR t_free > " +
                              std::to_string(t) + ")";
    EXPECT_EQ(sql_int(out, "SELECT coalesce(sum(bytes), 0) FROM allocation WHERE source = 4 AND level = 0" + alive),
              allocated)
        << name;
    EXPECT_EQ(sql_int(out, "SELECT coalesce(sum(bytes), 0) FROM allocation WHERE source = 4 AND level = 1" + alive),
              reserved)
        << name;
    ++compared;
  }
  EXPECT_EQ(compared, 11);

  // PyTorch's segments are CUPTI's cudaMallocs seen again (second records); what CUPTI saw beside
  // them (cuBLAS's workspaces, ...) stays outside.
  const int64_t torch_segments = sql_int(out, "SELECT count(*) FROM allocation WHERE source = 4 AND level = 1");
  const int64_t paired = sql_int(out, "SELECT count(*) FROM allocation c JOIN allocation t ON t.id = c.segment_id "
                                      "WHERE c.source = 1 AND c.level = 1 AND t.source = 4");
  EXPECT_GT(torch_segments, 0);
  EXPECT_EQ(paired, torch_segments);
  std::cout << "torch segments " << torch_segments << ", paired with CUPTI " << paired << ", CUPTI segments outside "
            << sql_int(out, "SELECT count(*) FROM allocation WHERE source = 1 AND level = 1 AND segment_id IS NULL AND "
                            "memory_kind = 1")
            << "\n";

  // The leak: three 16 MiB blocks from its line, alive to the end.
  const int line_no = leak_line(script);
  ASSERT_GT(line_no, 0);
  const std::string leak = "torch_loop.py:" + std::to_string(line_no) + " ";
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation a JOIN string s ON s.id = a.name_id WHERE a.source = 4 AND "
                         "a.level = 0 AND a.bytes = 16777216 AND a.t_free IS NULL AND s.text LIKE '" + leak + "%'"),
            3);
  // The OOM: an error row of PyTorch's history, the leaked blocks alive at it, named by zt check.
  const int64_t t_oom =
      sql_int(out, "SELECT t FROM error WHERE kind = 'oom' AND site = 'torch.cuda caching allocator' LIMIT 1");
  ASSERT_GT(t_oom, 0);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation a JOIN string s ON s.id = a.name_id WHERE a.level = 0 AND "
                         "a.t_alloc <= " + std::to_string(t_oom) + " AND (a.t_free IS NULL OR a.t_free > " +
                         std::to_string(t_oom) + ") AND s.text LIKE '" + leak + "%'"),
            3);
  auto check = run_command(std::string(ZT_EXE) + " check " + out + " --run 2>&1");
  EXPECT_EQ(check.code, 1) << check.out;
  EXPECT_NE(check.out.find(leak), std::string::npos) << check.out;
  EXPECT_NE(check.out.find("16.00 MiB"), std::string::npos) << check.out;
  // Epochs from the NVTX ranges "epoch N" (zt probe's step rules): zt check --leaks names the line.
  if (sql_int(out, "SELECT count(*) FROM marker WHERE kind = 2") >= 3) {
    auto leaks = run_command(std::string(ZT_EXE) + " check " + out + " --leaks 2>&1");
    EXPECT_EQ(leaks.code, 1) << leaks.out;
    EXPECT_NE(leaks.out.find(leak), std::string::npos) << leaks.out;
  } else {
    std::cout << "no epoch markers in this trace: zt check --leaks not asked\n";
  }
}
