// The GPU code path of the trainer, on the CPU: a Backend (core/backend.h) whose device memory the
// CPU cannot dereference. Its pointers are host memory moved up by 2^62, a non-canonical address
// on x86-64 and AArch64, so any code that touches accelerator memory itself, instead of through
// the device's ops, the copy engine or the model passes, dies with SIGSEGV. Its ops and passes
// take the offset off and run the CPU reference: so a run on it must give exactly the simulated
// GPU's losses. This is what `--device cuda` does with CUDA kernels in place of these CPU ones
// (the kernels themselves are checked against the same reference by tests/cuda, on a GPU).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>

#include "core/backend.h"
#include "traced_run.h"
#include "train/trainer.h"
#include "zero/communicator.h"
#include "zt/memory/memory_source.h"

using namespace zt::trainer;

namespace {

constexpr uintptr_t kOffset = uintptr_t(1) << 62;

template <typename T>
T* up(T* p) {
  return p ? reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) + kOffset) : nullptr;
}
// Device pointers back to host ones; host pointers (copies' other side) pass unchanged.
template <typename T>
T* down(T* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  return u >= kOffset ? reinterpret_cast<T*>(u - kOffset) : p;
}

class OpaqueSource final : public zt::memory::MemorySource {
 public:
  explicit OpaqueSource(size_t cap) : inner_(cap) {}
  void* allocate(size_t bytes) override { return up(inner_.allocate(bytes)); }
  void release(void* p, size_t bytes) override { inner_.release(down(p), bytes); }
  size_t capacity() const override { return inner_.capacity(); }
  size_t in_use() const override { return inner_.in_use(); }
  bool host_accessible() const override { return false; }
  std::string describe() const override { return "opaque test GPU memory"; }

 private:
  zt::memory::HostBackedSource inner_;
};

struct OpaqueOps final : DeviceOps {
  std::atomic<int64_t> calls{0}, adam{0}, copies{0};
  DeviceOps& h = host_ops();
  bool host_addressable() const override { return false; }
  void copy(void* dst, const void* src, size_t bytes) override {
    ++calls, ++copies;
    h.copy(down(dst), down(src), bytes);
  }
  void zero(void* p, size_t bytes) override {
    ++calls;
    h.zero(down(p), bytes);
  }
  void convert(void* dst, DType dt, const void* src, DType st, int64_t n) override {
    ++calls;
    h.convert(down(dst), dt, down(src), st, n);
  }
  void add(void* dst, DType dt, const float* src, int64_t n) override {
    ++calls;
    h.add(down(dst), dt, down(src), n);
  }
  void scale(float* x, int64_t n, float a) override {
    ++calls;
    h.scale(down(x), n, a);
  }
  double sum_squares(const float* x, int64_t n) override {
    ++calls;
    return h.sum_squares(down(x), n);
  }
  void adamw(float* p, const float* g, float* m, float* v, int64_t n, const zt::optim::AdamParams& hp, int64_t step,
             void* low_out, zt::optim::LowDType low) override {
    ++calls, ++adam;
    h.adamw(down(p), down(g), down(m), down(v), n, hp, step, down(low_out), low);
  }
};

class OpaquePasses final : public ModelPasses {
 public:
  explicit OpaquePasses(std::unique_ptr<ModelPasses> inner) : in_(std::move(inner)) {}
  size_t bytes() const override { return in_->bytes(); }
  void bind(void* memory) override { bound_ = memory != nullptr; }
  float* residual(int i) override { return up(in_->residual(i)); }
  float* grad_residual() override { return up(in_->grad_residual()); }
  void embed_forward(const float* p, const int32_t* tokens, float* x) override {
    ASSERT_TRUE(bound_);
    in_->embed_forward(down(p), down(tokens), down(x));
  }
  void block_forward(int l, const float* p, const float* x_in, float* x_out) override {
    in_->block_forward(l, down(p), down(x_in), down(x_out));
  }
  float head_forward_backward(const float* pf, const float* wte, const float* x, const int32_t* targets, float* dx,
                              float* df, float* dwte, float scale) override {
    return in_->head_forward_backward(down(pf), down(wte), down(x), down(targets), down(dx), down(df), down(dwte), scale);
  }
  void block_backward(int l, const float* p, const float* x_in, const float* dx_out, float* dx_in, float* d) override {
    in_->block_backward(l, down(p), down(x_in), down(dx_out), down(dx_in), down(d));
  }
  void embed_backward(const int32_t* tokens, const float* dx, float* d) override {
    in_->embed_backward(down(tokens), down(dx), down(d));
  }

 private:
  std::unique_ptr<ModelPasses> in_;
  bool bound_ = false;
};

class OpaqueBackend final : public Backend {
 public:
  OpaqueOps ops_;
  std::string describe(int) const override { return "opaque test GPU"; }
  size_t device_capacity(int) const override { return size_t(4) << 30; }
  std::unique_ptr<zt::memory::MemorySource> device_source(int, size_t cap) override {
    return std::make_unique<OpaqueSource>(cap);
  }
  std::unique_ptr<zt::memory::MemorySource> pinned_source(size_t cap, zt::memory::PagePlacement placement) override {
    return std::make_unique<zt::memory::HostBackedSource>(cap ? cap : size_t(4) << 30, 4096, placement);
  }
  DeviceOps& ops(int) override { return ops_; }
  std::unique_ptr<ModelPasses> model_passes(int, const zt::model::Config& c, int B, int T, bool ckpt,
                                            zt::model::Attention attention) override {
    return std::make_unique<OpaquePasses>(cpu_model_passes(c, B, T, ckpt, attention));
  }
  std::unique_ptr<Communicator> process_communicator(int, zt::probe::Recorder*, zt::probe::DeviceId, int64_t,
                                                     std::string* why) override {
    *why = "the opaque test backend has no multi-process transport";
    return nullptr;
  }
};

}  // namespace

