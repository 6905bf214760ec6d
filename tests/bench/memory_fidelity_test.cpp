// bench/memory_fidelity --dry-run: the benchmark's plan and its zt half (`zt train --virtual` at issue 33's
// two measured configs) on every CI run, so that a Python error or a change of zt train's closing line
// shows here and not first in a GPU session; its figures are the regression rows' (checked against
// DeepSpeed's in tests/trainer/ds_memory_test.cpp), read back from its summary.json.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "../test_util.h"

namespace {

std::string quoted(const std::string& s) { return "'" + s + "'"; }

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string memory_fidelity() {
  return quoted(ZT_PYTHON3) + " " + quoted(std::string(ZT_SOURCE_DIR) + "/bench/memory_fidelity");
}

}  // namespace

TEST(MemoryFidelity, TheDryRunPrintsThePlanAndRunsOurHalf) {
  if (std::string(ZT_PYTHON3).empty()) GTEST_SKIP() << "no python3 was found when configuring";
  zt::test::TempDir dir;
  const std::string out = dir.file("out");
  const zt::test::CommandResult r = zt::test::run_command(memory_fidelity() + " --dry-run --quick --build " +
                                                          quoted(ZT_BINARY_DIR) + " --out " + quoted(out) + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("Traceback"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"offload_optimizer\":{\"device\":\"cpu\",\"pin_memory\":true}"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("zt train --virtual"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(read_file(out + "/summary.json"));
  EXPECT_TRUE(j["dry_run"].get<bool>());
  ASSERT_EQ(j["configs"].size(), 2u);
  EXPECT_EQ(j["configs"][0]["config"], "350M:8");
  EXPECT_EQ(j["configs"][1]["config"], "1.5B:8:ckpt");
  for (const auto& c : j["configs"]) {
    ASSERT_TRUE(c["allocated_ratio"].is_number()) << c;
    EXPECT_NEAR(c["allocated_ratio"].get<double>(), 1.0, 0.05) << c;
    EXPECT_GT(c["ours"]["peak_reserved"].get<double>(), c["ours"]["peak_allocated"].get<double>()) << c;
  }
  EXPECT_NE(read_file(out + "/summary.md").find("| 350M B=8 T=1024"), std::string::npos);
  // A config it cannot read is a usage error.
  const zt::test::CommandResult bad = zt::test::run_command(memory_fidelity() + " --dry-run --configs 13B:8 --build " +
                                                            quoted(ZT_BINARY_DIR) + " --out " + quoted(out) + " 2>&1");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("MODEL:B[:ckpt][:poff]"), std::string::npos) << bad.out;
}
