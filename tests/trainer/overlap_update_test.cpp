// The overlapped update (cfg.overlap_update; zero/engine.h): step s's CPU AdamW runs on a
// background thread, module by module in the forward's order, while step s+1 starts; each module's
// first use waits for its own update. Checked: the losses are the ordinary update's bit for bit
// (stages, ranks, precisions, offload_param, prefetching, clipping, accumulation, fp16 skips); in
// the trace every module's forward starts after its AdamW ended, each step awaits every module,
// and AdamW runs beside the next forward; a save and a resume change nothing; bad settings are
// refused. The GPU code path (an opaque device) is in opaque_device_test.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../test_util.h"
#include "traced_run.h"
#include "train/trainer.h"
#include "zt/db/trace_reader.h"

using namespace zt::trainer;

namespace {

TrainConfig overlap_run(int64_t steps) {
  TrainConfig c = zt::test::tiny_run(steps);
  c.zero.stage = 3;
  c.zero.offload_optimizer = true;
  c.overlap_update = true;
  return c;
}

using zt::test::query_int;

}  // namespace

TEST(OverlapUpdate, LossesAreTheOrdinaryUpdatesBitForBit) {
  struct Case {
    int stage, world;
    bool off_param;
    const char* precision;
    bool prefetch = false;  // a prefetch bucket larger than the model: the prefetch meets updates due
    int64_t persistence = 0;
  };
  for (const Case& k : {Case{1, 1, false, "fp32"}, Case{2, 2, false, "bf16"}, Case{3, 2, false, "fp32", false, -1},
                        Case{3, 2, true, "bf16", true}, Case{3, 4, false, "bf16", true}, Case{3, 2, true, "fp16"}}) {
    SCOPED_TRACE("stage " + std::to_string(k.stage) + ", " + std::to_string(k.world) + " ranks, " + k.precision +
                 (k.off_param ? ", offload_param" : "") + (k.prefetch ? ", prefetching" : "") +
                 (k.persistence < 0 ? ", some whole modules" : ""));
    TrainConfig c = overlap_run(8);
    c.zero.stage = k.stage;
    c.world_size = k.world;
    c.zero.offload_param = k.off_param;
    c.precision = k.precision;
    c.zero.param_persistence_threshold = k.persistence;
    if (k.prefetch) c.zero.prefetch_bucket_size = c.zero.max_live_parameters = int64_t(1) << 30;
    c.grad_accum = 2;
    c.grad_clip = 0.5;  // active on tiny: the scale reaches the partitions before AdamW reads them
    if (std::string(k.precision) == "fp16") {
      c.zero.initial_scale_power = 20;  // overflows, then skipped steps: no update to await
      c.zero.hysteresis = 1;
      c.zero.loss_scale_window = 1;
    }
    TrainConfig plain = c;
    plain.overlap_update = false;
    const std::vector<double> want = zt::test::train_losses(plain);
    EXPECT_EQ(zt::test::train_losses(c), want);
  }
}

