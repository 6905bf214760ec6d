// Logic tests of the viewer's model, no window: loading into columns and tracks, the
// visible-range search, folding, min/max decimation, leak grouping, placement mismatches,
// the playhead state and range summaries.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <fstream>
#include <random>

#include "known_trace.h"
#include "mixed_trace.h"
#include "model/analysis.h"
#include "model/time_view.h"
#include "model/trace_model.h"
#include "hand_trace.h"
#include "test_util.h"
#include "zt/db/derive_steps.h"
#include "zt/db/trace_writer.h"

using namespace zt::viewer;
using K = zt::test::KnownTrace;

namespace {

class KnownTraceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new zt::test::TempDir();
    std::string err;
    ASSERT_TRUE(zt::test::write_known_trace(dir_->file("known.db"), &err)) << err;
    auto s = TraceModel::load(dir_->file("known.db"), &model_);
    ASSERT_TRUE(s.ok()) << s.message();
  }
  static void TearDownTestSuite() {
    model_.reset();
    delete dir_;
  }
  static const Track* find(TrackKind kind) {
    for (auto& t : model_->tracks)
      if (t.kind == kind) return &t;
    return nullptr;
  }
  static zt::test::TempDir* dir_;
  static std::unique_ptr<TraceModel> model_;
};
zt::test::TempDir* KnownTraceTest::dir_ = nullptr;
std::unique_ptr<TraceModel> KnownTraceTest::model_;

IntervalLane lane_of(const std::vector<std::pair<int64_t, int64_t>>& spans) {
  IntervalLane l;
  for (size_t i = 0; i < spans.size(); ++i) l.push(spans[i].first, spans[i].second, uint32_t(i));
  return l;
}

}  // namespace

TEST(Families, ClassifiesTensorNames) {
  EXPECT_EQ(classify_tensor("block3.gathered"), Family::Parameters);
  EXPECT_EQ(classify_tensor("block3.grad"), Family::Gradients);
  EXPECT_EQ(classify_tensor("grad.bucket0"), Family::Gradients);
  EXPECT_EQ(classify_tensor("allreduce_bucket.flat"), Family::Gradients);  // DeepSpeed's stages 0-2 (issue 41)
  EXPECT_EQ(classify_tensor("ipg_buckets[bf16].buffer[0]"), Family::Gradients);
  EXPECT_EQ(classify_tensor("extra_large_param_to_reduce[0].grad"), Family::Gradients);
  EXPECT_EQ(classify_tensor("block3.grad[shard]"), Family::Gradients);
  EXPECT_EQ(classify_tensor("adam.m[shard]"), Family::OptimizerState);
  EXPECT_EQ(classify_tensor("block3.master"), Family::OptimizerState);
  EXPECT_EQ(classify_tensor("block3.act"), Family::Activations);
  // The memory model's terms (trainer/zero/ds_memory.h).
  for (const char* n : {"block3.ln_1.out", "block3.attn.qkv", "block3.attn.lse", "block3.mlp.fc", "block3.residual",
                        "block4.input", "final_ln.rstd", "lm_head.log_softmax", "block3.forward_scratch", "embeddings.wte_out"})
    EXPECT_EQ(classify_tensor(n), Family::Activations) << n;
  EXPECT_EQ(classify_tensor("lm_head.grad_logits_fp32"), Family::Gradients);
  EXPECT_EQ(classify_tensor("ipg_bucket"), Family::Gradients);
  EXPECT_EQ(classify_tensor("ipg.flat"), Family::Gradients);
  EXPECT_EQ(classify_tensor("block3.persistent"), Family::Parameters);
  EXPECT_EQ(classify_tensor("final_ln.param"), Family::Parameters);
  EXPECT_EQ(classify_tensor("embeddings.wte.gathered"), Family::Parameters);
  EXPECT_EQ(classify_tensor("offload.buffer[epoch 1]"), Family::Buffers);
  EXPECT_EQ(classify_tensor("segment0"), Family::Buffers);
  EXPECT_EQ(leak_group_name("offload.buffer[epoch 12]"), "offload.buffer[epoch *]");
  EXPECT_EQ(leak_group_name("block3.grad"), "block3.grad");
  EXPECT_EQ(sibling_pattern("block12.grad[shard]"), "block#.grad[shard]");
}

TEST(Lod, VisibleRangeFindsOverlappingSpans) {
  // A long span first, then short ones: the long one still reaches t=500.
  IntervalLane l = lane_of({{0, 1000}, {10, 20}, {30, 40}, {600, 700}, {800, 900}});
  auto [a, b] = visible_range(l, 500, 650);
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 4u);  // spans 0..3 start by 650
  IntervalLane m = lane_of({{0, 10}, {20, 30}, {40, 50}, {60, 70}});
  auto [c, d] = visible_range(m, 25, 45);
  EXPECT_EQ(c, 1u);
  EXPECT_EQ(d, 3u);
  auto [e, f] = visible_range(m, 100, 200);
  EXPECT_EQ(e, f);
}

TEST(Lod, FoldsThinSpansAndKeepsWideOnes) {
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (int i = 0; i < 100000; ++i) spans.push_back({i * 20, i * 20 + 10});  // 10 ns on, 10 ns off
  spans.push_back({2'000'000, 2'500'000});                                  // one wide span
  IntervalLane l = lane_of(spans);
  std::vector<DrawItem> items;
  // 1000 ns per pixel: every small span is 0.01 px.
  fold_visible(l, 0, 3'000'000, 1000.0, 3.0, &items);
  uint64_t covered = 0;
  for (auto& it : items) covered += it.count;
  EXPECT_EQ(covered, spans.size());  // nothing lost, nothing counted twice
  EXPECT_LE(items.size(), 20u);      // a few folds, not 100k boxes
  ASSERT_FALSE(items.empty());
  EXPECT_EQ(items.back().count, 1u);  // the wide span is drawn on its own
  EXPECT_EQ(items.back().t0, 2'000'000);
  // Zoomed in to 1 ns per pixel, the spans are 10 px wide: no folding at all.
  items.clear();
  fold_visible(l, 0, 1000, 1.0, 3.0, &items);
  ASSERT_EQ(items.size(), 51u);  // spans starting at 0, 20, ..., 1000
  for (auto& it : items) EXPECT_EQ(it.count, 1u);
}

