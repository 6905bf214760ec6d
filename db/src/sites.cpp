// Allocation sites and what they hold (see zt/db/sites.h for the rules).
#include "zt/db/sites.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "sqlite.h"
#include "zt/common/units.h"
#include "zt/db/schema.h"
#include "zt/db/trace_reader.h"

namespace zt::db {
using detail::SqlError;
using detail::Stmt;

namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// The allocator's own frames, passed over when a native frame must stand for the site. A name
// ending in '_' or ':' is a prefix; any other is the function's whole name (a C++ one followed by
// its parameters or template arguments).
constexpr const char* kAllocatorFunctions[] = {
    "malloc", "calloc", "realloc", "reallocarray", "free", "posix_memalign", "aligned_alloc", "memalign", "valloc",
    "pvalloc", "mmap", "mmap64", "__mmap", "_int_malloc", "_int_realloc", "tcache_", "sysmalloc", "__libc_",
    "operator new", "operator new[]", "std::allocator", "std::__new_allocator", "__gnu_cxx::new_allocator",
    "std::allocator_traits", "cudaMalloc", "cudaMallocHost", "cudaMallocManaged", "cudaMallocAsync",
    "cudaMallocFromPoolAsync", "cudaMallocPitch", "cudaMalloc3D", "cudaHostAlloc", "cudaMemcpy", "cudaMemcpyAsync",
    "cudaMemcpy2D", "cudaMemcpy2DAsync", "cudaMemcpyPeer", "cudaMemcpyPeerAsync", "cudaMemset", "cudaMemsetAsync",
    "cuMem", "PyMem_", "_PyMem_", "PyObject_Malloc", "PyObject_Calloc", "PyObject_Realloc", "_PyObject_Malloc",
    "_PyObject_Calloc", "_PyObject_Realloc", "_PyObject_ArenaMmap", "_PyObject_VirtualAlloc", "new_arena",
    "allocate_from_new_pool", "pymalloc_alloc", "zt::probe::"};

bool allocator_frame(const FrameRow& f) {
  if (f.module.find("libzt_probe") != std::string::npos) return true;
  const std::string& s = f.symbol;
  for (const char* name : kAllocatorFunctions) {
    const std::string_view n(name);
    if (s.compare(0, n.size(), n) != 0) continue;
    if (n.back() == '_' || n.back() == ':' || s.size() == n.size()) return true;
    const char next = s[n.size()];
    if (next == '(' || next == '<' || next == '@' || next == '.') return true;
  }
  return false;
}

}  // namespace

std::optional<SiteLevel> parse_site_level(std::string_view word) {
  if (word == "line") return SiteLevel::Line;
  if (word == "function") return SiteLevel::Function;
  if (word == "module") return SiteLevel::Module;
  return std::nullopt;
}

const char* to_string(SiteLevel level) {
  switch (level) {
    case SiteLevel::Line: return "line";
    case SiteLevel::Function: return "function";
    case SiteLevel::Module: return "module";
  }
  return "?";
}

Status StackSites::load(TraceReader& reader, std::unique_ptr<StackSites>* out) {
  auto s = std::unique_ptr<StackSites>(new StackSites());
  std::vector<FrameRow> frames;
  if (Status st = reader.read(&frames); !st) return st;
  for (auto& f : frames) s->frames_.emplace(f.id, std::move(f));
  std::vector<StackRow> stacks;
  if (Status st = reader.read(&stacks); !st) return st;
  for (auto& n : stacks) s->stacks_.emplace(n.id, std::make_pair(n.parent_id, n.frame_id));
  *out = std::move(s);
  return Status::Ok();
}

