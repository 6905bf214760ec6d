// The delayed parameter update (cfg.delayed_update; zero/engine.h): step s's CPU AdamW runs on a
// background thread beside step s+1's forward and backward, which see the weights one update
// behind. Checked against the same schedule written out by hand with the reference model, across
// stages and ranks, in the trace (AdamW beside the next step), at a checkpoint (a sync point: a
// resumed run goes on exactly), and for bad settings. The GPU code path (an opaque device) is in
// opaque_device_test.cpp.
#include <gtest/gtest.h>

#include <omp.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "../test_util.h"
#include "core/backend.h"
#include "data/corpus.h"
#include "model/adamw.h"
#include "model/config.h"
#include "model/gpt2.h"
#include "model/layout.h"
#include "traced_run.h"
#include "train/trainer.h"
#include "zero/background.h"
#include "zt/db/trace_reader.h"

using namespace zt::trainer;

namespace {

// One rank, ZeRO-1 with the optimizer on the host, fp32: the engine's arithmetic is then the
// reference model's, bit for bit.
TrainConfig dpu_run(int64_t steps, int64_t delayed_from) {
  TrainConfig c = zt::test::tiny_run(steps);
  c.zero.stage = 1;
  c.zero.offload_optimizer = true;
  c.delayed_update = delayed_from;
  return c;
}

// The schedule by hand: the whole-model forward/backward of model/gpt2.h at the weights the
// device holds, and the reference AdamW on the master weights. Up to step `from` each update is
// applied before the next step; from it on, step s's update is applied only at step s+1's
// optimizer step, after step s+1's gradients were taken. With c.grad_clip > 0 each step's
// gradient is first multiplied by its clip factor where the norm exceeds it (the squares summed
// module by module in the engine's order, core/backend.h's sum_squares; the factor rounded to fp32
// as the engine's unscale_and_clip_grads does); `clipped` counts those steps. The first
// `fresh_modules` modules (a partial offload's, updated on the accelerator) are never delayed:
// their update is applied at once.
std::vector<double> dpu_by_hand(const TrainConfig& c, int64_t from, int* clipped = nullptr, int fresh_modules = 0) {
  const zt::model::Config mc = *zt::model::preset(c.model);
  const int B = int(c.micro_batch), T = int(c.seq_len);
  const Corpus corpus = synthetic_corpus(c.seed, c.synthetic_bytes);
  const DataPlan plan = plan_data(corpus, T, B, 1, 1);
  DataLoader loader(corpus, plan, c.seed);
  const size_t n = size_t(zt::model::num_params(mc));
  std::vector<float> weights(n), master(n), grads(n), m(n, 0.0f), v(n, 0.0f);
  zt::model::init_params(mc, c.seed, master.data());
  weights = master;
  zt::model::Workspace ws(mc, B, T, false);
  std::vector<int32_t> tokens(size_t(B) * T), targets(size_t(B) * T);
  std::vector<double> losses;
  bool pending = false;
  const std::vector<zt::model::ModuleSpec> table = zt::model::module_table(mc);
  // master -> weights over the modules [lo, hi)
  auto apply = [&](size_t lo, size_t hi) {
    for (size_t k = lo; k < hi && k < table.size(); ++k)
      std::copy_n(master.begin() + table[k].offset, table[k].numel, weights.begin() + table[k].offset);
  };
  const size_t fresh = size_t(fresh_modules);
  for (int64_t s = 0; s < c.steps; ++s) {
    loader.micro_batch(0, s, 0, 0, tokens.data(), targets.data());
    std::fill(grads.begin(), grads.end(), 0.0f);
    losses.push_back(zt::model::forward_backward(ws, weights.data(), tokens.data(), targets.data(), grads.data()));
    if (c.grad_clip > 0) {
      double sq = 0;
      for (const zt::model::ModuleSpec& ms : zt::model::module_table(mc))
        sq += host_ops().sum_squares(grads.data() + ms.offset, ms.numel);
      const double clip = (std::sqrt(sq) + 1e-6) / c.grad_clip;
      if (clip > 1) {
        if (clipped) ++*clipped;
        const float factor = 1.0f / float(clip);
        for (float& g : grads) g *= factor;
      }
    }
    if (pending) apply(fresh, table.size());  // the update of step s-1, applied now
    zt::model::adamw_step(master.data(), grads.data(), m.data(), v.data(), int64_t(n), c.lr, c.beta1, c.beta2, c.eps,
                          c.weight_decay, s + 1);
    apply(0, fresh);
    pending = s >= from;
    if (!pending) apply(fresh, table.size());
  }
  return losses;
}

}  // namespace

