#include "zt/db/trace_values.h"

#include <sqlite3.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "sqlite.h"
#include "zt/common/files.h"
#include "zt/db/schema.h"

namespace zt::db {
namespace {

using Type = ColumnRule::Type;

// The codes this build names (to_string says "invalid" for the others): an enum added to
// schema.h is accepted here without a second list to keep in step.
template <typename E>
std::vector<int64_t> codes_of() {
  std::vector<int64_t> out;
  for (int c = 0; c < 256; ++c)
    if (to_string(E(c)) != "invalid") out.push_back(c);
  return out;
}

std::string code_list(const std::vector<int64_t>& codes) {
  std::string s;
  for (int64_t c : codes) s += (s.empty() ? "" : ", ") + std::to_string(c);
  return s;
}

ColumnRule integer(std::string c, int64_t lo, int64_t hi, std::string what, bool nullable = false) {
  ColumnRule r;
  r.column = std::move(c);
  r.lo = lo, r.hi = hi, r.nullable = nullable;
  r.what = std::move(what);
  return r;
}
ColumnRule any_integer(std::string c, bool nullable = true) {
  return integer(std::move(c), INT64_MIN, INT64_MAX, nullable ? "NULL or an integer" : "an integer",
                 nullable);
}
ColumnRule id(std::string c = "id") { return integer(std::move(c), 1, INT64_MAX, "an id (an integer of at least 1)"); }
ColumnRule ref(std::string c, bool nullable = true) {
  return integer(std::move(c), 1, INT64_MAX, nullable ? "NULL or an id (an integer of at least 1)" : "an id (an integer of at least 1)", nullable);
}
ColumnRule string_ref(std::string c, bool nullable = true) {
  return integer(std::move(c), 1, kMaxTraceStringId,
                 std::string(nullable ? "NULL or " : "") + "a string id (an integer in 1 .. 2147483647)", nullable);
}
ColumnRule device_ref(std::string c, bool nullable = true) {
  return integer(std::move(c), 1, kMaxTraceStringId,
                 std::string(nullable ? "NULL or " : "") + "a device id (an integer in 1 .. 2147483647)", nullable);
}
// With not_before: a span's end; `summed` when readers add the spans' lengths up (busy time).
ColumnRule time(std::string c, bool nullable = false, std::string not_before = "", bool summed = false) {
  ColumnRule r = integer(std::move(c), 0, kMaxTraceTime,
                         std::string(nullable ? "NULL or " : "") + "a time (an integer in 0 .. 2^62 ns)", nullable);
  r.not_before = std::move(not_before);
  r.summed = summed;
  return r;
}
ColumnRule bytes(std::string c, bool nullable = false, bool summed = true) {
  ColumnRule r = integer(std::move(c), 0, kMaxTraceBytes,
                         std::string(nullable ? "NULL or " : "") + "a size (an integer in 0 .. 2^53 bytes)", nullable);
  r.summed = summed;
  return r;
}
ColumnRule rank(std::string c = "rank", bool nullable = false) {
  return integer(std::move(c), 0, kMaxTraceRank,
                 std::string(nullable ? "NULL or " : "") + "a rank (an integer in 0 .. 1048575)", nullable);
}
ColumnRule count(std::string c, const char* of) {
  return integer(std::move(c), 0, kMaxTraceCount,
                 std::string("NULL or ") + of + " (an integer in 0 .. 2147483647)", true);
}
template <typename E>
ColumnRule enumeration(std::string c, const char* name) {
  ColumnRule r = integer(std::move(c), 0, 255, "", false);
  r.codes = codes_of<E>();
  r.what = std::string("a code of enum_") + name + " (" + code_list(r.codes) + "; db/SCHEMA.md)";
  return r;
}
ColumnRule flag(std::string c, bool nullable) {
  ColumnRule r = integer(std::move(c), 0, 1, nullable ? "NULL, 0 or 1" : "0 or 1", nullable);
  r.codes = {0, 1};
  return r;
}
// A column added to its table after the first files were written: a file without it is checked
// without it.
ColumnRule later(ColumnRule r) {
  r.added_later = true;
  return r;
}
// A counter's value: any number (a diverged loss is an infinity; a NaN is stored as NULL).
ColumnRule number(std::string c) {
  ColumnRule r;
  r.column = std::move(c);
  r.type = Type::Number;
  r.nullable = true;
  r.what = "NULL or a number";
  return r;
}

const std::map<std::string, std::vector<ColumnRule>, std::less<>>& all_rules() {
  static const auto rules = [] {
    std::map<std::string, std::vector<ColumnRule>, std::less<>> m;
    m["run"] = {id(), any_integer("seed"), integer("pid", 0, INT32_MAX, "NULL or a process id (0 .. 2^31-1)", true),
                time("t_start"), time("t_end", true, "t_start"), time("wall_start_unix_ns"),
                enumeration<RunStatus>("status", "run_status"),
                integer("exit_code", INT32_MIN, INT32_MAX, "NULL or an exit code (a 32-bit integer)", true)};
    m["rank"] = {rank(), ref("run_id", false),
                 integer("world_size", 1, kMaxTraceRank + 1, "a world size (an integer in 1 .. 1048576)"),
                 rank("local_rank", true), integer("pid", 0, INT32_MAX, "NULL or a process id (0 .. 2^31-1)", true),
                 later(enumeration<RankRole>("role", "rank_role")), later(rank("job_rank", true))};
    m["device"] = {device_ref("id", false), rank(), enumeration<DeviceKind>("kind", "device_kind"),
                   integer("ordinal", 0, kMaxTraceRank, "a device index (an integer in 0 .. 1048575)"),
                   bytes("capacity_bytes", true, false), flag("simulated", false)};
    m["string"] = {string_ref("id", false)};
    m["frame"] = {id(), any_integer("ip", false), any_integer("module_offset")};
    m["stack"] = {id(), ref("parent_id"), ref("frame_id", false)};
    m["allocation"] = {id(), rank(), device_ref("device_id"), enumeration<MemoryKind>("memory_kind", "memory_kind"),
                       enumeration<AllocLevel>("level", "level"), any_integer("address", false), bytes("bytes"),
                       bytes("requested_bytes"), time("t_alloc"), time("t_free", true, "t_alloc"), string_ref("name_id"),
                       ref("stack_id"), enumeration<Source>("source", "source"), ref("segment_id"),
                       any_integer("stream"), later(bytes("weight_bytes", true))};
    m["transfer"] = {id(), rank(), enumeration<TransferKind>("kind", "transfer_kind"), bytes("bytes"),
                     device_ref("src_device_id"), device_ref("dst_device_id"), flag("pinned", true), time("t_start"),
                     time("t_end", false, "t_start", true), any_integer("stream"), string_ref("name_id"), string_ref("op_id"),
                     integer("participants", 0, kMaxTraceRank + 1, "NULL or a count of ranks (0 .. 1048576)", true),
                     any_integer("correlation_id"), enumeration<Source>("source", "source"), ref("stack_id")};
    m["kernel"] = {id(), rank(), device_ref("device_id", false), string_ref("name_id"), time("t_start"),
                   time("t_end", false, "t_start", true), any_integer("stream"), any_integer("correlation_id"),
                   enumeration<Source>("source", "source")};
    m["placement"] = {id(), rank(), time("t"), string_ref("tensor_id", false), device_ref("device_id"),
                      enumeration<PlacementWhy>("why", "placement_why"), bytes("bytes", true), ref("allocation_id")};
    m["marker"] = {id(), rank(), enumeration<MarkerKind>("kind", "marker_kind"), string_ref("name_id"), time("t_start"),
                   time("t_end", true, "t_start"), count("step", "a step number"), count("micro_step", "a micro-step number"),
                   count("epoch", "an epoch number"), any_integer("value")};
    m["counter"] = {id(), rank(), device_ref("device_id"), string_ref("name_id", false), time("t"), number("value")};
    m["fault"] = {id(), rank(), time("t"), count("step", "a step number")};
    m["error"] = {id(), rank(), time("t"), count("step", "a step number"), device_ref("device_id")};
    m["dropped"] = {id(), rank("rank", true), any_integer("thread", false), time("t"),
                    integer("events", 0, kMaxTraceTime, "a count of events (an integer in 0 .. 2^62)")};
    m["step_memory"] = {id(), rank(), device_ref("device_id", false), count("step", "a step number"),
                        count("epoch", "an epoch number"), time("t_start"), time("t_end", true, "t_start"),
                        bytes("allocated_bytes", false, false), bytes("reserved_bytes", false, false),
                        bytes("peak_allocated_bytes", false, false), bytes("peak_reserved_bytes", false, false),
                        bytes("host_rss_bytes", true, false)};
    ColumnRule epoch = integer("epoch", 0, kMaxTraceCount, "an epoch number (an integer in 0 .. 2147483647)");
    ColumnRule at = integer("at", 0, 1, "0 (the epoch's start) or 1 (its end)");
    at.codes = {0, 1};
    ColumnRule variance = number("sampled_variance");
    variance.nullable = false;
    variance.what = "a number";
    m["epoch_live"] = {id(), rank(), epoch, at, time("t"), device_ref("device_id", false),
                       enumeration<MemoryKind>("memory_kind", "memory_kind"), enumeration<AllocLevel>("level", "level"),
                       string_ref("name_id"), ref("stack_id"), bytes("bytes"),
                       integer("allocations", 0, kMaxTraceTime, "a count of allocations (an integer in 0 .. 2^62)"),
                       integer("sampled", 0, kMaxTraceTime, "a count of allocations (an integer in 0 .. 2^62)"),
                       variance};
    m["detail_span"] = {id(), rank(), time("t_start"), time("t_end", true, "t_start")};
    return m;
  }();
  return rules;
}

std::string quoted(const std::string& column) { return "\"" + column + "\""; }

// The SQL form of a rule, true for a row that keeps it (the same test as RowCheck::fits).
std::string sql_of(const ColumnRule& r) {
  const std::string c = quoted(r.column);
  std::string core;
  if (r.type == Type::Number) {
    core = "typeof(" + c + ") IN ('integer','real')";
  } else {
    core = "typeof(" + c + ") = 'integer'";
    if (!r.codes.empty()) core += " AND " + c + " IN (" + code_list(r.codes) + ")";
    else if (r.lo != INT64_MIN || r.hi != INT64_MAX)
      core += " AND " + c + " BETWEEN " + std::to_string(r.lo) + " AND " + std::to_string(r.hi);
    if (!r.not_before.empty()) {
      const std::string b = quoted(r.not_before);
      core += " AND (typeof(" + b + ") != 'integer' OR " + c + " >= " + b + ")";
    }
  }
  return r.nullable ? "(" + c + " IS NULL OR (" + core + "))" : "(" + core + ")";
}

std::string value_text(sqlite3_stmt* st, int col) {
  switch (sqlite3_column_type(st, col)) {
    case SQLITE_NULL: return "NULL";
    case SQLITE_INTEGER: return std::to_string(sqlite3_column_int64(st, col));
    case SQLITE_FLOAT: {
      char b[40];
      std::snprintf(b, sizeof b, "%.17g", sqlite3_column_double(st, col));
      return b;
    }
    case SQLITE_BLOB: return "a blob of " + std::to_string(sqlite3_column_bytes(st, col)) + " bytes";
    default: {
      const unsigned char* p = sqlite3_column_text(st, col);
      return "the text '" +
             printable(std::string_view(reinterpret_cast<const char*>(p), size_t(sqlite3_column_bytes(st, col)))) + "'";
    }
  }
}

}  // namespace

const std::vector<ColumnRule>& column_rules(std::string_view table) {
  static const std::vector<ColumnRule> none;
  auto it = all_rules().find(table);
  return it == all_rules().end() ? none : it->second;
}

const std::vector<std::string>& streamed_tables() {
  static const std::vector<std::string> t{"allocation", "transfer", "kernel", "placement", "marker", "counter"};
  return t;
}

Status check_table_values(sqlite3* db, const std::string& path, const std::string& table) {
  const auto& all = column_rules(table);
  if (all.empty()) return Status::Ok();
  std::vector<ColumnRule> rules;  // the rules of the columns this file has
  try {
    for (const auto& r : all) {
      if (r.added_later) {
        detail::Stmt has(db, "SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2");
        has.bind(1, table).bind(2, r.column);
        if (has.step() && has.i64(0) == 0) continue;  // a file from before the column
      }
      rules.push_back(r);
    }
  } catch (const detail::SqlError& e) {
    return Status::Error(path + ": not a readable zerotrace trace (table " + table + ": " + e.what() + ")");
  }
  std::string cols = "rowid AS zt_row", cond;
  for (const auto& r : rules) {
    cols += ", " + quoted(r.column);
    cond += (cond.empty() ? "" : " AND ") + sql_of(r);
  }
  try {
    detail::Stmt s(db, "SELECT " + cols + " FROM " + quoted(table) + " WHERE NOT (" + cond + ") LIMIT 1");
    if (s.step()) {
      RowCheck check(path, table, s.raw(), 0);
      if (!check.ok(s.raw())) return check.error();
      return Status::Error(path + ": " + table + " row " + std::to_string(s.i64(0)) +
                           " breaks a rule of db/SCHEMA.md (the trace is damaged or was edited)");
    }
  } catch (const detail::SqlError& e) {
    return Status::Error(path + ": not a readable zerotrace trace (table " + table + ": " + e.what() + ")");
  }
  // Every value is in its range now: their sums, one pass (total(): a double, which never
  // overflows as sum() would; near 2^62 it is exact to 1 KiB or 1 µs).
  std::string sums;
  std::vector<const ColumnRule*> summed;
  for (const auto& r : rules)
    if (r.summed) {
      sums += std::string(sums.empty() ? "" : ", ") + "total(" + quoted(r.column) +
              (r.not_before.empty() ? "" : " - " + quoted(r.not_before)) + ")";
      summed.push_back(&r);
    }
  if (summed.empty()) return Status::Ok();
  auto too_much = [&](const ColumnRule& r) {
    return Status::Error(path + ": " + table + ": " +
                         (r.not_before.empty() ? r.column : "the spans from " + r.not_before + " to " + r.column) +
                         " add up to more than 2^62 over the table's rows (the trace is damaged or was edited)");
  };
  try {
    detail::Stmt s(db, "SELECT " + sums + " FROM " + quoted(table));
    if (s.step())
      for (size_t k = 0; k < summed.size(); ++k)
        if (s.f64(int(k)) > double(kMaxTraceSum)) return too_much(*summed[k]);
  } catch (const detail::SqlError& e) {
    return Status::Error(path + ": not a readable zerotrace trace (table " + table + ": " + e.what() + ")");
  }
  return Status::Ok();
}

RowCheck::RowCheck(std::string path, std::string table, sqlite3_stmt* st, int id_column)
    : path_(std::move(path)), table_(std::move(table)), id_column_(id_column) {
  const auto& rules = column_rules(table_);
  const int n = sqlite3_column_count(st);
  auto column = [&](const std::string& name) {
    for (int i = 0; i < n; ++i)
      if (i != id_column_ && name == sqlite3_column_name(st, i)) return i;
    return -1;
  };
  for (const auto& r : rules)
    if (int c = column(r.column); c >= 0) bound_.push_back({c, r.not_before.empty() ? -1 : column(r.not_before), &r});
}

bool RowCheck::fits(sqlite3_stmt* st, const Bound& b) {
  const ColumnRule& r = *b.rule;
  const int type = sqlite3_column_type(st, b.col);
  if (type == SQLITE_NULL) return r.nullable;
  if (r.type == Type::Number) return type == SQLITE_INTEGER || type == SQLITE_FLOAT;
  if (type != SQLITE_INTEGER) return false;
  const int64_t v = sqlite3_column_int64(st, b.col);
  if (!r.codes.empty()) {
    bool known = false;
    for (int64_t c : r.codes) known = known || c == v;
    if (!known) return false;
  } else if (v < r.lo || v > r.hi) {
    return false;
  }
  return b.before_col < 0 || sqlite3_column_type(st, b.before_col) != SQLITE_INTEGER ||
         v >= sqlite3_column_int64(st, b.before_col);
}

bool RowCheck::add(sqlite3_stmt* st, Bound& b) {
  if (sqlite3_column_type(st, b.col) != SQLITE_INTEGER) return true;  // NULL (an open span): nothing to add
  int64_t v = sqlite3_column_int64(st, b.col);
  if (b.before_col >= 0) {
    if (sqlite3_column_type(st, b.before_col) != SQLITE_INTEGER) return true;
    v -= sqlite3_column_int64(st, b.before_col);  // fits() saw both in 0 .. 2^62
  }
  if (v > kMaxTraceSum - b.sum) return false;
  b.sum += v;
  return true;
}

bool RowCheck::fail_sum(sqlite3_stmt* st, const Bound& b) {
  const ColumnRule& r = *b.rule;
  std::string row = table_ + " row";
  if (id_column_ >= 0) row += " " + value_text(st, id_column_);
  error_ = Status::Error(path_ + ": " + row + ": " +
                         (r.not_before.empty() ? r.column : "the spans from " + r.not_before + " to " + r.column) +
                         " of the rows so far add up to more than 2^62 (the trace is damaged or was edited)");
  return false;
}

bool RowCheck::fail(sqlite3_stmt* st, const Bound& b) {
  std::string row = table_ + " row";
  if (id_column_ >= 0) row += " " + value_text(st, id_column_);
  const ColumnRule& r = *b.rule;
  const std::string v = value_text(st, b.col);
  // The value alone fits: the span ends before it starts.
  bool alone = sqlite3_column_type(st, b.col) == SQLITE_INTEGER;
  if (alone) {
    const int64_t x = sqlite3_column_int64(st, b.col);
    alone = r.codes.empty() ? x >= r.lo && x <= r.hi : false;
    for (int64_t c : r.codes) alone = alone || c == x;
  }
  if (alone && b.before_col >= 0)
    error_ = Status::Error(path_ + ": " + row + ": " + r.column + " " + v + " is before " + r.not_before + " " +
                           value_text(st, b.before_col) + "; a span cannot end before it starts");
  else
    error_ = Status::Error(path_ + ": " + row + ": " + r.column + " is " + v + "; it must be " + r.what);
  return false;
}

}  // namespace zt::db
