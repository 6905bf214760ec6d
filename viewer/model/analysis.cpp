#include "analysis.h"

#include <algorithm>
#include <map>
#include <set>

namespace zt::viewer {
namespace {
using db::AllocLevel;

// A segment whose blocks are recorded double-counts them, and so does a second record of a
// segment (CUPTI's twin of the trainer's); everything else is memory a tensor (or a buffer) holds.
bool counts_as_live(const Allocations& a, size_t i) {
  return !(a.level[i] == uint8_t(AllocLevel::Segment) && (a.holds_blocks[i] || a.second_record[i]));
}
}  // namespace

std::vector<LeakGroup> find_leaks(const TraceModel& m) {
  const Allocations& a = m.alloc;
  size_t epochs = 0;
  for (auto& v : m.epoch_ends) epochs = std::max(epochs, v.size());
  std::map<std::pair<std::string, std::string>, LeakGroup> groups;
  std::map<std::pair<std::string, std::string>, std::set<int>> group_devices;
  std::vector<std::string> group_name_of(0);
  for (size_t i = 0; i < a.size(); ++i) {
    if (!counts_as_live(a, i)) continue;
    bool alive = !a.freed[i];
    int d = a.device[i];
    int rank = d >= 0 ? m.devices[size_t(d)].rank : 0;
    const std::vector<int64_t>* ends = rank >= 0 && size_t(rank) < m.epoch_ends.size() ? &m.epoch_ends[size_t(rank)] : nullptr;
    // Epoch ends this allocation lives across: [first, last).
    size_t first = 0, last = 0;
    if (ends && !ends->empty()) {
      first = size_t(std::lower_bound(ends->begin(), ends->end(), a.t_alloc[i]) - ends->begin());
      last = alive ? ends->size()
                   : size_t(std::upper_bound(ends->begin(), ends->end(), a.t_free[i] - 1) - ends->begin());
    }
    if (!alive && last <= first) continue;
    // One row per tensor name and site (zt/db/sites.h): the rule zt check and zt db top group by,
    // so that one Python line's allocations are one row whatever native stacks they came through.
    auto key = std::make_pair(leak_group_name(m.str(a.name[i])), a.stack[i] ? m.site(a.stack[i]) : std::string());
    auto [it, inserted] = groups.try_emplace(key);
    LeakGroup& g = it->second;
    if (inserted) {
      g.name = key.first;
      g.site = key.second;
      g.stack_id = a.stack[i];
      g.bytes_at_epoch_end.assign(epochs, 0);
      g.first_alloc = a.t_alloc[i];
      g.example = uint32_t(i);
    }
    const int64_t counted = a.weight[i];
    if (alive) {
      ++g.alive_count;
      g.alive_bytes += counted;
      g.sampled += counted != a.bytes[i];
    }
    for (size_t e = first; e < last && e < epochs; ++e) g.bytes_at_epoch_end[e] += counted;
    if (d >= 0) group_devices[key].insert(d);
  }
  std::vector<LeakGroup> out;
  for (auto& [key, g] : groups) {
    const auto& v = g.bytes_at_epoch_end;
    if (v.size() >= 2) {
      bool never_less = true;
      for (size_t e = 1; e < v.size(); ++e) never_less = never_less && v[e] >= v[e - 1];
      g.grows = never_less && v.back() > v.front();
    }
    if (g.alive_count == 0 && !g.grows) continue;
    for (int d : group_devices[key]) {
      if (!g.devices.empty()) g.devices += ", ";
      g.devices += "rank " + std::to_string(m.devices[size_t(d)].rank) + " " + m.devices[size_t(d)].label;
    }
    out.push_back(std::move(g));
  }
  std::stable_sort(out.begin(), out.end(), [](const LeakGroup& x, const LeakGroup& y) {
    if (x.grows != y.grows) return x.grows;
    return x.alive_bytes > y.alive_bytes;
  });
  return out;
}

std::vector<std::string> error_tensor_names(const std::string& json) {
  // A JSON array of strings; names never contain quotes, so split on them.
  std::vector<std::string> out;
  for (size_t q = json.find('"'); q != std::string::npos;) {
    size_t e = json.find('"', q + 1);
    if (e == std::string::npos) break;
    std::string name = json.substr(q + 1, e - q - 1);
    // "fp32_partitioned_groups_flat[3].grad@cuda:0": the device the tensor was on follows the
    // last '@'; the placement rows name the tensor alone.
    if (size_t at = name.rfind('@'); at != std::string::npos && at > 0) name.resize(at);
    out.push_back(std::move(name));
    q = json.find('"', e + 1);
  }
  return out;
}

std::vector<TensorPlacement> placement_timeline(const TraceModel& m, int64_t merge_gap_ns, Status* status) {
  Status loaded = m.load_placements();
  if (status) *status = loaded;
  const Placements& p = m.place;
  struct Open {
    int device;
    int64_t t0;
  };
  std::map<std::pair<int, int32_t>, size_t> index;  // (rank, tensor) -> out index
  std::vector<TensorPlacement> out;
  std::vector<std::vector<Open>> open;
  auto close = [&](size_t k, int device, int64_t t) {
    auto& o = open[k];
    for (size_t j = 0; j < o.size();) {
      if (device < 0 || o[j].device == device) {
        auto& spans = out[k].spans;
        if (!spans.empty() && spans.back().device == o[j].device && o[j].t0 - spans.back().t1 <= merge_gap_ns)
          spans.back().t1 = std::max(spans.back().t1, t);
        else
          spans.push_back({o[j].t0, t, o[j].device, false});
        o.erase(o.begin() + long(j));
      } else {
        ++j;
      }
    }
  };
  for (size_t i = 0; i < p.size(); ++i) {
    auto key = std::make_pair(int(p.rank[i]), p.tensor[i]);
    auto [it, inserted] = index.try_emplace(key, out.size());
    if (inserted) {
      out.push_back({m.str(p.tensor[i]), int(p.rank[i]), {}, false, false, ""});
      open.emplace_back();
    }
    size_t k = it->second;
    auto why = db::PlacementWhy(p.why[i]);
    int d = p.device[i];
    if (why == db::PlacementWhy::Freed) {
      close(k, d, p.t[i]);
      continue;
    }
    if (why == db::PlacementWhy::Moved)
      for (auto& o : std::vector<Open>(open[k]))
        if (o.device != d) close(k, o.device, p.t[i]);
    bool already = false;
    for (auto& o : open[k]) already = already || o.device == d;
    if (!already) open[k].push_back({d, p.t[i]});
  }
  for (size_t k = 0; k < out.size(); ++k) close(k, -1, m.t_last);

  // Siblings (same name with the numbers hidden) should agree on host vs accelerator; the
  // class most siblings use is "expected", a span anywhere else is a mismatch.
  auto is_host = [&](int d) { return d >= 0 && m.devices[size_t(d)].host; };
  std::map<std::string, std::array<int, 2>> votes;  // pattern -> tensors seen on {accelerator, host}
  std::vector<std::string> pattern(out.size());
  for (size_t k = 0; k < out.size(); ++k) {
    pattern[k] = sibling_pattern(out[k].name);
    bool seen[2] = {false, false};
    for (auto& s : out[k].spans)
      if (s.device >= 0) seen[is_host(s.device)] = true;
    for (int c = 0; c < 2; ++c) votes[pattern[k]][c] += seen[c];
  }
  std::set<std::pair<int, std::string>> named_in_errors;  // (rank, tensor name)
  for (auto& f : m.flags) {
    if (!f.is_error) continue;
    for (const std::string& t : error_tensor_names(f.tensors)) named_in_errors.insert({f.rank, t});
  }
  for (size_t k = 0; k < out.size(); ++k) {
    auto v = votes[pattern[k]];
    out[k].in_error = named_in_errors.count({out[k].rank, out[k].name}) > 0;
    if (v[0] + v[1] < 2 || v[0] == v[1]) {
      out[k].expected = v[0] == v[1] ? "" : (v[1] > v[0] ? "host" : "accelerator");
      if (v[0] + v[1] < 2) out[k].expected = "";
    } else {
      bool host_expected = v[1] > v[0];
      out[k].expected = host_expected ? "host" : "accelerator";
      for (auto& s : out[k].spans)
        if (s.device >= 0 && is_host(s.device) != host_expected) s.mismatch = out[k].mismatch = true;
    }
    // Spans by start time, the mismatched ones last: a bar painted in this order shows the
    // wrong-device span on top of the (usually longer) span it overlaps.
    std::stable_sort(out[k].spans.begin(), out[k].spans.end(), [](const PlacementSpan& x, const PlacementSpan& y) {
      if (x.mismatch != y.mismatch) return y.mismatch;
      return x.t0 < y.t0;
    });
  }
  std::vector<size_t> order(out.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    int rx = out[x].mismatch * 2 + out[x].in_error, ry = out[y].mismatch * 2 + out[y].in_error;
    if (rx != ry) return rx > ry;
    if (out[x].rank != out[y].rank) return out[x].rank < out[y].rank;
    return out[x].name < out[y].name;
  });
  std::vector<TensorPlacement> sorted;
  sorted.reserve(out.size());
  for (size_t k : order) sorted.push_back(std::move(out[k]));
  return sorted;
}

