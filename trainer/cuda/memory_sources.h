// trainer/cuda/memory_sources.h: real GPU and pinned host memory as zt::memory sources, so the
// existing allocators run unchanged on CUDA: zt::memory::DeviceAllocator over CudaDeviceSource
// (same rounding, pools, stats, cap and PyTorch's OOM text as on the simulated GPU) and
// zt::memory::PinnedHostAllocator over CudaPinnedSource (options.source).
//
// Owns: nothing beyond counters; the regions belong to whoever allocated them until release().
// May call: the CUDA runtime. Called by: the allocators (and tests).
//
// CudaDeviceSource, two modes:
//  - uncapped (cap 0): capacity() is the device's total memory and in_use() is total - free from
//    cudaMemGetInfo, i.e. everything taken on the device by anyone: our segments, the CUDA
//    context, cuBLAS and NCCL workspaces, other processes. The OOM text's "free" and "this
//    process has X in use" then read the device as nvidia-smi would; PyTorch reads the second
//    per process through NVML, so on a shared GPU our figure is larger than PyTorch's.
//  - capped (cap > 0): a smaller GPU carved out of a real one (the simulated GPU's --device-memory,
//    on real memory): capacity() is the cap, in_use() the bytes this source holds (each request
//    rounded up to 512 B), and allocate() refuses what would pass the cap. Also refused, and
//    likewise answered with nullptr, is whatever cudaMalloc itself cannot give.
// allocate() returns nullptr only for lack of memory (cudaErrorMemoryAllocation, cleared so it
// does not linger for the next call); any other CUDA error throws CudaError. release() is
// cudaFree, which synchronizes the device: the caching allocator above calls it rarely (only in
// empty_cache() and on the retry before an OOM), as PyTorch does.
//
// CudaPinnedSource: cudaHostAlloc(cudaHostAllocPortable) regions, usable by every device and
// by DMA without staging; their pages lie on the NUMA node of the thread that pins them. With
// PagePlacement::Interleave instead each region is a mapping whose pages interleave over the
// NUMA nodes (zt/memory/numa.h), pinned by cudaHostRegister(cudaHostRegisterPortable) and
// unpinned and unmapped on release (zt train --pinned-numa interleave). capacity() is the cap,
// or the machine's physical memory when there is none; in_use() the bytes pinned through this
// source. host_accessible() is true.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>

#include "zt/memory/memory_source.h"
#include "zt/memory/numa.h"

namespace zt::cuda {

class CudaDeviceSource final : public memory::MemorySource {
 public:
  explicit CudaDeviceSource(int device, size_t cap = 0);
  void* allocate(size_t bytes) override;
  void release(void* ptr, size_t bytes) override;
  size_t capacity() const override;
  size_t in_use() const override;
  bool host_accessible() const override { return false; }
  std::string describe() const override;

  int device() const { return device_; }
  size_t cap() const { return cap_; }
  size_t held() const { return held_.load(std::memory_order_relaxed); }  // bytes of live regions from here

 private:
  static size_t rounded(size_t bytes) { return ((bytes == 0 ? 1 : bytes) + 511) & ~size_t(511); }
  int device_;
  size_t cap_;
  size_t total_ = 0;  // the device's memory, read once
  std::atomic<size_t> held_{0};
};

class CudaPinnedSource final : public memory::MemorySource {
 public:
  // Throws std::runtime_error, interleaved, where map_pages would (zt/memory/numa.h: check_placement).
  explicit CudaPinnedSource(size_t cap = memory::kNoLimit, memory::PagePlacement placement = memory::PagePlacement::Local);
  void* allocate(size_t bytes) override;
  void release(void* ptr, size_t bytes) override;
  size_t capacity() const override { return capacity_; }
  size_t in_use() const override { return held_.load(std::memory_order_relaxed); }
  bool host_accessible() const override { return true; }
  std::string describe() const override;

 private:
  size_t capacity_;
  memory::PagePlacement placement_;
  std::atomic<size_t> held_{0};
};

}  // namespace zt::cuda