// The schedule written out by hand (dpu_by_hand). 20 steps: past step 17, where this
// schedule's loss jumps from 3.00 to 5.94 and back to 2.82 (one-update-stale AdamW at lr 3e-3
// without warm-up or clipping: the engine follows the schedule through it, bit for bit).
TEST(DelayedUpdate, EachGradientIsTakenOneUpdateBehind) {
  constexpr int64_t kSteps = 20, kFrom = 2;
  const TrainConfig c = dpu_run(kSteps, kFrom);
  const std::vector<double> got = zt::test::train_losses(c);

  const std::vector<double> want = dpu_by_hand(c, kFrom);
  EXPECT_EQ(got, want);  // bit for bit

  // And it is a different run from the ordinary one from step kFrom + 1 on, the same before.
  TrainConfig plain = c;
  plain.delayed_update = -1;
  const std::vector<double> ord = zt::test::train_losses(plain);
  ASSERT_EQ(ord.size(), got.size());
  for (int64_t s = 0; s <= kFrom; ++s) EXPECT_EQ(got[size_t(s)], ord[size_t(s)]) << "step " << s;
  EXPECT_NE(got[kFrom + 1], ord[kFrom + 1]);
}

// The same schedule with clipping active on every step: each step's clip factor, from its own norm
// (the squares summed module by module in the engine's order: core/backend.h's sum_squares), reaches
// that step's delayed AdamW, which applies it in its pass (fp32 partitions under offload are not
// scaled in place), bit for bit the reference's gradient scaled by the same fp32 factor first.
TEST(DelayedUpdate, EachStepsClipFactorReachesItsDelayedAdamW) {
  constexpr int64_t kSteps = 8, kFrom = 1;
  TrainConfig c = dpu_run(kSteps, kFrom);
  c.grad_clip = 0.05;  // the tiny model's norms are ~1
  const std::vector<double> got = zt::test::train_losses(c);

  int clipped = 0;
  const std::vector<double> want = dpu_by_hand(c, kFrom, &clipped);
  EXPECT_EQ(clipped, kSteps);
  EXPECT_EQ(got, want);  // bit for bit
}

// A partial offload (offload_ratio 0.5: the embeddings and block0 keep their optimizer state on the
// simulated GPU): those modules' AdamW runs on the accelerator in the step itself, never delayed,
// and only the host modules' update is one step behind: the schedule by hand with the first two
// modules fresh, bit for bit (ZeRO-3, one rank, fp32: the reference's arithmetic), clipping active.
// Unlike the whole delayed update and the ordinary one.
TEST(DelayedUpdate, APartialOffloadDelaysOnlyTheHostModules) {
  constexpr int64_t kSteps = 8, kFrom = 1;
  TrainConfig c = dpu_run(kSteps, kFrom);
  c.zero.stage = 3;
  c.zero.offload_ratio = 0.5;
  c.grad_clip = 0.05;
  const std::vector<double> got = zt::test::train_losses(c);
  int clipped = 0;
  EXPECT_EQ(got, dpu_by_hand(c, kFrom, &clipped, 2));  // bit for bit
  EXPECT_EQ(clipped, kSteps);
  EXPECT_NE(got, dpu_by_hand(c, kFrom, nullptr, 0));
  TrainConfig plain = c;
  plain.delayed_update = -1;
  EXPECT_NE(got, zt::test::train_losses(plain));
  // offload_ratio 0: nothing on the host, nothing to delay: the ordinary run.
  c.zero.offload_ratio = 0;
  plain.zero.offload_ratio = 0;
  EXPECT_EQ(zt::test::train_losses(c), zt::test::train_losses(plain));
}

