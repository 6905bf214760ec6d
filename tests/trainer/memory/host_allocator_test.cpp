// The host allocators: pinned power-of-two rounding and caching (bug report R1's 20.4 GiB
// request that pins 32 GiB), the pinned cap and its error, empty_cache, real memory that
// can be written, the pageable allocator's cap, and thread safety.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "zt/memory/host_allocator.h"

using namespace zt::memory;

namespace {
constexpr size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

HostAllocatorOptions virtual_pinned(size_t cap) {
  HostAllocatorOptions o;
  o.backing = HostBacking::Virtual;
  o.cap = cap;
  return o;
}
}  // namespace

TEST(PinnedHostAllocator, RoundsToPowersOfTwo) {
  EXPECT_EQ(next_power_of_two(0), 0u);
  EXPECT_EQ(next_power_of_two(1), 1u);
  EXPECT_EQ(next_power_of_two(3), 4u);
  EXPECT_EQ(next_power_of_two(4096), 4096u);
  EXPECT_EQ(next_power_of_two(4097), 8192u);
  EXPECT_EQ(next_power_of_two(size_t(20.4 * double(GiB))), 32 * GiB);
}

TEST(PinnedHostAllocator, A20Point4GiBRequestPins32GiB) {
  PinnedHostAllocator a(virtual_pinned(kNoLimit));
  const size_t request = size_t(20.4 * double(GiB));
  HostBlock b = a.allocate(request, "offload.fp32_partition");
  EXPECT_EQ(b.size, 32 * GiB);
  EXPECT_EQ(b.requested, request);
  HostAllocatorStats st = a.stats();
  EXPECT_EQ(st.reserved_bytes, int64_t(32 * GiB));
  EXPECT_EQ(st.allocated_bytes, int64_t(32 * GiB));
  EXPECT_EQ(st.requested_bytes, int64_t(request));
  EXPECT_EQ(a.source().in_use(), 32 * GiB);
  a.free(b);
  // Freed, but still pinned: nothing goes back to the OS before empty_cache().
  st = a.stats();
  EXPECT_EQ(st.allocated_bytes, 0);
  EXPECT_EQ(st.reserved_bytes, int64_t(32 * GiB));
  EXPECT_EQ(st.cached_bytes, int64_t(32 * GiB));
  // Any request that rounds to the same size reuses the region.
  HostBlock c = a.allocate(17 * GiB, "offload.fp32_partition");
  EXPECT_EQ(c.ptr, b.ptr);
  EXPECT_EQ(a.stats().cache_hits_total, 1);
  EXPECT_EQ(a.stats().regions_total, 1);
  // A different power of two does not: 16 GiB needs a region of its own.
  HostBlock d = a.allocate(16 * GiB, "offload.grad_buffer");
  EXPECT_NE(d.ptr, c.ptr);
  EXPECT_EQ(a.stats().reserved_bytes, int64_t(48 * GiB));
  EXPECT_EQ(a.stats().peak_reserved_bytes, int64_t(48 * GiB));
  a.free(c);
  a.free(d);
  EXPECT_EQ(a.empty_cache(), 48 * GiB);
  EXPECT_EQ(a.stats().reserved_bytes, 0);
  EXPECT_EQ(a.source().in_use(), 0u);
}

// R1's mechanism: the cache keeps what an epoch freed, the next request rounds to a
// size the cache does not hold, and the cap is hit although nothing is in use.
TEST(PinnedHostAllocator, CapExceededNamesCachedBytes) {
  PinnedHostAllocator a(virtual_pinned(64 * GiB));
  HostBlock b = a.allocate(size_t(20.4 * double(GiB)), "epoch0.param_buffer");
  a.free(b);  // 32 GiB cached
  std::string text;
  try {
    a.allocate(33 * GiB, "epoch1.param_buffer");  // 64 GiB: 32 + 64 > 64
    FAIL() << "expected HostOutOfMemoryError";
  } catch (const HostOutOfMemoryError& e) {
    text = e.what();
    EXPECT_EQ(e.figures().rounded_bytes, 64 * GiB);
    EXPECT_EQ(e.figures().held_bytes, 32 * GiB);
    EXPECT_EQ(e.figures().cached_bytes, 32 * GiB);
    EXPECT_EQ(e.figures().cap_bytes, 64 * GiB);
    EXPECT_FALSE(e.figures().source_full);
    EXPECT_EQ(e.buffer_name(), "epoch1.param_buffer");
  }
  EXPECT_EQ(text,
            "Host out of memory (pinned): tried to pin 64.00 GiB for 'epoch1.param_buffer' (requested 33.00 GiB, "
            "rounded up to the next power of two). The pinned allocator holds 32.00 GiB (0 B in use, 32.00 GiB "
            "cached and not returned to the OS) against a cap of 64.00 GiB. Call empty_cache() at a safe point "
            "(e.g. the epoch boundary) to return the cached memory, or raise the cap.");
  EXPECT_EQ(a.stats().num_ooms, 1);
  EXPECT_EQ(a.stats().reserved_bytes, int64_t(32 * GiB));  // the failure took nothing
  // The cure the message names.
  EXPECT_EQ(a.empty_cache(), 32 * GiB);
  HostBlock c = a.allocate(33 * GiB, "epoch1.param_buffer");
  EXPECT_EQ(c.size, 64 * GiB);
  a.free(c);
}

