// libzt_probe.so's life in a probed process: start at load, InitializeInjection, fork, exec, exit.
//
// Owns: the process's one Recorder (created in the library constructor, closed at exit or
// exec, never destroyed so that late hooks on other threads never touch freed memory), the
// RSS sampler thread, the choice of trace file, and the "CUDA tracing was off" verdict.
//
// Lifecycle:
//  - load (LD_PRELOAD, or dlopen through CUDA_INJECTION64_PATH): read ZT_PROBE_*, open the
//    trace, start the host hooks and the sampler, register atfork and atexit handlers.
//  - InitializeInjection (called by the CUDA driver at cuInit): start the CUPTI collector.
//  - fork: the child stops recording into its parent's recorder at once (it never writes into the
//    parent's trace). A child that goes on without exec (a DataLoader worker) records its own trace
//    beside the parent's (".pidPID.db"), as a worker process of its parent's rank, with a Recorder,
//    writer and sampler of its own (unless ZT_PROBE_FORKS=0). The prepare handler holds the
//    parent's SQLite work (Recorder::hold_for_fork) so that the child finds SQLite's locks free;
//    the child handler does only async-signal-safe work until the parent's recorder is let go,
//    then starts afresh (start_worker). A child that execs closes that trace first, as any process.
//  - exec: the trace is closed first (an exec never runs atexit handlers); the new image, if
//    it loads the probe again, writes its own per-process file (see probe_config.h).
//  - exit: CUPTI force-flushed and drained, then the trace closed with the exit code (status
//    failed where it is not 0), where this process knows it: main's return (main is wrapped through
//    __libc_start_main), exit(), _exit() or _Exit(). `zt probe` writes the root's code into its
//    run row again after the process ends (it also sees a death by signal).
//  - fatal signals: the Recorder's crash handlers (and the collector's, chained before them)
//    write what there is and mark the run.
#include <alloca.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "../crash.h"
#include "../probe_heap.h"
#include "../interpose/host_hooks.h"
#include "../python/python_frames.h"
#include "zero/launcher_env.h"
#include "zt/probe/probe_config.h"
#include "zt/probe/python_error.h"
#include "zt/probe/recorder.h"

#if ZT_PROBE_WITH_CUPTI
#include "zt/probe/cupti_collector.h"
#endif

#define ZT_EXPORT extern "C" __attribute__((visibility("default")))

namespace zt::probe::inject {
namespace {

struct State {
  ProbeConfig cfg;
  Recorder* rec = nullptr;  // never deleted
  DeviceId host_device = 0;
  pid_t owner_pid = 0;
  bool root = false;
  std::atomic<bool> closed{false};
  std::atomic<bool> injection_called{false};
  std::atomic<int> exit_code{-1};  // 0-255 once main returned or exit/_exit was called
  std::string cuda_off_reason;  // set when InitializeInjection could not start CUPTI
  // The uncaught Python exception zt_probe_python_exception reported, written at the end where
  // the process then exits with a code other than 0.
  std::optional<db::ErrorRow> python_error;
  std::string python_exit;
  std::mutex mu;

  // RSS sampler.
  pthread_t sampler{};
  bool sampler_running = false;
  std::atomic<bool> sampler_stop{false};
  NameId n_rss = 0, n_small_bytes = 0, n_small_count = 0;

  // Which process of the job this is (probe_config.h's decide_process_role): its rank row.
  ProcessRole role;
  int world_size = 1;
  std::optional<int> local_rank;
  std::string launch;                     // the launcher's variables, described (config_json "launch")
  std::vector<std::string> launch_notes;  // and what they left unclear

