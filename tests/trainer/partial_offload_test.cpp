// The partial optimizer offload (cfg.zero.offload_ratio: DeepSpeed's offload_optimizer.ratio,
// ZeRO-Offload++; zero/engine.h): the first int((1 - ratio) * modules) modules keep their fp32
// master weights and Adam moments on the accelerator and are updated there, the rest are offloaded.
// Checked: the losses are the full offload's bit for bit (the device AdamW is the CPU AdamW's twin;
// stages' write-backs, ranks, precisions, offload_param, clipping, the overlapped update); in the
// trace each module's optimizer state lies where DeepSpeed's rule puts it, only the offloaded ones
// have host gradient partitions, and the clip scale meets each partition on its own device; bad
// settings are refused in every place they can be given. The delayed update's schedule under a
// partial offload is in delayed_update_test.cpp; the GPU code path (an opaque device) in
// opaque_device_test.cpp; a checkpoint resumed under another ratio here.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "../test_util.h"
#include "model/config.h"
#include "model/layout.h"
#include "traced_run.h"
#include "train/train_config.h"
#include "train/trainer.h"
#include "zt/db/trace_reader.h"

using namespace zt::trainer;

namespace {

TrainConfig partial_run(int64_t steps, double ratio) {
  TrainConfig c = zt::test::tiny_run(steps);
  c.zero.stage = 3;
  c.zero.offload_optimizer = true;
  c.zero.offload_ratio = ratio;
  return c;
}

using zt::test::query_int;

}  // namespace

TEST(PartialOffload, LossesAreTheFullOffloadsBitForBit) {
  struct Case {
    double ratio;
    int world;
    const char* precision;
    bool off_param = false;
    bool overlap = false;
    int64_t persistence = 0;  // -1: some modules kept whole (their write-back all-gathers)
    bool compute_grads = false;
  };
  for (const Case& k : {Case{0.5, 1, "fp32"}, Case{0.5, 2, "bf16"}, Case{0.25, 2, "fp16"}, Case{0.0, 1, "bf16"},
                        Case{0.5, 1, "bf16", true}, Case{0.5, 2, "fp32", true, false, -1}, Case{0.5, 2, "bf16", false, true},
                        Case{0.75, 1, "bf16", true, true}, Case{0.5, 2, "bf16", false, false, 0, true}}) {
    SCOPED_TRACE("ratio " + std::to_string(k.ratio) + ", " + std::to_string(k.world) + " ranks, " + k.precision +
                 (k.off_param ? ", offload_param" : "") + (k.overlap ? ", overlap_update" : "") +
                 (k.persistence < 0 ? ", some whole modules" : "") + (k.compute_grads ? ", compute-dtype partitions" : ""));
    TrainConfig c = partial_run(6, k.ratio);
    c.world_size = k.world;
    c.grad_accum = 2;
    c.precision = k.precision;
    c.zero.offload_param = k.off_param;
    c.zero.param_persistence_threshold = k.persistence;
    c.overlap_update = k.overlap;
    c.grad_partition_dtype = k.compute_grads ? "compute" : "fp32";
    c.grad_clip = 0.05;  // active on tiny: the scale reaches partitions on both sides
    if (std::string(k.precision) == "fp16") {
      c.zero.initial_scale_power = 20;  // overflows first: skipped steps, then scaled partitions
      c.zero.hysteresis = 1;
    }
    TrainConfig full = c;
    full.zero.offload_ratio = 1.0;
    full.overlap_update = false;
    const std::vector<double> want = zt::test::train_losses(full);
    EXPECT_EQ(zt::test::train_losses(c), want);
  }
}

