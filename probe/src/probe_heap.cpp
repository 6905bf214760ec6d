#include "probe_heap.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>
#include <new>

namespace zt::probe {
namespace {

// Whole pages straight from the kernel: the probe's mmap hook, a program's own mmap interposer
// and the program's arenas never see them.
class MappedPages final : public std::pmr::memory_resource {
  static size_t pages(size_t bytes) { return (bytes + 4095) & ~size_t(4095); }
  void* do_allocate(size_t bytes, size_t alignment) override {
    if (alignment > 4096) throw std::bad_alloc();
    long p = syscall(SYS_mmap, nullptr, pages(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == -1) throw std::bad_alloc();
    return reinterpret_cast<void*>(p);
  }
  void do_deallocate(void* p, size_t bytes, size_t) override { syscall(SYS_munmap, p, pages(bytes)); }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }
};

// An unsynchronized pool behind one mutex: the lock is the probe's to take around fork (a
// synchronized_pool_resource's own lock cannot be taken from outside).
class LockedPool final : public std::pmr::memory_resource {
 public:
  LockedPool(const std::pmr::pool_options& options, std::pmr::memory_resource* upstream) : pool_(options, upstream) {}
  std::mutex mu;

 private:
  void* do_allocate(size_t bytes, size_t alignment) override {
    std::lock_guard lock(mu);
    return pool_.allocate(bytes, alignment);
  }
  void do_deallocate(void* p, size_t bytes, size_t alignment) override {
    std::lock_guard lock(mu);
    pool_.deallocate(p, bytes, alignment);
  }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }
  std::pmr::unsynchronized_pool_resource pool_;
};

LockedPool* locked_pool() {
  // Built in static storage on first use and never destroyed.
  alignas(MappedPages) static unsigned char pages_storage[sizeof(MappedPages)];
  alignas(LockedPool) static unsigned char pool_storage[sizeof(LockedPool)];
  static LockedPool* heap = [] {
    auto* upstream = new (pages_storage) MappedPages();
    std::pmr::pool_options options;
    options.largest_required_pool_block = 4096;  // larger blocks: mappings of their own
    return new (pool_storage) LockedPool(options, upstream);
  }();
  return heap;
}

}  // namespace

std::pmr::memory_resource* probe_heap() { return locked_pool(); }

void probe_heap_lock_for_fork() { locked_pool()->mu.lock(); }
void probe_heap_unlock_after_fork() { locked_pool()->mu.unlock(); }

}  // namespace zt::probe
