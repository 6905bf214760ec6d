#include "zt/db/trace_reader.h"

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cstdio>
#include <limits>
#include <map>
#include <set>

#include "sqlite.h"
#include "zt/common/units.h"
#include "zt/db/trace_file.h"
#include "zt/db/trace_values.h"

namespace zt::db {
using detail::SqlError;
using detail::Stmt;

const std::vector<std::string>& TraceReader::table_names() {
  static const std::vector<std::string> names{"run",       "rank",   "device",  "string",  "frame",
                                              "stack",     "allocation", "transfer", "kernel", "placement",
                                              "marker",    "counter", "fault",   "error",   "dropped"};
  return names;
}

const std::vector<std::string>& TraceReader::aggregate_table_names() {
  static const std::vector<std::string> names{"step_memory", "epoch_live", "detail_span"};
  return names;
}

namespace {
// The tables the reader reads must be tables: a view or virtual table of the same name in a
// file from elsewhere could run any query (a recursive one that never ends) under our SELECTs.
std::string foreign_objects(sqlite3* db) {
  std::string names;
  for (const auto& t : TraceReader::table_names()) names += (names.empty() ? "'" : ",'") + t + "'";
  for (const auto& t : TraceReader::aggregate_table_names()) names += ",'" + t + "'";
  for (const char* e : {"enum_memory_kind", "enum_level", "enum_source", "enum_transfer_kind", "enum_placement_why",
                        "enum_marker_kind", "enum_device_kind", "enum_run_status", "enum_rank_role"})
    names += std::string(",'") + e + "'";
  Stmt s(db, "SELECT name, type FROM main.sqlite_schema WHERE name IN (" + names +
                 ") AND (type != 'table' OR sql LIKE 'CREATE VIRTUAL%') LIMIT 1");
  if (!s.step()) return "";
  return s.text(0) + " is a " + (s.text(1) == "table" ? std::string("virtual table") : s.text(1)) + ", not a table";
}

// The views of db/SCHEMA.md as TEMP views, which SQLite finds before the file's own: a query of
// allocation_v reads our definition, never one the file brought.
void define_views(sqlite3* db, bool weights) {
  std::string sql = views_sql();
  for (size_t at = 0; (at = sql.find("CREATE VIEW", at)) != std::string::npos; at += 16) sql.replace(at, 11, "CREATE TEMP VIEW");
  // A file from before sampled rows: allocation_v has the column all the same, NULL.
  if (!weights)
    if (size_t at = sql.find("a.weight_bytes"); at != std::string::npos) sql.replace(at, 14, "NULL AS weight_bytes");
  detail::exec(db, sql.c_str());
}
}  // namespace

Status TraceReader::open(const std::string& path, std::unique_ptr<TraceReader>* out, Checks checks) {
  if (Status s = validate_trace_file(path); !s) return s;
  std::unique_ptr<TraceReader> r(new TraceReader());
  r->path_ = path;
  int rc = sqlite3_open_v2(path.c_str(), &r->db_, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = one_line(r->db_ ? sqlite3_errmsg(r->db_) : sqlite3_errstr(rc));
    return Status::Error(path + ": cannot open the trace: " + msg);
  }
  try {
    // Functions with side effects never run from the file's schema (SQLite's advice for
    // databases from elsewhere).
    detail::exec(r->db_, "PRAGMA trusted_schema=0;");
    int64_t version = detail::query_int(r->db_, "PRAGMA user_version", -1);
    if (!schema_version_readable(version)) return Status::Error(schema_version_refusal(path, version));
    r->schema_version_ = int(version);
    if (std::string why = foreign_objects(r->db_); !why.empty())
      return Status::Error(path + ": not a zerotrace trace (" + why + ")");
    r->frame_lines_ = detail::query_int(r->db_, "SELECT count(*) FROM pragma_table_info('frame') WHERE name = 'line'") > 0;
    r->rank_roles_ = detail::query_int(r->db_, "SELECT count(*) FROM pragma_table_info('rank') WHERE name = 'role'") > 0;
    r->weights_ =
        detail::query_int(r->db_, "SELECT count(*) FROM pragma_table_info('allocation') WHERE name = 'weight_bytes'") > 0;
    define_views(r->db_, r->weights_);
    detail::exec(r->db_, "PRAGMA query_only=1;");
    // Touch the schema and every table once: corruption and foreign layouts show here,
    // not halfway through a command.
    // Version 3 on: the aggregate tables (a version 3 file without them is damaged, and refused here).
    r->aggregates_ = version >= kAggregatesSchemaVersion;
    for (const auto& t : r->tables()) {
      Stmt s(r->db_, "SELECT count(*) FROM (SELECT 1 FROM " + t + " LIMIT 1)");
      s.step();
    }
  } catch (const SqlError& e) {
    if (e.code == SQLITE_CORRUPT || e.code == SQLITE_NOTADB)
      return Status::Error(path + ": corrupt or truncated trace (" + e.what() + ")");
    return Status::Error(path + ": not a readable zerotrace trace (" + e.what() + ")");
  }
  // Every value a reader uses, in its range (zt/db/trace_values.h), before anyone trusts one.
  if (checks != Checks::None) {
    const auto& streamed = streamed_tables();
    for (const auto& t : r->tables()) {
      if (checks == Checks::SmallTables && std::find(streamed.begin(), streamed.end(), t) != streamed.end()) continue;
      if (Status s = check_table_values(r->db_, path, t); !s) return s;
    }
  }
  *out = std::move(r);
  return Status::Ok();
}

TraceReader::~TraceReader() {
  if (db_) sqlite3_close(db_);
}

std::string frame_text(const FrameRow& f) {
  char buf[64];
  if (f.python()) {
    std::string line = (f.symbol.empty() ? std::string("?") : f.symbol) + " (" + f.module;
    if (*f.line > 0) line += ":" + std::to_string(*f.line);
    return line + ")";
  }
  std::string line;
  if (!f.symbol.empty()) {
    line = f.symbol;
  } else {
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(f.ip));
    line = buf;
  }
  if (!f.module.empty()) {
    std::snprintf(buf, sizeof buf, "+0x%llx", static_cast<unsigned long long>(f.module_offset.value_or(0)));
    line += " (" + f.module + buf + ")";
  }
  return line;
}