TEST(Lod, DecimationMatchesBruteForce) {
  std::mt19937_64 rng(7);
  Series s;
  int64_t t = 100;
  for (int i = 0; i < 20000; ++i) {
    t += int64_t(rng() % 50) + 1;
    s.push(t, double(rng() % 100000));
  }
  s.build();
  for (int trial = 0; trial < 20; ++trial) {
    int64_t t0 = int64_t(rng() % uint64_t(t));
    double npp = double(rng() % 2000) / 10.0 + 0.5;
    int cols = 300;
    std::vector<ColumnMinMax> out;
    decimate(s, t0, npp, cols, t + 1, &out);
    for (int c = 0; c < cols; ++c) {
      int64_t c0 = t0 + int64_t(double(c) * npp), c1 = t0 + int64_t(double(c + 1) * npp);
      if (c1 <= c0) c1 = c0 + 1;
      if (c0 > t) break;
      double lo = 1e300, hi = -1e300;
      bool any = false;
      for (size_t i = 0; i < s.t.size(); ++i) {
        int64_t from = s.t[i], to = i + 1 < s.t.size() ? s.t[i + 1] : INT64_MAX;
        if (from < c1 && to > c0) lo = std::min(lo, s.value[i]), hi = std::max(hi, s.value[i]), any = true;
      }
      ASSERT_EQ(out[size_t(c)].any, any) << "column " << c;
      if (any) {
        EXPECT_EQ(out[size_t(c)].lo, float(lo)) << "column " << c;
        EXPECT_EQ(out[size_t(c)].hi, float(hi)) << "column " << c;
      }
    }
  }
}

TEST(TimeViewTest, ZoomKeepsTheTimeUnderTheCursor) {
  TimeView v;
  v.width_px = 1000;
  v.fit(0, 1e9);
  double before = v.t_of(250);
  v.zoom_at(250, 0.5);
  EXPECT_NEAR(v.t_of(250), before, 1e-3);
  v.pan_px(100);
  EXPECT_NEAR(v.t_of(350), before, 1e-3);
}

TEST_F(KnownTraceTest, LoadsColumnsAndTracks) {
  const TraceModel& m = *model_;
  EXPECT_EQ(m.t_align, K::kT0);
  EXPECT_EQ(m.t_last, K::kEnd);
  EXPECT_EQ(m.devices.size(), 2u);
  EXPECT_TRUE(std::is_sorted(m.alloc.t_alloc.begin(), m.alloc.t_alloc.end()));
  // markers, cuda:0 memory, cuda:0 allocations, host memory, cpu allocations, transfers, flags
  ASSERT_EQ(m.tracks.size(), 7u);
  EXPECT_EQ(m.tracks[0].kind, TrackKind::Markers);
  EXPECT_EQ(m.tracks[1].kind, TrackKind::Memory);
  EXPECT_EQ(m.tracks[1].capacity, K::kCapacity);
  EXPECT_EQ(m.tracks[3].kind, TrackKind::HostMemory);
  EXPECT_EQ(m.tracks[6].kind, TrackKind::Flags);
  EXPECT_EQ(m.step_start(6), K::step_start(6));
  EXPECT_EQ(m.epoch_start(1), K::step_start(5));
  ASSERT_EQ(m.flags.size(), 2u);
  EXPECT_FALSE(m.flags[0].is_error);
  EXPECT_EQ(m.flags[0].t, K::kFaultT);
  EXPECT_TRUE(m.flags[1].is_error);
  EXPECT_EQ(m.flags[1].t, K::kErrorT);
}

TEST_F(KnownTraceTest, AllocatedSeriesPeaksAtTheCheckpointGather) {
  const Track* mem = find(TrackKind::Memory);
  ASSERT_NE(mem, nullptr);
  ASSERT_FALSE(mem->series.empty());
  EXPECT_EQ(mem->series[0].name, "allocated");
  const Series& s = model_->series[size_t(mem->series[0].series)];
  EXPECT_EQ(s.peak, double(K::kPeakBytes));
  EXPECT_EQ(s.peak_t, K::kPeakStart);
  EXPECT_EQ(s.at(K::kPeakEnd), double(512 * K::kMiB));  // the gather is gone, act + grad stay
  double lo, hi;
  ASSERT_TRUE(s.range_min_max(K::step_start(0), K::step_start(6), &lo, &hi));
  EXPECT_EQ(hi, double(768 * K::kMiB));
  EXPECT_EQ(lo, 0.0);
}

TEST_F(KnownTraceTest, LeaksGroupByNameAndGrowPerEpoch) {
  auto leaks = find_leaks(*model_);
  ASSERT_EQ(leaks.size(), 1u);  // block0.master is freed; the per-step blocks are freed
  EXPECT_EQ(leaks[0].name, "offload.buffer[epoch *]");
  EXPECT_EQ(leaks[0].alive_count, 2);
  EXPECT_EQ(leaks[0].alive_bytes, 2 * K::kGiB);
  EXPECT_EQ(leaks[0].stack_id, 2);
  EXPECT_TRUE(leaks[0].grows);
  EXPECT_EQ(leaks[0].bytes_at_epoch_end, (std::vector<int64_t>{K::kGiB, 2 * K::kGiB}));
  std::vector<std::string> stack;
  ASSERT_TRUE(model_->stack_text(leaks[0].stack_id, &stack).ok());
  ASSERT_EQ(stack.size(), 2u);
  EXPECT_NE(stack[0].find("zt::offload::make_buffer"), std::string::npos);
}

