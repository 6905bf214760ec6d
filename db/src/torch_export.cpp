// A trace's device memory -> a PyTorch memory snapshot (zt export --torch-snapshot): see
// zt/db/torch_snapshot.h. Written with our own pickle writer (protocol 2: dicts, lists, tuples,
// strings, ints, bools), which memory_viz's reader and Python's pickle.load both take.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <regex>
#include <set>
#include <unordered_map>

#include "sqlite.h"
#include "torch_model.h"
#include "zt/db/pickle.h"
#include "zt/db/torch_snapshot.h"
#include "zt/db/trace_reader.h"

namespace zt::db {
namespace {

using detail::Stmt;

struct Row {
  int64_t id = 0, rank = 0, device = 0;
  AllocLevel level = AllocLevel::Block;
  uint64_t address = 0;
  int64_t bytes = 0, requested = 0, t_alloc = 0;
  std::optional<int64_t> t_free;
  int64_t stack = 0, stream = 0, name = 0;
};

// One entry of a device's history, before it is written. Entries at the same time keep the
// allocator's order: frees of what began earlier, then segments, then allocations, then what
// began and ended in that same instant.
struct Entry {
  int64_t t = 0;
  int phase = 0;
  int64_t order = 0;  // the row's id
  const char* action = "";
  uint64_t addr = 0;
  int64_t size = 0, stream = 0, stack = 0, device_free = 0;
  int64_t rank = 0;  // whose run's clock anchor converts its time
  bool oom = false;
};

struct Anchor {
  int64_t t_start = 0, wall = 0;
};

class Exporter {
 public:
  Exporter(TraceReader& r, TorchExportStats& st) : r_(r), st_(st), w_(&out_) {}

