#include "trace_data.h"

#include <sqlite3.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>

#include "zt/common/files.h"
#include "zt/common/units.h"
#include "zt/db/derive_steps.h"
#include "zt/db/names.h"
#include "zt/db/trace_values.h"

namespace zt::check::detail {

namespace {

// Streams the rows of one SELECT; `row` is called with the statement positioned on each row.
template <typename Fn>
Status for_each_row(sqlite3* db, const std::string& path, const char* sql, Fn row) {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) != SQLITE_OK)
    return Status::Error(path + ": reading failed: " + one_line(sqlite3_errmsg(db)));
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) row(st);
  Status s = rc == SQLITE_DONE ? Status::Ok() : Status::Error(path + ": reading failed: " + one_line(sqlite3_errmsg(db)));
  sqlite3_finalize(st);
  return s;
}

int64_t i64_or(sqlite3_stmt* st, int c, int64_t none) {
  return sqlite3_column_type(st, c) == SQLITE_NULL ? none : sqlite3_column_int64(st, c);
}

}  // namespace

Status TraceData::load(const std::string& path, std::unique_ptr<TraceData>* out) {
  auto d = std::make_unique<TraceData>();
  d->path_ = path;
  if (Status s = db::TraceReader::open(path, &d->reader_); !s) return s;
  if (Status s = d->reader_->read(&d->runs); !s) return s;
  if (Status s = d->reader_->read(&d->ranks); !s) return s;
  std::vector<db::DeviceRow> devices;
  if (Status s = d->reader_->read(&devices); !s) return s;
  for (auto& dev : devices) d->devices[dev.id] = dev;
  if (Status s = d->reader_->strings(&d->strings); !s) return s;
  if (Status s = d->reader_->read(&d->errors); !s) return s;
  if (Status s = d->load_allocations(); !s) return s;
  if (Status s = d->load_markers(); !s) return s;
  if (Status s = d->load_counters(); !s) return s;
  if (Status s = d->load_probed_runs(); !s) return s;
  if (Status s = d->load_aggregates(); !s) return s;
  d->find_run_others();
  *out = std::move(d);
  return Status::Ok();
}

void TraceData::find_run_others() {
  if (runs.size() != 1) return;
  std::string run_id;
  (void)for_each_row(reader_->handle(), path_,
                     "SELECT json_extract(config_json, '$.run_id') FROM run WHERE json_valid(config_json) AND "
                     "json_type(config_json) = 'object' AND json_type(config_json, '$.run_id') = 'text'",
                     [&](sqlite3_stmt* st) {
                       if (const unsigned char* t = sqlite3_column_text(st, 0)) run_id = reinterpret_cast<const char*>(t);
                     });
  if (run_id.empty()) return;
  // zt probe's rule (zt/probe/probe_config.h: per_process_trace_path, trace_stem): "<main without .db>.pid".
  namespace fs = std::filesystem;
  const fs::path self(path_);
  std::string stem = self.filename().string();
  if (stem.size() > 3 && stem.compare(stem.size() - 3, 3, ".db") == 0) stem.resize(stem.size() - 3);
  const std::string prefix = stem + ".pid", needle = "\"run_id\":\"" + run_id + "\"";
  std::error_code ec;
  const fs::path dir = self.has_parent_path() ? self.parent_path() : fs::path(".");
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.size() <= prefix.size() + 3 || n.compare(0, prefix.size(), prefix) != 0 ||
        n.compare(n.size() - 3, 3, ".db") != 0 || !std::isdigit(static_cast<unsigned char>(n[prefix.size()])))
      continue;
    sqlite3* db = nullptr;
    bool ours = false;
    if (sqlite3_open_v2(it->path().c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
      sqlite3_busy_timeout(db, 500);
      sqlite3_stmt* st = nullptr;
      if (sqlite3_prepare_v2(db, "SELECT 1 FROM run WHERE instr(coalesce(config_json, ''), ?1) > 0 LIMIT 1", -1, &st,
                             nullptr) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, needle.c_str(), -1, SQLITE_TRANSIENT);
        ours = sqlite3_step(st) == SQLITE_ROW;
      }
      sqlite3_finalize(st);
    }
    sqlite3_close(db);
    if (ours) run_others.push_back(self.has_parent_path() ? it->path().string() : n);
  }
  std::sort(run_others.begin(), run_others.end());
}

