// zt/db/kernel_summary.h on traces written by hand: the window (the steps but the first, a chosen
// range, the kernels' span without steps), per-kernel totals, the union of overlapping kernels,
// the idle gaps and the innermost host phase under each, and the errors that name the file.
#include "zt/db/kernel_summary.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../hand_trace.h"
#include "../test_util.h"

using namespace zt::db;

namespace {

// Rank 0 with cuda:0. Steps 0 [0, 100), 1 [100, 200), 2 [200, 300). Phases in step 1:
// "forward block0" [100, 140), "optimizer" [150, 195) with "adamw block3" [160, 190) inside; and
// "adamw block5" of step 1 in [205, 290): it ends after step 2 began, so it is the background
// thread's (the overlapped update's AdamW beside step 2) and never the phase under a gap.
// Kernels: one in step 0; gemm [100, 120), gemm [125, 135) and softmax [130, 138) (overlapping)
// in step 1; gemm [200, 250) in step 2.
void write_trace(const std::string& path, bool steps, bool kernels = true) {
  std::unique_ptr<TraceWriter> w = zt::test::hand_written_trace(path, "zt train --device cuda --cupti");
  ASSERT_NE(w, nullptr);
  w->insert(DeviceRow{1, 0, DeviceKind::Cuda, 0, "cuda:0", "GPU", std::nullopt, false});
  std::map<std::string, int64_t> names;
  auto name = [&](const std::string& n) {
    auto [it, fresh] = names.emplace(n, int64_t(names.size()) + 1);
    if (fresh) w->insert(StringRow{it->second, n});
    return it->second;
  };
  int64_t id = 0;
  auto marker = [&](MarkerKind kind, const std::string& n, int64_t t0, int64_t t1, int64_t step) {
    MarkerRow m;
    m.id = ++id, m.kind = kind, m.name_id = name(n), m.t_start = t0, m.t_end = t1, m.step = step;
    w->insert(m);
  };
  if (steps)
    for (int64_t s = 0; s < 3; ++s) marker(MarkerKind::Step, "step " + std::to_string(s), 100 * s, 100 * s + 100, s);
  marker(MarkerKind::Phase, "forward block0", 100, 140, 1);
  marker(MarkerKind::Phase, "optimizer", 150, 195, 1);
  marker(MarkerKind::Phase, "adamw block3", 160, 190, 1);
  if (steps) marker(MarkerKind::Phase, "adamw block5", 205, 290, 1);
  auto kernel = [&](const std::string& n, int64_t t0, int64_t t1) {
    KernelRow k;
    k.id = ++id, k.rank = 0, k.device_id = 1, k.name_id = name(n), k.t_start = t0, k.t_end = t1, k.source = Source::Cupti;
    w->insert(k);
  };
  if (kernels) {
    kernel("warmup", 10, 90);
    kernel("gemm", 100, 120);
    kernel("gemm", 125, 135);
    kernel("softmax", 130, 138);
    kernel("gemm", 200, 250);
  }
  w->commit();
  ASSERT_TRUE(w->finish().ok());
}

// A trace written by hand with the GPU cuda:0 of rank 0 (device id 1) and `names` as string ids 1, 2, ...
std::unique_ptr<TraceWriter> cuda_trace(const std::string& path, const std::vector<std::string>& names) {
  std::unique_ptr<TraceWriter> w = zt::test::hand_written_trace(path, "zt train --device cuda --cupti");
  if (!w) return w;
  w->insert(DeviceRow{1, 0, DeviceKind::Cuda, 0, "cuda:0", "GPU", std::nullopt, false});
  for (size_t i = 0; i < names.size(); ++i) w->insert(StringRow{int64_t(i) + 1, names[i]});
  return w;
}

KernelSummary summarize(const std::string& path, KernelSummaryOptions o = {}, std::string* error = nullptr) {
  std::unique_ptr<TraceReader> r;
  EXPECT_TRUE(TraceReader::open(path, &r).ok());
  KernelSummary k;
  if (!r) return k;
  zt::Status s = summarize_kernels(*r, o, &k);
  if (error) *error = s.ok() ? "" : s.message();
  else EXPECT_TRUE(s.ok()) << s.message();
  return k;
}

}  // namespace