  Status run(std::string* bytes) {
    sqlite3* db = r_.handle();
    std::vector<DeviceRow> devices;
    if (Status s = r_.read(&devices); !s) return s;
    std::vector<RunRow> runs;
    if (Status s = r_.read(&runs); !s) return s;
    std::vector<RankRow> ranks;
    if (Status s = r_.read(&ranks); !s) return s;
    for (auto& run : runs) run_anchor_[run.id] = Anchor{run.t_start, run.wall_start_unix_ns};
    for (auto& rk : ranks) rank_run_[rk.rank] = rk.run_id;
    if (!runs.empty()) default_anchor_ = run_anchor_[runs.front().id];

    // Accelerator devices -> snapshot device indexes: their ordinals when those are unique,
    // else in order.
    std::vector<const DeviceRow*> acc;
    for (auto& d : devices)
      if (d.kind == DeviceKind::Cuda || d.kind == DeviceKind::Sim) acc.push_back(&d);
    std::sort(acc.begin(), acc.end(), [](auto* a, auto* b) {
      return std::tie(a->rank, a->ordinal, a->id) < std::tie(b->rank, b->ordinal, b->id);
    });
    std::set<int64_t> ordinals;
    bool unique = true;
    for (auto* d : acc) unique = ordinals.insert(d->ordinal).second && unique && d->ordinal >= 0 && d->ordinal < 4096;
    for (size_t k = 0; k < acc.size(); ++k) {
      const int64_t idx = unique ? acc[k]->ordinal : int64_t(k);
      index_[acc[k]->id] = idx;
      if (!st_.device_map.empty()) st_.device_map += ", ";
      st_.device_map += acc[k]->label + " (rank " + std::to_string(acc[k]->rank) + ") -> device " + std::to_string(idx);
    }

    // The device memory: on a device with an allocator's own segments (the trainer's, PyTorch's),
    // those and every block; elsewhere whatever segments there are. Second records are skipped.
    std::set<int64_t> with_allocator;
    {
      Stmt q(db, "SELECT DISTINCT device_id FROM allocation WHERE level = 1 AND source IN (" +
                     std::string(kAllocatorSourcesSql) + ") AND memory_kind = 1");
      while (q.step()) with_allocator.insert(q.i64(0));
    }
    Stmt q(db,
           "SELECT id, rank, device_id, level, address, bytes, requested_bytes, t_alloc, t_free, stack_id, stream, "
           "source, name_id FROM allocation WHERE memory_kind = " + std::to_string(int(MemoryKind::Device)) +
               " AND NOT " + kSecondRecordSql + " ORDER BY id");
    std::map<int64_t, std::vector<Row>> segs, blocks;  // by snapshot device index
    while (q.step()) {
      auto it = index_.find(q.i64(2));
      if (it == index_.end()) continue;
      if (q.i64(4) < 0) {  // see TorchExportStats::left_out
        ++st_.left_out;
        continue;
      }
      Row row{q.i64(0), q.i64(1), it->second, AllocLevel(q.i64(3)), uint64_t(q.i64(4)), q.i64(5), q.i64(6),
              q.i64(7), q.opt(8), q.is_null(9) ? 0 : q.i64(9), q.is_null(10) ? 0 : q.i64(10),
              q.is_null(12) ? 0 : q.i64(12)};
      const Source src = Source(q.i64(11));
      if (row.level == AllocLevel::Segment) {
        if (with_allocator.count(q.i64(2)) && !is_allocator_source(src)) continue;
        segs[row.device].push_back(row);
      } else {
        blocks[row.device].push_back(row);
      }
    }
    std::vector<ErrorRow> errors;
    if (Status s = r_.read(&errors); !s) return s;
    std::map<int64_t, std::vector<const ErrorRow*>> ooms;
    for (auto& e : errors)
      if (e.kind == "oom")
        if (auto it = index_.find(e.device_id); it != index_.end()) ooms[it->second].push_back(&e);
    std::unordered_map<int64_t, std::string> names;
    if (Status s = r_.strings(&names); !s) return s;

    int64_t devices_n = 0;
    for (auto& [d, v] : segs) devices_n = std::max(devices_n, d + 1);
    for (auto& [d, v] : blocks) devices_n = std::max(devices_n, d + 1);
    for (auto& [d, v] : ooms) devices_n = std::max(devices_n, d + 1);
    st_.devices = int64_t(segs.size() > blocks.size() ? segs.size() : blocks.size());

    w_.begin_dict();
    // Segments alive at the end, each tiled with its live blocks (memory_viz walks them by size).
    w_.str("segments");
    w_.begin_list();
    for (auto& [d, list] : segs) {
      std::vector<const Row*> live_blocks;
      for (auto& b : blocks[d])
        if (!b.t_free) live_blocks.push_back(&b);
      std::sort(live_blocks.begin(), live_blocks.end(), [](auto* a, auto* b) { return a->address < b->address; });
      for (auto& s : list) {
        ++st_.segments;
        if (s.t_free) continue;
        write_segment(s, live_blocks, names);
      }
    }
    w_.end_list();
    w_.str("device_traces");
    w_.begin_list();
    for (int64_t d = 0; d < devices_n; ++d) {
      std::vector<Entry> entries;
      for (auto& s : segs[d]) add_row(s, entries);
      for (auto& b : blocks[d]) {
        ++st_.blocks;
        add_row(b, entries);
      }
      for (auto* e : ooms[d]) entries.push_back(oom_entry(*e, d));
      std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
        return std::tie(a.t, a.phase, a.order) < std::tie(b.t, b.phase, b.order);
      });
      w_.begin_list();
      for (auto& e : entries) write_entry(e);
      w_.end_list();
      st_.events += int64_t(entries.size());
    }
    w_.end_list();
    // A trace on the probe's CLOCK_MONOTONIC keeps it: the clock pair lets zt import put the
    // snapshot back on the same clock (memory_viz ignores the key).
    std::string clock;
    {
      Stmt c(db, "SELECT value FROM meta WHERE key = 'clock'");
      if (c.step()) clock = c.text(0);
    }
    if (clock.rfind("CLOCK_MONOTONIC", 0) == 0 && !runs.empty()) {
      const RunRow& run = runs.front();
      const int64_t end = run.t_end.value_or(run.t_start);
      w_.str("zerotrace");
      w_.begin_dict();
      w_.str("unix_ns");
      w_.integer(run.wall_start_unix_ns + (end - run.t_start));
      w_.str("monotonic_ns");
      w_.integer(end);
      w_.str("pid");
      w_.integer(run.pid);
      w_.end_dict();
    }
    w_.end_dict();
    w_.stop();
    *bytes = std::move(out_);
    return Status::Ok();
  }

