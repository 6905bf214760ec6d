// bench/gpu_compare on the simulated GPU (--device sim, tiny preset, FSDP2 skipped): the script's
// whole path except what needs a GPU or torch runs on every CI run, so a Python error or a change
// of a trace's phase names shows here and not first in a GPU session: the run, the trace's
// analysis (the step breakdown, the bound's terms), the report files, --profile's `zt db kernels`
// of the simulated GPU's passes, and --analyze of the same trace. Likewise bench/gpu_session, the
// GPU session's one prepared command (its steps through gpu_compare, its budget, its refusals).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "../test_util.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// The interpreter CMake found (scripts/setup installs python3) running a script of bench/.
std::string bench_script(const char* name) {
  return quoted(ZT_PYTHON3) + " " + quoted(std::string(ZT_SOURCE_DIR) + "/bench/" + name);
}
std::string gpu_compare() { return bench_script("gpu_compare"); }

#define REQUIRE_PYTHON()                                                        \
  if (std::string(ZT_PYTHON3).empty()) GTEST_SKIP() << "no python3 was found when configuring"

// bench/gpu_session on the simulated GPU with `args`, its files in `out`: its summary.json (null,
// and a failure, when it did not exit 0); what it printed in *printed.
nlohmann::json gpu_session(const std::string& args, const std::string& out, std::string* printed = nullptr) {
  const zt::test::CommandResult r = zt::test::run_command(bench_script("gpu_session") + " --device sim --build " +
                                                          quoted(ZT_BINARY_DIR) + " --out " + quoted(out) + " " +
                                                          args + " 2>&1");
  if (printed) *printed = r.out;
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("Traceback"), std::string::npos) << r.out;
  return r.code == 0 ? nlohmann::json::parse(read_file(out + "/summary.json")) : nlohmann::json();
}

}  // namespace

TEST(GpuCompare, RunsProfilesAndAnalyzesOnTheSimulatedGpu) {
  REQUIRE_PYTHON();
  zt::test::TempDir dir;
  const std::string out = dir.file("out");
  const zt::test::CommandResult r =
      zt::test::run_command(gpu_compare() + " --device sim --profile --skip-fsdp2 --no-build --build " +
                            quoted(ZT_BINARY_DIR) + " --steps 3 '--zt-args=--overlap-update --grad-partition-dtype compute' --out " + quoted(out) + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("Traceback"), std::string::npos) << r.out;

  const nlohmann::json j = nlohmann::json::parse(read_file(out + "/summary.json"));
  ASSERT_EQ(j["presets"].size(), 1u);
  const nlohmann::json& p = j["presets"][0];
  EXPECT_EQ(p["model"], "tiny");
  EXPECT_EQ(p["world_size"], 1);
  EXPECT_GT(p["step_s"].get<double>(), 0.0);
  EXPECT_GT(p["tokens_per_s"].get<double>(), 0.0);
  EXPECT_NE(p["settings"].get<std::string>().find("overlapped update"), std::string::npos) << p["settings"];
  EXPECT_NE(p["settings"].get<std::string>().find("bf16 grad partitions"), std::string::npos) << p["settings"];
  // The run's own AdamW pass a step (its "adamw" phases), beside the bound's.
  ASSERT_TRUE(p["adamw_pass_s"].is_number()) << p;
  EXPECT_GT(p["adamw_pass_s"].get<double>(), 0.0);
  // The set-up before the first step, from the trace.
  ASSERT_TRUE(p["setup_s"].is_number()) << p;
  EXPECT_GT(p["setup_s"].get<double>(), 0.0);
  EXPECT_NE(r.out.find("our AdamW ms"), std::string::npos) << r.out;
  // bench_gpu_limits is built where the CUDA toolkit is; where it measured CPU AdamW, the bound has that term.
  if (j["limits"].is_object() && j["limits"].contains("cpu_adam") && j["limits"]["cpu_adam"].contains("params_per_s")) {
    ASSERT_TRUE(p["bound_adam_s"].is_number()) << p;
    EXPECT_GT(p["bound_adam_s"].get<double>(), 0.0);
    // ... at the rate of the AdamW the run does: on bf16 gradient partitions.
    if (j["limits"]["cpu_adam"].contains("bf16_grads_params_per_s")) {
      EXPECT_DOUBLE_EQ(p["bound_adam_s"].get<double>(),
                       p["params"].get<double>() / j["limits"]["cpu_adam"]["bf16_grads_params_per_s"].get<double>());
    }
  }
  EXPECT_NE(read_file(out + "/summary.md").find("| tiny |"), std::string::npos);

  // --profile: the report of the simulated GPU's passes over the timed steps (2 warm-up, 3 timed).
  const std::string kernels = read_file(out + "/tiny/kernels.txt");
  EXPECT_NE(kernels.find("kernels of rank 0 on cuda:0, steps 2-3"), std::string::npos) << kernels;
  for (const char* pass : {"block_forward", "block_backward", "head_forward_backward", "GPU idle by host phase"})
    EXPECT_NE(kernels.find(pass), std::string::npos) << pass << " in\n" << kernels;
  EXPECT_NE(r.out.find("GPU busy"), std::string::npos) << r.out;

  // --analyze of the same trace gives the same step time.
  const zt::test::CommandResult a = zt::test::run_command(gpu_compare() + " --analyze " + quoted(out + "/tiny/trace.db") +
                                                          " --out " + quoted(dir.file("analyze")) + " 2>&1");
  ASSERT_EQ(a.code, 0) << a.out;
  const nlohmann::json ja = nlohmann::json::parse(read_file(dir.file("analyze") + "/summary.json"));
  ASSERT_EQ(ja["presets"].size(), 1u);
  EXPECT_DOUBLE_EQ(ja["presets"][0]["step_s"].get<double>(), p["step_s"].get<double>());
}

