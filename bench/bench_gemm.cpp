// bench/bench_gemm.cpp: the GPT-2 CPU reference model's forward+backward throughput, beside OpenBLAS
// sgemm on the same matrix shapes measured in the same process, as a ratio.
//
// Ours: zt::model::forward_backward (and forward alone) on a model preset (default 124M) with
// B x T tokens, no activation checkpointing, the LM head in one chunk of B*T rows.
// Baseline: exactly the weight GEMMs that pass issues (cblas_sgemm with the same m, n, k and
// transposes: per block qkv, attention projection, MLP fc and projection; the tied LM head; in the
// backward the input-gradient GEMM and the weight-gradient GEMM of each), back to back on buffers
// of the same sizes, nothing else.
// GFLOP/s of both = the same weight-GEMM FLOP count / wall time, so the ratio is t_sgemm / t_model:
// the share of the model's time that is the unavoidable GEMM work. Everything else the model does
// (attention, LayerNorm, GELU, softmax, bias and residual adds) is in its time, not its FLOPs.
// Target: >= 50%. Each figure is the best of R interleaved repetitions (baseline, then model), so a
// busy machine slows both alike.
//
// Usage: bench_gemm [PRESET] [--batch B] [--seq T] [--reps R]   (defaults: 124M, 4, 64, 3)
// Threads: OpenBLAS's own (OPENBLAS_NUM_THREADS) for GEMMs, OpenMP (OMP_NUM_THREADS) elsewhere.
// Unless OMP_WAIT_POLICY is set, the bench re-executes itself with OMP_WAIT_POLICY=passive: Debian's
// OpenBLAS runs its own pthreads, and libgomp's workers, spinning after each parallel region by
// default, take the cores those threads need. On 2 loaded cores the default policy measured
// 35-75% (wildly varying) where passive gave a steady ~80%. libgomp reads the variable when it is
// loaded, hence the re-exec rather than a setenv. Set OMP_WAIT_POLICY=active to see the default.
// Not a test: it never fails on a number.
#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/gpt2.h"
#include "zt/common/units.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Gemm {
  CBLAS_TRANSPOSE ta, tb;
  int m, n, k;
};

// The weight GEMMs of one forward (and, with backward, one forward+backward) in the order
// gpt2.cpp issues them; each weight y = x W^T with W [out, in] is (N, out, in) NoTrans x Trans,
// its backward dx = dy W (N, in, out) NoTrans x NoTrans and dW += dy^T x (out, in, N) Trans x NoTrans.
std::vector<Gemm> model_gemms(const zt::model::Config& c, int N, bool backward) {
  const int C = (int)c.width, V = (int)c.vocab;
  const int weights[4][2] = {{3 * C, C}, {C, C}, {4 * C, C}, {C, 4 * C}};  // {out, in}
  std::vector<Gemm> g;
  for (int l = 0; l < c.layers; l++) {
    for (const auto& w : weights) g.push_back({CblasNoTrans, CblasTrans, N, w[0], w[1]});
  }
  g.push_back({CblasNoTrans, CblasTrans, N, V, C});  // logits = ln_f(x) wte^T
  if (!backward) return g;
  g.push_back({CblasNoTrans, CblasNoTrans, N, C, V});  // d ln_f(x) = dlogits wte
  g.push_back({CblasTrans, CblasNoTrans, V, C, N});    // d wte += dlogits^T ln_f(x)
  for (int l = 0; l < c.layers; l++) {
    for (int i = 3; i >= 0; i--) {
      g.push_back({CblasNoTrans, CblasNoTrans, N, weights[i][1], weights[i][0]});
      g.push_back({CblasTrans, CblasNoTrans, weights[i][0], weights[i][1], N});
    }
  }
  return g;
}

// Runs the GEMM list on scratch buffers big enough for every call.
class GemmBaseline {
 public:
  explicit GemmBaseline(const std::vector<Gemm>& gemms) : gemms_(gemms) {
    size_t a = 0, b = 0, c = 0;
    for (const Gemm& g : gemms) {
      a = std::max(a, (size_t)g.m * g.k);
      b = std::max(b, (size_t)g.k * g.n);
      c = std::max(c, (size_t)g.m * g.n);
    }
    std::mt19937 rng(5);
    std::normal_distribution<float> d(0.0f, 0.02f);
    for (auto* v : {&a_, &b_, &c_}) v->resize(v == &a_ ? a : v == &b_ ? b : c);
    for (auto* v : {&a_, &b_, &c_}) {
      for (float& x : *v) x = d(rng);
    }
  }
  double flops() const {
    double f = 0;
    for (const Gemm& g : gemms_) f += 2.0 * g.m * g.n * g.k;
    return f;
  }
  void run() {
    for (const Gemm& g : gemms_) {
      const int lda = g.ta == CblasNoTrans ? g.k : g.m;
      const int ldb = g.tb == CblasNoTrans ? g.n : g.k;
      // beta = 1 as in the model (bias pre-filled output, accumulated weight gradients).
      cblas_sgemm(CblasRowMajor, g.ta, g.tb, g.m, g.n, g.k, 1.0f, a_.data(), lda, b_.data(), ldb, 1.0f,
                  c_.data(), g.n);
    }
  }
  size_t bytes() const { return 4 * (a_.size() + b_.size() + c_.size()); }
  size_t calls() const { return gemms_.size(); }

 private:
  std::vector<Gemm> gemms_;
  std::vector<float> a_, b_, c_;
};

