// ZT_PROBE_* parsing and per-process trace names: the contract between `zt probe` and the library.
#include <gtest/gtest.h>

#include <map>

#include "zt/probe/probe_config.h"

using namespace zt::probe;

namespace {
ProbeConfig parse(const std::map<std::string, std::string>& env, bool expect_ok = true, std::string* error = nullptr) {
  ProbeConfig c;
  zt::Status s = probe_config_from_env(
      [&](const char* k) -> const char* {
        auto it = env.find(k);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      &c);
  EXPECT_EQ(s.ok(), expect_ok) << s.message();
  if (error) *error = s.message();
  return c;
}
}  // namespace

TEST(ProbeConfig, DefaultsAndValues) {
  ProbeConfig d = parse({});
  EXPECT_EQ(d.host_threshold, 1u << 20);
  EXPECT_TRUE(d.stacks);
  EXPECT_EQ(d.stack_depth, 32);
  EXPECT_EQ(d.rss_interval_ms, 100);
  EXPECT_TRUE(d.forks);
  EXPECT_FALSE(parse({{kEnvForks, "0"}}).forks);
  ProbeConfig c = parse({{kEnvOutput, "/tmp/a.db"},
                         {kEnvHostThreshold, "64KiB"},
                         {kEnvStacks, "0"},
                         {kEnvStackDepth, "8"},
                         {kEnvCuda, "no"},
                         {kEnvRssMs, "0"}});
  EXPECT_EQ(c.output, "/tmp/a.db");
  EXPECT_EQ(c.host_threshold, 64u << 10);
  EXPECT_FALSE(c.stacks);
  EXPECT_EQ(c.stack_depth, 8);
  EXPECT_FALSE(c.cuda);
  EXPECT_EQ(c.rss_interval_ms, 0);
}

TEST(ProbeConfig, BadValuesNameTheVariable) {
  std::string e;
  parse({{kEnvHostThreshold, "big"}}, false, &e);
  EXPECT_NE(e.find("ZT_PROBE_HOST_THRESHOLD=big"), std::string::npos);
  parse({{kEnvStackDepth, "500"}}, false, &e);
  EXPECT_NE(e.find("ZT_PROBE_STACK_DEPTH=500"), std::string::npos);
  parse({{kEnvStacks, "maybe"}}, false, &e);
  EXPECT_NE(e.find("ZT_PROBE_STACKS=maybe"), std::string::npos);
  parse({{kEnvForks, "some"}}, false, &e);
  EXPECT_NE(e.find("ZT_PROBE_FORKS=some"), std::string::npos);
}

TEST(ProbeConfig, TheSampleIntervalAndSeed) {
  ProbeConfig d = parse({});
  EXPECT_EQ(d.sample_interval, 512u << 10);
  EXPECT_EQ(d.sample_seed, 0u);
  ProbeConfig c = parse({{kEnvSampleInterval, "64KiB"}, {kEnvSampleSeed, "42"}});
  EXPECT_EQ(c.sample_interval, 64u << 10);
  EXPECT_EQ(c.sample_seed, 42u);
  EXPECT_EQ(parse({{kEnvSampleInterval, "0"}}).sample_interval, 0u);  // off
  std::string e;
  parse({{kEnvSampleInterval, "often"}}, false, &e);
  EXPECT_NE(e.find("ZT_PROBE_SAMPLE_INTERVAL=often: not a size"), std::string::npos) << e;
  parse({{kEnvSampleInterval, "2TiB"}}, false, &e);
  EXPECT_NE(e.find("ZT_PROBE_SAMPLE_INTERVAL=2TiB"), std::string::npos) << e;
  parse({{kEnvSampleSeed, "-1"}}, false, &e);
  EXPECT_NE(e.find("ZT_PROBE_SAMPLE_SEED=-1: expected a whole number"), std::string::npos) << e;
}

TEST(ProbeConfig, PythonFramesOwnGilOrOff) {
  EXPECT_EQ(parse({}).python, PythonFrames::Own);
  EXPECT_EQ(parse({{kEnvPython, "gil"}}).python, PythonFrames::Gil);
  EXPECT_EQ(parse({{kEnvPython, "0"}}).python, PythonFrames::Off);
  EXPECT_EQ(parse({{kEnvPython, "1"}}).python, PythonFrames::Own);
  std::string e;
  parse({{kEnvPython, "always"}}, false, &e);
  EXPECT_NE(e.find("ZT_PROBE_PYTHON=always: expected 1, gil or 0"), std::string::npos) << e;
}

TEST(ProbeConfig, PerProcessTraceNames) {
  EXPECT_EQ(per_process_trace_path("/x/run.db", 42), "/x/run.pid42.db");
  EXPECT_EQ(per_process_trace_path("/x/run", 7), "/x/run.pid7.db");
}

TEST(ProbeConfig, RunIdIsCheckedAndKept) {
  EXPECT_EQ(parse({{kEnvRunId, "123-00ab.C_d"}}).run_id, "123-00ab.C_d");
  EXPECT_EQ(parse({}).run_id, "");
  std::string e;
  parse({{kEnvRunId, "a\"b"}}, false, &e);  // it goes into config_json unescaped: refused
  EXPECT_NE(e.find("ZT_PROBE_RUN_ID=a\"b"), std::string::npos) << e;
}

TEST(ProbeConfig, ShellQuotingRoundTrips) {
  EXPECT_EQ(shell_quote("python3"), "python3");
  EXPECT_EQ(shell_quote("/x/train.py"), "/x/train.py");
  EXPECT_EQ(shell_quote("--lr=1e-3,x:y@z%"), "--lr=1e-3,x:y@z%");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote("$HOME"), "'$HOME'");
  EXPECT_EQ(shell_quote("a\"b\\c"), "'a\"b\\c'");
  EXPECT_EQ(shell_quote("*"), "'*'");
  EXPECT_EQ(shell_quote_command({"python3", "-c", "print('hi there')", ""}),
            "python3 -c 'print('\\''hi there'\\'')' ''");
}

