// The zt command as a user meets it: help, version, exit codes, one-line errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "../hand_trace.h"

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

// --help fits the terminal: COLUMNS when set, else at most 100 columns (a pipe has no width), with
// the same words however narrow; only a word wider than its column may stick out. A subcommand's
// summary in zt --help is the first line of its description, and train's names the CUDA GPU.
TEST(Cli, HelpIsWrappedToTheTerminal) {
  auto words = [](const std::string& text) {
    std::istringstream in(text);
    std::vector<std::string> w;
    for (std::string x; in >> x;) w.push_back(x);
    return w;
  };
  for (const char* cmd : {"--help", "train --help", "check --help", "view --help", "repro --help", "db kernels --help"}) {
    Result wide = run_zt(cmd);
    ASSERT_EQ(wide.code, 0) << cmd;
    for (size_t columns : {size_t(0), size_t(60), size_t(80), size_t(200)}) {
      Result h = columns ? zt::test::run_command("COLUMNS=" + std::to_string(columns) + " " + ZT_EXE + " " + cmd + " 2>&1")
                         : zt::test::run_command("env -u COLUMNS " + std::string(ZT_EXE) + " " + cmd + " 2>&1 | cat");
      ASSERT_EQ(h.code, 0) << cmd;
      const size_t limit = columns == 0 || columns > 100 ? 100 : columns;
      std::istringstream lines(h.out);
      for (std::string line; std::getline(lines, line);) {
        if (line.size() <= limit) continue;
        const size_t last_space = line.find_last_of(' ');
        EXPECT_TRUE(last_space != std::string::npos && line.find_first_not_of(' ') > last_space - 1 &&
                    words(line).size() == 1)
            << cmd << " at " << columns << " columns: " << line;
      }
      EXPECT_EQ(words(h.out), words(wide.out)) << cmd << " at " << columns << " columns";
    }
  }
  Result h = zt::test::run_command("COLUMNS=100 " + std::string(ZT_EXE) + " --help 2>&1");
  EXPECT_NE(h.out.find("  train                       Train GPT-2 with ZeRO (stages 0-3, CPU offload) on a CUDA GPU, a\n"),
            std::string::npos)
      << h.out;
  EXPECT_EQ(h.out.find("Example: zt train"), std::string::npos) << "the subcommands' list shows summaries only";
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
                           "collective:all_gather", "dropped events: 0", "status: ok", "allocated at end", "reserved at end", "2.00 MiB",
                           "per step (mean bytes moved by each rank during its optimizer steps):"})
    EXPECT_NE(info.out.find(want), std::string::npos) << want << "\n" << info.out;

  Result sql = run_zt("db sql " + dir.file("a.db") + " \"SELECT name, bytes FROM allocation_v WHERE t_free IS NULL ORDER BY name LIMIT 1\"");
  ASSERT_EQ(sql.code, 0) << sql.out;
  EXPECT_NE(sql.out.find("offload.buffer[epoch 0]  1048576"), std::string::npos) << sql.out;
  EXPECT_NE(sql.out.find("(1 row)"), std::string::npos);
  // zt synth's timeline runs ahead of the clock: its run ends after its last event all the same.
  Result ends = run_zt("db sql --csv " + dir.file("a.db") +
                       " \"SELECT (SELECT t_end FROM run) >= (SELECT max(coalesce(t_end, t_start)) FROM marker) AS ok\"");
  EXPECT_EQ(ends.out, "ok\n1\n");
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

// zt train --delayed-update: the run says so at the start, and zt db info shows, per rank, the
// delayed updates, AdamW's time a step, the share of it beside the next step's compute, and the
// apply's wait; a run without it has no such section.
TEST(Cli, DelayedUpdateIsAnnouncedAndSummarized) {
  zt::test::TempDir dir;
  Result run = run_zt("train --model tiny --steps 6 --seq-len 32 --zero-stage 3 --offload-optimizer --delayed-update 1 "
                      "--trace " + dir.file("d.db"));
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_NE(run.out.find("delayed parameter update after 1 ordinary step: from step 2 on, each step's CPU AdamW runs "
                         "beside the next step"),
            std::string::npos)
      << run.out;
  Result info = run_zt("db info " + dir.file("d.db"));
  ASSERT_EQ(info.code, 0) << info.out;
  const size_t at = info.out.find("delayed parameter update (AdamW of step s beside step s+1's forward and backward):");
  ASSERT_NE(at, std::string::npos) << info.out;
  const std::string section = info.out.substr(at);
  for (const char* column : {"rank  updates  AdamW a step", "AdamW rate  beside the next step  apply a step", " Mparam/s "})
    EXPECT_NE(section.find(column), std::string::npos) << column << "\n" << section;
  // Steps 2-6 were delayed: five updates, the last applied at the end of the run.
  EXPECT_NE(section.find("\n     0        5 "), std::string::npos) << section;
  Result plain = run_zt("train --model tiny --steps 2 --seq-len 32 -q --trace " + dir.file("p.db"));
  ASSERT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(run_zt("db info " + dir.file("p.db")).out.find("delayed parameter update"), std::string::npos);
}

