// zt/db/rows.h: one plain struct per table row. Written by TraceWriter, read back by
// TraceReader, so a round trip is the identity. Id columns use 0 for "none" (stored as
// NULL); every real id is at least 1.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "zt/db/schema.h"

namespace zt::db {

struct RunRow {
  int64_t id = 1;
  std::string tool_version;
  std::string command_line;
  std::string config_json;
  std::optional<int64_t> seed;
  std::string hostname;
  int64_t pid = 0;
  int64_t t_start = 0;
  std::optional<int64_t> t_end;
  int64_t wall_start_unix_ns = 0;
  RunStatus status = RunStatus::Running;
  std::optional<int64_t> exit_code;
  std::string exit_detail;
  std::string source_file;
};

// How a run ended, in one phrase: "ended with status failed, exit code 1: step 8: CUDA out of
// memory", "ended without closing the trace (killed, or still running)".
std::string run_end_text(const RunRow& run);

struct RankRow {
  int64_t rank = 0;
  int64_t run_id = 1;
  int64_t world_size = 1;
  std::optional<int64_t> local_rank;
  std::string hostname;
  int64_t pid = 0;
  // Rank: a rank of the job; Launcher, Helper: a process of the run that is not one, and `rank`
  // is only its key (db/SCHEMA.md). Files written before roles read as ranks.
  RankRole role = RankRole::Rank;
  // The job's rank this row is or belongs to: a rank's own (equal to `rank`; NULL where no launcher
  // or communicator named it: the one process of a run without a launcher), a helper's rank (NULL
  // when it belongs to the launcher or is not known); NULL for a launcher.
  std::optional<int64_t> job_rank;
};

struct DeviceRow {
  int64_t id = 0;
  int64_t rank = 0;
  DeviceKind kind = DeviceKind::Cpu;
  int64_t ordinal = 0;
  std::string label;  // what users see: "cuda:1" (also for a simulated GPU), "cpu"
  std::string name;   // model name: "NVIDIA H100 80GB HBM3", "simulated GPU"
  std::optional<int64_t> capacity_bytes;
  bool simulated = false;
};

struct StringRow {
  int64_t id = 0;
  std::string text;
};

// A native frame: ip, and its module, offset and symbol once symbolized. A Python frame (a
// function the interpreter ran, read by the probe from CPython's frames): ip 0, module = its
// source file, symbol = its function (qualified name), line = the line it was running.
struct FrameRow {
  int64_t id = 0;
  uint64_t ip = 0;
  std::string module;
  std::optional<int64_t> module_offset;
  std::string symbol;
  std::optional<int64_t> line;  // source line: set for Python frames, NULL for native ones
  bool python() const { return ip == 0 && line.has_value(); }
};

// One frame as a stack shows it: "symbol (module+0x1f3)" for a native frame (the raw ip when it
// has no symbol), "function (file.py:42)" for a Python frame.
std::string frame_text(const FrameRow& f);

struct StackRow {
  int64_t id = 0;
  int64_t parent_id = 0;  // the caller's node; 0 at the outermost frame
  int64_t frame_id = 0;
};

struct AllocationRow {
  int64_t id = 0;
  int64_t rank = 0;
  int64_t device_id = 0;
  MemoryKind memory_kind = MemoryKind::Device;
  AllocLevel level = AllocLevel::Block;
  uint64_t address = 0;
  int64_t bytes = 0;
  int64_t requested_bytes = 0;
  int64_t t_alloc = 0;
  std::optional<int64_t> t_free;
  int64_t name_id = 0;
  int64_t stack_id = 0;
  Source source = Source::Api;
  int64_t segment_id = 0;
  std::optional<int64_t> stream;
  // A sampled row (the probe's byte sampler picked this allocation among those under its
  // threshold): the bytes it stands for, bytes / P(sampled), at least `bytes`. NULL (nullopt) for
  // a row recorded one by one. Estimates of live bytes by site count it by this (counted_bytes).
  std::optional<int64_t> weight_bytes;
  bool sampled() const { return weight_bytes.has_value(); }
  int64_t counted_bytes() const { return weight_bytes ? *weight_bytes : bytes; }
};

struct TransferRow {
  int64_t id = 0;
  int64_t rank = 0;
  TransferKind kind = TransferKind::H2D;
  int64_t bytes = 0;
  int64_t src_device_id = 0;
  int64_t dst_device_id = 0;
  std::optional<bool> pinned;
  int64_t t_start = 0;
  int64_t t_end = 0;
  std::optional<int64_t> stream;
  int64_t name_id = 0;
  int64_t op_id = 0;  // collectives: "all_gather", "reduce_scatter", ...
  std::optional<int64_t> participants;
  std::optional<int64_t> correlation_id;
  Source source = Source::Api;
  int64_t stack_id = 0;  // call stack of the API call that started it (cudaMemcpy*), when captured
};

struct KernelRow {
  int64_t id = 0;
  int64_t rank = 0;
  int64_t device_id = 0;
  int64_t name_id = 0;
  int64_t t_start = 0;
  int64_t t_end = 0;
  std::optional<int64_t> stream;
  std::optional<int64_t> correlation_id;
  std::string grid;
  std::string block;
  Source source = Source::Api;
};

struct PlacementRow {
  int64_t id = 0;
  int64_t rank = 0;
  int64_t t = 0;
  int64_t tensor_id = 0;  // string id of the tensor's name
  int64_t device_id = 0;
  PlacementWhy why = PlacementWhy::Created;
  std::optional<int64_t> bytes;
  int64_t allocation_id = 0;
};

struct MarkerRow {
  int64_t id = 0;
  int64_t rank = 0;
  MarkerKind kind = MarkerKind::Phase;
  int64_t name_id = 0;
  int64_t t_start = 0;
  std::optional<int64_t> t_end;
  std::optional<int64_t> step;
  std::optional<int64_t> micro_step;
  std::optional<int64_t> epoch;
  std::optional<int64_t> value;
};

struct CounterRow {
  int64_t id = 0;
  int64_t rank = 0;
  int64_t device_id = 0;
  int64_t name_id = 0;
  int64_t t = 0;
  double value = 0;  // NaN where the column is NULL (a NaN recorded: SQLite stores none)
};

struct FaultRow {
  int64_t id = 0;
  int64_t rank = 0;
  int64_t t = 0;
  std::string name;
  std::string trigger;
  std::optional<int64_t> step;
  std::string details;
};

struct ErrorRow {
  int64_t id = 0;
  int64_t rank = 0;
  int64_t t = 0;
  std::optional<int64_t> step;
  std::string kind;     // "device_mismatch", "oom", "uncaught_exception", ...
  std::string site;     // where in the code: "unscale_and_clip_grads", "checkpoint.gather"
  std::string message;
  std::string tensors;  // JSON array of tensor names involved
  int64_t device_id = 0;
};

struct DroppedRow {
  int64_t id = 0;
  std::optional<int64_t> rank;
  int64_t thread = 0;
  int64_t t = 0;
  int64_t events = 0;
  std::string reason;
};

// Aggregates (schema version 3; db/SCHEMA.md "Aggregates"): one row per step and device, written
// by the recorder at each step's end whether or not the step has detail.
struct StepMemoryRow {
  int64_t id = 0;
  int64_t rank = 0;
  int64_t device_id = 0;
  std::optional<int64_t> step, epoch;
  int64_t t_start = 0;
  std::optional<int64_t> t_end;  // NULL: the step never ended (the run died inside it)
  int64_t allocated_bytes = 0;   // live block bytes at the step's end (recorded one by one)
  int64_t reserved_bytes = 0;    // live segment bytes at the step's end
  int64_t peak_allocated_bytes = 0, peak_reserved_bytes = 0;  // the highest within the step
  std::optional<int64_t> host_rss_bytes;  // the rank's last RSS sample at or before the step's end
};

// The live set at an epoch boundary, one row per (device, memory kind, level, name, stack).
struct EpochLiveRow {
  int64_t id = 0;
  int64_t rank = 0;
  int64_t epoch = 0;
  int at = 0;  // 0: the epoch's start, 1: its end
  int64_t t = 0;
  int64_t device_id = 0;
  MemoryKind memory_kind = MemoryKind::Unknown;
  AllocLevel level = AllocLevel::Block;
  int64_t name_id = 0;   // 0: none
  int64_t stack_id = 0;  // 0: none
  int64_t bytes = 0;     // sampled rows by their weight
  int64_t allocations = 0;
  int64_t sampled = 0;            // of allocations, sampled rows
  double sampled_variance = 0;    // sum of sampled_variance(bytes, weight) over those
};

// A span of time with full detail (allocation, transfer, kernel, placement and range rows).
struct DetailSpanRow {
  int64_t id = 0;
  int64_t rank = 0;
  int64_t t_start = 0;
  std::optional<int64_t> t_end;  // NULL: the detail went on to the end of the run
  std::string end_reason;        // why it ended ("" when it did not)
};

}  // namespace zt::db
