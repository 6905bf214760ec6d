// The LD_PRELOAD interposer on a real program (tests/probe/host_workload.cpp): exactly the
// allocations it made, with their functions in the stacks; fork, threads, exec, the whole
// allocation API, allocation before main, and a bad setting.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "../test_util.h"
#include "probe_run_util.h"

using namespace zt::test;

namespace {

const std::string kWorkload = ZT_PROBE_WORKLOAD;

RunResult run_probed(const std::string& out, const std::vector<std::string>& args,
                     std::map<std::string, const char*> extra = {}) {
  std::vector<std::string> argv{kWorkload};
  argv.insert(argv.end(), args.begin(), args.end());
  // The byte sampler of allocations under the threshold (on by default) is off unless a test turns
  // it on: the others count the rows recorded one by one, which a sampled row would join by chance.
  std::map<std::string, const char*> env{{"LD_PRELOAD", nullptr},
                                         {"ZT_PROBE_OUTPUT", out.c_str()},
                                         {"ZT_PROBE_QUIET", "1"},
                                         {"ZT_PROBE_RSS_MS", "10"},
                                         {"ZT_PROBE_SAMPLE_INTERVAL", "0"}};
  static std::string lib = probe_library();
  env["LD_PRELOAD"] = lib.c_str();
  for (auto& [k, v] : extra) env[k] = v;
  return run_program(argv, env);
}

}  // namespace

TEST(Interposer, LeakedBuffersAreExactlyTheLiveAllocationsWithTheirFunction) {
  TempDir dir;
  std::string out = dir.file("leak.db");
  RunResult r = run_probed(out, {"leak", "7", std::to_string(3 << 19)});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string live = "t_free IS NULL AND source = 2";
  auto leaked = allocations_in(out, "zt_test_leak_buffers", live);
  EXPECT_EQ(leaked.size(), 7u);
  // Repeated identical stacks cost one id.
  EXPECT_EQ(sql_int(out, "SELECT count(DISTINCT stack_id) FROM allocation WHERE bytes >= 1572864 AND "
                         "requested_bytes = 1572864 AND t_free IS NULL"),
            1);
  // The allocation before main is there, with its function.
  EXPECT_EQ(allocations_in(out, "zt_test_before_main", live).size(), 1u);
  // Nothing else is alive: the temporaries were freed.
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE " + live), 8);
  auto temporaries = allocations_in(out, "zt_test_temporary_buffers", "t_free IS NOT NULL AND t_free >= t_alloc");
  EXPECT_EQ(temporaries.size(), 5u);
  // Kind, level, device, sizes.
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation_v WHERE memory_kind = 'pageable_host' AND level = "
                         "'segment' AND device = 'cpu' AND requested_bytes = 1572864"),
            12);
  // The innermost frame is the caller of malloc, not the probe.
  auto rows = sql(out, "SELECT stack_id FROM allocation WHERE requested_bytes = 1572864 AND t_free IS NULL LIMIT 1");
  ASSERT_FALSE(rows.empty());
  std::unique_ptr<zt::db::TraceReader> reader;
  ASSERT_TRUE(zt::db::TraceReader::open(out, &reader));
  std::vector<std::string> lines;
  ASSERT_TRUE(reader->stack_text(std::stoll(rows[0][0]), &lines));
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find("zt_test_leak_buffers"), std::string::npos) << lines[0];
  // Run ended cleanly; RSS and small-allocation counters were sampled; nothing dropped.
  EXPECT_EQ(sql_int(out, "SELECT status FROM run"), 1);
  EXPECT_GT(sql_int(out, "SELECT max(value) FROM counter_v WHERE name = 'host_rss'"), 1 << 20);
  EXPECT_GE(sql_int(out, "SELECT count(*) FROM counter_v WHERE name = 'host_small_bytes_allocated'"), 1);
  EXPECT_EQ(sql_int(out, "SELECT coalesce(sum(events), 0) FROM dropped"), 0);
}

