// zt/db/trace_values.h: the sane range of every value a trace holds, checked before it is trusted.
//
// A trace travels (a bug report's attachment, a CI artifact, a colleague's file): its ids, ranks,
// times, sizes and counts size vectors, index arrays and drive loops in every reader, so each
// column a reader uses has a rule here, and a value outside it is refused with one line naming
// the file, the table, the row and the value ("t.db: allocation row 17: t_alloc is -5; it must
// be a time (an integer in 0 .. 2^62 ns)"). TraceReader::open checks every table (Checks::All); the viewer,
// which streams the large tables anyway, checks them row by row with RowCheck instead of a
// second scan.
// Invariants once a table passed: every checked value has its type and lies in its range; times
// lie in [0, 2^62] ns, so the difference of any two fits in int64; sizes in [0, 2^53] bytes, exact
// as doubles; ranks in [0, 2^20); string ids in [1, 2^31) (the viewer keeps them as int32);
// steps and epochs in [0, 2^31); a span never ends before it starts.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zt/common/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace zt::db {

inline constexpr int64_t kMaxTraceTime = int64_t(1) << 62;  // ns: 146 years of CLOCK_MONOTONIC
inline constexpr int64_t kMaxTraceBytes = int64_t(1) << 53;  // 8 PiB: every size exact as a double
inline constexpr int64_t kMaxTraceRank = (int64_t(1) << 20) - 1;
inline constexpr int64_t kMaxTraceStringId = (int64_t(1) << 31) - 1;
inline constexpr int64_t kMaxTraceCount = (int64_t(1) << 31) - 1;  // steps, micro-steps, epochs
// A table's sizes (allocations', transfers', placements') and the lengths of its kernels and
// transfers add up to at most this: any sum a reader makes of them (live bytes, bytes moved, busy
// time) fits an int64, however many rows the file holds.
inline constexpr int64_t kMaxTraceSum = int64_t(1) << 62;

// What one column may hold.
struct ColumnRule {
  enum class Type : uint8_t { Integer, Number };  // Number: an integer or a real (infinities too)
  std::string column;
  Type type = Type::Integer;
  bool nullable = false;
  int64_t lo = INT64_MIN, hi = INT64_MAX;  // Integer: the range
  std::vector<int64_t> codes;              // Integer: an enum's codes (empty: any in the range)
  std::string not_before;                  // Integer: a column of the row this one may not be below
  bool summed = false;                     // the column (with not_before: the span's length) adds up to at most kMaxTraceSum
  std::string what;                        // the rule in words, for the message: "a time is an integer in 0 .. 2^62 ns"
  bool added_later = false;                // a column files from before it lack (rank.role, allocation.weight_bytes): checked where present
};

// The rules of a table (empty for a table without any, or unknown).
const std::vector<ColumnRule>& column_rules(std::string_view table);

// The tables whose rules the viewer checks while it streams them (the rest are small).
const std::vector<std::string>& streamed_tables();

// One pass over `table` by SQL: Ok, or the first row breaking a rule, named as RowCheck names it.
Status check_table_values(sqlite3* db, const std::string& path, const std::string& table);

// Checks the rows of one statement over `table` as they are stepped: the statement's columns are
// matched to the table's rules by name once (a column without a rule is not checked), then ok() per
// row. `id_column`: the column holding the row's id, for the message (-1: none).
class RowCheck {
 public:
  RowCheck(std::string path, std::string table, sqlite3_stmt* st, int id_column = -1);
  bool ok(sqlite3_stmt* st) {
    for (Bound& b : bound_) {
      if (!fits(st, b)) return fail(st, b);
      if (b.rule->summed && !add(st, b)) return fail_sum(st, b);
    }
    return true;
  }
  // After ok() returned false: "PATH: TABLE row ID: COLUMN is VALUE; it must be RULE".
  const Status& error() const { return error_; }

 private:
  struct Bound {
    int col;
    int before_col;  // -1: none
    const ColumnRule* rule;
    int64_t sum = 0;  // summed rules: the rows' values (or spans) so far
  };
  static bool fits(sqlite3_stmt* st, const Bound& b);
  static bool add(sqlite3_stmt* st, Bound& b);
  bool fail(sqlite3_stmt* st, const Bound& b);
  bool fail_sum(sqlite3_stmt* st, const Bound& b);
  std::string path_, table_;
  int id_column_;
  std::vector<Bound> bound_;
  Status error_;
};

}  // namespace zt::db
