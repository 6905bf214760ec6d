// probe/src/interpose/host_hooks.h: the LD_PRELOAD host-allocation interposer, seen from the
// rest of libzt_probe.so (inject/probe_main.cpp starts and stops it).
//
// Owns: the exported malloc, calloc, realloc, free, posix_memalign, aligned_alloc, memalign,
// mmap, mmap64 and munmap of libzt_probe.so; the table of live recorded allocations; the
// per-thread counters of small allocations.
//
// Invariants:
//  - Every hook forwards to the next definition (dlsym RTLD_NEXT) and returns its result
//    unchanged; recording is a side effect that can never change what the program sees.
//  - Allocations at or above the threshold become allocation rows (pageable_host, segment,
//    source host_hook) with a stack; smaller ones move per-thread counters, and a Poisson sample
//    of them by bytes (mean interval `sample_interval`) become rows too, each marked with the
//    bytes it stands for (allocation.weight_bytes = bytes / P(sampled)), their frees tracked.
//  - One open row per address: an address allocated again while its row is open (its free was
//    not seen: a partial munmap, a raw syscall, a thread that no longer records) closes the older
//    row at the new allocation's time, and each such guess is a `dropped` row ("host frees not
//    seen"). The trace stays valid for the reader (no row freed before it was made).
//  - posix_memalign, aligned_alloc and memalign never call through a null pointer (aligned.h).
//  - Code inside the probe (a ScopedGuard on the stack, the recorder's writer thread, the
//    probe's own threads) passes straight through: the probe never records itself and never
//    recurses into its own hooks.
//  - Until dlsym has returned the real functions, allocations come from a static arena, and
//    frees of arena memory are ignored.
//  - After fork() the child never writes into its parent's trace (child_after_fork); where it
//    records a trace of its own (a forked worker) it starts again from restart_after_fork().
#pragma once

#include <cstdint>

#include "guard.h"
#include "zt/probe/recorder.h"

namespace zt::probe::interpose {

struct HostHookConfig {
  Recorder* recorder = nullptr;
  DeviceId host_device = 0;
  uint64_t threshold = 1ull << 20;
  uint64_t sample_interval = 512 << 10;  // mean bytes between sampled allocations under the threshold; 0: off
  uint64_t sample_seed = 0;              // 0: each thread seeds from its id and the clock
  bool stacks = true;
  int stack_depth = 32;
  int rank = 0;
};

// Starts recording through `cfg.recorder` (which must outlive every later hook call: it is
// never destroyed, only closed). Idempotent per process.
void start(const HostHookConfig& cfg);
// Stops recording: later hooks only forward. Allocations still live stay open in the trace.
void stop();
// pthread_atfork child handler: this process records nothing from now on, and its counts of
// small allocations and of rows start from zero (async-signal-safe: atomic stores only).
// `start_first`, when not null, is called by the first allocation at or above the threshold (or
// anonymous mapping) the child makes: it may start recording (a forked worker's own trace,
// probe_main.cpp) and says whether it did; that allocation is then recorded.
void child_after_fork(bool (*start_first)() = nullptr);
// In a child forked without exec that records its own trace, before start(): a fresh table of
// live allocations and a fresh lock (a thread of the parent, gone here, may have held it; the
// parent's table stays the parent's). Only while this process is not recording.
void restart_after_fork();
bool recording();

struct SmallTotals {
  uint64_t allocations = 0;  // below the threshold, since the process started
  uint64_t frees = 0;        // frees of blocks below the threshold
  uint64_t bytes = 0;        // bytes requested by those allocations, in total (not live)
};
SmallTotals small_totals();
int64_t large_live_count();  // recorded allocations not yet freed
int64_t recorded_count();    // allocation rows at or above the threshold written since start()
int64_t sampled_count();     // sampled rows (under the threshold) written since start()
int64_t sampled_live_count();  // sampled rows not yet freed

// ScopedGuard and mark_probe_thread (guard.h) say which threads the hooks pass through.

}  // namespace zt::probe::interpose
