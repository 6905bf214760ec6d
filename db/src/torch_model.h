// db/src/torch_model.h: a PyTorch memory snapshot as plain structs, and the caching allocator's
// rules it is replayed with (private to db/; the public side is zt/db/torch_snapshot.h).
//
// parse_snapshot() turns the pickle's Value tree into these structs, checking every field a
// snapshot has (types, signs) and bounding its work by the file's size (a tree that shares
// lists may reference far more items than it holds). The replay (torch_snapshot.cpp) then never
// meets a wrong type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zt/common/status.h"

namespace zt::db::detail {

// CUDACachingAllocator's constants (c10/cuda/CUDACachingAllocator.cpp).
inline constexpr int64_t kTorchMinBlockSize = 512;         // every block is a multiple of it
inline constexpr int64_t kTorchSmallSize = 1 << 20;        // requests up to this go to the small pool
inline constexpr int64_t kTorchSmallBuffer = 2 << 20;      // the small pool's segments

struct TorchFrame {
  std::string filename;
  int64_t line = 0;
  std::string name;
};

enum class TorchAction : uint8_t {
  Alloc, FreeRequested, FreeCompleted, SegmentAlloc, SegmentFree, SegmentMap, SegmentUnmap, Oom, Snapshot, Other
};
std::string_view to_string(TorchAction a);

struct TorchEvent {
  TorchAction action = TorchAction::Other;
  uint64_t addr = 0;
  int64_t size = 0;
  int64_t stream = 0;
  std::optional<int64_t> time_us;
  int32_t stack = -1;  // index into TorchModel::stacks; -1: no frames
  int64_t device_free = 0;  // oom only
};

// A block of a segment in the final state. state: 0 inactive (free), 1 active_allocated,
// 2 active_pending_free (freed, waiting for another stream).
struct TorchBlock {
  uint64_t address = 0;
  int64_t size = 0;
  int64_t requested = 0;
  uint8_t state = 0;
  int32_t stack = -1;
};

struct TorchSegment {
  int64_t device = 0;
  uint64_t address = 0;
  int64_t total_size = 0;
  int64_t stream = 0;
  std::optional<bool> small;  // segment_type, when the snapshot says
  bool expandable = false;
  int32_t stack = -1;
  std::vector<TorchBlock> blocks;
};

struct TorchModel {
  std::vector<TorchSegment> segments;
  std::vector<std::vector<TorchEvent>> traces;  // per device index
  std::vector<std::vector<TorchFrame>> stacks;  // innermost frame first
  // allocator_settings (absent: PyTorch's defaults)
  std::optional<int64_t> max_split_size;          // none: no limit
  std::vector<int64_t> roundup_divisions;         // per power-of-two interval from 1 MiB up; empty: none
  // zerotrace's clock pair and run, when the probe's Python hook wrote the snapshot
  std::optional<int64_t> clock_unix_ns, clock_monotonic_ns;
  std::string run_id;
  int64_t pid = 0;
  std::string reason;  // "exit", "oom", ...
  int64_t events = 0;
  int64_t max_device() const;
};

// The snapshot in `bytes` (a pickle), checked; the error is one line without a file name.
Status parse_snapshot(std::string_view bytes, TorchModel* out);

// The caching allocator's size for a request (round_size), given the snapshot's settings.
int64_t torch_round_size(const TorchModel& m, int64_t requested);
// Whether a free block of `block_size` found for a request rounded to `size` is split
// (should_split): the small pool and expandable segments keep any remainder of 512 B or more, the
// large pool only a remainder above 1 MiB, and never for a request of max_split_size or more.
bool torch_should_split(const TorchModel& m, int64_t block_size, int64_t size, bool expandable);

}  // namespace zt::db::detail
