#include "zt/db/trace_writer.h"

#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <unordered_map>
#include <vector>

#include "match.h"
#include "sqlite.h"
#include "zt/db/trace_file.h"

namespace zt::db {
using detail::Stmt;

namespace {

int64_t i(auto v) { return static_cast<int64_t>(v); }

// Each busy table's columns, bound from `b` + 1 on: one row of a (multi-row) INSERT.
void bind_row(Stmt& s, int b, const AllocationRow& r) {
  s.bind_id(b + 1, r.id).bind(b + 2, r.rank).bind(b + 3, r.device_id).bind(b + 4, i(r.memory_kind))
      .bind(b + 5, i(r.level)).bind(b + 6, i(r.address)).bind(b + 7, r.bytes).bind(b + 8, r.requested_bytes)
      .bind(b + 9, r.t_alloc).bind_opt(b + 10, r.t_free).bind_id(b + 11, r.name_id).bind_id(b + 12, r.stack_id)
      .bind(b + 13, i(r.source)).bind_id(b + 14, r.segment_id).bind_opt(b + 15, r.stream)
      .bind_opt(b + 16, r.weight_bytes);
}
void bind_row(Stmt& s, int b, const TransferRow& r) {
  s.bind_id(b + 1, r.id).bind(b + 2, r.rank).bind(b + 3, i(r.kind)).bind(b + 4, r.bytes).bind_id(b + 5, r.src_device_id)
      .bind_id(b + 6, r.dst_device_id);
  if (r.pinned) s.bind(b + 7, int64_t(*r.pinned)); else s.bind_null(b + 7);
  s.bind(b + 8, r.t_start).bind(b + 9, r.t_end).bind_opt(b + 10, r.stream).bind_id(b + 11, r.name_id)
      .bind_id(b + 12, r.op_id).bind_opt(b + 13, r.participants).bind_opt(b + 14, r.correlation_id)
      .bind(b + 15, i(r.source)).bind_id(b + 16, r.stack_id);
}
void bind_row(Stmt& s, int b, const KernelRow& r) {
  s.bind_id(b + 1, r.id).bind(b + 2, r.rank).bind(b + 3, r.device_id).bind_id(b + 4, r.name_id).bind(b + 5, r.t_start)
      .bind(b + 6, r.t_end).bind_opt(b + 7, r.stream).bind_opt(b + 8, r.correlation_id)
      .bind_text_or_null(b + 9, r.grid).bind_text_or_null(b + 10, r.block).bind(b + 11, i(r.source));
}
void bind_row(Stmt& s, int b, const PlacementRow& r) {
  s.bind_id(b + 1, r.id).bind(b + 2, r.rank).bind(b + 3, r.t).bind(b + 4, r.tensor_id).bind_id(b + 5, r.device_id)
      .bind(b + 6, i(r.why)).bind_opt(b + 7, r.bytes).bind_id(b + 8, r.allocation_id);
}
void bind_row(Stmt& s, int b, const MarkerRow& r) {
  s.bind_id(b + 1, r.id).bind(b + 2, r.rank).bind(b + 3, i(r.kind)).bind_id(b + 4, r.name_id).bind(b + 5, r.t_start)
      .bind_opt(b + 6, r.t_end).bind_opt(b + 7, r.step).bind_opt(b + 8, r.micro_step).bind_opt(b + 9, r.epoch)
      .bind_opt(b + 10, r.value);
}
void bind_row(Stmt& s, int b, const CounterRow& r) {
  s.bind_id(b + 1, r.id).bind(b + 2, r.rank).bind_id(b + 3, r.device_id).bind(b + 4, r.name_id).bind(b + 5, r.t);
  // Byte counts stay exact integers; rates and losses stay real.
  // (The range first: converting a double past int64, or a NaN, to an integer is undefined.)
  if (r.value < 9.0e15 && r.value > -9.0e15 && r.value == static_cast<double>(static_cast<int64_t>(r.value)))
    s.bind(b + 6, static_cast<int64_t>(r.value));
  else
    s.bind(b + 6, r.value);
}

// Rows of one busy table inside a transaction wait here, and go in as INSERTs of kRowsPerInsert
// rows each (one statement step per 32 rows; a plain SQLite loop on the dev VM, 16 KiB pages,
// best of 3: 1.13M rows/s against 0.85M with one row a step)
// when the transaction commits, when kMaxWaiting rows wait, or before anything else that reads
// or writes the connection (handle()). A closing half (a free's t_free, a marker's end) for a
// row still waiting is written into the row, so the row goes in once instead of an INSERT and an
// UPDATE; most of a run's allocations are freed within the transaction that made them.
constexpr int kRowsPerInsert = 32;
constexpr size_t kMaxWaiting = 16384;

template <class Row>
class Batched {
 public:
  Batched() = default;
  // columns: the table's column list, comma-separated (as many as bind_row binds).
  Batched(sqlite3* db, const std::string& table, const std::string& columns)
      : ncols_(1 + int(std::count(columns.begin(), columns.end(), ','))) {
    auto sql = [&](int rows) {
      std::string one = "(";
      for (int c = 0; c < ncols_; ++c) one += c ? ",?" : "?";
      one += ")";
      std::string s = "INSERT INTO " + table + "(" + columns + ") VALUES" + one;
      for (int r = 1; r < rows; ++r) s += "," + one;
      return s;
    };
    one_ = Stmt(db, sql(1));
    many_ = Stmt(db, sql(kRowsPerInsert));
  }