// A partial offload (--offload-ratio 0.5 on tiny: block1 and final_ln offloaded, the embeddings and
// block0 updated on the device): the bound's CPU AdamW and transfers count the offloaded modules'
// parameters only (49984 + 128: the bytes the run moved down, too), and the settings say so.
TEST(GpuCompare, APartialOffloadsBoundCountsOnlyTheOffloadedModules) {
  REQUIRE_PYTHON();
  zt::test::TempDir dir;
  const std::string out = dir.file("ratio");
  const zt::test::CommandResult r = zt::test::run_command(
      gpu_compare() + " --device sim --skip-fsdp2 --no-limits --no-build --build " + quoted(ZT_BINARY_DIR) +
      " --steps 3 '--zt-args=--offload-ratio 0.5' --out " + quoted(out) + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json p = nlohmann::json::parse(read_file(out + "/summary.json"))["presets"][0];
  EXPECT_DOUBLE_EQ(p["offload_ratio"].get<double>(), 0.5) << p;
  EXPECT_EQ(p["host_optimizer_params"].get<int64_t>(), 49984 + 128) << p;
  EXPECT_DOUBLE_EQ(p["d2h_min_bytes"].get<double>(), 2.0 * (49984 + 128)) << p;
  EXPECT_DOUBLE_EQ(p["d2h_trace_bytes"].get<double>(), p["d2h_min_bytes"].get<double>()) << p;
  EXPECT_NE(p["settings"].get<std::string>().find("offload ratio 0.5"), std::string::npos) << p["settings"];
}

TEST(GpuCompare, BadArgumentsAreRefused) {
  REQUIRE_PYTHON();
  const zt::test::CommandResult r = zt::test::run_command(gpu_compare() + " --device sim --models 7B --no-build 2>&1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--models: '7B' is not one of"), std::string::npos) << r.out;
  const zt::test::CommandResult m = zt::test::run_command(gpu_compare() + " --analyze /nonexistent/t.db 2>&1");
  EXPECT_NE(m.code, 0);
  EXPECT_NE(m.out.find("/nonexistent/t.db"), std::string::npos) << m.out;
  // A zero count was replaced by the default, and a missing --limits file ended in a traceback.
  const zt::test::CommandResult z = zt::test::run_command(gpu_compare() + " --device sim --no-build --micro-batch 0 2>&1");
  EXPECT_EQ(z.code, 2) << z.out;
  EXPECT_NE(z.out.find("--micro-batch 0: at least 1"), std::string::npos) << z.out;
  const zt::test::CommandResult l =
      zt::test::run_command(gpu_compare() + " --analyze /nonexistent/t.db --limits /nonexistent/limits.json 2>&1");
  EXPECT_NE(l.code, 0);
  EXPECT_NE(l.out.find("--limits /nonexistent/limits.json: No such file or directory"), std::string::npos) << l.out;
  EXPECT_EQ(l.out.find("Traceback"), std::string::npos) << l.out;
}

