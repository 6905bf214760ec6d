// The leak check on what it was not built for (issue 40): unchanged user-style jobs on real libraries,
// Debian's PyTorch 1.13 and PyPI's transformers 4.44.2 (build/realjobs-venv, scripts/setup --realjobs), run
// under `zt probe` and checked by `zt check --leaks` with default options. The jobs (tests/realjobs/jobs/)
// never import zerotrace; each leaks small allocations (64 or 128 KiB, under the probe's 1 MiB threshold,
// so only the byte sampler sees them) on one line marked "# LEAK:", and has a clean twin. Each leak must be
// found (exit 1) with its rate in range, at that line, on the right rank or worker; each twin must pass.
// The rates are estimates from sampled allocations: each range below is wide enough for the error
// docs/check.md states at the default 512 KiB interval (about 30 samples: +-20% a standard error).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>

#include "../probe/probe_run_util.h"
#include "../test_util.h"

using namespace zt::test;
namespace fs = std::filesystem;

namespace {

std::string venv() { return std::string(ZT_BINARY_DIR) + "/realjobs-venv"; }
std::string venv_python() { return venv() + "/bin/python"; }
std::string job(const std::string& name) { return std::string(ZT_SOURCE_DIR) + "/tests/realjobs/jobs/" + name; }

// CI sets CI (GitHub, GitLab: "true"); there a missing venv is a failure, not a skip.
bool in_ci() {
  const char* v = std::getenv("CI");
  return v && *v && std::strcmp(v, "false") != 0 && std::strcmp(v, "0") != 0;
}

#define REQUIRE_REALJOBS_VENV()                                                                                     \
  do {                                                                                                             \
    if (::access(venv_python().c_str(), X_OK) != 0) {                                                              \
      if (in_ci()) FAIL() << venv() << " is missing under CI: scripts/setup --realjobs makes it (scripts/test runs it)"; \
      GTEST_SKIP() << "no " << venv() << ": scripts/setup --realjobs makes it (Debian's python3-torch, pinned transformers)"; \
    }                                                                                                              \
  } while (0)

// The line of `file` marked "# LEAK:" (1-based), 0 when none.
int leak_line(const std::string& file) {
  std::ifstream in(file);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n)
    if (line.find("# LEAK:") != std::string::npos) return n;
  return 0;
}

// zt probe -o OUT -- venv python ARGS..., in a clean environment: one intra-op thread (the 2-core CI
// machine runs two tests at once), no hub access, no launcher variables of the test's own.
RunResult probe(const std::string& out, const std::vector<std::string>& args, const std::string& home) {
  std::vector<std::string> argv{ZT_EXE, "probe", "-o", out, "--", venv_python()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_program(argv, {{"LD_PRELOAD", nullptr},     {"PYTHONPATH", nullptr},          {"OMP_NUM_THREADS", "1"},
                            {"HF_HUB_OFFLINE", "1"},     {"TRANSFORMERS_OFFLINE", "1"},   {"HF_HOME", home.c_str()},
                            {"CUDA_VISIBLE_DEVICES", ""}, {"ZT_PROBE_SAMPLE_SEED", nullptr}, {"RANK", nullptr},
                            {"WORLD_SIZE", nullptr},      {"LOCAL_RANK", nullptr},          {"MASTER_PORT", nullptr},
                            {"MASTER_ADDR", nullptr},     {"PYTHONHASHSEED", nullptr}});
}

// The trace to check: the one -o names, or the merge of the run's traces that zt probe's summary gives.
std::string trace_of(const RunResult& r, const std::string& out) {
  const size_t at = r.err.find("zt db merge ");
  if (at == std::string::npos) return out;
  const std::string cmd = r.err.substr(at + 3, r.err.find('\n', at) - at - 3);
  auto m = run_command(std::string(ZT_EXE) + " " + cmd + " 2>&1");
  EXPECT_EQ(m.code, 0) << m.out;
  std::istringstream words(cmd);
  std::string db, merge, merged;
  words >> db >> merge >> merged;
  return merged;
}

CommandResult check_leaks(const std::string& trace) {
  return run_command(std::string(ZT_EXE) + " check " + trace + " --leaks 2>&1");
}

// The finding line that starts "  - WHO" ("" when none).
std::string finding(const std::string& out, const std::string& who) {
  const size_t at = out.find("  - " + who);
  return at == std::string::npos ? "" : out.substr(at, out.find('\n', at) - at);
}

// "grew ~X UNIT per epoch|window" of a finding, in MiB; -1 when it has none.
double rate_mib(const std::string& line, std::string* per = nullptr) {
  static const std::regex re("grew ~?([0-9.]+) (B|KiB|MiB|GiB) per (epoch|window)");
  std::smatch m;
  if (!std::regex_search(line, m, re)) return -1;
  const std::string unit = m.str(2);
  const double scale = unit == "B" ? 1.0 / 1048576 : unit == "KiB" ? 1.0 / 1024 : unit == "MiB" ? 1.0 : 1024.0;
  if (per) *per = m.str(3);
  return std::stod(m.str(1)) * scale;
}

// A TCP port free now on localhost (torchrun's rendezvous; two tests may run at once).
int free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (s < 0 || ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (s >= 0) ::close(s);
    return 29517;
  }
  ::close(s);
  return ntohs(a.sin_port);
}