// Every stage's write-back of the delayed update (the all-gather of whole modules, the host and
// device parameter shards, the sharded ones in bf16 through the update buffers) gives the run of
// one rank with the same global batch, as the ordinary update does.
TEST(DelayedUpdate, StagesAndRanksAgree) {
  TrainConfig ref = dpu_run(8, 0);
  ref.grad_accum = 4;
  const std::vector<double> want = zt::test::train_losses(ref);
  struct Case {
    int stage, world;
    bool off_param;
    const char* precision;
  };
  for (const Case& k : {Case{2, 2, false, "fp32"}, Case{3, 4, true, "fp32"}, Case{3, 2, false, "fp32"},
                        Case{3, 2, true, "bf16"}}) {
    SCOPED_TRACE("stage " + std::to_string(k.stage) + ", " + std::to_string(k.world) + " ranks, " + k.precision +
                 (k.off_param ? ", offload_param" : ""));
    TrainConfig c = dpu_run(8, 0);
    c.world_size = k.world;
    c.grad_accum = 4 / k.world;
    c.zero.stage = k.stage;
    c.zero.offload_param = k.off_param;
    c.zero.param_persistence_threshold = k.stage == 3 && k.world == 2 && !k.off_param ? -1 : 0;  // some whole modules
    c.precision = k.precision;
    zt::test::expect_losses_close(zt::test::train_losses(c), want, std::string(k.precision) == "bf16" ? 2e-2 : 1e-5);
  }
}

// The trace shows the overlap: step s's "adamw <module>" phases (on the background thread) meet
// step s+1's forward, loss or backward phases in time, and each step from the second on applies
// the update before it ("apply delayed update of step s", inside step s+1's optimizer phase).
TEST(DelayedUpdate, AdamRunsBesideTheNextStepInTheTrace) {
  zt::test::TempDir dir;
  TrainConfig c = dpu_run(5, 0);
  c.zero.stage = 3;
  c.zero.offload_param = true;
  c.precision = "bf16";
  const std::vector<double> want = zt::test::train_losses(c);
  // The background thread must get a core while the rank thread runs the next step: on a 2-core
  // machine running other tests it may not, so up to five runs are made.
  int64_t overlapping = 0;
  for (int attempt = 0; attempt < 5 && overlapping == 0; ++attempt) {
    zt::test::TracedRun run = zt::test::train_traced(c, dir.file("d" + std::to_string(attempt) + ".db"));
    ASSERT_TRUE(run.status.ok()) << run.status.message();
    ASSERT_NE(run.reader, nullptr);
    EXPECT_EQ(run.summary.losses, want);  // the trace changes nothing
    zt::db::QueryResult q;
    ASSERT_TRUE(run.reader
                    ->query("SELECT step, name FROM marker_v WHERE rank = 0 AND name LIKE 'apply delayed update%' "
                            "ORDER BY t_start",
                            &q)
                    .ok());
    // Steps 1-4 apply the updates of steps 0-3; step 4's is applied at the end of the run.
    ASSERT_EQ(q.rows.size(), 5u);
    for (int s = 1; s <= 5; ++s)
      EXPECT_EQ(q.rows[size_t(s) - 1], (std::vector<std::string>{std::to_string(std::min(s, 4)),
                                                                  "apply delayed update of step " + std::to_string(s - 1)}));
    ASSERT_TRUE(run.reader
                    ->query("SELECT count(DISTINCT a.id) FROM marker_v a JOIN marker_v f ON f.rank = a.rank AND f.step = "
                            "a.step + 1 AND f.name IN ('forward', 'loss', 'backward') AND a.t_start < f.t_end AND "
                            "f.t_start < a.t_end WHERE a.rank = 0 AND a.name LIKE 'adamw %'",
                            &q)
                    .ok());
    overlapping = std::stoll(q.rows[0][0]);
  }
  EXPECT_GT(overlapping, 0) << "no AdamW phase overlapped the next step's forward or backward (5 runs)";
}

