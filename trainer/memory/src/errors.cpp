#include "zt/memory/errors.h"

#include <cstdio>

#include "zt/common/units.h"
#include "zt/memory/memory_source.h"

namespace zt::memory {

std::string pytorch_format_size(uint64_t size) {
  char buf[64];
  if (size <= 1024)
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(size));
  else if (size <= 1048576)
    std::snprintf(buf, sizeof buf, "%.2f KiB", double(size) / 1024.0);
  else if (size <= 1073741824ULL)
    std::snprintf(buf, sizeof buf, "%.2f MiB", double(size) / 1048576.0);
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(size) / 1073741824.0);
  return buf;
}

// PyTorch's sentences in PyTorch's order (c10/cuda/CUDACachingAllocator.cpp), word for word
// (a user searching for "allocated by PyTorch" finds the reproduction). PyTorch ends with a link to its documentation; ours has no such
// page, so the text stops after the advice. "allowed" appears only under a fraction limit.
std::string OutOfMemoryError::message(const DeviceOomFigures& f) {
  std::string m = "CUDA out of memory. Tried to allocate " + pytorch_format_size(f.alloc_bytes) + ". GPU " +
                  std::to_string(f.device_ordinal) + " has a total capacity of " +
                  pytorch_format_size(f.capacity_bytes) + " of which " + pytorch_format_size(f.free_bytes) +
                  " is free. ";
  m += "Including non-PyTorch memory, this process has " + pytorch_format_size(f.process_bytes) +
       " memory in use. ";
  if (f.limit_bytes != 0) m += pytorch_format_size(f.limit_bytes) + " allowed; ";
  m += "Of the allocated memory " + pytorch_format_size(f.allocated_bytes) +
       " is allocated by PyTorch, and " + pytorch_format_size(f.reserved_bytes - f.allocated_bytes) +
       " is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
       "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.";
  return m;
}

OutOfMemoryError::OutOfMemoryError(const DeviceOomFigures& f, std::string tensor_name)
    : std::runtime_error(message(f)), figures_(f), tensor_name_(std::move(tensor_name)) {}

std::string HostOutOfMemoryError::message(const HostOomFigures& f, const std::string& name) {
  auto gib = [](size_t b) { return format_bytes(double(b)); };
  std::string who = name.empty() ? std::string() : " for '" + name + "'";
  std::string m = std::string("Host out of memory (") + f.kind + "): tried to " +
                  (std::string(f.kind) == "pinned" ? "pin " : "allocate ") + gib(f.rounded_bytes) + who;
  if (f.rounded_bytes != f.requested_bytes)
    m += " (requested " + gib(f.requested_bytes) + ", rounded up to the next power of two)";
  m += ". ";
  m += std::string("The ") + f.kind + " allocator holds " + gib(f.held_bytes) + " (" +
       gib(f.held_bytes - f.cached_bytes) + " in use, " + gib(f.cached_bytes) +
       " cached and not returned to the OS)";
  if (f.cap_bytes != kNoLimit) m += " against a cap of " + gib(f.cap_bytes);
  m += ".";
  if (f.source_full)
    m += " The host memory below it is full: " + gib(f.source_in_use) + " of " + gib(f.source_capacity) +
         " in use.";
  if (f.cached_bytes > 0)
    m += " Call empty_cache() at a safe point (e.g. the epoch boundary) to return the cached memory, or "
         "raise the cap.";
  else
    m += " Free buffers that are no longer needed, or raise the cap.";
  return m;
}

HostOutOfMemoryError::HostOutOfMemoryError(const HostOomFigures& f, std::string buffer_name)
    : std::runtime_error(message(f, buffer_name)), figures_(f), buffer_name_(std::move(buffer_name)) {}

}  // namespace zt::memory