// A probed Python program's leak: the leaks view names where it was allocated, by its Python line.
TEST(PythonLeak, TheLeaksViewNamesTheSiteOfEachGroup) {
  zt::test::TempDir dir;
  const std::string path = dir.file("pyleak.db");
  ASSERT_TRUE(zt::test::write_python_leak_trace(path));
  std::unique_ptr<TraceModel> m;
  ASSERT_TRUE(TraceModel::load(path, &m).ok());
  auto leaks = find_leaks(*m);
  ASSERT_EQ(leaks.size(), 2u);
  const LeakGroup* grow = nullptr;
  for (auto& g : leaks)
    if (g.grows) grow = &g;
  ASSERT_NE(grow, nullptr);
  EXPECT_EQ(m->site(grow->stack_id), "grow (/w/leak.py:12)");
  EXPECT_EQ(grow->alive_bytes, 16 << 20);
  EXPECT_EQ(m->site(9), "make_table (/usr/lib/libtable.so+0x2000)");
  EXPECT_EQ(m->site(0), "");
}

// The leaks view groups by the site zt check and zt db top use (zt/db/sites.h): one Python line's
// allocations through two native paths are one row, and a sampled row counts for its weight.
TEST(PythonLeak, TheLeaksViewGroupsBySiteAndCountsSampledRowsByWeight) {
  zt::test::TempDir dir;
  const std::string path = dir.file("lib.db");
  ASSERT_TRUE(zt::test::write_library_trace(path));
  std::unique_ptr<TraceModel> m;
  ASSERT_TRUE(TraceModel::load(path, &m).ok());
  auto leaks = find_leaks(*m);
  const LeakGroup* line = nullptr;
  const LeakGroup* numpy = nullptr;
  for (auto& g : leaks) {
    if (g.site == "compute_loss (/w/hf_job.py:36)") line = &g;
    if (g.site == "compute_loss (/w/hf_job.py:36) via numpy ones") numpy = &g;
  }
  ASSERT_NE(line, nullptr);
  EXPECT_EQ(line->alive_count, 2);
  EXPECT_EQ(line->sampled, 1);
  EXPECT_EQ(line->alive_bytes, (512 << 10) + (64 << 10));
  ASSERT_NE(numpy, nullptr);
  EXPECT_EQ(numpy->alive_count, 2);
  EXPECT_EQ(numpy->alive_bytes, 3 << 20 >> 1);
  EXPECT_EQ(leaks.size(), 5u);
  // The host memory line is exact: the rows recorded one by one (3 x 2 MiB and 64 KiB), not the samples.
  const SeriesRef* pageable = nullptr;
  for (auto& t : m->tracks)
    for (auto& s : t.series)
      if (t.kind == TrackKind::HostMemory && s.name == "pageable") pageable = &s;
  ASSERT_NE(pageable, nullptr);
  EXPECT_EQ(m->series[size_t(pageable->series)].peak, double((6 << 20) + (64 << 10)));
}

TEST_F(KnownTraceTest, PlacementFlagsTheGradientPartitionOnTheWrongDevice) {
  auto rows = placement_timeline(*model_, 1000);
  ASSERT_GE(rows.size(), 4u);
  EXPECT_EQ(rows[0].name, "block2.grad[shard]");  // mismatched and named in the error: first
  EXPECT_TRUE(rows[0].mismatch);
  EXPECT_TRUE(rows[0].in_error);
  EXPECT_EQ(rows[0].expected, "host");
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_FALSE(rows[i].mismatch) << rows[i].name;
}

TEST_F(KnownTraceTest, PlayheadStateAtThePeak) {
  PlayheadState st = state_at(*model_, K::kPeakStart + K::kMs, 3);
  int gpu = model_->devices[0].host ? 1 : 0;
  EXPECT_EQ(st.live_total[size_t(gpu)], K::kPeakBytes);
  ASSERT_FALSE(st.largest.empty());
  EXPECT_EQ(model_->str(model_->alloc.name[st.largest[0]]), "checkpoint.gather");
  EXPECT_EQ(st.live[size_t(gpu)][size_t(Family::Activations)], 256 * K::kMiB);
  EXPECT_EQ(st.live[size_t(gpu)][size_t(Family::Gradients)], 256 * K::kMiB);
  // An H2D copy is in flight 7 ms into a step.
  PlayheadState copy = state_at(*model_, K::step_start(2) + 7 * K::kMs, 3);
  ASSERT_EQ(copy.transfers_in_flight.size(), 1u);
  EXPECT_EQ(model_->xfer.kind[copy.transfers_in_flight[0]], uint8_t(zt::db::TransferKind::H2D));
}

TEST_F(KnownTraceTest, RangeSummaryCountsBytesPeaksAndKeptAllocations) {
  RangeSummary r = summarize_range(*model_, K::step_start(0), K::step_start(1), 5);
  EXPECT_EQ(r.bytes[size_t(Direction::H2D)], 64 * K::kMiB);
  EXPECT_EQ(r.bytes[size_t(Direction::D2H)], 128 * K::kMiB);
  EXPECT_EQ(r.bytes[size_t(Direction::Collective)], 512 * K::kMiB);
  EXPECT_EQ(r.allocations, 3);
  EXPECT_EQ(r.kept, 0);
  bool found = false;
  for (auto& p : r.peaks)
    if (p.series == "allocated") {
      found = true;
      EXPECT_EQ(p.peak, double(768 * K::kMiB));
    }
  EXPECT_TRUE(found);
  // Around the first epoch end the leaked buffer is made and kept.
  RangeSummary e = summarize_range(*model_, K::step_start(5) - 2 * K::kMs, K::step_start(5), 5);
  EXPECT_EQ(e.kept, 1);
  EXPECT_EQ(e.kept_bytes, K::kGiB);
}

// ... committed, finished and loaded into the viewer's model (null, with a failure, when any fails).
std::unique_ptr<TraceModel> finish_and_load(zt::db::TraceWriter& w, const std::string& path) {
  w.commit();
  zt::Status s = w.finish();
  EXPECT_TRUE(s.ok()) << s.message();
  std::unique_ptr<TraceModel> m;
  if (s.ok()) s = TraceModel::load(path, &m);
  EXPECT_TRUE(s.ok()) << s.message();
  return s.ok() ? std::move(m) : nullptr;
}

