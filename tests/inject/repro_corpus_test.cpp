// Issue 41's corpus (inject/scenarios/corpus.tsv): every public report's scenario loads, cites where
// it came from, and gives at full size (the report's own model and cluster, virtual mode: sizes only,
// well under a second each) the verdict it is shipped with, reproduced or not. A memory-model change
// that changes a report's verdict changes this file's expectation and the docs' table with it.
// Every shipped scenario, corpus or not, parses and names its source.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>

#include "../test_util.h"
#include "corpus_manifest.h"
#include "zt/repro/runner.h"

using namespace zt;
namespace fs = std::filesystem;

namespace {

std::string scenarios_dir() { return std::string(ZT_SOURCE_DIR) + "/inject/scenarios"; }

std::vector<std::string> shipped() {
  std::vector<std::string> out;
  for (auto& e : fs::directory_iterator(scenarios_dir()))
    if (e.path().extension() == ".yaml") out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

const test::CorpusEntry& entry(const std::string& name) {
  static const std::vector<test::CorpusEntry> all = [] {
    std::string error;
    return test::read_corpus(test::corpus_path(), &error);
  }();
  for (auto& e : all)
    if (e.name == name) return e;
  static const test::CorpusEntry none;
  return none;
}

std::string explain(const repro::ReproResult& r) {
  std::ostringstream s;
  repro::print_verdict(r, s);
  return s.str();
}

std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (auto& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

}  // namespace

TEST(ShippedScenarios, EveryOneParsesAndCitesASource) {
  const std::vector<std::string> names = shipped();
  ASSERT_GE(names.size(), 12u);
  std::set<std::string> corpus;
  for (auto& n : test::corpus_names()) corpus.insert(n);
  const std::regex url(R"(^https://[A-Za-z0-9.-]+\.[a-z]+/\S+$)");
  for (const std::string& n : names) {
    repro::Scenario s;
    Status st = repro::load_scenario(scenarios_dir() + "/" + n + ".yaml", &s);
    ASSERT_TRUE(st) << st.message();
    EXPECT_EQ(s.name, n) << "the file is named for its scenario";
    ASSERT_FALSE(s.report_sources.empty()) << n << ": report.sources names no source";
    for (auto& src : s.report_sources) {
      EXPECT_FALSE(src.empty()) << n;
      // The corpus is public reports: each source an address anyone can open.
      if (corpus.count(n)) EXPECT_TRUE(std::regex_match(src, url)) << n << ": '" << src << "' is not a URL";
    }
    EXPECT_FALSE(s.report_title.empty()) << n;
    EXPECT_FALSE(s.report_summary.empty()) << n;
  }
}

TEST(CorpusManifest, NamesEachCorpusScenarioOnce) {
  std::string error;
  const std::vector<test::CorpusEntry> all = test::read_corpus(test::corpus_path(), &error);
  ASSERT_TRUE(error.empty()) << error;
  EXPECT_GE(all.size(), 15u);
  const std::set<std::string> verdicts = {"REPRODUCED", "NOT REPRODUCED", "DIFFERENT FAILURE", "INCONCLUSIVE"};
  const std::set<std::string> cures = {"CURED", "NOT CURED", "INCONCLUSIVE"};
  std::set<std::string> seen;
  const std::vector<std::string> files = shipped();
  for (auto& e : all) {
    EXPECT_TRUE(seen.insert(e.name).second) << "corpus.tsv:" << e.line << ": " << e.name << " twice";
    EXPECT_TRUE(std::find(files.begin(), files.end(), e.name) != files.end())
        << "corpus.tsv:" << e.line << ": no inject/scenarios/" << e.name << ".yaml";
    EXPECT_TRUE(verdicts.count(e.full_verdict)) << "corpus.tsv:" << e.line << ": '" << e.full_verdict << "'";
    EXPECT_TRUE(verdicts.count(e.small_verdict)) << "corpus.tsv:" << e.line << ": '" << e.small_verdict << "'";
    EXPECT_TRUE(cures.count(e.full_fix)) << "corpus.tsv:" << e.line << ": '" << e.full_fix << "'";
    EXPECT_TRUE(cures.count(e.small_fix)) << "corpus.tsv:" << e.line << ": '" << e.small_fix << "'";
    // A report that does not reproduce says why.
    if (e.full_verdict != "REPRODUCED" || e.full_fix != "CURED") {
      EXPECT_NE(e.why, "-") << "corpus.tsv:" << e.line << ": " << e.name << " is not reproduced and cured: say why";
    }
  }
}

class CorpusFullSize : public ::testing::TestWithParam<std::string> {};

TEST_P(CorpusFullSize, VerdictAsShipped) {
  const test::CorpusEntry& want = entry(GetParam());
  ASSERT_EQ(want.name, GetParam());
  repro::Scenario s;
  Status st = repro::load_scenario(scenarios_dir() + "/" + GetParam() + ".yaml", &s);
  ASSERT_TRUE(st) << st.message();
  test::TempDir dir;
  repro::RunOptions o;
  o.variant = repro::Variant::Full;
  o.keep_dir = dir.path();
  o.crash_handlers = false;
  repro::ReproResult r;
  const auto t0 = std::chrono::steady_clock::now();
  st = repro::run_scenario(s, o, &r);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(st) << st.message();
  EXPECT_EQ(r.verdict, want.full_verdict) << explain(r);
  EXPECT_EQ(repro::cure_word(r.cured), want.full_fix) << explain(r);
  EXPECT_TRUE(r.bug.config.virtual_mode) << "full size runs the report's model in virtual mode";
  EXPECT_LT(seconds, 10.0 * test::kSanitizerSlowdown) << "a full-size corpus run takes well under a second";
  RecordProperty("seconds", std::to_string(seconds));
}

INSTANTIATE_TEST_SUITE_P(Corpus, CorpusFullSize, ::testing::ValuesIn(test::corpus_names()), test_name);
