#include "zt/db/kernel_summary.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "sqlite.h"

namespace zt::db {
namespace {

using detail::Stmt;

// "reduce block3" -> "reduce blockN": the same phase of every module adds up.
std::string digits_as_n(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] >= '0' && s[i] <= '9') {
      out += 'N';
      while (i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '9') ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

struct Phase {
  int64_t t_start, t_end;
  std::string name;
};

}  // namespace

Status summarize_kernels(TraceReader& reader, const KernelSummaryOptions& options, KernelSummary* out) {
  const std::string& path = reader.path();
  try {
    sqlite3* db = reader.handle();
    KernelSummary s;
    // A rank's kernels are those of its devices (the index kernel_by_time is on device_id, t_start).
    if (detail::query_int(db, "SELECT EXISTS (SELECT 1 FROM kernel)") == 0)
      return Status::Error(path + ": no kernel rows (they come from CUPTI: record with zt train --device cuda --cupti, "
                                  "or zt probe -- PROGRAM; on the simulated GPU from its passes, which a --virtual "
                                  "run does not compute)");
    s.rank = options.rank;
    if (s.rank < 0)
      s.rank = detail::query_int(db, "SELECT min(d.rank) FROM device d WHERE EXISTS (SELECT 1 FROM kernel k WHERE "
                                     "k.device_id = d.id)");
    // The rank's devices with kernels: their ids (every later kernel query names them) and labels.
    std::vector<int64_t> devices;
    std::vector<std::string> labels;
    {
      Stmt q(db, "SELECT d.id, d.label FROM device d WHERE d.rank = ? AND EXISTS (SELECT 1 FROM kernel k WHERE "
                 "k.device_id = d.id) ORDER BY d.label");
      q.bind(1, s.rank);
      while (q.step()) {
        devices.push_back(q.i64(0));
        if (std::find(labels.begin(), labels.end(), q.text(1)) == labels.end()) labels.push_back(q.text(1));
      }
    }
    if (devices.empty()) return Status::Error(path + ": rank " + std::to_string(s.rank) + " has no kernel rows");
    for (const std::string& l : labels) s.devices += (s.devices.empty() ? "" : ", ") + l;
    std::string rank_devices = "device_id IN (";
    for (size_t i = 0; i < devices.size(); ++i) rank_devices += (i ? ", " : "") + std::to_string(devices[i]);
    rank_devices += ")";

    // The window: the rank's finished steps. Every step's start, also of a step that never ended
    // (the run died in it), tells the background thread's phases apart (below).
    std::vector<std::pair<int64_t, std::pair<int64_t, int64_t>>> steps;  // step, [t_start, t_end)
    std::map<int64_t, int64_t> step_start;
    {
      Stmt q(db, "SELECT step, t_start, t_end FROM marker WHERE rank = ? AND kind = 0 AND step IS NOT NULL ORDER BY "
                 "t_start");
      q.bind(1, s.rank);
      while (q.step()) {
        step_start[q.i64(0)] = q.i64(1);
        if (!q.is_null(2)) steps.push_back({q.i64(0), {q.i64(1), q.i64(2)}});
      }
    }
    if (steps.empty()) {
      if (options.first_step >= 0 || options.last_step >= 0)
        return Status::Error(path + ": rank " + std::to_string(s.rank) + " has no step markers to choose steps from");
      Stmt q(db, "SELECT min(t_start), max(t_end) FROM kernel WHERE " + rank_devices);
      q.step();
      s.t_start = q.i64(0);
      s.t_end = q.i64(1);
    } else {
      int64_t first = options.first_step, last = options.last_step;
      if (first < 0 && last < 0) {
        first = steps.size() > 1 ? steps[1].first : steps[0].first;
        last = steps.back().first;
      } else {
        if (first < 0) first = steps.front().first;
        if (last < 0) last = steps.back().first;
      }
      if (last < first)
        return Status::Error(path + ": steps " + std::to_string(first) + "-" + std::to_string(last) + ": the last comes first");
      bool found = false;
      int64_t lo = 0, hi = 0;
      for (auto& [step, span] : steps)
        if (step >= first && step <= last) {
          lo = found ? std::min(lo, span.first) : span.first;
          hi = found ? std::max(hi, span.second) : span.second;
          s.first_step = found ? std::min(s.first_step, step) : step;
          s.last_step = found ? std::max(s.last_step, step) : step;
          ++s.steps;
          found = true;
        }
      if (!found)
        return Status::Error(path + ": rank " + std::to_string(s.rank) + " has no finished step in " +
                             std::to_string(first) + "-" + std::to_string(last) + " (its steps: " +
                             std::to_string(steps.front().first) + "-" + std::to_string(steps.back().first) + ")");
      s.t_start = lo;
      s.t_end = hi;
    }

    // Kernels that started in the window, in time order: totals per name (a kernel belongs to the
    // window it starts in, so adjacent windows count none twice), and the union of all kernels'
    // intervals inside the window (busy), clipped at both ends: it starts with what kernels that
    // began before the window still ran into it (found among the last 256 kernels of each of the
    // rank's devices before it: a kernel still running then began shortly before).
    std::unordered_map<int64_t, KernelStat> by_id;
    std::vector<std::pair<int64_t, int64_t>> busy;  // merged [start, end) inside the window
    auto add_busy = [&](int64_t a, int64_t e) {
      a = std::max(a, s.t_start);
      e = std::min(e, s.t_end);
      if (e <= a) return;  // nothing inside the window (or a zero-length kernel): no interval, no split gap
      if (!busy.empty() && a <= busy.back().second) busy.back().second = std::max(busy.back().second, e);
      else busy.push_back({a, e});
    };
    {
      Stmt q(db, "SELECT max(t_end) FROM (SELECT t_end FROM kernel WHERE device_id = ? AND t_start < ? ORDER BY t_start "
                 "DESC LIMIT 256)");
      for (int64_t dev : devices) {
        q.bind(1, dev).bind(2, s.t_start);
        if (q.step() && !q.is_null(0)) add_busy(s.t_start, q.i64(0));
        q.reset();
      }
    }
    {
      Stmt q(db, "SELECT name_id, t_start, t_end FROM kernel WHERE " + rank_devices +
                     " AND t_start >= ? AND t_start < ? ORDER BY t_start");
      q.bind(1, s.t_start).bind(2, s.t_end);
      while (q.step()) {
        const int64_t id = q.i64(0), a = q.i64(1), b = std::max(q.i64(2), q.i64(1)), d = b - a;
        KernelStat& k = by_id[id];
        if (k.calls == 0) k.min_ns = k.max_ns = d;
        ++k.calls;
        k.total_ns += d;
        k.min_ns = std::min(k.min_ns, d);
        k.max_ns = std::max(k.max_ns, d);
        ++s.kernels;
        s.kernel_ns += d;
        add_busy(a, b);
      }
    }
    {
      Stmt q(db, "SELECT text FROM string WHERE id = ?");
      for (auto& [id, k] : by_id) {
        q.bind(1, id);
        k.name = q.step() ? q.text(0) : "(unnamed)";
        q.reset();
        s.by_name.push_back(std::move(k));
      }
    }
    std::sort(s.by_name.begin(), s.by_name.end(), [](const KernelStat& a, const KernelStat& b) {
      return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
    });
    for (auto& [a, b] : busy) s.busy_ns += b - a;

    // Idle gaps: the window less the busy intervals.
    std::vector<IdleGap> gaps;
    int64_t at = s.t_start;
    for (auto& [a, b] : busy) {
      if (a > at) gaps.push_back(IdleGap{at, a, -1, {}});
      at = std::max(at, b);
    }
    if (s.t_end > at) gaps.push_back(IdleGap{at, s.t_end, -1, {}});
    s.gaps = int64_t(gaps.size());

    // The host's innermost phase at each gap's midpoint (the latest-started phase around it), by
    // a sweep over the rank thread's phases in start order. A phase of step s that ends after
    // step s+1 began ran on the rank's background thread (the delayed or overlapped update's
    // AdamW beside the next step's compute): it is left out, so the gap goes to what the rank
    // thread was doing. The viewer draws the same phases on its "background" lanes by the same rule.
    std::vector<Phase> phases;
    {
      Stmt q(db, "SELECT m.t_start, m.t_end, coalesce(n.text, ''), m.step FROM marker m LEFT JOIN string n ON n.id = "
                 "m.name_id WHERE m.rank = ? AND m.kind = 3 AND m.t_start < ? AND coalesce(m.t_end, ?) > ? ORDER BY "
                 "m.t_start");
      q.bind(1, s.rank).bind(2, s.t_end).bind(3, s.t_end).bind(4, s.t_start);
      while (q.step()) {
        if (!q.is_null(3)) {
          // A phase that never ended (the run died while it ran) ends after any step began.
          auto next = step_start.find(q.i64(3) + 1);
          if (next != step_start.end() && (q.is_null(1) || q.i64(1) > next->second)) continue;  // the background's
        }
        phases.push_back({q.i64(0), q.is_null(1) ? s.t_end : q.i64(1), q.text(2)});
      }
    }
    std::set<std::pair<int64_t, size_t>> active;             // (t_start, index): innermost = last
    std::multimap<int64_t, size_t> ending;                   // t_end -> index
    size_t next = 0;
    std::map<std::string, IdleByPhase> idle;
    size_t step_at = 0;  // the first step that may hold the next gap's midpoint (both in time order)
    for (IdleGap& g : gaps) {
      const int64_t mid = g.t_start + (g.t_end - g.t_start) / 2;
      while (next < phases.size() && phases[next].t_start <= mid) {
        active.insert({phases[next].t_start, next});
        ending.insert({phases[next].t_end, next});
        ++next;
      }
      while (!ending.empty() && ending.begin()->first <= mid) {
        const size_t i = ending.begin()->second;
        active.erase({phases[i].t_start, i});
        ending.erase(ending.begin());
      }
      g.phase = active.empty() ? "(no phase)" : phases[active.rbegin()->second].name;
      while (step_at < steps.size() && steps[step_at].second.second <= mid) ++step_at;
      if (step_at < steps.size() && steps[step_at].second.first <= mid) g.step = steps[step_at].first;
      const std::string phase = digits_as_n(g.phase);
      IdleByPhase& p = idle[phase];
      p.phase = phase;
      p.ns += g.t_end - g.t_start;
      ++p.gaps;
    }
    for (auto& [name, p] : idle) s.idle_by_phase.push_back(p);
    std::sort(s.idle_by_phase.begin(), s.idle_by_phase.end(), [](const IdleByPhase& a, const IdleByPhase& b) {
      return a.ns != b.ns ? a.ns > b.ns : a.phase < b.phase;
    });
    std::stable_sort(gaps.begin(), gaps.end(),
                     [](const IdleGap& a, const IdleGap& b) { return a.t_end - a.t_start > b.t_end - b.t_start; });
    if (gaps.size() > options.longest_gaps) gaps.resize(options.longest_gaps);
    s.longest = std::move(gaps);
    *out = std::move(s);
    return Status::Ok();
  } catch (const std::exception& e) {
    return Status::Error(path + ": reading its kernels failed: " + e.what());
  }
}

}  // namespace zt::db
