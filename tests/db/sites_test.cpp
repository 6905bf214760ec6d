// Python frames in a trace's frame table, allocation sites and `zt db top`'s figures
// (zt/db/sites.h), on a hand-built trace of a probed Python program that leaks
// (tests/hand_trace.h: write_python_leak_trace).
#include <gtest/gtest.h>

#include <sqlite3.h>

#include "../hand_trace.h"
#include "../test_util.h"
#include "zt/db/export.h"
#include "zt/db/sites.h"
#include "zt/db/trace_reader.h"

using namespace zt::db;

namespace {

constexpr int64_t MiB = 1 << 20;

std::unique_ptr<TraceReader> open_trace(const std::string& path) {
  std::unique_ptr<TraceReader> r;
  zt::Status s = TraceReader::open(path, &r);
  EXPECT_TRUE(s.ok()) << s.message();
  return r;
}

std::vector<DeviceTop> top(const std::string& path, TopOptions o) {
  auto r = open_trace(path);
  std::vector<DeviceTop> out;
  zt::Status s = top_sites(*r, o, &out);
  EXPECT_TRUE(s.ok()) << s.message();
  return out;
}

// "site=bytes/allocations" for each listed site, in order.
std::string listed(const DeviceTop& d) {
  std::string s;
  for (auto& x : d.top) s += (s.empty() ? "" : ", ") + x.site + "=" + std::to_string(x.bytes / MiB) + "/" + std::to_string(x.allocations);
  return s;
}

struct LeakTrace : ::testing::Test {
  zt::test::TempDir dir;
  std::string path = dir.file("leak.db");
  void SetUp() override { ASSERT_TRUE(zt::test::write_python_leak_trace(path)); }
};

}  // namespace

TEST_F(LeakTrace, StacksShowPythonFramesAsFunctionFileAndLine) {
  auto r = open_trace(path);
  std::vector<std::string> lines;
  ASSERT_TRUE(r->stack_text(5, &lines).ok());
  EXPECT_EQ(lines, (std::vector<std::string>{"PyByteArray_Resize (/usr/bin/python3+0x101000)", "grow (/w/leak.py:12)",
                                             "train (/w/leak.py:20)", "<module> (/w/leak.py:30)",
                                             "Py_RunMain (/usr/bin/python3+0x102000)"}));
  std::vector<FrameRow> frames;
  ASSERT_TRUE(r->read(&frames).ok());
  ASSERT_EQ(frames.size(), 8u);
  EXPECT_TRUE(frames[2].python());
  EXPECT_EQ(frames[2].line, 12);
  EXPECT_FALSE(frames[1].python());
  EXPECT_FALSE(frames[1].line.has_value());
}

TEST_F(LeakTrace, TheSiteIsTheInnermostPythonFrameElseTheFirstFrameThatIsNotTheAllocators) {
  auto r = open_trace(path);
  std::unique_ptr<StackSites> sites;
  ASSERT_TRUE(StackSites::load(*r, &sites).ok());
  EXPECT_EQ(sites->site(5, SiteLevel::Line), "grow (/w/leak.py:12)");
  EXPECT_EQ(sites->site(5, SiteLevel::Function), "grow (/w/leak.py)");
  EXPECT_EQ(sites->site(5, SiteLevel::Module), "/w/leak.py");
  EXPECT_EQ(sites->site(7, SiteLevel::Line), "train (/w/leak.py:21)");
  // No Python frame: malloc is passed over.
  EXPECT_EQ(sites->site(9, SiteLevel::Line), "make_table (/usr/lib/libtable.so+0x2000)");
  EXPECT_EQ(sites->site(9, SiteLevel::Function), "make_table (/usr/lib/libtable.so)");
  EXPECT_EQ(sites->site(9, SiteLevel::Module), "/usr/lib/libtable.so");
  EXPECT_EQ(sites->site(0, SiteLevel::Line), "(no stack)");
  EXPECT_EQ(parse_site_level("function"), SiteLevel::Function);
  EXPECT_FALSE(parse_site_level("file").has_value());
}

