// `zt check` as CI runs it: exit codes, one-line errors, the JUnit file.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../test_util.h"
#include "check_traces.h"

using zt::test::RunShape;
using zt::test::TraceBuilder;

namespace {

using Result = zt::test::CommandResult;

Result zt_check(const std::string& args) { return zt::test::run_command(std::string(ZT_BINARY_DIR) + "/zt check " + args + " 2>&1"); }

std::string read(const std::string& path) { return zt::test::read_file(path); }

std::string make(const zt::test::TempDir& dir, const std::string& name, const RunShape& shape) {
  std::string path = dir.file(name);
  TraceBuilder b(path);
  zt::test::build_run(b, shape);
  b.finish();
  return path;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST(CheckCli, HelpHasAnExample) {
  Result r = zt_check("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(has(r.out, "Example: zt check run.db")) << r.out;
  for (const char* flag : {"--run", "--leaks", "--placement", "--budget", "--steps", "--junit", "--leak-threshold",
                           "--rss-threshold"})
    EXPECT_TRUE(has(r.out, flag)) << flag << "\n" << r.out;
}

TEST(CheckCli, CleanTracePassesWithExitZeroAndAJUnitFile) {
  zt::test::TempDir dir;
  std::string trace = make(dir, "clean.db", RunShape{});
  Result r = zt_check(trace + " --junit " + dir.file("out.xml"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "PASS leaks: ")) << r.out;
  EXPECT_TRUE(has(r.out, "PASS placement: ")) << r.out;
  EXPECT_TRUE(has(r.out, "PASS steps: 12 of 12 planned steps run")) << r.out;
  EXPECT_TRUE(has(r.out, "PASS run: the run ended ok")) << r.out;
  EXPECT_TRUE(has(r.out, "zt check: ok (4 passed)")) << r.out;
  std::string x = read(dir.file("out.xml"));
  EXPECT_TRUE(has(x, "<testsuite name=\"zt check\" tests=\"4\" failures=\"0\"")) << x;
  for (const char* name : {"run", "leaks", "placement", "steps"})
    EXPECT_TRUE(has(x, std::string("<testcase classname=\"zt check\" name=\"") + name + "\"")) << x;
  EXPECT_FALSE(has(x, "<failure")) << x;
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.xml.tmp-0")));
}

TEST(CheckCli, LeakFailsWithExitOneAndTheFailureInJUnit) {
  zt::test::TempDir dir;
  RunShape s;
  s.leak_per_epoch = 1 << 20;
  std::string trace = make(dir, "leak.db", s);
  Result r = zt_check(trace + " --leaks --junit " + dir.file("out.xml"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "FAIL leaks: ")) << r.out;
  EXPECT_TRUE(has(r.out, "  - rank 0 cpu pinned host memory: live bytes at epoch start grew 1.00 MiB per epoch")) << r.out;
  EXPECT_TRUE(has(r.out, "zt check: FAILED (leaks failed")) << r.out;
  EXPECT_FALSE(has(r.out, "placement")) << r.out;  // only the check asked for
  std::string x = read(dir.file("out.xml"));
  EXPECT_TRUE(has(x, "tests=\"1\" failures=\"1\"")) << x;
  EXPECT_TRUE(has(x, "<failure message=\"1 of 3 memories grow across epochs")) << x;
  EXPECT_TRUE(has(x, "offload.buffer[epoch *] +1.00 MiB in 1 allocation")) << x;

  // A higher threshold lets it pass.
  EXPECT_EQ(zt_check(trace + " --leaks --leak-threshold 2MiB").code, 0);
}

TEST(CheckCli, StepsAgainstN) {
  zt::test::TempDir dir;
  std::string trace = make(dir, "s.db", RunShape{});
  EXPECT_EQ(zt_check(trace + " --steps 12").code, 0);
  Result r = zt_check(trace + " --steps 13");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "12 of 13 expected steps run (--steps), 1 short")) << r.out;
  r = zt_check(trace + " --steps");  // without N: against the plan, and only that check
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "PASS steps: 12 of 12 planned steps run (data.steps_planned)")) << r.out;
  EXPECT_FALSE(has(r.out, "leaks")) << r.out;
}

TEST(CheckCli, BadInputExitsTwoWithOneLine) {
  zt::test::TempDir dir;
  Result r = zt_check(dir.file("missing.db"));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "zt: " + dir.file("missing.db") + ": no such file\n");

  std::ofstream(dir.file("junk.db")) << "this is not a trace";
  r = zt_check(dir.file("junk.db") + " --junit " + dir.file("bad.xml"));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out.rfind("zt: " + dir.file("junk.db") + ": ", 0), 0u) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_TRUE(has(read(dir.file("bad.xml")), "<error message=\"" + dir.file("junk.db") + ": ")) << read(dir.file("bad.xml"));

  std::string trace = make(dir, "ok.db", RunShape{});
  r = zt_check(trace + " --budget cuda=70GiB,host=9parsecs");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out,
            "zt: --budget: 'host=9parsecs': '9parsecs' is not a size: unknown unit 'parsecs' (B, KiB, MiB, GiB, TiB; or kB, MB, GB, TB: powers of 1000) "
            "(try 70GiB)\n");
  r = zt_check(trace + " --leak-threshold lots");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.out, "--leak-threshold: 'lots'")) << r.out;
  r = zt_check(trace + " --rss-threshold 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.out, "--rss-threshold: '0' is not a size above 0")) << r.out;
  r = zt_check(trace + " --steps many");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.out, "--steps: 'many' is not a number of steps")) << r.out;
}

TEST(CheckCli, BudgetOverFails) {
  zt::test::TempDir dir;
  std::string trace = make(dir, "b.db", RunShape{});
  Result r = zt_check(trace + " --budget cuda=10MiB");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "FAIL budget: ")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 0 cuda:0: peak allocated 19.00 MiB over the budget of 10.00 MiB")) << r.out;
  EXPECT_EQ(zt_check(trace + " --budget cuda=70GiB,host=900GiB").code, 0);
}

// A check named on the command line that cannot run is not a pass (issue 40): exit 1, the reason and
// what it needs, a JUnit <error>. The same check in the default set is a skip, exit 0.
TEST(CheckCli, ANamedCheckThatCannotRunExitsOne) {
  zt::test::TempDir dir;
  RunShape s;
  s.write_plan = false;
  std::string trace = make(dir, "noplan.db", s);
  Result r = zt_check(trace + " --steps --junit " + dir.file("out.xml"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(has(r.out, "CANNOT RUN steps: the trace records no plan (no data.steps_planned counter); give --steps N"))
      << r.out;
  EXPECT_TRUE(has(r.out, "zt check: FAILED (steps could not run, 0 passed)")) << r.out;
  std::string x = read(dir.file("out.xml"));
  EXPECT_TRUE(has(x, "tests=\"1\" failures=\"0\" errors=\"1\" skipped=\"0\"")) << x;
  EXPECT_TRUE(has(x, "type=\"cannot run\"")) << x;
  r = zt_check(trace);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "SKIP steps: ")) << r.out;
  EXPECT_TRUE(has(r.out, "zt check: ok (3 passed, 1 skipped)")) << r.out;
  EXPECT_EQ(zt_check(trace + " --steps 12").code, 0);
}