Status TraceReader::fail(const std::string& what) const { return Status::Error(path_ + ": " + what); }

template <typename Row, typename Fill>
Status TraceReader::read_rows(const char* sql, std::vector<Row>* out, Fill fill) {
  out->clear();
  try {
    Stmt s(db_, sql);
    while (s.step()) {
      Row r;
      fill(s, r);
      out->push_back(std::move(r));
    }
  } catch (const SqlError& e) {
    return fail(std::string("reading failed: ") + e.what());
  }
  return Status::Ok();
}

namespace {
int64_t id0(const Stmt& s, int c) { return s.is_null(c) ? 0 : s.i64(c); }

// CUPTI's segments beside the trainer's (see DriverRecords); nothing when either is missing.
void summarize_driver_records(sqlite3* db, TraceSummary* out) {
  const std::string seg = "level = " + std::to_string(int(AllocLevel::Segment));
  // The allocators' own segments: the trainer's (api) and PyTorch's (torch).
  const std::string api = std::string("(") + kAllocatorSourcesSql + ")", cupti = std::to_string(int(Source::Cupti));
  // Most traces have one source: EXISTS stops at the first row, and nothing else runs.
  Stmt both(db, "SELECT EXISTS(SELECT 1 FROM allocation WHERE source = " + cupti + " AND " + seg +
                    ") AND EXISTS(SELECT 1 FROM allocation WHERE source IN " + api + " AND " + seg + ")");
  if (!both.step() || both.i64(0) == 0) return;
  // The trainer's segments CUPTI could have seen (not pageable host memory: malloc is not CUDA's)
  // and has no record of; uncorrelated, so one pass over the table (segment_id has no index).
  const std::string seen_kinds = std::to_string(int(MemoryKind::Device)) + ", " +
                                 std::to_string(int(MemoryKind::PinnedHost)) + ", " +
                                 std::to_string(int(MemoryKind::Managed));
  const std::string twins = "SELECT segment_id FROM allocation WHERE source = " + cupti + " AND " + seg +
                            " AND segment_id IS NOT NULL";
  Stmt counts(db, "SELECT (SELECT count(*) FROM allocation WHERE source = " + cupti + " AND " + seg + " AND NOT " +
                      kModuleGlobalSql + "), (SELECT count(*) FROM (" + twins + ")), (SELECT count(*) FROM allocation WHERE source IN " +
                      api + " AND " + seg + " AND memory_kind IN (" + seen_kinds + ") AND id NOT IN (" + twins + "))");
  if (!counts.step()) return;
  DriverRecords d;
  d.cupti_segments = counts.i64(0);
  d.paired = counts.i64(1);
  d.api_unpaired = counts.i64(2);
  // Outside: CUPTI's device segments with no twin; their live bytes per device, at the highest.
  Stmt outside(db, "WITH o AS (SELECT * FROM allocation WHERE source = " + cupti + " AND " + seg +
                       " AND segment_id IS NULL AND memory_kind = " + std::to_string(int(MemoryKind::Device)) +
                       "), ev AS (SELECT device_id, t_alloc AS t, bytes AS b FROM o UNION ALL"
                       " SELECT device_id, t_free, -bytes FROM o WHERE t_free IS NOT NULL)"
                       " SELECT (SELECT count(*) FROM o), (SELECT coalesce(sum(bytes), 0) FROM o WHERE t_free IS NULL),"
                       " coalesce((SELECT sum(p) FROM (SELECT max(live) AS p FROM (SELECT device_id, sum(b) OVER"
                       " (PARTITION BY device_id ORDER BY t, b ROWS UNBOUNDED PRECEDING) AS live FROM ev)"
                       " GROUP BY device_id)), 0)");
  if (outside.step()) {
    d.outside_count = outside.i64(0);
    d.outside_live_at_end = outside.i64(1);
    d.outside_peak_bytes = outside.i64(2);
  }
  out->driver = d;
}

// SQL true for every marker row, written so that SQLite reads one kind of marker through the
// marker_by_time index (rank, kind, ...): `COLUMN IN (the table's ranks)`, the ranks found by
// stepping through the index (one seek a rank), where the file has an index led by marker.rank.
// A day's trace has 11.5M markers and 86k step markers: the step and epoch counts read these only.
// Without such an index (a killed run's trace, indexed at the end) "1": one scan, as before, never
// a scan per rank. Every marker's rank is an integer once the table passed its checks, so the two
// forms select the same rows.
std::string all_marker_ranks(sqlite3* db, const std::string& column) {
  const bool indexed = detail::query_int(db,
                                         "SELECT count(*) FROM pragma_index_list('marker') l, pragma_index_info(l.name) i "
                                         "WHERE i.seqno = 0 AND i.name = 'rank'") > 0;
  if (!indexed) return "1";
  return column + " IN (WITH RECURSIVE r(x) AS (SELECT min(rank) FROM marker UNION ALL SELECT (SELECT min(rank) FROM "
                  "marker WHERE rank > r.x) FROM r WHERE r.x IS NOT NULL) SELECT x FROM r WHERE x IS NOT NULL)";
}
}  // namespace

