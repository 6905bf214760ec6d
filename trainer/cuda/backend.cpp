// trainer/cuda/backend.cpp: the CUDA Backend of core/backend.h (compiled into zt_trainer when
// the build has CUDA; core/backend_nocuda.cpp otherwise).
//
// Each rank gets a slot on the process's GPU: its four streams (everything runs on the compute
// stream for now, so the engine's order is the stream's order), a cuBLAS handle, scratch for the
// squared norm, and its DeviceOps. Copies are cudaMemcpyAsync with cudaMemcpyDefault (unified
// addressing tells host from device) followed by a stream synchronize: the ops are synchronous
// for the caller, as core/backend.h requires; kernels are queued and ordered by the stream, and
// the communicator synchronizes before other ranks read a buffer.
#include <cuda_runtime.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/backend.h"
#include "cuda/adamw.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "cuda/memory_sources.h"
#include "cuda/model_passes.h"
#include "cuda/runtime.h"
#include "cuda/streams.h"
#include "model/config.h"
#include "zero/communicator.h"
#if ZT_HAVE_NCCL
#include "cuda/nccl_communicator.h"
#endif

namespace zt::trainer {

namespace {

class CudaOps final : public DeviceOps {
 public:
  explicit CudaOps(int device)
      : device_(set(device)), streams_(device), norm_(sizeof(double) * (cuda::kSquaredNormBlocks + 1)) {}
  cudaStream_t stream() const { return streams_.compute(); }
  int device() const { return device_; }

  bool host_addressable() const override { return false; }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    set(device_);
    cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream()), "cudaMemcpyAsync");
    cuda::check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
  }
  // Queued when both sides are device memory; a side on the host (a collective of host buffers,
  // such as a checkpoint's digests) makes it copy(): the host reads the result next.
  void copy_ordered(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    set(device_);
    if (!cuda::is_device_memory(dst) || !cuda::is_device_memory(src)) {
      copy(dst, src, bytes);
      return;
    }
    cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()), "cudaMemcpyAsync");
  }
  void zero(void* p, size_t bytes) override {
    if (!bytes) return;
    set(device_);
    cuda::check(cudaMemsetAsync(p, 0, bytes, stream()), "cudaMemsetAsync");
  }
  void convert(void* dst, DType dst_t, const void* src, DType src_t, int64_t n) override {
    set(device_);
    if (dst_t == src_t) {
      cuda::check(cudaMemcpyAsync(dst, src, size_t(n) * dtype_size(dst_t), cudaMemcpyDeviceToDevice, stream()),
                  "cudaMemcpyAsync");
      return;
    }
    cuda::cast(dst, dst_t, src, src_t, n, stream());
  }
  void add(void* dst, DType dst_t, const float* src, int64_t n) override {
    set(device_);
    cuda::add_inplace(dst, dst_t, src, n, stream());
  }
  void scale(float* x, int64_t n, float a) override {
    set(device_);
    cuda::scale_inplace(x, DType::F32, n, a, stream());
  }
  double sum_squares(const float* x, int64_t n) override {
    set(device_);
    double* out = norm_.as<double>();
    cuda::squared_norm(out, out + 1, x, DType::F32, n, stream());
    double s = 0;
    copy(&s, out, sizeof s);
    return s;
  }
  void adamw(float* params, const float* grads, float* m, float* v, int64_t n, const optim::AdamParams& hp,
             int64_t step, void* low_out, optim::LowDType low) override {
    set(device_);
    cuda::adamw_step(params, grads, m, v, n, hp, step, low_out, low, stream());
  }
  void synchronize() override {
    set(device_);
    cuda::check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
  }

  // The copy waits on the compute stream's work so far (an event), runs on the lane's stream,
  // stamps its start and end with host functions (`done`), then records the fence's event.
  Fence copy_async(void* dst, const void* src, size_t bytes, Lane lane, const CopyDone& done) override {
    set(device_);
    cudaStream_t s = lane == Lane::H2D ? streams_.h2d() : streams_.d2h();
    cudaEvent_t after = take_event();
    cuda::check(cudaEventRecord(after, stream()), "cudaEventRecord");
    cuda::check(cudaStreamWaitEvent(s, after, 0), "cudaStreamWaitEvent");
    give_event(after);  // reusable once recorded and waited on: the wait took its state
    Stamp* stamp = done ? new Stamp{done, 0} : nullptr;
    if (stamp) {
      const cudaError_t e = cudaLaunchHostFunc(s, &Stamp::start, stamp);
      if (e != cudaSuccess) delete stamp;  // nothing queued refers to it (once queued, it is left)
      cuda::check(e, "cudaLaunchHostFunc");
    }
    cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
    if (stamp) cuda::check(cudaLaunchHostFunc(s, &Stamp::end, stamp), "cudaLaunchHostFunc");
    cudaEvent_t fence = take_event();
    cuda::check(cudaEventRecord(fence, s), "cudaEventRecord");
    std::lock_guard lock(mu_);
    const Fence f = ++next_fence_;
    pending_[f] = {fence, lane};
    return f;
  }
  void wait(Fence f) override {
    if (f == 0) return;
    Pending p;
    {
      std::lock_guard lock(mu_);
      auto it = pending_.find(f);
      if (it == pending_.end()) return;
      p = it->second;
      pending_.erase(it);
    }
    set(device_);
    if (p.lane == Lane::H2D)
      cuda::check(cudaStreamWaitEvent(stream(), p.event, 0), "cudaStreamWaitEvent");  // the device waits
    else
      cuda::check(cudaEventSynchronize(p.event), "cudaEventSynchronize");  // the host reads next
    give_event(p.event);
  }

 private:
  // The calling thread's current device (rank threads come and go; the call is cheap).
  static int set(int device) {
    cuda::check(cudaSetDevice(device), "cudaSetDevice");
    return device;
  }
  // Host functions on a copy lane: the copy's start and end on the host clock. They may not call
  // CUDA; `end` runs before the fence's event completes, so wait() returns after it.
  struct Stamp {
    CopyDone done;
    int64_t t0;
    static void CUDART_CB start(void* p) { static_cast<Stamp*>(p)->t0 = probe::now_ns(); }
    static void CUDART_CB end(void* p) {
      auto* st = static_cast<Stamp*>(p);
      st->done(st->t0, probe::now_ns());
      delete st;
    }
  };
  struct Pending {
    cudaEvent_t event = nullptr;
    Lane lane = Lane::H2D;
  };
  cudaEvent_t take_event() {
    std::lock_guard lock(mu_);
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    cuda::check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void give_event(cudaEvent_t e) {
    std::lock_guard lock(mu_);
    free_events_.push_back(e);
  }

  int device_;
  cuda::StreamSet streams_;
  cuda::DeviceBuffer norm_;  // the squared norm's result and per-block partial sums
  std::mutex mu_;
  Fence next_fence_ = 0;
  std::map<Fence, Pending> pending_;
  std::vector<cudaEvent_t> free_events_;

 public:
  ~CudaOps() override {
    (void)cudaSetDevice(device_);
    (void)cudaDeviceSynchronize();
    for (auto& [f, p] : pending_) (void)cudaEventDestroy(p.event);
    for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
  }
};