  // A child forked without exec that records its own trace: its parent's pid.
  int64_t forked_from = 0;
};
State* g = nullptr;  // heap-allocated once, never freed (hooks may run during exit)

// A JSON string literal of text (quotes, backslashes and control characters escaped).
std::string json_string(const char* text) {
  std::string out = "\"";
  for (const char* c = text; *c; ++c) {
    if (*c == '"' || *c == '\\') out += '\\', out += *c;
    else if (static_cast<unsigned char>(*c) < 0x20) out += ' ';
    else out += *c;
  }
  return out + "\"";
}

// This process's arguments, quoted as a shell needs them (an argument with a space stays one).
std::string read_cmdline() {
  std::string raw;
  int fd = ::open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return raw;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) raw.append(buf, static_cast<size_t>(n));
  ::close(fd);
  // Each argument ends with a NUL (an empty argument is a lone NUL).
  std::vector<std::string> words;
  size_t start = 0;
  while (start < raw.size()) {
    size_t end = raw.find('\0', start);
    if (end == std::string::npos) end = raw.size();
    words.push_back(raw.substr(start, end - start));
    start = end + 1;
  }
  return shell_quote_command(words);
}

// The parent of `pid`, from /proc/PID/stat ("pid (comm) state ppid ..."; comm may hold spaces
// and parentheses, so the fields are read after its last ')'). 0 when unknown.
pid_t parent_of(pid_t pid) {
  char path[64], buf[512];
  std::snprintf(path, sizeof path, "/proc/%d/stat", int(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char* close_paren = std::strrchr(buf, ')');
  char state = 0;
  int ppid = 0;
  if (!close_paren || std::sscanf(close_paren + 1, " %c %d", &state, &ppid) != 2) return 0;
  return pid_t(ppid);
}

// True when `pid` is this process's parent, grandparent, ...
bool is_ancestor(int64_t pid) {
  pid_t p = getpid();
  for (int depth = 0; depth < 256 && p > 1; ++depth) {
    p = parent_of(p);
    if (p == pid) return true;
  }
  return false;
}

std::string host_name() {
  char h[256] = {0};
  if (gethostname(h, sizeof h - 1) != 0) return "";
  return h;
}

void say(const std::string& line) {
  if (g && g->cfg.quiet) return;
  std::string s = "zt probe: " + line + "\n";
  (void)!::write(2, s.data(), s.size());
}

// One sample: resident set size and the small-allocation sums, as counters.
void sample_once(int statm_fd) {
  if (statm_fd >= 0) {
    char buf[128];
    ssize_t n = ::pread(statm_fd, buf, sizeof buf - 1, 0);
    if (n > 0) {
      buf[n] = 0;
      long size = 0, resident = 0;
      if (std::sscanf(buf, "%ld %ld", &size, &resident) == 2)
        g->rec->counter(0, g->host_device, g->n_rss, double(resident) * double(sysconf(_SC_PAGESIZE)));
    }
  }
  if (g->cfg.host) {
    interpose::SmallTotals s = interpose::small_totals();
    g->rec->counter(0, g->host_device, g->n_small_bytes, double(s.bytes));
    g->rec->counter(0, g->host_device, g->n_small_count, double(s.allocations));
  }
}

// Every rss_interval_ms, and once more when finish() stops it: the last word on memory is
// what the program holds as it ends. (The sampler thread takes that last sample because
// finish() runs at exit, after the exiting thread's thread-locals, the Recorder's ring among
// them, are gone.)
void* sampler_main(void*) {
  interpose::mark_probe_thread();
  int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  const long period_ms = g->cfg.rss_interval_ms;
  while (!g->sampler_stop.load()) {
    sample_once(fd);
    // Sleep in short slices so that exit never waits a whole period.
    timespec slice{0, 10000000};
    for (long waited = 0; waited < period_ms && !g->sampler_stop.load(); waited += 10) nanosleep(&slice, nullptr);
  }
  sample_once(fd);
  if (fd >= 0) ::close(fd);
  return nullptr;
}

// Why CUDA tracing never started, when InitializeInjection was not called at all.
std::string reason_without_injection() {
  if (!g->cfg.cuda) return std::string(kEnvCuda) + "=0";
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!driver)
    return "the program never loaded the CUDA driver libcuda.so.1 (it made no CUDA calls, or no driver is installed)";
  dlclose(driver);
  if (!std::getenv("CUDA_INJECTION64_PATH"))
    return "CUDA_INJECTION64_PATH is not set, so the CUDA driver did not load the probe (run through zt probe)";
  return "the CUDA driver was loaded but never initialized (cuInit failed: no GPU visible?)";
}

// Set by the prepare handler on the thread that forks (the one thread a child has): whether it
// holds the parent recorder's SQLite work (Recorder::hold_for_fork).
thread_local bool t_fork_held __attribute__((tls_model("initial-exec"))) = false;

void before_fork() {
  t_fork_held = false;
  if (!g || !g->rec || !g->cfg.forks || g->closed.load() || getpid() != g->owner_pid) return;
  interpose::ScopedGuard guard;
  // No other thread inside libunwind (its locks), then none inside SQLite (the writer's cycle).
  if (!Recorder::close_unwinding_for_fork(2000)) return;
  t_fork_held = g->rec->hold_for_fork(2000);
  if (!t_fork_held) Recorder::reopen_unwinding_after_fork(false);
  // Then none inside the probe's own heap (a leaf lock: held only inside an allocation there).
  if (t_fork_held) probe_heap_lock_for_fork();
}

void parent_after_fork() {
  if (!t_fork_held) return;
  t_fork_held = false;
  probe_heap_unlock_after_fork();
  g->rec->release_after_fork();
  Recorder::reopen_unwinding_after_fork(false);
}

bool start_recording(const std::string& path);
void start_worker(pid_t parent);

// A forked child's own trace starts when it first records something (an allocation at or above the
// threshold, a zerotrace range), not at the fork: a child that execs at once (a shell's, a
// subprocess's) costs nothing and leaves no file, as before. 0: not a forked worker; 1: forked,
// not started; 2: starting (other threads wait); 3: started, or not started for good.
std::atomic<int> g_worker_state{0};
pid_t g_worker_parent = 0;  // the recording process it was forked from

// Starts the worker's trace where it is pending. True when this call found it pending or starting
// (the caller then looks at whether it records).
bool ensure_worker() {
  int s = g_worker_state.load(std::memory_order_acquire);
  if (s == 1 && g_worker_state.compare_exchange_strong(s, 2)) {
    start_worker(g_worker_parent);
    g_worker_state.store(3, std::memory_order_release);
    return true;
  }
  if (s != 2) return false;
  while (g_worker_state.load(std::memory_order_acquire) == 2) sched_yield();
  return true;
}

void child_after_fork() {
  if (!g) return;
  // Async-signal-safe only (atomic stores, write): the parent's threads are gone, and any lock one
  // of them held stays held here. The parent's recorder is let go, never closed or written.
  const bool parent_recording = g->rec && !g->closed.load() && getppid() == g->owner_pid;
  const bool pending = g_worker_state.load() == 1;  // forked from a worker that had not started yet
  const bool held = t_fork_held;
  t_fork_held = false;
  if (held) probe_heap_unlock_after_fork();
  if (held) Recorder::reopen_unwinding_after_fork(true);
  const bool worker = g->cfg.forks && ((parent_recording && held) || pending);
  interpose::child_after_fork(worker ? ensure_worker : nullptr);
#if ZT_PROBE_WITH_CUPTI
  cupti::child_after_fork();
#endif
  g->closed.store(true);  // the child's atexit must not close the parent's recorder
  g->sampler_running = false;
  if (g->rec) crash::unregister_recorder(g->rec);  // a crash here must not wait on the parent's writer
  if (parent_recording && g->cfg.forks && !held) {
    static const char msg[] =
        "zt probe: a forked child is not recorded: its parent's trace writer or stack unwinding was busy for 2 s at the "
        "fork\n";
    if (!g->cfg.quiet) (void)!::write(2, msg, sizeof msg - 1);
  }
  if (worker && parent_recording) g_worker_parent = getppid();
  g_worker_state.store(worker ? 1 : 0);
}

// Ends this process's recording. `detail` says why when it is not a normal exit.
void finish(const char* detail) {
  // No recorder: the trace could not be opened (the exec and _exit hooks still call in here).
  if (!g || !g->rec || getpid() != g->owner_pid || g->closed.exchange(true)) return;
  interpose::ScopedGuard guard;
  const bool is_exec = detail && std::strncmp(detail, "process image replaced", 22) == 0;
#if ZT_PROBE_WITH_CUPTI
  cupti::stop();  // force-flush and decode everything CUPTI still holds, before the close
#endif
  interpose::stop();
  if (g->sampler_running) {
    g->sampler_stop.store(true);
    pthread_join(g->sampler, nullptr);
    g->sampler_running = false;
  }

  std::string off;
  if (!g->forked_from) {  // a forked worker's CUDA is its parent's (CUDA does not work after fork)
    std::lock_guard lock(g->mu);
    if (!g->injection_called.load()) off = reason_without_injection();
    else off = g->cuda_off_reason;
  }
  if (!off.empty()) {
    // A note, not an error: the program ran as it would have; only the recording was partial.
    const std::string message = "CUDA tracing was off: " + off + "; host allocations were recorded";
    g->rec->note(message);
    // One line, from the process the user started, when it really ends (not at an exec).
    if (g->root && !is_exec && !g->injection_called.load()) say(message);
  }
  const int code = g->exit_code.load();
  std::string why = detail ? detail : "";
  {
    // Python's exit code for an uncaught exception is 1 (a KeyboardInterrupt's death by SIGINT
    // never comes here: zt probe fills its end in); an exit code of 0 means the exception was
    // not what ended the run (a console keeps a handled one in sys.last_value).
    std::lock_guard lock(g->mu);
    if (g->python_error && code != 0) {
      g->rec->error(*g->python_error);
      if (why.empty()) why = g->python_exit;
    }
  }
  Status s = g->rec->close(code > 0 ? RunStatus::Failed : RunStatus::Ok,
                           code >= 0 ? std::optional<int64_t>(code) : std::nullopt, why);
  if (!s) say("closing the trace failed: " + s.message());
  // Other processes of the run (shell wrappers, `readlink`, ...) that recorded nothing would
  // only bury the interesting traces: their files go. A forked worker's sampled rows still live at
  // its end count (its leak is often all small allocations); a shell's subshell that sampled one
  // allocation it freed does not.
  // A few live samples are a shell's subshell (a pyenv shim forks several before it execs Python),
  // not a worker's leak: a worker's sampled rows count from kWorkerSamplesKept live ones (about 2 MiB
  // at the default interval), and never in an image that ends in an exec.
  constexpr int64_t kWorkerSamplesKept = 4;
  const int64_t live_samples = g->forked_from && !is_exec ? interpose::sampled_live_count() : 0;
  const int64_t kept = interpose::recorded_count() + (live_samples >= kWorkerSamplesKept ? live_samples : 0);
  if (s && !g->root && kept == 0 && !g->injection_called.load()) {
    for (const char* suffix : {"", "-wal", "-shm"}) ::unlink((g->rec->path() + suffix).c_str());
  }
}

void at_exit() { finish(nullptr); }

// Opens this process's Recorder at `path` (g->cfg, g->role and the launch description set) and
// starts the host hooks and the RSS sampler. False (said on stderr) when the trace cannot be opened.
bool start_recording(const std::string& path) {
  const ProbeConfig& cfg = g->cfg;
  RecorderOptions opt;
  opt.path = path;
  opt.command_line = cfg.command_line.empty() || !g->root ? read_cmdline() : cfg.command_line;
  opt.config_json = "{\"probe\":\"libzt_probe.so\",\"host_threshold\":" + std::to_string(cfg.host_threshold) +
                    ",\"sample_interval\":" + std::to_string(cfg.host ? cfg.sample_interval : 0) +
                    ",\"max_trace\":" + std::to_string(cfg.max_trace) +
                    ",\"detail\":" + json_string(cfg.detail.text.c_str()) +
                    ",\"flight_recorder\":" + json_string(cfg.flight.text().c_str()) +
                    ",\"flight_memory\":" + std::to_string(cfg.flight.max_bytes) +
                    ",\"stacks\":" + (cfg.stacks ? "true" : "false") +
                    ",\"stack_depth\":" + std::to_string(cfg.stack_depth) +
                    ",\"python_frames\":" + (cfg.python == PythonFrames::Off ? "\"off\"" : cfg.python == PythonFrames::Gil ? "\"gil\"" : "\"own\"") +
                    ",\"python\":" + json_string(python::describe()) +
                    ",\"host\":" + (cfg.host ? "true" : "false") + ",\"cuda\":" + (cfg.cuda ? "true" : "false") +
                    ",\"rss_interval_ms\":" + std::to_string(cfg.rss_interval_ms) +
                    // run_id holds only [A-Za-z0-9._-] (probe_config_from_env checks): no escaping needed.
                    (cfg.run_id.empty() ? std::string() : ",\"run_id\":\"" + cfg.run_id + "\"") +
                    ",\"launch\":" + json_string(g->launch.c_str()) +
                    (g->role.launched_by > 0 ? ",\"launched_by\":" + std::to_string(g->role.launched_by) : std::string()) +
                    (g->forked_from > 0 ? ",\"forked_from\":" + std::to_string(g->forked_from) : std::string()) +
                    "}";
  // Blocking overflow: nothing is dropped. The hooks never hold a lock the writer needs, and
  // the writer's own allocations are not recorded, so waiting for it cannot deadlock.
  opt.overflow = OverflowPolicy::Block;
  opt.ring_events = 8192;  // 768 KiB per recording thread; host rows are rare by design
  opt.crash_handlers = true;
  opt.crash_on_interrupt = false;  // Python's KeyboardInterrupt needs SIGINT at its default
  opt.max_trace_bytes = cfg.max_trace;
  opt.detail = cfg.detail;
  opt.flight = cfg.flight;
  std::unique_ptr<Recorder> rec;
  if (Status s = Recorder::open(opt, &rec); !s) {
    // Said even when quiet: without it `zt probe` could only say that no trace was written.
    std::string m = "zt probe: not recording this process: " + s.message() + "\n";
    (void)!::write(2, m.data(), m.size());
    return false;
  }
  g->rec = rec.release();
  // The world size is the launcher's (torchrun's WORLD_SIZE, mpirun's, srun's), never the
  // number of processes this run starts (compiler checks, data loader workers...); the
  // bootstrap's communicator hook replaces it where the program says otherwise. Every file's
  // rows are key 0 as written: zt probe gives each its job rank (or a process key) at the end.
  g->rec->add_rank(0, g->world_size, g->local_rank, g->role.role, g->role.job_rank);
  for (const std::string& n : g->launch_notes) g->rec->note("launcher variables: " + n);
  g->host_device = g->rec->add_device(0, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false);
  g->n_rss = g->rec->intern("host_rss");
  g->n_small_bytes = g->rec->intern("host_small_bytes_allocated");
  g->n_small_count = g->rec->intern("host_small_allocations");

  if (cfg.host) {
    interpose::HostHookConfig h;
    h.recorder = g->rec;
    h.host_device = g->host_device;
    h.threshold = cfg.host_threshold;
    h.sample_interval = cfg.sample_interval;
    h.sample_seed = cfg.sample_seed;
    h.stacks = cfg.stacks;
    h.stack_depth = cfg.stack_depth;
    interpose::start(h);
  }
  if (cfg.rss_interval_ms > 0) {
    BlockAsyncSignals block;  // the sampler inherits the mask: the program's signals never land on it
    g->sampler_running = pthread_create(&g->sampler, nullptr, sampler_main, nullptr) == 0;
  }
  return true;
}

// The per-process file of this process: "<main>.pidPID.db", "-2", "-3"... when the pid wrote one
// already (the same pid can exec more than once: an earlier image's trace is never overwritten).
std::string own_trace_path() {
  const std::string base = per_process_trace_path(g->cfg.output, getpid());
  std::string path = base;
  for (int n = 2; ::access(path.c_str(), F_OK) == 0 && n < 100; ++n)
    path = base.substr(0, base.size() - 3) + "-" + std::to_string(n) + ".db";
  return path;
}

// In a forked child that goes on without exec, at its first recorded event (ensure_worker): the
// parent's recorder was let go at the fork (never closed, never written: its file stays the
// parent's); this process records its own trace as a worker of its parent's rank. The locks a
// thread of the parent may have held are made anew (the hooks', the Python frames', this module's).
void start_worker(pid_t parent) {
  interpose::ScopedGuard guard;
  new (&g->mu) std::mutex();
  python::child_after_fork();
  interpose::restart_after_fork();
  g->rec = nullptr;  // the parent's: never touched again here
  g->owner_pid = getpid();
  g->root = false;
  g->forked_from = parent;
  g->injection_called.store(false);
  g->cuda_off_reason.clear();
  g->python_error.reset();
  g->python_exit.clear();
  g->exit_code.store(-1);
  g->sampler_stop.store(false);
  // A worker of its parent's rank (a helper's or a worker's worker: of the same rank). zt probe
  // gives it the rank its parent ends up with (the one process of a run without a launcher names
  // none here); the communicator's hook never makes a worker a rank.
  g->role.role = db::RankRole::Worker;
  g->role.launched_by = 0;
  g->role.owns = false;
  if (!start_recording(own_trace_path())) return;
  g->closed.store(false);
}

__attribute__((constructor)) void on_load() {
  interpose::ScopedGuard guard;
  ProbeConfig cfg;
  if (Status s = probe_config_from_env([](const char* k) { return std::getenv(k); }, &cfg); !s) {
    std::string m = "zt probe: not recording this process: " + s.message() + "\n";
    (void)!::write(2, m.data(), m.size());
    return;
  }
  g = new State();
  g->cfg = cfg;
  g->owner_pid = getpid();

  // Which file: the first process of the run claims ZT_PROBE_OUTPUT, every other one
  // (children that exec, the root's own image after an exec) writes a per-process file.
  std::string path = cfg.output;
  const char* claimed = std::getenv(kEnvClaimed);
  if (claimed && *claimed) {
    path = own_trace_path();
  } else {
    g->root = true;
    setenv(kEnvClaimed, std::to_string(getpid()).c_str(), 1);
  }

  // Python frames: the interpreter's symbols are in the process already when it is a python3
  // (the executable or its libpython), so this finds them before anything is recorded.
  python::configure(cfg.python == PythonFrames::Off   ? python::Mode::Off
                    : cfg.python == PythonFrames::Gil ? python::Mode::Gil
                                                      : python::Mode::Own);
  // Which process of the job this is: the launcher's variables, and the owner of the rank they
  // name where this process inherited them (probe_config.h's decide_process_role).
  trainer::JobRank jr = trainer::read_job_rank(trainer::process_environment());
  {
    RankClaim self{jr.has_rank, jr.launcher, jr.rank, jr.world_size};
    std::optional<RankOwner> owner;
    if (const char* o = std::getenv(kEnvRankOwner); o && *o) owner = parse_rank_owner(o);
    const std::string host = host_name();
    const bool here = owner && owner->host == host;
    const bool is_self = here && owner->pid == getpid();
    g->role = decide_process_role(self, g->root, owner, here, is_self, here && !is_self && is_ancestor(owner->pid));
    g->world_size = jr.has_rank && jr.world_size > 0 ? jr.world_size : jr.has_rank ? jr.rank + 1 : 1;
    if (jr.has_rank && jr.world_size == 0)
      jr.notes.push_back("the world size was taken as " + std::to_string(g->world_size) +
                         " (the rank + 1): the launcher did not say it");
    g->local_rank = jr.local_rank;
    if (g->role.owns) setenv(kEnvRankOwner, format_rank_owner(RankOwner{host, getpid(), self}).c_str(), 1);
  }
  g->launch = jr.describe();
  g->launch_notes = jr.notes;
  if (!start_recording(path)) return;
  pthread_atfork(before_fork, parent_after_fork, child_after_fork);
  std::atexit(at_exit);

#if ZT_PROBE_WITH_CUPTI
  // NVTX ranges reach CUPTI only through NVTX's own injection hook; libcupti exports the
  // entry point, so point NVTX at it (unless the user chose something else).
  if (cfg.cuda && !std::getenv("NVTX_INJECTION64_PATH")) {
    if (const char* lib = cupti::library_path()) setenv("NVTX_INJECTION64_PATH", lib, 0);
  }
#endif
}

// An exec replaces the image without running atexit handlers: close the trace first. Returns
// true when this image hands the run's main trace on to the next one: the root image of an exec
// chain that recorded nothing (a pyenv `python3` shim, a shell wrapper) deletes its empty trace,
// and the image it execs claims ZT_PROBE_OUTPUT as the root (the caller takes ZT_PROBE_CLAIMED
// out of the new image's environment), so the data lands at the path given to -o.
bool before_exec(const char* file) {
  if (!g || g->closed.load() || getpid() != g->owner_pid) return false;
  interpose::ScopedGuard guard;
  const bool hand_on = g->rec && g->root && interpose::recorded_count() == 0 && !g->injection_called.load();
  std::string d = std::string("process image replaced by exec of ") + (file ? file : "?");
  finish(d.c_str());
  if (hand_on)
    for (const char* suffix : {"", "-wal", "-shm"}) ::unlink((g->rec->path() + suffix).c_str());
  return hand_on;
}

// envp without ZT_PROBE_CLAIMED, in `out` (room for every entry of envp and the null).
void without_claim(char* const envp[], char** out) {
  const size_t key = std::strlen(kEnvClaimed);
  size_t n = 0;
  for (size_t i = 0; envp && envp[i]; ++i)
    if (!(std::strncmp(envp[i], kEnvClaimed, key) == 0 && envp[i][key] == '=')) out[n++] = envp[i];
  out[n] = nullptr;
}
size_t env_entries(char* const envp[]) {
  size_t n = 0;
  while (envp && envp[n]) ++n;
  return n + 1;
}

}  // namespace
}  // namespace zt::probe::inject