// zt train --cupti: CUPTI's record of the trainer's segment (paired when the trace is finished)
// is counted once and drawn once; what CUPTI alone saw is drawn.
TEST(TraceModelTwins, ASecondRecordIsNeitherCountedNorDrawnTwice) {
  using namespace zt::db;
  zt::test::TempDir dir;
  const std::string path = dir.file("twins.db");
  std::unique_ptr<TraceModel> m;
  const int64_t MiB = 1 << 20;
  {
    std::unique_ptr<TraceWriter> w = zt::test::hand_written_trace(path, "zt train --device cuda --cupti");
    ASSERT_NE(w, nullptr);
    w->insert(DeviceRow{1, 0, DeviceKind::Cuda, 0, "cuda:0", "GPU", 80 * 1024 * MiB, false});
    auto seg = [&](int64_t id, uint64_t address, int64_t bytes, int64_t t0, int64_t t1, Source source) {
      AllocationRow a;
      a.id = id, a.rank = 0, a.device_id = 1, a.memory_kind = MemoryKind::Device, a.level = AllocLevel::Segment;
      a.address = address, a.bytes = a.requested_bytes = bytes, a.t_alloc = t0, a.t_free = t1, a.source = source;
      w->insert(a);
    };
    seg(10, 0x1000, 20 * MiB, 100, 900, Source::Api);            // the trainer's segment
    seg(20, 0x1000, 20 * MiB, 101, 899, Source::Cupti);          // CUPTI's record of it
    seg(23, 0x20000000, 32 * MiB, 105, 950, Source::Cupti);      // outside the trainer's allocators
    m = finish_and_load(*w, path);
  }
  ASSERT_NE(m, nullptr);
  std::vector<int64_t> drawn;
  for (const Track& t : m->tracks)
    if (t.kind == TrackKind::Allocations)
      for (const IntervalLane& lane : t.lanes)
        for (uint32_t row : lane.item) drawn.push_back(m->alloc.id[row]);
  std::sort(drawn.begin(), drawn.end());
  EXPECT_EQ(drawn, (std::vector<int64_t>{10, 23}));
  ASSERT_EQ(m->alloc.size(), 3u);  // all three are loaded (the inspector and SQL still see the twin)
  int twins = 0;
  for (size_t i = 0; i < m->alloc.size(); ++i) twins += m->alloc.second_record[i];
  EXPECT_EQ(twins, 1);
  // The memory track's reserved bytes: 20 + 32 MiB at the peak, not 72 (the twin once).
  double reserved_peak = -1;
  for (const Track& t : m->tracks)
    if (t.kind == TrackKind::Memory)
      for (const SeriesRef& r : t.series)
        if (r.name == "reserved") reserved_peak = m->series[size_t(r.series)].peak;
  EXPECT_EQ(reserved_peak, double(52 * MiB));
}

// The ruler's zero is named for what it is: this trace has no step markers, so it is the first event
// (the ruler said "time since step 0" for a run that died before its first step).
TEST(TraceModelAlign, ATraceWithoutStepsIsAlignedOnItsFirstEventAndSaysSo) {
  using namespace zt::db;
  zt::test::TempDir dir;
  const std::string path = dir.file("nosteps.db");
  std::unique_ptr<TraceWriter> w = zt::test::hand_written_trace(path, "zt train (died in setup)");
  ASSERT_NE(w, nullptr);
  w->insert(DeviceRow{1, 0, DeviceKind::Cuda, 0, "cuda:0", "GPU", int64_t(1) << 30, false});
  AllocationRow a;
  a.id = 1, a.rank = 0, a.device_id = 1, a.memory_kind = MemoryKind::Device, a.level = AllocLevel::Block;
  a.address = 0x1000, a.bytes = a.requested_bytes = 4096, a.t_alloc = 500, a.t_free = 900, a.source = Source::Api;
  w->insert(a);
  std::unique_ptr<TraceModel> m = finish_and_load(*w, path);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->align_label, "the first event");
  EXPECT_EQ(m->t_align, m->t_first);
}

// Two traces side by side line up at the lowest rank's step 0, the rank drawn first (they lined up
// at the earliest step 0 of any rank: where rank 1 began first, rank 0 sat 2.4 ms off the other
// trace's rank 0).
TEST(TraceModelAlign, TheLowestRanksStepZeroIsTheAlignment) {
  using namespace zt::db;
  zt::test::TempDir dir;
  const std::string path = dir.file("ranks.db");
  std::unique_ptr<TraceWriter> w = zt::test::hand_written_trace(path, "zt train --world-size 2");
  ASSERT_NE(w, nullptr);
  w->insert(RankRow{1, 1, 2, 1, "h", 1});
  w->insert(StringRow{1, "step 0"});
  const int64_t start[2] = {3000, 1000};  // rank 1 begins first
  for (int64_t r = 0; r < 2; ++r) {
    MarkerRow m;
    m.id = r + 1, m.rank = r, m.kind = MarkerKind::Step, m.name_id = 1, m.t_start = start[r], m.t_end = start[r] + 500;
    m.step = 0;
    w->insert(m);
  }
  std::unique_ptr<TraceModel> m = finish_and_load(*w, path);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->t_align, 3000);
  EXPECT_EQ(m->align_label, "step 0");
}

