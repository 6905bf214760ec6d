// tests/inject/check_traces.h: small hand-built traces for the `zt check` tests, written with
// db::TraceWriter so every row is exactly what a case needs.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "zt/db/trace_writer.h"

namespace zt::test {

class TraceBuilder {
 public:
  explicit TraceBuilder(const std::string& path) {
    Status s = db::TraceWriter::create(path, &w_);
    EXPECT_TRUE(s.ok()) << s.message();
    w_->begin();
  }

  int64_t name(const std::string& text) {
    auto it = names_.find(text);
    if (it != names_.end()) return it->second;
    int64_t id = int64_t(names_.size()) + 1;
    w_->insert(db::StringRow{id, text});
    names_[text] = id;
    return id;
  }
  // t_end: when the run ended (default 1000 s; none when it never closed its trace).
  void run(const std::string& config_json, db::RunStatus status = db::RunStatus::Ok,
           std::optional<int64_t> t_end = std::nullopt) {
    db::RunRow r;
    r.tool_version = "test";
    r.command_line = "check_test";
    r.config_json = config_json;
    r.hostname = "testhost";
    r.t_start = 0;
    r.status = status;
    if (status != db::RunStatus::Running) {  // a process that died without closing its trace ends nothing
      r.t_end = t_end.value_or(1'000'000'000'000);
      r.exit_code = status == db::RunStatus::Ok ? 0 : 1;
    }
    if (status == db::RunStatus::Failed) r.exit_detail = "step 8: CUDA out of memory";
    w_->insert(r);
  }
  void rank(int64_t rank, int64_t world) {
    db::RankRow r;
    r.rank = rank;
    r.world_size = world;
    r.hostname = "testhost";
    w_->insert(r);
  }
  // A process of a probed run that is not a rank (rank.role): a launcher or a helper.
  void process(int64_t key, db::RankRole role, int64_t pid, std::optional<int64_t> job_rank = {}) {
    db::RankRow r;
    r.rank = key;
    r.hostname = "testhost";
    r.pid = pid;
    r.role = role;
    r.job_rank = job_rank;
    w_->insert(r);
  }
  int64_t device(int64_t rank, db::DeviceKind kind, const std::string& label, std::optional<int64_t> capacity = {}) {
    db::DeviceRow d;
    d.id = ++devices_;
    d.rank = rank;
    d.kind = kind;
    d.ordinal = rank;
    d.label = label;
    d.name = kind == db::DeviceKind::Cpu ? "host memory" : "simulated GPU";
    d.capacity_bytes = capacity;
    d.simulated = kind == db::DeviceKind::Sim;
    w_->insert(d);
    return d.id;
  }
  int64_t alloc(int64_t rank, int64_t device, db::MemoryKind kind, const std::string& tensor, int64_t bytes,
                int64_t t_alloc, std::optional<int64_t> t_free, db::AllocLevel level = db::AllocLevel::Block,
                std::optional<int64_t> weight_bytes = std::nullopt) {
    db::AllocationRow a;
    a.id = ++allocs_;
    a.rank = rank;
    a.device_id = device;
    a.memory_kind = kind;
    a.level = level;
    a.address = 0x1000 * uint64_t(a.id);
    a.bytes = a.requested_bytes = bytes;
    a.t_alloc = t_alloc;
    a.t_free = t_free;
    a.name_id = name(tensor);
    a.weight_bytes = weight_bytes;  // set: a sampled row (the probe's byte sampler), standing for this many bytes
    w_->insert(a);
    return a.id;
  }
  void placement(int64_t rank, int64_t t, const std::string& tensor, int64_t device, db::PlacementWhy why,
                 int64_t bytes, int64_t allocation = 0) {
    db::PlacementRow p;
    p.id = ++placements_;
    p.rank = rank;
    p.t = t;
    p.tensor_id = name(tensor);
    p.device_id = device;
    p.why = why;
    p.bytes = bytes;
    p.allocation_id = allocation;
    w_->insert(p);
  }
  void marker(int64_t rank, db::MarkerKind kind, const std::string& n, int64_t t0, std::optional<int64_t> t1,
              std::optional<int64_t> step, std::optional<int64_t> epoch) {
    db::MarkerRow m;
    m.id = ++markers_;
    m.rank = rank;
    m.kind = kind;
    m.name_id = name(n);
    m.t_start = t0;
    m.t_end = t1;
    m.step = step;
    m.epoch = epoch;
    w_->insert(m);
  }
  void counter(int64_t rank, int64_t device, const std::string& n, int64_t t, double v) {
    db::CounterRow c;
    c.id = ++counters_;
    c.rank = rank;
    c.device_id = device;
    c.name_id = name(n);
    c.t = t;
    c.value = v;
    w_->insert(c);
  }
  void error(const db::ErrorRow& e) {
    db::ErrorRow r = e;
    r.id = ++errors_;
    w_->insert(r);
  }
  void finish() {
    w_->commit();
    Status s = w_->finish();
    EXPECT_TRUE(s.ok()) << s.message();
    w_.reset();
  }

