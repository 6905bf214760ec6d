// AdamW during backward (cfg.adam_in_backward with the overlapped update; zero/engine.h): each
// module's CPU AdamW starts once its gradient partition has landed during backward, out of place, and
// stands only where the step's norm says the ordinary update is the same. Checked: the losses are the
// ordinary update's bit for bit (stages 2-3, 1 to 4 ranks, precisions, accumulation, offload_param,
// partitions kept in the compute dtype, clipping that acts every step, some steps or never, fp16
// steps skipped on overflow); in the trace AdamW runs inside backward and every module's first use
// in the next step comes after its AdamW; a save and a resume change nothing; an AdamW that raises
// during backward ends the run with its error row; the second state is counted; bad settings are
// refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../test_util.h"
#include "traced_run.h"
#include "model/gpt2.h"
#include "train/trainer.h"
#include "zt/db/trace_reader.h"

using namespace zt::trainer;

namespace {

TrainConfig early_run(int64_t steps) {
  TrainConfig c = zt::test::tiny_run(steps);
  c.zero.stage = 3;
  c.zero.offload_optimizer = true;
  c.overlap_update = true;
  c.adam_in_backward = true;
  return c;
}

TrainConfig ordinary(TrainConfig c) {
  c.overlap_update = false;
  c.adam_in_backward = false;
  return c;
}

using zt::test::query_int;

}  // namespace

TEST(AdamInBackward, LossesAreTheOrdinaryUpdatesBitForBit) {
  struct Case {
    int stage, world;
    const char* precision;
    double clip;  // 0: off; 0.5 clips every step on tiny; 3 some steps
    int64_t accum = 1;
    bool off_param = false;
    bool compute_partitions = false;
    int64_t persistence = 0;
  };
  for (const Case& k :
       {Case{3, 1, "bf16", 0}, Case{3, 1, "fp32", 0}, Case{2, 2, "bf16", 0, 2}, Case{3, 4, "bf16", 0, 1, true},
        Case{3, 2, "bf16", 0.5, 2}, Case{3, 2, "bf16", 3.0, 1, false, true}, Case{3, 2, "fp32", 3.0, 1, true, false, -1},
        Case{3, 4, "bf16", 1e9, 2, true, true}, Case{3, 2, "fp16", 0, 1, true}}) {
    SCOPED_TRACE("stage " + std::to_string(k.stage) + ", " + std::to_string(k.world) + " ranks, " + k.precision +
                 ", clip " + std::to_string(k.clip) + ", accumulation " + std::to_string(k.accum) +
                 (k.off_param ? ", offload_param" : "") + (k.compute_partitions ? ", compute-dtype partitions" : "") +
                 (k.persistence < 0 ? ", some whole modules" : ""));
    TrainConfig c = early_run(8);
    c.zero.stage = k.stage;
    c.world_size = k.world;
    c.precision = k.precision;
    c.grad_clip = k.clip;
    c.grad_accum = k.accum;
    c.zero.offload_param = k.off_param;
    c.zero.param_persistence_threshold = k.persistence;
    if (k.compute_partitions) c.grad_partition_dtype = "compute";
    if (std::string(k.precision) == "fp16") {
      c.zero.initial_scale_power = 20;  // overflows, then skipped steps: the early updates thrown away
      c.zero.hysteresis = 1;
      c.zero.loss_scale_window = 1;
    }
    const std::vector<double> want = zt::test::train_losses(ordinary(c));
    EXPECT_EQ(zt::test::train_losses(c), want);
  }
}

// In the trace (one rank, bf16, no clipping): some module's AdamW of step s starts before step s's
// backward phase ends (up to ten runs: on a loaded 2-core machine the background thread may not get
// a core before backward is over), and no module's first use in step s+1 (fetch or forward marker)
// starts before its AdamW of step s ended. With clipping every step, each step's update is the
// overlapped update's pass: every module has an AdamW that starts after its step's backward ended.
TEST(AdamInBackward, AdamWRunsInsideBackwardAndTheNextForwardWaitsForIt) {
  zt::test::TempDir dir;
  constexpr int64_t kSteps = 8;
  TrainConfig c = early_run(kSteps);
  c.precision = "bf16";
  c.seq_len = 16;
  int64_t inside = 0;
  for (int attempt = 0; attempt < 10 && inside == 0; ++attempt) {
    zt::test::TracedRun run = zt::test::train_traced(c, dir.file("e" + std::to_string(attempt) + ".db"));
    ASSERT_TRUE(run.status.ok()) << run.status.message();
    zt::db::TraceReader& r = *run.reader;
    inside = query_int(r, "SELECT count(*) FROM marker_v a JOIN marker_v b ON b.rank = a.rank AND b.step = a.step AND "
                          "b.name = 'backward' WHERE a.rank = 0 AND a.name LIKE 'adamw %' AND a.t_start < b.t_end");
    const std::string late =
        "WITH a AS (SELECT step, substr(name, 7) AS module, t_end FROM marker_v WHERE rank = 0 AND name LIKE 'adamw %'), "
        "m AS (SELECT step, t_start, CASE WHEN name LIKE 'fetch %' THEN substr(name, 7) ELSE substr(name, 9) END AS "
        "module FROM marker_v WHERE rank = 0 AND (name LIKE 'fetch %' OR name LIKE 'forward %')), u AS (SELECT step, "
        "module, min(t_start) AS t FROM m GROUP BY step, module) SELECT count(*), coalesce(sum(u.t < a.t_end), 0) FROM a "
        "JOIN u ON u.module = a.module AND u.step = a.step + 1";
    zt::db::QueryResult q;
    ASSERT_TRUE(r.query(late, &q).ok());
    const int64_t modules = query_int(r, "SELECT count(DISTINCT name) FROM marker_v WHERE rank = 0 AND name LIKE 'adamw %'");
    EXPECT_EQ(std::stoll(q.rows[0][0]), modules * (kSteps - 1));
    EXPECT_EQ(std::stoll(q.rows[0][1]), 0) << "a module's next forward started before its AdamW ended";
  }
  EXPECT_GT(inside, 0) << "no AdamW started inside its step's backward (10 runs)";

  c.grad_clip = 0.5;  // clips every step on tiny
  zt::test::TracedRun run = zt::test::train_traced(c, dir.file("clipped.db"));
  ASSERT_TRUE(run.status.ok()) << run.status.message();
  zt::db::TraceReader& r = *run.reader;
  const int64_t modules = query_int(r, "SELECT count(DISTINCT name) FROM marker_v WHERE rank = 0 AND name LIKE 'adamw %'");
  EXPECT_EQ(query_int(r, "SELECT count(*) FROM (SELECT DISTINCT a.step, a.name FROM marker_v a JOIN marker_v b ON "
                         "b.rank = a.rank AND b.step = a.step AND b.name = 'backward' WHERE a.rank = 0 AND a.name LIKE "
                         "'adamw %' AND a.t_start > b.t_end)"),
            modules * kSteps);
  // The pass stops taking modules once the partitions landed make the step clip (on tiny at 0.5,
  // before the last one lands): no step ran every module's AdamW twice.
  EXPECT_EQ(query_int(r, "SELECT count(*) FROM (SELECT step FROM marker_v WHERE rank = 0 AND name LIKE 'adamw %' "
                         "GROUP BY step HAVING count(*) >= " + std::to_string(2 * modules) + ")"),
            0);
}

