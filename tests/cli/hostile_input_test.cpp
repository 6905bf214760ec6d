// Issue 29, as a user meets it: every file is untrusted input. The issue's hostile traces are
// refused by every command that reads a trace (one line naming the file, the table, the row and
// the value; exit 2; the viewer before any window); a killed run's trace copied without its -wal
// fails `zt check`; YAML alias cycles and bombs, a 20,000-deep pattern and negative DeepSpeed
// sizes are refused naming the file and the key; a manifest's numbers, checksums and a binary
// `latest` are refused in one printable line; a `latest` directory is found before training;
// `zt db sql` stops at its row and time limits and on Ctrl-C.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "../hostile_traces.h"
#include "../test_util.h"

namespace {

using Result = zt::test::CommandResult;
namespace fs = std::filesystem;

Result run_zt(const std::string& args) { return zt::test::run_command(std::string(ZT_EXE) + " " + args + " 2>&1"); }

void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// Lines of output, without the last newline.
size_t lines(const std::string& out) {
  size_t n = 0;
  for (char c : out) n += c == '\n';
  return n;
}

// A real trace of `zt train --steps 2`, made once and copied by each test that edits it.
const std::string& trained_trace() {
  static zt::test::TempDir dir;
  static const std::string path = [] {
    const std::string p = dir.file("t.db");
    Result r = run_zt("train --steps 2 --quiet --trace " + p);
    EXPECT_EQ(r.code, 0) << r.out;
    return p;
  }();
  return path;
}

}  // namespace

TEST(HostileInput, TheIssuesTracesAreRefusedByEveryReaderWithOneLine) {
  zt::test::TempDir dir;
  for (const zt::test::HostileEdit& c : zt::test::kIssueTraceEdits) {
    const std::string path = dir.file("bad.db");
    fs::copy_file(trained_trace(), path, fs::copy_options::overwrite_existing);
    zt::test::edit_trace(path, c.sql);
    for (const std::string& cmd :
         {"db info " + path, "check " + path, "export " + path + " --chrome " + dir.file("o.json"),
          "db kernels " + path, "db merge --force " + dir.file("m.db") + " " + path,
          "view " + path + " --screenshot " + dir.file("shot.png")}) {
      const bool view = cmd.rfind("view", 0) == 0;
      // The viewer checks the large tables as it loads them, once its window is open: under Xvfb.
      if (view && zt::test::run_command("command -v xvfb-run >/dev/null").code != 0) continue;
      Result r = view ? zt::test::run_under_xvfb(std::string(ZT_EXE) + " " + cmd, dir.path()) : run_zt(cmd);
      if (view && r.out.find("not built") != std::string::npos) continue;  // a build without the viewer
      EXPECT_EQ(r.code, 2) << cmd << "\n" << r.out;
      EXPECT_EQ(r.out.rfind("zt: " + path + ": ", 0), 0u) << cmd << "\n" << r.out;
      EXPECT_NE(r.out.find(c.refusal), std::string::npos) << cmd << "\n" << r.out;
      EXPECT_EQ(lines(r.out), 1u) << cmd << "\n" << r.out;
    }
    EXPECT_FALSE(fs::exists(dir.file("o.json")));
    EXPECT_FALSE(fs::exists(dir.file("shot.png")));
  }
}

TEST(HostileInput, CheckFailsATraceWithNoRunRow) {
  zt::test::TempDir dir;
  const std::string path = dir.file("norun.db");
  fs::copy_file(trained_trace(), path);
  zt::test::edit_trace(path, "DELETE FROM run");
  Result r = run_zt("check " + path);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("FAIL run: the trace has no run row: it cannot say what ran or how it ended"), std::string::npos)
      << r.out;
}

