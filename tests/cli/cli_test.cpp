// The zt command as a user meets it: help, version, exit codes, one-line errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../test_util.h"

namespace {

using Result = zt::test::CommandResult;

Result run_zt(const std::string& args) { return zt::test::run_command(std::string(ZT_EXE) + " " + args + " 2>&1"); }

}  // namespace

TEST(Cli, HelpAndVersion) {
  Result h = run_zt("--help");
  EXPECT_EQ(h.code, 0);
  for (const char* sub : {"train", "probe", "repro", "check", "view", "export", "db", "demo", "synth", "ckpt", "faults"})
    EXPECT_NE(h.out.find(sub), std::string::npos) << sub << " missing from --help";
  Result v = run_zt("--version");
  EXPECT_EQ(v.code, 0);
  EXPECT_EQ(v.out.rfind("zt 0.", 0), 0u) << v.out;
  Result dh = run_zt("db info --help");
  EXPECT_EQ(dh.code, 0);
  EXPECT_NE(dh.out.find("Example: zt db info run.db"), std::string::npos) << dh.out;
}

TEST(Cli, EverySubcommandIsBuiltAndNamesAMissingFile) {
  // repro, check, ckpt and faults were placeholders once; none may say "not built" now.
  for (const char* cmd : {"repro /nonexistent/scenario.yaml", "check /nonexistent/trace.db",
                                 "ckpt info /nonexistent/ckpt"}) {
    Result r = run_zt(cmd);
    EXPECT_EQ(r.code, 2) << cmd;
    EXPECT_EQ(r.out.find("not built yet"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("/nonexistent/"), std::string::npos) << cmd << ": " << r.out;
  }
  Result f = run_zt("faults");
  EXPECT_EQ(f.code, 0);
  EXPECT_NE(f.out.find("zero.norm_on_device"), std::string::npos) << f.out;
}

TEST(Cli, BadUsageExitsTwo) {
  EXPECT_EQ(run_zt("").code, 2);
  EXPECT_EQ(run_zt("db").code, 2);
  EXPECT_EQ(run_zt("db info").code, 2);
  EXPECT_EQ(run_zt("no-such-command").code, 2);
  Result r = run_zt("synth --leak-per-epoch 12parsecs -o /tmp/never.db");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--leak-per-epoch: '12parsecs' is not a size"), std::string::npos) << r.out;
}

TEST(Cli, BadTraceGetsOneClearLine) {
  zt::test::TempDir dir;
  std::ofstream(dir.file("junk.db")) << "this is not a trace, it is a text file with some words in it";
  for (const std::string& cmd : {"db info " + dir.file("junk.db"), "db sql " + dir.file("junk.db") + " 'SELECT 1'",
                                 "export " + dir.file("junk.db") + " --chrome " + dir.file("o.json")}) {
    Result r = run_zt(cmd);
    EXPECT_EQ(r.code, 2) << cmd;
    EXPECT_EQ(r.out, "zt: " + dir.file("junk.db") + ": not a zerotrace trace (not an SQLite database)\n") << cmd;
  }
  Result missing = run_zt("db info " + dir.file("missing.db"));
  EXPECT_EQ(missing.code, 2);
  EXPECT_EQ(missing.out, "zt: " + dir.file("missing.db") + ": no such file\n");
}

TEST(Cli, SynthInfoSqlExportMerge) {
  zt::test::TempDir dir;
  Result s = run_zt("synth -o " + dir.file("a.db") + " --ranks 2 --epochs 2 --steps 3 --leak-per-epoch 1MiB");
  ASSERT_EQ(s.code, 0) << s.out;
  Result info = run_zt("db info " + dir.file("a.db"));
  ASSERT_EQ(info.code, 0) << info.out;
  for (const char* want : {"ranks: 2 (world size 2)", "cuda:0", "cuda:1", "80.00 GiB", "steps: 6, epochs: 2",
                           "collective:all_gather", "dropped events: 0", "status: ok", "live at end", "2.00 MiB",
                           "per step (mean bytes moved by each rank during its optimizer steps):"})
    EXPECT_NE(info.out.find(want), std::string::npos) << want << "\n" << info.out;

  Result sql = run_zt("db sql " + dir.file("a.db") + " \"SELECT name, bytes FROM allocation_v WHERE t_free IS NULL ORDER BY name LIMIT 1\"");
  ASSERT_EQ(sql.code, 0) << sql.out;
  EXPECT_NE(sql.out.find("offload.buffer[epoch 0]  1048576"), std::string::npos) << sql.out;
  EXPECT_NE(sql.out.find("(1 row)"), std::string::npos);
  Result csv = run_zt("db sql --csv " + dir.file("a.db") + " \"SELECT 'a,b' AS x, 2 AS y\"");
  EXPECT_EQ(csv.out, "x,y\n\"a,b\",2\n");
  Result bad_sql = run_zt("db sql " + dir.file("a.db") + " \"DROP TABLE run\"");
  EXPECT_EQ(bad_sql.code, 2);

  Result ex = run_zt("export " + dir.file("a.db") + " --chrome " + dir.file("a.json"));
  ASSERT_EQ(ex.code, 0) << ex.out;
  std::ifstream in(dir.file("a.json"));
  auto j = nlohmann::json::parse(in);
  EXPECT_GT(j["traceEvents"].size(), 100u);

  // A merge needs distinct ranks: a single-rank synthetic trace merges alone.
  ASSERT_EQ(run_zt("synth -o " + dir.file("b.db") + " --ranks 1 --epochs 1 --steps 1").code, 0);
  Result m = run_zt("db merge " + dir.file("m.db") + " " + dir.file("b.db"));
  EXPECT_EQ(m.code, 0) << m.out;
  Result again = run_zt("db merge " + dir.file("m.db") + " " + dir.file("b.db"));
  EXPECT_EQ(again.code, 2);
  EXPECT_NE(again.out.find("already exists; pass --force"), std::string::npos);
  EXPECT_EQ(run_zt("db merge --force " + dir.file("m.db") + " " + dir.file("b.db")).code, 0);
}

TEST(Cli, TrainExitCodes) {
  zt::test::TempDir dir;
  Result ok = run_zt("train --model tiny --steps 2 --seq-len 32 --trace " + dir.file("t.db"));
  ASSERT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("step 2/2 | epoch 0 | loss "), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find(" tok/s | cuda:0 "), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("trace: " + dir.file("t.db")), std::string::npos) << ok.out;
  Result info = run_zt("db info " + dir.file("t.db"));
  EXPECT_NE(info.out.find("run 1: zt train --model tiny --steps 2 --seq-len 32 --trace"), std::string::npos) << info.out;

  Result oom = run_zt("train --model tiny --steps 2 --device-memory 3MiB -q --trace " + dir.file("oom.db"));
  EXPECT_EQ(oom.code, 1) << oom.out;  // it ran and failed: a result, not bad usage
  EXPECT_NE(oom.out.find("CUDA out of memory. Tried to allocate"), std::string::npos) << oom.out;
  Result oom_info = run_zt("db info " + dir.file("oom.db"));
  EXPECT_NE(oom_info.out.find("status: failed, exit code 1"), std::string::npos) << oom_info.out;

  EXPECT_EQ(run_zt("train --device-memory 12parsecs").code, 2);
  Result missing = run_zt("train --config " + dir.file("none.yaml"));
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.out.find("none.yaml: cannot open the config file"), std::string::npos) << missing.out;
  Result bad = run_zt("train --zero-stage 2 --offload-param --steps 1");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("offload_param needs ZeRO stage 3"), std::string::npos) << bad.out;
  Result zero = run_zt("train --model tiny --steps 2 --seq-len 32 --micro-batch 2 --world-size 2 --zero-stage 3 "
                       "--offload-optimizer --offload-param -q");
  EXPECT_EQ(zero.code, 0) << zero.out;
  Result ds = run_zt("train --model tiny --steps 1 --seq-len 32 --micro-batch 2 -q --ds-config " +
                     std::string(ZT_SOURCE_DIR) + "/tests/data/ds_r4_llamafactory_z3_offload.json");
  EXPECT_EQ(ds.code, 0) << ds.out;
  EXPECT_NE(ds.out.find("zt train: warning: "), std::string::npos) << ds.out;
  EXPECT_NE(ds.out.find("monitor_config is not implemented by zerotrace; ignored"), std::string::npos) << ds.out;
}

