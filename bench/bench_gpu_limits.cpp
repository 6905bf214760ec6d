// bench/bench_gpu_limits.cpp: the physical limits of this machine that bound a ZeRO-3 offload step,
// measured in the same session as the training runs they are compared with (bench/gpu_compare):
//   GPU   pinned H2D and D2H bandwidth (cudaHostAlloc + cudaMemcpyAsync, 4 MiB..1 GiB, cudaEvent
//         timing, best of N), both directions at once (two streams), pageable for contrast, device
//         memcpy (HBM), and bf16 GEMM TFLOP/s through cublasGemmEx (bf16 in, fp32 compute) at GPT-2's
//         shapes (forward, dinp and dw of qkv, attention projection, fc, mlp projection and the LM
//         head, N = B*T tokens) for each preset, plus a large square GEMM.
//   CPU   the fp32 CPU AdamW of the offload path (optim::cpu_adamw_step with the fused bf16 output, and
//         the same on bf16 gradients, cpu_adamw_step_grads, as --grad-partition-dtype compute runs it; all
//         OpenMP threads, each on the pages it first touched: the static split) in parameters/s, then
//         the same with the default dynamic chunks and with three quarters of the threads (the
//         background AdamW's default beside the step), and host memory bandwidth (a multi-threaded
//         memcpy and a STREAM triad over arrays of a few GiB).
// Without a usable GPU it prints "bench_gpu_limits: skipped: <why>" and still measures the CPU side;
// it exits 0 either way (it is not a test and never fails on a number).
//
// Units: GiB/s = 2^30 bytes/s; TFLOP/s = 1e12 flop/s; GEMM flops 2*m*n*k. Bytes counted: a copy
// counts its size once (what crosses the link); a host memcpy counts read + write (STREAM's "copy");
// the triad 3 arrays (no write-allocate); AdamW 30 B/param (read p, g, m, v; write p, m, v, bf16 p).
//
// Usage: bench_gpu_limits [--json FILE] [--quick] [--reps N] [--tokens N] [--presets 124M,350M,...]
//                         [--host-bytes N] [--adam-params N] [--device N] [--no-gemm]
//   --quick        small sizes and few repetitions (a smoke run: not a measurement)
//   --tokens N     N = B*T of the GEMM shapes (default 8192)
//   --host-bytes N bytes per host array (default 1 GiB: memcpy moves 2 GiB, the triad 3 GiB)
//   --adam-params  parameters of the AdamW shard (default 128Mi: 2 GiB of fp32 p, g, m, v)
// --json FILE writes every figure (bytes/s, flop/s, params/s as plain numbers) for bench/gpu_compare.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "cuda/memory_sources.h"
#include "cuda/runtime.h"
#include "zt/memory/numa.h"
#include "model/config.h"
#include "core/dtype_bits.h"
#include "optim/cpu_adam.h"

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using zt::cuda::check;

constexpr double kGiB = double(1ull << 30);
constexpr size_t kMiB = size_t(1) << 20;

struct Options {
  std::string json_path;
  bool quick = false;
  int reps = 5;
  int64_t tokens = 8192;
  std::vector<std::string> presets = {"124M", "350M", "774M", "1.5B"};
  size_t host_bytes = size_t(1) << 30;
  int64_t adam_params = int64_t(128) << 20;
  int device = 0;
  bool gemm = true;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string size_text(size_t bytes) {
  char b[32];
  if (bytes >= (size_t(1) << 30) && bytes % (size_t(1) << 30) == 0)
    std::snprintf(b, sizeof b, "%zu GiB", bytes >> 30);
  else
    std::snprintf(b, sizeof b, "%zu MiB", bytes >> 20);
  return b;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

// ------------------------------------------------------------------------------------------ CPU

using zt::bench::fill;
using zt::bench::HostArray;

void parallel_memcpy(void* dst, const void* src, size_t bytes) {
  const int T = omp_get_max_threads();
#pragma omp parallel num_threads(T)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const size_t chunk = (bytes / size_t(nt) + 63) / 64 * 64;
    const size_t lo = std::min(bytes, chunk * size_t(t)), hi = std::min(bytes, lo + chunk);
    if (hi > lo) std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo, hi - lo);
  }
}

void triad(float* a, const float* b, const float* c, float s, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}

