// Bad input gets one clear line naming the file and the problem; nothing is half-written.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "../test_util.h"
#include "zt/db/export.h"
#include "zt/db/trace_file.h"
#include "zt/db/trace_reader.h"
#include "zt/db/trace_writer.h"
#include "zt/probe/recorder.h"
#include "zt/probe/synthetic.h"

using namespace zt::db;

namespace {

std::string open_error(const std::string& path) {
  std::unique_ptr<TraceReader> r;
  zt::Status s = TraceReader::open(path, &r);
  EXPECT_FALSE(s.ok()) << path << " opened although it should not";
  return s.message();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

std::string make_trace(const zt::test::TempDir& dir, const std::string& name, int steps = 30) {
  zt::probe::RecorderOptions o;
  o.path = dir.file(name);
  o.crash_handlers = false;
  std::unique_ptr<zt::probe::Recorder> rec;
  EXPECT_TRUE(zt::probe::Recorder::open(o, &rec).ok());
  zt::probe::SyntheticOptions so;
  so.steps_per_epoch = steps;
  zt::probe::record_synthetic(*rec, so);
  EXPECT_TRUE(rec->close().ok());
  return o.path;
}

}  // namespace

TEST(BadInput, MissingFile) {
  zt::test::TempDir dir;
  std::string msg = open_error(dir.file("nope.db"));
  EXPECT_NE(msg.find("nope.db"), std::string::npos);
  EXPECT_NE(msg.find("no such file"), std::string::npos) << msg;
}

TEST(BadInput, EmptyFile) {
  zt::test::TempDir dir;
  write_file(dir.file("empty.db"), "");
  std::string msg = open_error(dir.file("empty.db"));
  EXPECT_NE(msg.find("empty.db: empty file (0 bytes)"), std::string::npos) << msg;
}

TEST(BadInput, Directory) {
  zt::test::TempDir dir;
  std::string msg = open_error(dir.path());
  EXPECT_NE(msg.find("is a directory"), std::string::npos) << msg;
}

TEST(BadInput, NotSqlite) {
  zt::test::TempDir dir;
  write_file(dir.file("notes.txt"), "step 1 loss 4.2\nstep 2 loss 3.9\n" + std::string(200, 'x'));
  std::string msg = open_error(dir.file("notes.txt"));
  EXPECT_NE(msg.find("notes.txt: not a zerotrace trace (not an SQLite database)"), std::string::npos) << msg;
}

TEST(BadInput, ForeignSqliteDatabase) {
  zt::test::TempDir dir;
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dir.file("other.db").c_str(), &db), SQLITE_OK);
  sqlite3_exec(db, "CREATE TABLE t(x); INSERT INTO t VALUES (1);", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  std::string msg = open_error(dir.file("other.db"));
  EXPECT_NE(msg.find("other.db: an SQLite database, but not a zerotrace trace"), std::string::npos) << msg;
}

// A newer version is refused by name; version 1 (counter.value NOT NULL, version 2's subset) reads.
TEST(BadInput, OtherSchemaVersion) {
  zt::test::TempDir dir;
  auto stamp = [](const std::string& path, int version) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    sqlite3_exec(db, ("PRAGMA user_version=" + std::to_string(version) + ";").c_str(), nullptr, nullptr, nullptr);
    sqlite3_close(db);
  };
  std::string path = make_trace(dir, "v4.db", 1);
  stamp(path, 4);
  std::string msg = open_error(path);
  EXPECT_NE(msg.find("v4.db: written with trace schema version 4; this zt reads versions 1 to 3"), std::string::npos)
      << msg;
  EXPECT_NE(zt::db::validate_trace_file(path).message().find("this zt reads versions 1 to 3"), std::string::npos);
  std::string v1 = make_trace(dir, "v1.db", 1);
  stamp(v1, 1);
  std::unique_ptr<zt::db::TraceReader> r;
  ASSERT_TRUE(zt::db::TraceReader::open(v1, &r).ok());
  EXPECT_EQ(r->schema_version(), 1);
  EXPECT_TRUE(zt::db::validate_trace_file(v1).ok());
}

TEST(BadInput, TruncatedTrace) {
  zt::test::TempDir dir;
  std::string path = make_trace(dir, "cut.db");
  auto size = std::filesystem::file_size(path);
  ASSERT_GT(size, 8192u);
  std::filesystem::resize_file(path, size / 2);
  std::string msg = open_error(path);
  EXPECT_NE(msg.find("cut.db: truncated trace"), std::string::npos) << msg;
}

