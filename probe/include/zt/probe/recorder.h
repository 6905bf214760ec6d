// zt/probe/recorder.h: the recording path. Everything the trainer (and later CUPTI and the
// host hooks) observes enters a trace through a Recorder.
//
// Owns: one trace file being written, a writer thread, and one ring buffer per recording
// thread. May call: db/ (TraceWriter) and libunwind. Called by: trainer/, inject/, zt.
//
// Hot path (alloc, free, placement, transfer, kernel, marker, counter): the caller's thread
// writes one fixed-size event into its own single-producer ring and returns; no lock, no
// allocation, no SQL. The writer thread drains every ring into large transactions with
// prepared statements and commits at least every `commit_interval_ms` while events flow.
//
// Invariants:
//  - Nothing is lost silently. A full ring either makes the producer wait (Block, the
//    default) or drops the event and counts it (Drop); counts land in the `dropped` table.
//  - Everything referenced by an event (strings, stacks, devices) is committed no later
//    than the event itself.
//  - A run row exists from open(); its status says "running" until close() or a crash
//    handler sets the end. After SIGKILL the trace opens and says the end is unknown.
//  - One clock: now_ns() is CLOCK_MONOTONIC in nanoseconds.
//  - Aggregates for the whole run (db/SCHEMA.md, "Aggregates": per step and device, per epoch
//    boundary the live set) are written by the writer whether or not the detail is. The detail
//    is written inside the policy's windows (RecorderOptions::detail) until the trace reaches
//    RecorderOptions::max_trace_bytes; one detail_span row per stretch of detail says when, and
//    the flight recorder's ring (RecorderOptions::flight) adds the last steps at the end.
#pragma once

#include <signal.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zt/common/status.h"
#include "zt/db/rows.h"
#include "zt/db/schema.h"
#include "zt/probe/detail_policy.h"

namespace zt::probe {

using db::AllocLevel;
using db::DeviceKind;
using db::MarkerKind;
using db::MemoryKind;
using db::PlacementWhy;
using db::RunStatus;
using db::Source;
using db::TransferKind;

int64_t now_ns();

using NameId = int64_t;    // 0 = none
using StackId = int64_t;   // 0 = none
using DeviceId = int64_t;  // 0 = none
using AllocId = int64_t;
using MarkerId = int64_t;

enum class OverflowPolicy : uint8_t {
  Block,  // the producer waits for the writer: nothing is lost (the trainer's choice)
  Drop,   // the event is dropped and counted (for hooks that must never wait)
};

struct RecorderOptions {
  std::string path;
  std::string command_line;
  std::string config_json;
  std::optional<int64_t> seed;
  size_t ring_events = 1 << 15;  // per recording thread; rounded up to a power of two
  OverflowPolicy overflow = OverflowPolicy::Block;
  int commit_interval_ms = 50;
  bool crash_handlers = true;  // flush and mark the run on fatal signals and std::terminate
  // With crash_handlers: SIGINT too. Off in a process the probe library was preloaded into: an
  // interpreter (Python) installs its own SIGINT handler (KeyboardInterrupt) only where it finds
  // the default one, so a handler of ours there changed what Ctrl-C does to the program.
  bool crash_on_interrupt = true;
  // The size cap of the trace (bytes; 0: none): once its rows reach it, the detail (allocation,
  // transfer, kernel, placement and range rows) stops and the aggregates go on (db/SCHEMA.md,
  // "Aggregates"); the detail_span row and a run note say when.
  int64_t max_trace_bytes = 0;
  // Which stretches get full detail (zt/probe/detail_policy.h; default: all, until the cap).
  // Outside its windows the detail rows are not written; the aggregates are. When a window opens,
  // the allocations live then whose rows the trace lacks are written with their own times, so
  // that live sums inside a window are whole. `signal` terms install a SIGUSR1 handler.
  DetailPolicy detail;
  // The flight recorder: the detail not written (outside the windows, past the cap) of the last
  // steps or seconds, kept by the writer in memory (at most flight.max_bytes) and written when the
  // run ends: close(), the crash handlers (fatal signals, std::terminate). Off here by default
  // (zt probe and zt train turn it on: 20 steps).
  FlightRecorder flight{0, 0, kDefaultFlightBytes};
};

struct AllocEvent {
  int rank = 0;
  DeviceId device = 0;
  MemoryKind memory_kind = MemoryKind::Device;
  AllocLevel level = AllocLevel::Block;
  uint64_t address = 0;
  int64_t bytes = 0;
  int64_t requested_bytes = -1;  // -1: same as bytes
  NameId name = 0;
  StackId stack = 0;
  Source source = Source::Api;
  AllocId segment = 0;  // for a block: the segment it was carved from
  int64_t stream = -1;  // -1: none
  int64_t t = 0;        // 0: now
  // A later free_address(device, address) closes it: the free closes the allocation that was
  // live at that address at the free's time (the one made there last at or before it), also
  // when a new allocation at the same address reaches the writer in the same cycle.
  bool free_by_address = false;
  int64_t weight_bytes = 0;  // a sampled allocation: the bytes it stands for (>= bytes); 0: recorded one by one
};

struct TransferEvent {
  int rank = 0;
  TransferKind kind = TransferKind::H2D;
  int64_t bytes = 0;
  DeviceId src = 0, dst = 0;
  int pinned = -1;  // -1 unknown, 0 pageable, 1 pinned
  int64_t t_start = 0, t_end = 0;
  int64_t stream = -1;
  NameId name = 0;
  NameId op = 0;  // collectives: interned "all_gather", "reduce_scatter", ...
  int participants = 0;
  int64_t correlation_id = -1;
  Source source = Source::Api;
  StackId stack = 0;
};

struct KernelEvent {
  int rank = 0;
  DeviceId device = 0;
  NameId name = 0;
  int64_t t_start = 0, t_end = 0;
  int64_t stream = -1;
  int64_t correlation_id = -1;
  uint32_t grid[3] = {0, 0, 0};
  uint32_t block[3] = {0, 0, 0};
  Source source = Source::Api;
};

struct MarkerEvent {
  int rank = 0;
  MarkerKind kind = MarkerKind::Phase;
  NameId name = 0;
  int64_t step = -1, micro_step = -1, epoch = -1;  // -1: not applicable
  int64_t t = 0;                                   // 0: now
};

struct Event;
struct ThreadRing;

class Recorder {
 public:
  static Status open(const RecorderOptions& options, std::unique_ptr<Recorder>* out);
  ~Recorder();  // closes with status ok when close() was not called
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  const std::string& path() const;

