// PyTorch memory snapshots in and out of traces (zt/db/torch_snapshot.h), the restricted pickle
// reader under them (zt/db/pickle.h), and Nsight Systems exports (zt/db/nsys_import.h). The
// fixtures are written by tests/db/torch_fixtures.py with Python's own pickle and sqlite3 modules
// from dicts and tables in the documented formats: no torch, no nsys.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <random>

#include "../hand_trace.h"
#include "../test_util.h"
#include "zt/db/nsys_import.h"
#include "zt/db/pickle.h"
#include "zt/db/torch_snapshot.h"
#include "zt/db/trace_reader.h"

namespace zt {
namespace {

using test::TempDir;
constexpr int64_t MiB = 1 << 20;
constexpr uint64_t S1 = 0x7F0000000000, S2 = 0x7F0001000000, D1 = 0x7F1000000000;

#define NEED_PYTHON()                                                                   \
  do {                                                                                  \
    if (std::string(ZT_PYTHON3).empty()) GTEST_SKIP() << "no python3 found by CMake"; \
  } while (0)

// Writes fixture `kind` to `out` (see torch_fixtures.py).
void fixture(const std::string& kind, const std::string& out, const std::string& args = "") {
  auto r = test::run_command(std::string(ZT_PYTHON3) + " " + ZT_SOURCE_DIR + "/tests/db/torch_fixtures.py " + kind +
                             " " + out + (args.empty() ? "" : " " + args) + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
}

std::unique_ptr<db::TraceReader> open(const std::string& path) {
  std::unique_ptr<db::TraceReader> r;
  Status s = db::TraceReader::open(path, &r);
  EXPECT_TRUE(s.ok()) << s.message();
  return r;
}

std::vector<std::vector<std::string>> sql(db::TraceReader& r, const std::string& q) {
  db::QueryResult out;
  Status s = r.query(q, &out);
  EXPECT_TRUE(s.ok()) << s.message() << "\n" << q;
  return out.rows;
}
int64_t sql_int(db::TraceReader& r, const std::string& q) {
  auto rows = sql(r, q);
  return rows.empty() || rows[0].empty() || rows[0][0] == "NULL" ? -1 : std::stoll(rows[0][0]);
}

// Live bytes of a level ("block" = allocated, "segment" = reserved) on a device at time t; second
// records skipped, as every sum of the trace does.
int64_t live(db::TraceReader& r, const std::string& device, const std::string& level, int64_t t) {
  return sql_int(r, "SELECT coalesce(sum(a.bytes), 0) FROM allocation a JOIN device d ON d.id = a.device_id "
                    "JOIN enum_level l ON l.code = a.level WHERE d.label = '" + device + "' AND l.name = '" + level +
                    "' AND a.t_alloc <= " + std::to_string(t) + " AND (a.t_free IS NULL OR a.t_free > " +
                    std::to_string(t) + ") AND NOT (a.level = 1 AND a.segment_id IS NOT NULL)");
}

class TorchSnapshot : public ::testing::Test {
 protected:
  void SetUp() override {
    NEED_PYTHON();
    snap_ = dir_.file("snap.pickle");
    fixture("snapshot", snap_);
    trace_ = dir_.file("snap.db");
    Status s = db::import_torch_snapshot(snap_, trace_, &st_);
    ASSERT_TRUE(s.ok()) << s.message();
    r_ = open(trace_);
    ASSERT_TRUE(r_);
  }
  TempDir dir_;
  std::string snap_, trace_;
  db::TorchImportStats st_;
  std::unique_ptr<db::TraceReader> r_;
};

TEST_F(TorchSnapshot, BlocksLieInsideTheirSegments) {
  EXPECT_EQ(st_.devices, 2);
  EXPECT_EQ(st_.events, 17);
  EXPECT_EQ(st_.segments, 3);
  EXPECT_EQ(st_.blocks, 8);  // six allocations on cuda:0; on cuda:1 one from before the history and one in it
  EXPECT_EQ(st_.size_mismatches, 0);
  EXPECT_EQ(st_.ooms, 1);
  // Every block row sits inside the segment row it names, both PyTorch's.
  EXPECT_EQ(sql_int(*r_, "SELECT count(*) FROM allocation b JOIN allocation s ON s.id = b.segment_id WHERE b.level = 0 "
                         "AND s.level = 1 AND b.address >= s.address AND b.address + b.bytes <= s.address + s.bytes "
                         "AND b.device_id = s.device_id AND b.source = 4 AND s.source = 4"),
            8);
  EXPECT_EQ(sql_int(*r_, "SELECT count(*) FROM allocation WHERE level = 0 AND segment_id IS NULL"), 0);
  // The sizes memory_allocated() counts: 512-byte rounding, and a free block handed out whole
  // where too little would remain to split.
  auto sizes = sql(*r_, "SELECT address, bytes, requested_bytes, t_alloc FROM allocation WHERE level = 0 AND "
                        "device_id = 1 ORDER BY t_alloc");
  ASSERT_EQ(sizes.size(), 6u);
  const std::vector<std::vector<int64_t>> want = {
      {int64_t(S1), 1024, 1000},
      {int64_t(S1 + 1024), 512, 512},
      {int64_t(S2), 3 * MiB, 3 * MiB},
      {int64_t(S2 + 3 * MiB), 17 * MiB, 16 * MiB + 100},  // 1 MiB - 512 B left: not split
      {int64_t(S1), 1024, 600},                          // the freed 1024 B block, whole
      {int64_t(S2), 3 * MiB, 2 * MiB + 1},               // the freed 3 MiB block, whole
  };
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(std::stoll(sizes[i][0]), want[i][0]) << i;
    EXPECT_EQ(std::stoll(sizes[i][1]), want[i][1]) << i;
    EXPECT_EQ(std::stoll(sizes[i][2]), want[i][2]) << i;
  }
  EXPECT_EQ(sql_int(*r_, "SELECT stream FROM allocation WHERE level = 0 AND address = " + std::to_string(S1 + 1024)),
            140000000000);
}

TEST_F(TorchSnapshot, AllocatedAndReservedFollowTheHistory) {
  // Entry k of cuda:0 is at k µs after the first one (k * 1000 ns on the trace's clock).
  struct Point {
    int64_t t, allocated, reserved;
  };
  const std::vector<Point> cuda0 = {
      {500, 0, 2 * MiB},                          // the first segment, nothing in it yet
      {1500, 1024, 2 * MiB},                      // after the first allocation
      {5500, 20 * MiB + 1536, 22 * MiB},          // 1024 + 512 + 3 MiB + 17 MiB
      {6500, 20 * MiB + 512, 22 * MiB},           // free_requested: memory_allocated() drops here
      {8500, 20 * MiB + 1536, 22 * MiB},
      {9500, 17 * MiB + 1536, 22 * MiB},
      {11500, 17 * MiB + 1536, 22 * MiB},         // at the OOM
      {20000, 20 * MiB + 1536, 22 * MiB},         // at the end: the snapshot's own segment list
  };
  for (auto& p : cuda0) {
    EXPECT_EQ(live(*r_, "cuda:0", "block", p.t), p.allocated) << "t=" << p.t;
    EXPECT_EQ(live(*r_, "cuda:0", "segment", p.t), p.reserved) << "t=" << p.t;
  }
  db::TraceSummary sum;
  ASSERT_TRUE(r_->summarize(&sum).ok());
  ASSERT_EQ(sum.devices.size(), 2u);
  EXPECT_EQ(sum.devices[0].peak_allocated, 20 * MiB + 1536);
  EXPECT_EQ(sum.devices[0].peak_reserved, 22 * MiB);
  EXPECT_EQ(sum.devices[0].allocated_at_end, 20 * MiB + 1536);
}

TEST_F(TorchSnapshot, AHistoryThatWrappedKeepsWhatWasThereBefore) {
  // cuda:1's history starts 100 µs in with the free of a 4 MiB block nobody saw allocated, in a
  // 20 MiB segment known only from the final segment list.
  EXPECT_EQ(st_.before_history, 2);
  EXPECT_EQ(live(*r_, "cuda:1", "segment", 99999), 20 * MiB);
  EXPECT_EQ(live(*r_, "cuda:1", "block", 99999), 4 * MiB);
  EXPECT_EQ(live(*r_, "cuda:1", "block", 101500), 0);
  EXPECT_EQ(live(*r_, "cuda:1", "block", 102500), 8 * MiB);
}

TEST_F(TorchSnapshot, TheOomKeepsItsLiveBlocks) {
  auto e = sql(*r_, "SELECT kind, t, message, tensors, device_id, site FROM error");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0][0], "oom");
  EXPECT_EQ(e[0][1], "11000");
  EXPECT_NE(e[0][2].find("Tried to allocate 30.00 MiB (31457280 bytes)"), std::string::npos) << e[0][2];
  EXPECT_NE(e[0][2].find("(1048576 bytes) free"), std::string::npos) << e[0][2];
  EXPECT_NE(e[0][2].find("Of the allocated memory 17.00 MiB is allocated by PyTorch"), std::string::npos) << e[0][2];
  EXPECT_EQ(e[0][3].rfind("[\"train.py:14 keep_history\"", 0), 0u) << e[0][3];  // the largest first
  EXPECT_EQ(e[0][4], "1");
  // The run is marked failed, with PyTorch's words.
  auto run = sql(*r_, "SELECT status, exit_detail FROM run");
  EXPECT_EQ(run[0][0], "2");
  EXPECT_NE(run[0][1].find("out-of-memory"), std::string::npos);
}

