// DeepSpeed's and PyTorch's memory, term by term (trainer/zero/ds_memory.h): each term against
// bytes computed by hand for a stated config, the virtual engine against the two H200 measurements of
// issue 33, and the terms against the cudaMalloc segments and host allocations of a real DeepSpeed
// 0.19.8 run (tests/data/ds_zero3_offload_350M_h200.csv, cut from a zt probe trace).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "../test_util.h"
#include "traced_run.h"
#include "model/config.h"
#include "train/model_shape.h"
#include "train/trainer.h"
#include "zero/ds_memory.h"
#include "zt/memory/device_allocator.h"
#include "zt/memory/host_allocator.h"

namespace {

using zt::trainer::ActivationShape;
using zt::trainer::DType;
using zt::trainer::MemoryOp;
using zt::trainer::MemoryTerm;

constexpr int64_t KiB = 1024, MiB = 1024 * KiB;
constexpr double GiB = double(1ll << 30);

zt::model::Config preset(const std::string& name) {
  auto c = zt::model::preset(name);
  EXPECT_TRUE(c.has_value()) << name;
  return c.value_or(zt::model::Config{});
}

ActivationShape shape_of(const std::string& name, int64_t B, int64_t T, bool flash, bool ckpt,
                         DType dt = DType::BF16) {
  const zt::model::Config c = preset(name);
  return zt::trainer::activation_shape(zt::trainer::shape_of(c, name), true, B, T, dt, flash, ckpt);
}

std::map<std::string, int64_t> by_name(const std::vector<MemoryTerm>& terms) {
  std::map<std::string, int64_t> m;
  for (const MemoryTerm& t : terms) m[t.name] = t.bytes();
  return m;
}

int64_t sum(const std::vector<MemoryTerm>& terms) {
  int64_t s = 0;
  for (const MemoryTerm& t : terms) s += t.bytes();
  return s;
}

// 350M (width 1024, 16 heads), B=8, T=1024, bf16: N = 8192 tokens; a [N, 1024] bf16 tensor is
// 16 MiB, an fp32 value per token 32 KiB.
TEST(DsMemory, A350MBlockKeepsSixteenWidthsAToken) {
  const ActivationShape a = shape_of("350M", 8, 1024, /*flash=*/true, false);
  auto t = by_name(zt::trainer::block_saved(a, 3));
  EXPECT_EQ(t["block3.ln_1.mean"], 32 * KiB);
  EXPECT_EQ(t["block3.ln_1.rstd"], 32 * KiB);
  EXPECT_EQ(t["block3.ln_1.out"], 16 * MiB);
  EXPECT_EQ(t["block3.attn.qkv"], 48 * MiB);  // q, k, v: views of c_attn's output, saved by SDPA
  EXPECT_EQ(t["block3.attn.out"], 16 * MiB);  // SDPA's output, c_proj's input (the transpose back is a view)
  EXPECT_EQ(t["block3.attn.lse"], 8 * 16 * 1024 * 4);  // log-sum-exp, fp32 [B, H, T]: 512 KiB
  EXPECT_EQ(t["block3.residual"], 16 * MiB);
  EXPECT_EQ(t["block3.ln_2.out"], 16 * MiB);
  EXPECT_EQ(t["block3.mlp.fc"], 64 * MiB);   // GELU's input [N, 4096]
  EXPECT_EQ(t["block3.mlp.act"], 64 * MiB);  // GELU's output, c_proj's input
  EXPECT_EQ(t["block4.input"], 16 * MiB);    // the output, named for its consumer
  EXPECT_EQ(t.count("block3.attn.probs"), 0u);
  // 15 widths a token of its own plus the output: 16 x 16 MiB, and the fp32 statistics.
  EXPECT_EQ(sum(zt::trainer::block_saved(a, 3)), 256 * MiB + 4 * 32 * KiB + 512 * KiB);
}

TEST(DsMemory, EagerAttentionKeepsTheProbabilitiesAndTheMask) {
  const ActivationShape a = shape_of("350M", 8, 1024, /*flash=*/false, false);
  auto t = by_name(zt::trainer::block_saved(a, 0));
  EXPECT_EQ(t["block0.attn.probs"], int64_t(8) * 16 * 1024 * 1024 * 2);  // softmax's output [B, H, T, T]: 256 MiB
  EXPECT_EQ(t["block0.attn.mask"], 1024 * 1024);                          // T x T bools
  EXPECT_EQ(t["block0.attn.q"] + t["block0.attn.k"] + t["block0.attn.v"], 48 * MiB);  // matmul's copies
  EXPECT_EQ(t["block0.attn.out"], 16 * MiB);  // the contiguous copy of probs @ v
  EXPECT_EQ(t.count("block0.attn.qkv"), 0u);  // freed once copied
  EXPECT_EQ(t.count("block0.attn.scores"), 0u);
  EXPECT_EQ(sum(zt::trainer::block_saved(a, 0)), 256 * MiB + 4 * 32 * KiB + 256 * MiB + 1 * MiB);
  // The forward's peak inside the attention: the saved tensors so far and two score buffers.
  const auto r = zt::trainer::replay_ops(zt::trainer::block_forward_ops(a, 0));
  EXPECT_EQ(r.end, sum(zt::trainer::block_saved(a, 0)));
  EXPECT_GE(r.peak, r.end);
}

TEST(DsMemory, CheckpointingKeepsTheInputAndRecomputesInBackward) {
  const ActivationShape a = shape_of("1.5B", 8, 1024, true, /*ckpt=*/true);
  // 1.5B: width 1600; [N, 1600] bf16 is 25 MiB.
  const auto fwd = zt::trainer::replay_ops(zt::trainer::block_forward_ops(a, 5));
  EXPECT_EQ(fwd.end, 25 * MiB);  // block6.input only
  // Alive at once in the no-grad forward: the residual, GELU's input and output (1 + 4 + 4 widths),
  // freed before the output is made.
  EXPECT_EQ(fwd.peak, 9 * 25 * MiB);
  // Backward: the recomputed saved tensors (all but the input and the output) and the scratch,
  // then all of it and the input freed.
  std::vector<MemoryOp> ops = {MemoryOp{true, {"block5.input", DType::BF16, 8 * 1024 * 1600}}};
  const auto bwd_ops = zt::trainer::block_backward_ops(a, 5);
  ops.insert(ops.end(), bwd_ops.begin(), bwd_ops.end());
  const auto bwd = zt::trainer::replay_ops(ops);
  EXPECT_EQ(bwd.end, 0);
  const int64_t saved = sum(zt::trainer::block_saved(a, 5)) - 25 * MiB;  // without the output
  EXPECT_EQ(bwd.peak, 25 * MiB + saved + 4 * 25 * MiB);  // + GELU's two gradients less its output
}

// The head of 350M at B=8, T=1024: N x V = 8192 x 50257 logits; bf16 823,410,688 bytes, fp32 twice.
TEST(DsMemory, TheLossKeepsThreeFp32CopiesOfTheLogitsAtItsPeak) {
  const ActivationShape a = shape_of("350M", 8, 1024, true, false);
  const int64_t NV = int64_t(8192) * 50257;
  std::map<std::string, int64_t> bytes;
  for (const MemoryOp& op : zt::trainer::head_ops(a))
    if (op.alloc) bytes[op.term.name] = op.term.bytes();
  EXPECT_EQ(bytes["lm_head.logits"], 2 * NV);
  EXPECT_EQ(bytes["lm_head.logits_fp32"], 4 * NV);  // the loss's .float()
  EXPECT_EQ(bytes["lm_head.log_softmax"], 4 * NV);
  EXPECT_EQ(bytes["lm_head.grad_log_softmax"], 4 * NV);
  EXPECT_EQ(bytes["lm_head.grad_logits_fp32"], 4 * NV);
  EXPECT_EQ(bytes["lm_head.grad_logits"], 2 * NV);
  std::vector<MemoryOp> ops = {MemoryOp{true, {"final_ln.input", DType::BF16, 8192 * 1024}}};
  const auto head = zt::trainer::head_ops(a);
  ops.insert(ops.end(), head.begin(), head.end());
  const auto r = zt::trainer::replay_ops(ops);
  // Peak: the final LayerNorm's input and output (16 MiB each, two 32 KiB statistics) and, at
  // log_softmax's backward, its saved output with both fp32 gradients.
  EXPECT_EQ(r.peak, 2 * 16 * MiB + 2 * 32 * KiB + 3 * 4 * NV);
  EXPECT_EQ(r.end, 16 * MiB);  // grad.hidden, kept for the blocks' backward
  // In fp32 there is no upcast: log_softmax reads the logits themselves.
  const ActivationShape f = shape_of("350M", 8, 1024, true, false, DType::F32);
  for (const MemoryOp& op : zt::trainer::head_ops(f)) EXPECT_NE(op.term.name, "lm_head.logits_fp32");
}

TEST(DsMemory, AMicroStepFreesEverythingItMade) {
  for (bool flash : {true, false})
    for (bool ckpt : {true, false}) {
      const ActivationShape a = shape_of("124M", 2, 256, flash, ckpt);
      EXPECT_EQ(zt::trainer::replay_ops(zt::trainer::micro_step_ops(a)).end, 0) << flash << ckpt;
    }
}

// 350M's parameters as DeepSpeed partitions them: 12 a block (weights and biases), wte and wpe,
// the final LayerNorm's two. Below the default threshold (1e5) stay whole: biases and norms.
TEST(DsMemory, ParametersPartitionsAndPersistence) {
  const zt::model::Config c = preset("350M");
  const auto mods = zt::trainer::module_parameters(&c, zt::trainer::shape_of(c, "350M"), true);
  ASSERT_EQ(mods.size(), 26u);
  EXPECT_EQ(mods[0], (std::vector<int64_t>{50257 * 1024, 1024 * 1024}));
  EXPECT_EQ(mods[1].size(), 12u);
  int64_t total = 0;
  for (const auto& m : mods)
    for (int64_t n : m) total += n;
  EXPECT_EQ(total, 354823168);
  // A block's persistent elements: ln_1 and ln_2 (2 x 2C), the four biases (3C + C + 4C + C).
  EXPECT_EQ(zt::trainer::persistent_numel(mods[1], 100000), 4 * 1024 + 9 * 1024);
  EXPECT_EQ(zt::trainer::persistent_numel(mods[0], 100000), 0);
  EXPECT_EQ(zt::trainer::ds_partition_numel(1024 * 1024 + 1, 8), 131073);
}

TEST(DsMemory, TheIpgBucketFlushesWhenTheNextParameterWouldNotFit) {
  zt::trainer::IpgBucket b(/*capacity=*/1000, /*world=*/4, DType::BF16, /*offload=*/true);
  EXPECT_FALSE(b.needs_flush(600));  // empty: never
  b.add(600);
  EXPECT_FALSE(b.needs_flush(400));
  b.add(398);
  EXPECT_TRUE(b.needs_flush(3));
  const auto ops = b.flush();
  // torch.cat of both gradients padded to W (600 + 400 elements), the partitions' device copies
  // (150 + 100) and the fp32 copy of the larger partition (150): bf16 but the last.
  const auto r = zt::trainer::replay_ops(ops);
  EXPECT_EQ(r.end, 0);
  EXPECT_EQ(r.peak, 2048 + 512 + 1024);  // 2000 B, 500 B and 600 B, each rounded up to 512 B
  for (const MemoryOp& op : ops) EXPECT_EQ(op.stream, 1) << op.term.name;  // the reduce stream
  EXPECT_EQ(b.elements(), 0);
  EXPECT_TRUE(b.flush().empty());
  // One gradient that needs no padding is reduced where it is: no concatenation.
  zt::trainer::IpgBucket one(1000, 4, DType::BF16, false);
  one.add(800);
  EXPECT_TRUE(one.flush().empty());
}

TEST(DsMemory, SubGroupsCloseOnceTheyHoldSubGroupSize) {
  const std::vector<std::vector<int64_t>> mods = {{50, 30}, {40}, {100}, {5}};
  EXPECT_EQ(zt::trainer::ds_sub_group_partitions(mods, 60, 1), (std::vector<int64_t>{80, 40 + 100, 5}));
  EXPECT_EQ(zt::trainer::ds_sub_group_partitions(mods, 1000000000, 2), (std::vector<int64_t>{25 + 15 + 20 + 50 + 3}));
  // The group closes on this rank's partitions (partition_numel()), not the whole parameters: on 2 ranks a group of
  // 60 takes 25 + 15 + 20 (the whole 50 + 30 + 40 = 120 would have closed it after 80).
  const zt::trainer::Ds3SubGroups g = zt::trainer::ds3_sub_groups(mods, 60, 2);
  EXPECT_EQ(g.numel, (std::vector<int64_t>{25 + 15 + 20, 50 + 3}));
  EXPECT_EQ(g.module_group, (std::vector<int>{0, 0, 1, 1}));  // the group each module's last parameter falls in
  EXPECT_EQ(g.largest(), 60);
  // A frozen module (no parameters in any group) belongs to none.
  EXPECT_EQ(zt::trainer::ds3_sub_groups({{50, 30}, {}, {100}}, 60, 1).module_group, (std::vector<int>{0, -1, 1}));
}

// stage3.py's host set-up of one sub-group under offload_optimizer, whole (stand-ins freed at the end of each list):
// .to(cpu).clone().float() makes the 16-bit copies (two when the partition is on the device) and the fp32 master;
// initialize_optimizer_states' torch.zeros(n); the set-up step's moments.
TEST(DsMemory, StageThreeSubGroupSetUpIsWholeOnTheHost) {
  const int64_t n = 1000;
  auto on_device = zt::trainer::ds3_master_setup_ops(2, n, DType::BF16, true);
  ASSERT_EQ(on_device.size(), 6u);
  for (const MemoryOp& op : on_device) EXPECT_TRUE(op.host) << op.term.name;
  EXPECT_EQ(on_device[2].term.name, "sub_group[2].fp32_partition");
  EXPECT_EQ(on_device[2].term.bytes(), 4 * n);
  // Peak: both 16-bit copies beside the fp32 master (2n + 2n + 4n), all freed.
  EXPECT_EQ(zt::trainer::replay_ops(on_device).end, 0);
  EXPECT_EQ(zt::trainer::replay_ops(on_device).peak, int64_t(2048 + 2048 + 4096));  // each rounded to 512 B
  auto offloaded = zt::trainer::ds3_master_setup_ops(0, n, DType::BF16, false);
  EXPECT_EQ(offloaded.size(), 4u);
  EXPECT_EQ(zt::trainer::replay_ops(offloaded).peak, int64_t(2048 + 4096));
  auto grad = zt::trainer::ds3_grad_setup_ops(1, n);
  auto done = zt::trainer::ds3_grad_setup_done(1);
  grad.insert(grad.end(), done.begin(), done.end());
  EXPECT_EQ(grad[0].term.name, "sub_group[1].grad_zeros");
  EXPECT_EQ(zt::trainer::replay_ops(grad).peak, 4096);
  EXPECT_EQ(zt::trainer::replay_ops(grad).end, 0);
  auto moments = zt::trainer::ds3_moments_setup_ops(1, n);
  EXPECT_EQ(zt::trainer::replay_ops(moments).peak, 2 * 4096);
  EXPECT_EQ(zt::trainer::replay_ops(moments).end, 0);
}

// ---- against the DeepSpeed run (tests/data/ds_zero3_offload_350M_h200.csv)

struct Row {
  std::string kind;
  int64_t bytes = 0;
  double t_alloc = 0, t_free = 1e300;
};

std::vector<Row> read_ds_run() {
  std::ifstream f(std::string(ZT_SOURCE_DIR) + "/tests/data/ds_zero3_offload_350M_h200.csv");
  EXPECT_TRUE(f.good());
  std::vector<Row> rows;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#' || line.rfind("kind,", 0) == 0) continue;
    std::stringstream s(line);
    std::string kind, bytes, ta, tf;
    std::getline(s, kind, ',');
    std::getline(s, bytes, ',');
    std::getline(s, ta, ',');
    std::getline(s, tf, ',');
    Row r;
    r.kind = kind;
    r.bytes = std::stoll(bytes);
    r.t_alloc = std::stod(ta);
    if (!tf.empty()) r.t_free = std::stod(tf);
    rows.push_back(r);
  }
  return rows;
}

