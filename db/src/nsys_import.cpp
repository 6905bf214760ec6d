// Nsight Systems' SQLite export -> a trace: see zt/db/nsys_import.h. Table and column names from
// the Nsight Systems user guide's "SQLite Schema Reference"; enum codes from its ENUM_* tables.
#include "zt/db/nsys_import.h"

#include <sqlite3.h>

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "new_trace.h"
#include "sqlite.h"
#include "zt/db/trace_file.h"
#include "zt/db/trace_values.h"
#include "zt/db/trace_writer.h"
#include "zt/version.h"

namespace zt::db {
namespace {

using detail::SqlError;
using detail::Stmt;

// A read-only connection that closes itself.
struct Db {
  sqlite3* db = nullptr;
  ~Db() {
    if (db) sqlite3_close(db);
  }
};

// The tables and their columns, read once.
class Schema {
 public:
  explicit Schema(sqlite3* db) {
    Stmt t(db, "SELECT name FROM sqlite_master WHERE type = 'table'");
    while (t.step()) tables_[t.text(0)];
    for (auto& [name, cols] : tables_) {
      Stmt c(db, "SELECT name FROM pragma_table_info(?1)");
      c.bind(1, name);
      while (c.step()) cols.insert(c.text(0));
    }
  }
  bool table(const std::string& t) const { return tables_.count(t) > 0; }
  bool column(const std::string& t, const std::string& c) const {
    auto it = tables_.find(t);
    return it != tables_.end() && it->second.count(c);
  }
  // "col" when the table has it, else "NULL": a column a version lacks reads as missing.
  std::string col(const std::string& t, const std::string& c) const { return column(t, c) ? "\"" + c + "\"" : "NULL"; }
  bool nsys() const {
    if (!table("StringIds")) return false;
    for (auto& [name, cols] : tables_)
      if (name.rfind("CUPTI_ACTIVITY_KIND_", 0) == 0 || name == "NVTX_EVENTS" || name == "CUDA_GPU_MEMORY_USAGE_EVENTS" ||
          name == "TARGET_INFO_SESSION_START_TIME")
        return true;
    return false;
  }