Status TraceReader::read(std::vector<RunRow>* out) {
  return read_rows("SELECT id,tool_version,command_line,config_json,seed,hostname,pid,t_start,t_end,"
                   "wall_start_unix_ns,status,exit_code,exit_detail,source_file FROM run ORDER BY id",
                   out, [](const Stmt& s, RunRow& r) {
                     r.id = s.i64(0); r.tool_version = s.text(1); r.command_line = s.text(2);
                     r.config_json = s.text(3); r.seed = s.opt(4); r.hostname = s.text(5); r.pid = s.i64(6);
                     r.t_start = s.i64(7); r.t_end = s.opt(8); r.wall_start_unix_ns = s.i64(9);
                     r.status = RunStatus(s.i64(10)); r.exit_code = s.opt(11); r.exit_detail = s.text(12);
                     r.source_file = s.text(13);
                   });
}
Status TraceReader::read(std::vector<RankRow>* out) {
  // Files from before rank roles: every row a rank, its job rank unknown.
  return read_rows(rank_roles_ ? "SELECT rank,run_id,world_size,local_rank,hostname,pid,role,job_rank FROM rank ORDER BY rank"
                               : "SELECT rank,run_id,world_size,local_rank,hostname,pid,0,NULL FROM rank ORDER BY rank",
                   out, [](const Stmt& s, RankRow& r) {
                     r.rank = s.i64(0); r.run_id = s.i64(1); r.world_size = s.i64(2); r.local_rank = s.opt(3);
                     r.hostname = s.text(4); r.pid = s.i64(5); r.role = RankRole(s.i64(6)); r.job_rank = s.opt(7);
                   });
}
Status TraceReader::read(std::vector<DeviceRow>* out) {
  return read_rows("SELECT id,rank,kind,ordinal,label,name,capacity_bytes,simulated FROM device ORDER BY id", out,
                   [](const Stmt& s, DeviceRow& r) {
                     r.id = s.i64(0); r.rank = s.i64(1); r.kind = DeviceKind(s.i64(2)); r.ordinal = s.i64(3);
                     r.label = s.text(4); r.name = s.text(5); r.capacity_bytes = s.opt(6); r.simulated = s.i64(7) != 0;
                   });
}
Status TraceReader::read(std::vector<StringRow>* out) {
  return read_rows("SELECT id,text FROM string ORDER BY id", out, [](const Stmt& s, StringRow& r) {
    r.id = s.i64(0); r.text = s.text(1);
  });
}
Status TraceReader::read(std::vector<FrameRow>* out) {
  return read_rows(frame_lines_ ? "SELECT id,ip,module,module_offset,symbol,line FROM frame ORDER BY id"
                                : "SELECT id,ip,module,module_offset,symbol,NULL FROM frame ORDER BY id",
                   out, [](const Stmt& s, FrameRow& r) {
                     r.id = s.i64(0); r.ip = uint64_t(s.i64(1)); r.module = s.text(2); r.module_offset = s.opt(3);
                     r.symbol = s.text(4); r.line = s.opt(5);
                   });
}
Status TraceReader::read(std::vector<StackRow>* out) {
  return read_rows("SELECT id,parent_id,frame_id FROM stack ORDER BY id", out, [](const Stmt& s, StackRow& r) {
    r.id = s.i64(0); r.parent_id = id0(s, 1); r.frame_id = s.i64(2);
  });
}
Status TraceReader::read(std::vector<AllocationRow>* out) {
  return read_rows(weights_ ? "SELECT id,rank,device_id,memory_kind,level,address,bytes,requested_bytes,t_alloc,t_free,"
                              "name_id,stack_id,source,segment_id,stream,weight_bytes FROM allocation ORDER BY t_alloc, id"
                            : "SELECT id,rank,device_id,memory_kind,level,address,bytes,requested_bytes,t_alloc,t_free,"
                              "name_id,stack_id,source,segment_id,stream,NULL FROM allocation ORDER BY t_alloc, id",
                   out, [](const Stmt& s, AllocationRow& r) {
                     r.id = s.i64(0); r.rank = s.i64(1); r.device_id = s.i64(2); r.memory_kind = MemoryKind(s.i64(3));
                     r.level = AllocLevel(s.i64(4)); r.address = uint64_t(s.i64(5)); r.bytes = s.i64(6);
                     r.requested_bytes = s.i64(7); r.t_alloc = s.i64(8); r.t_free = s.opt(9); r.name_id = id0(s, 10);
                     r.stack_id = id0(s, 11); r.source = Source(s.i64(12)); r.segment_id = id0(s, 13);
                     r.stream = s.opt(14); r.weight_bytes = s.opt(15);
                   });
}
Status TraceReader::read(std::vector<TransferRow>* out) {
  return read_rows("SELECT id,rank,kind,bytes,src_device_id,dst_device_id,pinned,t_start,t_end,stream,name_id,"
                   "op_id,participants,correlation_id,source,stack_id FROM transfer ORDER BY t_start, id",
                   out, [](const Stmt& s, TransferRow& r) {
                     r.id = s.i64(0); r.rank = s.i64(1); r.kind = TransferKind(s.i64(2)); r.bytes = s.i64(3);
                     r.src_device_id = id0(s, 4); r.dst_device_id = id0(s, 5);
                     if (!s.is_null(6)) r.pinned = s.i64(6) != 0;
                     r.t_start = s.i64(7); r.t_end = s.i64(8); r.stream = s.opt(9); r.name_id = id0(s, 10);
                     r.op_id = id0(s, 11); r.participants = s.opt(12); r.correlation_id = s.opt(13);
                     r.source = Source(s.i64(14)); r.stack_id = id0(s, 15);
                   });
}
Status TraceReader::read(std::vector<KernelRow>* out) {
  return read_rows("SELECT id,rank,device_id,name_id,t_start,t_end,stream,correlation_id,grid,block,source "
                   "FROM kernel ORDER BY t_start, id",
                   out, [](const Stmt& s, KernelRow& r) {
                     r.id = s.i64(0); r.rank = s.i64(1); r.device_id = s.i64(2); r.name_id = id0(s, 3);
                     r.t_start = s.i64(4); r.t_end = s.i64(5); r.stream = s.opt(6); r.correlation_id = s.opt(7);
                     r.grid = s.text(8); r.block = s.text(9); r.source = Source(s.i64(10));
                   });
}
Status TraceReader::read(std::vector<PlacementRow>* out) {
  return read_rows("SELECT id,rank,t,tensor_id,device_id,why,bytes,allocation_id FROM placement ORDER BY t, id", out,
                   [](const Stmt& s, PlacementRow& r) {
                     r.id = s.i64(0); r.rank = s.i64(1); r.t = s.i64(2); r.tensor_id = s.i64(3);
                     r.device_id = id0(s, 4); r.why = PlacementWhy(s.i64(5)); r.bytes = s.opt(6);
                     r.allocation_id = id0(s, 7);
                   });
}
Status TraceReader::read(std::vector<MarkerRow>* out) {
  return read_rows("SELECT id,rank,kind,name_id,t_start,t_end,step,micro_step,epoch,value FROM marker "
                   "ORDER BY t_start, id",
                   out, [](const Stmt& s, MarkerRow& r) {
                     r.id = s.i64(0); r.rank = s.i64(1); r.kind = MarkerKind(s.i64(2)); r.name_id = id0(s, 3);
                     r.t_start = s.i64(4); r.t_end = s.opt(5); r.step = s.opt(6); r.micro_step = s.opt(7);
                     r.epoch = s.opt(8); r.value = s.opt(9);
                   });
}
Status TraceReader::read(std::vector<CounterRow>* out) {
  return read_rows("SELECT id,rank,device_id,name_id,t,value FROM counter ORDER BY t, id", out,
                   [](const Stmt& s, CounterRow& r) {
                     r.id = s.i64(0); r.rank = s.i64(1); r.device_id = id0(s, 2); r.name_id = s.i64(3);
                     r.t = s.i64(4);
                     r.value = s.is_null(5) ? std::numeric_limits<double>::quiet_NaN() : s.f64(5);  // SQLite has no NaN
                   });
}
Status TraceReader::read(std::vector<FaultRow>* out) {
  return read_rows("SELECT id,rank,t,name,trigger,step,details FROM fault ORDER BY t, id", out,
                   [](const Stmt& s, FaultRow& r) {
                     r.id = s.i64(0); r.rank = s.i64(1); r.t = s.i64(2); r.name = s.text(3); r.trigger = s.text(4);
                     r.step = s.opt(5); r.details = s.text(6);
                   });
}
Status TraceReader::read(std::vector<ErrorRow>* out) {
  return read_rows("SELECT id,rank,t,step,kind,site,message,tensors,device_id FROM error ORDER BY t, id", out,
                   [](const Stmt& s, ErrorRow& r) {
                     r.id = s.i64(0); r.rank = s.i64(1); r.t = s.i64(2); r.step = s.opt(3); r.kind = s.text(4);
                     r.site = s.text(5); r.message = s.text(6); r.tensors = s.text(7); r.device_id = id0(s, 8);
                   });
}
Status TraceReader::read(std::vector<DroppedRow>* out) {
  return read_rows("SELECT id,rank,thread,t,events,reason FROM dropped ORDER BY t, id", out,
                   [](const Stmt& s, DroppedRow& r) {
                     r.id = s.i64(0); r.rank = s.opt(1); r.thread = s.i64(2); r.t = s.i64(3); r.events = s.i64(4);
                     r.reason = s.text(5);
                   });
}

