// viewer/model/trace_model.h: one trace, loaded once into time-sorted in-memory columns.
//
// Owns: every row the timeline draws (allocations, transfers, kernels, markers, placements,
// faults, errors), the interned strings, the tracks (per rank and device) built from them,
// and the memory series (allocated, reserved, host pinned/pageable, recorded counters).
// Reads the trace only through zt::db::TraceReader; after load() nothing here touches SQL
// except stack_text(), which fetches one call stack on demand (stacks are many and rarely
// looked at), and load_placements(), read once when the placement view first opens. No GL or ImGui: unit tests drive this without a window.
// Invariants: column rows are sorted by their start time; lanes index into the columns;
// an allocation never freed ends at t_last (the end of the trace), flagged by freed == 0.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "families.h"
#include "lod.h"
#include "zt/common/status.h"
#include "zt/db/rows.h"
#include "zt/db/sites.h"

namespace zt::db {
class TraceReader;
}

namespace zt::viewer {

struct DeviceInfo {
  int64_t id = 0;
  int rank = 0;
  std::string label;  // "cuda:0", "cpu"
  std::string name;
  int64_t capacity = 0;  // 0: unknown
  bool host = false;
};

struct Allocations {
  std::vector<int64_t> id, t_alloc, t_free, bytes, stack;
  // The bytes a row counts for in an estimate by site (the leaks view): a sampled row's weight
  // (allocation.weight_bytes, the probe's byte sampler), else its bytes.
  std::vector<int64_t> weight;
  std::vector<int32_t> device, name;  // device: index into TraceModel::devices
  std::vector<uint8_t> kind, level, family, freed;
  // in_segment: a block carved from a recorded segment; holds_blocks: a segment that blocks
  // were carved from; second_record: a segment another source also recorded (CUPTI's twin of
  // the trainer's segment, db::is_second_record). Together they keep live-byte sums from
  // counting memory twice.
  std::vector<uint8_t> in_segment, holds_blocks, second_record;
  size_t size() const { return t_alloc.size(); }
};

struct Transfers {
  std::vector<int64_t> t_start, t_end, bytes;
  std::vector<int32_t> rank, src, dst, name, op;  // src/dst: device index or -1
  std::vector<uint8_t> kind;
  size_t size() const { return t_start.size(); }
};

struct Kernels {
  std::vector<int64_t> t_start, t_end;
  std::vector<int32_t> device, name;
  size_t size() const { return t_start.size(); }
};

struct Markers {
  std::vector<int64_t> t_start, t_end, step, epoch;  // step/epoch -1: none
  std::vector<int32_t> rank, name;
  std::vector<uint8_t> kind;
  size_t size() const { return t_start.size(); }
};

struct Placements {
  std::vector<int64_t> t, bytes;
  std::vector<int32_t> rank, tensor, device;  // device index or -1
  std::vector<uint8_t> why;
  size_t size() const { return t.size(); }
};

// Direction lanes of a transfers track.
enum class Direction : uint8_t { H2D = 0, D2H, D2D, Collective };
inline constexpr int kDirectionCount = 4;
Direction direction_of(db::TransferKind);
const char* to_string(Direction);

// A counter that only ever adds up (bytes or items since the start, frees never subtracted):
// named "..._total" or "...bytes_allocated" (the probe's host_small_bytes_allocated). It says
// nothing of memory in use, so no memory track draws it or takes its scale from it
// ("pinned_allocated", bytes in use now, is not one).
bool is_cumulative_counter(std::string_view name);

enum class TrackKind : uint8_t { Markers, Memory, HostMemory, Allocations, Transfers, Kernels, Flags };

struct SeriesRef {
  std::string name;  // "allocated", "reserved", "pinned", "pageable", or a counter's name
  int series = -1;   // index into TraceModel::series
};

struct Track {
  TrackKind kind = TrackKind::Markers;
  int rank = 0;
  int device = -1;  // device index for device tracks
  std::string title;
  std::vector<IntervalLane> lanes;
  std::vector<std::string> lane_names;
  std::vector<SeriesRef> series;  // memory tracks
  int64_t capacity = 0;           // memory tracks: drawn as a line when known
  // Allocation tracks: the families of the rows drawn (bit 1 << Family) and whether allocator
  // segments are among them: what the track's legend names.
  uint8_t families = 0;
  bool segments = false;
};

struct Flag {
  int64_t t = 0;
  int rank = 0;
  bool is_error = false;
  int64_t step = -1;
  std::string title;   // fault name or error kind
  std::string detail;  // details or message
  std::string tensors; // errors: JSON list of tensors involved
  int device = -1;
};

struct LoadProgress {
  std::atomic<int64_t> rows_done{0};
  std::atomic<int64_t> rows_total{0};
  std::atomic<bool> cancel{false};
};

// What load() reads. All: every row the timeline draws. Overview: the aggregates alone (a version 3
// trace's step_memory and detail_span), the step and epoch markers, faults and errors: a day-long
// trace's first frame, drawn before its detail is read (db/SCHEMA.md, "Aggregates").
enum class LoadScope : uint8_t { All, Overview };

class TraceModel {
 public:
  // Reads the trace. `progress` (optional) is updated as rows arrive, from this thread.
  static Status load(const std::string& path, std::unique_ptr<TraceModel>* out, LoadProgress* progress = nullptr,
                     LoadScope scope = LoadScope::All);
  ~TraceModel();

