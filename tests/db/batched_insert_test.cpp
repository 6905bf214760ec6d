// TraceWriter's waiting rows: inside a transaction the busy tables' rows go in at commit() as
// multi-row INSERTs, and a free or marker end for a row still waiting is written into it. What
// reads back must be what a row-by-row writer would have left.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <stdexcept>
#include <string>

#include "../test_util.h"
#include "zt/db/trace_reader.h"
#include "zt/db/trace_writer.h"

using namespace zt::db;

namespace {

AllocationRow alloc(int64_t id) {
  AllocationRow r;
  r.id = id;
  r.rank = 0;
  r.device_id = 1;
  r.address = 0x1000 + uint64_t(id) * 256;
  r.bytes = 256;
  r.requested_bytes = 200 + id % 50;
  r.t_alloc = 1000 + id;
  r.name_id = id % 3;  // 0 is written as NULL
  r.stream = id % 2 ? std::optional<int64_t>(7) : std::nullopt;
  return r;
}

std::vector<AllocationRow> read_allocations(const std::string& path) {
  std::unique_ptr<TraceReader> r;
  EXPECT_TRUE(TraceReader::open(path, &r).ok());
  std::vector<AllocationRow> rows;
  zt::Status s = r->read(&rows);
  EXPECT_TRUE(s.ok()) << s.message();
  return rows;
}

int64_t count(sqlite3* db, const char* sql) {
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql, -1, &st, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  EXPECT_EQ(sqlite3_step(st), SQLITE_ROW);
  int64_t n = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  return n;
}

struct Trace {
  zt::test::TempDir dir;
  std::string path = dir.file("t.db");
  std::unique_ptr<TraceWriter> w;
  Trace() { EXPECT_TRUE(TraceWriter::create(path, &w).ok()); }
  std::vector<AllocationRow> finish() {
    EXPECT_TRUE(w->finish().ok());
    w.reset();
    return read_allocations(path);
  }
};

}  // namespace

// 100 rows (three groups of 32 and a remainder of 4) come back field for field, in id order.
TEST(BatchedInsert, RowsComeBackAsWritten) {
  Trace t;
  t.w->begin();
  for (int64_t id = 1; id <= 100; ++id) t.w->insert(alloc(id));
  t.w->commit();
  std::vector<AllocationRow> rows = t.finish();
  ASSERT_EQ(rows.size(), 100u);
  for (int64_t id = 1; id <= 100; ++id) {
    const AllocationRow& r = rows[size_t(id - 1)];
    AllocationRow want = alloc(id);
    EXPECT_EQ(r.id, want.id);
    EXPECT_EQ(r.address, want.address);
    EXPECT_EQ(r.requested_bytes, want.requested_bytes);
    EXPECT_EQ(r.t_alloc, want.t_alloc);
    EXPECT_EQ(r.name_id, want.name_id);
    EXPECT_EQ(r.stream, want.stream);
    EXPECT_FALSE(r.t_free.has_value());
  }
}

// handle() is for the caller's own SQL on the same connection: it sees every row inserted.
TEST(BatchedInsert, HandleWritesTheWaitingRowsFirst) {
  Trace t;
  t.w->begin();
  for (int64_t id = 1; id <= 45; ++id) t.w->insert(alloc(id));
  EXPECT_EQ(count(t.w->handle(), "SELECT count(*) FROM allocation"), 45);
  t.w->commit();
}

// A free of a waiting row is written into it; of a committed row, by an UPDATE; of a row that is
// nowhere, it says so (the probe retries it later).
TEST(BatchedInsert, FreesReachWaitingAndCommittedRows) {
  Trace t;
  t.w->begin();
  for (int64_t id = 1; id <= 40; ++id) t.w->insert(alloc(id));
  EXPECT_TRUE(t.w->set_allocation_freed(5, 5005));
  EXPECT_TRUE(t.w->set_allocation_freed(40, 5040));
  EXPECT_FALSE(t.w->set_allocation_freed(41, 1));
  t.w->commit();
  t.w->begin();
  EXPECT_TRUE(t.w->set_allocation_freed(6, 5006));
  t.w->insert(alloc(41));
  EXPECT_TRUE(t.w->set_allocation_freed(41, 5041));
  t.w->commit();
  std::vector<AllocationRow> rows = t.finish();
  ASSERT_EQ(rows.size(), 41u);
  for (const AllocationRow& r : rows) {
    if (r.id == 5 || r.id == 6 || r.id == 40 || r.id == 41)
      EXPECT_EQ(r.t_free, std::optional<int64_t>(5000 + r.id)) << "row " << r.id;
    else
      EXPECT_FALSE(r.t_free.has_value()) << "row " << r.id;
  }
}

// Ids from several threads' rings arrive out of order: the waiting rows are found all the same.
TEST(BatchedInsert, FreesFindWaitingRowsInAnyIdOrder) {
  Trace t;
  t.w->begin();
  for (int64_t id : {50, 10, 30, 20, 70}) t.w->insert(alloc(id));
  EXPECT_TRUE(t.w->set_allocation_freed(10, 1010));
  EXPECT_FALSE(t.w->set_allocation_freed(11, 1));
  t.w->insert(alloc(60));
  EXPECT_TRUE(t.w->set_allocation_freed(60, 1060));
  EXPECT_TRUE(t.w->set_allocation_freed(70, 1070));
  t.w->commit();
  std::vector<AllocationRow> rows = t.finish();
  ASSERT_EQ(rows.size(), 6u);
  for (const AllocationRow& r : rows)
    EXPECT_EQ(r.t_free, r.id == 10 || r.id >= 60 ? std::optional<int64_t>(1000 + r.id) : std::nullopt) << r.id;
}