// How a run ended is kept for the errors panel where it did not end well (the viewer showed nothing
// of a killed or crashed run); a counter that counts is not drawn on a memory track's byte scale
// (host_small_allocations read "peak 7 B"), while byte counters are.
TEST(TraceModelRun, ARunThatEndedBadlySaysSoAndCountsAreNotBytes) {
  using namespace zt::db;
  zt::test::TempDir dir;
  const std::string path = dir.file("killed.db");
  std::unique_ptr<TraceWriter> w = zt::test::hand_written_trace(path, "prog");  // its run never closed
  ASSERT_NE(w, nullptr);
  w->insert(DeviceRow{1, 0, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false});
  w->insert(StringRow{1, "host_rss"});
  w->insert(StringRow{2, "host_small_allocations"});
  for (int64_t i = 0; i < 4; ++i) {
    w->insert(CounterRow{2 * i + 1, 0, 1, 1, 100 * i, double((i + 1) << 20)});
    w->insert(CounterRow{2 * i + 2, 0, 1, 2, 100 * i, double(i + 7)});
  }
  std::unique_ptr<TraceModel> m = finish_and_load(*w, path);
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->run_problems.size(), 1u);
  EXPECT_EQ(m->run_problems[0], "run 1 ended without closing the trace (killed, or still running)");
  std::vector<std::string> names;
  for (const Track& t : m->tracks)
    if (t.kind == TrackKind::HostMemory)
      for (const SeriesRef& r : t.series) names.push_back(r.name);
  EXPECT_EQ(names, std::vector<std::string>{"host_rss"});
}

// A probed job's host track: host_small_bytes_allocated, a running total of every small allocation
// made (2 GiB by the end of an HF Trainer job whose RSS stayed near 300 MiB), is not memory in use:
// it is neither drawn nor sets the scale, so RSS and pageable set it. Nor is another running total
// of bytes (a "..._total").
TEST(TraceModelCounters, ARunningTotalDoesNotScaleTheHostTrack) {
  using namespace zt::db;
  zt::test::TempDir dir;
  const std::string path = dir.file("hf.db");
  std::unique_ptr<TraceWriter> w = zt::test::hand_written_trace(path, "python3 hf_job.py");
  ASSERT_NE(w, nullptr);
  constexpr int64_t MiB = 1 << 20;
  w->insert(DeviceRow{1, 0, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false});
  w->insert(StringRow{1, "host_rss"});
  w->insert(StringRow{2, "host_small_bytes_allocated"});
  w->insert(StringRow{3, "host_small_allocations"});
  w->insert(StringRow{4, "pinned_allocated"});
  w->insert(StringRow{5, "gloo_bytes_sent_total"});
  int64_t id = 0;
  for (int64_t i = 0; i < 8; ++i) {
    w->insert(CounterRow{++id, 0, 1, 1, 100 * i, double((280 + i) * MiB)});
    w->insert(CounterRow{++id, 0, 1, 2, 100 * i, double((i + 1) * 256 * MiB)});  // up to 2 GiB
    w->insert(CounterRow{++id, 0, 1, 3, 100 * i, double(1000 * (i + 1))});
    w->insert(CounterRow{++id, 0, 1, 4, 100 * i, double(4 * MiB)});
    w->insert(CounterRow{++id, 0, 1, 5, 100 * i, double((i + 1) * 512 * MiB)});
  }
  AllocationRow a;
  a.id = 1, a.rank = 0, a.device_id = 1, a.memory_kind = MemoryKind::PageableHost, a.level = AllocLevel::Segment;
  a.address = 0x10000000, a.bytes = a.requested_bytes = 64 * MiB, a.t_alloc = 50, a.source = Source::HostHook;
  w->insert(a);
  w->set_run_end(1, 800, RunStatus::Ok, 0, "");
  std::unique_ptr<TraceModel> m = finish_and_load(*w, path);
  ASSERT_NE(m, nullptr);
  std::vector<std::string> names;
  double top = 0;
  for (const Track& t : m->tracks)
    if (t.kind == TrackKind::HostMemory)
      for (const SeriesRef& r : t.series) {
        names.push_back(r.name);
        top = std::max(top, m->series[size_t(r.series)].peak);
      }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"host_rss", "pageable"}));
  EXPECT_EQ(top, double(287 * MiB));  // RSS's peak: what the track is scaled to
  EXPECT_TRUE(is_cumulative_counter("host_small_bytes_allocated"));
  EXPECT_TRUE(is_cumulative_counter("gloo_bytes_sent_total"));
  EXPECT_FALSE(is_cumulative_counter("pinned_allocated"));
  EXPECT_FALSE(is_cumulative_counter("host_rss"));
}

// An HF Trainer job that never imported zerotrace: the ranges zt probe's bootstrap wrote for the
// Trainer's callbacks are drawn as the Trainer's ("Trainer step 0"), not as zerotrace's
// ("zerotrace.transformers::step 0"); a range of the job's own keeps its name.
TEST(TraceModelPhases, TheTrainerHookRangesAreLabelledAsTheJobsOwn) {
  using namespace zt::db;
  zt::test::TempDir dir;
  const std::string path = dir.file("hf_phases.db");
  {
    std::unique_ptr<TraceWriter> w = zt::test::hand_written_trace(path, "python3 hf_job.py");
    ASSERT_NE(w, nullptr);
    const std::vector<std::string> names = {"zerotrace.transformers::epoch 0", "zerotrace.transformers::step 0",
                                            "zerotrace.transformers::step 1", "data::load batch"};
    for (size_t i = 0; i < names.size(); ++i) w->insert(StringRow{int64_t(i) + 1, names[i]});
    auto range = [&](int64_t id, int64_t name, int64_t t0, int64_t t1) {
      MarkerRow m;
      m.id = id, m.kind = MarkerKind::Range, m.name_id = name, m.t_start = t0, m.t_end = t1;
      w->insert(m);
    };
    range(1, 1, 0, 1000);
    range(2, 2, 10, 400);
    range(3, 3, 500, 900);
    range(4, 4, 20, 60);
    w->set_run_end(1, 1000, RunStatus::Ok, 0, "");
    w->commit();
    ASSERT_TRUE(w->finish().ok());
  }
  DerivedMarkers d;
  ASSERT_TRUE(derive_steps(path, StepRules{}, &d).ok());
  ASSERT_EQ(d.steps, 2);
  std::unique_ptr<TraceModel> m;
  ASSERT_TRUE(TraceModel::load(path, &m).ok());
  std::vector<std::string> phases;
  for (const Track& t : m->tracks)
    if (t.kind == TrackKind::Markers)
      for (size_t l = 2; l < t.lanes.size(); ++l)
        for (uint32_t item : t.lanes[l].item) phases.push_back(m->str(m->mark.name[item]));
  std::sort(phases.begin(), phases.end());
  EXPECT_EQ(phases, (std::vector<std::string>{"Trainer epoch 0", "Trainer step 0", "Trainer step 1", "data::load batch"}));
  for (size_t i = 0; i < m->mark.size(); ++i) EXPECT_EQ(m->str(m->mark.name[i]).find("zerotrace"), std::string::npos);
  EXPECT_EQ(range_label("zerotrace.lightning::epoch 2"), "Lightning epoch 2");
  EXPECT_EQ(range_label("zerotrace::loss"), "zerotrace::loss");  // the job's own zerotrace.phase("loss")
}