// zt train --overlap-update: announced at the start, in the trace's config, summarized by zt db info
// (the steps that awaited updates, and the wait); refused without the optimizer on the host.
TEST(Cli, OverlapUpdateIsAnnouncedAndSummarized) {
  zt::test::TempDir dir;
  Result run = run_zt("train --model tiny --steps 4 --seq-len 32 --zero-stage 3 --offload-optimizer --overlap-update "
                      "--trace " + dir.file("o.db"));
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_NE(run.out.find("overlapped update: each step's CPU AdamW runs beside the next step's forward"), std::string::npos)
      << run.out;
  Result info = run_zt("db info " + dir.file("o.db"));
  ASSERT_EQ(info.code, 0) << info.out;
  const size_t at = info.out.find("overlapped update (AdamW of step s beside step s+1's forward, each module awaited at "
                                  "its first use):");
  ASSERT_NE(at, std::string::npos) << info.out;
  const std::string section = info.out.substr(at);
  for (const char* column : {"rank  updates  AdamW a step", "AdamW rate  beside the next step  awaited a step", " Mparam/s "})
    EXPECT_NE(section.find(column), std::string::npos) << column << "\n" << section;
  EXPECT_NE(section.find("\n     0        4 "), std::string::npos) << section;  // steps 0-3 (step 3's awaited at the end)
  Result cfg = run_zt("db sql --csv " + dir.file("o.db") + " \"SELECT config_json FROM run\"");
  EXPECT_NE(cfg.out.find("\"\"overlap_update\"\":true"), std::string::npos) << cfg.out;
  Result plain = run_zt("train --model tiny --steps 2 --seq-len 32 -q --zero-stage 3 --offload-optimizer --trace " +
                        dir.file("p.db"));
  ASSERT_EQ(plain.code, 0) << plain.out;
  const std::string plain_info = run_zt("db info " + dir.file("p.db")).out;
  EXPECT_EQ(plain_info.find("overlapped update"), std::string::npos);
  // An ordinary step's AdamW instead: its time and rate on the rank thread.
  const size_t adamw = plain_info.find("CPU AdamW (the optimizer phase's adamw phases, on the rank thread):\n");
  ASSERT_NE(adamw, std::string::npos) << plain_info;
  for (const char* column : {"rank  steps  AdamW a step", "AdamW rate", " Mparam/s\n"})
    EXPECT_NE(plain_info.find(column, adamw), std::string::npos) << column << "\n" << plain_info;
  // Not without optimizer offload: the moments are on the (simulated) GPU.
  Result on_device = run_zt("train --model tiny --steps 2 --seq-len 32 -q --trace " + dir.file("d.db"));
  ASSERT_EQ(on_device.code, 0) << on_device.out;
  EXPECT_EQ(run_zt("db info " + dir.file("d.db")).out.find("CPU AdamW"), std::string::npos);
  Result bad = run_zt("train --overlap-update --model tiny --steps 1");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("overlap_update runs CPU AdamW beside the next step's forward: it needs the optimizer on the host"),
            std::string::npos)
      << bad.out;
}

// zt train --grad-partition-dtype compute: announced, in the trace's config, the partitions named
// .grad.bf16 in the trace; refused at stage 1, in fp32, without offload, or with another value.
TEST(Cli, GradPartitionDtypeComputeIsAnnouncedAndRefusedWhereItCannotApply) {
  zt::test::TempDir dir;
  const std::string base = "train --model tiny --steps 2 --seq-len 32 --precision bf16 --zero-stage 3 --offload-optimizer ";
  Result run = run_zt(base + "--grad-partition-dtype compute --trace " + dir.file("c.db"));
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_NE(run.out.find("gradient partitions kept in bf16 on the host: CPU AdamW widens them"), std::string::npos)
      << run.out;
  Result cfg = run_zt("db sql --csv " + dir.file("c.db") + " \"SELECT config_json FROM run\"");
  EXPECT_NE(cfg.out.find("\"\"grad_partition_dtype\"\":\"\"compute\"\""), std::string::npos) << cfg.out;
  Result names = run_zt("db sql --csv " + dir.file("c.db") +
                        " \"SELECT count(*) FROM allocation_v WHERE name LIKE 'fp32_partitioned_groups_flat[%].grad.bf16'\"");
  EXPECT_EQ(names.out.find("\n0"), std::string::npos) << names.out;
  for (const std::string& bad : {std::string("--precision bf16 --zero-stage 1 --offload-optimizer"),
                                 std::string("--precision fp32 --zero-stage 3 --offload-optimizer"),
                                 std::string("--precision bf16 --zero-stage 3")}) {
    Result r = run_zt("train --model tiny --steps 1 --seq-len 32 --grad-partition-dtype compute " + bad);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.out;
    EXPECT_NE(r.out.find("grad_partition_dtype compute keeps the host gradient partitions in the compute dtype"),
              std::string::npos)
        << r.out;
  }
  Result other = run_zt(base + "--grad-partition-dtype bf16");
  EXPECT_NE(other.code, 0);
  EXPECT_NE(other.out.find("--grad-partition-dtype"), std::string::npos) << other.out;
}

// zt train --pinned-numa interleave: announced with the host's nodes, in the trace's config and the
// YAML's key; another value refused by the flag and by the YAML key, naming the file.
TEST(Cli, PinnedNumaInterleaveIsAnnouncedAndAnotherValueRefused) {
  zt::test::TempDir dir;
  Result run = run_zt("train --model tiny --steps 2 --seq-len 32 --precision bf16 --zero-stage 3 --offload-optimizer "
                      "--pinned-numa interleave --trace " + dir.file("n.db"));
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_NE(run.out.find("pinned host memory interleaved page by page over NUMA node"), std::string::npos) << run.out;
  Result cfg = run_zt("db sql --csv " + dir.file("n.db") + " \"SELECT config_json FROM run\"");
  EXPECT_NE(cfg.out.find("\"\"pinned_numa\"\":\"\"interleave\"\""), std::string::npos) << cfg.out;
  Result flag = run_zt("train --model tiny --steps 1 --pinned-numa spread");
  EXPECT_NE(flag.code, 0);
  EXPECT_NE(flag.out.find("--pinned-numa"), std::string::npos) << flag.out;
  std::ofstream(dir.file("n.yaml")) << "model: tiny\nsteps: 1\npinned_numa: spread\n";
  Result yaml = run_zt("train --config " + dir.file("n.yaml"));
  EXPECT_EQ(yaml.code, 2) << yaml.out;
  EXPECT_NE(yaml.out.find("pinned_numa 'spread': use local"), std::string::npos) << yaml.out;
  EXPECT_NE(yaml.out.find("n.yaml"), std::string::npos) << yaml.out;
}