using namespace zt::probe::inject;

// Called by the CUDA driver (cuInit) when CUDA_INJECTION64_PATH names this library.
ZT_EXPORT int InitializeInjection(void) {
  if (!g || !g->rec) return 1;  // not recording this process (bad config, trace not writable)
  zt::probe::interpose::ScopedGuard guard;
  std::lock_guard lock(g->mu);
  if (g->injection_called.exchange(true)) return 1;
  std::string why;
#if ZT_PROBE_WITH_CUPTI
  if (!g->cfg.cuda) {
    why = std::string(zt::probe::kEnvCuda) + "=0";
  } else {
    zt::probe::cupti::CollectorOptions o;
    o.recorder = g->rec;
    o.host_device = g->host_device;
    o.stacks = g->cfg.stacks;
    o.stack_depth = g->cfg.stack_depth;
    why = zt::probe::cupti::start(o);
  }
#else
  why = "this libzt_probe.so was built without CUDA (no CUDA toolkit at build time)";
#endif
  if (!why.empty()) {
    g->cuda_off_reason = why;
    say("CUDA tracing is off: " + why + "; host allocations are still recorded");
  }
  return 1;
}

// The zerotrace Python package's way in (python/zerotrace/_probe.py finds these with ctypes in
// a probed process; nothing else calls them). Each does nothing where this process records
// nothing, and returns at once.