 private:
  std::unique_ptr<db::TraceWriter> w_;
  std::map<std::string, int64_t> names_;
  int64_t devices_ = 0, allocs_ = 0, placements_ = 0, markers_ = 0, counters_ = 0, errors_ = 0;
};

constexpr int64_t kMiB = 1 << 20;
constexpr int64_t kGiB = int64_t(1) << 30;

// A training-shaped trace: per rank a host device and a simulated GPU; model states made before
// epoch 0 and kept to the end (parameters on the GPU, fp32 master weights and Adam moments in
// pinned host memory when offloaded); per step activations, a gathered module and a staged
// parameter shard, all freed within the step; the GPU's caching allocator reserves another
// segment during epoch 0 and keeps it (its blocks are what counts). Times in ns: step s runs
// from 1000 + 100 s to 1000 + 100 s + 90.
struct RunShape {
  int ranks = 1;
  int epochs = 3;
  int steps_per_epoch = 4;
  int64_t leak_per_epoch = 0;        // pinned host bytes kept at each epoch's end, never freed
  int64_t lazy_state_bytes = 0;      // pinned host bytes created in epoch 0's first step and kept
  bool offload = true;               // optimizer and parameter offload in the config
  std::optional<double> offload_ratio;  // with offload: DeepSpeed's offload_optimizer block with this ratio
  std::optional<int64_t> steps_run;  // stop early: the run died after this many steps
  bool write_plan = true;            // the data.* counters
  std::optional<db::RunStatus> status;  // how the run row says it ended (default: failed when cut short)
};

inline int64_t step_t0(int64_t step) { return 1000 + 100 * step; }

inline void build_run(TraceBuilder& b, const RunShape& s) {
  const std::string cfg =
      !s.offload        ? R"({"model":"tiny","zero_optimization":{"stage":0}})"
      : s.offload_ratio ? R"({"model":"tiny","zero_optimization":{"stage":3,"offload_optimizer":{"device":"cpu","ratio":)" +
                              std::to_string(*s.offload_ratio) + R"(},"offload_param":true}})"
                        : R"({"model":"tiny","zero_optimization":{"stage":3,"offload_optimizer":true,"offload_param":true}})";
  const int64_t planned = int64_t(s.epochs) * s.steps_per_epoch;
  const int64_t ran = s.steps_run.value_or(planned);
  b.run(cfg, s.status.value_or(ran < planned ? db::RunStatus::Failed : db::RunStatus::Ok));
  const int64_t t_end = step_t0(planned) + 500;
  for (int r = 0; r < s.ranks; ++r) {
    b.rank(r, s.ranks);
    int64_t host = b.device(r, db::DeviceKind::Cpu, "cpu");
    int64_t gpu = b.device(r, db::DeviceKind::Sim, "cuda:" + std::to_string(r), 80 * kGiB);
    auto pinned = db::MemoryKind::PinnedHost;
    auto dev = db::MemoryKind::Device;
    b.alloc(r, gpu, dev, "segment", 64 * kMiB, 10, std::nullopt, db::AllocLevel::Segment);
    b.alloc(r, gpu, dev, "segment", 32 * kMiB, step_t0(1) + 5, std::nullopt, db::AllocLevel::Segment);
    for (int g = 0; g < 4; ++g) {
      const std::string i = std::to_string(g);
      b.alloc(r, gpu, dev, "block" + i + ".param", 2 * kMiB, 20 + g, t_end);
      auto opt_dev = s.offload ? host : gpu;
      auto opt_kind = s.offload ? pinned : dev;
      b.alloc(r, opt_dev, opt_kind, "fp32_partitioned_groups_flat[" + i + "]", 4 * kMiB, 30 + g, t_end);
      b.alloc(r, opt_dev, opt_kind, "fp32_partitioned_groups_flat[" + i + "].grad", 4 * kMiB, 40 + g, t_end);
      b.alloc(r, opt_dev, opt_kind, "adam.m[block" + i + "]", 4 * kMiB, 50 + g, t_end);
      b.alloc(r, opt_dev, opt_kind, "adam.v[block" + i + "]", 4 * kMiB, 60 + g, t_end);
      if (s.offload) b.alloc(r, host, pinned, "block" + i + ".shard", kMiB, 70 + g, t_end);
    }
    b.alloc(r, host, db::MemoryKind::PageableHost, "batch.tokens", 4096, 80, t_end);
    int64_t step = 0;
    for (int e = 0; e < s.epochs && step < ran; ++e) {
      const int64_t e0 = step_t0(step) - 5;
      int k = 0;
      for (; k < s.steps_per_epoch && step < ran; ++k, ++step) {
        const int64_t t0 = step_t0(step);
        b.marker(r, db::MarkerKind::Step, "step " + std::to_string(step), t0, t0 + 90, step, e);
        b.alloc(r, gpu, dev, "activations", 8 * kMiB, t0 + 1, t0 + 80);
        if (s.offload) b.alloc(r, gpu, dev, "block0.shard", kMiB, t0 + 2, t0 + 4);  // staged H2D in a fetch
        b.alloc(r, gpu, dev, "block0.gathered", 2 * kMiB, t0 + 3, t0 + 20);
        b.alloc(r, host, db::MemoryKind::PageableHost, "global_grad_norm", 4, t0 + 60, t0 + 61);
        if (e == 0 && k == 0 && s.lazy_state_bytes)
          b.alloc(r, host, pinned, "lazy.state", s.lazy_state_bytes, t0 + 70, t_end);
      }
      const int64_t e1 = step_t0(step) - 8;
      const bool complete = k == s.steps_per_epoch;
      if (s.leak_per_epoch && complete)
        b.alloc(r, host, pinned, "offload.buffer[epoch " + std::to_string(e) + "]", s.leak_per_epoch, e1 - 1, std::nullopt);
      b.marker(r, db::MarkerKind::Epoch, "epoch " + std::to_string(e), e0,
               complete ? std::optional<int64_t>(e1) : std::nullopt, std::nullopt, e);
      if (r == 0 && s.write_plan) b.counter(0, 0, "data.samples_used", e1, double((e + 1) * s.steps_per_epoch * 2));
    }
    if (ran < planned)  // the step that died
      b.marker(r, db::MarkerKind::Step, "step " + std::to_string(ran), step_t0(ran), std::nullopt, ran, ran / s.steps_per_epoch);
  }
  if (s.write_plan) {
    b.counter(0, 0, "data.documents", 5, 12);
    b.counter(0, 0, "data.documents_dropped", 5, 3);
    b.counter(0, 0, "data.documents_truncated", 5, 1);
    b.counter(0, 0, "data.samples_per_epoch", 5, 2.0 * s.steps_per_epoch);
    b.counter(0, 0, "data.steps_per_epoch", 5, s.steps_per_epoch);
    b.counter(0, 0, "data.steps_planned", 5, double(planned));
  }
}

}  // namespace zt::test
