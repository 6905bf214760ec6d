// The zt commands that write a file named by the user refuse to write over what they read (exit 2,
// the input intact byte for byte), and zt's tables align by columns on screen, not bytes ("µs").
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../test_util.h"

namespace fs = std::filesystem;

namespace {

using Result = zt::test::CommandResult;

Result run_zt(const std::string& args) { return zt::test::run_command(std::string(ZT_EXE) + " " + args + " 2>&1"); }

// A small real trace and checkpoints: 2 ranks, ZeRO-3 with the optimizer offloaded.
Result train(const std::string& dir, const std::string& extra = "") {
  return run_zt("train --model tiny --steps 6 --world-size 2 --zero-stage 3 --offload-optimizer --trace " + dir +
                "/t.db " + extra);
}

// Runs `args` in `dir` and expects exit 2, the one line `message`, and `input` unchanged.
void expect_refused(const std::string& dir, const std::string& args, const std::string& input,
                    const std::string& message, const std::string& runner = "") {
  const std::string before = zt::test::read_file(dir + "/" + input);
  ASSERT_FALSE(before.empty()) << input;
  Result r = zt::test::run_command("cd " + dir + " && " + runner + ZT_EXE + " " + args + " 2>&1");
  EXPECT_EQ(r.code, 2) << args << ": " << r.out;
  EXPECT_EQ(r.out, "zt: " + message + "\n") << args;
  EXPECT_TRUE(zt::test::read_file(dir + "/" + input) == before) << args << ": " << input << " was changed";
}

// The line as code points (UTF-8), so that index i is screen column i.
std::vector<std::string> columns(const std::string& line) {
  std::vector<std::string> cps;
  for (unsigned char c : line) {
    if ((c & 0xC0) == 0x80 && !cps.empty()) cps.back() += char(c);
    else cps.push_back(std::string(1, char(c)));
  }
  return cps;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// The table whose header line contains `labels` in order: its header and data rows (up to a
// blank line or a line ending in ':').
std::vector<std::string> table(const std::vector<std::string>& lines, const std::vector<std::string>& labels) {
  for (size_t i = 0; i < lines.size(); ++i) {
    size_t at = 0;
    bool all = true;
    for (const auto& l : labels) {
      at = lines[i].find(l, at);
      if (at == std::string::npos) {
        all = false;
        break;
      }
    }
    if (!all) continue;
    std::vector<std::string> t{lines[i]};
    for (size_t j = i + 1; j < lines.size() && !lines[j].empty() && lines[j].back() != ':'; ++j) t.push_back(lines[j]);
    return t;
  }
  return {};
}

// Every right-aligned column's cells end at the screen column where its header label ends, and the
// last (left-aligned) column starts where its label starts.
void expect_aligned(const std::vector<std::string>& t, const std::vector<std::string>& right, const std::string& last) {
  ASSERT_GE(t.size(), 2u) << "no table";
  const std::vector<std::string> head = columns(t[0]);
  auto find_col = [&](const std::string& label, size_t from) {
    const std::vector<std::string> l = columns(label);
    for (size_t i = from; i + l.size() <= head.size(); ++i)
      if (std::equal(l.begin(), l.end(), head.begin() + long(i))) return i;
    ADD_FAILURE() << label << " not in " << t[0];
    return size_t(0);
  };
  std::vector<size_t> ends;
  size_t from = 0;
  for (const auto& label : right) {
    const size_t start = find_col(label, from);
    ends.push_back(start + columns(label).size());
    from = ends.back();
  }
  const size_t last_start = last.empty() ? 0 : find_col(last, from);
  for (size_t r = 1; r < t.size(); ++r) {
    const std::vector<std::string> row = columns(t[r]);
    for (size_t e : ends) {
      ASSERT_LE(e, row.size()) << t[r];
      EXPECT_NE(row[e - 1], " ") << "a cell does not end at column " << e << ":\n" << t[0] << "\n" << t[r];
      if (e < row.size()) {
        EXPECT_EQ(row[e], " ") << "a cell runs past column " << e << ":\n" << t[0] << "\n" << t[r];
      }
    }
    if (!last.empty()) {
      ASSERT_LT(last_start, row.size()) << t[r];
      EXPECT_NE(row[last_start], " ") << t[0] << "\n" << t[r];
      EXPECT_EQ(row[last_start - 1], " ") << t[0] << "\n" << t[r];
    } else {
      EXPECT_EQ(row.size(), head.size()) << t[0] << "\n" << t[r];
    }
  }
}

}  // namespace

TEST(CliOutputs, ExportRefusesToWriteOverItsTrace) {
  zt::test::TempDir dir;
  ASSERT_EQ(run_zt("synth -o " + dir.file("a.db") + " --ranks 2 --epochs 1 --steps 2").code, 0);
  expect_refused(dir.path(), "export a.db --chrome a.db", "a.db", "a.db: the output is the input trace (choose another file)");
  expect_refused(dir.path(), "export a.db --chrome ./a.db", "a.db",
                 "./a.db: the output is the input trace a.db (choose another file)");
  expect_refused(dir.path(), "export a.db --chrome nodir/a.json", "a.db", "nodir/a.json: directory nodir does not exist");
  Result ok = run_zt("export " + dir.file("a.db") + " --chrome " + dir.file("a.json"));
  EXPECT_EQ(ok.code, 0) << ok.out;
}

TEST(CliOutputs, MergeRefusesToWriteOverAnInputSpelledAnotherWay) {
  zt::test::TempDir dir;
  ASSERT_EQ(run_zt("synth -o " + dir.file("a.db") + " --ranks 1 --epochs 1 --steps 2").code, 0);
  expect_refused(dir.path(), "db merge --force ./a.db a.db", "a.db",
                 "./a.db: the output is the input trace a.db (choose another file)");
  expect_refused(dir.path(), "db merge --force a.db a.db", "a.db", "a.db: the output is the input trace (choose another file)");
}

TEST(CliOutputs, CheckJunitRefusesToWriteOverItsTrace) {
  zt::test::TempDir dir;
  ASSERT_EQ(run_zt("synth -o " + dir.file("b.db") + " --ranks 1 --epochs 1 --steps 2").code, 0);
  expect_refused(dir.path(), "check b.db --junit b.db", "b.db", "b.db: the output is the input trace (choose another file)");
  expect_refused(dir.path(), "check b.db --junit ./b.db", "b.db",
                 "./b.db: the output is the input trace b.db (choose another file)");
}

TEST(CliOutputs, ViewScreenshotRefusesToWriteOverATrace) {
  zt::test::TempDir dir;
  ASSERT_EQ(run_zt("synth -o " + dir.file("v.db") + " --ranks 1 --epochs 1 --steps 2").code, 0);
  ASSERT_EQ(run_zt("synth -o " + dir.file("w.db") + " --ranks 1 --epochs 1 --steps 2").code, 0);
  if (run_zt("view --help").out.find("not built") != std::string::npos) GTEST_SKIP() << "viewer not built";
  // Under an X display the viewer would really render: the refusal must come first.
  const std::string xvfb = std::system("command -v xvfb-run >/dev/null 2>&1") == 0
                               ? "xvfb-run -a -s \"-screen 0 1600x1000x24\" "
                               : "";
  expect_refused(dir.path(), "view v.db --screenshot v.db", "v.db", "v.db: the output is the input trace (choose another file)",
                 xvfb);
  expect_refused(dir.path(), "view v.db w.db --screenshot ./w.db", "w.db",
                 "./w.db: the output is the input trace w.db (choose another file)", xvfb);
}

TEST(CliOutputs, ReproJsonRefusesToWriteOverItsScenario) {
  zt::test::TempDir dir;
  fs::copy_file(std::string(ZT_SOURCE_DIR) + "/inject/scenarios/r2-qwen72b-offload-device-mismatch.yaml", dir.file("s.yaml"));
  expect_refused(dir.path(), "repro s.yaml --json s.yaml", "s.yaml", "s.yaml: the output is the input scenario (choose another file)");
  expect_refused(dir.path(), "repro s.yaml --keep k --json k/bug.db", "s.yaml",
                 "k/bug.db: the --json output is the trace k/bug.db this run writes (choose another file)");
  fs::copy_file(dir.file("s.yaml"), dir.file("fix.db"));
  expect_refused(dir.path(), "repro fix.db --keep .", "fix.db",
                 "./fix.db: the output of --keep . is the input scenario fix.db (choose another directory)");
  EXPECT_FALSE(fs::exists(dir.file("k"))) << "nothing may run before the refusal";
}

TEST(CliOutputs, CkptConsolidateRefusesToWriteInsideTheCheckpoint) {
  zt::test::TempDir dir;
  Result t = train(dir.path(), "--checkpoint-dir " + dir.file("ck") + " --save-every 2");
  ASSERT_EQ(t.code, 0) << t.out;
  const std::string shard = "ck/step000004/rank00000.zts";
  expect_refused(dir.path(), "ckpt consolidate ck --out " + shard, shard,
                 shard + ": the output lies inside the checkpoint directory ck being read (choose a place outside it)");
  expect_refused(dir.path(), "ckpt consolidate ck/ --out ./ck/latest", "ck/latest",
                 "./ck/latest: the output lies inside the checkpoint directory ck/ being read (choose a place outside it)");
  expect_refused(dir.path(), "ckpt consolidate ck --out ''", shard,
                 "--out: the file name is empty; name the safetensors file to write");
  Result info = run_zt("ckpt info " + dir.file("ck"));
  EXPECT_EQ(info.out.find("INCOMPLETE"), std::string::npos) << info.out;
  Result ok = run_zt("ckpt consolidate " + dir.file("ck") + " --out " + dir.file("model.safetensors"));
  EXPECT_EQ(ok.code, 0) << ok.out;
  // The output's folder is made, as save_pretrained makes it (the help's own example failed on a
  // fresh machine: "directory model does not exist"); made and then left empty, it goes again.
  Result made = run_zt("ckpt consolidate " + dir.file("ck") + " --out " + dir.file("hf/model.safetensors"));
  EXPECT_EQ(made.code, 0) << made.out;
  EXPECT_TRUE(fs::exists(dir.file("hf/config.json")));
  Result gone = run_zt("ckpt consolidate " + dir.file("nock") + " --out " + dir.file("hf2/a/b/model.safetensors"));
  EXPECT_EQ(gone.code, 2) << gone.out;
  EXPECT_FALSE(fs::exists(dir.file("hf2")));  // every level made here
}

TEST(CliOutputs, DbKernelsAndInfoAlignByScreenColumns) {
  zt::test::TempDir dir;
  Result t = train(dir.path());
  ASSERT_EQ(t.code, 0) << t.out;
  Result k = run_zt("db kernels " + dir.file("t.db"));
  ASSERT_EQ(k.code, 0) << k.out;
  // The embedding passes take microseconds: the table mixes "ms" and "µs" cells.
  ASSERT_NE(k.out.find("\xC2\xB5s"), std::string::npos) << k.out;
  const auto lines = lines_of(k.out);
  const auto kernels = table(lines, {"time", "share", "calls", "avg", "min", "max", "kernel"});
  EXPECT_GE(kernels.size(), 4u) << k.out;
  expect_aligned(kernels, {"time", "share", "calls", "avg", "min", "max"}, "kernel");
  expect_aligned(table(lines, {"idle", "of window", "gaps", "host phase"}), {"idle", "of window", "gaps"}, "host phase");
  expect_aligned(table(lines, {"idle", "at", "step", "host phase"}), {"idle", "at", "step"}, "host phase");
  // db info's transfers: the last column is right-aligned, so every row is as wide as the header.
  Result info = run_zt("db info " + dir.file("t.db"));
  ASSERT_EQ(info.code, 0) << info.out;
  expect_aligned(table(lines_of(info.out), {"kind", "count", "bytes", "busy", "rate"}), {"count", "bytes", "busy", "rate"}, "");
}

// zt train says how long it took to set up, before and after; db info says when the first step began
// after the run started (the same set-up, from the trace), and nothing of it for a run that never
// reached a step.
TEST(CliOutputs, SetUpTimeIsPrintedAndInTheTrace) {
  zt::test::TempDir dir;
  Result t = train(dir.path());
  ASSERT_EQ(t.code, 0) << t.out;
  const size_t before = t.out.find("setting up rank 0: drawing 120.6k initial weights, placing the model states ...");
  const size_t after = t.out.find("set up in ");
  ASSERT_NE(before, std::string::npos) << t.out;
  ASSERT_NE(after, std::string::npos) << t.out;
  EXPECT_LT(before, after);
  EXPECT_LT(after, t.out.find("step 1/6")) << t.out;
  Result info = run_zt("db info " + dir.file("t.db"));
  ASSERT_EQ(info.code, 0) << info.out;
  EXPECT_NE(info.out.find("steps: 6, epochs: 1; the first began "), std::string::npos) << info.out;
  EXPECT_NE(info.out.find(" after the run started (its set-up)"), std::string::npos) << info.out;

  Result oom = run_zt("train --model tiny --steps 2 --device-memory 3MiB --trace " + dir.file("oom.db"));
  ASSERT_EQ(oom.code, 1) << oom.out;
  Result none = run_zt("db info " + dir.file("oom.db"));
  ASSERT_EQ(none.code, 0) << none.out;
  EXPECT_NE(none.out.find("steps: 0, epochs: 0\n"), std::string::npos) << none.out;
  EXPECT_EQ(none.out.find("the first began"), std::string::npos) << none.out;
}

// zt db info on a delayed update with the parameter shards on the device: per rank, how many of the
// write-back copies began before the apply of their update (the early write-back); none with
// ZT_EARLY_WRITE_BACK=0; no such line for host shards (offload_param), whose H2D copies into
// "<module>.shard" are the prefetch's.
TEST(CliOutputs, DbInfoSaysHowManyWriteBackCopiesWentUpEarly) {
  zt::test::TempDir dir;
  std::ofstream(dir.file("ds.json")) << R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
    "stage3_param_persistence_threshold": 0}, "bf16": {"enabled": true}, "train_micro_batch_size_per_gpu": 4})";
  const std::string run = "train --model tiny --steps 6 --delayed-update 0 --ds-config " + dir.file("ds.json");
  const std::string line = "weights up to the device shards (early write-back";
  Result early = run_zt(run + " --trace " + dir.file("early.db"));
  ASSERT_EQ(early.code, 0) << early.out;
  Result info = run_zt("db info " + dir.file("early.db"));
  ASSERT_EQ(info.code, 0) << info.out;
  EXPECT_NE(info.out.find(line), std::string::npos) << info.out;
  EXPECT_NE(info.out.find(" of 24 copies began before the apply of their update"), std::string::npos) << info.out;

  setenv("ZT_EARLY_WRITE_BACK", "0", 1);
  Result late = run_zt(run + " --trace " + dir.file("late.db"));
  unsetenv("ZT_EARLY_WRITE_BACK");
  ASSERT_EQ(late.code, 0) << late.out;
  info = run_zt("db info " + dir.file("late.db"));
  EXPECT_NE(info.out.find("rank 0: 0 of 24 copies began before the apply of their update"), std::string::npos)
      << info.out;

  std::ofstream(dir.file("ds-param.json")) << R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
    "offload_param": {"device": "cpu"}, "stage3_param_persistence_threshold": 0}, "bf16": {"enabled": true},
    "train_micro_batch_size_per_gpu": 4})";
  Result host = run_zt("train --model tiny --steps 6 --delayed-update 0 --ds-config " + dir.file("ds-param.json") +
                       " --trace " + dir.file("host.db"));
  ASSERT_EQ(host.code, 0) << host.out;
  info = run_zt("db info " + dir.file("host.db"));
  EXPECT_NE(info.out.find("delayed parameter update"), std::string::npos) << info.out;
  EXPECT_EQ(info.out.find(line), std::string::npos) << info.out;
}