// A range, as an NVTX range would be, without CUDA: "zerotrace::step 3" (domain::name). Returns
// its id for zt_probe_range_end, 0 when not recording. Steps and epochs are derived from these
// when the trace is finished (zt/db/derive_steps.h).
ZT_EXPORT int64_t zt_probe_range_start(const char* name) {
  if (g && g->closed.load()) ensure_worker();  // a forked worker's first mark starts its trace
  if (!g || !g->rec || g->closed.load() || getpid() != g->owner_pid || !name) return 0;
  zt::probe::interpose::ScopedGuard guard;
  zt::probe::MarkerEvent m;
  m.kind = zt::probe::MarkerKind::Range;
  m.name = g->rec->intern(name);
  return g->rec->marker_begin(m);
}
ZT_EXPORT void zt_probe_range_end(int64_t id) {
  if (!g || !g->rec || g->closed.load() || getpid() != g->owner_pid || id <= 0) return;
  zt::probe::interpose::ScopedGuard guard;
  g->rec->marker_end(id);
}

// The program's communicator says who it is (torch.distributed.init_process_group returned).
ZT_EXPORT void zt_probe_set_world(int rank, int world_size, int local_rank) {
  if (!g || !g->rec || g->closed.load() || getpid() != g->owner_pid || world_size < 1 || rank < 0 ||
      rank >= world_size || g->forked_from)  // a forked worker inherited its parent's communicator
    return;
  zt::probe::interpose::ScopedGuard guard;
  // Each process's trace is key 0 of its file; zt probe numbers them by job rank for the merge.
  // The communicator's rank is the job's: a process the launcher's variables did not name (a
  // torch.multiprocessing.spawn child) becomes that rank.
  std::lock_guard lock(g->mu);
  if (g->role.job_rank && *g->role.job_rank != rank && g->role.role == zt::db::RankRole::Rank)
    g->rec->note("the program's communicator says rank " + std::to_string(rank) + "; the launcher's variables said " +
                 std::to_string(*g->role.job_rank) + ": the communicator's is kept");
  g->role.role = zt::db::RankRole::Rank;
  g->role.job_rank = rank;
  g->world_size = world_size;
  if (local_rank >= 0) g->local_rank = local_rank;
  g->rec->add_rank(0, world_size, g->local_rank, g->role.role, g->role.job_rank);
}

