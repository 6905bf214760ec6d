#include "zt/memory/memory_source.h"

#include <cstdlib>
#include <stdexcept>

#include "zt/common/units.h"

namespace zt::memory {

namespace {

bool is_power_of_two(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

// Takes `bytes` out of `capacity` unless that would overflow it. A CAS loop rather than
// fetch_add-then-undo, so concurrent callers never see in_use() above the capacity.
bool reserve(std::atomic<size_t>& in_use, size_t capacity, size_t bytes) {
  size_t cur = in_use.load(std::memory_order_relaxed);
  do {
    if (bytes > capacity || cur > capacity - bytes) return false;
  } while (!in_use.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
  return true;
}

std::string capacity_text(size_t capacity) {
  return capacity == kNoLimit ? std::string("unlimited") : format_bytes(double(capacity));
}

}  // namespace

HostBackedSource::HostBackedSource(size_t capacity, size_t alignment)
    : capacity_(capacity), alignment_(alignment) {
  if (!is_power_of_two(alignment) || alignment < sizeof(void*))
    throw std::invalid_argument("HostBackedSource: alignment must be a power of two >= " +
                                std::to_string(sizeof(void*)) + " bytes, got " + std::to_string(alignment));
}

void* HostBackedSource::allocate(size_t bytes) {
  size_t n = rounded(bytes == 0 ? 1 : bytes);
  if (!reserve(in_use_, capacity_, n)) return nullptr;
  void* p = std::aligned_alloc(alignment_, n);
  if (!p) {  // the host itself is out of memory: same answer as a full device
    in_use_.fetch_sub(n, std::memory_order_relaxed);
    return nullptr;
  }
  return p;
}

void HostBackedSource::release(void* ptr, size_t bytes) {
  if (!ptr) return;
  std::free(ptr);
  in_use_.fetch_sub(rounded(bytes == 0 ? 1 : bytes), std::memory_order_relaxed);
}

std::string HostBackedSource::describe() const {
  return "host-backed memory, capacity " + capacity_text(capacity_);
}

VirtualSource::VirtualSource(size_t capacity, size_t alignment, uint64_t base)
    : capacity_(capacity), alignment_(alignment), next_(base) {
  if (!is_power_of_two(alignment))
    throw std::invalid_argument("VirtualSource: alignment must be a power of two, got " +
                                std::to_string(alignment));
  if (base == 0 || base % alignment != 0)
    throw std::invalid_argument("VirtualSource: base address must be non-zero and aligned");
}

void* VirtualSource::allocate(size_t bytes) {
  size_t n = rounded(bytes == 0 ? 1 : bytes);
  if (!reserve(in_use_, capacity_, n)) return nullptr;
  uint64_t addr = next_.fetch_add(n, std::memory_order_relaxed);
  return reinterpret_cast<void*>(static_cast<uintptr_t>(addr));
}

void VirtualSource::release(void* ptr, size_t bytes) {
  if (!ptr) return;
  in_use_.fetch_sub(rounded(bytes == 0 ? 1 : bytes), std::memory_order_relaxed);
}

std::string VirtualSource::describe() const {
  return "virtual memory (sizes only), capacity " + capacity_text(capacity_);
}

}  // namespace zt::memory
