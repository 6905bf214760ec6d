#include "zt/db/trace_file.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "zt/db/schema.h"

namespace zt::db {
namespace {
uint32_t be32(const unsigned char* p) { return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3]; }
}  // namespace

Status inspect_trace_file(const std::string& path, TraceFileInfo* info) {
  *info = TraceFileInfo{};
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return Status::Error(path + ": " + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) return Status::Error(path + ": is a directory, not a trace file");
  info->exists = true;
  info->size = st.st_size;
  struct stat wal{};
  info->has_wal = ::stat((path + "-wal").c_str(), &wal) == 0 && wal.st_size > 0;
  if (st.st_size == 0) return Status::Ok();
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path + ": cannot be read: " + std::strerror(errno));
  unsigned char h[100] = {};
  in.read(reinterpret_cast<char*>(h), sizeof h);
  if (in.gcount() < 100 || std::memcmp(h, "SQLite format 3\0", 16) != 0) return Status::Ok();
  info->is_sqlite = true;
  info->schema_version = static_cast<int32_t>(be32(h + 60));
  info->application_id = static_cast<int32_t>(be32(h + 68));
  return Status::Ok();
}

Status check_trace_destination(const std::string& path) {
  if (path.empty()) return Status::Error("the trace file name is empty: name a file to write");
  TraceFileInfo info;
  if (Status s = inspect_trace_file(path, &info); !s) return s;
  if (info.exists && info.size > 0 && !(info.is_sqlite && info.application_id == kApplicationId))
    return Status::Error(path + ": exists and is not a zerotrace trace; refusing to overwrite it");
  const auto parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  if (::access(dir.c_str(), F_OK) != 0) return Status::Error(path + ": directory " + dir + " does not exist");
  if (::access(dir.c_str(), W_OK) != 0)
    return Status::Error(path + ": cannot create the trace, directory " + dir + " is not writable (" +
                         std::strerror(errno) + ")");
  return Status::Ok();
}

Status validate_trace_file(const std::string& path) {
  TraceFileInfo info;
  if (Status s = inspect_trace_file(path, &info); !s) return s;
  if (!info.exists) return Status::Error(path + ": no such file");
  if (info.size == 0) return Status::Error(path + ": empty file (0 bytes), not a zerotrace trace");
  if (!info.is_sqlite) return Status::Error(path + ": not a zerotrace trace (not an SQLite database)");

  // The page count in the header is trustworthy when the change counter matches the
  // version-valid-for number; a file shorter than that count has been truncated. Not while a
  // WAL or rollback journal sits beside it: a process killed in the middle of a checkpoint
  // leaves a header that is ahead of the file, and SQLite completes it from the WAL on open.
  std::ifstream in(path, std::ios::binary);
  unsigned char h[100] = {};
  in.read(reinterpret_cast<char*>(h), sizeof h);
  uint32_t page_size = (uint32_t(h[16]) << 8) | h[17];
  if (page_size == 1) page_size = 65536;
  uint32_t pages = be32(h + 28);
  struct stat journal{};
  const bool has_journal = ::stat((path + "-journal").c_str(), &journal) == 0 && journal.st_size > 0;
  if (!info.has_wal && !has_journal && pages != 0 && be32(h + 24) == be32(h + 92) && page_size >= 512) {
    int64_t expected = int64_t(page_size) * pages;
    if (info.size < expected)
      return Status::Error(path + ": truncated trace (header says " + std::to_string(expected) +
                           " bytes, the file has " + std::to_string(info.size) + ")");
  }
  if (info.application_id != kApplicationId)
    return Status::Error(path + ": an SQLite database, but not a zerotrace trace (no zerotrace application id)");
  if (!schema_version_readable(info.schema_version))
    return Status::Error(schema_version_refusal(path, info.schema_version));
  return Status::Ok();
}

}  // namespace zt::db
