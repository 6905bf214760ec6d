// The zerotrace Python hook for PyTorch (python/zerotrace/hooks/torch_memory.py) and zt probe's
// merge of its history (cli/probe_torch.cpp), without a GPU: a stand-in torch package
// (tests/probe/fake_torch: _lazy_init, the history switch, _snapshot, the OOM observer over a toy
// allocator that keeps PyTorch's history format) under a real `zt probe` of a real Python.
// The GPU test with real PyTorch is tests/probe/torch_gpu_test.cpp.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "../test_util.h"
#include "probe_run_util.h"

using namespace zt::test;

namespace {

const char* kPython = "/usr/bin/python3";  // Debian's, as the other Python tests of zt probe
const std::string kProg = std::string(ZT_SOURCE_DIR) + "/tests/probe/torch_fake_prog.py";
const std::string kFakeTorch = std::string(ZT_SOURCE_DIR) + "/tests/probe/fake_torch";

int keep_line() {
  std::ifstream f(kProg);
  std::string line;
  for (int n = 1; std::getline(f, line); ++n)
    if (line.find("# KEEP") != std::string::npos) return n;
  return -1;
}

// Histories left beside the trace (zt probe removes each one it added).
int pickles_in(const std::string& dir) {
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().find(".torch.pid") != std::string::npos) ++n;
  return n;
}

RunResult probe(const std::string& out, const std::vector<std::string>& args,
                std::map<std::string, const char*> env = {}) {
  std::vector<std::string> argv = {ZT_EXE, "probe", "-o", out, "--", kPython, kProg};
  argv.insert(argv.end(), args.begin(), args.end());
  env["LD_PRELOAD"] = nullptr;
  env["PYTHONPATH"] = kFakeTorch.c_str();
  return run_program(argv, env);
}

}  // namespace

TEST(TorchHook, HistoryIsOnBeforeTheFirstAllocationAndLandsInTheTrace) {
  if (::access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " is not installed";
  TempDir dir;
  const std::string out = dir.file("t.db");
  RunResult r = probe(out, {});
  // The stand-in allocator raises when the history is off at its first allocation.
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("PyTorch's allocator history added: 6 blocks in 1 segment on 1 device"), std::string::npos)
      << r.err;
  EXPECT_EQ(pickles_in(dir.path()), 0);
  const std::string kept = "torch_fake_prog.py:" + std::to_string(keep_line()) + " step";
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation_v WHERE source = 'torch' AND level = 'block' AND name = '" +
                             kept + "' AND t_free IS NULL AND bytes = 3145728"),
            3);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE source = 4 AND level = 0 AND t_free IS NOT NULL"), 3);
  // On the probe's clock: inside the run, after it started.
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation a, run WHERE a.source = 4 AND (a.t_alloc < run.t_start OR "
                         "a.t_alloc > run.t_end)"),
            0);
  // The stack: the program's lines, innermost first.
  auto stack = sql(out, "SELECT stack_id FROM allocation_v WHERE name = '" + kept + "' LIMIT 1");
  ASSERT_EQ(stack.size(), 1u);
  std::unique_ptr<zt::db::TraceReader> reader;
  ASSERT_TRUE(zt::db::TraceReader::open(out, &reader).ok());
  std::vector<std::string> lines;
  ASSERT_TRUE(reader->stack_text(std::stoll(stack[0][0]), &lines).ok());
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("step (", 0), 0u) << lines[0];  // "function (file.py:LINE)", as the probe's own frames
  EXPECT_NE(lines[0].find("torch_fake_prog.py:" + std::to_string(keep_line()) + ")"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("<module>"), std::string::npos) << lines[1];
}

TEST(TorchHook, AnOomSnapshotOutlivesAProcessThatSkipsItsExitHandlers) {
  if (::access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " is not installed";
  TempDir dir;
  const std::string out = dir.file("t.db");
  RunResult r = probe(out, {"--oom-then-exit"});
  ASSERT_EQ(r.code, 3) << r.err;
  EXPECT_NE(r.err.find("1 out-of-memory error"), std::string::npos) << r.err;
  const int64_t t = sql_int(out, "SELECT t FROM error WHERE kind = 'oom' AND site = 'torch.cuda caching allocator'");
  ASSERT_GT(t, 0);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE source = 4 AND level = 0 AND bytes = 3145728 AND "
                         "t_alloc <= " + std::to_string(t) + " AND t_free IS NULL"),
            3);
}

TEST(TorchHook, OffWhenAsked) {
  if (::access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " is not installed";
  TempDir dir;
  const std::string out = dir.file("t.db");
  // With the history off the stand-in allocator refuses to allocate: the program fails, and no
  // history is left or added.
  RunResult r = probe(out, {}, {{"ZT_PROBE_TORCH", "0"}});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("history was not on"), std::string::npos) << r.err;
  EXPECT_EQ(pickles_in(dir.path()), 0);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE source = 4"), 0);
}