TEST(KernelSummary, StepsButTheFirstByDefault) {
  zt::test::TempDir dir;
  const std::string path = dir.file("k.db");
  write_trace(path, true);
  const KernelSummary k = summarize(path);
  EXPECT_EQ(k.rank, 0);
  EXPECT_EQ(k.devices, "cuda:0");
  EXPECT_EQ(k.first_step, 1);
  EXPECT_EQ(k.last_step, 2);
  EXPECT_EQ(k.t_start, 100);
  EXPECT_EQ(k.t_end, 300);
  EXPECT_EQ(k.kernels, 4);
  EXPECT_EQ(k.kernel_ns, 20 + 10 + 8 + 50);
  EXPECT_EQ(k.busy_ns, 20 + 13 + 50);  // gemm and softmax overlap in [130, 135)
  EXPECT_EQ(k.gaps, 3);
  ASSERT_EQ(k.by_name.size(), 2u);
  EXPECT_EQ(k.by_name[0].name, "gemm");
  EXPECT_EQ(k.by_name[0].calls, 3);
  EXPECT_EQ(k.by_name[0].total_ns, 80);
  EXPECT_EQ(k.by_name[0].min_ns, 10);
  EXPECT_EQ(k.by_name[0].max_ns, 50);
  EXPECT_EQ(k.by_name[1].name, "softmax");
  EXPECT_EQ(k.by_name[1].total_ns, 8);
  // Gaps: [120, 125) under the forward, [138, 200) under AdamW (innermost, inside the optimizer),
  // [250, 300) under no phase of the rank thread (the background "adamw block5" is beside it).
  ASSERT_EQ(k.longest.size(), 3u);
  EXPECT_EQ(k.longest[0].t_start, 138);
  EXPECT_EQ(k.longest[0].t_end, 200);
  EXPECT_EQ(k.longest[0].step, 1);
  EXPECT_EQ(k.longest[0].phase, "adamw block3");
  EXPECT_EQ(k.longest[1].phase, "(no phase)");
  EXPECT_EQ(k.longest[1].step, 2);
  EXPECT_EQ(k.longest[2].phase, "forward block0");
  ASSERT_EQ(k.idle_by_phase.size(), 3u);
  EXPECT_EQ(k.idle_by_phase[0].phase, "adamw blockN");
  EXPECT_EQ(k.idle_by_phase[0].ns, 62);
  EXPECT_EQ(k.idle_by_phase[1].phase, "(no phase)");
  EXPECT_EQ(k.idle_by_phase[1].ns, 50);
  EXPECT_EQ(k.idle_by_phase[2].phase, "forward blockN");
  EXPECT_EQ(k.idle_by_phase[2].ns, 5);

  KernelSummaryOptions o;
  o.longest_gaps = 1;
  EXPECT_EQ(summarize(path, o).longest.size(), 1u);
}

TEST(KernelSummary, ChosenStepsAndTheKernelsSpanWithoutSteps) {
  zt::test::TempDir dir;
  const std::string path = dir.file("k.db");
  write_trace(path, true);
  KernelSummaryOptions o;
  o.first_step = o.last_step = 1;
  KernelSummary k = summarize(path, o);
  EXPECT_EQ(k.t_start, 100);
  EXPECT_EQ(k.t_end, 200);
  EXPECT_EQ(k.kernels, 3);
  EXPECT_EQ(k.busy_ns, 33);
  EXPECT_EQ(k.gaps, 2);
  o.first_step = 0;
  o.last_step = 0;
  k = summarize(path, o);
  EXPECT_EQ(k.kernels, 1);
  EXPECT_EQ(k.by_name.at(0).name, "warmup");
  EXPECT_EQ(k.busy_ns, 80);

  const std::string bare = dir.file("bare.db");
  write_trace(bare, false);
  k = summarize(bare);
  EXPECT_EQ(k.first_step, -1);
  EXPECT_EQ(k.t_start, 10);
  EXPECT_EQ(k.t_end, 250);
  EXPECT_EQ(k.kernels, 5);
  EXPECT_EQ(k.busy_ns, 80 + 20 + 13 + 50);
}