 private:
  int64_t unix_us(int64_t rank, int64_t t) const {
    Anchor a = default_anchor_;
    if (auto it = rank_run_.find(rank); it != rank_run_.end())
      if (auto jt = run_anchor_.find(it->second); jt != run_anchor_.end()) a = jt->second;
    const int64_t ns = t - a.t_start + a.wall;
    return ns >= 0 ? ns / 1000 : -((-ns + 999) / 1000);
  }

  void add_row(const Row& r, std::vector<Entry>& out) {
    const bool seg = r.level == AllocLevel::Segment;
    Entry a;
    a.t = r.t_alloc;
    a.phase = seg ? 2 : 3;
    a.order = r.id;
    a.action = seg ? "segment_alloc" : "alloc";
    a.addr = r.address;
    a.size = seg ? r.bytes : (r.requested > 0 ? r.requested : r.bytes);
    a.stream = r.stream;
    a.stack = r.stack;
    a.rank = r.rank;
    out.push_back(a);
    if (!r.t_free) return;
    Entry f = a;
    f.t = *r.t_free;
    const bool instant = *r.t_free == r.t_alloc;
    if (seg) {
      f.phase = instant ? 6 : 1;
      f.action = "segment_free";
      out.push_back(f);
    } else {
      f.phase = instant ? 4 : 0;
      f.action = "free_requested";
      out.push_back(f);
      f.action = "free_completed";
      out.push_back(f);
    }
  }

  // The figures an imported oom row carries in its message ("(20971520 bytes)", "had ... (N bytes)
  // free"); 0 where a message has none (our trainer's own words say them otherwise).
  Entry oom_entry(const ErrorRow& e, int64_t) {
    Entry x;
    x.t = e.t;
    x.phase = 7;
    x.order = e.id;
    x.action = "oom";
    x.oom = true;
    static const std::regex bytes_re(R"(\((\d{1,18}) bytes\))");  // 18 digits: an int64
    std::vector<int64_t> figures;
    for (std::sregex_iterator it(e.message.begin(), e.message.end(), bytes_re), end; it != end; ++it)
      figures.push_back(std::stoll((*it)[1].str()));
    if (!figures.empty()) x.size = figures[0];
    if (figures.size() > 1) x.device_free = figures[1];
    x.stack = 0;
    x.rank = e.rank;
    return x;
  }

