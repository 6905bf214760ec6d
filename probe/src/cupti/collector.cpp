// The CUPTI collector (see zt/probe/cupti_collector.h for what it owns, which threads run what,
// and its two users: libzt_probe.so and `zt train --cupti`).
//
// Why it is shaped this way:
//  - CUPTI's buffer callbacks run on CUPTI's threads and stall the application's CUDA work
//    while they run, so they only pass pointers: decoding happens on our own thread.
//  - Buffers come from a pool allocated up front (kPoolInitial x kBufferBytes) and grow to a
//    cap; past the cap CUPTI is handed no buffer, drops records and counts them, and the
//    count is written to the trace (`dropped`), never lost silently.
//  - CUPTI timestamps are put on our clock by registering now_ns() as CUPTI's timestamp source
//    before any activity is enabled, so every row of a trace shares CLOCK_MONOTONIC ns.
//  - CONCURRENT_KERNEL is enabled first: enabling it late can stall for seconds on module load.
//  - Never call a flush from a resource callback (STREAM_DESTROY_STARTING deadlocks); we only
//    flush at cudaDeviceReset entry, at stop (exit) and on fatal signals.
//  - libcuda is never linked: the driver is looked up at run time (under injection it is loaded
//    by then, since the driver is what calls InitializeInjection; in `zt train` it is loaded by
//    the time a record names a device), so the library, and zt, load without one.
//  - In-process (zt train) the recorder is closed and destroyed soon after stop(), so stop()
//    turns off everything that could reach it later: the Callback API checks `accepting` first,
//    and once the decoder has written its last row the activities are disabled and the
//    subscription dropped.
#include "zt/probe/cupti_collector.h"

#include <cupti.h>
#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <time.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "../interpose/guard.h"
#include "../python/python_frames.h"
#include "correlation_stacks.h"
#include "zt/probe/cupti_decoder.h"

#define UNW_LOCAL_ONLY
#include <libunwind.h>

namespace zt::probe::cupti {
namespace {

constexpr size_t kBufferBytes = 4 << 20;
constexpr int kPoolInitial = 8;
constexpr int kPoolMax = 64;

// The activity kinds recorded, CONCURRENT_KERNEL first (see the top comment).
const std::pair<CUpti_ActivityKind, const char*> kKinds[] = {
    {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, "CONCURRENT_KERNEL"},
    {CUPTI_ACTIVITY_KIND_MEMORY2, "MEMORY2"},
    {CUPTI_ACTIVITY_KIND_MEMORY_POOL, "MEMORY_POOL"},
    {CUPTI_ACTIVITY_KIND_MEMCPY, "MEMCPY"},
    {CUPTI_ACTIVITY_KIND_MEMCPY2, "MEMCPY2"},
    {CUPTI_ACTIVITY_KIND_MEMSET, "MEMSET"},
    {CUPTI_ACTIVITY_KIND_RUNTIME, "RUNTIME"},
    {CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, "SYNCHRONIZATION"},
    {CUPTI_ACTIVITY_KIND_MARKER, "MARKER"},
    {CUPTI_ACTIVITY_KIND_MARKER_DATA, "MARKER_DATA"},
};

struct Completed {
  uint8_t* buffer;
  size_t valid;
};

struct Collector {
  CollectorOptions opt;
  CUpti_SubscriberHandle subscriber = nullptr;
  bool subscribed = false;
  std::vector<CUpti_ActivityKind> enabled_kinds;
  std::atomic<bool> running{false};    // started and not yet stopped
  std::atomic<bool> accepting{false};  // the Callback API may write into the recorder
  std::atomic<int> in_callback{0};     // Callback API calls under way (stop() waits for them)
  std::atomic<bool> forked{false};
  std::atomic<bool> stopped{false};  // stop() began: a process starts once
  std::atomic<bool> decoded{false};  // the decoder thread has exited: late buffers go back to the pool

  std::mutex pool_mu;
  std::vector<uint8_t*> free_buffers;
  int buffers_allocated = 0;

  std::mutex q_mu;
  std::condition_variable q_cv;
  std::deque<Completed> queue;
  std::atomic<int> pending{0};  // buffers queued or being decoded
  bool q_stop = false;
  std::thread decoder_thread;