double peak_of(const std::vector<Row>& rows, const std::string& kind) {
  std::vector<std::pair<double, int64_t>> ev;
  for (const Row& r : rows)
    if (r.kind == kind) {
      ev.push_back({r.t_alloc, r.bytes});
      if (r.t_free < 1e299) ev.push_back({r.t_free, -r.bytes});
    }
  std::sort(ev.begin(), ev.end());
  int64_t cur = 0, peak = 0;
  for (auto& e : ev) peak = std::max(peak, cur += e.second);
  return double(peak);
}

int count_of(const std::vector<Row>& rows, const std::string& kind, int64_t bytes, int64_t slack = 0) {
  int n = 0;
  for (const Row& r : rows) n += r.kind == kind && r.bytes >= bytes && r.bytes <= bytes + slack;
  return n;
}

int64_t segment_of(int64_t bytes) {  // the cudaMalloc a miss of this many bytes makes
  return int64_t(zt::memory::segment_size_for(zt::memory::round_request(size_t(bytes))));
}

TEST(DsMemoryAgainstDeepSpeed, TheRunsSegmentsAreTheTermsRoundedAsTheCachingAllocatorDoes) {
  const std::vector<Row> rows = read_ds_run();
  ASSERT_GT(rows.size(), 600u);
  const int64_t P = 354823168, NV = int64_t(8192) * 50257;
  // Set-up: the bf16 partitions of every parameter in one buffer (defragment), the ipg bucket of
  // reduce_bucket_size 5e8 bf16 elements.
  EXPECT_EQ(segment_of(2 * P), 678 * MiB);
  EXPECT_EQ(count_of(rows, "device_segment", 678 * MiB), 2);  // and, in backward, the bucket's torch.cat
  EXPECT_EQ(segment_of(2 * 500000000), 954 * MiB);
  EXPECT_EQ(count_of(rows, "device_segment", 954 * MiB), 1);
  // The head: the bf16 logits, then fp32 upcast, log_softmax and (in backward) a gradient.
  EXPECT_EQ(segment_of(2 * NV), 786 * MiB);
  EXPECT_EQ(segment_of(4 * NV), 1572 * MiB);
  EXPECT_EQ(count_of(rows, "device_segment", 786 * MiB), 1);
  EXPECT_EQ(count_of(rows, "device_segment", 1572 * MiB), 3);  // the backward's second fp32 gradient reuses the upcast's
  // A block's widest activations, [N, 4096] bf16: 64 MiB segments, two a block in the first forward.
  EXPECT_GE(count_of(rows, "device_segment", 64 * MiB), 2 * 24);
  // Host: DeepSpeedCPUAdam's fp32 master weights and two moments (pageable, 4P each; a few KiB of
  // malloc's own), the pinned fp32 gradient and the bf16 gradient partitions rounded to powers of
  // two, and each step's bf16 copy of the master weights.
  const zt::model::Config c = preset("350M");
  const auto h = zt::trainer::ds_host_terms(zt::trainer::module_parameters(&c, zt::trainer::shape_of(c, "350M"), true),
                                           1, DType::BF16, false, 1000000000);
  EXPECT_EQ(h.master, 4 * P);
  // The master weights and two moments; at set-up the fp32 copy cloned into the master, a gradient
  // buffer and the zeros pinned into the fp32 gradient.
  EXPECT_EQ(count_of(rows, "pageable", h.master, 8 * KiB), 3 + 3);
  EXPECT_EQ(h.grad_fp32_pinned, 2048 * MiB);
  EXPECT_EQ(h.grad_partitions_pinned, 1024 * MiB);
  EXPECT_EQ(count_of(rows, "pinned", h.grad_fp32_pinned), 1);
  EXPECT_EQ(count_of(rows, "pinned", h.grad_partitions_pinned), 1);
  EXPECT_EQ(h.step_copy, 2 * P);
  EXPECT_GE(count_of(rows, "pageable", h.step_copy, 8 * KiB), 4);  // one each step
}

