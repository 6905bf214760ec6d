// db/src/new_trace.h: a whole trace written at once (zt import), beside its target and renamed
// into place, so that a failure at any row leaves nothing at the target and an existing trace
// there as it was (private to db/).
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

#include "zt/common/status.h"
#include "zt/db/trace_writer.h"

namespace zt::db::detail {

// Thrown by `fill` when the input is at fault: its message (naming the input file) is the whole
// error line. Anything else thrown is the output's problem and names the trace.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Checks that a trace may be written at `path`, creates one beside it, calls `fill` (inside one
// transaction: it throws on an error of its own; the writer's come back from its finish()), checks the new trace as TraceReader::open would (a value
// `source`, the file read, let through is refused naming it) and renames it to `path`. `what` names
// the work in the error ("import").
Status write_new_trace(const std::string& path, const std::string& what, const std::string& source,
                       const std::function<void(TraceWriter&)>& fill);

// Removes `path` and SQLite's files beside it (-wal, -shm, -journal).
void remove_trace_and_journals(const std::string& path);

}  // namespace zt::db::detail