// A clean twin: `zt check --leaks` passes. (Before the probe kept its own memory apart, probe/src/probe_heap.h,
// its interned stacks and names pinned the job's heap: the clean HF job's RSS grew 4 to 6 MiB an epoch under
// zt probe, and the RSS witness reported it.)
void expect_clean(const CommandResult& check) {
  EXPECT_EQ(check.code, 0) << check.out;
  EXPECT_NE(check.out.find("PASS leaks"), std::string::npos) << check.out;
}

}  // namespace

// The venv is what it says: Debian's torch 1.13 under the pinned transformers and accelerate.
TEST(RealJobs, TheVenvHoldsThePinnedLibraries) {
  REQUIRE_REALJOBS_VENV();
  auto v = run_command(venv_python() +
                       " -c 'import torch, transformers, accelerate; print(torch.__version__[:4], transformers.__version__, "
                       "accelerate.__version__)' 2>&1");
  ASSERT_EQ(v.code, 0) << v.out;
  EXPECT_EQ(v.out, "1.13 4.44.2 0.33.0\n");
}

// (a) An HF Trainer job (a tiny GPT-2 from its config, CPU, 4 epochs of 16 steps) whose compute_loss keeps
// 8 numpy arrays of 64 KiB a step: 0.5 MiB a step, 8 MiB an epoch, none of them 1 MiB. The issue's
// headline: this passed before the sampler; now found with default options at the user's line.
TEST(RealJobs, AnHFTrainerJobLeakingHalfAMiBAStepIsFoundAtTheUsersLine) {
  REQUIRE_REALJOBS_VENV();
  TempDir dir;
  const std::string prog = job("hf_trainer.py");
  RunResult r = probe(dir.file("hf.db"), {prog, "leak", dir.file("out")}, dir.file("hf-home"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("64 steps (from transformers.Trainer's callbacks), 4 epochs (from transformers.Trainer's "
                       "callbacks)"),
            std::string::npos)
      << r.err;
  auto check = check_leaks(trace_of(r, dir.file("hf.db")));
  EXPECT_EQ(check.code, 1) << check.out;
  const std::string f = finding(check.out, "rank 0 cpu pageable host memory: live bytes at epoch start grew ~");
  ASSERT_FALSE(f.empty()) << check.out;
  std::cout << "finding: " << f << "\n";  // ctest -V shows it
  const double rate = rate_mib(f);
  EXPECT_GE(rate, 4.0) << f;  // 8 MiB an epoch
  EXPECT_LE(rate, 16.0) << f;
  EXPECT_NE(f.find("LeakyTrainer.compute_loss (" + prog + ":" + std::to_string(leak_line(prog)) + ") via numpy ones +~"),
            std::string::npos)
      << f;
}

// 6 epochs, not 4: with 4 the check compares 2 intervals, and a 1 MiB block the Trainer makes once in epoch
// 2 or 3 (seen in 2 of 6 runs) is growth of 512 KiB an epoch in half of them, which the rule counts as a leak
// every other epoch. With 6, that one block is 256 KiB an epoch in 1 of 4 intervals.
TEST(RealJobs, TheCleanHFTrainerJobPasses) {
  REQUIRE_REALJOBS_VENV();
  TempDir dir;
  RunResult r = probe(dir.file("hf.db"), {job("hf_trainer.py"), "clean", dir.file("out"), "6"}, dir.file("hf-home"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("6 epochs (from transformers.Trainer's callbacks)"), std::string::npos) << r.err;
  expect_clean(check_leaks(trace_of(r, dir.file("hf.db"))));
}

// (b) A plain PyTorch loop: no Trainer, no epochs, no marks; 400 steps, the leak keeps 128 KiB a step. Its steps
// come from its optimizer (before, windows of time held seconds of `import torch` and the clean twin failed).
TEST(RealJobs, APlainTorchLoopsLeakIsFoundOverWindowsOfItsOptimizerSteps) {
  REQUIRE_REALJOBS_VENV();
  TempDir dir;
  const std::string prog = job("plain_loop.py");
  RunResult r = probe(dir.file("loop.db"), {prog, "leak"}, dir.file("hf-home"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("400 steps (from PyTorch's optimizer steps), 0 epochs"), std::string::npos) << r.err;
  auto check = check_leaks(trace_of(r, dir.file("loop.db")));
  EXPECT_EQ(check.code, 1) << check.out;
  EXPECT_NE(check.out.find("over 4 windows of 100 steps (the trace has no epochs: windows of its 400 steps)"),
            std::string::npos)
      << check.out;
  const std::string f = finding(check.out, "rank 0 cpu pageable host memory: live bytes at window start grew ~");
  ASSERT_FALSE(f.empty()) << check.out;
  std::string per;
  std::cout << "finding: " << f << "\n";
  const double rate = rate_mib(f, &per);
  EXPECT_EQ(per, "window");
  EXPECT_GE(rate, 6.25) << f;  // 100 steps of 128 KiB: 12.5 MiB a window
  EXPECT_LE(rate, 25.0) << f;
  EXPECT_NE(f.find("<module> (" + prog + ":" + std::to_string(leak_line(prog)) + ") +~"), std::string::npos) << f;
}

TEST(RealJobs, TheCleanPlainTorchLoopPasses) {
  REQUIRE_REALJOBS_VENV();
  TempDir dir;
  RunResult r = probe(dir.file("loop.db"), {job("plain_loop.py"), "clean"}, dir.file("hf-home"));
  ASSERT_EQ(r.code, 0) << r.err;
  expect_clean(check_leaks(trace_of(r, dir.file("loop.db"))));
}

// (c) torchrun (python -m torch.distributed.run), gloo, 2 processes on CPU, DDP; rank 1 alone keeps 128 KiB a
// step for 300 steps. Debian's torch 1.13 on Python 3.11 needs --redirects and --tee other than 0 (its
// Std.from_str("0") is None there: "'NoneType' object has no attribute 'get'"), so the job's output goes to
// a log folder and is teed.
RunResult torchrun(const TempDir& dir, const std::string& out, const char* mode) {
  return probe(out,
               {"-m", "torch.distributed.run", "--nproc_per_node", "2", "--redirects", "1", "--tee", "1", "--log_dir",
                dir.file("logs"), "--master_port", std::to_string(free_port()), job("ddp_loop.py"), mode},
               dir.file("hf-home"));
}

TEST(RealJobs, ATorchrunLeakOnRankOneIsNamedOnRankOne) {
  REQUIRE_REALJOBS_VENV();
  TempDir dir;
  const std::string prog = job("ddp_loop.py");
  RunResult r = torchrun(dir, dir.file("ddp.db"), "leak");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("zt probe: launcher process "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("zt probe: rank 0, child process "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("zt probe: rank 1, child process "), std::string::npos) << r.err;
  const std::string merged = trace_of(r, dir.file("ddp.db"));
  ASSERT_NE(merged, dir.file("ddp.db")) << r.err;
  // The job's ranks, and torchrun's agent as the launcher (a process, not rank 0).
  EXPECT_EQ(sql(merged, "SELECT group_concat(role || ':' || coalesce(job_rank, '-'), ' ') FROM (SELECT * FROM rank "
                        "ORDER BY rank)")[0][0],
            "0:0 0:1 1:-");
  auto check = check_leaks(merged);
  EXPECT_EQ(check.code, 1) << check.out;
  const std::string f = finding(check.out, "rank 1 cpu pageable host memory: live bytes at window start grew ~");
  ASSERT_FALSE(f.empty()) << check.out;
  std::cout << "finding: " << f << "\n";  // ctest -V shows it
  const double rate = rate_mib(f);
  EXPECT_GE(rate, 4.7) << f;  // 75 steps of 128 KiB: 9.4 MiB a window
  EXPECT_LE(rate, 18.75) << f;
  EXPECT_NE(f.find("<module> (" + prog + ":" + std::to_string(leak_line(prog)) + ") +~"), std::string::npos) << f;
  EXPECT_EQ(finding(check.out, "rank 0 cpu"), "") << check.out;
  EXPECT_EQ(finding(check.out, "launcher process"), "") << check.out;
}

TEST(RealJobs, TheCleanTorchrunJobPasses) {
  REQUIRE_REALJOBS_VENV();
  TempDir dir;
  RunResult r = torchrun(dir, dir.file("ddp.db"), "clean");
  ASSERT_EQ(r.code, 0) << r.err;
  expect_clean(check_leaks(trace_of(r, dir.file("ddp.db"))));
}

// (e) In-memory checkpoints (torch.save into io.BytesIO, the "Saving and Loading Models" tutorial's save), one every
// 2 steps of a plain loop, 257 KiB each: a BytesIO grows by reallocating, under the probe's threshold. With `leak`
// all 150 are kept: about 9.4 MiB per window of 75 steps, named at the torch.save line. (Not a job the check was
// built around: tried 2026-11-29 as a new user would; the leak also grows the RSS by a few MiB a window more than
// the estimate, said as an RSS finding, not asserted here.)
TEST(RealJobs, InMemoryCheckpointsKeptEveryStepAreFoundAtTheSaveLine) {
  REQUIRE_REALJOBS_VENV();
  TempDir dir;
  const std::string prog = job("memory_snapshots.py");
  RunResult r = probe(dir.file("snap.db"), {prog, "leak"}, dir.file("hf-home"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("300 steps (from PyTorch's optimizer steps), 0 epochs"), std::string::npos) << r.err;
  auto check = check_leaks(trace_of(r, dir.file("snap.db")));
  EXPECT_EQ(check.code, 1) << check.out;
  const std::string f = finding(check.out, "rank 0 cpu pageable host memory: live bytes at window start grew ~");
  ASSERT_FALSE(f.empty()) << check.out;
  std::cout << "finding: " << f << "\n";
  const double rate = rate_mib(f);
  EXPECT_GE(rate, 4.7) << f;  // 37.5 snapshots of 257 KiB a window: 9.4 MiB
  EXPECT_LE(rate, 18.8) << f;
  EXPECT_NE(f.find("snapshot (" + prog + ":" + std::to_string(leak_line(prog)) + ") via torch _save +~"),
            std::string::npos)
      << f;
}

TEST(RealJobs, TheCleanSnapshotJobPasses) {
  REQUIRE_REALJOBS_VENV();
  TempDir dir;
  RunResult r = probe(dir.file("snap.db"), {job("memory_snapshots.py"), "clean"}, dir.file("hf-home"));
  ASSERT_EQ(r.code, 0) << r.err;
  expect_clean(check_leaks(trace_of(r, dir.file("snap.db"))));
}

// (d) A DataLoader with num_workers=2 (forked): its dataset's cache in each worker keeps 128 KiB a sample,
// 240 samples a worker. Each worker is its own process of rank 0, compared over windows of its own time.
TEST(RealJobs, ADataLoaderWorkersLeakIsNamedWithEachWorker) {
  REQUIRE_REALJOBS_VENV();
  TempDir dir;
  const std::string prog = job("loader_workers.py");
  RunResult r = probe(dir.file("dl.db"), {prog, "leak"}, dir.file("hf-home"));
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<int64_t> workers;
  for (size_t at = 0; (at = r.err.find("zt probe: worker process ", at)) != std::string::npos; ++at)
    workers.push_back(std::stoll(r.err.substr(at + std::strlen("zt probe: worker process "))));
  ASSERT_EQ(workers.size(), 2u) << r.err;
  auto check = check_leaks(trace_of(r, dir.file("dl.db")));
  EXPECT_EQ(check.code, 1) << check.out;
  for (int64_t pid : workers) {
    const std::string f = finding(check.out, "worker process " + std::to_string(pid) + " of rank 0 cpu pageable host "
                                             "memory: the lowest live bytes of each window grew ~");
    ASSERT_FALSE(f.empty()) << pid << "\n" << check.out;
    std::cout << "finding: " << f << "\n";  // ctest -V shows it
  const double rate = rate_mib(f);
    EXPECT_GE(rate, 2.0) << f;  // 30 MiB over the worker's life, a fifth of it in each window: about 6 MiB
    EXPECT_LE(rate, 15.0) << f;
    EXPECT_NE(f.find("Decoded.__getitem__ (" + prog + ":" + std::to_string(leak_line(prog)) + ")"), std::string::npos)
        << f;
  }
  EXPECT_EQ(finding(check.out, "rank 0 cpu"), "") << check.out;
}

TEST(RealJobs, TheCleanDataLoaderJobPasses) {
  REQUIRE_REALJOBS_VENV();
  TempDir dir;
  RunResult r = probe(dir.file("dl.db"), {job("loader_workers.py"), "clean"}, dir.file("hf-home"));
  ASSERT_EQ(r.code, 0) << r.err;
  expect_clean(check_leaks(trace_of(r, dir.file("dl.db"))));
}
