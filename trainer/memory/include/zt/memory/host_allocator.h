// zt/memory/host_allocator.h: host memory for offload: the caching pinned allocator
// (PyTorch's CachingHostAllocator, in outline) and a plain pageable allocator.
//
// PinnedHostAllocator owns the pinned regions it took from its source, whether handed out
// or cached. Policy, as PyTorch's: a request rounds up to the next power of two (so a
// 20.4 GiB request pins 32 GiB, bug report R1); a freed region is cached in the free list
// of its size and handed out again only for a request of that same rounded size; nothing
// goes back to the OS until empty_cache(). A miss that would take the pinned bytes held
// past the cap throws HostOutOfMemoryError *without* emptying the cache first: PyTorch's
// host allocator does not retry either, and this is exactly how cached pinned memory
// turns into a host OOM at an epoch boundary. The message says how much is cached and
// that empty_cache() would return it.
//
// Recording: each pinned region is a Segment row (memory from the OS, alive until
// empty_cache()), and each hand-out is a Block row over the same address (alive until
// free()). Regions and blocks are one-to-one, but keeping both rows is what separates
// "pinned and in use" (blocks: allocated) from "pinned and only cached" (segments without
// a live block: reserved minus allocated), the quantity that grows in R1.
//
// PageableHostAllocator owns plain host buffers (one region each, no caching): a Segment
// row for the region and a Block row for the buffer, so that allocated and reserved sums
// over the trace include host buffers the same way as device ones.
//
// Backing for both: real host memory (aligned_alloc) or virtual (sizes and fake
// addresses only), chosen at construction; or any MemorySource passed in (one host-RAM
// source shared by both allocators models a host with a fixed amount of RAM).
//
// Invariants (under the lock, between calls):
//  - allocated_bytes <= reserved_bytes <= cap; reserved = sum of live region sizes.
//  - Pinned: every region is either handed out (active map) or in exactly one free list,
//    and its size is a power of two.
//  - Thread-safe: one mutex per allocator; the recorder is called under it so that a
//    region's rows are ordered with its hand-outs.
// May call: MemorySource, probe::Recorder. Called by: the trainer's offload buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "zt/memory/errors.h"
#include "zt/memory/memory_source.h"
#include "zt/probe/recorder.h"

namespace zt::memory {

enum class HostBacking : uint8_t {
  Real,     // aligned_alloc: the memory is usable
  Virtual,  // sizes only: nobody may touch it
};

struct HostAllocatorOptions {
  probe::Recorder* recorder = nullptr;  // null: recording off
  int rank = 0;
  probe::DeviceId device = 0;  // the "cpu" device row; 0 when not recording
  HostBacking backing = HostBacking::Real;
  size_t cap = kNoLimit;       // most bytes held at once by this allocator
  // When set, regions come from here (not owned; must outlive the allocator) and
  // `backing` is ignored. When null, the allocator builds its own source of `backing`
  // with capacity `cap`.
  MemorySource* source = nullptr;
  bool record_counters = true;  // "pinned"/"pinned_allocated" or "pageable" counter rows
};

struct HostBlock {
  void* ptr = nullptr;
  size_t size = 0;       // bytes held for it (pinned: the power of two)
  size_t requested = 0;  // bytes asked for
  probe::AllocId alloc_id = 0;  // its Block row; 0 when not recording
  explicit operator bool() const { return ptr != nullptr; }
};

struct HostAllocatorStats {
  int64_t allocated_bytes = 0;   // handed out (rounded sizes)
  int64_t requested_bytes = 0;
  int64_t reserved_bytes = 0;    // held from the OS: pinned bytes held, in use or cached
  int64_t cached_bytes = 0;      // reserved - allocated
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t regions = 0;           // live regions (segments)
  int64_t allocations = 0;       // handed out now
  int64_t allocations_total = 0;
  int64_t cache_hits_total = 0;  // hand-outs served from the cache (pinned)
  int64_t regions_total = 0;     // regions ever taken from the source
  int64_t num_ooms = 0;
  int64_t cap_bytes = 0;         // 0: no cap
};

// Rounds like c10::llvm::PowerOf2Ceil: 0 -> 0, 1 -> 1, 3 -> 4, 2^k -> 2^k.
size_t next_power_of_two(size_t bytes);

class PinnedHostAllocator {
 public:
  explicit PinnedHostAllocator(HostAllocatorOptions options);
  ~PinnedHostAllocator();  // returns every region; records the frees (blocks first)
  PinnedHostAllocator(const PinnedHostAllocator&) = delete;
  PinnedHostAllocator& operator=(const PinnedHostAllocator&) = delete;

  // Throws HostOutOfMemoryError when the cap or the host is exceeded. Zero bytes returns
  // an empty HostBlock and records nothing.
  HostBlock allocate(size_t bytes, std::string_view name = {});
  // Caches the region for reuse; throws std::invalid_argument for an unknown block.
  void free(const HostBlock& block);
  // Returns every cached region to the OS; returns the bytes released.
  size_t empty_cache();

  HostAllocatorStats stats() const;
  void reset_peak_stats();
  void record_counters();
  MemorySource& source() const { return *source_; }

 private:
  struct Region;
  void note_changed(bool reserved_changed);
  probe::NameId intern(std::string_view name);

  HostAllocatorOptions options_;
  std::unique_ptr<MemorySource> owned_source_;
  MemorySource* source_;
  probe::NameId pinned_name_ = 0, pinned_allocated_name_ = 0;

  mutable std::mutex mu_;
  std::map<size_t, std::vector<Region*>> free_lists_;          // by power-of-two size
  std::unordered_map<uintptr_t, Region*> active_;              // handed out, by address
  std::unordered_map<uintptr_t, std::unique_ptr<Region>> regions_;  // all live regions
  HostAllocatorStats stats_;
};

class PageableHostAllocator {
 public:
  explicit PageableHostAllocator(HostAllocatorOptions options);
  ~PageableHostAllocator();  // frees whatever is still out; records the frees
  PageableHostAllocator(const PageableHostAllocator&) = delete;
  PageableHostAllocator& operator=(const PageableHostAllocator&) = delete;

  // Exactly `bytes` (no rounding beyond the source's alignment, no caching).
  HostBlock allocate(size_t bytes, std::string_view name = {});
  void free(const HostBlock& block);

  HostAllocatorStats stats() const;
  void reset_peak_stats();
  MemorySource& source() const { return *source_; }

 private:
  struct Buffer {
    size_t size = 0;
    size_t requested = 0;
    probe::AllocId segment_id = 0, block_id = 0;
  };
  HostAllocatorOptions options_;
  std::unique_ptr<MemorySource> owned_source_;
  MemorySource* source_;
  probe::NameId pageable_name_ = 0;

  mutable std::mutex mu_;
  std::unordered_map<uintptr_t, Buffer> live_;
  HostAllocatorStats stats_;
};

}  // namespace zt::memory
