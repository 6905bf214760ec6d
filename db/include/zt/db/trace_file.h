// zt/db/trace_file.h: what a file on disk is, before anything opens it with SQLite.
// Used by the reader (to refuse bad input with one clear line) and by the writer (to
// refuse to overwrite a file that is not ours).
#pragma once

#include <cstdint>
#include <string>

#include "zt/common/status.h"

namespace zt::db {

struct TraceFileInfo {
  bool exists = false;
  int64_t size = 0;
  bool is_sqlite = false;
  bool has_wal = false;
  int32_t application_id = 0;
  int32_t schema_version = 0;  // PRAGMA user_version
};

// Reads the 100-byte SQLite header (no SQLite call). Fails only on I/O errors.
Status inspect_trace_file(const std::string& path, TraceFileInfo* info);

// Ok if a new trace may be written at `path`: nothing there, an empty file or a zerotrace trace
// (replaced), in a directory that exists and is writable. Otherwise one line naming the file:
// "x.txt: exists and is not a zerotrace trace; refusing to overwrite it". TraceWriter::create
// checks it; a command that hands the path to another process (zt probe) checks it first.
Status check_trace_destination(const std::string& path);

// Ok if `path` is a readable zerotrace trace of our schema version; otherwise one line
// naming the file and the problem ("x.db: empty file (0 bytes), not a zerotrace trace").
Status validate_trace_file(const std::string& path);

}  // namespace zt::db