TEST_F(TorchSnapshot, PythonFramesAreTheStack) {
  auto rows = sql(*r_, "SELECT a.stack_id, s.text FROM allocation a JOIN string s ON s.id = a.name_id WHERE "
                       "a.level = 0 AND a.address = " + std::to_string(S2 + 3 * MiB));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0][1], "train.py:14 keep_history");
  std::vector<std::string> lines;
  ASSERT_TRUE(r_->stack_text(std::stoll(rows[0][0]), &lines).ok());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "keep_history (/home/u/job/train.py:14)");
  EXPECT_EQ(lines[2], "<module> (/home/u/job/train.py:60)");
  // The family, where torch's frames say it.
  EXPECT_EQ(sql_int(*r_, "SELECT count(*) FROM allocation_v WHERE name = 'model.py:22 forward (activation)'"), 1);
  EXPECT_EQ(sql_int(*r_, "SELECT count(*) FROM allocation_v WHERE name = 'train.py:45 main (optimizer state)'"), 1);
  EXPECT_EQ(sql_int(*r_, "SELECT count(*) FROM allocation_v WHERE source = 'torch'"), 11);
}

// The Python side: pickle.load must read what we write, and memory_viz's reader knows only some
// opcodes (MemoryViz.js's unpickler): every one we write must be among them.
TEST_F(TorchSnapshot, ExportRoundTripKeepsEveryBlock) {
  const std::string out = dir_.file("again.pickle"), again = dir_.file("again.db");
  db::TorchExportStats ex;
  Status s = db::export_torch_snapshot(trace_, out, &ex);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ex.blocks, 8);
  db::TorchImportStats st2;
  s = db::import_torch_snapshot(out, again, &st2);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(st2.size_mismatches, 0);
  auto r2 = open(again);
  // Every block and segment, to the microsecond the snapshot keeps.
  const std::string q =
      "SELECT d.label, a.level, a.address, a.bytes, a.requested_bytes, a.t_alloc / 1000, a.t_free / 1000, a.stream, "
      "s.text FROM allocation a JOIN device d ON d.id = a.device_id LEFT JOIN string s ON s.id = a.name_id "
      "ORDER BY d.label, a.level, a.t_alloc, a.address";
  auto a = sql(*r_, q), b = sql(*r2, q);
  ASSERT_EQ(a.size(), 11u);
  EXPECT_EQ(a, b);
  // Stacks too.
  auto sa = sql(*r_, "SELECT stack_id FROM allocation ORDER BY device_id, level, t_alloc, address");
  auto sb = sql(*r2, "SELECT stack_id FROM allocation ORDER BY device_id, level, t_alloc, address");
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    std::vector<std::string> la, lb;
    if (sa[i][0] != "NULL") ASSERT_TRUE(r_->stack_text(std::stoll(sa[i][0]), &la).ok());
    if (sb[i][0] != "NULL") ASSERT_TRUE(r2->stack_text(std::stoll(sb[i][0]), &lb).ok());
    EXPECT_EQ(la, lb) << i;
  }
  EXPECT_EQ(sql(*r_, "SELECT kind, t / 1000, message FROM error"), sql(*r2, "SELECT kind, t / 1000, message FROM error"));
  const std::string check = std::string(ZT_PYTHON3) + " -c \"import pickle, pickletools, sys\n"
                            "data = open(sys.argv[1], 'rb').read()\n"
                            "snap = pickle.loads(data)\n"
                            "ok = {'PROTO','EMPTY_DICT','EMPTY_LIST','MARK','SETITEMS','APPENDS','BINUNICODE',\n"
                            "      'BINPUT','LONG_BINPUT','BINGET','LONG_BINGET','BININT','BININT1','BININT2','LONG1',\n"
                            "      'NEWTRUE','NEWFALSE','TUPLE','STOP'}\n"
                            "used = {op.name for op, arg, pos in pickletools.genops(data)}\n"
                            "assert used <= ok, used - ok\n"
                            "segs = snap['segments']; traces = snap['device_traces']\n"
                            "print(len(segs), [len(t) for t in traces], sorted(segs[0].keys()))\n"
                            "\" " + out + " 2>&1";
  auto r = test::run_command(check);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("3 ["), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("'blocks'"), std::string::npos) << r.out;
}