namespace {
bool has(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// "/usr/lib/python3.11/json/encoder.py" -> the position after "python3.11/", else npos.
size_t stdlib_tail(std::string_view file) {
  for (size_t at = file.find("/lib"); at != std::string_view::npos; at = file.find("/lib", at + 1)) {
    size_t p = at + 4;
    if (file.compare(p, 2, "64") == 0) p += 2;
    if (file.compare(p, 8, "/python3") != 0 && file.compare(p, 8, "/python2") != 0) continue;
    p += 8;
    while (p < file.size() && ((file[p] >= '0' && file[p] <= '9') || file[p] == '.')) ++p;
    if (p < file.size() && file[p] == '/') return p + 1;
  }
  return std::string_view::npos;
}

// The position after "site-packages/" or "dist-packages/", else npos.
size_t package_tail(std::string_view file) {
  for (std::string_view dir : {"/site-packages/", "/dist-packages/"})
    if (size_t at = file.rfind(dir); at != std::string_view::npos) return at + dir.size();
  return std::string_view::npos;
}

bool own_python_package(std::string_view file) {
  return has(file, "/python/zerotrace/") || has(file, "/python/zt_bootstrap/");
}

// A native frame of an installed package's extension module (numpy's _multiarray_umath...).
bool package_native_frame(const FrameRow& f) { return !f.python() && package_tail(f.module) != std::string_view::npos; }
}  // namespace

bool user_frame(const FrameRow& f) {
  if (!f.python()) return false;
  std::string_view file(f.module);
  // "<frozen importlib._bootstrap>", and "<string>": code that exec() compiled, which is mostly a
  // library's (dataclasses', namedtuple's, a .pth line run by site.py).
  if (file.empty() || file.front() == '<') return false;
  return package_tail(file) == std::string_view::npos && stdlib_tail(file) == std::string_view::npos &&
         !own_python_package(file);
}

std::string via_text(const FrameRow& f) {
  std::string_view file(f.module);
  std::string package;
  if (own_python_package(file)) {
    package = "zerotrace";
  } else if (file.compare(0, 8, "<frozen ") == 0 && file.back() == '>') {
    package = std::string(file.substr(8, file.size() - 9));
  } else {
    size_t tail = package_tail(file);
    if (tail == std::string_view::npos) tail = stdlib_tail(file);
    std::string_view rest = tail == std::string_view::npos ? file.substr(file.rfind('/') + 1) : file.substr(tail);
    rest = rest.substr(0, rest.find('/'));
    for (std::string_view ext : {".py", ".so"})
      if (size_t e = rest.find(ext); e != std::string_view::npos && e > 0) rest = rest.substr(0, e);
    if (size_t dot = rest.find(".cpython"); dot != std::string_view::npos && dot > 0) rest = rest.substr(0, dot);
    package = std::string(rest);
  }
  std::string function = f.symbol;
  if (!f.python()) function = function.substr(0, function.find('('));  // a C++ function's parameters
  if (function.empty()) return package;
  return package.empty() ? function : package + " " + function;
}

const StackSites::Site& StackSites::site_of(int64_t stack_id) const {
  auto [cached, fresh] = site_of_.try_emplace(stack_id);
  if (!fresh || stack_id == 0) return cached->second;
  int64_t native = 0, python = 0, library = 0, package_native = 0;
  int64_t node = stack_id;
  for (int depth = 0; node != 0 && depth < 1024; ++depth) {
    auto it = stacks_.find(node);
    if (it == stacks_.end()) break;
    auto f = frames_.find(it->second.second);
    if (f != frames_.end()) {
      const FrameRow& fr = f->second;
      if (fr.python()) {
        if (python == 0) python = f->first;
        if (user_frame(fr)) {
          cached->second = {f->first, library ? library : package_native};
          return cached->second;
        }
        if (library == 0) library = f->first;
      } else if (!allocator_frame(fr)) {
        if (native == 0) native = f->first;
        if (package_native == 0 && python == 0 && package_native_frame(fr)) package_native = f->first;
      }
    }
    node = it->second.first;
  }
  cached->second = {python ? python : native, 0};
  return cached->second;
}

const FrameRow* StackSites::site_frame(int64_t stack_id) const {
  const int64_t id = site_of(stack_id).frame;
  if (id == 0) return nullptr;
  auto f = frames_.find(id);
  return f == frames_.end() ? nullptr : &f->second;
}

const FrameRow* StackSites::via_frame(int64_t stack_id) const {
  const int64_t id = site_of(stack_id).via;
  if (id == 0) return nullptr;
  auto f = frames_.find(id);
  return f == frames_.end() ? nullptr : &f->second;
}

std::string StackSites::site(int64_t stack_id, SiteLevel level) const {
  const FrameRow* f = site_frame(stack_id);
  if (!f) return "(no stack)";
  const std::string module = f->module.empty() ? "?" : f->module;
  const FrameRow* via = level == SiteLevel::Module ? nullptr : via_frame(stack_id);
  const std::string beside = via ? " via " + via_text(*via) : std::string();
  switch (level) {
    case SiteLevel::Line: return frame_text(*f) + beside;
    case SiteLevel::Function: return (f->symbol.empty() ? "?" : f->symbol) + " (" + module + ")" + beside;
    case SiteLevel::Module: return module;
  }
  return module;
}

namespace {

struct Alloc {
  int64_t bytes, t_alloc, t_free, stack;
  bool block;
  int64_t weight;  // the bytes it counts for: `bytes`, or a sampled row's weight
  bool alive_at(int64_t t) const { return t_alloc <= t && t < t_free; }
};

struct Epoch {
  int64_t epoch, t_end;
};

// The moment a device's counted memory was highest (the first time it got there) and how high.
std::pair<int64_t, int64_t> peak_of(const std::vector<const Alloc*>& rows) {
  std::vector<std::pair<int64_t, int64_t>> ev;  // (t, +bytes / -bytes); frees first at equal t
  ev.reserve(rows.size() * 2);
  for (const Alloc* a : rows) {
    ev.emplace_back(a->t_alloc, a->weight);
    if (a->t_free != kNever) ev.emplace_back(a->t_free, -a->weight);
  }
  std::sort(ev.begin(), ev.end());
  int64_t live = 0, best = -1, best_t = 0;
  for (size_t i = 0; i < ev.size();) {
    const int64_t t = ev[i].first;
    for (; i < ev.size() && ev[i].first == t; ++i) live += ev[i].second;
    if (live > best) best = live, best_t = t;
  }
  return {best_t, std::max<int64_t>(best, 0)};
}

}  // namespace

namespace {

// zt db top from epoch_live (a capped trace): the live set at each epoch's end (--per-epoch), or
// at the last boundary kept at or before the moment (--at end, --at TIME), grouped by site as the
// allocation rows are (tensor blocks where the device has any, else segments).
Status top_from_aggregates(const std::vector<DeviceRow>& devices, const std::vector<EpochLiveRow>& live,
                           const StackSites& sites, const TopOptions& o, int64_t t_first, const std::string& stopped,
                           std::vector<DeviceTop>* out) {
  for (auto& dev : devices) {
    if (!o.device.empty() && dev.label != o.device) continue;
    std::vector<const EpochLiveRow*> rows;
    for (auto& r : live)
      if (r.device_id == dev.id) rows.push_back(&r);
    if (rows.empty()) continue;
    DeviceTop d;
    d.rank = dev.rank;
    d.device = dev;
    for (auto* r : rows) d.blocks = d.blocks || r->level == AllocLevel::Block;
    // The boundaries looked at: (epoch, at, t), by time.
    std::vector<std::tuple<int64_t, int, int64_t>> points;
    std::set<std::pair<int64_t, int>> seen;
    for (auto* r : rows)
      if (seen.insert({r->epoch, r->at}).second) points.emplace_back(r->epoch, r->at, r->t);
    std::sort(points.begin(), points.end(), [](auto& a, auto& b) { return std::get<2>(a) < std::get<2>(b); });
    if (o.when == TopWhen::Epochs) {
      points.erase(std::remove_if(points.begin(), points.end(), [](auto& p) { return std::get<1>(p) != 1; }),
                   points.end());
    } else {
      const int64_t until = o.when == TopWhen::Time ? t_first + o.t_ns : kNever;
      while (!points.empty() && std::get<2>(points.back()) > until) points.pop_back();
      if (!points.empty()) points.erase(points.begin(), points.end() - 1);
    }
    if (points.empty()) {
      d.note = o.when == TopWhen::Epochs ? "rank " + std::to_string(dev.rank) + " has no ended epoch in the aggregates"
                                         : "no epoch boundary kept in the aggregates before that time";
      d.source = stopped;
      out->push_back(std::move(d));
      continue;
    }
    const size_t n = points.size();
    std::map<std::pair<int64_t, int>, size_t> index;
    for (size_t i = 0; i < n; ++i) {
      index[{std::get<0>(points[i]), std::get<1>(points[i])}] = i;
      if (o.when == TopWhen::Epochs) d.epochs.push_back(std::get<0>(points[i]));
    }
    d.totals.assign(n, 0);
    std::map<std::string, SiteBytes> by_site;
    std::map<std::string, double> variance;
    for (auto* r : rows) {
      if ((r->level == AllocLevel::Block) != d.blocks) continue;
      auto it = index.find({r->epoch, r->at});
      if (it == index.end()) continue;
      const std::string site = sites.site(r->stack_id, o.by);
      SiteBytes& s = by_site[site];
      if (s.series.empty()) s.site = site, s.series.assign(n, 0);
      s.series[it->second] += r->bytes;
      d.totals[it->second] += r->bytes;
      if (it->second == n - 1) {
        s.allocations += r->allocations;
        s.sampled += r->sampled;
        variance[site] += r->sampled_variance;
      }
    }
    const size_t from = n >= 3 ? 1 : 0;
    std::vector<SiteBytes> all;
    for (auto& [k, s] : by_site) {
      s.bytes = s.series[n - 1];
      s.stderr_bytes = std::sqrt(variance[k]);
      if (n - 1 > from) s.grew_per_epoch = double(s.series[n - 1] - s.series[from]) / double(n - 1 - from);
      if (o.when != TopWhen::Epochs) s.series.clear();
      if (s.bytes > 0 || s.grew_per_epoch != 0) all.push_back(std::move(s));
    }
    std::stable_sort(all.begin(), all.end(), [&](const SiteBytes& x, const SiteBytes& y) {
      if (o.when == TopWhen::Epochs && x.grew_per_epoch != y.grew_per_epoch) return x.grew_per_epoch > y.grew_per_epoch;
      return x.bytes > y.bytes;
    });
    d.total = d.totals[n - 1];
    for (auto& s : all) d.sites += s.bytes > 0;
    if (all.size() > o.top) {
      for (size_t i = o.top; i < all.size(); ++i) d.other_bytes += all[i].bytes;
      all.resize(o.top);
    }
    d.top = std::move(all);
    const auto& [epoch, at, t] = points[n - 1];
    d.t = t - t_first;
    if (o.when != TopWhen::Epochs) d.totals.clear();
    d.source = "from the aggregates (epoch_live): " + stopped +
               (o.when == TopWhen::Epochs ? std::string("; live sets at each epoch's end")
                                          : "; the live set at epoch " + std::to_string(epoch) + "'s " +
                                                (at == 1 ? "end" : "start") + ", the last the aggregates keep" +
                                                (o.when == TopWhen::Time ? " at or before that time" : ""));
    out->push_back(std::move(d));
  }
  return Status::Ok();
}

}  // namespace

Status top_sites(TraceReader& reader, const TopOptions& o, std::vector<DeviceTop>* out) {
  out->clear();
  std::vector<DeviceRow> devices;
  if (Status s = reader.read(&devices); !s) return s;
  if (!o.device.empty()) {
    std::set<std::string> labels;
    bool found = false;
    for (auto& d : devices) labels.insert(d.label), found = found || d.label == o.device;
    if (!found) {
      std::string have;
      for (auto& l : labels) have += (have.empty() ? "" : ", ") + l;
      return Status::Error(reader.path() + ": no device '" + o.device + "' in this trace (it has " +
                           (have.empty() ? std::string("none") : have) + ")");
    }
  }
  std::unique_ptr<StackSites> sites;
  if (Status s = StackSites::load(reader, &sites); !s) return s;
  std::vector<RunRow> runs;
  if (Status s = reader.read(&runs); !s) return s;

  std::map<int64_t, std::vector<Alloc>> by_device;
  std::map<int64_t, std::vector<Epoch>> epochs;  // rank -> ended epochs, by time
  int64_t t_first = kNever, t_last = 0;
  for (auto& r : runs) {
    t_first = std::min(t_first, r.t_start);
    if (r.t_end) t_last = std::max(t_last, *r.t_end);
  }
  try {
    Stmt a(reader.handle(), std::string("SELECT device_id, level, bytes, t_alloc, t_free, stack_id, ") +
                                reader.counted_bytes_sql() + " FROM allocation WHERE NOT " + kSecondRecordSql);
    while (a.step()) {
      Alloc x{a.i64(2), a.i64(3), a.is_null(4) ? kNever : a.i64(4), a.is_null(5) ? 0 : a.i64(5),
              AllocLevel(a.i64(1)) == AllocLevel::Block, std::max(a.i64(6), a.i64(2))};
      t_first = std::min(t_first, x.t_alloc);
      t_last = std::max({t_last, x.t_alloc, x.t_free == kNever ? 0 : x.t_free});
      by_device[a.i64(0)].push_back(x);
    }
    if (o.when == TopWhen::Epochs) {
      Stmt m(reader.handle(), "SELECT rank, epoch, t_start, t_end FROM marker WHERE kind = " +
                                  std::to_string(int(MarkerKind::Epoch)) + " AND t_end IS NOT NULL ORDER BY t_end");
      while (m.step()) epochs[m.i64(0)].push_back({m.is_null(1) ? int64_t(epochs[m.i64(0)].size()) : m.i64(1), m.i64(3)});
    }
  } catch (const SqlError& e) {
    return Status::Error(reader.path() + ": reading allocations failed: " + e.what());
  }
  if (t_first == kNever) t_first = 0;

  // A capped trace (db/SCHEMA.md, "Aggregates"): past the detail's end the allocation rows are
  // gone (and rows made before it and freed after it read as never freed), so what is held at an
  // epoch's end, at the end, or at a time past the detail comes from epoch_live's live sets.
  std::vector<DetailSpanRow> spans;
  if (Status s = reader.read(&spans); !s) return s;
  std::optional<int64_t> detail_end;
  std::string detail_reason;
  for (auto& sp : spans)
    if (sp.t_end && (!detail_end || *sp.t_end < *detail_end)) detail_end = sp.t_end, detail_reason = sp.end_reason;
  if (detail_end) {
    std::vector<EpochLiveRow> live;
    if (Status s = reader.read(&live); !s) return s;
    const bool past = o.when == TopWhen::Epochs || o.when == TopWhen::End ||
                      (o.when == TopWhen::Time && t_first + o.t_ns > *detail_end);
    const std::string stopped = "the detail stopped at " + format_duration_ns(double(*detail_end - t_first)) +
                                (detail_reason.empty() ? std::string() : " (" + detail_reason + ")");
    if (past && !live.empty())
      return top_from_aggregates(devices, live, *sites, o, t_first, stopped, out);
    std::vector<StepMemoryRow> steps;
    if (Status s = reader.read(&steps); !s) return s;
    for (auto& dev : devices) {
      if (!o.device.empty() && dev.label != o.device) continue;
      if (!by_device.count(dev.id)) continue;
      DeviceTop d;
      d.rank = dev.rank;
      d.device = dev;
      d.source = stopped + (past ? "; no epoch live sets were kept, so this is what the detail holds" : "");
      if (o.when == TopWhen::Peak) {
        const StepMemoryRow* best = nullptr;
        for (auto& sm : steps)
          if (sm.device_id == dev.id && (!best || sm.peak_reserved_bytes > best->peak_reserved_bytes)) best = &sm;
        if (best && best->t_start >= *detail_end)
          d.source += "; the run's peak is past it (" + format_bytes(double(best->peak_reserved_bytes)) +
                      " reserved in step " + (best->step ? std::to_string(*best->step) : std::string("?")) +
                      ", step_memory), its sites are not known: the detail's peak is shown";
      }
      out->push_back(std::move(d));
    }
  }

  for (auto& dev : devices) {
    if (!o.device.empty() && dev.label != o.device) continue;
    auto it = by_device.find(dev.id);
    if (it == by_device.end()) continue;
    DeviceTop d;
    d.rank = dev.rank;
    d.device = dev;
    for (auto& a : it->second) d.blocks = d.blocks || a.block;
    std::vector<const Alloc*> rows;
    for (auto& a : it->second)
      if (a.block == d.blocks) rows.push_back(&a);

    std::vector<int64_t> points;  // the moments looked at (one, or each epoch's end)
    switch (o.when) {
      case TopWhen::Peak: points = {peak_of(rows).first}; break;
      case TopWhen::End: points = {kNever - 1}; break;  // only what was never freed
      case TopWhen::Time: points = {t_first + o.t_ns}; break;
      case TopWhen::Epochs:
        for (auto& e : epochs[dev.rank]) {
          points.push_back(e.t_end);
          d.epochs.push_back(e.epoch);
        }
        break;
    }
    if (points.empty()) {
      d.note = "rank " + std::to_string(dev.rank) + " has no ended epoch markers";
      out->push_back(std::move(d));
      continue;
    }
    const size_t n = points.size();
    d.totals.assign(n, 0);
    std::map<std::string, SiteBytes> by_site;
    std::unordered_map<int64_t, std::string> text;  // stack -> site
    for (const Alloc* a : rows) {
      bool any = false;
      for (size_t i = 0; i < n && !any; ++i) any = a->alive_at(points[i]);
      if (!any) continue;
      auto [t, fresh] = text.try_emplace(a->stack);
      if (fresh) t->second = sites->site(a->stack, o.by);
      SiteBytes& s = by_site[t->second];
      if (s.series.empty()) s.site = t->second, s.series.assign(n, 0);
      for (size_t i = 0; i < n; ++i)
        if (a->alive_at(points[i])) s.series[i] += a->weight, d.totals[i] += a->weight;
      if (a->alive_at(points[n - 1])) {
        ++s.allocations;
        if (a->weight != a->bytes) ++s.sampled, s.stderr_bytes += sampled_variance(a->bytes, a->weight);
      }
    }
    // Growth per epoch: the first epoch is warm-up when there are three or more (as zt check --leaks).
    const size_t from = n >= 3 ? 1 : 0;
    std::vector<SiteBytes> all;
    for (auto& [k, s] : by_site) {
      s.bytes = s.series[n - 1];
      s.stderr_bytes = std::sqrt(s.stderr_bytes);  // summed as a variance above
      if (n - 1 > from) s.grew_per_epoch = double(s.series[n - 1] - s.series[from]) / double(n - 1 - from);
      if (o.when != TopWhen::Epochs) s.series.clear();
      if (s.bytes > 0 || s.grew_per_epoch != 0) all.push_back(std::move(s));
    }
    std::stable_sort(all.begin(), all.end(), [&](const SiteBytes& x, const SiteBytes& y) {
      if (o.when == TopWhen::Epochs && x.grew_per_epoch != y.grew_per_epoch) return x.grew_per_epoch > y.grew_per_epoch;
      return x.bytes > y.bytes;
    });
    d.total = d.totals[n - 1];
    d.sites = 0;
    for (auto& s : all) d.sites += s.bytes > 0;
    if (all.size() > o.top) {
      for (size_t i = o.top; i < all.size(); ++i) d.other_bytes += all[i].bytes;
      all.resize(o.top);
    }
    d.top = std::move(all);
    d.t = (o.when == TopWhen::End ? t_last : points[n - 1]) - t_first;
    if (o.when != TopWhen::Epochs) d.totals.clear();
    // A capped trace: the line that says where the figures stop, found by device.
    for (auto it = out->begin(); it != out->end(); ++it)
      if (it->device.id == d.device.id && it->top.empty() && it->note.empty() && !it->source.empty()) {
        d.source = it->source;
        out->erase(it);
        break;
      }
    out->push_back(std::move(d));
  }
  return Status::Ok();
}

}  // namespace zt::db
