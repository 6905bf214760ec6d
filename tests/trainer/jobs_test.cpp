// What users' jobs do that a plain training run does not (issue 30), each through the real
// allocators and read back from the trace: the model loaded from its checkpoint (from_pretrained,
// with and without zero.Init), frozen parameters (finetuning freeze) and LoRA's adapters (sizes),
// an evaluation phase (its activations and logits freed after it, or the logits kept), an
// encoder-decoder shape, and the node memory watchdog.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "traced_run.h"
#include "train/model_shape.h"
#include "zero/ds_memory.h"

using namespace zt;

namespace {

int64_t count(db::TraceReader& r, const std::string& sql) { return test::query_int(r, sql); }

trainer::TrainConfig zero3(int64_t steps) {
  trainer::TrainConfig c = test::tiny_run(steps);
  c.world_size = 2;
  c.zero.stage = 3;
  c.zero.param_persistence_threshold = 0;
  return c;
}

// One step of a full-size shape in virtual mode, ZeRO-3, one 128-token sequence per rank.
trainer::TrainConfig virtual_step(const trainer::ModelShape& shape, int world_size) {
  trainer::TrainConfig c;
  c.model = "custom";
  c.shape = shape;
  c.virtual_mode = true;
  c.data_samples = 100;
  c.steps = 1;
  c.micro_batch = 1;
  c.seq_len = 128;
  c.world_size = world_size;
  c.zero.stage = 3;
  return c;
}

}  // namespace

TEST(Jobs, FromPretrainedHoldsTheWholeModelOnEveryRankThenPartitions) {
  test::TempDir dir;
  trainer::TrainConfig c = zero3(1);
  c.from_pretrained = true;
  c.load_dtype = "fp32";
  test::TracedRun run = test::train_traced(c, dir.file("t.db"));
  ASSERT_TRUE(run.status) << run.status.message();
  db::TraceReader& r = *run.reader;
  // Every rank allocated each module's checkpoint copy inside the load phase, and freed it before the
  // first optimizer state was made (DeepSpeed builds those after partitioning).
  const int64_t modules = trainer::optimizer_modules(c);
  for (int rank : {0, 1}) {
    SCOPED_TRACE(rank);
    const std::string R = std::to_string(rank);
    EXPECT_EQ(count(r, "SELECT count(*) FROM allocation_v WHERE rank = " + R +
                           " AND level = 'block' AND name LIKE 'model.from_pretrained[%'"),
              modules);
    EXPECT_EQ(count(r, "SELECT count(*) FROM marker_v WHERE rank = " + R +
                           " AND name = 'model load (from_pretrained: the whole model on every rank)'"),
              1);
    EXPECT_EQ(count(r, "SELECT count(*) FROM allocation_v WHERE rank = " + R +
                           " AND name LIKE 'model.from_pretrained[%' AND (t_free IS NULL OR t_free > (SELECT min(t_alloc) "
                           "FROM allocation_v WHERE rank = " + R + " AND name LIKE 'adam.m[%'))"),
              0)
        << "the loaded model is gone before the optimizer states";
  }
  // The whole model's fp32 bytes, once per rank: the node's peak at load is world_size times it.
  EXPECT_EQ(count(r, "SELECT sum(requested_bytes) FROM allocation_v WHERE rank = 0 AND level = 'block' AND name LIKE "
                     "'model.from_pretrained[%'"),
            int64_t(model::num_params(*model::preset("tiny"))) * 4);
  EXPECT_GT(count(r, "SELECT max(value) FROM counter_v WHERE name = 'load.host_peak_per_node'"), 0);
  // The weights come from the loaded copy: an fp32 checkpoint trains as the drawn weights do.
  trainer::TrainConfig plain = zero3(1);
  EXPECT_EQ(test::train_losses(plain), run.summary.losses);
}

