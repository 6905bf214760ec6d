// The recording path: per-thread rings, the writer thread, and the run's lifecycle.
// See recorder.h for the invariants; the comments here say how each one is kept.
#include "zt/probe/recorder.h"

#include <cxxabi.h>
#include <errno.h>  // program_invocation_name
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <deque>
#include <memory_resource>
#include <new>
#include <mutex>
#include <regex>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include "aggregates.h"
#include "capture_signal.h"
#include "crash.h"
#include "elf_symbols.h"
#include "probe_heap.h"
#include "zt/db/trace_values.h"
#include "python/python_frames.h"
#include "zt/db/trace_writer.h"
#include "zt/common/units.h"
#include "zt/version.h"

#define UNW_LOCAL_ONLY
#include <libunwind.h>

namespace zt::probe {

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

namespace {
int64_t wall_now_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
std::atomic<uint64_t> g_recorder_serial{1};
constexpr int64_t kIdBlock = 4096;
constexpr int kGiveUpCycles = 64;  // a free whose allocation never shows up is reported after this
}  // namespace

// AllocFreed: the writer's own, in the flight recorder's ring only: an allocation whose row was not
// written, freed (its row with its free, made from the aggregates' record of it).
enum class EventType : uint8_t { Alloc, Free, FreeAddress, Placement, Transfer, Kernel, MarkerBegin, MarkerEnd, Counter, AllocFreed };

// One fixed-size record in a ring; meaning of the generic fields depends on `type`.
struct Event {
  int64_t t0, t1, id, a, b, c, d, e;
  int32_t device, device2, name, stack, aux;
  int32_t rank;  // db/SCHEMA.md allows ranks up to 2^20 - 1
  EventType type;
  uint8_t k0, k1, k2, flags;
};

// Single producer (its thread), single consumer (the writer). head and tail only grow;
// slots [tail, head) are published and immutable until the writer moves tail past them.
static_assert(std::is_trivial_v<Event>, "a ring's slots are its fresh pages, all zero: no constructor runs");

struct ThreadRing {
  // Pages of its own, straight from the kernel (as probe_heap.h's), populated by the mmap itself:
  // zero, so that no field of a slot is ever garbage, and resident from the start, so that the
  // process's RSS does not creep up by a ring's 3 MiB as it fills (the RSS witness of --leaks would
  // read that as growth). Value-initializing every slot wrote the same pages again after the
  // kernel's zeroing, one page fault each (~10 ms of CPU per recording thread).
  struct Free {
    size_t bytes;
    void operator()(Event* p) const { syscall(SYS_munmap, p, bytes); }
  };
  std::unique_ptr<Event[], Free> buf{nullptr, Free{0}};
  uint64_t mask = 0;
  int64_t thread_id = 0;
  alignas(64) std::atomic<uint64_t> head{0};
  uint64_t cached_tail = 0;
  int64_t id_next = 0, id_end = 0;
  alignas(64) std::atomic<uint64_t> tail{0};
  std::atomic<uint64_t> dropped{0};
  std::atomic<bool> retired{false};
  uint64_t dropped_written = 0;  // writer only
};

namespace {
struct TlsEntry {
  uint64_t serial;
  std::shared_ptr<ThreadRing> ring;
  std::pmr::unordered_map<std::pmr::string, NameId> names{probe_heap()};
};
struct TlsState {
  std::vector<TlsEntry> entries;
  uint64_t last_serial = 0;
  TlsEntry* last = nullptr;
  ~TlsState() {
    for (auto& e : entries) e.ring->retired.store(true, std::memory_order_release);
  }
  TlsEntry* find(uint64_t serial) {
    if (last_serial == serial) return last;
    for (auto& e : entries)
      if (e.serial == serial) {
        last_serial = serial;
        last = &e;
        return last;
      }
    return nullptr;
  }
};
thread_local TlsState tls;
thread_local bool tls_is_writer = false;
}  // namespace

struct Recorder::Impl {
  RecorderOptions opt;
  uint64_t serial = 0;
  std::unique_ptr<db::TraceWriter> w;
  db::RunRow run;

  // Slow-path state, under meta_mu. What lives for the whole run is in the probe's own pages
  // (probe_heap.h), not between the program's blocks.
  std::timed_mutex meta_mu;
  std::pmr::unordered_map<std::pmr::string, NameId> strings{probe_heap()};
  NameId next_string = 1;
  std::pmr::unordered_map<uint64_t, int64_t> frame_by_ip{probe_heap()};  // native ips and Python frame tokens
  std::pmr::unordered_map<std::pmr::string, uint64_t> python_function_key{probe_heap()};  // file NUL function -> key
  std::pmr::vector<std::pair<std::pmr::string, std::pmr::string>> python_functions{probe_heap()};  // key - 1 -> (file, function)
  std::pmr::vector<std::pair<int64_t, uint64_t>> frames_all{probe_heap()};  // for symbolization at close
  std::pmr::map<std::pair<int64_t, int64_t>, int64_t> stack_node{probe_heap()};  // (parent, frame) -> node
  std::pmr::unordered_map<std::pmr::string, StackId> stack_by_key{probe_heap()};
  DeviceId next_device = 1;
  std::vector<db::StringRow> p_strings;
  std::vector<db::FrameRow> p_frames;
  std::vector<db::StackRow> p_stacks;
  std::vector<db::DeviceRow> p_devices;
  std::vector<db::RankRow> p_ranks;
  std::vector<db::FaultRow> p_faults;
  std::vector<db::ErrorRow> p_errors;
  std::vector<db::DroppedRow> p_dropped;
  std::vector<std::string> notes;  // written into the run row at the end
  std::atomic<int64_t> errors_lost{0};  // error rows given up on the lock (Recorder::error)
  int64_t errors_lost_written = 0;      // writer only

  std::mutex rings_mu;
  std::vector<std::shared_ptr<ThreadRing>> rings;
  std::atomic<int64_t> id_counter{1};

  // Writer thread control.
  std::thread writer;
  pthread_t writer_tid{};
  std::mutex wmu;
  std::condition_variable wcv, flush_cv;
  bool stop = false;
  uint64_t flush_req = 0, flush_done = 0;
  std::atomic<bool> pressure{false};
  std::atomic<bool> closed{false};
  std::mutex close_mu;  // close(): one caller at a time
  // Held by whichever thread is inside SQLite for this recorder (the writer's cycle, close()'s
  // symbols and finish), and by hold_for_fork(): a child forked while it is held by the forking
  // thread finds SQLite's own locks free (no other thread of the parent was inside it).
  std::timed_mutex sql_mu;
  int64_t t_latest = 0;  // the latest time of any event written (writer thread)
  RunStatus end_status = RunStatus::Ok;
  std::optional<int64_t> end_code;
  std::string end_detail;
  Status writer_status;

  // Crash finalization (set from a signal handler).
  std::atomic<int> crash_request{0};
  std::atomic<bool> crash_done{false};
  RunStatus crash_status = RunStatus::Signal;
  char crash_detail[256] = {};

  // Writer-only state.
  struct PendingFree { int64_t id, t; int cycles; };
  struct PendingEnd { int64_t id, t; std::optional<int64_t> value; int cycles; };
  struct PendingAddrFree { int64_t device; uint64_t address; int64_t t; int cycles; };
  std::vector<PendingFree> pending_frees;
  std::vector<PendingEnd> pending_ends;
  std::vector<PendingAddrFree> pending_addr_frees;
  // (device, address) -> the allocations open there, as (t_alloc, id): an address free closes
  // the one that was live at the free's time, whatever reached the writer in the same cycle.
  std::map<std::pair<int64_t, uint64_t>, std::vector<std::pair<int64_t, int64_t>>> live_by_addr;
  std::atomic<uint64_t> recorded{0};
  int64_t unmatched = 0;
  // Events with a value no trace holds (zt/db/trace_values.h), dropped and counted: a probed
  // program's or CUPTI's garbage must not make the whole trace unreadable. Writer only.
  int64_t out_of_range = 0, out_of_range_written = 0;
  struct Sums {
    int64_t alloc_bytes = 0, alloc_requested = 0, alloc_weight = 0, transfer_bytes = 0, transfer_ns = 0, kernel_ns = 0, placement_bytes = 0;
  } sums;
  bool fits_trace(const Event& e);

  // Aggregates and the detail (db/SCHEMA.md, "Aggregates"). Writer only.
  detail::Aggregates agg;
  std::unordered_map<int64_t, std::pair<MarkerKind, int64_t>> boundary_names;  // string id -> "step N" / "epoch N"
  int64_t rss_name = 0;  // the string id of host_rss, once interned
  // allocated / reserved: the trainer's memory series, a sample at each change: detail, which
  // step_memory replaces outside the detail.
  int64_t allocated_name = 0, reserved_name = 0;
  bool detail_on = true;  // inside a detail window and under the cap
  bool capped = false;    // the trace reached opt.max_trace_bytes: no window opens again
  std::unordered_set<int64_t> skipped_markers;  // ranges begun outside the detail (their ends go too)
  int64_t last_step = -1;      // the last step begun on window_rank
  int32_t window_rank = -1;     // the rank whose steps drive the ring and SIGUSR1's count
  std::map<int32_t, int64_t> rank_step;  // each rank's step begun last: a step window is open while any rank is in one