std::vector<std::string> TraceReader::tables() const {
  std::vector<std::string> out = table_names();
  if (aggregates_) out.insert(out.end(), aggregate_table_names().begin(), aggregate_table_names().end());
  return out;
}

Status TraceReader::read(std::vector<StepMemoryRow>* out) {
  if (!aggregates_) return out->clear(), Status::Ok();
  return read_rows("SELECT id,rank,device_id,step,epoch,t_start,t_end,allocated_bytes,reserved_bytes,"
                   "peak_allocated_bytes,peak_reserved_bytes,host_rss_bytes FROM step_memory ORDER BY t_start, id",
                   out, [](const Stmt& s, StepMemoryRow& r) {
                     r.id = s.i64(0); r.rank = s.i64(1); r.device_id = s.i64(2); r.step = s.opt(3); r.epoch = s.opt(4);
                     r.t_start = s.i64(5); r.t_end = s.opt(6); r.allocated_bytes = s.i64(7);
                     r.reserved_bytes = s.i64(8); r.peak_allocated_bytes = s.i64(9); r.peak_reserved_bytes = s.i64(10);
                     r.host_rss_bytes = s.opt(11);
                   });
}
Status TraceReader::read(std::vector<EpochLiveRow>* out) {
  if (!aggregates_) return out->clear(), Status::Ok();
  return read_rows("SELECT id,rank,epoch,at,t,device_id,memory_kind,level,name_id,stack_id,bytes,allocations,sampled,"
                   "sampled_variance FROM epoch_live ORDER BY t, id",
                   out, [](const Stmt& s, EpochLiveRow& r) {
                     r.id = s.i64(0); r.rank = s.i64(1); r.epoch = s.i64(2); r.at = int(s.i64(3)); r.t = s.i64(4);
                     r.device_id = s.i64(5); r.memory_kind = MemoryKind(s.i64(6)); r.level = AllocLevel(s.i64(7));
                     r.name_id = s.i64(8); r.stack_id = s.i64(9); r.bytes = s.i64(10); r.allocations = s.i64(11);
                     r.sampled = s.i64(12); r.sampled_variance = s.f64(13);
                   });
}
Status TraceReader::read(std::vector<DetailSpanRow>* out) {
  if (!aggregates_) return out->clear(), Status::Ok();
  return read_rows("SELECT id,rank,t_start,t_end,end_reason FROM detail_span ORDER BY t_start, id", out,
                   [](const Stmt& s, DetailSpanRow& r) {
                     r.id = s.i64(0); r.rank = s.i64(1); r.t_start = s.i64(2); r.t_end = s.opt(3);
                     r.end_reason = s.text(4);
                   });
}