int usage(const char* why) {
  std::fprintf(stderr, "bench_gemm: %s\nusage: bench_gemm [PRESET] [--batch B] [--seq T] [--reps R]\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);
    std::perror("bench_gemm: re-exec with OMP_WAIT_POLICY=passive failed; going on with the default");
  }
  std::string name = "124M";
  int B = 4, T = 64, reps = 3;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (a == "--batch") {
      B = next();
    } else if (a == "--seq") {
      T = next();
    } else if (a == "--reps") {
      reps = next();
    } else if (a == "-h" || a == "--help") {
      return usage("GPT-2 forward+backward GFLOP/s against OpenBLAS sgemm on the same shapes");
    } else {
      name = a;
    }
  }
  const auto config = zt::model::preset(name);
  if (!config) return usage(("unknown preset '" + name + "' (tiny, 124M, 350M, 774M, 1.5B)").c_str());
  if (reps < 1) return usage("--reps must be at least 1");
  if (zt::Status s = zt::model::Workspace::check(*config, B, T); !s.ok()) return usage(s.message().c_str());
  const int N = B * T;

  const size_t n = (size_t)zt::model::num_params(*config);
  std::vector<float> params(n), grads(n, 0.0f);
  zt::model::init_params(*config, 1, params.data());
  zt::model::Workspace ws(*config, B, T, false, /*head_rows_per_chunk=*/N);
  std::vector<int32_t> tokens((size_t)N), targets((size_t)N);
  std::mt19937 rng(3);
  for (int i = 0; i < N; i++) {
    tokens[(size_t)i] = (int32_t)(rng() % (uint32_t)config->vocab);
    targets[(size_t)i] = (int32_t)(rng() % (uint32_t)config->vocab);
  }
  GemmBaseline base_fwd(model_gemms(*config, N, false)), base_fb(model_gemms(*config, N, true));
  const zt::model::FlopCount model_flops = zt::model::flops(*config, B, T);

  std::printf("bench_gemm: GPT-2 %s (%s), B=%d T=%d (%d tokens)\n", name.c_str(),
              zt::model::describe(*config).c_str(), B, T, N);
  std::printf("  threads: OpenBLAS %d, OpenMP %d (OMP_WAIT_POLICY=%s)\n", openblas_get_num_threads(),
              omp_get_max_threads(), std::getenv("OMP_WAIT_POLICY"));
  const size_t kept_checkpointed = zt::model::Workspace(*config, B, T, true, N).bytes_kept();
  std::printf("  parameters %s (%s fp32); workspace %s (kept for the backward %s, %s with activation "
              "checkpointing); sgemm scratch %s\n",
              zt::format_count((double)n).c_str(), zt::format_bytes(4.0 * (double)n).c_str(),
              zt::format_bytes((double)ws.bytes()).c_str(), zt::format_bytes((double)ws.bytes_kept()).c_str(),
              zt::format_bytes((double)kept_checkpointed).c_str(), zt::format_bytes((double)base_fb.bytes()).c_str());
  std::printf("  work: weight GEMMs %.2f GFLOP forward, %.2f GFLOP forward+backward (%zu sgemm calls); "
              "attention %.3f GFLOP forward, not in the ratio\n",
              base_fwd.flops() / 1e9, base_fb.flops() / 1e9, base_fb.calls(), model_flops.attention / 1e9);
  if (std::abs(base_fwd.flops() - model_flops.matmul) > 1e-6 * model_flops.matmul) {
    std::fprintf(stderr, "bench_gemm: the GEMM list (%.6g FLOP) disagrees with zt::model::flops (%.6g)\n",
                 base_fwd.flops(), model_flops.matmul);
    return 1;
  }

  // Warm-up: first touches of every buffer, OpenBLAS's and OpenMP's thread pools.
  base_fb.run();
  zt::model::forward_backward(ws, params.data(), tokens.data(), targets.data(), grads.data());

  double t_base_fwd = 1e30, t_model_fwd = 1e30, t_base_fb = 1e30, t_model_fb = 1e30;
  float loss = 0;
  for (int r = 0; r < reps; r++) {
    auto t0 = Clock::now();
    base_fwd.run();
    t_base_fwd = std::min(t_base_fwd, seconds_since(t0));
    t0 = Clock::now();
    loss = zt::model::forward(ws, params.data(), tokens.data(), targets.data());
    t_model_fwd = std::min(t_model_fwd, seconds_since(t0));
    t0 = Clock::now();
    base_fb.run();
    t_base_fb = std::min(t_base_fb, seconds_since(t0));
    t0 = Clock::now();
    zt::model::forward_backward(ws, params.data(), tokens.data(), targets.data(), grads.data());
    t_model_fb = std::min(t_model_fb, seconds_since(t0));
  }

  auto line = [](const char* what, double flops, double t_base, double t_model) {
    const double g_base = flops / t_base / 1e9, g_model = flops / t_model / 1e9;
    std::printf("  %-17s sgemm %8.1f ms %7.1f GFLOP/s | model %8.1f ms %7.1f GFLOP/s | model/sgemm %5.1f%%\n",
                what, t_base * 1e3, g_base, t_model * 1e3, g_model, 100.0 * g_model / g_base);
  };
  std::printf("  best of %d repetitions (loss %.4f):\n", reps, loss);
  line("forward", base_fwd.flops(), t_base_fwd, t_model_fwd);
  line("forward+backward", base_fb.flops(), t_base_fb, t_model_fb);
  std::printf("  target: forward+backward model/sgemm >= 50%%\n");
  return 0;
}