// The window's edges: a kernel that began before it counts in the busy time for what it ran inside
// (not in the per-name totals), one that runs past its end is clipped in the busy time (whole in
// the totals), a zero-length kernel splits no gap; a range partly beyond the steps uses those there;
// the lowest rank with kernels is the default, another can be asked for.
TEST(KernelSummary, TheWindowsEdgesAndRanks) {
  zt::test::TempDir dir;
  const std::string path = dir.file("edges.db");
  {
    std::unique_ptr<TraceWriter> w = cuda_trace(path, {"step", "A", "B", "C", "D", "E"});
    ASSERT_NE(w, nullptr);
    w->insert(DeviceRow{2, 1, DeviceKind::Cuda, 1, "cuda:1", "GPU", std::nullopt, false});
    int64_t id = 0;
    for (int64_t s = 0; s < 3; ++s) {
      MarkerRow m;
      m.id = ++id, m.kind = MarkerKind::Step, m.name_id = 1, m.t_start = 100 * s, m.t_end = 100 * s + 100, m.step = s;
      w->insert(m);
    }
    auto kernel = [&](int64_t device, int64_t rank, int64_t name, int64_t t0, int64_t t1) {
      KernelRow k;
      k.id = ++id, k.rank = rank, k.device_id = device, k.name_id = name, k.t_start = t0, k.t_end = t1;
      w->insert(k);
    };
    kernel(1, 0, 2, 90, 110);   // A: from step 0 into step 1
    kernel(1, 0, 3, 150, 150);  // B: zero length
    kernel(1, 0, 4, 290, 320);  // C: past the end of step 2
    kernel(1, 0, 5, 120, 130);  // D
    kernel(2, 1, 6, 100, 200);  // E: rank 1's
    w->commit();
    ASSERT_TRUE(w->finish().ok());
  }
  KernelSummary k = summarize(path);
  EXPECT_EQ(k.rank, 0);
  EXPECT_EQ(k.devices, "cuda:0");
  EXPECT_EQ(k.t_start, 100);
  EXPECT_EQ(k.t_end, 300);
  EXPECT_EQ(k.kernels, 3);              // B, C, D
  EXPECT_EQ(k.kernel_ns, 0 + 30 + 10);  // C whole
  EXPECT_EQ(k.busy_ns, 10 + 10 + 10);   // A's [100, 110), D, C's [290, 300)
  EXPECT_EQ(k.gaps, 2);                 // [110, 120) and [130, 290): B splits nothing
  ASSERT_FALSE(k.longest.empty());
  EXPECT_EQ(k.longest[0].t_start, 130);
  EXPECT_EQ(k.longest[0].t_end, 290);

  KernelSummaryOptions o;
  o.first_step = 1;
  o.last_step = 99;
  k = summarize(path, o);
  EXPECT_EQ(k.first_step, 1);
  EXPECT_EQ(k.last_step, 2);
  EXPECT_EQ(k.steps, 2);

  o = {};
  o.rank = 1;
  k = summarize(path, o);
  EXPECT_EQ(k.devices, "cuda:1");
  EXPECT_EQ(k.first_step, -1);  // rank 1 has no steps: the kernels' span
  EXPECT_EQ(k.kernels, 1);
  EXPECT_EQ(k.busy_ns, 100);
  EXPECT_EQ(k.gaps, 0);
}

// A run that died in step 2 while step 1's background AdamW still ran: step 2 and the AdamW phase
// never ended. The phase is still the background thread's (step 2 began before it ended), so the
// gap at the end of step 1 is the rank thread's "optimizer", not "adamw block9".
TEST(KernelSummary, TheBackgroundUpdateOfARunThatDied) {
  zt::test::TempDir dir;
  const std::string path = dir.file("died.db");
  {
    std::unique_ptr<TraceWriter> w = cuda_trace(path, {"step", "optimizer", "adamw block9", "gemm"});
    ASSERT_NE(w, nullptr);
    int64_t id = 0;
    auto marker = [&](MarkerKind kind, int64_t name, int64_t t0, std::optional<int64_t> t1, int64_t step) {
      MarkerRow m;
      m.id = ++id, m.kind = kind, m.name_id = name, m.t_start = t0, m.t_end = t1, m.step = step;
      w->insert(m);
    };
    marker(MarkerKind::Step, 1, 0, 100, 0);
    marker(MarkerKind::Step, 1, 100, 200, 1);
    marker(MarkerKind::Step, 1, 200, std::nullopt, 2);
    marker(MarkerKind::Phase, 2, 150, 200, 1);
    marker(MarkerKind::Phase, 3, 170, std::nullopt, 1);
    KernelRow k;
    k.id = ++id, k.rank = 0, k.device_id = 1, k.name_id = 4, k.t_start = 100, k.t_end = 160;
    w->insert(k);
    w->commit();
    ASSERT_TRUE(w->finish().ok());
  }
  const KernelSummary k = summarize(path);
  EXPECT_EQ(k.first_step, 1);  // the finished steps but the first
  EXPECT_EQ(k.last_step, 1);
  ASSERT_EQ(k.longest.size(), 1u);
  EXPECT_EQ(k.longest[0].t_start, 160);
  EXPECT_EQ(k.longest[0].t_end, 200);
  EXPECT_EQ(k.longest[0].phase, "optimizer");
}

TEST(KernelSummary, ErrorsNameTheFile) {
  zt::test::TempDir dir;
  const std::string path = dir.file("k.db"), none = dir.file("none.db"), bare = dir.file("bare.db");
  write_trace(path, true);
  write_trace(none, true, false);
  write_trace(bare, false);
  std::string err;
  summarize(none, {}, &err);
  EXPECT_EQ(err, none + ": no kernel rows (they come from CUPTI: record with zt train --device cuda --cupti, or zt probe "
                        "-- PROGRAM; on the simulated GPU from its passes, which a --virtual run does not compute)");
  KernelSummaryOptions o;
  o.rank = 3;
  summarize(path, o, &err);
  EXPECT_EQ(err, path + ": rank 3 has no kernel rows");
  o = {};
  o.first_step = 7;
  o.last_step = 9;
  summarize(path, o, &err);
  EXPECT_EQ(err, path + ": rank 0 has no finished step in 7-9 (its steps: 0-2)");
  o.first_step = 2;
  o.last_step = 1;
  summarize(path, o, &err);
  EXPECT_EQ(err, path + ": steps 2-1: the last comes first");
  o.first_step = o.last_step = 1;
  summarize(bare, o, &err);
  EXPECT_EQ(err, bare + ": rank 0 has no step markers to choose steps from");
}