// zt db kernels on a trace with kernel rows written by hand (two steps: gemm and softmax kernels, an
// AdamW phase over the GPU's idle time): the header, the kernel table, the idle time by host phase;
// bad --steps and a missing trace are refused with exit 2.
TEST(Cli, DbKernelsSummarizesTheGpusTime) {
  using namespace zt::db;
  zt::test::TempDir dir;
  const std::string path = dir.file("k.db");
  {
    std::unique_ptr<TraceWriter> w = zt::test::hand_written_trace(path, "zt train --device cuda --cupti");
    ASSERT_NE(w, nullptr);
    w->insert(DeviceRow{1, 0, DeviceKind::Cuda, 0, "cuda:0", "GPU", std::nullopt, false});
    const char* names[] = {"step", "gemm_bf16", "softmax_rows", "adamw block3"};
    for (int64_t i = 0; i < 4; ++i) w->insert(StringRow{i + 1, names[i]});
    int64_t id = 0;
    const int64_t ms = 1000000;
    for (int64_t s = 0; s < 3; ++s) {
      MarkerRow m;
      m.id = ++id, m.kind = MarkerKind::Step, m.name_id = 1, m.t_start = s * 10 * ms, m.t_end = (s + 1) * 10 * ms, m.step = s;
      w->insert(m);
      auto kernel = [&](int64_t name, int64_t t0, int64_t t1) {
        KernelRow k;
        k.id = ++id, k.device_id = 1, k.name_id = name, k.t_start = s * 10 * ms + t0, k.t_end = s * 10 * ms + t1;
        w->insert(k);
      };
      kernel(2, 0, 4 * ms);
      kernel(3, 4 * ms, 5 * ms);
      MarkerRow a;
      a.id = ++id, a.kind = MarkerKind::Phase, a.name_id = 4, a.t_start = s * 10 * ms + 5 * ms;
      a.t_end = s * 10 * ms + 10 * ms, a.step = s;
      w->insert(a);
    }
    w->commit();
    ASSERT_TRUE(w->finish().ok());
  }
  Result r = run_zt("db kernels " + path);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("kernels of rank 0 on cuda:0, steps 1-2 (20.00 ms, 10.00 ms a step): 4 kernels, 10.00 ms of kernel time"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("GPU busy 10.00 ms (50.0% of the window), idle 10.00 ms in 2 gaps"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("8.00 ms  80.0%      2  4.00 ms  4.00 ms  4.00 ms  gemm_bf16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("10.00 ms      50.0%     2  adamw blockN"), std::string::npos) << r.out;
  Result one = run_zt("db kernels " + path + " --steps 2 --top 1");
  ASSERT_EQ(one.code, 0) << one.out;
  EXPECT_NE(one.out.find("step 2 (10.00 ms): 2 kernels"), std::string::npos) << one.out;
  EXPECT_NE(one.out.find("(1 more kernel names)"), std::string::npos) << one.out;
  Result bad = run_zt("db kernels " + path + " --steps 2-x");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--steps '2-x': give a step (3) or a range (2-4) of steps counted from 0"), std::string::npos)
      << bad.out;
  Result none = run_zt("db kernels " + dir.file("missing.db"));
  EXPECT_EQ(none.code, 2) << none.out;
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
  EXPECT_NE(missing.out.find("none.yaml: no such config file"), std::string::npos) << missing.out;
  // A flag wins over the file's setting it excludes too ("give steps or epochs, not both" came from
  // the file's epochs beside --steps), and the flags' own names are keys (fault, comm_timeout, quiet).
  std::ofstream(dir.file("x.yaml")) << "model: tiny\nseq_len: 32\nepochs: 3\nzero_stage: 3\noffload_optimizer: true\n"
                                       "delayed_update: 0\nquiet: true\ncomm_timeout: 5000\n"
                                       "fault: 'zero.norm_on_device[step=99]=return'\n";
  Result excl = run_zt("train --config " + dir.file("x.yaml") + " --steps 2 --overlap-update");
  EXPECT_EQ(excl.code, 0) << excl.out;
  EXPECT_NE(excl.out.find("trained 2 steps"), std::string::npos) << excl.out;
  EXPECT_EQ(excl.out.find(" tok/s | "), std::string::npos) << "quiet: true";
  Result bad = run_zt("train --zero-stage 2 --offload-param --steps 1");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("offload_param needs ZeRO stage 3"), std::string::npos) << bad.out;
  Result zero = run_zt("train --model tiny --steps 2 --seq-len 32 --micro-batch 2 --world-size 2 --zero-stage 3 "
                       "--offload-optimizer --offload-param -q");
  EXPECT_EQ(zero.code, 0) << zero.out;
  // Its "auto" values take the run's TrainingArguments: defaults, and the micro-batch typed.
  Result ds = run_zt("train --model tiny --steps 1 --seq-len 32 --micro-batch 2 -q --hf-args defaults --ds-config " +
                     std::string(ZT_SOURCE_DIR) + "/tests/data/ds_r4_llamafactory_z3_offload.json");
  EXPECT_EQ(ds.code, 0) << ds.out;
  EXPECT_NE(ds.out.find("zt train: warning: "), std::string::npos) << ds.out;
  EXPECT_NE(ds.out.find("monitor_config is not a key DeepSpeed 0.19 reads; ignored"), std::string::npos) << ds.out;
}

// Bad input found before training starts is refused before the trace is opened: opening it replaces
// the file, so the trace the user already had would be lost for a typo.
TEST(Cli, BadInputLeavesAnExistingTraceAlone) {
  zt::test::TempDir dir;
  const std::string trace = dir.file("kept.db");
  ASSERT_EQ(run_zt("train --model tiny --steps 2 --seq-len 32 -q --trace " + trace).code, 0);
  const std::string before = zt::test::read_file(trace);
  std::filesystem::create_directory(dir.file("adir"));
  const std::string ck = dir.file("ck");  // a checkpoint of the default seed, to resume with another one
  ASSERT_EQ(run_zt("train --model tiny --steps 2 -q --checkpoint-dir " + ck + " --save-every 2").code, 0);
  // The data's contents too (once read only after the trace was opened), and a checkpoint
  // directory that is a file (once found at the first save, exit 1, after training).
  std::ofstream(dir.file("empty.txt")).close();
  std::ofstream(dir.file("small.txt")) << "hi\n";
  std::ofstream(dir.file("afile")) << "x\n";
  for (const std::string& bad : {std::string("--fault 'bogus=return'"), "--data " + dir.file("adir"),
                                 "--data " + dir.file("none.txt"), std::string("--seq-len 100000"),
                                 std::string("--save-every 2"), "--resume --checkpoint-dir " + dir.file("nock"),
                                 "--resume --checkpoint-dir " + ck + " --seed 99", "--data " + dir.file("empty.txt"),
                                 "--data " + dir.file("small.txt"), "--save-every 1 --checkpoint-dir " + dir.file("afile"),
                                 // a module the model does not have: refused only when the fault fired, once
                                 std::string("--zero-stage 3 --offload-optimizer --fault "
                                             "'zero.grad_partition_stays_on_device=return(99)'")}) {
    Result r = run_zt("train --model tiny --steps 2 -q --trace " + trace + " " + bad);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.out;
    EXPECT_TRUE(zt::test::read_file(trace) == before) << bad << " replaced the trace";  // not the bytes: a trace is binary
  }
  Result dir_data = run_zt("train --model tiny --steps 2 -q --data " + dir.file("adir"));
  EXPECT_NE(dir_data.out.find(dir.file("adir") + ": is a directory, not a data file"), std::string::npos) << dir_data.out;
  Result empty = run_zt("train --model tiny --steps 2 -q --data " + dir.file("empty.txt"));
  EXPECT_EQ(empty.out, "zt: " + dir.file("empty.txt") + ": the data file is empty\n");
  Result module = run_zt("train --model tiny --steps 2 -q --zero-stage 3 --offload-optimizer --fault "
                         "'zero.grad_partition_stays_on_device=return(99)'");
  EXPECT_NE(module.out.find("module index '99': the model has modules 0..3"), std::string::npos) << module.out;
  // Only return(N) names a module: print's message is its own (it was refused as module 'hello').
  Result print = run_zt("train --model tiny --steps 1 -q --zero-stage 3 --offload-optimizer --fault "
                        "'zero.grad_partition_stays_on_device[step=99]=print(hello)'");
  EXPECT_EQ(print.code, 0) << print.out;
  Result file_ck = run_zt("train --model tiny --steps 2 -q --save-every 1 --checkpoint-dir " + dir.file("afile"));
  EXPECT_EQ(file_ck.out, "zt: --checkpoint-dir " + dir.file("afile") + ": exists and is not a directory\n");
}

// A flag beside --ds-config that the DeepSpeed config sets otherwise is refused, naming both (the
// JSON used to win silently: --micro-batch 1 ran with 2, --zero-stage 1 at stage 3); the same
// value in both is fine.
TEST(Cli, AFlagTheDeepSpeedConfigContradictsIsRefused) {
  zt::test::TempDir dir;
  const std::string ds = dir.file("ds.json");
  std::ofstream(ds) << R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}})";
  const std::string train = "train --model tiny --steps 1 --seq-len 32 -q --ds-config " + ds + " ";
  const std::pair<const char*, const char*> cases[] = {
      {"--micro-batch 1", "--micro-batch 1 and --ds-config DS (2) disagree: set it in one place"},
      {"--zero-stage 1", "--zero-stage 1 and --ds-config DS (3) disagree: set it in one place"},
      {"--precision fp32", "--precision fp32 and --ds-config DS (bf16) disagree: set it in one place"},
  };
  for (auto& [flag, want] : cases) {
    Result r = run_zt(train + flag);
    EXPECT_EQ(r.code, 2) << flag << "\n" << r.out;
    std::string w = want;
    w.replace(w.find("DS"), 2, ds);
    EXPECT_EQ(r.out, "zt: " + w + "\n") << flag;
  }
  Result same = run_zt(train + "--micro-batch 2 --zero-stage 3 --precision bf16 --offload-optimizer");
  EXPECT_EQ(same.code, 0) << same.out;
  // A flag the config leaves alone still applies.
  Result other = run_zt(train + "--lr 0.01");
  EXPECT_EQ(other.code, 0) << other.out;
  // Values are compared as numbers, not as their 6-digit print (these two printed alike).
  const std::string ds_lr = dir.file("lr.json");
  std::ofstream(ds_lr) << R"({"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 0.0003}}})";
  Result same_lr = run_zt("train --model tiny --steps 1 --seq-len 32 -q --lr 3e-4 --ds-config " + ds_lr);
  EXPECT_EQ(same_lr.code, 0) << same_lr.out;
  Result close_lr = run_zt("train --model tiny --steps 1 --seq-len 32 -q --lr 0.00030000001 --ds-config " + ds_lr);
  EXPECT_EQ(close_lr.code, 2) << close_lr.out;
  EXPECT_NE(close_lr.out.find("--lr 0.00030000001"), std::string::npos) << close_lr.out;
}