Status TraceData::load_aggregates() {
  if (!reader_->has_aggregates()) return Status::Ok();
  db::TraceSummary::Detail detail;
  if (Status s = reader_->summarize_detail(&detail); !s) return s;
  detail_end = detail.t_end;
  detail_end_reason = detail.end_reason;
  if (detail_end) detail_spans = detail.spans;
  if (detail_end)
    if (Status s = reader_->read(&step_memory); !s) return s;
  std::vector<db::EpochLiveRow> rows;
  if (Status s = reader_->read(&rows); !s) return s;
  for (auto& r : rows)
    if (r.memory_kind != db::MemoryKind::ModuleGlobal) epoch_live[{r.rank, r.epoch, r.at}].push_back(r);
  return Status::Ok();
}

Status TraceData::load_allocations() {
  // A second record of a segment (CUPTI's twin of the trainer's) is the same memory, and a CUDA
  // module's globals are not the program's allocations: neither is loaded.
  const std::string sql = std::string("SELECT id,rank,device_id,memory_kind,level,bytes,t_alloc,t_free,name_id,stack_id,") +
                          (reader_->has_weights() ? "weight_bytes" : "NULL") + " FROM allocation WHERE NOT " +
                          db::kSecondRecordSql + " AND NOT " + db::kModuleGlobalSql;
  return for_each_row(reader_->handle(), path_, sql.c_str(),
                      [&](sqlite3_stmt* st) {
                        Alloc a;
                        a.id = sqlite3_column_int64(st, 0);
                        a.rank = sqlite3_column_int64(st, 1);
                        a.device_id = i64_or(st, 2, 0);
                        a.kind = db::MemoryKind(sqlite3_column_int(st, 3));
                        a.level = db::AllocLevel(sqlite3_column_int(st, 4));
                        a.bytes = sqlite3_column_int64(st, 5);
                        a.t_alloc = sqlite3_column_int64(st, 6);
                        a.t_free = i64_or(st, 7, kNever);
                        a.name_id = i64_or(st, 8, 0);
                        a.stack_id = i64_or(st, 9, 0);
                        a.weight = std::max(a.bytes, i64_or(st, 10, 0));
                        (sqlite3_column_type(st, 10) == SQLITE_NULL ? allocs : sampled).push_back(a);
                      });
}