TEST(Jobs, ZeroInitLoadsOneModuleAtATime) {
  test::TempDir dir;
  trainer::TrainConfig c = zero3(1);
  c.from_pretrained = true;
  c.zero_init = true;
  test::TracedRun run = test::train_traced(c, dir.file("t.db"));
  ASSERT_TRUE(run.status) << run.status.message();
  db::TraceReader& r = *run.reader;
  // One zero.Init load phase per module, and never two modules' copies alive at once.
  EXPECT_EQ(count(r, "SELECT count(*) FROM marker_v WHERE rank = 0 AND name LIKE 'model load (zero.Init: %'"),
            trainer::optimizer_modules(c));
  EXPECT_EQ(count(r, "SELECT count(*) FROM allocation_v a JOIN allocation_v b ON a.rank = b.rank AND a.id < b.id WHERE "
                     "a.level = 'block' AND b.level = 'block' AND a.name LIKE 'model.from_pretrained[%' AND b.name LIKE "
                     "'model.from_pretrained[%' AND b.t_alloc < a.t_free"),
            0);
  // A 16-bit checkpoint: the weights are the drawn ones rounded through bf16, so the run differs.
  trainer::TrainConfig bf = c;
  bf.load_dtype = "bf16";
  EXPECT_NE(test::train_losses(bf), run.summary.losses);
}

TEST(Jobs, FrozenModulesHaveNoGradientsNorOptimizerState) {
  test::TempDir dir;
  trainer::TrainConfig c = test::tiny_run(3);
  c.world_size = 2;
  c.zero.stage = 2;
  c.zero.offload_optimizer = true;
  c.finetuning = "freeze";
  c.trainable_layers = 1;
  test::TracedRun run = test::train_traced(c, dir.file("t.db"));
  ASSERT_TRUE(run.status) << run.status.message();
  db::TraceReader& r = *run.reader;
  const int64_t layers = model::preset("tiny")->layers;
  const std::string last = "block" + std::to_string(layers - 1);
  // Only the last block has Adam moments and a gradient; the frozen ones have parameters only.
  EXPECT_EQ(count(r, "SELECT count(DISTINCT name) FROM allocation_v WHERE rank = 0 AND name LIKE 'adam.m[%'"), 1);
  EXPECT_EQ(count(r, "SELECT count(*) FROM allocation_v WHERE rank = 0 AND level = 'block' AND name = 'adam.m[" + last + "]'"), 1);
  EXPECT_EQ(count(r, "SELECT count(*) FROM allocation_v WHERE rank = 0 AND name LIKE 'embeddings.grad%'"), 0);
  EXPECT_GT(count(r, "SELECT count(*) FROM allocation_v WHERE rank = 0 AND name LIKE 'embeddings.param'"), 0);
  // It trains (the loss moves) and every frozen weight stays as drawn: the same losses as the model
  // would give with its first blocks frozen in the reference.
  ASSERT_EQ(run.summary.losses.size(), 3u);
  EXPECT_NE(run.summary.losses[0], run.summary.losses[2]);
  trainer::TrainConfig full = c;
  full.finetuning = "full";
  EXPECT_NE(test::train_losses(full), run.summary.losses) << "freezing changed what trains";
}