  void write_frames(int64_t stack_id) {
    if (stack_id == 0) {
      if (empty_frames_ == UINT32_MAX) {
        w_.begin_list();
        empty_frames_ = w_.remember();
        w_.end_list();
      } else {
        w_.recall(empty_frames_);
      }
      return;
    }
    if (auto it = stack_memo_.find(stack_id); it != stack_memo_.end()) {
      w_.recall(it->second);
      return;
    }
    w_.begin_list();
    stack_memo_[stack_id] = w_.remember();
    std::vector<FrameRow> frames;
    if (Status st = r_.stack_frames(stack_id, &frames); !st) throw detail::SqlError(0, st.message());
    for (const FrameRow& f : frames) {
      std::string symbol = f.symbol;
      w_.begin_dict();
      w_.str("filename");
      w_.str(f.module.empty() ? "??" : f.module);
      w_.str("line");
      w_.integer(f.python() ? *f.line : 0);
      w_.str("name");
      if (symbol.empty()) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(f.ip));
        symbol = buf;
      }
      w_.str(symbol);
      w_.end_dict();
    }
    w_.end_list();
  }

  void write_entry(const Entry& e) {
    w_.begin_dict();
    w_.str("action");
    w_.str(e.action);
    if (e.oom) {
      w_.str("device_free");
      w_.integer(e.device_free);
    } else {
      w_.str("addr");
      w_.integer(int64_t(e.addr));
    }
    w_.str("size");
    w_.integer(e.size);
    w_.str("stream");
    w_.integer(e.stream);
    w_.str("time_us");
    w_.integer(unix_us(e.rank, e.t));
    w_.str("frames");
    write_frames(e.stack);
    w_.end_dict();
  }

  void write_segment(const Row& s, const std::vector<const Row*>& live_blocks,
                     const std::unordered_map<int64_t, std::string>& names) {
    const uint64_t end = s.address + uint64_t(s.bytes);
    std::vector<const Row*> inside;
    for (auto it = std::lower_bound(live_blocks.begin(), live_blocks.end(), s.address,
                                    [](const Row* r, uint64_t a) { return r->address < a; });
         it != live_blocks.end() && (*it)->address < end; ++it)
      inside.push_back(*it);
    int64_t allocated = 0, requested = 0;
    for (auto* b : inside) allocated += b->bytes, requested += b->requested;
    auto nm = names.find(s.name);
    const bool expandable = nm != names.end() && nm->second.find("expandable") != std::string::npos;
    w_.begin_dict();
    w_.str("device");
    w_.integer(s.device);
    w_.str("address");
    w_.integer(int64_t(s.address));
    w_.str("total_size");
    w_.integer(s.bytes);
    w_.str("allocated_size");
    w_.integer(allocated);
    w_.str("active_size");
    w_.integer(allocated);
    w_.str("requested_size");
    w_.integer(requested);
    w_.str("stream");
    w_.integer(s.stream);
    w_.str("segment_type");
    w_.str(s.bytes == detail::kTorchSmallBuffer && !expandable ? "small" : "large");
    w_.str("segment_pool_id");
    w_.begin_tuple();
    w_.integer(0);
    w_.integer(0);
    w_.end_tuple();
    w_.str("is_expandable");
    w_.boolean(expandable);
    w_.str("frames");
    write_frames(s.stack);
    w_.str("blocks");
    w_.begin_list();
    uint64_t at = s.address;
    auto gap = [&](uint64_t to) {
      if (to <= at) return;
      w_.begin_dict();
      w_.str("address");
      w_.integer(int64_t(at));
      w_.str("size");
      w_.integer(int64_t(to - at));
      w_.str("requested_size");
      w_.integer(0);
      w_.str("state");
      w_.str("inactive");
      w_.str("frames");
      write_frames(0);
      w_.end_dict();
      at = to;
    };
    for (auto* b : inside) {
      if (b->address < at || b->address + uint64_t(b->bytes) > end) continue;  // overlaps: not tiled
      gap(b->address);
      w_.begin_dict();
      w_.str("address");
      w_.integer(int64_t(b->address));
      w_.str("size");
      w_.integer(b->bytes);
      w_.str("requested_size");
      w_.integer(b->requested > 0 ? b->requested : b->bytes);
      w_.str("state");
      w_.str("active_allocated");
      w_.str("frames");
      write_frames(b->stack);
      w_.end_dict();
      at = b->address + uint64_t(b->bytes);
    }
    gap(end);
    w_.end_list();
    w_.end_dict();
  }

  TraceReader& r_;
  TorchExportStats& st_;
  std::string out_;
  pickle::Writer w_;
  std::unordered_map<int64_t, int64_t> index_;  // device row id -> snapshot device index
  std::unordered_map<int64_t, Anchor> run_anchor_;
  std::unordered_map<int64_t, int64_t> rank_run_;
  Anchor default_anchor_;
  std::unordered_map<int64_t, uint32_t> stack_memo_;
  uint32_t empty_frames_ = UINT32_MAX;
};

}  // namespace

Status export_torch_snapshot(const std::string& trace_path, const std::string& pickle_path, TorchExportStats* stats) {
  TorchExportStats local;
  TorchExportStats& st = stats ? *stats : local;
  st = TorchExportStats();
  std::unique_ptr<TraceReader> r;
  if (Status s = TraceReader::open(trace_path, &r); !s) return s;
  std::string bytes;
  try {
    Exporter ex(*r, st);
    if (Status s = ex.run(&bytes); !s) return s;
  } catch (const detail::SqlError& e) {
    return Status::Error(trace_path + ": reading the trace failed: " + e.what());
  }
  const std::string tmp = pickle_path + ".writing";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return Status::Error(pickle_path + ": cannot write: " + std::strerror(errno));
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed || std::rename(tmp.c_str(), pickle_path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return Status::Error(pickle_path + ": cannot write: " + std::strerror(err));
  }
  st.bytes = int64_t(bytes.size());
  return Status::Ok();
}

}  // namespace zt::db