// More rows than may wait in one transaction: the early ones go in before the commit and are
// freed by UPDATE, the late ones still in memory.
TEST(BatchedInsert, ALongTransactionWritesAsItGoes) {
  Trace t;
  t.w->begin();
  const int64_t n = 20000;
  for (int64_t id = 1; id <= n; ++id) t.w->insert(alloc(id));
  EXPECT_TRUE(t.w->set_allocation_freed(1, 90001));
  EXPECT_TRUE(t.w->set_allocation_freed(n, 90002));
  t.w->commit();
  std::vector<AllocationRow> rows = t.finish();
  ASSERT_EQ(rows.size(), size_t(n));
  EXPECT_EQ(rows.front().t_free, std::optional<int64_t>(90001));
  EXPECT_EQ(rows.back().t_free, std::optional<int64_t>(90002));
}

// A marker's end keeps the value it had unless the end brings one (the UPDATE's coalesce).
TEST(BatchedInsert, MarkerEndsOfWaitingMarkers) {
  Trace t;
  t.w->begin();
  MarkerRow a;
  a.id = 3, a.t_start = 100, a.value = 5;
  MarkerRow b;
  b.id = 4, b.t_start = 110;
  t.w->insert(a);
  t.w->insert(b);
  EXPECT_TRUE(t.w->set_marker_end(3, 200, std::nullopt));
  EXPECT_TRUE(t.w->set_marker_end(4, 210, 9));
  EXPECT_FALSE(t.w->set_marker_end(5, 1, std::nullopt));
  t.w->commit();
  ASSERT_TRUE(t.w->finish().ok());
  t.w.reset();
  std::unique_ptr<TraceReader> r;
  ASSERT_TRUE(TraceReader::open(t.path, &r).ok());
  std::vector<MarkerRow> m;
  ASSERT_TRUE(r->read(&m).ok());
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].t_end, std::optional<int64_t>(200));
  EXPECT_EQ(m[0].value, std::optional<int64_t>(5));
  EXPECT_EQ(m[1].t_end, std::optional<int64_t>(210));
  EXPECT_EQ(m[1].value, std::optional<int64_t>(9));
}

// A bad row (a duplicate id) is refused at commit() with SQLite's words, and only it: its group
// of 32 goes in row by row, and the transaction's other rows are committed.
TEST(BatchedInsert, ABadRowIsRefusedAtCommitAndOnlyIt) {
  Trace t;
  t.w->begin();
  for (int64_t id = 1; id <= 40; ++id) t.w->insert(alloc(id));
  t.w->insert(alloc(7));  // the 41st row: inside the second group of 32
  for (int64_t id = 41; id <= 70; ++id) t.w->insert(alloc(id));
  EXPECT_TRUE(t.w->status().ok());  // waiting: nothing was written yet
  t.w->commit();
  const zt::Status s = t.w->status();
  EXPECT_FALSE(s.ok()) << "commit() accepted a duplicate id";
  EXPECT_NE(s.message().find("UNIQUE constraint failed: allocation.id"), std::string::npos) << s.message();
  EXPECT_FALSE(t.w->in_transaction());
  t.w->begin();  // the writer goes on
  t.w->insert(alloc(71));
  t.w->commit();
  // finish() does its work and still says that a row was refused.
  const zt::Status f = t.w->finish();
  EXPECT_EQ(f.message(), s.message());
  t.w.reset();
  std::vector<AllocationRow> rows = read_allocations(t.path);
  ASSERT_EQ(rows.size(), 71u);
  EXPECT_EQ(rows[6].t_alloc, alloc(7).t_alloc);
}

// db/README.md: errors cross the module line as Status, never as exceptions. A TraceWriter call
// that fails (here: a duplicate id, outside a transaction and inside one) throws nothing; the
// first error is kept, names the file, and finish() returns it.
TEST(BatchedInsert, NoCallThrowsAndTheFirstErrorIsKept) {
  Trace t;
  EXPECT_NO_THROW(t.w->insert(StringRow{1, "one"}));
  EXPECT_NO_THROW(t.w->insert(StringRow{1, "again"}));  // at once: autocommit
  zt::Status s = t.w->status();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind(t.path + ": writing the trace failed: ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("UNIQUE constraint failed: string.id"), std::string::npos) << s.message();
  EXPECT_NO_THROW({
    t.w->begin();
    t.w->insert(alloc(1));
    t.w->insert(alloc(1));
    EXPECT_TRUE(t.w->set_allocation_freed(1, 5000));
    t.w->set_meta("k", "v");
    t.w->commit();
    t.w->checkpoint();
  });
  EXPECT_EQ(t.w->status().message(), s.message()) << "the first error is the one kept";
  zt::Status f;
  EXPECT_NO_THROW(f = t.w->finish());
  EXPECT_EQ(f.message(), s.message());
  t.w.reset();
  std::vector<AllocationRow> rows = read_allocations(t.path);
  ASSERT_EQ(rows.size(), 1u);  // the good rows went in
  EXPECT_EQ(rows[0].t_free, std::optional<int64_t>(5000));
}

// Outside a transaction an insert is committed on return, as before.
TEST(BatchedInsert, OutsideATransactionRowsGoInAtOnce) {
  Trace t;
  t.w->insert(alloc(1));
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open_v2(t.path.c_str(), &other, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  EXPECT_EQ(count(other, "SELECT count(*) FROM allocation"), 1);
  sqlite3_close(other);
}
