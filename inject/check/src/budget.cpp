// --budget cuda=70GiB,host=900GiB: peak allocated bytes per accelerator device and per host
// machine against the budget. The rules and their reasons are in inject/check/README.md.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <tuple>

#include "trace_data.h"
#include "zt/common/units.h"
#include "zt/db/trace_values.h"

namespace zt::check {

Status parse_budget(const std::string& text, Budget* out) {
  *out = Budget{};
  auto bad = [](const std::string& item, const std::string& why) {
    return Status::Error("--budget: '" + item + "': " + why);
  };
  auto trim = [](std::string s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    size_t i = 0;
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    return s.substr(i);
  };
  if (trim(text).empty()) return Status::Error("--budget: empty; give KEY=SIZE items, e.g. cuda=70GiB,host=900GiB");
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = trim(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    start = comma == std::string::npos ? text.size() + 1 : comma + 1;
    if (item.empty()) return bad(item, "empty item (items are KEY=SIZE separated by commas)");
    size_t eq = item.find('=');
    if (eq == std::string::npos) return bad(item, "not KEY=SIZE (e.g. cuda=70GiB)");
    std::string key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
    for (char& c : key) c = char(std::tolower(static_cast<unsigned char>(c)));
    std::optional<int64_t>* slot = nullptr;
    if (key == "cuda" || key == "gpu") slot = &out->cuda;
    else if (key == "host" || key == "cpu") slot = &out->host;
    else return bad(item, "unknown key '" + key + "' (cuda or host)");
    if (*slot) return bad(item, "'" + key + "' given twice");
    std::string why;
    auto b = parse_size_i64(value, &why);
    if (!b || value.empty()) return bad(item, "'" + value + "' " + why + " (try 70GiB)");
    *slot = *b;
  }
  return Status::Ok();
}

namespace detail {

namespace {

struct Peak {
  int64_t bytes = 0;
  int64_t t = 0;
};

// The highest sum of live bytes (alive = t_alloc <= t < t_free) and when it was first reached.
// Memory never freed goes with its process: it counts until the end of the rank's run where that
// run ended (a merged trace of processes run one after another on one host must not add up an
// exited child's memory with the next one's), and to the end of the trace where it did not.
Peak sweep(const std::vector<const Alloc*>& rows, const TraceData& d) {
  std::map<int64_t, int64_t> run_end;  // rank -> its run's end, or kNever
  auto end_of = [&](int64_t rank) {
    auto it = run_end.find(rank);
    if (it != run_end.end()) return it->second;
    const db::RunRow* run = d.run_of(rank);
    return run_end[rank] = run && run->t_end ? *run->t_end : kNever;
  };
  std::vector<std::pair<int64_t, int64_t>> ev;  // (t, delta); frees sort before allocations at one t
  ev.reserve(rows.size() * 2);
  for (const Alloc* a : rows) {
    ev.emplace_back(a->t_alloc, a->bytes);
    const int64_t t_free = a->t_free != kNever ? a->t_free : end_of(a->rank);
    if (t_free != kNever && t_free >= a->t_alloc) ev.emplace_back(t_free, -a->bytes);
  }
  std::sort(ev.begin(), ev.end());
  Peak p;
  int64_t live = 0;
  for (size_t i = 0; i < ev.size();) {
    int64_t t = ev[i].first;
    for (; i < ev.size() && ev[i].first == t; ++i) live += ev[i].second;
    if (live > p.bytes) p = {live, t};
  }
  return p;
}

std::string alive_at_peak(TraceData& d, const std::vector<const Alloc*>& rows, int64_t t) {
  std::map<std::string, NamedBytes> groups;
  for (const Alloc* a : rows) {
    if (!a->alive_at(t)) continue;
    std::string n = d.group_of(*a);
    NamedBytes& g = groups[n];
    g.name = n;
    g.bytes += a->bytes;
    ++g.count;
    if (a->bytes > g.largest_bytes) {
      g.largest_bytes = a->bytes;
      g.largest_stack = a->stack_id;
    }
  }
  return describe_groups(d, sort_groups(groups, 5), "");
}

std::string when(TraceData& d, int64_t rank, int64_t t) {
  if (auto s = d.step_at(rank, t)) return "at step " + std::to_string(*s);
  return "outside any step";
}

}  // namespace

Status check_budget(TraceData& d, const Budget& b, CheckResult* out) {
  CheckResult& r = *out;
  r.name = "budget";
  // Tensor-level rows (blocks) where a (rank, device, memory kind) has any, else its segments.
  using Key = std::tuple<int64_t, int64_t, db::MemoryKind>;
  std::map<Key, bool> has_blocks;
  for (auto& a : d.allocs) {
    bool& x = has_blocks[Key{a.rank, a.device_id, a.kind}];
    x = x || a.level == db::AllocLevel::Block;
  }
  auto counted = [&](const Alloc& a) { return (a.level == db::AllocLevel::Block) == has_blocks[Key{a.rank, a.device_id, a.kind}]; };

  std::string within;
  std::vector<std::string> unseen;  // a key whose memory the trace does not record: the check cannot look
  if (b.cuda) {
    std::map<int64_t, std::vector<const Alloc*>> blocks, segments;
    for (auto& a : d.allocs) {
      if (!d.is_accelerator(a.device_id)) continue;
      (a.level == db::AllocLevel::Block ? blocks : segments)[a.device_id].push_back(&a);
    }
    int64_t highest = -1;
    std::string highest_at;
    int n = 0;
    std::vector<const db::DeviceRow*> accelerators;  // by rank, then index
    for (auto& [id, dev] : d.devices)
      if (d.is_accelerator(id)) accelerators.push_back(&dev);
    std::stable_sort(accelerators.begin(), accelerators.end(), [](const db::DeviceRow* x, const db::DeviceRow* y) {
      return std::make_pair(x->rank, x->ordinal) < std::make_pair(y->rank, y->ordinal);
    });
    for (const db::DeviceRow* dp : accelerators) {
      const db::DeviceRow& dev = *dp;
      const int64_t id = dev.id;
      ++n;
      Peak alloc, reserved = sweep(segments[id], d);
      std::string what = "peak allocated";
      const std::vector<const Alloc*>* rows = &blocks[id];
      if (!blocks[id].empty()) {
        alloc = sweep(blocks[id], d);
      } else {
        // No tensor-level rows: the allocator's own counter, else the reserved segments.
        bool from_counter = false;
        // A counter is any number in a trace (db/SCHEMA.md); one that is not a size is left out, and said.
        bool odd_counter = false;
        for (auto& c : d.counters) {
          if (c.device_id != id || c.name != "allocated") continue;
          if (!(c.value >= 0 && c.value <= double(db::kMaxTraceBytes))) {
            char v[32];
            std::snprintf(v, sizeof v, "%.6g", c.value);
            if (!odd_counter)
              out->context.push_back("the 'allocated' counter of rank " + std::to_string(dev.rank) + " " +
                                     d.device_label(id) + " holds " + v + ", not a size: left out of its peak");
            odd_counter = true;
            continue;
          }
          if (int64_t(c.value) > alloc.bytes) {
            alloc = {int64_t(c.value), c.t};
            from_counter = true;
          }
        }
        if (!from_counter) {
          alloc = reserved;
          what = "peak reserved (no block rows)";
          rows = &segments[id];
        } else {
          what = "peak allocated (counter)";
        }
      }
      // Past the detail (a capped trace): the steps' peaks from the aggregates, where higher.
      bool from_aggregates = false;
      for (const db::StepMemoryRow& s : d.step_memory) {
        if (s.device_id != id) continue;
        const int64_t peak = blocks[id].empty() && s.peak_allocated_bytes == 0 ? s.peak_reserved_bytes : s.peak_allocated_bytes;
        reserved.bytes = std::max(reserved.bytes, s.peak_reserved_bytes);
        if (peak > alloc.bytes) {
          alloc = {peak, s.t_start};
          from_aggregates = true;
        }
      }
      if (from_aggregates) {
        what += " (from the aggregates: within the step, past the detail)";
        rows = nullptr;
      }
      const std::string name = d.who(dev.rank) + " " + d.device_label(id);
      if (alloc.bytes > highest) {
        highest = alloc.bytes;
        highest_at = name;
      }
      if (alloc.bytes <= *b.cuda) continue;
      std::string line = name + ": " + what + " " + format_bytes(double(alloc.bytes)) + " over the budget of " +
                         format_bytes(double(*b.cuda)) + " by " + format_bytes(double(alloc.bytes - *b.cuda)) + ", " +
                         when(d, dev.rank, alloc.t) + " (";
      if (dev.capacity_bytes) line += "capacity " + format_bytes(double(*dev.capacity_bytes)) + ", ";
      line += "peak reserved " + format_bytes(double(reserved.bytes)) + ")";
      std::string top = rows ? alive_at_peak(d, *rows, alloc.t) : std::string();
      if (!top.empty()) line += "; alive at the peak: " + top;
      else if (!rows) line += "; what was alive then is not in the trace (its detail stopped at its size cap)";
      r.findings.push_back(std::move(line));
    }
    if (n)
      within += "cuda: highest " + format_bytes(double(std::max<int64_t>(highest, 0))) + " (" + highest_at + ") of " +
                format_bytes(double(*b.cuda)) + " on " + std::to_string(n) + " device" + (n == 1 ? "" : "s");
    else
      unseen.push_back("cuda: the trace records no accelerator device (zt probe records a GPU's memory when CUDA "
                       "tracing is on: `zt db info` notes when it was off; on a CPU job leave cuda= out)");
  }
  if (b.host) {
    // Per host machine: every rank's host buffers there together (one clock per host).
    std::map<std::string, std::vector<const Alloc*>> per_host;
    std::map<std::string, int64_t> rank_of_host;
    for (auto& a : d.allocs) {
      if (d.is_accelerator(a.device_id)) continue;
      if (!d.devices.count(a.device_id) && a.kind != db::MemoryKind::PinnedHost &&
          a.kind != db::MemoryKind::PageableHost)
        continue;
      if (!counted(a)) continue;
      std::string h = d.hostname_of(a.rank);
      per_host[h].push_back(&a);
      rank_of_host.emplace(h, a.rank);
    }
    int64_t highest = -1;
    std::string highest_at;
    for (auto& [host, rows] : per_host) {
      Peak p = sweep(rows, d);
      if (p.bytes > highest) {
        highest = p.bytes;
        highest_at = host;
      }
      if (p.bytes <= *b.host) continue;
      int64_t pinned = 0, pageable = 0;
      for (const Alloc* a : rows)
        if (a->alive_at(p.t)) (a->kind == db::MemoryKind::PinnedHost ? pinned : pageable) += a->bytes;
      std::string line = "host " + host + ": peak allocated host memory " + format_bytes(double(p.bytes)) +
                         " over the budget of " + format_bytes(double(*b.host)) + " by " +
                         format_bytes(double(p.bytes - *b.host)) + ", " + when(d, rank_of_host[host], p.t) + " (pinned " +
                         format_bytes(double(pinned)) + ", other " + format_bytes(double(pageable)) + ")";
      std::string top = alive_at_peak(d, rows, p.t);
      if (!top.empty()) line += "; alive at the peak: " + top;
      r.findings.push_back(std::move(line));
    }
    if (per_host.empty()) {
      unseen.push_back("host: the trace records no host allocations (zt probe records those of its "
                       "--host-threshold, 1 MiB by default, or more: give a lower one; or leave host= out)");
    } else {
      if (!within.empty()) within += "; ";
      within += "host: highest " + format_bytes(double(highest)) + " (" + highest_at + ") of " +
                format_bytes(double(*b.host));
    }
  }
  if (b.host && d.detail_end)
    r.context.push_back("host: the trace's detail stopped at its size cap (" + d.detail_end_reason +
                        "): host memory is compared up to it only; the accelerators' peaks after it come from the "
                        "aggregates (step_memory)");
  if (!r.findings.empty()) {
    r.outcome = Outcome::Fail;
    r.summary = std::to_string(r.findings.size()) + (r.findings.size() == 1 ? " peak" : " peaks") +
                " over the budget (" + within + ")";
    for (auto& u : unseen) r.context.push_back("not checked: " + u);
  } else if (!unseen.empty()) {
    // A budget on memory the trace does not hold is not kept: it was never looked at.
    r.outcome = Outcome::Skip;
    r.summary = "cannot look: ";
    for (size_t i = 0; i < unseen.size(); ++i) r.summary += (i ? "; " : "") + unseen[i];
    if (!within.empty()) r.summary += "; within the budget: " + within;
  } else {
    r.summary = "peak allocated within the budget: " + within;
  }
  return Status::Ok();
}

}  // namespace detail
}  // namespace zt::check