  std::atomic<uint64_t> dropped_by_cupti{0};
  uint64_t dropped_written = 0;  // decoder thread only

  CorrelationStacks stacks;
  std::unique_ptr<Decoder> decoder;

  // Address ranges of the code between the application and our callback (CUPTI, the driver,
  // libzt_probe.so): their frames are dropped from the top of each stack.
  std::vector<std::pair<uintptr_t, uintptr_t>> skip_ranges;
};
Collector* g = nullptr;  // never freed: CUPTI may call back during exit

void take_buffer_back(uint8_t* b) {
  std::lock_guard lock(g->pool_mu);
  g->free_buffers.push_back(b);
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  interpose::ScopedGuard guard;
  *max_records = 0;
  std::lock_guard lock(g->pool_mu);
  if (g->free_buffers.empty() && g->buffers_allocated < kPoolMax) {
    if (void* p = aligned_alloc(8, kBufferBytes)) {
      g->free_buffers.push_back(static_cast<uint8_t*>(p));
      ++g->buffers_allocated;
    }
  }
  if (g->free_buffers.empty()) {
    *buffer = nullptr;
    *size = 0;  // CUPTI drops records and counts them; the count reaches the trace
    return;
  }
  *buffer = g->free_buffers.back();
  g->free_buffers.pop_back();
  *size = kBufferBytes;
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t* buffer, size_t size, size_t valid) {
  interpose::ScopedGuard guard;
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(ctx, stream_id, &dropped) == CUPTI_SUCCESS && dropped)
    g->dropped_by_cupti.fetch_add(dropped);
  if (!buffer) return;
  if (valid == 0 || g->forked.load() || g->decoded.load()) {
    take_buffer_back(buffer);
    return;
  }
  g->pending.fetch_add(1);
  {
    std::lock_guard lock(g->q_mu);
    g->queue.push_back({buffer, valid});
  }
  g->q_cv.notify_one();
}

void write_dropped() {
  uint64_t d = g->dropped_by_cupti.load();
  if (d > g->dropped_written) {
    g->opt.recorder->dropped(static_cast<int64_t>(d - g->dropped_written),
                             "CUPTI dropped activity records (its buffers were full)", g->opt.rank);
    g->dropped_written = d;
  }
}

void decoder_main() {
  interpose::mark_probe_thread();
  for (;;) {
    Completed c;
    {
      std::unique_lock lock(g->q_mu);
      g->q_cv.wait(lock, [] { return g->q_stop || !g->queue.empty(); });
      if (g->queue.empty()) {
        // Stopping and drained. finish() records rows, so it runs here: stop() runs at exit
        // on a thread whose thread-locals (its Recorder ring) are already destroyed.
        lock.unlock();
        write_dropped();
        g->decoder->finish();
        return;
      }
      c = g->queue.front();
      g->queue.pop_front();
    }
    CUpti_Activity* record = nullptr;
    while (cuptiActivityGetNextRecord(c.buffer, c.valid, &record) == CUPTI_SUCCESS) g->decoder->decode(record);
    take_buffer_back(c.buffer);
    write_dropped();
    g->pending.fetch_sub(1);
  }
}

bool wait_drained(int timeout_ms) {
  for (int waited = 0; waited < timeout_ms; ++waited) {
    if (g->pending.load() == 0) return true;
    timespec ts{0, 1000000};
    nanosleep(&ts, nullptr);
  }
  return g->pending.load() == 0;
}

uint64_t CUPTIAPI timestamp_now() { return static_cast<uint64_t>(now_ns()); }

int collect_skip_range(dl_phdr_info* info, size_t, void* data) {
  auto* out = static_cast<std::vector<std::pair<uintptr_t, uintptr_t>>*>(data);
  const char* name = info->dlpi_name ? info->dlpi_name : "";
  Dl_info self{};
  dladdr(reinterpret_cast<void*>(&collect_skip_range), &self);
  // This collector's own object only when it is a shared library (libzt_probe.so): linked into
  // an executable (zt train --cupti) that object is the application, whose frames are the story.
  // (dl_iterate_phdr names the executable "", dladdr by argv[0]: the two never match.)
  bool ours = name[0] != '\0' && self.dli_fname && std::strcmp(self.dli_fname, name) == 0;
  if (!ours && !std::strstr(name, "libcupti") && !std::strstr(name, "libcuda.so")) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X))
      out->emplace_back(info->dlpi_addr + ph.p_vaddr, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
  }
  return 0;
}

