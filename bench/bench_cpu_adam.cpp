// bench/bench_cpu_adam.cpp: the vectorized CPU AdamW (optim/cpu_adam.h) on one large shard, beside
// baselines measured in the same run, as ratios:
//   (a) the scalar reference zt::model::adamw_step (one fused scalar loop, one thread): ours/ref is
//       the ratio of parameters/s. DeepSpeed claims 5-7x for its CPUAdam over PyTorch's CPU Adam,
//       which makes about nine passes over memory; the reference here is already a single pass, so
//       a PyTorch-style unfused AdamW (9 element-wise passes, OpenMP + SIMD, its temporary
//       preallocated) is timed as well, as a stand-in for what DeepSpeed compared against.
//   (b) a STREAM-style triad a[i] = b[i] + s*c[i] on fp32 arrays of the same length with the same
//       threads, with plain and with non-temporal stores: ours/triad is the ratio of bytes/s to the
//       faster of the two. Target: >= 70%.
// Bytes counted (STREAM's convention: what the algorithm reads and writes, no write-allocate):
// AdamW 28 B/param (read p, g, m, v; write p, m, v), +2 with the fused bf16/fp16 output; triad 12 B.
// The fused output aligned (non-temporal stores, as the trainer's) and one element off (plain ones).
//   (c) the host's work per parameter of a ZeRO-3 offload step in bf16, the gradient partition
//       landing from the device in bf16: two passes as the engine makes them by default (widen into
//       the fp32 partition summing squares, 6 B; AdamW on it with the bf16 output, 30 B) against one
//       (squares summed over the bf16 partition, 2 B; AdamW reading it, 28 B:
//       grad_partition_dtype compute). "vs 2-pass" is the ratio of parameters/s.
//   (d) the schedule: ours with the bf16 output split into 16Ki-element chunks taken by the next free
//       thread (dynamic, the default) against one contiguous range per thread (static). Alone they
//       should be alike; with --beside K they are also timed while K other threads (not OpenMP's)
//       stream memory in bursts of ON ms every ON+OFF ms, as the rank thread's own team lands
//       gradient partitions beside the trainer's background AdamW on the GPU host: there a static
//       range waits for its most preempted thread. "vs static" is the ratio of parameters/s.
// GB = 1e9 bytes. Each figure is the best of R interleaved repetitions (every variant once per
// repetition), so a busy machine slows all alike; beside the bursts the median is printed too.
//
// Usage: bench_cpu_adam [--params N] [--reps R] [--threads T1,T2,...] [--beside K[:ON/OFF]]
//   defaults: 64Mi parameters, 5 repetitions, threads 1 and omp_get_max_threads(); --beside K
//   alone means bursts of 5 ms every 10 ms.
// Not a test: it never fails on a number.
#include <omp.h>
#if defined(__SSE__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "core/backend.h"
#include "model/adamw.h"
#include "optim/cpu_adam.h"

namespace {

using Clock = std::chrono::steady_clock;
using zt::optim::AdamParams;
using zt::optim::CpuAdamIsa;
using zt::optim::LowDType;

using Buffer = zt::bench::HostArray;
using zt::bench::fill;

void triad(float* a, const float* b, const float* c, float s, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}

// The same with non-temporal stores, which skip reading a's lines before writing them (the plain
// triad moves 16 B/element for the 12 it counts); both are shown, ratios use the faster.
void triad_nt(float* a, const float* b, const float* c, float s, int64_t n) {
#if defined(__SSE__)
  const __m128 sv = _mm_set1_ps(s);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n / 4; i++)  // a is 64-byte aligned: every group of 4 is 16-byte aligned
    _mm_stream_ps(a + 4 * i, _mm_add_ps(_mm_loadu_ps(b + 4 * i), _mm_mul_ps(sv, _mm_loadu_ps(c + 4 * i))));
  _mm_sfence();
  for (int64_t i = n / 4 * 4; i < n; i++) a[i] = b[i] + s * c[i];
#else
  triad(a, b, c, s, n);
#endif
}

