// zt/db/kernel_summary.h: where a trace's GPU time went, from its kernel rows (CUPTI's activity
// records: `zt train --device cuda --cupti`, `zt probe`), as Nsight Systems' cuda_gpu_kern_sum
// report gives it, and where the GPU sat idle and what the host was doing meanwhile.
//
// Owns: choosing the window (steps of one rank; by default every finished step but the first,
// the warm-up; a trace without step markers: the kernels' own span), the totals per kernel name,
// the union of the kernels' intervals (busy), the gaps between them (idle) and the host phase
// under each gap (the innermost phase marker of the rank's own thread at the gap's midpoint,
// digits shown as N so that "reduce block3" and "reduce block7" add up; a phase of step s that
// ends after step s+1 began is the background AdamW's, as the viewer's lanes have it, and is left
// out). A rank's kernels are those on its devices. May call: the trace's SQLite connection
// (read-only). Called by: `zt db kernels` (cli/db_commands.cpp), bench/gpu_compare (through it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zt/common/status.h"
#include "zt/db/trace_reader.h"

namespace zt::db {

struct KernelSummaryOptions {
  int64_t rank = -1;                        // -1: the lowest rank with kernel rows
  int64_t first_step = -1, last_step = -1;  // -1: the default window (above)
  size_t longest_gaps = 5;                  // how many of the longest idle gaps to list
};

struct KernelStat {
  std::string name;
  int64_t calls = 0;
  int64_t total_ns = 0, min_ns = 0, max_ns = 0;
};

struct IdleGap {
  int64_t t_start = 0, t_end = 0;
  int64_t step = -1;   // the step it lies in (-1: none)
  std::string phase;   // the host's innermost phase at its midpoint, as recorded ("(no phase)")
};

struct IdleByPhase {
  std::string phase;  // digits as N
  int64_t ns = 0;
  int64_t gaps = 0;
};

struct KernelSummary {
  int64_t rank = 0;
  std::string devices;                      // the labels of the rank's devices with kernels ("cuda:0")
  int64_t first_step = -1, last_step = -1;  // the finished steps found in the range asked for; -1: no step markers
  int64_t steps = 0;                        // how many (the window spans them)
  int64_t t_start = 0, t_end = 0;           // the window
  int64_t kernels = 0;                      // kernels that started in it
  int64_t kernel_ns = 0;                    // the sum of their durations (whole, also past the window's end)
  int64_t busy_ns = 0;                      // the union of all kernels' intervals, clipped to the window
  int64_t gaps = 0;                         // idle intervals (window - busy)
  std::vector<KernelStat> by_name;          // most time first
  std::vector<IdleGap> longest;             // longest first
  std::vector<IdleByPhase> idle_by_phase;   // most idle time first
  int64_t window_ns() const { return t_end - t_start; }
};

// Errors (naming the file): no kernel rows at all, none of the rank, steps that are not in it.
Status summarize_kernels(TraceReader& reader, const KernelSummaryOptions& options, KernelSummary* out);

}  // namespace zt::db