TEST(Jobs, LoraTrainsTheAdaptersOnlyInVirtualMode) {
  // Llama-2-7B: PEFT's LoRA r=8 on q_proj and v_proj trains 4,194,304 parameters.
  trainer::ModelShape llama;
  llama.name = "Llama-2-7B";
  llama.width = 4096;
  llama.layers = llama.heads = llama.kv_heads = 32;
  llama.ffn = 11008;
  llama.gated_ffn = true;
  llama.vocab = 32000;
  llama.context = 4096;
  llama.tied_embeddings = false;
  llama.norm = "rms";
  trainer::TrainConfig c = virtual_step(llama, 8);
  c.zero.offload_optimizer = true;
  c.precision = "bf16";
  c.finetuning = "lora";
  c.lora_rank = 8;
  c.lora_targets = "qv";
  int64_t adapters = 0;
  for (int64_t b = 0; b < c.shape.layers; ++b) adapters += trainer::lora_params(c.shape, b, 8, "qv");
  EXPECT_EQ(adapters, 4194304);
  test::TempDir dir;
  test::TracedRun run = test::train_traced(c, dir.file("t.db"));
  ASSERT_TRUE(run.status) << run.status.message();
  db::TraceReader& r = *run.reader;
  EXPECT_EQ(count(r, "SELECT count(*) FROM allocation_v WHERE level = 'block' AND name LIKE 'adam.m[block%.lora]'"), 32);
  EXPECT_EQ(count(r, "SELECT count(*) FROM allocation_v WHERE name LIKE 'adam.m[%' AND name NOT LIKE '%.lora]'"), 0);
  // Each adapter is PEFT's lora_A (8 x 4096) and lora_B (4096 x 8) of q and v: four parameters of
  // 32768 elements, below DeepSpeed's persistence threshold (10 x width), kept whole on every rank
  // in bf16; its gradient goes through the ipg bucket, the frozen blocks' do not exist.
  EXPECT_EQ(count(r, "SELECT count(*) FROM allocation_v WHERE rank = 0 AND level = 'block' AND name LIKE "
                     "'block%.lora.persistent' AND requested_bytes = 4 * 32768 * 2"),
            32);
  EXPECT_EQ(count(r, "SELECT count(*) FROM allocation_v WHERE rank = 0 AND level = 'block' AND name = 'block0.lora.grad'"), 1);
  EXPECT_EQ(count(r, "SELECT count(*) FROM allocation_v WHERE rank = 0 AND level = 'block' AND name = 'block0.grad'"), 0);
  // A real run refuses LoRA: the reference passes have no adapters.
  trainer::TrainConfig real = test::tiny_run(1);
  real.finetuning = "lora";
  trainer::TrainSummary s;
  Status st = trainer::train(real, nullptr, nullptr, &s);
  EXPECT_FALSE(st);
  EXPECT_NE(st.message().find("virtual mode only"), std::string::npos) << st.message();
}

TEST(Jobs, EvaluationFreesItsActivationsAndLogitsUnlessTheyAreKept) {
  test::TempDir dir;
  trainer::TrainConfig c = zero3(2);
  c.eval_steps = 1;
  c.eval_samples = 8;  // 2 batches of 2 on each of 2 ranks
  test::TracedRun run = test::train_traced(c, dir.file("t.db"));
  ASSERT_TRUE(run.status) << run.status.message();
  db::TraceReader& r = *run.reader;
  EXPECT_EQ(count(r, "SELECT count(*) FROM marker_v WHERE rank = 0 AND name = 'evaluation'"), 2);
  EXPECT_EQ(count(r, "SELECT count(*) FROM marker_v WHERE rank = 0 AND name LIKE 'eval batch %'"), 4);
  // Each batch's logits live only inside the evaluation; none survive it.
  EXPECT_EQ(count(r, "SELECT count(*) FROM allocation_v WHERE rank = 0 AND level = 'block' AND name = 'eval.logits'"), 4);
  EXPECT_EQ(count(r, "SELECT count(*) FROM allocation_v a WHERE rank = 0 AND name LIKE 'eval.%' AND (a.t_free IS NULL OR "
                     "a.t_free > (SELECT max(t_end) FROM marker_v WHERE rank = 0 AND name = 'evaluation'))"),
            0);
  EXPECT_GT(count(r, "SELECT count(*) FROM counter_v WHERE name = 'eval_loss'"), 0);
  // The training is the same with or without evaluations in between (no sample is used, no state changes).
  trainer::TrainConfig none = zero3(2);
  EXPECT_EQ(test::train_losses(none), run.summary.losses);
  // Kept (a compute_metrics): gathered from both ranks, concatenated on the device, moved to the host
  // every batch with eval_accumulation_steps 1.
  trainer::TrainConfig kept = c;
  kept.eval_keep_logits = true;
  kept.eval_accumulation_steps = 1;
  test::TracedRun k = test::train_traced(kept, dir.file("k.db"));
  ASSERT_TRUE(k.status) << k.status.message();
  const int64_t V = model::preset("tiny")->vocab, one = 2 * 32 * V * 4;
  EXPECT_EQ(count(*k.reader, "SELECT max(requested_bytes) FROM allocation_v WHERE rank = 0 AND name = 'eval.preds.device'"),
            2 * one);
  EXPECT_EQ(count(*k.reader, "SELECT max(requested_bytes) FROM allocation_v WHERE rank = 0 AND name = 'eval.preds' AND "
                             "device = 'cpu'"),
            4 * one);
}