json measure_host_memory(const Options& o) {
  const size_t bytes = o.host_bytes / 64 * 64;
  const int64_t n = int64_t(bytes / 4);
  HostArray a(bytes), b(bytes), c(bytes);
  fill(a.f(), n, 1.0f, 1);
  fill(b.f(), n, 1.0f, 2);
  fill(c.f(), n, 1.0f, 3);
  double best_copy = 1e30, best_triad = 1e30;
  for (int r = -1; r < o.reps; r++) {  // r = -1: warm-up
    auto t0 = Clock::now();
    parallel_memcpy(a.ptr, b.ptr, bytes);
    const double s_copy = seconds_since(t0);
    t0 = Clock::now();
    triad(a.f(), b.f(), c.f(), 0.5f, n);
    const double s_triad = seconds_since(t0);
    if (r >= 0) {
      best_copy = std::min(best_copy, s_copy);
      best_triad = std::min(best_triad, s_triad);
    }
  }
  const double copy_bps = 2.0 * double(bytes) / best_copy, triad_bps = 3.0 * double(bytes) / best_triad;
  std::printf("host memory (%d threads, arrays of %s):\n", omp_get_max_threads(), size_text(bytes).c_str());
  std::printf("  %-44s %9.2f GiB/s  (read + write counted)\n", "memcpy", copy_bps / kGiB);
  std::printf("  %-44s %9.2f GiB/s  (3 arrays counted)\n", "STREAM triad a = b + s*c", triad_bps / kGiB);
  return json{{"threads", omp_get_max_threads()},
              {"array_bytes", bytes},
              {"memcpy_bytes_per_s", copy_bps},
              {"triad_bytes_per_s", triad_bps},
              {"bytes_per_s", std::max(copy_bps, triad_bps)}};
}

struct Pinned {
  explicit Pinned(size_t bytes) {
    check(cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault), "cudaHostAlloc");
    std::memset(ptr, 1, bytes);  // touch every page
  }
  ~Pinned() {
    if (ptr) (void)cudaFreeHost(ptr);
  }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  void* ptr = nullptr;
};

// Host memory mapped with its pages interleaved over the NUMA nodes (zt/memory/numa.h); when
// `pin`, a region of zt train --pinned-numa interleave's own source (mapped, then cudaHostRegister).
struct Interleaved {
  Interleaved(size_t bytes, bool pin) : bytes(bytes) {
    if (pin) {
      source = std::make_unique<zt::cuda::CudaPinnedSource>(zt::memory::kNoLimit, zt::memory::PagePlacement::Interleave);
      ptr = source->allocate(bytes);
    } else {
      ptr = zt::memory::map_pages(bytes, zt::memory::PagePlacement::Interleave);
    }
    if (!ptr) throw std::runtime_error("out of memory (" + std::to_string(bytes) + " bytes)");
  }
  ~Interleaved() {
    if (source) source->release(ptr, bytes);
    else zt::memory::unmap_pages(ptr, bytes);
  }
  Interleaved(const Interleaved&) = delete;
  Interleaved& operator=(const Interleaved&) = delete;
  size_t bytes;
  std::unique_ptr<zt::cuda::CudaPinnedSource> source;
  void* ptr = nullptr;
};

// "node 0 100%" / "node 0 50%, node 1 50%": where the pages of [ptr, ptr + bytes) lie now.
std::string where_pages_lie(const void* ptr, size_t bytes) {
  std::map<int, int64_t> by_node;
  try {
    by_node = zt::memory::pages_by_node(ptr, bytes);
  } catch (const std::exception& e) {
    return e.what();
  }
  int64_t total = 0;
  for (const auto& [node, pages] : by_node) total += pages;
  std::string s;
  for (const auto& [node, pages] : by_node) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s %.0f%%", s.empty() ? "" : ", ",
                  node == -1 ? "not resident" : node < 0 ? "unknown" : ("node " + std::to_string(node)).c_str(),
                  100.0 * double(pages) / double(total));
    s += buf;
  }
  return s;
}

