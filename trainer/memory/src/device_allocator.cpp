#include "zt/memory/device_allocator.h"

#include "error_row.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace zt::memory {

// A segment: one region from the source. Its blocks tile it; `first` is the lowest.
struct DeviceAllocator::Segment {
  uintptr_t addr = 0;
  size_t size = 0;
  bool small = false;
  int64_t stream = -1;
  probe::AllocId rec_id = 0;
  void* ptr = nullptr;  // as the source returned it: release() wants it back
};

// A block: a piece of a segment, handed out or cached. Never stored in the memory itself.
struct DeviceAllocator::Block {
  uintptr_t addr = 0;
  size_t size = 0;
  size_t requested = 0;
  int64_t stream = -1;
  bool allocated = false;
  Segment* segment = nullptr;
  Block* prev = nullptr;  // neighbours in address order within the segment
  Block* next = nullptr;
  probe::AllocId rec_id = 0;
  uint64_t id = 0;
  bool is_split() const { return prev != nullptr || next != nullptr; }
};

// Best fit order: stream, then size, then address (PyTorch's BlockComparatorSize).
bool DeviceAllocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  return a->addr < b->addr;
}

size_t round_request(size_t bytes) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  return kMinBlockSize * ((bytes + kMinBlockSize - 1) / kMinBlockSize);
}

size_t segment_size_for(size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);
}

namespace {

// PyTorch's should_split: small blocks split for any remainder (sizes are multiples of
// 512, so the rest is at least 512 B); large ones only when the rest could serve a
// large request (> 1 MiB), else the slack stays with the block and counts as allocated.
bool should_split(size_t block_size, size_t size, bool small) {
  size_t rest = block_size - size;
  return small ? rest >= kMinBlockSize : rest > kSmallSize;
}

}  // namespace

DeviceAllocator::DeviceAllocator(MemorySource* source, DeviceAllocatorOptions options)
    : source_(source), options_(options) {
  if (!source_) throw std::invalid_argument("DeviceAllocator: a MemorySource is required");
  if (options_.recorder) {
    allocated_name_ = options_.recorder->intern("allocated");
    reserved_name_ = options_.recorder->intern("reserved");
  }
}

DeviceAllocator::~DeviceAllocator() {
  std::lock_guard lock(mu_);
  probe::Recorder* rec = options_.recorder;
  // Close every block row (handed out or cached) before the segment rows, so that no
  // block outlives its segment in the trace.
  auto drop_block = [&](Block* b) {
    if (rec && b->allocated && b->rec_id) rec->free(b->rec_id);
    delete b;
  };
  for (auto& [addr, b] : active_) drop_block(b);
  for (Block* b : small_pool_) drop_block(b);
  for (Block* b : large_pool_) drop_block(b);
  active_.clear();
  small_pool_.clear();
  large_pool_.clear();
  for (auto& [addr, seg] : segments_) {
    if (rec && seg->rec_id) rec->free(seg->rec_id);
    source_->release(seg->ptr, seg->size);
  }
  segments_.clear();
  for (Block* b : spare_blocks_) delete b;
}

// Every split makes a Block and every merge drops one; in the cached steady state that
// is one pair per allocate/free, so the structs are recycled instead of going to malloc.
DeviceAllocator::Block* DeviceAllocator::new_block() {
  if (spare_blocks_.empty()) return new Block;
  Block* b = spare_blocks_.back();
  spare_blocks_.pop_back();
  *b = Block{};
  return b;
}

void DeviceAllocator::recycle(Block* b) {
  if (spare_blocks_.size() < 1024) {
    spare_blocks_.push_back(b);
  } else {
    delete b;
  }
}

probe::NameId DeviceAllocator::intern(std::string_view name) {
  if (!options_.recorder || name.empty()) return 0;
  return options_.recorder->intern(name);
}

DeviceBlock DeviceAllocator::allocate(size_t bytes, std::string_view name, int64_t stream) {
  return allocate_impl(bytes, intern(name), name, stream);
}

DeviceBlock DeviceAllocator::allocate(size_t bytes, probe::NameId name, int64_t stream) {
  return allocate_impl(bytes, name, {}, stream);
}