// Overlapped with the parameters offloaded, AdamW writes a sharded module's host shard in place:
// such a module gets no update buffer (one made up front would double the host parameter memory
// offload_param is there to save). Everything sharded: persistence threshold 0.
TEST(DelayedUpdate, OverlappedInPlaceModulesGetNoUpdateBuffer) {
  zt::test::TempDir dir;
  TrainConfig c = dpu_run(2, -1);
  c.overlap_update = true;
  c.zero.stage = 3;
  c.zero.offload_param = true;
  c.zero.param_persistence_threshold = 0;
  c.precision = "bf16";
  zt::test::TracedRun run = zt::test::train_traced(c, dir.file("o.db"));
  ASSERT_TRUE(run.status.ok()) << run.status.message();
  ASSERT_NE(run.reader, nullptr);
  zt::db::QueryResult q;
  ASSERT_TRUE(run.reader
                  ->query("SELECT (SELECT COUNT(*) FROM allocation a JOIN string s ON s.id = a.name_id "
                          "WHERE a.memory_kind = 2 AND s.text LIKE '%.update'), "
                          "(SELECT COUNT(*) FROM allocation a JOIN string s ON s.id = a.name_id WHERE s.text LIKE '%.shard')",
                          &q)
                  .ok());
  EXPECT_EQ(q.rows[0][0], "0") << "pinned update buffers for modules updated in place";
  EXPECT_NE(q.rows[0][1], "0") << "no sharded module: the case is not exercised";
}

// The background update's buffers (two compute-dtype update buffers per module, the spare
// gradient partition) are made with the engine: no pinned segment is added after the first step.
// Made at their first use, they took cached segments the gradient staging had used, and staging
// pinned new ones inside steps 2-4 (the tiny model: 2.82 -> 4.07 MiB over those steps; on an H100
// those steps ran at a third of the later speed).
TEST(DelayedUpdate, NoPinnedSegmentIsAddedAfterTheFirstStep) {
  zt::test::TempDir dir;
  for (bool overlapped : {false, true}) {
    TrainConfig c = dpu_run(6, overlapped ? -1 : 1);
    c.overlap_update = overlapped;
    c.zero.stage = 3;
    c.precision = "bf16";
    zt::test::TracedRun run = zt::test::train_traced(c, dir.file(overlapped ? "o.db" : "d.db"));
    ASSERT_TRUE(run.status.ok()) << run.status.message();
    ASSERT_NE(run.reader, nullptr);
    zt::db::QueryResult q;
    // Pinned segments (memory kind 2, level 1) by the step they were made in.
    ASSERT_TRUE(run.reader
                    ->query("SELECT m.step, COUNT(*) FROM allocation a JOIN marker m ON m.kind = 0 AND m.rank = a.rank "
                            "AND a.t_alloc BETWEEN m.t_start AND m.t_end WHERE a.memory_kind = 2 AND a.level = 1 "
                            "GROUP BY m.step ORDER BY m.step",
                            &q)
                    .ok());
    ASSERT_FALSE(q.rows.empty()) << "no pinned segment made in any step: the query no longer finds them";
    for (const auto& row : q.rows)
      EXPECT_EQ(row[0], "0") << (overlapped ? "overlapped" : "delayed") << ": " << row[1]
                             << " pinned segments made in step " << row[0];
  }
}

// A save applies the update in flight: the saved state is that after the step it is named for,
// and the run goes on from it. So a run resumed from a save continues bit for bit, and a run that
// saves is not the run that does not from the first save on.
// Twice: host parameter shards (offload_param, fp32), and device shards in bf16, whose updates go up
// early into their second shards, swapped in by the save's apply.
TEST(DelayedUpdate, ACheckpointIsASyncPointAndResumesExactly) {
  for (bool device_shards : {false, true}) {
    SCOPED_TRACE(device_shards ? "bf16 device shards (early write-back)" : "fp32 host shards");
    zt::test::TempDir tmp;
    TrainConfig c = dpu_run(6, 0);
    c.world_size = 2;
    c.zero.stage = 3;
    c.zero.offload_param = !device_shards;
    c.zero.param_persistence_threshold = 0;
    if (device_shards) c.precision = "bf16";
    const std::vector<double> unsaved = zt::test::train_losses(c);
    c.checkpoint_dir = tmp.file("ckpt");
    c.save_every = 2;
    const std::vector<double> saved = zt::test::train_losses(c);
    ASSERT_EQ(saved.size(), 6u);
    EXPECT_EQ(std::vector<double>(saved.begin(), saved.begin() + 2), std::vector<double>(unsaved.begin(), unsaved.begin() + 2));
    EXPECT_NE(saved[2], unsaved[2]);  // step 2 saw step 1's update, applied by the save

    // A run that stops after the step-4 save, then resumes from it to step 6.
    c.checkpoint_dir = tmp.file("stopped");
    const zt::test::StopAndResume run = zt::test::stop_and_resume(c, 4);
    EXPECT_EQ(run.before, std::vector<double>(saved.begin(), saved.begin() + 4));
    EXPECT_EQ(run.after, std::vector<double>(saved.begin() + 4, saved.end()));  // bit for bit
  }
}