json measure_cpu_adam(const Options& o, bool gpu) {
  const int64_t n = o.adam_params;
  HostArray p(size_t(n) * 4), g(size_t(n) * 4), m(size_t(n) * 4), v(size_t(n) * 4), low(size_t(n) * 2);
  fill(p.f(), n, 1.0f, 11);
  fill(g.f(), n, 0.1f, 12);
  fill(m.f(), n, 0.01f, 13);
  fill(v.f(), n, 0.0f, 14);
  std::memset(low.ptr, 0, size_t(n) * 2);
  const zt::optim::AdamParams hp{3e-3, 0.9, 0.95, 1e-8, 0.0};  // zt train's defaults
  int64_t step = 1;
  // Parameters/s of `one_step` (one AdamW step of the n parameters): the best of o.reps after one untimed.
  auto rate = [&](const std::function<void()>& one_step) {
    double best = 1e30;
    for (int r = -1; r < o.reps; r++) {
      const auto t0 = Clock::now();
      one_step();
      const double s = seconds_since(t0);
      if (r >= 0) best = std::min(best, s);
    }
    return double(n) / best;
  };
  // The bf16-gradient step (zt train --grad-partition-dtype compute: 28 B/param) on the given arrays.
  auto bf16_step = [&](float* pp, const void* gg, float* mm, float* vv, void* lo) {
    return [&, pp, gg, mm, vv, lo] {
      zt::optim::cpu_adamw_step_grads(pp, gg, zt::optim::GradDType::BF16, 1.0f, mm, vv, n, hp, step++, lo,
                                      zt::optim::LowDType::BF16);
    };
  };
  // The bound's rate: AdamW alone at its best. These arrays were first touched by fill()'s static
  // split, so AdamW runs the same static split here (each thread on its own pages, local on a host
  // of several NUMA nodes); its default schedule (dynamic chunks, for a pass that shares the cores
  // with the step) is measured after it.
  zt::optim::cpu_adam_force_schedule(zt::optim::CpuAdamSchedule::Static);
  const double pps = rate([&] {
    zt::optim::cpu_adamw_step(p.f(), g.f(), m.f(), v.f(), n, hp, step++, low.ptr, zt::optim::LowDType::BF16);
  });
  HostArray gl(size_t(n) * 2);
  for (int64_t i = 0; i < n; i++) reinterpret_cast<uint16_t*>(gl.ptr)[i] = zt::trainer::bits::float_to_bf16(g.f()[i]);
  const double pps_low = rate(bf16_step(p.f(), gl.ptr, m.f(), v.f(), low.ptr));
  zt::optim::cpu_adam_unforce_schedule();
  const double pps_low_dynamic = rate(bf16_step(p.f(), gl.ptr, m.f(), v.f(), low.ptr));
  // With three quarters of the threads (the background AdamW's default beside the step): near the
  // rate with all of them where memory bandwidth is the limit, near 3/4 of it where each core's is.
  const int all_threads = omp_get_max_threads(), three_quarters = std::max(1, all_threads * 3 / 4);
  omp_set_num_threads(three_quarters);
  const double pps_low_3q = rate(bf16_step(p.f(), gl.ptr, m.f(), v.f(), low.ptr));
  omp_set_num_threads(all_threads);
  const std::vector<int> nodes = zt::memory::numa_nodes();
  std::printf("CPU AdamW (optim::cpu_adamw_step, %s, %d threads, %lld params, fused bf16 output):\n",
              zt::optim::cpu_adam_isa(), omp_get_max_threads(), (long long)n);
  std::printf("  %-44s %9.1f Mparam/s  (%.2f GiB/s at 30 B/param)\n", "AdamW step, fp32 gradients", pps / 1e6,
              pps * 30.0 / kGiB);
  std::printf("  %-44s %9.1f Mparam/s  (%.2f GiB/s at 28 B/param)\n", "AdamW step, bf16 gradients", pps_low / 1e6,
              pps_low * 28.0 / kGiB);
  std::printf("  %-44s %9.1f Mparam/s\n", "... its default schedule (dynamic chunks)", pps_low_dynamic / 1e6);
  const std::string label_3q =
      "... " + std::to_string(three_quarters) + (three_quarters == 1 ? " thread" : " threads") + " (dynamic chunks)";
  std::printf("  %-44s %9.1f Mparam/s\n", label_3q.c_str(), pps_low_3q / 1e6);
  json out{{"isa", zt::optim::cpu_adam_isa()},
           {"threads", omp_get_max_threads()},
           {"params", n},
           {"bytes_per_param", 30},
           {"params_per_s", pps},
           {"bytes_per_s", pps * 30.0},
           {"bf16_grads_params_per_s", pps_low},
           {"schedule", "static"},
           {"bf16_grads_dynamic_params_per_s", pps_low_dynamic},
           {"three_quarter_threads", three_quarters},
           {"bf16_grads_three_quarter_threads_params_per_s", pps_low_3q},
           {"numa_nodes", nodes.size()},
           {"pages_first_touched_by_each_thread", where_pages_lie(p.ptr, size_t(n) * 4)}};
  // Where the pages lie. The arrays above were first touched by the OpenMP threads that run AdamW,
  // in the same static split, so each thread's pages are on its own NUMA node; the trainer's
  // optimizer state is pinned host memory (cudaHostAlloc) written first by the rank thread alone.
  // The same bf16-gradient step on arrays first touched by one thread, and (with a GPU) on
  // cudaHostAlloc memory: on a host of one NUMA node the three should agree.
  auto rate_on = [&](float* pp, void* gg, float* mm, float* vv, void* lo) {
    fill(pp, n, 1.0f, 11);
    std::memcpy(gg, gl.ptr, size_t(n) * 2);
    fill(mm, n, 0.01f, 13);
    fill(vv, n, 0.0f, 14);
    return rate(bf16_step(pp, gg, mm, vv, lo));
  };
  {
    HostArray p1(size_t(n) * 4), g1(size_t(n) * 2), m1(size_t(n) * 4), v1(size_t(n) * 4), l1(size_t(n) * 2);
    for (void* x : {p1.ptr, m1.ptr, v1.ptr}) std::memset(x, 0, size_t(n) * 4);  // first touch: this thread
    for (void* x : {g1.ptr, l1.ptr}) std::memset(x, 0, size_t(n) * 2);
    const double r1 = rate_on(p1.f(), g1.ptr, m1.f(), v1.f(), l1.ptr);
    std::printf("  %-44s %9.1f Mparam/s\n", "... on pages first touched by one thread", r1 / 1e6);
    out["bf16_grads_one_thread_touched_params_per_s"] = r1;
    out["pages_first_touched_by_one_thread"] = where_pages_lie(p1.ptr, size_t(n) * 4);
  }
  // zt train --pinned-numa interleave's pages: round robin over the nodes, whoever touches them.
  // Its rate under `label` and JSON keys bf16_grads_<key>_params_per_s and pages_<key>, or why not.
  auto measure_interleaved = [&](bool pin, const char* label, const std::string& key) {
    try {
      Interleaved pi(size_t(n) * 4, pin), gi(size_t(n) * 2, pin), mi(size_t(n) * 4, pin), vi(size_t(n) * 4, pin),
          li(size_t(n) * 2, pin);
      const double r = rate_on(static_cast<float*>(pi.ptr), gi.ptr, static_cast<float*>(mi.ptr),
                               static_cast<float*>(vi.ptr), li.ptr);
      std::printf("  %-44s %9.1f Mparam/s\n", label, r / 1e6);
      out["bf16_grads_" + key + "_params_per_s"] = r;
      out["pages_" + key] = where_pages_lie(pi.ptr, size_t(n) * 4);
    } catch (const std::exception& e) {
      std::printf("  %s: %s\n", label, e.what());
    }
  };
  measure_interleaved(false, "... on pages interleaved over the NUMA nodes", "interleaved");
  if (gpu) {
    {
      Pinned pp(size_t(n) * 4), gp(size_t(n) * 2), mp(size_t(n) * 4), vp(size_t(n) * 4), lp(size_t(n) * 2);
      const double r2 = rate_on(static_cast<float*>(pp.ptr), gp.ptr, static_cast<float*>(mp.ptr),
                                static_cast<float*>(vp.ptr), lp.ptr);
      std::printf("  %-44s %9.1f Mparam/s\n", "... on pinned memory (cudaHostAlloc)", r2 / 1e6);
      out["bf16_grads_pinned_params_per_s"] = r2;
      out["pages_pinned"] = where_pages_lie(pp.ptr, size_t(n) * 4);
    }
    measure_interleaved(true, "... on pinned interleaved pages (cudaHostRegister)", "pinned_interleaved");
  }
  std::printf("  (this process may use NUMA node%s %s; pages of", nodes.size() == 1 ? "" : "s",
              zt::memory::node_list_text(nodes).c_str());
  const char* sep = " ";
  for (const auto& [label, key] : {std::pair{"each thread's own", "pages_first_touched_by_each_thread"},
                                   {"one thread's", "pages_first_touched_by_one_thread"},
                                   {"cudaHostAlloc's", "pages_pinned"},
                                   {"interleaved", "pages_interleaved"},
                                   {"pinned interleaved", "pages_pinned_interleaved"}})
    if (out.contains(key)) std::printf("%s%s: %s", sep, label, out[key].get<std::string>().c_str()), sep = "; ";
  std::printf(")\n");
  return out;
}