// PyTorch 1.13's single-tensor AdamW as its CPU kernels run it: one element-wise pass per op.
void torch_style_adamw(float* p, const float* g, float* m, float* v, float* d, int64_t n, const AdamParams& hp,
                       int64_t step) {
  const double bc1 = 1.0 - std::pow(hp.beta1, (double)step), bc2 = 1.0 - std::pow(hp.beta2, (double)step);
  const float decay = (float)(1.0 - hp.lr * hp.weight_decay), b1 = (float)hp.beta1, b2 = (float)hp.beta2;
  const float omb1 = (float)(1.0 - hp.beta1), omb2 = (float)(1.0 - hp.beta2), eps = (float)hp.eps;
  const float bc2_sqrt = (float)std::sqrt(bc2), neg_step = (float)(-hp.lr / bc1);
#pragma omp parallel
  {
#pragma omp for simd schedule(static)
    for (int64_t i = 0; i < n; i++) p[i] *= decay;  // param.mul_(1 - lr * wd)
#pragma omp for simd schedule(static)
    for (int64_t i = 0; i < n; i++) m[i] *= b1;  // exp_avg.mul_(beta1)
#pragma omp for simd schedule(static)
    for (int64_t i = 0; i < n; i++) m[i] += g[i] * omb1;  // .add_(grad, alpha=1 - beta1)
#pragma omp for simd schedule(static)
    for (int64_t i = 0; i < n; i++) v[i] *= b2;  // exp_avg_sq.mul_(beta2)
#pragma omp for simd schedule(static)
    for (int64_t i = 0; i < n; i++) v[i] += g[i] * g[i] * omb2;  // .addcmul_(grad, grad, value=1 - beta2)
#if defined(__SSE__)
    // Explicit SIMD: with errno semantics GCC leaves std::sqrt scalar, and PyTorch's kernel is not.
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n / 4; i++) _mm_storeu_ps(d + 4 * i, _mm_sqrt_ps(_mm_loadu_ps(v + 4 * i)));
#pragma omp single
    for (int64_t i = n / 4 * 4; i < n; i++) d[i] = std::sqrt(v[i]);
#else
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; i++) d[i] = std::sqrt(v[i]);  // exp_avg_sq.sqrt()
#endif
#pragma omp for simd schedule(static)
    for (int64_t i = 0; i < n; i++) d[i] /= bc2_sqrt;  // / bias_correction2_sqrt
#pragma omp for simd schedule(static)
    for (int64_t i = 0; i < n; i++) d[i] += eps;  // .add_(eps)
#pragma omp for simd schedule(static)
    for (int64_t i = 0; i < n; i++)  // param.addcdiv_(exp_avg, denom, value=-step_size)
      p[i] += neg_step * (m[i] / d[i]);
  }
}

struct Variant {
  std::string name;
  double bytes_per_elem;
  bool threaded;                   // false: runs on one thread whatever T is (the reference)
  std::function<void()> run;
  std::vector<double> best;        // per thread count, seconds
};

// K threads beside the timed work, each streaming over arrays of its own (bf16 widened to fp32 with
// its sum of squares: the landing of a gradient partition) for on_ms, then sleeping off_ms, until
// stopped. They start and stop with the object.
class Bursts {
 public:
  Bursts(int k, double on_ms, double off_ms) {
    for (int i = 0; i < k; i++)
      threads_.emplace_back([this, on_ms, off_ms] {
        const int64_t n = int64_t(8) << 20;  // 16 MiB in, 32 MiB out: well past the caches
        std::vector<uint16_t> in(size_t(n), 0x3f80);
        std::vector<float> out(static_cast<size_t>(n));
        int64_t at = 0;
        const int64_t piece = int64_t(1) << 16;
        while (!stop_.load(std::memory_order_relaxed)) {
          const auto until = Clock::now() + std::chrono::duration<double, std::milli>(on_ms);
          while (Clock::now() < until && !stop_.load(std::memory_order_relaxed)) {
            double s = 0;
            for (int64_t j = at; j < at + piece; j++) {
              uint32_t b = uint32_t(in[size_t(j)]) << 16;
              float f;
              std::memcpy(&f, &b, 4);
              out[size_t(j)] = f;
              s += double(f) * f;
            }
            sink_ += s;
            at = (at + piece) % n;
          }
          if (off_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(off_ms));
        }
      });
  }
  ~Bursts() {
    stop_ = true;
    for (auto& t : threads_) t.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<double> sink_{0};
  std::vector<std::thread> threads_;
};

std::vector<int> parse_threads(const char* s) {
  std::vector<int> t;
  for (const char* q = s; *q;) {
    t.push_back(std::atoi(q));
    while (*q && *q != ',') q++;
    if (*q == ',') q++;
  }
  return t;
}

}  // namespace

