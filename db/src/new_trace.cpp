#include "new_trace.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>

#include "zt/db/trace_file.h"
#include "zt/db/trace_reader.h"

namespace zt::db::detail {

void remove_trace_and_journals(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) ::unlink((path + suffix).c_str());
}

Status write_new_trace(const std::string& path, const std::string& what, const std::string& source,
                       const std::function<void(TraceWriter&)>& fill) {
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
    if (Status s = w->finish(); !s) {  // also the first error of fill's writes
      std::string why = s.message();
      if (why.rfind(tmp + ": ", 0) == 0) why = why.substr(tmp.size() + 2);
      result = Status::Error(path + ": " + what + " failed: " + why);
    }
  } catch (const InputError& e) {
    result = Status::Error(e.what());
  } catch (const std::exception& e) {
    result = Status::Error(path + ": " + what + " failed: " + e.what());
  }
  w.reset();
  // What an import made from another tool's file is checked as a reader would (db/SCHEMA.md's
  // rules) before it replaces anything: a value the source let through (a time, a size) is refused
  // here, not by every command that opens the trace later.
  if (result.ok()) {
    std::unique_ptr<TraceReader> check;
    if (Status s = TraceReader::open(tmp, &check); !s) {
      std::string why = s.message();
      if (why.rfind(tmp + ": ", 0) == 0) why = why.substr(tmp.size() + 2);
      result = Status::Error(source + ": its " + what + " would break a rule of db/SCHEMA.md (" + why + "); nothing written to " + path);
    }
  }
  if (result.ok() && std::rename(tmp.c_str(), path.c_str()) != 0)
    result = Status::Error(path + ": cannot rename the new trace into place: " + std::strerror(errno));
  if (!result.ok()) remove_trace_and_journals(tmp);
  return result;
}

}  // namespace zt::db::detail
