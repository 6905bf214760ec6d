// Issue 29: a trace is checked before it is trusted. Each hostile file the issue tried (a string
// id of -5 or 4e12, a device on rank 2^31-1, an allocation at INT64_MIN, a step marker whose time
// is text) is refused by TraceReader::open with one line naming the file, the table, the row, the
// column and the value; a table that is a view and views the file redefines are not obeyed; the
// run row is in the trace file itself from the start of a run; `zt db sql`'s limits stop a query.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>

#include "../hand_trace.h"
#include "../hostile_traces.h"
#include "../test_util.h"
#include "zt/db/export.h"
#include "zt/db/trace_reader.h"
#include "zt/db/trace_values.h"
#include "zt/db/trace_writer.h"
#include "zt/probe/recorder.h"

using namespace zt;
using namespace zt::db;

namespace {

// A small finished trace: rank 0 with a GPU, two steps, allocations, a transfer, a counter.
std::string small_trace(const test::TempDir& dir, const std::string& name = "t.db") {
  const std::string path = dir.file(name);
  auto w = test::hand_written_trace(path, "zt train --steps 2");
  EXPECT_TRUE(w);
  w->insert(StringRow{1, "step 0"});
  w->insert(StringRow{2, "block0.gathered"});
  w->insert(StringRow{3, "allocated"});
  w->insert(DeviceRow{1, 0, DeviceKind::Sim, 0, "cuda:0", "simulated GPU", int64_t(1) << 30, true});
  for (int s = 0; s < 2; ++s) {
    MarkerRow m;
    m.id = s + 1, m.kind = MarkerKind::Step, m.name_id = 1, m.t_start = 1000 + 100 * s, m.t_end = 1090 + 100 * s;
    m.step = s, m.epoch = 0;
    w->insert(m);
    AllocationRow a;
    a.id = s + 1, a.device_id = 1, a.bytes = a.requested_bytes = 4096, a.t_alloc = 1010 + 100 * s;
    a.t_free = 1050 + 100 * s, a.name_id = 2;
    w->insert(a);
  }
  TransferRow x;
  x.id = 1, x.bytes = 100, x.t_start = 1020, x.t_end = 1030, x.dst_device_id = 1;
  w->insert(x);
  CounterRow c;
  c.id = 1, c.device_id = 1, c.name_id = 3, c.t = 1040, c.value = 4096;
  w->insert(c);
  w->set_run_end(1, 2000, RunStatus::Ok, 0, "");
  w->commit();
  EXPECT_TRUE(w->finish());
  return path;
}

std::string refusal(const std::string& path, TraceReader::Checks checks = TraceReader::Checks::All) {
  std::unique_ptr<TraceReader> r;
  Status s = TraceReader::open(path, &r, checks);
  EXPECT_FALSE(s.ok()) << path << " opened";
  return s.message();
}

}  // namespace

TEST(TraceValues, AGoodTraceOpens) {
  test::TempDir dir;
  std::unique_ptr<TraceReader> r;
  Status s = TraceReader::open(small_trace(dir), &r);
  EXPECT_TRUE(s.ok()) << s.message();
}