Status TraceReader::strings(std::unordered_map<int64_t, std::string>* out) {
  std::vector<StringRow> rows;
  if (Status s = read(&rows); !s) return s;
  out->clear();
  for (auto& r : rows) out->emplace(r.id, std::move(r.text));
  return Status::Ok();
}

Status TraceReader::stack_frames(int64_t stack_id, std::vector<FrameRow>* out) {
  out->clear();
  try {
    Stmt s(db_,
           std::string("WITH RECURSIVE walk(id, parent_id, frame_id, depth) AS ("
                       " SELECT id, parent_id, frame_id, 0 FROM stack WHERE id = ?"
                       " UNION ALL SELECT s.id, s.parent_id, s.frame_id, w.depth + 1 FROM stack s JOIN walk w ON s.id = w.parent_id"
                       " WHERE w.depth < 1024)"
                       " SELECT f.id, f.ip, f.module, f.module_offset, f.symbol, ") +
               (frame_lines_ ? "f.line" : "NULL") + " FROM walk w JOIN frame f ON f.id = w.frame_id ORDER BY w.depth");
    s.bind(1, stack_id);
    while (s.step()) {
      FrameRow f;
      f.id = s.i64(0);
      f.ip = uint64_t(s.i64(1));
      f.module = s.text(2);
      f.module_offset = s.opt(3);
      f.symbol = s.text(4);
      f.line = s.opt(5);
      out->push_back(std::move(f));
    }
  } catch (const SqlError& e) {
    return fail(std::string("reading stack failed: ") + e.what());
  }
  return Status::Ok();
}

Status TraceReader::stack_text(int64_t stack_id, std::vector<std::string>* out) {
  out->clear();
  std::vector<FrameRow> frames;
  if (Status s = stack_frames(stack_id, &frames); !s) return s;
  for (const FrameRow& f : frames) out->push_back(frame_text(f));
  return Status::Ok();
}

Status TraceReader::row_count(const std::string& table, int64_t* out) {
  try {
    *out = detail::query_int(db_, ("SELECT count(*) FROM \"" + table + "\"").c_str());
  } catch (const SqlError& e) {
    return fail(std::string("counting ") + table + " failed: " + e.what());
  }
  return Status::Ok();
}

