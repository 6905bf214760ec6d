#include "zt/memory/memory_source.h"

#include <unistd.h>

#include <cstdlib>
#include <stdexcept>

#include "zt/common/units.h"

namespace zt::memory {

namespace {

bool is_power_of_two(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

std::string capacity_text(size_t capacity) {
  return capacity == kNoLimit ? std::string("unlimited") : format_bytes(double(capacity));
}

}  // namespace

// A CAS loop rather than fetch_add-then-undo, so concurrent callers never see in_use()
// above the capacity.
size_t CappedSource::take(size_t bytes) {
  const size_t n = rounded(bytes);
  size_t cur = in_use_.load(std::memory_order_relaxed);
  do {
    if (n > capacity_ || cur > capacity_ - n) return 0;
  } while (!in_use_.compare_exchange_weak(cur, cur + n, std::memory_order_relaxed));
  return n;
}

HostBackedSource::HostBackedSource(size_t capacity, size_t alignment, PagePlacement placement)
    : CappedSource(capacity, alignment), placement_(placement) {
  if (!is_power_of_two(alignment) || alignment < sizeof(void*))
    throw std::invalid_argument("HostBackedSource: alignment must be a power of two >= " +
                                std::to_string(sizeof(void*)) + " bytes, got " + std::to_string(alignment));
  if (placement == PagePlacement::Interleave) {
    const long page = ::sysconf(_SC_PAGESIZE);
    if (page > 0 && alignment > size_t(page))
      throw std::invalid_argument("HostBackedSource: interleaved regions are mappings, aligned to the page (" +
                                  std::to_string(page) + " bytes), not to " + std::to_string(alignment));
    check_placement(placement);
  }
}

void* HostBackedSource::allocate(size_t bytes) {
  const size_t n = take(bytes);
  if (n == 0) return nullptr;
  void* p = nullptr;
  try {
    p = placement_ == PagePlacement::Interleave ? map_pages(n, placement_) : std::aligned_alloc(alignment(), n);
  } catch (...) {
    give_back(bytes);
    throw;
  }
  if (!p) give_back(bytes);  // the host itself is out of memory: same answer as a full device
  return p;
}

void HostBackedSource::release(void* ptr, size_t bytes) {
  if (!ptr) return;
  if (placement_ == PagePlacement::Interleave) unmap_pages(ptr, rounded(bytes));
  else std::free(ptr);
  give_back(bytes);
}

std::string HostBackedSource::describe() const {
  std::string s = "host-backed memory, capacity " + capacity_text(capacity());
  if (placement_ == PagePlacement::Interleave) s += ", pages interleaved over NUMA nodes " + node_list_text(numa_nodes());
  return s;
}

VirtualSource::VirtualSource(size_t capacity, size_t alignment, uint64_t base)
    : CappedSource(capacity, alignment), next_(base) {
  if (!is_power_of_two(alignment))
    throw std::invalid_argument("VirtualSource: alignment must be a power of two, got " +
                                std::to_string(alignment));
  if (base == 0 || base % alignment != 0)
    throw std::invalid_argument("VirtualSource: base address must be non-zero and aligned");
}

void* VirtualSource::allocate(size_t bytes) {
  const size_t n = take(bytes);
  if (n == 0) return nullptr;
  uint64_t addr = next_.fetch_add(n, std::memory_order_relaxed);
  return reinterpret_cast<void*>(static_cast<uintptr_t>(addr));
}

void VirtualSource::release(void* ptr, size_t bytes) {
  if (!ptr) return;
  give_back(bytes);
}

std::string VirtualSource::describe() const {
  return "virtual memory (sizes only), capacity " + capacity_text(capacity());
}

}  // namespace zt::memory