// ---- which process of the job this is ----------------------------------------------------------

TEST(ProcessRole, OwnerLinesRoundTripAndRejectDamage) {
  RankOwner o;
  o.host = "node7";
  o.pid = 4242;
  o.claim = RankClaim{true, "torchrun", 1, 2};
  EXPECT_EQ(format_rank_owner(o), "node7 4242 torchrun 1 2");
  auto back = parse_rank_owner(format_rank_owner(o));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->host, "node7");
  EXPECT_EQ(back->pid, 4242);
  EXPECT_TRUE(back->claim.same(o.claim));
  RankOwner none;
  none.host = "h";
  none.pid = 9;
  EXPECT_EQ(format_rank_owner(none), "h 9 - 0 0");
  ASSERT_TRUE(parse_rank_owner("h 9 - 0 0"));
  EXPECT_FALSE(parse_rank_owner("h 9 - 0 0")->claim.has_rank);
  for (const char* bad : {"", "h 9 - 0", "h 9 - 0 0 x", "h x - 0 0", "h 0 - 0 0", "h 9 torchrun -1 2", " 9 - 0 0",
                          "h 99999999999 - 0 0"})
    EXPECT_FALSE(parse_rank_owner(bad)) << bad;
}

TEST(ProcessRole, RanksHelpersAndTheLauncher) {
  const RankClaim none;
  const RankClaim r1{true, "torchrun", 1, 2};
  const RankClaim r0{true, "torchrun", 0, 2};
  auto owner = [](int64_t pid, RankClaim c) { return std::optional<RankOwner>(RankOwner{"h", pid, c}); };

  // The root without variables: the one rank of a run without a launcher (job rank unknown).
  ProcessRole p = decide_process_role(none, true, std::nullopt, false, false, false);
  EXPECT_EQ(p.role, zt::db::RankRole::Rank);
  EXPECT_FALSE(p.job_rank);
  EXPECT_TRUE(p.owns);
  // A worker torchrun started (its owner: the launcher without a rank, its parent): rank 1, and
  // the launcher is named.
  p = decide_process_role(r1, false, owner(100, none), true, false, true);
  EXPECT_EQ(p.role, zt::db::RankRole::Rank);
  EXPECT_EQ(p.job_rank, 1);
  EXPECT_EQ(p.launched_by, 100);
  EXPECT_TRUE(p.owns);
  // Workers started in reverse order change nothing: each takes its own variables' rank.
  EXPECT_EQ(decide_process_role(r0, false, owner(100, none), true, false, true).job_rank, 0);
  // A subprocess of rank 1 (a compiler, a data tool): same variables, its owner an ancestor.
  p = decide_process_role(r1, false, owner(200, r1), true, false, true);
  EXPECT_EQ(p.role, zt::db::RankRole::Helper);
  EXPECT_EQ(p.job_rank, 1);
  EXPECT_FALSE(p.owns);
  EXPECT_EQ(p.launched_by, 0);
  // The same claim from a process that is not an ancestor: srun's batch shell runs as task 0, and
  // srun's task 0 has the same variables. The task is the rank; the shell its launcher.
  p = decide_process_role(r0, false, owner(300, r0), true, false, false);
  EXPECT_EQ(p.role, zt::db::RankRole::Rank);
  EXPECT_EQ(p.launched_by, 300);
  // An outer launcher's rank (srun task 0 running torchrun): torchrun's worker is the rank.
  p = decide_process_role(r1, false, owner(400, RankClaim{true, "srun", 0, 2}), true, false, true);
  EXPECT_EQ(p.role, zt::db::RankRole::Rank);
  EXPECT_EQ(p.launched_by, 400);
  // An exec'd image of rank 1 (its own earlier image owns): still rank 1, nobody's launcher.
  p = decide_process_role(r1, false, owner(200, r1), true, true, false);
  EXPECT_EQ(p.role, zt::db::RankRole::Rank);
  EXPECT_EQ(p.launched_by, 0);
  // An owner on another host is never this process's launcher by pid.
  EXPECT_EQ(decide_process_role(r1, false, owner(100, none), false, false, false).launched_by, 0);
  // Without variables and not the root: a helper, of the owner's rank where it has one.
  p = decide_process_role(none, false, owner(200, r1), true, false, true);
  EXPECT_EQ(p.role, zt::db::RankRole::Helper);
  EXPECT_EQ(p.job_rank, 1);
  p = decide_process_role(none, false, owner(100, none), true, false, true);
  EXPECT_EQ(p.role, zt::db::RankRole::Helper);
  EXPECT_FALSE(p.job_rank);
  // An exec'd image of the root without variables: still the root's rank.
  EXPECT_EQ(decide_process_role(none, false, owner(100, none), true, true, false).role, zt::db::RankRole::Rank);
}