namespace {
// One read-only statement, or why not: the text after the first statement must hold no other
// (sqlite3_prepare compiles only the first and would ignore the rest), and nothing may write a file
// (VACUUM INTO and ATTACH create one even on a read-only connection).
std::string refuse_query(sqlite3* db, const std::string& sql) {
  sqlite3_stmt* first = nullptr;
  const char* tail = nullptr;
  if (sqlite3_prepare_v2(db, sql.c_str(), int(sql.size()), &first, &tail) != SQLITE_OK)
    return one_line(sqlite3_errmsg(db));
  if (first == nullptr) return "no SQL statement given";
  const bool readonly = sqlite3_stmt_readonly(first) != 0;
  // The first keyword, after any comments.
  std::string kw;
  const std::string text = sqlite3_sql(first);
  for (size_t i = 0; i < text.size() && kw.size() < 8;) {
    if (text.compare(i, 2, "--") == 0) {
      i = text.find('\n', i);
      if (i == std::string::npos) break;
    } else if (text.compare(i, 2, "/*") == 0) {
      i = text.find("*/", i);
      if (i == std::string::npos) break;
      i += 2;
    } else if (std::isalpha(static_cast<unsigned char>(text[i]))) {
      kw += char(std::toupper(static_cast<unsigned char>(text[i++])));
      continue;
    } else if (!kw.empty()) {
      break;
    } else {
      ++i;
    }
  }
  sqlite3_finalize(first);
  // A PRAGMA that sets nothing reads (journal_mode, page_size); SQLite calls some of them writing.
  const bool pragma_read = kw == "PRAGMA" && text.find('=') == std::string::npos;
  if ((!readonly && !pragma_read) || kw == "VACUUM" || kw == "ATTACH")
    return "only reading statements (SELECT, WITH, PRAGMA ...) run on a trace; this one writes";
  sqlite3_stmt* second = nullptr;
  const char* rest = tail;
  if (tail && sqlite3_prepare_v2(db, tail, -1, &second, &rest) == SQLITE_OK && second == nullptr) return "";
  if (second) sqlite3_finalize(second);
  std::string more(tail ? tail : "");
  if (more.size() > 40) more = more.substr(0, 40) + "...";
  return "one statement at a time: another follows the first ('" + more + "')";
}
}  // namespace

namespace {
// Called by SQLite every few thousand virtual-machine steps while a limited query runs.
struct QueryWatch {
  const QueryLimits* limits;
  std::chrono::steady_clock::time_point deadline;
  QueryResult::Stopped why = QueryResult::Stopped::No;
};
int watch_query(void* arg) {
  auto* w = static_cast<QueryWatch*>(arg);
  if (w->limits->interrupted && *w->limits->interrupted) w->why = QueryResult::Stopped::Interrupted;
  else if (w->limits->timeout_ms > 0 && std::chrono::steady_clock::now() > w->deadline) w->why = QueryResult::Stopped::Timeout;
  return w->why != QueryResult::Stopped::No;  // non-zero: SQLite stops the statement (SQLITE_INTERRUPT)
}
}  // namespace

Status TraceReader::query(const std::string& sql, QueryResult* out, const QueryLimits& limits) {
  *out = QueryResult{};
  if (std::string why = refuse_query(db_, sql); !why.empty()) return Status::Error(path_ + ": SQL error: " + why);
  QueryWatch watch{&limits, std::chrono::steady_clock::now() + std::chrono::milliseconds(limits.timeout_ms)};
  const bool watched = limits.timeout_ms > 0 || limits.interrupted;
  if (watched) sqlite3_progress_handler(db_, 4096, watch_query, &watch);
  struct Unwatch {
    sqlite3* db;
    bool on;
    ~Unwatch() {
      if (on) sqlite3_progress_handler(db, 0, nullptr, nullptr);
    }
  } unwatch{db_, watched};
  try {
    Stmt s(db_, sql);
    int n = s.columns();
    for (int c = 0; c < n; ++c) out->columns.push_back(s.column_name(c));
    out->numeric.assign(n, true);
    while (s.step()) {
      if (limits.max_rows > 0 && int64_t(out->rows.size()) == limits.max_rows) {
        out->stopped = QueryResult::Stopped::RowLimit;
        return Status::Error(path_ + ": the query returned more than " + std::to_string(limits.max_rows) +
                             " rows; stopped there (--max-rows N for more, 0 for no limit)");
      }
      std::vector<std::string> row;
      for (int c = 0; c < n; ++c) {
        int type = s.column_type(c);
        if (type == SQLITE_NULL) row.push_back("NULL");
        else {
          if (type != SQLITE_INTEGER && type != SQLITE_FLOAT) out->numeric[c] = false;
          row.push_back(s.text(c));
        }
      }
      out->rows.push_back(std::move(row));
    }
  } catch (const SqlError& e) {
    out->stopped = watch.why;
    const std::string so_far = std::to_string(out->rows.size()) + " row" + (out->rows.size() == 1 ? "" : "s") + " read";
    if (watch.why == QueryResult::Stopped::Interrupted)
      return Status::Error(path_ + ": the query was interrupted (" + so_far + ")");
    if (watch.why == QueryResult::Stopped::Timeout)
      return Status::Error(path_ + ": the query ran longer than " + format_duration_ns(double(limits.timeout_ms) * 1e6) +
                           "; stopped (" + so_far + "; --timeout SECONDS for longer, 0 for no limit)");
    return Status::Error(path_ + ": SQL error: " + e.what());
  }
  return Status::Ok();
}