  // The detail windows (zt/probe/detail_policy.h). Writer only.
  int64_t span_id = 1;        // the detail_span row of the current (or last) stretch
  std::string span_why;       // the window term that opened it
  int64_t span_start = 0;     // its t_start (an end is never before it: the value checks refuse that)
  int64_t first_step = -1;    // the first step number begun
  std::vector<std::regex> capture_res;
  std::unordered_set<int64_t> capture_names;    // string ids of ranges that are capture ranges
  std::unordered_set<int64_t> capture_open;     // their markers begun and not ended
  uint64_t signals_seen = 0;
  bool signal_active = false;
  int64_t signal_t = 0;        // when the last SIGUSR1 was seen (the writer's clock)
  int64_t signal_begun = 0;    // steps begun since then
  int64_t signal_until = 0;    // signal:Ds: the window's end
  // The window term that wants detail at time t ("" none). Changes signal_active when its window ran out.
  std::string want_detail(int64_t t);
  void update_window(int64_t t);
  void open_span(int64_t t, const std::string& why);
  void close_span(int64_t t, const std::string& reason);
  db::AllocationRow allocation_row(int64_t id, const detail::Aggregates::Live& l) const;

  // The flight recorder's ring (RecorderOptions::flight): detail events not written, oldest first.
  struct Kept {
    Event e;
    int64_t t_free;  // an AllocFreed entry's free; else 0
    int64_t t() const { return e.type == EventType::AllocFreed ? t_free : e.t0; }
  };
  std::deque<Kept> ring;
  uint64_t ring_base = 0;                                  // the absolute index of ring.front()
  struct RingStep {
    uint64_t first;  // the absolute index of its first entry
    int64_t second;  // the step
    int64_t t;       // its begin
  };
  std::deque<RingStep> ring_steps;                         // at each step's begin
  int64_t ring_lost_to_memory = 0;                         // entries the memory bound took
  std::string ring_state_written;                          // meta flight_recorder as last written
  void keep(const Event& e, int64_t t_free = 0);
  void ring_step(int64_t step, int64_t t);
  void trim_ring();
  std::string ring_summary() const;
  void write_ring_state();                                 // meta flight_recorder: what a kill -9 would lose
  void write_ring(const std::string& how_ended);           // the end of the run: the ring as detail
  void write_detail_row(const Event& e);                   // placement, transfer, kernel, range, counter

  static constexpr int64_t kDetailSpanId = 1;
  void stop_detail();
  // After a commit (the rows wait in the writer until then): the detail stops once the trace's
  // pages and the indexes the close will build for them reach the cap. The indexes: 0.6 of the
  // rows they index (58% measured on zt synth's mix of allocations, transfers, kernels, markers
  // and counters; docs/probe.md, "Long jobs"). Inside a transaction.
  void check_size() {
    if (detail_on && !capped && opt.max_trace_bytes > 0 && w->size_bytes() / 5 * 8 >= opt.max_trace_bytes) stop_detail();
  }

  void writer_main();
  bool drain(bool final_pass);
  void write_event(const Event& e, std::vector<PendingFree>& frees, std::vector<PendingEnd>& ends,
                   std::vector<PendingAddrFree>& addr_frees);
  void write_meta(bool blocking);
  void resolve_pending(std::vector<PendingFree>& frees, std::vector<PendingEnd>& ends,
                       std::vector<PendingAddrFree>& addr_frees, bool final_pass);
  void symbolize();
};

Recorder::Recorder() : impl_(std::make_unique<Impl>()) {}

const std::string& Recorder::path() const { return impl_->opt.path; }

Status Recorder::open(const RecorderOptions& options, std::unique_ptr<Recorder>* out) {
  std::unique_ptr<Recorder> r(new Recorder());
  Impl& m = *r->impl_;
  m.opt = options;
  size_t cap = 64;
  while (cap < options.ring_events) cap <<= 1;
  m.opt.ring_events = cap;
  m.serial = g_recorder_serial.fetch_add(1);
  if (Status s = db::TraceWriter::create(options.path, &m.w); !s) {
    m.w.reset();
    return s;
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  m.run.id = 1;
  m.run.tool_version = ZT_VERSION;
  m.run.command_line = options.command_line;
  m.run.config_json = options.config_json;
  m.run.seed = options.seed;
  m.run.hostname = host;
  m.run.pid = getpid();
  m.run.t_start = now_ns();
  m.run.wall_start_unix_ns = wall_now_ns();
  m.run.status = RunStatus::Running;
  for (auto& r : options.detail.ranges) {
    try {
      m.capture_res.emplace_back(r);
    } catch (const std::regex_error& e) {
      m.w.reset();
      return Status::Error("--detail range:" + r + ": not a regular expression (" + e.what() + ")");
    }
  }
  m.w->begin();
  m.w->insert(m.run);
  // The first stretch begins with the run; where no window is open at the start (every:N, none, a
  // time window later on), it ends there, so that readers never take the run for detailed.
  db::DetailSpanRow span;
  span.id = Impl::kDetailSpanId;
  span.t_start = m.run.t_start;
  m.span_why = m.want_detail(m.run.t_start);
  m.span_start = m.run.t_start;
  m.detail_on = !m.span_why.empty();
  if (!m.detail_on) {
    span.t_end = m.run.t_start;
    span.end_reason = "no detail window at the start (--detail " + options.detail.text + ")";
  }
  m.w->insert(span);
  m.w->commit();
  // Into the main file now, not at the first automatic checkpoint: a trace copied without
  // its -wal while the run records (a CI artifact of a killed job) still names the run, and
  // its status says it never ended, so `zt check` fails it.
  m.w->checkpoint();
  if (Status s = m.w->status(); !s) {
    m.w.reset();
    return Status::Error(options.path + ": cannot write the run row: " + s.message());
  }
  {
    BlockAsyncSignals block;  // the writer inherits the mask (see recorder.h)
    m.writer = std::thread([&m] { m.writer_main(); });
  }
  if (options.detail.signal) capture_signal::install();
  m.signals_seen = capture_signal::requests();
  if (options.crash_handlers) crash::register_recorder(r.get(), options.crash_on_interrupt);
  *out = std::move(r);
  return Status::Ok();
}

Recorder::~Recorder() {
  // Not closed by its owner: an exception is unwinding past it (a failed run, whatever caused it),
  // or the owner simply let it go (an ended run). A writer that failed still has its thread to join.
  if (impl_->w)
    (void)close(std::uncaught_exceptions() > 0 ? RunStatus::Failed : RunStatus::Ok, std::nullopt,
                std::uncaught_exceptions() > 0 ? "an exception ended the program before it closed the trace" : "");
}

BlockAsyncSignals::BlockAsyncSignals() {
  sigset_t all;
  sigfillset(&all);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT}) sigdelset(&all, sig);
  pthread_sigmask(SIG_BLOCK, &all, &saved_);
}

BlockAsyncSignals::~BlockAsyncSignals() { pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }

// ---------------------------------------------------------------- slow path

void Recorder::add_rank(int rank, int world_size, std::optional<int> local_rank, db::RankRole role,
                        std::optional<int> job_rank) {
  std::lock_guard lock(impl_->meta_mu);
  db::RankRow r;
  r.rank = rank;
  r.world_size = world_size;
  if (local_rank) r.local_rank = *local_rank;
  r.role = role;
  if (job_rank) r.job_rank = *job_rank;
  r.hostname = impl_->run.hostname;
  r.pid = impl_->run.pid;
  impl_->p_ranks.push_back(r);
}

DeviceId Recorder::add_device(int rank, DeviceKind kind, int ordinal, std::string label, std::string name,
                              std::optional<int64_t> capacity_bytes, bool simulated) {
  std::lock_guard lock(impl_->meta_mu);
  db::DeviceRow d;
  d.id = impl_->next_device++;
  d.rank = rank;
  d.kind = kind;
  d.ordinal = ordinal;
  d.label = std::move(label);
  d.name = std::move(name);
  d.capacity_bytes = capacity_bytes;
  d.simulated = simulated;
  impl_->p_devices.push_back(d);
  return d.id;
}

NameId Recorder::intern(std::string_view text) {
  TlsEntry* e = tls.find(impl_->serial);
  if (e) {
    // Heterogeneous lookup would avoid this copy; names are short, so the SSO covers most.
    auto it = e->names.find(std::pmr::string(text, probe_heap()));
    if (it != e->names.end()) return it->second;
  }
  NameId id;
  {
    std::lock_guard lock(impl_->meta_mu);
    auto [it, inserted] = impl_->strings.try_emplace(std::pmr::string(text, probe_heap()), impl_->next_string);
    if (inserted) {
      impl_->next_string++;
      impl_->p_strings.push_back({it->second, std::string(it->first)});
    }
    id = it->second;
  }
  if (!e) {
    ring();  // registers this thread's entry
    e = tls.find(impl_->serial);
  }
  if (e && e->names.size() < 65536) e->names.emplace(std::pmr::string(text, probe_heap()), id);
  return id;
}