// In the trace (one rank, bf16, offload_param, prefetching; 4 tokens a step, so that AdamW takes
// about as long as the forward): every module's first use in step s (a fetch, prefetch or
// forward marker) starts after its "adamw" of step s-1 ended; steps 1-14 await every module once,
// step 15 twice (the end of the run awaits its own update); and some AdamW of step s ran while a
// forward of step s+1 did (up to ten runs: on a loaded 2-core machine the background thread may
// not get a core in time). One rank: with two, each fetch's all-gather also waits for the other
// rank's AdamW, and on 2 cores four threads share them.
TEST(OverlapUpdate, EachModuleWaitsForItsOwnAdamWAndTheRestRunsBeside) {
  zt::test::TempDir dir;
  constexpr int64_t kLast = 15;
  TrainConfig c = overlap_run(kLast + 1);
  c.micro_batch = 1;
  // Long enough a forward for the OS to run the background AdamW beside it: in a world of one a
  // fetch no longer waits in an all-gather (the shard is the module), the rank thread's last pause.
  c.seq_len = 64;
  c.precision = "bf16";
  c.zero.offload_param = true;
  c.zero.prefetch_bucket_size = c.zero.max_live_parameters = int64_t(1) << 30;
  TrainConfig plain = c;
  plain.overlap_update = false;
  const std::vector<double> want = zt::test::train_losses(plain);
  int64_t beside = 0;
  for (int attempt = 0; attempt < 10 && beside == 0; ++attempt) {
    zt::test::TracedRun run = zt::test::train_traced(c, dir.file("o" + std::to_string(attempt) + ".db"));
    ASSERT_TRUE(run.status.ok()) << run.status.message();
    ASSERT_NE(run.reader, nullptr);
    EXPECT_EQ(run.summary.losses, want);
    zt::db::TraceReader& r = *run.reader;
    const int64_t modules = query_int(r, "SELECT count(DISTINCT name) FROM marker_v WHERE rank = 0 AND name LIKE 'adamw %'");
    ASSERT_GT(modules, 2);
    // Each module's first use in step s: its first "fetch", "prefetch" or "forward" marker (bf16:
    // every fetch upcasts, so each module has a fetch marker every step).
    const std::string uses =
        "WITH a AS (SELECT step, substr(name, 7) AS module, t_end FROM marker_v WHERE rank = 0 AND name LIKE 'adamw %'), "
        "m AS (SELECT step, t_start, CASE WHEN name LIKE 'fetch %' THEN substr(name, 7) WHEN name LIKE 'prefetch %' THEN "
        "substr(name, 10) ELSE substr(name, 9) END AS module FROM marker_v WHERE rank = 0 AND (name LIKE 'fetch %' OR "
        "name LIKE 'prefetch %' OR name LIKE 'forward %')), u AS (SELECT step, module, min(t_start) AS t FROM m GROUP BY "
        "step, module) SELECT count(*), coalesce(sum(u.t < a.t_end), 0) FROM a JOIN u ON u.module = a.module AND "
        "u.step = a.step + 1";
    zt::db::QueryResult q;
    ASSERT_TRUE(r.query(uses, &q).ok());
    EXPECT_EQ(std::stoll(q.rows[0][0]), modules * kLast) << "steps 1-15, every module";
    EXPECT_EQ(std::stoll(q.rows[0][1]), 0) << "a module's forward started before its AdamW ended";
    for (int64_t s = 1; s <= kLast; ++s)
      EXPECT_EQ(query_int(r, "SELECT count(*) FROM (SELECT name FROM marker_v WHERE rank = 0 AND name LIKE 'await update %' "
                            "AND step = " + std::to_string(s) + " GROUP BY name HAVING count(*) = " +
                                std::to_string(s < kLast ? 1 : 2) + ")"),
                modules)
          << "step " << s;
    beside = query_int(r, "SELECT count(DISTINCT a.id) FROM marker_v a JOIN marker_v f ON f.rank = a.rank AND f.step = "
                         "a.step + 1 AND f.name LIKE 'forward %' AND a.t_start < f.t_end AND f.t_start < a.t_end "
                         "WHERE a.rank = 0 AND a.name LIKE 'adamw %'");
  }
  EXPECT_GT(beside, 0) << "no AdamW ran beside the next step's forward (10 runs)";
}

// The update in flight is finished by a save (every rank, collectively) and at the end of the run:
// a run that saves is the run that does not, and a run resumed from a save goes on bit for bit.
TEST(OverlapUpdate, ASaveAndAResumeChangeNothing) {
  zt::test::TempDir tmp;
  TrainConfig c = overlap_run(6);
  c.world_size = 2;
  c.precision = "bf16";
  c.zero.param_persistence_threshold = -1;  // some whole modules: their write-back all-gathers
  const std::vector<double> unsaved = zt::test::train_losses(c);
  c.checkpoint_dir = tmp.file("ckpt");
  c.save_every = 2;
  EXPECT_EQ(zt::test::train_losses(c), unsaved);
  c.checkpoint_dir = tmp.file("stopped");
  const zt::test::StopAndResume run = zt::test::stop_and_resume(c, 4);
  EXPECT_EQ(run.before, std::vector<double>(unsaved.begin(), unsaved.begin() + 4));
  EXPECT_EQ(run.after, std::vector<double>(unsaved.begin() + 4, unsaved.end()));
}