Status TraceReader::summarize_detail(TraceSummary::Detail* out) {
  *out = TraceSummary::Detail{};
  if (!aggregates_) return Status::Ok();
  out->aggregates = true;
  std::vector<DetailSpanRow>& spans = out->spans;
  if (Status s = read(&spans); !s) return s;
  // The earliest end of any span: detail is complete before it (after it, allocation rows are
  // missing wherever no span covers, so sums over them are not the run's).
  for (auto& sp : spans)
    if (sp.t_end && (!out->t_end || *sp.t_end < *out->t_end)) out->t_end = sp.t_end, out->end_reason = sp.end_reason;
  // A stretch [t0, t1] of a rank inside some span (a span without an end runs to the end of the
  // run). A merged trace has each process's spans under its rank: a rank's rows then count only
  // its own spans (a rank with none, any).
  std::set<int64_t> span_ranks;
  for (auto& sp : spans) span_ranks.insert(sp.rank);
  auto inside = [&](int64_t rank, int64_t t0, int64_t t1) {
    const bool own = span_ranks.size() > 1 && span_ranks.count(rank);
    for (auto& sp : spans)
      if ((!own || sp.rank == rank) && sp.t_start <= t0 && (!sp.t_end || t1 <= *sp.t_end)) return true;
    return false;
  };
  try {
    if (Stmt m(db_, "SELECT value FROM meta WHERE key = 'flight_recorder'"); m.step()) out->flight_recorder = m.text(0);
    // A step once (its rows: one per rank and device): with detail when on every rank it lies
    // inside a span (a step never ended: its begin). A row without a step number counts on its own.
    std::map<std::pair<int64_t, int64_t>, bool> steps;  // (numbered, step or row) -> detail
    Stmt st(db_, "SELECT step, t_start, t_end, id, rank FROM step_memory ORDER BY t_start");
    while (st.step()) {
      const std::optional<int64_t> step = st.opt(0);
      const int64_t last = st.is_null(2) ? st.i64(1) : st.i64(2);
      const bool detail = inside(st.i64(4), st.i64(1), last);
      auto [it, fresh] = steps.try_emplace({step ? 1 : 0, step ? *step : st.i64(3)}, detail);
      if (!fresh) it->second = it->second && detail;
    }
    for (auto& [key, detail] : steps) {
      ++out->steps;
      out->steps_with_detail += detail;
      if (key.first == 0) continue;
      const int64_t step = key.second;
      if (!out->first_step || step < *out->first_step) out->first_step = step;
      if (!out->last_step || step > *out->last_step) out->last_step = step;
      if (detail && (!out->last_detail_step || step > *out->last_detail_step)) out->last_detail_step = step;
      if (detail) {
        if (!out->detail_steps.empty() && out->detail_steps.back().second + 1 == step) out->detail_steps.back().second = step;
        else out->detail_steps.emplace_back(step, step);
      }
      if (!detail && (!out->first_aggregate_step || step < *out->first_aggregate_step)) out->first_aggregate_step = step;
    }
    Stmt ep(db_, "SELECT count(*) FROM (SELECT DISTINCT epoch, at FROM epoch_live)");
    if (ep.step()) out->epoch_boundaries = ep.i64(0);
  } catch (const SqlError& e) {
    return fail(std::string("reading the aggregates: ") + e.what());
  }
  return Status::Ok();
}

