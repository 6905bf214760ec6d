// tests/hand_trace.h: a trace written row by row by a test (the reader's, the viewer's and the
// CLI's tests of what a trace says, without a run to make it).
#pragma once

#include <memory>
#include <string>

#include "zt/db/trace_writer.h"

namespace zt::test {

// The writer of a new trace at `path`, begun, with its run row (`command`) and rank 0's row
// (null when the file cannot be created).
inline std::unique_ptr<db::TraceWriter> hand_written_trace(const std::string& path, const std::string& command) {
  std::unique_ptr<db::TraceWriter> w;
  if (!db::TraceWriter::create(path, &w).ok()) return nullptr;
  w->begin();
  db::RunRow run;
  run.id = 1, run.command_line = command, run.t_start = 0;
  w->insert(run);
  w->insert(db::RankRow{0, 1, 1, 0, "h", 1});
  return w;
}

}  // namespace zt::test