// An uncaught Python exception ends the run: an error row (PyTorch's texts read as zt's
// reproductions write them: zt/probe/python_error.h) and the run's exit detail.
// t: when it happened (CLOCK_MONOTONIC ns, as it left a zerotrace range), 0 for now.
ZT_EXPORT void zt_probe_python_exception(const char* type, const char* text, const char* report, int64_t t) {
  if (g && g->closed.load()) ensure_worker();
  if (!g || !g->rec || g->closed.load() || getpid() != g->owner_pid) return;
  zt::probe::interpose::ScopedGuard guard;
  const zt::probe::PythonError pe =
      zt::probe::classify_python_exception(type ? type : "Exception", text ? text : "", report ? report : "");
  zt::db::ErrorRow e;
  e.t = t > 0 ? t : zt::probe::now_ns();
  e.kind = pe.kind;
  e.site = pe.site;
  e.message = pe.message;
  e.tensors = pe.tensors;
  if (pe.device == "cpu") e.device_id = g->host_device;
  std::lock_guard lock(g->mu);
  g->python_error = e;
  g->python_exit = pe.exit_detail;
}

namespace {
using execve_fn = int (*)(const char*, char* const[], char* const[]);
using execv_fn = int (*)(const char*, char* const[]);
template <typename F>
F next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}
}  // namespace