TEST(AdamInBackward, ASaveAndAResumeChangeNothing) {
  zt::test::TempDir tmp;
  TrainConfig c = early_run(6);
  c.world_size = 2;
  c.precision = "bf16";
  c.grad_clip = 3.0;  // some steps clip
  c.zero.param_persistence_threshold = -1;  // some whole modules: their write-back all-gathers
  const std::vector<double> unsaved = zt::test::train_losses(c);
  EXPECT_EQ(unsaved, zt::test::train_losses(ordinary(c)));
  c.checkpoint_dir = tmp.file("ckpt");
  c.save_every = 2;
  EXPECT_EQ(zt::test::train_losses(c), unsaved);
  c.checkpoint_dir = tmp.file("stopped");
  const zt::test::StopAndResume run = zt::test::stop_and_resume(c, 4);
  EXPECT_EQ(run.before, std::vector<double>(unsaved.begin(), unsaved.begin() + 4));
  EXPECT_EQ(run.after, std::vector<double>(unsaved.begin() + 4, unsaved.end()));
}

// The fault optim.cpu_adam_error on the early pass (tiny's 4 modules: call 10 of a rank is step 2's
// second AdamW): the run fails with that error and its error row, on one rank and on one of two
// (the other is aborted, not left waiting), and nothing hangs.
TEST(AdamInBackward, AnAdamWErrorDuringBackwardEndsTheRunWithItsErrorRow) {
  for (int world : {1, 2}) {
    SCOPED_TRACE(std::to_string(world) + " ranks");
    zt::test::TempDir dir;
    TrainConfig c = early_run(6);
    c.world_size = world;
    c.faults = {"optim.cpu_adam_error[rank=" + std::to_string(world - 1) + ",call=10]=return"};
    zt::test::TracedRun run = zt::test::train_traced(c, dir.file("adam.db"));
    ASSERT_FALSE(run.status.ok());
    EXPECT_NE(run.status.message().find("at step 2 failed: cpu_adamw_step_grads_into: step counts from 1, got 0"),
              std::string::npos)
        << run.status.message();
    zt::db::QueryResult q;
    ASSERT_TRUE(run.reader->query("SELECT kind, step FROM error WHERE kind = 'cpu_adam_error'", &q).ok());
    ASSERT_EQ(q.rows.size(), 1u);
    EXPECT_EQ(q.rows[0][1], "2");
  }
}

// The second fp32 state: 12 bytes a parameter of this rank's optimizer partition more, on the host.
TEST(AdamInBackward, TheSecondStateIsCountedInTheModelStates) {
  TrainConfig c = early_run(1);
  c.precision = "bf16";
  TrainSummary with, without;
  ASSERT_TRUE(train(c, nullptr, nullptr, &with).ok());
  c.adam_in_backward = false;
  ASSERT_TRUE(train(c, nullptr, nullptr, &without).ok());
  const int64_t P = zt::model::num_params(*zt::model::preset("tiny"));  // one rank: no padding
  EXPECT_EQ(with.model_state_bytes - without.model_state_bytes, 12 * P);
}

TEST(AdamInBackward, BadSettingsAreRefused) {
  TrainConfig c = early_run(2);
  EXPECT_TRUE(validate(c).ok());
  c.overlap_update = false;
  zt::Status st = validate(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("adam_in_backward starts the overlapped update's AdamW during backward: give "
                              "overlap_update too"),
            std::string::npos)
      << st.message();
  c.overlap_update = true;
  c.zero.stage = 1;
  st = validate(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("adam_in_backward needs ZeRO stage 2 or 3"), std::string::npos) << st.message();
}
