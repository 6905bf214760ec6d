// probe/src/aggregates.h: the aggregates of a whole run (db/SCHEMA.md, "Aggregates"), kept by the
// Recorder's writer thread from the events it drains, whether or not their detail rows are
// written: per step and device the live bytes at the step's end and the peak within it, the
// host RSS; at each epoch's start and end the live set by (device, memory kind, level, name,
// stack), sampled rows by their weight.
//
// Owns: the table of live allocations (id -> what a free takes back) and the running sums. Used
// by the writer thread only (no lock).
// Invariants:
//  - Within one writer cycle, the changes are applied in time order (allocations and frees at a
//    time before the boundaries at that time: "alive at t" is t_alloc <= t < t_free, as the
//    readers count it); an event that reaches the writer a cycle after a boundary it precedes
//    (its thread's ring drained late) counts after that boundary.
//  - Exact sums (allocated, reserved, peaks) leave out sampled rows and module globals, as every
//    reader's exact sums do; the live set counts sampled rows by their weight, and leaves out
//    module globals.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "zt/db/rows.h"

namespace zt::db {
class TraceWriter;
}

namespace zt::probe::detail {

// A range name that says a step or an epoch: "step 3", "zerotrace::epoch 1", "Step_7", "epoch:2"
// (the NVTX convention and the zerotrace module's names: zt/db/derive_steps.h, sources 2 and 4).
// Kind Step or Epoch and the number; nullopt for any other name.
std::optional<std::pair<db::MarkerKind, int64_t>> step_or_epoch_range(std::string_view name);

class Aggregates {
 public:
  struct Live {
    int32_t rank = 0;
    int32_t device = 0;
    db::MemoryKind kind = db::MemoryKind::Unknown;
    db::AllocLevel level = db::AllocLevel::Block;
    int32_t name = 0, stack = 0;
    int64_t bytes = 0;
    int64_t weight = 0;     // a sampled row's weight; 0: recorded one by one
    bool detailed = false;  // its allocation row is in the trace
    // The rest of its row, for a row written later (a detail window opening while it is live, the
    // flight recorder's ring at the end): the row it would have had.
    db::Source source = db::Source::Api;
    int64_t t_alloc = 0, requested = 0, segment = 0, stream = -1;
    uint64_t address = 0;
  };

  // The writer's calls, as it meets the events.
  void alloc(int64_t id, int64_t t, const Live& a);
  // A free of `id` at t: true when the allocation is live here (then *freed is what it was, and
  // its `detailed` says whether its row is in the trace); false when it is not known (yet).
  bool free(int64_t id, int64_t t, Live* freed);
  // Each live allocation whose row is not in the trace, by id (a window opens, the ring is
  // written): f(id, live); they count as written from then on.
  template <class F>
  void write_undetailed(F&& f) {
    for (auto& [id, l] : live_)
      if (!l.detailed) {
        f(id, l);
        l.detailed = true;
      }
  }
  void boundary_begin(int64_t marker_id, db::MarkerKind kind, int rank, int64_t t, int64_t step, int64_t epoch);
  void marker_end(int64_t marker_id, int64_t t);
  void rss(int rank, int64_t t, int64_t bytes);
  // The cycle's changes in time order; the rows they end go to w (inside its transaction).
  void apply(db::TraceWriter& w);
  // The run ends: steps still open are written without an end.
  void finish(db::TraceWriter& w);

  size_t live_allocations() const { return live_.size(); }

 private:
  enum class OpKind : uint8_t { Change, Begin, End, Rss };
  struct Op {
    int64_t t;
    uint64_t seq;
    OpKind kind;
    int sign = 0;  // Change: +1 an allocation, -1 a free
    Live a{};
    int64_t marker = 0;
    db::MarkerKind marker_kind = db::MarkerKind::Step;
    int rank = 0;
    int64_t step = -1, epoch = -1, value = 0;
  };
  struct Device {
    int32_t rank = 0;
    int64_t allocated = 0, reserved = 0, peak_allocated = 0, peak_reserved = 0;
  };
  struct Open {
    db::MarkerKind kind;
    int rank;
    int64_t t_start, step, epoch;
  };
  using Key = std::tuple<int32_t, int32_t, uint8_t, uint8_t, int32_t, int32_t>;  // rank, device, kind, level, name, stack
  struct KeyHash {
    size_t operator()(const Key& k) const {
      uint64_t h = uint64_t(uint32_t(std::get<0>(k))) * 0x9E3779B97F4A7C15ull;
      h ^= (uint64_t(uint32_t(std::get<1>(k))) << 16 | uint64_t(std::get<2>(k)) << 8 | std::get<3>(k)) + (h << 6) + (h >> 2);
      h ^= uint64_t(uint32_t(std::get<4>(k))) * 0xC2B2AE3D27D4EB4Full + (h << 6) + (h >> 2);
      h ^= uint64_t(uint32_t(std::get<5>(k))) * 0x165667B19E3779F9ull + (h << 6) + (h >> 2);
      return size_t(h);
    }
  };
  struct Sum {
    int64_t bytes = 0, count = 0, sampled = 0;
    double variance = 0;
  };

  void change(const Live& a, int sign);
  void write_step(db::TraceWriter& w, const Open& o, std::optional<int64_t> t_end);
  void write_live_set(db::TraceWriter& w, int rank, int64_t epoch, int at, int64_t t);

  std::unordered_map<int64_t, Live> live_;
  std::vector<Op> ops_;
  uint64_t seq_ = 0;
  std::map<int32_t, Device> devices_;
  std::map<int64_t, Open> open_;              // step and epoch markers begun and not ended, by id
  std::unordered_set<int64_t> boundaries_;    // their ids as met (before the cycle's apply), for marker_end
  std::map<int, int64_t> rss_;                // per rank, the last sample
  std::unordered_map<Key, Sum, KeyHash> live_set_;
};

}  // namespace zt::probe::detail
