#include "zt/db/schema.h"

#include <array>
#include <string>

namespace zt::db {
namespace {
constexpr std::array<std::string_view, 6> kMemoryKind{"unknown", "device", "pinned_host", "pageable_host", "managed",
                                                      "module_global"};
constexpr std::array<std::string_view, 2> kAllocLevel{"block", "segment"};
constexpr std::array<std::string_view, 5> kSource{"api", "cupti", "host_hook", "synthetic", "torch"};
constexpr std::array<std::string_view, 6> kTransferKind{"H2D", "D2H", "D2D", "H2H", "P2P", "collective"};
constexpr std::array<std::string_view, 3> kPlacementWhy{"created", "moved", "freed"};
constexpr std::array<std::string_view, 5> kMarkerKind{"step", "micro_step", "epoch", "phase", "range"};
constexpr std::array<std::string_view, 3> kDeviceKind{"cpu", "cuda", "sim"};
constexpr std::array<std::string_view, 5> kRunStatus{"running", "ok", "failed", "signal", "terminated"};
constexpr std::array<std::string_view, 4> kRankRole{"rank", "launcher", "helper", "worker"};

template <size_t N>
std::string_view name_of(const std::array<std::string_view, N>& names, uint8_t code) {
  return code < N ? names[code] : std::string_view("invalid");
}
template <typename E, size_t N>
std::optional<E> parse(const std::array<std::string_view, N>& names, std::string_view s) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<E>(i);
  return std::nullopt;
}
}  // namespace

std::string_view to_string(MemoryKind v) { return name_of(kMemoryKind, uint8_t(v)); }
std::string_view to_string(AllocLevel v) { return name_of(kAllocLevel, uint8_t(v)); }
std::string_view to_string(Source v) { return name_of(kSource, uint8_t(v)); }
std::string_view to_string(TransferKind v) { return name_of(kTransferKind, uint8_t(v)); }
std::string_view to_string(PlacementWhy v) { return name_of(kPlacementWhy, uint8_t(v)); }
std::string_view to_string(MarkerKind v) { return name_of(kMarkerKind, uint8_t(v)); }
std::string_view to_string(DeviceKind v) { return name_of(kDeviceKind, uint8_t(v)); }
std::string_view to_string(RunStatus v) { return name_of(kRunStatus, uint8_t(v)); }
std::string_view to_string(RankRole v) { return name_of(kRankRole, uint8_t(v)); }

std::optional<TransferKind> transfer_kind_from_string(std::string_view s) { return parse<TransferKind>(kTransferKind, s); }
std::optional<MarkerKind> marker_kind_from_string(std::string_view s) { return parse<MarkerKind>(kMarkerKind, s); }
std::optional<RunStatus> run_status_from_string(std::string_view s) { return parse<RunStatus>(kRunStatus, s); }

