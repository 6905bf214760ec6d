// The caching device allocator: rounding and pools, splitting and coalescing, best fit,
// caching, stats worked out by hand, the memory-fraction cap, retry after emptying the
// cache, PyTorch's OOM text with bug report R4's figures, and thread safety.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "zt/memory/device_allocator.h"

using namespace zt::memory;

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

uintptr_t addr(const DeviceBlock& b) { return reinterpret_cast<uintptr_t>(b.ptr); }

}  // namespace

TEST(DeviceAllocatorRules, RoundingAndSegmentSizes) {
  EXPECT_EQ(round_request(1), 512u);
  EXPECT_EQ(round_request(512), 512u);
  EXPECT_EQ(round_request(513), 1024u);
  EXPECT_EQ(segment_size_for(round_request(1 * MiB)), 2 * MiB);        // small pool
  EXPECT_EQ(segment_size_for(round_request(1 * MiB + 1)), 20 * MiB);   // large, < 10 MiB
  EXPECT_EQ(segment_size_for(round_request(10 * MiB - 512)), 20 * MiB);
  EXPECT_EQ(segment_size_for(round_request(10 * MiB - 1)), 10 * MiB);  // rounds up to 10 MiB first
  EXPECT_EQ(segment_size_for(round_request(10 * MiB)), 10 * MiB);      // rounded to 2 MiB
  EXPECT_EQ(segment_size_for(round_request(10 * MiB + 1)), 12 * MiB);
  EXPECT_TRUE(is_small_request(round_request(1 * MiB)));
  EXPECT_FALSE(is_small_request(round_request(1 * MiB + 1)));
}

TEST(DeviceAllocator, SplitsThenCoalescesAndReusesBestFit) {
  VirtualSource src(1 * GiB);
  DeviceAllocator a(&src, {});
  DeviceBlock A = a.allocate(1000, "A");   // 1024 B
  DeviceBlock B = a.allocate(4096, "B");   // 4096 B
  DeviceBlock C = a.allocate(8192, "C");   // 8192 B
  ASSERT_EQ(a.stats().segments, 1);        // all three carved from one 2 MiB small segment
  EXPECT_EQ(A.size, 1024u);
  EXPECT_EQ(addr(B), addr(A) + 1024);
  EXPECT_EQ(addr(C), addr(B) + 4096);
  const size_t tail = 2 * MiB - 1024 - 4096 - 8192;
  EXPECT_EQ(a.stats().inactive_split_bytes, int64_t(tail));

  a.free(B);
  a.free(A);  // merges with B: one free 5120 B block at the segment start
  EXPECT_EQ(a.stats().inactive_split_bytes, int64_t(tail + 5120));
  EXPECT_EQ(a.check_invariants(), "");

  // 5000 B rounds to 5120: the coalesced block fits exactly; the tail is larger. Best fit
  // must take the coalesced one, which only exists if A and B were merged.
  DeviceBlock D = a.allocate(5000, "D");
  EXPECT_EQ(addr(D), addr(A));
  EXPECT_EQ(D.size, 5120u);
  EXPECT_EQ(a.stats().segments, 1);
  EXPECT_EQ(a.stats().inactive_split_bytes, int64_t(tail));

  // 4096 B no longer fits anywhere but the tail: it goes right after C.
  DeviceBlock E = a.allocate(4096, "E");
  EXPECT_EQ(addr(E), addr(C) + 8192);
  a.free(C);
  a.free(D);
  a.free(E);  // everything merges back into one whole-segment block
  EXPECT_EQ(a.stats().inactive_split_bytes, 0);
  EXPECT_EQ(a.stats().allocated_bytes, 0);
  EXPECT_EQ(a.stats().reserved_bytes, int64_t(2 * MiB));
  EXPECT_EQ(a.check_invariants(), "");
}

