// tests/hostile_traces.h: a trace edited by SQL as a hostile user would, and issue 29's files: the
// edits of a `zt train` trace that crashed, hung or fooled zt (the viewer, db info, check,
// export), with the part of the refusal that names the value. The db, viewer and CLI tests each
// check their reader refuses every one.
#pragma once

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <string>

namespace zt::test {

// Runs `sql` on the trace at `path` (a test failure if it cannot).
inline void edit_trace(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << sql << ": " << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

struct HostileEdit {
  const char* sql;
  const char* refusal;  // what the one-line refusal says of the value
};

// The issue's reproductions: a negative string id (the viewer segfaulted), a string id of 4e12
// (bad_alloc), a device on rank 2^31-1 (length_error), an allocation at INT64_MIN (the viewer spun
// past 13 GB), a step marker whose time is text (`zt: stoll`).
inline const HostileEdit kIssueTraceEdits[] = {
    {"UPDATE string SET id=-5 WHERE id=(SELECT max(id) FROM string)", "string row -5: id is -5"},
    {"UPDATE string SET id=4000000000000 WHERE id=(SELECT max(id) FROM string)", "id is 4000000000000"},
    {"UPDATE device SET rank=2147483647 WHERE id=(SELECT min(id) FROM device)", "rank is 2147483647"},
    {"UPDATE allocation SET t_alloc=-9223372036854775808 WHERE id=(SELECT min(id) FROM allocation)",
     "t_alloc is -9223372036854775808"},
    {"UPDATE marker SET t_start='abc' WHERE kind=0", "t_start is the text 'abc'"},
};

}  // namespace zt::test
