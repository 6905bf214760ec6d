// bench/bench_writer.cpp: the probe's recording path, measured beside a plain SQLite loop.
//
// Three figures from the issue, each printed beside a baseline measured in the same process
// and as the ratio ours/baseline:
//  1. Writer throughput for allocation rows, one writer thread (target >= 1,000,000 rows/s).
//  2. Hot-path cost per recorded event on the caller's thread, p50 and p99 (target p50 <= 100 ns
//     without a stack).
//  3. Bytes per event on disk.
//
// Baseline: a fresh trace from zt::db::TraceWriter::create (same schema, same pragmas), then
// handle() with sqlite3_prepare_v2 / bind / step / reset in a plain loop inside one transaction,
// inserting the same rows into the same `allocation` table.
// Ours: a probe::Recorder (crash_handlers=false) fed AllocEvents (a device from add_device,
// interned names, realistic sizes and addresses), then close().
//
// What is measured (all in one process, one after the other):
//  - Throughput, default options (32Ki-event ring, Block): "committed" is first alloc() ->
//    flush() returned (every row committed, no indexes yet); "end-to-end" adds close(), which
//    builds the indexes and checkpoints the WAL. The drain rate while producing comes from
//    events_recorded() sampled by the producer (middle 80 % of the run). Per-thread CPU time and
//    run-queue wait come from /proc/self/task/TID/schedstat, because wall-clock rates on a small
//    shared machine move with other load; the CPU-time rates do much less.
//  - Hot path: every call timed on its own, p50/p99 over >= 2^20 events with the default N,
//    raw and net of the timer's own p50 overhead. A ring of 2^k <= N events, flushed before each
//    pass of at most 2^k events, so reserve() never waits: blocking is excluded. A first pass
//    touches every slot once (its page faults are reported as "cold ring"); the measured pass
//    then reuses mapped slots. The alloc-only throughput run (ring fills, Block) is timed per
//    call too, for the figure with waits included. One extra line with capture_stack().
//  - Bytes: file size after close() (one file, WAL folded back) / allocation rows; the baseline
//    file after TraceWriter::finish(), i.e. with the same indexes. dbstat splits table and index.
//
// Usage: bench_writer [N] [--stack-events M] [--clock tsc|posix] [--keep]
//   N               allocation rows per run (default 2000000; "2e6" and "500k" are accepted)
//   --stack-events  events of the capture_stack() line (default N/16)
//   --clock         per-call timer: lfence-fenced rdtsc calibrated against steady_clock (default
//                   when the CPU has an invariant TSC), or clock_gettime(CLOCK_MONOTONIC)
//   --keep          keep the temporary directory with the trace files
// Not a test: it never fails on a number.
#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define ZT_BENCH_HAVE_TSC 1
#else
#define ZT_BENCH_HAVE_TSC 0
#endif

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "zt/db/trace_writer.h"
#include "zt/probe/recorder.h"

namespace {

using zt::probe::AllocEvent;
using zt::probe::AllocId;
using zt::probe::DeviceId;
using zt::probe::NameId;
using zt::probe::Recorder;
using zt::probe::RecorderOptions;
using zt::probe::StackId;

std::string g_tmpdir;
bool g_keep = false;

void cleanup() {
  if (!g_tmpdir.empty() && !g_keep) {
    std::error_code ec;
    std::filesystem::remove_all(g_tmpdir, ec);
  }
}

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "bench_writer: %s\n", msg.c_str());
  cleanup();
  std::exit(1);
}

// ------------------------------------------------------------------ per-call timer

bool g_tsc = true;
double g_ns_per_tick = 1.0;

inline uint64_t ticks() {
#if ZT_BENCH_HAVE_TSC
  if (g_tsc) {
    _mm_lfence();
    uint64_t t = __rdtsc();
    _mm_lfence();
    asm volatile("" ::: "memory");
    return t;
  }
#endif
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  asm volatile("" ::: "memory");
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

bool cpu_has_invariant_tsc() {
  if (!ZT_BENCH_HAVE_TSC) return false;
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("flags", 0) == 0)
      return line.find(" constant_tsc") != std::string::npos && line.find(" nonstop_tsc") != std::string::npos;
  return false;
}

void calibrate() {
  if (!g_tsc) {
    g_ns_per_tick = 1.0;
    return;
  }
  using namespace std::chrono;
  auto c0 = steady_clock::now();
  uint64_t t0 = ticks();
  while (steady_clock::now() - c0 < milliseconds(250)) {
  }
  uint64_t t1 = ticks();
  auto c1 = steady_clock::now();
  g_ns_per_tick = duration<double, std::nano>(c1 - c0).count() / double(t1 - t0);
}

int64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

inline uint32_t clamp32(uint64_t v) { return v > 0xFFFFFFFFull ? 0xFFFFFFFFu : uint32_t(v); }

struct Lat {
  size_t n = 0;
  double p50 = 0, p99 = 0, p999 = 0, max = 0, mean = 0;  // ns, raw (timer overhead included)
};

Lat lat_stats(std::vector<uint32_t> v) {
  Lat L;
  L.n = v.size();
  if (v.empty()) return L;
  long double sum = 0;
  for (uint32_t x : v) sum += x;
  L.mean = double(sum / v.size()) * g_ns_per_tick;
  auto pct = [&](double q) {
    size_t k = std::min(v.size() - 1, size_t(q * double(v.size())));
    std::nth_element(v.begin(), v.begin() + k, v.end());
    return double(v[k]) * g_ns_per_tick;
  };
  L.p50 = pct(0.50);
  L.p99 = pct(0.99);
  L.p999 = pct(0.999);
  L.max = double(*std::max_element(v.begin(), v.end())) * g_ns_per_tick;
  return L;
}

