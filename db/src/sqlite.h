// db/src/sqlite.h: thin RAII over the SQLite C API, private to db/.
// Invariant: a Stmt is reset and its bindings cleared after every step_done().
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "zt/common/files.h"

namespace zt::db::detail {

// Thrown inside db/ only; the public API turns it into a Status naming the file. Its text is one
// line (SQLite quotes a damaged schema's SQL, newlines and all).
struct SqlError : std::runtime_error {
  SqlError(int code, const std::string& what) : std::runtime_error(one_line(what)), code(code) {}
  int code;
};

class Stmt {
 public:
  Stmt() = default;
  Stmt(sqlite3* db, std::string_view sql);
  ~Stmt();
  Stmt(Stmt&& o) noexcept : db_(o.db_), s_(o.s_) { o.s_ = nullptr; }
  Stmt& operator=(Stmt&& o) noexcept;
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& bind(int i, int64_t v) { check(sqlite3_bind_int64(s_, i, v)); return *this; }
  Stmt& bind(int i, double v) { check(sqlite3_bind_double(s_, i, v)); return *this; }
  Stmt& bind(int i, std::string_view v) {
    check(sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
    return *this;
  }
  Stmt& bind_null(int i) { check(sqlite3_bind_null(s_, i)); return *this; }
  Stmt& bind_id(int i, int64_t id) { return id == 0 ? bind_null(i) : bind(i, id); }
  Stmt& bind_text_or_null(int i, std::string_view v) { return v.empty() ? bind_null(i) : bind(i, v); }
  Stmt& bind_opt(int i, const std::optional<int64_t>& v) { return v ? bind(i, *v) : bind_null(i); }

  bool step();       // true while a row is available
  void step_done();  // run to completion, then reset for reuse
  void reset();

  int64_t i64(int col) const { return sqlite3_column_int64(s_, col); }
  double f64(int col) const { return sqlite3_column_double(s_, col); }
  bool is_null(int col) const { return sqlite3_column_type(s_, col) == SQLITE_NULL; }
  std::optional<int64_t> opt(int col) const { return is_null(col) ? std::nullopt : std::optional<int64_t>(i64(col)); }
  std::string text(int col) const {
    auto p = sqlite3_column_text(s_, col);
    return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(s_, col)) : std::string();
  }
  int columns() const { return sqlite3_column_count(s_); }
  std::string column_name(int col) const { return sqlite3_column_name(s_, col); }
  int column_type(int col) const { return sqlite3_column_type(s_, col); }
  sqlite3_stmt* raw() const { return s_; }

 private:
  void check(int rc);
  sqlite3* db_ = nullptr;
  sqlite3_stmt* s_ = nullptr;
};

void exec(sqlite3* db, const char* sql);
int64_t query_int(sqlite3* db, const char* sql, int64_t fallback = 0);
std::string sql_quote(std::string_view text);

}  // namespace zt::db::detail