// fp16 whose loss scale doubles after every good step, so that overflows follow updates: a step
// skipped for an overflow still applies the update in flight, so every update is applied in the
// step after its own (or at the end of the run), never two steps later.
TEST(DelayedUpdate, ASkippedStepStillAppliesTheUpdateInFlight) {
  zt::test::TempDir dir;
  TrainConfig c = dpu_run(16, 0);
  c.zero.stage = 2;
  c.precision = "fp16";
  c.zero.initial_scale_power = 20;
  c.zero.hysteresis = 1;
  c.zero.loss_scale_window = 1;  // the scale doubles after each good step: the next one overflows
  zt::test::TracedRun run = zt::test::train_traced(c, dir.file("fp16.db"));
  ASSERT_TRUE(run.status.ok()) << run.status.message();
  ASSERT_NE(run.reader, nullptr);
  zt::db::QueryResult q;
  ASSERT_TRUE(run.reader
                  ->query("SELECT step, substr(name, length('apply delayed update of step ') + 1) FROM marker_v WHERE "
                          "rank = 0 AND name LIKE 'apply delayed update of step %' ORDER BY t_start",
                          &q)
                  .ok());
  ASSERT_FALSE(q.rows.empty());
  for (const auto& row : q.rows) {
    const int64_t at = std::stoll(row[0]), of = std::stoll(row[1]);
    EXPECT_TRUE(at == of + 1 || (at == of && of == c.steps - 1)) << "the update of step " << of << " applied at step " << at;
  }
  // The case this is about happened: updates applied in steps that were skipped.
  ASSERT_TRUE(run.reader
                  ->query("SELECT count(*) FROM marker_v a JOIN marker_v k ON k.rank = a.rank AND k.step = a.step AND "
                          "k.name = 'skipped step (gradient overflow)' WHERE a.rank = 0 AND a.name LIKE "
                          "'apply delayed update of step %'",
                          &q)
                  .ok());
  EXPECT_GT(std::stoll(q.rows[0][0]), 0);
  EXPECT_GT(run.summary.skipped_steps, 0);
  EXPECT_LT(run.summary.skipped_steps, int64_t(c.steps));
}