  // --- set-up and slow path: any thread, takes a lock ---
  // Adding a rank again replaces its row (the probe learns the world size from the program's
  // communicator after it started). role and job_rank: rank.role and rank.job_rank (db/SCHEMA.md).
  void add_rank(int rank, int world_size, std::optional<int> local_rank = std::nullopt,
                db::RankRole role = db::RankRole::Rank, std::optional<int> job_rank = std::nullopt);
  DeviceId add_device(int rank, DeviceKind kind, int ordinal, std::string label, std::string name,
                      std::optional<int64_t> capacity_bytes, bool simulated);
  NameId intern(std::string_view text);  // cheap after the first time on a thread
  // ips innermost first. Identical stacks get one id; shared callers share rows. An entry with
  // kPythonFrameBit set is a Python frame (python_frame_token), any other a native ip.
  StackId intern_stack(const uint64_t* ips, int depth);
  // A Python function (source file, qualified name), interned once: the key that
  // python_frame_token() pairs with a line. Slow path (a lock, a map); callers cache the key.
  uint64_t python_function(std::string_view file, std::string_view function);
  static constexpr uint64_t kPythonFrameBit = 1ull << 63;  // never set in a user-space ip
  static constexpr int kPythonLineBits = 24;               // lines above 16777215 read as 0 (unknown)
  static uint64_t python_frame_token(uint64_t function_key, int line) {
    const uint64_t l = line > 0 && line < (1 << kPythonLineBits) ? uint64_t(line) : 0;
    return kPythonFrameBit | (function_key << kPythonLineBits) | l;
  }
  // A libunwind backtrace of the calling thread, `skip` frames above the caller dropped.
  StackId capture_stack(int skip = 0, int max_depth = 32);
  void fault(const db::FaultRow& row);  // id and t filled in when 0
  // Waits at most 500 ms for the slow path's lock (an error is often recorded on the way down,
  // std::terminate, where the lock may never come free); a row given up is counted, and the
  // count lands in `dropped` ("error rows not recorded: ...").
  void error(const db::ErrorRow& row);
  // Something the reader should know that is not an error of the run ("CUDA tracing was off:
  // ..."): kept in the run row's config_json as "notes" (written at close).
  void note(std::string text);
  // Losses the recorder did not see itself (CUPTI's dropped activity records, ...): a row in
  // `dropped` with this reason, so that nothing is lost silently.
  void dropped(int64_t events, std::string_view reason, int rank = 0);
  // True on the writer thread of any Recorder. The LD_PRELOAD interposer uses it so that the
  // writer's own allocations (SQLite's) are neither counted nor recorded, which would feed back.
  static bool on_writer_thread();