TEST(DeviceAllocator, SmallAndLargePoolsNeverShareSegments) {
  VirtualSource src(1 * GiB);
  DeviceAllocator a(&src, {});
  DeviceBlock s = a.allocate(1 * MiB, "small");  // exactly the largest small request
  EXPECT_EQ(a.stats().reserved_bytes, int64_t(2 * MiB));
  a.free(s);
  // The cached 2 MiB small segment could hold 1.5 MiB, but it is the small pool's.
  DeviceBlock l = a.allocate(1 * MiB + 512 * KiB, "large");
  EXPECT_EQ(a.stats().segments, 2);
  EXPECT_EQ(a.stats().reserved_bytes, int64_t(2 * MiB + 20 * MiB));
  // And a small request does not come out of the large segment's 18.5 MiB remainder.
  DeviceBlock s2 = a.allocate(4 * KiB, "small2");
  EXPECT_EQ(addr(s2), addr(s));
  EXPECT_EQ(a.stats().segments, 2);
  // A 10 MiB request fits in the large segment's 18.5 MiB remainder: best fit takes it.
  DeviceBlock mid = a.allocate(10 * MiB + 1, "mid");
  EXPECT_EQ(mid.size, 10 * MiB + 512);
  EXPECT_EQ(a.stats().segments, 2);
  // One that fits nowhere gets a segment of its own size, rounded up to 2 MiB.
  DeviceBlock big = a.allocate(30 * MiB + 1, "big");
  EXPECT_EQ(big.size, 30 * MiB + 512);
  EXPECT_EQ(a.stats().reserved_bytes, int64_t(2 * MiB + 20 * MiB + 32 * MiB));
  a.free(mid);
  a.free(l);
  a.free(s2);
  a.free(big);
  EXPECT_EQ(a.check_invariants(), "");
}

TEST(DeviceAllocator, LargeBlocksAreNotSplitForSmallRemainders) {
  VirtualSource src(1 * GiB);
  DeviceAllocator a(&src, {});
  DeviceBlock x = a.allocate(5 * MiB, "x");  // 20 MiB segment, split: 15 MiB cached
  EXPECT_EQ(x.size, 5 * MiB);
  a.free(x);
  // 19.5 MiB from the cached 20 MiB block leaves 0.5 MiB, not > 1 MiB: no split, the caller
  // gets (and allocated counts) the whole 20 MiB.
  DeviceBlock y = a.allocate(19 * MiB + 512 * KiB, "y");
  EXPECT_EQ(y.size, 20 * MiB);
  EXPECT_EQ(y.requested, 19 * MiB + 512 * KiB);
  EXPECT_EQ(a.stats().allocated_bytes, int64_t(20 * MiB));
  EXPECT_EQ(a.stats().requested_bytes, int64_t(19 * MiB + 512 * KiB));
  EXPECT_EQ(a.stats().segments, 1);
  a.free(y);
}

TEST(DeviceAllocator, FreedBlocksAreCachedAndReused) {
  VirtualSource src(1 * GiB);
  DeviceAllocator a(&src, {});
  DeviceBlock x = a.allocate(64 * MiB, "x");
  void* p = x.ptr;
  a.free(x);
  EXPECT_EQ(a.stats().reserved_bytes, int64_t(64 * MiB));  // still held: cached
  EXPECT_EQ(src.in_use(), 64 * MiB);
  DeviceBlock y = a.allocate(64 * MiB, "y");
  EXPECT_EQ(y.ptr, p);
  EXPECT_NE(y.id, x.id);
  EXPECT_EQ(a.stats().segment_allocs_total, 1);  // no second "cudaMalloc"
  a.free(y);
  // Blocks are per stream: the cached block is not handed to another stream.
  DeviceBlock z = a.allocate(64 * MiB, "z", /*stream=*/7);
  EXPECT_NE(z.ptr, p);
  EXPECT_EQ(a.stats().segment_allocs_total, 2);
  a.free(z);
}

