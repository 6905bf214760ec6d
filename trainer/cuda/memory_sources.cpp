// trainer/cuda/memory_sources.cpp: see memory_sources.h.
#include "cuda/memory_sources.h"

#include <unistd.h>

#include "cuda/runtime.h"
#include "zt/common/units.h"

namespace zt::cuda {

namespace {

// Takes n out of `held` unless that would pass `cap`; a CAS loop so that concurrent callers
// never see held above the cap.
bool take(std::atomic<size_t>& held, size_t n, size_t cap) {
  size_t cur = held.load(std::memory_order_relaxed);
  do {
    if (n > cap || cur > cap - n) return false;
  } while (!held.compare_exchange_weak(cur, cur + n, std::memory_order_relaxed));
  return true;
}

}  // namespace

CudaDeviceSource::CudaDeviceSource(int device, size_t cap) : device_(device), cap_(cap) {
  DeviceGuard guard(device);
  size_t free_b = 0;
  check(cudaMemGetInfo(&free_b, &total_), "cudaMemGetInfo");
}

void* CudaDeviceSource::allocate(size_t bytes) {
  const size_t n = rounded(bytes);
  if (cap_ != 0 && !take(held_, n, cap_)) return nullptr;
  DeviceGuard guard(device_);
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, n);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    if (cap_ != 0) held_.fetch_sub(n, std::memory_order_relaxed);
    return nullptr;
  }
  if (e != cudaSuccess) {
    if (cap_ != 0) held_.fetch_sub(n, std::memory_order_relaxed);
    check(e, "cudaMalloc");
  }
  if (cap_ == 0) held_.fetch_add(n, std::memory_order_relaxed);
  return p;
}

void CudaDeviceSource::release(void* ptr, size_t bytes) {
  if (!ptr) return;
  DeviceGuard guard(device_);
  check(cudaFree(ptr), "cudaFree");
  held_.fetch_sub(rounded(bytes), std::memory_order_relaxed);
}

size_t CudaDeviceSource::capacity() const { return cap_ != 0 ? cap_ : total_; }

size_t CudaDeviceSource::in_use() const {
  if (cap_ != 0) return held();
  DeviceGuard guard(device_);
  size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  return total_b - free_b;
}

std::string CudaDeviceSource::describe() const {
  std::string s = "CUDA device " + std::to_string(device_) + " memory (cudaMalloc), ";
  if (cap_ != 0) return s + "capped at " + format_bytes(double(cap_)) + " of " + format_bytes(double(total_));
  return s + format_bytes(double(total_));
}

CudaPinnedSource::CudaPinnedSource(size_t cap, memory::PagePlacement placement) : capacity_(cap), placement_(placement) {
  if (capacity_ == memory::kNoLimit) {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) capacity_ = size_t(pages) * size_t(page);
  }
  memory::check_placement(placement_);
}

// Interleaved: a mapping of its own whose pages the interleave policy places as cudaHostRegister
// faults them in to pin them.
void* CudaPinnedSource::allocate(size_t bytes) {
  const size_t n = bytes == 0 ? 1 : bytes;
  if (!take(held_, n, capacity_)) return nullptr;
  void* p = nullptr;
  cudaError_t e = cudaSuccess;
  if (placement_ == memory::PagePlacement::Interleave) {
    try {
      p = memory::map_pages(n, placement_);
    } catch (...) {
      held_.fetch_sub(n, std::memory_order_relaxed);
      throw;
    }
    if (!p) {
      held_.fetch_sub(n, std::memory_order_relaxed);
      return nullptr;
    }
    e = cudaHostRegister(p, n, cudaHostRegisterPortable);
    if (e != cudaSuccess) memory::unmap_pages(p, n);
  } else {
    e = cudaHostAlloc(&p, n, cudaHostAllocPortable);
  }
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    held_.fetch_sub(n, std::memory_order_relaxed);
    return nullptr;
  }
  if (e != cudaSuccess) {
    held_.fetch_sub(n, std::memory_order_relaxed);
    check(e, placement_ == memory::PagePlacement::Interleave ? "cudaHostRegister" : "cudaHostAlloc");
  }
  return p;
}

void CudaPinnedSource::release(void* ptr, size_t bytes) {
  if (!ptr) return;
  const size_t n = bytes == 0 ? 1 : bytes;
  if (placement_ == memory::PagePlacement::Interleave) {
    check(cudaHostUnregister(ptr), "cudaHostUnregister");
    memory::unmap_pages(ptr, n);
  } else {
    check(cudaFreeHost(ptr), "cudaFreeHost");
  }
  held_.fetch_sub(n, std::memory_order_relaxed);
}

std::string CudaPinnedSource::describe() const {
  if (placement_ == memory::PagePlacement::Interleave)
    return "pinned host memory (mapped, pages interleaved over NUMA nodes " + memory::node_list_text(memory::numa_nodes()) +
           ", cudaHostRegister), capacity " + format_bytes(double(capacity_));
  return "pinned host memory (cudaHostAlloc), capacity " + format_bytes(double(capacity_));
}

}  // namespace zt::cuda