namespace zt::probe::inject {
namespace {
void note_exit_code(int code) {
  if (g && getpid() == g->owner_pid) g->exit_code.store(code & 0xff);  // what the parent's wait sees
}
using main_fn = int (*)(int, char**, char**);
main_fn g_main = nullptr;
int main_noting_its_return(int argc, char** argv, char** envp) {
  const int code = g_main(argc, argv, envp);
  note_exit_code(code);
  return code;
}
}  // namespace
}  // namespace zt::probe::inject

// The program's main, wrapped to note its return: returning from main calls exit inside libc,
// where no interposition reaches. glibc 2.34's __libc_start_main still calls `init` when it is
// not null (older binaries pass their constructors' caller there): passed on unchanged.
#if defined(__x86_64__) || defined(__aarch64__)  // the prototype of these ABIs (powerpc's differs)
ZT_EXPORT int __libc_start_main(main_fn main, int argc, char** argv, void (*init)(void), void (*fini)(void),
                                void (*rtld_fini)(void), void* stack_end) {
  using start_fn = int (*)(main_fn, int, char**, void (*)(void), void (*)(void), void (*)(void), void*);
  static start_fn real = next<start_fn>("__libc_start_main");
  g_main = main;
  return real(main_noting_its_return, argc, argv, init, fini, rtld_fini, stack_end);
}
#endif

