// zt/db/trace_writer.h: creates a trace file and inserts rows with prepared statements.
//
// Owns: the SQLite connection of one trace being written. Not thread-safe: the probe's
// writer thread is its only user while a run records; merge uses it on its own thread.
// Invariants:
//  - create() either leaves a complete empty version-1 trace, or nothing at all.
//  - Rows become durable at commit(); WAL mode, so a process killed with SIGKILL leaves a
//    file that opens with every committed transaction in it.
//  - Inside a transaction, rows of the busy tables (allocation, transfer, kernel, placement,
//    marker, counter) wait in memory and go in as multi-row INSERTs at commit() (or after 16Ki
//    waiting rows, or at handle()); a free or marker end for a waiting row is written into it.
//    So an error of such an insert (a duplicate id) comes when the waiting rows are written:
//    by commit(), or by the insert() or handle() that writes them; the other rows still go in.
//    Outside a transaction every insert goes in at once.
//  - No call throws (errors cross the module line as Status, db/README.md). A write that fails
//    keeps its error: status() returns the first one, naming the file and SQLite's words. The
//    writer goes on after it (after a constraint error the other rows still go in; after an I/O
//    error the later writes fail too), and finish() returns that first error after its own work,
//    so that a caller who checks only finish() never takes a trace with a refused row for a whole one.
//  - finish() builds the indexes, folds the WAL back into the one file and closes it.
#pragma once

#include <memory>
#include <string>

#include "zt/common/status.h"
#include "zt/db/rows.h"

struct sqlite3;

namespace zt::db {

class TraceWriter {
 public:
  // Creates `path`. An existing zerotrace trace there is replaced; any other existing file
  // is refused (we never clobber what we did not write).
  static Status create(const std::string& path, std::unique_ptr<TraceWriter>* out);
  // Opens an existing, finished trace of this schema version to add rows to it (zt probe adds
  // PyTorch's allocator history to a process's trace); finish() then pairs, indexes and folds the
  // WAL again. The caller picks ids above the file's own. Any other file is refused, one line.
  static Status append(const std::string& path, std::unique_ptr<TraceWriter>* out);
  ~TraceWriter();

  const std::string& path() const { return path_; }

  void begin();
  void commit();
  bool in_transaction() const { return in_tx_; }
  // The first error of any call so far ("<path>: writing the trace failed: <why>"), or ok.
  Status status() const;

  void insert(const RunRow&);
  void insert(const RankRow&);
  void insert(const DeviceRow&);
  void insert(const StringRow&);
  void insert(const FrameRow&);
  void insert(const StackRow&);
  void insert(const AllocationRow&);
  void insert(const TransferRow&);
  void insert(const KernelRow&);
  void insert(const PlacementRow&);
  void insert(const MarkerRow&);
  void insert(const CounterRow&);
  void insert(const FaultRow&);
  void insert(const ErrorRow&);
  void insert(const DroppedRow&);
  void insert(const StepMemoryRow&);
  void insert(const EpochLiveRow&);
  void insert(const DetailSpanRow&);
  // The detail span `id` ended at t_end, for `reason` (a size cap reached).
  void end_detail_span(int64_t id, int64_t t_end, const std::string& reason);
  // The size of the trace's rows so far (the database's pages, its -wal included), in bytes.
  int64_t size_bytes();

  // Closing halves of rows written earlier. Return false when no such row exists yet.
  bool set_allocation_freed(int64_t allocation_id, int64_t t_free);
  bool set_marker_end(int64_t marker_id, int64_t t_end, std::optional<int64_t> value = std::nullopt);
  void set_run_end(int64_t run_id, int64_t t_end, RunStatus status, std::optional<int64_t> exit_code,
                   const std::string& detail);
  // Appends `text` to the run's config_json "notes" array (config_json {} when it had none; a
  // config that is not a JSON object is left alone).
  void add_run_note(int64_t run_id, const std::string& text);
  void set_frame_symbol(int64_t frame_id, const std::string& module, std::optional<int64_t> offset,
                        const std::string& symbol);
  void set_meta(const std::string& key, const std::string& value);

  // Commits, then copies what the WAL holds into the main file: the rows written so far are in
  // the trace file itself, also for whoever copies it without its -wal (the run row, written
  // at the start of a run, says what ran and that it has not ended).
  void checkpoint();

  // Builds indexes, checkpoints the WAL into the main file, switches to a single-file journal.
  // Returns the first error of the writer's life (status()) when there was one, else its own.
  Status finish();

  // The connection, for SQL of the caller's own; every waiting row is written first.
  sqlite3* handle();

 private:
  struct Statements;
  TraceWriter() = default;
  void prepare();  // the prepared statements, on db_
  std::string path_;
  sqlite3* db_ = nullptr;
  std::unique_ptr<Statements> st_;
  bool in_tx_ = false;
  bool failed_ = false;
  std::string error_;  // the first failure's words (status())
  void fail(const char* what) noexcept;
  template <class F>
  bool guarded(F&& f) noexcept;  // runs f; what it throws becomes the writer's error (false)
};

}  // namespace zt::db
