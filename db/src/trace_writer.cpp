#include "zt/db/trace_writer.h"

#include <sqlite3.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "match.h"
#include "sqlite.h"
#include "zt/db/trace_file.h"

namespace zt::db {
using detail::Stmt;

struct TraceWriter::Statements {
  Stmt run, rank, device, string, frame, stack, allocation, transfer, kernel, placement, marker, counter, fault,
      error, dropped, alloc_free, marker_end, run_end, frame_symbol, meta;
};

namespace {
std::string parent_dir(const std::string& path) {
  auto p = std::filesystem::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}
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

Status TraceWriter::create(const std::string& path, std::unique_ptr<TraceWriter>* out) {
  configure_sqlite_once();
  TraceFileInfo info;
  if (Status s = inspect_trace_file(path, &info); !s) return s;
  if (info.exists && info.size > 0 && !(info.is_sqlite && info.application_id == kApplicationId))
    return Status::Error(path + ": exists and is not a zerotrace trace; refusing to overwrite it");
  std::string dir = parent_dir(path);
  if (::access(dir.c_str(), F_OK) != 0) return Status::Error(path + ": directory " + dir + " does not exist");
  if (::access(dir.c_str(), W_OK) != 0)
    return Status::Error(path + ": cannot create the trace, directory " + dir + " is not writable (" +
                         std::strerror(errno) + ")");

  // Build the new trace beside the target, then rename it into place: whatever was at
  // `path` stays intact until a complete empty trace replaces it.
  std::string tmp = path + ".creating";
  remove_trace_files(tmp);
  std::unique_ptr<TraceWriter> w(new TraceWriter());
  w->path_ = path;
  int rc = sqlite3_open_v2(tmp.c_str(), &w->db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = w->db_ ? sqlite3_errmsg(w->db_) : sqlite3_errstr(rc);
    sqlite3_close(w->db_);
    w->db_ = nullptr;
    remove_trace_files(tmp);
    return Status::Error(path + ": cannot create the trace: " + msg);
  }
  try {
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
    auto& s = *(w->st_ = std::make_unique<Statements>());
    sqlite3* db = w->db_;
    s.run = Stmt(db,
                 "INSERT INTO run(id,tool_version,command_line,config_json,seed,hostname,pid,t_start,t_end,"
                 "wall_start_unix_ns,status,exit_code,exit_detail,source_file) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
    s.rank = Stmt(db, "INSERT INTO rank(rank,run_id,world_size,local_rank,hostname,pid) VALUES(?,?,?,?,?,?)");
    s.device = Stmt(db,
                    "INSERT INTO device(id,rank,kind,ordinal,label,name,capacity_bytes,simulated) VALUES(?,?,?,?,?,?,?,?)");
    s.string = Stmt(db, "INSERT INTO string(id,text) VALUES(?,?)");
    s.frame = Stmt(db, "INSERT INTO frame(id,ip,module,module_offset,symbol) VALUES(?,?,?,?,?)");
    s.stack = Stmt(db, "INSERT INTO stack(id,parent_id,frame_id) VALUES(?,?,?)");
    s.allocation = Stmt(db,
                        "INSERT INTO allocation(id,rank,device_id,memory_kind,level,address,bytes,requested_bytes,"
                        "t_alloc,t_free,name_id,stack_id,source,segment_id,stream) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
    s.transfer = Stmt(db,
                      "INSERT INTO transfer(id,rank,kind,bytes,src_device_id,dst_device_id,pinned,t_start,t_end,stream,"
                      "name_id,op_id,participants,correlation_id,source,stack_id) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
    s.kernel = Stmt(db,
                    "INSERT INTO kernel(id,rank,device_id,name_id,t_start,t_end,stream,correlation_id,grid,block,source)"
                    " VALUES(?,?,?,?,?,?,?,?,?,?,?)");
    s.placement = Stmt(db,
                       "INSERT INTO placement(id,rank,t,tensor_id,device_id,why,bytes,allocation_id) VALUES(?,?,?,?,?,?,?,?)");
    s.marker = Stmt(db,
                    "INSERT INTO marker(id,rank,kind,name_id,t_start,t_end,step,micro_step,epoch,value)"
                    " VALUES(?,?,?,?,?,?,?,?,?,?)");
    s.counter = Stmt(db, "INSERT INTO counter(id,rank,device_id,name_id,t,value) VALUES(?,?,?,?,?,?)");
    s.fault = Stmt(db, "INSERT INTO fault(id,rank,t,name,trigger,step,details) VALUES(?,?,?,?,?,?,?)");
    s.error = Stmt(db, "INSERT INTO error(id,rank,t,step,kind,site,message,tensors,device_id) VALUES(?,?,?,?,?,?,?,?,?)");
    s.dropped = Stmt(db, "INSERT INTO dropped(id,rank,thread,t,events,reason) VALUES(?,?,?,?,?,?)");
    s.alloc_free = Stmt(db, "UPDATE allocation SET t_free=? WHERE id=?");
    s.marker_end = Stmt(db, "UPDATE marker SET t_end=?, value=coalesce(?, value) WHERE id=?");
    s.run_end = Stmt(db, "UPDATE run SET t_end=?, status=?, exit_code=?, exit_detail=? WHERE id=?");
    s.frame_symbol = Stmt(db, "UPDATE frame SET module=?, module_offset=?, symbol=? WHERE id=?");
    s.meta = Stmt(db, "INSERT OR REPLACE INTO meta(key,value) VALUES(?,?)");
  } catch (const detail::SqlError& e) {
    w->st_.reset();
    if (w->db_) sqlite3_close(w->db_);
    w->db_ = nullptr;
    remove_trace_files(tmp);
    return Status::Error(path + ": cannot create the trace: " + e.what());
  }
  *out = std::move(w);
  return Status::Ok();
}

TraceWriter::~TraceWriter() {
  if (in_tx_) {
    try {
      commit();
    } catch (...) {
    }
  }
  st_.reset();
  if (db_) sqlite3_close(db_);
}

void TraceWriter::begin() {
  if (!in_tx_) {
    detail::exec(db_, "BEGIN;");
    in_tx_ = true;
  }
}

void TraceWriter::commit() {
  if (in_tx_) {
    in_tx_ = false;
    detail::exec(db_, "COMMIT;");
  }
}

namespace {
int64_t i(auto v) { return static_cast<int64_t>(v); }
}  // namespace

void TraceWriter::insert(const RunRow& r) {
  st_->run.bind(1, r.id).bind(2, r.tool_version).bind(3, r.command_line).bind_text_or_null(4, r.config_json)
      .bind_opt(5, r.seed).bind_text_or_null(6, r.hostname).bind(7, r.pid).bind(8, r.t_start).bind_opt(9, r.t_end)
      .bind(10, r.wall_start_unix_ns).bind(11, i(r.status)).bind_opt(12, r.exit_code)
      .bind_text_or_null(13, r.exit_detail).bind_text_or_null(14, r.source_file).step_done();
}
void TraceWriter::insert(const RankRow& r) {
  st_->rank.bind(1, r.rank).bind(2, r.run_id).bind(3, r.world_size).bind_opt(4, r.local_rank)
      .bind_text_or_null(5, r.hostname).bind(6, r.pid).step_done();
}
void TraceWriter::insert(const DeviceRow& r) {
  st_->device.bind(1, r.id).bind(2, r.rank).bind(3, i(r.kind)).bind(4, r.ordinal).bind(5, r.label)
      .bind_text_or_null(6, r.name).bind_opt(7, r.capacity_bytes).bind(8, int64_t(r.simulated)).step_done();
}
void TraceWriter::insert(const StringRow& r) { st_->string.bind(1, r.id).bind(2, r.text).step_done(); }
void TraceWriter::insert(const FrameRow& r) {
  st_->frame.bind(1, r.id).bind(2, i(r.ip)).bind_text_or_null(3, r.module).bind_opt(4, r.module_offset)
      .bind_text_or_null(5, r.symbol).step_done();
}
void TraceWriter::insert(const StackRow& r) {
  st_->stack.bind(1, r.id).bind_id(2, r.parent_id).bind(3, r.frame_id).step_done();
}
void TraceWriter::insert(const AllocationRow& r) {
  st_->allocation.bind_id(1, r.id).bind(2, r.rank).bind(3, r.device_id).bind(4, i(r.memory_kind)).bind(5, i(r.level))
      .bind(6, i(r.address)).bind(7, r.bytes).bind(8, r.requested_bytes).bind(9, r.t_alloc).bind_opt(10, r.t_free)
      .bind_id(11, r.name_id).bind_id(12, r.stack_id).bind(13, i(r.source)).bind_id(14, r.segment_id)
      .bind_opt(15, r.stream).step_done();
}
void TraceWriter::insert(const TransferRow& r) {
  auto& s = st_->transfer;
  s.bind_id(1, r.id).bind(2, r.rank).bind(3, i(r.kind)).bind(4, r.bytes).bind_id(5, r.src_device_id)
      .bind_id(6, r.dst_device_id);
  if (r.pinned) s.bind(7, int64_t(*r.pinned)); else s.bind_null(7);
  s.bind(8, r.t_start).bind(9, r.t_end).bind_opt(10, r.stream).bind_id(11, r.name_id).bind_id(12, r.op_id)
      .bind_opt(13, r.participants).bind_opt(14, r.correlation_id).bind(15, i(r.source)).bind_id(16, r.stack_id)
      .step_done();
}
void TraceWriter::insert(const KernelRow& r) {
  st_->kernel.bind_id(1, r.id).bind(2, r.rank).bind(3, r.device_id).bind_id(4, r.name_id).bind(5, r.t_start)
      .bind(6, r.t_end).bind_opt(7, r.stream).bind_opt(8, r.correlation_id).bind_text_or_null(9, r.grid)
      .bind_text_or_null(10, r.block).bind(11, i(r.source)).step_done();
}
void TraceWriter::insert(const PlacementRow& r) {
  st_->placement.bind_id(1, r.id).bind(2, r.rank).bind(3, r.t).bind(4, r.tensor_id).bind_id(5, r.device_id)
      .bind(6, i(r.why)).bind_opt(7, r.bytes).bind_id(8, r.allocation_id).step_done();
}
void TraceWriter::insert(const MarkerRow& r) {
  st_->marker.bind_id(1, r.id).bind(2, r.rank).bind(3, i(r.kind)).bind_id(4, r.name_id).bind(5, r.t_start)
      .bind_opt(6, r.t_end).bind_opt(7, r.step).bind_opt(8, r.micro_step).bind_opt(9, r.epoch).bind_opt(10, r.value)
      .step_done();
}
void TraceWriter::insert(const CounterRow& r) {
  auto& s = st_->counter;
  s.bind_id(1, r.id).bind(2, r.rank).bind_id(3, r.device_id).bind(4, r.name_id).bind(5, r.t);
  // Byte counts stay exact integers; rates and losses stay real.
  if (r.value == static_cast<double>(static_cast<int64_t>(r.value)) && r.value < 9.0e15 && r.value > -9.0e15)
    s.bind(6, static_cast<int64_t>(r.value));
  else
    s.bind(6, r.value);
  s.step_done();
}
void TraceWriter::insert(const FaultRow& r) {
  st_->fault.bind_id(1, r.id).bind(2, r.rank).bind(3, r.t).bind(4, r.name).bind_text_or_null(5, r.trigger)
      .bind_opt(6, r.step).bind_text_or_null(7, r.details).step_done();
}
void TraceWriter::insert(const ErrorRow& r) {
  st_->error.bind_id(1, r.id).bind(2, r.rank).bind(3, r.t).bind_opt(4, r.step).bind_text_or_null(5, r.kind)
      .bind_text_or_null(6, r.site).bind(7, r.message).bind_text_or_null(8, r.tensors).bind_id(9, r.device_id).step_done();
}
void TraceWriter::insert(const DroppedRow& r) {
  st_->dropped.bind_id(1, r.id).bind_opt(2, r.rank).bind(3, r.thread).bind(4, r.t).bind(5, r.events).bind(6, r.reason)
      .step_done();
}

bool TraceWriter::set_allocation_freed(int64_t id, int64_t t_free) {
  st_->alloc_free.bind(1, t_free).bind(2, id).step_done();
  return sqlite3_changes(db_) > 0;
}
bool TraceWriter::set_marker_end(int64_t id, int64_t t_end, std::optional<int64_t> value) {
  st_->marker_end.bind(1, t_end).bind_opt(2, value).bind(3, id).step_done();
  return sqlite3_changes(db_) > 0;
}
void TraceWriter::set_run_end(int64_t run_id, int64_t t_end, RunStatus status, std::optional<int64_t> exit_code,
                              const std::string& detail) {
  st_->run_end.bind(1, t_end).bind(2, i(status)).bind_opt(3, exit_code).bind_text_or_null(4, detail).bind(5, run_id)
      .step_done();
}
void TraceWriter::set_frame_symbol(int64_t frame_id, const std::string& module, std::optional<int64_t> offset,
                                   const std::string& symbol) {
  st_->frame_symbol.bind_text_or_null(1, module).bind_opt(2, offset).bind_text_or_null(3, symbol).bind(4, frame_id)
      .step_done();
}
void TraceWriter::set_meta(const std::string& key, const std::string& value) {
  st_->meta.bind(1, key).bind(2, value).step_done();
}

Status TraceWriter::finish() {
  try {
    commit();
    try {
      detail::match_driver_records(db_);
    } catch (const detail::SqlError& e) {
      // The pairing is a convenience: the rows are all there without it, so the trace is still
      // finished (indexed, one file), and says why its CUPTI rows are unpaired.
      set_meta("driver_records", std::string("not paired: ") + e.what());
    }
    detail::exec(db_, index_sql());
    detail::exec(db_, "PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode=DELETE;");
  } catch (const detail::SqlError& e) {
    return Status::Error(path_ + ": could not finish the trace: " + e.what());
  }
  return Status::Ok();
}

}  // namespace zt::db
