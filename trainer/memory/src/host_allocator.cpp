#include "zt/memory/host_allocator.h"

#include "error_row.h"

#include <algorithm>
#include <bit>
#include <stdexcept>
#include <string>

namespace zt::memory {

size_t next_power_of_two(size_t bytes) {
  if (bytes <= 1) return bytes;
  return std::bit_ceil(bytes);
}

namespace {

std::unique_ptr<MemorySource> own_source(const HostAllocatorOptions& o) {
  if (o.source) return nullptr;
  // Pinned regions are page-aligned, as cudaHostAlloc's are.
  if (o.backing == HostBacking::Virtual) return std::make_unique<VirtualSource>(o.cap, 4096);
  return std::make_unique<HostBackedSource>(o.cap, 4096);
}

probe::AllocEvent host_event(const HostAllocatorOptions& o, probe::MemoryKind kind, probe::AllocLevel level,
                             uintptr_t addr, size_t bytes, size_t requested, probe::NameId name,
                             probe::AllocId segment) {
  probe::AllocEvent e;
  e.rank = o.rank;
  e.device = o.device;
  e.memory_kind = kind;
  e.level = level;
  e.address = addr;
  e.bytes = int64_t(bytes);
  e.requested_bytes = int64_t(requested);
  e.name = name;
  e.segment = segment;
  return e;
}

}  // namespace

// ------------------------------------------------------------------ pinned

struct PinnedHostAllocator::Region {
  void* ptr = nullptr;
  size_t size = 0;  // a power of two
  size_t requested = 0;
  probe::AllocId segment_id = 0;
  probe::AllocId block_id = 0;  // while handed out
};

PinnedHostAllocator::PinnedHostAllocator(HostAllocatorOptions options)
    : options_(options), owned_source_(own_source(options)), source_(options.source ? options.source : owned_source_.get()) {
  stats_.cap_bytes = options_.cap == kNoLimit ? 0 : int64_t(options_.cap);
  if (options_.recorder) {
    pinned_name_ = options_.recorder->intern("pinned");
    pinned_allocated_name_ = options_.recorder->intern("pinned_allocated");
  }
}

PinnedHostAllocator::~PinnedHostAllocator() {
  std::lock_guard lock(mu_);
  probe::Recorder* rec = options_.recorder;
  for (auto& [addr, r] : active_)
    if (rec && r->block_id) rec->free(r->block_id);
  for (auto& [addr, r] : regions_) {
    if (rec && r->segment_id) rec->free(r->segment_id);
    source_->release(r->ptr, r->size);
  }
}

probe::NameId PinnedHostAllocator::intern(std::string_view name) {
  if (!options_.recorder || name.empty()) return 0;
  return options_.recorder->intern(name);
}

HostBlock PinnedHostAllocator::allocate(size_t bytes, std::string_view name) {
  if (bytes == 0) return {};
  const size_t size = next_power_of_two(bytes);
  const probe::NameId name_id = intern(name);
  std::lock_guard lock(mu_);
  Region* r = nullptr;
  bool reserved_changed = false;
  if (auto it = free_lists_.find(size); it != free_lists_.end() && !it->second.empty()) {
    r = it->second.back();  // most recently freed: its pages are likeliest to be resident
    it->second.pop_back();
    stats_.cache_hits_total += 1;
  } else {
    // No retry after emptying the cache: see the header (PyTorch does not either, and
    // that is the mechanism R1 reproduces).
    HostOomFigures f;
    f.kind = "pinned";
    f.requested_bytes = bytes;
    f.rounded_bytes = size;
    f.held_bytes = size_t(stats_.reserved_bytes);
    f.cached_bytes = size_t(stats_.reserved_bytes - stats_.allocated_bytes);
    f.cap_bytes = options_.cap;
    f.source_capacity = source_->capacity();
    void* p = nullptr;
    bool over_cap = options_.cap != kNoLimit && (size > options_.cap || f.held_bytes > options_.cap - size);
    if (!over_cap) p = source_->allocate(size);
    if (!p) {
      f.source_in_use = source_->in_use();
      f.source_full = !over_cap;
      stats_.num_ooms += 1;
      HostOutOfMemoryError err(f, std::string(name));
      if (options_.recorder) {
        db::ErrorRow row;
        row.rank = options_.rank;
        row.kind = "host_oom";
        row.message = err.what();
        row.device_id = options_.device;
        row.tensors = detail::json_name_array(name);
        options_.recorder->error(row);
      }
      throw err;
    }
    auto owned = std::make_unique<Region>();
    r = owned.get();
    r->ptr = p;
    r->size = size;
    if (options_.recorder)
      r->segment_id = options_.recorder->alloc(host_event(options_, probe::MemoryKind::PinnedHost,
                                                          probe::AllocLevel::Segment, uintptr_t(p), size, size,
                                                          name_id, 0));
    regions_.emplace(uintptr_t(p), std::move(owned));
    stats_.reserved_bytes += int64_t(size);
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    stats_.regions += 1;
    stats_.regions_total += 1;
    reserved_changed = true;
  }
  r->requested = bytes;
  if (options_.recorder)
    r->block_id = options_.recorder->alloc(host_event(options_, probe::MemoryKind::PinnedHost,
                                                      probe::AllocLevel::Block, uintptr_t(r->ptr), r->size, bytes,
                                                      name_id, r->segment_id));
  active_.emplace(uintptr_t(r->ptr), r);
  stats_.allocated_bytes += int64_t(r->size);
  stats_.requested_bytes += int64_t(bytes);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.allocations += 1;
  stats_.allocations_total += 1;
  stats_.cached_bytes = stats_.reserved_bytes - stats_.allocated_bytes;
  note_changed(reserved_changed);
  return HostBlock{r->ptr, r->size, bytes, r->block_id};
}

void PinnedHostAllocator::free(const HostBlock& block) {
  if (!block.ptr) return;
  std::lock_guard lock(mu_);
  auto it = active_.find(uintptr_t(block.ptr));
  if (it == active_.end())
    throw std::invalid_argument("PinnedHostAllocator::free: " + std::to_string(uintptr_t(block.ptr)) +
                                " is not handed out by this allocator (double free, or another allocator's)");
  Region* r = it->second;
  active_.erase(it);
  if (options_.recorder && r->block_id) options_.recorder->free(r->block_id);
  r->block_id = 0;
  stats_.allocated_bytes -= int64_t(r->size);
  stats_.requested_bytes -= int64_t(r->requested);
  stats_.allocations -= 1;
  stats_.cached_bytes = stats_.reserved_bytes - stats_.allocated_bytes;
  free_lists_[r->size].push_back(r);
  note_changed(false);
}

size_t PinnedHostAllocator::empty_cache() {
  std::lock_guard lock(mu_);
  size_t released = 0;
  for (auto& [size, list] : free_lists_) {
    for (Region* r : list) {
      if (options_.recorder && r->segment_id) options_.recorder->free(r->segment_id);
      source_->release(r->ptr, r->size);
      released += r->size;
      stats_.reserved_bytes -= int64_t(r->size);
      stats_.regions -= 1;
      regions_.erase(uintptr_t(r->ptr));  // destroys r
    }
  }
  free_lists_.clear();
  stats_.cached_bytes = stats_.reserved_bytes - stats_.allocated_bytes;
  if (released) note_changed(true);
  return released;
}

HostAllocatorStats PinnedHostAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void PinnedHostAllocator::reset_peak_stats() {
  std::lock_guard lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void PinnedHostAllocator::note_changed(bool reserved_changed) {
  probe::Recorder* rec = options_.recorder;
  if (!rec || !options_.record_counters) return;
  rec->counter(options_.rank, options_.device, pinned_allocated_name_, double(stats_.allocated_bytes));
  if (reserved_changed) rec->counter(options_.rank, options_.device, pinned_name_, double(stats_.reserved_bytes));
}

void PinnedHostAllocator::record_counters() {
  std::lock_guard lock(mu_);
  probe::Recorder* rec = options_.recorder;
  if (!rec) return;
  rec->counter(options_.rank, options_.device, pinned_allocated_name_, double(stats_.allocated_bytes));
  rec->counter(options_.rank, options_.device, pinned_name_, double(stats_.reserved_bytes));
}

// ------------------------------------------------------------------ pageable

PageableHostAllocator::PageableHostAllocator(HostAllocatorOptions options)
    : options_(options), owned_source_(own_source(options)), source_(options.source ? options.source : owned_source_.get()) {
  stats_.cap_bytes = options_.cap == kNoLimit ? 0 : int64_t(options_.cap);
  if (options_.recorder) pageable_name_ = options_.recorder->intern("pageable");
}

PageableHostAllocator::~PageableHostAllocator() {
  std::lock_guard lock(mu_);
  for (auto& [addr, b] : live_) {
    if (options_.recorder) {
      if (b.block_id) options_.recorder->free(b.block_id);
      if (b.segment_id) options_.recorder->free(b.segment_id);
    }
    source_->release(reinterpret_cast<void*>(addr), b.size);
  }
}

HostBlock PageableHostAllocator::allocate(size_t bytes, std::string_view name) {
  if (bytes == 0) return {};
  probe::Recorder* rec = options_.recorder;
  const probe::NameId name_id = rec && !name.empty() ? rec->intern(name) : 0;
  std::lock_guard lock(mu_);
  bool over_cap = options_.cap != kNoLimit && (bytes > options_.cap || size_t(stats_.reserved_bytes) > options_.cap - bytes);
  void* p = over_cap ? nullptr : source_->allocate(bytes);
  if (!p) {
    HostOomFigures f;
    f.kind = "pageable";
    f.requested_bytes = bytes;
    f.rounded_bytes = bytes;
    f.held_bytes = size_t(stats_.reserved_bytes);
    f.cached_bytes = 0;
    f.cap_bytes = options_.cap;
    f.source_capacity = source_->capacity();
    f.source_in_use = source_->in_use();
    f.source_full = !over_cap;
    stats_.num_ooms += 1;
    HostOutOfMemoryError err(f, std::string(name));
    if (rec) {
      db::ErrorRow row;
      row.rank = options_.rank;
      row.kind = "host_oom";
      row.message = err.what();
      row.device_id = options_.device;
      row.tensors = detail::json_name_array(name);
      rec->error(row);
    }
    throw err;
  }
  Buffer b;
  b.size = bytes;
  b.requested = bytes;
  if (rec) {
    b.segment_id = rec->alloc(host_event(options_, probe::MemoryKind::PageableHost, probe::AllocLevel::Segment,
                                         uintptr_t(p), bytes, bytes, name_id, 0));
    b.block_id = rec->alloc(host_event(options_, probe::MemoryKind::PageableHost, probe::AllocLevel::Block,
                                       uintptr_t(p), bytes, bytes, name_id, b.segment_id));
  }
  live_.emplace(uintptr_t(p), b);
  stats_.allocated_bytes += int64_t(bytes);
  stats_.requested_bytes += int64_t(bytes);
  stats_.reserved_bytes += int64_t(bytes);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  stats_.regions += 1;
  stats_.regions_total += 1;
  stats_.allocations += 1;
  stats_.allocations_total += 1;
  if (rec && options_.record_counters)
    rec->counter(options_.rank, options_.device, pageable_name_, double(stats_.allocated_bytes));
  return HostBlock{p, bytes, bytes, b.block_id};
}

void PageableHostAllocator::free(const HostBlock& block) {
  if (!block.ptr) return;
  std::lock_guard lock(mu_);
  auto it = live_.find(uintptr_t(block.ptr));
  if (it == live_.end())
    throw std::invalid_argument("PageableHostAllocator::free: " + std::to_string(uintptr_t(block.ptr)) +
                                " is not allocated here (double free, or another allocator's)");
  Buffer b = it->second;
  live_.erase(it);
  probe::Recorder* rec = options_.recorder;
  if (rec) {
    if (b.block_id) rec->free(b.block_id);
    if (b.segment_id) rec->free(b.segment_id);
  }
  source_->release(block.ptr, b.size);
  stats_.allocated_bytes -= int64_t(b.size);
  stats_.requested_bytes -= int64_t(b.requested);
  stats_.reserved_bytes -= int64_t(b.size);
  stats_.regions -= 1;
  stats_.allocations -= 1;
  if (rec && options_.record_counters)
    rec->counter(options_.rank, options_.device, pageable_name_, double(stats_.allocated_bytes));
}

HostAllocatorStats PageableHostAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void PageableHostAllocator::reset_peak_stats() {
  std::lock_guard lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

}  // namespace zt::memory
