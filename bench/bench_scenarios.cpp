// bench_scenarios: what replaying the bug reports costs, and what failpoints cost when off.
//
// 1. Every full-size scenario (the report's own model and cluster, virtual mode: bug run and
//    fix run) in a child process: wall time and peak RSS (wait4's ru_maxrss), beside the same
//    scenario's small real-compute variant measured the same way (the baseline).
// 2. Failpoints switched off: a training step (GPT-2 tiny, 2 ranks, ZeRO-3 with offload, no
//    trace) with no failpoint configured, beside the same step with one failpoint configured
//    for a site training never reaches (every site on the way then takes the slow path: a
//    registry lookup per evaluation).
// 3. The ZT_FAIL macro itself, ns per call: nothing configured (one relaxed atomic load),
//    an unrelated site configured (the slow path), against an empty loop.
//   bench_scenarios [--steps N] [--calls N]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_util.h"
#include "train/trainer.h"
#include "zt/common/units.h"
#include "zt/fail/failpoint.h"
#include "zt/repro/runner.h"

using namespace zt;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

struct Child {
  int exit_code = -1;
  double seconds = 0;
  double max_rss_mib = 0;
};

// Runs one scenario variant in a forked child (this process is single-threaded here), so
// its peak RSS is its own.
Child run_child(const std::string& file, repro::Variant v, const std::string& keep) {
  Child c;
  const auto t0 = Clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    repro::Scenario s;
    if (!repro::load_scenario(file, &s)) _exit(2);
    repro::RunOptions o;
    o.variant = v;
    o.keep_dir = keep;
    o.crash_handlers = false;
    repro::ReproResult r;
    if (!repro::run_scenario(s, o, &r)) _exit(2);
    _exit(r.exit_code());
  }
  int status = 0;
  struct rusage ru {};
  wait4(pid, &status, 0, &ru);
  c.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  c.max_rss_mib = double(ru.ru_maxrss) / 1024.0;
  return c;
}

inline void escape(const void* p) { asm volatile("" : : "g"(p) : "memory"); }

// Seconds per optimizer step (the training loop's own time, set-up excluded), no trace.
double step_seconds(const trainer::TrainConfig& cfg) {
  trainer::TrainSummary sum;
  Status s = trainer::train(cfg, nullptr, nullptr, &sum);
  if (!s) {
    std::fprintf(stderr, "bench_scenarios: %s\n", s.message().c_str());
    std::exit(1);
  }
  return sum.seconds / double(cfg.steps);
}