// The update buffers' two ways to the parameters: copied into the host shards (offload_param) or up
// to the device shards; bf16 on two ranks, stage 3: the same run, bit for bit, and not the run
// without the delayed update.
TEST(DelayedUpdate, HostAndDeviceShardsTakeTheSameUpdate) {
  TrainConfig c = dpu_run(6, 1);
  c.world_size = 2;
  c.zero.stage = 3;
  c.zero.param_persistence_threshold = 0;
  c.precision = "bf16";
  TrainConfig host = c;
  host.zero.offload_param = true;
  const std::vector<double> on_device = zt::test::train_losses(c), on_host = zt::test::train_losses(host);
  EXPECT_EQ(on_device, on_host);
  TrainConfig plain = host;
  plain.delayed_update = -1;
  const std::vector<double> ord = zt::test::train_losses(plain);
  ASSERT_EQ(ord.size(), on_host.size());
  EXPECT_EQ(ord[1], on_host[1]);
  EXPECT_NE(ord[2], on_host[2]);

  // Up to the device shards the write-back is asynchronous (the H2D lane; the next fetch waits for
  // it): in the trace, some copies into "<module>.shard" made after an "apply delayed update" began
  // end after it has ended (the shards are on the device here: no other H2D copy writes them). Up to five runs, for a loaded machine (the lane must lag once).
  zt::test::TempDir dir;
  int64_t applied = 0, outlived = 0;
  for (int attempt = 0; attempt < 5 && outlived == 0; ++attempt) {
    zt::test::TracedRun run = zt::test::train_traced(c, dir.file("w" + std::to_string(attempt) + ".db"));
    ASSERT_TRUE(run.status.ok()) << run.status.message();
    EXPECT_EQ(run.summary.losses, on_device);
    zt::db::QueryResult q;
    ASSERT_TRUE(run.reader
                    ->query("WITH c AS (SELECT t.t_end, (SELECT m.t_end FROM marker_v m WHERE m.rank = t.rank AND m.name "
                            "LIKE 'apply delayed update%' AND m.t_start <= t.t_start ORDER BY m.t_start DESC LIMIT 1) AS "
                            "apply_end FROM transfer_v t WHERE t.rank = 0 AND t.kind = 'H2D' AND t.name LIKE '%.shard') "
                            "SELECT count(apply_end), coalesce(sum(t_end > apply_end), 0) FROM c",
                            &q)
                    .ok());
    applied = std::stoll(q.rows[0][0]);
    outlived = std::stoll(q.rows[0][1]);
    EXPECT_GT(applied, 0) << "no write-back copy after an apply began";
  }
  EXPECT_GT(outlived, 0) << "every write-back copy finished inside its apply (5 runs): not asynchronous";
}

// The early write-back (device shards, bf16): each module's updated weights go up into the shard's
// second buffer as soon as its AdamW has run, swapped in at the apply. The same run, bit for bit, as
// ZT_EARLY_WRITE_BACK=0 (every copy made by the apply, after the whole pass); in the trace, with it
// some copies begin before the apply of their update (during the next step), without it none do; the
// second shard counts in the model states; a bad value is refused by name.
TEST(DelayedUpdate, EarlyWriteBackGoesUpDuringTheStepAndChangesNothing) {
  TrainConfig c = dpu_run(6, 0);
  c.zero.stage = 3;
  c.zero.param_persistence_threshold = 0;  // every module sharded: its write-back is a local copy
  c.precision = "bf16";
  zt::test::TempDir dir;
  zt::test::TracedRun late = [&] {
    zt::test::ScopedEnv env("ZT_EARLY_WRITE_BACK", "0");
    return zt::test::train_traced(c, dir.file("late.db"));
  }();
  ASSERT_TRUE(late.status.ok()) << late.status.message();
  const zt::test::WriteBackCopies late_copies = zt::test::write_back_copies(*late.reader);
  EXPECT_GT(late_copies.total, 0);
  EXPECT_EQ(late_copies.before_apply, 0) << "without the early write-back every copy is an apply's";
  // The background pass must finish a module while the next step still fetches: on a loaded
  // 2-core machine it may not, so up to five runs are made.
  int64_t outside = 0, state_bytes = 0;
  for (int attempt = 0; attempt < 5 && outside == 0; ++attempt) {
    zt::test::TracedRun run = zt::test::train_traced(c, dir.file("early" + std::to_string(attempt) + ".db"));
    ASSERT_TRUE(run.status.ok()) << run.status.message();
    EXPECT_EQ(run.summary.losses, late.summary.losses);  // bit for bit
    const zt::test::WriteBackCopies copies = zt::test::write_back_copies(*run.reader);
    EXPECT_EQ(copies.total, late_copies.total) << "one copy per module and update either way";
    outside = copies.before_apply;
    state_bytes = run.summary.model_state_bytes;
  }
  EXPECT_GT(outside, 0) << "no copy began before the apply of its update (5 runs): nothing went up early";
  // The second shard: the model's bf16 parameters once more (one rank: its shards are the model).
  const int64_t P = zt::model::num_params(*zt::model::preset("tiny"));
  EXPECT_GE(state_bytes - late.summary.model_state_bytes, 2 * P);
  EXPECT_LT(state_bytes - late.summary.model_state_bytes, 2 * P + 4096 * 2 * 8);  // padding

  const zt::Status st = [&] {
    zt::test::ScopedEnv env("ZT_EARLY_WRITE_BACK", "yes");
    TrainSummary s;
    return train(c, nullptr, nullptr, &s);
  }();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("ZT_EARLY_WRITE_BACK='yes': 1 (the default) or 0"), std::string::npos) << st.message();
}

