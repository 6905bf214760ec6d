// zt/memory/memory_source.h: where an allocator's segments come from.
//
// A MemorySource is the device (or the host RAM) as seen from below every allocator: it
// hands out whole regions and takes them back, and it knows its capacity and how much of
// it is taken by anyone (allocators, and direct users such as a CUDA context or NCCL
// buffers). Allocators ask it for segments; the OOM message reads "free" from it.
//
// Owns: the regions it has handed out that are not yet released (HostBackedSource owns
// real host memory; VirtualSource owns nothing but an address range and a byte count).
// May call: the C library. Called by: DeviceAllocator, PinnedHostAllocator,
// PageableHostAllocator, and anything that takes device memory outside an allocator.
//
// Invariants (every implementation):
//  - 0 <= in_use() <= capacity(); in_use() is the sum of the (aligned) sizes of the live
//    regions, so capacity() - in_use() is what cudaMemGetInfo would call "free".
//  - allocate() returns nullptr when there is no room; it never throws for lack of room
//    and never returns the same address twice while the first region is live.
//  - release(p, n) must get back exactly the pointer and size that allocate(n) gave.
//  - Thread-safe: any thread may allocate and release concurrently.
// A cudaMalloc-backed source fits the same shape: allocate = cudaMalloc (nullptr on
// cudaErrorMemoryAllocation), capacity/in_use from cudaMemGetInfo, backed() = false from
// the host's point of view (the host must not dereference device pointers either).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "zt/memory/numa.h"

namespace zt::memory {

class MemorySource {
 public:
  virtual ~MemorySource() = default;
  // A region of at least `bytes`, or nullptr when the source has no room.
  virtual void* allocate(size_t bytes) = 0;
  // Gives back a region from allocate(bytes); `bytes` must be the size asked for then.
  virtual void release(void* ptr, size_t bytes) = 0;
  virtual size_t capacity() const = 0;
  // Bytes taken from this source by anyone, allocators or not.
  virtual size_t in_use() const = 0;
  // True when the host may read and write the memory (false for virtual and device memory).
  virtual bool host_accessible() const = 0;
  // One line for messages: "simulated GPU memory, 79.32 GiB, host-backed".
  virtual std::string describe() const = 0;
};

// The bookkeeping both sources below share: a capacity, an alignment every size is rounded
// up to, and the rounded bytes taken now (never above the capacity, also under races).
class CappedSource : public MemorySource {
 public:
  size_t capacity() const override { return capacity_; }
  size_t in_use() const override { return in_use_.load(std::memory_order_relaxed); }

 protected:
  CappedSource(size_t capacity, size_t alignment) : capacity_(capacity), alignment_(alignment) {}
  // The rounded size of a request (a zero-byte request takes one unit).
  size_t rounded(size_t bytes) const { return ((bytes == 0 ? 1 : bytes) + alignment_ - 1) & ~(alignment_ - 1); }
  // Takes rounded(bytes) out of the capacity; 0 when it does not fit.
  size_t take(size_t bytes);
  void give_back(size_t bytes) { in_use_.fetch_sub(rounded(bytes), std::memory_order_relaxed); }
  size_t alignment() const { return alignment_; }

 private:
  const size_t capacity_;
  const size_t alignment_;
  std::atomic<size_t> in_use_{0};
};

// The simulated GPU (or a capped host RAM): real host memory from aligned_alloc, at most
// `capacity` bytes taken at once. Pages are not touched here, so an untouched region costs
// the OS nothing until the trainer writes to it. With PagePlacement::Interleave each region is
// its own mapping whose pages interleave over the NUMA nodes (zt/memory/numa.h).
class HostBackedSource final : public CappedSource {
 public:
  // `alignment` must be a power of two; sizes are rounded up to it (aligned_alloc's rule),
  // and in_use() counts the rounded sizes. Interleaved, it may not exceed the page size (the
  // alignment of a mapping); the constructor also throws std::runtime_error where map_pages would
  // (numa.h: check_placement), so allocate() never fails for that reason.
  explicit HostBackedSource(size_t capacity, size_t alignment = 4096, PagePlacement placement = PagePlacement::Local);
  ~HostBackedSource() override = default;  // regions still out belong to their callers
  void* allocate(size_t bytes) override;
  void release(void* ptr, size_t bytes) override;
  bool host_accessible() const override { return true; }
  std::string describe() const override;
  PagePlacement placement() const { return placement_; }

 private:
  const PagePlacement placement_;
};

// Sizes only: unique fake addresses, no backing memory, so a 236B-parameter model on 48
// GPUs can be replayed for memory on a laptop. Nobody may dereference what it returns;
// every allocator above it keeps its bookkeeping outside the memory it hands out.
// Addresses are handed out by bumping a counter and are never reused (2^64 bytes of
// address space outlast any replay), which keeps every address unique in a trace.
class VirtualSource final : public CappedSource {
 public:
  // Fake addresses start at `base` (default 0x7e00'0000'0000, far from real heap
  // addresses on x86-64 Linux, so a stray dereference faults rather than corrupts).
  explicit VirtualSource(size_t capacity, size_t alignment = 512, uint64_t base = 0x7e0000000000ULL);
  void* allocate(size_t bytes) override;
  void release(void* ptr, size_t bytes) override;
  bool host_accessible() const override { return false; }
  std::string describe() const override;

 private:
  std::atomic<uint64_t> next_;
};

// Unlimited capacity for sources and caps: "no limit".
inline constexpr size_t kNoLimit = SIZE_MAX;

}  // namespace zt::memory