// The issue's four files for `zt view`, and the text time that made `zt db info` say "zt: stoll".
TEST(TraceValues, TheIssuesFilesAreRefusedNamingFileTableRowColumnAndValue) {
  struct Case {
    const char* sql;
    const char* expected;
  } cases[] = {
      {test::kIssueTraceEdits[0].sql, ": string row -5: id is -5; it must be a string id (an integer in 1 .. 2147483647)"},
      {test::kIssueTraceEdits[1].sql, ": string row 4000000000000: id is 4000000000000; it must be a string id"},
      {test::kIssueTraceEdits[2].sql, ": device row 1: rank is 2147483647; it must be a rank (an integer in 0 .. 1048575)"},
      {test::kIssueTraceEdits[3].sql,
       ": allocation row 1: t_alloc is -9223372036854775808; it must be a time (an integer in 0 .. 2^62 ns)"},
      {test::kIssueTraceEdits[4].sql, ": marker row 1: t_start is the text 'abc'; it must be a time"},
      {"UPDATE allocation SET t_free=5 WHERE id=2", ": allocation row 2: t_free 5 is before t_alloc 1110; a span cannot end before it starts"},
      {"UPDATE transfer SET bytes=-1", ": transfer row 1: bytes is -1; it must be a size (an integer in 0 .. 2^53 bytes)"},
      {"UPDATE marker SET kind=9 WHERE id=1", ": marker row 1: kind is 9; it must be a code of enum_marker_kind (0, 1, 2, 3, 4; db/SCHEMA.md)"},
      {"UPDATE counter SET value='lots'", ": counter row 1: value is the text 'lots'; it must be NULL or a number"},
      {"UPDATE marker SET step=x'00ff' WHERE id=1", ": marker row 1: step is a blob of 2 bytes; it must be NULL or a step number"},
      {"UPDATE rank SET role=7", ": rank row 0: role is 7; it must be a code of enum_rank_role (0, 1, 2, 3; db/SCHEMA.md)"},
      {"UPDATE rank SET job_rank=-1", ": rank row 0: job_rank is -1; it must be NULL or a rank (an integer in 0 .. 1048575)"},
  };
  for (const Case& c : cases) {
    test::TempDir dir;
    const std::string path = small_trace(dir);
    test::edit_trace(path, c.sql);
    const std::string msg = refusal(path);
    EXPECT_EQ(msg.rfind(path + ":", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.expected), std::string::npos) << c.sql << "\n" << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

// Each value in its range is not enough: a reader sums sizes and spans. A table's add up to at
// most 2^62, so every sum fits an int64 however many rows a file holds.
TEST(TraceValues, ATablesSizesAndSpansAddUpToAtMost2To62) {
  {
    test::TempDir dir;
    const std::string path = small_trace(dir);
    test::edit_trace(path, "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 600) "
               "INSERT INTO allocation(rank,device_id,memory_kind,level,address,bytes,requested_bytes,t_alloc,source) "
               "SELECT 0, 1, 1, 0, i, 9007199254740992, 0, 5000, 0 FROM n");
    EXPECT_NE(refusal(path).find(": allocation: bytes add up to more than 2^62 over the table's rows"), std::string::npos);
    // The viewer's streaming check says the same, at the row where the sum passes 2^62.
    std::unique_ptr<TraceReader> r;
    ASSERT_TRUE(TraceReader::open(path, &r, TraceReader::Checks::SmallTables));
    sqlite3_stmt* st = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(r->handle(), "SELECT bytes, id FROM allocation ORDER BY id", -1, &st, nullptr), SQLITE_OK);
    RowCheck check(path, "allocation", st, 1);
    bool all = true;
    while (sqlite3_step(st) == SQLITE_ROW && (all = check.ok(st))) {
    }
    sqlite3_finalize(st);
    EXPECT_FALSE(all);
    EXPECT_NE(check.error().message().find("allocation row 514: bytes of the rows so far add up to more than 2^62"),
              std::string::npos)
        << check.error().message();
  }
  test::TempDir dir;
  const std::string path = small_trace(dir);
  test::edit_trace(path, "INSERT INTO transfer(rank,kind,bytes,t_start,t_end,source) VALUES (0,0,1,0,4611686018427387904,0),"
             "(0,0,1,0,4611686018427387904,0)");
  EXPECT_NE(refusal(path).find(": transfer: the spans from t_start to t_end add up to more than 2^62"), std::string::npos);
}

// Two traces that each keep the rules can break one together (device ids offset past 2^31 - 1):
// `zt db merge` checks what it made before it replaces anything.
TEST(TraceValues, AMergeThatWouldBreakARuleWritesNothing) {
  test::TempDir dir;
  const std::string a = small_trace(dir, "a.db"), b = small_trace(dir, "b.db");
  test::edit_trace(a, "UPDATE device SET id=2147483640; UPDATE allocation SET device_id=2147483640;"
                      "UPDATE transfer SET dst_device_id=2147483640; UPDATE counter SET device_id=2147483640");
  test::edit_trace(b, "UPDATE rank SET rank=1; UPDATE device SET id=20, rank=1; UPDATE allocation SET device_id=20, rank=1;"
                      "UPDATE transfer SET dst_device_id=20, rank=1; UPDATE counter SET device_id=20, rank=1;"
                      "UPDATE marker SET rank=1");
  Status s = merge_traces(dir.file("m.db"), {a, b}, false);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("m.db: the merged trace would break a rule of db/SCHEMA.md (device row 2147483660: id is "
                             "2147483660; it must be a device id"),
            std::string::npos)
      << s.message();
  EXPECT_FALSE(std::filesystem::exists(dir.file("m.db")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("m.db.merging")));
}

TEST(TraceValues, TextFromTheFileIsPrintedEscaped) {
  test::TempDir dir;
  const std::string path = small_trace(dir);
  test::edit_trace(path, "UPDATE marker SET t_start=char(27)||'[2J'||char(7) WHERE id=1");
  const std::string msg = refusal(path);
  EXPECT_NE(msg.find("t_start is the text '\\x1b[2J\\x07'"), std::string::npos) << msg;
}

