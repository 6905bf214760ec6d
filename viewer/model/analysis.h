// viewer/model/analysis.h: the questions the panels ask of a loaded trace.
//
// Owns the answers, computed from TraceModel's columns without SQL: leak groups (alive at
// the end, or growing across epochs, grouped by tensor name and allocation site), each tensor's
// placement over time with device mismatches, the state at the playhead (live bytes per
// device and family, largest live allocations, what is in flight), and the summary of a
// selected time range. Times here are trace times (not aligned view times).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "trace_model.h"

namespace zt::viewer {

struct LeakGroup {
  std::string name;  // leak_group_name() of the tensor name
  std::string site;  // the site of its stacks (zt/db/sites.h, the rule zt check and zt db top use); "" without a stack
  int64_t stack_id = 0;  // one of its stacks (the first allocation's)
  int64_t sampled = 0;   // alive rows that are sampled (the probe's byte sampler): alive_bytes is then an estimate
  std::string devices;  // labels, comma separated
  int64_t alive_count = 0, alive_bytes = 0;  // never freed; sampled rows by their weight
  std::vector<int64_t> bytes_at_epoch_end;   // live bytes of the group at each epoch's end, sampled rows by weight
  bool grows = false;                        // strictly more at the last epoch end than the first, never less
  int64_t first_alloc = 0;                   // earliest allocation still alive at the end (or growing)
  uint32_t example = 0;                      // one allocation row of the group, for the details panel
};

// Groups worth showing, largest alive bytes first. Segments that blocks live in are left out:
// they are the allocator's cache, and their blocks tell the story.
std::vector<LeakGroup> find_leaks(const TraceModel& m);

// The tensor names of an error row's `tensors` (a JSON array of strings), each without the
// "@device" suffix the trainer appends ("x.grad@cuda:0" -> "x.grad").
std::vector<std::string> error_tensor_names(const std::string& json);

struct PlacementSpan {
  int64_t t0 = 0, t1 = 0;
  int device = -1;
  bool mismatch = false;
};
struct TensorPlacement {
  std::string name;
  int rank = 0;
  std::vector<PlacementSpan> spans;  // by start time, mismatched spans last (drawn on top)
  bool mismatch = false;  // some span on a device class (host vs accelerator) its siblings never use
  bool in_error = false;  // named in an error row of the same rank (its "@device" suffix ignored)
  std::string expected;   // "host" or "accelerator": where its siblings live
};

// One entry per (rank, tensor name), mismatched and error-named tensors first. Spans on one
// device separated by less than `merge_gap_ns` merge, so a tensor gathered every step reads
// as one bar rather than thousands.
// Reads the placement rows on first use; a read failure leaves the list empty and is
// reported through *status (optional).
std::vector<TensorPlacement> placement_timeline(const TraceModel& m, int64_t merge_gap_ns, Status* status = nullptr);

struct PlayheadState {
  int64_t t = 0;
  std::vector<std::array<int64_t, kFamilyCount>> live;  // per device, per family
  std::vector<int64_t> live_total;                      // per device
  std::vector<uint32_t> largest;                        // allocation rows, largest first
  std::vector<uint32_t> transfers_in_flight;            // transfer rows
  std::vector<uint32_t> kernels_running;                // kernel rows
  std::vector<uint32_t> open_markers;                   // marker rows containing t (innermost last)
};

// Scans the allocations made before t: O(allocations before t), done once per playhead move.
PlayheadState state_at(const TraceModel& m, int64_t t, size_t top_n);

struct RangeSummary {
  int64_t t0 = 0, t1 = 0;
  std::array<int64_t, kDirectionCount> bytes{}, count{};  // transfers starting in the range
  struct Peak {
    int device = -1;
    std::string series;
    double peak = 0;
  };
  std::vector<Peak> peaks;  // per memory series with data in the range
  int64_t allocations = 0;  // made in the range
  int64_t kept = 0, kept_bytes = 0;  // of those, not freed by the range's end
  std::vector<uint32_t> kept_largest;
};
RangeSummary summarize_range(const TraceModel& m, int64_t t0, int64_t t1, size_t top_n);

}  // namespace zt::viewer