TEST(Jobs, EncoderDecoderShapesCountCrossAttentionAndBothStacks) {
  // t5-base's layout: 222,903,552 parameters (transformers' count).
  trainer::ModelShape t5;
  t5.name = "t5-base";
  t5.width = 768;
  t5.layers = 12;
  t5.encoder_layers = 12;
  t5.heads = 12;
  t5.kv_heads = 12;
  t5.ffn = 3072;
  t5.vocab = 32128;
  t5.context = 512;
  t5.tied_embeddings = true;
  t5.norm = "rms";
  t5.final_norms = 2;
  t5.relative_attention_buckets = 32;
  EXPECT_EQ(trainer::shape_params(t5, false), 222903552);
  const auto modules = trainer::shape_modules(t5, false);
  EXPECT_EQ(modules[1].name, "encoder.block0");
  EXPECT_EQ(modules[13].name, "decoder.block0");
  EXPECT_GT(modules[13].numel, modules[1].numel) << "a decoder block has cross-attention";
  // DeepSpeed's units are the same modules' parameters (the engine read past a shorter table).
  const auto params = trainer::module_parameters(nullptr, t5, false);
  ASSERT_EQ(params.size(), modules.size());
  EXPECT_EQ(params[13].size(), 1 + 4 + 1 + 1 + 4 + 1 + 2u) << "norm, q k v o, relative buckets, norm, cross q k v o, norm, wi wo";
  // Activations: the decoder's cross-attention over the encoder's tokens grows with both lengths.
  EXPECT_GT(trainer::encoder_decoder_activation_bytes(t5, 1, 512, 128, false),
            trainer::encoder_decoder_activation_bytes(t5, 1, 128, 128, false));
  EXPECT_LT(trainer::encoder_decoder_activation_bytes(t5, 1, 512, 512, true),
            trainer::encoder_decoder_activation_bytes(t5, 1, 512, 512, false));
  // It trains in virtual mode (encoder blocks, then decoder blocks).
  trainer::TrainConfig c = virtual_step(t5, 1);
  test::TempDir dir;
  test::TracedRun run = test::train_traced(c, dir.file("t.db"));
  ASSERT_TRUE(run.status) << run.status.message();
  EXPECT_EQ(count(*run.reader, "SELECT count(*) FROM marker_v WHERE name = 'forward decoder.block11'"), 1);
  // Its activations (one estimated tensor) live from its forward to the end of its backward, as
  // PyTorch's do: not from set-up through the optimizer step (and a save) as they did.
  EXPECT_EQ(count(*run.reader, "SELECT count(*) FROM allocation_v a WHERE level = 'block' AND name = 'activations' AND "
                               "a.t_alloc >= (SELECT min(t_start) FROM marker_v WHERE name = 'forward') AND a.t_free <= "
                               "(SELECT min(t_start) FROM marker_v WHERE name = 'optimizer')"),
            1);
}