// `select` over rank 0's blocks alive when its step `step` ended, narrowed by `where`.
zt::db::QueryResult alive_at_step_end(zt::db::TraceReader& r, int step, const std::string& select,
                                      const std::string& where) {
  zt::db::QueryResult q;
  EXPECT_TRUE(r.query("WITH e AS (SELECT t_end FROM marker WHERE rank = 0 AND kind = 0 AND step = " + std::to_string(step) +
                          ") SELECT " + select + " FROM allocation_v, e WHERE rank = 0 AND level = 'block' AND t_alloc <= "
                          "e.t_end AND (t_free IS NULL OR t_free > e.t_end) AND " + where,
                      &q)
                  .ok());
  return q;
}

// The regression rows of issue 33: `zt train --virtual` against DeepSpeed 0.19.8's
// torch.cuda.max_memory_allocated() on one H200 (B=8, T=1024, ZeRO-3 + offload_optimizer, bf16).
zt::trainer::TrainConfig virtual_run(const std::string& model, bool ckpt) {
  zt::trainer::TrainConfig c;
  c.virtual_mode = true;
  c.model = model;
  c.data_samples = 1000;
  c.steps = 3;
  c.zero.stage = 3;
  c.zero.offload_optimizer = true;
  c.precision = "bf16";
  c.micro_batch = 8;
  c.seq_len = 1024;
  c.attention = "flash";
  c.activation_checkpointing = ckpt;
  c.device_memory = uint64_t(139.8 * GiB);
  c.quiet = true;
  return c;
}

TEST(DsMemoryAgainstDeepSpeed, Virtual350MPeakAllocatedWithinFivePercent) {
  zt::trainer::TrainSummary s;
  ASSERT_TRUE(zt::trainer::train(virtual_run("350M", false), nullptr, nullptr, &s).ok());
  const double ds = 12.30 * GiB;  // SDPA attention, no activation checkpointing
  std::printf("350M: zt --virtual peak %.2f GiB allocated (DeepSpeed 12.30 GiB: %+.1f%%), %.2f GiB reserved\n",
              s.peak_allocated / GiB, 100 * (s.peak_allocated / ds - 1), s.peak_reserved / GiB);
  EXPECT_NEAR(double(s.peak_allocated), ds, 0.05 * ds);
  // Reserved against the run's cudaMalloc segments (torch.cuda.memory_reserved()): within 10%.
  const double reserved = peak_of(read_ds_run(), "device_segment");
  EXPECT_NEAR(reserved / GiB, 15.18, 0.01);
  EXPECT_NEAR(double(s.peak_reserved), reserved, 0.10 * reserved);
}

// The host side of the same run, as DeepSpeed keeps it: the fp32 master weights and Adam's two
// moments pageable (12 bytes a parameter, 350M's 354,823,168 of them), the gradients pinned.
TEST(DsMemoryAgainstDeepSpeed, Virtual350MHostIsPageableStatesAndPinnedGradients) {
  zt::test::TempDir dir;
  auto r = zt::test::train_traced(virtual_run("350M", false), dir.file("h.db"));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  const zt::db::QueryResult q = alive_at_step_end(
      *r.reader, 1, "memory_kind, sum(requested_bytes)",
      "device = 'cpu' AND (name GLOB 'fp32_partitioned_groups_flat*' OR name GLOB 'adam.*' OR name GLOB '*.grad[[]shard]')"
      " GROUP BY 1 ORDER BY 1");
  std::map<std::string, int64_t> got;
  for (auto& row : q.rows) got[row[0]] = std::stoll(row[1]);
  const int64_t P = 354823168;
  EXPECT_EQ(got["pageable_host"], 12 * P);         // master, m, v
  EXPECT_EQ(got["pinned_host"], 4 * P + 2 * P);     // the fp32 gradient, the bf16 gradient partitions
  // Each step's bf16 copy of the master weights on its way up is one module's at a time, made and
  // dropped as that module's step runs (stage3.py's .to() of a sub-group's fp32 partition), never
  // all of them at once: they were, 2 bytes a parameter on the host for the whole optimizer step.
  zt::db::QueryResult o;
  ASSERT_TRUE(r.reader
                  ->query("SELECT count(*), (SELECT count(*) FROM allocation_v a JOIN allocation_v b ON a.rank = b.rank "
                          "AND a.id < b.id WHERE a.rank = 0 AND a.level = 'block' AND b.level = 'block' AND a.device = 'cpu' AND "
                          "b.device = 'cpu' AND a.name GLOB '*.update' AND b.name GLOB '*.update' AND b.t_alloc < a.t_free) "
                          "FROM allocation_v WHERE rank = 0 "
                          "AND level = 'block' AND device = 'cpu' AND memory_kind = 'pageable_host' AND name GLOB '*.update'",
                          &o)
                  .ok());
  ASSERT_EQ(o.rows.size(), 1u);
  EXPECT_GT(std::stoll(o.rows[0][0]), 0) << "the copies were made";
  EXPECT_EQ(o.rows[0][1], "0") << "two modules' copies alive at once";
}

TEST(DsMemoryAgainstDeepSpeed, Virtual1p5BCheckpointedPeakAllocatedWithinFivePercent) {
  zt::trainer::TrainSummary s;
  ASSERT_TRUE(zt::trainer::train(virtual_run("1.5B", true), nullptr, nullptr, &s).ok());
  const double ds = 9.72 * GiB;
  std::printf("1.5B + activation checkpointing: zt --virtual peak %.2f GiB allocated (DeepSpeed 9.72 GiB: %+.1f%%)\n",
              s.peak_allocated / GiB, 100 * (s.peak_allocated / ds - 1));
  EXPECT_NEAR(double(s.peak_allocated), ds, 0.05 * ds);
}

// Issue 30: what autograd keeps is freed by the backward that used it, in virtual mode and on the
// simulated GPU alike; nothing of it is alive between steps.
TEST(DsMemory, ActivationsAreFreedAfterBackwardInEveryMode) {
  for (bool virt : {true, false}) {
    zt::test::TempDir dir;
    zt::trainer::TrainConfig c = zt::test::tiny_run(2);
    c.precision = "bf16";
    c.zero.stage = 3;
    c.zero.offload_optimizer = true;
    c.virtual_mode = virt;
    if (virt) c.data_samples = 100;
    auto r = zt::test::train_traced(c, dir.file("a.db"));
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    zt::db::QueryResult q = alive_at_step_end(
        *r.reader, 0, "count(*)",
        "(name GLOB 'block*.*' OR name GLOB 'lm_head.*' OR name GLOB 'final_ln.*' OR name = 'activations' OR name = "
        "'grad.hidden') AND name NOT GLOB '*.shard' AND name NOT GLOB '*.param' AND name NOT GLOB '*.grad*'");
    ASSERT_EQ(q.rows.size(), 1u);
    EXPECT_EQ(q.rows[0][0], "0") << (virt ? "virtual" : "simulated GPU");
    // ... and they were there during the step.
    ASSERT_TRUE(r.reader->query("SELECT count(*) FROM allocation_v WHERE name = 'block1.mlp.act' AND level = 'block'", &q).ok());
    EXPECT_EQ(q.rows[0][0], "2") << "one a step";
  }
}

}  // namespace

namespace {
zt::trainer::TrainConfig virtual_z3(int64_t world, bool offload) {
  zt::trainer::TrainConfig c;
  c.virtual_mode = true;
  c.model = "124M";
  c.world_size = world;
  c.data_samples = 100;
  c.steps = 2;
  c.zero.stage = 3;
  c.zero.offload_optimizer = offload;
  c.precision = "bf16";
  c.micro_batch = 1;
  c.seq_len = 64;
  c.attention = "sdpa";
  c.device_memory = uint64_t(80) << 30;
  c.quiet = true;
  return c;
}
}  // namespace

// Stage 3 fetches a module's parameters one buffer each (partition_parameters.py: ceil(numel / W) x W elements of
// the compute dtype), those below the persistence threshold (1e5) whole on every rank already: GPT-2's block has
// four above it (c_attn, attn c_proj, c_fc, mlp c_proj), so an OOM in a fetch asks for one parameter, as
// DeepSpeed's param_buffer = torch.empty(...) does.
TEST(DsMemory, StageThreeGathersParameterByParameter) {
  zt::test::TempDir dir;
  auto r = zt::test::train_traced(virtual_z3(4, false), dir.file("g.db"));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  zt::db::QueryResult q;
  ASSERT_TRUE(r.reader
                  ->query("SELECT name, max(requested_bytes) FROM allocation_v WHERE rank = 0 AND level = 'block' AND "
                          "name GLOB 'block0.gathered*' GROUP BY name ORDER BY name",
                          &q)
                  .ok());
  ASSERT_EQ(q.rows.size(), 4u);
  EXPECT_EQ(q.rows[0], (std::vector<std::string>{"block0.gathered[0]", std::to_string(768 * 2304 * 2)}));
  EXPECT_EQ(q.rows[2], (std::vector<std::string>{"block0.gathered[2]", std::to_string(768 * 3072 * 2)}));
}

// Under offload_optimizer the host's set-up goes a sub-group at a time, whole (stage3.py): with 124M on 2 ranks
// and sub_group_size 2e7, a host too small for the fp32 states runs out asking for one sub-group's fp32
// partition, not one module's master.
TEST(DsMemory, StageThreeHostSetUpAsksForASubGroup) {
  zt::test::TempDir dir;
  zt::trainer::TrainConfig c = virtual_z3(2, true);
  c.zero.sub_group_size = 20000000;
  c.host_memory = uint64_t(200) << 20;  // 124M: 62M a rank, 16 bytes each in states; the masters alone 237 MiB
  auto r = zt::test::train_traced(c, dir.file("h.db"));
  ASSERT_FALSE(r.status.ok());
  zt::db::QueryResult q;
  ASSERT_TRUE(r.reader->query("SELECT message FROM error", &q).ok());
  ASSERT_EQ(q.rows.size(), 1u);
  EXPECT_NE(q.rows[0][0].find("for 'sub_group["), std::string::npos) << q.rows[0][0];
  // Every sub-group but the last holds 2e7 partition elements or more (fp32: >= 76.29 MiB).
  const zt::model::Config c124 = preset("124M");
  const auto mods = zt::trainer::module_parameters(&c124, zt::trainer::shape_of(c124, "124M"), true);
  const auto groups = zt::trainer::ds3_sub_groups(mods, 20000000, 2);
  ASSERT_GE(groups.numel.size(), 2u);
  EXPECT_GE(groups.numel[0], 20000000);
}