Status TraceReader::summarize(TraceSummary* out) {
  *out = TraceSummary{};
  if (Status s = read(&out->runs); !s) return s;
  if (Status s = read(&out->ranks); !s) return s;
  std::vector<DeviceRow> devices;
  if (Status s = read(&devices); !s) return s;
  for (const auto& t : tables()) {
    int64_t n = 0;
    if (Status s = row_count(t, &n); !s) return s;
    out->rows_per_table.emplace_back(t, n);
  }
  if (Status s = summarize_detail(&out->detail); !s) return s;
  try {
    Stmt span(db_,
              "SELECT min(t0), max(t1) FROM ("
              " SELECT min(t_alloc) t0, max(max(t_alloc, coalesce(t_free, t_alloc))) t1 FROM allocation"
              " UNION ALL SELECT min(t_start), max(t_end) FROM transfer"
              " UNION ALL SELECT min(t_start), max(t_end) FROM kernel"
              " UNION ALL SELECT min(t_start), max(max(t_start, coalesce(t_end, t_start))) FROM marker"
              " UNION ALL SELECT min(t), max(t) FROM counter"
              " UNION ALL SELECT min(t), max(t) FROM placement"
              " UNION ALL SELECT min(t), max(t) FROM fault"
              " UNION ALL SELECT min(t), max(t) FROM error)");
    if (span.step() && !span.is_null(0)) {
      out->t_first = span.i64(0);
      out->t_last = span.i64(1);
    }
    // Live bytes per device and level, as a running sum over alloc (+) and free (-)
    // events; at equal times frees count first, so a free-then-alloc is no false peak.
    std::map<int64_t, DevicePeak> peaks;
    for (auto& d : devices) peaks[d.id].device = d;
    Stmt peak(db_,
              std::string("WITH a AS (SELECT * FROM allocation WHERE NOT ") + kSecondRecordSql + " AND NOT " +
                  kModuleGlobalSql + " AND NOT " + sampled_sql() + "),"
              " ev AS (SELECT device_id, level, t_alloc AS t, bytes AS d FROM a"
              " UNION ALL SELECT device_id, level, t_free, -bytes FROM a WHERE t_free IS NOT NULL)"
              " SELECT device_id, level, max(live) FROM (SELECT device_id, level, sum(d) OVER"
              " (PARTITION BY device_id, level ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS live FROM ev)"
              " GROUP BY device_id, level");
    while (peak.step()) {
      auto& p = peaks[peak.i64(0)];
      if (AllocLevel(peak.i64(1)) == AllocLevel::Segment) p.peak_reserved = peak.i64(2);
      else p.peak_allocated = peak.i64(2);
    }
    // Blocks lie inside segments: what is left at the end is counted per level, as the peaks are.
    Stmt live(db_,
              std::string("SELECT device_id, level, count(*), sum(CASE WHEN t_free IS NULL THEN bytes ELSE 0 END) FROM"
                          " allocation WHERE NOT ") + kSecondRecordSql + " AND NOT " + kModuleGlobalSql +
                  " AND NOT " + sampled_sql() + " GROUP BY device_id, level");
    while (live.step()) {
      auto& p = peaks[live.i64(0)];
      p.allocations += live.i64(2);
      if (AllocLevel(live.i64(1)) == AllocLevel::Segment) p.reserved_at_end = live.i64(3);
      else p.allocated_at_end = live.i64(3), p.blocks = live.i64(2);
    }
    Stmt globals(db_, std::string("SELECT device_id, count(*), sum(bytes) FROM allocation WHERE ") + kModuleGlobalSql +
                          " GROUP BY device_id");
    while (globals.step()) {
      auto& p = peaks[globals.i64(0)];
      p.module_globals = globals.i64(1);
      p.module_global_bytes = globals.i64(2);
    }
    summarize_driver_records(db_, out);
    for (auto& [id, p] : peaks) {
      if (p.device.id == 0) p.device.id = id, p.device.label = "device#" + std::to_string(id);
      out->devices.push_back(p);
    }
    Stmt tr(db_,
            "SELECT k.name || CASE WHEN t.kind = 5 THEN ':' || coalesce(o.text, '?') ELSE '' END, count(*),"
            " sum(t.bytes), sum(t.t_end - t.t_start) FROM transfer t JOIN enum_transfer_kind k ON k.code = t.kind"
            " LEFT JOIN string o ON o.id = t.op_id GROUP BY 1 ORDER BY min(t.kind), 1");
    while (tr.step()) out->transfers.push_back({tr.text(0), tr.i64(1), tr.i64(2), tr.i64(3)});
    // A capped trace's transfers stop with its detail: the steps counted are those that ended in it.
    const std::string in_detail =
        out->detail.t_end ? " AND m.t_end <= " + std::to_string(*out->detail.t_end) : std::string();
    const std::string ranks = all_marker_ranks(db_, "rank"), m_ranks = all_marker_ranks(db_, "m.rank");
    Stmt st(db_,
            "SELECT m.rank, count(DISTINCT m.id),"
            " coalesce(sum(CASE WHEN t.kind = 0 THEN t.bytes END), 0),"
            " coalesce(sum(CASE WHEN t.kind = 1 THEN t.bytes END), 0),"
            " coalesce(sum(CASE WHEN t.kind = 5 THEN t.bytes END), 0)"
            " FROM marker m LEFT JOIN transfer t ON t.rank = m.rank AND t.t_start >= m.t_start AND t.t_start < m.t_end"
            " WHERE " + m_ranks + " AND m.kind = 0 AND m.t_end IS NOT NULL" + in_detail + " GROUP BY m.rank ORDER BY m.rank");
    while (st.step()) {
      StepTraffic s;
      s.rank = st.i64(0);
      s.steps = st.i64(1);
      const double n = double(std::max<int64_t>(s.steps, 1));
      s.h2d = double(st.i64(2)) / n;
      s.d2h = double(st.i64(3)) / n;
      s.collective = double(st.i64(4)) / n;
      out->step_traffic.push_back(s);
    }
    out->steps = detail::query_int(
        db_, ("SELECT count(DISTINCT coalesce(step, id)) FROM marker WHERE " + ranks + " AND kind = 0 AND t_end IS NOT NULL")
                 .c_str());
    out->steps_unfinished = detail::query_int(
        db_, ("SELECT count(DISTINCT coalesce(step, id)) FROM marker WHERE " + ranks +
              " AND kind = 0 AND t_end IS NULL AND coalesce(step, id) NOT IN (SELECT coalesce(step, id) FROM marker"
              " WHERE " + ranks + " AND kind = 0 AND t_end IS NOT NULL)")
                 .c_str());
    out->epochs = detail::query_int(
        db_, ("SELECT count(DISTINCT coalesce(epoch, id)) FROM marker WHERE " + ranks + " AND kind = 2").c_str());
    out->dropped_events = detail::query_int(db_, "SELECT coalesce(sum(events), 0) FROM dropped");
  } catch (const SqlError& e) {
    return fail(std::string("summary failed: ") + e.what());
  }
  if (Status s = read(&out->faults); !s) return s;
  if (Status s = read(&out->errors); !s) return s;
  // Notes: the runs' own, then the cuda_tracing_off error rows of traces older zt wrote.
  try {
    Stmt notes(db_, "SELECT j.value FROM run, json_each(run.config_json, '$.notes') j WHERE json_valid(run.config_json) "
                    "AND json_type(run.config_json) = 'object' ORDER BY run.id, j.key");
    while (notes.step()) out->notes.push_back(notes.text(0));
  } catch (const SqlError& e) {
    return fail(std::string("summary failed: ") + e.what());
  }
  auto legacy = std::stable_partition(out->errors.begin(), out->errors.end(),
                                      [](const ErrorRow& e) { return e.kind != "cuda_tracing_off"; });
  for (auto it = legacy; it != out->errors.end(); ++it) out->notes.push_back(it->message);
  out->errors.erase(legacy, out->errors.end());
  return Status::Ok();
}

}  // namespace zt::db