namespace {
const char* kTablesSql = R"SQL(
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE run (
  id INTEGER PRIMARY KEY, tool_version TEXT NOT NULL, command_line TEXT NOT NULL,
  config_json TEXT, seed INTEGER, hostname TEXT, pid INTEGER,
  t_start INTEGER NOT NULL, t_end INTEGER, wall_start_unix_ns INTEGER NOT NULL,
  status INTEGER NOT NULL, exit_code INTEGER, exit_detail TEXT, source_file TEXT);
CREATE TABLE rank (
  rank INTEGER PRIMARY KEY, run_id INTEGER NOT NULL, world_size INTEGER NOT NULL,
  local_rank INTEGER, hostname TEXT, pid INTEGER, role INTEGER NOT NULL DEFAULT 0, job_rank INTEGER);
CREATE TABLE device (
  id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, kind INTEGER NOT NULL, ordinal INTEGER NOT NULL,
  label TEXT NOT NULL, name TEXT, capacity_bytes INTEGER, simulated INTEGER NOT NULL DEFAULT 0);
CREATE TABLE string (id INTEGER PRIMARY KEY, text TEXT NOT NULL UNIQUE);
CREATE TABLE frame (
  id INTEGER PRIMARY KEY, ip INTEGER NOT NULL, module TEXT, module_offset INTEGER, symbol TEXT, line INTEGER);
CREATE TABLE stack (id INTEGER PRIMARY KEY, parent_id INTEGER, frame_id INTEGER NOT NULL);
CREATE TABLE allocation (
  id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, device_id INTEGER NOT NULL,
  memory_kind INTEGER NOT NULL, level INTEGER NOT NULL, address INTEGER NOT NULL,
  bytes INTEGER NOT NULL, requested_bytes INTEGER NOT NULL,
  t_alloc INTEGER NOT NULL, t_free INTEGER, name_id INTEGER, stack_id INTEGER,
  source INTEGER NOT NULL, segment_id INTEGER, stream INTEGER, weight_bytes INTEGER);
CREATE TABLE transfer (
  id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, kind INTEGER NOT NULL, bytes INTEGER NOT NULL,
  src_device_id INTEGER, dst_device_id INTEGER, pinned INTEGER,
  t_start INTEGER NOT NULL, t_end INTEGER NOT NULL, stream INTEGER, name_id INTEGER,
  op_id INTEGER, participants INTEGER, correlation_id INTEGER, source INTEGER NOT NULL, stack_id INTEGER);
CREATE TABLE kernel (
  id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, device_id INTEGER NOT NULL, name_id INTEGER,
  t_start INTEGER NOT NULL, t_end INTEGER NOT NULL, stream INTEGER, correlation_id INTEGER,
  grid TEXT, block TEXT, source INTEGER NOT NULL);
CREATE TABLE placement (
  id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, t INTEGER NOT NULL, tensor_id INTEGER NOT NULL,
  device_id INTEGER, why INTEGER NOT NULL, bytes INTEGER, allocation_id INTEGER);
CREATE TABLE marker (
  id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, kind INTEGER NOT NULL, name_id INTEGER,
  t_start INTEGER NOT NULL, t_end INTEGER, step INTEGER, micro_step INTEGER, epoch INTEGER,
  value INTEGER);
CREATE TABLE counter (
  id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, device_id INTEGER, name_id INTEGER NOT NULL,
  t INTEGER NOT NULL, value NUMERIC);
CREATE TABLE fault (
  id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, t INTEGER NOT NULL, name TEXT NOT NULL,
  trigger TEXT, step INTEGER, details TEXT);
CREATE TABLE error (
  id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, t INTEGER NOT NULL, step INTEGER,
  kind TEXT, site TEXT, message TEXT NOT NULL, tensors TEXT, device_id INTEGER);
CREATE TABLE dropped (
  id INTEGER PRIMARY KEY, rank INTEGER, thread INTEGER NOT NULL, t INTEGER NOT NULL,
  events INTEGER NOT NULL, reason TEXT NOT NULL);

CREATE TABLE step_memory (
  id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, device_id INTEGER NOT NULL, step INTEGER, epoch INTEGER,
  t_start INTEGER NOT NULL, t_end INTEGER, allocated_bytes INTEGER NOT NULL, reserved_bytes INTEGER NOT NULL,
  peak_allocated_bytes INTEGER NOT NULL, peak_reserved_bytes INTEGER NOT NULL, host_rss_bytes INTEGER);
CREATE TABLE epoch_live (
  id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, epoch INTEGER NOT NULL, at INTEGER NOT NULL, t INTEGER NOT NULL,
  device_id INTEGER NOT NULL, memory_kind INTEGER NOT NULL, level INTEGER NOT NULL, name_id INTEGER,
  stack_id INTEGER, bytes INTEGER NOT NULL, allocations INTEGER NOT NULL, sampled INTEGER NOT NULL,
  sampled_variance REAL NOT NULL);
CREATE TABLE detail_span (
  id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, t_start INTEGER NOT NULL, t_end INTEGER, end_reason TEXT);

CREATE TABLE enum_memory_kind (code INTEGER PRIMARY KEY, name TEXT NOT NULL);
INSERT INTO enum_memory_kind VALUES (0,'unknown'),(1,'device'),(2,'pinned_host'),(3,'pageable_host'),(4,'managed'),
  (5,'module_global');
CREATE TABLE enum_level (code INTEGER PRIMARY KEY, name TEXT NOT NULL);
INSERT INTO enum_level VALUES (0,'block'),(1,'segment');
CREATE TABLE enum_source (code INTEGER PRIMARY KEY, name TEXT NOT NULL);
INSERT INTO enum_source VALUES (0,'api'),(1,'cupti'),(2,'host_hook'),(3,'synthetic'),(4,'torch');
CREATE TABLE enum_transfer_kind (code INTEGER PRIMARY KEY, name TEXT NOT NULL);
INSERT INTO enum_transfer_kind VALUES (0,'H2D'),(1,'D2H'),(2,'D2D'),(3,'H2H'),(4,'P2P'),(5,'collective');
CREATE TABLE enum_placement_why (code INTEGER PRIMARY KEY, name TEXT NOT NULL);
INSERT INTO enum_placement_why VALUES (0,'created'),(1,'moved'),(2,'freed');
CREATE TABLE enum_marker_kind (code INTEGER PRIMARY KEY, name TEXT NOT NULL);
INSERT INTO enum_marker_kind VALUES (0,'step'),(1,'micro_step'),(2,'epoch'),(3,'phase'),(4,'range');
CREATE TABLE enum_device_kind (code INTEGER PRIMARY KEY, name TEXT NOT NULL);
INSERT INTO enum_device_kind VALUES (0,'cpu'),(1,'cuda'),(2,'sim');
CREATE TABLE enum_run_status (code INTEGER PRIMARY KEY, name TEXT NOT NULL);
INSERT INTO enum_run_status VALUES (0,'running'),(1,'ok'),(2,'failed'),(3,'signal'),(4,'terminated');
CREATE TABLE enum_rank_role (code INTEGER PRIMARY KEY, name TEXT NOT NULL);
INSERT INTO enum_rank_role VALUES (0,'rank'),(1,'launcher'),(2,'helper'),(3,'worker');
)SQL";
const char* kViewsSql = R"SQL(
CREATE VIEW allocation_v AS
  SELECT a.id, a.rank, d.label AS device, mk.name AS memory_kind, lv.name AS level, a.address,
         a.bytes, a.requested_bytes, a.t_alloc, a.t_free, s.text AS name, a.stack_id,
         src.name AS source, a.segment_id, a.stream, a.weight_bytes
  FROM allocation a LEFT JOIN device d ON d.id = a.device_id
  LEFT JOIN enum_memory_kind mk ON mk.code = a.memory_kind LEFT JOIN enum_level lv ON lv.code = a.level
  LEFT JOIN string s ON s.id = a.name_id LEFT JOIN enum_source src ON src.code = a.source;