Status TraceData::load_markers() {
  std::map<int64_t, std::map<int64_t, Span>> epoch_marks;  // rank -> epoch -> span
  std::map<int64_t, std::map<int64_t, Span>> epoch_from_steps;
  auto add = [&](int64_t rank, db::MarkerKind kind, int64_t t_start, std::optional<int64_t> t_end,
                 std::optional<int64_t> step, std::optional<int64_t> epoch) {
    Span sp;
    sp.t_start = t_start;
    sp.ended = t_end.has_value();
    sp.t_end = t_end.value_or(kNever);
    if (kind == db::MarkerKind::Step) {
      if (!step) return;
      sp.index = *step;
      steps[rank].push_back(sp);
      if (epoch) {
        auto [it, fresh] = epoch_from_steps[rank].try_emplace(*epoch, sp);
        it->second.index = *epoch;
        if (!fresh) {
          it->second.t_start = std::min(it->second.t_start, sp.t_start);
          it->second.t_end = std::max(it->second.t_end, sp.t_end);
          it->second.ended = it->second.ended && sp.ended;
        }
      }
    } else {
      auto& m = epoch_marks[rank];
      sp.index = epoch ? *epoch : int64_t(m.size());
      m.emplace(sp.index, sp);
    }
  };
  auto opt = [](sqlite3_stmt* st, int c) {
    return sqlite3_column_type(st, c) == SQLITE_NULL ? std::nullopt : std::optional<int64_t>(sqlite3_column_int64(st, c));
  };
  int64_t rows = 0;
  Status s = for_each_row(
      reader_->handle(), path_,
      "SELECT rank,kind,t_start,t_end,step,epoch FROM marker WHERE kind IN (0,2) ORDER BY t_start", [&](sqlite3_stmt* st) {
        ++rows;
        add(sqlite3_column_int64(st, 0), db::MarkerKind(sqlite3_column_int(st, 1)), sqlite3_column_int64(st, 2),
            opt(st, 3), opt(st, 4), opt(st, 5));
      });
  if (!s) return s;
  if (rows == 0) {
    // No step or epoch markers: a probed program's are derived from its ranges when zt probe
    // finishes the trace, which it could not do when it was killed together with the job. The
    // same rules here, in memory (the user's trace is not written).
    db::DerivedMarkers dm;
    std::vector<db::DerivedMarker> derived;
    if (db::derive_steps_in_memory(*reader_, {}, &dm, &derived) && dm.steps + dm.epochs > 0) {
      std::stable_sort(derived.begin(), derived.end(),
                       [](const db::DerivedMarker& a, const db::DerivedMarker& b) { return a.t_start < b.t_start; });
      for (auto& m : derived)
        if (m.kind == db::MarkerKind::Step || m.kind == db::MarkerKind::Epoch)
          add(m.rank, m.kind, m.t_start, m.t_end, m.step, m.epoch);
      derived_markers = "the trace has no step or epoch markers (zt probe derives them from the ranges when the "
                        "program ends, and could not: killed with the job?): zt check derived " +
                        db::describe(dm) + " from its ranges, in memory; `zt db steps " + path_ +
                        "` writes them into the trace";
    }
  }
  // Epoch markers where the trace has them; a rank without any falls back to its steps' epochs.
  for (auto* src : {&epoch_marks, &epoch_from_steps})
    for (auto& [rank, m] : *src) {
      if (epochs.count(rank)) continue;
      for (auto& [e, sp] : m) epochs[rank].push_back(sp);
    }
  return Status::Ok();
}

Status TraceData::load_counters() {
  return for_each_row(reader_->handle(), path_,
                      "SELECT c.rank,c.device_id,s.text,c.t,c.value FROM counter c JOIN string s ON s.id=c.name_id"
                      " WHERE s.text IN ('allocated','reserved','host_rss') OR s.text LIKE 'data.%' ORDER BY c.t",
                      [&](sqlite3_stmt* st) {
                        const unsigned char* name = sqlite3_column_text(st, 2);
                        if (name && std::string_view(reinterpret_cast<const char*>(name)) == "host_rss") {
                          // A counter is any number in a trace: an RSS that is not a size is left out.
                          const double v = sqlite3_column_type(st, 4) == SQLITE_NULL ? -1 : sqlite3_column_double(st, 4);
                          if (v >= 0 && v <= double(db::kMaxTraceBytes))
                            rss[sqlite3_column_int64(st, 0)].emplace_back(sqlite3_column_int64(st, 3), int64_t(v));
                          return;
                        }
                        CounterSample c;
                        c.rank = sqlite3_column_int64(st, 0);
                        c.device_id = i64_or(st, 1, 0);
                        const unsigned char* txt = sqlite3_column_text(st, 2);
                        c.name = txt ? reinterpret_cast<const char*>(txt) : "";
                        c.t = sqlite3_column_int64(st, 3);
                        // A NaN is stored as NULL (SQLite has none): read back as NaN, as TraceReader does.
                        c.value = sqlite3_column_type(st, 4) == SQLITE_NULL ? std::nan("")
                                                                             : sqlite3_column_double(st, 4);
                        counters.push_back(std::move(c));
                      });
}