// A child forked without exec (its parent has the probe's writer and sampler threads running)
// records into a trace of its own beside the parent's, as a worker process, never into the
// parent's; with ZT_PROBE_FORKS=0 it records nothing anywhere.
TEST(Interposer, ForkedChildRecordsItsOwnTraceNeverTheParents) {
  for (bool forks : {true, false}) {
    TempDir dir;
    std::string out = dir.file("fork.db");
    RunResult r = run_probed(out, {"fork"}, {{"ZT_PROBE_FORKS", forks ? nullptr : "0"}});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(allocations_in(out, "zt_test_parent_alloc").size(), 2u);
    EXPECT_EQ(allocations_in(out, "zt_test_child_alloc").size(), 0u);
    EXPECT_EQ(sql_int(out, "SELECT status FROM run"), 1);
    std::vector<std::string> others;
    for (auto& e : std::filesystem::directory_iterator(dir.path()))
      if (e.path().extension() == ".db" && e.path() != out) others.push_back(e.path().string());
    if (!forks) {
      EXPECT_TRUE(others.empty()) << others.size();
      continue;
    }
    ASSERT_EQ(others.size(), 1u);
    const std::string child = others[0];
    EXPECT_NE(child.find("fork.pid"), std::string::npos) << child;
    EXPECT_EQ(allocations_in(child, "zt_test_child_alloc").size(), 2u);
    EXPECT_EQ(allocations_in(child, "zt_test_parent_alloc").size(), 0u);  // the parent's table is not the child's
    EXPECT_EQ(sql_int(child, "SELECT status FROM run"), 1);  // closed at its exit(0)
    EXPECT_EQ(sql_int(child, "SELECT role FROM rank"), 3);    // worker
    EXPECT_EQ(sql_int(child, "SELECT json_extract(config_json, '$.forked_from') FROM run"),
              sql_int(out, "SELECT pid FROM run"));
    EXPECT_NE(sql_int(child, "SELECT pid FROM run"), sql_int(out, "SELECT pid FROM run"));
    EXPECT_GE(sql_int(child, "SELECT count(*) FROM counter_v WHERE name = 'host_rss'"), 1);
  }
}

// Forks in a busy multi-threaded parent: every child records its own trace and ends (none
// deadlocks on a lock a thread of the parent held at the fork), and the parent's trace is whole.
TEST(Interposer, ForksWhileThreadsAllocateEachRecordTheirOwnTrace) {
  TempDir dir;
  std::string out = dir.file("forks.db");
  RunResult r = run_probed(out, {"forks", "12"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(sql_int(out, "SELECT status FROM run"), 1);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE requested_bytes = 1572864"), 4 * 200);
  EXPECT_EQ(allocations_in(out, "zt_test_child_alloc").size(), 0u);
  int children = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) {
    if (e.path().extension() != ".db" || e.path() == out) continue;
    ++children;
    const std::string child = e.path().string();
    EXPECT_EQ(allocations_in(child, "zt_test_child_alloc").size(), 2u) << child;
    EXPECT_EQ(sql_int(child, "SELECT count(*) FROM allocation WHERE requested_bytes = 1572864"), 0) << child;
    EXPECT_EQ(sql_int(child, "SELECT status FROM run"), 1) << child;
  }
  EXPECT_EQ(children, 12);
}

TEST(Interposer, SixteenThreadsAllocatingLoseNothing) {
  TempDir dir;
  std::string out = dir.file("threads.db");
  RunResult r = run_probed(out, {"threads", "16", "40"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE requested_bytes = 1572864"), 16 * 40);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE requested_bytes = 1572864 AND t_free IS NULL"), 0);
  EXPECT_EQ(allocations_in(out, "zt_test_thread_leak", "t_free IS NULL").size(), 16u);
  EXPECT_EQ(sql_int(out, "SELECT coalesce(sum(events), 0) FROM dropped"), 0);
  // 16 x 40 x 100 small allocations were counted, not recorded.
  EXPECT_GE(sql_int(out, "SELECT max(value) FROM counter_v WHERE name = 'host_small_allocations'"), 16 * 40 * 100);
}

TEST(Interposer, EveryAllocationFunctionAndMmap) {
  TempDir dir;
  std::string out = dir.file("api.db");
  RunResult r = run_probed(out, {"api"});
  ASSERT_EQ(r.code, 0) << r.err;
  // calloc, posix_memalign, aligned_alloc, realloc, one kept mmap, one unmapped mmap; the
  // allocation before main; no row for the PROT_NONE reservation.
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE requested_bytes = 2097152 AND t_free IS NULL"), 5)
      << "calloc + posix_memalign + aligned_alloc + mmap + before main";
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE requested_bytes = 3145728 AND t_free IS NULL"), 1);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE requested_bytes = 4194304 AND t_free IS NOT NULL"), 1);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE requested_bytes >= 67108864"), 0);
}