// --device cuda under a launcher, on any machine: the launcher's settings are checked (and named)
// before any GPU is looked for; without a usable GPU the run is refused with the reason.
TEST(Cli, DeviceCudaChecksTheLauncherAndSaysWhyThereIsNoGpu) {
  zt::test::TempDir dir;
  const std::string train = std::string(ZT_EXE) + " train --device cuda --model tiny --steps 1 --trace " + dir.file("run.db");
  // torchrun's variables, one missing.
  Result partial = zt::test::run_command("env -u LOCAL_RANK RANK=1 WORLD_SIZE=2 " + train + " 2>&1");
  EXPECT_EQ(partial.code, 2) << partial.out;
  EXPECT_NE(partial.out.find("LOCAL_RANK not"), std::string::npos) << partial.out;
  // A world size that disagrees with the launcher's.
  Result world = zt::test::run_command("RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 " + train + " --world-size 3 2>&1");
  EXPECT_EQ(world.code, 2) << world.out;
  EXPECT_NE(world.out.find("--world-size 3 disagrees with the launcher: rank 1 of 2"), std::string::npos) << world.out;
  // Each process writes its own trace (run.rank1.db), even when the run is refused.
  Result ok = zt::test::run_command("RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 " + train + " 2>&1");
  EXPECT_NE(ok.out.find(dir.file("run.rank1.db")), std::string::npos) << ok.out;
  // No launcher: on a machine without a usable GPU, the reason (a machine with one trains here).
  Result single = zt::test::run_command("env -u RANK -u WORLD_SIZE -u LOCAL_RANK " + train + " 2>&1");
  if (single.code != 0) {
    EXPECT_EQ(single.code, 2) << single.out;
    EXPECT_NE(single.out.find("--device cuda: "), std::string::npos) << single.out;
  }
}
