// zt/db/trace_reader.h: opens a trace read-only and answers typed queries.
//
// Owns: one read-only SQLite connection. open() refuses bad input (missing, empty, not
// SQLite, not ours, another schema version, truncated, corrupt, a table that is a view, a value
// out of its range) with one line naming the file and the problem. Every query returns a Status in the same style; nothing here
// throws across the module line. Reading never writes: the file is opened read-only and
// with query_only set, so `zt db sql` cannot change a trace. The views of db/SCHEMA.md are the
// reader's own (TEMP views), whatever the file defines.
#pragma once

#include <csignal>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "zt/common/status.h"
#include "zt/db/rows.h"

struct sqlite3;

namespace zt::db {

// Bounds on one query of a user's (`zt db sql`): a recursive query that never ends, or one that
// returns rows without end, stops with an error instead of running until memory runs out.
struct QueryLimits {
  int64_t max_rows = 0;    // 0: none
  int64_t timeout_ms = 0;  // 0: none
  // Set (to non-zero) by a signal handler: the query stops at its next check (Ctrl-C).
  const volatile std::sig_atomic_t* interrupted = nullptr;
};

struct QueryResult {
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;  // NULL reads as "NULL"
  std::vector<bool> numeric;                   // per column: every non-NULL value was a number
  // Why the query stopped before its end (query() then returns an error saying so; the rows
  // read until then stay here).
  enum class Stopped { No, RowLimit, Timeout, Interrupted } stopped = Stopped::No;
};

struct DevicePeak {
  DeviceRow device;
  int64_t peak_allocated = 0;  // live block bytes at their highest
  int64_t peak_reserved = 0;   // live segment bytes at their highest
  int64_t allocated_at_end = 0;  // block bytes never freed (inside the segments below)
  int64_t reserved_at_end = 0;   // segment bytes never freed
  // Second records of a segment (CUPTI's, paired with the trainer's) count in none of these, nor
  // do a CUDA module's globals (memory kind module_global: see `module_globals`).
  int64_t allocations = 0;
  int64_t blocks = 0;  // block rows among them: 0 means nothing recorded allocator blocks here, so
                       // "allocated" is unknown (a probed program's host memory, or PyTorch's
                       // cache seen only as CUPTI's cudaMalloc segments), not 0
  int64_t module_globals = 0, module_global_bytes = 0;  // left out above
};

struct TransferTotal {
  std::string kind;  // "H2D", ..., or "collective:all_gather"
  int64_t count = 0;
  int64_t bytes = 0;
  int64_t busy_ns = 0;
};

// CUPTI's segments beside the trainer's own (a trace with both sources, e.g. `zt train
// --cupti`): how many were paired when the trace was finished, and what CUPTI saw outside the
// trainer's allocators (NCCL's buffers, CUDA libraries' own memory, ...).
struct DriverRecords {
  int64_t cupti_segments = 0;      // CUPTI segment rows (cudaMalloc, cudaHostAlloc, ...)
  int64_t paired = 0;              // ... that are a second record of one of the trainer's segments
  int64_t api_unpaired = 0;        // the trainer's device/pinned segments CUPTI has no record of
  int64_t outside_count = 0;       // CUPTI device segments outside the trainer's allocators
  int64_t outside_peak_bytes = 0;  // ... their live bytes at the highest (summed over devices)
  int64_t outside_live_at_end = 0;  // ... and still live at the end
};

// Bytes one rank moved per optimizer step (transfers that started inside its step markers).
struct StepTraffic {
  int64_t rank = 0;
  int64_t steps = 0;
  double h2d = 0, d2h = 0, collective = 0;  // mean bytes per step
};

struct TraceSummary {
  std::vector<RunRow> runs;
  std::vector<RankRow> ranks;
  std::vector<DevicePeak> devices;
  std::vector<std::pair<std::string, int64_t>> rows_per_table;
  int64_t t_first = 0, t_last = 0;  // span of every timestamp in the trace
  std::vector<TransferTotal> transfers;
  std::vector<StepTraffic> step_traffic;
  std::optional<DriverRecords> driver;  // only when the trace has CUPTI and api segments
  int64_t steps = 0, epochs = 0;  // steps that ended (on some rank); epochs begun
  int64_t steps_unfinished = 0;    // steps that began and ended on no rank (the run died in them)
  int64_t dropped_events = 0;
  std::vector<FaultRow> faults;
  std::vector<ErrorRow> errors;
  // What the recording could not do, not errors of the run ("CUDA tracing was off: ..."): each
  // run's config_json "notes", and the error rows of kind cuda_tracing_off older zt wrote.
  std::vector<std::string> notes;
  // Which stretch of the run has full detail (version 3 on; older files: all of it, no aggregates).
  struct Detail {
    bool aggregates = false;           // the file has the aggregate tables
    std::optional<int64_t> t_end;      // the detail stopped here (NULL: it went on to the end)
    std::string end_reason;
    int64_t steps = 0;                 // step numbers in step_memory (a step of several ranks once)
    int64_t steps_with_detail = 0;     // of those, ended on every rank inside the detail span
    std::optional<int64_t> first_step, last_step, last_detail_step, first_aggregate_step;
    int64_t epoch_boundaries = 0;      // epoch starts and ends with a live set (of any rank)
    // The stretches of detail (detail_span rows, by start): more than one where a detail policy
    // opened windows (zt/probe/detail_policy.h) or the flight recorder wrote its ring at the end.
    std::vector<DetailSpanRow> spans;
    // The step numbers with detail, as runs of consecutive numbers ([a, b] inclusive).
    std::vector<std::pair<int64_t, int64_t>> detail_steps;
    std::string flight_recorder;       // meta flight_recorder: what the ring held, and whether it was written
  } detail;
};

class TraceReader {
 public:
  // What open() checks of the values (zt/db/trace_values.h): every table; every table but the
  // large ones a caller checks row by row as it streams them (the viewer); nothing (`zt db sql`,
  // which shows a damaged trace as it is).
  enum class Checks { All, SmallTables, None };
  static Status open(const std::string& path, std::unique_ptr<TraceReader>* out, Checks checks = Checks::All);
  ~TraceReader();