 private:
  std::map<std::string, std::set<std::string>> tables_;
};

// An ENUM_* table: code -> symbol name ("CUDA_MEMOPR_MEMORY_KIND_PINNED"); empty when absent.
std::unordered_map<int64_t, std::string> read_enum(sqlite3* db, const Schema& s, const std::string& table) {
  std::unordered_map<int64_t, std::string> out;
  if (!s.column(table, "id")) return out;
  const std::string name_col = s.column(table, "name") ? "name" : s.column(table, "label") ? "label" : "";
  if (name_col.empty()) return out;
  Stmt q(db, "SELECT id, " + name_col + " FROM " + table);
  while (q.step()) out[q.i64(0)] = q.text(1);
  return out;
}

std::string symbol_of(const std::unordered_map<int64_t, std::string>& e, int64_t code, const char* const* documented,
                      size_t n) {
  if (auto it = e.find(code); it != e.end()) return it->second;
  return code >= 0 && size_t(code) < n ? documented[code] : "";
}

// ENUM_CUDA_MEM_KIND, nsys's numbering (0 = pageable), translated into ours.
MemoryKind memory_kind(const std::unordered_map<int64_t, std::string>& e, int64_t code) {
  static const char* const kDoc[] = {"CUDA_MEMOPR_MEMORY_KIND_PAGEABLE", "CUDA_MEMOPR_MEMORY_KIND_PINNED",
                                     "CUDA_MEMOPR_MEMORY_KIND_DEVICE",   "CUDA_MEMOPR_MEMORY_KIND_ARRAY",
                                     "CUDA_MEMOPR_MEMORY_KIND_MANAGED",  "CUDA_MEMOPR_MEMORY_KIND_DEVICE_STATIC",
                                     "CUDA_MEMOPR_MEMORY_KIND_MANAGED_STATIC", "CUDA_MEMOPR_MEMORY_KIND_UNKNOWN"};
  const std::string s = symbol_of(e, code, kDoc, std::size(kDoc));
  auto ends = [&](const char* tail) {
    const std::string t = tail;
    return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
  };
  if (ends("_PAGEABLE") || s == "Pageable") return MemoryKind::PageableHost;
  if (ends("_PINNED") || s == "Pinned") return MemoryKind::PinnedHost;
  // __device__ / __managed__ variables, set up as a module loads: not the program's allocations
  // (as CUPTI's device static and managed static are in zt probe's traces).
  if (ends("_DEVICE_STATIC") || ends("_MANAGED_STATIC") || s == "Device Static" || s == "Managed Static")
    return MemoryKind::ModuleGlobal;
  if (ends("_DEVICE") || ends("_ARRAY") || s == "Device" || s == "Array") return MemoryKind::Device;
  if (ends("_MANAGED") || s == "Managed") return MemoryKind::Managed;
  return MemoryKind::Unknown;
}

// ENUM_CUDA_MEMCPY_OPER (CUPTI's copy kinds, with nsys's unified-memory kinds 11-13 added).
std::optional<TransferKind> copy_kind(const std::unordered_map<int64_t, std::string>& e, int64_t code) {
  static const char* const kDoc[] = {
      "CUDA_MEMCPY_KIND_UNKNOWN", "CUDA_MEMCPY_KIND_HTOD", "CUDA_MEMCPY_KIND_DTOH",     "CUDA_MEMCPY_KIND_HTOA",
      "CUDA_MEMCPY_KIND_ATOH",    "CUDA_MEMCPY_KIND_ATOA", "CUDA_MEMCPY_KIND_ATOD",     "CUDA_MEMCPY_KIND_DTOA",
      "CUDA_MEMCPY_KIND_DTOD",    "CUDA_MEMCPY_KIND_HTOH", "CUDA_MEMCPY_KIND_PTOP",     "CUDA_MEMCPY_KIND_UVM_HTOD",
      "CUDA_MEMCPY_KIND_UVM_DTOH", "CUDA_MEMCPY_KIND_UVM_DTOD"};
  std::string s = symbol_of(e, code, kDoc, std::size(kDoc));
  if (auto p = s.rfind('_'); p != std::string::npos) s = s.substr(p + 1);
  if (s == "HTOD" || s == "HTOA") return TransferKind::H2D;
  if (s == "DTOH" || s == "ATOH") return TransferKind::D2H;
  if (s == "DTOD" || s == "ATOA" || s == "ATOD" || s == "DTOA") return TransferKind::D2D;
  if (s == "HTOH") return TransferKind::H2H;
  if (s == "PTOP") return TransferKind::P2P;
  return std::nullopt;
}

int64_t pid_of(int64_t global_id) { return (global_id >> 24) & 0xFFFFFF; }

class Importer {
 public:
  Importer(sqlite3* db, const Schema& s, const std::string& path, NsysImportStats& st)
      : db_(db), s_(s), path_(path), st_(st) {}

  void run(TraceWriter& w) {
    w_ = &w;
    mem_kinds_ = read_enum(db_, s_, "ENUM_CUDA_MEM_KIND");
    copy_kinds_ = read_enum(db_, s_, "ENUM_CUDA_MEMCPY_OPER");
    mem_opers_ = read_enum(db_, s_, "ENUM_CUDA_DEV_MEM_EVENT_OPER");
    event_types_ = read_enum(db_, s_, "ENUM_NSYS_EVENT_TYPE");
    {
      Stmt q(db_, "SELECT id, value FROM StringIds");
      while (q.step()) strings_[q.i64(0)] = q.text(1);
    }
    if (s_.table("TARGET_INFO_GPU") && s_.column("TARGET_INFO_GPU", "id")) {
      Stmt q(db_, "SELECT id, " + s_.col("TARGET_INFO_GPU", "name") + ", " + s_.col("TARGET_INFO_GPU", "totalMemory") +
                      " FROM TARGET_INFO_GPU");
      while (q.step()) gpus_[q.i64(0)] = {q.text(1), q.opt(2)};
    }
    ranks_for_processes();
    memory();
    copies();
    kernels();
    nvtx();
    run_rows();
  }

 private:
  // Every process that left a row, by PID: rank 0, 1, ... in PID order.
  void ranks_for_processes() {
    std::set<int64_t> pids;
    auto collect = [&](const std::string& table, const char* column) {
      if (!s_.column(table, column)) return;
      Stmt q(db_, std::string("SELECT DISTINCT ") + column + " FROM " + table + " WHERE " + column + " IS NOT NULL");
      while (q.step()) pids.insert(pid_of(q.i64(0)));
    };
    collect("CUDA_GPU_MEMORY_USAGE_EVENTS", "globalPid");
    collect("CUPTI_ACTIVITY_KIND_MEMCPY", "globalPid");
    collect("CUPTI_ACTIVITY_KIND_MEMSET", "globalPid");
    collect("CUPTI_ACTIVITY_KIND_KERNEL", "globalPid");
    collect("NVTX_EVENTS", "globalTid");
    if (pids.empty()) pids.insert(0);
    for (int64_t pid : pids) {
      const int64_t rank = int64_t(rank_of_.size());
      rank_of_[pid] = rank;
      RankRow r;
      r.rank = rank;
      r.world_size = int64_t(pids.size());
      r.pid = pid;
      w_->insert(r);
    }
    st_.processes = int64_t(pids.size());
  }
  int64_t rank(const Stmt& q, int col) {
    if (q.is_null(col)) return 0;
    auto it = rank_of_.find(pid_of(q.i64(col)));
    return it == rank_of_.end() ? 0 : it->second;
  }

