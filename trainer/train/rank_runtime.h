// trainer/train/rank_runtime.h: one rank's devices and their memory.
//
// Owns: for one rank, its accelerator (a simulated GPU `sim:N` shown as `cuda:N`, a real GPU
// through a Backend (core/backend.h), or the host when training on `cpu`) and its host, each with its allocators: the caching device
// allocator over a memory source with the device's capacity, the caching pinned host
// allocator and the pageable host allocator (both under the host cap). Registers both
// devices and the rank in the trace. No global state: a rank is an object.
// Invariant: destroyed after every tensor allocated from it.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>

#include "core/backend.h"
#include "core/device.h"
#include "zt/memory/device_allocator.h"
#include "zt/memory/host_allocator.h"
#include "zt/memory/memory_source.h"

namespace zt::trainer {

// The job killed by a node memory watchdog (TrainConfig::watchdog_kill_at): its error row (kind
// memory_watchdog) is recorded; what() is the tool's own message.
class MemoryWatchdogKill : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A node memory watchdog, as Ray's memory monitor, Kubernetes' memory limit, systemd-oomd or
// Slurm's cgroup: the host memory a node's ranks hold (pinned and pageable, reserved) against
// kill_at x the node's memory; the allocation that reaches it kills the job. The ranks of a node are
// symmetric under ZeRO, so each rank is held to its share (kill_at x node / ranks_in_node): the node's
// total is ranks_in_node times a rank's (in virtual mode one rank stands for them all), and a run is
// killed at the same allocation of the same rank each time, whatever the threads' timing.
class NodeMemoryWatch {
 public:
  NodeMemoryWatch(std::string tool, double kill_at, uint64_t node_bytes, int ranks_in_node, int node);
  // Rank `rank` now holds `held` bytes; when that reaches its share (and `check`), the error row is
  // recorded (its tensor `name`) and MemoryWatchdogKill thrown.
  void update(int rank, int64_t held, bool check, std::string_view name, probe::Recorder* rec, probe::DeviceId device);
  // The tool's message for a node holding `used` of `total` bytes.
  static std::string message(const std::string& tool, double kill_at, uint64_t used, uint64_t total, int node,
                             std::string_view name);

 private:
  std::string tool_;
  double kill_at_;
  uint64_t node_bytes_;
  int ranks_, node_;
};

struct RuntimeOptions {
  DeviceType accelerator = DeviceType::Sim;  // Sim, Cpu, or Cuda (with `backend`)
  Backend* backend = nullptr;                // Cuda: the GPU's memory, ops and model passes
  int rank = 0;
  int world_size = 1;
  size_t device_capacity = 80ull << 30;  // Cuda: a cap below the GPU's own memory (0: the GPU's)
  size_t host_capacity = 0;  // 0: no cap
  bool virtual_memory = false;  // sizes only, no backing memory (replays for memory alone)
  // Where the pinned allocator's pages lie (zt/memory/numa.h; TrainConfig::pinned_numa). Without
  // a GPU, under a host cap, the one host memory pinned and pageable buffers share is placed so
  // as a whole; in virtual mode there are no pages to place.
  memory::PagePlacement pinned_placement = memory::PagePlacement::Local;
  NodeMemoryWatch* watch = nullptr;  // the node's memory watchdog, if any (outlives the runtime)
  // The simulated GPU's memory outside PyTorch's allocator (train/outside_memory.h): taken from its
  // source before the allocator exists, given back when the runtime ends. Ignored on cuda and cpu.
  std::vector<std::pair<std::string, size_t>> outside_allocator;
};

class RankRuntime {
 public:
  RankRuntime(const RuntimeOptions& options, probe::Recorder* recorder);
  ~RankRuntime();

  int rank() const { return options_.rank; }
  Device& accelerator() { return *accel_; }
  Device& host() { return *host_; }
  memory::DeviceAllocator* device_allocator() { return device_alloc_.get(); }
  memory::PinnedHostAllocator& pinned_allocator() { return *pinned_; }
  memory::PageableHostAllocator& pageable_allocator() { return *pageable_; }
  probe::Recorder* recorder() const { return rec_; }
  // GPT-2's passes on the accelerator: the CPU reference, or the backend's kernels. On the
  // simulated GPU with a recorder, each pass is also a kernel row on the device (named after it).
  std::unique_ptr<ModelPasses> model_passes(const model::Config& config, int B, int T, bool checkpointing,
                                            model::Attention attention = model::Attention::Materialized);

 private:
  class DeviceStorage;
  class PinnedStorage;
  class PageableStorage;
  RuntimeOptions options_;
  probe::Recorder* rec_;
  std::unique_ptr<memory::MemorySource> source_;       // the accelerator's memory
  std::vector<std::pair<void*, size_t>> outside_;      // regions of source_ outside the allocator
  std::unique_ptr<memory::MemorySource> host_source_;  // shared by pinned and pageable under a host cap
  std::unique_ptr<memory::MemorySource> pinned_source_;  // a GPU's page-locked memory, or placed pages of the host's
  std::unique_ptr<memory::DeviceAllocator> device_alloc_;
  std::unique_ptr<memory::PinnedHostAllocator> pinned_;
  std::unique_ptr<memory::PageableHostAllocator> pageable_;
  void watch_host(std::string_view name, bool check);  // the node watchdog, after a host allocation or free
  std::unique_ptr<StorageAllocator> device_storage_, pinned_storage_, pageable_storage_;
  std::unique_ptr<DeviceOps> sim_ops_;  // the simulated GPU's (its copy lanes' threads)
  std::unique_ptr<Device> accel_, host_;
};

}  // namespace zt::trainer