static int run(int argc, char** argv) {
  int64_t n = int64_t(64) << 20;
  int reps = 5;
  std::vector<int> threads = {1, omp_get_max_threads()};
  int beside = 0;
  double on_ms = 5, off_ms = 5;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--beside" && i + 1 < argc) {
      const std::string b = argv[++i];
      char* end = nullptr;
      beside = int(std::strtol(b.c_str(), &end, 10));
      if (*end == ':' && std::sscanf(end + 1, "%lf/%lf", &on_ms, &off_ms) != 2) beside = -1;
      else if (*end && *end != ':') beside = -1;
      if (beside < 1 || on_ms <= 0 || off_ms < 0) {
        std::fprintf(stderr, "bench_cpu_adam: --beside %s: expected K or K:ON/OFF (K >= 1 threads, ON > 0 and "
                             "OFF >= 0 milliseconds)\n", b.c_str());
        return 2;
      }
    } else if (a == "--params" && i + 1 < argc) n = std::atoll(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--threads" && i + 1 < argc) threads = parse_threads(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_cpu_adam [--params N] [--reps R] [--threads T1,T2,...] [--beside K[:ON/OFF]]\n");
      return 2;
    }
  }
  std::sort(threads.begin(), threads.end());
  threads.erase(std::unique(threads.begin(), threads.end()), threads.end());
  threads.erase(std::remove_if(threads.begin(), threads.end(), [](int t) { return t < 1; }), threads.end());
  if (threads.empty() || n < 1) {
    std::fprintf(stderr, "bench_cpu_adam: nothing to run\n");
    return 2;
  }

  const size_t fbytes = size_t(n) * 4;
  Buffer p(fbytes), g(fbytes), m(fbytes), v(fbytes), low(size_t(n) * 2), d(fbytes), ta(fbytes), tb(fbytes),
      tc(fbytes);
  fill(p.f(), n, 1.0f, 1);
  fill(g.f(), n, 0.1f, 2);
  fill(m.f(), n, 0.01f, 3);
  for (float* x : {v.f(), d.f()}) fill(x, n, 0.0f, 4);
  fill(ta.f(), n, 1.0f, 5);
  fill(tb.f(), n, 1.0f, 6);
  fill(tc.f(), n, 1.0f, 7);
  std::memset(low.ptr, 0, size_t(n) * 2);

  const AdamParams hp{1e-4, 0.9, 0.999, 1e-8, 0.01};
  int64_t step = 1;  // every AdamW call is a new step of the same shard

  std::vector<Variant> vs;
  vs.push_back({"STREAM triad a=b+s*c (fp32)", 12.0, true,
                [&] { triad(ta.f(), tb.f(), tc.f(), 0.5f, n); }, {}});
  vs.push_back({"STREAM triad, non-temporal stores", 12.0, true,
                [&] { triad_nt(ta.f(), tb.f(), tc.f(), 0.5f, n); }, {}});
  vs.push_back({"reference zt::model::adamw_step", 28.0, false,
                [&] { zt::model::adamw_step(p.f(), g.f(), m.f(), v.f(), n, hp.lr, hp.beta1, hp.beta2, hp.eps,
                                            hp.weight_decay, step++); },
                {}});
  vs.push_back({"torch-style unfused, 9 passes", 28.0, true,
                [&] { torch_style_adamw(p.f(), g.f(), m.f(), v.f(), d.f(), n, hp, step++); }, {}});
  // The fused output in `low` (64-byte aligned: written with non-temporal stores) or at `out`.
  auto ours = [&](CpuAdamIsa isa, LowDType lt, void* out = nullptr) {
    return [&, isa, lt, out] {
      zt::optim::cpu_adam_force_isa(isa);
      zt::optim::cpu_adamw_step(p.f(), g.f(), m.f(), v.f(), n, hp, step++,
                                lt == LowDType::None ? nullptr : out ? out : low.ptr, lt);
    };
  };
  for (CpuAdamIsa isa : {CpuAdamIsa::Scalar, CpuAdamIsa::Avx2, CpuAdamIsa::Avx512}) {
    if (!zt::optim::cpu_adam_isa_supported(isa)) continue;
    const std::string name = std::string("ours ") + zt::optim::cpu_adam_isa_name(isa);
    vs.push_back({name, 28.0, true, ours(isa, LowDType::None), {}});
  }
  const CpuAdamIsa best = zt::optim::cpu_adam_best_isa();
  const std::string best_name = zt::optim::cpu_adam_isa_name(best);
  vs.push_back({"ours " + best_name + " + bf16 out", 30.0, true, ours(best, LowDType::BF16), {}});
  vs.push_back({"ours " + best_name + " + fp16 out", 30.0, true, ours(best, LowDType::F16), {}});
  // The same bf16 output one element off 32 bytes: plain stores (the aligned one's are non-temporal).
  Buffer low_off(size_t(n) * 2 + 64);
  vs.push_back({"ours " + best_name + " + bf16 out, plain stores", 30.0, true,
                ours(best, LowDType::BF16, static_cast<uint16_t*>(low_off.ptr) + 1), {}});
  // (d): the bf16 output with each schedule (the rows above run the default, dynamic).
  auto scheduled = [&](zt::optim::CpuAdamSchedule sched) {
    return [&, sched, best] {
      zt::optim::cpu_adam_force_schedule(sched);
      ours(best, LowDType::BF16)();
      zt::optim::cpu_adam_unforce_schedule();
    };
  };
  const size_t sched_rows = vs.size();
  vs.push_back({"ours " + best_name + " + bf16 out, static", 30.0, true,
                scheduled(zt::optim::CpuAdamSchedule::Static), {}});
  vs.push_back({"ours " + best_name + " + bf16 out, dynamic", 30.0, true,
                scheduled(zt::optim::CpuAdamSchedule::Dynamic), {}});
  // (c): the bf16 gradient partition as it lands, in `gl` (`low` takes the bf16 weights).
  Buffer gl(size_t(n) * 2);
  zt::trainer::host_ops().convert(gl.ptr, zt::trainer::DType::BF16, g.f(), zt::trainer::DType::F32, n);
  const size_t two_pass = vs.size();
  vs.push_back({"2-pass: widen+sumsq, AdamW fp32 g", 36.0, true,
                [&, best] {
                  zt::optim::cpu_adam_force_isa(best);
                  zt::trainer::widen_and_sum_squares(g.f(), gl.ptr, zt::trainer::DType::BF16, n);
                  zt::optim::cpu_adamw_step(p.f(), g.f(), m.f(), v.f(), n, hp, step++, low.ptr, LowDType::BF16);
                },
                {}});
  vs.push_back({"1-pass: sumsq, AdamW bf16 g", 30.0, true,
                [&, best] {
                  zt::optim::cpu_adam_force_isa(best);
                  zt::trainer::widen_and_sum_squares(nullptr, gl.ptr, zt::trainer::DType::BF16, n);
                  zt::optim::cpu_adamw_step_grads(p.f(), gl.ptr, zt::optim::GradDType::BF16, 1.0f, m.f(), v.f(), n,
                                                  hp, step++, low.ptr, LowDType::BF16);
                },
                {}});

  std::printf("bench_cpu_adam: %lld parameters (p, g, m, v fp32: %.2f GB), best of %d interleaved reps\n",
              (long long)n, 16.0 * n / 1e9, reps);
  std::printf("ISAs on this CPU: avx2 %s, avx512 %s; chosen at run time: %s\n",
              zt::optim::cpu_adam_isa_supported(CpuAdamIsa::Avx2) ? "yes" : "no",
              zt::optim::cpu_adam_isa_supported(CpuAdamIsa::Avx512) ? "yes" : "no", best_name.c_str());
  std::printf("bytes counted: AdamW 28 B/param (+2 with bf16/fp16 out), triad 12 B/element; GB = 1e9 B\n");

  const auto t_start = Clock::now();
  for (auto& var : vs) var.best.assign(threads.size(), 1e30);
  for (size_t ti = 0; ti < threads.size(); ti++) {
    omp_set_num_threads(threads[ti]);
    for (int r = -1; r < reps; r++) {  // r = -1: warm-up, not timed
      for (auto& var : vs) {
        if (!var.threaded && ti > 0) continue;  // the reference has no threads: measured once
        const auto t0 = Clock::now();
        var.run();
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (r >= 0) var.best[ti] = std::min(var.best[ti], s);
      }
    }
  }
  zt::optim::cpu_adam_unforce_isa();

  const double ref_s = vs[2].best[0];
  for (size_t ti = 0; ti < threads.size(); ti++) {
    const double triad_gbs = 12.0 * n / std::min(vs[0].best[ti], vs[1].best[ti]) / 1e9;
    std::printf("\nthreads = %d\n", threads[ti]);
    std::printf("  %-36s %10s %9s %10s %9s %9s\n", "", "Mparam/s", "GB/s", "vs ref", "vs triad", "vs 2-pass or static");
    for (auto& var : vs) {
      const double s = var.threaded ? var.best[ti] : var.best[0];
      const double gbs = var.bytes_per_elem * n / s / 1e9;
      if (&var == &vs[0] || &var == &vs[1]) {
        std::printf("  %-36s %10s %9.2f %10s %8.0f%%\n", var.name.c_str(), "", gbs, "", 100.0 * gbs / triad_gbs);
        continue;
      }
      std::string name = var.name + (var.threaded ? "" : " (1 thread)");
      std::printf("  %-36s %10.1f %9.2f %9.2fx %8.0f%%", name.c_str(), n / s / 1e6, gbs, ref_s / s,
                  100.0 * gbs / triad_gbs);
      if (&var >= &vs[two_pass]) std::printf(" %8.2fx", vs[two_pass].best[ti] / s);
      if (&var == &vs[sched_rows + 1]) std::printf(" %8.2fx", vs[sched_rows].best[ti] / s);
      std::printf("\n");
    }
  }
  if (beside > 0) {
    // (d) beside the bursts: static and dynamic in turn, best and median of the reps.
    std::printf("\nbeside %d thread%s streaming memory %.3g ms of every %.3g ms (ours %s + bf16 out):\n", beside,
                beside == 1 ? "" : "s", on_ms, on_ms + off_ms, best_name.c_str());
    std::printf("  %-10s %-10s %12s %12s %12s\n", "threads", "schedule", "best Mp/s", "median Mp/s",
                "vs static");
    const int breps = std::max(reps, 7);
    for (int t : threads) {
      omp_set_num_threads(t);
      std::vector<double> st, dy;
      {
        Bursts bursts(beside, on_ms, off_ms);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        for (int r = -1; r < breps; r++)
          for (int k = 0; k < 2; k++) {
            const auto t0 = Clock::now();
            vs[sched_rows + size_t(k)].run();
            const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
            if (r >= 0) (k ? dy : st).push_back(sec);
          }
      }
      for (auto* x : {&st, &dy}) std::sort(x->begin(), x->end());
      const double st_best = st.front(), dy_best = dy.front(), st_med = st[st.size() / 2], dy_med = dy[dy.size() / 2];
      std::printf("  %-10d %-10s %12.1f %12.1f\n", t, "static", n / st_best / 1e6, n / st_med / 1e6);
      std::printf("  %-10d %-10s %12.1f %12.1f %6.2fx best %5.2fx median\n", t, "dynamic", n / dy_best / 1e6,
                  n / dy_med / 1e6, st_best / dy_best, st_med / dy_med);
    }
  }
  std::printf("\nvs ref = parameters/s over the scalar reference's (one thread); vs triad = GB/s over the triad's"
              " (the faster of the two) with the same threads; vs 2-pass = parameters/s over the 2-pass offload"
              " step's (its rows) or over the static schedule's (the dynamic row)\n");
  std::printf("total %.1f s\n", std::chrono::duration<double>(Clock::now() - t_start).count());
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // an allocation the machine could not give
    std::fprintf(stderr, "bench_cpu_adam: %s\n", e.what());
    return 1;
  }
}