  const std::string& path() const { return path_; }
  int schema_version() const { return schema_version_; }  // the file's (PRAGMA user_version)

  Status read(std::vector<RunRow>* out);
  Status read(std::vector<RankRow>* out);
  Status read(std::vector<DeviceRow>* out);
  Status read(std::vector<StringRow>* out);
  Status read(std::vector<FrameRow>* out);
  Status read(std::vector<StackRow>* out);
  Status read(std::vector<AllocationRow>* out);
  Status read(std::vector<TransferRow>* out);
  Status read(std::vector<KernelRow>* out);
  Status read(std::vector<PlacementRow>* out);
  Status read(std::vector<MarkerRow>* out);
  Status read(std::vector<CounterRow>* out);
  Status read(std::vector<FaultRow>* out);
  Status read(std::vector<ErrorRow>* out);
  Status read(std::vector<DroppedRow>* out);
  // The aggregate tables (version 3 on; none in older files: their detail covers the whole run).
  Status read(std::vector<StepMemoryRow>* out);
  Status read(std::vector<EpochLiveRow>* out);
  Status read(std::vector<DetailSpanRow>* out);
  bool has_aggregates() const { return aggregates_; }

  // id -> text for every interned string.
  Status strings(std::unordered_map<int64_t, std::string>* out);
  // A stack as text lines, innermost frame first ("symbol (module+0x1f3)", or the raw ip; a source
  // frame, ip 0 with a module, as "file.py:LINE function").
  Status stack_text(int64_t stack_id, std::vector<std::string>* out);
  // A stack's frame rows, innermost first (at most 1024).
  Status stack_frames(int64_t stack_id, std::vector<FrameRow>* out);
  Status row_count(const std::string& table, int64_t* out);
  Status summarize(TraceSummary* out);
  // Which steps have detail (part of summarize()).
  Status summarize_detail(TraceSummary::Detail* out);
  // Any read-only SQL; values rendered as text.
  Status query(const std::string& sql, QueryResult* out, const QueryLimits& limits = {});

  sqlite3* handle() const { return db_; }
  // The allocation table has `weight_bytes` (sampled rows, SCHEMA.md); files before it have none.
  bool has_weights() const { return weights_; }
  // SQL true for a sampled allocation row: kSampledSql, or "0" in a file without the column.
  const char* sampled_sql() const { return weights_ ? kSampledSql : "(0)"; }
  // SQL for the bytes an allocation row counts for in an estimate: its weight when sampled.
  const char* counted_bytes_sql() const { return weights_ ? "coalesce(weight_bytes, bytes)" : "bytes"; }
  static const std::vector<std::string>& table_names();  // every version's tables
  static const std::vector<std::string>& aggregate_table_names();  // version 3 on
  std::vector<std::string> tables() const;  // this file's: table_names(), and the aggregate ones where it has them

 private:
  TraceReader() = default;
  template <typename Row, typename Fill>
  Status read_rows(const char* sql, std::vector<Row>* out, Fill fill);
  Status fail(const std::string& what) const;
  std::string path_;
  sqlite3* db_ = nullptr;
  int schema_version_ = 0;
  bool frame_lines_ = false;  // the frame table has its `line` column (Python frames; files before it have none)
  bool rank_roles_ = false;   // the rank table has `role` and `job_rank` (files before rank roles have neither)
  bool weights_ = false;      // the allocation table has its `weight_bytes` column (sampled rows)
  bool aggregates_ = false;   // version 3 on: step_memory, epoch_live, detail_span
};

}  // namespace zt::db
