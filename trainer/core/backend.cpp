#include "core/backend.h"

#include <omp.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "model/gpt2.h"

namespace zt::trainer {

namespace {

// Host ops over large arrays run on OpenMP threads in fixed chunks of kHostChunk elements (the
// optimizer step's unscale and norm pass over every parameter of a rank under optimizer offload:
// on one thread they cost more than the CPU Adam itself; the casts are dtype.cpp's, threaded
// already). Element-wise ops are exact whatever the split; sum_squares sums each chunk in double
// on 8 lanes (element i on lane i mod 8, each lane in index order; one chain of dependent adds
// ran at a quarter of memory speed), adds the lanes pairwise, then the chunk sums in chunk order:
// its result depends on n alone, never on the thread count. The chunks go to whichever thread is
// free (schedule dynamic): a landing team sharing the cores with the background AdamW waits for a
// preempted thread's current chunk, not for its whole share.
constexpr int64_t kHostChunk = int64_t{1} << 16;
constexpr int kSumLanes = 8;

// The sum of load(i)^2 over [lo, hi) in the order above; `load` may also store what it loaded.
template <class Load>
double sum_squares_lanes(int64_t lo, int64_t hi, const Load& load) {
  double acc[kSumLanes] = {};
  int64_t i = lo;
  for (; i + kSumLanes <= hi; i += kSumLanes)
    for (int k = 0; k < kSumLanes; ++k) {
      const double v = load(i + k);
      acc[k] += v * v;
    }
  for (int k = 0; i < hi; ++i, ++k) {
    const double v = load(i);
    acc[k] += v * v;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <class F>
void for_chunks(int64_t n, const F& f) {
  const int64_t chunks = (n + kHostChunk - 1) / kHostChunk;
  if (chunks <= 1 || omp_in_parallel() || omp_get_max_threads() == 1) {
    for (int64_t c = 0; c < chunks; ++c) f(c * kHostChunk, std::min(n, (c + 1) * kHostChunk));
    return;
  }
#pragma omp parallel for schedule(dynamic)
  for (int64_t c = 0; c < chunks; ++c) f(c * kHostChunk, std::min(n, (c + 1) * kHostChunk));
}

// f(lo, hi) over [0, bytes): in one call below kPieceMin, else one contiguous piece a thread (page
// multiples), each thread its own.
constexpr size_t kPieceMin = size_t(4) << 20;
template <class F>
void for_pieces(size_t bytes, const F& f) {
  if (bytes < kPieceMin || omp_in_parallel() || omp_get_max_threads() == 1) {
    if (bytes) f(size_t(0), bytes);
    return;
  }
#pragma omp parallel
  {
    const size_t t = size_t(omp_get_thread_num()), nt = size_t(omp_get_num_threads());
    const size_t piece = (bytes / nt + 4095) / 4096 * 4096;
    const size_t lo = std::min(bytes, t * piece), hi = t + 1 == nt ? bytes : std::min(bytes, lo + piece);
    if (lo < hi) f(lo, hi);
  }
}

// The sum of squares' one order: `chunk(lo, hi)` sums [lo, hi) (sum_squares_lanes), the chunk
// sums are added in chunk order.
template <class F>
double chunked_sum_squares(int64_t n, const F& chunk) {
  const int64_t chunks = (n + kHostChunk - 1) / kHostChunk;
  std::vector<double> part(size_t(std::max<int64_t>(chunks, 1)), 0.0);
  for_chunks(n, [&](int64_t lo, int64_t hi) { part[size_t(lo / kHostChunk)] = chunk(lo, hi); });
  double s = 0;
  for (double p : part) s += p;
  return s;
}

class HostOps : public DeviceOps {
 public:
  bool host_addressable() const override { return true; }
  // Large copies and fills on OpenMP threads too, one contiguous piece each (so glibc's own choice
  // for large sizes, non-temporal stores among them, holds within each): the engine's set-up zeroes
  // and fills every model state, and a fresh page's first touch is the kernel clearing it, at one
  // thread's pace.
  void copy(void* dst, const void* src, size_t bytes) override {
    for_pieces(bytes, [&](size_t lo, size_t hi) {
      std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo, hi - lo);
    });
  }
  void zero(void* p, size_t bytes) override {
    for_pieces(bytes, [&](size_t lo, size_t hi) { std::memset(static_cast<char*>(p) + lo, 0, hi - lo); });
  }
  void convert(void* dst, DType dst_t, const void* src, DType src_t, int64_t n) override {
    // to_float / from_float run on OpenMP threads themselves (core/dtype.cpp).
    if (dst_t == src_t) {
      copy(dst, src, size_t(n) * dtype_size(dst_t));
    } else if (src_t == DType::F32) {
      from_float(dst_t, static_cast<const float*>(src), dst, size_t(n));
    } else if (dst_t == DType::F32) {
      to_float(src_t, src, static_cast<float*>(dst), size_t(n));
    } else {
      std::vector<float> tmp(static_cast<size_t>(n));
      to_float(src_t, src, tmp.data(), tmp.size());
      from_float(dst_t, tmp.data(), dst, tmp.size());
    }
  }
  void add(void* dst, DType dst_t, const float* src, int64_t n) override {
    if (dst_t == DType::F32) {
      float* d = static_cast<float*>(dst);
      for_chunks(n, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) d[i] += src[i];
      });
      return;
    }
    auto* d = static_cast<uint16_t*>(dst);
    const bool bf = dst_t == DType::BF16;
    for_chunks(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const float x = (bf ? bf16_to_float(d[i]) : fp16_to_float(d[i])) + src[i];
        d[i] = bf ? float_to_bf16(x) : float_to_fp16(x);
      }
    });
  }
  void scale(float* x, int64_t n, float a) override {
    for_chunks(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) x[i] *= a;
    });
  }
  double sum_squares(const float* x, int64_t n) override {
    return chunked_sum_squares(n, [x](int64_t lo, int64_t hi) {
      return sum_squares_lanes(lo, hi, [x](int64_t i) { return double(x[i]); });
    });
  }

  void adamw(float* params, const float* grads, float* m, float* v, int64_t n, const optim::AdamParams& hp,
             int64_t step, void* low_out, optim::LowDType low) override {
    optim::cpu_adamw_step(params, grads, m, v, n, hp, step, low_out, low);
  }
};