bool in_skip_range(uintptr_t ip) {
  for (auto& [lo, hi] : g->skip_ranges)
    if (ip >= lo && ip < hi) return true;
  return false;
}

// Callback API, on the application's thread at API entry.
void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API) return;
  // Counted before `accepting` is read (both sequentially consistent): either stop() sees this
  // call under way and waits for it, or this call sees that stop() began and leaves.
  g->in_callback.fetch_add(1);
  struct Leave {
    ~Leave() { g->in_callback.fetch_sub(1); }
  } leave;
  if (!g->accepting.load() || g->forked.load()) return;
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (cb->callbackSite != CUPTI_API_ENTER) return;
  interpose::ScopedGuard guard;
  if (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaDeviceReset_v3020) {
    cuptiActivityFlushAll(0);  // the context and its records go away with the reset
    return;
  }
  if (!g->opt.stacks) return;
  void* raw[160];
  int n;
  {
    Recorder::UnwindPass pass;  // a fork waits for it (see recorder.h)
    n = unw_backtrace(raw, g->opt.stack_depth + 32);
  }
  // raw[0] is this callback's own frame (in libzt_probe.so also inside a skip range; linked into
  // zt it is not); CUPTI's and the driver's frames follow.
  int first = 1;
  while (first < n && in_skip_range(reinterpret_cast<uintptr_t>(raw[first]))) ++first;
  uint64_t ips[160];
  int depth = 0;
  for (int i = first; i < n && depth < g->opt.stack_depth; ++i) ips[depth++] = reinterpret_cast<uint64_t>(raw[i]);
  // The calling thread's Python frames where the interpreter runs them (PyTorch calls cudaMalloc
  // with the GIL released: its frames are read all the same, see python_frames.h).
  uint64_t stack[160 + python::kMaxPythonFrames];
  const int m = python::interleave(*g->opt.recorder, ips, depth, stack, int(sizeof stack / sizeof stack[0]));
  g->stacks.put(cb->correlationId, g->opt.recorder->intern_stack(stack, m));
}

// Fatal signals: hand CUPTI's buffered records to the recorder before the recorder's own
// crash handler (installed earlier, so called after us) writes the end of the run.
constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTERM, SIGINT, SIGHUP};
struct sigaction g_previous[sizeof kSignals / sizeof kSignals[0]];
std::atomic<bool> g_in_signal{false};