TEST(Jobs, TheNodeWatchdogKillsAtItsShareWithItsOwnErrorKind) {
  test::TempDir dir;
  trainer::TrainConfig c = test::tiny_run(1);
  c.world_size = 2;
  c.ranks_per_node = 2;
  c.zero.stage = 2;
  c.zero.offload_optimizer = true;  // the optimizer states on the host
  c.host_memory = 64ull << 20;
  c.watchdog = "kubernetes";
  c.watchdog_kill_at = 0.01;  // 655 KiB of the node's 64 MiB: the first host buffers pass it
  test::TracedRun run = test::train_traced(c, dir.file("t.db"));
  ASSERT_FALSE(run.status);
  db::TraceReader& r = *run.reader;
  db::QueryResult q;
  ASSERT_TRUE(r.query("SELECT kind, site, message FROM error ORDER BY rank, t LIMIT 1", &q));
  ASSERT_EQ(q.rows.size(), 1u);
  EXPECT_EQ(q.rows[0][0], "memory_watchdog");
  EXPECT_EQ(q.rows[0][1], "kubernetes");
  EXPECT_NE(q.rows[0][2].find("OOMKilled"), std::string::npos) << q.rows[0][2];
  EXPECT_EQ(count(r, "SELECT count(*) FROM error WHERE kind = 'host_oom'"), 0) << "killed before the cap";
  // Unwatched, the same run trains.
  c.watchdog_kill_at = 0;
  EXPECT_EQ(test::train_losses(c).size(), 1u);
}

// virtual_fast_forward: a steady state's steps counted, not replayed. The run ends where the replayed
// run ends (steps, samples, memory), each epoch replays until two steps leave memory alike, and a
// run with a fault configured replays every step.
TEST(Jobs, VirtualFastForwardCountsTheSteadyStepsAndEndsAsTheReplay) {
  trainer::ModelShape shape;
  shape.name = "small";
  shape.width = 256;
  shape.layers = 4;
  shape.heads = 4;
  shape.kv_heads = 4;
  shape.ffn = 1024;
  shape.vocab = 1000;
  shape.context = 128;
  trainer::TrainConfig c = virtual_step(shape, 4);
  c.steps = 0;
  c.epochs = 3;
  c.data_samples = 64;  // 16 steps an epoch on 4 ranks
  c.grad_accum = 1;
  c.zero.offload_optimizer = true;
  test::TempDir dir;
  test::TracedRun all = test::train_traced(c, dir.file("all.db"));
  ASSERT_TRUE(all.status) << all.status.message();
  c.virtual_fast_forward = true;
  test::TracedRun ff = test::train_traced(c, dir.file("ff.db"));
  ASSERT_TRUE(ff.status) << ff.status.message();
  EXPECT_EQ(all.summary.steps, 48);
  EXPECT_EQ(ff.summary.steps, 48);
  EXPECT_EQ(ff.summary.samples_used, all.summary.samples_used);
  EXPECT_EQ(ff.summary.peak_allocated, all.summary.peak_allocated);
  EXPECT_EQ(ff.summary.peak_reserved, all.summary.peak_reserved);
  auto last = [](db::TraceReader& r, const char* name) {
    return count(r, std::string("SELECT CAST(value AS INTEGER) FROM counter c JOIN string s ON s.id = c.name_id WHERE "
                                "s.text = '") + name + "' ORDER BY c.t DESC, c.id DESC LIMIT 1");
  };
  for (const char* n : {"allocated", "reserved", "pinned", "data.samples_used"})
    EXPECT_EQ(last(*ff.reader, n), last(*all.reader, n)) << n;
  const std::string ended = "SELECT count(*) FROM marker WHERE kind = 0 AND t_end IS NOT NULL";
  EXPECT_EQ(count(*ff.reader, ended), 48);
  EXPECT_EQ(count(*all.reader, ended), 48);
  // Each epoch replays at least two steps; the rest of it is the steady state's.
  const int64_t forwarded = last(*ff.reader, "virtual.steps_fast_forwarded");
  EXPECT_GE(forwarded, 36);
  EXPECT_LE(forwarded, 42);
  EXPECT_LT(count(*ff.reader, "SELECT count(*) FROM allocation"), count(*all.reader, "SELECT count(*) FROM allocation") / 4);
  // A fault's call counts and draws need every step: none is fast-forwarded.
  c.faults = {"ckpt.torn_write=return"};  // a site training never reaches
  test::TracedRun faulted = test::train_traced(c, dir.file("faulted.db"));
  ASSERT_TRUE(faulted.status) << faulted.status.message();
  EXPECT_EQ(faulted.summary.steps, 48);
  EXPECT_EQ(last(*faulted.reader, "virtual.steps_fast_forwarded"), -1) << "no such counter";
}