// The Replay panel's largest live allocations name their site as `zt db top` does (the Python line),
// with the device they are on.
TEST(PythonLeak, TheLargestLiveAllocationsNameTheirSite) {
  zt::test::TempDir dir;
  const std::string path = dir.file("pyleak.db");
  ASSERT_TRUE(zt::test::write_python_leak_trace(path));
  std::unique_ptr<TraceModel> m;
  ASSERT_TRUE(TraceModel::load(path, &m).ok());
  PlayheadState st = state_at(*m, 450, 10);
  ASSERT_EQ(st.largest.size(), 5u);  // grow's four 4 MiB and make_table's 2 MiB
  EXPECT_EQ(allocation_line(*m, st.largest[0]), "4.00 MiB  grow (/w/leak.py:12)  (rank 0 cpu)");
  EXPECT_EQ(allocation_line(*m, st.largest[4]), "2.00 MiB  make_table (/usr/lib/libtable.so+0x2000)  (rank 0 cpu)");
}

// A phase of step s that runs into step s+1 (the delayed update's AdamW, on a background thread
// beside the next step) is drawn on a "background" lane of its own, so the next step's phases stay
// on the first phase lane; a phase between two steps (a checkpoint) stays with the phases.
TEST(TraceModelBackground, PhasesThatOutliveTheirStepGetTheirOwnLane) {
  using namespace zt::db;
  zt::test::TempDir dir;
  const std::string path = dir.file("background.db");
  std::unique_ptr<TraceModel> m;
  {
    std::unique_ptr<TraceWriter> w = zt::test::hand_written_trace(path, "zt train --delayed-update 0");
    ASSERT_NE(w, nullptr);
    std::map<std::string, int64_t> names;
    int64_t id = 0;
    auto marker = [&](MarkerKind kind, const std::string& name, int64_t t0, int64_t t1, int64_t step) {
      auto [it, fresh] = names.emplace(name, int64_t(names.size()) + 1);
      if (fresh) w->insert(StringRow{it->second, name});
      MarkerRow m;
      m.id = ++id, m.kind = kind, m.name_id = it->second, m.t_start = t0, m.t_end = t1, m.step = step;
      w->insert(m);
    };
    marker(MarkerKind::Step, "step 0", 0, 100, 0);
    marker(MarkerKind::Phase, "forward", 0, 40, 0);
    marker(MarkerKind::Phase, "optimizer", 60, 100, 0);
    marker(MarkerKind::Phase, "adamw block0", 90, 130, 0);  // into step 1
    marker(MarkerKind::Phase, "checkpoint", 100, 110, 0);    // between the steps
    marker(MarkerKind::Step, "step 1", 110, 210, 1);
    marker(MarkerKind::Phase, "forward", 110, 150, 1);
    marker(MarkerKind::Phase, "adamw block1", 140, 160, 0);  // starts in step 1
    marker(MarkerKind::Phase, "optimizer", 170, 210, 1);
    m = finish_and_load(*w, path);
  }
  ASSERT_NE(m, nullptr);
  const Track& t = m->tracks.at(0);
  ASSERT_EQ(t.kind, TrackKind::Markers);
  std::map<std::string, std::vector<std::string>> by_lane;  // lane name (or index) -> marker names
  std::string name;
  for (size_t l = 0; l < t.lanes.size(); ++l) {
    if (!t.lane_names[l].empty()) name = t.lane_names[l];
    for (uint32_t row : t.lanes[l].item)
      by_lane[name + "/" + std::to_string(l)].push_back(m->str(m->mark.name[row]));
  }
  EXPECT_EQ(by_lane["phases/2"], (std::vector<std::string>{"forward", "optimizer", "checkpoint", "forward", "optimizer"}));
  EXPECT_EQ(by_lane["background/3"], (std::vector<std::string>{"adamw block0", "adamw block1"}));
  EXPECT_EQ(t.lane_names, (std::vector<std::string>{"epochs", "steps", "phases", "background"}));
}

TEST(TraceModelErrors, BadFileGivesAnErrorNamingIt) {
  zt::test::TempDir dir;
  std::string path = dir.file("not-a-trace.db");
  std::ofstream(path) << "this is not a zerotrace trace\n";
  std::unique_ptr<TraceModel> m;
  auto s = TraceModel::load(path, &m);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_FALSE(TraceModel::load(dir.file("missing.db"), &m).ok());
}