TEST(Interposer, ExecClosesTheTraceAndTheNewImageWritesItsOwn) {
  TempDir dir;
  std::string out = dir.file("exec.db");
  RunResult r = run_probed(out, {"exec", kWorkload, "3", std::to_string(2 << 20)});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(allocations_in(out, "zt_test_parent_alloc").size(), 1u);
  auto detail = sql(out, "SELECT exit_detail FROM run");
  ASSERT_FALSE(detail.empty());
  EXPECT_NE(detail[0][0].find("process image replaced by exec"), std::string::npos) << detail[0][0];
  std::string second;
  for (auto& e : std::filesystem::directory_iterator(dir.path()))
    if (e.path().filename().string().find("exec.pid") == 0) second = e.path().string();
  ASSERT_FALSE(second.empty()) << "the exec'd image wrote no per-process trace";
  EXPECT_EQ(allocations_in(second, "zt_test_leak_buffers", "t_free IS NULL").size(), 3u);
}

// execl, execlp and execle are hooked too: the trace was left unclosed and the allocations of
// the last moments before the exec lost.
TEST(Interposer, TheListFormOfExecClosesTheTraceToo) {
  TempDir dir;
  std::string out = dir.file("execl.db");
  RunResult r = run_probed(out, {"execl", kWorkload, "2", std::to_string(1 << 20)});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(allocations_in(out, "zt_test_parent_alloc").size(), 1u);
  auto detail = sql(out, "SELECT exit_detail, t_end IS NOT NULL FROM run");
  ASSERT_FALSE(detail.empty());
  EXPECT_NE(detail[0][0].find("process image replaced by exec"), std::string::npos) << detail[0][0];
  EXPECT_EQ(detail[0][1], "1");
}

// The exit code goes into the run row from inside the process (a child's trace has no zt probe
// to write it afterwards): main's return, exit().
TEST(Interposer, TheExitCodeIsRecordedByTheProcessItself) {
  TempDir dir;
  for (const char* how : {"return", "exit"}) {
    std::string out = dir.file(std::string(how) + ".db");
    RunResult r = run_probed(out, {how, "5"});
    ASSERT_EQ(r.code, 5) << how << ": " << r.err;
    auto code = sql(out, "SELECT exit_code FROM run");
    ASSERT_FALSE(code.empty()) << how;
    EXPECT_EQ(code[0][0], "5") << how;
  }
}