PlayheadState state_at(const TraceModel& m, int64_t t, size_t top_n) {
  PlayheadState st;
  st.t = t;
  const Allocations& a = m.alloc;
  st.live.assign(m.devices.size(), {});
  st.live_total.assign(m.devices.size(), 0);
  size_t end = size_t(std::upper_bound(a.t_alloc.begin(), a.t_alloc.end(), t) - a.t_alloc.begin());
  std::vector<uint32_t> live;
  for (size_t i = 0; i < end; ++i) {
    if (a.freed[i] && a.t_free[i] <= t) continue;
    if (!counts_as_live(a, i) || a.device[i] < 0) continue;
    st.live[size_t(a.device[i])][a.family[i]] += a.bytes[i];
    st.live_total[size_t(a.device[i])] += a.bytes[i];
    live.push_back(uint32_t(i));
  }
  size_t n = std::min(top_n, live.size());
  std::partial_sort(live.begin(), live.begin() + long(n), live.end(),
                    [&](uint32_t x, uint32_t y) { return a.bytes[x] > a.bytes[y]; });
  st.largest.assign(live.begin(), live.begin() + long(n));
  // In-flight work: spans that started by t and end after it.
  for (const Track& tr : m.tracks) {
    if (tr.kind != TrackKind::Transfers && tr.kind != TrackKind::Kernels && tr.kind != TrackKind::Markers) continue;
    for (const IntervalLane& lane : tr.lanes) {
      auto [i, last] = visible_range(lane, t + 1, t);
      for (; i < last; ++i) {
        if (lane.start[i] > t || lane.end[i] <= t) continue;
        if (tr.kind == TrackKind::Transfers) st.transfers_in_flight.push_back(lane.item[i]);
        else if (tr.kind == TrackKind::Kernels) st.kernels_running.push_back(lane.item[i]);
        else st.open_markers.push_back(lane.item[i]);
      }
    }
  }
  return st;
}