// Where each module's optimizer state lies (tiny: embeddings, block0, block1, final_ln), by
// DeepSpeed's rule i >= int((1 - ratio) * modules) for the host; host gradient partitions only for
// those; their AdamW phases "adamw <module>" and the others' "device adamw <module>"; and with
// clipping the scale's device copy, so no device error.
TEST(PartialOffload, EachModulesOptimizerStateLiesWhereTheRatioPutsIt) {
  zt::test::TempDir dir;
  struct Case {
    double ratio;
    int on_device;
  };
  for (const Case& k : {Case{0.5, 2}, Case{0.7, 1}, Case{0.8, 0}, Case{0.0, 4}, Case{1.0, 0}}) {
    SCOPED_TRACE("ratio " + std::to_string(k.ratio));
    TrainConfig c = partial_run(2, k.ratio);
    c.precision = "bf16";
    c.grad_clip = 0.05;
    zt::test::TracedRun run = zt::test::train_traced(c, dir.file("r" + std::to_string(int(k.ratio * 100)) + ".db"));
    ASSERT_TRUE(run.status.ok()) << run.status.message();
    ASSERT_NE(run.reader, nullptr);
    zt::db::TraceReader& r = *run.reader;
    const std::vector<std::string> names = {"embeddings", "block0", "block1", "final_ln"};
    for (int i = 0; i < 4; ++i) {
      const bool dev = i < k.on_device;
      const std::string n = names[size_t(i)];
      const std::string at = "SELECT count(*) FROM allocation_v WHERE level = 'block' AND ";
      EXPECT_EQ(query_int(r, at + "name = 'adam.m[" + n + "]' AND device = '" + (dev ? "cuda:0" : "cpu") + "'"), 1) << n;
      // The host partition is made once; a device module's fp32 partition is widened on the
      // accelerator in each optimizer step (bf16), as without any offload.
      const std::string grad = "name = 'fp32_partitioned_groups_flat[" + std::to_string(i) + "].grad' AND device = ";
      EXPECT_EQ(query_int(r, at + grad + "'cpu'"), dev ? 0 : 1) << n;
      EXPECT_EQ(query_int(r, at + grad + "'cuda:0'"), dev ? 2 : 0) << n;
      const std::string ph = "SELECT count(*) FROM marker_v WHERE kind = 'phase' AND name = '";
      EXPECT_EQ(query_int(r, ph + "device adamw " + n + "'"), dev ? 2 : 0) << n;
      EXPECT_EQ(query_int(r, ph + "adamw " + n + "'"), dev ? 0 : 2) << n;
    }
    EXPECT_EQ(query_int(r, "SELECT count(*) FROM error"), 0);
    // The clip scale stays on the host, a CPU scalar valid against the partitions on the
    // accelerator too (as PyTorch lets a 0-dim CPU tensor meet CUDA tensors): no copy of it.
    EXPECT_EQ(query_int(r, "SELECT count(*) FROM transfer_v WHERE name = 'combined_scale'"), 0);
  }
}

// Less offloaded, more device memory: the fp32 master weights and both moments of the modules kept
// there (12 bytes a parameter: embeddings and block0 at ratio 0.5) are on the accelerator all along,
// on top of everything the full offload's peak had.
TEST(PartialOffload, KeepsTheOptimizersBytesOnTheAccelerator) {
  TrainSummary full, half;
  TrainConfig c = partial_run(1, 1.0);
  ASSERT_TRUE(train(c, nullptr, nullptr, &full).ok());
  c.zero.offload_ratio = 0.5;
  ASSERT_TRUE(train(c, nullptr, nullptr, &half).ok());
  const std::vector<zt::model::ModuleSpec> table = zt::model::module_table(*zt::model::preset(c.model));
  const int64_t kept = 12 * (table[0].numel + table[1].numel);
  EXPECT_GE(half.peak_allocated, full.peak_allocated + kept);
}

// The set-up line says how the ratio split the modules (and nothing of it under a full offload).
TEST(PartialOffload, TheSetUpLineSaysWhereTheOptimizerStatesWent) {
  for (double ratio : {0.7, 1.0}) {
    std::ostringstream progress;
    TrainSummary s;
    ASSERT_TRUE(train(partial_run(1, ratio), nullptr, &progress, &s).ok());
    const bool said = progress.str().find("offload_ratio 0.7: the optimizer state of 3 of 4 modules on the host, 1 on "
                                          "cuda:0") != std::string::npos;
    EXPECT_EQ(said, ratio < 1) << progress.str();
    EXPECT_EQ(progress.str().find("offload_ratio 1"), std::string::npos) << progress.str();
  }
}

// The R2 fault under a partial offload: by default the last module's partition (offloaded) stays on
// the device, and the guard stops the clip there; a module whose optimizer state is on the
// accelerator anyway is refused by name (its partition is never offloaded: the fault would do
// nothing); with nothing offloaded (ratio 0) the fault has nothing to act on and does not fire.
TEST(PartialOffload, ThePartitionLeftOnTheDeviceFaultNeedsAnOffloadedModule) {
  TrainConfig c = partial_run(2, 0.5);
  c.grad_clip = 0.05;
  c.faults = {"zero.grad_partition_stays_on_device=return"};
  TrainSummary s;
  zt::Status st = train(c, nullptr, nullptr, &s);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("Expected all tensors to be on the same device"), std::string::npos) << st.message();
  c.faults = {"zero.grad_partition_stays_on_device=return(0)"};
  st = train(c, nullptr, nullptr, &s);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("module 0 keeps its optimizer state on the accelerator (offload_ratio 0.5): its "
                              "partition is never offloaded; the offloaded modules are 2..3"),
            std::string::npos)
      << st.message();
  zt::test::TempDir dir;
  c.zero.offload_ratio = 0;
  c.faults = {"zero.grad_partition_stays_on_device=return", "host.epoch_leak=return(pow2)"};
  c.steps = 0;
  c.epochs = 2;  // an epoch boundary for the leak, a few steps each
  c.synthetic_bytes = 800;
  zt::test::TracedRun run = zt::test::train_traced(c, dir.file("none.db"));
  ASSERT_TRUE(run.status.ok()) << run.status.message();
  EXPECT_EQ(query_int(*run.reader, "SELECT count(*) FROM fault"), 0);
}

