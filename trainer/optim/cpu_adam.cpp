// optim/cpu_adam.cpp: see cpu_adam.h. The scalar kernel (baseline ISA), the run-time ISA choice and
// the OpenMP split of a shard: chunks taken in turn by whichever thread is free (dynamic), or one
// contiguous range per thread (static).
#include "optim/cpu_adam.h"

#include <omp.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "optim/cpu_adam_kernel.h"

namespace zt::optim {
namespace detail {
namespace {

struct Scalar {
  using reg = float;
  static constexpr int W = 1;
  static reg load(const float* x) { return *x; }
  static void store(float* x, reg a) { *x = a; }
  static void stream(float* x, reg a) { *x = a; }
  static reg set1(float a) { return a; }
  static reg mul(reg a, reg b) { return a * b; }
  static reg add(reg a, reg b) { return a + b; }
  static reg sub(reg a, reg b) { return a - b; }
  static reg div(reg a, reg b) { return a / b; }
  static reg sqrt(reg a) { return std::sqrt(a); }
  static reg load_bf16(const uint16_t* x) { return widen_bf16(*x); }
  static reg load_fp16(const uint16_t* x) { return widen_fp16(*x); }
  // No non-temporal stores here: NT is ignored, and nothing needs fencing.
  template <bool NT>
  static void store_bf16(uint16_t* out, reg a) { *out = round_to_bf16(a); }
  template <bool NT>
  static void store_fp16(uint16_t* out, reg a) { *out = round_to_fp16(a); }
  static void fence() {}
};

}  // namespace

void adam_kernel_scalar(AdamIO io, GradRef g, uint16_t* low_out, int64_t n, const AdamConsts& c, LowDType low) {
  adam_dispatch<Scalar>(io, g, low_out, n, c, low);
}

}  // namespace detail

namespace {

constexpr int64_t kParallelMin = int64_t(1) << 16;  // below this a parallel region costs more than it saves
constexpr int64_t kSplitAlign = 64;                  // thread ranges start at multiples of 64 elements
// A dynamic chunk: 16Ki elements (448 KiB of p, g, m, v in fp32), a multiple of kSplitAlign.
constexpr int64_t kDynamicChunk = int64_t(1) << 14;

bool cpu_has(CpuAdamIsa isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  switch (isa) {
    case CpuAdamIsa::Scalar: return true;
    case CpuAdamIsa::Avx2: {
      // F16C from CPUID (leaf 1, ECX): clang 14's __builtin_cpu_supports does not know "f16c".
      unsigned a = 0, b = 0, c = 0, d = 0;
      return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    }
    case CpuAdamIsa::Avx512: return __builtin_cpu_supports("avx512f");
  }
  return false;
#else
  return isa == CpuAdamIsa::Scalar;
#endif
}

bool compiled(CpuAdamIsa isa) {
  switch (isa) {
    case CpuAdamIsa::Scalar: return true;
    case CpuAdamIsa::Avx2: return ZT_OPTIM_HAVE_AVX2 != 0;
    case CpuAdamIsa::Avx512: return ZT_OPTIM_HAVE_AVX512 != 0;
  }
  return false;
}

// ZT_CPU_ADAM_ISA if it names a supported ISA (a warning otherwise), else the best one.
CpuAdamIsa default_isa() {
  static const CpuAdamIsa isa = [] {
    const CpuAdamIsa best = cpu_adam_best_isa();
    const char* env = std::getenv("ZT_CPU_ADAM_ISA");
    if (!env || !*env) return best;
    const std::string_view name(env);
    for (CpuAdamIsa i : {CpuAdamIsa::Scalar, CpuAdamIsa::Avx2, CpuAdamIsa::Avx512}) {
      if (name != cpu_adam_isa_name(i)) continue;
      if (cpu_adam_isa_supported(i)) return i;
      std::fprintf(stderr, "zt: ZT_CPU_ADAM_ISA=%s: this CPU cannot run it; using %s\n", env,
                   cpu_adam_isa_name(best));
      return best;
    }
    std::fprintf(stderr, "zt: ZT_CPU_ADAM_ISA=%s: not one of scalar, avx2, avx512; using %s\n", env,
                 cpu_adam_isa_name(best));
    return best;
  }();
  return isa;
}

std::atomic<int> g_forced{-1};  // a CpuAdamIsa, or -1: the default

// ZT_CPU_ADAM_SCHEDULE if it names a schedule (a warning otherwise), else dynamic.
CpuAdamSchedule default_schedule() {
  static const CpuAdamSchedule sched = [] {
    const char* env = std::getenv("ZT_CPU_ADAM_SCHEDULE");
    if (!env || !*env) return CpuAdamSchedule::Dynamic;
    const std::string_view name(env);
    for (CpuAdamSchedule s : {CpuAdamSchedule::Static, CpuAdamSchedule::Dynamic})
      if (name == cpu_adam_schedule_name(s)) return s;
    std::fprintf(stderr, "zt: ZT_CPU_ADAM_SCHEDULE=%s: not one of static, dynamic; using dynamic\n", env);
    return CpuAdamSchedule::Dynamic;
  }();
  return sched;
}

std::atomic<int> g_forced_schedule{-1};  // a CpuAdamSchedule, or -1: the default

detail::AdamKernel kernel_for(CpuAdamIsa isa) {
  switch (isa) {
#if ZT_OPTIM_HAVE_AVX512
    case CpuAdamIsa::Avx512: return detail::adam_kernel_avx512;
#endif
#if ZT_OPTIM_HAVE_AVX2
    case CpuAdamIsa::Avx2: return detail::adam_kernel_avx2;
#endif
    default: return detail::adam_kernel_scalar;
  }
}

}  // namespace

const char* cpu_adam_isa_name(CpuAdamIsa isa) {
  switch (isa) {
    case CpuAdamIsa::Scalar: return "scalar";
    case CpuAdamIsa::Avx2: return "avx2";
    case CpuAdamIsa::Avx512: return "avx512";
  }
  return "?";
}

bool cpu_adam_isa_supported(CpuAdamIsa isa) { return compiled(isa) && cpu_has(isa); }

CpuAdamIsa cpu_adam_best_isa() {
  static const CpuAdamIsa best = cpu_adam_isa_supported(CpuAdamIsa::Avx512) ? CpuAdamIsa::Avx512
                                 : cpu_adam_isa_supported(CpuAdamIsa::Avx2) ? CpuAdamIsa::Avx2
                                                                            : CpuAdamIsa::Scalar;
  return best;
}

CpuAdamIsa cpu_adam_active_isa() {
  const int forced = g_forced.load(std::memory_order_relaxed);
  return forced >= 0 ? CpuAdamIsa(forced) : default_isa();
}

const char* cpu_adam_isa() { return cpu_adam_isa_name(cpu_adam_active_isa()); }

void cpu_adam_force_isa(CpuAdamIsa isa) {
  if (!cpu_adam_isa_supported(isa))
    throw std::invalid_argument(std::string("cpu_adam_force_isa: this CPU (or build) cannot run ") +
                                cpu_adam_isa_name(isa) + "; the best it has is " +
                                cpu_adam_isa_name(cpu_adam_best_isa()));
  g_forced.store(int(isa), std::memory_order_relaxed);
}

void cpu_adam_unforce_isa() { g_forced.store(-1, std::memory_order_relaxed); }

const char* cpu_adam_schedule_name(CpuAdamSchedule s) {
  return s == CpuAdamSchedule::Static ? "static" : s == CpuAdamSchedule::Dynamic ? "dynamic" : "?";
}

CpuAdamSchedule cpu_adam_active_schedule() {
  const int forced = g_forced_schedule.load(std::memory_order_relaxed);
  return forced >= 0 ? CpuAdamSchedule(forced) : default_schedule();
}

void cpu_adam_force_schedule(CpuAdamSchedule s) { g_forced_schedule.store(int(s), std::memory_order_relaxed); }

void cpu_adam_unforce_schedule() { g_forced_schedule.store(-1, std::memory_order_relaxed); }

AdamConsts adam_consts(const AdamParams& hp, int64_t step) {
  if (step < 1) throw std::invalid_argument("AdamW: step counts from 1, got " + std::to_string(step));
  // Exactly as zt::model::adamw_step forms them: in double, rounded once to fp32.
  const double bias_correction1 = 1.0 - std::pow(hp.beta1, (double)step);
  const double bias_correction2 = 1.0 - std::pow(hp.beta2, (double)step);
  AdamConsts c;
  c.step_size = (float)(hp.lr / bias_correction1);
  c.bias_correction2_sqrt = (float)std::sqrt(bias_correction2);
  c.decay = (float)(1.0 - hp.lr * hp.weight_decay);
  c.beta1 = (float)hp.beta1;
  c.beta2 = (float)hp.beta2;
  c.eps = (float)hp.eps;
  c.one_minus_beta1 = (float)(1.0 - hp.beta1);
  c.one_minus_beta2 = (float)(1.0 - hp.beta2);
  return c;
}

namespace {

// The one driver of every AdamW here: checks, then the ISA's kernel over [0, n) of `io`, split among
// the OpenMP threads as the schedule says.
void adamw_io(const char* fn, const detail::AdamIO& io, const void* grads, GradDType grad_t, float grad_scale, int64_t n,
              const AdamParams& hp, int64_t step, void* low_out, LowDType low) {
  if (step < 1) throw std::invalid_argument(std::string(fn) + ": step counts from 1, got " + std::to_string(step));
  if (low != LowDType::None && low_out == nullptr)
    throw std::invalid_argument(std::string(fn) + ": a bf16/fp16 output was asked for but low_out is null");
  if (grad_t != GradDType::F32 && grad_t != GradDType::BF16 && grad_t != GradDType::F16)
    throw std::invalid_argument(std::string(fn) + ": gradient type " + std::to_string(int(grad_t)) +
                                " is not fp32, bf16 or fp16");
  if (n <= 0) return;
  const AdamConsts c = adam_consts(hp, step);

  const detail::AdamKernel kernel = kernel_for(cpu_adam_active_isa());
  uint16_t* lo = low == LowDType::None ? nullptr : static_cast<uint16_t*>(low_out);
  const size_t gsize = grad_t == GradDType::F32 ? 4 : 2;
  const auto* gbytes = static_cast<const unsigned char*>(grads);
  if (n < kParallelMin || omp_get_max_threads() == 1 || omp_in_parallel()) {
    kernel(io, {grads, grad_t, grad_scale}, lo, n, c, low);
    return;
  }
  // [begin, end) on the calling thread. Range boundaries are multiples of 64 elements, so an aligned
  // low_out stays 32-byte aligned in every range (and aligned fp32 outputs 64-byte aligned).
  // Element-wise: no split changes any result.
  auto range = [&](int64_t begin, int64_t end) {
    kernel(io.at(begin), {gbytes + size_t(begin) * gsize, grad_t, grad_scale}, lo ? lo + begin : nullptr, end - begin,
           c, low);
  };
  if (cpu_adam_active_schedule() == CpuAdamSchedule::Static) {
    // One contiguous range per thread (each a stream the prefetchers follow).
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t blocks = (n + kSplitAlign - 1) / kSplitAlign;
      const int64_t begin = std::min(n, blocks * t / threads * kSplitAlign);
      const int64_t end = std::min(n, blocks * (t + 1) / threads * kSplitAlign);
      if (end > begin) range(begin, end);
    }
    return;
  }
  // Chunks of kDynamicChunk elements, each taken by the next thread free: a thread the OS preempts
  // (another team beside this one on the same cores) delays the pass by one chunk, not by its whole
  // share, since the others take its remaining chunks.
  const int64_t chunks = (n + kDynamicChunk - 1) / kDynamicChunk;
  std::atomic<int64_t> next{0};
#pragma omp parallel num_threads(int(std::min<int64_t>(chunks, omp_get_max_threads())))
  {
    for (int64_t k; (k = next.fetch_add(1, std::memory_order_relaxed)) < chunks;)
      range(k * kDynamicChunk, std::min(n, (k + 1) * kDynamicChunk));
  }
}

}  // namespace

