// The LD_PRELOAD host-allocation interposer (see host_hooks.h for what it owns and promises).
//
// Cost model: the common case is a small allocation on an application thread. It pays one
// thread-local byte test and two plain stores into the thread's own counter slot (no atomic
// read-modify-write, no lock), and one thread-local subtraction for the byte sampler; its free
// reads the block's size word (glibc), one bit of the sampled-address filter (32 KiB), and does one
// store. Only allocations at or above the threshold, and the sampled ones (one per
// sample interval of bytes allocated, on average), take a stack, a lock on the live table, and a
// ring write in the Recorder.
//
// The byte sampler (as tcmalloc's, Go's heap profiler and heapprofd): the bytes a thread allocates
// under the threshold are a line on which sample points fall as a Poisson process of mean spacing
// T (the interval). Each thread keeps the bytes until its next point, drawn from an exponential
// distribution of mean T; an allocation of s bytes that reaches it is sampled, and the next point
// is drawn afresh from the allocation's end (the process is memoryless, so that is exact). So an
// allocation of s bytes is sampled with probability p = 1 - exp(-s/T), independently of every
// other, and its row stands for bytes / p: live bytes by site are estimated without bias.
#include "host_hooks.h"

#include "aligned.h"

#include <dlfcn.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>

#define ZT_TLS __attribute__((tls_model("initial-exec")))
#define ZT_EXPORT extern "C" __attribute__((visibility("default")))