// After --resume the closing line counts the steps this process ran, and says which they were.
TEST(Cli, AResumedRunSaysWhichStepsItTrained) {
  zt::test::TempDir dir;
  const std::string ck = dir.file("ck");
  const std::string train = "train --model tiny --seq-len 32 --micro-batch 2 --checkpoint-dir " + ck;
  ASSERT_EQ(run_zt(train + " --steps 3 --save-every 3 -q").code, 0);
  Result r = run_zt(train + " --steps 6 --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("trained 3 steps (192 tokens), steps 4-6 after resuming from " + ck + "/step000003, in "),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("samples used 6 (this part)"), std::string::npos) << r.out;
}

// Small bad arguments, each one line and exit 2: a step count past int64 (read as INT64_MAX), a
// negative --step (ignored, the view drawn unzoomed), an empty trace name (the error named no file).
TEST(Cli, OutOfRangeStepsAndEmptyNamesAreRefused) {
  zt::test::TempDir dir;
  const std::string t = dir.file("t.db");
  ASSERT_EQ(run_zt("synth -o " + t + " --ranks 1 --epochs 1 --steps 2").code, 0);
  Result big = run_zt("db kernels " + t + " --steps 99999999999999999999");
  EXPECT_EQ(big.code, 2) << big.out;
  EXPECT_NE(big.out.find("--steps '99999999999999999999': give a step"), std::string::npos) << big.out;
  Result neg = run_zt("view " + t + " --screenshot " + dir.file("v.png") + " --step -5");
  EXPECT_EQ(neg.code, 2) << neg.out;
  EXPECT_NE(neg.out.find("--step -5: a step number is 0 or more"), std::string::npos) << neg.out;
  Result empty = run_zt("synth -o '' --ranks 1 --epochs 1 --steps 1");
  EXPECT_EQ(empty.code, 2) << empty.out;
  EXPECT_NE(empty.out.find("the trace file name is empty"), std::string::npos) << empty.out;
  Result no_budget = run_zt("check " + t + " --budget ''");  // was taken for no budget, exit 0
  EXPECT_EQ(no_budget.code, 2) << no_budget.out;
  EXPECT_NE(no_budget.out.find("--budget: empty"), std::string::npos) << no_budget.out;
  // The demo's later runs compare their loss at step 20 with the first run's.
  Result short_demo = run_zt("demo --steps 10 --dir " + dir.file("d"));
  EXPECT_EQ(short_demo.code, 2) << short_demo.out;
  EXPECT_FALSE(std::filesystem::exists(dir.file("d")));
  // A usage error is one line too, naming the command whose --help lists the options.
  Result bogus = run_zt("train --bogus");
  EXPECT_EQ(bogus.code, 2);
  EXPECT_EQ(bogus.out, "zt: The following argument was not expected: --bogus (zt train --help lists the options)\n");
  Result missing = run_zt("db kernels");
  EXPECT_EQ(missing.out, "zt: TRACE is required (zt db kernels --help lists the options)\n");
}

// db info counts the steps that ended, and says how many began and never did (a killed run's last);
// what is left allocated at the end is counted apart from what is left reserved (blocks lie inside
// segments: their sum was more than the reserve itself).
TEST(Cli, DbInfoCountsFinishedStepsAndWhatIsLeftPerLevel) {
  zt::test::TempDir dir;
  const std::string path = dir.file("killed.db");
  {
    std::unique_ptr<zt::db::TraceWriter> w = zt::test::hand_written_trace(path, "zt train");
    ASSERT_TRUE(w);
    w->insert(zt::db::StringRow{1, "step"});
    w->insert(zt::db::DeviceRow{1, 0, zt::db::DeviceKind::Sim, 0, "cuda:0", "simulated GPU", 1 << 30, true});
    for (int64_t s = 0; s < 3; ++s) {
      zt::db::MarkerRow m;
      m.id = s + 1, m.rank = 0, m.kind = zt::db::MarkerKind::Step, m.name_id = 1, m.t_start = 100 * s, m.step = s;
      if (s < 2) m.t_end = 100 * s + 90;
      w->insert(m);
    }
    zt::db::AllocationRow seg;
    seg.id = 1, seg.rank = 0, seg.device_id = 1, seg.memory_kind = zt::db::MemoryKind::Device;
    seg.level = zt::db::AllocLevel::Segment, seg.address = 0x1000, seg.bytes = seg.requested_bytes = 4 << 20;
    seg.t_alloc = 10;
    w->insert(seg);
    zt::db::AllocationRow blk = seg;
    blk.id = 2, blk.level = zt::db::AllocLevel::Block, blk.bytes = blk.requested_bytes = 1 << 20, blk.t_alloc = 20;
    blk.segment_id = 1;
    w->insert(blk);
    w->commit();
    ASSERT_TRUE(w->finish().ok());
  }
  Result info = run_zt("db info " + path);
  ASSERT_EQ(info.code, 0) << info.out;
  EXPECT_NE(info.out.find("steps: 2 (and 1 that began and never ended), epochs: 0"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("allocated at end"), std::string::npos) << info.out;
  // 1 MiB allocated and 4 MiB reserved at the end (and at the peaks): their sum is nowhere.
  EXPECT_EQ(info.out.find("5.00 MiB"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("1.00 MiB"), std::string::npos) << info.out;
}

// db info on a merged trace of a CPU job (issue 40): no per-step table of zeros where nothing was
// transferred, the error's kind on its line, and a note each process said (CUDA tracing was off)
// said once, with how many said it.
TEST(Cli, DbInfoOfAMergedCpuJob) {
  zt::test::TempDir dir;
  const std::string path = dir.file("cpu.db");
  const std::string off = "CUDA tracing was off: the program never loaded the CUDA driver; host allocations were recorded";
  {
    std::unique_ptr<zt::db::TraceWriter> w = zt::test::hand_written_trace(path, "python3 job.py");
    ASSERT_TRUE(w);
    for (int64_t id = 2; id <= 3; ++id) {
      zt::db::RunRow run;
      run.id = id, run.command_line = "python3 job.py", run.t_start = 0;
      w->insert(run);
    }
    w->insert(zt::db::StringRow{1, "step"});
    w->insert(zt::db::DeviceRow{1, 0, zt::db::DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false});
    for (int64_t s = 0; s < 3; ++s) {
      zt::db::MarkerRow m;
      m.id = s + 1, m.rank = 0, m.kind = zt::db::MarkerKind::Step, m.name_id = 1, m.t_start = 100 * s;
      m.t_end = 100 * s + 90, m.step = s;
      w->insert(m);
    }
    zt::db::ErrorRow e;
    e.id = 1, e.rank = 0, e.t = 250, e.kind = "uncaught_exception", e.message = "ValueError: bad batch";
    w->insert(e);
    w->commit();
    for (int64_t id = 1; id <= 3; ++id) w->add_run_note(id, off);
    w->commit();
    ASSERT_TRUE(w->finish().ok());
  }
  Result info = run_zt("db info " + path);
  ASSERT_EQ(info.code, 0) << info.out;
  EXPECT_NE(info.out.find("transfers: none"), std::string::npos) << info.out;
  EXPECT_EQ(info.out.find("per step"), std::string::npos) << info.out;
  EXPECT_EQ(info.out.find("H2D"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("rank 0: uncaught_exception: ValueError: bad batch"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("note: " + off + " (said by 3 of the trace's 3 runs)\n"), std::string::npos) << info.out;
  size_t notes = 0;
  for (size_t at = 0; (at = info.out.find("note: ", at)) != std::string::npos; ++at) ++notes;
  EXPECT_EQ(notes, 1u) << info.out;
}

// A DeepSpeed config of the wrong shape or with impossible values: one line naming the file and the key.
TEST(Cli, DeepSpeedConfigErrorsNameTheFileAndTheKey) {
  zt::test::TempDir dir;
  const std::string ds = dir.file("ds.json");
  const std::pair<const char*, const char*> cases[] = {
      {R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true, "loss_scale_window": 0}})", "fp16.loss_scale_window must be at least 1"},
      {R"({"train_micro_batch_size_per_gpu": 1, "bf16": true})", "bf16 must be an object ({...}), not true"},
      {R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2.7}})", "zero_optimization.stage must be a whole number, not 2.7"},
      {R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": 5}})", "optimizer.type must be a string, not 5"},
      {R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"params": {"lr": -1}}})", "optimizer.params.lr -1 must not be negative"},
      {R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"params": {"lr": 0}}})", "lr must be a positive number"},
      {R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"params": {"lr": 1e400}}})", "not valid JSON"},
      {R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 4294967299}})", "zero_optimization.stage 4294967299 is out of range"},
  };
  for (auto& [text, want] : cases) {
    std::ofstream(ds) << text;
    Result r = run_zt("train --model tiny --steps 1 -q --ds-config " + ds);
    EXPECT_EQ(r.code, 2) << text << "\n" << r.out;
    EXPECT_NE(r.out.find(ds + ": " + want), std::string::npos) << text << "\n" << r.out;
  }
  Result overflow = run_zt("train --model tiny --steps 1 -q --grad-accum 4611686018427387904");
  EXPECT_EQ(overflow.code, 2) << overflow.out;  // once a SIGFPE from the data plan's product
  EXPECT_NE(overflow.out.find("grad_accum 4611686018427387904 is above the limit"), std::string::npos) << overflow.out;
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