// r2's bug.db: partition 3's .grad lives on the host like its siblings and, for a while, also on
// the GPU. The GPU span is flagged and ordered last (so the panel paints it over the host span),
// and the error rows, which name the tensor as "...grad@cuda:N", mark it as named in an error.
TEST(Placement, WrongDeviceSpanIsLastAndErrorNamesMatchWithoutTheirDevice) {
  using M = zt::test::MismatchTrace;
  zt::test::TempDir dir;
  std::string err;
  ASSERT_TRUE(zt::test::write_mismatch_trace(dir.file("r2.db"), &err)) << err;
  std::unique_ptr<TraceModel> m;
  auto s = TraceModel::load(dir.file("r2.db"), &m);
  ASSERT_TRUE(s.ok()) << s.message();
  auto rows = placement_timeline(*m, 1000);
  ASSERT_EQ(rows.size(), 16u);  // 4 partitions and their .grad, per rank
  for (int r = 0; r < 2; ++r) {
    const TensorPlacement& p = rows[size_t(r)];
    EXPECT_EQ(p.name, M::kWrongTensor);
    EXPECT_EQ(p.rank, r);
    EXPECT_TRUE(p.mismatch);
    EXPECT_TRUE(p.in_error) << "the error names it as " << M::kWrongTensor << "@cuda:" << r;
    EXPECT_EQ(p.expected, "host");
    ASSERT_EQ(p.spans.size(), 2u);
    EXPECT_FALSE(p.spans[0].mismatch);  // the host span, the whole run
    EXPECT_TRUE(m->devices[size_t(p.spans[0].device)].host);
    EXPECT_TRUE(p.spans[1].mismatch);   // the GPU span, drawn last
    EXPECT_FALSE(m->devices[size_t(p.spans[1].device)].host);
    EXPECT_EQ(p.spans[1].t0, M::kGpuGradStart);
    EXPECT_EQ(p.spans[1].t1, M::kGpuGradEnd);
  }
  for (size_t i = 2; i < rows.size(); ++i) {
    EXPECT_FALSE(rows[i].mismatch) << rows[i].name;
    EXPECT_FALSE(rows[i].in_error) << rows[i].name;
  }
  EXPECT_EQ(error_tensor_names(R"(["combined_scale@cpu","a.grad@cuda:0","plain"])"),
            (std::vector<std::string>{"combined_scale", "a.grad", "plain"}));
}

// A probed program's steps (derived from its ranges when the trace was finished: here DeepSpeed's,
// the rows of a real trace, tests/data/deepspeed_zero3_offload_steps.sql) are the viewer's steps to
// jump to; a CUDA module's globals are not drawn; an old trace's "CUDA tracing was off" error row is
// not a flag.
TEST(TraceModelProbed, DerivedStepsNavigateAndModuleGlobalsAndNotesAreNotDrawn) {
  using namespace zt::db;
  zt::test::TempDir dir;
  const std::string path = dir.file("ds.db");
  {
    std::unique_ptr<TraceWriter> w;
    ASSERT_TRUE(TraceWriter::create(path, &w).ok());
    const std::string sql = zt::test::read_file(std::string(ZT_SOURCE_DIR) + "/tests/data/deepspeed_zero3_offload_steps.sql");
    ASSERT_FALSE(sql.empty());
    ASSERT_EQ(sqlite3_exec(w->handle(), sql.c_str(), nullptr, nullptr, nullptr), 0);
    // One of its module globals as this zt records them, and an old trace's note-as-error.
    ASSERT_EQ(sqlite3_exec(w->handle(),
                           "UPDATE allocation SET memory_kind = 5 WHERE id = 5046;"
                           "INSERT INTO error(rank, t, kind, site, message) VALUES (0, 150000000000, "
                           "'cuda_tracing_off', 'probe', 'CUDA tracing was off: test');",
                           nullptr, nullptr, nullptr),
              0);
    ASSERT_TRUE(w->finish().ok());
  }
  DerivedMarkers d;
  ASSERT_TRUE(derive_steps(path, StepRules{}, &d).ok());
  ASSERT_EQ(d.steps, 4);
  std::unique_ptr<TraceModel> m;
  ASSERT_TRUE(TraceModel::load(path, &m).ok());
  EXPECT_EQ(m->max_step, 3);
  EXPECT_EQ(m->step_start(0), 150277984551);  // the first DeepSpeedEngine.forward's start
  EXPECT_EQ(m->step_end(3), 155060298970);   // the fourth optimizer step's end
  for (size_t i = 0; i < m->alloc.size(); ++i) EXPECT_NE(m->alloc.id[i], 5046);
  EXPECT_TRUE(m->flags.empty());
}

// A launcher's or helper's key is not a rank (rank.role): its tracks are named by role and pid.
TEST(TraceModelRun, ALaunchersTracksAreNamedByItsPidNotAsARank) {
  using namespace zt::db;
  zt::test::TempDir dir;
  const std::string path = dir.file("job.db");
  std::unique_ptr<TraceWriter> w = zt::test::hand_written_trace(path, "python3 launch.py");
  ASSERT_NE(w, nullptr);
  RankRow launcher{2, 1, 1, std::nullopt, "h", 77};
  launcher.role = RankRole::Launcher;
  w->insert(launcher);
  RankRow helper{3, 1, 2, std::nullopt, "h", 78};
  helper.role = RankRole::Helper;
  helper.job_rank = 0;
  w->insert(helper);
  w->insert(DeviceRow{1, 2, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false});
  w->insert(DeviceRow{2, 3, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false});
  w->insert(StringRow{1, "host_rss"});
  w->insert(CounterRow{1, 2, 1, 1, 100, double(1 << 20)});
  w->insert(CounterRow{2, 3, 2, 1, 100, double(2 << 20)});
  std::unique_ptr<TraceModel> m = finish_and_load(*w, path);
  ASSERT_NE(m, nullptr);
  std::vector<std::string> titles;
  for (const Track& t : m->tracks) titles.push_back(t.title);
  auto has = [&](const std::string& prefix) {
    for (auto& t : titles)
      if (t.rfind(prefix, 0) == 0) return true;
    return false;
  };
  EXPECT_TRUE(has("launcher process 77 · host memory")) << ::testing::PrintToString(titles);
  EXPECT_TRUE(has("helper process 78 of rank 0 · host memory")) << ::testing::PrintToString(titles);
  EXPECT_FALSE(has("rank 2 ·")) << ::testing::PrintToString(titles);
}

// A trace whose detail stopped at its cap (issue 39): the overview draws the whole run from the
// aggregates alone, the full load draws the detail up to where it stopped and the aggregates after
// it, on one curve.
namespace {
using M = zt::test::MixedTrace;
const Track* memory_track(const TraceModel& m, const std::string& label) {
  for (auto& t : m.tracks)
    if ((t.kind == TrackKind::Memory || t.kind == TrackKind::HostMemory) && t.title.find(label) != std::string::npos)
      return &t;
  return nullptr;
}
const Series* named(const TraceModel& m, const Track& t, const std::string& name) {
  for (auto& ref : t.series)
    if (ref.name == name) return &m.series[size_t(ref.series)];
  return nullptr;
}
int count_kind(const TraceModel& m, TrackKind k) {
  return int(std::count_if(m.tracks.begin(), m.tracks.end(), [&](const Track& t) { return t.kind == k; }));
}
}  // namespace