  int64_t device(int64_t rank, std::optional<int64_t> cuda) {
    auto key = std::make_pair(rank, cuda.value_or(-1));
    if (auto it = devices_.find(key); it != devices_.end()) return it->second;
    DeviceRow d;
    d.id = int64_t(devices_.size()) + 1;
    d.rank = rank;
    if (cuda) {
      d.kind = DeviceKind::Cuda;
      d.ordinal = *cuda;
      d.label = "cuda:" + std::to_string(*cuda);
      if (auto g = gpus_.find(*cuda); g != gpus_.end()) {
        d.name = g->second.first;
        d.capacity_bytes = g->second.second;
      }
      ++st_.devices;
    } else {
      d.kind = DeviceKind::Cpu;
      d.label = "cpu";
    }
    w_->insert(d);
    devices_[key] = d.id;
    return d.id;
  }

  int64_t name(const std::string& text) {
    if (text.empty()) return 0;
    auto [it, fresh] = names_.emplace(text, int64_t(names_.size()) + 1);
    if (fresh) w_->insert(StringRow{it->second, text});
    return it->second;
  }
  std::string string_id(const Stmt& q, int col) {
    if (q.is_null(col)) return "";
    auto it = strings_.find(q.i64(col));
    return it == strings_.end() ? "" : it->second;
  }
  void seen(int64_t t) {
    t_first_ = std::min(t_first_, t);
    t_last_ = std::max(t_last_, t);
  }

  void memory() {
    const std::string t = "CUDA_GPU_MEMORY_USAGE_EVENTS";
    if (!s_.column(t, "start") || !s_.column(t, "address") || !s_.column(t, "bytes") ||
        !s_.column(t, "memoryOperationType"))
      return;
    Stmt q(db_, "SELECT start, " + s_.col(t, "globalPid") + ", " + s_.col(t, "deviceId") + ", address, bytes, " +
                    s_.col(t, "memKind") + ", memoryOperationType, " + s_.col(t, "name") + ", " +
                    s_.col(t, "streamId") + ", " + s_.col(t, "localMemoryPoolAddress") + " FROM " + t +
                    " ORDER BY start, rowid");
    std::map<std::pair<int64_t, int64_t>, int64_t> live;  // (rank, address) -> row id
    while (q.step()) {
      const int64_t ts = q.i64(0), rk = rank(q, 1);
      seen(ts);
      std::string oper = symbol_of(mem_opers_, q.i64(6), nullptr, 0);
      const bool alloc = oper.empty() ? q.i64(6) == 0 : oper.find("DEALLOC") == std::string::npos &&
                                                          oper.find("Dealloc") == std::string::npos;
      const auto key = std::make_pair(rk, q.i64(3));
      if (alloc) {
        AllocationRow r;
        r.id = next_alloc_++;
        r.rank = rk;
        r.memory_kind = q.is_null(5) ? MemoryKind::Device : memory_kind(mem_kinds_, q.i64(5));
        const bool host = r.memory_kind == MemoryKind::PinnedHost || r.memory_kind == MemoryKind::PageableHost;
        r.device_id = device(rk, host || q.is_null(2) ? std::nullopt : std::optional<int64_t>(q.i64(2)));
        r.level = !q.is_null(9) && q.i64(9) != 0 ? AllocLevel::Block : AllocLevel::Segment;
        r.address = uint64_t(q.i64(3));
        r.bytes = r.requested_bytes = q.i64(4);
        r.t_alloc = ts;
        r.name_id = name(q.text(7));
        r.source = Source::Cupti;
        r.stream = q.opt(8);
        w_->insert(r);
        if (auto old = live.find(key); old != live.end()) w_->set_allocation_freed(old->second, ts);
        live[key] = r.id;
        ++st_.allocations;
      } else if (auto it = live.find(key); it != live.end()) {
        w_->set_allocation_freed(it->second, ts);
        live.erase(it);
      } else {
        ++st_.frees_unmatched;
        last_unmatched_ = ts;
      }
    }
    if (st_.frees_unmatched) {
      DroppedRow d;
      d.id = 1;
      d.t = last_unmatched_;
      d.events = st_.frees_unmatched;
      d.reason = "Deallocation rows in CUDA_GPU_MEMORY_USAGE_EVENTS without their Allocation (made before the capture)";
      w_->insert(d);
    }
  }