RangeSummary summarize_range(const TraceModel& m, int64_t t0, int64_t t1, size_t top_n) {
  RangeSummary r;
  r.t0 = t0;
  r.t1 = t1;
  const Transfers& x = m.xfer;
  size_t i = size_t(std::lower_bound(x.t_start.begin(), x.t_start.end(), t0) - x.t_start.begin());
  for (; i < x.size() && x.t_start[i] < t1; ++i) {
    int d = int(direction_of(db::TransferKind(x.kind[i])));
    r.bytes[size_t(d)] += x.bytes[i];
    ++r.count[size_t(d)];
  }
  for (const Track& tr : m.tracks) {
    if (tr.kind != TrackKind::Memory && tr.kind != TrackKind::HostMemory) continue;
    for (auto& ref : tr.series) {
      double lo, hi;
      if (m.series[size_t(ref.series)].range_min_max(t0, t1, &lo, &hi)) r.peaks.push_back({tr.device, ref.name, hi});
    }
  }
  const Allocations& a = m.alloc;
  size_t b = size_t(std::lower_bound(a.t_alloc.begin(), a.t_alloc.end(), t0) - a.t_alloc.begin());
  std::vector<uint32_t> kept;
  for (; b < a.size() && a.t_alloc[b] < t1; ++b) {
    if (!counts_as_live(a, b)) continue;
    ++r.allocations;
    if (!a.freed[b] || a.t_free[b] >= t1) {
      ++r.kept;
      r.kept_bytes += a.bytes[b];
      kept.push_back(uint32_t(b));
    }
  }
  size_t n = std::min(top_n, kept.size());
  std::partial_sort(kept.begin(), kept.begin() + long(n), kept.end(),
                    [&](uint32_t p, uint32_t q) { return a.bytes[p] > a.bytes[q]; });
  r.kept_largest.assign(kept.begin(), kept.begin() + long(n));
  return r;
}

}  // namespace zt::viewer
