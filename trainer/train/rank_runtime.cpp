#include "train/rank_runtime.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "zt/memory/errors.h"

namespace zt::trainer {

class RankRuntime::DeviceStorage : public StorageAllocator {
 public:
  DeviceStorage(memory::DeviceAllocator& a, bool backed) : a_(a), backed_(backed) {}
  bool backed() const override { return backed_; }
  MemoryBlock allocate(size_t bytes, std::string_view name) override { return allocate_on_stream(bytes, name, -1); }
  MemoryBlock allocate_on_stream(size_t bytes, std::string_view name, int64_t stream) override {
    memory::DeviceBlock b = a_.allocate(bytes, name, stream);
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
  using Watch = std::function<void(std::string_view name, bool check)>;
  HostStorage(Alloc& a, bool backed, Watch watch = nullptr) : a_(a), backed_(backed), watch_(std::move(watch)) {}
  bool backed() const override { return backed_; }
  MemoryBlock allocate(size_t bytes, std::string_view name) override {
    memory::HostBlock b = a_.allocate(bytes, name);
    if (watch_) {
      try {
        watch_(name, true);
      } catch (...) {  // killed: the block goes back first, so the books stay straight
        a_.free(b);
        throw;
      }
    }
    return {b.ptr, b.size, b.requested, -1, b.alloc_id, 0};
  }
  void release(const MemoryBlock& m) override {
    memory::HostBlock b;
    b.ptr = m.ptr;
    b.size = m.bytes;
    b.requested = m.requested;
    b.alloc_id = m.trace_id;
    if (b.size) a_.free(b);
    if (watch_) watch_({}, false);
  }

 private:
  Alloc& a_;
  bool backed_;
  Watch watch_;
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
    // (On a GPU the pinned memory has a source of its own, below: this one is pageable only.)
    if (o.virtual_memory) host_source_ = std::make_unique<memory::VirtualSource>(o.host_capacity);
    else
      host_source_ = std::make_unique<memory::HostBackedSource>(
          o.host_capacity, 4096, o.accelerator == DeviceType::Cuda ? memory::PagePlacement::Local : o.pinned_placement);
    ho.source = host_source_.get();
  }
  if (o.accelerator == DeviceType::Cuda) {
    // Page-locked memory from the GPU's backend (cudaHostAlloc, or mapped and registered when
    // interleaved), under the host cap, when one is given, of its own.
    pinned_source_ = o.backend->pinned_source(o.host_capacity, o.pinned_placement);
  } else if (!o.host_capacity && !o.virtual_memory && o.pinned_placement != memory::PagePlacement::Local) {
    pinned_source_ = std::make_unique<memory::HostBackedSource>(memory::kNoLimit, 4096, o.pinned_placement);
  }
  memory::HostAllocatorOptions po = ho;
  if (pinned_source_) po.source = pinned_source_.get();
  pinned_ = std::make_unique<memory::PinnedHostAllocator>(po);
  pageable_ = std::make_unique<memory::PageableHostAllocator>(ho);
  HostStorage<memory::PinnedHostAllocator>::Watch watch;
  if (o.watch) watch = [this](std::string_view name, bool check) { watch_host(name, check); };
  pinned_storage_ = std::make_unique<PinnedStorage>(*pinned_, !o.virtual_memory, watch);
  pageable_storage_ = std::make_unique<PageableStorage>(*pageable_, !o.virtual_memory, watch);
  host_ = std::make_unique<Device>(DeviceType::Cpu, 0, o.rank, rec, host_id, pageable_storage_.get(),
                                   pinned_storage_.get());
  if (o.accelerator == DeviceType::Sim || o.accelerator == DeviceType::Cuda) {
    if (o.accelerator == DeviceType::Cuda) source_ = o.backend->device_source(o.rank, options_.device_capacity);
    else if (o.virtual_memory) source_ = std::make_unique<memory::VirtualSource>(o.device_capacity);
    else source_ = std::make_unique<memory::HostBackedSource>(o.device_capacity);
    if (o.accelerator == DeviceType::Sim)
      for (const auto& [name, bytes] : o.outside_allocator) {
        if (!bytes) continue;
        void* p = source_->allocate(bytes);
        if (!p) {
          for (const auto& [q, n] : outside_) source_->release(q, n);
          throw std::runtime_error("CUDA error: out of memory making the " + name + " (" +
                                   memory::pytorch_format_size(bytes) + ") on a GPU of " +
                                   memory::pytorch_format_size(o.device_capacity));
        }
        outside_.emplace_back(p, bytes);
        if (rec)
          rec->note("cuda:" + std::to_string(o.rank) + " outside PyTorch's allocator: " + name + " " +
                    memory::pytorch_format_size(bytes) + " (in the OOM message's free and process memory)");
      }
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

RankRuntime::~RankRuntime() {
  for (const auto& [p, bytes] : outside_) source_->release(p, bytes);
}

void RankRuntime::watch_host(std::string_view name, bool check) {
  const int64_t held = pinned_->stats().reserved_bytes + pageable_->stats().reserved_bytes;
  options_.watch->update(options_.rank, held, check, name, rec_, host_ ? host_->trace_id() : 0);
}

NodeMemoryWatch::NodeMemoryWatch(std::string tool, double kill_at, uint64_t node_bytes, int ranks_in_node, int node)
    : tool_(std::move(tool)), kill_at_(kill_at), node_bytes_(node_bytes), ranks_(std::max(1, ranks_in_node)), node_(node) {}

std::string NodeMemoryWatch::message(const std::string& tool, double kill_at, uint64_t used, uint64_t total, int node,
                                     std::string_view name) {
  char share[32], limit[32];
  std::snprintf(share, sizeof share, "%.6f", double(used) / double(total));
  std::snprintf(limit, sizeof limit, "%g", kill_at);
  const std::string u = memory::pytorch_format_size(used), t = memory::pytorch_format_size(total);
  const std::string what = name.empty() ? std::string() : " (at the allocation of " + std::string(name) + ")";
  const std::string launcher = " The launcher then reports each rank as: exits with return code = -9.";
  if (tool == "kubernetes")
    return "OOMKilled: the container of node " + std::to_string(node) + " used " + u + " of its memory limit of " + t +
           " (" + share + " >= " + limit + ")" + what + "; its processes were killed with SIGKILL (exit code 137)." + launcher;
  if (tool == "systemd-oomd")
    return "systemd-oomd: Killed /system.slice/training.service due to memory used (" + u + ") / total (" + t +
           ") being more than " + std::to_string(int(kill_at * 100 + 0.5)) + ".00% on node " + std::to_string(node) + what +
           "." + launcher;
  if (tool == "slurm")
    return "slurmstepd: error: Detected 1 oom_kill event in StepId=0.0 on node " + std::to_string(node) +
           ": Some of the step tasks have been OOM Killed (cgroup memory " + u + " of " + t + ")" + what + "." + launcher;
  // Ray's memory monitor (its words; its sizes in decimal GB).
  char ug[32], tg[32];
  const bool gb = total >= 1000000000ull;  // small (test) nodes in MB, so the figures say something
  std::snprintf(ug, sizeof ug, gb ? "%.2fGB" : "%.2fMB", double(used) / (gb ? 1e9 : 1e6));
  std::snprintf(tg, sizeof tg, gb ? "%.2fGB" : "%.2fMB", double(total) / (gb ? 1e9 : 1e6));
  return "Task was killed due to the node running low on memory. Memory on the node (node " + std::to_string(node) +
         ") where the task was running was " + ug + " / " + tg + " (" + share +
         "), which exceeds the memory usage threshold of " + limit + ". Ray killed this worker" + what +
         " because it was the most recently scheduled task." + launcher;
}

void NodeMemoryWatch::update(int rank, int64_t held, bool check, std::string_view name, probe::Recorder* rec,
                             probe::DeviceId device) {
  if (!check || double(held) * double(ranks_) < kill_at_ * double(node_bytes_)) return;
  const uint64_t used = uint64_t(held) * uint64_t(ranks_);
  const std::string msg = message(tool_.empty() ? "ray" : tool_, kill_at_, used, node_bytes_, node_, name);
  if (rec) {
    db::ErrorRow row;
    row.rank = rank;
    row.kind = "memory_watchdog";
    row.site = tool_.empty() ? "ray" : tool_;
    row.message = msg;
    row.tensors = name.empty() ? "[]" : "[" + nlohmann::json(std::string(name)).dump() + "]";
    row.device_id = device;
    rec->error(row);
  }
  throw MemoryWatchdogKill(msg);
}

namespace {

// The simulated GPU's compute as kernel rows: each pass of the CPU reference that runs as the
// simulated device's work is one row on the device, named after the pass ("block_forward"),
// from its start to its end on the rank thread, as CUPTI records a real GPU's kernels. So
// `zt db kernels`, the viewer's kernel lanes and the Chrome export show when the simulated GPU
// computed and when it sat idle (waiting on a transfer, CPU Adam, a collective). The simulated
// device's other ops (casts, adds, AdamW on the device) are not recorded as kernels.
class RecordedPasses final : public ModelPasses {
 public:
  RecordedPasses(std::unique_ptr<ModelPasses> inner, probe::Recorder* rec, int rank, probe::DeviceId device)
      : inner_(std::move(inner)), rec_(rec), rank_(rank), device_(device) {
    for (int i = 0; i < kPasses; ++i) names_[i] = rec_->intern(kNames[i]);
  }
  size_t bytes() const override { return inner_->bytes(); }
  void bind(void* memory) override { inner_->bind(memory); }
  bool owns_memory() const override { return inner_->owns_memory(); }
  float* residual(int i) override { return inner_->residual(i); }
  float* grad_residual() override { return inner_->grad_residual(); }
  void embed_forward(const float* emb_params, const int32_t* tokens, float* x_out) override {
    Kernel k(*this, kEmbedForward);
    inner_->embed_forward(emb_params, tokens, x_out);
  }
  void block_forward(int layer, const float* block_params, const float* x_in, float* x_out) override {
    Kernel k(*this, kBlockForward);
    inner_->block_forward(layer, block_params, x_in, x_out);
  }
  float head_forward_backward(const float* final_params, const float* wte, const float* x, const int32_t* targets,
                              float* dx, float* d_final_params, float* d_wte, float grad_scale) override {
    Kernel k(*this, kHead);
    return inner_->head_forward_backward(final_params, wte, x, targets, dx, d_final_params, d_wte, grad_scale);
  }
  void block_backward(int layer, const float* block_params, const float* x_in, const float* dx_out, float* dx_in,
                      float* d_block_params) override {
    Kernel k(*this, kBlockBackward);
    inner_->block_backward(layer, block_params, x_in, dx_out, dx_in, d_block_params);
  }
  void embed_backward(const int32_t* tokens, const float* dx, float* d_emb_params) override {
    Kernel k(*this, kEmbedBackward);
    inner_->embed_backward(tokens, dx, d_emb_params);
  }
  float head_forward(const float* final_params, const float* wte, const float* x, const int32_t* targets,
                     float* logits) override {
    Kernel k(*this, kHeadForward);
    return inner_->head_forward(final_params, wte, x, targets, logits);
  }

 private:
  enum Pass { kEmbedForward, kBlockForward, kHead, kBlockBackward, kEmbedBackward, kHeadForward, kPasses };
  static constexpr const char* kNames[kPasses] = {"embed_forward", "block_forward", "head_forward_backward",
                                                  "block_backward", "embed_backward", "head_forward"};
  // One row from construction to destruction (also when the pass throws: the device did work).
  // Interned up front, so the destructor allocates nothing (it may run while an exception unwinds).
  struct Kernel {
    Kernel(RecordedPasses& p, Pass pass) : p_(p), pass_(pass), t0_(probe::now_ns()) {}
    ~Kernel() {
      probe::KernelEvent e;
      e.rank = p_.rank_;
      e.device = p_.device_;
      e.name = p_.names_[pass_];
      e.t_start = t0_;
      e.t_end = probe::now_ns();
      e.source = probe::Source::Api;
      p_.rec_->kernel(e);
    }
    RecordedPasses& p_;
    Pass pass_;
    int64_t t0_;
  };
  probe::NameId names_[kPasses] = {};
  std::unique_ptr<ModelPasses> inner_;
  probe::Recorder* rec_;
  int rank_;
  probe::DeviceId device_;
};

}  // namespace

std::unique_ptr<ModelPasses> RankRuntime::model_passes(const model::Config& config, int B, int T, bool checkpointing,
                                                      model::Attention attention) {
  if (options_.accelerator == DeviceType::Cuda)
    return options_.backend->model_passes(options_.rank, config, B, T, checkpointing, attention);
  std::unique_ptr<ModelPasses> passes = cpu_model_passes(config, B, T, checkpointing, attention);
  if (options_.accelerator == DeviceType::Sim && rec_)
    return std::make_unique<RecordedPasses>(std::move(passes), rec_, options_.rank, accel_->trace_id());
  return passes;
}

}  // namespace zt::trainer