// Timer overhead: two back-to-back reads, as around an empty call.
double g_granularity_ns = 0;  // the smallest gap between two distinct measured durations
Lat timer_overhead(size_t n) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t a = ticks();
    uint64_t b = ticks();
    v[i] = clamp32(b - a);
  }
  std::vector<uint32_t> d = v;
  std::sort(d.begin(), d.end());
  d.erase(std::unique(d.begin(), d.end()), d.end());
  uint32_t step = 0;
  for (size_t i = 1; i < d.size(); ++i)
    if (step == 0 || d[i] - d[i - 1] < step) step = d[i] - d[i - 1];
  g_granularity_ns = double(step) * g_ns_per_tick;
  return lat_stats(std::move(v));
}
std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

// ------------------------------------------------------------------ workload

constexpr int kNames = 64;
constexpr uint64_t kAddrBase = 0x7f2c00000000ull;
constexpr uint64_t kAddrSpan = 80ull << 30;  // an 80 GiB device
constexpr int64_t kFreeDelay = 1024;         // a block is freed this many allocations later

// The same sequence for ours and the baseline: a caching allocator's blocks on one GPU.
struct Workload {
  uint64_t s = 0x9E3779B97F4A7C15ull;
  uint64_t next_addr = kAddrBase;
  struct Row {
    uint64_t address;
    int64_t bytes, requested;
    int name;
    int64_t stream;
  };
  uint64_t rnd() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ull;
  }
  Row next() {
    uint64_t r = rnd();
    int64_t req;
    unsigned cls = unsigned(r % 100);
    if (cls < 70) req = 1 + int64_t((r >> 8) % 65536);                        // small: up to 64 KiB
    else if (cls < 95) req = (1ll << 20) + int64_t((r >> 8) % (63ll << 20));  // 1..64 MiB
    else req = (256ll << 20) + int64_t((r >> 8) % (768ll << 20));             // 256 MiB..1 GiB
    int64_t bytes = (req + 511) & ~int64_t(511);  // the caching allocator rounds to 512 B
    Row row{next_addr, bytes, req, int((r >> 40) % kNames), int64_t((r >> 50) % 4)};
    next_addr += uint64_t(bytes);
    if (next_addr >= kAddrBase + kAddrSpan) next_addr = kAddrBase;
    return row;
  }
};

std::string name_text(int k) {
  static const char* parts[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "mlp.up_proj.weight",
                                "mlp.down_proj.weight"};
  return "model.layers." + std::to_string(k / 4) + "." + parts[k % 4];
}

// ------------------------------------------------------------------ files

uint64_t file_size(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
}
uint64_t trace_bytes(const std::string& p) {
  return file_size(p) + file_size(p + "-wal") + file_size(p + "-shm") + file_size(p + "-journal");
}

struct Breakdown {
  bool ok = false;
  uint64_t table = 0, indexes = 0;  // the allocation table and its indexes
};

Breakdown allocation_breakdown(const std::string& path) {
  Breakdown b;
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return b;
  }
  sqlite3_stmt* st = nullptr;
  const char* sql =
      "SELECT d.name, sum(d.pgsize), m.type FROM dbstat d JOIN sqlite_schema m ON m.name = d.name "
      "WHERE m.tbl_name = 'allocation' GROUP BY d.name";
  if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) == SQLITE_OK) {
    b.ok = true;
    while (sqlite3_step(st) == SQLITE_ROW) {
      uint64_t bytes = uint64_t(sqlite3_column_int64(st, 1));
      std::string type = reinterpret_cast<const char*>(sqlite3_column_text(st, 2));
      (type == "table" ? b.table : b.indexes) += bytes;
    }
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return b;
}

int64_t count_rows(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  int64_t n = -1;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
      n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
  }
  sqlite3_close(db);
  return n;
}

double secs(int64_t a, int64_t b) { return double(b - a) / 1e9; }

// ------------------------------------------------------------------ scheduler accounting
// /proc/self/task/TID/schedstat: ns on a CPU, ns runnable but waiting for one. On a busy
// 2-core machine wall-clock rates move with other load; CPU time per row does much less.

struct Sched {
  double run_s = 0, wait_s = 0;
};
Sched sched_of(long tid) {
  Sched s;
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/schedstat");
  unsigned long long run = 0, wait = 0;
  if (f >> run >> wait) s.run_s = double(run) / 1e9, s.wait_s = double(wait) / 1e9;
  return s;
}
Sched operator-(const Sched& a, const Sched& b) { return {a.run_s - b.run_s, a.wait_s - b.wait_s}; }
std::vector<long> task_ids() {
  std::vector<long> ids;
  for (auto& e : std::filesystem::directory_iterator("/proc/self/task")) ids.push_back(std::stol(e.path().filename()));
  return ids;
}
long self_tid() { return long(::gettid()); }

// ------------------------------------------------------------------ baseline

