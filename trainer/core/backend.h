// trainer/core/backend.h: what a kind of accelerator provides to the trainer.
//
// Owns three interfaces and the host's implementation of the first two:
//   DeviceOps     copies and the engine's arithmetic on one device's memory (zeroing, dtype
//                 conversion, accumulation, scaling, the squared norm, AdamW). The host and the
//                 simulated GPU use HostOps (plain CPU loops over host-addressable memory); a
//                 CUDA device uses kernels on its rank's stream (trainer/cuda/backend.cpp).
//   ModelPasses   GPT-2's per-module passes (model/gpt2.h) with their activation memory: the
//                 CPU reference on the host and the simulated GPU; CUDA kernels on a GPU.
//   Backend       for one kind of accelerator: the device's name and memory source, the pinned
//                 host memory source, and per rank the DeviceOps and ModelPasses above.
// The engine (zero/engine.cpp), the copy engine (core/tensor.cpp) and the in-process transport
// (zero/communicator.cpp) go through these instead of touching accelerator memory themselves,
// so one engine runs on both the simulated GPU and a real one.
//
// Conventions: every pointer handed to a DeviceOps belongs to that device (or, for copy(), to
// it or the host); the ops are synchronous for the caller: when one returns, its result is
// visible to any later op, copy or collective on any rank (a CUDA implementation synchronizes
// its stream before returning where the host could observe the memory).
// May call: optim/ (the CPU AdamW), core/dtype.h. Called by: core/tensor.cpp, zero/, train/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "core/dtype.h"
#include "model/gpt2.h"
#include "optim/cpu_adam.h"
#include "zt/probe/recorder.h"

namespace zt::memory {
class MemorySource;
enum class PagePlacement : uint8_t;
}
namespace zt::model {
struct Config;
}

namespace zt::trainer {

class Communicator;  // zero/communicator.h

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  // False when the CPU cannot dereference this device's pointers (a real GPU).
  virtual bool host_addressable() const = 0;
  // dst := src, `bytes` bytes; either side may be this device or the host.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // dst := src, ordered with the rest of this rank's device work (later ops, copies and passes of
  // this rank see it) but, when both are this device's memory, not waited for by the caller: the
  // one exception to the rule above, for a collective of one rank (zero/communicator.cpp). With
  // either on the host it is copy(), synchronous. Default: copy().
  virtual void copy_ordered(void* dst, const void* src, size_t bytes) { copy(dst, src, bytes); }
  virtual void zero(void* p, size_t bytes) = 0;
  // dst[i] = src[i] converted (fp32/bf16/fp16, round to nearest even); same dtype: a copy.
  virtual void convert(void* dst, DType dst_t, const void* src, DType src_t, int64_t n) = 0;
  // dst[i] += src[i], in fp32, rounded back to dst_t.
  virtual void add(void* dst, DType dst_t, const float* src, int64_t n) = 0;
  // x[i] *= a.
  virtual void scale(float* x, int64_t n, float a) = 0;
  // Sum of x[i]^2 in fp64, in a fixed order that depends on n alone (on the host: 8 lanes per
  // chunk of 64Ki, core/backend.cpp; on a GPU its kernel's).
  virtual double sum_squares(const float* x, int64_t n) = 0;
  // One AdamW step, exactly optim::cpu_adamw_step's contract (and on the host, that function).
  virtual void adamw(float* params, const float* grads, float* m, float* v, int64_t n, const optim::AdamParams& hp,
                     int64_t step, void* low_out, optim::LowDType low) = 0;
  // Waits for everything this rank queued on the device.
  virtual void synchronize() {}