// A preloaded probe leaves SIGINT at its default: Python installs its KeyboardInterrupt handler
// only where it finds the default one (under the probe, Ctrl-C killed it with status 130).
TEST(Interposer, SigintIsLeftToTheProgram) {
  TempDir dir;
  RunResult r = run_probed(dir.file("sigint.db"), {"sigint"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("SIGINT default"), std::string::npos) << r.err;
}

TEST(Interposer, ThresholdComesFromTheEnvironment) {
  TempDir dir;
  std::string out = dir.file("threshold.db");
  RunResult r = run_probed(out, {"leak", "3", std::to_string(2 << 20)}, {{"ZT_PROBE_HOST_THRESHOLD", "4MiB"}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation"), 0);
  // Summed instead: the 3 leaked and 5 temporary 2 MiB buffers were counted.
  EXPECT_GE(sql_int(out, "SELECT max(value) FROM counter_v WHERE name = 'host_small_bytes_allocated'"), 3 * (2 << 20) + 5 * (2 << 20));
  // With the byte sampler (a point every 512 KiB on average) each 2 MiB buffer is sampled with
  // probability 1 - exp(-4) = 0.98: rows standing for their expected bytes, none one by one.
  std::string sampled = dir.file("sampled.db");
  r = run_probed(sampled, {"leak", "3", std::to_string(2 << 20)},
                 {{"ZT_PROBE_HOST_THRESHOLD", "4MiB"}, {"ZT_PROBE_SAMPLE_INTERVAL", "512KiB"}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(sql_int(sampled, "SELECT count(*) FROM allocation WHERE weight_bytes IS NULL"), 0);
  EXPECT_GE(sql_int(sampled, "SELECT count(*) FROM allocation WHERE requested_bytes = 2097152 AND weight_bytes > bytes"), 6);
}

TEST(Interposer, NoStacksMeansNoStackRows) {
  TempDir dir;
  std::string out = dir.file("nostacks.db");
  RunResult r = run_probed(out, {"leak", "2", std::to_string(2 << 20)}, {{"ZT_PROBE_STACKS", "0"}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE t_free IS NULL"), 3);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE stack_id IS NOT NULL"), 0);
}

TEST(Interposer, BadSettingLeavesTheProgramAloneAndSaysWhy) {
  TempDir dir;
  std::string out = dir.file("bad.db");
  RunResult r = run_probed(out, {"leak", "1", "100"}, {{"ZT_PROBE_HOST_THRESHOLD", "lots"}, {"ZT_PROBE_QUIET", "0"}});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.err.find("ZT_PROBE_HOST_THRESHOLD=lots"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));
}

// Allocations under the threshold, sampled by bytes (ZT_PROBE_SAMPLE_INTERVAL): each sampled one is
// a row with its stack and its weight, its free is seen, and the weights estimate the bytes.
TEST(Interposer, SmallAllocationsAreSampledWithTheirStacksWeightsAndFrees) {
  TempDir dir;
  std::string out = dir.file("sampled.db");
  // 400 kept blocks of 64 KiB and 5 freed ones; a sample point every 64 KiB on average: each
  // is sampled with probability 1 - exp(-1) and stands for 64 KiB / that.
  RunResult r = run_probed(out, {"leak", "400", "65536"}, {{"ZT_PROBE_SAMPLE_INTERVAL", "65536"}});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string kept = "requested_bytes = 65536 AND weight_bytes IS NOT NULL AND t_free IS NULL";
  auto rows = allocations_in(out, "zt_test_leak_buffers", kept);
  const double p = 1 - std::exp(-1.0);
  // 400 blocks, each sampled with probability p: 253 expected, 9.6 standard deviations; 6 of them here.
  EXPECT_GT(double(rows.size()), 400 * p - 58);
  EXPECT_LT(double(rows.size()), 400 * p + 58);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE " + kept), int64_t(rows.size()));
  const int64_t usable = sql_int(out, "SELECT min(bytes) FROM allocation WHERE " + kept);
  EXPECT_GE(usable, 65536);
  EXPECT_EQ(sql_int(out, "SELECT count(DISTINCT weight_bytes) FROM allocation WHERE " + kept), 1);
  EXPECT_EQ(sql_int(out, "SELECT min(weight_bytes) FROM allocation WHERE " + kept), std::llround(double(usable) / p));
  // The temporaries' sampled rows are closed by their frees.
  EXPECT_EQ(allocations_in(out, "zt_test_temporary_buffers", "weight_bytes IS NOT NULL AND t_free IS NULL").size(), 0u);
  EXPECT_EQ(sql_int(out, "SELECT count(*) FROM allocation WHERE weight_bytes IS NOT NULL AND weight_bytes < bytes"), 0);
  EXPECT_EQ(sql_int(out, "SELECT json_extract(config_json, '$.sample_interval') FROM run"), 65536);

  // Sixteen threads, each with its own sample points, 400000 small blocks made and freed: every
  // sampled row is closed (the free found it through the filter), nothing dropped.
  std::string threads = dir.file("threads.db");
  r = run_probed(threads, {"threads", "16", "250"}, {{"ZT_PROBE_SAMPLE_INTERVAL", "4096"}});
  ASSERT_EQ(r.code, 0) << r.err;
  const int64_t sampled = sql_int(threads, "SELECT count(*) FROM allocation WHERE weight_bytes IS NOT NULL AND "
                                           "requested_bytes < 200");
  EXPECT_GT(sampled, 1000);
  auto open_small = allocations_in(threads, "thread_main", "weight_bytes IS NOT NULL AND t_free IS NULL");
  EXPECT_EQ(open_small.size(), 0u);
  EXPECT_EQ(sql_int(threads, "SELECT coalesce(sum(events), 0) FROM dropped"), 0);

  // Off: no row under the threshold.
  std::string off = dir.file("off.db");
  r = run_probed(off, {"leak", "400", "65536"}, {{"ZT_PROBE_SAMPLE_INTERVAL", "0"}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(sql_int(off, "SELECT count(*) FROM allocation WHERE bytes < 1048576"), 0);
}