// An error message is the file's text: a figure of more digits than an int64 holds is not one
// (std::stoll threw out of range in zt export, ending the process).
TEST_F(TorchSnapshot, AnOomMessageWithAFigurePastInt64IsExportedWithoutIt) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(trace_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE error SET message = 'Tried to allocate (123456789012345678901234 bytes)'", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  const std::string out = dir_.file("long.pickle");
  Status s = db::export_torch_snapshot(trace_, out);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(db::check_torch_snapshot(test::read_file(out)).ok());
}

// A trace keeps an address as an int64: one of 2^63 or more is negative there, and a snapshot's
// addresses are non-negative. The export leaves such a row out and counts it, so what zt exports, zt
// imports (fuzz_nsys found an export its own import refused).
TEST_F(TorchSnapshot, AnAddressPast2To63IsLeftOutOfTheExportAndCounted) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(trace_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE allocation SET address = -9223372036854775808 WHERE id = (SELECT min(id) FROM allocation "
                             "WHERE level = 1)",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  const std::string out = dir_.file("high.pickle");
  db::TorchExportStats ex;
  Status s = db::export_torch_snapshot(trace_, out, &ex);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ex.left_out, 1);
  EXPECT_EQ(ex.blocks, 8);  // a segment (level 1) was the one edited
  s = db::check_torch_snapshot(test::read_file(out));
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(TorchSnapshotForms, TheLegacySegmentListAndExpandableSegments) {
  NEED_PYTHON();
  TempDir dir;
  fixture("snapshot-legacy", dir.file("legacy.pickle"));
  db::TorchImportStats st;
  Status s = db::import_torch_snapshot(dir.file("legacy.pickle"), dir.file("legacy.db"), &st);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_FALSE(st.has_history);
  EXPECT_EQ(st.blocks, 1);
  auto r = open(dir.file("legacy.db"));
  EXPECT_EQ(sql(*r, "SELECT bytes, requested_bytes, s.text FROM allocation a JOIN string s ON s.id = a.name_id WHERE "
                    "level = 0")[0],
            (std::vector<std::string>{"4096", "4000", "train.py:14 keep_history"}));

  fixture("expandable", dir.file("exp.pickle"));
  s = db::import_torch_snapshot(dir.file("exp.pickle"), dir.file("exp.db"), &st);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(st.size_mismatches, 0);
  auto e = open(dir.file("exp.db"));
  EXPECT_EQ(live(*e, "cuda:0", "segment", 2500), 20 * MiB);
  EXPECT_EQ(live(*e, "cuda:0", "block", 2500), 9 * MiB);  // 5 + 4 MiB: an expandable segment splits any remainder
  EXPECT_EQ(live(*e, "cuda:0", "segment", 5500), 10 * MiB);  // half unmapped
  EXPECT_EQ(live(*e, "cuda:0", "block", 5500), 5 * MiB);
}

// zt probe's merge: PyTorch's history into the probed process's trace, on its clock, paired with
// CUPTI's records of the same cudaMallocs; a cuBLAS workspace stays outside PyTorch's allocator.
TEST(TorchSnapshotMerge, BlocksLandInsideCuptisSegments) {
  NEED_PYTHON();
  TempDir dir;
  constexpr int64_t T0us = 1'700'000'000'000'000, mono = 5'000'000'000;
  // The hook read its clock pair 20 µs after the history's first entry.
  const int64_t unix_ns = (T0us + 20) * 1000;
  fixture("snapshot", dir.file("s.pickle"),
          std::to_string(unix_ns) + " " + std::to_string(mono) + " run-7");
  const std::string trace = dir.file("probe.db");
  {
    auto w = test::hand_written_trace(trace, "python3 train.py");
    ASSERT_TRUE(w);
    w->insert(db::DeviceRow{1, 0, db::DeviceKind::Cuda, 0, "cuda:0", "NVIDIA H200", 150 * 1024 * MiB, false});
    w->insert(db::DeviceRow{2, 0, db::DeviceKind::Cpu, 0, "cpu", "", std::nullopt, false});
    auto seg = [&](int64_t id, uint64_t addr, int64_t bytes, int64_t t) {
      db::AllocationRow a;
      a.id = id, a.device_id = 1, a.level = db::AllocLevel::Segment, a.address = addr, a.bytes = bytes,
      a.requested_bytes = bytes, a.t_alloc = t, a.source = db::Source::Cupti;
      w->insert(a);
    };
    const int64_t e0 = mono - 20'000;  // the history's first entry on the probe's clock
    seg(1, S1, 2 * MiB, e0 - 300);     // cudaMalloc returns before the allocator records it
    seg(2, S2, 20 * MiB, e0 + 3000 - 300);
    seg(3, 0x7F5000000000, 64 * MiB, e0 + 4500);  // cuBLAS's workspace: not PyTorch's
    w->commit();
    ASSERT_TRUE(w->finish().ok());
  }
  const std::string before = test::read_file(trace);
  db::TorchImportStats st;
  Status s = db::merge_torch_snapshot(trace, dir.file("s.pickle"), "another-run", &st);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("written by another run"), std::string::npos) << s.message();
  EXPECT_EQ(test::read_file(trace), before) << "a refused merge left the trace as it was";

  s = db::merge_torch_snapshot(trace, dir.file("s.pickle"), "run-7", &st);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(st.on_probe_clock);
  EXPECT_EQ(st.cupti_paired, 2);
  auto r = open(trace);
  // CUPTI's two cudaMallocs are now second records of PyTorch's segments; the workspace is not.
  EXPECT_EQ(sql_int(*r, "SELECT count(*) FROM allocation c JOIN allocation t ON t.id = c.segment_id WHERE c.source = 1 "
                        "AND t.source = 4 AND c.address = t.address"),
            2);
  EXPECT_EQ(sql_int(*r, "SELECT count(*) FROM allocation WHERE source = 1 AND segment_id IS NULL"), 1);
  // Blocks on CUPTI's device row of their ordinal, at the probe's time; cuda:1, which CUPTI did
  // not see in this hand-made trace, gets a row of its own.
  const int64_t e0 = mono - 20'000;
  EXPECT_EQ(sql_int(*r, "SELECT count(*) FROM allocation WHERE source = 4 AND device_id = 1"), 8);
  EXPECT_EQ(sql_int(*r, "SELECT count(*) FROM device WHERE kind = 1"), 2);
  EXPECT_EQ(live(*r, "cuda:0", "block", e0 + 5500), 20 * MiB + 1536);
  // What PyTorch reserved, and the device's reserved with the memory outside PyTorch's allocator.
  EXPECT_EQ(sql_int(*r, "SELECT sum(bytes) FROM allocation WHERE source = 4 AND level = 1 AND t_free IS NULL AND "
                        "device_id = 1"),
            22 * MiB);
  EXPECT_EQ(live(*r, "cuda:0", "segment", e0 + 5500), 22 * MiB + 64 * MiB);
  db::TraceSummary sum;
  ASSERT_TRUE(r->summarize(&sum).ok());
  ASSERT_TRUE(sum.driver.has_value());
  EXPECT_EQ(sum.driver->paired, 2);
  EXPECT_EQ(sum.driver->outside_count, 1);
  EXPECT_EQ(sum.driver->outside_live_at_end, 64 * MiB);
  // Each block's name and stack, as in an import.
  EXPECT_EQ(sql_int(*r, "SELECT count(*) FROM allocation_v WHERE name = 'train.py:14 keep_history' AND level = 'block' "
                        "AND device = 'cuda:0'"),
            1);
}

