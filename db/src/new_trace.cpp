#include "new_trace.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>

#include "zt/db/trace_file.h"

namespace zt::db::detail {

void remove_trace_and_journals(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) ::unlink((path + suffix).c_str());
}

Status write_new_trace(const std::string& path, const std::string& what, const std::function<void(TraceWriter&)>& fill) {
  if (Status s = check_trace_destination(path); !s) return s;
  const std::string tmp = path + ".importing";
  remove_trace_and_journals(tmp);
  std::unique_ptr<TraceWriter> w;
  if (Status s = TraceWriter::create(tmp, &w); !s) return Status::Error(path + ": " + s.message());
  Status result;
  try {
    w->begin();
    fill(*w);
    w->commit();
    if (Status s = w->finish(); !s) result = Status::Error(path + ": " + what + " failed: " + s.message());
  } catch (const InputError& e) {
    result = Status::Error(e.what());
  } catch (const std::exception& e) {
    result = Status::Error(path + ": " + what + " failed: " + e.what());
  }
  w.reset();
  if (result.ok() && std::rename(tmp.c_str(), path.c_str()) != 0)
    result = Status::Error(path + ": cannot rename the new trace into place: " + std::strerror(errno));
  if (!result.ok()) remove_trace_and_journals(tmp);
  return result;
}

}  // namespace zt::db::detail