TEST(BadInput, CorruptPagesAreReportedNotCrashed) {
  zt::test::TempDir dir;
  std::string path = make_trace(dir, "corrupt.db");
  auto size = std::filesystem::file_size(path);
  // Overwrite everything after the first page (the schema's root) with garbage.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096);
    std::string junk(size - 4096, '\xA5');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  std::unique_ptr<TraceReader> r;
  zt::Status s = TraceReader::open(path, &r);
  if (s.ok()) {
    TraceSummary sum;
    s = r->summarize(&sum);
  }
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("corrupt.db"), std::string::npos) << s.message();
}

TEST(BadInput, WriterRefusesToOverwriteAForeignFile) {
  zt::test::TempDir dir;
  write_file(dir.file("precious.txt"), "do not lose me");
  std::unique_ptr<TraceWriter> w;
  zt::Status s = TraceWriter::create(dir.file("precious.txt"), &w);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("precious.txt: exists and is not a zerotrace trace"), std::string::npos) << s.message();
  std::ifstream f(dir.file("precious.txt"));
  std::string content((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "do not lose me");
}

TEST(BadInput, WriterInMissingOrReadOnlyDirectory) {
  zt::test::TempDir dir;
  std::unique_ptr<TraceWriter> w;
  zt::Status s = TraceWriter::create(dir.file("no/such/dir/t.db"), &w);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("does not exist"), std::string::npos) << s.message();

  std::string ro_path;
  if (geteuid() != 0) {
    std::string ro = dir.file("ro");
    std::filesystem::create_directory(ro);
    chmod(ro.c_str(), 0555);
    ro_path = ro + "/t.db";
  } else {
    // Root ignores permission bits; /proc refuses new files to everybody.
    ro_path = "/proc/zt-test-trace.db";
  }
  s = TraceWriter::create(ro_path, &w);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(ro_path), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(ro_path));
  EXPECT_FALSE(std::filesystem::exists(ro_path + ".creating"));
}

TEST(BadInput, RecorderOpenFailureIsAStatus) {
  zt::test::TempDir dir;
  write_file(dir.file("x.db"), "not a trace");
  zt::probe::RecorderOptions o;
  o.path = dir.file("x.db");
  o.crash_handlers = false;
  std::unique_ptr<zt::probe::Recorder> rec;
  zt::Status s = zt::probe::Recorder::open(o, &rec);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(rec, nullptr);
}

TEST(BadInput, ExportOfABadTraceWritesNothing) {
  zt::test::TempDir dir;
  write_file(dir.file("bad.db"), "garbage");
  zt::Status s = export_chrome(dir.file("bad.db"), dir.file("out.json"));
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.json")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.json.writing")));
}

TEST(BadInput, MergeWithABadInputWritesNothing) {
  zt::test::TempDir dir;
  std::string good = make_trace(dir, "good.db", 1);
  write_file(dir.file("bad.db"), "");
  zt::Status s = merge_traces(dir.file("merged.db"), {good, dir.file("bad.db")}, false);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("bad.db"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(dir.file("merged.db")));
}

// zt db sql: one reading statement. A second statement was silently ignored, an empty one said
// "not an error", and VACUUM INTO left an empty file behind although the connection is read-only.
TEST(BadInput, QueriesAreOneReadingStatement) {
  zt::test::TempDir dir;
  std::string path = make_trace(dir, "q.db", 1);
  std::unique_ptr<zt::db::TraceReader> r;
  ASSERT_TRUE(zt::db::TraceReader::open(path, &r).ok());
  zt::db::QueryResult q;
  auto error = [&](const std::string& sql) {
    zt::Status s = r->query(sql, &q);
    return s.ok() ? std::string("ok") : s.message();
  };
  EXPECT_EQ(error("SELECT 1; SELECT 2"), path + ": SQL error: one statement at a time: another follows the first (' SELECT 2')");
  EXPECT_EQ(error("  "), path + ": SQL error: no SQL statement given");
  const std::string copy = dir.file("copy.db");
  EXPECT_NE(error("VACUUM INTO '" + copy + "'").find("only reading statements"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(copy));
  EXPECT_NE(error("DELETE FROM run").find("only reading statements"), std::string::npos);
  EXPECT_NE(error("/* a comment first */ ATTACH '" + copy + "' AS x").find("only reading statements"), std::string::npos);
  EXPECT_EQ(error("PRAGMA journal_mode"), "ok");  // a getter, though SQLite calls it writing
  EXPECT_EQ(error("SELECT count(*) FROM run; -- a comment after it is fine"), "ok");
  ASSERT_EQ(q.rows.size(), 1u);
  EXPECT_EQ(q.rows[0][0], "1");
}