// ---- the restricted pickle reader

std::string bytes_of(std::initializer_list<int> v) {
  std::string s;
  for (int c : v) s.push_back(char(c));
  return s;
}

TEST(Pickle, ReadsWhatPythonWritesForData) {
  // {'a': [1, -2, 70000, 2**40, 2**64 - 1, 1.5, True, None, 'é'], 'b': (1, 2)}, protocol 2 by hand.
  db::pickle::Result r = db::pickle::parse(
      bytes_of({0x80, 2, '}', 'q', 0, '(', 'X', 1, 0, 0, 0, 'a', ']', '(', 'K', 1, 'J', 0xfe, 0xff, 0xff, 0xff, 'J',
                0x70, 0x11, 1, 0, 0x8a, 6, 0, 0, 0, 0, 0, 1, 0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                0, 'G', 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x88, 'N', 'X', 2, 0, 0, 0, 0xc3, 0xa9, 'e', 'X', 1, 0, 0, 0,
                'b', 'K', 1, 'K', 2, 0x86, 'u', '.'}));
  ASSERT_TRUE(r.ok()) << r.error;
  const db::pickle::Value* a = r.value->get("a");
  ASSERT_TRUE(a && a->is_list());
  ASSERT_EQ(a->items.size(), 9u);
  EXPECT_EQ(a->items[0]->integer, 1);
  EXPECT_EQ(a->items[1]->integer, -2);
  EXPECT_EQ(a->items[2]->integer, 70000);
  EXPECT_EQ(a->items[3]->integer, int64_t(1) << 40);
  EXPECT_EQ(a->items[4]->kind, db::pickle::Kind::BigInt);
  EXPECT_EQ(a->items[5]->real, 1.5);
  EXPECT_EQ(a->items[6]->kind, db::pickle::Kind::Bool);
  EXPECT_EQ(a->items[7]->kind, db::pickle::Kind::None);
  EXPECT_EQ(a->items[8]->text, "\xc3\xa9");
  EXPECT_EQ(r.value->get("b")->kind, db::pickle::Kind::Tuple);
}

