#include "trace_model.h"

#include <sqlite3.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <numeric>
#include <queue>
#include <set>
#include <thread>
#include <unordered_map>

#include "zt/common/files.h"
#include "zt/db/derive_steps.h"
#include "zt/db/trace_reader.h"
#include "zt/db/trace_values.h"

namespace zt::viewer {
namespace {

using db::AllocLevel;
using db::MarkerKind;
using db::MemoryKind;

constexpr int kMaxAllocationLanes = 32;
constexpr int kMaxPhaseLanes = 6;
constexpr int kMaxKernelLanes = 4;

// Streams one SELECT, calling fill(stmt) per row and publishing progress every 64k rows.
// Raw SQLite (through the reader's handle) because the typed reads build a row struct with
// strings per row and sort in SQL; on ten million rows that alone costs seconds. Each row's
// values are checked against db/'s rules before fill() sees them (the reader checked only the
// small tables: a second scan of the large ones would cost a third of the load); the SELECT
// ends with the row's id, for the message.
template <typename Fill>
Status stream(sqlite3* db, const std::string& path, const char* table, const char* sql, LoadProgress* progress,
              int64_t* rows, Fill fill) {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) != SQLITE_OK)
    return Status::Error(path + ": reading the " + table + " table failed: " + one_line(sqlite3_errmsg(db)));
  db::RowCheck check(path, table, st, sqlite3_column_count(st) - 1);
  int rc;
  int64_t n = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (!check.ok(st)) {
      sqlite3_finalize(st);
      return check.error();
    }
    fill(st);
    if ((++n & 0xffff) == 0 && progress) {
      progress->rows_done.fetch_add(0x10000, std::memory_order_relaxed);
      if (progress->cancel.load(std::memory_order_relaxed)) break;
    }
  }
  if (progress) progress->rows_done.fetch_add(n & 0xffff, std::memory_order_relaxed);
  *rows += n;
  std::string err = rc == SQLITE_DONE || rc == SQLITE_ROW ? "" : one_line(sqlite3_errmsg(db));
  sqlite3_finalize(st);
  if (!err.empty()) return Status::Error(path + ": reading the " + table + " table failed: " + err);
  if (progress && progress->cancel.load()) return Status::Error(path + ": loading cancelled");
  return Status::Ok();
}

// Rows in a table, estimated from its largest rowid: instant, where count(*) walks the whole
// table. Used to reserve columns and to size the progress bar. Ids need not be dense (a file may
// hold one row with id 2^60), so the estimate is also capped by what the file can hold: a row
// takes more than 16 bytes of it.
int64_t estimate_rows(sqlite3* db, const char* table) {
  auto one = [db](const std::string& sql) {
    sqlite3_stmt* st = nullptr;
    int64_t n = 0;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
      n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return n;
  };
  const int64_t file_bytes = one("PRAGMA page_count") * one("PRAGMA page_size");
  return std::clamp<int64_t>(one(std::string("SELECT max(rowid) FROM ") + table), 0, file_bytes / 16);
}

template <typename... V>
void reserve_all(int64_t n, V&... v) {
  (v.reserve(size_t(std::max<int64_t>(n, 0))), ...);
}

int64_t col_or(sqlite3_stmt* st, int c, int64_t none) {
  return sqlite3_column_type(st, c) == SQLITE_NULL ? none : sqlite3_column_int64(st, c);
}

// Permutation that sorts `key` (stable, so rows at one instant keep their recorded order).
// Returns an empty vector when the column is already sorted, the usual case.
std::vector<uint32_t> sort_order(const std::vector<int64_t>& key) {
  if (std::is_sorted(key.begin(), key.end())) return {};
  std::vector<uint32_t> order(key.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return key[a] < key[b]; });
  return order;
}
template <typename T>
void permute(std::vector<T>& v, const std::vector<uint32_t>& order) {
  if (order.empty()) return;
  std::vector<T> out(v.size());
  for (size_t i = 0; i < order.size(); ++i) out[i] = v[order[i]];
  v.swap(out);
}

// Greedy interval colouring: each span goes to the lowest lane free at its start, so spans
// in one lane never overlap (the last lane takes the overflow and may).
class LaneAssigner {
 public:
  explicit LaneAssigner(int max_lanes) : max_(max_lanes) {}
  int assign(int64_t t0, int64_t t1) {
    while (!busy_.empty() && busy_.top().first <= t0) {
      free_.push(busy_.top().second);
      busy_.pop();
    }
    int lane;
    if (!free_.empty()) {
      lane = free_.top();
      free_.pop();
    } else if (used_ < max_ - 1) {
      lane = used_++;
    } else {
      return max_ - 1;  // overflow: not tracked as busy, shares the last lane
    }
    busy_.push({t1, lane});
    return lane;
  }
  int lanes() const { return used_; }

 private:
  using Busy = std::pair<int64_t, int>;
  int max_;
  int used_ = 0;
  std::priority_queue<Busy, std::vector<Busy>, std::greater<Busy>> busy_;
  std::priority_queue<int, std::vector<int>, std::greater<int>> free_;
};

}  // namespace