Status TraceData::load_probed_runs() {
  return for_each_row(reader_->handle(), path_,
                      "SELECT id, json_extract(config_json, '$.host_threshold'), json_extract(config_json, "
                      "'$.sample_interval') FROM run WHERE json_valid(config_json) AND json_type(config_json) = "
                      "'object' AND json_extract(config_json, '$.probe') IS NOT NULL",
                      [&](sqlite3_stmt* st) {
                        std::optional<int64_t> threshold;
                        if (sqlite3_column_type(st, 1) == SQLITE_INTEGER && sqlite3_column_int64(st, 1) >= 0)
                          threshold = sqlite3_column_int64(st, 1);
                        probed_runs[sqlite3_column_int64(st, 0)] = threshold;
                        if (sqlite3_column_type(st, 2) == SQLITE_INTEGER && sqlite3_column_int64(st, 2) > 0)
                          sample_intervals[sqlite3_column_int64(st, 0)] = sqlite3_column_int64(st, 2);
                      });
}

int64_t TraceData::sample_interval(int64_t rank) const {
  const db::RunRow* run = run_of(rank);
  auto it = run ? sample_intervals.find(run->id) : sample_intervals.end();
  return it == sample_intervals.end() ? 0 : it->second;
}

bool TraceData::probed(int64_t rank, std::optional<int64_t>* host_threshold) const {
  const db::RunRow* run = run_of(rank);
  auto it = run ? probed_runs.find(run->id) : probed_runs.end();
  if (it == probed_runs.end()) return false;
  if (host_threshold) *host_threshold = it->second;
  return true;
}

const std::string& TraceData::str(int64_t id) const {
  static const std::string none = "(unnamed)";
  auto it = strings.find(id);
  return it == strings.end() || it->second.empty() ? none : it->second;
}

bool TraceData::is_accelerator(int64_t device_id) const {
  auto it = devices.find(device_id);
  return it != devices.end() && it->second.kind != db::DeviceKind::Cpu;
}

std::string TraceData::device_label(int64_t device_id) const {
  auto it = devices.find(device_id);
  if (it == devices.end()) return device_id ? "device " + std::to_string(device_id) : "no device";
  return it->second.label.empty() ? std::string(db::to_string(it->second.kind)) : it->second.label;
}

std::string TraceData::hostname_of(int64_t rank) const {
  for (auto& r : ranks)
    if (r.rank == rank && !r.hostname.empty()) return r.hostname;
  if (const db::RunRow* run = run_of(rank); run && !run->hostname.empty()) return run->hostname;
  return "host of rank " + std::to_string(rank);
}

bool TraceData::is_process(int64_t rank) const {
  for (auto& r : ranks)
    if (r.rank == rank) return r.role != db::RankRole::Rank;
  return false;
}

std::string TraceData::who(int64_t rank) const {
  for (auto& r : ranks)
    if (r.rank == rank && r.role != db::RankRole::Rank)
      return std::string(db::to_string(r.role)) + " process " + std::to_string(r.pid) +
             (r.job_rank ? " of rank " + std::to_string(*r.job_rank) : "");
  return "rank " + std::to_string(rank);
}

const db::RunRow* TraceData::run_of(int64_t rank) const {
  for (auto& r : ranks)
    if (r.rank == rank)
      for (auto& run : runs)
        if (run.id == r.run_id) return &run;
  return runs.empty() ? nullptr : &runs.front();
}

std::optional<int64_t> TraceData::step_at(int64_t rank, int64_t t) const {
  auto it = steps.find(rank);
  if (it == steps.end()) return std::nullopt;
  const auto& v = it->second;
  auto p = std::upper_bound(v.begin(), v.end(), t, [](int64_t x, const Span& s) { return x < s.t_start; });
  if (p == v.begin()) return std::nullopt;
  return std::prev(p)->index;
}

