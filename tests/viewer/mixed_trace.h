// tests/viewer/mixed_trace.h: a trace whose detail stopped at its size cap (db/SCHEMA.md,
// "Aggregates"), written through zt::db::TraceWriter with exactly known content: 20 steps of
// 100 ms in 2 epochs; full detail (allocations on a simulated GPU and the host) for steps 0-5, then
// step_memory alone for steps 6-19, in which the GPU's allocated bytes at each step's end grow by
// 128 MiB a step (what the viewer must draw there, not an empty track); detail_span ends at
// kDetailEnd with the cap's reason.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "zt/db/trace_writer.h"

namespace zt::test {

struct MixedTrace {
  static constexpr int64_t kMs = 1'000'000;
  static constexpr int64_t kMiB = 1ll << 20, kGiB = 1ll << 30;
  static constexpr int64_t kT0 = 5'000'000'000;
  static constexpr int kSteps = 20, kStepsPerEpoch = 10, kDetailSteps = 6;
  static constexpr int64_t kStepNs = 100 * kMs;
  static constexpr int64_t kDetailEnd = kT0 + kDetailSteps * kStepNs - kMs;
  static constexpr int64_t kCapacity = 6 * kGiB;
  static constexpr int64_t kActivation = 1 * kGiB;  // made and freed in each step with detail
  static int64_t step_start(int s) { return kT0 + s * kStepNs; }
  static int64_t step_end(int s) { return step_start(s) + 90 * kMs; }
  // The GPU's allocated bytes at step s's end (the detail's steps: 0), its reserved bytes.
  static int64_t allocated_at_end(int s) { return s < kDetailSteps ? 0 : int64_t(s - kDetailSteps + 1) * 128 * kMiB; }
  static int64_t reserved_at_end(int s) { return s < kDetailSteps ? 2 * kGiB : 4 * kGiB; }
  static constexpr const char* kReason = "the trace reached its size cap of 1.00 MiB (--max-trace)";
};

inline bool write_mixed_trace(const std::string& path, std::string* error) {
  using namespace zt::db;
  using M = MixedTrace;
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
  run.command_line = "mixed trace";
  run.t_start = M::kT0 - 10 * M::kMs;
  run.t_end = M::step_start(M::kSteps);
  run.status = RunStatus::Ok;
  w->insert(run);
  w->insert(RankRow{});
  w->insert(DeviceRow{1, 0, DeviceKind::Sim, 0, "cuda:0", "simulated GPU", M::kCapacity, true});
  w->insert(DeviceRow{2, 0, DeviceKind::Cpu, 0, "cpu", "host", std::nullopt, false});
  int64_t alloc_id = 0, marker_id = 0, step_id = 0;
  auto alloc = [&](int64_t dev, MemoryKind kind, AllocLevel level, const std::string& name, int64_t bytes, int64_t t0,
                   std::optional<int64_t> t1, int64_t segment = 0) {
    AllocationRow a;
    a.id = ++alloc_id;
    a.device_id = dev;
    a.memory_kind = kind;
    a.level = level;
    a.address = 0x10000000ull * uint64_t(a.id);
    a.bytes = a.requested_bytes = bytes;
    a.t_alloc = t0;
    a.t_free = t1;
    a.name_id = str(name);
    a.segment_id = segment;
    w->insert(a);
    return a.id;
  };
  // The detail: a 2 GiB segment and a 256 MiB pinned buffer for the run, an activation per step.
  const int64_t seg = alloc(1, MemoryKind::Device, AllocLevel::Segment, "segment0", 2 * M::kGiB, M::kT0 - 5 * M::kMs,
                            std::nullopt);
  alloc(2, MemoryKind::PinnedHost, AllocLevel::Segment, "offload.buffer", 256 * M::kMiB, M::kT0 - 4 * M::kMs, std::nullopt);
  for (int s = 0; s < M::kDetailSteps; ++s)
    alloc(1, MemoryKind::Device, AllocLevel::Block, "block0.act", M::kActivation, M::step_start(s) + 10 * M::kMs,
          M::step_start(s) + 80 * M::kMs, seg);
  auto marker = [&](MarkerKind kind, const std::string& name, int64_t t0, int64_t t1, int64_t step, int64_t epoch) {
    MarkerRow m;
    m.id = ++marker_id;
    m.kind = kind;
    m.name_id = str(name);
    m.t_start = t0;
    m.t_end = t1;
    if (step >= 0) m.step = step;
    m.epoch = epoch;
    w->insert(m);
  };
  for (int e = 0; e < M::kSteps / M::kStepsPerEpoch; ++e)
    marker(MarkerKind::Epoch, "epoch " + std::to_string(e), M::step_start(e * M::kStepsPerEpoch),
           M::step_end((e + 1) * M::kStepsPerEpoch - 1), -1, e);
  for (int s = 0; s < M::kSteps; ++s) {
    const int epoch = s / M::kStepsPerEpoch;
    marker(MarkerKind::Step, "step " + std::to_string(s), M::step_start(s), M::step_end(s), s, epoch);
    if (s < M::kDetailSteps)
      marker(MarkerKind::Phase, "forward", M::step_start(s) + 5 * M::kMs, M::step_start(s) + 45 * M::kMs, s, epoch);
    // The aggregates, every step: the GPU's and the host's.
    StepMemoryRow g;
    g.id = ++step_id;
    g.device_id = 1;
    g.step = s;
    g.epoch = epoch;
    g.t_start = M::step_start(s);
    g.t_end = M::step_end(s);
    g.allocated_bytes = M::allocated_at_end(s);
    g.reserved_bytes = M::reserved_at_end(s);
    g.peak_allocated_bytes = M::kActivation + g.allocated_bytes;
    g.peak_reserved_bytes = g.reserved_bytes;
    g.host_rss_bytes = M::kGiB + s * 16 * M::kMiB;
    w->insert(g);
    StepMemoryRow h = g;
    h.id = ++step_id;
    h.device_id = 2;
    h.allocated_bytes = 0;
    h.reserved_bytes = 256 * M::kMiB + (s < M::kDetailSteps ? 0 : 64 * M::kMiB);
    h.peak_allocated_bytes = 0;
    h.peak_reserved_bytes = h.reserved_bytes;
    w->insert(h);
  }
  DetailSpanRow span;
  span.id = 1;
  span.t_start = M::kT0 - 10 * M::kMs;
  span.t_end = M::kDetailEnd;
  span.end_reason = M::kReason;
  w->insert(span);
  w->commit();
  if (Status s = w->finish(); !s) {
    *error = s.message();
    return false;
  }
  return true;
}

}  // namespace zt::test