TEST(PartialOffload, BadRatiosAreRefusedWhereverGiven) {
  TrainConfig c = partial_run(1, 1.5);
  zt::Status st = validate(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("offload_ratio must lie in [0, 1]"), std::string::npos) << st.message();
  c = partial_run(1, 0.5);
  c.zero.stage = 2;
  st = validate(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("needs offload_optimizer and ZeRO stage 3"), std::string::npos) << st.message();
  c = partial_run(1, 0.5);
  c.zero.offload_optimizer = false;
  EXPECT_FALSE(validate(c).ok());
  EXPECT_TRUE(validate(partial_run(1, 0.0)).ok());

  // DeepSpeed's JSON: read, range-checked with the file's name, not given to offload_param.
  std::vector<std::string> warnings;
  TrainConfig d;
  ASSERT_TRUE(load_deepspeed_config_text(
                  R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})",
                  "ds.json", &d, &warnings)
                  .ok());
  EXPECT_DOUBLE_EQ(d.zero.offload_ratio, 0.3);
  EXPECT_TRUE(warnings.empty());
  TrainConfig e;
  st = load_deepspeed_config_text(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": 2}}})",
                                  "ds.json", &e, &warnings);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("ds.json: zero_optimization.offload_optimizer.ratio 2 must lie in [0, 1]"),
            std::string::npos)
      << st.message();
  st = load_deepspeed_config_text(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"offload_optimizer": {"ratio": "half"}}})", "ds.json", &e,
                                  &warnings);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("ratio must be a number"), std::string::npos) << st.message();
  warnings.clear();
  TrainConfig f;
  // offload_param has no ratio: DeepSpeed 0.19's model refuses the key.
  st = load_deepspeed_config_text(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "ratio": 0.5}}})",
                                  "ds.json", &f, &warnings);
  EXPECT_NE(st.message().find("Extra inputs are not permitted"), std::string::npos) << st.message();
  // Below stage 3 DeepSpeed refuses a ratio ("Partial offloading only supported for ZeRO Stage 3.").
  st = load_deepspeed_config_text(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})",
                                  "ds.json", &f, &warnings);
  EXPECT_NE(st.message().find("Partial offloading only supported for ZeRO Stage 3."), std::string::npos) << st.message();
  // At stage 3 without a cpu offload it has nothing to split: ignored with a warning.
  for (const char* text : {R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "none", "ratio": 0.5}}})"}) {
    warnings.clear();
    TrainConfig g;
    ASSERT_TRUE(load_deepspeed_config_text(text, "ds.json", &g, &warnings).ok()) << text;
    EXPECT_DOUBLE_EQ(g.zero.offload_ratio, 1.0) << text;
    EXPECT_TRUE(validate(g).ok()) << text;
    ASSERT_EQ(warnings.size(), 1u) << text;
    EXPECT_NE(warnings[0].find("ds.json: zero_optimization.offload_optimizer.ratio has no effect"), std::string::npos)
        << warnings[0];
  }
}

// A checkpoint holds each module's fp32 master weights and moments wherever they lived: a run saved
// under one ratio resumes under another (the device modules' states staged down to save, copied up
// on load) and goes on exactly as the uninterrupted run (2 ranks, bf16, clipping).
TEST(PartialOffload, ACheckpointResumesUnderAnotherRatioExactly) {
  struct Case {
    double saved, resumed;
  };
  for (const Case& k : {Case{0.5, 1.0}, Case{1.0, 0.25}, Case{0.5, 0.5}}) {
    SCOPED_TRACE("saved at ratio " + std::to_string(k.saved) + ", resumed at " + std::to_string(k.resumed));
    zt::test::TempDir tmp;
    TrainConfig c = partial_run(6, k.saved);
    c.world_size = 2;
    c.precision = "bf16";
    c.grad_clip = 0.05;
    const std::vector<double> whole = zt::test::train_losses(c);
    c.steps = 3;
    c.checkpoint_dir = tmp.file("ckpt");
    c.save_every = 3;
    ASSERT_EQ(zt::test::train_losses(c).size(), 3u);
    c.steps = 6;
    c.resume = true;
    c.zero.offload_ratio = k.resumed;
    TrainSummary s;
    zt::Status st = train(c, nullptr, nullptr, &s);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(s.resumed_from_step, 3);
    EXPECT_EQ(s.losses, std::vector<double>(whole.begin() + 3, whole.end()));  // bit for bit
  }
}