  // --- hot path: lock-free, one ring write ---
  AllocId alloc(const AllocEvent& e);
  void free(AllocId id, int64_t t = 0);
  void free_address(DeviceId device, uint64_t address, int64_t t = 0);
  void placement(int rank, NameId tensor, DeviceId device, PlacementWhy why, int64_t bytes = -1,
                 AllocId allocation = 0, int64_t t = 0);
  void transfer(const TransferEvent& e);
  void kernel(const KernelEvent& e);
  MarkerId marker_begin(const MarkerEvent& e);
  void marker_end(MarkerId id, int64_t value = INT64_MIN, int64_t t = 0);
  void counter(int rank, DeviceId device, NameId name, double value, int64_t t = 0);

  // Blocks until every event recorded (by any thread) before the call is committed.
  void flush();
  // Ends the run: drains, marks the run row, symbolizes stacks, builds indexes. Idempotent.
  Status close(RunStatus status = RunStatus::Ok, std::optional<int64_t> exit_code = std::nullopt,
               const std::string& detail = "");

  // fork() in a program that goes on without exec (a DataLoader worker): the prepare handler
  // holds this recorder's SQLite work (waits, at most timeout_ms, for the writer's cycle to end;
  // false when it did not), so that no other thread is inside SQLite, whose global locks the
  // child needs to write its own trace; the parent's handler releases it (only where it held).
  bool hold_for_fork(int timeout_ms);
  void release_after_fork();
  // libunwind's own caches have process-wide locks: a child forked while another thread of its
  // parent was inside unw_backtrace finds one held, and hangs at its first stack. Every backtrace
  // the probe takes is made while an UnwindPass is alive; the prepare handler closes the gate
  // (waits, at most timeout_ms, for the passes alive; false when they did not end, and the gate
  // stays open). The forking thread itself passes a closed gate. Both sides reopen it after the fork.
  // (A pass, not a wrapper function: a wrapper's frame would shift the callers' frame skips.)
  class UnwindPass {
   public:
    UnwindPass();
    ~UnwindPass();
    UnwindPass(const UnwindPass&) = delete;
    UnwindPass& operator=(const UnwindPass&) = delete;

   private:
    bool counted_ = false;
  };
  static bool close_unwinding_for_fork(int timeout_ms);
  static void reopen_unwinding_after_fork(bool in_child);

  uint64_t events_recorded() const;  // committed rows from rings
  uint64_t events_dropped() const;

  // Tests only: the slow path's lock, held until the returned lock goes (what a thread stopped
  // or dying inside the recorder does to the other callers).
  std::unique_lock<std::timed_mutex> hold_slow_path_lock_for_testing();

  // Used by the crash handlers: finish from a dying process (called in a signal handler).
  void crash_finalize(RunStatus status, const char* detail, int timeout_ms);

  struct Impl;

 private:
  Recorder();
  ThreadRing* ring();
  Event* reserve(ThreadRing* r);
  void publish(ThreadRing* r);
  int64_t next_id(ThreadRing* r);
  std::unique_ptr<Impl> impl_;
};

// While alive, the calling thread blocks every asynchronous signal; its mask is restored after.
// Every thread the probe starts (the writer, the RSS sampler, the CUPTI decoder) is created under
// one and inherits the mask, so that a signal the program sends to its process (SIGUSR1 for its
// own sigwait thread, SIGTERM, SIGINT) is never delivered to a probe thread, where its default
// action would end the program (heaptrack's bug 378494). The synchronous fatal signals (SIGSEGV,
// SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT) stay as they were: a fault raises them in the
// thread that made it, and blocked they kill the process without the crash handlers.
class BlockAsyncSignals {
 public:
  BlockAsyncSignals();
  ~BlockAsyncSignals();
  BlockAsyncSignals(const BlockAsyncSignals&) = delete;
  BlockAsyncSignals& operator=(const BlockAsyncSignals&) = delete;

 private:
  sigset_t saved_;
};

// RAII marker: begin in the constructor, end in the destructor.
class ScopedMarker {
 public:
  ScopedMarker(Recorder* rec, const MarkerEvent& e) : rec_(rec), id_(rec ? rec->marker_begin(e) : 0) {}
  ~ScopedMarker() {
    if (rec_) rec_->marker_end(id_);
  }
  ScopedMarker(const ScopedMarker&) = delete;
  ScopedMarker& operator=(const ScopedMarker&) = delete;

 private:
  Recorder* rec_;
  MarkerId id_;
};

}  // namespace zt::probe