TEST_F(LeakTrace, TopAtThePeakAtTheEndAndAtATime) {
  // The peak: epoch 3's temporary beside three epochs of grown memory and the native table.
  auto d = top(path, {});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].device.label, "cpu");
  EXPECT_FALSE(d[0].blocks);
  EXPECT_EQ(d[0].total, 22 * MiB);
  EXPECT_EQ(d[0].t, 320);
  EXPECT_EQ(d[0].sites, 3);
  EXPECT_EQ(listed(d[0]), "grow (/w/leak.py:12)=12/3, train (/w/leak.py:21)=8/1, make_table (/usr/lib/libtable.so+0x2000)=2/1");

  TopOptions end;
  end.when = TopWhen::End;
  d = top(path, end);
  EXPECT_EQ(listed(d[0]), "grow (/w/leak.py:12)=16/4, make_table (/usr/lib/libtable.so+0x2000)=2/1");
  EXPECT_EQ(d[0].t, 500);  // the run's end

  TopOptions at;
  at.when = TopWhen::Time;
  at.t_ns = 25;
  at.by = SiteLevel::Module;
  d = top(path, at);
  EXPECT_EQ(listed(d[0]), "/w/leak.py=8/1, /usr/lib/libtable.so=2/1");

  TopOptions one;
  one.top = 1;
  d = top(path, one);
  ASSERT_EQ(d[0].top.size(), 1u);
  EXPECT_EQ(d[0].other_bytes, 10 * MiB);
}

TEST_F(LeakTrace, TopPerEpochPutsTheGrowingLineFirst) {
  TopOptions o;
  o.when = TopWhen::Epochs;
  auto d = top(path, o);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].epochs, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(d[0].totals, (std::vector<int64_t>{6 * MiB, 10 * MiB, 14 * MiB, 18 * MiB}));
  ASSERT_EQ(d[0].top.size(), 2u);  // train's temporaries hold nothing at any epoch's end
  EXPECT_EQ(d[0].top[0].site, "grow (/w/leak.py:12)");
  EXPECT_DOUBLE_EQ(d[0].top[0].grew_per_epoch, double(4 * MiB));
  EXPECT_EQ(d[0].top[0].series, (std::vector<int64_t>{4 * MiB, 8 * MiB, 12 * MiB, 16 * MiB}));
  EXPECT_EQ(d[0].top[1].site, "make_table (/usr/lib/libtable.so+0x2000)");
  EXPECT_DOUBLE_EQ(d[0].top[1].grew_per_epoch, 0.0);
}

TEST_F(LeakTrace, AnUnknownDeviceIsRefusedWithTheOnesThereAre) {
  auto r = open_trace(path);
  TopOptions o;
  o.device = "cuda:0";
  std::vector<DeviceTop> out;
  zt::Status s = top_sites(*r, o, &out);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no device 'cuda:0' in this trace (it has cpu)"), std::string::npos) << s.message();
}

TEST_F(LeakTrace, MergeKeepsPythonFramesAndAFileWithoutTheLineColumnStillReadsAndMerges) {
  // A trace written before frame.line existed: the same file with the column dropped.
  const std::string old = dir.file("old.db");
  ASSERT_TRUE(zt::test::write_python_leak_trace(old));
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(old.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "DELETE FROM frame WHERE ip = 0; ALTER TABLE frame DROP COLUMN line; UPDATE rank SET rank = 1;"
                             "UPDATE device SET rank = 1;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
  {
    auto r = open_trace(old);
    std::vector<FrameRow> frames;
    ASSERT_TRUE(r->read(&frames).ok());
    EXPECT_EQ(frames.size(), 4u);
    for (auto& f : frames) EXPECT_FALSE(f.line.has_value());
    std::vector<std::string> lines;
    ASSERT_TRUE(r->stack_text(9, &lines).ok());
    EXPECT_EQ(lines.front(), "malloc (/lib/x86_64-linux-gnu/libc.so.6+0x1000)");
  }
  const std::string merged = dir.file("merged.db");
  zt::Status s = merge_traces(merged, {path, old}, false);
  ASSERT_TRUE(s.ok()) << s.message();
  auto r = open_trace(merged);
  std::vector<std::string> lines;
  ASSERT_TRUE(r->stack_text(5, &lines).ok());
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[1], "grow (/w/leak.py:12)");
}