namespace zt::probe::interpose {
namespace {

// ---------------------------------------------------------------- thread state
// One byte per thread, t_state (guard.h, defined in guard.cpp so that the CUPTI collector can
// be linked without these hooks). kUnknown: not yet classified (the first hook on a thread asks
// the Recorder whether this is its writer). kApp: record. Anything else: pass through.
thread_local bool t_resolving ZT_TLS = false;

// Per-thread counters of small allocations. A thread owns its slot exclusively, so plain
// relaxed loads and stores suffice; threads beyond kSlots share the last slot with atomic
// adds (correct, only slower).
constexpr int kSlots = 1024;
struct alignas(64) Slot {
  std::atomic<uint64_t> allocs{0}, frees{0}, alloc_bytes{0};
};
Slot g_slots[kSlots];
std::atomic<int> g_next_slot{0};
thread_local Slot* t_slot ZT_TLS = nullptr;
thread_local bool t_slot_shared ZT_TLS = false;

inline void bump(std::atomic<uint64_t>& c, uint64_t v, bool shared) {
  if (__builtin_expect(!shared, 1)) c.store(c.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  else c.fetch_add(v, std::memory_order_relaxed);
}

// ---------------------------------------------------------------- real functions
using malloc_fn = void* (*)(size_t);
using free_fn = void (*)(void*);
using calloc_fn = void* (*)(size_t, size_t);
using realloc_fn = void* (*)(void*, size_t);
using usable_fn = size_t (*)(void*);
using mmap_fn = void* (*)(void*, size_t, int, int, int, off_t);
using munmap_fn = int (*)(void*, size_t);

struct Real {
  malloc_fn malloc = nullptr;
  free_fn free = nullptr;
  calloc_fn calloc = nullptr;
  realloc_fn realloc = nullptr;
  AlignedReal aligned;  // posix_memalign, aligned_alloc, memalign: any may be missing (aligned.h)
  usable_fn usable = nullptr;
  mmap_fn mmap = nullptr;
  mmap_fn mmap64 = nullptr;
  munmap_fn munmap = nullptr;
};
Real g_real;
// True when the malloc behind this one is glibc's (see block_size).
bool g_glibc_headers = false;
std::atomic<int> g_resolve_state{0};  // 0 not yet, 1 one thread is in dlsym, 2 done

// dlsym may allocate (its error buffer); those allocations are served from here. They are
// few and small, and never returned.
alignas(64) char g_arena[64 * 1024];
std::atomic<size_t> g_arena_used{0};

void* arena_alloc(size_t n, size_t align = 16) {
  size_t start = g_arena_used.load();
  for (;;) {
    size_t aligned = (start + align - 1) & ~(align - 1);
    if (aligned + n > sizeof g_arena) return nullptr;
    if (g_arena_used.compare_exchange_weak(start, aligned + n)) return g_arena + aligned;
  }
}
inline bool in_arena(const void* p) { return p >= g_arena && p < g_arena + sizeof g_arena; }

void resolve() {
  int expected = 0;
  if (g_resolve_state.compare_exchange_strong(expected, 1)) {
    t_resolving = true;
    Real r;
    r.malloc = reinterpret_cast<malloc_fn>(dlsym(RTLD_NEXT, "malloc"));
    r.free = reinterpret_cast<free_fn>(dlsym(RTLD_NEXT, "free"));
    r.calloc = reinterpret_cast<calloc_fn>(dlsym(RTLD_NEXT, "calloc"));
    r.realloc = reinterpret_cast<realloc_fn>(dlsym(RTLD_NEXT, "realloc"));
    r.aligned.posix_memalign = reinterpret_cast<posix_memalign_fn>(dlsym(RTLD_NEXT, "posix_memalign"));
    r.aligned.aligned_alloc = reinterpret_cast<aligned_alloc_fn>(dlsym(RTLD_NEXT, "aligned_alloc"));
    r.aligned.memalign = reinterpret_cast<aligned_alloc_fn>(dlsym(RTLD_NEXT, "memalign"));
    r.usable = reinterpret_cast<usable_fn>(dlsym(RTLD_NEXT, "malloc_usable_size"));
    r.mmap = reinterpret_cast<mmap_fn>(dlsym(RTLD_NEXT, "mmap"));
    r.mmap64 = reinterpret_cast<mmap_fn>(dlsym(RTLD_NEXT, "mmap64"));
    r.munmap = reinterpret_cast<munmap_fn>(dlsym(RTLD_NEXT, "munmap"));
    if (!r.mmap64) r.mmap64 = r.mmap;
    Dl_info info{};
    if (r.malloc && dladdr(reinterpret_cast<void*>(r.malloc), &info) && info.dli_fname)
      g_glibc_headers = std::strstr(info.dli_fname, "/libc.so.6") != nullptr;
    t_resolving = false;
    if (!r.malloc || !r.free || !r.calloc || !r.realloc || !r.usable || !r.mmap || !r.munmap) {
      static const char msg[] = "zt probe: cannot find the C library's malloc behind the interposer; aborting\n";
      (void)!write(2, msg, sizeof msg - 1);
      abort();
    }
    g_real = r;
    g_resolve_state.store(2, std::memory_order_release);
  } else {
    while (g_resolve_state.load(std::memory_order_acquire) != 2) sched_yield();
  }
}
// glibc keeps each block's size in the word before it (low 3 bits are flags). Reading it is
// what malloc_usable_size does, minus checks that made it the largest single cost of the free
// hook. Only trusted when the next malloc really is glibc's (checked in resolve()); otherwise
// the hook asks malloc_usable_size.
inline size_t block_size(void* p) {
  if (__builtin_expect(g_glibc_headers, 1)) return reinterpret_cast<const size_t*>(p)[-1] & ~size_t(7);
  return g_real.usable(p);
}

inline void ensure_real() {
  if (__builtin_expect(g_resolve_state.load(std::memory_order_acquire) != 2, 0)) resolve();
}

// ---------------------------------------------------------------- recording state
std::atomic<Recorder*> g_rec{nullptr};
std::atomic<bool> g_on{false};
uint64_t g_threshold = 1ull << 20;  // written once in start(), before g_on is set
DeviceId g_device = 0;
bool g_stacks = true;
int g_depth = 32;
int g_rank = 0;
std::atomic<int64_t> g_recorded{0};  // rows of allocations at or above the threshold (not the sampled ones)
std::atomic<bool (*)()> g_start_first{nullptr};  // a forked child's first recorded allocation starts it

// The byte sampler (see the top of this file). g_interval 0: off.
uint64_t g_interval = 0;  // written once in start(), before g_on is set
uint64_t g_seed = 0;      // 0: each thread seeds from its id and the clock
std::atomic<uint64_t> g_seed_serial{0};
thread_local int64_t t_until_sample ZT_TLS = 0;  // bytes until this thread's next sample point
thread_local uint64_t t_rng ZT_TLS = 0;          // 0: the thread's sampler is not started yet
std::atomic<int64_t> g_sampled{0};
std::atomic<int64_t> g_sampled_mmaps_live{0};

// Live sampled allocations are far fewer than frees of small blocks: a free asks the live table
// only where this counting filter of their addresses says it may hold the block. 2^18 slots: with
// 8192 live sampled rows (4 GiB of small allocations alive at 512 KiB) 3% of small frees take the
// table's lock. The counts (512 KiB, touched only where used) change only under g_live_mu, with a
// sampled allocation or its free; what a free reads is one bit a slot, set while its count is not 0:
// 32 KiB, which stays in the cache (a load from the counts, a cache miss on most frees, was 1.3% of
// the HF Trainer job's CPU time).
constexpr int kFilterBits = 18;
uint16_t g_filter_count[1 << kFilterBits];                  // under g_live_mu
std::atomic<uint64_t> g_filter_bits[(1 << kFilterBits) / 64];  // bit i: g_filter_count[i] != 0
inline uint32_t filter_slot(const void* p) {
  return uint32_t((uint64_t(reinterpret_cast<uintptr_t>(p) >> 4) * 0x9E3779B97F4A7C15ull) >> (64 - kFilterBits));
}
inline bool filter_may_hold(const void* p) {
  const uint32_t i = filter_slot(p);
  return (g_filter_bits[i >> 6].load(std::memory_order_relaxed) >> (i & 63)) & 1;
}
// Both under g_live_mu.
inline void filter_add(const void* p) {
  const uint32_t i = filter_slot(p);
  if (g_filter_count[i]++ == 0) g_filter_bits[i >> 6].fetch_or(uint64_t(1) << (i & 63), std::memory_order_relaxed);
}
inline void filter_remove(const void* p) {
  const uint32_t i = filter_slot(p);
  if (--g_filter_count[i] == 0) g_filter_bits[i >> 6].fetch_and(~(uint64_t(1) << (i & 63)), std::memory_order_relaxed);
}


// Live recorded allocations: address -> allocation id. Heap-allocated and never destroyed,
// so hooks that run during exit (other threads, late atexit handlers) never see a dead map.
std::mutex g_live_mu;
std::unordered_map<uintptr_t, AllocId>* g_live_malloc = nullptr;
std::unordered_map<uintptr_t, AllocId>* g_live_mmap = nullptr;
std::unordered_map<uintptr_t, AllocId>* g_live_sampled = nullptr;       // malloc family
std::unordered_map<uintptr_t, AllocId>* g_live_sampled_mmap = nullptr;  // small anonymous mmaps

// The Recorder keeps per-thread state in a thread_local that is destroyed when the thread
// ends, and for the main thread when exit() begins (before atexit handlers and static
// destructors, which still allocate and free). From then on this thread must not enter the
// Recorder. The sentinel is constructed right after the thread's first Recorder call, so it
// is destroyed just before the Recorder's state (reverse order) and turns the thread into a
// pass-through one. Allocations freed after that point stay live in the trace: they were
// live when the thread (or the program) ended.
struct TlsSentinel {
  bool armed = false;
  ~TlsSentinel() { t_state = kProbeThread; }
};
thread_local TlsSentinel t_sentinel;
inline void arm_sentinel() {
  if (__builtin_expect(!t_sentinel.armed, 0)) t_sentinel.armed = true;
}

void classify() {
  if (t_state != kUnknown) return;
  t_state = Recorder::on_writer_thread() ? kProbeThread : kApp;
}

inline bool app_thread() {
  uint8_t s = t_state;
  if (__builtin_expect(s == kApp, 1)) return true;
  if (s == kUnknown) {
    classify();
    return t_state == kApp;
  }
  return false;
}

Slot& slot() {
  if (__builtin_expect(t_slot != nullptr, 1)) return *t_slot;
  int i = g_next_slot.fetch_add(1, std::memory_order_relaxed);
  if (i >= kSlots - 1) {
    t_slot = &g_slots[kSlots - 1];
    t_slot_shared = true;
  } else {
    t_slot = &g_slots[i];
  }
  return *t_slot;
}

constexpr const char* kUnseenFree =
    "host frees not seen (the address was allocated again while its allocation was open): the allocation was "
    "closed at the time its address came back";

// Frames between capture_stack's caller and the application: record_large, then the hook.
// Both are noinline so that this count holds.
constexpr int kSkipFrames = 2;

// The recorder to record an allocation into, null when not recording. In a forked child whose
// trace has not started (child_after_fork's start_first), the first allocation to record starts it.
// Every path that records a new allocation asks here (a free never starts anything).
inline Recorder* recorder_or_start() {
  Recorder* rec = g_rec.load(std::memory_order_acquire);
  if (__builtin_expect(rec && g_on.load(std::memory_order_relaxed), 1)) return rec;
  bool (*start)() = g_start_first.load(std::memory_order_acquire);
  if (!start) return nullptr;
  {
    ScopedGuard guard;  // the start's own allocations pass through
    if (!start()) return nullptr;
  }
  rec = g_rec.load(std::memory_order_acquire);
  return rec && g_on.load(std::memory_order_relaxed) ? rec : nullptr;
}


// An allocation whose free went by unseen: it was freed by the time its address came back, so its
// row ends at `t` (the new allocation's time), and the guess is counted as a dropped row.
inline void close_unseen(Recorder* rec, AllocId stale, int64_t t) {
  if (!stale) return;
  rec->free(stale, t);
  rec->dropped(1, kUnseenFree, g_rank);
}

__attribute__((noinline)) void record_large(void* p, size_t requested, size_t bytes, bool mmapped) {
  Recorder* rec = recorder_or_start();
  if (!rec) return;
  ScopedGuard guard;
  AllocEvent e;
  e.rank = g_rank;
  e.device = g_device;
  e.memory_kind = MemoryKind::PageableHost;
  e.level = AllocLevel::Segment;
  e.address = reinterpret_cast<uint64_t>(p);
  e.bytes = static_cast<int64_t>(bytes);
  e.requested_bytes = static_cast<int64_t>(requested);
  e.source = Source::HostHook;
  e.stack = g_stacks ? rec->capture_stack(kSkipFrames, g_depth) : 0;
  e.t = now_ns();
  AllocId id = rec->alloc(e);
  arm_sentinel();
  g_recorded.fetch_add(1, std::memory_order_relaxed);
  AllocId stale = 0;
  {
    std::lock_guard lock(g_live_mu);
    auto& table = mmapped ? *g_live_mmap : *g_live_malloc;
    auto [it, inserted] = table.try_emplace(reinterpret_cast<uintptr_t>(p), id);
    if (!inserted) stale = std::exchange(it->second, id);
  }
  // The address came back while its earlier allocation is open: that one's free went by unseen
  // (a munmap of part of a mapping, a free on a thread that no longer records, a raw syscall).
  close_unseen(rec, stale, e.t);
}

// Returns false when p was not a recorded allocation.
__attribute__((noinline)) bool forget_large(void* p, bool mmapped) {
  Recorder* rec = g_rec.load(std::memory_order_acquire);
  if (!rec || !g_on.load(std::memory_order_relaxed)) return false;
  ScopedGuard guard;
  AllocId id = 0;
  {
    std::lock_guard lock(g_live_mu);
    auto& table = mmapped ? *g_live_mmap : *g_live_malloc;
    auto it = table.find(reinterpret_cast<uintptr_t>(p));
    if (it == table.end()) return false;  // allocated before recording began, or a filter collision
    id = it->second;
    table.erase(it);
  }
  rec->free(id);
  arm_sentinel();
  return true;
}

// The thread's random numbers (xorshift64*): never 0 once seeded.
inline uint64_t next_random() {
  t_rng ^= t_rng >> 12;
  t_rng ^= t_rng << 25;
  t_rng ^= t_rng >> 27;
  return t_rng * 0x2545F4914F6CDD1Dull;
}
// Bytes to the next sample point: exponential with mean g_interval, at least 1.
inline int64_t draw_until_sample() {
  const double u = (double(next_random() >> 11) + 0.5) * (1.0 / 9007199254740992.0);  // (0, 1)
  const double x = -std::log(u) * double(g_interval);
  return x < 1 ? 1 : x > 9.0e18 ? int64_t(9.0e18) : int64_t(x);
}

// An allocation under the threshold whose bytes reached this thread's next sample point (or the
// thread's first, which starts its sampler): recorded as a sampled row, its free tracked. Returns
// without recording when the point is not reached after all (a thread's first allocation).
// noinline, called only from the hooks: the stack skips it and the hook (kSkipFrames).
__attribute__((noinline)) void sample_small(void* p, size_t requested, bool mmapped) {
  if (__builtin_expect(t_rng == 0, 0)) {
    uint64_t seed = g_seed ? g_seed + 0x9E3779B97F4A7C15ull * g_seed_serial.fetch_add(1, std::memory_order_relaxed)
                           : (uint64_t(syscall(SYS_gettid)) << 32) ^ uint64_t(now_ns());
    t_rng = seed ? seed : 1;
    (void)next_random();
    t_until_sample = draw_until_sample() - int64_t(requested);
    if (t_until_sample > 0) return;
  }
  // The next point, from this allocation's end.
  t_until_sample = draw_until_sample();
  Recorder* rec = recorder_or_start();  // a forked worker's first sample starts its trace
  if (!rec) return;
  ScopedGuard guard;
  const size_t bytes = mmapped ? requested : g_real.usable(p);
  // P(sampled) = 1 - exp(-s/T) for the s bytes the sampler counted; the row stands for bytes / P.
  const double prob = -std::expm1(-double(requested) / double(g_interval));
  if (!(prob > 0)) return;
  AllocEvent e;
  e.rank = g_rank;
  e.device = g_device;
  e.memory_kind = MemoryKind::PageableHost;
  e.level = AllocLevel::Segment;
  e.address = reinterpret_cast<uint64_t>(p);
  e.bytes = static_cast<int64_t>(bytes);
  e.requested_bytes = static_cast<int64_t>(requested);
  e.source = Source::HostHook;
  e.weight_bytes = std::max<int64_t>(int64_t(bytes), std::llround(double(bytes) / prob));
  e.stack = g_stacks ? rec->capture_stack(kSkipFrames, g_depth) : 0;
  e.t = now_ns();
  AllocId id = rec->alloc(e);
  arm_sentinel();
  g_sampled.fetch_add(1, std::memory_order_relaxed);
  AllocId stale = 0;
  {
    std::lock_guard lock(g_live_mu);
    auto& table = mmapped ? *g_live_sampled_mmap : *g_live_sampled;
    auto [it, inserted] = table.try_emplace(reinterpret_cast<uintptr_t>(p), id);
    if (!inserted) stale = std::exchange(it->second, id);
    else if (mmapped) g_sampled_mmaps_live.fetch_add(1, std::memory_order_relaxed);
    else filter_add(p);
  }
  // The address is live in the table already: its free went by unseen, as in record_large.
  close_unseen(rec, stale, e.t);
}

// Returns false when p is not a live sampled allocation.
__attribute__((noinline)) bool forget_sampled(void* p, bool mmapped) {
  Recorder* rec = g_rec.load(std::memory_order_acquire);
  if (!rec || !g_on.load(std::memory_order_relaxed)) return false;
  ScopedGuard guard;
  AllocId id = 0;
  {
    std::lock_guard lock(g_live_mu);
    auto& table = mmapped ? *g_live_sampled_mmap : *g_live_sampled;
    auto it = table.find(reinterpret_cast<uintptr_t>(p));
    if (it == table.end()) return false;  // a filter collision
    id = it->second;
    table.erase(it);
    if (mmapped) g_sampled_mmaps_live.fetch_sub(1, std::memory_order_relaxed);
    else filter_remove(p);
  }
  rec->free(id);
  arm_sentinel();
  return true;
}

// After a successful allocation of `requested` bytes at p. Small ones count the requested
// bytes (asking the allocator for the usable size here cost more than the rest of the hook), and
// move the thread's sampler.
inline void on_alloc(void* p, size_t requested) {
  if (!p || !app_thread()) return;
  if (__builtin_expect(requested < g_threshold, 1)) {
    Slot& s = slot();
    const bool shared = t_slot_shared;
    bump(s.allocs, 1, shared);
    bump(s.alloc_bytes, requested, shared);
    if (g_interval && __builtin_expect((t_until_sample -= int64_t(requested)) <= 0, 0)) sample_small(p, requested, false);
    return;
  }
  record_large(p, requested, g_real.usable(p), false);
}

// Before p goes back to the allocator (never after: another thread could get the same
// address and record it before we erase the old entry).
inline void on_free(void* p) {
  if (!app_thread()) return;
  // A recorded allocation's block is at least as large as the request, which was at least the
  // threshold: a smaller block is certainly not recorded; a larger one only costs a lookup.
  if (__builtin_expect(block_size(p) >= g_threshold, 0) && forget_large(p, false)) return;
  // A sampled block is any size under the threshold: the filter says which may be one.
  if (__builtin_expect(filter_may_hold(p), 0) && forget_sampled(p, false)) return;
  Slot& s = slot();
  bump(s.frees, 1, t_slot_shared);
}

}  // namespace

void start(const HostHookConfig& cfg) {
  ensure_real();
  ScopedGuard guard;
  if (!g_live_malloc) {
    g_live_malloc = new std::unordered_map<uintptr_t, AllocId>();
    g_live_mmap = new std::unordered_map<uintptr_t, AllocId>();
    g_live_sampled = new std::unordered_map<uintptr_t, AllocId>();
    g_live_sampled_mmap = new std::unordered_map<uintptr_t, AllocId>();
  }
  g_threshold = cfg.threshold;
  g_interval = cfg.sample_interval;
  g_seed = cfg.sample_seed;
  g_device = cfg.host_device;
  g_stacks = cfg.stacks;
  g_depth = cfg.stack_depth;
  g_rank = cfg.rank;
  g_rec.store(cfg.recorder, std::memory_order_release);
  g_on.store(cfg.recorder != nullptr, std::memory_order_release);
}

void stop() { g_on.store(false, std::memory_order_release); }

void child_after_fork(bool (*start_first)()) {
  // Only the forking thread exists now; g_live_mu may be held by a thread that is gone, so
  // nothing here may lock. Turning recording off is enough: every path checks g_on first.
  g_on.store(false, std::memory_order_relaxed);
  g_rec.store(nullptr, std::memory_order_relaxed);
  for (auto& s : g_slots) {
    s.allocs.store(0, std::memory_order_relaxed);
    s.frees.store(0, std::memory_order_relaxed);
    s.alloc_bytes.store(0, std::memory_order_relaxed);
  }
  g_recorded.store(0, std::memory_order_relaxed);
  g_sampled.store(0, std::memory_order_relaxed);
  g_sampled_mmaps_live.store(0, std::memory_order_relaxed);
  // The parent's sampled addresses are not this process's live set (a fresh table comes with
  // restart_after_fork): their filter slots go. Only slots in use are written, so that the pages
  // the parent never touched stay untouched here.
  for (size_t w = 0; w < sizeof g_filter_bits / sizeof g_filter_bits[0]; ++w) {
    uint64_t bits = g_filter_bits[w].load(std::memory_order_relaxed);
    if (!bits) continue;
    for (; bits; bits &= bits - 1) g_filter_count[w * 64 + size_t(__builtin_ctzll(bits))] = 0;
    g_filter_bits[w].store(0, std::memory_order_relaxed);
  }
  g_start_first.store(start_first, std::memory_order_release);
  // The forking thread's sampler starts afresh at the child's next allocation (seeded from the child's
  // thread id unless ZT_PROBE_SAMPLE_SEED fixes it): workers forked from one parent would otherwise all
  // sample the same points of the same allocations, one draw counted as many. Memoryless: a new
  // countdown from here is as exact as the parent's.
  t_rng = 0;
  t_until_sample = 0;
}

void restart_after_fork() {
  new (&g_live_mu) std::mutex();  // the parent's may be held by a thread the child does not have
  ScopedGuard guard;
  g_live_malloc = new std::unordered_map<uintptr_t, AllocId>();  // the parent's are left as they are
  g_live_mmap = new std::unordered_map<uintptr_t, AllocId>();
  g_live_sampled = new std::unordered_map<uintptr_t, AllocId>();
  g_live_sampled_mmap = new std::unordered_map<uintptr_t, AllocId>();
}

bool recording() { return g_on.load(std::memory_order_relaxed); }

SmallTotals small_totals() {
  SmallTotals t;
  uint64_t ab = 0;
  int n = std::min(g_next_slot.load(std::memory_order_relaxed), kSlots);
  if (g_slots[kSlots - 1].allocs.load() || g_slots[kSlots - 1].frees.load()) n = kSlots;
  for (int i = 0; i < n; ++i) {
    t.allocations += g_slots[i].allocs.load(std::memory_order_relaxed);
    t.frees += g_slots[i].frees.load(std::memory_order_relaxed);
    ab += g_slots[i].alloc_bytes.load(std::memory_order_relaxed);
  }
  t.bytes = ab;
  return t;
}

int64_t recorded_count() { return g_recorded.load(); }
int64_t sampled_count() { return g_sampled.load(); }

int64_t sampled_live_count() {
  ScopedGuard guard;
  std::lock_guard lock(g_live_mu);
  return g_live_sampled ? static_cast<int64_t>(g_live_sampled->size() + g_live_sampled_mmap->size()) : 0;
}

int64_t large_live_count() {
  ScopedGuard guard;
  std::lock_guard lock(g_live_mu);
  return g_live_malloc ? static_cast<int64_t>(g_live_malloc->size() + g_live_mmap->size()) : 0;
}

}  // namespace zt::probe::interpose

// ---------------------------------------------------------------- the exported hooks
using namespace zt::probe::interpose;

ZT_EXPORT void* malloc(size_t n) {
  if (__builtin_expect(g_resolve_state.load(std::memory_order_acquire) != 2, 0)) {
    if (t_resolving) return arena_alloc(n);
    resolve();
  }
  void* p = g_real.malloc(n);
  on_alloc(p, n);
  return p;
}

ZT_EXPORT void free(void* p) {
  if (!p || in_arena(p)) return;
  ensure_real();
  on_free(p);
  g_real.free(p);
}

ZT_EXPORT void* calloc(size_t n, size_t size) {
  if (__builtin_expect(g_resolve_state.load(std::memory_order_acquire) != 2, 0)) {
    if (t_resolving) {
      size_t total;
      if (__builtin_mul_overflow(n, size, &total)) return nullptr;
      return arena_alloc(total);  // static storage: already zero
    }
    resolve();
  }
  void* p = g_real.calloc(n, size);
  on_alloc(p, n * size);
  return p;
}

ZT_EXPORT void* realloc(void* old, size_t n) {
  ensure_real();
  if (in_arena(old)) {
    // Arena blocks carry no size; copying n bytes may read past the old block's end but stays
    // inside the arena (or stops at its end).
    void* p = malloc(n);
    if (p && n) {
      size_t avail = static_cast<size_t>(g_arena + sizeof g_arena - static_cast<char*>(old));
      std::memcpy(p, old, n < avail ? n : avail);
    }
    return p;
  }
  if (old) on_free(old);
  void* p = g_real.realloc(old, n);
  if (p) on_alloc(p, n);
  else if (old && n) on_alloc(old, g_real.usable(old));  // failed: the old block lives on
  return p;
}

ZT_EXPORT int posix_memalign(void** out, size_t align, size_t n) {
  ensure_real();
  int rc = real_posix_memalign(g_real.aligned, out, align, n);
  if (rc == 0) on_alloc(*out, n);
  return rc;
}

ZT_EXPORT void* aligned_alloc(size_t align, size_t n) {
  ensure_real();
  void* p = real_aligned_alloc(g_real.aligned, align, n, false);
  on_alloc(p, n);
  return p;
}

ZT_EXPORT void* memalign(size_t align, size_t n) {
  ensure_real();
  void* p = real_aligned_alloc(g_real.aligned, align, n, true);
  on_alloc(p, n);
  return p;
}

namespace {
// Only anonymous, accessible, reserved mappings are memory the program asked for. PROT_NONE
// and MAP_NORESERVE mappings are address-space reservations (the CUDA driver reserves
// terabytes this way); file mappings are files.
inline bool is_allocation_like(int prot, int flags) {
  return (flags & MAP_ANONYMOUS) && prot != PROT_NONE && !(flags & MAP_NORESERVE);
}
inline void after_mmap(void* p, size_t len, int prot, int flags) {
  if (p == MAP_FAILED || !is_allocation_like(prot, flags) || !app_thread()) return;
  if (len >= g_threshold) record_large(p, len, len, true);
  else if (g_interval && (t_until_sample -= int64_t(len)) <= 0) sample_small(p, len, true);
}
}  // namespace

ZT_EXPORT void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  ensure_real();
  void* p = g_real.mmap(addr, len, prot, flags, fd, off);
  after_mmap(p, len, prot, flags);
  return p;
}

ZT_EXPORT void* mmap64(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  ensure_real();
  void* p = g_real.mmap64(addr, len, prot, flags, fd, off);
  after_mmap(p, len, prot, flags);
  return p;
}

ZT_EXPORT int munmap(void* addr, size_t len) {
  ensure_real();
  // Only an unmapping that starts where a recorded mapping starts closes it (the common
  // case); unmapping part of a mapping leaves the row open.
  if (len >= g_threshold && app_thread()) (void)forget_large(addr, true);
  else if (g_sampled_mmaps_live.load(std::memory_order_relaxed) > 0 && app_thread()) (void)forget_sampled(addr, true);
  return g_real.munmap(addr, len);
}