  const std::string& path() const { return path_; }
  const std::string& str(int64_t id) const;
  int64_t intern_lookup(const std::string& text) const;  // 0 if absent

  // The call stack of an allocation, innermost frame first; read from the file on demand.
  Status stack_text(int64_t stack_id, std::vector<std::string>* lines) const;
  // Where a stack allocated (zt/db/sites.h): its Python line ("grow (/x/leak.py:12)"), else its first
  // native frame that is not the allocator's; "" for stack 0. The frame and stack tables are read at
  // the first call, each site once.
  const std::string& site(int64_t stack_id) const;

  // Time span of everything in the trace, and the alignment point (the start of the lowest
  // rank's step 0, or t_first when there are no steps) used to put two traces on one axis.
  int64_t t_first = 0, t_last = 0, t_align = 0;
  std::string align_label = "step 0";  // what t_align is: "step 0", "step 3" (the first recorded), "the first event"
  int ranks = 0;
  int64_t rows = 0;  // rows read, every table
  int64_t step_rows = 0;  // step_memory rows read
  // The overview (LoadScope::Overview): the memory tracks are drawn from step_memory alone; no
  // allocation, transfer, kernel, range or counter row was read.
  bool overview = false;
  // Where the detail stopped (the earliest end of a detail_span row; -1: it went on to the end),
  // and why. Past it the memory tracks draw step_memory's per-step values (allocated, reserved
  // at each step's end; each step's peaks; "live (per step)" on a host device), and the timeline
  // marks the stretch as aggregates only.
  int64_t detail_end = -1;
  std::string detail_reason;

  std::vector<DeviceInfo> devices;
  Allocations alloc;
  Transfers xfer;
  Kernels kern;
  Markers mark;
  // Placements are read on first use (load_placements): only the placement view needs them,
  // and on a large trace they are a third of the rows.
  mutable Placements place;
  Status load_placements() const;
  std::vector<Flag> flags;  // faults and errors, by time
  // How each run ended where it did not end well ("run 1 ended with status signal, exit code
  // 139: killed by SIGSEGV"): the errors panel leads with them.
  std::vector<std::string> run_problems;
  std::vector<Series> series;
  std::vector<Track> tracks;

  // Start time of step N / epoch N (earliest over ranks); -1 if there is no such marker.
  int64_t step_start(int64_t step) const;
  int64_t step_end(int64_t step) const;
  int64_t epoch_start(int64_t epoch) const;
  int64_t max_step = -1, max_epoch = -1;
  // Epoch end times per rank (for "grows across epochs").
  std::vector<std::vector<int64_t>> epoch_ends;

 private:
  TraceModel() = default;
  Status read_all(LoadProgress* progress);
  void build_tracks();
  std::vector<std::vector<SeriesRef>> aggregate_series(std::vector<std::array<int, 4>>* series_of);
  std::string path_;
  std::unique_ptr<db::TraceReader> reader_;
  std::vector<std::string> strings_;  // by string id, or by index when the file's ids were sparse
  std::unordered_map<int64_t, int32_t> string_index_;  // sparse ids only: file id -> index
  std::vector<int64_t> string_file_id_;                // sparse ids only: index -> file id
  // The index of a string id from the file (0: none, or no such string).
  int32_t name_index(int64_t id) const {
    if (string_index_.empty()) return id > 0 && size_t(id) < strings_.size() ? int32_t(id) : 0;
    auto it = string_index_.find(id);
    return it == string_index_.end() ? 0 : it->second;
  }
  std::vector<int> rank_list_;  // the ranks the trace has (rank and device rows), ascending
  // What a track of key r is called: "rank r", or a launcher's or helper's role and pid (rank.role:
  // its key is not a rank).
  std::unordered_map<int, std::string> process_names_;
  std::string rank_title(int r) const {
    auto it = process_names_.find(r);
    return it != process_names_.end() ? it->second : "rank " + std::to_string(r);
  }
  mutable std::unique_ptr<db::StackSites> sites_;
  mutable std::unordered_map<int64_t, std::string> site_text_;
  struct ExtraCounter {
    int device;
    std::string name;
    int series;
  };
  std::vector<ExtraCounter> extra_counters_;
  mutable bool placements_loaded_ = false;
  std::vector<db::StepMemoryRow> step_memory_;  // read for the overview, or where the detail stopped
};

}  // namespace zt::viewer