TEST(Pickle, RefusesCodeAndWhatIsNotData) {
  struct Case {
    std::string bytes, words;
  };
  using namespace std::string_literals;
  const std::vector<Case> cases = {
      {"\x80\x02" "cposix\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85R."s, "would import posix.system"},
      {std::string("\x80\x04\x8c\x02os\x8c\x06system\x93", 15) + ".", "would import os.system"},
      {"\x80\x02}.b"s, ""},  // STOP first: what follows is never read
      {"\x80\x02]q\x00h\x00" "a."s, "already shared"},         // a list inside itself
      {"\x80\x02", "truncated"},
      {"\x80\x02X\xff\x00\x00\x00" "ab."s, "truncated"},
      {"\x80\x09}.", "protocol 9"},
      {"(I1\n.", "INT"},                                   // protocol 0 text
      {"\x80\x02\x8f.", "EMPTY_SET"},
      {"\x80\x02h\x05."s, "never stored"},
      {"\x80\x02}(]K\x01u.", "unhashable"},
      {"\x80\x02\xff.", "unknown opcode 0xff"},
      {"", "empty"},
  };
  for (auto& c : cases) {
    db::pickle::Result r = db::pickle::parse(c.bytes);
    if (c.words.empty()) {
      EXPECT_TRUE(r.ok()) << r.error;
      continue;
    }
    EXPECT_FALSE(r.ok()) << c.words;
    EXPECT_NE(r.error.find(c.words), std::string::npos) << r.error;
    EXPECT_EQ(r.error.rfind("byte ", 0), 0u) << r.error;
  }
  // Nested deeper than the limit: refused, not a stack overflow.
  std::string deep = "\x80\x02";
  for (int i = 0; i < 100000; ++i) deep += "]";
  for (int i = 0; i < 100000; ++i) deep += "a";
  deep += ".";
  db::pickle::Result r = db::pickle::parse(deep);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.error.find("nested more than 64"), std::string::npos) << r.error;
}