  void copies() {
    const std::string t = "CUPTI_ACTIVITY_KIND_MEMCPY";
    if (!s_.column(t, "start") || !s_.column(t, "end") || !s_.column(t, "bytes") || !s_.column(t, "copyKind")) return;
    Stmt q(db_, "SELECT start, \"end\", " + s_.col(t, "globalPid") + ", " + s_.col(t, "deviceId") + ", bytes, copyKind, " +
                    s_.col(t, "srcKind") + ", " + s_.col(t, "dstKind") + ", " + s_.col(t, "srcDeviceId") + ", " +
                    s_.col(t, "dstDeviceId") + ", " + s_.col(t, "streamId") + ", " + s_.col(t, "correlationId") +
                    " FROM " + t + " ORDER BY start, rowid");
    int64_t id = 1;
    while (q.step()) {
      auto kind = copy_kind(copy_kinds_, q.i64(5));
      if (!kind) continue;
      const int64_t rk = rank(q, 2);
      const std::optional<int64_t> dev = q.opt(3);
      auto pinned = [&](int col) -> std::optional<bool> {
        if (q.is_null(col)) return std::nullopt;
        MemoryKind k = memory_kind(mem_kinds_, q.i64(col));
        if (k == MemoryKind::PinnedHost) return true;
        if (k == MemoryKind::PageableHost) return false;
        return std::nullopt;
      };
      TransferRow r;
      r.id = id++;
      r.rank = rk;
      r.kind = *kind;
      r.bytes = q.i64(4);
      switch (*kind) {
        case TransferKind::H2D: r.src_device_id = device(rk, std::nullopt), r.dst_device_id = device(rk, dev), r.pinned = pinned(6); break;
        case TransferKind::D2H: r.src_device_id = device(rk, dev), r.dst_device_id = device(rk, std::nullopt), r.pinned = pinned(7); break;
        case TransferKind::H2H: r.src_device_id = r.dst_device_id = device(rk, std::nullopt); break;
        case TransferKind::P2P:
          r.src_device_id = device(rk, q.is_null(8) ? dev : q.opt(8));
          r.dst_device_id = device(rk, q.is_null(9) ? dev : q.opt(9));
          break;
        default: r.src_device_id = r.dst_device_id = device(rk, dev); break;
      }
      r.t_start = q.i64(0);
      r.t_end = q.i64(1);
      r.stream = q.opt(10);
      r.correlation_id = q.opt(11);
      r.source = Source::Cupti;
      seen(r.t_start), seen(r.t_end);
      w_->insert(r);
      ++st_.transfers;
    }
  }

  // A kernel row's fields every activity table has: start, end, globalPid, deviceId, streamId,
  // correlationId (columns 0-5 of the caller's query).
  KernelRow kernel_row(const Stmt& q, int64_t id) {
    KernelRow r;
    r.id = id;
    r.rank = rank(q, 2);
    r.device_id = device(r.rank, q.opt(3));
    r.t_start = q.i64(0);
    r.t_end = q.i64(1);
    r.stream = q.opt(4);
    r.correlation_id = q.opt(5);
    r.source = Source::Cupti;
    seen(r.t_start), seen(r.t_end);
    return r;
  }
  std::string common_columns(const std::string& t) {
    return "start, \"end\", " + s_.col(t, "globalPid") + ", " + s_.col(t, "deviceId") + ", " + s_.col(t, "streamId") +
           ", " + s_.col(t, "correlationId");
  }