  // Outside a transaction every row goes in at once (autocommit: it is durable on return).
  void add(const Row& r, bool in_transaction) {
    if (!in_transaction) {
      bind_row(one_, 0, r);
      one_.step_done();
      return;
    }
    if (!rows_.empty() && r.id <= rows_.back().id) ascending_ = false;
    rows_.push_back(r);
    if (rows_.size() >= kMaxWaiting) flush();
  }

  // The waiting row with this id, or null (ids are the table's primary keys; 0 is none).
  Row* waiting(int64_t id) {
    if (id == 0 || rows_.empty()) return nullptr;
    if (ascending_) {
      auto it = std::lower_bound(rows_.begin(), rows_.end(), id, [](const Row& r, int64_t v) { return r.id < v; });
      return it != rows_.end() && it->id == id ? &*it : nullptr;
    }
    for (; indexed_ < rows_.size(); ++indexed_) index_.emplace(rows_[indexed_].id, indexed_);
    auto it = index_.find(id);
    return it != index_.end() ? &rows_[it->second] : nullptr;
  }

  // Writes every waiting row; the waiting list is empty afterwards, also when it throws. A
  // group whose multi-row INSERT breaks a constraint (a duplicate id) goes in row by row, so only
  // the bad rows are left out, and the first such error is thrown after every row was tried. Any
  // other error (disk full, I/O) is thrown at once: SQLite may have rolled the transaction back.
  void flush() {
    if (rows_.empty()) return;
    struct Clear {
      Batched& b;
      ~Clear() { b.rows_.clear(), b.index_.clear(), b.indexed_ = 0, b.ascending_ = true; }
    } clear{*this};
    auto constraint = [](const detail::SqlError& e) { return (e.code & 0xff) == SQLITE_CONSTRAINT; };
    std::exception_ptr first;
    auto one = [&](const Row& r) {
      try {
        bind_row(one_, 0, r);
        one_.step_done();
      } catch (const detail::SqlError& e) {
        if (!constraint(e)) throw;
        if (!first) first = std::current_exception();
      }
    };
    size_t k = 0;
    for (; k + kRowsPerInsert <= rows_.size(); k += kRowsPerInsert) {
      try {
        for (int r = 0; r < kRowsPerInsert; ++r) bind_row(many_, r * ncols_, rows_[k + size_t(r)]);
        many_.step_done();
      } catch (const detail::SqlError& e) {
        if (!constraint(e)) throw;
        for (int r = 0; r < kRowsPerInsert; ++r) one(rows_[k + size_t(r)]);
      }
    }
    for (; k < rows_.size(); ++k) one(rows_[k]);
    if (first) std::rethrow_exception(first);
  }

