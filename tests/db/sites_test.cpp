// Python frames in a trace's frame table, allocation sites and `zt db top`'s figures
// (zt/db/sites.h), on a hand-built trace of a probed Python program that leaks
// (tests/hand_trace.h: write_python_leak_trace).
#include <gtest/gtest.h>

#include <sqlite3.h>

#include <cmath>

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


TEST(Sites, TheSiteIsTheUsersLineWithTheLibraryCallBesideIt) {
  zt::test::TempDir dir;
  const std::string path = dir.file("lib.db");
  ASSERT_TRUE(zt::test::write_library_trace(path));
  auto r = open_trace(path);
  std::unique_ptr<StackSites> sites;
  ASSERT_TRUE(StackSites::load(*r, &sites).ok());
  EXPECT_EQ(sites->site(6, SiteLevel::Line), "compute_loss (/w/hf_job.py:36) via numpy ones");
  EXPECT_EQ(sites->site(6, SiteLevel::Function), "compute_loss (/w/hf_job.py) via numpy ones");
  EXPECT_EQ(sites->site(6, SiteLevel::Module), "/w/hf_job.py");
  EXPECT_EQ(sites->site(8, SiteLevel::Line), "compute_loss (/w/hf_job.py:36)");  // the interpreter is no library
  EXPECT_EQ(sites->site(19, SiteLevel::Line), "compute_loss (/w/hf_job.py:36)");
  EXPECT_EQ(sites->site(11, SiteLevel::Line), "step (/w/job.py:9) via numpy PyArray_Empty");
  // No frame of the user's: the innermost Python frame, library or not (exec()'d code is no user's).
  EXPECT_EQ(sites->site(14, SiteLevel::Line), "JSONEncoder.encode (/usr/lib/python3.11/json/encoder.py:200)");
  EXPECT_EQ(sites->site(17, SiteLevel::Line), "epoch (/opt/zt/share/zerotrace/python/zerotrace/__init__.py:40)");
  FrameRow f;
  f.line = 1;
  for (const char* lib : {"/usr/lib/python3.11/json/encoder.py", "/usr/local/lib/python3.12/threading.py",
                          "/home/u/.pyenv/versions/3.11.7/lib/python3.11/asyncio/base_events.py",
                          "/home/u/venv/lib/python3.11/site-packages/torch/nn/modules/module.py",
                          "/usr/lib/python3/dist-packages/numpy/core/numeric.py", "<frozen importlib._bootstrap>",
                          "/opt/zt/share/zerotrace/python/zerotrace/__init__.py", "<string>"}) {
    f.module = lib;
    EXPECT_FALSE(user_frame(f)) << lib;
  }
  for (const char* user : {"/w/hf_job.py", "/home/u/lib/train.py", "/srv/python3/job.py", "job.py"}) {
    f.module = user;
    EXPECT_TRUE(user_frame(f)) << user;
  }
}

TEST(Sites, TopCountsASampledRowForItsWeightWithItsError) {
  zt::test::TempDir dir;
  const std::string path = dir.file("lib.db");
  ASSERT_TRUE(zt::test::write_library_trace(path));
  TopOptions end;
  end.when = TopWhen::End;
  auto d = top(path, end);
  ASSERT_EQ(d.size(), 1u);
  // 3 exact rows of 2 MiB; compute_loss via numpy: 2 x 0.75 MiB; compute_loss: 0.5 MiB sampled, 64 KiB exact.
  EXPECT_EQ(d[0].total, 6 * MiB + 3 * MiB / 2 + MiB / 2 + MiB / 16);
  const SiteBytes* numpy = nullptr;
  for (auto& s : d[0].top)
    if (s.site == "compute_loss (/w/hf_job.py:36) via numpy ones") numpy = &s;
  ASSERT_NE(numpy, nullptr);
  EXPECT_EQ(numpy->bytes, 3 * MiB / 2);
  EXPECT_EQ(numpy->allocations, 2);
  EXPECT_EQ(numpy->sampled, 2);
  // Each row adds w (w - s) to the variance: 2 x 0.75 MiB x 0.25 MiB.
  EXPECT_NEAR(numpy->stderr_bytes, std::sqrt(2.0 * 0.75 * 0.25) * double(MiB), 1.0);
  for (auto& s : d[0].top)
    if (s.sampled == 0) {
      EXPECT_EQ(s.stderr_bytes, 0.0) << s.site;
    }
  // One line through two native paths is one site: a sampled row and an exact one.
  const SiteBytes* line = nullptr;
  for (auto& s : d[0].top)
    if (s.site == "compute_loss (/w/hf_job.py:36)") line = &s;
  ASSERT_NE(line, nullptr);
  EXPECT_EQ(line->allocations, 2);
  EXPECT_EQ(line->sampled, 1);
  EXPECT_EQ(line->bytes, (512 << 10) + (64 << 10));
  // The exact sums of the summary leave the sampled rows out: the 3 rows of 2 MiB and the 64 KiB one.
  auto r = open_trace(path);
  TraceSummary sum;
  ASSERT_TRUE(r->summarize(&sum).ok());
  ASSERT_EQ(sum.devices.size(), 1u);
  EXPECT_EQ(sum.devices[0].reserved_at_end, 6 * MiB + MiB / 16);
  std::vector<AllocationRow> rows;
  ASSERT_TRUE(r->read(&rows).ok());
  ASSERT_EQ(rows.size(), 7u);
  EXPECT_TRUE(rows[0].sampled());
  EXPECT_EQ(rows[0].counted_bytes(), 3 * MiB / 4);
  EXPECT_FALSE(rows[3].sampled());
}

