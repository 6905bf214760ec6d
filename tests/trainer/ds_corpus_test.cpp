// The public DeepSpeed configs of tests/data/ds_configs/ (issue 42's targets): every file DeepSpeed
// accepts is accepted, and at least 95% resolve exactly as DeepSpeed 0.19 resolves them.
#include <gtest/gtest.h>

#include "ds_configs.h"

TEST(DeepSpeedCorpus, ConfigsAreReadAsDeepSpeedReadsThem) {
  const auto files = zt::bench::corpus_files(std::string(ZT_SOURCE_DIR) + "/tests/data/ds_configs");
  ASSERT_GE(files.size(), 60u);
  int same = 0;
  std::string diffs;
  for (const std::string& path : files) {
    const auto r = zt::bench::judge_config(path);
    same += r.same;
    EXPECT_FALSE(r.deepspeed_accepts && !r.zt_accepts) << r.name << ": " << r.diff;
    if (!r.same) diffs += r.name + ": " + r.diff + "\n";
  }
  EXPECT_GE(same * 100, int(files.size()) * 95) << same << " of " << files.size() << " as DeepSpeed:\n" << diffs;
}
