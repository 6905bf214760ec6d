// Python frames in the probe's stacks (probe/src/python/python_frames.h), on real programs run
// by Debian's python3 under libzt_probe.so: the line and function that allocated, a nested call
// chain in order and in place of the interpreter's eval-loop frames, a call made with the GIL
// released, and a program without Python whose stacks stay as they were.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "../hand_trace.h"
#include "../test_util.h"
#include "probe_run_util.h"

using namespace zt::test;

namespace {

// Line numbers below are the scripts' own: keep them in step with the text.
const char* kNested = R"(import sys

def inner():
    buf = bytearray(8 << 20)
    return buf

def middle():
    return inner()

def outer():
    return middle()

kept = outer()
kept2 = bytearray(3 << 20)
print("ok")
)";

const char* kGilReleased = R"(import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]

def grab():
    return libc.malloc(16 << 20)

p = grab()
print("ok")
)";

std::string write_script(TempDir& dir, const std::string& name, const char* text) {
  std::string path = dir.file(name);
  std::ofstream(path) << text;
  return path;
}

RunResult run_python(const std::string& out, const std::string& script, std::map<std::string, const char*> extra = {}) {
  static std::string lib = probe_library();
  std::map<std::string, const char*> env{{"LD_PRELOAD", lib.c_str()},
                                         {"ZT_PROBE_OUTPUT", out.c_str()},
                                         {"ZT_PROBE_QUIET", "1"},
                                         {"PYTHONDONTWRITEBYTECODE", "1"}};
  for (auto& [k, v] : extra) env[k] = v;
  return run_program({python3(), script}, env);
}

// The stack of the one allocation of `bytes` requested (bytearray asks one more, for its NUL),
// innermost first.
std::vector<std::string> stack_of(const std::string& trace, int64_t bytes) {
  std::vector<std::string> lines;
  auto rows = sql(trace, "SELECT stack_id FROM allocation WHERE requested_bytes BETWEEN " + std::to_string(bytes) +
                             " AND " + std::to_string(bytes + 64));
  if (rows.size() != 1 || rows[0][0] == "NULL") return lines;
  std::unique_ptr<zt::db::TraceReader> r;
  if (!zt::db::TraceReader::open(trace, &r)) return lines;
  (void)r->stack_text(std::stoll(rows[0][0]), &lines);
  return lines;
}

size_t index_of(const std::vector<std::string>& lines, const std::string& text) {
  for (size_t i = 0; i < lines.size(); ++i)
    if (lines[i] == text) return i;
  return lines.size();
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (auto& l : lines) s += "\n  " + l;
  return s;
}

}  // namespace

TEST(PythonFrames, AnAllocationCarriesItsLineAndTheCallChainInOrder) {
  if (python3().empty()) GTEST_SKIP() << "no python3";
  TempDir dir;
  const std::string script = write_script(dir, "nested.py", kNested), out = dir.file("nested.db");
  RunResult r = run_python(out, script);
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines = stack_of(out, 8 << 20);
  ASSERT_FALSE(lines.empty());
  // The chain, innermost first, each with the line it was running.
  const size_t inner = index_of(lines, "inner (" + script + ":4)"), middle = index_of(lines, "middle (" + script + ":8)"),
               outer = index_of(lines, "outer (" + script + ":11)"), top = index_of(lines, "<module> (" + script + ":13)");
  ASSERT_LT(top, lines.size()) << joined(lines);
  EXPECT_TRUE(inner < middle && middle < outer && outer < top) << joined(lines);
  // Where the interpreter runs them: after the C code that allocated (bytearray's), before the C
  // code that started the script, and no eval-loop frame is left between them.
  EXPECT_GT(inner, 0u) << joined(lines);
  EXPECT_NE(joined({lines.begin(), lines.begin() + long(inner)}).find("PyByteArray_Resize"), std::string::npos)
      << joined(lines);
  EXPECT_NE(joined({lines.begin() + long(top), lines.end()}).find("Py_RunMain"), std::string::npos) << joined(lines);
  EXPECT_EQ(joined({lines.begin() + long(inner), lines.begin() + long(top)}).find("_PyEval_EvalFrameDefault"),
            std::string::npos)
      << joined(lines);
  // The top-level allocation has its own line.
  EXPECT_LT(index_of(stack_of(out, 3 << 20), "<module> (" + script + ":14)"), stack_of(out, 3 << 20).size());
  // The run says which interpreter it read.
  EXPECT_EQ(sql(out, "SELECT json_extract(config_json, '$.python') LIKE 'Python 3.%' FROM run")[0][0], "1");
  // Python frames are rows of their own: ip 0, the file as module, the function as symbol.
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM frame WHERE ip = 0 AND module = '" + script +
                             "' AND symbol = 'inner' AND line = 4"),
            1);
}

