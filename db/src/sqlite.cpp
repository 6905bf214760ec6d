#include "sqlite.h"

namespace zt::db::detail {

Stmt::Stmt(sqlite3* db, std::string_view sql) : db_(db) {
  int rc = sqlite3_prepare_v3(db, sql.data(), static_cast<int>(sql.size()), SQLITE_PREPARE_PERSISTENT, &s_, nullptr);
  if (rc != SQLITE_OK) throw SqlError(rc, sqlite3_errmsg(db));
}

Stmt::~Stmt() {
  if (s_) sqlite3_finalize(s_);
}

Stmt& Stmt::operator=(Stmt&& o) noexcept {
  if (this != &o) {
    if (s_) sqlite3_finalize(s_);
    db_ = o.db_;
    s_ = o.s_;
    o.s_ = nullptr;
  }
  return *this;
}

void Stmt::check(int rc) {
  if (rc != SQLITE_OK) throw SqlError(rc, sqlite3_errmsg(db_));
}

bool Stmt::step() {
  int rc = sqlite3_step(s_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  std::string msg = sqlite3_errmsg(db_);
  sqlite3_reset(s_);
  throw SqlError(rc, msg);
}

void Stmt::step_done() {
  int rc = sqlite3_step(s_);
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
    std::string msg = sqlite3_errmsg(db_);
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
    throw SqlError(rc, msg);
  }
  // No sqlite3_clear_bindings here: every statement binds every parameter on each use
  // (NULLs explicitly), and clearing cost ~4% of an insert.
  sqlite3_reset(s_);
}

void Stmt::reset() {
  sqlite3_reset(s_);
  sqlite3_clear_bindings(s_);
}

void exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errstr(rc);
    sqlite3_free(err);
    throw SqlError(rc, msg);
  }
}

int64_t query_int(sqlite3* db, const char* sql, int64_t fallback) {
  Stmt s(db, sql);
  if (s.step() && !s.is_null(0)) return s.i64(0);
  return fallback;
}

std::string sql_quote(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') out += '\'';
    out += c;
  }
  return out + "'";
}

}  // namespace zt::db::detail
