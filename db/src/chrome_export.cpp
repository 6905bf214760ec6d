// zt export --chrome: the trace as Chrome trace-event JSON, streamed row by row.
// Layout: one process per rank (pid = rank). Threads: 1 markers, 10+kind transfers
// (H2D, D2H, ...), 100+device kernels. Allocations are async slices (they overlap, which
// complete events on one thread may not); a live block/segment sum per device is a counter, which
// goes on from step_memory where the detail stopped (db/SCHEMA.md, "Aggregates").
#include <cmath>
#include <sqlite3.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <tuple>
#include <nlohmann/json.hpp>

#include "sqlite.h"
#include "zt/db/export.h"
#include "zt/db/sites.h"
#include "zt/db/trace_reader.h"

namespace zt::db {
using detail::SqlError;
using detail::Stmt;

namespace {

class JsonOut {
 public:
  explicit JsonOut(std::ofstream& f) : f_(f) {}
  // Writes one trace event; `fields` is the inside of the object, already JSON.
  void event(const std::string& fields) {
    f_ << (first_ ? "\n" : ",\n") << "{" << fields << "}";
    first_ = false;
    ++count;
  }
  int64_t count = 0;

 private:
  std::ofstream& f_;
  bool first_ = true;
};

std::string q(const std::string& s) { return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

std::string us(int64_t t, int64_t t0) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3f", double(t - t0) / 1000.0);
  return buf;
}

}  // namespace

Status export_chrome(const std::string& trace_path, const std::string& json_path, ExportStats* stats) {
  std::unique_ptr<TraceReader> reader;
  if (Status s = TraceReader::open(trace_path, &reader); !s) return s;
  TraceSummary sum;
  if (Status s = reader->summarize(&sum); !s) return s;
  std::unordered_map<int64_t, std::string> names;
  if (Status s = reader->strings(&names); !s) return s;
  std::vector<DeviceRow> devices;
  if (Status s = reader->read(&devices); !s) return s;
  std::map<int64_t, std::string> dev_label;
  for (auto& d : devices) dev_label[d.id] = d.label;
  auto name_of = [&](int64_t id, const char* fallback) {
    auto it = names.find(id);
    return it == names.end() ? std::string(fallback) : it->second;
  };
  auto label_of = [&](int64_t id) {
    auto it = dev_label.find(id);
    return it == dev_label.end() ? std::string("?") : it->second;
  };
  const int64_t t0 = !sum.runs.empty() ? std::min(sum.runs.front().t_start, sum.t_first ? sum.t_first : INT64_MAX)
                                       : sum.t_first;
  const int64_t t_end = std::max(sum.t_last, t0);
  // Where a rank's process ended before the trace does (a merged trace of processes run in turn),
  // what it never freed ends with it, not at the trace's end.
  std::map<int64_t, int64_t> process_end;  // rank -> its run's end, only where before t_end
  for (auto& r : sum.ranks)
    for (auto& run : sum.runs)
      if (run.id == r.run_id && run.t_end && *run.t_end < t_end) process_end[r.rank] = *run.t_end;

  std::unique_ptr<StackSites> sites;  // frames and stacks, for the events' stacks and sites
  if (Status s = StackSites::load(*reader, &sites); !s) return s;

  // The aggregates, read before anything is written (a bad row: the reader's message, no output).
  std::vector<DetailSpanRow> spans;
  std::vector<StepMemoryRow> steps;
  std::vector<EpochLiveRow> live_sets;
  if (Status s = reader->read(&spans); !s) return s;
  std::optional<int64_t> detail_end;
  std::string detail_reason;
  for (auto& sp : spans)
    if (sp.t_end && (!detail_end || *sp.t_end < *detail_end)) detail_end = sp.t_end, detail_reason = sp.end_reason;
  if (detail_end)
    if (Status s = reader->read(&steps); !s) return s;
  if (Status s = reader->read(&live_sets); !s) return s;

  std::string tmp = json_path + ".writing";
  std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
  if (!f) return Status::Error(json_path + ": cannot write here");
  JsonOut out(f);
  f << "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"source\":" << q(trace_path) << ",\"tool\":\"zerotrace\"},"
    << "\"traceEvents\":[";
  try {
    // Names of processes (ranks) and threads (tracks).
    std::set<int64_t> ranks;
    for (auto& r : sum.ranks) ranks.insert(r.rank);
    for (auto& d : devices) ranks.insert(d.rank);
    if (ranks.empty()) ranks.insert(0);
    // A launcher's or helper's key is not a rank (rank.role): named by its role and pid.
    std::map<int64_t, std::string> process_names;
    for (auto& r : sum.ranks)
      if (r.role != RankRole::Rank)
        process_names[r.rank] = std::string(to_string(r.role)) + " process " + std::to_string(r.pid) +
                                (r.job_rank ? " of rank " + std::to_string(*r.job_rank) : "");
    for (int64_t r : ranks) {
      const auto named = process_names.find(r);
      out.event("\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(r) + ",\"args\":{\"name\":" +
                q(named != process_names.end() ? named->second : "rank " + std::to_string(r)) + "}");
      out.event("\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + std::to_string(r) +
                ",\"tid\":1,\"args\":{\"name\":\"markers\"}");
      for (int k = 0; k <= 5; ++k)
        out.event("\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + std::to_string(r) + ",\"tid\":" +
                  std::to_string(10 + k) + ",\"args\":{\"name\":\"transfers " +
                  std::string(to_string(TransferKind(k))) + "\"}");
    }

    // Call stacks (innermost frame first, Python frames among the native ones) as each event's
    // "stack" argument; its site names an allocation that has no tensor name.
    std::unordered_map<int64_t, std::string> stack_args;  // stack id -> ",\"stack\":[...]"
    auto stack_arg = [&](int64_t stack_id) -> const std::string& {
      auto [it, fresh] = stack_args.try_emplace(stack_id);
      if (fresh && stack_id) {
        std::vector<std::string> lines;
        if (reader->stack_text(stack_id, &lines) && !lines.empty()) {
          it->second = ",\"site\":" + q(sites->site(stack_id, SiteLevel::Line)) + ",\"stack\":[";
          for (size_t i = 0; i < lines.size(); ++i) it->second += (i ? "," : "") + q(lines[i]);
          it->second += "]";
        }
      }
      return it->second;
    };

    // Allocations: async begin/end; a live-bytes counter per device from the same sweep.
    struct Ev { int64_t t; int64_t delta; int64_t device; int level; int64_t rank; };
    std::vector<Ev> sweep;
    Stmt a(reader->handle(),
           std::string("SELECT id, rank, device_id, memory_kind, level, bytes, t_alloc, t_free, name_id, segment_id, "
                       "stack_id, ") + (reader->has_weights() ? "weight_bytes" : "NULL") +
               " FROM allocation WHERE NOT " + kModuleGlobalSql + " ORDER BY t_alloc, id");
    while (a.step()) {
      int64_t id = a.i64(0), rank = a.i64(1), dev = a.i64(2), bytes = a.i64(5), ta = a.i64(6);
      bool alive = a.is_null(7);
      const auto ended = alive ? process_end.find(rank) : process_end.end();
      const bool gone = ended != process_end.end() && ended->second >= ta;  // freed by its process's exit
      int64_t tf = !alive ? a.i64(7) : gone ? ended->second : t_end;
      int level = int(a.i64(4));
      const int64_t stack_id = a.is_null(10) ? 0 : a.i64(10);
      const std::string& stack = stack_arg(stack_id);
      std::string nm = name_of(a.is_null(8) ? 0 : a.i64(8), "");
      if (nm.empty()) nm = stack.empty() ? "allocation" : sites->site(stack_id, SiteLevel::Line);
      std::string common = "\"cat\":\"allocation\",\"id\":" + std::to_string(id) + ",\"pid\":" + std::to_string(rank) +
                           ",\"tid\":" + std::to_string(1000 + dev) + ",\"name\":" + q(nm);
      out.event(common + ",\"ph\":\"b\",\"ts\":" + us(ta, t0) + ",\"args\":{\"bytes\":" + std::to_string(bytes) +
                ",\"device\":" + q(label_of(dev)) + ",\"memory_kind\":" +
                q(std::string(to_string(MemoryKind(a.i64(3))))) + ",\"level\":" +
                q(std::string(to_string(AllocLevel(level)))) + ",\"alive_at_end\":" + (alive ? "true" : "false") +
                (a.is_null(11) ? std::string() : ",\"sampled_weight_bytes\":" + std::to_string(a.i64(11))) + stack + "}");
      out.event(common + ",\"ph\":\"e\",\"ts\":" + us(tf, t0));
      if (is_second_record(AllocLevel(level), a.is_null(9) ? 0 : a.i64(9))) continue;  // counted by its twin
      if (!a.is_null(11)) continue;  // a sampled row: exact counters leave it out (SCHEMA.md, "Sampled rows")
      sweep.push_back({ta, bytes, dev, level, rank});
      if (!alive || gone) sweep.push_back({tf, -bytes, dev, level, rank});
    }
    std::stable_sort(sweep.begin(), sweep.end(), [](const Ev& x, const Ev& y) {
      return x.t != y.t ? x.t < y.t : x.delta < y.delta;
    });
    std::map<int64_t, std::pair<int64_t, int64_t>> live;  // device -> (blocks, segments)
    for (auto& e : sweep) {
      auto& l = live[e.device];
      (e.level == int(AllocLevel::Segment) ? l.second : l.first) += e.delta;
      out.event("\"ph\":\"C\",\"name\":" + q("memory " + label_of(e.device)) + ",\"pid\":" + std::to_string(e.rank) +
                ",\"ts\":" + us(e.t, t0) + ",\"args\":{\"allocated\":" + std::to_string(l.first) +
                ",\"reserved\":" + std::to_string(l.second) + "}");
    }

    // The aggregates (db/SCHEMA.md, "Aggregates"), both layers kept: where the detail stopped, a
    // slice "aggregates only" to the end on each rank's markers and the reason; past it the same
    // memory counter goes on from step_memory (allocated, reserved at each step's end), with each
    // step's peaks beside it; the live set at each epoch boundary as an instant event (bytes by site).
    if (detail_end) {
      for (int64_t r : ranks)
        out.event("\"ph\":\"X\",\"cat\":\"aggregates\",\"name\":\"aggregates only (per step)\",\"pid\":" +
                  std::to_string(r) + ",\"tid\":1,\"ts\":" + us(*detail_end, t0) + ",\"dur\":" +
                  us(std::max(t_end, *detail_end), *detail_end) + ",\"args\":{\"detail_stopped\":" + q(detail_reason) +
                  "}");
      for (auto& sm : steps) {
        const int64_t end = sm.t_end.value_or(t_end);
        if (end <= *detail_end) continue;
        out.event("\"ph\":\"C\",\"name\":" + q("memory " + label_of(sm.device_id)) + ",\"pid\":" +
                  std::to_string(sm.rank) + ",\"ts\":" + us(end, t0) + ",\"args\":{\"allocated\":" +
                  std::to_string(sm.allocated_bytes) + ",\"reserved\":" + std::to_string(sm.reserved_bytes) + "}");
        out.event("\"ph\":\"C\",\"name\":" + q("step peak " + label_of(sm.device_id)) + ",\"pid\":" +
                  std::to_string(sm.rank) + ",\"ts\":" + us(sm.t_start, t0) + ",\"args\":{\"allocated\":" +
                  std::to_string(sm.peak_allocated_bytes) + ",\"reserved\":" + std::to_string(sm.peak_reserved_bytes) +
                  "}");
      }
    }
    {
      // (rank, epoch, at, device) -> site -> bytes
      std::map<std::tuple<int64_t, int64_t, int, int64_t>, std::pair<int64_t, std::map<std::string, int64_t>>> sets;
      for (auto& l : live_sets) {
        auto& e = sets[{l.rank, l.epoch, l.at, l.device_id}];
        e.first = l.t;
        e.second[l.name_id ? name_of(l.name_id, "?") : sites->site(l.stack_id, SiteLevel::Line)] += l.bytes;
      }
      for (auto& [key, e] : sets) {
        const auto& [rank, epoch, at, device] = key;
        int64_t total = 0;
        std::string by;
        for (auto& [site, bytes] : e.second) {
          total += bytes;
          by += (by.empty() ? "" : ",") + q(site) + ":" + std::to_string(bytes);
        }
        out.event("\"ph\":\"i\",\"s\":\"p\",\"cat\":\"aggregates\",\"name\":" +
                  q("live set " + label_of(device) + " at epoch " + std::to_string(epoch) + (at ? " end" : " start")) +
                  ",\"pid\":" + std::to_string(rank) + ",\"tid\":1,\"ts\":" + us(e.first, t0) +
                  ",\"args\":{\"bytes\":" + std::to_string(total) + ",\"by_site\":{" + by + "}}");
      }
    }

    Stmt tr(reader->handle(),
            "SELECT rank, kind, bytes, src_device_id, dst_device_id, pinned, t_start, t_end, name_id, op_id, stream,"
            " stack_id FROM transfer ORDER BY t_start, id");
    while (tr.step()) {
      TransferKind kind = TransferKind(tr.i64(1));
      std::string nm = std::string(to_string(kind));
      if (kind == TransferKind::Collective && !tr.is_null(9)) nm = name_of(tr.i64(9), "collective");
      std::string tensor = tr.is_null(8) ? "" : name_of(tr.i64(8), "");
      out.event("\"ph\":\"X\",\"cat\":\"transfer\",\"name\":" + q(tensor.empty() ? nm : nm + " " + tensor) +
                ",\"pid\":" + std::to_string(tr.i64(0)) + ",\"tid\":" + std::to_string(10 + int(kind)) +
                ",\"ts\":" + us(tr.i64(6), t0) + ",\"dur\":" + us(tr.i64(7), tr.i64(6)) + ",\"args\":{\"bytes\":" +
                std::to_string(tr.i64(2)) + ",\"src\":" + q(tr.is_null(3) ? "-" : label_of(tr.i64(3))) +
                ",\"dst\":" + q(tr.is_null(4) ? "-" : label_of(tr.i64(4))) + ",\"pinned\":" +
                (tr.is_null(5) ? "null" : (tr.i64(5) ? "true" : "false")) + stack_arg(tr.is_null(11) ? 0 : tr.i64(11)) +
                "}");
    }

    Stmt k(reader->handle(), "SELECT rank, device_id, name_id, t_start, t_end, stream FROM kernel ORDER BY t_start, id");
    while (k.step()) {
      out.event("\"ph\":\"X\",\"cat\":\"kernel\",\"name\":" + q(name_of(k.is_null(2) ? 0 : k.i64(2), "kernel")) +
                ",\"pid\":" + std::to_string(k.i64(0)) + ",\"tid\":" + std::to_string(100 + k.i64(1)) +
                ",\"ts\":" + us(k.i64(3), t0) + ",\"dur\":" + us(k.i64(4), k.i64(3)));
    }

    Stmt m(reader->handle(),
           "SELECT rank, kind, name_id, t_start, t_end, step, micro_step, epoch, value FROM marker ORDER BY t_start, id");
    while (m.step()) {
      int64_t ts = m.i64(3), te = m.is_null(4) ? t_end : m.i64(4);
      std::string args = "\"kind\":" + q(std::string(to_string(MarkerKind(m.i64(1)))));
      if (!m.is_null(5)) args += ",\"step\":" + std::to_string(m.i64(5));
      if (!m.is_null(6)) args += ",\"micro_step\":" + std::to_string(m.i64(6));
      if (!m.is_null(7)) args += ",\"epoch\":" + std::to_string(m.i64(7));
      if (!m.is_null(8)) args += ",\"value\":" + std::to_string(m.i64(8));
      if (m.is_null(4)) args += ",\"unfinished\":true";
      out.event("\"ph\":\"X\",\"cat\":\"marker\",\"name\":" + q(name_of(m.is_null(2) ? 0 : m.i64(2), "marker")) +
                ",\"pid\":" + std::to_string(m.i64(0)) + ",\"tid\":1,\"ts\":" + us(ts, t0) + ",\"dur\":" +
                us(te, ts) + ",\"args\":{" + args + "}");
    }

    Stmt c(reader->handle(), "SELECT rank, device_id, name_id, t, value FROM counter ORDER BY t, id");
    while (c.step()) {
      std::string nm = name_of(c.i64(2), "counter");
      if (!c.is_null(1)) nm += " " + label_of(c.i64(1));
      // NaN (stored as NULL) and infinities: JSON has no number for them.
      if (c.is_null(4) || !std::isfinite(c.f64(4))) continue;
      char val[64];
      std::snprintf(val, sizeof val, "%.17g", c.f64(4));
      out.event("\"ph\":\"C\",\"name\":" + q(nm) + ",\"pid\":" + std::to_string(c.i64(0)) + ",\"ts\":" +
                us(c.i64(3), t0) + ",\"args\":{\"value\":" + val + "}");
    }

    for (auto& fr : sum.faults)
      out.event("\"ph\":\"i\",\"s\":\"p\",\"cat\":\"fault\",\"name\":" + q("fault: " + fr.name) + ",\"pid\":" +
                std::to_string(fr.rank) + ",\"tid\":1,\"ts\":" + us(fr.t, t0) + ",\"args\":{\"trigger\":" +
                q(fr.trigger) + ",\"details\":" + q(fr.details) + "}");
    for (auto& er : sum.errors)
      out.event("\"ph\":\"i\",\"s\":\"p\",\"cat\":\"error\",\"name\":" + q("error: " + er.message) + ",\"pid\":" +
                std::to_string(er.rank) + ",\"tid\":1,\"ts\":" + us(er.t, t0) + ",\"args\":{\"kind\":" + q(er.kind) + ",\"site\":" + q(er.site) +
                ",\"tensors\":" + q(er.tensors) + "}");
  } catch (const SqlError& e) {
    f.close();
    ::unlink(tmp.c_str());
    return Status::Error(trace_path + ": export failed: " + e.what());
  }
  f << "\n]}\n";
  f.flush();
  if (!f) {
    f.close();
    ::unlink(tmp.c_str());
    return Status::Error(json_path + ": write failed (disk full?)");
  }
  int64_t bytes = static_cast<int64_t>(f.tellp());
  f.close();
  if (std::rename(tmp.c_str(), json_path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Status::Error(json_path + ": cannot move the export into place");
  }
  if (stats) *stats = {out.count, bytes};
  return Status::Ok();
}

}  // namespace zt::db