  // ---- asynchronous copies: transfers that overlap compute ----
  // Two copy lanes per device, each in order: host-to-device and device-to-host.
  enum class Lane : uint8_t { H2D, D2H };
  using Fence = uint64_t;  // 0: finished already
  using CopyDone = std::function<void(int64_t t_start_ns, int64_t t_end_ns)>;
  // dst := src on `lane`, started after the work this rank has queued on the device so far (so
  // src is final and dst is free) and running while later work proceeds. `done`, when set, gets
  // the copy's start and end (probe::now_ns clock), possibly on another thread, before wait(f)
  // returns. Neither buffer may be touched, or freed, until wait(f). Default: a synchronous copy.
  virtual Fence copy_async(void* dst, const void* src, size_t bytes, Lane lane, const CopyDone& done);
  // The copy behind `f` is finished for its consumer: for an H2D copy, before any work queued on
  // the device from now on; for a D2H copy, before this call returns (the host reads next).
  virtual void wait(Fence f) { (void)f; }
};

// CPU loops over host memory (the host, the simulated GPU). Stateless: one instance serves all;
// its copy_async is synchronous.
DeviceOps& host_ops();
// On the host: dst[i] = src[i] widened to fp32 (src_t bf16 or fp16; fp32 is copied), and the sum
// of the dst[i]^2, equal bit for bit to host_ops().sum_squares(dst, n) (the same chunks summed in
// the same order). One pass over memory where convert() then sum_squares() make two: a gradient
// partition landing from the device (zero/engine.cpp). With dst null nothing is written and the
// sum is the same (a partition kept in its compute dtype: TrainConfig::grad_partition_dtype).
double widen_and_sum_squares(float* dst, const void* src, DType src_t, int64_t n);
// A simulated GPU's ops: the host's, with copy_async on two threads of its own (one per lane), so
// the simulated GPU's transfers really overlap its compute as a GPU's copy engines do. One per device.
std::unique_ptr<DeviceOps> make_sim_ops();

// GPT-2's per-module passes over one micro-batch shape (B sequences of T tokens), with the
// conventions of model/gpt2.h: parameter pointers are one module's fp32 parameters, gradient
// pointers are accumulated into, activation gradients are overwritten. Every pointer is on the
// device these passes run on. One pass at a time.
class ModelPasses {
 public:
  virtual ~ModelPasses() = default;
  // Device bytes the passes need for activations and scratch (the engine allocates them as one
  // tensor, "activations", so the device allocator counts them).
  virtual size_t bytes() const = 0;
  // Hands the passes that allocation (bytes() of them, on the device) before the first pass.
  // Implementations that own their memory (the CPU reference) ignore it.
  virtual void bind(void* memory) = 0;
  // True when the passes keep their activations in memory of their own and ignore bind() (the CPU
  // reference's workspace, on the host): the engine then charges the device with what PyTorch's
  // autograd would keep instead (zero/ds_memory.h), tensor by tensor, as in virtual mode.
  virtual bool owns_memory() const { return false; }
  virtual float* residual(int i) = 0;  // [B, T, C]; 0: embedding output, l + 1: block l's output
  virtual float* grad_residual() = 0;  // [B, T, C]
  virtual void embed_forward(const float* emb_params, const int32_t* tokens, float* x_out) = 0;
  virtual void block_forward(int layer, const float* block_params, const float* x_in, float* x_out) = 0;
  // Returns the unscaled mean loss (the device result, read back).
  virtual float head_forward_backward(const float* final_params, const float* wte, const float* x,
                                      const int32_t* targets, float* dx, float* d_final_params, float* d_wte,
                                      float grad_scale) = 0;
  virtual void block_backward(int layer, const float* block_params, const float* x_in, const float* dx_out,
                              float* dx_in, float* d_block_params) = 0;
  virtual void embed_backward(const int32_t* tokens, const float* dx, float* d_emb_params) = 0;
  // Forward only (an evaluation): the mean loss, and the [B, T, vocab] fp32 logits into `logits`
  // when not null (device memory). Passes that have none throw std::invalid_argument.
  virtual float head_forward(const float* /*final_params*/, const float* /*wte*/, const float* /*x*/,
                             const int32_t* /*targets*/, float* /*logits*/) {
    throw std::invalid_argument("these model passes have no forward-only head (evaluation runs on the simulated GPU and the CPU)");
  }
};

