// The aggregates the writer keeps for the whole run (aggregates.h).
#include "aggregates.h"

#include <algorithm>
#include <cctype>

#include "zt/db/sites.h"
#include "zt/db/trace_writer.h"

namespace zt::probe::detail {

std::optional<std::pair<db::MarkerKind, int64_t>> step_or_epoch_range(std::string_view name) {
  if (auto p = name.rfind("::"); p != std::string_view::npos) name.remove_prefix(p + 2);
  auto starts = [&](std::string_view word) {
    if (name.size() < word.size()) return false;
    for (size_t i = 0; i < word.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(name[i])) != word[i]) return false;
    return true;
  };
  db::MarkerKind kind;
  size_t i;
  if (starts("step")) kind = db::MarkerKind::Step, i = 4;
  else if (starts("epoch")) kind = db::MarkerKind::Epoch, i = 5;
  else return std::nullopt;
  if (i < name.size() && (name[i] == ' ' || name[i] == '_' || name[i] == ':' || name[i] == '#')) ++i;
  if (i == name.size() || name.size() - i > 9) return std::nullopt;  // a number below 2^31
  int64_t n = 0;
  for (; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    n = n * 10 + (name[i] - '0');
  }
  return std::make_pair(kind, n);
}

void Aggregates::alloc(int64_t id, int64_t t, const Live& a) {
  live_[id] = a;
  Op op{t, seq_++, OpKind::Change};
  op.sign = 1;
  op.a = a;
  ops_.push_back(op);
}

bool Aggregates::free(int64_t id, int64_t t, Live* freed) {
  auto it = live_.find(id);
  if (it == live_.end()) return false;
  *freed = it->second;
  Op op{t, seq_++, OpKind::Change};
  op.sign = -1;
  op.a = it->second;
  ops_.push_back(op);
  live_.erase(it);
  return true;
}

void Aggregates::boundary_begin(int64_t marker_id, db::MarkerKind kind, int rank, int64_t t, int64_t step,
                                int64_t epoch) {
  Op op{t, seq_++, OpKind::Begin};
  op.marker = marker_id, op.marker_kind = kind, op.rank = rank, op.step = step, op.epoch = epoch;
  ops_.push_back(op);
  boundaries_.insert(marker_id);
}

void Aggregates::marker_end(int64_t marker_id, int64_t t) {
  if (boundaries_.erase(marker_id) == 0) return;  // a phase or another range: not a boundary
  Op op{t, seq_++, OpKind::End};
  op.marker = marker_id;
  ops_.push_back(op);
}

void Aggregates::rss(int rank, int64_t t, int64_t bytes) {
  Op op{t, seq_++, OpKind::Rss};
  op.rank = rank, op.value = bytes;
  ops_.push_back(op);
}

void Aggregates::change(const Live& a, int sign) {
  if (a.kind == db::MemoryKind::ModuleGlobal) return;  // not the program's memory (schema.h)
  if (a.device <= 0) return;  // no device (a row whose device_id is NULL): no aggregate row can name it
  Device& d = devices_[a.device];
  d.rank = a.rank;
  if (a.weight == 0) {  // exact sums: rows recorded one by one
    int64_t& sum = a.level == db::AllocLevel::Block ? d.allocated : d.reserved;
    sum += sign * a.bytes;
    d.peak_allocated = std::max(d.peak_allocated, d.allocated);
    d.peak_reserved = std::max(d.peak_reserved, d.reserved);
  }
  const Key k{a.rank, a.device, uint8_t(a.kind), uint8_t(a.level), a.name, a.stack};
  auto [it, fresh] = live_set_.try_emplace(k);
  Sum& s = it->second;
  s.bytes += sign * (a.weight ? a.weight : a.bytes);
  s.count += sign;
  if (a.weight) {
    s.sampled += sign;
    s.variance += sign * db::sampled_variance(a.bytes, a.weight);
  }
  if (s.count == 0) live_set_.erase(it);
}