// ZT_ADAM_THREADS and ZT_ADAM_WAIT_THREADS set the background AdamW's OpenMP threads beside the
// step and while the rank thread waits for it, ZT_RANK_THREADS_BESIDE the rank thread's own beside it
// (tuning knobs for GPU hosts): any counts give the same run, delayed or overlapped; a bad one is
// refused by name.
TEST(DelayedUpdate, AdamThreadsFromTheEnvironment) {
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlapped" : "delayed");
    TrainConfig c = dpu_run(4, 0);
    if (overlap) c.delayed_update = -1, c.overlap_update = true;
    const std::vector<double> want = zt::test::train_losses(c);
    const std::vector<double> one = [&] {
      zt::test::ScopedEnv adam("ZT_ADAM_THREADS", "1"), waited("ZT_ADAM_WAIT_THREADS", "3"),
          beside("ZT_RANK_THREADS_BESIDE", "1");
      return zt::test::train_losses(c);
    }();
    EXPECT_EQ(one, want);
  }
  const TrainConfig c = dpu_run(4, 0);
  // A run of c with one variable set to `value`: its status.
  auto train_with = [&](const char* name, const char* value) {
    zt::test::ScopedEnv env(name, value);
    TrainSummary s;
    return train(c, nullptr, nullptr, &s);
  };
  {
    const zt::Status st = train_with("ZT_RANK_THREADS_BESIDE", "x");
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("ZT_RANK_THREADS_BESIDE='x': the rank thread's threads while the background AdamW"),
              std::string::npos)
        << st.message();
  }
  for (const char* name : {"ZT_ADAM_THREADS", "ZT_ADAM_WAIT_THREADS"}) {
    const zt::Status st = train_with(name, "0");
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(std::string(name) + "='0': the background AdamW's threads"), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("a count from 1 to 4096"), std::string::npos) << st.message();
  }
}

TEST(DelayedUpdate, BadSettingsAreRefused) {
  TrainConfig c = zt::test::tiny_run(2);
  c.delayed_update = 0;
  zt::Status st = validate(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("delayed_update"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("offload_optimizer"), std::string::npos) << st.message();
  c.zero.stage = 2;
  c.zero.offload_optimizer = true;
  EXPECT_TRUE(validate(c).ok());
  c.delayed_update = -2;
  st = validate(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("a count of ordinary steps first (0 or more), or -1 for off"), std::string::npos)
      << st.message();
}

// How many threads a parallel region of this thread's takes now.
static int omp_team() {
  int n = 0;
#pragma omp parallel
  {
#pragma omp single
    n = omp_get_num_threads();
  }
  return n;
}

// The thread the update runs on: a job's exception reaches the wait() after it; jobs run in order,
// one at a time.
TEST(BackgroundThread, RunsJobsInOrderAndRethrowsTheirErrors) {
  BackgroundThread bt(1);
  EXPECT_FALSE(bt.pending());
  bt.wait();  // nothing handed over: returns at once
  std::vector<int> seen;
  for (int i = 0; i < 3; ++i) {
    bt.submit([&seen, i] { seen.push_back(i); });
    EXPECT_TRUE(bt.pending());
    EXPECT_THROW(bt.submit([] {}), std::logic_error);  // one at a time
    bt.wait();
  }
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2}));
  bt.submit([] { throw std::runtime_error("adam failed"); });
  try {
    bt.wait();
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "adam failed");
  }
  EXPECT_FALSE(bt.pending());
  bt.submit([&seen] { seen.push_back(9); });  // still usable
  bt.wait();
  EXPECT_EQ(seen.back(), 9);
}