// The viewer checks the large tables itself as it streams them; SmallTables leaves them to it.
TEST(TraceValues, SmallTablesLeavesTheStreamedOnesToTheirReader) {
  test::TempDir dir;
  const std::string path = small_trace(dir);
  test::edit_trace(path, "UPDATE allocation SET t_alloc=-1 WHERE id=1");
  std::unique_ptr<TraceReader> r;
  ASSERT_TRUE(TraceReader::open(path, &r, TraceReader::Checks::SmallTables));
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(r->handle(), "SELECT t_alloc, id FROM allocation ORDER BY id", -1, &st, nullptr), SQLITE_OK);
  RowCheck check(path, "allocation", st, 1);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_FALSE(check.ok(st));
  EXPECT_NE(check.error().message().find("allocation row 1: t_alloc is -1"), std::string::npos) << check.error().message();
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_TRUE(check.ok(st));
  sqlite3_finalize(st);
  test::edit_trace(path, "UPDATE string SET id=-5 WHERE id=3");
  EXPECT_NE(refusal(path, TraceReader::Checks::SmallTables).find("string row -5"), std::string::npos);
  // zt db sql looks at a damaged trace as it is.
  EXPECT_TRUE(TraceReader::open(path, &r, TraceReader::Checks::None));
}

// A view where a table should be could run any query under ours; views the file defines are
// shadowed by the reader's own.
TEST(TraceValues, TablesThatAreViewsAreRefusedAndTheFilesViewsAreNotUsed) {
  test::TempDir dir;
  const std::string path = small_trace(dir);
  test::edit_trace(path, "DROP VIEW marker_v; CREATE VIEW marker_v AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) "
             "SELECT x AS id, 0 AS rank, 'step' AS kind, '' AS name, x AS t_start, NULL AS t_end, 0 AS step, NULL AS micro_step, "
             "0 AS epoch, NULL AS value FROM c");
  std::unique_ptr<TraceReader> r;
  ASSERT_TRUE(TraceReader::open(path, &r));
  QueryResult q;
  ASSERT_TRUE(r->query("SELECT count(*) FROM marker_v", &q));  // ours: two rows, not an endless recursion
  EXPECT_EQ(q.rows.at(0).at(0), "2");
  r.reset();
  test::edit_trace(path, "ALTER TABLE kernel RENAME TO kernel_rows; CREATE VIEW kernel AS SELECT * FROM kernel_rows");
  const std::string msg = refusal(path, TraceReader::Checks::None);
  EXPECT_NE(msg.find("not a zerotrace trace (kernel is a view, not a table)"), std::string::npos) << msg;
}

// A trace copied without its -wal while the run records still says what ran, and that it has not
// ended: the run row is checkpointed into the file at the start.
TEST(TraceValues, TheRunRowIsInTheTraceFileItselfFromTheStart) {
  test::TempDir dir;
  probe::RecorderOptions o;
  o.path = dir.file("live.db");
  o.command_line = "zt train --steps 100";
  o.crash_handlers = false;
  std::unique_ptr<probe::Recorder> rec;
  ASSERT_TRUE(probe::Recorder::open(o, &rec));
  std::filesystem::copy_file(o.path, dir.file("copy.db"));  // the file alone, no -wal
  std::unique_ptr<TraceReader> r;
  ASSERT_TRUE(TraceReader::open(dir.file("copy.db"), &r));
  std::vector<RunRow> runs;
  ASSERT_TRUE(r->read(&runs));
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].command_line, "zt train --steps 100");
  EXPECT_EQ(runs[0].status, RunStatus::Running);
  EXPECT_FALSE(runs[0].t_end);
  EXPECT_TRUE(rec->close());
}

TEST(TraceValues, QueryLimitsStopARunawayQuery) {
  test::TempDir dir;
  std::unique_ptr<TraceReader> r;
  ASSERT_TRUE(TraceReader::open(small_trace(dir), &r, TraceReader::Checks::None));
  const std::string endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x FROM c";
  QueryResult q;
  QueryLimits rows;
  rows.max_rows = 1000;
  Status s = r->query(endless, &q, rows);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(q.stopped, QueryResult::Stopped::RowLimit);
  EXPECT_EQ(q.rows.size(), 1000u);
  EXPECT_NE(s.message().find("more than 1000 rows; stopped there (--max-rows N for more, 0 for no limit)"), std::string::npos)
      << s.message();
  QueryLimits time;
  time.timeout_ms = 200;
  const auto t0 = std::chrono::steady_clock::now();
  s = r->query("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c", &q, time);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(q.stopped, QueryResult::Stopped::Timeout);
  EXPECT_LT(secs, 5.0);
  EXPECT_NE(s.message().find("the query ran longer than 200.00 ms; stopped"), std::string::npos) << s.message();
  volatile std::sig_atomic_t flag = 0;
  QueryLimits interrupt;
  interrupt.interrupted = &flag;
  std::thread ctrl_c([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    flag = 1;
  });
  s = r->query("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c", &q, interrupt);
  ctrl_c.join();
  EXPECT_EQ(q.stopped, QueryResult::Stopped::Interrupted);
  EXPECT_NE(s.message().find("the query was interrupted"), std::string::npos) << s.message();
  // And the connection still answers.
  EXPECT_TRUE(r->query("SELECT count(*) FROM allocation", &q));
}