void Aggregates::write_step(db::TraceWriter& w, const Open& o, std::optional<int64_t> t_end) {
  for (auto& [device, d] : devices_) {
    if (d.rank != o.rank) continue;
    db::StepMemoryRow r;
    r.rank = o.rank;
    r.device_id = device;
    if (o.step >= 0) r.step = o.step;
    if (o.epoch >= 0) r.epoch = o.epoch;
    r.t_start = o.t_start;
    r.t_end = t_end;
    r.allocated_bytes = std::max<int64_t>(d.allocated, 0);
    r.reserved_bytes = std::max<int64_t>(d.reserved, 0);
    r.peak_allocated_bytes = std::max<int64_t>(d.peak_allocated, r.allocated_bytes);
    r.peak_reserved_bytes = std::max<int64_t>(d.peak_reserved, r.reserved_bytes);
    if (auto it = rss_.find(o.rank); it != rss_.end()) r.host_rss_bytes = it->second;
    w.insert(r);
  }
}

void Aggregates::write_live_set(db::TraceWriter& w, int rank, int64_t epoch, int at, int64_t t) {
  if (epoch < 0) return;  // an epoch marker without its number: no row can name it
  for (auto& [k, s] : live_set_) {
    if (std::get<0>(k) != rank || s.count <= 0) continue;
    db::EpochLiveRow r;
    r.rank = rank;
    r.epoch = epoch;
    r.at = at;
    r.t = t;
    r.device_id = std::get<1>(k);
    r.memory_kind = db::MemoryKind(std::get<2>(k));
    r.level = db::AllocLevel(std::get<3>(k));
    r.name_id = std::get<4>(k);
    r.stack_id = std::get<5>(k);
    r.bytes = std::max<int64_t>(s.bytes, 0);
    r.allocations = s.count;
    r.sampled = std::max<int64_t>(s.sampled, 0);
    r.sampled_variance = std::max(s.variance, 0.0);
    w.insert(r);
  }
}

void Aggregates::apply(db::TraceWriter& w) {
  // Time order; at one time frees, then allocations (a free-then-alloc is no false peak, as in the
  // readers' peaks), then the boundaries ("alive at t" counts an allocation made at t and not one
  // freed at t), then the order the writer met them in.
  auto rank_of = [](const Op& o) { return o.kind != OpKind::Change ? 2 : o.sign < 0 ? 0 : 1; };
  auto before = [&](const Op& x, const Op& y) {
    const int cx = rank_of(x), cy = rank_of(y);
    return std::tie(x.t, cx, x.seq) < std::tie(y.t, cy, y.seq);
  };
  if (!std::is_sorted(ops_.begin(), ops_.end(), before)) std::sort(ops_.begin(), ops_.end(), before);
  for (const Op& op : ops_) {
    switch (op.kind) {
      case OpKind::Change:
        change(op.a, op.sign);
        break;
      case OpKind::Rss:
        rss_[op.rank] = op.value;
        break;
      case OpKind::Begin: {
        Open o{op.marker_kind, op.rank, op.t, op.step, op.epoch};
        if (o.kind == db::MarkerKind::Step) {
          if (o.epoch < 0)  // a range "step N": the epoch open on its rank, if any
            for (auto& [id, e] : open_)
              if (e.kind == db::MarkerKind::Epoch && e.rank == o.rank) o.epoch = e.step;
          for (auto& [device, d] : devices_)
            if (d.rank == o.rank) d.peak_allocated = d.allocated, d.peak_reserved = d.reserved;
        } else {
          o.step = op.epoch;  // an epoch's number, kept where a step's is
          write_live_set(w, o.rank, o.step, 0, op.t);
        }
        open_[op.marker] = o;
        break;
      }
      case OpKind::End: {
        auto it = open_.find(op.marker);
        if (it == open_.end()) break;  // not a step or epoch (or its begin comes in a later cycle)
        if (it->second.kind == db::MarkerKind::Step) write_step(w, it->second, op.t);
        else write_live_set(w, it->second.rank, it->second.step, 1, op.t);
        open_.erase(it);
        break;
      }
    }
  }
  ops_.clear();
}

void Aggregates::finish(db::TraceWriter& w) {
  apply(w);
  for (auto& [id, o] : open_)
    if (o.kind == db::MarkerKind::Step) write_step(w, o, std::nullopt);
  open_.clear();
}

}  // namespace zt::probe::detail
