// --leaks: live bytes at the same phase of successive epochs (each epoch's start, and each
// epoch's end) per rank, device and memory kind; growth beyond the threshold is a leak. Without
// epochs, equal windows of steps, else equal windows of time between the run's first and last tenth.
// On a probed trace, the process's RSS is a witness: growth the recorded allocations do not
// explain is a leak too. The probe's sampled rows count for the bytes they stand for, and growth
// they make up must stand out of its sampling error (3 standard errors). The rules and their
// reasons are in inject/check/README.md.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string_view>
#include <tuple>

#include "trace_data.h"
#include "zt/common/units.h"

namespace zt::check::detail {

namespace {

// What a rank's memory is compared over: its epochs, else windows of its steps, else windows of
// its run's time.
// its run's time. In a trace with detail windows (zt probe --detail), a rank without epochs is
// compared at its stretches of detail, where the allocation rows are whole.
enum class BasisKind { Epochs, StepWindows, TimeWindows, DetailWindows };

struct Window {
  int64_t t_start = 0, t_end = kNever;
  bool ended = false;
  std::string label;  // "epoch 2", "window 1 (steps 3-5)", "window 1 (1.20 s-2.40 s)"
  int64_t epoch = -1;  // an epoch's number (epochs only): its live set in the aggregates
};

struct Basis {
  BasisKind kind = BasisKind::Epochs;
  std::vector<Window> windows;
  bool warmup = true;  // the first interval is left out (three windows or more)
  std::string words;   // "3 epochs", "4 windows of 3 steps", "4 windows of 2.25 s between the run's first and last tenth"
  int64_t width = 0;   // windows of time: each window's length
  const char* unit() const { return kind == BasisKind::Epochs ? "epoch" : "window"; }
};

constexpr int kWindows = 4;

// One series of values to compare: at each window's start, at each ended window's end, or (windows of
// time, not aligned with the program's loop) the lowest value inside each window.
struct Series {
  enum Kind { Start, End, Low } kind = Start;
  std::vector<const Window*> windows;
  std::string phase() const { return kind == Start ? "start" : kind == End ? "end" : "lowest point"; }
};

// Values of a series and the time each holds at (a start or end, or where the low was reached).
struct Values {
  std::vector<int64_t> v;
  std::vector<int64_t> at;
};

struct Verdict {
  bool leak = false;
  double per_window = 0;
  int64_t threshold = 0;  // the one applied
  size_t from = 0, to = 0;  // the points compared (to = the last)
};

// live: bytes at successive points. The first interval is warm-up when there are three points
// or more (caches and lazily created state settle during the first epoch); the growth must be
// at least `threshold` per epoch on average and show in at least half of the intervals, and in two of them
// where two or more are compared (one step is not a leak).
// The threshold of one memory: the one given, else 512 KiB, or 1% of the memory at the first
// compared point when that is smaller (a tiny run's 320 KiB per epoch is a quarter of its pinned
// memory), but at least 64 KiB. The lower one needs three points or more, so that the first
// epoch's lazily created state is left out as warm-up.
int64_t threshold_for(int64_t given, int64_t first_live, size_t points) {
  if (given > 0) return given;
  if (points < 3) return kLeakThresholdMax;
  return std::clamp<int64_t>(first_live / 100, kLeakThresholdMin, kLeakThresholdMax);
}

Verdict evaluate(const std::vector<int64_t>& live, int64_t threshold, bool warmup) {
  Verdict v;
  const size_t n = live.size();
  if (n < 2) return v;
  v.from = warmup && n >= 3 ? 1 : 0;
  v.to = n - 1;
  v.threshold = threshold;
  const size_t counted = v.to - v.from;
  size_t grew = 0;
  for (size_t i = v.from; i < v.to; ++i) grew += live[i + 1] > live[i];
  v.per_window = double(live[v.to] - live[v.from]) / double(counted);
  // A one-off step is not a leak: where two intervals or more are compared, the growth must show in two of
  // them at least (with two intervals, one step read as "a leak every other epoch": a clean job's RSS that
  // jumped once by 12 MiB, a block the HF Trainer makes once, failed the check).
  v.leak = v.per_window >= double(threshold) && 2 * grew >= counted && (counted < 2 || grew >= 2);
  return v;
}

std::string delta(int64_t d) { return (d < 0 ? "-" : "+") + format_bytes(double(d < 0 ? -d : d)); }

// "epoch 0: 1.25 GiB, epoch 1: +1.00 MiB, epoch 2: +1.00 MiB": the first point, then each change.
std::string series_text(const Series& s, const std::vector<int64_t>& live) {
  std::string out = s.windows[0]->label + ": " + format_bytes(double(live[0]));
  const size_t n = live.size();
  for (size_t i = 1; i < n; ++i) {
    if (n > 7 && i == 3) {
      out += ", ...";
      i = n - 4;  // the loop's ++ makes it the third from the end
      continue;
    }
    out += ", " + s.windows[i]->label + ": " + delta(live[i] - live[i - 1]);
  }
  return out;
}

// The basis of one rank: its epochs (two or more); else kWindows windows of its steps (two or more
// steps); else kWindows windows of its run's time between the first tenth (the start-up: imports,
// the model built, the data loaded) and the last (the shutdown). `last_event`: the rank's last recorded time, the run's end
// when the run did not record one. `imports`: the times of its allocations made while importing a module; the
// last of them within the first 3/4 of the run (a module imported in the last quarter, at shutdown, is not
// start-up), where past the first tenth, is where the windows begin: a short job spends seconds importing torch
// (torchrun's agent 8 s of a 17 s run), and that is no growth.
std::optional<Basis> basis_of(const TraceData& d, int64_t rank, int64_t last_event, const std::vector<int64_t>& imports) {
  Basis b;
  if (auto it = d.epochs.find(rank); it != d.epochs.end() && it->second.size() >= 2) {
    b.kind = BasisKind::Epochs;
    for (auto& e : it->second)
      b.windows.push_back({e.t_start, e.t_end, e.ended, "epoch " + std::to_string(e.index), e.index});
    b.words = std::to_string(it->second.size()) + " epochs";
    return b;
  }
  // Detail windows: the rank's stretches (a process's rows are under its first rank; a rank with none of its
  // own takes every stretch: the ranks of one zt train process), those that hold time.
  std::vector<const db::DetailSpanRow*> spans;
  for (int pass = 0; pass < 2 && spans.empty(); ++pass)
    for (auto& sp : d.detail_spans)
      if ((pass == 1 || sp.rank == rank) && sp.t_end.value_or(last_event) > sp.t_start) spans.push_back(&sp);
  if (spans.size() >= 2) {
    b.kind = BasisKind::DetailWindows;
    const db::RunRow* run = d.run_of(rank);
    const int64_t t0 = run ? run->t_start : 0;
    auto st = d.steps.find(rank);
    for (size_t w = 0; w < spans.size(); ++w) {
      const int64_t a = spans[w]->t_start, z = spans[w]->t_end.value_or(last_event);
      std::optional<int64_t> first, last;  // the steps that begin inside the stretch
      if (st != d.steps.end())
        for (auto& s : st->second)
          if (s.t_start >= a && s.t_start < z) {
            if (!first) first = s.index;
            last = s.index;
          }
      const std::string what = first ? (*first == *last ? "step " + std::to_string(*first)
                                                        : "steps " + std::to_string(*first) + "-" + std::to_string(*last))
                                     : format_duration_ns(double(a - t0)) + "-" + format_duration_ns(double(z - t0));
      b.windows.push_back({a, z, spans[w]->t_end.has_value(), "detail window " + std::to_string(w) + " (" + what + ")"});
    }
    b.words = std::to_string(spans.size()) + " stretches of detail (the trace has " +
              (d.epochs.count(rank) ? "1 epoch" : std::string("no epochs")) +
              " and its detail has gaps, zt probe --detail: compared at each stretch's start and end)";
    return b;
  }
  if (auto it = d.steps.find(rank); it != d.steps.end() && it->second.size() >= 2) {
    const auto& st = it->second;  // by t_start
    const size_t n = st.size(), k = std::min<size_t>(kWindows, n);
    b.kind = BasisKind::StepWindows;
    for (size_t w = 0; w < k; ++w) {
      const Span& first = st[w * n / k];
      const Span& last = st[(w + 1) * n / k - 1];
      const std::string steps = first.index == last.index ? "step " + std::to_string(first.index)
                                                          : "steps " + std::to_string(first.index) + "-" +
                                                                std::to_string(last.index);
      b.windows.push_back({first.t_start, last.t_end, last.ended, "window " + std::to_string(w) + " (" + steps + ")"});
    }
    b.words = std::to_string(k) + " windows of " + (n % k ? "about " : "") + std::to_string(n / k) + " step" +
              (n / k == 1 ? "" : "s") + " (the trace has " +
              (d.epochs.count(rank) ? "1 epoch" : std::string("no epochs")) + ": windows of its " + std::to_string(n) +
              " steps)";
    return b;
  }
  const db::RunRow* run = d.run_of(rank);
  const int64_t t0 = run ? run->t_start : 0;
  const int64_t t1 = run && run->t_end ? *run->t_end : last_event;
  if (t1 - t0 < 10 * kWindows) return std::nullopt;
  b.kind = BasisKind::TimeWindows;
  b.warmup = false;  // the first tenth is the warm-up
  // The last tenth is the shutdown: an interpreter frees its objects at exit, and the probe's last
  // RSS sample is taken after that.
  int64_t imports_end = 0;
  for (int64_t t : imports)
    if (t <= t0 + (t1 - t0) * 3 / 4) imports_end = std::max(imports_end, t);
  const bool after_imports = imports_end > t0 + (t1 - t0) / 10;
  const int64_t start = after_imports ? imports_end : t0 + (t1 - t0) / 10, stop = t1 - (t1 - t0) / 10,
                width = (stop - start) / kWindows;
  for (int w = 0; w < kWindows; ++w) {
    const int64_t a = start + w * width, z = w + 1 == kWindows ? stop : a + width;
    b.windows.push_back({a, z, true,
                         "window " + std::to_string(w) + " (" + format_duration_ns(double(a - t0)) + "-" +
                             format_duration_ns(double(z - t0)) + ")"});
  }
  b.width = width;
  b.words = std::to_string(kWindows) + " windows of " + format_duration_ns(double(width)) +
            (after_imports ? " between the end of its imports (" + format_duration_ns(double(imports_end - t0)) +
                                 ") and the run's last tenth"
                           : std::string(" between the run's first and last tenth")) +
            " (the trace has no epochs or steps: windows of time)";
  return b;
}

std::vector<Series> series_of(const Basis& b) {
  std::vector<Series> out;
  if (b.kind == BasisKind::TimeWindows) {
    Series low{Series::Low, {}};
    for (auto& w : b.windows) low.windows.push_back(&w);
    out.push_back(low);
    return out;
  }
  Series starts{Series::Start, {}}, ends{Series::End, {}};
  for (auto& w : b.windows) {
    starts.windows.push_back(&w);
    if (w.ended) ends.windows.push_back(&w);
  }
  out.push_back(starts);
  out.push_back(ends);
  return out;
}

// Live bytes of `rows` at the given times: an allocation counts at t when t_alloc <= t < t_free, for
// its weight (a sampled row: the bytes it stands for; else its bytes).
std::vector<int64_t> live_at(const std::vector<const Alloc*>& rows, const std::vector<int64_t>& times) {
  std::vector<size_t> order(times.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return times[x] < times[y]; });
  std::vector<int64_t> ts(times.size());
  for (size_t i = 0; i < order.size(); ++i) ts[i] = times[order[i]];
  std::vector<int64_t> diff(times.size() + 1, 0);
  for (const Alloc* a : rows) {
    size_t first = size_t(std::lower_bound(ts.begin(), ts.end(), a->t_alloc) - ts.begin());
    size_t last = size_t(std::lower_bound(ts.begin(), ts.end(), a->t_free) - ts.begin());
    if (first >= last) continue;
    diff[first] += a->weight;
    diff[last] -= a->weight;
  }
  std::vector<int64_t> out(times.size());
  int64_t run = 0;
  for (size_t i = 0; i < times.size(); ++i) out[order[i]] = run += diff[i];
  return out;
}

Values live_values(const std::vector<const Alloc*>& rows, const Series& s) {
  Values out;
  if (s.kind != Series::Low) {
    for (const Window* w : s.windows) out.at.push_back(s.kind == Series::Start ? w->t_start : w->t_end);
    out.v = live_at(rows, out.at);
    return out;
  }
  // The lowest live bytes inside each window (windows in time order, not overlapping).
  std::vector<std::pair<int64_t, int64_t>> ev;  // (t, change)
  ev.reserve(rows.size() * 2);
  for (const Alloc* a : rows) {
    ev.emplace_back(a->t_alloc, a->weight);
    if (a->t_free != kNever) ev.emplace_back(a->t_free, -a->weight);
  }
  std::sort(ev.begin(), ev.end());
  size_t i = 0;
  int64_t live = 0;
  for (const Window* w : s.windows) {
    while (i < ev.size() && ev[i].first <= w->t_start) live += ev[i++].second;
    int64_t low = live, at = w->t_start;
    while (i < ev.size() && ev[i].first < w->t_end) {
      const int64_t t = ev[i].first;
      while (i < ev.size() && ev[i].first == t) live += ev[i++].second;
      if (live < low) low = live, at = t;
    }
    out.v.push_back(low);
    out.at.push_back(at);
  }
  return out;
}

// RSS of one process: the last sample at or before each start (the first one after where none
// was taken yet); the lowest sample inside each window of time (without one inside: the last before).
std::optional<Values> rss_values(const std::vector<std::pair<int64_t, int64_t>>& samples, const Series& s) {
  if (samples.empty()) return std::nullopt;
  Values out;
  auto at_or_before = [&](int64_t t) {
    auto p = std::upper_bound(samples.begin(), samples.end(), t,
                              [](int64_t x, const std::pair<int64_t, int64_t>& y) { return x < y.first; });
    return p == samples.begin() ? *p : *std::prev(p);
  };
  for (const Window* w : s.windows) {
    std::pair<int64_t, int64_t> pick = at_or_before(s.kind == Series::End ? w->t_end : w->t_start);
    if (s.kind == Series::Low) {  // the samples inside the window, where it has any
      auto p = std::lower_bound(samples.begin(), samples.end(), w->t_start,
                                [](const std::pair<int64_t, int64_t>& y, int64_t x) { return y.first < x; });
      if (p != samples.end() && p->first < w->t_end) pick = *p;
      for (; p != samples.end() && p->first < w->t_end; ++p)
        if (p->second < pick.second) pick = *p;
    }
    out.v.push_back(pick.second);
    out.at.push_back(pick.first);
  }
  return out;
}

// The aggregates' live bytes of one memory at each point of a series (epochs only): the epoch_live
// rows of the rank at each epoch's start or end, by the same block-else-segment rule. nullopt where
// an epoch's live set is not in the trace (its boundary was not one the recorder saw).
template <typename Keep>
std::optional<Values> aggregate_values(const TraceData& d, int64_t rank, const Series& s, Keep keep) {
  Values out;
  for (const Window* w : s.windows) {
    auto it = d.epoch_live.find({rank, w->epoch, s.kind == Series::End ? 1 : 0});
    if (w->epoch < 0 || it == d.epoch_live.end()) return std::nullopt;
    int64_t sum = 0;
    for (const db::EpochLiveRow& r : it->second)
      if (keep(r)) sum += r.bytes;
    out.v.push_back(sum);
    out.at.push_back(s.kind == Series::End ? w->t_end : w->t_start);
  }
  return out;
}

// A path as a POSIX shell reads it back (zt probe's shell_quote, zt/probe/probe_config.h, spells the
// same rule; zt check does not link the probe): unchanged when made only of characters no shell
// treats specially, else in single quotes.
std::string shell_word(const std::string& w) {
  bool plain = !w.empty();
  for (unsigned char c : w) plain = plain && (std::isalnum(c) || std::string_view("_@%+=:,./-").find(char(c)) != std::string_view::npos);
  if (plain) return w;
  std::string out = "'";
  for (char c : w) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A probed run of several processes (forked DataLoader workers, helpers, other ranks) leaves one trace per
// process; this trace holds one of them. Their allocations were not compared: a pass here does not
// speak for them, so it is a skip (CANNOT RUN when --leaks was named), and the merge is said.
void others_of_run(const TraceData& d, CheckResult* r) {
  if (d.run_others.empty()) return;
  const size_t n = d.run_others.size();
  std::string merged = d.path();
  if (merged.size() > 3 && merged.compare(merged.size() - 3, 3, ".db") == 0) merged.resize(merged.size() - 3);
  std::string merge = "zt db merge " + shell_word(merged + ".merged.db") + " " + shell_word(d.path());
  for (auto& p : d.run_others) merge += " " + shell_word(p);
  const std::string these = std::to_string(n) + " more trace" + (n == 1 ? "" : "s") + " of this run lie" +
                            (n == 1 ? "s" : "") + " beside this one (its other processes: forked DataLoader workers, "
                            "helpers, other ranks; docs/probe.md, \"Processes\")";
  if (r->outcome == Outcome::Pass) {
    r->context.insert(r->context.begin(), "in this trace's own process: " + r->summary);
    r->outcome = Outcome::Skip;
    r->summary = "only this trace's own process was compared: " + these +
                 ", and their allocations were not; merge them and check the merged trace: " + merge;
  } else {
    r->context.push_back(these + ", and were not compared; merge them and check the merged trace: " + merge);
  }
}

}  // namespace

Status check_leaks(TraceData& d, const Options& o, CheckResult* out) {
  CheckResult& r = *out;
  r.name = "leaks";

  // Groups: (rank, device, memory kind). Tensor-level rows (blocks) where the group has any:
  // segments are the caching allocator's reserve, which grows during warm-up and stays cached.
  // The probe's sampled rows (host allocations under its threshold) join their memory's rows,
  // each counting for its weight (the bytes it stands for): live bytes are then an estimate.
  using Key = std::tuple<int64_t, int64_t, db::MemoryKind>;
  std::map<Key, bool> has_blocks;
  std::map<int64_t, int64_t> last_event;  // per rank
  auto saw = [&](int64_t rank, int64_t t) {
    auto [it, fresh] = last_event.try_emplace(rank, t);
    if (!fresh) it->second = std::max(it->second, t);
  };
  for (const auto* all : {&d.allocs, &d.sampled})
    for (auto& a : *all) {
      bool& b = has_blocks[Key{a.rank, a.device_id, a.kind}];
      b = b || a.level == db::AllocLevel::Block;
      saw(a.rank, a.t_free != kNever ? a.t_free : a.t_alloc);
    }
  for (auto& [rank, samples] : d.rss)
    if (!samples.empty()) saw(rank, samples.back().first);
  std::map<Key, std::vector<const Alloc*>> groups;
  for (const auto* all : {&d.allocs, &d.sampled})
    for (auto& a : *all) {
      Key k{a.rank, a.device_id, a.kind};
      if ((a.level == db::AllocLevel::Block) == has_blocks[k]) groups[k].push_back(&a);
    }
  std::vector<std::string> within_error;  // growth past the threshold that sampling error explains

  std::map<int64_t, std::optional<Basis>> bases;
  std::map<int64_t, std::vector<int64_t>> imports;  // per rank: when it allocated while importing a module
  bool imports_read = false;
  auto basis = [&](int64_t rank) -> const Basis* {
    auto it = bases.find(rank);
    if (it == bases.end()) {
      auto few = [](const std::map<int64_t, std::vector<Span>>& m, int64_t r) {
        auto f = m.find(r);
        return f == m.end() || f->second.size() < 2;
      };
      // Only a rank without epochs or steps (windows of time) needs them: read once for all ranks then.
      if (!imports_read && few(d.epochs, rank) && few(d.steps, rank)) {
        imports_read = true;
        for (const auto* all : {&d.allocs, &d.sampled})
          for (auto& a : *all)
            if (d.importing(a.stack_id)) imports[a.rank].push_back(a.t_alloc);
      }
      it = bases.emplace(rank, basis_of(d, rank, last_event[rank], imports[rank])).first;
    }
    return it->second ? &*it->second : nullptr;
  };
  std::set<BasisKind> kinds;
  size_t max_epochs = 0;
  std::vector<std::string> window_words;
  std::set<const Basis*> time_bases;  // windows of time: one per process, said once in the summary
  auto used = [&](const Basis& b) {
    kinds.insert(b.kind);
    if (b.kind == BasisKind::Epochs) max_epochs = std::max(max_epochs, b.windows.size());
    else if (b.kind == BasisKind::TimeWindows) time_bases.insert(&b);
    else if (std::find(window_words.begin(), window_words.end(), b.words) == window_words.end())
      window_words.push_back(b.words);
  };

  // Ranks whose compared epochs reach past the end of the detail (a trace cut by its size cap):
  // compared from the aggregates' live sets, which go on to the end of the run.
  std::set<int64_t> from_aggregates, not_compared;
  if (d.detail_end) {
    std::set<int64_t> ranks;
    for (auto& [key, rows] : groups) ranks.insert(std::get<0>(key));
    for (auto& [key, rows] : d.epoch_live) ranks.insert(std::get<0>(key));
    for (int64_t rank : ranks) {
      const Basis* b = basis(rank);
      if (!b) continue;
      int64_t last = 0;
      for (auto& w : b->windows) last = std::max(last, w.ended ? w.t_end : w.t_start);
      if (b->kind == BasisKind::Epochs && last > *d.detail_end) from_aggregates.insert(rank);
      else if (b->kind != BasisKind::DetailWindows && last > *d.detail_end) {
        // Past the end of the detail the rows are not the rank's memory: only the windows before it are
        // compared, and a rank left with fewer than two is not compared at all (never passed unseen).
        Basis& cut = *bases[rank];
        std::vector<Window> kept;
        for (auto& w : cut.windows)
          if ((w.ended ? w.t_end : w.t_start) <= *d.detail_end) kept.push_back(w);
        const std::string stopped =
            d.who(rank) + ": the trace's detail stopped " +
            format_duration_ns(double(*d.detail_end - (d.run_of(rank) ? d.run_of(rank)->t_start : 0))) +
            " into the run (" + d.detail_end_reason + ")";
        const std::string how = "mark epochs (zerotrace.epoch(n)) so that the aggregates hold each one's live set, "
                                "or record more detail (--max-trace, --detail)";
        if (kept.size() >= 2) {
          r.context.push_back(stopped + ", and without epochs only its " + std::to_string(kept.size()) + " of " +
                              std::to_string(cut.windows.size()) + " windows before that were compared; " + how);
          cut.windows = std::move(kept);
          cut.words += ", the first " + std::to_string(cut.windows.size()) + " before the detail stopped";
        } else {
          r.context.push_back(stopped + ", and without epochs its live bytes could not be compared; " + how);
          not_compared.insert(rank);
        }
      }
    }
  }

  int memories = 0;
  for (auto& [key, rows] : groups) {
    auto [rank, device_id, kind] = key;
    if (from_aggregates.count(rank) || not_compared.count(rank)) continue;
    const Basis* b = basis(rank);
    if (!b) continue;
    used(*b);
    ++memories;
    bool reported = false;
    std::string doubt;  // growth past the threshold that sampling explains (said when not reported)
    for (const Series& s : series_of(*b)) {
      if (reported || s.windows.size() < 2) continue;
      Values live = live_values(rows, s);
      const size_t from = b->warmup && live.v.size() >= 3 ? 1 : 0;
      Verdict v = evaluate(live.v, threshold_for(o.leak_threshold, live.v[from], live.v.size()), b->warmup);
      if (!v.leak) continue;
      const std::string phase = s.phase();
      const std::string unit = b->unit();
      const int64_t t_from = live.at[v.from], t_to = live.at[v.to];
      // Sampled rows make the growth an estimate. Its variance: each sampled row alive at one of
      // the two points and not the other adds weight * (weight - bytes) (docs/check.md); rows alive
      // at both cancel. A leak must stand out of that error: growth of 3 standard errors or more.
      double variance = 0;
      int64_t sampled_rows = 0;
      for (const Alloc* a : rows)
        if (a->weight != a->bytes && a->alive_at(t_from) != a->alive_at(t_to)) {
          variance += db::sampled_variance(a->bytes, a->weight);
          ++sampled_rows;
        }
      const double growth = double(live.v[v.to] - live.v[v.from]), error = std::sqrt(variance);
      const std::string error_text = "±" + format_bytes(error / double(v.to - v.from)) + " per " + unit;
      const std::string where_ = d.who(rank) + " " + d.device_label(device_id) + " " + memory_kind_words(kind);
      if (growth < 3 * error) {
        if (doubt.empty())
          doubt = where_ + (s.kind == Series::Low ? ": the lowest live bytes of each window grew ~"
                                                  : " grew ~") +
                  format_bytes(v.per_window) + " per " + unit +
                  (s.kind == Series::Low ? std::string() : " at " + unit + " " + phase) +
                  ", within 3 standard errors of its sampled estimate (" + error_text + ")";
        continue;
      }
      reported = true;
      // Evidence: what is alive at the later point and was not at the earlier, net per name.
      std::map<std::string, NamedBytes> net;
      for (const Alloc* a : rows) {
        bool at_from = a->alive_at(t_from), at_to = a->alive_at(t_to);
        if (at_from == at_to) continue;
        std::string n = d.group_of(*a);
        NamedBytes& g = net[n];
        g.name = n;
        if (at_to) {
          g.bytes += a->weight;
          ++g.count;
          g.sampled += a->weight != a->bytes;
          if (a->weight > g.largest_bytes) {
            g.largest_bytes = a->weight;
            g.largest_stack = a->stack_id;
          }
        } else {
          g.bytes -= a->weight;
        }
      }
      for (auto it = net.begin(); it != net.end();) it = it->second.bytes > 0 && it->second.count > 0 ? std::next(it) : net.erase(it);
      auto top = sort_groups(net, 3);
      auto point = [&](size_t i) {
        std::string label = s.windows[i]->label;
        if (b->kind != BasisKind::Epochs) label = label.substr(0, label.find(" ("));
        return s.kind == Series::Low ? label + "'s lowest point" : label + " " + phase;
      };
      std::string line = where_ +
                         (s.kind == Series::Low ? ": the lowest live bytes of each window grew "
                                                : ": live bytes at " + unit + " " + phase + " grew ") +
                         (sampled_rows ? "~" : "") + format_bytes(v.per_window) + " per " + unit + " (" +
                         series_text(s, live.v) + ")";
      if (sampled_rows)
        line += " (estimated from " + std::to_string(sampled_rows) + " sampled allocations: " + error_text + ")";
      if (o.leak_threshold == 0 && v.threshold < kLeakThresholdMax)
        line += " (this memory's threshold: " + format_bytes(double(v.threshold)) + " per " + unit + ")";
      if (v.from > 0 && live.v[1] - live.v[0] < v.threshold)
        line += ", " + s.windows[0]->label + " taken as warm-up";
      if (!top.empty())
        line += "; alive at " + point(v.to) + " but not at " + point(v.from) + ": " + describe_groups(d, top, "+");
      r.findings.push_back(std::move(line));
    }
    if (!reported && !doubt.empty()) within_error.push_back(std::move(doubt));
  }

  // The ranks compared from the aggregates: the same rule on the epoch live sets.
  for (int64_t rank : from_aggregates) {
    const Basis* b = basis(rank);
    used(*b);
    using Memory = std::pair<int64_t, db::MemoryKind>;
    std::map<Memory, bool> blocks;
    for (auto& [key, rows] : d.epoch_live)
      if (std::get<0>(key) == rank)
        for (auto& row : rows) {
          bool& x = blocks[{row.device_id, row.memory_kind}];
          x = x || row.level == db::AllocLevel::Block;
        }
    const std::string cut = "from the aggregates: the detail stopped " +
                            format_duration_ns(double(*d.detail_end - (d.run_of(rank) ? d.run_of(rank)->t_start : 0))) +
                            " into the run";
    for (auto& [memory, has_blocks_] : blocks) {
      const auto [device_id, kind] = memory;
      const bool want_blocks = has_blocks_;
      auto keep = [&, device_id = device_id, kind = kind](const db::EpochLiveRow& row) {
        return row.device_id == device_id && row.memory_kind == kind && (row.level == db::AllocLevel::Block) == want_blocks;
      };
      ++memories;
      bool reported = false;
      std::string doubt;
      const std::string where_ = d.who(rank) + " " + d.device_label(device_id) + " " + memory_kind_words(kind);
      for (const Series& s : series_of(*b)) {
        if (reported || s.windows.size() < 2) continue;
        std::optional<Values> live = aggregate_values(d, rank, s, keep);
        if (!live) {
          r.context.push_back(where_ + ": an epoch " + s.phase() + " has no live set in the aggregates; not compared there");
          continue;
        }
        const size_t from = b->warmup && live->v.size() >= 3 ? 1 : 0;
        Verdict v = evaluate(live->v, threshold_for(o.leak_threshold, live->v[from], live->v.size()), b->warmup);
        if (!v.leak) continue;
        const int at = s.kind == Series::End ? 1 : 0;
        const auto& rows_from = d.epoch_live.at({rank, s.windows[v.from]->epoch, at});
        const auto& rows_to = d.epoch_live.at({rank, s.windows[v.to]->epoch, at});
        // What each (name, stack) held at the two points. The sampled estimate's variance: the
        // change of each one's variance (rows alive at both points cancel; a site whose sampled
        // rows came and went between them in equal measure is not seen: a lower bound).
        struct Held { int64_t bytes = 0, count = 0, sampled = 0; double variance = 0; };
        std::map<std::pair<int64_t, int64_t>, std::pair<Held, Held>> by_site;
        for (auto* rows : {&rows_from, &rows_to})
          for (auto& row : *rows) {
            if (!keep(row)) continue;
            Held& h = rows == &rows_from ? by_site[{row.name_id, row.stack_id}].first : by_site[{row.name_id, row.stack_id}].second;
            h.bytes += row.bytes, h.count += row.allocations, h.sampled += row.sampled;
            h.variance += std::max(row.sampled_variance, 0.0);
          }
        double variance = 0;
        int64_t sampled_rows = 0;
        std::map<std::string, NamedBytes> net;
        for (auto& [site, held] : by_site) {
          variance += std::abs(held.second.variance - held.first.variance);
          sampled_rows += std::abs(held.second.sampled - held.first.sampled);
          const int64_t grew = held.second.bytes - held.first.bytes;
          if (grew <= 0) continue;
          Alloc a;
          a.name_id = site.first, a.stack_id = site.second;
          const std::string n = d.group_of(a);
          NamedBytes& g = net[n];
          g.name = n;
          g.bytes += grew;
          g.count += std::max<int64_t>(held.second.count - held.first.count, 0);
          g.sampled += std::max<int64_t>(held.second.sampled - held.first.sampled, 0);
          if (grew > g.largest_bytes) g.largest_bytes = grew, g.largest_stack = site.second;
        }
        const std::string unit = b->unit();
        const double error = std::sqrt(variance);
        const std::string error_text = "±" + format_bytes(error / double(v.to - v.from)) + " per " + unit;
        if (double(live->v[v.to] - live->v[v.from]) < 3 * error) {
          if (doubt.empty())
            doubt = where_ + " grew ~" + format_bytes(v.per_window) + " per " + unit + " at " + unit + " " + s.phase() +
                    ", within 3 standard errors of its sampled estimate (" + error_text + ", " + cut + ")";
          continue;
        }
        reported = true;
        for (auto it = net.begin(); it != net.end();) it = it->second.bytes > 0 && it->second.count > 0 ? std::next(it) : net.erase(it);
        auto top = sort_groups(net, 3);
        std::string line = where_ + ": live bytes at " + unit + " " + s.phase() + " grew " + (sampled_rows ? "~" : "") +
                           format_bytes(v.per_window) + " per " + unit + " (" + series_text(s, live->v) + "; " + cut + ")";
        if (sampled_rows)
          line += " (estimated from sampled allocations: " + error_text + ")";
        if (o.leak_threshold == 0 && v.threshold < kLeakThresholdMax)
          line += " (this memory's threshold: " + format_bytes(double(v.threshold)) + " per " + unit + ")";
        if (v.from > 0 && live->v[1] - live->v[0] < v.threshold) line += ", " + s.windows[0]->label + " taken as warm-up";
        if (!top.empty())
          line += "; alive at " + s.windows[v.to]->label + " " + s.phase() + " but not at " + s.windows[v.from]->label +
                  " " + s.phase() + ": " + describe_groups(d, top, "+");
        r.findings.push_back(std::move(line));
      }
      if (!reported && !doubt.empty()) within_error.push_back(std::move(doubt));
    }
  }

  // RSS as a witness (probed processes): growth of the resident set that the recorded host
  // allocations do not explain. Allocations under zt probe's host threshold, memory a library maps
  // itself and fragmentation reach the trace only there.
  const int64_t rss_threshold = o.rss_threshold > 0 ? o.rss_threshold : kRssThresholdDefault;
  int processes = 0, rss_findings = 0;
  std::vector<int64_t> probed_without_rss;
  std::set<int64_t> probed_ranks;
  for (auto& [key, rows] : groups)
    if (d.probed(std::get<0>(key))) probed_ranks.insert(std::get<0>(key));
  for (auto& [rank, samples] : d.rss)
    if (d.probed(rank)) probed_ranks.insert(rank);
  for (int64_t rank : probed_ranks) {
    auto samples = d.rss.find(rank);
    if (samples == d.rss.end() || samples->second.size() < 2) {
      probed_without_rss.push_back(rank);
      continue;
    }
    const Basis* b = basis(rank);
    if (!b) continue;
    Series s = series_of(*b).front();  // window starts, or their lowest points (windows of time)
    if (s.windows.size() < 2) continue;
    std::optional<Values> rss = rss_values(samples->second, s);
    if (!rss) continue;
    // The recorded host memory of the rank at the same moments.
    std::vector<const Alloc*> host;
    for (auto& [key, rows] : groups)
      if (std::get<0>(key) == rank && !d.is_accelerator(std::get<1>(key)) &&
          (std::get<2>(key) == db::MemoryKind::PageableHost || std::get<2>(key) == db::MemoryKind::PinnedHost))
        host.insert(host.end(), rows.begin(), rows.end());
    std::vector<int64_t> recorded = live_at(host, rss->at);
    // A rank whose detail stopped before its windows: its recorded allocations there are not known, so none
    // explain its RSS growth (said in the line).
    const bool unknown_recorded = not_compared.count(rank) > 0;
    if (unknown_recorded) recorded.assign(recorded.size(), 0);
    if (from_aggregates.count(rank)) {  // the recorded host memory at each epoch's start, from the aggregates
      auto agg = aggregate_values(d, rank, s, [&](const db::EpochLiveRow& row) {
        return !d.is_accelerator(row.device_id) &&
               (row.memory_kind == db::MemoryKind::PageableHost || row.memory_kind == db::MemoryKind::PinnedHost);
      });
      if (!agg) continue;
      recorded = agg->v;
    }
    Verdict v = evaluate(rss->v, rss_threshold, b->warmup);  // from, to, and growth in half the intervals
    const size_t counted = v.to - v.from;
    if (counted == 0) continue;
    if (std::set<int64_t>(rss->at.begin() + long(v.from), rss->at.end()).size() < 2) {
      // One sample stands for every compared point: the RSS could not be seen to grow.
      r.context.push_back(d.who(rank) + ": one RSS sample stands for every compared " + b->unit() +
                          " start (the " + b->unit() + "s are shorter than the sampling period): its growth was not "
                          "seen; zt probe --rss-interval-ms samples more often");
      continue;
    }
    used(*b);
    ++processes;
    const int64_t rss_growth = rss->v[v.to] - rss->v[v.from];
    const int64_t recorded_growth = recorded[v.to] - recorded[v.from];
    // Recorded memory that was freed does not excuse growth: only recorded growth explains.
    const double unexplained = double(rss_growth - std::max<int64_t>(recorded_growth, 0)) / double(counted);
    size_t grew = 0;
    for (size_t i = v.from; i < v.to; ++i) grew += rss->v[i + 1] > rss->v[i];
    if (!(unexplained >= double(rss_threshold) && 2 * grew >= counted)) continue;
    ++rss_findings;
    const std::string unit = b->unit();
    std::optional<int64_t> host_threshold;
    (void)d.probed(rank, &host_threshold);
    std::string line = d.who(rank) + " host RSS: " +
                       (s.kind == Series::Low ? "the lowest RSS of each window grew " : "RSS at " + unit + " start grew ") +
                       format_bytes(double(rss_growth) / double(counted)) + " per " + unit + ", " +
                       format_bytes(unexplained) + " per " + unit + " more than its recorded host allocations explain " +
                       "(they grew " + format_bytes(double(std::max<int64_t>(recorded_growth, 0)) / double(counted)) +
                       " per " + unit + "; RSS " + series_text(s, rss->v) + "; threshold " +
                       format_bytes(double(rss_threshold)) + " per " + unit + ", --rss-threshold)";
    if (v.from > 0) line += ", " + s.windows[0]->label + " taken as warm-up";
    if (unknown_recorded) line += "; its allocations past the end of the detail are not in the trace, so none are counted";
    const std::string below = "allocations under zt probe's --host-threshold" +
                              (host_threshold ? " (" + format_bytes(double(*host_threshold)) + ")" : std::string());
    if (d.sample_interval(rank) > 0)  // the sampled rows counted above: small allocations are in, as an estimate
      line += "; memory the trace does not record grows: memory a library maps itself, or fragmentation (" + below +
              " are counted by their sampled estimate); zt probe with a lower --host-threshold records more "
              "allocations one by one, with their lines";
    else
      line += "; memory the trace does not record one by one grows: " + below +
              " (not sampled in this run), memory a library maps itself, or fragmentation; zt probe samples them "
              "by bytes unless --sample-interval is 0, and a lower --host-threshold records them one by one, with "
              "their lines";
    r.findings.push_back(std::move(line));
  }

  if (memories == 0 && processes == 0) {
    r.outcome = Outcome::Skip;
    r.summary = !not_compared.empty()
                    ? "nothing compared: the trace's detail stopped before the windows of " +
                          std::to_string(not_compared.size()) + " rank" + (not_compared.size() == 1 ? "" : "s") +
                          " without epochs (see below)"
                : d.allocs.empty() && d.sampled.empty() && d.rss.empty()
                    ? "nothing to compare: the trace records no allocations and no RSS; record the program with "
                      "zt probe (or zt train, zt import)"
                    : "nothing to compare: the trace has no epochs, no steps and no span of time to cut into "
                      "windows; mark epochs (zerotrace.epoch(n), docs/python-jobs.md) or record a longer run";
    others_of_run(d, &r);
    return Status::Ok();
  }

  const std::string unit = kinds.size() == 1 && *kinds.begin() == BasisKind::Epochs ? "epoch"
                           : kinds.count(BasisKind::Epochs)                       ? "epoch or window"
                                                                                   : "window";
  const std::string limit = o.leak_threshold > 0
                                ? format_bytes(double(o.leak_threshold)) + " per " + unit
                                : format_bytes(double(kLeakThresholdMax)) + " per " + unit +
                                      ", or 1% of a smaller memory (" + format_bytes(double(kLeakThresholdMin)) +
                                      " at least)";
  std::string over;
  if (max_epochs) over = std::to_string(max_epochs) + " epochs";
  for (auto& w : window_words) over += (over.empty() ? "" : "; ") + w;
  if (time_bases.size() == 1) {
    over += (over.empty() ? "" : "; ") + (*time_bases.begin())->words;
  } else if (!time_bases.empty()) {
    // Each process's windows are cut from its own life: said once, with the range of their lengths (they
    // were repeated once per process: eleven times over a DataLoader's workers).
    int64_t shortest = INT64_MAX, longest = 0;
    for (const Basis* b : time_bases) shortest = std::min(shortest, b->width), longest = std::max(longest, b->width);
    over += (over.empty() ? "" : "; ") + std::to_string(kWindows) + " windows of time in each of " +
            std::to_string(time_bases.size()) + " processes (" + format_duration_ns(double(shortest)) +
            (shortest == longest ? "" : " to " + format_duration_ns(double(longest))) +
            " each), between the first tenth of its run, or the end of its imports, and its last tenth (no epochs or "
            "steps there: windows of time)";
  }
  const std::string rss_limit = format_bytes(double(rss_threshold)) + " per " + unit;
  const int leaking = int(r.findings.size()) - rss_findings;
  if (!r.findings.empty()) {
    r.outcome = Outcome::Fail;
    r.summary = std::to_string(leaking) + " of " + std::to_string(memories) + " memories grow across " + unit +
                "s (threshold " + limit + ")";
    if (rss_findings)
      r.summary += "; the RSS of " + std::to_string(rss_findings) + " of " + std::to_string(processes) + " process" +
                   (processes == 1 ? "" : "es") + " grows more than its recorded allocations explain (threshold " +
                   rss_limit + ")";
    if (kinds != std::set<BasisKind>{BasisKind::Epochs}) r.summary += ", over " + over;
  } else {
    const std::string where = kinds.count(BasisKind::TimeWindows) && kinds.size() == 1
                                  ? "the lowest live bytes of each window"
                                  : "live bytes at " + unit + " start and end";
    r.summary = where + " do not grow by " + limit + " or more on any of " + std::to_string(memories) +
                " memories over " + over;
    if (processes)
      r.summary += "; RSS growth the recorded allocations do not explain stays under " + rss_limit + " on " +
                   std::to_string(processes) + " process" + (processes == 1 ? "" : "es");
  }
  if (!probed_without_rss.empty())
    r.context.push_back(std::to_string(probed_without_rss.size()) + " probed process" +
                        (probed_without_rss.size() == 1 ? "" : "es") +
                        " without RSS samples (zt probe --rss-interval-ms 0?): growth outside the recorded "
                        "allocations was not looked at there");
  if (!d.derived_markers.empty()) r.context.push_back(d.derived_markers);
  for (auto& w : within_error) r.summary += "; " + w;
  others_of_run(d, &r);
  return Status::Ok();
}

}  // namespace zt::check::detail