void on_signal(int sig, siginfo_t* info, void* ctx) {
  // Not async-signal-safe (CUPTI takes locks): a best effort from a process that is dying
  // anyway, bounded in time so that a deadlocked flush cannot keep it alive.
  if (!g_in_signal.exchange(true) && g && g->running.load() && !g->forked.load()) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    wait_drained(2000);
    g_in_signal.store(false);
  }
  for (size_t i = 0; i < sizeof kSignals / sizeof kSignals[0]; ++i) {
    if (kSignals[i] != sig) continue;
    const struct sigaction& prev = g_previous[i];
    if (prev.sa_flags & SA_SIGINFO) {
      if (prev.sa_sigaction) prev.sa_sigaction(sig, info, ctx);
      return;
    }
    if (prev.sa_handler == SIG_IGN) return;
    if (prev.sa_handler != SIG_DFL) {
      prev.sa_handler(sig);
      return;
    }
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void install_signal_handlers() {
  // Once per process: a second installation would save our own handler as "the previous one".
  static bool installed = false;
  if (installed) return;
  installed = true;
  for (size_t i = 0; i < sizeof kSignals / sizeof kSignals[0]; ++i) {
    struct sigaction sa{};
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(kSignals[i], &sa, &g_previous[i]);
    if (!(g_previous[i].sa_flags & SA_SIGINFO) && g_previous[i].sa_handler == SIG_IGN)
      sigaction(kSignals[i], &g_previous[i], nullptr);  // the program chose to ignore it
  }
}

std::string result_text(CUptiResult r) {
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  return s ? s : ("CUPTI error " + std::to_string(int(r)));
}

// A driver entry point: from the loaded libcuda.so.1 itself (the CUDA runtime may have opened it
// RTLD_LOCAL, out of RTLD_DEFAULT's reach), else from the global scope.
void* driver_symbol(const char* symbol) {
  static void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  void* p = driver ? dlsym(driver, symbol) : nullptr;
  return p ? p : dlsym(RTLD_DEFAULT, symbol);
}

// Device name and memory through the driver, looked up at run time (see the top comment). Called
// on the decoder thread, when a record first names the device: the driver is loaded by then.
DeviceInfo device_info(uint32_t ordinal) {
  using get_fn = int (*)(int*, int);
  using name_fn = int (*)(char*, int, int);
  using mem_fn = int (*)(size_t*, int);
  static auto get = reinterpret_cast<get_fn>(driver_symbol("cuDeviceGet"));
  static auto name = reinterpret_cast<name_fn>(driver_symbol("cuDeviceGetName"));
  static auto mem = reinterpret_cast<mem_fn>(driver_symbol("cuDeviceTotalMem_v2"));
  DeviceInfo info;
  int dev = 0;
  if (!get || get(&dev, static_cast<int>(ordinal)) != 0) return info;
  char buf[256] = {};
  if (name && name(buf, sizeof buf - 1, dev) == 0) info.name = buf;
  size_t bytes = 0;
  if (mem && mem(&bytes, dev) == 0) info.capacity_bytes = static_cast<int64_t>(bytes);
  return info;
}

// Without a driver CUPTI only says CUPTI_ERROR_UNKNOWN: name the cause. Asked only after a
// failure (under injection the driver is loaded, so this adds nothing there).
std::string driver_note() {
  void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h) {
    dlclose(h);
    return "";
  }
  const char* e = dlerror();
  return std::string(" (no CUDA driver: ") + (e ? e : "libcuda.so.1 cannot be loaded") + ")";
}

// Undoes a start() that failed part of the way, so that nothing refers to its recorder and a
// later start() begins afresh. (The activity callbacks and the clock stay registered with CUPTI:
// nothing takes them back, and with no activity enabled they are never called.)
std::string start_failed(std::string why) {
  for (CUpti_ActivityKind k : g->enabled_kinds) cuptiActivityDisable(k);
  g->enabled_kinds.clear();
  if (g->subscribed) {
    cuptiUnsubscribe(g->subscriber);
    g->subscribed = false;
  }
  g->decoder.reset();
  g->skip_ranges.clear();
  return why;
}

}  // namespace

const char* library_path() {
  static std::string path;
  if (path.empty()) {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&cuptiActivityFlushAll), &info) && info.dli_fname) path = info.dli_fname;
  }
  return path.empty() ? nullptr : path.c_str();
}