TEST(DeviceAllocator, StatsAfterASequenceMatchHandArithmetic) {
  VirtualSource src(1 * GiB);
  DeviceAllocator a(&src, {});
  DeviceBlock p = a.allocate(100, "p");       // 512 B of a new 2 MiB small segment
  DeviceBlock q = a.allocate(3 * MiB, "q");   // new 20 MiB segment: q [0,3) + free [3,20)
  DeviceBlock r = a.allocate(12 * MiB, "r");  // best fit in the 17 MiB rest: r [3,15) + free [15,20)
  DeviceBlock t = a.allocate(40 * MiB, "t");  // nothing cached fits: new 40 MiB segment
  a.free(q);                                  // [0,3) free; r is in use, nothing to merge
  DeviceBlock s = a.allocate(4 * MiB, "s");   // best fit [15,20): the 1 MiB rest is not > 1 MiB,
                                              // so s gets all 5 MiB, unsplit
  EXPECT_EQ(s.size, 5 * MiB);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s.ptr), reinterpret_cast<uintptr_t>(q.ptr) + 15 * MiB);
  a.free(t);                                  // the 40 MiB segment is whole and free
  EXPECT_EQ(a.empty_cache(), 40 * MiB);       // and the only one empty_cache can return

  DeviceAllocatorStats st = a.stats();
  EXPECT_EQ(st.allocated_bytes, int64_t(512 + 12 * MiB + 5 * MiB));
  EXPECT_EQ(st.requested_bytes, int64_t(100 + 12 * MiB + 4 * MiB));
  EXPECT_EQ(st.active_bytes, st.allocated_bytes);
  EXPECT_EQ(st.reserved_bytes, int64_t(2 * MiB + 20 * MiB));
  EXPECT_EQ(st.inactive_split_bytes, int64_t((2 * MiB - 512) + 3 * MiB));
  EXPECT_EQ(st.peak_allocated_bytes, int64_t(512 + 12 * MiB + 40 * MiB + 5 * MiB));  // after s
  EXPECT_EQ(st.peak_reserved_bytes, int64_t(2 * MiB + 20 * MiB + 40 * MiB));
  EXPECT_EQ(st.segments, 2);
  EXPECT_EQ(st.allocations, 3);
  EXPECT_EQ(st.allocations_total, 5);
  EXPECT_EQ(st.frees_total, 2);
  EXPECT_EQ(st.segment_allocs_total, 3);
  EXPECT_EQ(st.segment_frees_total, 1);
  EXPECT_EQ(st.num_ooms, 0);
  EXPECT_EQ(src.in_use(), 22 * MiB);
  EXPECT_EQ(a.check_invariants(), "");

  a.reset_peak_stats();
  st = a.stats();
  EXPECT_EQ(st.peak_allocated_bytes, st.allocated_bytes);
  EXPECT_EQ(st.peak_reserved_bytes, st.reserved_bytes);
  a.free(r);  // merges with [0,3)
  a.free(s);  // and with [15,20): the 20 MiB segment is whole again
  a.free(p);
  EXPECT_EQ(a.stats().inactive_split_bytes, 0);
  EXPECT_EQ(a.empty_cache(), 22 * MiB);
  EXPECT_EQ(src.in_use(), 0u);
  EXPECT_EQ(a.stats().peak_allocated_bytes, int64_t(512 + 17 * MiB));  // the peak since the reset
  EXPECT_EQ(a.check_invariants(), "");
}

TEST(DeviceAllocator, MemoryFractionCapsReserved) {
  VirtualSource src(1 * GiB);
  DeviceAllocatorOptions o;
  o.device_ordinal = 5;
  DeviceAllocator a(&src, o);
  EXPECT_THROW(a.set_per_process_memory_fraction(1.5), std::invalid_argument);
  a.set_per_process_memory_fraction(0.5);  // 512 MiB
  EXPECT_EQ(a.stats().limit_bytes, int64_t(512 * MiB));
  DeviceBlock x = a.allocate(300 * MiB, "x");
  try {
    a.allocate(300 * MiB, "y");
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    // The device has 724 MiB free, but the limit allows only 512 MiB to be reserved.
    // PyTorch's format_size prints exactly 1 GiB as "1024.00 MiB" (its bounds are inclusive).
    EXPECT_EQ(std::string(e.what()),
              "CUDA out of memory. Tried to allocate 300.00 MiB. GPU 5 has a total capacity of 1024.00 MiB of which "
              "724.00 MiB is free. Including non-PyTorch memory, this process has 300.00 MiB memory in use. "
              "512.00 MiB allowed; Of the allocated memory 300.00 MiB is allocated by PyTorch, and "
              "0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
              "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.");
    EXPECT_EQ(e.figures().limit_bytes, 512 * MiB);
    EXPECT_EQ(e.tensor_name(), "y");
  }
  EXPECT_EQ(a.stats().num_ooms, 1);
  EXPECT_EQ(a.stats().reserved_bytes, int64_t(300 * MiB));  // the failure took nothing
  a.clear_memory_fraction();
  DeviceBlock y = a.allocate(300 * MiB, "y");
  a.free(x);
  a.free(y);
  EXPECT_EQ(a.check_invariants(), "");
}