DeviceAllocator::Block* DeviceAllocator::find_free_block(Pool& pool, int64_t stream, size_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  key.addr = 0;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

// Takes a new segment and returns it as one free block (in no pool), or nullptr when the
// limit or the source says no.
DeviceAllocator::Block* DeviceAllocator::take_segment(size_t segment_bytes, bool small, int64_t stream,
                                                      probe::NameId name) {
  if (limit_ != 0 && size_t(stats_.reserved_bytes) + segment_bytes > limit_) return nullptr;
  void* p = source_->allocate(segment_bytes);
  if (!p) return nullptr;
  auto seg = std::make_unique<Segment>();
  seg->addr = reinterpret_cast<uintptr_t>(p);
  seg->size = segment_bytes;
  seg->small = small;
  seg->stream = stream;
  seg->ptr = p;
  if (probe::Recorder* rec = options_.recorder) {
    probe::AllocEvent e;
    e.rank = options_.rank;
    e.device = options_.device;
    e.memory_kind = probe::MemoryKind::Device;
    e.level = probe::AllocLevel::Segment;
    e.address = seg->addr;
    e.bytes = int64_t(segment_bytes);
    e.requested_bytes = int64_t(segment_bytes);
    // A segment carries the name of the request that made the allocator take it: the
    // question a timeline answers is "which tensor made reserved grow here".
    e.name = name;
    e.stream = stream;
    seg->rec_id = rec->alloc(e);
  }
  Block* b = new_block();
  b->addr = seg->addr;
  b->size = segment_bytes;
  b->stream = stream;
  b->segment = seg.get();
  stats_.reserved_bytes += int64_t(segment_bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  stats_.segments += 1;
  stats_.segment_allocs_total += 1;
  segments_.emplace(seg->addr, std::move(seg));
  note_reserved_changed();
  return b;
}

DeviceBlock DeviceAllocator::allocate_impl(size_t bytes, probe::NameId name, std::string_view text,
                                           int64_t stream) {
  if (bytes == 0) return {};
  const size_t size = round_request(bytes);
  const bool small = is_small_request(size);
  std::lock_guard lock(mu_);
  Pool& pool = pool_for(small);
  Block* b = find_free_block(pool, stream, size);
  if (b) {
    if (b->is_split()) stats_.inactive_split_bytes -= int64_t(b->size);
  } else {
    const size_t seg_bytes = segment_size_for(size);
    b = take_segment(seg_bytes, small, stream, name);
    if (!b) {
      // PyTorch frees cached segments and retries before giving up: memory held in the
      // cache is not "in use", so an OOM while the cache could satisfy it would be wrong.
      stats_.alloc_retries += 1;
      release_free_segments();
      b = take_segment(seg_bytes, small, stream, name);
    }
    if (!b) throw_oom(bytes, seg_bytes, text);
  }

  if (should_split(b->size, size, small)) {
    // The front becomes the caller's block; the rest stays cached in the same segment.
    Block* rest = new_block();
    rest->addr = b->addr + size;
    rest->size = b->size - size;
    rest->stream = b->stream;
    rest->segment = b->segment;
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    pool.insert(rest);
    stats_.inactive_split_bytes += int64_t(rest->size);
  }

  b->allocated = true;
  b->requested = bytes;
  b->id = next_block_id_++;
  if (probe::Recorder* rec = options_.recorder) {
    probe::AllocEvent e;
    e.rank = options_.rank;
    e.device = options_.device;
    e.memory_kind = probe::MemoryKind::Device;
    e.level = probe::AllocLevel::Block;
    e.address = b->addr;
    e.bytes = int64_t(b->size);
    e.requested_bytes = int64_t(bytes);
    e.name = name;
    e.segment = b->segment->rec_id;
    e.stream = stream;
    if (options_.capture_stacks) e.stack = rec->capture_stack(1);
    b->rec_id = rec->alloc(e);
  } else {
    b->rec_id = 0;
  }
  active_.emplace(b->addr, b);
  stats_.allocated_bytes += int64_t(b->size);
  stats_.active_bytes += int64_t(b->size);
  stats_.requested_bytes += int64_t(bytes);
  stats_.allocations += 1;
  stats_.allocations_total += 1;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.peak_active_bytes = std::max(stats_.peak_active_bytes, stats_.active_bytes);
  note_allocated_changed();
  return DeviceBlock{reinterpret_cast<void*>(b->addr), b->size, bytes, stream, b->id, b->rec_id};
}

void DeviceAllocator::free(const DeviceBlock& handle) {
  if (!handle.ptr) return;
  std::lock_guard lock(mu_);
  auto it = active_.find(reinterpret_cast<uintptr_t>(handle.ptr));
  if (it == active_.end() || it->second->id != handle.id)
    throw std::invalid_argument("DeviceAllocator::free: block " + std::to_string(handle.id) + " at address " +
                                std::to_string(reinterpret_cast<uintptr_t>(handle.ptr)) +
                                " is not allocated here (double free, or a block from another allocator)");
  Block* b = it->second;
  active_.erase(it);
  if (probe::Recorder* rec = options_.recorder; rec && b->rec_id) rec->free(b->rec_id);
  stats_.allocated_bytes -= int64_t(b->size);
  stats_.active_bytes -= int64_t(b->size);
  stats_.requested_bytes -= int64_t(b->requested);
  stats_.allocations -= 1;
  stats_.frees_total += 1;
  b->allocated = false;
  b->requested = 0;
  b->rec_id = 0;

  // Merge with free neighbours: they are cached, so take them out of the pool first.
  Pool& pool = pool_for(b->segment->small);
  if (Block* p = b->prev; p && !p->allocated) {  // b absorbs its lower neighbour
    pool.erase(p);
    stats_.inactive_split_bytes -= int64_t(p->size);
    b->addr = p->addr;
    b->size += p->size;
    b->prev = p->prev;
    if (b->prev) b->prev->next = b;
    recycle(p);
  }
  if (Block* n = b->next; n && !n->allocated) {  // and its upper one
    pool.erase(n);
    stats_.inactive_split_bytes -= int64_t(n->size);
    b->size += n->size;
    b->next = n->next;
    if (b->next) b->next->prev = b;
    recycle(n);
  }
  if (b->is_split()) stats_.inactive_split_bytes += int64_t(b->size);
  pool.insert(b);
  note_allocated_changed();
}

void DeviceAllocator::release_segment(Block* whole) {
  auto it = segments_.find(whole->addr);
  Segment* seg = it->second.get();
  if (probe::Recorder* rec = options_.recorder; rec && seg->rec_id) rec->free(seg->rec_id);
  source_->release(seg->ptr, seg->size);
  stats_.reserved_bytes -= int64_t(seg->size);
  stats_.segments -= 1;
  stats_.segment_frees_total += 1;
  recycle(whole);
  segments_.erase(it);
}

size_t DeviceAllocator::release_free_segments() {
  size_t released = 0;
  for (Pool* pool : {&small_pool_, &large_pool_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->is_split()) {  // part of a segment that is partly in use: cannot go back
        ++it;
        continue;
      }
      it = pool->erase(it);
      released += b->size;
      release_segment(b);
    }
  }
  if (released) note_reserved_changed();
  return released;
}

size_t DeviceAllocator::empty_cache() {
  std::lock_guard lock(mu_);
  return release_free_segments();
}

void DeviceAllocator::throw_oom(size_t requested, size_t segment_bytes, std::string_view tensor) {
  stats_.num_ooms += 1;
  DeviceOomFigures f;
  f.device_ordinal = options_.device_ordinal;
  f.requested_bytes = requested;
  f.alloc_bytes = segment_bytes;
  f.capacity_bytes = source_->capacity();
  size_t in_use = source_->in_use();
  f.free_bytes = f.capacity_bytes > in_use ? f.capacity_bytes - in_use : 0;
  f.process_bytes = in_use;
  f.allocated_bytes = size_t(stats_.allocated_bytes);
  f.reserved_bytes = size_t(stats_.reserved_bytes);
  f.limit_bytes = limit_;
  OutOfMemoryError err(f, std::string(tensor));
  if (probe::Recorder* rec = options_.recorder) {
    db::ErrorRow row;
    row.rank = options_.rank;
    row.kind = "oom";
    row.message = err.what();
    row.device_id = options_.device;
    row.tensors = detail::json_name_array(tensor);
    rec->error(row);
  }
  throw err;
}

void DeviceAllocator::set_per_process_memory_fraction(double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0))
    throw std::invalid_argument("set_per_process_memory_fraction: fraction must be in [0, 1], got " +
                                std::to_string(fraction));
  std::lock_guard lock(mu_);
  limit_ = size_t(fraction * double(source_->capacity()));
  if (limit_ == 0) limit_ = 1;  // a fraction of 0 forbids any new segment; 0 means "none"
  stats_.limit_bytes = int64_t(limit_);
}

