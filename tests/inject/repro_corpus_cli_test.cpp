// Issue 41's corpus through the zt binary (label corpus): each public report's scenario found by
// name, listed by `zt repro --list`, run full size (--virtual) and small, each with the verdict it is
// shipped with (inject/scenarios/corpus.tsv), the full-size run within a minute and 2 GiB.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>

#include "../test_util.h"
#include "corpus_manifest.h"
#include "measure_zt.h"

namespace {

zt::test::CorpusEntry entry(const std::string& name) {
  std::string error;
  for (auto& e : zt::test::read_corpus(zt::test::corpus_path(), &error))
    if (e.name == name) return e;
  return {};
}

class CorpusCli : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST(CorpusCli, ListNamesEveryCorpusScenario) {
  zt::test::CommandResult r = zt::test::run_command(std::string(ZT_BINARY_DIR) + "/zt repro --list 2>&1");
  EXPECT_EQ(r.code, 0) << r.out;
  for (auto& n : zt::test::corpus_names()) EXPECT_NE(r.out.find("  " + n), std::string::npos) << n << "\n" << r.out;
}

TEST_P(CorpusCli, FullSizeAndSmallAsShipped) {
  const zt::test::CorpusEntry want = entry(GetParam());
  ASSERT_EQ(want.name, GetParam());
  zt::test::TempDir dir;
  for (const bool full : {true, false}) {
    std::vector<std::string> args = {"repro", GetParam(), "-q", "--keep", dir.file(full ? "full" : "small"), "--json",
                                     dir.file("v.json")};
    if (full) args.push_back("--virtual");
    zt::test::Measured m = zt::test::measure_zt(args, dir.file("log.txt"));
    const std::string log = zt::test::read_file(dir.file("log.txt"));
    const std::string& verdict = full ? want.full_verdict : want.small_verdict;
    const std::string& fix = full ? want.full_fix : want.small_fix;
    EXPECT_EQ(m.code, verdict == "REPRODUCED" && fix == "CURED" ? 0 : 1) << log;
    auto j = nlohmann::json::parse(zt::test::read_file(dir.file("v.json")));
    EXPECT_EQ(j["verdict"], verdict) << (full ? "full size\n" : "small\n") << log;
    EXPECT_EQ(j["fix_verdict"], fix) << (full ? "full size\n" : "small\n") << log;
    EXPECT_LT(m.seconds, 60.0) << log;
    EXPECT_LT(m.max_rss_kib, 2L << 20) << "peak RSS " << m.max_rss_kib << " KiB";
    if (full) RecordProperty("full_seconds", std::to_string(m.seconds));
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, CorpusCli, ::testing::ValuesIn(zt::test::corpus_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           for (auto& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });
