// The optimizer's own memory and the attention's saved tensors (issue 41; trainer/zero/optimizer_memory.h,
// ds_memory.h). Each figure is hand-computed from the library source the comment names; then the virtual
// engine charges them in the right place at the right phase, and bad names are refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../test_util.h"
#include "traced_run.h"
#include "train/hf_config.h"
#include "train/train_config.h"
#include "train/trainer.h"
#include "zero/ds_memory.h"
#include "zero/optimizer_memory.h"

namespace {

using zt::trainer::DType;
using zt::trainer::OptimizerImpl;
using zt::trainer::OptimizerSpec;
using zt::trainer::optimizer_state_bytes;
using zt::trainer::optimizer_step_temporary_bytes;

OptimizerSpec named(const std::string& name, bool offload = false) {
  auto o = zt::trainer::parse_optimizer(name, offload);
  EXPECT_TRUE(o.has_value()) << name;
  return o.value_or(OptimizerSpec{});
}

// ---- the state and the step's temporaries, per implementation

// DeepSpeed FusedAdam (ops/adam/fused_adam.py step: exp_avg, exp_avg_sq = zeros_like(p.data), fp32 masters)
// and DeepSpeedCPUAdam (ops/adam/cpu_adam.py: the same on the host); both update in place
// (multi_tensor_apply / the AVX kernel): no temporaries.
TEST(OptimizerMemory, DeepSpeedAdamKeepsTwoFp32MomentsAndNoTemporaries) {
  const OptimizerSpec fused = named("AdamW");  // DeepSpeed lower-cases its own names
  EXPECT_EQ(fused.impl, OptimizerImpl::FusedAdam);
  EXPECT_EQ(fused.name, "adamw");
  EXPECT_EQ(named("adam", true).impl, OptimizerImpl::CpuAdam) << "engine.py: adam under offload is DeepSpeedCPUAdam";
  EXPECT_EQ(optimizer_state_bytes(fused, 1000), 8000);
  EXPECT_EQ(optimizer_step_temporary_bytes(fused, {1000, 3000}, 0.1), 0);
  EXPECT_EQ(optimizer_step_temporary_bytes(named("DeepSpeedCPUAdam"), {1000, 3000}, 0.1), 0);
  const auto terms = zt::trainer::optimizer_state_terms(fused, "block0", 1000);
  ASSERT_EQ(terms.size(), 2u);
  EXPECT_EQ(terms[0].name, "adam.m[block0]");
  EXPECT_EQ(terms[1].name, "adam.v[block0]");
}

// torch/optim/adam.py (AdamW is Adam with decoupled_weight_decay):
//  foreach, _multi_tensor_adam: exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs), then _foreach_div_ and
//    _foreach_add_ in place: one fp32 copy of every tensor of the call, 4 x (1000 + 3000) = 16000 bytes;
//  fused, _fused_adam: torch._fused_adamw_ in place: 0;
//  for-loop, _single_tensor_adam: denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps): the root and the
//    quotient alive at once for the largest tensor, 2 x 4 x 3000 = 24000 bytes.
TEST(OptimizerMemory, TorchAdamWTemporariesByMode) {
  const std::vector<int64_t> call = {1000, 3000};
  for (const char* n : {"adamw_torch", "adamw_torch_foreach", "adamw_torch_fused", "adamw_torch_for_loop"})
    EXPECT_EQ(optimizer_state_bytes(named(n), 3000), 8 * 3000) << n;
  EXPECT_EQ(named("adamw_torch").impl, OptimizerImpl::TorchAdamWForeach) << "the HF Trainer's adamw_torch: torch's default";
  EXPECT_EQ(optimizer_step_temporary_bytes(named("adamw_torch"), call, 0.0), 16000);
  EXPECT_EQ(optimizer_step_temporary_bytes(named("adamw_torch_foreach"), call, 0.1), 16000);
  EXPECT_EQ(optimizer_step_temporary_bytes(named("adamw_torch_fused"), call, 0.1), 0);
  EXPECT_EQ(optimizer_step_temporary_bytes(named("adamw_torch_for_loop"), call, 0.1), 24000);
  // transformers' AdamW (adamw_hf): denom = exp_avg_sq.sqrt().add_(eps), one tensor at a time: 4 x 3000.
  EXPECT_EQ(optimizer_step_temporary_bytes(named("adamw_hf"), call, 0.1), 12000);
}

// bitsandbytes/optim/optimizer.py Optimizer2State.init_state: p.numel() < min_8bit_size (4096) keeps fp32
// state1/state2; else uint8 state1/state2 and, block_wise, absmax1/absmax2 fp32 of ceil(n / 2048) blocks. The
// update (F.optimizer_update_8bit_blockwise) is in place.
TEST(OptimizerMemory, Bitsandbytes8BitStateIsTwoBytesAndTheBlockScales) {
  const OptimizerSpec b = named("adamw_bnb_8bit");
  EXPECT_EQ(b.impl, OptimizerImpl::Bnb8bitAdam);
  EXPECT_EQ(optimizer_state_bytes(b, 10000), 2 * 10000 + 2 * 4 * 5) << "ceil(10000 / 2048) = 5 blocks";
  EXPECT_EQ(optimizer_state_bytes(b, 4096), 2 * 4096 + 2 * 4 * 2);
  EXPECT_EQ(optimizer_state_bytes(b, 4095), 8 * 4095) << "below min_8bit_size: fp32 states";
  EXPECT_EQ(optimizer_step_temporary_bytes(b, {10000}, 0.1), 0);
  const auto terms = zt::trainer::optimizer_state_terms(b, "block1", 10000);
  ASSERT_EQ(terms.size(), 4u);
  EXPECT_EQ(terms[0].name, "bnb.state1[block1]");
  EXPECT_EQ(terms[0].dtype, DType::U8);
  EXPECT_TRUE(named("paged_adamw_8bit").paged);
  EXPECT_EQ(named("adamw_8bit").impl, OptimizerImpl::Bnb8bitAdam);
}

// transformers/optimization.py Adafactor.step on a tensor of one dimension (DeepSpeed's flat partitions):
// factored = len(shape) >= 2 is false, so exp_avg_sq = zeros_like(grad) (fp32); beta1 None (the HF Trainer's
// adafactor): no exp_avg. update = (grad**2) + eps, then update = exp_avg_sq.rsqrt().mul_(grad) made while the
// first is alive: 2 x 4 x the largest tensor.
TEST(OptimizerMemory, AdafactorOnFlatPartitionsKeepsTheWholeSecondMoment) {
  const OptimizerSpec a = named("adafactor");
  EXPECT_EQ(optimizer_state_bytes(a, 5000), 4 * 5000);
  EXPECT_EQ(optimizer_step_temporary_bytes(a, {5000, 2000}, 0.0), 8 * 5000);
}

// torch/optim/sgd.py: momentum_buffer = torch.clone(grad) when momentum != 0 (none at 0, the HF Trainer's sgd);
// _multi_tensor_sgd with weight_decay: device_grads = torch._foreach_add(device_grads, device_params): a new list.
TEST(OptimizerMemory, SgdMomentumBufferAndWeightDecayCopy) {
  EXPECT_EQ(optimizer_state_bytes(named("sgd"), 1000), 0);
  EXPECT_EQ(optimizer_state_bytes(named("sgd_momentum"), 1000), 4000);
  EXPECT_EQ(optimizer_step_temporary_bytes(named("sgd"), {1000, 3000}, 0.0), 0);
  EXPECT_EQ(optimizer_step_temporary_bytes(named("sgd_momentum"), {1000, 3000}, 0.01), 16000);
}

// ---- which optimizer a run uses, and what is refused

TEST(OptimizerMemory, TheKeyThenTheDeepSpeedConfigThenTheEngineDefault) {
  zt::trainer::TrainConfig c;
  c.zero.stage = 2;
  OptimizerSpec o = zt::trainer::optimizer_of(c);
  EXPECT_FALSE(o.given);
  EXPECT_EQ(o.impl, OptimizerImpl::FusedAdam);
  c.zero.offload_optimizer = true;
  EXPECT_EQ(zt::trainer::optimizer_of(c).impl, OptimizerImpl::CpuAdam);
  c.optimizer_name = "adamw";  // the DeepSpeed config's, resolved
  o = zt::trainer::optimizer_of(c);
  EXPECT_TRUE(o.given);
  EXPECT_EQ(o.impl, OptimizerImpl::CpuAdam);
  c.zero.offload_optimizer = false;
  c.optimizer = "adamw_torch_fused";  // the run's key wins
  EXPECT_EQ(zt::trainer::optimizer_of(c).impl, OptimizerImpl::TorchAdamWFused);
}

std::string problem(const std::string& optimizer, bool virt, int stage, bool offload) {
  zt::trainer::TrainConfig c;
  c.virtual_mode = virt;
  c.zero.stage = stage;
  c.zero.offload_optimizer = offload;
  c.precision = "bf16";
  c.optimizer = optimizer;
  return zt::trainer::optimizer_problem(c);
}

TEST(OptimizerMemory, BadNamesAndCombinationsAreRefused) {
  EXPECT_FALSE(zt::trainer::parse_optimizer("adamw_torch_fusd", false));
  EXPECT_NE(problem("adamw_torch_fusd", true, 2, false).find("'adamw_torch_fusd' is not a name"), std::string::npos);
  EXPECT_NE(problem("DeepSpeedCPUAdam", true, 2, false).find("needs offload_optimizer"), std::string::npos);
  EXPECT_NE(problem("adamw_torch", true, 2, true).find("client optimizer under ZeRO-Offload"), std::string::npos);
  EXPECT_NE(problem("adamw_bnb_8bit", true, 3, true).find("device tensors only"), std::string::npos);
  EXPECT_NE(problem("adafactor", false, 2, false).find("virtual mode only"), std::string::npos);
  EXPECT_NE(problem("adafactor", true, 0, false).find("row and a column factor"), std::string::npos);
  EXPECT_EQ(problem("adafactor", true, 2, false), "");
  EXPECT_EQ(problem("adamw_torch_for_loop", false, 2, false), "") << "AdamW's arithmetic: a real run computes it";
  EXPECT_EQ(problem("adam", true, 2, true), "");
  // validate() says it with the file.
  zt::trainer::TrainConfig c;
  c.optimizer = "lion_8bit";
  c.config_file = "run.yaml";
  auto st = zt::trainer::validate(c);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("run.yaml: optimizer 'lion_8bit' is not a name zerotrace knows", 0), 0u) << st.message();
}

// ---- attention as the job runs it

int64_t alloc_bytes(const std::vector<zt::trainer::MemoryOp>& ops, const std::string& name) {
  int64_t b = 0;
  for (const auto& op : ops)
    if (op.alloc && op.term.name == name) b += op.term.bytes();
  return b;
}

// What one block keeps, by implementation (B 2, T 100, 4 heads, width 64, bf16 unless said):
//  eager (HF's eager_attention_forward: softmax over the [B, H, T, T] scores, saved for its backward):
//    the probabilities, 2 x 4 x 100 x 100 x 2 bytes = 160000, and the causal mask;
//  flash_attention_2 (flash_attn's softmax_lse, [B, H, T] fp32): 2 x 4 x 100 x 4 = 3200;
//  sdpa in 16 bit (_scaled_dot_product_flash_attention's logsumexp, [B, H, T]): the same;
//  sdpa in fp32 (the flash kernel takes 16 bit only: _efficient_attention_forward, logsumexp
//    [B, H, ceil(T / 32) x 32], kAlignLSE 32): 2 x 4 x 128 x 4 = 4096.
TEST(AttentionMemory, EagerKeepsTheProbabilitiesSdpaAndFlashTheLogSumExp) {
  zt::trainer::ModelShape s;
  s.width = 64;
  s.heads = 4;
  s.kv_heads = 4;
  s.layers = 2;
  s.ffn = 256;
  s.vocab = 128;
  s.context = 128;
  auto ops_for = [&](const std::string& attention, DType dt) {
    zt::model::Attention a;
    EXPECT_TRUE(zt::model::parse_attention(attention, &a)) << attention;
    auto shape = zt::trainer::activation_shape(s, true, 2, 100, dt, a == zt::model::Attention::Flash, false);
    shape.lse_align = zt::trainer::attention_lse_align(attention, dt);
    return zt::trainer::block_forward_ops(shape, 0);
  };
  const auto eager = ops_for("eager", DType::BF16);
  EXPECT_EQ(alloc_bytes(eager, "block0.attn.probs"), 2 * 4 * 100 * 100 * 2);
  EXPECT_EQ(alloc_bytes(eager, "block0.attn.lse"), 0);
  const auto fa2 = ops_for("flash_attention_2", DType::BF16);
  EXPECT_EQ(alloc_bytes(fa2, "block0.attn.probs"), 0);
  EXPECT_EQ(alloc_bytes(fa2, "block0.attn.lse"), 2 * 4 * 100 * 4);
  EXPECT_EQ(alloc_bytes(ops_for("sdpa", DType::BF16), "block0.attn.lse"), 2 * 4 * 100 * 4);
  EXPECT_EQ(alloc_bytes(ops_for("sdpa", DType::F32), "block0.attn.lse"), 2 * 4 * 128 * 4);
  // Eager in training with attention dropout: native_dropout's bool mask (2 x 4 x 100 x 100 bytes) and its
  // output (bf16), saved beside the probabilities until the block's backward frees them.
  auto shape = zt::trainer::activation_shape(s, true, 2, 100, DType::BF16, false, false);
  shape.attn_dropout = true;
  const auto dropped = zt::trainer::block_forward_ops(shape, 0);
  EXPECT_EQ(alloc_bytes(dropped, "block0.attn.dropout_mask"), 2 * 4 * 100 * 100);
  EXPECT_EQ(alloc_bytes(dropped, "block0.attn.probs_dropped"), 2 * 4 * 100 * 100 * 2);
  EXPECT_EQ(alloc_bytes(dropped, "block0.attn.probs"), 2 * 4 * 100 * 100 * 2);
  bool freed = false;
  for (const auto& op : zt::trainer::block_backward_ops(shape, 0))
    if (!op.alloc && op.term.name == "block0.attn.dropout_mask") freed = true;
  EXPECT_TRUE(freed) << "kept to the block's backward";
  auto none = shape;
  none.flash = true;  // SDPA and flash-attn keep a seed, not a mask
  EXPECT_EQ(alloc_bytes(zt::trainer::block_forward_ops(none, 0), "block0.attn.dropout_mask"), 0);
}

TEST(AttentionMemory, UnknownNamesAndFlashAttentionInFp32AreRefused) {
  zt::trainer::TrainConfig c;
  c.config_file = "run.yaml";
  c.attention = "flash_attn";
  auto st = zt::trainer::validate(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("run.yaml: attention 'flash_attn'"), std::string::npos) << st.message();
  c.attention = "flash_attention_2";
  c.precision = "fp32";
  st = zt::trainer::validate(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("FlashAttention-2 runs fp16 and bf16 only"), std::string::npos) << st.message();
  c.attention = "sdpa";
  EXPECT_TRUE(zt::trainer::validate(c).ok());
  c.attention_dropout = 0.1;
  st = zt::trainer::validate(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("attention_dropout is charged in virtual mode only"), std::string::npos) << st.message();
  c.virtual_mode = true;
  c.attention_dropout = 1.5;
  EXPECT_FALSE(zt::trainer::validate(c).ok());
}

// A config.json's attn_implementation (or _attn_implementation, as save_pretrained writes it) is read; a value
// zerotrace does not model is refused, naming the file and the key.
TEST(AttentionMemory, HfConfigAttnImplementation) {
  nlohmann::json j = {{"model_type", "gpt2"}, {"n_embd", 64},  {"n_layer", 2},         {"n_head", 4},
                      {"vocab_size", 128},    {"n_positions", 128}, {"_attn_implementation", "flash_attention_2"}};
  zt::trainer::HfModel m;
  auto st = zt::trainer::hf_config_from_json(j, "config.json", &m);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(m.attention, "flash_attention_2");
  EXPECT_EQ(m.attention_dropout, 0.0);
  j["attn_pdrop"] = 0.1;  // GPT-2's
  ASSERT_TRUE(zt::trainer::hf_config_from_json(j, "config.json", &m).ok());
  EXPECT_EQ(m.attention_dropout, 0.1);
  j["attn_pdrop"] = "0.1";
  st = zt::trainer::hf_config_from_json(j, "config.json", &m);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("config.json: attn_pdrop must be a number"), std::string::npos) << st.message();
  j["attn_pdrop"] = 0.1;
  j["_attn_implementation"] = "flex_attention";
  st = zt::trainer::hf_config_from_json(j, "config.json", &m);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("config.json: _attn_implementation 'flex_attention'"), std::string::npos) << st.message();
}

// ---- the virtual engine charges them in the right place at the right phase

zt::trainer::TrainConfig virtual_run(int stage, const std::string& optimizer, int64_t world = 4) {
  zt::trainer::TrainConfig c;
  c.virtual_mode = true;
  c.model = "124M";
  c.data_samples = 100;
  c.steps = 2;
  c.world_size = world;
  c.zero.stage = stage;
  c.precision = "bf16";
  c.micro_batch = 1;
  c.seq_len = 64;
  c.attention = "sdpa";
  c.optimizer = optimizer;
  c.zero.reduce_bucket_size = -1;  // "auto", as the HF integration writes it: width^2 (not 5e8: 1 GB of bucket)
  c.device_memory = uint64_t(80) << 30;
  c.quiet = true;
  return c;
}

int64_t bytes_of(zt::db::TraceReader& r, const std::string& where) {
  return zt::test::query_int(r, "SELECT coalesce(sum(requested_bytes), 0) FROM allocation_v WHERE rank = 0 AND "
                                "level = 'block' AND " + where);
}
const char* kInStep1 =
    " AND t_alloc >= (SELECT t_start FROM marker_v WHERE rank = 0 AND name = 'optimizer' AND step = 1) AND t_free <= "
    "(SELECT t_end FROM marker_v WHERE rank = 0 AND name = 'optimizer' AND step = 1)";

// Stage 2: DeepSpeed hands torch's AdamW one flat fp32 partition (P elements): foreach's square root is 4P,
// made and freed inside each step, on the GPU; the moments are adam.m/adam.v as FusedAdam's. One GPU, so that
// the step is the run's peak (on 4, rank 0's partition lies inside the embedding: its overflow check, 11 bytes an
// element, peaks higher).
TEST(OptimizerEngine, StageTwoForeachChargesItsSquareRootInTheStep) {
  zt::test::TempDir dir;
  auto r = zt::test::train_traced(virtual_run(2, "adamw_torch", 1), dir.file("foreach.db"));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  auto& db = *r.reader;
  const int64_t masters = bytes_of(db, "name GLOB 'fp32_partitioned_groups_flat[[]*]'");  // 4P
  ASSERT_GT(masters, 0);
  EXPECT_EQ(bytes_of(db, "name = 'adamw.exp_avg_sq_sqrt' AND device = 'cuda:0'" + std::string(kInStep1)), masters);
  EXPECT_EQ(bytes_of(db, "name GLOB 'adam.*'"), 2 * masters);
  // ... beside the fp32 gradient partition DeepSpeed made for the step (single_partition_of_fp32_groups[0].grad).
  EXPECT_EQ(zt::test::query_int(db, "SELECT count(*) FROM allocation_v a JOIN allocation_v g ON g.rank = a.rank AND "
                                    "a.name = 'adamw.exp_avg_sq_sqrt' AND g.name = "
                                    "'single_partition_of_fp32_groups[0].grad' AND g.t_alloc < a.t_alloc AND "
                                    "a.t_free <= g.t_free WHERE a.rank = 0 AND a.level = 'block' AND g.level = 'block'"),
            2)
      << "both steps";
  // fused: none. At stage 2 the square root (4P) only matches what the step held before Adam (grads_in_partition,
  // flat_grad_partition: 2P^ + 2P), so foreach peaks no lower than fused; for-loop's root and quotient of the one
  // flat partition (8P) beside the fp32 gradient (4P) raise the peak.
  auto f = zt::test::train_traced(virtual_run(2, "adamw_torch_fused", 1), dir.file("fused.db"));
  ASSERT_TRUE(f.status.ok()) << f.status.message();
  EXPECT_EQ(bytes_of(*f.reader, "name GLOB 'adamw.*'"), 0);
  EXPECT_GE(r.summary.peak_allocated, f.summary.peak_allocated);
  auto l = zt::test::train_traced(virtual_run(2, "adamw_torch_for_loop", 1), dir.file("loop.db"));
  ASSERT_TRUE(l.status.ok()) << l.status.message();
  EXPECT_EQ(bytes_of(*l.reader, "name = 'adamw.denom'"), 2 * masters) << "two steps, 4P each";
  // Fused peaks at 2P^ + 2P + 4P beside the model states, before Adam; for-loop at 4P + 8P in Adam: 4P more
  // (P^ = P on one GPU).
  EXPECT_NEAR(double(l.summary.peak_allocated - f.summary.peak_allocated), double(masters), double(1 << 20));
}

// bitsandbytes at stage 2: no fp32 moments, its uint8 states (1 byte an element of the partition) made at the
// first step, on the GPU; the step's peak is lower than FusedAdam's.
TEST(OptimizerEngine, StageTwoBitsandbytesStateReplacesTheMoments) {
  zt::test::TempDir dir;
  auto r = zt::test::train_traced(virtual_run(2, "adamw_bnb_8bit"), dir.file("bnb.db"));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  auto& db = *r.reader;
  const int64_t masters = bytes_of(db, "name GLOB 'fp32_partitioned_groups_flat[[]*]'");
  EXPECT_EQ(bytes_of(db, "name GLOB 'adam.*'"), 0);
  EXPECT_EQ(bytes_of(db, "name GLOB 'bnb.state1[[]*]' AND device = 'cuda:0'"), masters / 4);
  EXPECT_EQ(bytes_of(db, "name GLOB 'bnb.state1[[]*]' AND t_alloc < (SELECT t_start FROM marker_v WHERE rank = 0 AND "
                         "name = 'optimizer' AND step = 0)"),
            0)
      << "made inside the first step, as torch's optimizers make their state";
  auto d = zt::test::train_traced(virtual_run(2, ""), dir.file("default.db"));
  ASSERT_TRUE(d.status.ok()) << d.status.message();
  EXPECT_LT(r.summary.peak_allocated, d.summary.peak_allocated);
}

// Stage 3: one sub-group (here a module) at a time: Adafactor's two update-sized temporaries are freed before
// the next module's, so at most 8 bytes an element of the largest module are alive at once.
TEST(OptimizerEngine, StageThreeTemporariesOneSubGroupAtATime) {
  zt::test::TempDir dir;
  auto r = zt::test::train_traced(virtual_run(3, "adafactor"), dir.file("ada.db"));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  auto& db = *r.reader;
  const int64_t largest = zt::test::query_int(
      db, "SELECT max(requested_bytes) FROM allocation_v WHERE rank = 0 AND level = 'block' AND name GLOB "
          "'fp32_partitioned_groups_flat[[]*]'");
  EXPECT_EQ(zt::test::query_int(db, "SELECT max(requested_bytes) FROM allocation_v WHERE rank = 0 AND level = 'block' "
                                    "AND name = 'adafactor.update'"),
            largest);
  EXPECT_EQ(zt::test::query_int(db, "SELECT count(*) FROM allocation_v a JOIN allocation_v b ON a.rank = b.rank AND "
                                    "a.name = 'adafactor.update' AND b.name = 'adafactor.update' AND a.id < b.id AND "
                                    "b.t_alloc < a.t_free AND a.rank = 0 AND a.level = 'block' AND b.level = 'block'"),
            0)
      << "never two modules' temporaries at once";
  EXPECT_GT(bytes_of(db, "name GLOB 'adafactor.exp_avg_sq[[]*]'"), 0);
  EXPECT_EQ(bytes_of(db, "name GLOB 'adam.*'"), 0);
}

}  // namespace