TEST(DeviceAllocator, EmptiesTheCacheAndRetriesBeforeFailing) {
  VirtualSource src(1 * GiB);
  DeviceAllocator a(&src, {});
  DeviceBlock x = a.allocate(600 * MiB, "x");
  a.free(x);  // 600 MiB stays cached
  // 700 MiB does not fit in the cached block, and the source has only 424 MiB left: the
  // allocator must return the cached segment and retry rather than report an OOM.
  DeviceBlock y = a.allocate(700 * MiB, "y");
  ASSERT_TRUE(y);
  DeviceAllocatorStats st = a.stats();
  EXPECT_EQ(st.alloc_retries, 1);
  EXPECT_EQ(st.segment_frees_total, 1);
  EXPECT_EQ(st.num_ooms, 0);
  EXPECT_EQ(st.reserved_bytes, int64_t(700 * MiB));
  // The same through the fraction limit: the cache is emptied for the limit too.
  a.set_per_process_memory_fraction(0.75);  // 768 MiB
  a.free(y);
  DeviceBlock z = a.allocate(750 * MiB, "z");
  EXPECT_EQ(a.stats().alloc_retries, 2);
  a.free(z);
}

// Bug report R4: a checkpoint save under ZeRO-3 gathers a 3.39 GiB module on a GPU whose
// memory is almost all held. The device: 79.32 GiB, of which 2.42 GiB goes to memory
// outside the allocator (CUDA context, NCCL and cuBLAS workspaces: taken straight from
// the source). The allocator holds 73.29 GiB of tensors plus 1.60 GiB of holes inside
// segments that are partly in use (two 2 GiB gather buffers later reused for 1.20 GiB
// tensors), which empty_cache() cannot return. Sizes in MiB are chosen so that every
// figure prints as in the report.
TEST(DeviceAllocator, OutOfMemoryTextReproducesR4) {
  const size_t capacity = 81220 * MiB;  // 79.3164 GiB
  VirtualSource src(capacity);
  void* non_allocator = src.allocate(2482 * MiB);
  ASSERT_NE(non_allocator, nullptr);
  DeviceAllocator a(&src, {});
  std::vector<DeviceBlock> live;
  DeviceBlock g0 = a.allocate(2048 * MiB, "gather_buffer.0");
  DeviceBlock g1 = a.allocate(2048 * MiB, "gather_buffer.1");
  a.free(g0);
  a.free(g1);
  live.push_back(a.allocate(1229 * MiB, "activations.0"));  // into g0's segment: 819 MiB hole
  live.push_back(a.allocate(1229 * MiB, "activations.1"));  // into g1's segment: 819 MiB hole
  for (int i = 0; i < 71; ++i)  // > 819 MiB each, so none lands in a hole
    live.push_back(a.allocate(1008 * MiB, "layers." + std::to_string(i) + ".partition"));
  live.push_back(a.allocate(1024 * MiB, "embed.partition"));
  ASSERT_EQ(a.stats().allocated_bytes, int64_t(75050 * MiB));  // 73.29 GiB
  ASSERT_EQ(a.stats().reserved_bytes, int64_t(76688 * MiB));   // + 1638 MiB = 1.60 GiB of holes
  ASSERT_EQ(capacity - src.in_use(), 2050 * MiB);              // 2.00 GiB free

  const size_t request = 3640000000;  // 3.39 GiB; its segment rounds to 3472 MiB
  std::string text;
  try {
    a.allocate(request, "model.layers.59.mlp.experts.gathered");
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    text = e.what();
    const DeviceOomFigures& f = e.figures();
    EXPECT_EQ(f.device_ordinal, 0);
    EXPECT_EQ(f.requested_bytes, request);
    EXPECT_EQ(f.alloc_bytes, 3472 * MiB);
    EXPECT_EQ(f.capacity_bytes, capacity);
    EXPECT_EQ(f.free_bytes, 2050 * MiB);
    EXPECT_EQ(f.process_bytes, 79170 * MiB);
    EXPECT_EQ(f.allocated_bytes, 75050 * MiB);
    EXPECT_EQ(f.reserved_bytes, 76688 * MiB);
    EXPECT_EQ(f.limit_bytes, 0u);
    EXPECT_EQ(e.tensor_name(), "model.layers.59.mlp.experts.gathered");
  }
  EXPECT_EQ(text,
            "CUDA out of memory. Tried to allocate 3.39 GiB. GPU 0 has a total capacity of 79.32 GiB of which "
            "2.00 GiB is free. Including non-PyTorch memory, this process has 77.31 GiB memory in use. Of the "
            "allocated memory 73.29 GiB is allocated by PyTorch, and 1.60 GiB is reserved by PyTorch "
            "but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.");
  DeviceAllocatorStats st = a.stats();
  EXPECT_EQ(st.num_ooms, 1);
  EXPECT_EQ(st.alloc_retries, 1);         // it did empty the cache and retry first
  EXPECT_EQ(st.segment_frees_total, 0);   // but nothing in the cache was whole
  EXPECT_EQ(a.check_invariants(), "");
  for (auto& b : live) a.free(b);
  src.release(non_allocator, 2482 * MiB);
}