// zt train --cupti: CUPTI inside the trainer. Refused (exit 2, one line) without --device cuda, without
// --trace, and in a build without CUPTI; on a machine without a GPU it says why CUDA tracing is off,
// records that in the trace, and fails as --device cuda does there (no crash, no hang).
// --device cuda: the GPU's own memory unless a cap is given, on the command line or in the config
// file (even one equal to the simulated GPU's default 80 GiB); --tf32, --matmul-precision,
// --matmul-dtype and --delayed-update reach the resolved config, and are refused where they cannot act.
// The trace's run.config_json shows what the run was given (the run itself needs a GPU).
TEST(Cli, TrainCudaCapsMemoryOnlyWhenAskedAndTakesTf32) {
  zt::test::TempDir dir;
  auto config_of = [&](const std::string& yaml, const std::string& flags) {
    const std::string cfg = dir.file("c.yaml"), trace = dir.file("t.db");
    std::ofstream(cfg) << yaml;
    std::filesystem::remove(trace);
    Result r = zt::test::run_command("env -u RANK -u WORLD_SIZE -u LOCAL_RANK " + std::string(ZT_EXE) +
                                     " train --device cuda --model tiny --steps 1 -q --config " + cfg + " --trace " +
                                     trace + " " + flags + " 2>&1");
    Result q = run_zt("db sql --csv " + trace + " \"SELECT config_json FROM run\"");
    return std::make_pair(r.code, q.out);
  };
  auto [code, plain] = config_of("steps: 1\n", "");
  if (code == 0) GTEST_SKIP() << "a GPU is here: the run trained";
  EXPECT_NE(plain.find("\"\"device_memory\"\":0,"), std::string::npos) << plain;
  EXPECT_NE(plain.find("\"\"tf32\"\":false"), std::string::npos) << plain;
  auto [code2, capped] = config_of("device_memory: 80GiB\n", "--tf32");
  EXPECT_NE(capped.find("\"\"device_memory\"\":85899345920,"), std::string::npos) << capped;
  EXPECT_NE(capped.find("\"\"tf32\"\":true"), std::string::npos) << capped;
  auto [code3, flag] = config_of("steps: 1\n", "--device-memory 1GiB");
  EXPECT_NE(flag.find("\"\"device_memory\"\":1073741824,"), std::string::npos) << flag;
  auto [code4, medium] = config_of("matmul_precision: medium\n", "--delayed-update 1 --zero-stage 3 --offload-optimizer");
  EXPECT_NE(medium.find("\"\"matmul_precision\"\":\"\"medium\"\""), std::string::npos) << medium;
  EXPECT_NE(medium.find("\"\"delayed_update\"\":1"), std::string::npos) << medium;
  auto [code5, high] = config_of("steps: 1\n", "--tf32");
  EXPECT_NE(high.find("\"\"matmul_precision\"\":\"\"high\"\""), std::string::npos) << high;
  Result sim = run_zt("train --tf32 --model tiny --steps 1");
  EXPECT_EQ(sim.code, 2) << sim.out;
  EXPECT_NE(sim.out.find("tf32 chooses how a real GPU multiplies matrices: it needs --device cuda"), std::string::npos)
      << sim.out;
  Result med = run_zt("train --matmul-precision medium --model tiny --steps 1");
  EXPECT_EQ(med.code, 2) << med.out;
  EXPECT_NE(med.out.find("matmul_precision chooses how a real GPU multiplies matrices"), std::string::npos) << med.out;
  auto [code6, b16] = config_of("matmul_dtype: bf16\nprecision: bf16\n", "");
  EXPECT_NE(b16.find("\"\"matmul_dtype\"\":\"\"bf16\"\""), std::string::npos) << b16;
  EXPECT_NE(plain.find("\"\"matmul_dtype\"\":\"\"fp32\"\""), std::string::npos) << plain;
  Result b16_sim = run_zt("train --matmul-dtype bf16 --precision bf16 --model tiny --steps 1");
  EXPECT_EQ(b16_sim.code, 2) << b16_sim.out;
  EXPECT_NE(b16_sim.out.find("matmul_dtype bf16 multiplies bf16 activations on a GPU's tensor cores"),
            std::string::npos)
      << b16_sim.out;
  Result dpu = run_zt("train --delayed-update 0 --model tiny --steps 1");
  EXPECT_EQ(dpu.code, 2) << dpu.out;
  EXPECT_NE(dpu.out.find("delayed_update runs CPU AdamW beside the next step: it needs the optimizer on the host"),
            std::string::npos)
      << dpu.out;
}