TEST(Pickle, WriterAndReaderAgree) {
  std::string out;
  db::pickle::Writer w(&out);
  w.begin_dict();
  w.str("list");
  w.begin_list();
  for (int i = 0; i < 2500; ++i) w.integer(int64_t(i) * 100003 - 7);  // three APPENDS batches
  w.end_list();
  w.str("shared");
  w.begin_list();
  uint32_t memo = w.remember();
  w.str("x");
  w.end_list();
  w.str("again");
  w.recall(memo);
  w.str("big");
  w.integer(int64_t(1) << 47);
  w.str("neg");
  w.integer(-(int64_t(1) << 40));
  w.str("t");
  w.begin_tuple();
  w.integer(0);
  w.integer(0);
  w.end_tuple();
  w.str("f");
  w.real(0.25);
  w.str("b");
  w.boolean(false);
  w.str("n");
  w.none();
  w.end_dict();
  w.stop();
  db::pickle::Result r = db::pickle::parse(out);
  ASSERT_TRUE(r.ok()) << r.error;
  const auto* list = r.value->get("list");
  ASSERT_EQ(list->items.size(), 2500u);
  EXPECT_EQ(list->items[2499]->integer, 2499LL * 100003 - 7);
  EXPECT_EQ(r.value->get("shared"), r.value->get("again"));  // one object, as memoized
  EXPECT_EQ(r.value->get("big")->integer, int64_t(1) << 47);
  EXPECT_EQ(r.value->get("neg")->integer, -(int64_t(1) << 40));
  EXPECT_EQ(r.value->get("t")->items.size(), 2u);
  EXPECT_EQ(r.value->get("f")->real, 0.25);
}

// Any bytes: an answer, never a crash or a hang. Every truncation of a real snapshot and seeded
// random damage to it (what the fuzzers of tests/fuzz do at scale).
TEST(Pickle, DamagedSnapshotsAreRefusedNotCrashedOn) {
  NEED_PYTHON();
  TempDir dir;
  fixture("snapshot", dir.file("s.pickle"));
  const std::string good = test::read_file(dir.file("s.pickle"));
  ASSERT_TRUE(db::check_torch_snapshot(good).ok());
  for (size_t n = 0; n < good.size(); n += 7) EXPECT_FALSE(db::check_torch_snapshot(good.substr(0, n)).ok()) << n;
  std::mt19937_64 g(28);
  int refused = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string bad = good;
    for (int k = 0; k < 1 + i % 4; ++k) bad[g() % bad.size()] = char(g());
    refused += db::check_torch_snapshot(bad).ok() ? 0 : 1;
  }
  EXPECT_GT(refused, 100);
}

// ---- Nsight Systems