void DeviceAllocator::clear_memory_fraction() {
  std::lock_guard lock(mu_);
  limit_ = 0;
  stats_.limit_bytes = 0;
}

DeviceAllocatorStats DeviceAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void DeviceAllocator::reset_peak_stats() {
  std::lock_guard lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_active_bytes = stats_.active_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void DeviceAllocator::note_allocated_changed() {
  if (options_.recorder && options_.record_counters)
    options_.recorder->counter(options_.rank, options_.device, allocated_name_, double(stats_.allocated_bytes));
}

void DeviceAllocator::note_reserved_changed() {
  if (options_.recorder && options_.record_counters)
    options_.recorder->counter(options_.rank, options_.device, reserved_name_, double(stats_.reserved_bytes));
}

void DeviceAllocator::record_counters() {
  std::lock_guard lock(mu_);
  if (!options_.recorder) return;
  options_.recorder->counter(options_.rank, options_.device, allocated_name_, double(stats_.allocated_bytes));
  options_.recorder->counter(options_.rank, options_.device, reserved_name_, double(stats_.reserved_bytes));
}

std::string DeviceAllocator::check_invariants() const {
  std::lock_guard lock(mu_);
  // Walk each segment from its first block. The first block is the one whose address is
  // the segment's: find it among handed-out and cached blocks.
  std::unordered_map<uintptr_t, const Block*> first;
  auto consider = [&](const Block* b) {
    if (!b->prev) first[b->addr] = b;
  };
  for (auto& [a, b] : active_) consider(b);
  for (const Block* b : small_pool_) consider(b);
  for (const Block* b : large_pool_) consider(b);
  int64_t allocated = 0, reserved = 0, inactive_split = 0;
  size_t blocks_seen = 0;
  for (auto& [addr, seg] : segments_) {
    auto f = first.find(addr);
    if (f == first.end()) return "segment at " + std::to_string(addr) + " has no first block";
    uintptr_t expect = addr;
    bool split = f->second->next != nullptr;
    for (const Block* b = f->second; b; b = b->next) {
      ++blocks_seen;
      if (b->segment != seg.get()) return "a block points at the wrong segment";
      if (b->addr != expect) return "blocks of a segment leave a gap or overlap";
      if (b->next && b->next->prev != b) return "broken prev/next links";
      if (!b->allocated && b->next && !b->next->allocated) return "two adjacent free blocks were not merged";
      if (b->size % kMinBlockSize) return "a block size is not a multiple of 512";
      const Pool& pool = seg->small ? small_pool_ : large_pool_;
      bool cached = pool.count(const_cast<Block*>(b)) != 0;
      bool handed = active_.count(b->addr) && active_.at(b->addr) == b;
      if (cached == handed || cached == b->allocated) return "a block is neither exactly cached nor handed out";
      if (b->allocated) allocated += int64_t(b->size);
      if (!b->allocated && split) inactive_split += int64_t(b->size);
      expect += b->size;
    }
    if (expect != addr + seg->size) return "blocks do not cover their segment";
    reserved += int64_t(seg->size);
  }
  if (blocks_seen != active_.size() + small_pool_.size() + large_pool_.size())
    return "a block lies outside every segment";
  if (allocated != stats_.allocated_bytes) return "allocated_bytes disagrees with the blocks";
  if (reserved != stats_.reserved_bytes) return "reserved_bytes disagrees with the segments";
  if (inactive_split != stats_.inactive_split_bytes) return "inactive_split_bytes disagrees with the blocks";
  if (!(stats_.allocated_bytes <= stats_.active_bytes && stats_.active_bytes <= stats_.reserved_bytes))
    return "allocated <= active <= reserved does not hold";
  if (size_t(stats_.reserved_bytes) > source_->in_use()) return "reserved exceeds the source's in_use";
  return "";
}

}  // namespace zt::memory