// ------------------------------------------------------------------------------------------ GPU

struct Stream {
  Stream() { check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  ~Stream() {
    if (s) (void)cudaStreamDestroy(s);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t s = nullptr;
};

struct EventPair {
  EventPair() {
    check(cudaEventCreate(&a), "cudaEventCreate");
    check(cudaEventCreate(&b), "cudaEventCreate");
  }
  ~EventPair() {
    (void)cudaEventDestroy(a);
    (void)cudaEventDestroy(b);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  float ms() const {
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
    return t;
  }
  cudaEvent_t a = nullptr, b = nullptr;
};

// Best of `reps` timings (seconds) of `enqueue` on `stream`, after one warm-up.
double best_of(int reps, cudaStream_t stream, const std::function<void()>& enqueue) {
  EventPair ev;
  double best = 1e30;
  for (int r = -1; r < reps; r++) {
    check(cudaEventRecord(ev.a, stream), "cudaEventRecord");
    enqueue();
    check(cudaEventRecord(ev.b, stream), "cudaEventRecord");
    const double s = ev.ms() / 1e3;
    if (r >= 0) best = std::min(best, s);
  }
  return best;
}

json measure_transfers(const Options& o) {
  std::vector<size_t> sizes = {4 * kMiB, 16 * kMiB, 64 * kMiB, 256 * kMiB, 1024 * kMiB};
  if (o.quick) sizes = {4 * kMiB, 64 * kMiB};
  const size_t max_bytes = sizes.back();
  zt::cuda::DeviceBuffer d0(max_bytes), d1(max_bytes);
  check(cudaMemset(d0.get(), 0, max_bytes), "cudaMemset");
  check(cudaMemset(d1.get(), 0, max_bytes), "cudaMemset");
  Pinned h0(max_bytes), h1(max_bytes);
  Stream s0, s1;
  json out;
  std::printf("host <-> device copies (cudaMemcpyAsync, best of %d, cudaEvent timing):\n", o.reps);
  std::printf("  %-10s %14s %14s %14s %14s\n", "size", "H2D pinned", "D2H pinned", "H2D pageable", "D2H pageable");
  double peak_h2d = 0, peak_d2h = 0, peak_h2d_pageable = 0, peak_d2h_pageable = 0;
  json rows = json::array();
  std::vector<char> pageable(max_bytes, 1);  // touched: the copies below fault no pages in
  for (size_t bytes : sizes) {
    const double h2d = best_of(o.reps, s0.s, [&] {
      check(cudaMemcpyAsync(d0.get(), h0.ptr, bytes, cudaMemcpyHostToDevice, s0.s), "cudaMemcpyAsync H2D");
    });
    const double d2h = best_of(o.reps, s0.s, [&] {
      check(cudaMemcpyAsync(h1.ptr, d1.get(), bytes, cudaMemcpyDeviceToHost, s0.s), "cudaMemcpyAsync D2H");
    });
    // Pageable copies are staged by the driver through its own pinned buffer; timed on the host
    // clock around a synchronous copy (what the caller waits for).
    auto host_timed = [&](cudaMemcpyKind kind) {
      double best = 1e30;
      for (int r = -1; r < std::max(1, o.reps / 2); r++) {
        const auto t0 = Clock::now();
        if (kind == cudaMemcpyHostToDevice)
          check(cudaMemcpy(d0.get(), pageable.data(), bytes, kind), "cudaMemcpy H2D pageable");
        else
          check(cudaMemcpy(pageable.data(), d1.get(), bytes, kind), "cudaMemcpy D2H pageable");
        // A pageable H2D may return once the data is staged, before its DMA has finished.
        check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        const double s = seconds_since(t0);
        if (r >= 0) best = std::min(best, s);
      }
      return best;
    };
    const double h2d_pg = host_timed(cudaMemcpyHostToDevice), d2h_pg = host_timed(cudaMemcpyDeviceToHost);
    const double b = double(bytes);
    std::printf("  %-10s %9.2f GiB/s %9.2f GiB/s %9.2f GiB/s %9.2f GiB/s\n", size_text(bytes).c_str(), b / h2d / kGiB,
                b / d2h / kGiB, b / h2d_pg / kGiB, b / d2h_pg / kGiB);
    rows.push_back({{"bytes", bytes},
                    {"h2d_pinned_bytes_per_s", b / h2d},
                    {"d2h_pinned_bytes_per_s", b / d2h},
                    {"h2d_pageable_bytes_per_s", b / h2d_pg},
                    {"d2h_pageable_bytes_per_s", b / d2h_pg}});
    if (bytes >= 64 * kMiB || sizes.size() < 3) {
      peak_h2d = std::max(peak_h2d, b / h2d);
      peak_d2h = std::max(peak_d2h, b / d2h);
      peak_h2d_pageable = std::max(peak_h2d_pageable, b / h2d_pg);
      peak_d2h_pageable = std::max(peak_d2h_pageable, b / d2h_pg);
    }
  }
  // Both directions at once, on two streams (H100 has separate copy engines; the link is full duplex).
  const size_t bi = std::min(max_bytes, 256 * kMiB);
  const double s_bi = best_of(o.reps, s0.s, [&] {
    EventPair fork;
    check(cudaEventRecord(fork.a, s0.s), "cudaEventRecord");
    check(cudaStreamWaitEvent(s1.s, fork.a, 0), "cudaStreamWaitEvent");
    check(cudaMemcpyAsync(d0.get(), h0.ptr, bi, cudaMemcpyHostToDevice, s0.s), "cudaMemcpyAsync H2D");
    check(cudaMemcpyAsync(h1.ptr, d1.get(), bi, cudaMemcpyDeviceToHost, s1.s), "cudaMemcpyAsync D2H");
    check(cudaEventRecord(fork.b, s1.s), "cudaEventRecord");
    check(cudaStreamWaitEvent(s0.s, fork.b, 0), "cudaStreamWaitEvent");
  });
  const double bidir = 2.0 * double(bi) / s_bi;
  // Device memory: a device-to-device copy reads and writes every byte.
  const double s_d2d = best_of(o.reps, s0.s, [&] {
    check(cudaMemcpyAsync(d1.get(), d0.get(), max_bytes, cudaMemcpyDeviceToDevice, s0.s), "cudaMemcpyAsync D2D");
  });
  const double d2d = 2.0 * double(max_bytes) / s_d2d;
  std::printf("  %-44s %9.2f GiB/s  (H2D + D2H of %s each at once, both counted)\n", "pinned, both directions",
              bidir / kGiB, size_text(bi).c_str());
  std::printf("  %-44s %9.2f GiB/s  (read + write counted)\n", "device memcpy D2D", d2d / kGiB);
  std::printf("  peak pinned: H2D %.2f GiB/s, D2H %.2f GiB/s (sizes >= 64 MiB); pageable: H2D %.2f, D2H %.2f GiB/s\n",
              peak_h2d / kGiB, peak_d2h / kGiB, peak_h2d_pageable / kGiB, peak_d2h_pageable / kGiB);
  out["sizes"] = rows;
  out["h2d_pinned_bytes_per_s"] = peak_h2d;
  out["d2h_pinned_bytes_per_s"] = peak_d2h;
  out["h2d_pageable_bytes_per_s"] = peak_h2d_pageable;
  out["d2h_pageable_bytes_per_s"] = peak_d2h_pageable;
  out["bidirectional_pinned_bytes_per_s"] = bidir;
  out["bidirectional_bytes_each_way"] = bi;
  out["device_copy_bytes_per_s"] = d2d;
  return out;
}

void check_blas(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(call) + ": cuBLAS status " + std::to_string(int(s)));
}

// One cublasGemmEx, column-major C[m, n] = op(A) op(B) (+ C), A and B bf16, C bf16 or fp32, fp32 compute.
struct Gemm {
  std::string label;
  cublasOperation_t ta, tb;
  int64_t m, n, k;
  bool c_fp32;  // dw: fp32 output, accumulated (beta = 1), as trainer/cuda/gemm.cpp does
  int64_t count = 1;  // how many times one training forward+backward runs it (layers)
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

// GPT-2's GEMMs as trainer/cuda/gemm.h maps them (row-major tensors as column-major transposes):
//   forward out[N, OC] = inp[N, IC] @ w^T: m=OC, n=N, k=IC, (T, N)
//   dinp[N, IC] = dout[N, OC] @ w:          m=IC, n=N, k=OC, (N, N)
//   dw[OC, IC] += dout^T @ inp:              m=IC, n=OC, k=N, (N, T), fp32 output
std::vector<Gemm> gpt2_gemms(const zt::model::Config& c, int64_t N) {
  struct Lin {
    const char* name;
    int64_t ic, oc, count;
  };
  const int64_t C = c.width;
  const Lin lins[] = {{"qkv", C, 3 * C, c.layers},
                      {"attn.proj", C, C, c.layers},
                      {"mlp.fc", C, 4 * C, c.layers},
                      {"mlp.proj", 4 * C, C, c.layers},
                      {"lm_head", C, c.vocab, 1}};
  std::vector<Gemm> out;
  for (const Lin& l : lins) {
    out.push_back({std::string(l.name) + " fwd", CUBLAS_OP_T, CUBLAS_OP_N, l.oc, N, l.ic, false, l.count});
    out.push_back({std::string(l.name) + " dinp", CUBLAS_OP_N, CUBLAS_OP_N, l.ic, N, l.oc, false, l.count});
    out.push_back({std::string(l.name) + " dw", CUBLAS_OP_N, CUBLAS_OP_T, l.ic, l.oc, N, true, l.count});
  }
  return out;
}

struct GemmBench {
  cublasHandle_t handle = nullptr;
  Stream stream;
  zt::cuda::DeviceBuffer a, b, c;
  int iters;
  int reps;

  GemmBench(size_t a_bytes, size_t b_bytes, size_t c_bytes, int iters, int reps) : iters(iters), reps(reps) {
    check_blas(cublasCreate(&handle), "cublasCreate");
    check_blas(cublasSetStream(handle, stream.s), "cublasSetStream");
    a = zt::cuda::DeviceBuffer(a_bytes);
    b = zt::cuda::DeviceBuffer(b_bytes);
    c = zt::cuda::DeviceBuffer(c_bytes);
    random_bf16(a);
    random_bf16(b);
    check(cudaMemset(c.get(), 0, c_bytes), "cudaMemset");
  }
  ~GemmBench() {
    if (handle) (void)cublasDestroy(handle);
  }

  // Random bf16 in [-1, 1): power and clocks depend on the data; zeros would flatter the GPU.
  static void random_bf16(zt::cuda::DeviceBuffer& buf) {
    const size_t chunk = std::min(buf.bytes(), 16 * kMiB) / 2 * 2;
    std::vector<uint16_t> pat(chunk / 2);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (auto& v : pat) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      float f = float(x >> 40) / float(1ull << 24) * 2.0f - 1.0f;
      uint32_t u;
      std::memcpy(&u, &f, 4);
      v = uint16_t(u >> 16);
    }
    for (size_t off = 0; off < buf.bytes(); off += chunk)
      check(cudaMemcpy(static_cast<char*>(buf.get()) + off, pat.data(), std::min(chunk, buf.bytes() - off),
                       cudaMemcpyHostToDevice),
            "cudaMemcpy");
  }

  void run(const Gemm& g) {
    const float alpha = 1.0f, beta = g.c_fp32 ? 1.0f : 0.0f;
    const int64_t lda = g.ta == CUBLAS_OP_N ? g.m : g.k;
    const int64_t ldb = g.tb == CUBLAS_OP_N ? g.k : g.n;
    check_blas(cublasGemmEx(handle, g.ta, g.tb, int(g.m), int(g.n), int(g.k), &alpha, a.get(), CUDA_R_16BF, int(lda),
                            b.get(), CUDA_R_16BF, int(ldb), &beta, c.get(), g.c_fp32 ? CUDA_R_32F : CUDA_R_16BF,
                            int(g.m), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
  }

  // Seconds per GEMM: the best of `reps` averages over `iters` back-to-back launches.
  double time(const Gemm& g) {
    for (int i = 0; i < 2; i++) run(g);  // warm-up: cuBLAS picks and loads its kernel
    return best_of(reps, stream.s, [&] {
             for (int i = 0; i < iters; i++) run(g);
           }) /
           iters;
  }
};

json measure_gemms(const Options& o) {
  const int64_t N = o.tokens;
  std::vector<std::pair<std::string, std::vector<Gemm>>> sets;
  for (const std::string& name : o.presets) {
    auto c = zt::model::preset(name);
    if (!c) throw std::invalid_argument("--presets: unknown preset '" + name + "'");
    sets.push_back({name, gpt2_gemms(*c, N)});
  }
  const int64_t S = o.quick ? 2048 : 8192;
  const Gemm square{"square " + std::to_string(S) + "^3", CUBLAS_OP_N, CUBLAS_OP_N, S, S, S, false, 1};
  size_t a_max = size_t(S * S), b_max = size_t(S * S), c_max = size_t(S * S) * 2;  // elements (c in bf16 units)
  for (auto& [name, gs] : sets)
    for (const Gemm& g : gs) {
      a_max = std::max(a_max, size_t(g.m * g.k));
      b_max = std::max(b_max, size_t(g.k * g.n));
      c_max = std::max(c_max, size_t(g.m * g.n) * (g.c_fp32 ? 2 : 1));
    }
  GemmBench bench(a_max * 2, b_max * 2, c_max * 2, o.quick ? 2 : 10, o.quick ? 2 : std::max(3, o.reps));

  std::printf("bf16 GEMM (cublasGemmEx, bf16 in, fp32 compute; N = B*T = %lld tokens; best of %d x %d launches):\n",
              (long long)N, bench.reps, bench.iters);
  const double s_sq = bench.time(square);
  const double sq_rate = square.flops() / s_sq;
  std::printf("  %-44s %9.1f TFLOP/s\n", square.label.c_str(), sq_rate / 1e12);
  json out;
  out["square"] = {{"m", S}, {"n", S}, {"k", S}, {"flop_per_s", sq_rate}};
  json presets = json::object();
  for (auto& [name, gs] : sets) {
    double flops = 0, secs = 0;
    json rows = json::array();
    std::printf("  %s (%s):\n", name.c_str(), zt::model::describe(*zt::model::preset(name)).c_str());
    for (const Gemm& g : gs) {
      const double s = bench.time(g);
      flops += g.flops() * double(g.count);
      secs += s * double(g.count);
      std::printf("    %-28s m=%-6lld n=%-6lld k=%-6lld %9.1f TFLOP/s%s\n", g.label.c_str(), (long long)g.m,
                  (long long)g.n, (long long)g.k, g.flops() / s / 1e12, g.count > 1 ? "" : "  (once)");
      rows.push_back({{"label", g.label}, {"m", g.m}, {"n", g.n}, {"k", g.k}, {"count", g.count},
                      {"flop_per_s", g.flops() / s}, {"seconds", s}});
    }
    // The rate a whole forward+backward's weight GEMMs would run at: their flops over their time.
    std::printf("    %-28s %37s %9.1f TFLOP/s  (%.2f ms for one fwd+bwd's GEMMs)\n", "effective (flop-weighted)", "",
                flops / secs / 1e12, secs * 1e3);
    presets[name] = {{"tokens", N}, {"flop_per_s", flops / secs}, {"gemm_flops", flops}, {"gemm_seconds", secs},
                     {"gemms", rows}};
  }
  out["presets"] = presets;
  out["tokens"] = N;
  return out;
}

int run(const Options& o) {
  json j;
  j["tool"] = "bench_gpu_limits";
  j["quick"] = o.quick;
  std::string why;
  const bool gpu = zt::cuda::cuda_available(&why);
  j["gpu"] = {{"available", gpu}, {"why", gpu ? "" : why}, {"versions", zt::cuda::versions()}};
  if (!gpu) {
    std::printf("bench_gpu_limits: skipped: %s\n", why.c_str());
    std::printf("bench_gpu_limits: measuring the CPU-side limits only\n");
  } else {
    try {
      if (o.device < 0 || o.device >= zt::cuda::device_count())
        throw std::invalid_argument("--device " + std::to_string(o.device) + ": this machine has " +
                                    std::to_string(zt::cuda::device_count()) + " GPUs");
      check(cudaSetDevice(o.device), "cudaSetDevice");
      cudaDeviceProp prop{};
      check(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties");
      std::printf("device %d: %s (%s)\n", o.device, prop.name, zt::cuda::versions().c_str());
      std::printf("  %s\n", zt::cuda::describe_device(o.device).c_str());
      j["gpu"]["name"] = prop.name;
      j["gpu"]["ordinal"] = o.device;
      j["gpu"]["compute_capability"] = std::to_string(prop.major) + "." + std::to_string(prop.minor);
      j["gpu"]["memory_bytes"] = prop.totalGlobalMem;
      j["gpu"]["sm_count"] = prop.multiProcessorCount;
      j["gpu"]["description"] = zt::cuda::describe_device(o.device);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_gpu_limits: %s\n", e.what());
      j["gpu"]["error"] = e.what();
    }
    if (!j["gpu"].contains("error")) {
      try {
        j["transfers"] = measure_transfers(o);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_gpu_limits: transfers: %s\n", e.what());
        j["transfers"] = {{"error", e.what()}};
      }
      if (o.gemm) {
        try {
          j["gemm"] = measure_gemms(o);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "bench_gpu_limits: gemm: %s\n", e.what());
          j["gemm"] = {{"error", e.what()}};
        }
      }
    }
  }
  try {
    j["cpu_adam"] = measure_cpu_adam(o, j.contains("gpu") && j["gpu"].is_object() && !j["gpu"].contains("error") &&
                                            j["gpu"].contains("name"));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_limits: cpu adam: %s\n", e.what());
    j["cpu_adam"] = {{"error", e.what()}};
  }
  try {
    j["host_memory"] = measure_host_memory(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_limits: host memory: %s\n", e.what());
    j["host_memory"] = {{"error", e.what()}};
  }
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    f << j.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "bench_gpu_limits: cannot write %s\n", o.json_path.c_str());
      return 2;
    }
    std::printf("wrote %s\n", o.json_path.c_str());
  }
  return 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: bench_gpu_limits [--json FILE] [--quick] [--reps N] [--tokens N] [--presets 124M,350M,774M,1.5B]\n"
               "                        [--host-bytes N] [--adam-params N] [--device N] [--no-gemm]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool host_bytes_set = false, adam_set = false;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--json" && (v = next())) o.json_path = v;
    else if (a == "--quick") o.quick = true;
    else if (a == "--reps" && (v = next())) o.reps = std::max(1, std::atoi(v));
    else if (a == "--tokens" && (v = next())) o.tokens = std::max<int64_t>(1, std::atoll(v));
    else if (a == "--presets" && (v = next())) o.presets = split_commas(v);
    else if (a == "--host-bytes" && (v = next())) o.host_bytes = size_t(std::max<long long>(4096, std::atoll(v))), host_bytes_set = true;
    else if (a == "--adam-params" && (v = next())) o.adam_params = std::max<int64_t>(1, std::atoll(v)), adam_set = true;
    else if (a == "--device" && (v = next())) o.device = std::atoi(v);
    else if (a == "--no-gemm") o.gemm = false;
    else if (a == "-h" || a == "--help") {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "bench_gpu_limits: unknown or incomplete argument '%s'\n", a.c_str());
      return usage();
    }
  }
  if (o.quick) {
    if (!host_bytes_set) o.host_bytes = 64 * kMiB;
    if (!adam_set) o.adam_params = int64_t(8) << 20;
    o.reps = std::min(o.reps, 2);
  }
  for (const std::string& p : o.presets)
    if (!zt::model::preset(p)) {
      std::fprintf(stderr, "bench_gpu_limits: --presets: '%s' is not one of tiny, 124M, 350M, 774M, 1.5B\n", p.c_str());
      return 2;
    }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_limits: %s\n", e.what());
    return 1;
  }
}