// ns per call of `body`, the best of `reps` runs of `calls` calls.
template <typename F>
double ns_per_call(int64_t calls, int reps, F&& body) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < calls; ++i) body(i);
    best = std::min(best, std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / double(calls));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  zt::bench::Options opt(argc, argv, "bench_scenarios [--steps N] [--calls N]");
  const int64_t steps = opt.integer("--steps", 30, 1);
  const int64_t calls = opt.integer("--calls", 20000000, 1);
  opt.done();
  const fs::path src = fs::path(__FILE__).parent_path().parent_path() / "inject" / "scenarios";
  const fs::path dir = fs::temp_directory_path() / ("zt_bench_scenarios_" + std::to_string(getpid()));
  fs::create_directories(dir);

  // ---- 1. the scenarios
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(src))
    if (e.path().extension() == ".yaml") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  std::printf("bench_scenarios: each scenario's bug run + fix run, in a child process; baseline: its small real-compute "
              "variant\n");
  std::printf("%-40s %12s %14s | %12s %14s | %9s %9s\n", "scenario", "full [s]", "full RSS [MiB]", "small [s]",
              "small RSS [MiB]", "time x", "RSS x");
  for (const auto& n : names) {
    const std::string file = (src / (n + ".yaml")).string();
    Child full = run_child(file, repro::Variant::Full, (dir / (n + "-full")).string());
    Child small = run_child(file, repro::Variant::Small, (dir / (n + "-small")).string());
    std::printf("%-40s %12.2f %14.1f | %12.2f %14.1f | %9.2f %9.2f%s\n", n.c_str(), full.seconds, full.max_rss_mib,
                small.seconds, small.max_rss_mib, full.seconds / small.seconds, full.max_rss_mib / small.max_rss_mib,
                full.exit_code == 0 && small.exit_code == 0 ? "" : "  (not reproduced and cured!)");
    fs::remove_all(dir / (n + "-full"));
    fs::remove_all(dir / (n + "-small"));
  }

  // ---- 2. a training step with failpoints off
  trainer::TrainConfig cfg;
  cfg.model = "tiny";
  cfg.world_size = 2;
  cfg.micro_batch = 2;
  cfg.grad_accum = 2;
  cfg.seq_len = 32;
  cfg.steps = steps;
  cfg.precision = "bf16";
  cfg.zero.stage = 3;
  cfg.zero.offload_optimizer = true;
  cfg.zero.offload_param = true;
  trainer::TrainConfig unrelated = cfg;
  unrelated.faults = {"ckpt.torn_write=return"};  // no checkpoint is saved: configured, never fires
  std::vector<double> bases, slows;
  for (int rep = 0; rep < 6; ++rep) {  // alternated ABBA (order effects cancel), the best of each
    if (rep % 2 == 0) {
      bases.push_back(step_seconds(cfg));
      slows.push_back(step_seconds(unrelated));
    } else {
      slows.push_back(step_seconds(unrelated));
      bases.push_back(step_seconds(cfg));
    }
  }
  std::sort(bases.begin(), bases.end());
  std::sort(slows.begin(), slows.end());
  const double base = bases.front(), slow = slows.front();
  std::printf("\ntraining step, GPT-2 tiny, 2 ranks, ZeRO-3 + offload, bf16, accumulation 2, no trace (best of 6 runs of %lld "
              "steps):\n",
              (long long)steps);
  const double base_med = (bases[2] + bases[3]) / 2, slow_med = (slows[2] + slows[3]) / 2;
  std::printf("  no failpoint configured           %8.3f ms per step   (baseline; median %.3f ms, runs %.3f-%.3f ms)\n",
              base * 1e3, base_med * 1e3, bases.front() * 1e3, bases.back() * 1e3);
  std::printf("  an unrelated failpoint configured %8.3f ms per step   ratio %.3fx (median %.3f ms, ratio %.3fx; runs "
              "%.3f-%.3f ms)\n",
              slow * 1e3, slow / base, slow_med * 1e3, slow_med / base_med, slows.front() * 1e3, slows.back() * 1e3);

  // ---- 3. the macro
  const fail::Context ctx{0, 1, 0, 0, nullptr};
  int64_t sink = 0;
  const double empty = ns_per_call(calls, 5, [&](int64_t i) {
    sink += i & 1;
    escape(&sink);
  });
  const double off = ns_per_call(calls, 5, [&](int64_t i) {
    if (ZT_FAIL("zero.norm_on_device", ctx)) ++sink;
    sink += i & 1;
    escape(&sink);
  });
  std::vector<fail::Spec> specs;
  if (Status s = fail::parse_specs("ckpt.torn_write=return", &specs); !s) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 2;
  }
  double on = 0;
  {
    fail::Scope scope(specs, 1);
    on = ns_per_call(calls / 10, 5, [&](int64_t i) {
      if (ZT_FAIL("zero.norm_on_device", ctx)) ++sink;
      sink += i & 1;
      escape(&sink);
    });
  }
  std::printf("\nZT_FAIL(\"zero.norm_on_device\", ctx), best of 5 runs of %lld calls:\n", (long long)calls);
  std::printf("  empty loop                        %7.2f ns per call   (baseline)\n", empty);
  std::printf("  nothing configured                %7.2f ns per call   ratio %.2fx, %+.2f ns\n", off, off / empty, off - empty);
  std::printf("  an unrelated site configured      %7.2f ns per call   ratio %.2fx, %+.2f ns (the slow path)\n", on,
              on / empty, on - empty);
  escape(&sink);
  fs::remove_all(dir);
  return 0;
}