// One copy lane of a simulated GPU: a thread doing the copies in order.
class CopyLane {
 public:
  ~CopyLane() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }
  DeviceOps::Fence push(void* dst, const void* src, size_t bytes, const DeviceOps::CopyDone& done) {
    std::lock_guard lock(mu_);
    if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
    jobs_.push_back({dst, src, bytes, done, ++queued_});
    cv_.notify_all();
    return queued_;
  }
  void wait(uint64_t n) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return finished_ >= n; });
  }

 private:
  struct Job {
    void* dst;
    const void* src;
    size_t bytes;
    DeviceOps::CopyDone done;
    uint64_t n;
  };
  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, nothing left
      Job j = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      const int64_t t0 = probe::now_ns();
      if (j.bytes) std::memcpy(j.dst, j.src, j.bytes);
      if (j.done) j.done(t0, probe::now_ns());
      j.done = nullptr;  // what it holds is released before the waiter can release the rest
      lock.lock();
      finished_ = j.n;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  uint64_t queued_ = 0, finished_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

// Fences carry their lane in the top bit.
constexpr uint64_t kD2HBit = uint64_t(1) << 63;

class SimOps final : public HostOps {
 public:
  Fence copy_async(void* dst, const void* src, size_t bytes, Lane lane, const CopyDone& done) override {
    CopyLane& l = lane == Lane::H2D ? h2d_ : d2h_;
    return l.push(dst, src, bytes, done) | (lane == Lane::D2H ? kD2HBit : 0);
  }
  void wait(Fence f) override {
    if (f == 0) return;
    if (f & kD2HBit) d2h_.wait(f & ~kD2HBit);
    else h2d_.wait(f);
  }

 private:
  CopyLane h2d_, d2h_;
};