// The Chrome export shows each sampled row with its weight; its memory counters are exact.
TEST(Sites, TheChromeExportMarksSampledRowsAndCountsOnlyExactOnes) {
  zt::test::TempDir dir;
  const std::string path = dir.file("lib.db");
  ASSERT_TRUE(zt::test::write_library_trace(path));
  ASSERT_TRUE(export_chrome(path, dir.file("lib.json")).ok());
  const std::string json = zt::test::read_file(dir.file("lib.json"));
  size_t marked = 0;
  for (size_t at = json.find("\"sampled_weight_bytes\":"); at != std::string::npos;
       at = json.find("\"sampled_weight_bytes\":", at + 1))
    ++marked;
  EXPECT_EQ(marked, 3u);
  EXPECT_NE(json.find("\"reserved\":" + std::to_string(6 * MiB + MiB / 16) + "}"), std::string::npos);
  EXPECT_EQ(json.find("\"reserved\":" + std::to_string(6 * MiB + MiB / 16 + MiB / 2) + "}"), std::string::npos);
}

// A trace from before allocation.weight_bytes: it reads, merges, and takes new rows.
TEST_F(LeakTrace, AFileWithoutSampledRowsColumnReadsMergesAndTakesRows) {
  const std::string old = dir.file("old.db");
  ASSERT_TRUE(zt::test::write_python_leak_trace(old));
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(old.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "DROP VIEW allocation_v; ALTER TABLE allocation DROP COLUMN weight_bytes;"
                             "UPDATE rank SET rank = 1; UPDATE device SET rank = 1; UPDATE allocation SET rank = 1;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
  {
    auto r = open_trace(old);
    ASSERT_TRUE(r);
    EXPECT_FALSE(r->has_weights());
    std::vector<AllocationRow> rows;
    ASSERT_TRUE(r->read(&rows).ok());
    for (auto& a : rows) EXPECT_FALSE(a.sampled());
    QueryResult q;
    ASSERT_TRUE(r->query("SELECT count(*) FROM allocation_v WHERE weight_bytes IS NULL", &q).ok());
    EXPECT_EQ(q.rows[0][0], "9");
  }
  TopOptions end;
  end.when = TopWhen::End;
  EXPECT_EQ(listed(top(old, end)[0]), "grow (/w/leak.py:12)=16/4, make_table (/usr/lib/libtable.so+0x2000)=2/1");
  // Merged with a file that has sampled rows: theirs keep their weights, the old file's rows have none.
  const std::string sampled = dir.file("sampled.db");
  ASSERT_TRUE(zt::test::write_library_trace(sampled));
  const std::string merged = dir.file("merged.db");
  zt::Status s = merge_traces(merged, {sampled, old}, false);
  ASSERT_TRUE(s.ok()) << s.message();
  {
    auto m = open_trace(merged);
    QueryResult q;
    ASSERT_TRUE(m->query("SELECT count(weight_bytes), count(*) FROM allocation", &q).ok());
    EXPECT_EQ(q.rows[0][0], "3");
    EXPECT_EQ(q.rows[0][1], "16");
  }
  std::unique_ptr<TraceWriter> w;
  s = TraceWriter::append(old, &w);
  ASSERT_TRUE(s.ok()) << s.message();
  w->begin();
  AllocationRow a;
  a.id = 100, a.rank = 0, a.device_id = 1, a.memory_kind = MemoryKind::PageableHost, a.level = AllocLevel::Segment;
  a.bytes = a.requested_bytes = 1000, a.t_alloc = 20, a.source = Source::HostHook, a.weight_bytes = 600000;
  w->insert(a);
  w->commit();
  ASSERT_TRUE(w->finish().ok());
  auto r = open_trace(old);
  EXPECT_TRUE(r->has_weights());
}
