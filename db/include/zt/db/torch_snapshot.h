// zt/db/torch_snapshot.h: PyTorch memory snapshots in and out of traces.
//
// A snapshot is what torch.cuda.memory._dump_snapshot() pickles and pytorch.org/memory_viz reads:
// `segments` (each cudaMalloc'd segment with the blocks that tile it, alive when it was taken) and
// `device_traces` (per device, the allocator's history since _record_memory_history: alloc,
// free_requested, free_completed, segment_alloc, segment_free, segment_map, segment_unmap, oom,
// snapshot, each with address, size, stream, Python frames and time_us). The format is documented
// in torch/cuda/memory.py (_snapshot) and read by torch/cuda/_memory_viz.py.
//
// Into a trace (import, and zt probe's merge of a probed program's own history):
//  - segment_alloc / segment_free (and map / unmap of expandable segments) become `segment` rows,
//    source `torch`; alloc / free_requested become `block` rows inside them (segment_id), with the
//    stream, the Python stack as frame rows (ip 0, module = file, module_offset = line, symbol =
//    function) and a name made of the innermost frame of the user's code ("train.py:14 step") and,
//    where the frames say so, the tensor's family ("(activation)", "(gradient)", "(parameter)",
//    "(optimizer state)").
//  - A block's `bytes` is what torch.cuda.memory_allocated() counts: the allocator's rounded size,
//    or the whole free block where it was not split. The history only records the requested size,
//    so the split is replayed with the caching allocator's rules (512-byte rounding, small pool up to
//    1 MiB split down to 512 B, large pool split only when more than 1 MiB remains, max_split_size and
//    roundup_power2_divisions from allocator_settings when the snapshot has them); blocks alive at
//    the end take their size from the snapshot's own segment list. So at every moment the live block
//    rows of a device sum to memory_allocated(), the live segment rows to memory_reserved().
//  - A block ends (t_free) at free_requested, where memory_allocated() drops; its memory is reusable
//    from free_completed (a block used on another stream waits for it).
//  - An oom entry becomes an `error` row of kind oom (figures in its message, the largest live blocks
//    in `tensors`); the blocks alive then stay in the trace as they were.
//  - What was alive before the history began (a ring buffer that wrapped, or recording started late)
//    is taken from the frees of unknown blocks and from the final segment list, from the history's
//    first moment.
//  - Times: time_us is Unix time (PyTorch converts its TSC clock at snapshot time). A snapshot that
//    carries zerotrace's clock pair (key `zerotrace`: unix_ns and monotonic_ns read together, written
//    by the probe's Python hook) lands on the probe's CLOCK_MONOTONIC clock; any other is imported on
//    its own clock, nanoseconds from its first event, its run row anchored at that Unix time. Without
//    time_us (snapshots before PyTorch 2.1) the events are 1 µs apart, in order.
// Out of a trace (export): the device memory of every accelerator device as one snapshot: segments
// and blocks as alloc / free / segment events with time_us, the segments alive at the end tiled with
// their live blocks, frames from the stacks, oom errors as oom entries; memory_viz opens it, and
// import -> export -> import gives the same block rows.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "zt/common/status.h"

namespace zt::db {

struct TorchImportStats {
  int64_t devices = 0;
  int64_t events = 0;            // device trace entries read
  int64_t segments = 0;          // segment rows written
  int64_t blocks = 0;            // block rows written
  int64_t blocks_alive_at_end = 0;
  int64_t before_history = 0;    // blocks and segments alive before the history's first entry
  int64_t ooms = 0;
  int64_t size_mismatches = 0;   // blocks alive at the end whose replayed size differed from the snapshot's
  int64_t cupti_paired = 0;      // merge: CUPTI segments now a second record of a torch segment
  bool has_history = false;      // any device trace entries at all
  bool on_probe_clock = false;   // the snapshot carried zerotrace's clock pair
};

// The snapshot file -> a new trace at `trace_path`, written beside it and renamed into place: a bad
// file leaves nothing there (and an existing trace at that path as it was).
Status import_torch_snapshot(const std::string& pickle_path, const std::string& trace_path,
                             TorchImportStats* stats = nullptr);

// A probed process's own snapshot (written by the zerotrace Python hook) -> rows in that process's
// finished trace: torch segments paired with CUPTI's records of the same cudaMalloc (those become
// second records, db/SCHEMA.md "One memory, two records"), blocks inside them, on CUPTI's device rows
// of the same CUDA ordinal. The trace is copied, extended and renamed back: on any error it is as it
// was. `run_id`, when not empty, must equal the snapshot's zerotrace run_id.
Status merge_torch_snapshot(const std::string& trace_path, const std::string& pickle_path, const std::string& run_id,
                            TorchImportStats* stats = nullptr);

struct TorchExportStats {
  int64_t devices = 0;
  int64_t segments = 0;
  int64_t blocks = 0;
  int64_t events = 0;
  int64_t bytes = 0;  // size of the pickle
  std::string device_map;  // "cuda:0 (rank 0) -> device 0, ..." when the trace has several
  // Rows left out: an address at or past 2^63 (negative in the trace's int64), which a snapshot's
  // non-negative addresses cannot hold. No CUDA allocator hands one out; an edited trace can.
  int64_t left_out = 0;
};

// The trace's device memory -> a snapshot pickle (temporary file beside it, renamed into place).
Status export_torch_snapshot(const std::string& trace_path, const std::string& pickle_path,
                             TorchExportStats* stats = nullptr);

// Checks that `bytes` is a snapshot this reader takes (the pickle and the snapshot's structure),
// without writing anything: the fuzzing entry point above pickle::parse. The error is one line
// without a file name.
Status check_torch_snapshot(std::string_view bytes);

}  // namespace zt::db