// zt db info on a partial offload: per rank the modules on each side and the device AdamW's time a
// step; nothing of it for a full offload.
TEST(CliOutputs, DbInfoSaysHowAPartialOffloadSplitTheModules) {
  zt::test::TempDir dir;
  const std::string run = "train --model tiny --steps 3 --zero-stage 3 --offload-optimizer --quiet";
  Result part = run_zt(run + " --offload-ratio 0.7 --trace " + dir.file("part.db"));
  ASSERT_EQ(part.code, 0) << part.out;
  Result info = run_zt("db info " + dir.file("part.db"));
  ASSERT_EQ(info.code, 0) << info.out;
  EXPECT_NE(info.out.find("partial optimizer offload (offload_ratio 0.7):"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("modules on the host  on the accelerator  device AdamW a step"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("     0                    3                   1 "), std::string::npos) << info.out;
  Result full = run_zt(run + " --trace " + dir.file("full.db"));
  ASSERT_EQ(full.code, 0) << full.out;
  info = run_zt("db info " + dir.file("full.db"));
  EXPECT_EQ(info.out.find("partial optimizer offload"), std::string::npos) << info.out;
}

// zt demo (README's first command) to its end: its last sections show the updates run beside the
// step and the partial offload: the overlapped update's and the partial offload's loss at step 20 are
// run 1's (each printed beside run 1's), the delayed update's early write-back and the partial
// offload's split are reported. Its output is for a newcomer: it says the simulated GPU is used, each
// of its eleven sections has a title, only run 1 prints step lines, and the command heading run 1,
// pasted into a shell, trains the same run (the same losses, the same allocations).
TEST(CliOutputs, TheDemoShowsTheUpdatesBesideTheStepAndThePartialOffload) {
  zt::test::TempDir dir;
  Result demo = run_zt("demo --device sim --steps 20 --dir " + dir.file("demo"));
  ASSERT_EQ(demo.code, 0) << demo.out;
  const std::string label = "rank 0's loss at step 20: ";
  std::vector<std::pair<std::string, std::string>> losses;  // run 1's, this run's
  for (size_t at = demo.out.find(label); at != std::string::npos; at = demo.out.find(label, at + 1)) {
    std::istringstream line(demo.out.substr(at + label.size(), demo.out.find('\n', at) - at - label.size()));
    std::string run1, in, run, one, here;
    line >> run1 >> in >> run >> one >> here;
    ASSERT_EQ(in + run + one, "inrun1,") << line.str();
    losses.emplace_back(run1, here);
  }
  ASSERT_EQ(losses.size(), 2u) << demo.out;
  EXPECT_EQ(losses[0].second, losses[0].first) << "the overlapped update";
  EXPECT_EQ(losses[1].second, losses[1].first) << "the partial offload";
  EXPECT_NE(demo.out.find("copies began before the apply of their update"), std::string::npos) << demo.out;
  EXPECT_NE(demo.out.find("== 11. Partial optimizer offload: --offload-ratio 0.5"), std::string::npos) << demo.out;
  EXPECT_NE(demo.out.find("partial optimizer offload (offload_ratio 0.5):"), std::string::npos) << demo.out;
  EXPECT_NE(demo.out.find("the optimizer state of 2 of 4 modules on the host, 2 on cuda:0"), std::string::npos)
      << demo.out;

  EXPECT_EQ(demo.out.rfind("The demo uses (--device sim) zt's simulated GPU", 0), 0u) << demo.out;
  for (int n = 1; n <= 11; ++n) EXPECT_NE(demo.out.find("\n== " + std::to_string(n) + ". "), std::string::npos) << n;
  size_t step_lines = 0;
  const size_t run1 = demo.out.find("\n== 1. "), after_run1 = demo.out.find("\n== 2. ");
  for (size_t at = demo.out.find("\nstep "); at != std::string::npos; at = demo.out.find("\nstep ", at + 1)) {
    EXPECT_TRUE(run1 < at && at < after_run1) << "a step line outside run 1's section: " << demo.out.substr(at, 40);
    ++step_lines;
  }
  EXPECT_GT(step_lines, 0u);
  EXPECT_EQ(demo.out.find("1 samples"), std::string::npos) << demo.out;
  EXPECT_NE(demo.out.find("1 sample dropped"), std::string::npos) << demo.out;

  // Run 1's command, pasted (its lines joined where they end in " \"), with another trace.
  const size_t head = demo.out.find("== 1. Train with a trace (run 1)\n");
  ASSERT_NE(head, std::string::npos) << demo.out;
  std::string command;
  for (size_t at = demo.out.find('\n', head) + 1;;) {
    const size_t nl = demo.out.find('\n', at);
    std::string line = demo.out.substr(at, nl - at);
    at = nl + 1;
    const bool more = line.size() >= 2 && line.compare(line.size() - 2, 2, " \\") == 0;
    command += line.substr(0, more ? line.size() - 2 : std::string::npos);
    if (!more) break;
  }
  const std::string trace = dir.file("demo") + "/train.db";
  const size_t t = command.find(" --trace " + trace);
  ASSERT_EQ(command.rfind("   zt train ", 0), 0u) << command;
  ASSERT_NE(t, std::string::npos) << command;
  command.replace(t, 9 + trace.size(), " --trace " + dir.file("pasted.db"));
  Result pasted = zt::test::run_command(std::string(ZT_EXE) + command.substr(5) + " -q 2>&1");
  ASSERT_EQ(pasted.code, 0) << command << "\n" << pasted.out;
  const std::string same = "\"SELECT (SELECT group_concat(value, ' ') FROM (SELECT value FROM counter_v WHERE rank = 0 AND "
                           "name = 'loss' ORDER BY t)), "
                           "count(*), sum(bytes), group_concat(DISTINCT name) FROM allocation_v\"";
  Result a = run_zt("db sql " + trace + " " + same), b = run_zt("db sql " + dir.file("pasted.db") + " " + same);
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_EQ(a.out, b.out) << command;
}

// zt demo --device cuda on a machine without a GPU is refused before it starts (one line, exit 2),
// not after a banner that says "A GPU is used" and run 1's failure.
TEST(CliOutputs, TheDemoOnCudaWithoutAGpuIsRefusedBeforeItStarts) {
  if (fs::exists("/proc/driver/nvidia/version")) GTEST_SKIP() << "an NVIDIA driver is here: the demo would run on it";
  zt::test::TempDir dir;
  Result r = run_zt("demo --device cuda --dir " + dir.file("demo"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.out.rfind("zt: demo --device cuda: no usable GPU here (", 0), 0u) << r.out;
  EXPECT_EQ(r.out.find("A GPU is used"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}