// The job's OpenMP width, piece by piece: the narrow one while the owner goes on; the waited one for
// the pieces the owner waits for (all of them in wait(), those up to k under a Waiting mark for k,
// not the piece after k even while that mark still lives); its parallel regions really take that
// many threads.
TEST(BackgroundThread, TheJobWidensForThePiecesItsOwnerWaitsFor) {
  BackgroundThread bt(1, 3);
  std::atomic<bool> started{false}, first_done{false}, go{false};
  int before = 0, team_before = 0, first = 0, team_first = 0, second = 0, third = 0, team_third = 0;
  // Polls piece `piece`'s width until it is the waited one (20 s at most).
  auto until_wide = [&](int64_t piece) {
    const auto t0 = std::chrono::steady_clock::now();
    int w = 0;
    while ((w = bt.refresh_width(piece)) != 3 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return w;
  };
  bt.submit([&] {
    before = bt.refresh_width(0);
    team_before = omp_team();
    started = true;
    first = until_wide(0);
    team_first = omp_team();
    first_done = true;
    while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    second = bt.refresh_width(1);  // the owner's mark for piece 0 still lives
    omp_team();
    third = until_wide(2);  // the owner is in wait()
    team_third = omp_team();
  });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  {
    BackgroundThread::Waiting waiting(bt, 0);
    while (!first_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    go = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // piece 1 starts under the mark
  }
  bt.wait();
  EXPECT_EQ(before, 1);
  EXPECT_EQ(team_before, 1);
  EXPECT_EQ(first, 3);
  EXPECT_EQ(team_first, 3);
  EXPECT_EQ(second, 1);
  EXPECT_EQ(third, 3);
  EXPECT_EQ(team_third, 3);
}

// The owner's own width beside a job (Beside): narrowed to owner_beside only while a job is under way,
// its parallel regions really that wide, and its own width back after the mark; nothing without
// owner_beside or without a job.
TEST(BackgroundThread, TheOwnerNarrowsBesideARunningJobOnly) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(3);
  BackgroundThread bt(1, 0, 2), plain(1);
  std::atomic<bool> release{false};
  {
    BackgroundThread::Beside idle(bt);  // no job: the owner's own width
    EXPECT_EQ(omp_get_max_threads(), 3);
  }
  bt.submit([&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  plain.submit([&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  {
    BackgroundThread::Beside beside(bt);
    EXPECT_EQ(omp_get_max_threads(), 2);
    EXPECT_EQ(omp_team(), 2);
  }
  EXPECT_EQ(omp_get_max_threads(), 3);
  EXPECT_EQ(omp_team(), 3);
  {
    BackgroundThread::Beside unset(plain);  // no owner_beside: left as it is
    EXPECT_EQ(omp_get_max_threads(), 3);
  }
  release = true;
  bt.wait();
  plain.wait();
  {
    BackgroundThread::Beside done(bt);  // the job has finished
    EXPECT_EQ(omp_get_max_threads(), 3);
  }
  omp_set_num_threads(before);
}

// ZT_ADAM_NICE's mechanism: the job's thread and the OpenMP threads of its regions run at the niceness
// given (each thread's own, read back with getpriority on its thread id), the owner's stays as it was.
TEST(BackgroundThread, TheJobsThreadsRunAtTheirNiceness) {
  auto own_nice = [] { return getpriority(PRIO_PROCESS, id_t(syscall(SYS_gettid))); };
  const int owner_before = own_nice();
  if (owner_before > 7) GTEST_SKIP() << "this test runs at niceness " << owner_before << ", above the 7 it sets";
  BackgroundThread bt(3, 0, 0, 7);
  std::vector<int> seen;
  std::mutex mu;
  bt.submit([&] {
    bt.refresh_width(0);
    std::lock_guard lock(mu);
    seen.push_back(own_nice());
  });
  bt.wait();
  bt.submit([&] {
#pragma omp parallel num_threads(3)
    {
      const int n = own_nice();
      std::lock_guard lock(mu);
      seen.push_back(n);
    }
  });
  bt.wait();
  ASSERT_EQ(seen.size(), 4u);
  for (int n : seen) EXPECT_EQ(n, 7);
  EXPECT_EQ(own_nice(), owner_before);
}