 private:
  int ncols_ = 0;
  Stmt one_, many_;
  std::vector<Row> rows_;
  bool ascending_ = true;                      // ids strictly increase: binary search
  std::unordered_map<int64_t, size_t> index_;  // otherwise: id -> position, built on demand
  size_t indexed_ = 0;
};

}  // namespace

struct TraceWriter::Statements {
  Stmt run, rank, device, string, frame, stack, fault, error, dropped, alloc_free, marker_end, run_end, frame_symbol,
      meta, step_memory, epoch_live, detail_span, detail_end, page_count;
  Batched<AllocationRow> allocation;
  Batched<TransferRow> transfer;
  Batched<KernelRow> kernel;
  Batched<PlacementRow> placement;
  Batched<MarkerRow> marker;
  Batched<CounterRow> counter;

  // Every table's waiting rows; the first error is thrown after all of them were tried (a
  // constraint error leaves the transaction usable; after any other, the later tables' writes
  // fail too, and their rows are dropped with it).
  void flush() {
    std::exception_ptr first;
    auto each = [&](auto& table) {
      try {
        table.flush();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    };
    each(allocation), each(transfer), each(kernel), each(placement), each(marker), each(counter);
    if (first) std::rethrow_exception(first);
  }
};

namespace {
void remove_trace_files(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) ::unlink((path + suffix).c_str());
}
}  // namespace

namespace {
// SQLite's allocation statistics cost ~6% of an insert; zerotrace never reads them. The
// setting is process-wide and must precede the first connection, hence once, here.
void configure_sqlite_once() {
  static const bool done = [] {
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
    return true;
  }();
  (void)done;
}
}  // namespace

void TraceWriter::prepare() {
  auto& s = *(st_ = std::make_unique<Statements>());
  sqlite3* db = db_;
  s.run = Stmt(db,
               "INSERT INTO run(id,tool_version,command_line,config_json,seed,hostname,pid,t_start,t_end,"
               "wall_start_unix_ns,status,exit_code,exit_detail,source_file) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  s.rank = Stmt(db, "INSERT OR REPLACE INTO rank(rank,run_id,world_size,local_rank,hostname,pid,role,job_rank) "
                     "VALUES(?,?,?,?,?,?,?,?)");
  s.device = Stmt(db,
                  "INSERT INTO device(id,rank,kind,ordinal,label,name,capacity_bytes,simulated) VALUES(?,?,?,?,?,?,?,?)");
  s.string = Stmt(db, "INSERT INTO string(id,text) VALUES(?,?)");
  s.frame = Stmt(db, "INSERT INTO frame(id,ip,module,module_offset,symbol,line) VALUES(?,?,?,?,?,?)");
  s.stack = Stmt(db, "INSERT INTO stack(id,parent_id,frame_id) VALUES(?,?,?)");
  s.allocation = Batched<AllocationRow>(db, "allocation",
                                        "id,rank,device_id,memory_kind,level,address,bytes,requested_bytes,"
                                        "t_alloc,t_free,name_id,stack_id,source,segment_id,stream,weight_bytes");
  s.transfer = Batched<TransferRow>(db, "transfer",
                                    "id,rank,kind,bytes,src_device_id,dst_device_id,pinned,t_start,t_end,stream,"
                                    "name_id,op_id,participants,correlation_id,source,stack_id");
  s.kernel = Batched<KernelRow>(db, "kernel",
                                "id,rank,device_id,name_id,t_start,t_end,stream,correlation_id,grid,block,source");
  s.placement = Batched<PlacementRow>(db, "placement", "id,rank,t,tensor_id,device_id,why,bytes,allocation_id");
  s.marker = Batched<MarkerRow>(db, "marker", "id,rank,kind,name_id,t_start,t_end,step,micro_step,epoch,value");
  s.counter = Batched<CounterRow>(db, "counter", "id,rank,device_id,name_id,t,value");
  s.fault = Stmt(db, "INSERT INTO fault(id,rank,t,name,trigger,step,details) VALUES(?,?,?,?,?,?,?)");
  s.error = Stmt(db, "INSERT INTO error(id,rank,t,step,kind,site,message,tensors,device_id) VALUES(?,?,?,?,?,?,?,?,?)");
  s.dropped = Stmt(db, "INSERT INTO dropped(id,rank,thread,t,events,reason) VALUES(?,?,?,?,?,?)");
  s.alloc_free = Stmt(db, "UPDATE allocation SET t_free=? WHERE id=?");
  s.marker_end = Stmt(db, "UPDATE marker SET t_end=?, value=coalesce(?, value) WHERE id=?");
  s.run_end = Stmt(db, "UPDATE run SET t_end=?, status=?, exit_code=?, exit_detail=? WHERE id=?");
  s.frame_symbol = Stmt(db, "UPDATE frame SET module=?, module_offset=?, symbol=? WHERE id=?");
  s.meta = Stmt(db, "INSERT OR REPLACE INTO meta(key,value) VALUES(?,?)");
  s.step_memory = Stmt(db,
                       "INSERT INTO step_memory(id,rank,device_id,step,epoch,t_start,t_end,allocated_bytes,reserved_bytes,"
                       "peak_allocated_bytes,peak_reserved_bytes,host_rss_bytes) VALUES(?,?,?,?,?,?,?,?,?,?,?,?)");
  s.epoch_live = Stmt(db,
                      "INSERT INTO epoch_live(id,rank,epoch,at,t,device_id,memory_kind,level,name_id,stack_id,bytes,"
                      "allocations,sampled,sampled_variance) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  s.detail_span = Stmt(db, "INSERT INTO detail_span(id,rank,t_start,t_end,end_reason) VALUES(?,?,?,?,?)");
  s.detail_end = Stmt(db, "UPDATE detail_span SET t_end=?, end_reason=? WHERE id=?");
  s.page_count = Stmt(db, "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()");
}

Status TraceWriter::create(const std::string& path, std::unique_ptr<TraceWriter>* out) {
  configure_sqlite_once();
  if (Status s = check_trace_destination(path); !s) return s;

  // Build the new trace beside the target, then rename it into place: whatever was at
  // `path` stays intact until a complete empty trace replaces it.
  std::string tmp = path + ".creating";
  remove_trace_files(tmp);
  std::unique_ptr<TraceWriter> w(new TraceWriter());
  w->path_ = path;
  int rc = sqlite3_open_v2(tmp.c_str(), &w->db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = one_line(w->db_ ? sqlite3_errmsg(w->db_) : sqlite3_errstr(rc));
    sqlite3_close(w->db_);
    w->db_ = nullptr;
    remove_trace_files(tmp);
    return Status::Error(path + ": cannot create the trace: " + msg);
  }
  try {
    // 16 KiB pages (SQLite's default is 4 KiB): a fifth less CPU an inserted row (fewer page
    // splits and cells to move), and fewer, larger reads when the viewer scans a table.
    detail::exec(w->db_, "PRAGMA page_size=16384;");
    detail::exec(w->db_, ("PRAGMA application_id=" + std::to_string(kApplicationId) + ";").c_str());
    detail::exec(w->db_, ("PRAGMA user_version=" + std::to_string(kSchemaVersion) + ";").c_str());
    detail::exec(w->db_, "BEGIN;");
    detail::exec(w->db_, schema_sql());
    detail::exec(w->db_, ("INSERT INTO meta VALUES ('schema_version','" + std::to_string(kSchemaVersion) +
                          "'),('format','zerotrace trace'),('clock','CLOCK_MONOTONIC ns');")
                             .c_str());
    detail::exec(w->db_, "COMMIT;");
    sqlite3_close(w->db_);
    w->db_ = nullptr;
    remove_trace_files(path);
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw detail::SqlError(SQLITE_IOERR, std::string("rename failed: ") + std::strerror(errno));
    rc = sqlite3_open_v2(path.c_str(), &w->db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr);
    if (rc != SQLITE_OK) throw detail::SqlError(rc, sqlite3_errstr(rc));
    // WAL: readers (zt db info on a live run) never block the writer, and a killed
    // process loses at most the transaction in flight. NORMAL sync: no fsync per commit,
    // which survives a process crash (the kernel has the pages), not a power cut.
    detail::exec(w->db_, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA cache_size=-65536;");
    w->prepare();
  } catch (const std::exception& e) {  // SqlError, or no memory for the statements
    w->st_.reset();
    if (w->db_) sqlite3_close(w->db_);
    w->db_ = nullptr;
    remove_trace_files(tmp);
    return Status::Error(path + ": cannot create the trace: " + e.what());
  }
  *out = std::move(w);
  return Status::Ok();
}

Status TraceWriter::append(const std::string& path, std::unique_ptr<TraceWriter>* out) {
  configure_sqlite_once();
  if (Status s = validate_trace_file(path); !s) return s;
  TraceFileInfo info;
  if (Status s = inspect_trace_file(path, &info); !s) return s;
  // A version 2 file is a version 3 one without aggregates (detail everywhere): it gets the tables.
  if (info.schema_version != kSchemaVersion && info.schema_version != kAggregatesSchemaVersion - 1)
    return Status::Error(path + ": written with trace schema version " + std::to_string(info.schema_version) +
                         "; rows are added only to version " + std::to_string(kAggregatesSchemaVersion - 1) + " to " +
                         std::to_string(kSchemaVersion) + " traces");
  std::unique_ptr<TraceWriter> w(new TraceWriter());
  w->path_ = path;
  int rc = sqlite3_open_v2(path.c_str(), &w->db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = one_line(w->db_ ? sqlite3_errmsg(w->db_) : sqlite3_errstr(rc));
    sqlite3_close(w->db_);
    w->db_ = nullptr;
    return Status::Error(path + ": cannot open the trace to add rows: " + msg);
  }
  try {
    detail::exec(w->db_, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA cache_size=-65536;");
    // A code added to an enum after the file was written (a trace from an older zt).
    detail::exec(w->db_, "INSERT OR IGNORE INTO enum_source VALUES (4,'torch');");
    // A trace from before Python frames (frame.line): the column is added, NULL for its rows.
    if (detail::query_int(w->db_, "SELECT count(*) FROM pragma_table_info('frame') WHERE name = 'line'") == 0)
      detail::exec(w->db_, "ALTER TABLE frame ADD COLUMN line INTEGER;");
    // A trace from before rank roles (rank.role, rank.job_rank): every row of it is a rank.
    if (detail::query_int(w->db_, "SELECT count(*) FROM pragma_table_info('rank') WHERE name = 'role'") == 0)
      detail::exec(w->db_,
                   "ALTER TABLE rank ADD COLUMN role INTEGER NOT NULL DEFAULT 0; ALTER TABLE rank ADD COLUMN job_rank "
                   "INTEGER; CREATE TABLE IF NOT EXISTS enum_rank_role (code INTEGER PRIMARY KEY, name TEXT NOT NULL); "
                   "INSERT OR IGNORE INTO enum_rank_role VALUES (0,'rank'),(1,'launcher'),(2,'helper');");
    // A trace from before forked workers (role 3): the code is added to its enum table.
    detail::exec(w->db_, "INSERT OR IGNORE INTO enum_rank_role VALUES (3,'worker');");
    // A trace from before sampled rows (allocation.weight_bytes): the column is added, NULL for its rows.
    if (detail::query_int(w->db_, "SELECT count(*) FROM pragma_table_info('allocation') WHERE name = 'weight_bytes'") == 0)
      detail::exec(w->db_, "ALTER TABLE allocation ADD COLUMN weight_bytes INTEGER;");
    // A version 2 trace: the aggregate tables, empty (its detail covers the whole run), and version 3.
    if (info.schema_version < kAggregatesSchemaVersion) {
      detail::exec(w->db_, "BEGIN;");
      detail::exec(w->db_, aggregate_tables_sql());
      detail::exec(w->db_, ("PRAGMA user_version=" + std::to_string(kSchemaVersion) + ";").c_str());
      detail::exec(w->db_, ("INSERT OR REPLACE INTO meta VALUES ('schema_version','" + std::to_string(kSchemaVersion) +
                            "');").c_str());
      detail::exec(w->db_, "COMMIT;");
    }
    w->prepare();
  } catch (const std::exception& e) {
    w->st_.reset();
    sqlite3_close(w->db_);
    w->db_ = nullptr;
    return Status::Error(path + ": cannot open the trace to add rows: " + e.what());
  }
  *out = std::move(w);
  return Status::Ok();
}

TraceWriter::~TraceWriter() {
  commit();  // never throws (what fails is kept, and nobody asks any more)
  st_.reset();
  if (db_) sqlite3_close(db_);
}

// Inside the writer everything throws (detail::SqlError, std::bad_alloc); no exception leaves it.
void TraceWriter::fail(const char* what) noexcept {
  if (failed_) return;
  failed_ = true;
  try {
    error_ = what;
  } catch (...) {
  }
}

template <class F>
bool TraceWriter::guarded(F&& f) noexcept {
  try {
    f();
    return true;
  } catch (const std::exception& e) {
    fail(e.what());
  } catch (...) {
    fail("an unknown error");
  }
  return false;
}

Status TraceWriter::status() const {
  if (!failed_) return Status::Ok();
  return Status::Error(path_ + ": writing the trace failed: " + error_);
}

void TraceWriter::begin() {
  if (in_tx_) return;
  guarded([&] {
    detail::exec(db_, "BEGIN;");
    in_tx_ = true;
  });
}

// The waiting rows that can go in are committed also when some cannot; the first error is kept
// (rather than COMMIT's own, when an I/O error already ended the transaction).
void TraceWriter::commit() {
  if (!in_tx_) return;
  in_tx_ = false;
  if (!st_) return;
  guarded([&] { st_->flush(); });
  if (!sqlite3_get_autocommit(db_)) guarded([&] { detail::exec(db_, "COMMIT;"); });  // a transaction is still open
}

void TraceWriter::checkpoint() {
  commit();
  guarded([&] { detail::exec(db_, "PRAGMA wal_checkpoint(PASSIVE);"); });
}

sqlite3* TraceWriter::handle() {
  if (st_) guarded([&] { st_->flush(); });
  return db_;
}

void TraceWriter::insert(const RunRow& r) {
  guarded([&] {
    st_->run.bind(1, r.id).bind(2, r.tool_version).bind(3, r.command_line).bind_text_or_null(4, r.config_json)
        .bind_opt(5, r.seed).bind_text_or_null(6, r.hostname).bind(7, r.pid).bind(8, r.t_start).bind_opt(9, r.t_end)
        .bind(10, r.wall_start_unix_ns).bind(11, i(r.status)).bind_opt(12, r.exit_code)
        .bind_text_or_null(13, r.exit_detail).bind_text_or_null(14, r.source_file).step_done();
  });
}
void TraceWriter::insert(const RankRow& r) {
  guarded([&] {
    st_->rank.bind(1, r.rank).bind(2, r.run_id).bind(3, r.world_size).bind_opt(4, r.local_rank)
        .bind_text_or_null(5, r.hostname).bind(6, r.pid).bind(7, i(r.role)).bind_opt(8, r.job_rank).step_done();
  });
}
void TraceWriter::insert(const DeviceRow& r) {
  guarded([&] {
    st_->device.bind(1, r.id).bind(2, r.rank).bind(3, i(r.kind)).bind(4, r.ordinal).bind(5, r.label)
        .bind_text_or_null(6, r.name).bind_opt(7, r.capacity_bytes).bind(8, int64_t(r.simulated)).step_done();
  });
}
void TraceWriter::insert(const StringRow& r) {
  guarded([&] { st_->string.bind(1, r.id).bind(2, r.text).step_done(); });
}
void TraceWriter::insert(const FrameRow& r) {
  guarded([&] {
    st_->frame.bind(1, r.id).bind(2, i(r.ip)).bind_text_or_null(3, r.module).bind_opt(4, r.module_offset)
        .bind_text_or_null(5, r.symbol).bind_opt(6, r.line).step_done();
  });
}
void TraceWriter::insert(const StackRow& r) {
  guarded([&] { st_->stack.bind(1, r.id).bind_id(2, r.parent_id).bind(3, r.frame_id).step_done(); });
}
void TraceWriter::insert(const AllocationRow& r) { guarded([&] { st_->allocation.add(r, in_tx_); }); }
void TraceWriter::insert(const TransferRow& r) { guarded([&] { st_->transfer.add(r, in_tx_); }); }
void TraceWriter::insert(const KernelRow& r) { guarded([&] { st_->kernel.add(r, in_tx_); }); }
void TraceWriter::insert(const PlacementRow& r) { guarded([&] { st_->placement.add(r, in_tx_); }); }
void TraceWriter::insert(const MarkerRow& r) { guarded([&] { st_->marker.add(r, in_tx_); }); }
void TraceWriter::insert(const CounterRow& r) { guarded([&] { st_->counter.add(r, in_tx_); }); }
void TraceWriter::insert(const FaultRow& r) {
  guarded([&] {
    st_->fault.bind_id(1, r.id).bind(2, r.rank).bind(3, r.t).bind(4, r.name).bind_text_or_null(5, r.trigger)
        .bind_opt(6, r.step).bind_text_or_null(7, r.details).step_done();
  });
}
void TraceWriter::insert(const ErrorRow& r) {
  guarded([&] {
    st_->error.bind_id(1, r.id).bind(2, r.rank).bind(3, r.t).bind_opt(4, r.step).bind_text_or_null(5, r.kind)
        .bind_text_or_null(6, r.site).bind(7, r.message).bind_text_or_null(8, r.tensors).bind_id(9, r.device_id)
        .step_done();
  });
}
void TraceWriter::insert(const DroppedRow& r) {
  guarded([&] {
    st_->dropped.bind_id(1, r.id).bind_opt(2, r.rank).bind(3, r.thread).bind(4, r.t).bind(5, r.events)
        .bind(6, r.reason).step_done();
  });
}

void TraceWriter::insert(const StepMemoryRow& r) {
  guarded([&] {
    st_->step_memory.bind_id(1, r.id).bind(2, r.rank).bind(3, r.device_id).bind_opt(4, r.step).bind_opt(5, r.epoch)
        .bind(6, r.t_start).bind_opt(7, r.t_end).bind(8, r.allocated_bytes).bind(9, r.reserved_bytes)
        .bind(10, r.peak_allocated_bytes).bind(11, r.peak_reserved_bytes).bind_opt(12, r.host_rss_bytes).step_done();
  });
}
void TraceWriter::insert(const EpochLiveRow& r) {
  guarded([&] {
    st_->epoch_live.bind_id(1, r.id).bind(2, r.rank).bind(3, r.epoch).bind(4, int64_t(r.at)).bind(5, r.t)
        .bind(6, r.device_id).bind(7, i(r.memory_kind)).bind(8, i(r.level)).bind_id(9, r.name_id)
        .bind_id(10, r.stack_id).bind(11, r.bytes).bind(12, r.allocations).bind(13, r.sampled)
        .bind(14, r.sampled_variance).step_done();
  });
}
void TraceWriter::insert(const DetailSpanRow& r) {
  guarded([&] {
    st_->detail_span.bind_id(1, r.id).bind(2, r.rank).bind(3, r.t_start).bind_opt(4, r.t_end)
        .bind_text_or_null(5, r.end_reason).step_done();
  });
}
void TraceWriter::end_detail_span(int64_t id, int64_t t_end, const std::string& reason) {
  guarded([&] { st_->detail_end.bind(1, t_end).bind_text_or_null(2, reason).bind(3, id).step_done(); });
}
int64_t TraceWriter::size_bytes() {
  int64_t out = 0;
  guarded([&] {
    if (st_->page_count.step()) out = st_->page_count.i64(0);
    st_->page_count.reset();
  });
  return out;
}

bool TraceWriter::set_allocation_freed(int64_t id, int64_t t_free) {
  bool found = false;
  guarded([&] {
    if (AllocationRow* r = st_->allocation.waiting(id)) {
      r->t_free = t_free;
      found = true;
      return;
    }
    st_->alloc_free.bind(1, t_free).bind(2, id).step_done();
    found = sqlite3_changes(db_) > 0;
  });
  return found;
}
bool TraceWriter::set_marker_end(int64_t id, int64_t t_end, std::optional<int64_t> value) {
  bool found = false;
  guarded([&] {
    if (MarkerRow* r = st_->marker.waiting(id)) {  // the UPDATE's "value = coalesce(?, value)"
      r->t_end = t_end;
      if (value) r->value = value;
      found = true;
      return;
    }
    st_->marker_end.bind(1, t_end).bind_opt(2, value).bind(3, id).step_done();
    found = sqlite3_changes(db_) > 0;
  });
  return found;
}
void TraceWriter::set_run_end(int64_t run_id, int64_t t_end, RunStatus status, std::optional<int64_t> exit_code,
                              const std::string& detail) {
  guarded([&] {
    st_->run_end.bind(1, t_end).bind(2, i(status)).bind_opt(3, exit_code).bind_text_or_null(4, detail)
        .bind(5, run_id).step_done();
  });
}
void TraceWriter::add_run_note(int64_t run_id, const std::string& text) {
  sqlite3* db = handle();
  guarded([&] {
    Stmt s(db,
           "UPDATE run SET config_json = json_insert(json_insert(coalesce(config_json, '{}'), '$.notes', json('[]')), "
           "'$.notes[#]', ?1) WHERE id = ?2 AND json_valid(coalesce(config_json, '{}')) AND "
           "json_type(coalesce(config_json, '{}')) = 'object'");
    s.bind(1, std::string_view(text)).bind(2, run_id).step_done();
  });
}
void TraceWriter::set_frame_symbol(int64_t frame_id, const std::string& module, std::optional<int64_t> offset,
                                   const std::string& symbol) {
  guarded([&] {
    st_->frame_symbol.bind_text_or_null(1, module).bind_opt(2, offset).bind_text_or_null(3, symbol)
        .bind(4, frame_id).step_done();
  });
}
void TraceWriter::set_meta(const std::string& key, const std::string& value) {
  guarded([&] { st_->meta.bind(1, key).bind(2, value).step_done(); });
}

Status TraceWriter::finish() {
  commit();
  Status own;
  try {
    try {
      detail::match_driver_records(db_);
    } catch (const detail::SqlError& e) {
      // The pairing is a convenience: the rows are all there without it, so the trace is still
      // finished (indexed, one file), and says why its CUPTI rows are unpaired.
      set_meta("driver_records", std::string("not paired: ") + e.what());
    }
    detail::exec(db_, index_sql());
    detail::exec(db_, "PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode=DELETE;");
  } catch (const std::exception& e) {
    own = Status::Error(path_ + ": could not finish the trace: " + e.what());
  }
  if (failed_) return status();
  return own;
}

}  // namespace zt::db
