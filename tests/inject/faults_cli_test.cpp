// Bad fault specs and bad scenarios as users meet them through the zt binary: refused up front
// with one line and exit 2, never accepted and failing mid-run (zt faults --check, zt train
// --fault, ZT_FAULTS, zt repro).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "../test_util.h"

namespace {

using Result = zt::test::CommandResult;

Result run_zt(const std::string& args) { return zt::test::run_command(std::string(ZT_BINARY_DIR) + "/zt " + args + " 2>&1"); }

std::string scenario(const std::string& name) { return std::string(ZT_SOURCE_DIR) + "/inject/scenarios/" + name + ".yaml"; }

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

int lines(const std::string& text) { return int(std::count(text.begin(), text.end(), '\n')); }

// The shipped R5 scenario with `from` (first occurrence) replaced by `to`, written to dir/name.
std::string r5_with(const zt::test::TempDir& dir, const std::string& name, const std::string& from, const std::string& to) {
  std::string text = zt::test::read_file(scenario("r5-axolotl-unscale-clip-mismatch"));
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  std::ofstream(dir.file(name)) << text;
  return dir.file(name);
}

}  // namespace

TEST(FaultsCli, CheckRefusesAnArgumentTheSiteDoesNotTake) {
  Result r = run_zt("faults --check 'host.epoch_leak=return(bogus)'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(lines(r.out), 1) << r.out;
  for (const char* w : {"host.epoch_leak", "'bogus'", "pinned, pow2 or fork"}) EXPECT_TRUE(has(r.out, w)) << w << ": " << r.out;
  r = run_zt("faults --check 'data.parallel_drop=return(200)'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "percentage '200'")) << r.out;
  r = run_zt("faults --check 'zero.norm_on_device=return(now)'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "takes no argument")) << r.out;
  r = run_zt("faults --check 'host.epoch_leak[epoch>=1]=return(pow2)'");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "host.epoch_leak: 1 condition(s), actions: return(pow2)")) << r.out;
}

TEST(FaultsCli, CheckRefusesTrailingTextAndAnEmptySpec) {
  Result r = run_zt("faults --check 'host.epoch_leak=return(pow2)(x)'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(lines(r.out), 1) << r.out;
  EXPECT_TRUE(has(r.out, "unexpected '(x)'")) << r.out;
  for (const char* empty : {"''", "' '", "';'"}) {
    r = run_zt(std::string("faults --check ") + empty);
    EXPECT_EQ(r.code, 2) << empty << ": " << r.out;
    EXPECT_EQ(lines(r.out), 1) << empty << ": " << r.out;
    EXPECT_TRUE(has(r.out, "no spec")) << r.out;
    EXPECT_FALSE(has(r.out, "zero.norm_on_device ")) << "not the catalog: " << r.out;
  }
}

TEST(FaultsCli, TheCatalogSaysWhatEachReturnTakes) {
  Result r = run_zt("faults");
  EXPECT_EQ(r.code, 0) << r.out;
  for (const char* w : {"RETURN", "return(pinned|pow2|fork)", "return(0..100)", "return(N>=1)", "return(N)"})
    EXPECT_TRUE(has(r.out, w)) << w << ": " << r.out;
  r = run_zt("faults -v");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "ARG is a variant: pinned, pow2 or fork (default pinned)")) << r.out;
  EXPECT_TRUE(has(r.out, "return takes no argument")) << r.out;
}

TEST(FaultsCli, TrainRefusesABadArgumentBeforeItTrains) {
  // Before: accepted, and the run failed with exit 1 at the first epoch boundary.
  Result r = run_zt("train --epochs 2 --zero-stage 2 --offload-optimizer --fault 'host.epoch_leak=return(bogus)'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(lines(r.out), 1) << r.out;
  EXPECT_TRUE(has(r.out, "--fault 'host.epoch_leak=return(bogus)'")) << r.out;
  EXPECT_TRUE(has(r.out, "variant 'bogus' is not allowed")) << r.out;
  r = run_zt("train --steps 1 --fault 'config.max_iters=return(8)(9)'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "unexpected '(9)'")) << r.out;
  r = zt::test::run_command("ZT_FAULTS='host.epoch_leak=return(fork);data.parallel_drop=return(x)' " +
                            std::string(ZT_BINARY_DIR) + "/zt train --steps 1 2>&1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "ZT_FAULTS: 'data.parallel_drop=return(x)'")) << r.out;
}

TEST(FaultsCli, ReproRefusesABadScenarioWithExit2) {
  zt::test::TempDir dir;
  // Before: ran both runs and said NOT REPRODUCED (exit 1).
  std::string p = r5_with(dir, "kind.yaml", "  error: device_mismatch", "  error: gremlins");
  Result r = run_zt("repro -q " + p + " --keep " + dir.file("k1"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(lines(r.out), 1) << r.out;
  EXPECT_TRUE(has(r.out, p + ":")) << r.out;
  EXPECT_TRUE(has(r.out, "expect.error: 'gremlins'")) << r.out;
  // Before: the shape's products wrapped and --virtual said REPRODUCED.
  p = r5_with(dir, "ffn.yaml", "  ffn: 14336", "  ffn: 9223372036854775807");
  r = run_zt("repro -q --virtual " + p + " --keep " + dir.file("k2"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, p + ":")) << r.out;
  EXPECT_TRUE(has(r.out, "model.ffn: 9223372036854775807 is above the limit of 16777216")) << r.out;
  // Before: INCONCLUSIVE (exit 1) after the bug run had been attempted.
  p = r5_with(dir, "layers.yaml", "  layers: 32", "  layers: 99999999999999");
  r = run_zt("repro -q --virtual " + p + " --keep " + dir.file("k3"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "model.layers: 99999999999999 is above the limit of 65536")) << r.out;
  p = r5_with(dir, "arg.yaml", "  - zero.norm_on_device=return", "  - zero.norm_on_device=return(yes)");
  r = run_zt("repro -q " + p + " --keep " + dir.file("k4"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(has(r.out, "takes no argument")) << r.out;
}