ZT_EXPORT void exit(int code) {
  static auto real = next<void (*)(int)>("exit");
  note_exit_code(code);
  real(code);
  __builtin_unreachable();
}

// _exit skips atexit handlers (shells exit this way): end the trace first, as exit would.
ZT_EXPORT void _exit(int code) {
  static auto real = next<void (*)(int)>("_exit");
  note_exit_code(code);
  if (g && !g->closed.load() && getpid() == g->owner_pid) finish("exited through _exit");
  real(code);
  __builtin_unreachable();
}
ZT_EXPORT void _Exit(int code) {
  static auto real = next<void (*)(int)>("_Exit");
  note_exit_code(code);
  if (g && !g->closed.load() && getpid() == g->owner_pid) finish("exited through _Exit");
  real(code);
  __builtin_unreachable();
}

// The environment forms get an environment without the claim where the trace is handed on
// (on this frame's stack: no malloc, usable in a vfork child); the others lose it from environ.
ZT_EXPORT int execve(const char* path, char* const argv[], char* const envp[]) {
  static execve_fn real = next<execve_fn>("execve");
  if (!before_exec(path)) return real(path, argv, envp);
  char** env = static_cast<char**>(alloca(env_entries(envp) * sizeof(char*)));
  without_claim(envp, env);
  return real(path, argv, env);
}
ZT_EXPORT int execv(const char* path, char* const argv[]) {
  static execv_fn real = next<execv_fn>("execv");
  if (before_exec(path)) unsetenv(zt::probe::kEnvClaimed);
  return real(path, argv);
}
ZT_EXPORT int execvp(const char* file, char* const argv[]) {
  static execv_fn real = next<execv_fn>("execvp");
  if (before_exec(file)) unsetenv(zt::probe::kEnvClaimed);
  return real(file, argv);
}
ZT_EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) {
  static execve_fn real = next<execve_fn>("execvpe");
  if (!before_exec(file)) return real(file, argv, envp);
  char** env = static_cast<char**>(alloca(env_entries(envp) * sizeof(char*)));
  without_claim(envp, env);
  return real(file, argv, env);
}