// --attention: reaches the run's config in the trace, and a value we have no attention for is
// refused with the ones we have.
TEST(Cli, AttentionFlashReachesTheRunAndOthersAreRefused) {
  zt::test::TempDir dir;
  const std::string trace = dir.file("t.db");
  Result r = run_zt("train --model tiny --steps 1 -q --attention flash --trace " + trace);
  ASSERT_EQ(r.code, 0) << r.out;
  Result q = run_zt("db sql --csv " + trace + " \"SELECT config_json FROM run\"");
  EXPECT_NE(q.out.find("\"\"attention\"\":\"\"flash\"\""), std::string::npos) << q.out;
  Result bad = run_zt("train --model tiny --steps 1 --attention flash_attn");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("attention 'flash_attn': use materialized or eager"), std::string::npos) << bad.out;
  // --optimizer: an unknown name is one line naming it, exit 2; one outside AdamW's family needs --virtual.
  Result opt = run_zt("train --model tiny --steps 1 --optimizer adamw_torh");
  EXPECT_EQ(opt.code, 2) << opt.out;
  EXPECT_NE(opt.out.find("optimizer 'adamw_torh' is not a name zerotrace knows"), std::string::npos) << opt.out;
  Result real = run_zt("train --model tiny --steps 1 --optimizer adafactor --zero-stage 2");
  EXPECT_EQ(real.code, 2) << real.out;
  EXPECT_NE(real.out.find("replayed for memory in virtual mode only"), std::string::npos) << real.out;
}