TEST(PinnedHostAllocator, RealBackingIsWritableAndReused) {
  HostAllocatorOptions o;
  o.cap = 64 * MiB;
  PinnedHostAllocator a(o);
  HostBlock b = a.allocate(3 * MiB, "staging");
  ASSERT_TRUE(b);
  EXPECT_EQ(b.size, 4 * MiB);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.ptr) % 4096, 0u);  // page-aligned like cudaHostAlloc
  std::memset(b.ptr, 0xab, b.size);
  void* p = b.ptr;
  a.free(b);
  HostBlock c = a.allocate(4 * MiB, "staging");
  EXPECT_EQ(c.ptr, p);
  EXPECT_THROW(a.free(HostBlock{reinterpret_cast<void*>(0x1000), 4096, 4096, 0}), std::invalid_argument);
  a.free(c);
  EXPECT_THROW(a.free(c), std::invalid_argument);
}

TEST(PinnedHostAllocator, ThreadSafe) {
  HostAllocatorOptions o;
  o.cap = 512 * MiB;
  PinnedHostAllocator a(o);
  auto work = [&](int t) {
    std::vector<HostBlock> live;
    for (int i = 0; i < 2000; ++i) {
      size_t bytes = size_t(4 * KiB) << ((i + t) % 8);
      HostBlock b = a.allocate(bytes, "t");
      static_cast<unsigned char*>(b.ptr)[0] = static_cast<unsigned char>(t);
      live.push_back(b);
      if (live.size() > 4) {
        EXPECT_EQ(static_cast<unsigned char*>(live.front().ptr)[0], t);
        a.free(live.front());
        live.erase(live.begin());
      }
    }
    for (auto& b : live) a.free(b);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(work, t);
  for (auto& th : threads) th.join();
  HostAllocatorStats st = a.stats();
  EXPECT_EQ(st.allocated_bytes, 0);
  EXPECT_EQ(st.allocations, 0);
  EXPECT_EQ(st.allocations_total, 8000);
  EXPECT_GT(st.cache_hits_total, 7000);  // at most a few regions per size and thread
  EXPECT_EQ(a.empty_cache(), size_t(st.reserved_bytes));
  EXPECT_EQ(a.source().in_use(), 0u);
}

TEST(PageableHostAllocator, CapStatsAndRealMemory) {
  HostAllocatorOptions o;
  o.cap = 10 * MiB;
  PageableHostAllocator a(o);
  HostBlock x = a.allocate(6 * MiB, "dataset.tokens");
  std::memset(x.ptr, 1, x.size);
  EXPECT_EQ(x.size, 6 * MiB);  // no rounding
  try {
    a.allocate(5 * MiB, "dataset.shuffle");
    FAIL() << "expected HostOutOfMemoryError";
  } catch (const HostOutOfMemoryError& e) {
    EXPECT_EQ(std::string(e.what()),
              "Host out of memory (pageable): tried to allocate 5.00 MiB for 'dataset.shuffle'. The pageable "
              "allocator holds 6.00 MiB (6.00 MiB in use, 0 B cached and not returned to the OS) against a cap "
              "of 10.00 MiB. Free buffers that are no longer needed, or raise the cap.");
  }
  a.free(x);  // no caching: straight back to the OS
  HostAllocatorStats st = a.stats();
  EXPECT_EQ(st.allocated_bytes, 0);
  EXPECT_EQ(st.reserved_bytes, 0);
  EXPECT_EQ(st.peak_allocated_bytes, int64_t(6 * MiB));
  EXPECT_EQ(st.num_ooms, 1);
  EXPECT_EQ(a.source().in_use(), 0u);
}

// One host-RAM source shared by both allocators: the host runs out before either cap.
TEST(HostAllocators, SharedHostSourceRunsOut) {
  VirtualSource ram(100 * GiB, 4096);
  HostAllocatorOptions o;
  o.source = &ram;
  PinnedHostAllocator pinned(o);
  PageableHostAllocator pageable(o);
  HostBlock p = pinned.allocate(40 * GiB, "pinned");  // 64 GiB
  HostBlock q = pageable.allocate(30 * GiB, "pageable");
  EXPECT_EQ(ram.in_use(), 94 * GiB);
  try {
    pageable.allocate(8 * GiB, "more");
    FAIL() << "expected HostOutOfMemoryError";
  } catch (const HostOutOfMemoryError& e) {
    EXPECT_TRUE(e.figures().source_full);
    EXPECT_NE(std::string(e.what()).find("The host memory below it is full: 94.00 GiB of 100.00 GiB in use."),
              std::string::npos)
        << e.what();
  }
  pinned.free(p);
  pageable.free(q);
}
