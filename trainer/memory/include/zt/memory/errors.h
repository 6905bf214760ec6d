// zt/memory/errors.h: the out-of-memory errors the allocators throw, and PyTorch's size
// format that their messages use.
//
// The device error's what() is PyTorch's CUDACachingAllocator message, word for word ("allocated
// by PyTorch": the simulated and caching allocators stand in for PyTorch's): users paste that
// text into bug reports (R4) and search for it, and a reproduction must produce the same
// sentences with its own figures. The figures are also
// kept as fields so that code and tests never parse the text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace zt::memory {

// PyTorch's c10 format_size: "<= 1024" prints "N bytes", up to 1 MiB "x.xx KiB", up to
// 1 GiB "x.xx MiB", else "x.xx GiB" (two decimals, binary units, boundaries inclusive:
// exactly 1 GiB prints "1024.00 MiB"). zt::format_bytes differs ("B", TiB, exclusive
// boundaries), so the OOM text uses this one to match what users paste.
std::string pytorch_format_size(uint64_t bytes);

struct DeviceOomFigures {
  int device_ordinal = 0;           // "GPU N"
  size_t requested_bytes = 0;       // what the caller asked for
  size_t alloc_bytes = 0;           // "Tried to allocate": the segment size tried (PyTorch reports this)
  size_t capacity_bytes = 0;        // "total capacity"
  size_t free_bytes = 0;            // capacity - in_use of the source, after the cache was emptied
  size_t process_bytes = 0;         // "this process has X memory in use": source in_use, allocator included
  size_t allocated_bytes = 0;       // "allocated by PyTorch"
  size_t reserved_bytes = 0;        // reserved - allocated = "reserved ... but unallocated"
  size_t limit_bytes = 0;           // per-process cap from set_per_process_memory_fraction; 0 = none
};

// Thrown by DeviceAllocator::allocate after emptying the cache and retrying once.
class OutOfMemoryError : public std::runtime_error {
 public:
  OutOfMemoryError(const DeviceOomFigures& f, std::string tensor_name);
  const DeviceOomFigures& figures() const { return figures_; }
  const std::string& tensor_name() const { return tensor_name_; }
  static std::string message(const DeviceOomFigures& f);

 private:
  DeviceOomFigures figures_;
  std::string tensor_name_;
};

struct HostOomFigures {
  const char* kind = "pinned";  // "pinned" or "pageable"
  size_t requested_bytes = 0;   // what the caller asked for
  size_t rounded_bytes = 0;     // what would have been taken (pinned: next power of two)
  size_t held_bytes = 0;        // bytes this allocator holds from the OS (in use + cached)
  size_t cached_bytes = 0;      // held but not handed out (pinned cache)
  size_t cap_bytes = 0;         // the allocator's cap; kNoLimit = none
  size_t source_capacity = 0;   // the host memory below it
  size_t source_in_use = 0;
  bool source_full = false;     // true: the host ran out, not the cap
};

// Thrown by the host allocators when their cap (or the host memory below) is exceeded.
class HostOutOfMemoryError : public std::runtime_error {
 public:
  HostOutOfMemoryError(const HostOomFigures& f, std::string buffer_name);
  const HostOomFigures& figures() const { return figures_; }
  const std::string& buffer_name() const { return buffer_name_; }
  static std::string message(const HostOomFigures& f, const std::string& buffer_name);

 private:
  HostOomFigures figures_;
  std::string buffer_name_;
};

}  // namespace zt::memory