StackId Recorder::intern_stack(const uint64_t* ips, int depth) {
  if (depth <= 0) return 0;
  std::pmr::string key(reinterpret_cast<const char*>(ips), sizeof(uint64_t) * depth, probe_heap());
  std::lock_guard lock(impl_->meta_mu);
  Impl& m = *impl_;
  if (auto it = m.stack_by_key.find(key); it != m.stack_by_key.end()) return it->second;
  // Walk from the outermost caller inwards so that common callers share nodes.
  int64_t parent = 0;
  for (int i = depth - 1; i >= 0; --i) {
    auto [fit, fnew] = m.frame_by_ip.try_emplace(ips[i], int64_t(m.frame_by_ip.size() + 1));
    if (fnew) {
      db::FrameRow f;
      f.id = fit->second;
      if (ips[i] & kPythonFrameBit) {
        // A Python frame is complete when it is made: its file and function were copied when its
        // function was interned, and nothing is left to symbolize at close.
        const uint64_t key = (ips[i] & ~kPythonFrameBit) >> kPythonLineBits;
        if (key >= 1 && key <= m.python_functions.size()) {
          f.module = std::string(m.python_functions[key - 1].first);
          f.symbol = std::string(m.python_functions[key - 1].second);
        }
        f.line = int64_t(ips[i] & ((1ull << kPythonLineBits) - 1));
        m.p_frames.push_back(std::move(f));
      } else {
        f.ip = ips[i];
        m.p_frames.push_back(f);
        m.frames_all.emplace_back(f.id, f.ip);
      }
    }
    auto [nit, nnew] = m.stack_node.try_emplace({parent, fit->second}, int64_t(m.stack_node.size() + 1));
    if (nnew) m.p_stacks.push_back({nit->second, parent, fit->second});
    parent = nit->second;
  }
  m.stack_by_key.emplace(std::move(key), parent);
  return parent;
}

uint64_t Recorder::python_function(std::string_view file, std::string_view function) {
  std::pmr::string key(probe_heap());
  key.reserve(file.size() + 1 + function.size());
  key.append(file).push_back('\0');
  key.append(function);
  std::lock_guard lock(impl_->meta_mu);
  Impl& m = *impl_;
  auto [it, fresh] = m.python_function_key.try_emplace(std::move(key), m.python_functions.size() + 1);
  if (fresh) m.python_functions.emplace_back(std::pmr::string(file, probe_heap()), std::pmr::string(function, probe_heap()));
  return it->second;
}

// The unwinding gate (see UnwindPass in recorder.h). A thread counts itself in, then looks at the
// gate: closed, it counts itself out and waits. The prepare handler closes the gate, then waits for
// the count to reach 0: after that no other thread is inside libunwind until the gate reopens.
namespace {
std::atomic<int> g_unwinding{0};
std::atomic<bool> g_unwind_gate_closed{false};
thread_local bool t_unwind_gate_owner __attribute__((tls_model("initial-exec"))) = false;
thread_local int t_unwind_depth __attribute__((tls_model("initial-exec"))) = 0;
}  // namespace

Recorder::UnwindPass::UnwindPass() {
  if (t_unwind_depth++ > 0 || t_unwind_gate_owner) return;  // nested, or the forking thread itself
  for (;;) {
    g_unwinding.fetch_add(1, std::memory_order_seq_cst);
    if (!g_unwind_gate_closed.load(std::memory_order_seq_cst)) break;
    g_unwinding.fetch_sub(1, std::memory_order_seq_cst);
    while (g_unwind_gate_closed.load(std::memory_order_acquire)) {
      timespec ts{0, 50000};
      nanosleep(&ts, nullptr);
    }
  }
  counted_ = true;
}

Recorder::UnwindPass::~UnwindPass() {
  --t_unwind_depth;
  if (counted_) g_unwinding.fetch_sub(1, std::memory_order_release);
}

bool Recorder::close_unwinding_for_fork(int timeout_ms) {
  g_unwind_gate_closed.store(true, std::memory_order_seq_cst);
  for (int waited_us = 0; g_unwinding.load(std::memory_order_seq_cst) != 0; waited_us += 50) {
    if (waited_us >= timeout_ms * 1000) {
      g_unwind_gate_closed.store(false);
      return false;
    }
    timespec ts{0, 50000};
    nanosleep(&ts, nullptr);
  }
  t_unwind_gate_owner = true;
  return true;
}

void Recorder::reopen_unwinding_after_fork(bool in_child) {
  // In the child the other threads are gone: a count one of them left between its two steps goes.
  if (in_child) g_unwinding.store(0);
  t_unwind_gate_owner = false;
  g_unwind_gate_closed.store(false, std::memory_order_release);
}

StackId Recorder::capture_stack(int skip, int max_depth) {
  void* raw[128];
  if (max_depth > 128) max_depth = 128;
  int n;
  {
    UnwindPass pass;  // a fork waits for it (see recorder.h)
    n = unw_backtrace(raw, max_depth + skip + 1);
  }
  uint64_t ips[128];
  int depth = 0;
  for (int i = skip + 1; i < n && depth < max_depth; ++i) ips[depth++] = reinterpret_cast<uint64_t>(raw[i]);
  // In a Python process, the interpreter's frames where it runs them (a copy of ips otherwise).
  uint64_t stack[128 + python::kMaxPythonFrames];
  return intern_stack(stack, python::interleave(*this, ips, depth, stack, int(sizeof stack / sizeof stack[0])));
}

void Recorder::fault(const db::FaultRow& row) {
  db::FaultRow r = row;
  if (r.t == 0) r.t = now_ns();
  std::lock_guard lock(impl_->meta_mu);
  impl_->p_faults.push_back(std::move(r));
}

void Recorder::dropped(int64_t events, std::string_view reason, int rank) {
  if (events <= 0) return;
  db::DroppedRow d;
  d.rank = rank;
  d.thread = static_cast<int64_t>(syscall(SYS_gettid));
  d.t = now_ns();
  d.events = events;
  d.reason = std::string(reason);
  std::lock_guard lock(impl_->meta_mu);
  impl_->p_dropped.push_back(std::move(d));
}

bool Recorder::on_writer_thread() { return tls_is_writer; }

void Recorder::note(std::string text) {
  std::lock_guard lock(impl_->meta_mu);
  impl_->notes.push_back(std::move(text));
}