TEST(OpaqueDevice, PointersReallyCannotBeDereferenced) {
  OpaqueSource src(1 << 20);
  float* p = static_cast<float*>(src.allocate(4096));
  EXPECT_DEATH({ volatile float x = p[0]; (void)x; }, "");
  src.release(p, 4096);
}

// Every stage, with and without offloads, mixed precision, 1 and 2 ranks, the delayed and the
// overlapped update: the
// same losses, bit for bit, as on the simulated GPU, and the optimizer where the config puts it.
TEST(OpaqueDevice, TrainsExactlyAsTheSimulatedGpu) {
  struct Case {
    int stage, world;
    bool off_opt, off_param;
    const char* precision;
    int64_t delayed = -1;  // the delayed parameter update from this step on
    bool overlap = false;  // the overlapped update
    int64_t persistence = 0;  // -1: stage 3 keeps its small modules whole (their write-back all-gathers)
    bool compute_grads = false;  // grad_partition_dtype compute: the D2H copy lands in the partition itself
    double ratio = 1.0;          // offload_ratio: the first modules' optimizer on the device
  };
  for (const Case& k : {Case{0, 1, false, false, "fp32"}, Case{1, 2, true, false, "bf16"}, Case{2, 2, false, false, "fp16"},
                        Case{3, 1, true, true, "bf16"}, Case{3, 2, true, false, "fp32"}, Case{3, 2, false, false, "bf16"},
                        Case{1, 2, true, false, "bf16", 1}, Case{3, 1, true, true, "bf16", 0},
                        Case{3, 2, true, false, "fp32", 0}, Case{3, 2, true, false, "bf16", -1, true, -1},
                        Case{3, 1, true, true, "bf16", -1, true}, Case{2, 2, true, false, "fp32", -1, true},
                        Case{3, 1, true, true, "bf16", -1, false, 0, true}, Case{2, 2, true, false, "fp16", 1, false, 0, true},
                        Case{3, 2, true, false, "bf16", -1, true, -1, true},
                        Case{3, 2, true, false, "bf16", 0} /* the delayed update's early write-back into device shards */,
                        Case{3, 1, false, true, "bf16"} /* host shards, the optimizer on the device: D2H write-back */,
                        Case{3, 2, true, true, "bf16", -1, false, 0, false, 0.5}, Case{3, 2, true, false, "bf16", 0, false, 0, false, 0.5},
                        Case{3, 1, true, true, "fp16", -1, true, 0, false, 0.5}}) {
    SCOPED_TRACE("stage " + std::to_string(k.stage) + ", " + std::to_string(k.world) + " ranks, " + k.precision +
                 (k.off_opt ? ", offload_optimizer" : "") + (k.off_param ? ", offload_param" : "") +
                 (k.delayed >= 0 ? ", delayed_update " + std::to_string(k.delayed) : "") +
                 (k.overlap ? ", overlap_update" : "") + (k.persistence < 0 ? ", some whole modules" : "") +
                 (k.compute_grads ? ", compute-dtype gradient partitions" : "") +
                 (k.ratio < 1 ? ", offload_ratio " + std::to_string(k.ratio) : ""));
    TrainConfig c = zt::test::tiny_run(4);
    c.world_size = k.world;
    c.grad_accum = 2;
    c.precision = k.precision;
    c.grad_clip = 0.05;  // clipping active: the scale path of unscale_and_clip_grads
    c.zero.stage = k.stage;
    c.zero.offload_optimizer = k.off_opt;
    c.zero.offload_param = k.off_param;
    c.zero.param_persistence_threshold = k.persistence;
    c.delayed_update = k.delayed;
    c.overlap_update = k.overlap;
    c.grad_partition_dtype = k.compute_grads ? "compute" : "fp32";
    c.zero.offload_ratio = k.ratio;
    OpaqueBackend b;
    const std::vector<double> want = zt::test::train_losses(c);
    c.device = "cuda";
    const std::vector<double> got = zt::test::train_losses(c, &b);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i;
    EXPECT_GT(b.ops_.calls.load(), 0);
    EXPECT_GT(b.ops_.copies.load(), 0);
    // AdamW on the device only when the optimizer state is there.
    if (k.off_opt && k.ratio == 1) EXPECT_EQ(b.ops_.adam.load(), 0);
    else EXPECT_GT(b.ops_.adam.load(), 0);
  }
}

// The device guard sees the opaque GPU as cuda:0, as it would a real one: R2's fault still fires.
TEST(OpaqueDevice, TheGuardStillCatchesTheNormOnTheDevice) {
  TrainConfig c = zt::test::tiny_run(2);
  c.device = "cuda";
  c.zero.stage = 3;
  c.zero.offload_optimizer = true;
  c.grad_clip = 1e-3;
  c.faults = {"zero.norm_on_device=return"};
  OpaqueBackend b;
  TrainSummary s;
  zt::Status st = train(c, nullptr, nullptr, &s, &b);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"),
            std::string::npos)
      << st.message();
}

TEST(OpaqueDevice, ABackendNeedsDeviceCuda) {
  TrainConfig c = zt::test::tiny_run(1);
  OpaqueBackend b;
  TrainSummary s;
  zt::Status st = train(c, nullptr, nullptr, &s, &b);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("a backend was given for --device sim"), std::string::npos) << st.message();
}