// The CI artifact of a killed job: the trace file without its -wal. It used to pass (`SKIP run:
// the trace has no run row`); the run row is in the file from the start now, and says the run
// never ended.
TEST(HostileInput, CheckFailsAKilledRunsTraceCopiedWithoutItsWal) {
  zt::test::TempDir dir;
  const std::string live = dir.file("live.db");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(ZT_EXE, ZT_EXE, "train", "--steps", "100000", "--quiet", "--trace", live.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Until the run has begun recording (its WAL holds rows).
  for (int i = 0; i < 600 && !(fs::exists(live + "-wal") && fs::file_size(live + "-wal") > 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  fs::copy_file(live, dir.file("artifact.db"));
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  Result r = run_zt("check " + dir.file("artifact.db"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("FAIL run: the run did not end ok"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ended without closing the trace"), std::string::npos) << r.out;
  Result info = run_zt("db info " + dir.file("artifact.db"));
  EXPECT_EQ(info.code, 0) << info.out;
  EXPECT_NE(info.out.find("run 1: zt train --steps 100000"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("status: end unknown: the process stopped without closing the trace"), std::string::npos) << info.out;
}

TEST(HostileInput, DbSqlStopsAtItsLimitsAndOnCtrlC) {
  const std::string endless = "\"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x FROM c\"";
  Result rows = run_zt("db sql " + trained_trace() + " " + endless + " --csv --max-rows 10");
  EXPECT_EQ(rows.code, 2) << rows.out;
  EXPECT_NE(rows.out.find("\n10\nzt: "), std::string::npos) << rows.out;
  EXPECT_NE(rows.out.find("returned more than 10 rows; stopped there"), std::string::npos) << rows.out;
  const std::string counting = "\"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c\"";
  Result time = run_zt("db sql " + trained_trace() + " " + counting + " --timeout 0.3");
  EXPECT_EQ(time.code, 2) << time.out;
  EXPECT_NE(time.out.find("the query ran longer than 300.00 ms; stopped"), std::string::npos) << time.out;
  // Ctrl-C: SIGINT to a query with no time limit ends it at once, exit 130.
  zt::test::TempDir dir;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string out = dir.file("out.txt");
    freopen(out.c_str(), "w", stderr);
    execl(ZT_EXE, ZT_EXE, "db", "sql", trained_trace().c_str(),
          "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c", "--timeout", "0",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto t0 = std::chrono::steady_clock::now();
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 130);
  EXPECT_NE(zt::test::read_file(dir.file("out.txt")).find("the query was interrupted"), std::string::npos);
}

TEST(HostileInput, YamlAliasCyclesAndBombsAreRefusedNamingTheFile) {
  zt::test::TempDir dir;
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b', p = 'a'; c <= 'i'; ++c, ++p) {
    bomb += std::string(1, c) + ": &" + c + " [";
    for (int k = 0; k < 10; ++k) bomb += std::string(k ? "," : "") + "*" + p;
    bomb += "]\n";
  }
  struct Case {
    std::string text, expected;
  } cases[] = {
      {"faults: &x [*x]\n", "nested more than 64 levels deep (an alias inside its own anchor"},
      {bomb + "faults: *i\n", "more than 100000 values once its aliases are expanded"},
      {"[steps]: 3\n", "a key must be a single word, not a list"},
  };
  for (const Case& c : cases) {
    write(dir.file("c.yaml"), c.text);
    const auto t0 = std::chrono::steady_clock::now();
    Result r = run_zt("train --config " + dir.file("c.yaml"));
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_EQ(r.out.rfind("zt: " + dir.file("c.yaml"), 0), 0u) << r.out;
    EXPECT_NE(r.out.find(c.expected), std::string::npos) << r.out;
    // The same in a scenario.
    write(dir.file("s.yaml"), "scenario: s\n" + c.text);
    Result s = run_zt("repro " + dir.file("s.yaml"));
    EXPECT_EQ(s.code, 2) << s.out;
    EXPECT_EQ(s.out.rfind("zt: " + dir.file("s.yaml"), 0), 0u) << s.out;
    EXPECT_NE(s.out.find(c.expected), std::string::npos) << s.out;
  }
}

TEST(HostileInput, AScenariosPatternIsBounded) {
  zt::test::TempDir dir;
  std::string scen = zt::test::read_file(std::string(ZT_SOURCE_DIR) + "/inject/scenarios/r2-qwen72b-offload-device-mismatch.yaml");
  const std::string old = "  message: 'Expected all tensors";
  const size_t at = scen.find(old);
  ASSERT_NE(at, std::string::npos);
  const size_t eol = scen.find('\n', at);
  scen.replace(at, eol - at, "  message: '" + std::string(20000, '(') + std::string(20000, ')') + "'");
  write(dir.file("deep.yaml"), scen);
  Result r = run_zt("repro " + dir.file("deep.yaml"));
  EXPECT_EQ(r.code, 2) << r.out.substr(0, 400);
  EXPECT_NE(r.out.find("deep.yaml:73: expect.message: '(((((((("), std::string::npos) << r.out.substr(0, 400);
  EXPECT_NE(r.out.find("' is 40000 characters long; a pattern may have at most 1000"), std::string::npos) << r.out.substr(0, 400);
  EXPECT_LT(r.out.size(), 400u);
}

TEST(HostileInput, NegativeDeepSpeedSizesAreRefusedWithTheKeyAndTheFile) {
  zt::test::TempDir dir;
  for (const char* key : {"reduce_bucket_size", "stage3_param_persistence_threshold", "stage3_prefetch_bucket_size"}) {
    write(dir.file("ds.json"), std::string(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, ")") +
                                   key + R"(": -5}})");
    Result r = run_zt("train --steps 1 --ds-config " + dir.file("ds.json"));
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(dir.file("ds.json") + ": zero_optimization." + key + " -5 must not be negative"), std::string::npos)
        << r.out;
  }
}

TEST(HostileInput, AnActivationTooLargeIsNamedByItsFileAndKeys) {
  zt::test::TempDir dir;
  write(dir.file("big.yaml"), "micro_batch: 16777216\n");
  Result r = run_zt("train --steps 1 --config " + dir.file("big.yaml"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find(dir.file("big.yaml") + ": micro_batch 16777216, seq_len 64 (model tiny): B*T = "), std::string::npos)
      << r.out;
}

TEST(HostileInput, CheckpointFilesAreCheckedAndPrintedSafely) {
  zt::test::TempDir dir;
  const std::string ck = dir.file("ck");
  Result t = run_zt("train --steps 1 --save-every 1 --quiet --checkpoint-dir " + ck);
  ASSERT_EQ(t.code, 0) << t.out;
  const std::string manifest = ck + "/step000001/manifest.json";
  const std::string good = zt::test::read_file(manifest);
  auto replace = [&](const std::string& from, const std::string& to) {  // the last one: the top level's
    std::string m = good;
    const size_t at = m.rfind(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) m.replace(at, from.size(), to);
    write(manifest, m);
  };
  replace("\"world_size\": 1", "\"world_size\": 1e30");
  Result w = run_zt("ckpt info " + ck);
  EXPECT_NE(w.out.find("manifest.json: world_size 1e+30 must be a whole number in 1 .. 16777216"), std::string::npos)
      << w.out;
  const size_t sum = good.find("\"xxh64\": \"");
  ASSERT_NE(sum, std::string::npos);
  replace(good.substr(sum, 27), "\"xxh64\": \"zz\"");
  Result c = run_zt("ckpt info " + ck);
  EXPECT_NE(c.out.find("is not a checksum (16 hexadecimal digits)"), std::string::npos) << c.out;
  // No complete checkpoint: one line, naming what was refused and why.
  Result none = run_zt("train --steps 2 --resume --checkpoint-dir " + ck);
  EXPECT_EQ(none.code, 2) << none.out;
  EXPECT_NE(none.out.find("no complete checkpoint to resume from (step000001 (latest): "), std::string::npos) << none.out;
  EXPECT_EQ(lines(none.out), 1u) << none.out;
  write(manifest, good);
  // A binary `latest` never reaches the terminal as it is.
  write(ck + "/latest", std::string("\x1b[2J\x07\x00\xff", 7));
  Result b = run_zt("ckpt info " + ck);
  EXPECT_EQ(b.out.find('\x1b'), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("latest holds '\\x1b[2J\\x07\\x00\\xff', which is not a checkpoint tag"), std::string::npos) << b.out;
  Result resume = run_zt("train --steps 2 --quiet --resume --checkpoint-dir " + ck);
  EXPECT_EQ(resume.code, 0) << resume.out;  // the newest complete checkpoint, found without it
  EXPECT_EQ(resume.out.find('\x1b'), std::string::npos) << resume.out;
}

TEST(HostileInput, ALatestDirectoryIsFoundBeforeAnythingTrainsOrIsWritten) {
  zt::test::TempDir dir;
  const std::string ck = dir.file("ck");
  fs::create_directories(ck + "/latest");
  Result r = run_zt("train --steps 3 --save-every 1 --checkpoint-dir " + ck + " --trace " + dir.file("t.db"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find(ck + "/latest is a directory, where each save writes the name of the newest checkpoint"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("step 1"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir.file("t.db")));
}

// --max-trace that is not a size: one line naming the option, exit 2, nothing run or written.
TEST(HostileInput, MaxTraceThatIsNotASizeIsRefused) {
  zt::test::TempDir dir;
  const std::string ran = dir.file("ran");
  for (const std::string& cmd :
       {"train --steps 1 --quiet --trace " + dir.file("t.db") + " --max-trace 12Q",
        "probe -o " + dir.file("p.db") + " --max-trace lots -- /usr/bin/touch " + ran,
        "synth -o " + dir.file("s.db") + " --max-trace -1MiB"}) {
    Result r = run_zt(cmd);
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.out;
    EXPECT_EQ(lines(r.out), 1u) << r.out;
    EXPECT_NE(r.out.find("--max-trace"), std::string::npos) << r.out;
  }
  EXPECT_FALSE(fs::exists(ran));
  for (const char* f : {"t.db", "p.db", "s.db"}) EXPECT_FALSE(fs::exists(dir.file(f))) << f;
}

// zt train under a small cap: the detail stops after a few steps, every step is still in the trace
// (zt check --steps passes), zt db info says which steps have detail, and the file stays near the cap.
TEST(HostileInput, TrainUnderACapKeepsItsStepsAndSaysWhereTheDetailEnded) {
  zt::test::TempDir dir;
  const std::string t = dir.file("capped.db");
  Result r = run_zt("train --steps 60 --quiet --trace " + t + " --max-trace 900KiB --flight-recorder off");
  ASSERT_EQ(r.code, 0) << r.out;
  Result info = run_zt("db info " + t);
  ASSERT_EQ(info.code, 0) << info.out;
  EXPECT_NE(info.out.find("then aggregates only (steps "), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("the trace reached its size cap of 900.00 KiB (--max-trace)"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("note: detail stopped "), std::string::npos) << info.out;
  EXPECT_LT(fs::file_size(t), 1200u << 10);
  Result steps = run_zt("check " + t + " --steps 60");
  EXPECT_EQ(steps.code, 0) << steps.out;
}

// --detail, --flight-recorder, --flight-memory that do not parse, or a ring larger than the machine's
// memory allows: one line naming the option, exit 2, nothing run or written (zt train and zt probe alike).
TEST(HostileInput, DetailPolicyThatDoesNotParseIsRefused) {
  zt::test::TempDir dir;
  const std::string ran = dir.file("ran");
  const std::pair<std::string, std::string> bad[] = {
      {"--detail every:0", "--detail 'every:0'"},
      {"--detail first:3 --detail evry:5", "--detail 'evry:5': not a detail window"},
      {"--detail time:15m-10m", "--detail 'time:15m-10m'"},
      {"--detail 'range:('", "--detail 'range:(': not a regular expression"},
      {"--flight-recorder lots", "--flight-recorder 'lots'"},
      {"--flight-memory 900TiB", "--flight-memory '900TiB' is more than half this machine's memory"},
  };
  for (auto& [opt, said] : bad)
    for (const std::string& cmd : {"train --steps 1 --quiet --trace " + dir.file("t.db") + " " + opt,
                                   "probe -o " + dir.file("p.db") + " " + opt + " -- /usr/bin/touch " + ran}) {
      Result r = run_zt(cmd);
      EXPECT_EQ(r.code, 2) << cmd << "\n" << r.out;
      EXPECT_EQ(lines(r.out), 1u) << r.out;
      EXPECT_NE(r.out.find(said), std::string::npos) << r.out;
    }
  EXPECT_FALSE(fs::exists(ran));
  for (const char* f : {"t.db", "p.db"}) EXPECT_FALSE(fs::exists(dir.file(f))) << f;
  // zt train reads the variables where the options are not given; a bad one is named.
  Result r = zt::test::run_command("ZT_PROBE_DETAIL=every:x " + std::string(ZT_EXE) + " train --steps 1 --quiet --trace " +
                                   dir.file("t.db") + " 2>&1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(lines(r.out), 1u) << r.out;
  EXPECT_NE(r.out.find("ZT_PROBE_DETAIL='every:x'"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir.file("t.db")));
}

// zt train with windows and the flight recorder: zt db info lists the detailed steps and stretches,
// and the ring's last steps are there after a cap stopped the detail.
TEST(HostileInput, TrainWithDetailWindowsAndTheFlightRecorder) {
  zt::test::TempDir dir;
  const std::string t = dir.file("w.db");
  Result r = run_zt("train --steps 12 --quiet --trace " + t + " --detail first:2 --detail every:5 --flight-recorder 3");
  ASSERT_EQ(r.code, 0) << r.out;
  Result info = run_zt("db info " + t);
  ASSERT_EQ(info.code, 0) << info.out;
  // Steps 0, 1 (first:2), 5 and 10 (every:5), and the ring's last 3: 9 (its kernels), 10 (a window) and 11.
  EXPECT_NE(info.out.find("detail: 6 of 12 steps (steps 0-1, 5, 9-11) in "), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("the detail window every:5 closed"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("flight recorder: the last 3 steps before the end"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("flight recorder: written when the trace was closed (run ok"), std::string::npos) << info.out;
  Result steps = run_zt("check " + t + " --steps 12");
  EXPECT_EQ(steps.code, 0) << steps.out;
}

// An out-of-memory error in step 0 of zt train with no detail window: the flight recorder's ring,
// written when the trace is closed, holds the set-up and step 0 in full detail.
TEST(HostileInput, TrainOutOfMemoryKeepsTheFlightRecordersRing) {
  zt::test::TempDir dir;
  const std::string t = dir.file("oom.db");
  Result r = run_zt("train --steps 30 --quiet --trace " + t + " --detail none --flight-recorder 3 --device-memory 5MiB");
  ASSERT_EQ(r.code, 1) << r.out;
  Result info = run_zt("db info " + t);
  ASSERT_EQ(info.code, 0) << info.out;
  EXPECT_NE(info.out.find("detail: 1 of 1 step (step 0) in 2 stretches"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("flight recorder: the last 3 steps before the end (step 0, "), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("written when the trace was closed (run failed, exit code 1)"), std::string::npos) << info.out;
  // The set-up's allocations are in the ring's stretch: the trace has allocation rows though no window opened.
  Result rows = run_zt("db sql " + t + " \"SELECT 'rows=' || count(*) AS n FROM allocation WHERE t_alloc < (SELECT min(t_start) FROM step_memory)\"");
  const size_t at = rows.out.find("rows=");
  ASSERT_NE(at, std::string::npos) << rows.out;
  EXPECT_GT(std::stoll(rows.out.substr(at + 5)), 10) << rows.out;
}