TEST(NsysImport, AllocationsCopiesKernelsAndRangesBecomeRows) {
  NEED_PYTHON();
  TempDir dir;
  fixture("nsys", dir.file("report.sqlite"));
  EXPECT_TRUE(db::is_nsys_export(dir.file("report.sqlite")));
  db::NsysImportStats st;
  Status s = db::import_nsys_export(dir.file("report.sqlite"), dir.file("nsys.db"), &st);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(st.processes, 2);
  EXPECT_EQ(st.allocations, 6);
  EXPECT_EQ(st.frees_unmatched, 1);
  EXPECT_EQ(st.transfers, 4);
  EXPECT_EQ(st.kernels, 1);
  EXPECT_EQ(st.memsets, 1);
  EXPECT_EQ(st.ranges, 2);
  EXPECT_EQ(st.marks, 1);
  auto r = open(dir.file("nsys.db"));
  // Nsight's memory kinds (0 pageable, 1 pinned, 2 device, 5 device static) read as ours; a
  // __device__ variable is a module global, as in zt probe's own traces.
  EXPECT_EQ(sql(*r, "SELECT rank, device, memory_kind, level, bytes, t_alloc, t_free, name FROM allocation_v "
                    "ORDER BY t_alloc"),
            (std::vector<std::vector<std::string>>{
                {"0", "cuda:0", "device", "segment", "67108864", "100", "900", "NULL"},
                {"0", "cpu", "pinned_host", "segment", "2097152", "110", "NULL", "NULL"},
                {"0", "cpu", "pageable_host", "segment", "1048576", "120", "NULL", "NULL"},
                {"0", "cuda:0", "device", "block", "1048576", "130", "NULL", "NULL"},
                {"0", "cuda:0", "module_global", "segment", "8", "140", "NULL", "my_global"},
                {"1", "cuda:0", "device", "segment", "4194304", "150", "NULL", "NULL"},
            }));
  EXPECT_EQ(sql(*r, "SELECT kind, bytes, src_device, dst_device, pinned, t_start, t_end FROM transfer_v ORDER BY t_start"),
            (std::vector<std::vector<std::string>>{
                {"H2D", "1048576", "cpu", "cuda:0", "1", "200", "210"},
                {"D2H", "2097152", "cuda:0", "cpu", "0", "220", "240"},
                {"D2D", "4194304", "cuda:0", "cuda:0", "NULL", "250", "260"},
                {"P2P", "8388608", "cuda:0", "cuda:1", "NULL", "270", "280"},
            }));
  EXPECT_EQ(sql(*r, "SELECT name, t_start, t_end FROM kernel_v ORDER BY t_start"),
            (std::vector<std::vector<std::string>>{{"void gemm_kernel<float>(float*, int)", "300", "350"},
                                                   {"memset 4096 B", "360", "370"}}));
  EXPECT_EQ(sql(*r, "SELECT kind, name, t_start, t_end, value FROM marker_v ORDER BY t_start"),
            (std::vector<std::vector<std::string>>{{"range", "epoch 1", "50", "950", "NULL"},
                                                   {"range", "step 0", "400", "500", "7"},
                                                   {"range", "checkpoint", "600", "600", "NULL"}}));
  EXPECT_EQ(sql(*r, "SELECT name, capacity_bytes FROM device WHERE label = 'cuda:0' AND rank = 0")[0],
            (std::vector<std::string>{"NVIDIA H200", "150754820096"}));
  EXPECT_EQ(sql_int(*r, "SELECT wall_start_unix_ns FROM run"), 1700000000000000000);
  EXPECT_EQ(sql_int(*r, "SELECT sum(events) FROM dropped"), 1);
}

// ---- zt import on the command line: bad and foreign files

struct Cli {
  int code;
  std::string out;
};
Cli zt_import(const std::string& args) {
  auto r = test::run_command(std::string(ZT_EXE) + " import " + args + " 2>&1");
  return {r.code, r.out};
}