TEST(MixedTrace, OverviewDrawsEveryStepFromTheAggregates) {
  zt::test::TempDir dir;
  std::string err;
  ASSERT_TRUE(zt::test::write_mixed_trace(dir.file("mixed.db"), &err)) << err;
  std::unique_ptr<TraceModel> m;
  zt::Status s = TraceModel::load(dir.file("mixed.db"), &m, nullptr, LoadScope::Overview);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(m->overview);
  EXPECT_EQ(m->detail_end, M::kDetailEnd);
  EXPECT_EQ(m->detail_reason, M::kReason);
  EXPECT_EQ(m->step_rows, 2 * M::kSteps);
  // No detail was read: no allocation row, no phase, no allocation track; the steps and epochs are there.
  EXPECT_EQ(m->alloc.size(), 0u);
  EXPECT_EQ(count_kind(*m, TrackKind::Allocations), 0);
  EXPECT_EQ(m->mark.size(), size_t(M::kSteps + 2));
  EXPECT_EQ(m->max_step, M::kSteps - 1);
  EXPECT_EQ(m->step_start(7), M::step_start(7));
  const Track* gpu = memory_track(*m, "cuda:0");
  ASSERT_NE(gpu, nullptr);
  const Series* a = named(*m, *gpu, "allocated");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->t.size(), size_t(M::kSteps));
  for (int st : {0, 5, 6, 19}) EXPECT_EQ(a->at(M::step_end(st)), double(M::allocated_at_end(st))) << "step " << st;
  const Series* pk = named(*m, *gpu, "step peak alloc");
  ASSERT_NE(pk, nullptr);
  EXPECT_EQ(pk->peak, double(M::kActivation + M::allocated_at_end(M::kSteps - 1)));
  ASSERT_NE(named(*m, *gpu, "reserved"), nullptr);
  const Track* host = memory_track(*m, "host memory");
  ASSERT_NE(host, nullptr);
  const Series* rss = named(*m, *host, "host_rss");
  ASSERT_NE(rss, nullptr);
  EXPECT_EQ(rss->at(M::step_end(10)), double(M::kGiB + 10 * 16 * M::kMiB));
  ASSERT_NE(named(*m, *host, "live (per step)"), nullptr);
}

TEST(MixedTrace, FullLoadJoinsTheDetailToTheAggregatesAfterIt) {
  zt::test::TempDir dir;
  std::string err;
  ASSERT_TRUE(zt::test::write_mixed_trace(dir.file("mixed.db"), &err)) << err;
  std::unique_ptr<TraceModel> m;
  zt::Status s = TraceModel::load(dir.file("mixed.db"), &m);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_FALSE(m->overview);
  EXPECT_EQ(m->detail_end, M::kDetailEnd);
  EXPECT_EQ(count_kind(*m, TrackKind::Allocations), 2);
  const Track* gpu = memory_track(*m, "cuda:0");
  ASSERT_NE(gpu, nullptr);
  const Series* a = named(*m, *gpu, "allocated");
  ASSERT_NE(a, nullptr);
  // The detail inside a step (the activation live), then each step's end past the cap.
  EXPECT_EQ(a->at(M::step_start(3) + 50 * M::kMs), double(M::kActivation));
  EXPECT_EQ(a->at(M::step_end(3)), 0.0);
  for (int st : {6, 12, 19}) EXPECT_EQ(a->at(M::step_end(st)), double(M::allocated_at_end(st))) << "step " << st;
  EXPECT_EQ(a->stop, INT64_MAX) << "the joined curve goes on past the detail";
  const Series* r = named(*m, *gpu, "reserved");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->at(M::step_start(2)), double(2 * M::kGiB));
  EXPECT_EQ(r->at(M::step_end(15)), double(4 * M::kGiB));
  // Peaks per step only where the detail is gone.
  const Series* pk = named(*m, *gpu, "step peak alloc");
  ASSERT_NE(pk, nullptr);
  EXPECT_GE(pk->t.front(), M::step_start(M::kDetailSteps));
  EXPECT_EQ(named(*m, *gpu, "step peak resv"), nullptr) << "it equals reserved at every step's end: no line for it";
  // A row the detail never saw freed (the segment, the pinned buffer) is drawn to where the detail
  // stopped, not through the aggregates-only stretch.
  for (auto& t : m->tracks)
    if (t.kind == TrackKind::Allocations)
      for (auto& lane : t.lanes)
        for (size_t i = 0; i < lane.size(); ++i) EXPECT_LE(lane.end[i], M::kDetailEnd) << t.title;
  // The host's detail series stop where the detail did; its aggregate goes on; RSS from counters
  // only (this trace has no counter rows, so none is made up from the aggregates).
  const Track* host = memory_track(*m, "host memory");
  ASSERT_NE(host, nullptr);
  const Series* pinned = named(*m, *host, "pinned");
  ASSERT_NE(pinned, nullptr);
  EXPECT_EQ(pinned->stop, M::kDetailEnd);
  const Series* live = named(*m, *host, "live (per step)");
  ASSERT_NE(live, nullptr);
  EXPECT_EQ(live->at(M::step_end(8)), double(320 * M::kMiB));
  EXPECT_EQ(named(*m, *host, "host_rss"), nullptr);
}

TEST_F(KnownTraceTest, AnUncappedTraceDrawsNoAggregateSeries) {
  EXPECT_EQ(model_->detail_end, -1);
  for (auto& t : model_->tracks)
    for (auto& ref : t.series) {
      EXPECT_NE(ref.name, "step peak alloc") << t.title;
      EXPECT_NE(ref.name, "live (per step)") << t.title;
      EXPECT_EQ(model_->series[size_t(ref.series)].stop, INT64_MAX) << t.title;
    }
}