// The CPU benchmarks read their options strictly (bench_util.h Options): an unknown option or a
// value that is not a number is refused with the usage, exit 2 (they ran with defaults, exit 0;
// bench_ckpt --ranks abc aborted).
TEST(BenchOptions, UnknownOptionsAndBadValuesAreRefused) {
  const std::string bench = std::string(ZT_BINARY_DIR) + "/bench/";
  const zt::test::CommandResult u = zt::test::run_command(bench + "bench_landing --numel 1000 --bogus 2>&1");
  EXPECT_EQ(u.code, 2) << u.out;
  EXPECT_NE(u.out.find("'--bogus': not an option of this benchmark"), std::string::npos) << u.out;
  EXPECT_NE(u.out.find("usage: bench_landing"), std::string::npos) << u.out;
  const zt::test::CommandResult v = zt::test::run_command(bench + "bench_ckpt --ranks abc 2>&1");
  EXPECT_EQ(v.code, 2) << v.out;
  EXPECT_NE(v.out.find("--ranks 'abc': a whole number from 1 to 64"), std::string::npos) << v.out;
  const zt::test::CommandResult d = zt::test::run_command(bench + "bench_landing --dtype fp8 2>&1");
  EXPECT_EQ(d.code, 2) << d.out;
  EXPECT_NE(d.out.find("--dtype 'fp8': one of bf16, fp16"), std::string::npos) << d.out;
  const zt::test::CommandResult h = zt::test::run_command(bench + "bench_allocator --help 2>&1");
  EXPECT_EQ(h.code, 0) << h.out;
  EXPECT_NE(h.out.find("usage: bench_allocator [--iters N]"), std::string::npos) << h.out;
}

TEST(GpuSession, EveryStepRunsOnTheSimulatedGpuAndTheRowsSayWhatChanged) {
  REQUIRE_PYTHON();
  zt::test::TempDir dir;
  const std::string out = dir.file("session");
  std::string printed;
  const nlohmann::json j = gpu_session("", out, &printed);
  ASSERT_TRUE(j.is_object());
  std::map<std::string, nlohmann::json> rows, steps;
  for (const auto& row : j["rows"]) rows[row["step"].get<std::string>()] = row;
  for (const auto& st : j["steps"]) steps[st["step"].get<std::string>()] = st;
  // Every model step left a row with a step time, each run of gpu_compare with the tiny preset.
  for (const char* name : {"350M-early", "1.5B-early", "350M-overlap", "350M-early-narrow", "350M-early-nice", "350M-early-adam8", "350M", "350M-ratio", "350M-bf16grad", "350M-nowiden", "350M-adamall", "350M-narrowrank", "350M-static", "350M-latewb",
                           "350M-blocksync",
                           "350M-interleave",
                           "1.5B", "124M"}) {
    ASSERT_TRUE(rows.count(name)) << name << " has no row:\n" << printed;
    EXPECT_EQ(rows[name]["model"], "tiny") << name;
    EXPECT_GT(rows[name]["step_ms"].get<double>(), 0.0) << name;
    EXPECT_GT(rows[name]["adamw_mparam_s"].get<double>(), 0.0) << name;
    EXPECT_GT(rows[name]["setup_s"].get<double>(), 0.0) << name;
    EXPECT_EQ(steps[name]["rc"], 0) << name;
  }
  // Each variant changed what it says it changes (the trace's own settings, or the environment).
  EXPECT_NE(rows["350M-bf16grad"]["settings"].get<std::string>().find("bf16 grad partitions"), std::string::npos);
  EXPECT_NE(rows["350M-interleave"]["settings"].get<std::string>().find("pinned interleaved"), std::string::npos);
  EXPECT_NE(rows["350M-ratio"]["settings"].get<std::string>().find("offload ratio 0.5"), std::string::npos)
      << rows["350M-ratio"];
  // The ordinary update's steps: AdamW during backward, and the overlapped update without it (A/B).
  EXPECT_NE(rows["350M-early"]["settings"].get<std::string>().find("overlapped update, AdamW in backward"),
            std::string::npos)
      << rows["350M-early"];
  EXPECT_NE(rows["1.5B-early"]["settings"].get<std::string>().find("AdamW in backward"), std::string::npos);
  EXPECT_EQ(rows["350M-overlap"]["settings"].get<std::string>().find("AdamW in backward"), std::string::npos);
  EXPECT_NE(rows["350M-overlap"]["settings"].get<std::string>().find("overlapped update"), std::string::npos);
  EXPECT_TRUE(rows["350M-early-narrow"]["env"].contains("ZT_RANK_THREADS_BESIDE")) << rows["350M-early-narrow"];
  EXPECT_EQ(rows["350M-early-nice"]["env"].value("ZT_ADAM_NICE", ""), "10") << rows["350M-early-nice"];
  // ... and never the settings the delayed-update steps after them take.
  EXPECT_EQ(rows["1.5B"]["settings"].get<std::string>().find("overlapped"), std::string::npos) << rows["1.5B"];
  // A partial offload is never the settings the later steps take (FSDP2 offloads everything).
  EXPECT_EQ(rows["1.5B"]["settings"].get<std::string>().find("offload ratio"), std::string::npos) << rows["1.5B"];
  EXPECT_TRUE(rows["350M-nowiden"]["env"].contains("ZT_ADAM_WAIT_THREADS")) << rows["350M-nowiden"];
  EXPECT_EQ(rows["350M-nowiden"]["env"]["ZT_ADAM_WAIT_THREADS"], rows["350M-nowiden"]["env"]["ZT_ADAM_THREADS"]);
  EXPECT_TRUE(rows["350M-narrowrank"]["env"].contains("ZT_RANK_THREADS_BESIDE")) << rows["350M-narrowrank"];
  EXPECT_EQ(rows["350M-static"]["env"].value("ZT_CPU_ADAM_SCHEDULE", ""), "static") << rows["350M-static"];
  EXPECT_EQ(rows["350M-latewb"]["env"].value("ZT_EARLY_WRITE_BACK", ""), "0") << rows["350M-latewb"];
  EXPECT_EQ(rows["350M-blocksync"]["env"].value("ZT_CUDA_SYNC", ""), "blocking") << rows["350M-blocksync"];
  EXPECT_EQ(rows["350M"]["settings"].get<std::string>().find("bf16 grad partitions"), std::string::npos);
  // The CPU AdamW's tests ran, the GPU tests said why not, and the limits were measured once and
  // used where bench_gpu_limits is built (with the CUDA toolkit); elsewhere no step measures them.
  EXPECT_NE(steps["350M-early-bf16"]["skipped"].get<std::string>().find("computes in fp32"), std::string::npos)
      << steps["350M-early-bf16"];
  EXPECT_EQ(steps["adam-isa"]["rc"], 0);
  EXPECT_NE(steps["gpu-tests"]["skipped"].get<std::string>().find("no GPU"), std::string::npos);
  const std::string log = read_file(out + "/session.log");
  if (std::filesystem::exists(std::string(ZT_BINARY_DIR) + "/bench/bench_gpu_limits")) {
    EXPECT_EQ(steps["limits"]["rc"], 0);
    EXPECT_NE(log.find("--limits " + out + "/limits/limits.json"), std::string::npos) << log;
  } else {
    EXPECT_NE(steps["limits"]["skipped"].get<std::string>().find("not built"), std::string::npos);
    EXPECT_NE(log.find("--no-limits"), std::string::npos) << log;
  }
  EXPECT_EQ(read_file(out + "/350M/gpu_compare.log").find("bench_gpu_limits"), std::string::npos);  // not measured again
  EXPECT_NE(log.find("350M-nowiden: ZT_ADAM_THREADS="), std::string::npos) << log;
  EXPECT_NE(read_file(out + "/summary.md").find("| 350M-bf16grad | tiny |"), std::string::npos);
}