// The list forms: their arguments gathered on the stack (as glibc does: no malloc, so they stay
// usable in a vfork child) into the vector forms above, which close the trace.
namespace {
// Gathers arg0 and the words after it, up to and with their terminating null, into an array on
// this frame's stack and calls exec(argv) with it; `ap` is left after the null (execle's envp).
template <typename Exec>
int with_word_list(const char* arg0, va_list& ap, Exec&& exec) {
  va_list count;
  va_copy(count, ap);
  size_t n = 1;  // the null
  if (arg0) {
    ++n;  // arg0
    while (va_arg(count, char*)) ++n;
  }
  va_end(count);
  char** argv = static_cast<char**>(alloca(n * sizeof(char*)));
  argv[0] = const_cast<char*>(arg0);
  for (size_t k = 1; k < n; ++k) argv[k] = va_arg(ap, char*);
  return exec(argv);
}
}  // namespace
ZT_EXPORT int execl(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  const int rc = with_word_list(arg, ap, [&](char** argv) { return execv(path, argv); });
  va_end(ap);
  return rc;
}
ZT_EXPORT int execlp(const char* file, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  const int rc = with_word_list(arg, ap, [&](char** argv) { return execvp(file, argv); });
  va_end(ap);
  return rc;
}
ZT_EXPORT int execle(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  const int rc = with_word_list(arg, ap, [&](char** argv) {
    char* const* envp = va_arg(ap, char* const*);  // after the list's terminating null
    return execve(path, argv, envp);
  });
  va_end(ap);
  return rc;
}
