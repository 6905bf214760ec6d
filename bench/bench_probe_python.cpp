// bench_probe_python: what `zt probe` costs a Python program, with Python frames in its stacks,
// against the same program unprobed and against heaptrack on it, all in the same run.
//
// The workload is a JSON-heavy script (written to a temporary folder): json.dumps and json.loads
// of a 20000-record structure, ROUNDS times. Nearly all its allocations are small (counted by the
// probe, not recorded); each dumps makes a string of about 2.9 MiB and the encoder's chunk list,
// which are above the default 1 MiB threshold and recorded with a stack of native and Python
// frames. Runs alternate (unprobed, probed, probed without Python frames, heaptrack); the median
// wall time of each is printed, and the median CPU time (user + system of the process and its
// children, which for heaptrack includes heaptrack_interpret). Ratios are against the unprobed run. A second
// workload records every allocation (2 MiB bytearrays, 20 Python calls deep): the CPU time one
// recorded stack costs, with and without its Python frames. The byte sampler of allocations under
// the threshold (on by default, 512 KiB) is timed against the same probe with it off
// (ZT_PROBE_SAMPLE_INTERVAL=0) in the same alternation: its cost, as a ratio.
// --hf-runs N: the HF Trainer job of the realjobs tests (tests/realjobs/jobs/hf_trainer.py, clean: a tiny
// GPT-2 on CPU, 4 epochs of 16 steps, in build/realjobs-venv: scripts/setup --realjobs) unprobed, under
// `zt probe` (sampling on, the default), under memray (where `pip install --target build/bench-memray memray`
// put it) and under heaptrack, N alternating runs each, medians and ratios. --hf-only skips the rest.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "zt/db/trace_reader.h"

namespace {

const char* kScript = R"(import json, sys
rounds = int(sys.argv[1])
data = [{"id": i, "name": "item%d" % i, "tags": ["alpha", "beta", "gamma"], "vals": [i * 0.5, i * 1.5, i * 2.5],
         "nested": {"k": i, "s": "x" * (i % 17)}} for i in range(20000)]

def roundtrip(d):
    s = json.dumps(d)
    return s, json.loads(s)

total = 0
for r in range(rounds):
    s, back = roundtrip(data)
    total += len(s) + len(back)
print(total)
)";

// Every allocation recorded: N bytearrays of 2 MiB made 20 Python calls deep (the cost of one
// recorded stack with and without its Python frames).
const char* kDeepScript = R"(import sys
n = int(sys.argv[1])

def down(depth):
    if depth == 0:
        for i in range(n):
            b = bytearray(2 << 20)
        return
    down(depth - 1)

down(20)
)";

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The median of the runs' wall times and of their CPU times (each taken apart): on a shared machine
// the fastest run says more about the neighbours' quiet moments than about the program.
struct Timing {
  std::vector<int64_t> walls, cpus;
  int64_t wall = 0, cpu = 0;
  bool ok = false;
  void settle() {
    auto median = [](std::vector<int64_t> v) {
      std::sort(v.begin(), v.end());
      return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
    };
    wall = median(walls), cpu = median(cpus);
  }
};

// Runs argv with env added (stdout and stderr to /dev/null); wall and CPU time, or -1 on failure.
std::pair<int64_t, int64_t> run(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  const int64_t t0 = now_ns();
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    unsetenv("ZT_PROBE_CLAIMED");
    unsetenv("LD_PRELOAD");
    for (auto& kv : env) putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execvp(a[0], a.data());
    _exit(127);
  }
  int st = 0;
  rusage ru{};
  wait4(pid, &st, 0, &ru);
  const int64_t wall = now_ns() - t0;
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return {-1, -1};
  const int64_t cpu = (int64_t(ru.ru_utime.tv_sec) + ru.ru_stime.tv_sec) * 1000000000 +
                      (int64_t(ru.ru_utime.tv_usec) + ru.ru_stime.tv_usec) * 1000;
  return {wall, cpu};
}

void keep(Timing& t, std::pair<int64_t, int64_t> r) {
  if (r.first < 0) return;
  t.ok = true;
  t.walls.push_back(r.first);
  t.cpus.push_back(r.second);
  t.settle();
}

