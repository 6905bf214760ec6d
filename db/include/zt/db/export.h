// zt/db/export.h: other formats and combinations of traces.
//  - Chrome trace-event JSON (opens in Perfetto and chrome://tracing): allocation lifetimes
//    and transfers as async slices, markers as complete slices, memory counters as counter
//    tracks, faults and errors as instant events. Times in microseconds from the trace's
//    first event. One process per rank (a launcher or helper named by its role and pid). A capped
//    trace keeps both layers: past the detail's end a slice "aggregates only (per step)", the
//    memory counter going on from step_memory, each step's peaks, each epoch boundary's live set.
//  - Merge: per-rank trace files into one trace; clocks kept as they are, ranks kept
//    apart (the same rank in two inputs is an error; a probed file's rank is its job rank),
//    launchers' and helpers' keys renumbered after every rank in input order (rank.role),
//    ids renumbered.
// Both write to a temporary file beside the output and rename it into place, so a failure
// leaves no half-written output and never touches an existing one.
#pragma once

#include <string>
#include <vector>

#include "zt/common/status.h"

namespace zt::db {

struct ExportStats {
  int64_t events = 0;  // trace events written
  int64_t bytes = 0;   // size of the JSON file
};

Status export_chrome(const std::string& trace_path, const std::string& json_path, ExportStats* stats = nullptr);

Status merge_traces(const std::string& out_path, const std::vector<std::string>& inputs, bool overwrite);

}  // namespace zt::db