  void kernels() {
    int64_t id = 1;
    const std::string k = "CUPTI_ACTIVITY_KIND_KERNEL";
    if (s_.column(k, "start") && s_.column(k, "end")) {
      auto c = [&](const char* col) { return s_.col(k, col); };
      Stmt q(db_, "SELECT " + common_columns(k) + ", " + c("demangledName") + ", " + c("shortName") + ", " + c("gridX") +
                      ", " + c("gridY") + ", " + c("gridZ") + ", " + c("blockX") + ", " + c("blockY") + ", " +
                      c("blockZ") + " FROM " + k + " ORDER BY start, rowid");
      while (q.step()) {
        KernelRow r = kernel_row(q, id++);
        std::string n = string_id(q, 6);
        if (n.empty()) n = string_id(q, 7);
        r.name_id = name(n.empty() ? "kernel" : n);
        if (!q.is_null(8))
          r.grid = std::to_string(q.i64(8)) + "," + std::to_string(q.i64(9)) + "," + std::to_string(q.i64(10));
        if (!q.is_null(11))
          r.block = std::to_string(q.i64(11)) + "," + std::to_string(q.i64(12)) + "," + std::to_string(q.i64(13));
        w_->insert(r);
        ++st_.kernels;
      }
    }
    const std::string m = "CUPTI_ACTIVITY_KIND_MEMSET";
    if (s_.column(m, "start") && s_.column(m, "end") && s_.column(m, "bytes")) {
      Stmt q(db_, "SELECT " + common_columns(m) + ", bytes FROM " + m + " ORDER BY start, rowid");
      while (q.step()) {
        KernelRow r = kernel_row(q, id++);
        r.name_id = name("memset " + std::to_string(q.i64(6)) + " B");
        w_->insert(r);
        ++st_.memsets;
      }
    }
  }

  void nvtx() {
    const std::string t = "NVTX_EVENTS";
    if (!s_.column(t, "start") || !s_.column(t, "eventType")) return;
    Stmt q(db_, "SELECT start, " + s_.col(t, "end") + ", eventType, " + s_.col(t, "text") + ", " + s_.col(t, "textId") +
                    ", " + s_.col(t, "globalTid") + ", " + s_.col(t, "int64Value") + ", " + s_.col(t, "uint64Value") +
                    " FROM " + t + " ORDER BY start, rowid");
    int64_t id = 1;
    while (q.step()) {
      // ENUM_NSYS_EVENT_TYPE: 34 NvtxMark, 59 NvtxPushPopRange, 60 NvtxStartEndRange (documented codes).
      const int64_t code = q.i64(2);
      std::string type;
      if (auto it = event_types_.find(code); it != event_types_.end()) type = it->second;
      else type = code == 34 ? "NvtxMark" : code == 59 ? "NvtxPushPopRange" : code == 60 ? "NvtxStartEndRange" : "";
      const bool mark = type == "NvtxMark";
      if (!mark && type != "NvtxPushPopRange" && type != "NvtxStartEndRange") continue;
      std::string text = q.text(3);
      if (text.empty()) text = string_id(q, 4);
      MarkerRow r;
      r.id = id++;
      r.rank = rank(q, 5);
      r.kind = MarkerKind::Range;
      r.name_id = name(text.empty() ? "(unnamed NVTX range)" : text);
      r.t_start = q.i64(0);
      if (mark) r.t_end = r.t_start;
      else if (!q.is_null(1) && q.i64(1) >= r.t_start) r.t_end = q.i64(1);
      if (!q.is_null(6)) r.value = q.i64(6);
      else if (!q.is_null(7)) r.value = q.i64(7);
      seen(r.t_start);
      if (r.t_end) seen(*r.t_end);
      w_->insert(r);
      ++(mark ? st_.marks : st_.ranges);
    }
  }

