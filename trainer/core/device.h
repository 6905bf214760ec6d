// trainer/core/device.h: where tensors live.
//
// Owns: the device model that both the simulated GPU and CUDA plug into. A Device is one
// rank's view of one memory space: `cuda:N` (a real GPU: its kernels and copies through its DeviceOps), `sim:N` (a simulated GPU:
// memory from the host up to a capacity, kernels on the CPU, copies counted as
// H2D/D2H/D2D) or `cpu`. A simulated GPU calls itself `cuda:N` in every message users see,
// because that is what the bug reports say; the trace's device table records that it is
// simulated.
// Invariant: a Device outlives every tensor on it; its allocators belong to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "zt/probe/recorder.h"

namespace zt::trainer {

enum class DeviceType : uint8_t { Cpu, Cuda, Sim };

struct DeviceRef {
  DeviceType type = DeviceType::Cpu;
  int index = 0;
};
// "cpu", "sim", "sim:1", "cuda", "cuda:0".
std::optional<DeviceRef> parse_device(std::string_view text);

// One block of memory handed out by an allocator; `trace_id` is its allocation row.
struct MemoryBlock {
  void* ptr = nullptr;
  size_t bytes = 0;      // bytes held (rounded)
  size_t requested = 0;  // bytes asked for
  int64_t stream = -1;
  probe::AllocId trace_id = 0;
  uint64_t handle = 0;  // the allocator's own token
};

// What a tensor's storage is allocated from. Implementations record every allocation and
// free through the probe, with the tensor's name.
class StorageAllocator {
 public:
  virtual ~StorageAllocator() = default;
  // Throws the allocator's out-of-memory error when it cannot.
  virtual MemoryBlock allocate(size_t bytes, std::string_view name) = 0;
  // The same on a stream of the device (a caching allocator keeps each stream's blocks apart, as
  // PyTorch's does); allocators without streams ignore it.
  virtual MemoryBlock allocate_on_stream(size_t bytes, std::string_view name, int64_t stream) {
    (void)stream;
    return allocate(bytes, name);
  }
  virtual void release(const MemoryBlock& block) = 0;
  // False in virtual mode: blocks have sizes and addresses but no memory behind them, so a
  // tensor's raw() is null and every byte copy and kernel is skipped.
  virtual bool backed() const { return true; }
};

class DeviceOps;  // core/backend.h

class Device {
 public:
  // `ops` null: the host's (CPU loops over host-addressable memory: the host, a simulated GPU).
  Device(DeviceType type, int index, int rank, probe::Recorder* rec, probe::DeviceId trace_id,
         StorageAllocator* memory, StorageAllocator* pinned = nullptr, DeviceOps* ops = nullptr);

  DeviceType type() const { return type_; }
  int index() const { return index_; }
  int rank() const { return rank_; }
  bool is_host() const { return type_ == DeviceType::Cpu; }
  // What users see: "cuda:1" for a real or simulated GPU, "cpu" for the host.
  const std::string& label() const { return label_; }
  probe::Recorder* recorder() const { return rec_; }
  probe::DeviceId trace_id() const { return trace_id_; }
  StorageAllocator& memory() const { return *memory_; }
  // Pinned host memory (host devices only); null when this host has no pinned allocator.
  StorageAllocator* pinned() const { return pinned_; }
  // Copies and arithmetic on this device's memory (core/backend.h).
  DeviceOps& ops() const { return *ops_; }

 private:
  DeviceType type_;
  int index_;
  int rank_;
  std::string label_;
  probe::Recorder* rec_;
  probe::DeviceId trace_id_;
  StorageAllocator* memory_;
  StorageAllocator* pinned_;
  DeviceOps* ops_;
};

}  // namespace zt::trainer