class CpuModelPasses final : public ModelPasses {
 public:
  CpuModelPasses(const model::Config& c, int B, int T, bool checkpointing, model::Attention attention)
      : ws_(c, B, T, checkpointing, 0, attention) {}
  size_t bytes() const override { return ws_.bytes(); }
  void bind(void*) override {}
  bool owns_memory() const override { return true; }
  float* residual(int i) override { return ws_.residual(i); }
  float* grad_residual() override { return ws_.grad_residual(); }
  void embed_forward(const float* p, const int32_t* tokens, float* x_out) override {
    model::embed_forward(ws_, p, tokens, x_out);
  }
  void block_forward(int layer, const float* p, const float* x_in, float* x_out) override {
    model::block_forward(ws_, layer, p, x_in, x_out);
  }
  float head_forward_backward(const float* pf, const float* wte, const float* x, const int32_t* targets, float* dx,
                              float* d_final, float* d_wte, float grad_scale) override {
    return model::head_forward_backward(ws_, pf, wte, x, targets, dx, d_final, d_wte, grad_scale);
  }
  void block_backward(int layer, const float* p, const float* x_in, const float* dx_out, float* dx_in,
                      float* d_block) override {
    model::block_backward(ws_, layer, p, x_in, dx_out, dx_in, d_block);
  }
  void embed_backward(const int32_t* tokens, const float* dx, float* d_emb) override {
    model::embed_backward(ws_, tokens, dx, d_emb);
  }
  float head_forward(const float* pf, const float* wte, const float* x, const int32_t* targets, float* logits) override {
    return model::head_forward(ws_, pf, wte, x, targets, logits);
  }

 private:
  model::Workspace ws_;
};

}  // namespace

DeviceOps::Fence DeviceOps::copy_async(void* dst, const void* src, size_t bytes, Lane, const CopyDone& done) {
  const int64_t t0 = probe::now_ns();
  copy(dst, src, bytes);
  if (done) done(t0, probe::now_ns());
  return 0;
}

std::unique_ptr<DeviceOps> make_sim_ops() { return std::make_unique<SimOps>(); }

DeviceOps& host_ops() {
  static HostOps ops;
  return ops;
}

double widen_and_sum_squares(float* dst, const void* src, DType src_t, int64_t n) {
  if (src_t != DType::F32 && src_t != DType::BF16 && src_t != DType::F16)
    throw std::invalid_argument("widen_and_sum_squares: " + std::string(dtype_name(src_t)) + " is not a float dtype");
  return chunked_sum_squares(n, [&](int64_t lo, int64_t hi) {
    // `widened(i)`: element i in fp32; written to dst on the way when there is one.
    auto sum = [&](auto widened) {
      if (!dst) return sum_squares_lanes(lo, hi, [&](int64_t i) { return double(widened(i)); });
      return sum_squares_lanes(lo, hi, [&](int64_t i) { return double(dst[i] = widened(i)); });
    };
    const float* x = static_cast<const float*>(src);
    const uint16_t* h = static_cast<const uint16_t*>(src);
    if (src_t == DType::F32) return sum([&](int64_t i) { return x[i]; });
    if (src_t == DType::BF16) return sum([&](int64_t i) { return bf16_to_float(h[i]); });
    return sum([&](int64_t i) { return fp16_to_float(h[i]); });
  });
}

std::unique_ptr<ModelPasses> cpu_model_passes(const model::Config& config, int B, int T, bool checkpointing,
                                              model::Attention attention) {
  return std::make_unique<CpuModelPasses>(config, B, T, checkpointing, attention);
}

bool parse_cuda_sync(const std::string& text, CudaSync* out) {
  static const std::pair<const char*, CudaSync> kNames[] = {
      {"auto", CudaSync::Auto}, {"spin", CudaSync::Spin}, {"yield", CudaSync::Yield}, {"blocking", CudaSync::Blocking}};
  for (const auto& [name, value] : kNames)
    if (text == name) {
      *out = value;
      return true;
    }
  return false;
}

}  // namespace zt::trainer