std::string start(const CollectorOptions& options) {
  if (!options.recorder) return "no trace to record into";
  if (g && g->running.load()) return "";
  if (g && g->stopped.load()) return "CUDA tracing already ran and stopped in this process (it starts once)";
  interpose::ScopedGuard guard;
  if (!g) g = new Collector();
  g->opt = options;

  // The Callback API first: it is the part another profiler may already hold.
  char other[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN + 64] = {};
  CUpti_SubscriberParams params{};
  params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
  params.subscriberName = "zerotrace";
  params.oldSubscriberName = other;
  params.oldSubscriberSize = sizeof other;
  CUptiResult r = cuptiSubscribe_v2(&g->subscriber, on_api, nullptr, &params);
  if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
    return start_failed(std::string("another profiler already holds CUPTI (") + (other[0] ? other : "name not given") +
                        ")");
  if (r != CUPTI_SUCCESS) return start_failed("CUPTI could not subscribe: " + result_text(r) + driver_note());
  g->subscribed = true;

  for (uint32_t cbid = 1; cbid < CUPTI_RUNTIME_TRACE_CBID_SIZE; ++cbid) {
    const char* name = nullptr;
    if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &name) != CUPTI_SUCCESS || !name) continue;
    std::string api = api_name_without_version(name);
    if (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaDeviceReset_v3020 || (options.stacks && api_wants_stack(api)))
      cuptiEnableCallback(1, g->subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, cbid);
  }
  dl_iterate_phdr(collect_skip_range, &g->skip_ranges);

  DecoderHooks hooks;
  hooks.device_info = device_info;
  hooks.runtime_api_name = [](uint32_t cbid) {
    const char* name = nullptr;
    cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &name);
    return std::string(name ? name : "");
  };
  hooks.take_stack = [](uint32_t corr) { return g->stacks.take(corr); };
  g->decoder = std::make_unique<Decoder>(*options.recorder, options.host_device, std::move(hooks), options.rank);

  {
    std::lock_guard lock(g->pool_mu);
    for (int i = g->buffers_allocated; i < kPoolInitial; ++i)  // a retried start keeps its pool
      if (void* p = aligned_alloc(8, kBufferBytes)) {
        g->free_buffers.push_back(static_cast<uint8_t*>(p));
        ++g->buffers_allocated;
      }
  }
  if ((r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed)) != CUPTI_SUCCESS)
    return start_failed("CUPTI refused the activity buffers: " + result_text(r));
  if ((r = cuptiActivityRegisterTimestampCallback(timestamp_now)) != CUPTI_SUCCESS)
    return start_failed("CUPTI would not use our clock (CLOCK_MONOTONIC): " + result_text(r));

  std::string failed;
  for (auto& [kind, label] : kKinds) {
    CUptiResult e = cuptiActivityEnable(kind);
    if (e == CUPTI_SUCCESS) g->enabled_kinds.push_back(kind);
    else failed += std::string(failed.empty() ? "" : ", ") + label + " (" + result_text(e) + ")";
  }
  if (g->enabled_kinds.empty()) return start_failed("CUPTI enabled no activity kind: " + failed + driver_note());
  if (!failed.empty()) {
    db::ErrorRow e;
    e.kind = "cuda_tracing_partial";
    e.site = "probe.cupti";
    e.message = "CUPTI refused some activity kinds, their rows are missing: " + failed;
    options.recorder->error(e);
  }

  {
    BlockAsyncSignals block;  // the decoder inherits the mask: the program's signals never land on it
    g->decoder_thread = std::thread(decoder_main);
  }
  g->running.store(true);
  g->accepting.store(true);
  install_signal_handlers();
  // Registered after the CUDA runtime's own exit handler, so it runs first: the records are
  // flushed while the contexts still exist (NVIDIA's injection sample does the same). Where the
  // caller stops explicitly (zt train) this one finds nothing to do.
  static bool at_exit_registered = false;
  if (!at_exit_registered) at_exit_registered = std::atexit(stop) == 0;
  return "";
}

void stop() {
  if (!g || !g->running.load() || g->forked.load() || g->stopped.exchange(true)) return;
  interpose::ScopedGuard guard;
  g->accepting.store(false);  // no more stacks into the recorder...
  for (int waited_us = 0; g->in_callback.load() != 0 && waited_us < 5000000; waited_us += 100) {
    timespec ts{0, 100000};  // ...once the calls already under way have left (at most 5 s)
    nanosleep(&ts, nullptr);
  }
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);  // blocking: every buffer is queued on return
  {
    std::lock_guard lock(g->q_mu);
    g->q_stop = true;
  }
  g->q_cv.notify_one();
  if (g->decoder_thread.joinable()) g->decoder_thread.join();  // its last rows are in the recorder
  g->decoded.store(true);
  // From here on nothing may reach the recorder (zt train closes and destroys it next): no more
  // records, no more callbacks.
  for (CUpti_ActivityKind k : g->enabled_kinds) cuptiActivityDisable(k);
  g->enabled_kinds.clear();
  if (g->subscribed) {
    cuptiUnsubscribe(g->subscriber);
    g->subscribed = false;
  }
  g->running.store(false);
}

void child_after_fork() {
  if (g) g->forked.store(true);
}

}  // namespace zt::probe::cupti