void Recorder::error(const db::ErrorRow& row) {
  db::ErrorRow r = row;
  if (r.t == 0) r.t = now_ns();
  std::unique_lock lock(impl_->meta_mu, std::defer_lock);
  // An error is often recorded on the way down (std::terminate): never wait forever.
  // Given up: counted, and the writer says so in `dropped` (it needs no lock for that).
  if (!lock.try_lock_for(std::chrono::milliseconds(500))) {
    impl_->errors_lost.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  impl_->p_errors.push_back(std::move(r));
}

std::unique_lock<std::timed_mutex> Recorder::hold_slow_path_lock_for_testing() {
  return std::unique_lock<std::timed_mutex>(impl_->meta_mu);
}

// ---------------------------------------------------------------- hot path

ThreadRing* Recorder::ring() {
  if (TlsEntry* e = tls.find(impl_->serial)) return e->ring.get();
  auto r = std::make_shared<ThreadRing>();
  {
    const size_t bytes = (impl_->opt.ring_events * sizeof(Event) + 4095) & ~size_t(4095);
    const long p = syscall(SYS_mmap, nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == -1) throw std::bad_alloc();
    r->buf = std::unique_ptr<Event[], ThreadRing::Free>(reinterpret_cast<Event*>(p), ThreadRing::Free{bytes});
  }
  r->mask = impl_->opt.ring_events - 1;
  r->thread_id = static_cast<int64_t>(syscall(SYS_gettid));
  {
    std::lock_guard lock(impl_->rings_mu);
    impl_->rings.push_back(r);
  }
  // Rings of recorders closed since (only this thread's entry still holds them) go: a thread that
  // records into one recorder after another (tests, fuzz_cupti_decoder's thousands) kept every
  // ring's memory until it ended.
  std::erase_if(tls.entries, [](const TlsEntry& e) { return e.ring.use_count() == 1; });
  tls.entries.push_back({impl_->serial, r, {}});
  tls.last_serial = 0;
  tls.last = nullptr;
  return r.get();
}

Event* Recorder::reserve(ThreadRing* r) {
  uint64_t h = r->head.load(std::memory_order_relaxed);
  uint64_t cap = r->mask + 1;
  if (h - r->cached_tail >= cap) {
    r->cached_tail = r->tail.load(std::memory_order_acquire);
    while (h - r->cached_tail >= cap) {
      if (impl_->opt.overflow == OverflowPolicy::Drop || impl_->closed.load(std::memory_order_relaxed) ||
          impl_->crash_request.load(std::memory_order_relaxed)) {
        r->dropped.fetch_add(1, std::memory_order_relaxed);
        return nullptr;
      }
      impl_->pressure.store(true, std::memory_order_relaxed);
      impl_->wcv.notify_one();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      r->cached_tail = r->tail.load(std::memory_order_acquire);
    }
  }
  return &r->buf[h & r->mask];
}

void Recorder::publish(ThreadRing* r) {
  r->head.store(r->head.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

int64_t Recorder::next_id(ThreadRing* r) {
  if (r->id_next == r->id_end) {
    r->id_next = impl_->id_counter.fetch_add(kIdBlock, std::memory_order_relaxed);
    r->id_end = r->id_next + kIdBlock;
  }
  return r->id_next++;
}

AllocId Recorder::alloc(const AllocEvent& a) {
  ThreadRing* r = ring();
  AllocId id = next_id(r);
  Event* e = reserve(r);
  if (!e) return id;
  e->type = EventType::Alloc;
  e->t0 = a.t ? a.t : now_ns();
  e->t1 = a.weight_bytes;  // an allocation has no end time: t1 carries a sampled row's weight (0: none)
  e->id = id;
  e->a = static_cast<int64_t>(a.address);
  e->b = a.bytes;
  e->c = a.requested_bytes < 0 ? a.bytes : a.requested_bytes;
  e->d = a.segment;
  e->e = a.stream;
  e->device = static_cast<int32_t>(a.device);
  e->name = static_cast<int32_t>(a.name);
  e->stack = static_cast<int32_t>(a.stack);
  e->rank = static_cast<int32_t>(a.rank);
  e->k0 = uint8_t(a.memory_kind);
  e->k1 = uint8_t(a.level);
  e->k2 = uint8_t(a.source);
  e->flags = a.free_by_address ? 1 : 0;
  publish(r);
  return id;
}

void Recorder::free(AllocId id, int64_t t) {
  ThreadRing* r = ring();
  Event* e = reserve(r);
  if (!e) return;
  e->type = EventType::Free;
  e->t0 = t ? t : now_ns();
  e->id = id;
  publish(r);
}

void Recorder::free_address(DeviceId device, uint64_t address, int64_t t) {
  ThreadRing* r = ring();
  Event* e = reserve(r);
  if (!e) return;
  e->type = EventType::FreeAddress;
  e->t0 = t ? t : now_ns();
  e->device = static_cast<int32_t>(device);
  e->a = static_cast<int64_t>(address);
  publish(r);
}

void Recorder::placement(int rank, NameId tensor, DeviceId device, PlacementWhy why, int64_t bytes,
                         AllocId allocation, int64_t t) {
  ThreadRing* r = ring();
  Event* e = reserve(r);
  if (!e) return;
  e->type = EventType::Placement;
  e->t0 = t ? t : now_ns();
  e->rank = static_cast<int32_t>(rank);
  e->name = static_cast<int32_t>(tensor);
  e->device = static_cast<int32_t>(device);
  e->k0 = uint8_t(why);
  e->b = bytes;
  e->id = allocation;
  publish(r);
}

void Recorder::transfer(const TransferEvent& x) {
  ThreadRing* r = ring();
  Event* e = reserve(r);
  if (!e) return;
  e->type = EventType::Transfer;
  e->t0 = x.t_start ? x.t_start : now_ns();
  e->t1 = x.t_end ? x.t_end : e->t0;
  e->rank = static_cast<int32_t>(x.rank);
  e->k0 = uint8_t(x.kind);
  e->k1 = static_cast<uint8_t>(x.pinned + 1);
  e->k2 = uint8_t(x.source);
  e->b = x.bytes;
  e->device = static_cast<int32_t>(x.src);
  e->device2 = static_cast<int32_t>(x.dst);
  e->e = x.stream;
  e->name = static_cast<int32_t>(x.name);
  e->stack = static_cast<int32_t>(x.op);
  e->aux = x.participants;
  e->c = x.correlation_id;
  e->d = x.stack;
  publish(r);
}

void Recorder::kernel(const KernelEvent& k) {
  ThreadRing* r = ring();
  Event* e = reserve(r);
  if (!e) return;
  e->type = EventType::Kernel;
  e->t0 = k.t_start ? k.t_start : now_ns();
  e->t1 = k.t_end ? k.t_end : e->t0;
  e->rank = static_cast<int32_t>(k.rank);
  e->device = static_cast<int32_t>(k.device);
  e->name = static_cast<int32_t>(k.name);
  e->e = k.stream;
  e->c = k.correlation_id;
  auto pack = [](const uint32_t d[3]) {
    return int64_t(d[0] & 0x1FFFFF) | (int64_t(d[1] & 0x1FFFFF) << 21) | (int64_t(d[2] & 0x1FFFFF) << 42);
  };
  e->a = pack(k.grid);
  e->b = pack(k.block);
  e->k2 = uint8_t(k.source);
  publish(r);
}

MarkerId Recorder::marker_begin(const MarkerEvent& m) {
  ThreadRing* r = ring();
  MarkerId id = next_id(r);
  Event* e = reserve(r);
  if (!e) return id;
  e->type = EventType::MarkerBegin;
  e->t0 = m.t ? m.t : now_ns();
  e->id = id;
  e->rank = static_cast<int32_t>(m.rank);
  e->k0 = uint8_t(m.kind);
  e->name = static_cast<int32_t>(m.name);
  e->a = m.step;
  e->b = m.micro_step;
  e->c = m.epoch;
  publish(r);
  return id;
}

void Recorder::marker_end(MarkerId id, int64_t value, int64_t t) {
  ThreadRing* r = ring();
  Event* e = reserve(r);
  if (!e) return;
  e->type = EventType::MarkerEnd;
  e->t0 = t ? t : now_ns();
  e->id = id;
  e->a = value;
  publish(r);
}

void Recorder::counter(int rank, DeviceId device, NameId name, double value, int64_t t) {
  ThreadRing* r = ring();
  Event* e = reserve(r);
  if (!e) return;
  e->type = EventType::Counter;
  e->t0 = t ? t : now_ns();
  e->rank = static_cast<int32_t>(rank);
  e->device = static_cast<int32_t>(device);
  e->name = static_cast<int32_t>(name);
  std::memcpy(&e->a, &value, sizeof value);
  publish(r);
}

// ---------------------------------------------------------------- writer thread

void Recorder::Impl::write_meta(bool blocking) {
  std::unique_lock lock(meta_mu, std::defer_lock);
  if (blocking) lock.lock();
  else if (!lock.try_lock_for(std::chrono::milliseconds(200))) return;
  auto strings_ = std::move(p_strings);
  auto frames_ = std::move(p_frames);
  auto stacks_ = std::move(p_stacks);
  auto devices_ = std::move(p_devices);
  auto ranks_ = std::move(p_ranks);
  auto faults_ = std::move(p_faults);
  auto errors_ = std::move(p_errors);
  auto dropped_ = std::move(p_dropped);
  p_strings.clear(), p_frames.clear(), p_stacks.clear(), p_devices.clear(), p_ranks.clear(), p_faults.clear(),
      p_errors.clear(), p_dropped.clear();
  lock.unlock();
  for (auto& x : strings_) {
    if (x.text == "host_rss") rss_name = x.id;
    else if (x.text == "allocated") allocated_name = x.id;
    else if (x.text == "reserved") reserved_name = x.id;
    else if (auto b = detail::step_or_epoch_range(x.text)) boundary_names.emplace(x.id, *b);
    if (!capture_res.empty()) {
      // A capture range: its name, or its name without the NVTX domain ("domain::name"), matches
      // one of the --detail range: expressions (as zt probe --step-range matches names).
      const std::string_view name(x.text);
      const size_t p = name.find("::");
      const std::string bare(p == std::string_view::npos ? name : name.substr(p + 2));
      for (auto& re : capture_res)
        if (std::regex_match(x.text, re) || (p != std::string_view::npos && std::regex_match(bare, re))) {
          capture_names.insert(x.id);
          break;
        }
    }
    w->insert(x);
  }
  for (auto& x : frames_) w->insert(x);
  for (auto& x : stacks_) w->insert(x);
  for (auto& x : devices_) w->insert(x);
  for (auto& x : ranks_) w->insert(x);
  for (auto& x : faults_) w->insert(x);
  for (auto& x : errors_) w->insert(x);
  for (auto& x : dropped_) w->insert(x);
}

namespace {
bool time_ok(int64_t t) { return t >= 0 && t <= db::kMaxTraceTime; }
bool size_ok(int64_t b) { return b >= 0 && b <= db::kMaxTraceBytes; }
// Adds `more` to a table's sum unless that passes kMaxTraceSum (then the event is dropped).
bool add_within(int64_t& total, int64_t more) {
  if (more > db::kMaxTraceSum - total) return false;
  total += more;
  return true;
}
// A dropped row the writer itself writes: `events` lost, and why.
void write_dropped(db::TraceWriter& w, int64_t thread, int64_t events, std::string reason) {
  db::DroppedRow d;
  d.thread = thread;
  d.t = now_ns();
  d.events = events;
  d.reason = std::move(reason);
  w.insert(d);
}
}  // namespace

bool Recorder::Impl::fits_trace(const Event& e) {
  switch (e.type) {
    case EventType::Alloc: {
      if (!time_ok(e.t0) || !size_ok(e.b) || !size_ok(e.c) || !size_ok(e.t1)) return false;
      Sums next = sums;
      if (!add_within(next.alloc_bytes, e.b) || !add_within(next.alloc_requested, e.c) ||
          !add_within(next.alloc_weight, e.t1))
        return false;
      sums = next;
      return true;
    }
    case EventType::Transfer: {
      if (!time_ok(e.t0) || !time_ok(e.t1) || e.t1 < e.t0 || !size_ok(e.b)) return false;
      Sums next = sums;
      if (!add_within(next.transfer_bytes, e.b) || !add_within(next.transfer_ns, e.t1 - e.t0)) return false;
      sums = next;
      return true;
    }
    case EventType::Kernel:
      return time_ok(e.t0) && time_ok(e.t1) && e.t1 >= e.t0 && add_within(sums.kernel_ns, e.t1 - e.t0);
    case EventType::Placement:
      return time_ok(e.t0) && e.b <= db::kMaxTraceBytes && (e.b < 0 || add_within(sums.placement_bytes, e.b));
    case EventType::MarkerBegin:
      return time_ok(e.t0) && e.a <= db::kMaxTraceCount && e.b <= db::kMaxTraceCount && e.c <= db::kMaxTraceCount;
    default:  // frees, marker ends, counters: a time
      return time_ok(e.t0);
  }
}

db::AllocationRow Recorder::Impl::allocation_row(int64_t id, const detail::Aggregates::Live& l) const {
  db::AllocationRow a;
  a.id = id;
  a.rank = l.rank;
  a.device_id = l.device;
  a.memory_kind = l.kind;
  a.level = l.level;
  a.source = l.source;
  a.address = l.address;
  a.bytes = l.bytes;
  a.requested_bytes = l.requested;
  a.segment_id = l.segment;
  if (l.stream >= 0) a.stream = l.stream;
  a.t_alloc = l.t_alloc;
  a.name_id = l.name;
  a.stack_id = l.stack;
  if (l.weight > 0) a.weight_bytes = l.weight;
  return a;
}

// The row of a detail event other than an allocation (those are written from the aggregates'
// record: allocation_row) and the closing halves.
void Recorder::Impl::write_detail_row(const Event& e) {
  switch (e.type) {
    case EventType::Placement: {
      db::PlacementRow p;
      p.rank = e.rank;
      p.t = e.t0;
      p.tensor_id = e.name;
      p.device_id = e.device;
      p.why = PlacementWhy(e.k0);
      if (e.b >= 0) p.bytes = e.b;
      p.allocation_id = e.id;
      w->insert(p);
      break;
    }
    case EventType::Transfer: {
      db::TransferRow t;
      t.rank = e.rank;
      t.kind = TransferKind(e.k0);
      if (e.k1 != 0) t.pinned = e.k1 == 2;
      t.source = Source(e.k2);
      t.bytes = e.b;
      t.src_device_id = e.device;
      t.dst_device_id = e.device2;
      t.t_start = e.t0;
      t.t_end = e.t1;
      if (e.e >= 0) t.stream = e.e;
      t.name_id = e.name;
      t.op_id = e.stack;
      if (e.aux > 0) t.participants = e.aux;
      if (e.c >= 0) t.correlation_id = e.c;
      t.stack_id = e.d;
      w->insert(t);
      break;
    }
    case EventType::Kernel: {
      db::KernelRow k;
      k.rank = e.rank;
      k.device_id = e.device;
      k.name_id = e.name;
      k.t_start = e.t0;
      k.t_end = e.t1;
      if (e.e >= 0) k.stream = e.e;
      if (e.c >= 0) k.correlation_id = e.c;
      auto unpack = [](int64_t v) {
        if (v == 0) return std::string();
        return std::to_string(v & 0x1FFFFF) + "," + std::to_string((v >> 21) & 0x1FFFFF) + "," +
               std::to_string((v >> 42) & 0x1FFFFF);
      };
      k.grid = unpack(e.a);
      k.block = unpack(e.b);
      k.source = Source(e.k2);
      w->insert(k);
      break;
    }
    case EventType::MarkerBegin: {
      db::MarkerRow m;
      m.id = e.id;
      m.rank = e.rank;
      m.kind = MarkerKind(e.k0);
      m.name_id = e.name;
      m.t_start = e.t0;
      if (e.a >= 0) m.step = e.a;
      if (e.b >= 0) m.micro_step = e.b;
      if (e.c >= 0) m.epoch = e.c;
      w->insert(m);
      break;
    }
    case EventType::Counter: {
      db::CounterRow c;
      c.rank = e.rank;
      c.device_id = e.device;
      c.name_id = e.name;
      c.t = e.t0;
      std::memcpy(&c.value, &e.a, sizeof c.value);
      w->insert(c);
      break;
    }
    default:
      break;
  }
}

void Recorder::Impl::write_event(const Event& e, std::vector<PendingFree>& frees, std::vector<PendingEnd>& ends,
                                 std::vector<PendingAddrFree>& addr_frees) {
  if (!fits_trace(e)) {
    ++out_of_range;
    return;
  }
  // t1 is set by the events that have an end (transfers, kernels) only: elsewhere it is whatever
  // the ring's slot held (a run end 34 h after its close, read from reused heap memory).
  t_latest = std::max(t_latest, e.t0);
  if (e.type == EventType::Transfer || e.type == EventType::Kernel) t_latest = std::max(t_latest, e.t1);
  switch (e.type) {
    case EventType::Alloc: {
      detail::Aggregates::Live l;
      l.rank = e.rank, l.device = e.device, l.kind = MemoryKind(e.k0), l.level = AllocLevel(e.k1), l.name = e.name;
      l.stack = e.stack, l.bytes = e.b, l.weight = e.t1 > 0 ? e.t1 : 0, l.detailed = detail_on;
      l.source = Source(e.k2), l.t_alloc = e.t0, l.requested = e.c, l.segment = e.d, l.stream = e.e;
      l.address = static_cast<uint64_t>(e.a);
      agg.alloc(e.id, e.t0, l);
      if (detail_on) w->insert(allocation_row(e.id, l));
      if (e.flags & 1) live_by_addr[{e.device, l.address}].emplace_back(e.t0, e.id);
      break;
    }
    case EventType::Free:
      frees.push_back({e.id, e.t0, 0});
      break;
    case EventType::FreeAddress:
      addr_frees.push_back({e.device, static_cast<uint64_t>(e.a), e.t0, 0});
      break;
    case EventType::Placement:
    case EventType::Transfer:
    case EventType::Kernel:
      if (detail_on) write_detail_row(e);
      else keep(e);
      break;
    case EventType::MarkerBegin: {
      const MarkerKind kind = MarkerKind(e.k0);
      bool boundary = true, step_begin = false;
      int64_t step_number = -1;
      if (kind == MarkerKind::Step) {
        step_begin = true;
        agg.boundary_begin(e.id, kind, e.rank, e.t0, e.a, e.c);
        step_number = e.a;
      } else if (kind == MarkerKind::Epoch) {
        agg.boundary_begin(e.id, kind, e.rank, e.t0, -1, e.c);
      } else if (auto b = kind == MarkerKind::Range ? boundary_names.find(e.name) : boundary_names.end();
                 b != boundary_names.end()) {
        const bool step = b->second.first == MarkerKind::Step;
        agg.boundary_begin(e.id, b->second.first, e.rank, e.t0, step ? b->second.second : -1,
                           step ? -1 : b->second.second);
        if (step) step_number = b->second.second, step_begin = true;
      } else {
        boundary = false;
      }
      // A step begins: the step windows and the flight recorder's ring follow it, on the rank of the
      // first step met (the ranks of zt train's threads, or of a merged run, step together: one
      // rank's steps drive them, whose numbers never go back and forth between two ranks'). A
      // capture range begins: its window opens with it.
      if (step_begin && step_number >= 0) {
        if (window_rank < 0) window_rank = e.rank;
        if (first_step < 0) first_step = step_number;
        rank_step[e.rank] = step_number;
        if (e.rank == window_rank) {
          last_step = step_number;
          if (signal_active && e.t0 >= signal_t) ++signal_begun;
          ring_step(last_step, e.t0);
        }
        update_window(e.t0);
      }
      if (!capture_res.empty() && capture_names.count(e.name)) {
        capture_open.insert(e.id);
        update_window(e.t0);
      }
      // Outside the detail: steps and epochs go on; phases, micro-steps and other ranges are detail.
      if (!detail_on && !boundary && kind != MarkerKind::Epoch) {
        skipped_markers.insert(e.id);
        keep(e);
        break;
      }
      write_detail_row(e);
      break;
    }
    case EventType::MarkerEnd: {
      agg.marker_end(e.id, e.t0);
      const bool capture_end = !capture_open.empty() && capture_open.erase(e.id);
      if (!skipped_markers.empty() && skipped_markers.erase(e.id)) keep(e);
      else ends.push_back({e.id, e.t0, e.a == INT64_MIN ? std::nullopt : std::optional<int64_t>(e.a), 0});
      if (capture_end) update_window(e.t0);
      break;
    }
    case EventType::Counter: {
      double value;
      std::memcpy(&value, &e.a, sizeof value);
      if (rss_name != 0 && e.name == rss_name && value >= 0 && value <= double(db::kMaxTraceBytes))
        agg.rss(e.rank, e.t0, int64_t(value));
      if (!detail_on && e.name != 0 && (e.name == allocated_name || e.name == reserved_name)) {
        keep(e);
        break;
      }
      write_detail_row(e);
      break;
    }
    case EventType::AllocFreed:
      break;  // never in a thread's ring
  }
}

// Closing halves (free, marker end) may reach the writer before the row they close,
// when the opening half sits in another thread's ring; they wait a few cycles.
void Recorder::Impl::resolve_pending(std::vector<PendingFree>& frees, std::vector<PendingEnd>& ends,
                                     std::vector<PendingAddrFree>& addr_frees, bool final_pass) {
  for (auto& f : addr_frees) {
    // The allocation live at the free's time: the latest made at this address at or before it.
    // (One made after it, at the address the free gave back, stays open.)
    auto it = live_by_addr.find({f.device, f.address});
    int64_t id = 0;
    if (it != live_by_addr.end()) {
      auto& open = it->second;
      auto match = open.end();
      for (auto c = open.begin(); c != open.end(); ++c)
        if (c->first <= f.t && (match == open.end() || c->first >= match->first)) match = c;
      if (match != open.end()) {
        id = match->second;
        open.erase(match);
        if (open.empty()) live_by_addr.erase(it);
      }
    }
    if (id != 0) {
      frees.push_back({id, f.t, 0});
    } else if (!final_pass && ++f.cycles < kGiveUpCycles) {
      pending_addr_frees.push_back(f);
    } else {
      ++unmatched;
    }
  }
  for (auto& f : frees) {
    detail::Aggregates::Live freed;
    if (agg.free(f.id, f.t, &freed)) {
      if (freed.detailed) {
        w->set_allocation_freed(f.id, f.t);
      } else if (opt.flight.on()) {
        Event k{};  // its row, made at the end from what the aggregates knew of it
        k.type = EventType::AllocFreed;
        k.id = f.id;
        k.t0 = freed.t_alloc;
        k.t1 = freed.weight;
        k.a = static_cast<int64_t>(freed.address);
        k.b = freed.bytes;
        k.c = freed.requested;
        k.d = freed.segment;
        k.e = freed.stream;
        k.device = freed.device;
        k.name = freed.name;
        k.stack = freed.stack;
        k.rank = freed.rank;
        k.k0 = uint8_t(freed.kind);
        k.k1 = uint8_t(freed.level);
        k.k2 = uint8_t(freed.source);
        keep(k, f.t);
      }
      continue;
    }
    if (w->set_allocation_freed(f.id, f.t)) continue;
    if (!final_pass && ++f.cycles < kGiveUpCycles) pending_frees.push_back(f);
    else ++unmatched;
  }
  for (auto& m : ends) {
    if (w->set_marker_end(m.id, m.t, m.value)) continue;
    if (!final_pass && ++m.cycles < kGiveUpCycles) pending_ends.push_back(m);
    else ++unmatched;
  }
}

// One cycle: snapshot ring heads, write the slow-path rows (which every snapshotted event
// may reference), then the events, then the closing halves; commit at least every 50 ms.
bool Recorder::Impl::drain(bool final_pass) {
  std::vector<std::shared_ptr<ThreadRing>> snapshot;
  {
    std::lock_guard lock(rings_mu);
    snapshot = rings;
  }
  std::vector<uint64_t> heads(snapshot.size());
  for (size_t i = 0; i < snapshot.size(); ++i) heads[i] = snapshot[i]->head.load(std::memory_order_acquire);
  std::vector<PendingFree> frees = std::move(pending_frees);
  std::vector<PendingEnd> ends = std::move(pending_ends);
  std::vector<PendingAddrFree> addr_frees = std::move(pending_addr_frees);
  pending_frees.clear(), pending_ends.clear(), pending_addr_frees.clear();

  w->begin();
  write_meta(!final_pass);
  if (!opt.detail.all && (opt.detail.signal || !opt.detail.times.empty())) {
    const int64_t clock = std::max(now_ns(), t_latest);
    if (opt.detail.signal)
      if (const uint64_t n = capture_signal::requests(); n != signals_seen) {
        signals_seen = n;
        signal_active = true;
        signal_t = clock;
        signal_begun = 0;
        signal_until = clock + opt.detail.signal_ns;
        char line[160];
        std::snprintf(line, sizeof line, "SIGUSR1 %.3f s into the run%s: detail for the next %s",
                      double(clock - run.t_start) / 1e9,
                      last_step >= 0 ? (", in step " + std::to_string(last_step)).c_str() : "",
                      opt.detail.signal_steps > 0 ? (std::to_string(opt.detail.signal_steps) + " steps").c_str()
                                                  : format_duration_ns(double(opt.detail.signal_ns)).c_str());
        std::lock_guard lock(meta_mu);
        notes.emplace_back(line);
      }
    update_window(clock);
  }
  bool any = false;
  int64_t t_tx = now_ns();
  uint64_t n_tx = 0;
  for (size_t i = 0; i < snapshot.size(); ++i) {
    ThreadRing& r = *snapshot[i];
    uint64_t t = r.tail.load(std::memory_order_relaxed);
    while (t < heads[i]) {
      write_event(r.buf[t & r.mask], frees, ends, addr_frees);
      ++t;
      if ((++n_tx & 4095) == 0) {
        r.tail.store(t, std::memory_order_release);  // room for a blocked producer
        if (now_ns() - t_tx > 50'000'000) {
          resolve_pending(frees, ends, addr_frees, false);
          frees = std::move(pending_frees), ends = std::move(pending_ends),
          addr_frees = std::move(pending_addr_frees);
          pending_frees.clear(), pending_ends.clear(), pending_addr_frees.clear();
          w->commit();
          w->begin();
          t_tx = now_ns();
          check_size();
        }
      }
    }
    if (t != r.tail.load(std::memory_order_relaxed)) any = true;
    r.tail.store(t, std::memory_order_release);
    uint64_t dropped = r.dropped.load(std::memory_order_relaxed);
    if (dropped != r.dropped_written) {
      write_dropped(*w, r.thread_id, static_cast<int64_t>(dropped - r.dropped_written),
                    "ring buffer full (overflow policy: drop)");
      r.dropped_written = dropped;
    }
  }
  recorded.fetch_add(n_tx, std::memory_order_relaxed);
  resolve_pending(frees, ends, addr_frees, final_pass);
  if (out_of_range > out_of_range_written) {
    write_dropped(*w, 0, out_of_range - out_of_range_written,
                  "events with a value no trace holds (db/SCHEMA.md, Value ranges: a time past 2^62 ns or before 0, "
                  "an end before its start, a size past 2^53 bytes, sums past 2^62)");
    out_of_range_written = out_of_range;
  }
  if (const int64_t lost = errors_lost.load(std::memory_order_relaxed); lost > errors_lost_written) {
    write_dropped(*w, 0, lost - errors_lost_written,
                  "error rows not recorded: the recorder's lock stayed taken for 500 ms (a thread stopped or dying "
                  "inside the recorder)");
    errors_lost_written = lost;
  }
  if (final_pass && unmatched > 0) {
    write_dropped(*w, 0, unmatched, "free or marker end whose opening event is not in the trace");
    unmatched = 0;
  }
  agg.apply(*w);
  if (opt.flight.ns > 0) trim_ring();
  write_ring_state();
  w->commit();
  w->begin();
  check_size();
  w->commit();
  // Threads that ended and whose rings are empty leave the registry.
  {
    std::lock_guard lock(rings_mu);
    std::erase_if(rings, [](const std::shared_ptr<ThreadRing>& r) {
      return r->retired.load(std::memory_order_acquire) &&
             r->tail.load(std::memory_order_relaxed) == r->head.load(std::memory_order_acquire);
    });
  }
  return any;
}

void Recorder::Impl::writer_main() {
  tls_is_writer = true;  // first: before this thread allocates anything (see on_writer_thread)
  writer_tid = pthread_self();
  // Process-directed signals (SIGTERM, SIGINT) go to another thread, which then waits for
  // this one to write the end of the run.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  auto interval = std::chrono::milliseconds(opt.commit_interval_ms);
  // A failed write (a full disk, the file size limit) ends the recording: close() reports it,
  // and producers drop from then on instead of waiting.
  auto fail = [&](Status s) {
    writer_status = std::move(s);
    std::lock_guard lock(wmu);
    flush_done = flush_req = ~0ull;
    flush_cv.notify_all();
    closed.store(true);
  };
  try {
    for (;;) {
      uint64_t req;
      bool stopping;
      {
        std::unique_lock lock(wmu);
        wcv.wait_for(lock, interval, [&] {
          return stop || flush_req != flush_done || pressure.load() || crash_request.load() != 0;
        });
        pressure.store(false);
        req = flush_req;
        stopping = stop;
      }
      std::unique_lock sql(sql_mu);  // released at the end of this cycle (see sql_mu)
      if (crash_request.load()) {
        drain(true);
        w->begin();
        write_ring(std::string("at the crash handler (") + crash_detail + ")");
        agg.finish(*w);
        w->set_run_end(run.id, now_ns(), crash_status, std::nullopt, crash_detail);
        {
          // The notes too (the cap, SIGUSR1's windows), unless the dying thread holds their lock.
          std::unique_lock lock(meta_mu, std::defer_lock);
          if (lock.try_lock_for(std::chrono::milliseconds(200))) {
            const std::vector<std::string> notes_ = notes;
            lock.unlock();
            for (auto& n : notes_) w->add_run_note(run.id, n);
          }
        }
        w->commit();
        crash_done.store(true);
        return;
      }
      bool busy = drain(stopping);
      while (busy && !stopping && !crash_request.load() && w->status().ok()) {
        sql.unlock();  // a fork waiting in hold_for_fork() gets its turn between two drains
        sched_yield();
        sql.lock();
        busy = drain(false);
      }
      if (!w->status().ok()) return fail(w->status());
      {
        std::lock_guard lock(wmu);
        flush_done = req;
      }
      flush_cv.notify_all();
      if (stopping) {
        drain(true);
        w->begin();
        {
          std::string how = "when the trace was closed (run " + std::string(db::to_string(end_status));
          if (end_code) how += ", exit code " + std::to_string(*end_code);
          write_ring(how + ")");
        }
        agg.finish(*w);
        // A run ends after its last event, also where the events' times were given (zt synth's
        // made-up timeline runs ahead of the clock).
        w->set_run_end(run.id, std::max(now_ns(), t_latest), end_status, end_code, end_detail);
        std::vector<std::string> notes_;
        {
          std::lock_guard lock(meta_mu);
          notes_ = notes;
        }
        for (auto& n : notes_) w->add_run_note(run.id, n);
        w->commit();
        if (!w->status().ok()) fail(w->status());
        return;
      }
    }
  } catch (const std::exception& e) {  // no memory for the writer's own vectors
    fail(Status::Error(opt.path + ": writing the trace failed: " + e.what()));
  }
}

// The trace reached its cap (called inside the writer's transaction): from here on only the aggregates (and the small tables: steps, epochs,
// phases, counters, faults, errors) are written, and the flight recorder's ring at the end. The detail span ends at the latest event written.
void Recorder::Impl::stop_detail() {
  capped = true;
  const int64_t t = std::max(t_latest, run.t_start);
  const std::string cap = format_bytes(double(opt.max_trace_bytes));
  close_span(t, "the trace reached its size cap of " + cap + " (--max-trace)");
  char when[64];
  std::snprintf(when, sizeof when, "%.3f s", double(t - run.t_start) / 1e9);
  std::string line = "detail stopped " + std::string(when) + " into the run";
  if (last_step >= 0) line += ", in step " + std::to_string(last_step);
  line += ": the trace reached its size cap of " + cap +
          " (--max-trace, ZT_PROBE_MAX_TRACE); allocations, transfers, kernels, placements, phases, ranges and the "
          "allocated and reserved counters after it are not in the trace; steps, epochs and the aggregates "
          "(step_memory, epoch_live) go on to the end";
  if (opt.flight.on()) line += ", and the flight recorder's last " + opt.flight.text() + " are written at the end";
  std::lock_guard lock(meta_mu);
  notes.push_back(std::move(line));
}

std::string Recorder::Impl::want_detail(int64_t t) {
  const DetailPolicy& p = opt.detail;
  if (p.all) return "all";
  if (p.has_step_terms()) {
    // A step window is open while any rank is inside a chosen step (ranks that lag each other
    // each get the whole of it); before any step, the set-up (first:N).
    auto chosen = [&](int64_t step) -> std::string {
      if (!p.step_selected(step, first_step)) return "";
      if (p.first > 0 && (first_step < 0 || step - first_step < p.first)) return "first:" + std::to_string(p.first);
      if (p.every > 0 && step >= 0 && step % p.every == 0) return "every:" + std::to_string(p.every);
      return "steps";
    };
    if (rank_step.empty()) {
      if (std::string why = chosen(-1); !why.empty()) return why;
    }
    for (auto& [rank, step] : rank_step)
      if (std::string why = chosen(step); !why.empty()) return why;
  }
  const int64_t rel = t - run.t_start;
  for (auto& [a, b] : p.times)
    if (rel >= a && rel < b) return "time";
  if (!capture_open.empty()) return "range";
  if (signal_active) {
    // signal:K: the rest of the step it came in and K steps begun after it (a step whose begin the
    // writer meets only after the signal, though it began before, is not one of them).
    const bool on = p.signal_steps > 0 ? signal_begun <= p.signal_steps : t < signal_until;
    if (on) return "signal (SIGUSR1)";
    signal_active = false;
  }
  return "";
}

void Recorder::Impl::update_window(int64_t t) {
  if (opt.detail.all) return;
  const std::string why = want_detail(t);
  if (!why.empty() && !detail_on && !capped) open_span(t, why);
  else if (why.empty() && detail_on) close_span(t, "the detail window " + span_why + " closed");
}

// A stretch of detail begins at t (inside the writer's transaction): its row, and the rows of the
// allocations live now that the trace lacks, with their own times (so that live sums inside the
// stretch are whole).
void Recorder::Impl::open_span(int64_t t, const std::string& why) {
  db::DetailSpanRow r;
  r.id = ++span_id;
  r.t_start = std::max(t, run.t_start);
  span_start = r.t_start;
  w->insert(r);
  agg.write_undetailed([&](int64_t id, const detail::Aggregates::Live& l) { w->insert(allocation_row(id, l)); });
  detail_on = true;
  span_why = why;
}

void Recorder::Impl::close_span(int64_t t, const std::string& reason) {
  if (!detail_on) return;
  // A boundary of another thread's ring, drained after a window the writer's clock opened, can be
  // older than the window's start: the window then closes where it began.
  w->end_detail_span(span_id, std::max(t, span_start), reason);
  detail_on = false;
}

void Recorder::Impl::keep(const Event& e, int64_t t_free) {
  if (!opt.flight.on()) return;
  ring.push_back({e, t_free});
  const size_t cap = size_t(opt.flight.max_bytes / kFlightEntryBytes);
  while (ring.size() > cap) {
    ring.pop_front();
    ++ring_base;
    ++ring_lost_to_memory;
  }
}

void Recorder::Impl::ring_step(int64_t step, int64_t t) {
  if (!opt.flight.on()) return;
  if (!ring_steps.empty() && ring_steps.back().second == step) return;  // the same step on another rank
  ring_steps.push_back({ring_base + ring.size(), step, t});
  trim_ring();
}

// The ring keeps the last `steps` steps (from the begin of the oldest kept), or what happened in the
// last `ns`; never more than its memory bound (keep()).
void Recorder::Impl::trim_ring() {
  if (opt.flight.steps > 0) {
    while (ring_steps.size() > size_t(opt.flight.steps)) ring_steps.pop_front();
    const uint64_t from = ring_steps.size() == size_t(opt.flight.steps) ? ring_steps.front().first : ring_base;
    while (ring_base < from && !ring.empty()) ring.pop_front(), ++ring_base;
  } else if (opt.flight.ns > 0) {
    while (!ring.empty() && ring.front().t() < t_latest - opt.flight.ns) ring.pop_front(), ++ring_base;
  }
  while (!ring_steps.empty() && ring_steps.front().first < ring_base && ring_steps.size() > 1 &&
         ring_steps[1].first <= ring_base)
    ring_steps.pop_front();
}

std::string Recorder::Impl::ring_summary() const {
  std::string s;
  if (!ring_steps.empty()) {
    const int64_t a = ring_steps.front().second, b = ring_steps.back().second;
    s = a == b ? "step " + std::to_string(a) : "steps " + std::to_string(a) + "-" + std::to_string(b);
    s += ", ";
  }
  s += std::to_string(ring.size()) + " events, " + format_bytes(double(ring.size()) * kFlightEntryBytes);
  if (!ring.empty()) {
    char span[96];
    std::snprintf(span, sizeof span, ", %.3f-%.3f s into the run", double(ring.front().t() - run.t_start) / 1e9,
                  double(t_latest - run.t_start) / 1e9);
    s += span;
  }
  return s;
}

// meta flight_recorder: what the ring holds and that it is in memory only, so that a trace whose
// process was killed by SIGKILL (or whose writer never got to the end) says what it lost. Written
// when the ring's steps change (once a step at most), and at the end, when the ring is written.
void Recorder::Impl::write_ring_state() {
  if (!opt.flight.on() || ring.empty()) return;
  const std::string key = ring_steps.empty() ? "events " + std::to_string(ring.size() / 65536)
                                             : std::to_string(ring_steps.front().second) + "-" +
                                                   std::to_string(ring_steps.back().second);
  if (key == ring_state_written) return;
  ring_state_written = key;
  w->set_meta("flight_recorder", "in memory, not written (" + ring_summary() +
                                     "); written when the run ends; a process killed by SIGKILL loses it");
}

// The end of the run (inside the writer's last transaction): the ring's detail is written as one more
// stretch of detail, with the allocations live at its start that the trace lacks.
void Recorder::Impl::write_ring(const std::string& how_ended) {
  if (!opt.flight.on() || ring.empty()) return;
  const std::string summary = ring_summary();
  // Where the kept detail begins: the oldest kept step's begin, where none of it was dropped; else
  // the oldest event kept. Frees reach the ring at the end of the writer's cycle they were drained
  // in, so a free older than that (of a step the ring no longer holds) is left out.
  int64_t t0 = INT64_MAX;
  for (auto& k : ring)
    if (k.e.type != EventType::AllocFreed) t0 = std::min(t0, k.t());
  if (t0 == INT64_MAX)
    for (auto& k : ring) t0 = std::min(t0, k.t());
  if (!ring_steps.empty() && ring_steps.front().first >= ring_base) {
    // Nothing dropped yet: from the oldest event (the set-up before the first step too), or the first
    // step's begin if earlier; else from the oldest kept step's begin.
    t0 = ring_base == 0 ? std::min(t0, ring_steps.front().t) : ring_steps.front().t;
  }
  if (opt.flight.ns > 0) t0 = std::max(t0, t_latest - opt.flight.ns);
  db::DetailSpanRow r;
  r.id = ++span_id;
  r.t_start = std::max(t0, run.t_start);
  r.t_end = std::max(t_latest, r.t_start);
  r.end_reason = "flight recorder: the last " + opt.flight.text() + " before the end (" + summary + "), written " + how_ended;
  if (ring_lost_to_memory > 0)
    r.end_reason += "; its memory bound (" + format_bytes(double(opt.flight.max_bytes)) + ", --flight-memory) dropped " +
                    std::to_string(ring_lost_to_memory) + " older events";
  w->insert(r);
  // Allocations live now whose rows are not in the trace, then those freed inside the ring's time.
  agg.write_undetailed([&](int64_t id, const detail::Aggregates::Live& l) { w->insert(allocation_row(id, l)); });
  std::unordered_set<int64_t> begun;  // markers whose rows this writes: their ends follow
  for (const Kept& k : ring) {
    const Event& e = k.e;
    if (k.t() < t0) continue;
    switch (e.type) {
      case EventType::AllocFreed: {
        detail::Aggregates::Live l;
        l.rank = e.rank, l.device = e.device, l.kind = MemoryKind(e.k0), l.level = AllocLevel(e.k1), l.name = e.name;
        l.stack = e.stack, l.bytes = e.b, l.weight = e.t1, l.source = Source(e.k2), l.t_alloc = e.t0;
        l.requested = e.c, l.segment = e.d, l.stream = e.e, l.address = static_cast<uint64_t>(e.a);
        db::AllocationRow a = allocation_row(e.id, l);
        a.t_free = k.t_free;
        w->insert(a);
        break;
      }
      case EventType::MarkerBegin:
        begun.insert(e.id);
        write_detail_row(e);
        break;
      case EventType::MarkerEnd:
        if (begun.count(e.id)) w->set_marker_end(e.id, e.t0, e.a == INT64_MIN ? std::nullopt : std::optional<int64_t>(e.a));
        break;
      default:
        write_detail_row(e);
    }
  }
  w->set_meta("flight_recorder", "written " + how_ended + " (" + summary + ")");
  ring.clear();
  ring_steps.clear();
}

void Recorder::flush() {
  Impl& m = *impl_;
  if (m.closed.load()) return;
  std::unique_lock lock(m.wmu);
  uint64_t target = ++m.flush_req;
  m.wcv.notify_one();
  m.flush_cv.wait(lock, [&] { return m.flush_done >= target || m.closed.load(); });
}

void Recorder::Impl::symbolize() {
  std::vector<std::pair<int64_t, uint64_t>> frames;
  {
    std::lock_guard lock(meta_mu);
    frames.assign(frames_all.begin(), frames_all.end());
  }
  if (frames.empty()) return;
  // The program itself is named by dladdr as it was started (argv[0]: "../src/prog"), which means
  // nothing from another directory: its absolute path instead.
  std::string exe;
  {
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n > 0) exe.assign(buf, size_t(n));
  }
  std::map<std::string, std::unique_ptr<ElfSymbols>> elf_tables;  // by module, read at first need
  // Which object holds each frame, from one listing of the loaded objects (elf_symbols.h: dladdr on
  // every frame cost more than the whole recording of an HF job). dladdr is asked only where the
  // listing has no object for an address, or the object's file gives no symbol table.
  LoadedModules modules;
  modules.snapshot();
  w->begin();
  for (auto& [id, ip] : frames) {
    // A return address points after the call; ip-1 lies inside the calling function.
    void* const at = reinterpret_cast<void*>(ip - 1);
    Dl_info info{};
    bool asked_dladdr = false;
    std::string module;
    uint64_t fbase = 0;
    if (const LoadedModules::Module* mod = modules.find(ip - 1)) {
      module = mod->name.empty() ? program_invocation_name : mod->name;  // dladdr's name for the program
      fbase = mod->base;
    } else {
      if (!dladdr(at, &info)) continue;
      asked_dladdr = true;
      module = info.dli_fname ? info.dli_fname : "";
      fbase = reinterpret_cast<uint64_t>(info.dli_fbase);
    }
    std::string symbol;
    const char* raw = nullptr;
    // The program itself: dladdr names it argv[0] as given; its absolute path instead. Another
    // relative name (a library dlopen'ed as "./libx.so", a relative LD_LIBRARY_PATH entry) is made
    // absolute where it resolves; where it does not, its frames keep the name and get no symbol
    // from a file that may not be theirs.
    bool file_known = !module.empty() && module[0] == '/';
    if (!module.empty() && module[0] != '/') {
      if (!exe.empty() && module == program_invocation_name) {
        module = exe, file_known = true;
      } else if (char* abs = ::realpath(module.c_str(), nullptr)) {
        module = abs, file_known = true;
        std::free(abs);
      }
    }
    const ElfSymbols* table = nullptr;
    if (file_known) {
      std::unique_ptr<ElfSymbols>& t = elf_tables[module];
      if (!t) {
        t = std::make_unique<ElfSymbols>();
        t->load(module);
      }
      if (t->size() > 0) table = t.get();
    }
    if (table) {
      // fbase is where the first loaded segment begins: the file's addresses count from its
      // first PT_LOAD's address (0 for ordinary shared libraries and PIE programs).
      raw = table->find(table->position_independent() ? ip - 1 - fbase + table->first_load_address() : ip - 1);
    } else {
      // No symbol table to read (the vDSO, a deleted file): the dynamic symbols, as the loader has them.
      if (!asked_dladdr && !dladdr(at, &info)) info = Dl_info{};
      raw = info.dli_sname;
    }
    if (raw) {
      int st = 0;
      char* dem = abi::__cxa_demangle(raw, nullptr, nullptr, &st);
      symbol = (st == 0 && dem) ? dem : raw;
      std::free(dem);
    }
    std::optional<int64_t> offset;
    if (fbase) offset = static_cast<int64_t>(ip - fbase);
    w->set_frame_symbol(id, module, offset, symbol);
  }
  w->commit();
}

Status Recorder::close(RunStatus status, std::optional<int64_t> exit_code, const std::string& detail) {
  Impl& m = *impl_;
  // The crash handlers must never see a recorder that is going away, however it ends (idempotent).
  crash::unregister_recorder(this);
  std::lock_guard close_lock(m.close_mu);  // two closers never join the writer at once
  if (m.closed.exchange(true)) {
    // Closed before, or the writer failed (it marks the recorder closed, so that producers drop
    // instead of waiting): its thread has ended or is ending, and must be joined before it goes.
    if (m.writer.joinable() && m.writer.get_id() != std::this_thread::get_id()) m.writer.join();
    return m.writer_status;
  }
  {
    std::lock_guard lock(m.wmu);
    m.stop = true;
    m.end_status = status;
    m.end_code = exit_code;
    m.end_detail = detail;
  }
  m.wcv.notify_one();
  if (m.writer.joinable()) m.writer.join();
  if (!m.writer_status) return m.writer_status;
  std::lock_guard sql(m.sql_mu);
  try {
    m.symbolize();
  } catch (const std::exception& e) {
    return Status::Error(m.opt.path + ": writing symbols failed: " + e.what());
  }
  return m.w->finish();
}

bool Recorder::hold_for_fork(int timeout_ms) {
  return impl_->sql_mu.try_lock_for(std::chrono::milliseconds(timeout_ms));
}
void Recorder::release_after_fork() { impl_->sql_mu.unlock(); }

uint64_t Recorder::events_recorded() const { return impl_->recorded.load(); }

uint64_t Recorder::events_dropped() const {
  uint64_t n = 0;
  std::lock_guard lock(impl_->rings_mu);
  for (auto& r : impl_->rings) n += r->dropped.load();
  return n;
}

void Recorder::crash_finalize(RunStatus status, const char* detail, int timeout_ms) {
  Impl& m = *impl_;
  if (m.closed.load() || m.crash_done.load()) return;
  if (m.writer_tid == pthread_self()) return;  // the writer itself is dying: nothing can write
  m.crash_status = status;
  std::strncpy(m.crash_detail, detail, sizeof m.crash_detail - 1);
  m.crash_request.store(1);
  m.wcv.notify_one();
  for (int waited = 0; waited < timeout_ms && !m.crash_done.load(); ++waited) {
    timespec ts{0, 1000000};
    nanosleep(&ts, nullptr);
  }
}

}  // namespace zt::probe