TEST(ImportCli, BadOrForeignFilesAreRefusedAndNothingIsWritten) {
  NEED_PYTHON();
  using namespace std::string_literals;
  TempDir dir;
  fixture("snapshot", dir.file("good.pickle"));
  const std::string good = test::read_file(dir.file("good.pickle"));
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir.file(name), std::ios::binary) << bytes;
    return dir.file(name);
  };
  const std::string marker = dir.file("pwned");
  fixture("evil-reduce", dir.file("evil2.pickle"), "'touch " + marker + "'");
  fixture("evil-stack", dir.file("evil4.pickle"), "'touch " + marker + "'");
  fixture("sqlite-foreign", dir.file("recipes.sqlite"));
  // Values a reader refuses: events before the boot of the clock pair's machine; an Nsight export
  // whose kernel starts at -9e18 ns, without a session start time (which is checked against the
  // capture's start first): what an import would write is checked as a reader would.
  fixture("snapshot", dir.file("boot.pickle"), "4000000000000000000 0 run-1");
  fixture("nsys", dir.file("negative.sqlite"));
  ASSERT_EQ(std::system((std::string(ZT_PYTHON3) + " -c \"import sqlite3; d = sqlite3.connect('" + dir.file("negative.sqlite") +
                         "'); d.execute('UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = -9000000000000000000'); "
                         "d.execute('DELETE FROM TARGET_INFO_SESSION_START_TIME'); d.commit()\"")
                            .c_str()),
            0);
  // A session start past 2^62 ns, and a damaged schema whose SQLite error quotes SQL over lines.
  fixture("nsys", dir.file("utc.sqlite"));
  fixture("nsys", dir.file("schema.sqlite"));
  ASSERT_EQ(std::system((std::string(ZT_PYTHON3) + " -c \"import sqlite3; d = sqlite3.connect('" + dir.file("utc.sqlite") +
                         "'); d.execute('UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = 9223372036854775807'); "
                         "d.commit(); d = sqlite3.connect('" + dir.file("schema.sqlite") + "'); "
                         "d.execute('PRAGMA writable_schema=ON'); "
                         "d.execute(\\\"UPDATE sqlite_schema SET sql = replace(sql, 'gridY', '[') WHERE name = 'CUPTI_ACTIVITY_KIND_KERNEL'\\\"); "
                         "d.commit()\"")
                            .c_str()),
            0);
  std::string flipped = good;
  flipped[2] = char(0xff);  // the opcode after PROTO
  struct Case {
    std::string file, words;
  };
  const std::vector<Case> cases = {
      {dir.file("evil2.pickle"), "would import posix.system"},
      {dir.file("evil4.pickle"), "would import posix.system"},
      {write("half.pickle", good.substr(0, good.size() / 2)), "truncated"},
      {write("flipped.pickle", flipped), "unknown opcode 0xff"},
      {write("empty.pickle", ""), "empty file"},
      {write("notes.txt", "hello\n"), "neither a PyTorch memory snapshot"},
      {write("snap.json", "{\"segments\": []}"), "neither a PyTorch memory snapshot"},
      {write("report.nsys-rep", "NSYS-binary"), "export it first: nsys export --type sqlite"},
      {dir.file("recipes.sqlite"), "not an Nsight Systems export"},
      {write("list.pickle", "\x80\x02]q\x00(K\x01K\x02" "e."s), "segments[0] is an int, not a dict"},
      {write("str.pickle", "\x80\x02X\x02\x00\x00\x00hi."s), "holds a str, not a dict"},
      // Protocols 0 and 1 (pickle.dumps({"segments": []}, protocol=0 or 1)): what is not read is named.
      {write("p0.dat", "(dp0\nVsegments\np1\n(lp2\ns."s), "opcode PUT (0x70)"},
      {write("p1.dat", "}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02X\x01\x00\x00\x00xq\x03I01\nu."s), "opcode INT (0x49)"},
      {write("evil0.pickle", "cposix\nsystem\n(S'true'\ntR."s), "would import posix.system"},
      {dir.file("missing.pickle"), "no such"},
      {dir.file("boot.pickle"), "outside the clock of its 'zerotrace' pair"},
      {dir.file("utc.sqlite"), "utcEpochNs is 9223372036854775807, not a Unix time"},
      {dir.file("schema.sqlite"), "malformed database schema (CUPTI_ACTIVITY_KIND_KERNEL)"},
      {dir.file("negative.sqlite"), "its import would break a rule of db/SCHEMA.md (run row 1: t_start is -9000000000000000000"},
  };
  // An existing trace at -o stays as it was.
  const std::string out = dir.file("out.db");
  ASSERT_EQ(zt_import(dir.file("good.pickle") + " -o " + out).code, 0);
  const std::string kept = test::read_file(out);
  for (auto& c : cases) {
    Cli r = zt_import(c.file + " -o " + out);
    EXPECT_EQ(r.code, 2) << c.file << ": " << r.out;
    EXPECT_NE(r.out.find(c.file), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(c.words), std::string::npos) << c.words << " in: " << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_EQ(test::read_file(out), kept) << c.file;
    Cli fresh = zt_import(c.file + " -o " + dir.file("fresh.db"));
    EXPECT_EQ(fresh.code, 2);
    struct stat sb;
    EXPECT_NE(::stat(dir.file("fresh.db").c_str(), &sb), 0) << c.file << " left a file at -o";
    EXPECT_NE(::stat((dir.file("fresh.db") + ".importing").c_str(), &sb), 0) << c.file;
  }
  struct stat sb;
  EXPECT_NE(::stat(marker.c_str(), &sb), 0) << "a pickle ran code";
  // A trace is not imported again; the output may not be the input.
  Cli again = zt_import(out + " -o " + dir.file("x.db"));
  EXPECT_EQ(again.code, 2);
  EXPECT_NE(again.out.find("already a zerotrace trace"), std::string::npos) << again.out;
  Cli self = zt_import(dir.file("good.pickle") + " -o " + dir.file("good.pickle"));
  EXPECT_EQ(self.code, 2) << self.out;
  EXPECT_EQ(test::read_file(dir.file("good.pickle")), good);
}

TEST(ImportCli, ImportExportAndTheOtherCommandsReadTheTrace) {
  NEED_PYTHON();
  TempDir dir;
  fixture("snapshot", dir.file("s.pickle"));
  Cli r = zt_import(dir.file("s.pickle") + " -o " + dir.file("s.db"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("8 blocks"), std::string::npos) << r.out;
  auto info = test::run_command(std::string(ZT_EXE) + " db info " + dir.file("s.db") + " 2>&1");
  EXPECT_EQ(info.code, 0) << info.out;
  EXPECT_NE(info.out.find("20.00 MiB"), std::string::npos) << info.out;
  // zt check fails the run on its OOM and names the largest tensors alive then, with their line.
  auto check = test::run_command(std::string(ZT_EXE) + " check " + dir.file("s.db") + " --run 2>&1");
  EXPECT_EQ(check.code, 1) << check.out;
  EXPECT_NE(check.out.find("train.py:14 keep_history 17.00 MiB"), std::string::npos) << check.out;
  auto exp = test::run_command(std::string(ZT_EXE) + " export " + dir.file("s.db") + " --torch-snapshot " +
                               dir.file("back.pickle") + " 2>&1");
  EXPECT_EQ(exp.code, 0) << exp.out;
  EXPECT_NE(exp.out.find("8 blocks"), std::string::npos) << exp.out;
  auto none = test::run_command(std::string(ZT_EXE) + " export " + dir.file("s.db") + " 2>&1");
  EXPECT_EQ(none.code, 2) << none.out;
  fixture("nsys", dir.file("n.sqlite"));
  r = zt_import(dir.file("n.sqlite") + " -o " + dir.file("n.db"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("4 copies"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace zt