void cpu_adamw_step_grads(float* params, const void* grads, GradDType grad_t, float grad_scale, float* m, float* v,
                          int64_t n, const AdamParams& hp, int64_t step, void* low_out, LowDType low) {
  const char* fn = grad_t == GradDType::F32 && grad_scale == 1.0f ? "cpu_adamw_step" : "cpu_adamw_step_grads";
  adamw_io(fn, detail::in_place(params, m, v), grads, grad_t, grad_scale, n, hp, step, low_out, low);
}

void cpu_adamw_step_grads_into(const float* p_in, const float* m_in, const float* v_in, float* p_out, float* m_out,
                               float* v_out, const void* grads, GradDType grad_t, float grad_scale, int64_t n,
                               const AdamParams& hp, int64_t step, void* low_out, LowDType low) {
  adamw_io("cpu_adamw_step_grads_into", {p_in, m_in, v_in, p_out, m_out, v_out}, grads, grad_t, grad_scale, n, hp,
           step, low_out, low);
}

void cpu_adamw_step(float* params, const float* grads, float* m, float* v, int64_t n, const AdamParams& hp,
                    int64_t step, void* low_out, LowDType low) {
  cpu_adamw_step_grads(params, grads, GradDType::F32, 1.0f, m, v, n, hp, step, low_out, low);
}

}  // namespace zt::optim