// The CPU reference (model::Workspace and the passes of model/gpt2.h).
std::unique_ptr<ModelPasses> cpu_model_passes(const model::Config& config, int B, int T, bool checkpointing,
                                              model::Attention attention = model::Attention::Materialized);

// One kind of accelerator. Thread-safe: rank threads call it concurrently.
class Backend {
 public:
  virtual ~Backend() = default;
  // "NVIDIA H100 80GB HBM3 (cuda:0, sm_90, 79.19 GiB)": for the trace's device table and logs.
  virtual std::string describe(int rank) const = 0;
  // Usable bytes of the rank's device (what the allocator may take when no cap is given).
  virtual size_t device_capacity(int rank) const = 0;
  // The device memory behind rank's caching allocator, at most `cap` bytes.
  virtual std::unique_ptr<memory::MemorySource> device_source(int rank, size_t cap) = 0;
  // Page-locked host memory for the pinned allocator, at most `cap` bytes (0: no cap), its pages
  // placed as `placement` says (zt/memory/numa.h; throws std::runtime_error when the OS refuses).
  virtual std::unique_ptr<memory::MemorySource> pinned_source(size_t cap, memory::PagePlacement placement) = 0;
  // The rank's ops (valid while the backend lives; the rank thread is their only user).
  virtual DeviceOps& ops(int rank) = 0;
  // attention: Flash runs cuda/flash_attention.h; Materialized the cuBLAS attention (gemm.h).
  virtual std::unique_ptr<ModelPasses> model_passes(int rank, const model::Config& config, int B, int T,
                                                    bool checkpointing, model::Attention attention) = 0;
  // This process as rank `rank` of a multi-process job (one GPU per process), its collectives
  // ordered after the rank's work on the device: NCCL, from the launcher's variables and the
  // rendezvous settings (zero/launcher_env.h). Throws LaunchError for missing or inconsistent
  // settings; null with *why when this build has no NCCL.
  virtual std::unique_ptr<Communicator> process_communicator(int rank, probe::Recorder* rec, probe::DeviceId device,
                                                             int64_t timeout_ms, std::string* why) = 0;
};

// The CUDA backend: every rank of this process on GPU `device` (in-process ranks share it, each
// with its own stream and cuBLAS handle; a multi-process NCCL job gives each process its local
// rank's GPU; where only one GPU is visible (CUDA_VISIBLE_DEVICES, Slurm's --gpus-per-task) that
// one, whatever `device` says). Null with the reason in *why when this build has no CUDA, the
// machine no usable GPU, or `device` is out of range.
// matmul: how the fp32 GEMMs run (TrainConfig::matmul_precision; core/dtype.h).
// sync: how a host thread waits for the GPU (cudaSetDeviceFlags' schedule): auto (CUDA's default:
// spin while the process has fewer active contexts than cores), spin, yield, or blocking (the
// thread sleeps on an OS primitive until the GPU is done, freeing its core for the CPU AdamW beside
// the step, at the price of a wake-up per wait). ZT_CUDA_SYNC picks it (parse_cuda_sync).
enum class CudaSync { Auto, Spin, Yield, Blocking };
// bf16_compute: the model passes' GEMMs on bf16 inputs (TrainConfig::matmul_dtype bf16; cuda/model_passes.h).
struct CudaBackendOptions {
  MatmulPrecision matmul = MatmulPrecision::Highest;
  bool bf16_compute = false;
  CudaSync sync = CudaSync::Auto;
};
// "auto", "spin", "yield" or "blocking"; false for anything else.
bool parse_cuda_sync(const std::string& text, CudaSync* out);
std::unique_ptr<Backend> make_cuda_backend(int device, std::string* why, CudaBackendOptions options = {});

}  // namespace zt::trainer
