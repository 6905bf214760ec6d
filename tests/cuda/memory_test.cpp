// The caching allocators on real GPU memory (trainer/cuda/memory_sources.h) and the stream set
// (streams.h). Label gpu: every test skips, saying why, without a usable GPU.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cuda/kernels.h"
#include "cuda/memory_sources.h"
#include "cuda/streams.h"
#include "cuda_test_util.h"
#include "zt/memory/device_allocator.h"
#include "zt/memory/host_allocator.h"
#include "zt/memory/numa.h"

using namespace zt::cuda;
using namespace zt::memory;

namespace {
constexpr size_t MiB = size_t(1) << 20;
}

// Under a 64 MiB cap: three 20 MiB tensors take three 20 MiB segments; the fourth finds 4 MiB
// left and fails with PyTorch's text and these exact figures, after the allocator emptied its
// cache and retried (nothing was cached).
TEST(CudaDeviceMemory, CappedAllocatorOomTextHasTheRealFigures) {
  ZT_REQUIRE_GPU();
  CudaDeviceSource source(0, 64 * MiB);
  EXPECT_EQ(source.capacity(), 64 * MiB);
  {
    DeviceAllocatorOptions o;
    o.device_ordinal = 0;
    DeviceAllocator alloc(&source, o);
    std::vector<DeviceBlock> blocks;
    for (int i = 0; i < 3; ++i) blocks.push_back(alloc.allocate(20 * MiB, "block" + std::to_string(i) + ".gathered"));
    EXPECT_EQ(source.held(), 60 * MiB);
    EXPECT_EQ(alloc.stats().segment_allocs_total, 3);

    // The memory is real device memory: write and read it back.
    std::vector<uint8_t> pattern(MiB, 0xab), back(MiB, 0);
    ASSERT_EQ(cudaMemcpy(blocks[1].ptr, pattern.data(), MiB, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(back.data(), blocks[1].ptr, MiB, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(back, pattern);

    DeviceOomFigures want;
    want.device_ordinal = 0;
    want.requested_bytes = 20 * MiB;
    want.alloc_bytes = 20 * MiB;
    want.capacity_bytes = 64 * MiB;
    want.free_bytes = 4 * MiB;
    want.process_bytes = 60 * MiB;
    want.allocated_bytes = 60 * MiB;
    want.reserved_bytes = 60 * MiB;
    try {
      alloc.allocate(20 * MiB, "block3.gathered");
      FAIL() << "expected CUDA out of memory";
    } catch (const OutOfMemoryError& e) {
      EXPECT_EQ(std::string(e.what()), OutOfMemoryError::message(want));
      EXPECT_NE(std::string(e.what()).find("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
                                           "capacity of 64.00 MiB of which 4.00 MiB is free."),
                std::string::npos)
          << e.what();
      EXPECT_EQ(e.tensor_name(), "block3.gathered");
    }
    EXPECT_EQ(alloc.stats().num_ooms, 1);
    EXPECT_EQ(alloc.stats().alloc_retries, 1);
    EXPECT_EQ(alloc.check_invariants(), "");

    // Freed blocks stay cached (reserved), and come back from the cache: no new cudaMalloc.
    alloc.free(blocks[0]);
    blocks.erase(blocks.begin());
    DeviceBlock again = alloc.allocate(20 * MiB, "block3.gathered");
    EXPECT_EQ(alloc.stats().segment_allocs_total, 3);
    alloc.free(again);
    for (const DeviceBlock& b : blocks) alloc.free(b);
    EXPECT_EQ(alloc.empty_cache(), 60 * MiB);
    EXPECT_EQ(source.held(), 0u);  // every segment went back through cudaFree
  }
}

// Uncapped: the source reads the whole device (cudaMemGetInfo), and a memory fraction caps the
// allocator; the OOM text then says how much is allowed.
TEST(CudaDeviceMemory, FractionLimitOnTheWholeDevice) {
  ZT_REQUIRE_GPU();
  CudaDeviceSource source(0);
  size_t free_b = 0, total_b = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  EXPECT_EQ(source.capacity(), total_b);
  EXPECT_GT(source.in_use(), 0u);  // at least the CUDA context; other processes count too
  EXPECT_LE(source.in_use(), total_b);
  DeviceAllocatorOptions o;
  DeviceAllocator alloc(&source, o);
  alloc.set_per_process_memory_fraction(double(32 * MiB) / double(source.capacity()));
  DeviceBlock a = alloc.allocate(20 * MiB, "a");
  EXPECT_EQ(source.held(), 20 * MiB);
  try {
    alloc.allocate(20 * MiB, "b");
    FAIL() << "expected CUDA out of memory under the fraction";
  } catch (const OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("Tried to allocate 20.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find(" allowed; Of the allocated memory 20.00 MiB is allocated by PyTorch"), std::string::npos)
        << m;
    EXPECT_EQ(e.figures().capacity_bytes, total_b);
    EXPECT_GE(e.figures().process_bytes, 20 * MiB);  // the whole device's use, ours included
  }
  alloc.free(a);
  EXPECT_EQ(alloc.check_invariants(), "");
}

// Pinned host memory through cudaHostAlloc under the allocator's cap: power-of-two rounding,
// page-locked (the driver knows the pointer), and the host OOM with the cached bytes named.
TEST(CudaPinnedMemory, PinnedAllocatorOnCudaHostAlloc) {
  ZT_REQUIRE_GPU();
  CudaPinnedSource source;
  HostAllocatorOptions o;
  o.cap = 8 * MiB;
  o.source = &source;
  PinnedHostAllocator pinned(o);
  HostBlock a = pinned.allocate(3 * MiB, "fp32_partitioned_groups_flat[0]");
  HostBlock b = pinned.allocate(3 * MiB, "fp32_partitioned_groups_flat[1]");
  EXPECT_EQ(a.size, 4 * MiB);
  EXPECT_EQ(source.in_use(), 8 * MiB);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, a.ptr), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  std::memset(a.ptr, 0x5a, 4 * MiB);  // host-accessible

  pinned.free(b);  // cached, still pinned
  try {
    pinned.allocate(5 * MiB, "fp32_partitioned_groups_flat[2]");  // 8 MiB: over the cap with 4 MiB cached
    FAIL() << "expected a host OOM";
  } catch (const HostOutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("Host out of memory (pinned): tried to pin 8.00 MiB for 'fp32_partitioned_groups_flat[2]'"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("4.00 MiB cached"), std::string::npos) << m;
  }
  pinned.free(a);
  EXPECT_EQ(pinned.empty_cache(), 8 * MiB);
  EXPECT_EQ(source.in_use(), 0u);
}

// --pinned-numa interleave: each region a mapping whose pages interleave over the NUMA nodes,
// pinned by cudaHostRegister (the driver knows it as host memory), copied to the device and back
// as cudaHostAlloc memory is, and unpinned and unmapped on release.
TEST(CudaPinnedMemory, InterleavedRegionsAreMappedThenRegistered) {
  ZT_REQUIRE_GPU();
  if (!interleave_refusal().empty()) GTEST_SKIP() << "NUMA policy calls refused: " << interleave_refusal();
  CudaPinnedSource source(kNoLimit, PagePlacement::Interleave);
  EXPECT_NE(source.describe().find("interleaved over NUMA nodes " + node_list_text(numa_nodes())), std::string::npos)
      << source.describe();
  const size_t n = 6 * MiB + 123;  // not a whole number of pages
  auto* host = static_cast<unsigned char*>(source.allocate(n));
  ASSERT_NE(host, nullptr);
  EXPECT_EQ(source.in_use(), n);
  EXPECT_EQ(placement_of(host), PagePlacement::Interleave);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, host), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  // Pinned: every page is resident, on the nodes the process may use.
  const std::vector<int> nodes = numa_nodes();
  int64_t resident = 0;
  for (const auto& [node, pages] : pages_by_node(host, n)) {
    EXPECT_NE(std::find(nodes.begin(), nodes.end(), node), nodes.end()) << "a page on node " << node;
    resident += pages;
  }
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  EXPECT_EQ(resident, int64_t((n + page - 1) / page));
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<unsigned char>(i * 7);
  DeviceBuffer dev(n);
  check(cudaMemcpy(dev.get(), host, n, cudaMemcpyHostToDevice), "H2D");
  std::memset(host, 0, n);
  check(cudaMemcpy(host, dev.get(), n, cudaMemcpyDeviceToHost), "D2H");
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += host[i] != static_cast<unsigned char>(i * 7);
  EXPECT_EQ(bad, 0u);
  source.release(host, n);
  EXPECT_EQ(source.in_use(), 0u);
}

// The offload pattern on the four streams: H2D on h2d, compute waits on an event, a kernel on
// compute, D2H on d2h after compute's event; the host sees the right values.
TEST(CudaStreams, EventsOrderCopiesAndCompute) {
  ZT_REQUIRE_GPU();
  StreamSet streams(0);
  const size_t n = 1 << 20;
  CudaPinnedSource pinned_src;
  float* host_in = static_cast<float*>(pinned_src.allocate(n * 4));
  float* host_out = static_cast<float*>(pinned_src.allocate(n * 4));
  ASSERT_NE(host_in, nullptr);
  for (size_t i = 0; i < n; ++i) host_in[i] = float(i % 1000);
  DeviceBuffer dev(n * 4);

  Event start(true);
  start.record(streams.h2d());
  check(cudaMemcpyAsync(dev.get(), host_in, n * 4, cudaMemcpyHostToDevice, streams.h2d()), "H2D");
  Event copied = streams.record(StreamKind::H2D);
  streams.wait(StreamKind::Compute, copied);
  scale_inplace(dev.get(), zt::trainer::DType::F32, int64_t(n), 2.0f, streams.compute());
  streams.wait(StreamKind::D2H, StreamKind::Compute);
  check(cudaMemcpyAsync(host_out, dev.get(), n * 4, cudaMemcpyDeviceToHost, streams.d2h()), "D2H");
  Event end(true);
  end.record(streams.d2h());
  end.synchronize();
  EXPECT_TRUE(end.done());
  EXPECT_GE(end.elapsed_ms(start), 0.0f);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += host_out[i] != 2.0f * float(i % 1000);
  EXPECT_EQ(bad, 0u);

  Event never;
  EXPECT_THROW(streams.wait(StreamKind::Compute, never), std::logic_error);
  pinned_src.release(host_in, n * 4);
  pinned_src.release(host_out, n * 4);
}