TEST(GpuSession, StepsThatDoNotFitTheBudgetAreSkippedRunsCutShortAreMarkedBadArgumentsRefused) {
  REQUIRE_PYTHON();
  zt::test::TempDir dir;
  const std::string out = dir.file("session");
  // The simulated GPU's estimates are a tenth of the GPU's (limits 9 s, 350M 9 s, 1.5B 18 s): with 5 s
  // none fits, and each says so.
  const nlohmann::json j = gpu_session("--budget 5 --only limits,350M,1.5B", out);
  ASSERT_EQ(j["steps"].size(), 3u) << j;
  for (int i : {0, 1, 2}) EXPECT_NE(j["steps"][i]["skipped"].get<std::string>().find("does not fit"), std::string::npos) << j;
  EXPECT_TRUE(j["rows"].empty());

  // A run that outlasts its share of the time left (gpu_compare's --timeout, half of it) is killed;
  // what its trace holds is still a row, marked as cut short.
  const std::string cut = dir.file("cut");
  const nlohmann::json jc = gpu_session("--budget 16 --only 350M --steps 1000000", cut);
  ASSERT_EQ(jc["rows"].size(), 1u) << jc;
  EXPECT_FALSE(jc["rows"][0]["complete"].get<bool>()) << jc;
  EXPECT_GT(jc["rows"][0]["step_ms"].get<double>(), 0.0) << jc;
  EXPECT_NE(read_file(cut + "/summary.md").find("| 350M (cut short) |"), std::string::npos);

  const zt::test::CommandResult bad = zt::test::run_command(bench_script("gpu_session") + " --only 350M,7B --plan 2>&1");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("--only: no step 7B"), std::string::npos) << bad.out;
  const zt::test::CommandResult nobuild =
      zt::test::run_command(bench_script("gpu_session") + " --device sim --build /nonexistent/build 2>&1");
  EXPECT_NE(nobuild.code, 0);
  EXPECT_NE(nobuild.out.find("/nonexistent/build/zt not found"), std::string::npos) << nobuild.out;
  const zt::test::CommandResult nolimits =
      zt::test::run_command(bench_script("gpu_session") + " --limits /nonexistent/limits.json --plan 2>&1");
  EXPECT_EQ(nolimits.code, 2);
  EXPECT_NE(nolimits.out.find("--limits: /nonexistent/limits.json: no such file"), std::string::npos) << nolimits.out;
}
