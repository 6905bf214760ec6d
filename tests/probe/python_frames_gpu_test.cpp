// Python frames in a CUDA call's stack (label gpu): PyTorch's caching allocator calls cudaMalloc
// with the GIL released, from C++ under the Python line that asked for the tensor; CUPTI's stack
// of that call must carry the line. Skips without a python3 that imports torch with CUDA (set
// ZT_TEST_PYTHON to choose one).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "../test_util.h"
#include "probe_run_util.h"

using namespace zt::test;

namespace {

// The interpreter (its real path: a pyenv shim would exec it) of the first candidate that imports
// torch with a GPU; empty when none does.
std::string torch_python(std::string* why) {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("ZT_TEST_PYTHON"); p && *p) candidates.push_back(p);
  candidates.push_back("python3");
  candidates.push_back("/usr/bin/python3");
  for (auto& c : candidates) {
    CommandResult r = run_command(c +
                                  " -c 'import sys, torch; assert torch.cuda.is_available(), \"no GPU\"; "
                                  "print(sys.executable)' 2>/dev/null");
    if (r.code == 0 && !r.out.empty()) return r.out.substr(0, r.out.find('\n'));
  }
  *why = "no python3 that imports torch with CUDA (tried ZT_TEST_PYTHON, python3, /usr/bin/python3)";
  return "";
}

// Line numbers are the script's own.
const char* kScript = R"(import torch
torch.cuda.init()
x = torch.empty(64 << 20, device="cuda")
torch.cuda.synchronize()
print(torch.cuda.memory_reserved())
)";

}  // namespace

TEST(PythonFramesGpu, APyTorchCudaMallocCarriesItsPythonLine) {
  std::string why;
  const std::string python = torch_python(&why);
  if (python.empty()) GTEST_SKIP() << why;
  TempDir dir;
  const std::string script = dir.file("torch_alloc.py"), out = dir.file("torch.db");
  std::ofstream(script) << kScript;
  // A fresh process: the caching allocator has nothing cached, so the 256 MiB tensor is a cudaMalloc.
  CommandResult r = run_command("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False " + std::string(ZT_EXE) +
                                " probe -o " + out + " -- " + python + " " + script + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  auto rows = sql(out, "SELECT stack_id FROM allocation WHERE source = 1 AND memory_kind = 1 AND bytes >= " +
                           std::to_string(int64_t(256) << 20) + " AND stack_id IS NOT NULL");
  ASSERT_EQ(rows.size(), 1u) << r.out;
  std::unique_ptr<zt::db::TraceReader> reader;
  ASSERT_TRUE(zt::db::TraceReader::open(out, &reader));
  std::vector<std::string> lines;
  ASSERT_TRUE(reader->stack_text(std::stoll(rows[0][0]), &lines));
  std::string text;
  for (auto& l : lines) text += "\n  " + l;
  EXPECT_NE(text.find("<module> (" + script + ":3)"), std::string::npos) << text;
}
