// zt/memory/device_allocator.h: the caching device allocator (PyTorch's
// CUDACachingAllocator, in outline) for the simulated GPU and, later, for CUDA.
//
// Owns: the segments it took from its MemorySource and the blocks carved from them, and
// the bookkeeping for both (kept apart from the memory itself, so a VirtualSource works:
// the allocator never reads or writes the memory it hands out). Does not own the source
// or the recorder; both must outlive it (and the recorder must still be open).
// May call: MemorySource, probe::Recorder. Called by: the trainer's devices and tensors.
//
// Policy (PyTorch's constants):
//  - Requests round up to a multiple of 512 B (at least 512 B).
//  - Small pool: rounded requests <= 1 MiB, served from 2 MiB segments. Large pool: larger
//    requests; a new segment is 20 MiB for requests < 10 MiB, else the request rounded up
//    to 2 MiB. The pools never share segments.
//  - Best fit: the smallest cached free block of the right pool and stream that fits
//    (ties broken by lowest address). A block is split when the rest is >= 512 B (small
//    pool) or > 1 MiB (large pool); otherwise the caller gets the whole block.
//  - A freed block merges with free neighbours in its segment and stays cached. Segments
//    go back to the source only in empty_cache(), or when an allocation fails: then every
//    fully free segment is returned and the allocation retried once; if it fails again,
//    OutOfMemoryError (PyTorch's text) is thrown and recorded as an `oom` error row.
//  - Blocks belong to the stream they were allocated on and are reused only on it.
//
// Invariants (under the lock, between calls):
//  - allocated_bytes <= active_bytes <= reserved_bytes <= the source's in_use().
//  - No segment is taken that would put reserved_bytes over the limit (when one is set).
//    Setting a limit below the current reserved bytes releases nothing, as in PyTorch:
//    only later segments are refused, and empty_cache() brings reserved down.
//  - Every block lies inside exactly one segment; a segment's blocks tile it without gaps
//    or overlap, in address order (prev/next links); no two adjacent blocks are both free.
//  - A block is either handed out (in the active map) or cached (in exactly one pool set).
//  - Recording: a segment row is opened before any block row that names it and closed
//    after its last block row closes; each row's bytes equal the bytes counted in stats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "zt/memory/errors.h"
#include "zt/memory/memory_source.h"
#include "zt/probe/recorder.h"

namespace zt::memory {

inline constexpr size_t kMinBlockSize = 512;             // every size is a multiple
inline constexpr size_t kSmallSize = 1 << 20;            // largest small-pool request
inline constexpr size_t kSmallBuffer = 2 << 20;          // small-pool segment
inline constexpr size_t kLargeBuffer = 20 << 20;         // segment for 1 MiB < request < 10 MiB
inline constexpr size_t kMinLargeAlloc = 10 << 20;       // from here segments fit the request
inline constexpr size_t kRoundLarge = 2 << 20;           // large segments round to 2 MiB

// Rounding and pool rules, exposed so tests and the trainer's planners agree with them.
size_t round_request(size_t bytes);         // to a multiple of 512, at least 512
size_t segment_size_for(size_t rounded);    // the segment a miss of this size takes
inline bool is_small_request(size_t rounded) { return rounded <= kSmallSize; }

struct DeviceAllocatorOptions {
  probe::Recorder* recorder = nullptr;  // null: recording off
  int rank = 0;
  probe::DeviceId device = 0;           // from Recorder::add_device; 0 when not recording
  int device_ordinal = 0;               // "GPU N" in the OOM text
  bool capture_stacks = false;          // a libunwind stack per block (costs ~µs each)
  bool record_counters = true;          // "allocated"/"reserved" counter rows on each change
};

// What allocate() hands out. Pass it back to free() unchanged.
struct DeviceBlock {
  void* ptr = nullptr;        // null only for a zero-byte request
  size_t size = 0;            // bytes of the block (rounded, possibly more when not split)
  size_t requested = 0;       // bytes asked for
  int64_t stream = -1;
  uint64_t id = 0;            // the allocator's own block number, unique, from 1
  probe::AllocId alloc_id = 0;  // the block's row in the trace; 0 when not recording
  explicit operator bool() const { return ptr != nullptr; }
};

struct DeviceAllocatorStats {
  // current values
  int64_t allocated_bytes = 0;       // blocks handed out (rounded sizes)
  int64_t requested_bytes = 0;       // what their callers asked for
  int64_t active_bytes = 0;          // allocated + blocks freed but still in use by a stream;
                                     // equal to allocated until cross-stream use is tracked
  int64_t reserved_bytes = 0;        // segments held from the source
  int64_t inactive_split_bytes = 0;  // cached bytes in segments that are partly in use:
                                     // the part empty_cache() cannot return
  int64_t segments = 0;
  int64_t allocations = 0;           // blocks handed out now
  // peaks since construction or reset_peak_stats()
  int64_t peak_allocated_bytes = 0;
  int64_t peak_active_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  // cumulative counts
  int64_t allocations_total = 0;     // successful allocate() calls that returned memory
  int64_t frees_total = 0;
  int64_t segment_allocs_total = 0;  // "cudaMalloc" calls that succeeded
  int64_t segment_frees_total = 0;   // "cudaFree" calls
  int64_t alloc_retries = 0;         // misses that emptied the cache and retried
  int64_t num_ooms = 0;              // OutOfMemoryError thrown
  int64_t limit_bytes = 0;           // 0: no per-process limit
};

class DeviceAllocator {
 public:
  DeviceAllocator(MemorySource* source, DeviceAllocatorOptions options);
  // Returns every segment to the source and records the frees (blocks first). Blocks still
  // handed out at this point are freed with them: their owners must not use them after.
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  // `name` labels the block (and a segment it causes) in the trace: "block3.gathered".
  // Zero bytes returns an empty DeviceBlock and records nothing.
  // Throws OutOfMemoryError when the memory is not there even after emptying the cache.
  DeviceBlock allocate(size_t bytes, std::string_view name = {}, int64_t stream = -1);
  DeviceBlock allocate(size_t bytes, probe::NameId name, int64_t stream = -1);
  // Throws std::invalid_argument for a block this allocator did not hand out or that was
  // already freed (a double free is a bug to report, not to absorb).
  void free(const DeviceBlock& block);

