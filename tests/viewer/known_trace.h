// tests/viewer/known_trace.h: writes a small trace with exactly known content through
// zt::db::TraceWriter, so viewer tests can say where things must be: one memory peak at a
// known time, one fault and one error at known times, a pinned buffer leaked at each epoch
// end (with a call stack), and one gradient partition placed on the wrong device. A second
// trace (write_mismatch_trace) has the shape of `zt repro r2-...-device-mismatch`'s bug.db.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "zt/db/trace_writer.h"

namespace zt::test {

struct KnownTrace {
  static constexpr int64_t kMs = 1'000'000;
  static constexpr int64_t kMiB = 1ll << 20, kGiB = 1ll << 30;
  static constexpr int64_t kT0 = 5'000'000'000;  // start of step 0
  static constexpr int kSteps = 10, kStepsPerEpoch = 5;
  static constexpr int64_t kStepNs = 100 * kMs;
  static constexpr int64_t kPeakStart = kT0 + 6 * kStepNs + 60 * kMs;  // checkpoint gather in step 6
  static constexpr int64_t kPeakEnd = kPeakStart + 10 * kMs;
  static constexpr int64_t kPeakBytes = 3 * kGiB + 512 * kMiB;  // gather + act + grad
  static constexpr int64_t kFaultT = kT0 + 300 * kMs;
  static constexpr int64_t kErrorT = kT0 + 820 * kMs;
  static constexpr int64_t kEnd = kT0 + kSteps * kStepNs + 5 * kMs;
  static constexpr int64_t kCapacity = 4 * kGiB;
  static int64_t step_start(int s) { return kT0 + s * kStepNs; }
};

// Writes the known trace to `path`; returns false on failure (with *error set).
inline bool write_known_trace(const std::string& path, std::string* error) {
  using namespace zt::db;
  using K = KnownTrace;
  std::unique_ptr<TraceWriter> w;
  if (Status s = TraceWriter::create(path, &w); !s) {
    *error = s.message();
    return false;
  }
  std::map<std::string, int64_t> ids;
  auto str = [&](const std::string& t) {
    auto it = ids.find(t);
    if (it != ids.end()) return it->second;
    int64_t id = int64_t(ids.size()) + 1;
    ids[t] = id;
    w->insert(StringRow{id, t});
    return id;
  };
  w->begin();
  RunRow run;
  run.tool_version = "test";
  run.command_line = "known trace";
  run.t_start = K::kT0 - 10 * K::kMs;
  run.t_end = K::kEnd;
  run.status = RunStatus::Ok;
  w->insert(run);
  RankRow rank;
  w->insert(rank);
  DeviceRow gpu{1, 0, DeviceKind::Sim, 0, "cuda:0", "simulated GPU", K::kCapacity, true};
  DeviceRow cpu{2, 0, DeviceKind::Cpu, 0, "cpu", "host", std::nullopt, false};
  w->insert(gpu);
  w->insert(cpu);
  w->insert(FrameRow{1, 0x401000, "/usr/bin/trainer", 0x1000, "main", std::nullopt});
  w->insert(FrameRow{2, 0x402000, "/usr/bin/trainer", 0x2000, "zt::offload::make_buffer", std::nullopt});
  w->insert(StackRow{1, 0, 1});
  w->insert(StackRow{2, 1, 2});

  int64_t alloc_id = 0, xfer_id = 0, marker_id = 0, place_id = 0;
  auto alloc = [&](int64_t dev, MemoryKind kind, const std::string& name, int64_t bytes, int64_t t0,
                   std::optional<int64_t> t1, int64_t stack = 0) {
    AllocationRow a;
    a.id = ++alloc_id;
    a.device_id = dev;
    a.memory_kind = kind;
    a.level = kind == MemoryKind::Device ? AllocLevel::Block : AllocLevel::Segment;
    a.address = 0x10000000ull * uint64_t(a.id);
    a.bytes = a.requested_bytes = bytes;
    a.t_alloc = t0;
    a.t_free = t1;
    a.name_id = str(name);
    a.stack_id = stack;
    w->insert(a);
  };
  auto marker = [&](MarkerKind kind, const std::string& name, int64_t t0, int64_t t1, int64_t step, int64_t epoch) {
    MarkerRow m;
    m.id = ++marker_id;
    m.kind = kind;
    m.name_id = str(name);
    m.t_start = t0;
    m.t_end = t1;
    if (step >= 0) m.step = step;
    if (epoch >= 0) m.epoch = epoch;
    w->insert(m);
  };
  auto transfer = [&](TransferKind kind, const std::string& name, int64_t bytes, int64_t src, int64_t dst, int64_t t0,
                      int64_t t1, const std::string& op = "") {
    TransferRow x;
    x.id = ++xfer_id;
    x.kind = kind;
    x.bytes = bytes;
    x.src_device_id = src;
    x.dst_device_id = dst;
    x.t_start = t0;
    x.t_end = t1;
    x.name_id = str(name);
    if (!op.empty()) x.op_id = str(op);
    w->insert(x);
  };
  auto place = [&](const std::string& tensor, int64_t dev, int64_t t) {
    PlacementRow p;
    p.id = ++place_id;
    p.t = t;
    p.tensor_id = str(tensor);
    p.device_id = dev;
    p.why = PlacementWhy::Created;
    w->insert(p);
  };

  alloc(2, MemoryKind::PinnedHost, "block0.master", 512 * K::kMiB, K::kT0 - 5 * K::kMs, K::kEnd);
  for (int b = 0; b < 4; ++b)  // gradient partitions live on the host, except block2's
    place("block" + std::to_string(b) + ".grad[shard]", b == 2 ? 1 : 2, K::kT0 + K::kMs);
  for (int e = 0; e < K::kSteps / K::kStepsPerEpoch; ++e) {
    int64_t e0 = K::step_start(e * K::kStepsPerEpoch), e1 = K::step_start((e + 1) * K::kStepsPerEpoch);
    marker(MarkerKind::Epoch, "epoch " + std::to_string(e), e0, e1, -1, e);
    // The leak: a pinned offload buffer made at each epoch end and never freed.
    alloc(2, MemoryKind::PinnedHost, "offload.buffer[epoch " + std::to_string(e) + "]", K::kGiB, e1 - K::kMs,
          std::nullopt, 2);
  }
  for (int s = 0; s < K::kSteps; ++s) {
    int64_t t = K::step_start(s);
    int e = s / K::kStepsPerEpoch;
    marker(MarkerKind::Step, "step " + std::to_string(s), t, t + K::kStepNs, s, e);
    marker(MarkerKind::Phase, "forward", t, t + 40 * K::kMs, s, e);
    marker(MarkerKind::Phase, "backward", t + 40 * K::kMs, t + 90 * K::kMs, s, e);
    transfer(TransferKind::H2D, "blockA.shard", 64 * K::kMiB, 2, 1, t + 5 * K::kMs, t + 10 * K::kMs);
    transfer(TransferKind::Collective, "blockA.gathered", 512 * K::kMiB, 1, 1, t + 10 * K::kMs, t + 12 * K::kMs,
             "all_gather");
    transfer(TransferKind::D2H, "blockA.grad[shard]", 128 * K::kMiB, 1, 2, t + 85 * K::kMs, t + 88 * K::kMs);
    alloc(1, MemoryKind::Device, "blockA.gathered", 512 * K::kMiB, t + 10 * K::kMs, t + 30 * K::kMs);
    alloc(1, MemoryKind::Device, "blockA.act", 256 * K::kMiB, t + 20 * K::kMs, t + 80 * K::kMs);
    alloc(1, MemoryKind::Device, "blockA.grad", 256 * K::kMiB, t + 50 * K::kMs, t + 85 * K::kMs);
    if (s == 6) alloc(1, MemoryKind::Device, "checkpoint.gather", 3 * K::kGiB, K::kPeakStart, K::kPeakEnd);
  }
  FaultRow f;
  f.id = 1;
  f.t = K::kFaultT;
  f.name = "wrong_device_grad";
  f.trigger = "step 3";
  f.step = 3;
  f.details = "left block2's gradient partition on cuda:0";
  w->insert(f);
  ErrorRow err;
  err.id = 1;
  err.t = K::kErrorT;
  err.step = 8;
  err.kind = "RuntimeError";
  err.message = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!";
  err.tensors = "[\"block2.grad[shard]\"]";
  err.device_id = 1;
  w->insert(err);
  w->commit();
  if (Status s = w->finish(); !s) {
    *error = s.message();
    return false;
  }
  return true;
}

// The shape of r2's bug.db (ZeRO-3 with the optimizer offloaded, one fp32 gradient partition
// left on the GPU): two ranks, each with a host and a GPU. Every fp32 partition and its .grad
// live on the host for the whole run; partition 3's .grad also lives on cuda:<rank> for a while
// (created after, freed just before its host copy), and an error row per rank names it with
// the trainer's "@device" suffix. Rank 0's GPU also runs one long kernel with a known name.
struct MismatchTrace {
  static constexpr int64_t kMs = 1'000'000;
  static constexpr int64_t kT0 = 1'000 * kMs;          // start of step 0
  static constexpr int64_t kEnd = kT0 + 40 * kMs;
  static constexpr int64_t kGpuGradStart = kT0 + 20 * kMs;  // partition 3's .grad on the GPU
  static constexpr int64_t kGpuGradEnd = kT0 + 32 * kMs;
  static constexpr int64_t kKernelStart = kT0 + 2 * kMs, kKernelEnd = kT0 + 14 * kMs;
  static constexpr const char* kKernelName = "adam_step_kernel";
  static constexpr const char* kWrongTensor = "fp32_partitioned_groups_flat[3].grad";
};

inline bool write_mismatch_trace(const std::string& path, std::string* error) {
  using namespace zt::db;
  using M = MismatchTrace;
  std::unique_ptr<TraceWriter> w;
  if (Status s = TraceWriter::create(path, &w); !s) {
    *error = s.message();
    return false;
  }
  std::map<std::string, int64_t> ids;
  auto str = [&](const std::string& t) {
    auto [it, fresh] = ids.emplace(t, int64_t(ids.size()) + 1);
    if (fresh) w->insert(StringRow{it->second, t});
    return it->second;
  };
  w->begin();
  RunRow run;
  run.tool_version = "test";
  run.command_line = "mismatch trace";
  run.t_start = M::kT0 - M::kMs;
  run.t_end = M::kEnd;
  run.status = RunStatus::Failed;
  w->insert(run);
  int64_t place_id = 0, marker_id = 0;
  for (int r = 0; r < 2; ++r) {
    w->insert(RankRow{r, 1, 2, r, "h", 100 + r});
    const int64_t host = 1 + 2 * r, gpu = 2 + 2 * r;
    w->insert(DeviceRow{host, r, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false});
    w->insert(DeviceRow{gpu, r, DeviceKind::Sim, r, "cuda:" + std::to_string(r), "simulated GPU", 64ll << 20, true});
    MarkerRow step;
    step.id = ++marker_id, step.rank = r, step.kind = MarkerKind::Step, step.name_id = str("step 0");
    step.t_start = M::kT0, step.t_end = M::kEnd - M::kMs, step.step = 0;
    w->insert(step);
    auto place = [&](const std::string& tensor, int64_t dev, int64_t t, PlacementWhy why) {
      PlacementRow p;
      p.id = ++place_id, p.rank = r, p.t = t, p.tensor_id = str(tensor), p.device_id = dev, p.why = why;
      p.bytes = 256;
      w->insert(p);
    };
    for (int g = 0; g < 4; ++g) {
      std::string flat = "fp32_partitioned_groups_flat[" + std::to_string(g) + "]";
      place(flat, host, M::kT0 + g * M::kMs / 10, PlacementWhy::Created);
      place(flat + ".grad", host, M::kT0 + g * M::kMs / 10 + 1000, PlacementWhy::Created);
    }
    place(M::kWrongTensor, gpu, M::kGpuGradStart, PlacementWhy::Created);
    place(M::kWrongTensor, gpu, M::kGpuGradEnd, PlacementWhy::Freed);
    place(M::kWrongTensor, host, M::kGpuGradEnd + 1000, PlacementWhy::Freed);
    ErrorRow err;
    err.id = 1 + r, err.rank = r, err.t = M::kGpuGradEnd - M::kMs, err.step = 0, err.kind = "device_mismatch";
    err.site = "unscale_and_clip_grads";
    err.message = "Expected all tensors to be on the same device, but found at least two devices, cpu and cuda:" +
                  std::to_string(r) + "!";
    err.tensors = "[\"combined_scale@cpu\",\"" + std::string(M::kWrongTensor) + "@cuda:" + std::to_string(r) + "\"]";
    err.device_id = gpu;
    w->insert(err);
  }
  KernelRow k;
  k.id = 1, k.rank = 0, k.device_id = 2, k.name_id = str(MismatchTrace::kKernelName);
  k.t_start = MismatchTrace::kKernelStart, k.t_end = MismatchTrace::kKernelEnd;
  w->insert(k);
  w->commit();
  if (Status s = w->finish(); !s) {
    *error = s.message();
    return false;
  }
  return true;
}

}  // namespace zt::test
