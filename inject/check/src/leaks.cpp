// --leaks: live bytes at the same phase of successive epochs (each epoch's start, and each
// epoch's end) per rank, device and memory kind; growth beyond the threshold is a leak.
// The rules and their reasons are in inject/check/README.md.
#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "trace_data.h"
#include "zt/common/units.h"

namespace zt::check::detail {

namespace {

struct Point {
  int64_t t = 0;
  int64_t epoch = 0;
};

struct Verdict {
  bool leak = false;
  double per_epoch = 0;
  int64_t threshold = 0;  // the one applied
  size_t from = 0, to = 0;  // the points compared (to = the last)
};

// live: bytes at successive points. The first interval is warm-up when there are three points
// or more (caches and lazily created state settle during the first epoch); the growth must be
// at least `threshold` per epoch on average and show in at least half of the intervals.
// The threshold of one memory: the one given, else 512 KiB, or 1% of the memory at the first
// compared point when that is smaller (a tiny run's 320 KiB per epoch is a quarter of its pinned
// memory), but at least 64 KiB. The lower one needs three points or more, so that the first
// epoch's lazily created state is left out as warm-up.
int64_t threshold_for(int64_t given, int64_t first_live, size_t points) {
  if (given > 0) return given;
  if (points < 3) return kLeakThresholdMax;
  return std::clamp<int64_t>(first_live / 100, kLeakThresholdMin, kLeakThresholdMax);
}

Verdict evaluate(const std::vector<int64_t>& live, int64_t given_threshold) {
  Verdict v;
  const size_t n = live.size();
  if (n < 2) return v;
  v.from = n >= 3 ? 1 : 0;
  v.to = n - 1;
  v.threshold = threshold_for(given_threshold, live[v.from], n);
  const int64_t threshold = v.threshold;
  const size_t counted = v.to - v.from;
  size_t grew = 0;
  for (size_t i = v.from; i < v.to; ++i) grew += live[i + 1] > live[i];
  v.per_epoch = double(live[v.to] - live[v.from]) / double(counted);
  v.leak = v.per_epoch >= double(threshold) && 2 * grew >= counted;
  return v;
}

// "epoch 0: 1.25 GiB, epoch 1: +1.00 MiB, epoch 2: +1.00 MiB": the first point, then each change.
std::string series_text(const std::vector<Point>& pts, const std::vector<int64_t>& live) {
  auto delta = [](int64_t d) { return (d < 0 ? "-" : "+") + format_bytes(double(d < 0 ? -d : d)); };
  std::string out = "epoch " + std::to_string(pts[0].epoch) + ": " + format_bytes(double(live[0]));
  const size_t n = pts.size();
  for (size_t i = 1; i < n; ++i) {
    if (n > 7 && i == 3) {
      out += ", ...";
      i = n - 4;  // the loop's ++ makes it the third from the end
      continue;
    }
    out += ", epoch " + std::to_string(pts[i].epoch) + ": " + delta(live[i] - live[i - 1]);
  }
  return out;
}

}  // namespace

Status check_leaks(TraceData& d, const Options& o, CheckResult* out) {
  CheckResult& r = *out;
  r.name = "leaks";
  size_t max_epochs = 0;
  for (auto& [rank, v] : d.epochs) max_epochs = std::max(max_epochs, v.size());
  if (max_epochs < 2) {
    r.outcome = Outcome::Skip;
    r.summary = max_epochs == 0 ? "the trace has no epoch markers: needs 2 epochs or more to compare"
                                : "the trace has 1 epoch: needs 2 or more to compare";
    return Status::Ok();
  }

  // Groups: (rank, device, memory kind). Tensor-level rows (blocks) where the group has any:
  // segments are the caching allocator's reserve, which grows during warm-up and stays cached.
  // The probe's sampled rows (host allocations under its threshold) join their memory's rows,
  // each counting for its weight (the bytes it stands for): live bytes are then an estimate.
  using Key = std::tuple<int64_t, int64_t, db::MemoryKind>;
  std::map<Key, bool> has_blocks;
  for (const auto* all : {&d.allocs, &d.sampled})
    for (auto& a : *all) {
      bool& b = has_blocks[Key{a.rank, a.device_id, a.kind}];
      b = b || a.level == db::AllocLevel::Block;
    }
  std::map<Key, std::vector<const Alloc*>> groups;
  for (const auto* all : {&d.allocs, &d.sampled})
    for (auto& a : *all) {
      Key k{a.rank, a.device_id, a.kind};
      if ((a.level == db::AllocLevel::Block) == has_blocks[k]) groups[k].push_back(&a);
    }
  std::vector<std::string> within_error;  // growth past the threshold that sampling error explains

  int memories = 0;
  for (auto& [key, rows] : groups) {
    auto [rank, device_id, kind] = key;
    auto eit = d.epochs.find(rank);
    if (eit == d.epochs.end() || eit->second.size() < 2) continue;
    ++memories;
    const auto& eps = eit->second;
    // Two series: at each epoch's start, and at each ended epoch's end.
    std::vector<Point> starts, ends;
    for (auto& e : eps) {
      starts.push_back({e.t_start, e.index});
      if (e.ended) ends.push_back({e.t_end, e.index});
    }
    bool reported = false;
    std::string doubt;  // growth past the threshold that sampling explains (said when not reported)
    for (int series = 0; series < 2 && !reported; ++series) {
      const std::vector<Point>& pts = series == 0 ? starts : ends;
      if (pts.size() < 2) continue;
      // Live bytes at each point: an allocation covers the points in [t_alloc, t_free).
      std::vector<size_t> order(pts.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return pts[x].t < pts[y].t; });
      std::vector<int64_t> ts(pts.size());
      for (size_t i = 0; i < order.size(); ++i) ts[i] = pts[order[i]].t;
      std::vector<int64_t> diff(pts.size() + 1, 0);
      for (const Alloc* a : rows) {
        size_t first = size_t(std::lower_bound(ts.begin(), ts.end(), a->t_alloc) - ts.begin());
        size_t last = size_t(std::lower_bound(ts.begin(), ts.end(), a->t_free) - ts.begin());
        if (first >= last) continue;
        diff[first] += a->weight;
        diff[last] -= a->weight;
      }
      std::vector<int64_t> live_sorted(pts.size());
      int64_t run = 0;
      for (size_t i = 0; i < pts.size(); ++i) live_sorted[i] = run += diff[i];
      std::vector<int64_t> live(pts.size());
      for (size_t i = 0; i < order.size(); ++i) live[order[i]] = live_sorted[i];

      Verdict v = evaluate(live, o.leak_threshold);
      if (!v.leak) continue;
      const char* phase = series == 0 ? "start" : "end";
      const int64_t t_from = pts[v.from].t, t_to = pts[v.to].t;
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
      const double growth = double(live[v.to] - live[v.from]), error = std::sqrt(variance);
      const std::string where_ = "rank " + std::to_string(rank) + " " + d.device_label(device_id) + " " +
                                 memory_kind_words(kind);
      if (growth < 3 * error) {
        if (doubt.empty())
          doubt = where_ + " grew ~" + format_bytes(v.per_epoch) + " per epoch at epoch " + phase +
                  ", within 3 standard errors of its sampled estimate (±" +
                  format_bytes(error / double(v.to - v.from)) + " per epoch)";
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
      std::string line = where_ + ": live bytes at epoch " + phase + " grew " + (sampled_rows ? "~" : "") +
                         format_bytes(v.per_epoch) + " per epoch (" + series_text(pts, live) + ")";
      if (sampled_rows)
        line += " (estimated from " + std::to_string(sampled_rows) + " sampled allocations: ±" +
                format_bytes(error / double(v.to - v.from)) + " per epoch)";
      if (o.leak_threshold == 0 && v.threshold < kLeakThresholdMax)
        line += " (this memory's threshold: " + format_bytes(double(v.threshold)) + " per epoch)";
      if (v.from > 0 && live[1] - live[0] < v.threshold)
        line += ", epoch " + std::to_string(pts[0].epoch) + " taken as warm-up";
      if (!top.empty())
        line += "; alive at epoch " + std::to_string(pts[v.to].epoch) + " " + phase + " but not at epoch " +
                std::to_string(pts[v.from].epoch) + " " + phase + ": " + describe_groups(d, top, "+");
      r.findings.push_back(std::move(line));
    }
    if (!reported && !doubt.empty()) within_error.push_back(std::move(doubt));
  }
  const std::string limit = o.leak_threshold > 0
                                ? format_bytes(double(o.leak_threshold)) + " per epoch"
                                : format_bytes(double(kLeakThresholdMax)) + " per epoch, or 1% of a smaller memory (" +
                                      format_bytes(double(kLeakThresholdMin)) + " at least)";
  if (!r.findings.empty()) {
    r.outcome = Outcome::Fail;
    r.summary = std::to_string(r.findings.size()) + " of " + std::to_string(memories) +
                " memories grow across epochs (threshold " + limit + ")";
  } else {
    r.summary = "live bytes at epoch start and end do not grow by " + limit + " or more on any of " +
                std::to_string(memories) + " memories over " + std::to_string(max_epochs) + " epochs";
  }
  for (auto& w : within_error) r.summary += "; " + w;
  return Status::Ok();
}

}  // namespace zt::check::detail