CREATE VIEW transfer_v AS
  SELECT t.id, t.rank, k.name AS kind, t.bytes, sd.label AS src_device, dd.label AS dst_device, t.pinned,
         t.t_start, t.t_end, t.stream, n.text AS name, o.text AS op, t.participants, t.correlation_id, t.stack_id,
         src.name AS source
  FROM transfer t LEFT JOIN enum_transfer_kind k ON k.code = t.kind LEFT JOIN enum_source src ON src.code = t.source
  LEFT JOIN device sd ON sd.id = t.src_device_id LEFT JOIN device dd ON dd.id = t.dst_device_id
  LEFT JOIN string n ON n.id = t.name_id LEFT JOIN string o ON o.id = t.op_id;
CREATE VIEW marker_v AS
  SELECT m.id, m.rank, k.name AS kind, n.text AS name, m.t_start, m.t_end, m.step, m.micro_step, m.epoch, m.value
  FROM marker m LEFT JOIN enum_marker_kind k ON k.code = m.kind LEFT JOIN string n ON n.id = m.name_id;
CREATE VIEW placement_v AS
  SELECT p.id, p.rank, p.t, n.text AS tensor, d.label AS device, w.name AS why, p.bytes, p.allocation_id
  FROM placement p LEFT JOIN string n ON n.id = p.tensor_id LEFT JOIN device d ON d.id = p.device_id
  LEFT JOIN enum_placement_why w ON w.code = p.why;
CREATE VIEW counter_v AS
  SELECT c.id, c.rank, d.label AS device, n.text AS name, c.t, c.value
  FROM counter c LEFT JOIN device d ON d.id = c.device_id LEFT JOIN string n ON n.id = c.name_id;
CREATE VIEW kernel_v AS
  SELECT k.id, k.rank, d.label AS device, n.text AS name, k.t_start, k.t_end, k.stream, k.correlation_id,
         src.name AS source
  FROM kernel k LEFT JOIN device d ON d.id = k.device_id LEFT JOIN string n ON n.id = k.name_id
  LEFT JOIN enum_source src ON src.code = k.source;
)SQL";
}  // namespace

const char* schema_sql() {
  static const std::string sql = std::string(kTablesSql) + kViewsSql;
  return sql.c_str();
}

const char* views_sql() { return kViewsSql; }

const char* aggregate_tables_sql() {
  // The same DDL as in kTablesSql: a version 2 file gets these when rows are added to it.
  static const std::string sql = [] {
    const std::string all = kTablesSql;
    const size_t from = all.find("CREATE TABLE step_memory"), to = all.find("CREATE TABLE enum_memory_kind");
    return all.substr(from, to - from);
  }();
  return sql.c_str();
}

const char* index_sql() {
  return R"SQL(
CREATE INDEX IF NOT EXISTS allocation_by_device_time ON allocation(device_id, t_alloc);
CREATE INDEX IF NOT EXISTS allocation_by_name ON allocation(name_id);
CREATE INDEX IF NOT EXISTS allocation_live ON allocation(device_id, t_free);
CREATE INDEX IF NOT EXISTS transfer_by_time ON transfer(rank, t_start);
CREATE INDEX IF NOT EXISTS kernel_by_time ON kernel(device_id, t_start);
CREATE INDEX IF NOT EXISTS placement_by_tensor ON placement(tensor_id, t);
CREATE INDEX IF NOT EXISTS marker_by_time ON marker(rank, kind, t_start);
CREATE INDEX IF NOT EXISTS counter_by_series ON counter(device_id, name_id, t);
CREATE INDEX IF NOT EXISTS stack_by_parent ON stack(parent_id);
CREATE INDEX IF NOT EXISTS step_memory_by_time ON step_memory(device_id, t_start);
)SQL";
}

}  // namespace zt::db

#include "zt/db/rows.h"

namespace zt::db {

std::string run_end_text(const RunRow& run) {
  std::string line;
  if (run.status == RunStatus::Running) line = "ended without closing the trace (killed, or still running)";
  else line = "ended with status " + std::string(to_string(run.status));
  if (run.exit_code) line += ", exit code " + std::to_string(*run.exit_code);
  if (!run.exit_detail.empty()) line += ": " + run.exit_detail;
  return line;
}

}  // namespace zt::db