TEST(PythonFrames, ACallWithTheGilReleasedCarriesItsLineUnlessOnlyGilIsAsked) {
  if (python3().empty()) GTEST_SKIP() << "no python3";
  TempDir dir;
  const std::string script = write_script(dir, "nogil.py", kGilReleased);
  // ctypes releases the GIL around a foreign call, as PyTorch does around its operators.
  const std::string own = dir.file("own.db");
  RunResult r = run_python(own, script);
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines = stack_of(own, 16 << 20);
  EXPECT_LT(index_of(lines, "grab (" + script + ":7)"), index_of(lines, "<module> (" + script + ":9)")) << joined(lines);
  EXPECT_LT(index_of(lines, "<module> (" + script + ":9)"), lines.size()) << joined(lines);

  const std::string gil = dir.file("gil.db");
  r = run_python(gil, script, {{"ZT_PROBE_PYTHON", "gil"}});
  ASSERT_EQ(r.code, 0) << r.err;
  lines = stack_of(gil, 16 << 20);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(joined(lines).find(".py:"), std::string::npos) << joined(lines);
  EXPECT_NE(joined(lines).find("Py_RunMain"), std::string::npos) << joined(lines);  // the native stack stays

  const std::string off = dir.file("off.db");
  r = run_python(off, script, {{"ZT_PROBE_PYTHON", "0"}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(sql_int(off, "SELECT count(*) FROM frame WHERE ip = 0"), 0);
  EXPECT_EQ(sql(off, "SELECT json_extract(config_json, '$.python') FROM run")[0][0], "off");
}

// PyTorch releases the GIL around its operators (so its CUDA caching allocator's cudaMalloc runs
// without it): a CPU tensor's allocation shows the same, where CI has torch (Debian's python3-torch).
TEST(PythonFrames, APyTorchAllocationWithoutTheGilCarriesItsLine) {
  if (python3().empty() || run_command(python3() + " -c 'import torch' 2>/dev/null").code != 0)
    GTEST_SKIP() << "no torch for " << python3();
  TempDir dir;
  const std::string script = write_script(dir, "tensor.py", R"(import torch
def make():
    return torch.empty(64 << 20)
x = make()
)");
  const std::string own = dir.file("own.db"), gil = dir.file("gil.db");
  ASSERT_EQ(run_python(own, script).code, 0);
  ASSERT_EQ(run_python(gil, script, {{"ZT_PROBE_PYTHON", "gil"}}).code, 0);
  std::vector<std::string> lines = stack_of(own, int64_t(256) << 20);
  EXPECT_LT(index_of(lines, "make (" + script + ":3)"), index_of(lines, "<module> (" + script + ":4)")) << joined(lines);
  EXPECT_LT(index_of(lines, "<module> (" + script + ":4)"), lines.size()) << joined(lines);
  EXPECT_NE(joined(lines).find("empty_cpu"), std::string::npos) << joined(lines);  // torch's own frames stay
  lines = stack_of(gil, int64_t(256) << 20);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(joined(lines).find(".py:"), std::string::npos) << joined(lines);  // the GIL was released there
}

TEST(PythonFrames, AProgramWithoutPythonKeepsItsNativeStacks) {
  TempDir dir;
  static std::string lib = probe_library();
  auto run = [&](const std::string& out, const char* python) {
    return run_program({ZT_PROBE_WORKLOAD, "leak", "3", std::to_string(3 << 19)},
                       {{"LD_PRELOAD", lib.c_str()}, {"ZT_PROBE_OUTPUT", out.c_str()}, {"ZT_PROBE_QUIET", "1"},
                        {"ZT_PROBE_PYTHON", python}});
  };
  const std::string with = dir.file("with.db"), without = dir.file("without.db");
  ASSERT_EQ(run(with, "1").code, 0);
  ASSERT_EQ(run(without, "0").code, 0);
  EXPECT_EQ(sql_int(with, "SELECT count(*) FROM frame WHERE ip = 0 OR line IS NOT NULL"), 0);
  EXPECT_EQ(sql(with, "SELECT json_extract(config_json, '$.python') FROM run")[0][0], "no Python in this process");
  // The same frames with or without the Python reader.
  auto leaked = allocations_in(with, "zt_test_leak_buffers", "requested_bytes = " + std::to_string(3 << 19));
  EXPECT_EQ(leaked.size(), 3u);
  std::unique_ptr<zt::db::TraceReader> ra, rb;
  ASSERT_TRUE(zt::db::TraceReader::open(with, &ra));
  ASSERT_TRUE(zt::db::TraceReader::open(without, &rb));
  std::vector<std::string> la, lb;
  ASSERT_TRUE(ra->stack_text(sql_int(with, "SELECT max(stack_id) FROM allocation WHERE requested_bytes = 1572864"), &la));
  ASSERT_TRUE(rb->stack_text(sql_int(without, "SELECT max(stack_id) FROM allocation WHERE requested_bytes = 1572864"), &lb));
  ASSERT_FALSE(la.empty());
  // A frame without a symbol shows its address, which differs from run to run (ASLR).
  for (auto* v : {&la, &lb})
    for (auto& l : *v)
      if (l.rfind("0x", 0) == 0) l = "?" + l.substr(l.find(' '));
  EXPECT_EQ(la, lb);
}

// zt db top and zt export on a probed Python program; zt check --leaks names the growing line.
TEST(PythonFrames, DbTopExportAndCheckNameThePythonLine) {
  if (python3().empty()) GTEST_SKIP() << "no python3";
  TempDir dir;
  const std::string script = write_script(dir, "nested.py", kNested), out = dir.file("nested.db");
  ASSERT_EQ(run_python(out, script).code, 0);
  const std::string zt = ZT_EXE;
  CommandResult top = run_command(zt + " db top " + out + " 2>&1");
  ASSERT_EQ(top.code, 0) << top.out;
  // The peak: both bytearrays alive, the larger first, each at its line.
  const size_t inner = top.out.find("8.00 MiB"), module = top.out.find("3.00 MiB");
  EXPECT_NE(top.out.find("allocation sites by line, at the peak of each device"), std::string::npos) << top.out;
  ASSERT_NE(inner, std::string::npos) << top.out;
  EXPECT_LT(inner, module) << top.out;
  EXPECT_EQ(top.out.find("inner (" + script + ":4)"), top.out.find('\n', inner) - std::string("inner (" + script + ":4)").size())
      << top.out;
  EXPECT_NE(top.out.find("<module> (" + script + ":14)"), std::string::npos) << top.out;
  top = run_command(zt + " db top " + out + " --by module --top 1 2>&1");
  ASSERT_EQ(top.code, 0) << top.out;
  // The script's two lines as one module, two allocations; the rest in one line.
  EXPECT_NE(top.out.find(" 2  " + script + "\n"), std::string::npos) << top.out;
  EXPECT_NE(top.out.find("more site"), std::string::npos) << top.out;
  top = run_command(zt + " db top " + out + " --by file 2>&1");
  EXPECT_EQ(top.code, 2) << top.out;
  EXPECT_NE(top.out.find("--by 'file': give line, function or module"), std::string::npos) << top.out;

  // The Chrome export: an unnamed allocation is named by its site and carries its stack.
  const std::string json = dir.file("nested.json");
  CommandResult ex = run_command(zt + " export " + out + " --chrome " + json + " 2>&1");
  ASSERT_EQ(ex.code, 0) << ex.out;
  const std::string text = read_file(json);
  EXPECT_NE(text.find("\"name\":\"inner (" + script + ":4)\""), std::string::npos);
  EXPECT_NE(text.find("\"stack\":[\""), std::string::npos);
  EXPECT_NE(text.find("\"middle (" + script + ":8)\",\"outer (" + script + ":11)\""), std::string::npos);

  const std::string leak = dir.file("leak.db");
  ASSERT_TRUE(write_python_leak_trace(leak));
  CommandResult check = run_command(zt + " check " + leak + " --leaks 2>&1");
  EXPECT_EQ(check.code, 1) << check.out;
  EXPECT_NE(check.out.find("grow (/w/leak.py:12) +8.00 MiB in 2 allocations"), std::string::npos) << check.out;
  top = run_command(zt + " db top " + leak + " --per-epoch 2>&1");
  ASSERT_EQ(top.code, 0) << top.out;
  EXPECT_NE(top.out.find("4.00 MiB    16.00 MiB            4  grow (/w/leak.py:12)"), std::string::npos) << top.out;
}