std::string TraceData::stack_brief(int64_t stack_id, int frames) {
  if (!stack_id) return "";
  if (auto it = stack_cache_.find(stack_id); it != stack_cache_.end()) return it->second;
  std::vector<std::string> lines;
  std::string out;
  if (reader_->stack_text(stack_id, &lines)) {
    int n = 0;
    for (auto& l : lines) {
      // The probe's own frames (the interposer, the recorder) say nothing about the caller.
      if (l.find("libzt_probe") != std::string::npos || l.rfind("zt::probe::", 0) == 0) continue;
      std::string f = l;
      if (auto p = f.find(" ("); p != std::string::npos && f.rfind("0x", 0) != 0) f.resize(p);
      out += (n ? " < " : "") + f;
      if (++n == frames) break;
    }
  }
  stack_cache_[stack_id] = out;
  return out;
}

bool TraceData::importing(int64_t stack_id) {
  if (!stack_id) return false;
  if (auto it = importing_cache_.find(stack_id); it != importing_cache_.end()) return it->second;
  std::vector<std::string> lines;
  bool found = false;
  if (reader_->stack_text(stack_id, &lines))
    for (auto& l : lines) found = found || l.find("(<frozen importlib._bootstrap") != std::string::npos;
  return importing_cache_[stack_id] = found;
}

db::StackSites* TraceData::sites() {
  if (!sites_ && !db::StackSites::load(*reader_, &sites_)) sites_.reset();
  return sites_.get();
}

std::string TraceData::where(int64_t stack_id) {
  if (!stack_id) return "";
  if (db::StackSites* s = sites(); s) {
    const db::FrameRow* f = s->site_frame(stack_id);
    if (f && f->python()) return s->site(stack_id, db::SiteLevel::Line);
  }
  return stack_brief(stack_id);
}

std::string TraceData::group_of(const Alloc& a) {
  auto named = strings.find(a.name_id);
  const bool unnamed = named == strings.end() || named->second.empty();
  db::StackSites* s = unnamed && a.stack_id ? sites() : nullptr;
  if (s && s->site_frame(a.stack_id)) return s->site(a.stack_id, db::SiteLevel::Line);
  return group_name(str(a.name_id));
}

std::string group_name(const std::string& name) { return db::tensor_group(name); }

std::vector<NamedBytes> sort_groups(std::map<std::string, NamedBytes>& groups, size_t top) {
  std::vector<NamedBytes> v;
  for (auto& [k, g] : groups) v.push_back(g);
  std::stable_sort(v.begin(), v.end(), [](const NamedBytes& a, const NamedBytes& b) { return a.bytes > b.bytes; });
  if (v.size() > top) v.resize(top);
  return v;
}

std::string describe_groups(TraceData& d, const std::vector<NamedBytes>& groups, const char* sign) {
  std::string out;
  for (auto& g : groups) {
    if (!out.empty()) out += ", ";
    out += g.name + " " + sign + (g.sampled ? "~" : "") + format_bytes(double(g.bytes)) + " in " +
           std::to_string(g.count) + " allocation" + (g.count == 1 ? "" : "s") +
           (g.sampled ? " (" + std::to_string(g.sampled) + " sampled)" : "");
    std::string st = d.where(g.largest_stack);
    if (!st.empty() && st != g.name) out += " (at " + st + ")";
  }
  return out;
}

std::string memory_kind_words(db::MemoryKind k) {
  switch (k) {
    case db::MemoryKind::Device: return "device memory";
    case db::MemoryKind::PinnedHost: return "pinned host memory";
    case db::MemoryKind::PageableHost: return "pageable host memory";
    case db::MemoryKind::Managed: return "managed memory";
    default: return "memory of unknown kind";
  }
}

}  // namespace zt::check::detail