TEST(DeviceAllocator, PyTorchSizeFormat) {
  EXPECT_EQ(pytorch_format_size(0), "0 bytes");
  EXPECT_EQ(pytorch_format_size(1024), "1024 bytes");
  EXPECT_EQ(pytorch_format_size(1025), "1.00 KiB");
  EXPECT_EQ(pytorch_format_size(MiB), "1024.00 KiB");
  EXPECT_EQ(pytorch_format_size(20 * MiB), "20.00 MiB");
  EXPECT_EQ(pytorch_format_size(GiB), "1024.00 MiB");
  EXPECT_EQ(pytorch_format_size(GiB + GiB / 2), "1.50 GiB");
}

TEST(DeviceAllocator, EmptyCacheReturnsOnlyWholeSegments) {
  HostBackedSource src(256 * MiB);
  DeviceAllocator a(&src, {});
  DeviceBlock x = a.allocate(30 * MiB, "x");
  DeviceBlock y = a.allocate(2 * MiB, "y");  // 20 MiB segment, split
  DeviceBlock z = a.allocate(2 * MiB, "z");  // same segment
  a.free(x);
  a.free(y);
  EXPECT_EQ(a.empty_cache(), 30 * MiB);  // y's segment still holds z
  EXPECT_EQ(a.stats().reserved_bytes, int64_t(20 * MiB));
  EXPECT_EQ(src.in_use(), 20 * MiB);
  a.free(z);
  EXPECT_EQ(a.empty_cache(), 20 * MiB);
  EXPECT_EQ(src.in_use(), 0u);
  EXPECT_EQ(a.stats().segments, 0);
  EXPECT_EQ(a.check_invariants(), "");
}

TEST(DeviceAllocator, RejectsDoubleAndForeignFrees) {
  VirtualSource src(1 * GiB);
  DeviceAllocator a(&src, {});
  DeviceAllocator other(&src, {});
  DeviceBlock x = a.allocate(4096, "x");
  EXPECT_THROW(other.free(x), std::invalid_argument);
  a.free(x);
  EXPECT_THROW(a.free(x), std::invalid_argument);
  EXPECT_FALSE(a.allocate(0, "nothing"));
  EXPECT_EQ(a.stats().allocations_total, 1);
}

// Four threads allocate and free mixed sizes on real memory, each stamping its blocks and
// checking the stamp before freeing: overlapping blocks or a lost update would show.
TEST(DeviceAllocator, ThreadSafeUnderConcurrentUse) {
  HostBackedSource src(1 * GiB);
  DeviceAllocator a(&src, {});
  std::atomic<int> bad{0};
  std::atomic<bool> stop{false};
  auto work = [&](int t) {
    std::mt19937 rng(1234 + t);
    const size_t sizes[] = {512, 3000, 64 * KiB, 1 * MiB, 1 * MiB + 4096, 5 * MiB, 12 * MiB};
    std::vector<DeviceBlock> live;
    for (int i = 0; i < 3000; ++i) {
      if (live.size() < 8 && (live.empty() || rng() % 2)) {
        DeviceBlock b = a.allocate(sizes[rng() % 7], "t" + std::to_string(t), t % 2);
        auto* p = static_cast<unsigned char*>(b.ptr);
        std::memset(p, t + 1, 64);  // every size here is >= 512 B
        p[b.requested - 1] = static_cast<unsigned char>(t + 1);
        live.push_back(b);
      } else {
        size_t k = rng() % live.size();
        DeviceBlock b = live[k];
        auto* p = static_cast<unsigned char*>(b.ptr);
        for (size_t j = 0; j < 64; ++j)
          if (p[j] != t + 1) ++bad;
        if (p[b.requested - 1] != t + 1) ++bad;
        a.free(b);
        live.erase(live.begin() + long(k));
      }
    }
    for (auto& b : live) a.free(b);
  };
  std::thread observer([&] {
    while (!stop) {
      DeviceAllocatorStats st = a.stats();
      if (st.allocated_bytes > st.reserved_bytes) ++bad;
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(work, t);
  for (auto& th : threads) th.join();
  stop = true;
  observer.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(a.stats().allocated_bytes, 0);
  EXPECT_EQ(a.stats().allocations, 0);
  EXPECT_EQ(a.stats().allocations_total, a.stats().frees_total);
  EXPECT_EQ(a.check_invariants(), "");
  a.empty_cache();
  EXPECT_EQ(src.in_use(), 0u);
}
