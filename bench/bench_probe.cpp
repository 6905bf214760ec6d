// bench_probe: what libzt_probe.so costs a program, as ratios measured in the same run.
//
// The same binary is the workload: `bench_probe --small N` runs N small malloc/free pairs
// (below the 1 MiB threshold: counted, never recorded) and prints its loop time;
// `bench_probe --large N` runs N 2 MiB malloc/free pairs (each one recorded with a stack).
// The driver runs each workload with and without LD_PRELOAD=libzt_probe.so, alternating,
// keeps the fastest of several runs of each, and prints the ratio, plus the bytes of trace per
// recorded event. The CUDA overhead needs a GPU and is not measured here.
#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_util.h"
#include "zt/common/units.h"
#include "zt/db/trace_reader.h"

namespace {

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// A mix like a real program's: sizes 16..1024 bytes, a window of live blocks freed out of order.
__attribute__((noinline)) int64_t small_workload(long n) {
  constexpr int kWindow = 256;
  void* live[kWindow] = {};
  uint32_t x = 12345;
  int64_t t0 = now_ns();
  for (long i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    int slot = int(x >> 24) % kWindow;
    std::free(live[slot]);
    live[slot] = std::malloc(16 + (x & 1008));
    if (live[slot]) static_cast<char*>(live[slot])[0] = char(i);
  }
  int64_t t1 = now_ns();
  for (auto* p : live) std::free(p);
  return t1 - t0;
}

void* volatile g_sink;  // keeps the compiler from removing a malloc/free pair

__attribute__((noinline)) int64_t large_workload(long n) {
  int64_t t0 = now_ns();
  for (long i = 0; i < n; ++i) {
    g_sink = std::malloc(2 << 20);
    std::free(g_sink);
  }
  return now_ns() - t0;
}

// Runs this binary with `args`, optionally under the probe; returns the loop time it printed.
int64_t run_child(const std::string& self, const std::vector<std::string>& args, const std::string& preload,
                  const std::string& trace) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    unsetenv("ZT_PROBE_CLAIMED");
    if (!preload.empty()) {
      setenv("LD_PRELOAD", preload.c_str(), 1);
      setenv("ZT_PROBE_OUTPUT", trace.c_str(), 1);
      setenv("ZT_PROBE_QUIET", "1", 1);
    } else {
      unsetenv("LD_PRELOAD");
    }
    std::vector<char*> argv{const_cast<char*>(self.c_str())};
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(self.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  char buf[128] = {};
  ssize_t got = read(fds[0], buf, sizeof buf - 1);
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  if (got <= 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return -1;
  return std::atoll(buf);
}

struct Pair {
  int64_t base = INT64_MAX, probed = INT64_MAX;
};

Pair measure(const std::string& self, const std::vector<std::string>& args, const std::string& lib,
             const std::string& trace, int rounds) {
  Pair p;
  for (int i = 0; i < rounds; ++i) {
    int64_t b = run_child(self, args, "", "");
    int64_t q = run_child(self, args, lib, trace);
    if (b > 0) p.base = std::min(p.base, b);
    if (q > 0) p.probed = std::min(p.probed, q);
  }
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--small") == 0) {
    std::printf("%lld\n", (long long)small_workload(std::atol(argv[2])));
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "--large") == 0) {
    std::printf("%lld\n", (long long)large_workload(std::atol(argv[2])));
    return 0;
  }
  zt::bench::Options opt(argc, argv, "bench_probe   (no options; --small N / --large N run the workload itself)");
  opt.done();
  namespace fs = std::filesystem;
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string lib = (fs::path(self).parent_path().parent_path() / "libzt_probe.so").string();
  if (const char* v = std::getenv("ZT_PROBE_LIBRARY")) lib = v;
  if (!fs::exists(lib)) {
    std::fprintf(stderr, "bench_probe: %s not found (build the zt_probe_so target)\n", lib.c_str());
    return 2;
  }
  std::string dir = fs::temp_directory_path() / ("zt-bench-probe-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string trace = dir + "/bench.db";
  const long kSmall = 4000000, kLarge = 2000;
  const int kRounds = 5;

  std::printf("bench_probe: libzt_probe.so overhead (fastest of %d alternating runs each)\n", kRounds);
  Pair s = measure(self, {"--small", std::to_string(kSmall)}, lib, trace, kRounds);
  std::printf("  small malloc/free (16..1024 B, below the 1 MiB threshold), %ld pairs:\n", kSmall);
  std::printf("    without probe  %8.1f ns/pair\n", double(s.base) / kSmall);
  std::printf("    with probe     %8.1f ns/pair\n", double(s.probed) / kSmall);
  std::printf("    ratio          %8.2fx   (target: at most 1.30x)\n", double(s.probed) / double(s.base));

  Pair l = measure(self, {"--large", std::to_string(kLarge)}, lib, trace, kRounds);
  std::printf("  large malloc/free (2 MiB, recorded with a 32-frame stack), %ld pairs:\n", kLarge);
  // In ns: a cached 2 MiB malloc/free pair takes tens of them (in us with one decimal it read 0.0).
  std::printf("    without probe  %8.1f ns/pair\n", double(l.base) / kLarge);
  std::printf("    with probe     %8.1f ns/pair\n", double(l.probed) / kLarge);
  std::printf("    ratio          %8.2fx\n", double(l.probed) / double(l.base));

  // Bytes of trace per recorded event: the large run's trace (the last one written).
  std::unique_ptr<zt::db::TraceReader> r;
  if (zt::db::TraceReader::open(trace, &r)) {
    zt::db::QueryResult q;
    int64_t allocs = 0, counters = 0;
    if (r->query("SELECT (SELECT count(*) FROM allocation), (SELECT count(*) FROM counter)", &q) && !q.rows.empty()) {
      allocs = std::stoll(q.rows[0][0]);
      counters = std::stoll(q.rows[0][1]);
    }
    r.reset();
    auto bytes = static_cast<double>(fs::file_size(trace));
    // Each recorded allocation is two events (alloc, free) folded into one row.
    std::printf("  trace: %s for %lld allocation rows (alloc + free each) and %lld counter samples\n",
                zt::format_bytes(bytes).c_str(), (long long)allocs, (long long)counters);
    if (allocs > 0)
      std::printf("    %.0f bytes per recorded event (alloc or free), %.0f bytes per allocation row\n",
                  bytes / double(2 * allocs + counters), bytes / double(allocs));
  }
  void* cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  std::printf("  CUDA overhead: skipped (%s)\n",
              cuda ? "not measured: this benchmark has no CUDA workload yet"
                   : "needs a GPU and its driver; none here");
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}
