// bench/bench_landing.cpp: a gradient partition landing on the host under optimizer offload
// (zero/engine.cpp finish_offload): the compute-dtype copy from the device widened to the fp32
// partition and its sum of squares taken for the global norm. Ours: widen_and_sum_squares, one
// pass (core/backend.h). Baseline, the same run: what the engine did before, HostOps convert()
// then sum_squares(), two passes. Both give the same values and the same sum (checked here, and by
// tests/trainer/core_test.cpp); printed: time, GB/s over the bytes each must touch at least (bf16
// in 2 B + fp32 out 4 B per element), and ours/baseline. Best of R interleaved repetitions.
//   bench_landing [--numel N (default 38.6M: GPT-2 124M's embeddings)] [--reps R] [--dtype bf16|fp16]
// Not a test: it never fails on a number.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/backend.h"

using namespace zt::trainer;

namespace {

double seconds_of(const std::chrono::steady_clock::time_point& a) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  zt::bench::Options opt(argc, argv, "bench_landing [--numel N] [--reps R] [--dtype bf16|fp16]");
  // GPT-2 124M's token embeddings by default: the largest partition, landed last.
  const int64_t n = opt.integer("--numel", 50257 * 768, 1);
  const int reps = int(opt.integer("--reps", 7, 1, 100000));
  const DType t = opt.text("--dtype", "bf16", {"bf16", "fp16"}) == "fp16" ? DType::F16 : DType::BF16;
  opt.done();
  if (n < 1 || reps < 1) {
    std::fprintf(stderr, "bench_landing: --numel and --reps must be positive\n");
    return 2;
  }
  const size_t count = static_cast<size_t>(n);
  std::vector<float> values(count);
  for (int64_t i = 0; i < n; ++i) values[size_t(i)] = float((i * 2654435761u) % 20001) * 1e-4f - 1.0f;
  std::vector<uint16_t> low(count);
  host_ops().convert(low.data(), t, values.data(), DType::F32, n);
  std::vector<float> a(count), b(count);
  // First touch of the outputs on every thread, as the engine's long-lived partitions are.
  host_ops().convert(a.data(), DType::F32, low.data(), t, n);
  host_ops().convert(b.data(), DType::F32, low.data(), t, n);

  double best_two = 1e30, best_one = 1e30, sum_two = 0, sum_one = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    host_ops().convert(a.data(), DType::F32, low.data(), t, n);
    sum_two = host_ops().sum_squares(a.data(), n);
    best_two = std::min(best_two, seconds_of(t0));
    t0 = std::chrono::steady_clock::now();
    sum_one = widen_and_sum_squares(b.data(), low.data(), t, n);
    best_one = std::min(best_one, seconds_of(t0));
  }
  const bool same = sum_one == sum_two && std::memcmp(a.data(), b.data(), size_t(n) * 4) == 0;
  const double bytes = double(n) * 6;
  std::printf("bench_landing: %lld %s values widened to fp32 and summed (%.1f MB in, %.1f MB out), %d threads, best of %d\n",
              (long long)n, std::string(dtype_name(t)).c_str(), double(n) * 2 / 1e6, double(n) * 4 / 1e6,
              omp_get_max_threads(), reps);
  std::printf("  %-40s %9.2f ms %8.2f GB/s\n", "baseline: convert() then sum_squares()", best_two * 1e3,
              bytes / best_two / 1e9);
  std::printf("  %-40s %9.2f ms %8.2f GB/s\n", "ours: widen_and_sum_squares()", best_one * 1e3, bytes / best_one / 1e9);
  std::printf("  ours/baseline time %.2fx; same values and sum: %s\n", best_one / best_two, same ? "yes" : "NO");
  return same ? 0 : 1;
}
