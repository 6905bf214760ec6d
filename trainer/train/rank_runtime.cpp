#include "train/rank_runtime.h"

#include <stdexcept>

namespace zt::trainer {

class RankRuntime::DeviceStorage : public StorageAllocator {
 public:
  DeviceStorage(memory::DeviceAllocator& a, bool backed) : a_(a), backed_(backed) {}
  bool backed() const override { return backed_; }
  MemoryBlock allocate(size_t bytes, std::string_view name) override {
    memory::DeviceBlock b = a_.allocate(bytes, name);
    return {b.ptr, b.size, b.requested, b.stream, b.alloc_id, b.id};
  }
  void release(const MemoryBlock& m) override {
    memory::DeviceBlock b;
    b.ptr = m.ptr;
    b.size = m.bytes;
    b.requested = m.requested;
    b.stream = m.stream;
    b.id = m.handle;
    b.alloc_id = m.trace_id;
    if (b.size) a_.free(b);
  }

 private:
  memory::DeviceAllocator& a_;
  bool backed_;
};

template <typename Alloc>
class HostStorage : public StorageAllocator {
 public:
  HostStorage(Alloc& a, bool backed) : a_(a), backed_(backed) {}
  bool backed() const override { return backed_; }
  MemoryBlock allocate(size_t bytes, std::string_view name) override {
    memory::HostBlock b = a_.allocate(bytes, name);
    return {b.ptr, b.size, b.requested, -1, b.alloc_id, 0};
  }
  void release(const MemoryBlock& m) override {
    memory::HostBlock b;
    b.ptr = m.ptr;
    b.size = m.bytes;
    b.requested = m.requested;
    b.alloc_id = m.trace_id;
    if (b.size) a_.free(b);
  }

 private:
  Alloc& a_;
  bool backed_;
};

class RankRuntime::PinnedStorage : public HostStorage<memory::PinnedHostAllocator> {
  using HostStorage::HostStorage;
};
class RankRuntime::PageableStorage : public HostStorage<memory::PageableHostAllocator> {
  using HostStorage::HostStorage;
};

RankRuntime::RankRuntime(const RuntimeOptions& o, probe::Recorder* rec) : options_(o), rec_(rec) {
  if (o.accelerator == DeviceType::Cuda && !o.backend)
    throw std::invalid_argument("RankRuntime: a cuda accelerator needs its backend");
  if (o.accelerator == DeviceType::Cuda && o.virtual_memory)
    throw std::invalid_argument("virtual mode runs on the simulated GPU (--device sim), not on cuda");
  // A real GPU: its own memory unless capped below it.
  if (o.accelerator == DeviceType::Cuda) {
    const size_t have = o.backend->device_capacity(o.rank);
    if (options_.device_capacity == 0 || options_.device_capacity > have) options_.device_capacity = have;
  }
  probe::DeviceId host_id = 0, accel_id = 0;
  if (rec) {
    rec->add_rank(o.rank, o.world_size, o.rank);
    host_id = rec->add_device(o.rank, probe::DeviceKind::Cpu, 0, "cpu", "host memory",
                              o.host_capacity ? std::optional<int64_t>(int64_t(o.host_capacity)) : std::nullopt, false);
    if (o.accelerator == DeviceType::Sim)
      accel_id = rec->add_device(o.rank, probe::DeviceKind::Sim, o.rank, "cuda:" + std::to_string(o.rank),
                                 o.virtual_memory ? "simulated GPU (virtual: sizes only)" : "simulated GPU",
                                 int64_t(o.device_capacity), true);
    else if (o.accelerator == DeviceType::Cuda)
      accel_id = rec->add_device(o.rank, probe::DeviceKind::Cuda, o.rank, "cuda:" + std::to_string(o.rank),
                                 o.backend->describe(o.rank), int64_t(options_.device_capacity), false);
  }
  memory::HostAllocatorOptions ho;
  ho.recorder = rec;
  ho.rank = o.rank;
  ho.device = host_id;
  ho.backing = o.virtual_memory ? memory::HostBacking::Virtual : memory::HostBacking::Real;
  if (o.host_capacity) {
    // One host memory for both allocators: pinned and pageable bytes count against one cap,
    // as they do on a real machine.
    ho.cap = o.host_capacity;
    if (o.virtual_memory) host_source_ = std::make_unique<memory::VirtualSource>(o.host_capacity);
    else host_source_ = std::make_unique<memory::HostBackedSource>(o.host_capacity);
    ho.source = host_source_.get();
  }
  if (o.accelerator == DeviceType::Cuda) {
    // Pinned memory from cudaHostAlloc (under the host cap, when one is given, of its own).
    pinned_source_ = o.backend->pinned_source(o.host_capacity);
    memory::HostAllocatorOptions po = ho;
    po.source = pinned_source_.get();
    pinned_ = std::make_unique<memory::PinnedHostAllocator>(po);
  }
  if (!pinned_) pinned_ = std::make_unique<memory::PinnedHostAllocator>(ho);
  pageable_ = std::make_unique<memory::PageableHostAllocator>(ho);
  pinned_storage_ = std::make_unique<PinnedStorage>(*pinned_, !o.virtual_memory);
  pageable_storage_ = std::make_unique<PageableStorage>(*pageable_, !o.virtual_memory);
  host_ = std::make_unique<Device>(DeviceType::Cpu, 0, o.rank, rec, host_id, pageable_storage_.get(),
                                   pinned_storage_.get());
  if (o.accelerator == DeviceType::Sim || o.accelerator == DeviceType::Cuda) {
    if (o.accelerator == DeviceType::Cuda) source_ = o.backend->device_source(o.rank, options_.device_capacity);
    else if (o.virtual_memory) source_ = std::make_unique<memory::VirtualSource>(o.device_capacity);
    else source_ = std::make_unique<memory::HostBackedSource>(o.device_capacity);
    memory::DeviceAllocatorOptions dopt;
    dopt.recorder = rec;
    dopt.rank = o.rank;
    dopt.device = accel_id;
    dopt.device_ordinal = o.rank;
    device_alloc_ = std::make_unique<memory::DeviceAllocator>(source_.get(), dopt);
    device_storage_ = std::make_unique<DeviceStorage>(*device_alloc_, !o.virtual_memory);
    DeviceOps* ops = nullptr;
    if (o.accelerator == DeviceType::Cuda) {
      ops = &o.backend->ops(o.rank);
    } else if (!o.virtual_memory) {
      sim_ops_ = make_sim_ops();
      ops = sim_ops_.get();
    }
    accel_ = std::make_unique<Device>(o.accelerator, o.rank, o.rank, rec, accel_id, device_storage_.get(), nullptr, ops);
  } else {
    // Training on the CPU: the "accelerator" is the host itself.
    accel_ = std::make_unique<Device>(DeviceType::Cpu, 0, o.rank, rec, host_id, pageable_storage_.get(),
                                      pinned_storage_.get());
  }
}

RankRuntime::~RankRuntime() = default;

std::unique_ptr<ModelPasses> RankRuntime::model_passes(const model::Config& config, int B, int T, bool checkpointing,
                                                      model::Attention attention) {
  if (options_.accelerator == DeviceType::Cuda)
    return options_.backend->model_passes(options_.rank, config, B, T, checkpointing, attention);
  return cpu_model_passes(config, B, T, checkpointing, attention);
}

}  // namespace zt::trainer