struct Slot {
  Slot(int device, MatmulPrecision matmul) : ops(device), blas(device) { blas.set_matmul_precision(matmul); }
  CudaOps ops;
  cuda::Blas blas;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, CudaBackendOptions options)
      : device_(device), options_(options), capacity_(cuda::CudaDeviceSource(device, 0).capacity()) {}

  std::string describe(int) const override { return cuda::describe_device(device_); }
  size_t device_capacity(int) const override { return capacity_; }
  std::unique_ptr<memory::MemorySource> device_source(int, size_t cap) override {
    return std::make_unique<cuda::CudaDeviceSource>(device_, cap >= capacity_ ? 0 : cap);
  }
  std::unique_ptr<memory::MemorySource> pinned_source(size_t cap, memory::PagePlacement placement) override {
    return std::make_unique<cuda::CudaPinnedSource>(cap ? cap : memory::kNoLimit, placement);
  }
  DeviceOps& ops(int rank) override { return slot(rank).ops; }
  std::unique_ptr<ModelPasses> model_passes(int rank, const model::Config& config, int B, int T, bool checkpointing,
                                            model::Attention attention) override {
    Slot& s = slot(rank);
    auto passes = std::make_unique<cuda::CudaModelPasses>(
        config, B, T, checkpointing, s.ops.stream(), s.blas, 0, attention,
        options_.bf16_compute ? cuda::Compute::Bf16 : cuda::Compute::Fp32);
    // Queued only: the ops, copies and collectives that read their results run later on the same
    // stream or synchronize it first (the communicator does), so no pass needs to wait.
    passes->set_synchronous(false);
    // ZT_CUBLASLT_EPILOGUES=0: bf16 compute's bias and GELU the unfused way (an A/B knob for GPU hosts).
    if (const char* e = std::getenv("ZT_CUBLASLT_EPILOGUES"); e && std::string(e) == "0")
      passes->set_fused_epilogues(false);
    return passes;
  }
  std::unique_ptr<Communicator> process_communicator(int rank, probe::Recorder* rec, probe::DeviceId trace_device,
                                                     int64_t timeout_ms, std::string* why) override {
#if ZT_HAVE_NCCL
    cuda::NcclOptions o;
    o.device = device_;
    o.timeout_ms = timeout_ms;
    o.recorder = rec;
    o.trace_device = trace_device;
    o.stream = slot(rank).ops.stream();  // after the rank's kernels, in stream order
    (void)why;
    return cuda::NcclCommunicator::from_environment(o);
#else
    (void)rank, (void)rec, (void)trace_device, (void)timeout_ms;
    if (why) *why = "this build has no NCCL (nccl.h and libnccl were not found at configure time)";
    return nullptr;
#endif
  }

 private:
  Slot& slot(int rank) {
    std::lock_guard lock(mu_);
    auto& s = slots_[rank];
    if (!s) s = std::make_unique<Slot>(device_, options_.matmul);
    return *s;
  }
  int device_;
  CudaBackendOptions options_;
  size_t capacity_;
  std::mutex mu_;
  std::map<int, std::unique_ptr<Slot>> slots_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device, std::string* why, CudaBackendOptions options) {
  std::string reason;
  if (!cuda::cuda_available(&reason)) {
    if (why) *why = reason;
    return nullptr;
  }
  if (cuda::device_count() == 1) device = 0;
  if (device < 0 || device >= cuda::device_count()) {
    if (why)
      *why = "GPU " + std::to_string(device) + " does not exist: this machine has " +
             std::to_string(cuda::device_count()) + " usable GPU(s)";
    return nullptr;
  }
  if (options.sync != CudaSync::Auto) {
    // Before the device's first use here (the backend's capacity query creates its context).
    const unsigned schedule = options.sync == CudaSync::Spin    ? cudaDeviceScheduleSpin
                              : options.sync == CudaSync::Yield ? cudaDeviceScheduleYield
                                                                : cudaDeviceScheduleBlockingSync;
    try {
      cuda::set_device_schedule(device, schedule);
    } catch (const cuda::CudaError& e) {
      if (why) *why = std::string("ZT_CUDA_SYNC: ") + e.what();
      return nullptr;
    }
  }
  return std::make_unique<CudaBackend>(device, options);
}

}  // namespace zt::trainer