  // Returns every fully free cached segment to the source. Returns the bytes released.
  size_t empty_cache();
  // PyTorch's set_per_process_memory_fraction: reserved may not exceed f x capacity.
  // f in [0, 1]; throws std::invalid_argument otherwise. 1.0 still sets a limit equal to
  // the capacity (so the message names it); clear_memory_fraction() removes it.
  void set_per_process_memory_fraction(double fraction);
  void clear_memory_fraction();

  DeviceAllocatorStats stats() const;
  void reset_peak_stats();
  // Writes the current "allocated" and "reserved" counters to the trace now.
  void record_counters();

  MemorySource& source() const { return *source_; }
  const DeviceAllocatorOptions& options() const { return options_; }

  // Verifies the invariants above by walking every segment; returns an empty string when
  // they hold, else what is wrong. For tests and debug builds: O(blocks).
  std::string check_invariants() const;

 private:
  struct Segment;
  struct Block;
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockOrder>;

  DeviceBlock allocate_impl(size_t bytes, probe::NameId name, std::string_view text, int64_t stream);
  Block* find_free_block(Pool& pool, int64_t stream, size_t size);
  Block* take_segment(size_t segment_bytes, bool small, int64_t stream, probe::NameId name);
  size_t release_free_segments();  // callers hold mu_
  void release_segment(Block* whole);
  [[noreturn]] void throw_oom(size_t requested, size_t segment_bytes, std::string_view tensor);
  void note_allocated_changed();
  void note_reserved_changed();
  Block* new_block();
  void recycle(Block* b);
  Pool& pool_for(bool small) { return small ? small_pool_ : large_pool_; }
  probe::NameId intern(std::string_view name);

  MemorySource* source_;
  const DeviceAllocatorOptions options_;
  probe::NameId allocated_name_ = 0, reserved_name_ = 0;

  mutable std::mutex mu_;
  Pool small_pool_, large_pool_;
  std::unordered_map<uintptr_t, Block*> active_;  // by address: what free() looks up
  std::unordered_map<uintptr_t, std::unique_ptr<Segment>> segments_;  // by start address
  size_t limit_ = 0;  // 0: none
  std::vector<Block*> spare_blocks_;  // recycled Block structs (not memory)
  uint64_t next_block_id_ = 1;
  DeviceAllocatorStats stats_;
};

}  // namespace zt::memory