// A module's CPU AdamW that raises (the fault optim.cpu_adam_error; tiny has 4 modules, so call 10
// of a rank is block0's AdamW of step 2) ends the run with that error, and nothing hangs: on the
// rank thread (the ordinary update), or on the background thread (overlapped, delayed), where the
// rank thread meets it at its next wait in step 3; on one rank, or on one of two (the other rank is
// aborted, not left waiting in a collective).
TEST(OverlapUpdate, AnAdamWErrorOnTheBackgroundThreadEndsTheRun) {
  for (int world : {1, 2})
    for (const char* mode : {"ordinary", "overlapped", "delayed"}) {
      SCOPED_TRACE(std::string(mode) + ", " + std::to_string(world) + " ranks");
      TrainConfig c = overlap_run(6);
      c.world_size = world;
      c.overlap_update = std::string(mode) == "overlapped";
      c.delayed_update = std::string(mode) == "delayed" ? 0 : -1;
      c.faults = {"optim.cpu_adam_error[rank=" + std::to_string(world - 1) + ",call=10]=return"};
      TrainSummary s;
      const zt::Status st = train(c, nullptr, nullptr, &s);
      ASSERT_FALSE(st.ok());
      // The kernel's own refusal (the fault hands it a step count of 0), not a text the fault wrote.
      EXPECT_NE(st.message().find("CPU AdamW of block0 at step 2 failed: cpu_adamw_step: step counts from 1, got 0"),
                std::string::npos)
          << st.message();
      EXPECT_NE(st.message().find(std::string("step ") + (std::string(mode) == "ordinary" ? "2" : "3")), std::string::npos)
          << st.message();
    }
  // The trace explains it with an error row (it had only the run's exit detail).
  zt::test::TempDir dir;
  TrainConfig c = overlap_run(6);
  c.faults = {"optim.cpu_adam_error[call=10]=return"};
  zt::test::TracedRun run = zt::test::train_traced(c, dir.file("adam.db"));
  ASSERT_FALSE(run.status.ok());
  zt::db::QueryResult q;
  ASSERT_TRUE(run.reader->query("SELECT kind, site, step, message FROM error", &q).ok());
  ASSERT_EQ(q.rows.size(), 1u);
  EXPECT_EQ(q.rows[0], (std::vector<std::string>{"cpu_adam_error", "adamw block0", "2",
                                                  "CPU AdamW of block0 at step 2 failed: cpu_adamw_step: step counts "
                                                  "from 1, got 0"}));
  // The fault row says what it did to the kernel; the error row is the kernel's.
  ASSERT_TRUE(run.reader->query("SELECT name, details FROM fault", &q).ok());
  ASSERT_EQ(q.rows.size(), 1u);
  EXPECT_EQ(q.rows[0][0], "optim.cpu_adam_error");
  EXPECT_NE(q.rows[0][1].find("handed step count 0"), std::string::npos) << q.rows[0][1];
}

TEST(OverlapUpdate, BadSettingsAreRefused) {
  TrainConfig c = zt::test::tiny_run(2);
  c.overlap_update = true;
  zt::Status st = validate(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("overlap_update runs CPU AdamW beside the next step's forward: it needs the optimizer on "
                              "the host"),
            std::string::npos)
      << st.message();
  c.zero.stage = 2;
  c.zero.offload_optimizer = true;
  EXPECT_TRUE(validate(c).ok());
  c.delayed_update = 1;
  st = validate(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("overlap_update and delayed_update are two ways of running AdamW beside the next step"),
            std::string::npos)
      << st.message();
}