TEST(Cli, TrainCuptiNeedsDeviceCudaATraceAndSaysWhyItIsOff) {
  zt::test::TempDir dir;
  Result sim = run_zt("train --cupti --model tiny --steps 1 --trace " + dir.file("sim.db"));
  EXPECT_EQ(sim.code, 2) << sim.out;
  EXPECT_EQ(sim.out, "zt: --cupti needs --device cuda (CUPTI traces a real GPU; --device sim has none)\n");
  Result cpu = run_zt("train --cupti --device cpu --model tiny --steps 1 --trace " + dir.file("cpu.db"));
  EXPECT_EQ(cpu.code, 2) << cpu.out;
  EXPECT_NE(cpu.out.find("--cupti needs --device cuda"), std::string::npos) << cpu.out;
  Result untraced = run_zt("train --cupti --device cuda --model tiny --steps 1");
  EXPECT_EQ(untraced.code, 2) << untraced.out;
  EXPECT_EQ(untraced.out, "zt: --cupti needs --trace (CUPTI's rows go into the trace)\n");
  // Refusals come before any trace is opened.
  EXPECT_FALSE(std::filesystem::exists(dir.file("sim.db")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("cpu.db")));

  const std::string trace = dir.file("cuda.db");
  // timeout: a hang in CUPTI without a driver must fail here, not stall the suite (124).
  Result r = zt::test::run_command("env -u RANK -u WORLD_SIZE -u LOCAL_RANK timeout 300 " + std::string(ZT_EXE) +
                                   " train --device cuda --cupti --model tiny --steps 1 --seq-len 32 -q --trace " +
                                   trace + " 2>&1");
#if !ZT_TEST_HAVE_CUPTI
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.out, "zt: --cupti: this build has no CUPTI (built without a CUDA toolkit)\n");
#else
  if (r.code == 0) return;  // a machine with a usable GPU trained (tests/probe/train_cupti_gpu_test.cpp checks the rows)
  EXPECT_EQ(r.code, 2) << r.out;  // as --device cuda without --cupti
  EXPECT_NE(r.out.find("--device cuda: "), std::string::npos) << r.out;
  const std::string off_line = "zt train: CUDA tracing (--cupti) is off: ";
  const size_t off = r.out.find(off_line);
  if (off != std::string::npos) {
    // Said once, before training was tried, and kept in the trace.
    EXPECT_EQ(r.out.find(off_line, off + 1), std::string::npos) << r.out;
    EXPECT_LT(off, r.out.find("--device cuda: ")) << r.out;
    Result q = run_zt("db sql --csv " + trace +
                      " \"SELECT count(*) AS n FROM run, json_each(run.config_json, '\\$.notes') j WHERE j.value LIKE "
                      "'CUDA tracing (--cupti) was off: %'\"");
    EXPECT_EQ(q.out, "n\n1\n");
  }
  Result info = run_zt("db info " + trace);
  EXPECT_NE(info.out.find("status: failed"), std::string::npos) << info.out;