bool is_cumulative_counter(std::string_view name) {
  auto ends_with = [&](std::string_view tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends_with("_total") || ends_with("bytes_allocated");
}

Direction direction_of(db::TransferKind k) {
  switch (k) {
    case db::TransferKind::H2D: return Direction::H2D;
    case db::TransferKind::D2H: return Direction::D2H;
    case db::TransferKind::Collective: return Direction::Collective;
    default: return Direction::D2D;  // D2D, P2P and H2H: copies that do not cross the host link
  }
}

const char* to_string(Direction d) {
  static const char* names[] = {"H2D", "D2H", "D2D/P2P", "collectives"};
  return names[int(d)];
}

TraceModel::~TraceModel() = default;

const std::string& TraceModel::str(int64_t id) const {
  static const std::string empty;
  return id > 0 && size_t(id) < strings_.size() ? strings_[size_t(id)] : empty;
}

int64_t TraceModel::intern_lookup(const std::string& text) const {
  for (size_t i = 1; i < strings_.size(); ++i)
    if (strings_[i] == text) return int64_t(i);
  return 0;
}

Status TraceModel::stack_text(int64_t stack_id, std::vector<std::string>* lines) const {
  lines->clear();
  if (stack_id <= 0) return Status::Ok();
  return reader_->stack_text(stack_id, lines);
}

const std::string& TraceModel::site(int64_t stack_id) const {
  auto [it, fresh] = site_text_.try_emplace(stack_id);
  if (fresh && stack_id > 0) {
    if (!sites_ && !db::StackSites::load(*reader_, &sites_)) sites_.reset();
    it->second = sites_ ? sites_->site(stack_id, db::SiteLevel::Line) : "stack " + std::to_string(stack_id);
  }
  return it->second;
}

Status TraceModel::load_placements() const {
  if (placements_loaded_) return Status::Ok();
  Placements& p = place;
  std::unordered_map<int64_t, int32_t> dev_index;
  for (size_t d = 0; d < devices.size(); ++d) dev_index[devices[d].id] = int32_t(d);
  int64_t n = 0;
  Status s = stream(reader_->handle(), path_, "placement", "SELECT rank,t,tensor_id,device_id,why,bytes,id FROM placement",
                    nullptr, &n, [&](sqlite3_stmt* st) {
                      p.rank.push_back(int32_t(sqlite3_column_int64(st, 0)));
                      p.t.push_back(sqlite3_column_int64(st, 1));
                      p.tensor.push_back(name_index(sqlite3_column_int64(st, 2)));
                      auto it = dev_index.find(col_or(st, 3, 0));
                      p.device.push_back(it == dev_index.end() ? -1 : it->second);
                      p.why.push_back(uint8_t(sqlite3_column_int64(st, 4)));
                      p.bytes.push_back(col_or(st, 5, 0));
                    });
  if (!s) {
    p = Placements{};
    return s;
  }
  auto order = sort_order(p.t);
  permute(p.t, order), permute(p.bytes, order), permute(p.rank, order);
  permute(p.tensor, order), permute(p.device, order), permute(p.why, order);
  placements_loaded_ = true;
  return Status::Ok();
}

int64_t TraceModel::step_start(int64_t step) const {
  int64_t best = -1;
  for (size_t i = 0; i < mark.size(); ++i)
    if (mark.kind[i] == uint8_t(MarkerKind::Step) && mark.step[i] == step && (best < 0 || mark.t_start[i] < best))
      best = mark.t_start[i];
  return best;
}
int64_t TraceModel::step_end(int64_t step) const {
  int64_t best = -1;
  for (size_t i = 0; i < mark.size(); ++i)
    if (mark.kind[i] == uint8_t(MarkerKind::Step) && mark.step[i] == step) best = std::max(best, mark.t_end[i]);
  return best;
}
int64_t TraceModel::epoch_start(int64_t epoch) const {
  int64_t best = -1;
  for (size_t i = 0; i < mark.size(); ++i)
    if (mark.kind[i] == uint8_t(MarkerKind::Epoch) && mark.epoch[i] == epoch && (best < 0 || mark.t_start[i] < best))
      best = mark.t_start[i];
  return best;
}

namespace {
// Reading through a memory map skips a copy of every page: a third less time on big traces.
void tune_for_scans(sqlite3* db) { sqlite3_exec(db, "PRAGMA mmap_size=68719476736", nullptr, nullptr, nullptr); }
}  // namespace

Status TraceModel::load(const std::string& path, std::unique_ptr<TraceModel>* out, LoadProgress* progress,
                        LoadScope scope) {
  std::unique_ptr<TraceModel> m(new TraceModel());
  m->path_ = path;
  if (Status s = db::TraceReader::open(path, &m->reader_, db::TraceReader::Checks::SmallTables); !s) return s;
  tune_for_scans(m->reader_->handle());
  m->overview = scope == LoadScope::Overview;
  if (Status s = m->read_all(progress); !s) return s;
  m->build_tracks();
  *out = std::move(m);
  return Status::Ok();
}

Status TraceModel::read_all(LoadProgress* progress) {
  db::TraceReader& r = *reader_;
  if (progress) {
    int64_t total = 0;
    for (const char* t : {"allocation", "transfer", "kernel", "marker"}) total += estimate_rows(r.handle(), t);
    progress->rows_total = total;
  }
  // Small tables through the typed reader.
  std::vector<db::DeviceRow> dev_rows;
  std::vector<db::RankRow> rank_rows;
  std::vector<db::FaultRow> faults;
  std::vector<db::ErrorRow> errors;
  std::vector<db::StringRow> string_rows;
  std::vector<db::RunRow> run_rows;
  if (Status s = r.read(&run_rows); !s) return s;
  for (auto& run : run_rows)
    if (run.status != db::RunStatus::Ok || (run.exit_code && *run.exit_code != 0))
      run_problems.push_back("run " + std::to_string(run.id) + " " + db::run_end_text(run));
  if (Status s = r.read(&dev_rows); !s) return s;
  if (Status s = r.read(&rank_rows); !s) return s;
  if (Status s = r.read(&faults); !s) return s;
  if (Status s = r.read(&errors); !s) return s;
  if (Status s = r.read(&string_rows); !s) return s;
  // The aggregates (version 3 on): where the detail stopped, and the memory of every step.
  std::vector<db::DetailSpanRow> spans;
  if (Status s = r.read(&spans); !s) return s;
  for (auto& sp : spans)
    if (sp.t_end && (detail_end < 0 || *sp.t_end < detail_end)) {
      detail_end = *sp.t_end;
      detail_reason = sp.end_reason;
    }
  // A trace whose detail covers the whole run draws its memory from the detail; the steps'
  // aggregates are read where the detail stopped, or for the overview.
  if (overview || detail_end >= 0) {
    if (Status s = r.read(&step_memory_); !s) return s;
  }
  step_rows = int64_t(step_memory_.size());
  rows += int64_t(dev_rows.size() + rank_rows.size() + faults.size() + errors.size() + string_rows.size() +
                  spans.size() + step_memory_.size());
  // Strings by id, where the ids are dense (the writer hands them out from 1); sparse ids (a
  // merged or hand-made file: any id up to 2^31 is valid) are renumbered 1..n on load, so no
  // vector is sized by an id from the file.
  int64_t max_id = 0;
  for (auto& s : string_rows) max_id = std::max(max_id, s.id);
  if (max_id <= 2 * int64_t(string_rows.size()) + 65536) {
    strings_.assign(size_t(max_id + 1), std::string());
    for (auto& s : string_rows) strings_[size_t(s.id)] = std::move(s.text);
  } else {
    strings_.assign(1, std::string());
    for (auto& s : string_rows) {
      string_index_[s.id] = int32_t(strings_.size());
      string_file_id_.resize(strings_.size(), 0);
      string_file_id_.push_back(s.id);
      strings_.push_back(std::move(s.text));
    }
  }

  std::unordered_map<int64_t, int32_t> dev_index;
  std::set<int> rank_set;
  for (auto& rr : rank_rows) rank_set.insert(int(rr.rank));
  process_names_.clear();
  for (auto& rr : rank_rows)
    if (rr.role != db::RankRole::Rank)
      process_names_[int(rr.rank)] = std::string(db::to_string(rr.role)) + " process " + std::to_string(rr.pid) +
                                     (rr.job_rank ? " of rank " + std::to_string(*rr.job_rank) : "");
  for (auto& d : dev_rows) {
    dev_index[d.id] = int32_t(devices.size());
    DeviceInfo info;
    info.id = d.id;
    info.rank = int(d.rank);
    info.label = d.label;
    info.name = d.name;
    info.capacity = d.capacity_bytes.value_or(0);
    info.host = d.kind == db::DeviceKind::Cpu;
    devices.push_back(info);
    rank_set.insert(int(d.rank));
  }
  auto dev = [&](int64_t id) -> int32_t {
    auto it = dev_index.find(id);
    return it == dev_index.end() ? -1 : it->second;
  };

  // Allocations are usually the largest table: read them on a second connection and thread
  // while this one reads the rest. SQLite connections are independent, so this is safe.
  std::unique_ptr<db::TraceReader> second;
  if (Status s = db::TraceReader::open(path_, &second, db::TraceReader::Checks::None); !s) return s;
  tune_for_scans(second->handle());
  Status alloc_status;
  int64_t alloc_rows = 0;
  std::thread alloc_thread([&] {
    Allocations& a = alloc;
    if (overview) {
      // The overview: the step and epoch markers alone, each rank's by the marker index (a day's
      // detail stretch holds millions of ranges that a scan would walk).
      for (int rank : rank_set) {
        const std::string sql = "SELECT rank,kind,name_id,t_start,t_end,step,epoch,id FROM marker WHERE rank = " +
                                std::to_string(rank) + " AND kind IN (" + std::to_string(int(MarkerKind::Step)) +
                                "," + std::to_string(int(MarkerKind::Epoch)) + ")";
        alloc_status = stream(second->handle(), path_, "marker", sql.c_str(), progress, &alloc_rows,
                              [&](sqlite3_stmt* st) {
                                mark.rank.push_back(int32_t(sqlite3_column_int64(st, 0)));
                                mark.kind.push_back(uint8_t(sqlite3_column_int64(st, 1)));
                                mark.name.push_back(name_index(col_or(st, 2, 0)));
                                mark.t_start.push_back(sqlite3_column_int64(st, 3));
                                mark.t_end.push_back(col_or(st, 4, INT64_MAX));
                                mark.step.push_back(col_or(st, 5, -1));
                                mark.epoch.push_back(col_or(st, 6, -1));
                              });
        if (!alloc_status) return;
      }
      auto morder = sort_order(mark.t_start);
      permute(mark.t_start, morder), permute(mark.t_end, morder), permute(mark.step, morder);
      permute(mark.epoch, morder), permute(mark.rank, morder), permute(mark.name, morder), permute(mark.kind, morder);
      return;
    }
    int64_t n = estimate_rows(second->handle(), "allocation");
    std::vector<int64_t> segment_of;
    reserve_all(n, a.id, a.t_alloc, a.t_free, a.bytes, a.weight, a.stack, a.device, a.name, a.kind, a.level, a.freed,
                segment_of);
    alloc_status = stream(
        second->handle(), path_, "allocation",
        // A CUDA module's globals are not the program's allocations (db/SCHEMA.md): not drawn.
        (std::string("SELECT id,device_id,memory_kind,level,bytes,t_alloc,t_free,name_id,stack_id,segment_id,") +
         (second->has_weights() ? "weight_bytes" : "NULL") + ",id FROM allocation WHERE NOT " + db::kModuleGlobalSql)
            .c_str(),
        progress,
        &alloc_rows, [&](sqlite3_stmt* st) {
          a.id.push_back(sqlite3_column_int64(st, 0));
          a.device.push_back(dev(sqlite3_column_int64(st, 1)));
          a.kind.push_back(uint8_t(sqlite3_column_int64(st, 2)));
          a.level.push_back(uint8_t(sqlite3_column_int64(st, 3)));
          a.bytes.push_back(sqlite3_column_int64(st, 4));
          a.t_alloc.push_back(sqlite3_column_int64(st, 5));
          bool freed = sqlite3_column_type(st, 6) != SQLITE_NULL;
          a.freed.push_back(freed);
          a.t_free.push_back(freed ? sqlite3_column_int64(st, 6) : INT64_MAX);
          a.name.push_back(name_index(col_or(st, 7, 0)));
          a.stack.push_back(col_or(st, 8, 0));
          segment_of.push_back(col_or(st, 9, 0));
          a.weight.push_back(std::max(a.bytes.back(), col_or(st, 10, 0)));
        });
    if (!alloc_status) return;
    std::vector<int64_t> containers;
    for (size_t i = 0; i < a.size(); ++i)
      if (segment_of[i] && a.level[i] == uint8_t(AllocLevel::Block)) containers.push_back(segment_of[i]);
    std::sort(containers.begin(), containers.end());
    a.in_segment.resize(a.size());
    a.holds_blocks.resize(a.size());
    a.second_record.resize(a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      a.second_record[i] = db::is_second_record(AllocLevel(a.level[i]), segment_of[i]);
      a.in_segment[i] = segment_of[i] != 0 && !a.second_record[i];
      a.holds_blocks[i] = std::binary_search(containers.begin(), containers.end(), a.id[i]);
    }
    auto order = sort_order(a.t_alloc);
    permute(a.id, order), permute(a.t_alloc, order), permute(a.t_free, order), permute(a.bytes, order);
    permute(a.weight, order);
    permute(a.stack, order), permute(a.device, order), permute(a.name, order), permute(a.kind, order);
    permute(a.level, order), permute(a.freed, order), permute(a.in_segment, order);
    permute(a.holds_blocks, order), permute(a.second_record, order);
    std::vector<uint8_t> family_of(strings_.size());
    for (size_t i = 0; i < strings_.size(); ++i) family_of[i] = uint8_t(classify_tensor(strings_[i]));
    a.family.resize(a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      int32_t nm = a.name[i];
      a.family[i] = nm > 0 && size_t(nm) < family_of.size() ? family_of[size_t(nm)] : uint8_t(Family::Buffers);
    }
    if (!alloc_status) return;
    // Markers too, so the two connections read about as many rows each.
    int64_t nm = estimate_rows(second->handle(), "marker");
    reserve_all(nm, mark.t_start, mark.t_end, mark.step, mark.epoch, mark.rank, mark.name, mark.kind);
    alloc_status = stream(second->handle(), path_, "marker", "SELECT rank,kind,name_id,t_start,t_end,step,epoch,id FROM marker",
                          progress, &alloc_rows, [&](sqlite3_stmt* st) {
                            mark.rank.push_back(int32_t(sqlite3_column_int64(st, 0)));
                            mark.kind.push_back(uint8_t(sqlite3_column_int64(st, 1)));
                            mark.name.push_back(name_index(col_or(st, 2, 0)));
                            mark.t_start.push_back(sqlite3_column_int64(st, 3));
                            mark.t_end.push_back(col_or(st, 4, INT64_MAX));  // open: closed at t_last below
                            mark.step.push_back(col_or(st, 5, -1));
                            mark.epoch.push_back(col_or(st, 6, -1));
                          });
    if (!alloc_status) return;
    auto morder = sort_order(mark.t_start);
    permute(mark.t_start, morder), permute(mark.t_end, morder), permute(mark.step, morder);
    permute(mark.epoch, morder), permute(mark.rank, morder), permute(mark.name, morder), permute(mark.kind, morder);
  });

  int64_t nx = overview ? 0 : estimate_rows(r.handle(), "transfer");
  reserve_all(nx, xfer.t_start, xfer.t_end, xfer.bytes, xfer.rank, xfer.src, xfer.dst, xfer.name, xfer.op, xfer.kind);
  Status s = overview ? Status::Ok() : stream(r.handle(), path_, "transfer",
                    "SELECT rank,kind,bytes,src_device_id,dst_device_id,t_start,t_end,name_id,op_id,id FROM transfer",
                    progress, &rows, [&](sqlite3_stmt* st) {
                      xfer.rank.push_back(int32_t(sqlite3_column_int64(st, 0)));
                      xfer.kind.push_back(uint8_t(sqlite3_column_int64(st, 1)));
                      xfer.bytes.push_back(sqlite3_column_int64(st, 2));
                      xfer.src.push_back(dev(col_or(st, 3, 0)));
                      xfer.dst.push_back(dev(col_or(st, 4, 0)));
                      xfer.t_start.push_back(sqlite3_column_int64(st, 5));
                      xfer.t_end.push_back(sqlite3_column_int64(st, 6));
                      xfer.name.push_back(name_index(col_or(st, 7, 0)));
                      xfer.op.push_back(name_index(col_or(st, 8, 0)));
                    });
  if (s && !overview) {
    auto order = sort_order(xfer.t_start);
    permute(xfer.t_start, order), permute(xfer.t_end, order), permute(xfer.bytes, order);
    permute(xfer.rank, order), permute(xfer.src, order), permute(xfer.dst, order);
    permute(xfer.name, order), permute(xfer.op, order), permute(xfer.kind, order);
    s = stream(r.handle(), path_, "kernel", "SELECT device_id,name_id,t_start,t_end,id FROM kernel", progress, &rows,
               [&](sqlite3_stmt* st) {
                 kern.device.push_back(dev(sqlite3_column_int64(st, 0)));
                 kern.name.push_back(name_index(col_or(st, 1, 0)));
                 kern.t_start.push_back(sqlite3_column_int64(st, 2));
                 kern.t_end.push_back(sqlite3_column_int64(st, 3));
               });
  }
  if (s) {
    auto order = sort_order(kern.t_start);
    permute(kern.t_start, order), permute(kern.t_end, order), permute(kern.device, order), permute(kern.name, order);
  }
  // Recorded counters that are about memory go beside the derived series (host RSS is only
  // known this way); allocated/reserved/pinned are derived from allocations instead, which
  // is exact at every event rather than at the recorder's sampling points.
  struct CounterKey {
    int32_t device;
    int32_t name;
    bool operator<(const CounterKey& o) const { return device != o.device ? device < o.device : name < o.name; }
  };
  std::map<CounterKey, Series> counters;
  // Only memory-like counters are read, chosen by name before the scan: a trace full of
  // loss or throughput samples costs nothing here.
  std::string wanted;
  for (size_t i = 1; i < strings_.size(); ++i) {
    const std::string& n = strings_[i];
    if (n == "allocated" || n == "reserved" || n == "pinned" || n == "pageable") continue;
    // Counts are not bytes (host_small_allocations was drawn on the byte scale, "peak 7 B").
    const bool count = n.find("count") != std::string::npos ||
                       (n.size() >= 11 && n.compare(n.size() - 11, 11, "allocations") == 0);
    if (count) continue;
    // Nor is a running total memory in use: the probe's host_small_bytes_allocated adds up every
    // small allocation ever made (frees never subtract), a staircase to GiBs that set the host
    // track's scale and flattened RSS and pageable under it.
    if (is_cumulative_counter(n)) continue;
    if (n.find("rss") != std::string::npos || n.find("mem") != std::string::npos ||
        n.find("bytes") != std::string::npos || n.find("host") != std::string::npos)
      wanted += (wanted.empty() ? "" : ",") + std::to_string(string_file_id_.empty() ? int64_t(i) : string_file_id_[i]);
  }
  if (s && !wanted.empty() && !overview) {
    std::string sql = "SELECT device_id,name_id,t,value,id FROM counter WHERE name_id IN (" + wanted +
                      ") AND value IS NOT NULL ORDER BY t";  // NULL: a NaN recorded (db/SCHEMA.md)
    s = stream(r.handle(), path_, "counter", sql.c_str(), progress, &rows, [&](sqlite3_stmt* st) {
      int32_t d = dev(col_or(st, 0, 0));
      if (d < 0 || !std::isfinite(sqlite3_column_double(st, 3))) return;  // an infinity has no place on a byte scale
      counters[CounterKey{d, name_index(sqlite3_column_int64(st, 1))}].push(sqlite3_column_int64(st, 2),
                                                                          sqlite3_column_double(st, 3));
    });
  }
  if (!s) progress ? progress->cancel.store(true) : void();
  alloc_thread.join();
  if (!s) return s;
  if (!alloc_status) return alloc_status;
  rows += alloc_rows;
  // A range zt probe's framework hooks wrote is shown as the framework's own ("Trainer step 3",
  // not "zerotrace.transformers::step 3": the job never imported zerotrace). Its name string is
  // a range's alone, so it is renamed in place, once.
  std::vector<uint8_t> relabelled(strings_.size());
  for (size_t i = 0; i < mark.size(); ++i) {
    const int32_t nm = mark.name[i];
    if (MarkerKind(mark.kind[i]) != MarkerKind::Range || nm <= 0 || relabelled[size_t(nm)]) continue;
    relabelled[size_t(nm)] = 1;
    strings_[size_t(nm)] = db::range_label(strings_[size_t(nm)]);
  }

  // Span of the trace.
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  auto span = [&](int64_t a, int64_t b) {
    lo = std::min(lo, a);
    hi = std::max(hi, b);
  };
  if (alloc.size()) span(alloc.t_alloc.front(), alloc.t_alloc.back());
  for (size_t i = 0; i < alloc.size(); ++i)
    if (alloc.freed[i]) hi = std::max(hi, alloc.t_free[i]);
  for (size_t i = 0; i < xfer.size(); ++i) span(xfer.t_start[i], xfer.t_end[i]);
  for (size_t i = 0; i < kern.size(); ++i) span(kern.t_start[i], kern.t_end[i]);
  for (size_t i = 0; i < mark.size(); ++i) span(mark.t_start[i], mark.t_end[i] == INT64_MAX ? mark.t_start[i] : mark.t_end[i]);
  for (auto& [k, ser] : counters) span(ser.t.front(), ser.t.back());
  for (auto& f : faults) span(f.t, f.t);
  for (auto& e : errors) span(e.t, e.t);
  for (auto& sm : step_memory_) span(sm.t_start, sm.t_end.value_or(sm.t_start));
  if (lo > hi) lo = hi = 0;
  t_first = lo;
  t_last = hi;
  for (size_t i = 0; i < alloc.size(); ++i)
    if (!alloc.freed[i]) alloc.t_free[i] = t_last;
  for (auto& t : mark.t_end)
    if (t == INT64_MAX) t = t_last;

  for (auto& f : faults)
    flags.push_back({f.t, int(f.rank), false, f.step.value_or(-1), f.name,
                     f.details + (f.trigger.empty() ? "" : " [trigger " + f.trigger + "]"), "", -1});
  for (auto& e : errors)
    // Older traces kept "CUDA tracing was off" as an error row: a note of the recording, not an
    // error of the run (db/SCHEMA.md, run.config_json "notes"), so not a flag.
    if (e.kind != "cuda_tracing_off")
      flags.push_back({e.t, int(e.rank), true, e.step.value_or(-1), e.kind.empty() ? "error" : e.kind, e.message,
                     e.tensors, e.device_id ? dev(e.device_id) : -1});
  std::stable_sort(flags.begin(), flags.end(), [](const Flag& a, const Flag& b) { return a.t < b.t; });

  ranks = rank_set.empty() ? 1 : *rank_set.rbegin() + 1;
  rank_list_.assign(rank_set.begin(), rank_set.end());
  if (rank_list_.empty()) rank_list_.push_back(0);
  for (size_t i = 0; i < mark.size(); ++i) {
    max_step = std::max(max_step, mark.step[i]);
    max_epoch = std::max(max_epoch, mark.epoch[i]);
  }
  epoch_ends.assign(size_t(ranks), {});
  for (size_t i = 0; i < mark.size(); ++i)
    if (mark.kind[i] == uint8_t(MarkerKind::Epoch) && mark.rank[i] >= 0 && mark.rank[i] < ranks)
      epoch_ends[size_t(mark.rank[i])].push_back(mark.t_end[i]);
  for (auto& v : epoch_ends) std::sort(v.begin(), v.end());
  // Step 0 of the lowest rank that has one: the rank drawn first, so two traces compared side by
  // side line up where the eye looks (the earliest step 0 of any rank put one trace's rank 0
  // 2.4 ms off the other's when another rank began first).
  int64_t s0 = -1;
  int s0_rank = -1;
  for (size_t i = 0; i < mark.size(); ++i)
    if (mark.kind[i] == uint8_t(MarkerKind::Step) && mark.step[i] == 0 &&
        (s0_rank < 0 || mark.rank[i] < s0_rank || (mark.rank[i] == s0_rank && mark.t_start[i] < s0))) {
      s0 = mark.t_start[i];
      s0_rank = mark.rank[i];
    }
  align_label = "step 0";
  if (s0 < 0) {
    // No step 0: align on the first step recorded, else on the first event.
    int64_t first_step = -1;
    for (size_t i = 0; i < mark.size(); ++i)
      if (mark.kind[i] == uint8_t(MarkerKind::Step)) {
        first_step = mark.t_start[i];
        align_label = "step " + std::to_string(mark.step[i]);
        break;
      }
    s0 = first_step;
  }
  if (s0 < 0) align_label = "the first event";
  t_align = s0 >= 0 ? s0 : t_first;

  // Memory tracks are filled in build_tracks(); counters wait here.
  for (auto& [key, ser] : counters) {
    ser.build();
    series.push_back(std::move(ser));
    extra_counters_.push_back({key.device, str(key.name), int(series.size() - 1)});
  }
  return Status::Ok();
}

// The series drawn from step_memory (db/SCHEMA.md, "Aggregates"): in the overview, every step's;
// in a trace whose detail stopped, those of the steps that ended after it. An accelerator's
// allocated and reserved go on from the detail's own series (one curve: the detail's values up to
// where the detail stopped, then each step's end), its peaks within each step are series of
// their own; a host device's live bytes (blocks and segments) are one series, "live (per step)",
// beside the detail's pinned and pageable, which stop where the detail did. Host RSS comes from
// the counter where the counters were read, else (the overview) from step_memory.
std::vector<std::vector<SeriesRef>> TraceModel::aggregate_series(std::vector<std::array<int, 4>>* series_of) {
  const size_t n_dev = devices.size();
  std::vector<std::vector<SeriesRef>> refs(n_dev);
  if (detail_end >= 0)
    for (auto& row : *series_of)
      for (int k : row)
        if (k >= 0) series[size_t(k)].stop = detail_end;
  if (step_memory_.empty()) return refs;
  std::unordered_map<int64_t, size_t> dev_index;
  for (size_t d = 0; d < n_dev; ++d) dev_index[devices[d].id] = d;
  // Per device: allocated, reserved, peak allocated, peak reserved; per rank: RSS.
  enum { kAlloc, kResv, kPeakAlloc, kPeakResv, kLive, kAggKinds };
  std::vector<std::array<Series, kAggKinds>> agg(n_dev);
  std::map<int, Series> rss;
  for (const db::StepMemoryRow& sm : step_memory_) {
    auto it = dev_index.find(sm.device_id);
    if (it == dev_index.end()) continue;
    const int64_t end = sm.t_end.value_or(t_last);  // the step the run ended in: its values so far
    if (!overview && end <= detail_end) continue;
    auto& a = agg[it->second];
    if (devices[it->second].host) {
      a[kLive].push(end, double(sm.allocated_bytes) + double(sm.reserved_bytes));
    } else {
      a[kAlloc].push(end, double(sm.allocated_bytes));
      a[kResv].push(end, double(sm.reserved_bytes));
      a[kPeakAlloc].push(sm.t_start, double(sm.peak_allocated_bytes));
      a[kPeakResv].push(sm.t_start, double(sm.peak_reserved_bytes));
    }
    if (overview && sm.host_rss_bytes) rss[int(sm.rank)].push(end, double(*sm.host_rss_bytes));
  }
  auto add = [&](size_t d, const char* name, Series&& s) {
    if (s.empty()) return;
    s.build();
    series.push_back(std::move(s));
    refs[d].push_back({name, int(series.size() - 1)});
  };
  // A step's peak is a series of its own where it says more than the step's end does (a segment's
  // peak within the step equals its end in a steady run: no line and no label for it).
  auto says_more = [](const Series& peak, const Series& end) {
    for (size_t i = 0; i < peak.value.size() && i < end.value.size(); ++i)
      if (peak.value[i] != end.value[i]) return true;
    return false;
  };
  for (size_t d = 0; d < n_dev; ++d) {
    auto& a = agg[d];
    const bool peak_alloc_says_more = says_more(a[kPeakAlloc], a[kAlloc]);
    const bool peak_resv_says_more = says_more(a[kPeakResv], a[kResv]);
    for (int k : {kAlloc, kResv}) {
      if (a[size_t(k)].empty()) continue;
      int& own = (*series_of)[d][k == kAlloc ? 0 : 1];
      if (own < 0) {
        add(d, k == kAlloc ? "allocated" : "reserved", std::move(a[size_t(k)]));
        continue;
      }
      // One curve: the detail's values up to where it stopped, then each step's end.
      Series& s = series[size_t(own)];
      while (!s.t.empty() && s.t.back() > detail_end) s.t.pop_back(), s.value.pop_back();
      for (size_t i = 0; i < a[size_t(k)].t.size(); ++i) s.push(a[size_t(k)].t[i], a[size_t(k)].value[i]);
      s.stop = INT64_MAX;
      s.build();
    }
    if (peak_alloc_says_more) add(d, "step peak alloc", std::move(a[kPeakAlloc]));
    if (peak_resv_says_more) add(d, "step peak resv", std::move(a[kPeakResv]));
    add(d, "live (per step)", std::move(a[kLive]));
  }
  // RSS on the rank's host device (else its first device).
  for (auto& [rank, s] : rss) {
    size_t best = n_dev;
    for (size_t d = 0; d < n_dev; ++d)
      if (devices[d].rank == rank && (best == n_dev || (devices[d].host && !devices[best].host))) best = d;
    if (best < n_dev) add(best, "host_rss", std::move(s));
  }
  return refs;
}

void TraceModel::build_tracks() {
  const size_t n_dev = devices.size();
  // Derived live-byte series per device: allocated (blocks), reserved (segments), and for
  // host memory pinned / pageable (segments, plus blocks outside any segment).
  enum SeriesKind { kAllocated, kReserved, kPinned, kPageable, kKinds };
  std::vector<std::array<int, kKinds>> series_of(n_dev);
  for (auto& a : series_of) a.fill(-1);
  {
    std::vector<std::array<std::vector<uint32_t>, kKinds>> members(n_dev);
    for (uint32_t i = 0; i < alloc.size(); ++i) {
      int d = alloc.device[i];
      if (d < 0 || alloc.second_record[i]) continue;  // counted by its twin
      auto kind = MemoryKind(alloc.kind[i]);
      bool segment = alloc.level[i] == uint8_t(AllocLevel::Segment);
      if (kind == MemoryKind::Device || kind == MemoryKind::Managed) {
        members[size_t(d)][segment ? kReserved : kAllocated].push_back(i);
      } else if (kind == MemoryKind::PinnedHost || kind == MemoryKind::PageableHost) {
        // A host block inside a recorded segment is already counted by the segment.
        if (!segment && alloc.in_segment[i]) continue;
        // A sampled row (the probe's byte sampler) is an estimate's share, not memory the line
        // can add exactly (db/SCHEMA.md, "Sampled rows"): the leaks view counts it, the line does not.
        if (alloc.weight[i] != alloc.bytes[i]) continue;
        members[size_t(d)][kind == MemoryKind::PinnedHost ? kPinned : kPageable].push_back(i);
      }
    }
    std::vector<std::pair<int, int>> jobs;
    for (size_t d = 0; d < n_dev; ++d)
      for (int k = 0; k < kKinds; ++k)
        if (!members[d][k].empty()) {
          series.emplace_back();
          series_of[d][k] = int(series.size() - 1);
          jobs.push_back({int(d), k});
        }
    // Each series is a merge of the allocation times (already sorted) with the sorted free
    // times; independent per series, so the two cores share them.
    auto work = [&](size_t from, size_t step) {
      for (size_t j = from; j < jobs.size(); j += step) {
        auto [d, k] = jobs[j];
        const auto& idx = members[size_t(d)][k];
        std::vector<std::pair<int64_t, int64_t>> frees;
        frees.reserve(idx.size());
        for (uint32_t i : idx)
          if (alloc.freed[i]) frees.push_back({alloc.t_free[i], alloc.bytes[i]});
        std::sort(frees.begin(), frees.end());
        Series& ser = series[size_t(series_of[size_t(d)][k])];
        ser.t.reserve(idx.size() + frees.size());
        ser.value.reserve(idx.size() + frees.size());
        // A double: exact below 2^53 bytes, and a file's thousands of 2^53-byte rows cannot
        // overflow it as they would an int64.
        double live = 0;
        size_t a = 0, f = 0;
        // At equal times frees go first, so a free-then-alloc is no false peak.
        while (a < idx.size() || f < frees.size()) {
          if (f < frees.size() && (a == idx.size() || frees[f].first <= alloc.t_alloc[idx[a]])) {
            live -= double(frees[f].second);
            ser.push(frees[f].first, live);
            ++f;
          } else {
            live += double(alloc.bytes[idx[a]]);
            ser.push(alloc.t_alloc[idx[a]], live);
            ++a;
          }
        }
        ser.build();
      }
    };
    std::thread helper(work, 1, 2);
    work(0, 2);
    helper.join();
  }
  std::vector<std::vector<SeriesRef>> aggregate_refs = aggregate_series(&series_of);

  // Allocation lanes per device, built on the helper core while the rest are built here.
  std::vector<Track> alloc_tracks(n_dev);
  std::thread lanes_thread([&] {
    std::vector<LaneAssigner> assigners(n_dev, LaneAssigner(kMaxAllocationLanes));
    for (uint32_t i = 0; i < alloc.size(); ++i) {
      int d = alloc.device[i];
      // A second record (CUPTI's twin of the trainer's segment) is the same memory as the
      // segment drawn already: one box, not two side by side.
      if (d < 0 || alloc.second_record[i]) continue;
      Track& t = alloc_tracks[size_t(d)];
      // Where the detail stopped, a row it never saw freed is drawn to there, not through the
      // aggregates-only stretch: whether it lived on is not known.
      const int64_t end = !alloc.freed[i] && detail_end >= 0 ? std::max(alloc.t_alloc[i], detail_end) : alloc.t_free[i];
      size_t lane = size_t(assigners[size_t(d)].assign(alloc.t_alloc[i], end));
      if (t.lanes.size() <= lane) t.lanes.resize(lane + 1);
      t.lanes[lane].push(alloc.t_alloc[i], end, i);
      t.families |= uint8_t(1u << alloc.family[i]);
      t.segments = t.segments || alloc.level[i] == uint8_t(db::AllocLevel::Segment);
    }
  });

  // Tracks for the ranks the trace has, not for every number below the highest (a file may
  // name rank 1048575 alone): slot[r] is rank r's place in the per-rank vectors, -1 for none.
  const std::vector<int>& rank_list = rank_list_;
  const size_t n_rank = rank_list.size();
  std::vector<int> slot(size_t(ranks), -1);
  for (size_t k = 0; k < n_rank; ++k) slot[size_t(rank_list[k])] = int(k);
  auto slot_of = [&](int r) { return r >= 0 && r < ranks ? slot[size_t(r)] : -1; };
  std::vector<Track> marker_tracks(n_rank), transfer_tracks(n_rank);
  for (size_t k = 0; k < n_rank; ++k) {
    const int r = rank_list[k];
    Track& t = marker_tracks[k];
    t.kind = TrackKind::Markers;
    t.rank = r;
    t.title = rank_title(r) + " · epochs, steps, phases";
    t.lanes.resize(2);
    t.lane_names = {"epochs", "steps"};
    Track& x = transfer_tracks[k];
    x.kind = TrackKind::Transfers;
    x.rank = r;
    x.title = rank_title(r) + " · transfers";
    x.lanes.resize(kDirectionCount);
    for (int d = 0; d < kDirectionCount; ++d) x.lane_names.push_back(to_string(Direction(d)));
  }
  // A phase of step s that overlaps another step's marker ran beside the rank's thread (the
  // delayed parameter update's AdamW, on a background thread while step s+1 computes): it goes to
  // "background" lanes below the phases, so the rank thread's phases keep their nesting. A phase
  // between two steps (a checkpoint) is the rank thread's.
  std::map<std::pair<int, int64_t>, int64_t> step_start;  // (rank, step) -> start of the step marker
  for (uint32_t i = 0; i < mark.size(); ++i)
    if (MarkerKind(mark.kind[i]) == MarkerKind::Step && mark.step[i] >= 0)
      step_start[{mark.rank[i], mark.step[i]}] = mark.t_start[i];
  auto beside_the_next_step = [&](uint32_t i) {
    if (MarkerKind(mark.kind[i]) != MarkerKind::Phase || mark.step[i] < 0) return false;
    auto it = step_start.find({mark.rank[i], mark.step[i] + 1});
    return it != step_start.end() && mark.t_end[i] > it->second;
  };
  std::vector<LaneAssigner> phase_lanes(n_rank, LaneAssigner(kMaxPhaseLanes));
  std::vector<LaneAssigner> background_lanes(n_rank, LaneAssigner(kMaxPhaseLanes));
  std::vector<std::vector<std::pair<int, uint32_t>>> background(n_rank);  // (lane, marker)
  for (uint32_t i = 0; i < mark.size(); ++i) {
    const int k = slot_of(mark.rank[i]);
    if (k < 0) continue;
    const size_t r = size_t(k);
    Track& t = marker_tracks[r];
    auto kind = MarkerKind(mark.kind[i]);
    size_t lane;
    if (kind == MarkerKind::Epoch) {
      lane = 0;
    } else if (kind == MarkerKind::Step) {
      lane = 1;
    } else if (beside_the_next_step(i)) {
      background[r].push_back({background_lanes[r].assign(mark.t_start[i], mark.t_end[i]), i});
      continue;
    } else {
      lane = 2 + size_t(phase_lanes[r].assign(mark.t_start[i], mark.t_end[i]));
    }
    while (t.lanes.size() <= lane) {
      t.lanes.emplace_back();
      t.lane_names.push_back(t.lane_names.size() == 2 ? "phases" : "");
    }
    t.lanes[lane].push(mark.t_start[i], mark.t_end[i], i);
  }
  for (size_t r = 0; r < n_rank; ++r) {
    Track& t = marker_tracks[r];
    const size_t first = t.lanes.size();
    for (auto [lane, i] : background[r]) {
      while (t.lanes.size() <= first + size_t(lane)) {
        t.lanes.emplace_back();
        t.lane_names.push_back(t.lanes.size() == first + 1 ? "background" : "");
      }
      t.lanes[first + size_t(lane)].push(mark.t_start[i], mark.t_end[i], i);
    }
  }
  for (uint32_t i = 0; i < xfer.size(); ++i) {
    const int k = slot_of(xfer.rank[i]);
    if (k < 0) continue;
    transfer_tracks[size_t(k)].lanes[size_t(direction_of(db::TransferKind(xfer.kind[i])))].push(xfer.t_start[i],
                                                                                               xfer.t_end[i], i);
  }
  std::vector<Track> kernel_tracks(n_dev);
  std::vector<LaneAssigner> kernel_lanes(n_dev, LaneAssigner(kMaxKernelLanes));
  for (uint32_t i = 0; i < kern.size(); ++i) {
    int d = kern.device[i];
    if (d < 0) continue;
    size_t lane = size_t(kernel_lanes[size_t(d)].assign(kern.t_start[i], kern.t_end[i]));
    auto& lanes = kernel_tracks[size_t(d)].lanes;
    if (lanes.size() <= lane) lanes.resize(lane + 1);
    lanes[lane].push(kern.t_start[i], kern.t_end[i], i);
  }
  lanes_thread.join();

  // Track order per rank: markers, then per device memory / allocations / kernels (GPUs
  // first, host last), transfers, then faults and errors.
  for (size_t k = 0; k < n_rank; ++k) {
    const int r = rank_list[k];
    tracks.push_back(std::move(marker_tracks[k]));
    std::vector<size_t> devs;
    for (size_t d = 0; d < n_dev; ++d)
      if (devices[d].rank == r) devs.push_back(d);
    std::stable_sort(devs.begin(), devs.end(), [&](size_t a, size_t b) { return !devices[a].host && devices[b].host; });
    for (size_t d : devs) {
      const DeviceInfo& info = devices[d];
      Track mem;
      mem.kind = info.host ? TrackKind::HostMemory : TrackKind::Memory;
      mem.rank = r;
      mem.device = int(d);
      mem.capacity = info.capacity;
      mem.title = info.host ? rank_title(r) + " · host memory (" + info.label + ")"
                            : rank_title(r) + " · " + info.label + " memory";
      static const char* names[] = {"allocated", "reserved", "pinned", "pageable"};
      for (int k = 0; k < kKinds; ++k)
        if (series_of[d][k] >= 0) mem.series.push_back({names[k], series_of[d][k]});
      for (auto& c : extra_counters_)
        if (c.device == int(d)) mem.series.push_back({c.name, c.series});
      for (auto& ref : aggregate_refs[d]) mem.series.push_back(ref);
      if (!mem.series.empty() || info.capacity > 0) tracks.push_back(std::move(mem));
      Track& at = alloc_tracks[d];
      if (!at.lanes.empty()) {
        at.kind = TrackKind::Allocations;
        at.rank = r;
        at.device = int(d);
        at.title = rank_title(r) + " · " + info.label + " allocations";
        at.lane_names.assign(at.lanes.size(), "");
        tracks.push_back(std::move(at));
      }
      Track& kt = kernel_tracks[d];
      if (!kt.lanes.empty()) {
        kt.kind = TrackKind::Kernels;
        kt.rank = r;
        kt.device = int(d);
        kt.title = rank_title(r) + " · " + info.label + " kernels";
        kt.lane_names.assign(kt.lanes.size(), "");
        tracks.push_back(std::move(kt));
      }
    }
    tracks.push_back(std::move(transfer_tracks[k]));
    Track flags_track;
    flags_track.kind = TrackKind::Flags;
    flags_track.rank = r;
    flags_track.title = rank_title(r) + " · faults and errors";
    tracks.push_back(std::move(flags_track));
  }
}

}  // namespace zt::viewer