bool on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "";
  for (size_t a = 0; a <= p.size();) {
    size_t b = p.find(':', a);
    if (b == std::string::npos) b = p.size();
    if (access((p.substr(a, b - a) + "/" + name).c_str(), X_OK) == 0) return true;
    a = b + 1;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  zt::bench::Options opt(argc, argv,
                         "bench_probe_python [--rounds R] [--runs N] [--hf-runs M] [--hf-only]   (R json round trips a "
                         "run, default 20; N alternating runs of each, default 5; M runs of the HF Trainer job, "
                         "default 3, 0: none)");
  const long rounds = opt.integer("--rounds", 20, 1, 100000);
  const long runs = opt.integer("--runs", 5, 1, 1000);
  const long hf_runs = opt.integer("--hf-runs", 3, 0, 1000);
  const bool hf_only = opt.flag("--hf-only");
  opt.done();
  namespace fs = std::filesystem;
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string lib = (fs::path(self).parent_path().parent_path() / "libzt_probe.so").string();
  if (const char* v = std::getenv("ZT_PROBE_LIBRARY")) lib = v;
  if (!fs::exists(lib)) {
    std::fprintf(stderr, "bench_probe_python: %s not found (build the zt_probe_so target)\n", lib.c_str());
    return 2;
  }
  const std::string python = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  const std::string dir = fs::temp_directory_path() / ("zt-bench-probe-python-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string script = dir + "/json_roundtrips.py", trace = dir + "/probe.db", ht = dir + "/heaptrack";
  const std::string deep = dir + "/deep_records.py";
  std::ofstream(script) << kScript;
  std::ofstream(deep) << kDeepScript;
  const bool have_heaptrack = on_path("heaptrack");
  if (hf_only) goto hf;
  {

  const std::vector<std::string> cmd{python, script, std::to_string(rounds)};
  auto probe_env = [&](const char* python_frames, const char* sample_interval = "512KiB") {
    return std::vector<std::string>{"LD_PRELOAD=" + lib, "ZT_PROBE_OUTPUT=" + trace, "ZT_PROBE_QUIET=1",
                                    std::string("ZT_PROBE_PYTHON=") + python_frames,
                                    std::string("ZT_PROBE_SAMPLE_INTERVAL=") + sample_interval};
  };
  std::vector<std::string> ht_cmd{"heaptrack", "-o", ht};
  ht_cmd.insert(ht_cmd.end(), cmd.begin(), cmd.end());
  Timing base, probed, native_only, heaptrack, unsampled;
  for (long i = 0; i < runs; ++i) {
    keep(base, run(cmd, {}));
    fs::remove(trace);
    keep(unsampled, run(cmd, probe_env("1", "0")));
    fs::remove(trace);
    keep(probed, run(cmd, probe_env("1")));
    if (i + 1 < runs) fs::remove(trace);  // the last probed trace is read below
    std::error_code ec;
    fs::rename(trace, dir + "/probe-python.db", ec);
    keep(native_only, run(cmd, probe_env("0")));
    fs::remove(trace);
    fs::rename(dir + "/probe-python.db", trace, ec);
    if (have_heaptrack) {
      keep(heaptrack, run(ht_cmd, {}));
      for (auto& e : fs::directory_iterator(dir))
        if (e.path().filename().string().rfind("heaptrack", 0) == 0) fs::remove(e.path(), ec);
    }
  }
  if (!base.ok || !probed.ok) {
    std::fprintf(stderr, "bench_probe_python: the workload failed (%s %s)\n", python.c_str(), script.c_str());
    return 1;
  }
  std::printf("bench_probe_python: %s, %ld json round trips of 20000 records a run, median of %ld alternating runs\n",
              python.c_str(), rounds, runs);
  std::printf("  %-44s %10s %8s %10s %8s\n", "", "wall", "ratio", "cpu", "ratio");
  auto line = [&](const char* what, const Timing& t) {
    if (!t.ok) return;
    std::printf("  %-44s %8.0f ms %7.3fx %8.0f ms %7.3fx\n", what, double(t.wall) / 1e6, double(t.wall) / double(base.wall),
                double(t.cpu) / 1e6, double(t.cpu) / double(base.cpu));
  };
  line("unprobed", base);
  line("zt probe, Python frames (default)", probed);
  line("zt probe, ZT_PROBE_PYTHON=0 (native stacks)", native_only);
  line("zt probe, sampling off (SAMPLE_INTERVAL=0)", unsampled);
  if (have_heaptrack) line("heaptrack", heaptrack);
  else std::printf("  heaptrack: skipped (not on PATH; Debian package heaptrack)\n");
  std::printf("  target: zt probe at most 1.05x wall\n");
  if (unsampled.ok)
    std::printf("  the byte sampler (512 KiB, on) against off, same run: %.3fx wall, %.3fx cpu (target: at most 1.05x)\n",
                double(probed.wall) / double(unsampled.wall), double(probed.cpu) / double(unsampled.cpu));

  std::unique_ptr<zt::db::TraceReader> r;
  if (zt::db::TraceReader::open(trace, &r)) {
    zt::db::QueryResult q;
    if (r->query(std::string("SELECT count(*), count(DISTINCT stack_id), (SELECT count(*) FROM frame WHERE ip = 0), "
                             "(SELECT count(*) FROM allocation WHERE ") + r->sampled_sql() + ") FROM allocation",
                 &q) &&
        !q.rows.empty())
      std::printf("  the probed run's trace: %s allocation rows (%s of them sampled), %s distinct stacks, %s Python frames\n",
                  q.rows[0][0].c_str(), q.rows[0][3].c_str(), q.rows[0][1].c_str(), q.rows[0][2].c_str());
  }
  r.reset();

  // The cost of one recorded stack: every allocation above the threshold, 20 Python calls deep.
  const long kDeep = 5000;
  const std::vector<std::string> deep_cmd{python, deep, std::to_string(kDeep)};
  Timing d_base, d_py, d_native;
  for (long i = 0; i < runs; ++i) {
    keep(d_base, run(deep_cmd, {}));
    fs::remove(trace);
    keep(d_native, run(deep_cmd, probe_env("0")));
    fs::remove(trace);
    keep(d_py, run(deep_cmd, probe_env("1")));
  }
  if (d_base.ok && d_py.ok && d_native.ok) {
    std::printf("  one recorded stack (%ld bytearray(2 << 20) 20 Python calls deep, CPU time over the unprobed run's):\n",
                kDeep);
    std::printf("    native stack only (ZT_PROBE_PYTHON=0)  %8.2f us a recorded allocation\n",
                double(d_native.cpu - d_base.cpu) / 1e3 / double(kDeep));
    std::printf("    with its Python frames (default)       %8.2f us a recorded allocation\n",
                double(d_py.cpu - d_base.cpu) / 1e3 / double(kDeep));
  }
  }
hf:
  if (hf_runs > 0) {
    const fs::path build = fs::path(self).parent_path().parent_path();
    const std::string venv_python = (build / "realjobs-venv/bin/python").string();
    const std::string zt = (build / "zt").string(), memray_dir = (build / "bench-memray").string();
    const std::string job = std::string(ZT_SOURCE_DIR) + "/tests/realjobs/jobs/hf_trainer.py";
    if (access(venv_python.c_str(), X_OK) != 0) {
      std::printf("  the HF Trainer job: skipped (no %s: scripts/setup --realjobs)\n", venv_python.c_str());
    } else {
      const std::vector<std::string> hf{venv_python, job, "clean", dir + "/hf-out", "4", "16"};
      const std::vector<std::string> env{"OMP_NUM_THREADS=1", "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1",
                                         "HF_HOME=" + dir + "/hf-home", "CUDA_VISIBLE_DEVICES="};
      std::vector<std::string> zt_cmd{zt, "probe", "-o", dir + "/hf.db", "--"};
      zt_cmd.insert(zt_cmd.end(), hf.begin(), hf.end());
      const bool have_memray = fs::exists(memray_dir + "/memray");
      std::vector<std::string> memray_cmd{venv_python, "-m", "memray", "run", "-q", "-f", "-o", dir + "/hf.memray"};
      memray_cmd.insert(memray_cmd.end(), hf.begin() + 1, hf.end());
      std::vector<std::string> memray_env = env;
      memray_env.push_back("PYTHONPATH=" + memray_dir);
      std::vector<std::string> ht_hf{"heaptrack", "-o", dir + "/hf-heaptrack"};
      ht_hf.insert(ht_hf.end(), hf.begin(), hf.end());
      Timing h_base, h_zt, h_memray, h_ht;
      std::error_code ec;
      for (long i = 0; i < hf_runs; ++i) {
        keep(h_base, run(hf, env));
        for (auto& e : fs::directory_iterator(dir))
          if (e.path().filename().string().rfind("hf.", 0) == 0) fs::remove(e.path(), ec);
        keep(h_zt, run(zt_cmd, env));
        if (have_memray) keep(h_memray, run(memray_cmd, memray_env));
        if (have_heaptrack) {
          keep(h_ht, run(ht_hf, env));
          for (auto& e : fs::directory_iterator(dir))
            if (e.path().filename().string().rfind("hf-heaptrack", 0) == 0) fs::remove(e.path(), ec);
        }
      }
      if (!h_base.ok || !h_zt.ok) {
        std::fprintf(stderr, "bench_probe_python: the HF Trainer job failed (%s %s)\n", venv_python.c_str(), job.c_str());
        return 1;
      }
      std::printf("the HF Trainer job (%s clean: tiny GPT-2, CPU, 4 epochs of 16 steps), median of %ld alternating runs\n",
                  job.c_str(), hf_runs);
      std::printf("  %-44s %10s %8s %10s %8s\n", "", "wall", "ratio", "cpu", "ratio");
      auto hf_line = [&](const char* what, const Timing& t) {
        if (!t.ok) return;
        std::printf("  %-44s %8.0f ms %7.3fx %8.0f ms %7.3fx\n", what, double(t.wall) / 1e6,
                    double(t.wall) / double(h_base.wall), double(t.cpu) / 1e6, double(t.cpu) / double(h_base.cpu));
      };
      hf_line("unprobed", h_base);
      hf_line("zt probe (sampling on, 512 KiB)", h_zt);
      if (have_memray) hf_line("memray run", h_memray);
      else std::printf("  memray: skipped (pip install --target %s memray)\n", memray_dir.c_str());
      if (have_heaptrack) hf_line("heaptrack", h_ht);
      std::printf("  target: zt probe at most 1.05x (issue 40: memray 1.41x, heaptrack 4.18x)\n");
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}