#endif
}

// A probed job's launcher and helpers (rank.role) are not ranks: zt db info counts the ranks and
// lists the other processes after them by pid and key, the first four named, the rest counted.
TEST(Cli, DbInfoListsALaunchersAndHelpersApartFromTheRanks) {
  zt::test::TempDir dir;
  const std::string path = dir.file("job.db");
  {
    auto w = zt::test::hand_written_trace(path, "python3 launch.py");  // rank 0 of 1
    ASSERT_TRUE(w);
    zt::db::RankRow launcher{1, 1, 1, std::nullopt, "h", 40};
    launcher.role = zt::db::RankRole::Launcher;
    w->insert(launcher);
    for (int k = 0; k < 5; ++k) {
      zt::db::RankRow helper{2 + k, 1, 1, std::nullopt, "h", 50 + k};
      helper.role = zt::db::RankRole::Helper;
      helper.job_rank = 0;
      w->insert(helper);
    }
    w->commit();
    ASSERT_TRUE(w->finish());
  }
  Result info = run_zt("db info " + path);
  ASSERT_EQ(info.code, 0) << info.out;
  EXPECT_NE(info.out.find("ranks: 1 (world size 1); other processes: launcher 40 (key 1), helper 50 of rank 0 (key 2), "
                          "helper 51 of rank 0 (key 3), helper 52 of rank 0 (key 4) and 2 more\n"),
            std::string::npos)
      << info.out;
}

// zt db top on a merged trace of a job and its forked DataLoader worker headed the worker's table
// "cpu of rank 1" (found 2026-11-29 on the PyTorch tutorial's loop with num_workers=2), where zt db info
// and zt check name it "worker process 4251 of rank 0". It names it so too.
TEST(Cli, DbTopNamesAWorkerByItsRoleAndPid) {
  zt::test::TempDir dir;
  const std::string path = dir.file("job.db");
  {
    auto w = zt::test::hand_written_trace(path, "python3 train.py");  // rank 0 of 1
    ASSERT_TRUE(w);
    zt::db::RankRow worker{1, 1, 1, std::nullopt, "h", 4251};
    worker.role = zt::db::RankRole::Worker;
    worker.job_rank = 0;
    w->insert(worker);
    for (int64_t key : {0, 1}) {
      zt::db::DeviceRow d;
      d.id = key + 1, d.rank = key, d.kind = zt::db::DeviceKind::Cpu, d.label = "cpu", d.name = "host memory";
      w->insert(d);
      zt::db::AllocationRow a;
      a.id = key + 1, a.rank = key, a.device_id = key + 1, a.memory_kind = zt::db::MemoryKind::PageableHost;
      a.address = 0x1000 * uint64_t(key + 1), a.bytes = a.requested_bytes = (2 + key) << 20, a.t_alloc = 10;
      w->insert(a);
    }
    w->commit();
    ASSERT_TRUE(w->finish());
  }
  Result top = run_zt("db top " + path);
  ASSERT_EQ(top.code, 0) << top.out;
  EXPECT_NE(top.out.find("\ncpu of rank 0: 2.00 MiB"), std::string::npos) << top.out;
  EXPECT_NE(top.out.find("\ncpu of worker process 4251 of rank 0: 3.00 MiB"), std::string::npos) << top.out;
  EXPECT_EQ(top.out.find("cpu of rank 1"), std::string::npos) << top.out;
}
