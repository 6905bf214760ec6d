// bench_allocator: what one allocate/free pair costs in the caching device allocator and
// the pinned host allocator, in the cached steady state (the block is in the cache, as it
// is from the second training step on), beside plain malloc/free of the same size measured
// in the same run. Recording off, then on (one trace file, counters on and off).
//
// Reading it: the ratio is allocator time / malloc time for the same size. malloc of
// sizes above glibc's mmap threshold (32 MiB at most) is an mmap+munmap pair per call, so
// for 64 MiB the baseline is a system call and the ratio falls below 1; that is the cost
// the caching allocator exists to avoid, not a flaw in the measurement.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "zt/common/units.h"
#include "zt/memory/device_allocator.h"
#include "zt/memory/host_allocator.h"
#include "zt/probe/recorder.h"

using namespace zt::memory;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

// Keeps the compiler from proving a malloc/free pair dead and removing it.
inline void escape(void* p) { asm volatile("" : : "g"(p) : "memory"); }

// ns per iteration: the best of `reps` runs of `iters` iterations each (the best run is
// the one least disturbed by the other core's work and by the writer thread's commits).
// `between` runs after each run, untimed (the recording modes flush the rings there).
double time_ns(int iters, int reps, const std::function<void()>& body,
               const std::function<void()>& between = [] {}) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) body();
    double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / iters;
    best = std::min(best, ns);
    between();
  }
  return best;
}

double malloc_pair_ns(size_t bytes, int iters) {
  return time_ns(iters, 5, [bytes] {
    void* p = std::malloc(bytes);
    escape(p);
    std::free(p);
  });
}

// Recording modes. "burst": each run fits in the thread's ring (flushed between runs),
// so the figure is the hot-path cost the allocator adds. "sustained": the default ring and
// a run much longer than it, so the producer waits for the writer thread (the Block
// policy): the figure is the writer's throughput, the ceiling for allocation-heavy loops.
struct Mode {
  const char* name;
  bool record;
  bool counters;
  size_t ring_events;  // 0: default (32768 events per thread)
  int iters_divisor;   // runs of iters / this
  int reps;
};

}  // namespace

int main(int argc, char** argv) {
  zt::bench::Options opt(argc, argv, "bench_allocator [--iters N]   (allocate/free pairs a run; default 100000)");
  const int iters = int(opt.integer("--iters", 100000, 1, 1'000'000'000));
  opt.done();
  const std::vector<size_t> sizes = {512, 64 * KiB, 4 * MiB, 64 * MiB};
  // Sustained: iters / 2 pairs of 4 events (alloc, free, two counters) = 200000 events per
  // run against a 32768-event ring, so most of each run waits on the writer.
  const Mode modes[] = {{"recording off", false, false, 0, 1, 5},
                        {"recording on, burst (fits in the ring), counters on", true, true, 1 << 20, 4, 5},
                        {"recording on, burst (fits in the ring), counters off", true, false, 1 << 20, 4, 5},
                        {"recording on, sustained (writer-bound), counters on", true, true, 0, 2, 2}};
  std::string dir = std::filesystem::temp_directory_path() / ("zt-bench-alloc-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);

  std::printf("bench_allocator: allocate+free pair, cached steady state (ns per pair)\n");
  std::printf("baseline: glibc malloc+free of the same size in this process\n\n");
  std::printf("(malloc is timed right before the allocators for each size, so that both see the same\n"
              " machine load; above glibc's mmap threshold it is timed over 1/100 of the pairs)\n\n");

  for (const Mode& m : modes) {
    std::unique_ptr<zt::probe::Recorder> rec;
    zt::probe::DeviceId gpu = 0, cpu = 0;
    if (m.record) {
      zt::probe::RecorderOptions ro;
      ro.path = dir + "/bench.db";
      std::filesystem::remove(ro.path);
      ro.command_line = "bench_allocator";
      ro.crash_handlers = false;
      if (m.ring_events) ro.ring_events = m.ring_events;
      if (zt::Status st = zt::probe::Recorder::open(ro, &rec); !st) {
        std::fprintf(stderr, "bench_allocator: %s\n", st.message().c_str());
        return 2;
      }
      rec->add_rank(0, 1);
      gpu = rec->add_device(0, zt::probe::DeviceKind::Sim, 0, "cuda:0", "simulated GPU", int64_t(8) << 30, true);
      cpu = rec->add_device(0, zt::probe::DeviceKind::Cpu, 0, "cpu", "host", std::nullopt, false);
    }
    HostBackedSource src(8 * GiB);  // real memory, never touched by the allocator
    DeviceAllocatorOptions dopt;
    dopt.recorder = rec.get();
    dopt.device = gpu;
    dopt.record_counters = m.counters;
    DeviceAllocator dev(&src, dopt);
    HostAllocatorOptions hopt;
    hopt.recorder = rec.get();
    hopt.device = cpu;
    hopt.record_counters = m.counters;
    PinnedHostAllocator pinned(hopt);
    const zt::probe::NameId name = rec ? rec->intern("bench.tensor") : 0;

    const int n = std::max(1, iters / m.iters_divisor);
    auto flush = [&] {
      if (rec) rec->flush();
    };
    std::printf("== %s: best of %d x %d pairs ==\n", m.name, m.reps, n);
    std::printf("%-10s %18s %18s %14s %14s %12s\n", "size", "device alloc ns", "pinned alloc ns", "malloc ns",
                "device/malloc", "pinned/malloc");
    for (size_t s : sizes) {
      // Warm: the block is cached from here on, and the ring's pages have been touched (the
      // first pass through a fresh ring costs page faults, not allocator work).
      const int warm = std::min(n, 25000);
      for (int k = 0; k < warm; ++k) dev.free(dev.allocate(s, name));
      for (int k = 0; k < warm; ++k) pinned.free(pinned.allocate(s, "bench.buffer"));
      flush();
      const double base = malloc_pair_ns(s, s >= 32 * MiB ? std::max(1, n / 100) : n);
      double d = time_ns(n, m.reps, [&] { dev.free(dev.allocate(s, name)); }, flush);
      double p = time_ns(n, m.reps, [&] { pinned.free(pinned.allocate(s, "bench.buffer")); }, flush);
      std::printf("%-10s %18.1f %18.1f %14.1f %14.2f %12.2f\n", zt::format_bytes(double(s)).c_str(), d, p, base,
                  d / base, p / base);
    }
    DeviceAllocatorStats st = dev.stats();
    std::printf("device: %lld segment allocs for %lld allocations (cached steady state)\n",
                static_cast<long long>(st.segment_allocs_total), static_cast<long long>(st.allocations_total));
    if (rec) {
      rec->flush();
      std::printf("recorded: %llu events committed, %llu dropped (the Block policy never drops)\n",
                  static_cast<unsigned long long>(rec->events_recorded()),
                  static_cast<unsigned long long>(rec->events_dropped()));
    }
    std::printf("\n");
  }
  std::filesystem::remove_all(dir);
  return 0;
}