struct BaselineResult {
  uint64_t rows = 0, updates = 0;
  double loop_s = 0;    // BEGIN .. COMMIT returned
  double finish_s = 0;  // TraceWriter::finish(): the same indexes + WAL checkpoint as close()
  uint64_t bytes = 0;
  Breakdown bd;
  std::vector<uint32_t> lat;      // one insert (bind+step+reset), every kSample-th call
  std::vector<uint32_t> upd_lat;  // one UPDATE ... SET t_free, every kSample-th call
  Sched loop_cpu, finish_cpu;   // this thread during the loop, during finish()
};
constexpr uint64_t kSample = 4;

void exec_or_die(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string m = err ? err : "?";
    sqlite3_free(err);
    die(std::string("baseline: ") + sql + ": " + m);
  }
}

BaselineResult run_baseline(const std::string& path, uint64_t n, bool free_half) {
  BaselineResult R;
  std::unique_ptr<zt::db::TraceWriter> w;
  if (zt::Status s = zt::db::TraceWriter::create(path, &w); !s) die(s.message());
  sqlite3* db = w->handle();
  // Same side rows as ours carries (a device, the names), outside the timed loop.
  exec_or_die(db, "INSERT INTO device(id,rank,kind,ordinal,label,name,capacity_bytes,simulated) "
                  "VALUES(1,0,1,0,'cuda:0','simulated GPU',85899345920,1)");
  {
    sqlite3_stmt* st = nullptr;
    sqlite3_prepare_v2(db, "INSERT INTO string(id,text) VALUES(?,?)", -1, &st, nullptr);
    for (int k = 0; k < kNames; ++k) {
      std::string t = name_text(k);
      sqlite3_bind_int64(st, 1, k + 1);
      sqlite3_bind_text(st, 2, t.c_str(), int(t.size()), SQLITE_TRANSIENT);
      sqlite3_step(st);
      sqlite3_reset(st);
    }
    sqlite3_finalize(st);
  }
  sqlite3_stmt* ins = nullptr;
  sqlite3_stmt* upd = nullptr;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO allocation(id,rank,device_id,memory_kind,level,address,bytes,requested_bytes,"
                         "t_alloc,t_free,name_id,stack_id,source,segment_id,stream) "
                         "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                         -1, &ins, nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(db, "UPDATE allocation SET t_free=? WHERE id=?", -1, &upd, nullptr) != SQLITE_OK)
    die(std::string("baseline prepare: ") + sqlite3_errmsg(db));
  R.lat.reserve(n / kSample + 1);
  Workload wl;
  auto free_row = [&](int64_t id) {
    bool timed = (R.updates % kSample) == 0;
    uint64_t a = timed ? ticks() : 0;
    sqlite3_bind_int64(upd, 1, zt::probe::now_ns());
    sqlite3_bind_int64(upd, 2, id);
    if (sqlite3_step(upd) != SQLITE_DONE) die(std::string("baseline update: ") + sqlite3_errmsg(db));
    sqlite3_reset(upd);
    if (timed) R.upd_lat.push_back(clamp32(ticks() - a));
    ++R.updates;
  };

  Sched s0 = sched_of(self_tid());
  int64_t t0 = zt::probe::now_ns();
  exec_or_die(db, "BEGIN");
  for (uint64_t i = 0; i < n; ++i) {
    Workload::Row row = wl.next();
    bool timed = (i % kSample) == 0;
    uint64_t a = timed ? ticks() : 0;
    sqlite3_bind_int64(ins, 1, int64_t(i + 1));
    sqlite3_bind_int64(ins, 2, 0);
    sqlite3_bind_int64(ins, 3, 1);
    sqlite3_bind_int64(ins, 4, int64_t(zt::db::MemoryKind::Device));
    sqlite3_bind_int64(ins, 5, int64_t(zt::db::AllocLevel::Block));
    sqlite3_bind_int64(ins, 6, int64_t(row.address));
    sqlite3_bind_int64(ins, 7, row.bytes);
    sqlite3_bind_int64(ins, 8, row.requested);
    sqlite3_bind_int64(ins, 9, zt::probe::now_ns());
    sqlite3_bind_null(ins, 10);
    sqlite3_bind_int64(ins, 11, row.name + 1);
    sqlite3_bind_null(ins, 12);
    sqlite3_bind_int64(ins, 13, int64_t(zt::db::Source::Api));
    sqlite3_bind_null(ins, 14);
    sqlite3_bind_int64(ins, 15, row.stream);
    if (sqlite3_step(ins) != SQLITE_DONE) die(std::string("baseline insert: ") + sqlite3_errmsg(db));
    sqlite3_reset(ins);
    if (timed) R.lat.push_back(clamp32(ticks() - a));
    if (free_half && int64_t(i) >= kFreeDelay && ((i - kFreeDelay) & 1) == 0) free_row(int64_t(i - kFreeDelay) + 1);
  }
  if (free_half)
    for (uint64_t j = n > uint64_t(kFreeDelay) ? n - kFreeDelay : 0; j < n; ++j)
      if ((j & 1) == 0) free_row(int64_t(j) + 1);
  exec_or_die(db, "COMMIT");
  int64_t t1 = zt::probe::now_ns();
  Sched s1 = sched_of(self_tid());
  sqlite3_finalize(ins);
  sqlite3_finalize(upd);
  if (zt::Status s = w->finish(); !s) die(s.message());
  int64_t t2 = zt::probe::now_ns();
  Sched s2 = sched_of(self_tid());
  R.loop_cpu = s1 - s0;
  R.finish_cpu = s2 - s1;
  w.reset();
  R.rows = n;
  R.loop_s = secs(t0, t1);
  R.finish_s = secs(t1, t2);
  R.bytes = trace_bytes(path);
  if (!free_half) R.bd = allocation_breakdown(path);
  return R;
}

// ------------------------------------------------------------------ ours

struct Setup {
  long writer_tid = 0;  // the thread Recorder::open started
  std::unique_ptr<Recorder> rec;
  DeviceId dev = 0;
  NameId names[kNames] = {};
};

Setup open_recorder(const std::string& path, size_t ring_events, zt::probe::OverflowPolicy policy) {
  Setup S;
  RecorderOptions o;
  o.path = path;
  o.command_line = "bench_writer";
  o.crash_handlers = false;
  o.ring_events = ring_events;
  o.overflow = policy;
  std::vector<long> before = task_ids();
  if (zt::Status s = Recorder::open(o, &S.rec); !s) die(s.message());
  for (long t : task_ids())
    if (std::find(before.begin(), before.end(), t) == before.end()) S.writer_tid = t;
  S.rec->add_rank(0, 1, 0);
  S.dev = S.rec->add_device(0, zt::probe::DeviceKind::Cuda, 0, "cuda:0", "simulated GPU", 80ll << 30, true);
  for (int k = 0; k < kNames; ++k) S.names[k] = S.rec->intern(name_text(k));  // also registers this thread's ring
  return S;
}

inline AllocEvent make_event(const Setup& S, const Workload::Row& row) {
  AllocEvent e;
  e.rank = 0;
  e.device = S.dev;
  e.memory_kind = zt::probe::MemoryKind::Device;
  e.level = zt::probe::AllocLevel::Block;
  e.address = row.address;
  e.bytes = row.bytes;
  e.requested_bytes = row.requested;
  e.name = S.names[row.name];
  e.stream = row.stream;
  e.t = 0;  // the recorder stamps now_ns() on the caller's thread, as a hook would
  return e;
}

struct ThroughputResult {
  uint64_t rows = 0, events = 0, recorded = 0, dropped = 0;
  double produce_s = 0;   // first event .. last event returned (producer blocked on the ring as needed)
  double commit_s = 0;    // first event .. flush() returned: every row committed, no indexes yet
  double close_s = 0;     // close() after that flush: indexes, WAL checkpoint, run end
  double drain_rate = 0;  // events/s committed by the writer while the producer runs (middle 80 %)
  uint64_t bytes = 0;
  Breakdown bd;
  int64_t rows_in_file = -1, freed_in_file = -1;
  std::vector<uint32_t> lat;  // per-call, when timed
  Sched writer_cpu;           // the writer thread, first event .. flush() returned
  Sched producer_cpu;         // this thread, same interval
  Sched close_cpu;            // this thread in close() (close() builds the indexes on the caller's thread)
};

// Default ring (RecorderOptions::ring_events) and the Block policy: the trainer's setting.
ThroughputResult run_ours(const std::string& path, uint64_t n, bool free_half, bool timed) {
  ThroughputResult R;
  Setup S = open_recorder(path, RecorderOptions{}.ring_events, zt::probe::OverflowPolicy::Block);
  Recorder& rec = *S.rec;
  Workload wl;
  std::vector<AllocId> recent(kFreeDelay);
  struct Sample {
    int64_t t;
    uint64_t recorded;
  };
  std::vector<Sample> samples;
  samples.reserve(n / 8192 + 2);
  if (timed) R.lat.resize(n);
  uint64_t rec0 = rec.events_recorded();

  Sched w0 = sched_of(S.writer_tid), p0 = sched_of(self_tid());
  int64_t t0 = zt::probe::now_ns();
  samples.push_back({t0, rec0});
  for (uint64_t i = 0; i < n; ++i) {
    AllocEvent e = make_event(S, wl.next());
    AllocId id;
    if (timed) {
      uint64_t a = ticks();
      id = rec.alloc(e);
      R.lat[i] = clamp32(ticks() - a);
    } else {
      id = rec.alloc(e);
    }
    if (free_half) {
      if (int64_t(i) >= kFreeDelay && ((i - kFreeDelay) & 1) == 0) {
        rec.free(recent[(i - kFreeDelay) % kFreeDelay]);
        ++R.events;
      }
      recent[i % kFreeDelay] = id;
    }
    if ((i & 8191) == 8191) samples.push_back({zt::probe::now_ns(), rec.events_recorded()});
  }
  if (free_half)
    for (uint64_t j = n > uint64_t(kFreeDelay) ? n - kFreeDelay : 0; j < n; ++j)
      if ((j & 1) == 0) {
        rec.free(recent[j % kFreeDelay]);
        ++R.events;
      }
  int64_t t_prod = zt::probe::now_ns();
  samples.push_back({t_prod, rec.events_recorded()});
  rec.flush();
  int64_t t_flush = zt::probe::now_ns();
  R.writer_cpu = sched_of(S.writer_tid) - w0;
  Sched p1 = sched_of(self_tid());
  R.producer_cpu = p1 - p0;
  R.recorded = rec.events_recorded() - rec0;
  R.dropped = rec.events_dropped();
  if (zt::Status s = rec.close(); !s) die(s.message());
  int64_t t_close = zt::probe::now_ns();
  R.close_cpu = sched_of(self_tid()) - p1;
  S.rec.reset();

  R.rows = n;
  R.events += n;
  R.produce_s = secs(t0, t_prod);
  R.commit_s = secs(t0, t_flush);
  R.close_s = secs(t_flush, t_close);
  // Drain rate while producing: the middle 80 % of the production window.
  int64_t lo = t0 + (t_prod - t0) / 10, hi = t_prod - (t_prod - t0) / 10;
  const Sample* a = nullptr;
  const Sample* b = nullptr;
  for (const Sample& s : samples) {
    if (!a && s.t >= lo) a = &s;
    if (s.t <= hi) b = &s;
  }
  if (a && b && b->t > a->t) R.drain_rate = double(b->recorded - a->recorded) / secs(a->t, b->t);
  R.bytes = trace_bytes(path);
  if (!free_half) R.bd = allocation_breakdown(path);
  R.rows_in_file = count_rows(path, "SELECT count(*) FROM allocation");
  R.freed_in_file = count_rows(path, "SELECT count(*) FROM allocation WHERE t_free IS NOT NULL");
  return R;
}

// A call chain of `depth` frames above capture_stack(), so stacks look like a framework's.
__attribute__((noinline)) StackId deep(Recorder& rec, int depth) {
  if (depth <= 0) return rec.capture_stack();
  StackId s = deep(rec, depth - 1);
  asm volatile("" : "+r"(s));  // no tail call: every level stays a frame
  return s;
}

struct HotResult {
  size_t ring = 0;
  Lat cold, warm, free_, stack, clock;
  double idle_drain_rate = 0;  // events/s the writer commits after the producer stopped
  uint64_t batch_n = 0;
  double batch_mean_ns = 0, batch_loop_ns = 0;  // untimed pass: ns per alloc(), and per empty loop turn
  uint64_t dropped = 0;
  int stack_depth_min = 0, stack_depth_max = 0;
};

// A ring large enough that reserve() never waits: every pass starts after flush() with at
// most ring_events events, so the per-call figures exclude blocking on a full ring.
HotResult run_hot(const std::string& path, uint64_t n, uint64_t stack_events) {
  HotResult H;
  // The largest power of two <= n (>= 2^20 = 1,048,576 with the default n): the cold pass fills
  // every slot once, the warm passes then reuse mapped slots only.
  size_t ring = 64;
  while (ring * 2 <= n) ring <<= 1;
  stack_events = std::min<uint64_t>(stack_events, ring);
  H.ring = ring;
  Setup S = open_recorder(path, ring, zt::probe::OverflowPolicy::Block);
  Recorder& rec = *S.rec;
  Workload wl;
  std::vector<uint32_t> lat(std::max<uint64_t>(ring, n));

  // Pass 1, cold ring: `ring` events touch every slot once (first-touch page faults included).
  for (size_t i = 0; i < ring; ++i) {
    AllocEvent e = make_event(S, wl.next());
    uint64_t a = ticks();
    (void)rec.alloc(e);
    lat[i] = clamp32(ticks() - a);
  }
  H.cold = lat_stats(std::vector<uint32_t>(lat.begin(), lat.begin() + ring));
  rec.flush();

  // Pass 2, warm ring: `ring` events into slots that are already mapped.
  n = ring;
  std::vector<AllocId> ids(n);
  uint64_t rec_before = rec.events_recorded();
  for (uint64_t i = 0; i < n; ++i) {
    AllocEvent e = make_event(S, wl.next());
    uint64_t a = ticks();
    ids[i] = rec.alloc(e);
    lat[i] = clamp32(ticks() - a);
  }
  int64_t t_prod = zt::probe::now_ns();
  uint64_t rec_at_prod = rec.events_recorded();
  H.warm = lat_stats(std::vector<uint32_t>(lat.begin(), lat.begin() + n));
  rec.flush();
  int64_t t_flush = zt::probe::now_ns();
  uint64_t left = n - std::min<uint64_t>(n, rec_at_prod - rec_before);
  if (t_flush > t_prod && left > 0) H.idle_drain_rate = double(left) / secs(t_prod, t_flush);

  // Pass 2b: the same call untimed, n/4 calls in one interval: the mean cost without a per-call
  // timer, less the cost of the same loop without the call. Thread CPU time, not wall time, so
  // that being preempted on a busy machine does not count.
  {
    uint64_t nb = std::max<uint64_t>(1, n / 4);
    Workload w2 = wl;
    int64_t a0 = thread_cpu_ns();
    for (uint64_t i = 0; i < nb; ++i) {
      AllocEvent e = make_event(S, w2.next());
      asm volatile("" : : "g"(&e) : "memory");
    }
    int64_t a1 = thread_cpu_ns();
    for (uint64_t i = 0; i < nb; ++i) {
      AllocEvent e = make_event(S, wl.next());
      asm volatile("" : : "g"(&e) : "memory");
      (void)rec.alloc(e);
    }
    int64_t a2 = thread_cpu_ns();
    H.batch_n = nb;
    H.batch_loop_ns = double(a1 - a0) / double(nb);
    H.batch_mean_ns = double(a2 - a1) / double(nb) - H.batch_loop_ns;
    rec.flush();
  }

  // Pass 3: free() for half of pass 2's allocations.
  uint64_t nf = 0;
  for (uint64_t i = 0; i < n; i += 2) {
    uint64_t a = ticks();
    rec.free(ids[i]);
    lat[nf++] = clamp32(ticks() - a);
  }
  H.free_ = lat_stats(std::vector<uint32_t>(lat.begin(), lat.begin() + nf));
  // Reference: the clock read alloc() and free() do when t == 0.
  for (uint64_t i = 0; i < nf; ++i) {
    uint64_t a = ticks();
    int64_t t = zt::probe::now_ns();
    asm volatile("" : : "r"(t));
    lat[i] = clamp32(ticks() - a);
  }
  H.clock = lat_stats(std::vector<uint32_t>(lat.begin(), lat.begin() + nf));
  rec.flush();

  // Pass 4: capture_stack() + alloc() per event, 20..23 frames of our own above it.
  H.stack_depth_min = 20, H.stack_depth_max = 23;
  for (uint64_t i = 0; i < stack_events; ++i) {
    AllocEvent e = make_event(S, wl.next());
    int depth = 20 + int(i & 3);
    uint64_t a = ticks();
    e.stack = deep(rec, depth);
    (void)rec.alloc(e);
    lat[i] = clamp32(ticks() - a);
  }
  H.stack = lat_stats(std::vector<uint32_t>(lat.begin(), lat.begin() + stack_events));
  H.dropped = rec.events_dropped();
  if (zt::Status s = rec.close(); !s) die(s.message());
  return H;
}

// ------------------------------------------------------------------ printing

std::string commas(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f", v);
  std::string s = buf, out;
  size_t start = (s[0] == '-') ? 1 : 0;
  for (size_t i = 0; i < s.size(); ++i) {
    out += s[i];
    size_t rest = s.size() - i - 1;
    if (i >= start && rest > 0 && rest % 3 == 0) out += ',';
  }
  return out;
}
std::string fmt(double v, int prec = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}
std::string ratio(double ours, double base) { return base > 0 ? fmt(ours / base, 2) + "x" : "-"; }

void header(const char* title) {
  std::printf("\n%s\n", title);
  std::printf("%-62s %18s %18s %9s  %s\n", "figure", "ours", "baseline", "ours/base", "target");
  std::printf("%s\n", std::string(62 + 1 + 18 + 1 + 18 + 1 + 9 + 2 + 20, '-').c_str());
}
void line(const std::string& label, const std::string& ours, const std::string& base, const std::string& r,
          const std::string& target = "") {
  std::printf("%-62s %18s %18s %9s  %s\n", label.c_str(), ours.c_str(), base.c_str(), r.c_str(), target.c_str());
}

uint64_t parse_count(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || v <= 0) die(std::string("not a count: ") + s);
  if (*end == 'k' || *end == 'K') v *= 1e3;
  else if (*end == 'm' || *end == 'M') v *= 1e6;
  return uint64_t(v);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 2000000;
  uint64_t stack_events = 0;
  std::string clock = cpu_has_invariant_tsc() ? "tsc" : "posix";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--stack-events" && i + 1 < argc) stack_events = parse_count(argv[++i]);
    else if (a == "--clock" && i + 1 < argc) clock = argv[++i];
    else if (a == "--keep") g_keep = true;
    else if (a == "-h" || a == "--help") {
      std::printf("usage: bench_writer [N] [--stack-events M] [--clock tsc|posix] [--keep]\n");
      return 0;
    } else n = parse_count(argv[i]);
  }
  if (n < 2 * uint64_t(kFreeDelay)) n = 2 * kFreeDelay;
  if (stack_events == 0) stack_events = std::max<uint64_t>(1, n / 16);
  if (clock != "tsc" && clock != "posix") die("--clock is tsc or posix");
  if (clock == "tsc" && !ZT_BENCH_HAVE_TSC) die("--clock tsc: no TSC on this architecture");
  g_tsc = clock == "tsc";
  ::signal(SIGPIPE, SIG_IGN);  // `bench_writer | head` still removes its temporary directory
  calibrate();

  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/zt_bench_writer.XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) die("mkdtemp failed: " + std::string(std::strerror(errno)));
  g_tmpdir = buf.data();

  int64_t t_start = zt::probe::now_ns();
  Lat ovh = timer_overhead(1000000);
  const double ov = ovh.p50;  // subtracted from every percentile for the "net" figures

  std::printf("bench_writer: N = %s allocation rows per run, sqlite %s, temp dir %s\n", commas(double(n)).c_str(),
              sqlite3_libversion(), g_tmpdir.c_str());
  std::printf("per-call timer: %s; %.4f ns/tick;\n  timer overhead (two back-to-back reads) p50 %.1f ns, p99 %.1f ns;"
              " resolution %.1f ns (percentiles are quantized to it)\n",
              g_tsc ? "lfence;rdtsc;lfence, calibrated against steady_clock" : "clock_gettime(CLOCK_MONOTONIC)",
              g_ns_per_tick, ovh.p50, ovh.p99, g_granularity_ns);
  std::printf("cores online %ld, load average at start %s\n", sysconf(_SC_NPROCESSORS_ONLN), loadavg().c_str());
  std::fflush(stdout);

  BaselineResult B = run_baseline(g_tmpdir + "/baseline.zt", n, false);
  BaselineResult BF = run_baseline(g_tmpdir + "/baseline_free.zt", n, true);
  // The alloc-only run also times every call: the producer is throttled by the writer (it waits
  // on the full ring most of the time), so the per-call timer does not change the throughput.
  ThroughputResult A = run_ours(g_tmpdir + "/ours.zt", n, false, true);
  ThroughputResult F = run_ours(g_tmpdir + "/ours_free.zt", n, true, false);
  HotResult H = run_hot(g_tmpdir + "/ours_hot.zt", n, stack_events);
  Lat blk = lat_stats(std::move(A.lat));
  Lat base_lat = lat_stats(std::move(B.lat));
  Lat base_upd_lat = lat_stats(std::move(BF.upd_lat));

  // ---- 1. throughput
  auto target = [](double v) { return std::string(">= 1,000,000") + (v >= 1e6 ? " met" : " MISSED"); };
  header("1. Writer throughput, allocation rows, one writer thread (ours: default 32Ki ring, Block policy)");
  double b_loop = double(B.rows) / B.loop_s, b_e2e = double(B.rows) / (B.loop_s + B.finish_s);
  double a_e2e = double(A.rows) / (A.commit_s + A.close_s), a_commit = double(A.rows) / A.commit_s;
  double a_cpu = double(A.rows) / A.writer_cpu.run_s, b_cpu = double(B.rows) / B.loop_cpu.run_s;
  line("alloc: end-to-end, first event -> close() returned [rows/s]", commas(a_e2e), commas(b_e2e),
       ratio(a_e2e, b_e2e), target(a_e2e));
  line("alloc: first event -> all committed (flush), excl. close [rows/s]", commas(a_commit), commas(b_loop),
       ratio(a_commit, b_loop), target(a_commit));
  line("alloc: drain rate while producing, middle 80% [rows/s]", commas(A.drain_rate), commas(b_loop),
       ratio(A.drain_rate, b_loop), target(A.drain_rate));
  line("alloc: drain rate, producer idle (2a's big ring) [rows/s]", commas(H.idle_drain_rate), commas(b_loop),
       ratio(H.idle_drain_rate, b_loop), target(H.idle_drain_rate));
  line("alloc: rows per writer-thread CPU second [rows/s]", commas(a_cpu), commas(b_cpu), ratio(a_cpu, b_cpu),
       target(a_cpu));
  line("alloc: writer-thread CPU per row [ns]", fmt(A.writer_cpu.run_s * 1e9 / A.rows),
       fmt(B.loop_cpu.run_s * 1e9 / B.rows), ratio(A.writer_cpu.run_s, B.loop_cpu.run_s));
  line("alloc: writer runnable but not running (CPU contention) [s]", fmt(A.writer_cpu.wait_s, 3),
       fmt(B.loop_cpu.wait_s, 3), "-");
  line("alloc: producer thread on CPU / wall during the run [s]",
       fmt(A.producer_cpu.run_s, 3) + " / " + fmt(A.produce_s, 3), "-", "-");
  line("alloc: close() vs finish(), indexes + checkpoint: wall [s]", fmt(A.close_s, 3), fmt(B.finish_s, 3),
       ratio(A.close_s, B.finish_s));
  line("alloc: close() vs finish(): caller-thread CPU [s]", fmt(A.close_cpu.run_s, 3), fmt(B.finish_cpu.run_s, 3),
       ratio(A.close_cpu.run_s, B.finish_cpu.run_s));
  double bf_loop = double(BF.rows) / BF.loop_s, bf_e2e = double(BF.rows) / (BF.loop_s + BF.finish_s);
  double f_e2e = double(F.rows) / (F.commit_s + F.close_s), f_commit = double(F.rows) / F.commit_s;
  double bf_ev = double(BF.rows + BF.updates) / BF.loop_s;
  double f_cpu = double(F.rows) / F.writer_cpu.run_s, bf_cpu = double(BF.rows) / BF.loop_cpu.run_s;
  line("alloc+free(half): end-to-end incl. close() [rows/s]", commas(f_e2e), commas(bf_e2e), ratio(f_e2e, bf_e2e),
       target(f_e2e));
  line("alloc+free(half): first event -> committed [rows/s]", commas(f_commit), commas(bf_loop),
       ratio(f_commit, bf_loop), target(f_commit));
  line("alloc+free(half): same in events/s, 1.5 per row [events/s]", commas(double(F.events) / F.commit_s),
       commas(bf_ev), ratio(double(F.events) / F.commit_s, bf_ev));
  line("alloc+free(half): drain rate while producing [events/s]", commas(F.drain_rate), commas(bf_ev),
       ratio(F.drain_rate, bf_ev));
  line("alloc+free(half): rows per writer-thread CPU second [rows/s]", commas(f_cpu), commas(bf_cpu),
       ratio(f_cpu, bf_cpu), target(f_cpu));
  line("alloc+free(half): close() vs finish(): wall [s]", fmt(F.close_s, 3), fmt(BF.finish_s, 3),
       ratio(F.close_s, BF.finish_s));
  std::printf("   baseline columns: the plain loop's BEGIN..COMMIT for 'committed'/'drain' lines, loop + finish()\n"
              "   for end-to-end; its CPU lines are the loop thread's. ours 'committed' = first alloc() -> flush()\n"
              "   returned; close() then adds the index build + WAL checkpoint (reported separately).\n");

  // ---- 2. hot path
  auto hot = [&](const std::string& what, const Lat& L, const Lat& base, const std::string& target_p50) {
    line(what + ": p50 raw [ns]", fmt(L.p50), fmt(base.p50), ratio(L.p50, base.p50));
    line(what + ": p50 net of timer [ns]", fmt(L.p50 - ov), fmt(base.p50 - ov), ratio(L.p50 - ov, base.p50 - ov),
         target_p50.empty() ? "" : target_p50 + (L.p50 - ov <= 100 ? " met" : " MISSED"));
    line(what + ": p99 raw / net [ns]", fmt(L.p99) + " / " + fmt(L.p99 - ov), fmt(base.p99) + " / " + fmt(base.p99 - ov),
         ratio(L.p99 - ov, base.p99 - ov));
    line(what + ": p99.9 / max raw [ns]", fmt(L.p999) + " / " + commas(L.max), fmt(base.p999) + " / " + commas(base.max),
         "-");
    line(what + ": mean raw [ns]", fmt(L.mean), fmt(base.mean), ratio(L.mean, base.mean));
  };
  std::printf("\n2. Hot-path cost per event on the caller's thread (baseline: one plain-loop insert, bind+step+reset,\n"
              "   every %" PRIu64 "th of the baseline loop timed; net = raw - timer overhead p50 %.1f ns)\n",
              kSample, ov);
  // The plain loop's CPU time per row (its thread, BEGIN..COMMIT), as the batch figure's baseline.
  const double base_batch = B.loop_cpu.run_s * 1e9 / double(B.rows);
  header("2a. alloc(), no stack, ring of 2^k <= N events, flushed before each pass of <= 2^k: never waits");
  hot("alloc, warm ring (" + commas(double(H.warm.n)) + " ev)", H.warm, base_lat, "<= 100");
  line("alloc, untimed batch of " + commas(double(H.batch_n)) + ": mean CPU per call [ns]", fmt(H.batch_mean_ns),
       fmt(base_batch), ratio(H.batch_mean_ns, base_batch), "(loop alone " + fmt(H.batch_loop_ns) + " ns, subtracted)");
  line("reference: now_ns() alone, p50 / p99 net [ns]", fmt(H.clock.p50 - ov) + " / " + fmt(H.clock.p99 - ov), "-",
       "-", "(alloc/free stamp t=0 events with it)");
  hot("alloc, cold ring 1st pass (" + commas(double(H.cold.n)) + " ev)", H.cold, base_lat, "");
  header("2b. free(id), same big warm ring (baseline: one plain-loop UPDATE allocation SET t_free)");
  hot("free (" + commas(double(H.free_.n)) + " ev)", H.free_, base_upd_lat, "");
  header("2c. alloc() when the ring fills: section 1's alloc-only run, default 32Ki ring, Block (waits included)");
  hot("alloc, Block, ring fills (" + commas(double(blk.n)) + " ev)", blk, base_lat, "");
  std::printf("   (%s rows in %.3f s producer time; a producer on a full ring sleeps 50 us and retries)\n",
              commas(double(A.rows)).c_str(), A.produce_s);
  header("2d. capture_stack() + alloc(), 21-24 frames of our own (+ main's)");
  hot("stack+alloc (" + commas(double(H.stack.n)) + " ev)", H.stack, base_lat, "");

  // ---- 3. bytes
  header("3. Bytes per allocation row on disk (file after close(); baseline after finish(): same indexes)");
  line("alloc only: file bytes / row [bytes]", fmt(double(A.bytes) / double(A.rows)), fmt(double(B.bytes) / double(B.rows)),
       ratio(double(A.bytes) / A.rows, double(B.bytes) / B.rows));
  if (A.bd.ok && B.bd.ok) {
    line("alloc only: allocation table pages / row [bytes]", fmt(double(A.bd.table) / A.rows),
         fmt(double(B.bd.table) / B.rows), ratio(double(A.bd.table), double(B.bd.table)));
    line("alloc only: its 3 indexes' pages / row [bytes]", fmt(double(A.bd.indexes) / A.rows),
         fmt(double(B.bd.indexes) / B.rows), ratio(double(A.bd.indexes), double(B.bd.indexes)));
  }
  line("alloc + free(half): file bytes / row [bytes]", fmt(double(F.bytes) / double(F.rows)),
       fmt(double(BF.bytes) / double(BF.rows)), ratio(double(F.bytes) / F.rows, double(BF.bytes) / BF.rows));
  line("alloc only: file size [bytes]", commas(double(A.bytes)), commas(double(B.bytes)), ratio(A.bytes, B.bytes));

  // ---- checks
  std::printf("\nchecks: ours alloc-only file has %" PRId64 " allocation rows (expected %" PRIu64
              "); free run: %" PRId64 " rows, %" PRId64 " freed (expected %" PRIu64 ")\n",
              A.rows_in_file, A.rows, F.rows_in_file, F.freed_in_file, BF.updates);
  std::printf("        events recorded by the writer: alloc-only %" PRIu64 ", free run %" PRIu64 " (of %" PRIu64
              "); dropped: %" PRIu64 " / %" PRIu64 " / %" PRIu64 "\n",
              A.recorded, F.recorded, F.events, A.dropped, F.dropped, H.dropped);
  std::printf("        big ring for 2a/2b/2d: %s events (~%s MiB at 96 B per ring slot)\n", commas(double(H.ring)).c_str(),
              fmt(double(H.ring) * 96.0 / 1048576.0, 0).c_str());
  std::printf("load average at end %s\n", loadavg().c_str());
  std::printf("total wall time %.1f s\n", secs(t_start, zt::probe::now_ns()));
  cleanup();
  if (g_keep) std::printf("kept %s\n", g_tmpdir.c_str());
  return 0;
}