  void run_rows() {
    std::optional<int64_t> utc, start, stop;
    if (s_.column("TARGET_INFO_SESSION_START_TIME", "utcEpochNs")) {
      Stmt q(db_, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1");
      if (q.step()) utc = q.opt(0);
    }
    if (s_.column("ANALYSIS_DETAILS", "startTime") && s_.column("ANALYSIS_DETAILS", "stopTime")) {
      Stmt q(db_, "SELECT startTime, stopTime FROM ANALYSIS_DETAILS LIMIT 1");
      if (q.step()) start = q.opt(0), stop = q.opt(1);
    }
    RunRow r;
    r.tool_version = ZT_VERSION;
    r.command_line = "zt import " + path_;
    r.config_json = R"({"imported_from":"Nsight Systems SQLite export"})";
    r.t_start = start ? *start : t_first_ == INT64_MAX ? 0 : t_first_;
    r.t_end = stop ? *stop : t_last_ == INT64_MIN ? r.t_start : t_last_;
    if (t_first_ != INT64_MAX) r.t_start = std::min(r.t_start, t_first_);
    if (t_last_ != INT64_MIN) r.t_end = std::max(*r.t_end, t_last_);
    // Nsight's timestamps count from the session's start, which utcEpochNs gives in Unix time. Both
    // are the file's values: checked before they are added (the rows' own are checked as written).
    auto in_range = [](int64_t t) { return t >= 0 && t <= kMaxTraceTime; };
    if (utc && !in_range(*utc))
      throw detail::InputError(path_ + ": TARGET_INFO_SESSION_START_TIME.utcEpochNs is " + std::to_string(*utc) +
                               ", not a Unix time in ns (0 .. 2^62)");
    if (utc && (!in_range(r.t_start) || r.t_start > kMaxTraceTime - *utc))
      throw detail::InputError(path_ + ": the capture starts at " + std::to_string(r.t_start) +
                               " ns from the session's start, which is not a time in 0 .. 2^62 ns after " +
                               std::to_string(*utc) + " (the export is damaged or was edited)");
    r.wall_start_unix_ns = utc ? *utc + r.t_start : 0;
    r.pid = rank_of_.empty() ? 0 : rank_of_.begin()->first;
    r.status = RunStatus::Ok;
    w_->insert(r);
    w_->set_meta("clock", utc ? "Nsight Systems ns since the capture session began"
                              : "Nsight Systems ns (the export has no session start time)");
    w_->set_meta("imported_from", "Nsight Systems SQLite export " + path_);
  }

  sqlite3* db_;
  const Schema& s_;
  std::string path_;
  NsysImportStats& st_;
  TraceWriter* w_ = nullptr;
  std::unordered_map<int64_t, std::string> mem_kinds_, copy_kinds_, mem_opers_, event_types_, strings_;
  std::unordered_map<int64_t, std::pair<std::string, std::optional<int64_t>>> gpus_;
  std::map<int64_t, int64_t> rank_of_;  // pid -> rank
  std::map<std::pair<int64_t, int64_t>, int64_t> devices_;
  std::unordered_map<std::string, int64_t> names_;
  int64_t next_alloc_ = 1, last_unmatched_ = 0;
  int64_t t_first_ = INT64_MAX, t_last_ = INT64_MIN;
};

// Opens `path` read-only after checking it is SQLite; the error names the file.
Status open_sqlite(const std::string& path, Db* out) {
  TraceFileInfo info;
  if (Status s = inspect_trace_file(path, &info); !s) return s;
  if (!info.exists) return Status::Error(path + ": no such file");
  if (!info.is_sqlite) return Status::Error(path + ": not an SQLite database");
  if (sqlite3_open_v2(path.c_str(), &out->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr) != SQLITE_OK)
    return Status::Error(path + ": cannot open: " + (out->db ? one_line(sqlite3_errmsg(out->db)) : "out of memory"));
  sqlite3_exec(out->db, "PRAGMA query_only=1", nullptr, nullptr, nullptr);
  return Status::Ok();
}

}  // namespace

bool is_nsys_export(const std::string& path) {
  Db db;
  if (!open_sqlite(path, &db)) return false;
  try {
    return Schema(db.db).nsys();
  } catch (const SqlError&) {
    return false;
  }
}

Status import_nsys_export(const std::string& nsys_path, const std::string& trace_path, NsysImportStats* stats) {
  NsysImportStats local;
  NsysImportStats& st = stats ? *stats : local;
  st = NsysImportStats();
  Db db;
  if (Status s = open_sqlite(nsys_path, &db); !s) return s;
  std::unique_ptr<Schema> schema;
  try {
    schema = std::make_unique<Schema>(db.db);
  } catch (const SqlError& e) {
    return Status::Error(nsys_path + ": not a readable SQLite database: " + e.what());
  }
  if (!schema->nsys())
    return Status::Error(nsys_path + ": an SQLite database, but not an Nsight Systems export (no StringIds beside "
                                     "CUPTI_ACTIVITY_KIND_*, NVTX_EVENTS or CUDA_GPU_MEMORY_USAGE_EVENTS tables)");
  return detail::write_new_trace(trace_path, "import", nsys_path, [&](TraceWriter& w) {
    try {
      Importer(db.db, *schema, nsys_path, st).run(w);
    } catch (const SqlError& e) {
      // The export's connection holds the error when reading it failed (a damaged file); else the
      // trace being written did.
      const int rc = sqlite3_errcode(db.db);
      if (rc != SQLITE_OK && rc != SQLITE_ROW && rc != SQLITE_DONE)
        throw detail::InputError(nsys_path + ": reading the export failed: " + e.what());
      throw;
    }
  });
}

}  // namespace zt::db
