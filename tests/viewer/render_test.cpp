// Rendering tests: the real `zt view --screenshot` under Xvfb with Mesa, checked by what
// must be where (the memory peak's x, the error flag's colour at its time, the number of
// tracks), never by byte-equal images. Skipped when no X display can be made.
#include <gtest/gtest.h>
#include <stb_image.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "known_trace.h"
#include "mixed_trace.h"
#include "test_util.h"

using K = zt::test::KnownTrace;
using json = nlohmann::json;

namespace {

struct Shot {
  int rc = -1;
  std::string err;
  int w = 0, h = 0;
  std::vector<unsigned char> rgb;
  json layout;
  bool pixel_is(int x, int y, int r, int g, int b, int tol = 12) const {
    if (x < 0 || y < 0 || x >= w || y >= h) return false;
    const unsigned char* p = &rgb[(size_t(y) * size_t(w) + size_t(x)) * 3];
    return std::abs(p[0] - r) <= tol && std::abs(p[1] - g) <= tol && std::abs(p[2] - b) <= tol;
  }
  double x_of(int64_t trace_t, int trace = 0) const {
    double align = layout["traces"][size_t(trace)]["t_align"].get<double>();
    return layout["time_x0"].get<double>() +
           (double(trace_t) - align - layout["view_t0_ns"].get<double>()) / layout["ns_per_px"].get<double>();
  }
  const json* track(const std::string& kind, int trace = 0) const {
    for (auto& t : layout["tracks"])
      if (t["kind"] == kind && t["trace"] == trace) return &t;
    return nullptr;
  }
};

bool have_xvfb() { return std::system("command -v xvfb-run >/dev/null 2>&1") == 0; }

Shot screenshot(const zt::test::TempDir& dir, const std::string& args, const std::string& size = "1600x1000") {
  Shot s;
  std::string png = dir.file("shot.png");
  zt::test::CommandResult r = zt::test::run_under_xvfb(
      ZT_BINARY_DIR "/zt view " + args + " --screenshot " + png + " --size " + size, dir.path(), "-screen 0 1600x1000x24");
  s.rc = r.code;
  s.err = r.out;
  if (s.rc != 0) return s;
  int n = 0;
  unsigned char* data = stbi_load(png.c_str(), &s.w, &s.h, &n, 3);
  if (data) {
    s.rgb.assign(data, data + size_t(s.w) * size_t(s.h) * 3);
    stbi_image_free(data);
  }
  std::ifstream(png + ".json") >> s.layout;
  return s;
}

class RenderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_xvfb()) GTEST_SKIP() << "xvfb-run not found: cannot make an X display";
    std::string err;
    ASSERT_TRUE(zt::test::write_known_trace(dir_.file("known.db"), &err)) << err;
  }
  Shot take(const std::string& extra = "") { return take_of(dir_.file("known.db") + " " + extra); }
  // `args`: the traces and options; `size`: the window.
  Shot take_of(const std::string& args, const std::string& size = "1600x1000") {
    Shot s = screenshot(dir_, args, size);
    if (s.rc != 0 && s.err.find("cannot open a window") != std::string::npos) {
      skipped_ = true;
      return s;
    }
    return s;
  }
  zt::test::TempDir dir_;
  bool skipped_ = false;
};

#define TAKE_OR_SKIP(var, extra)                                              \
  Shot var = take(extra);                                                     \
  if (skipped_) GTEST_SKIP() << "no X display could be made: " << var.err;    \
  ASSERT_EQ(var.rc, 0) << var.err;                                            \
  ASSERT_EQ(var.w, 1600);                                                     \
  ASSERT_EQ(var.h, 1000)

// The same for any traces and window size.
#define TAKE_OF_OR_SKIP(var, args, size, w_, h_)                              \
  Shot var = take_of(args, size);                                             \
  if (skipped_) GTEST_SKIP() << "no X display could be made: " << var.err;    \
  ASSERT_EQ(var.rc, 0) << var.err;                                            \
  ASSERT_EQ(var.w, w_);                                                       \
  ASSERT_EQ(var.h, h_)

// The placement row of `name` on `rank` as drawn (null if it was not).
const json* placement_row(const Shot& s, const std::string& name, int rank) {
  for (auto& r : s.layout["placement_rows"])
    if (r["name"] == name && r["rank"] == rank) return &r;
  return nullptr;
}

}  // namespace

TEST_F(RenderTest, MemoryCurvePeaksAtTheCheckpointGather) {
  TAKE_OR_SKIP(s, "");
  const json* mem = s.track("memory");
  ASSERT_NE(mem, nullptr);
  int y0 = int((*mem)["y0"].get<double>()), y1 = int((*mem)["y1"].get<double>());
  int x0 = int(s.layout["time_x0"].get<double>()), x1 = int(s.layout["time_x1"].get<double>());
  // The allocated curve's highest pixel: the first row from the top holding its colour.
  int best_y = y1, best_x = -1;
  for (int y = y0; y < y1 && best_x < 0; ++y)
    for (int x = x0; x < x1; ++x)
      if (s.pixel_is(x, y, 60, 200, 170, 20)) {
        best_y = y, best_x = x;
        break;
      }
  ASSERT_GE(best_x, 0) << "no allocated curve drawn in the memory track";
  double a = s.x_of(K::kPeakStart), b = s.x_of(K::kPeakEnd);
  EXPECT_GE(best_x, int(a) - 2) << "peak drawn at x=" << best_x << ", expected in [" << a << ", " << b << "]";
  EXPECT_LE(best_x, int(b) + 2) << "peak drawn at x=" << best_x << ", expected in [" << a << ", " << b << "]";
  EXPECT_LT(best_y, y0 + (y1 - y0) / 3) << "the peak should reach the top third";
}

TEST_F(RenderTest, FaultAndErrorFlagsAtTheirTimes) {
  TAKE_OR_SKIP(s, "");
  const json* flags = s.track("flags");
  ASSERT_NE(flags, nullptr);
  int y = int((*flags)["y0"].get<double>()) + 12;
  int xe = int(std::lround(s.x_of(K::kErrorT))), xf = int(std::lround(s.x_of(K::kFaultT)));
  EXPECT_TRUE(s.pixel_is(xe, y, 235, 30, 30) || s.pixel_is(xe - 1, y, 235, 30, 30)) << "no error flag at x=" << xe;
  EXPECT_TRUE(s.pixel_is(xf, y, 255, 170, 0) || s.pixel_is(xf - 1, y, 255, 170, 0)) << "no fault flag at x=" << xf;
  // Between them, at step 5's start, there is no flag.
  int xn = int(std::lround(s.x_of(K::step_start(5))));
  EXPECT_FALSE(s.pixel_is(xn, y, 235, 30, 30) || s.pixel_is(xn, y, 255, 170, 0));
}

TEST_F(RenderTest, OneTrackPerKindAndTwoTracesSideBySide) {
  TAKE_OR_SKIP(s, "");
  ASSERT_EQ(s.layout["tracks"].size(), 7u);
  for (auto& t : s.layout["tracks"]) {
    // Each track's header shows its title: light text pixels in the header row.
    int y = int(t["y0"].get<double>()) - 9, text = 0;
    for (int x = 60; x < 200; ++x) text += s.pixel_is(x, y, 225, 225, 235, 40);
    EXPECT_GT(text, 0) << "no title drawn for track " << t["title"];
  }
  std::string err;
  ASSERT_TRUE(zt::test::write_known_trace(dir_.file("after.db"), &err)) << err;
  TAKE_OR_SKIP(two, dir_.file("after.db"));
  EXPECT_EQ(two.layout["tracks"].size(), 14u);
  EXPECT_EQ(two.layout["traces"].size(), 2u);
  // Both aligned at step 0: the same time maps to the same x in both traces.
  EXPECT_NEAR(two.x_of(K::kErrorT, 0), two.x_of(K::kErrorT, 1), 0.01);
}

TEST_F(RenderTest, StepZoomsToThatStep) {
  TAKE_OR_SKIP(s, "--step 6 --panel leaks");
  double a = s.x_of(K::step_start(6)), b = s.x_of(K::step_start(7));
  double x0 = s.layout["time_x0"].get<double>(), x1 = s.layout["time_x1"].get<double>();
  EXPECT_NEAR(a, x0, (x1 - x0) * 0.05);
  EXPECT_NEAR(b, x1, (x1 - x0) * 0.05);
}

// r2's bug: a .grad that lived on the GPU for a while beside its host copy. Its GPU span is
// painted over the host span in the mismatch colour, the legend names each device once, and
// the error rows (which name it "...grad@cuda:N") mark it as named in an error.
TEST_F(RenderTest, PlacementShowsTheWrongDeviceSpanOverItsHostSpan) {
  using M = zt::test::MismatchTrace;
  std::string err;
  ASSERT_TRUE(zt::test::write_mismatch_trace(dir_.file("r2.db"), &err)) << err;
  TAKE_OF_OR_SKIP(s, dir_.file("r2.db") + " --panel placement", "1600x1000", 1600, 1000);
  EXPECT_EQ(s.layout["placement_legend"], json({"host", "cuda:0", "cuda:1", "wrong device class"}));
  for (int rank = 0; rank < 2; ++rank) {
    const json* row = placement_row(s, M::kWrongTensor, rank);
    ASSERT_NE(row, nullptr) << "no placement row drawn for " << M::kWrongTensor << " on rank " << rank;
    EXPECT_EQ((*row)["text"], std::string(M::kWrongTensor) + "  (in an error)");
    double x0 = (*row)["x0"].get<double>(), x1 = (*row)["x1"].get<double>();
    double t0 = (*row)["t0"].get<double>(), t1 = (*row)["t1"].get<double>();
    auto x_at = [&](int64_t t) { return int(std::lround(x0 + (double(t) - t0) / (t1 - t0) * (x1 - x0))); };
    int y = int(((*row)["y0"].get<double>() + (*row)["y1"].get<double>()) / 2);
    int on_gpu = x_at((M::kGpuGradStart + M::kGpuGradEnd) / 2), on_host = x_at(M::kT0 + 10 * M::kMs);
    EXPECT_TRUE(s.pixel_is(on_gpu, y, 255, 60, 200)) << "rank " << rank << ": the GPU span is not drawn at x=" << on_gpu;
    EXPECT_TRUE(s.pixel_is(on_host, y, 150, 150, 150)) << "rank " << rank << ": the host span is not drawn at x=" << on_host;
  }
}

// In a narrow window the tensor column cannot fit the name: it loses its start, not the ".grad".
TEST_F(RenderTest, NarrowPlacementColumnKeepsTheEndOfTheName) {
  using M = zt::test::MismatchTrace;
  std::string err;
  ASSERT_TRUE(zt::test::write_mismatch_trace(dir_.file("r2.db"), &err)) << err;
  TAKE_OF_OR_SKIP(s, dir_.file("r2.db") + " --panel placement", "700x800", 700, 800);
  const json* row = placement_row(s, M::kWrongTensor, 0);
  ASSERT_NE(row, nullptr);
  std::string text = (*row)["text"];
  EXPECT_EQ(text.rfind("...", 0), 0u) << text;
  std::string end = "[3].grad  (in an error)";
  ASSERT_GE(text.size(), end.size());
  EXPECT_EQ(text.substr(text.size() - end.size()), end) << text;
}

// The first frame: the playhead at the first step's start (view time 0), where the model states
// are live, not at the trace's first event before anything is; each allocation track names its
// colours in its label column: the families of its rows, and the allocator's segments (dimmer).
TEST_F(RenderTest, FirstFrameHasThePlayheadAtStepZeroAndTheAllocationColoursNamed) {
  TAKE_OR_SKIP(s, "");
  EXPECT_EQ(s.layout["playhead_ns"].get<double>(), 0.0);
  // The known trace's device holds blockA.gathered, .act, .grad and checkpoint.gather; its host
  // block0.master and the offload buffers, in pinned segments.
  std::map<std::string, json> legends;
  for (auto& t : s.layout["tracks"])
    if (t["kind"] == "allocations") legends[t["title"]] = t["labels"];
  ASSERT_EQ(legends.size(), 2u) << s.layout["tracks"].dump();
  for (auto& [title, labels] : legends) {
    if (title.find("cuda:0") != std::string::npos)
      EXPECT_EQ(labels, json({"parameters", "gradients", "activations", "buffers/other"})) << title;
    else
      EXPECT_EQ(labels, json({"optimizer state", "buffers/other", "dimmer: allocator segment"})) << title;
  }
}

// Every number of a memory track is in its label column: each series' real peak, the capacity,
// and the scale (the top edge), named as such; nothing is written over the curves.
TEST_F(RenderTest, MemoryTrackNamesPeaksAndScaleBesideTheCurves) {
  TAKE_OR_SKIP(s, "");
  const json* mem = s.track("memory");
  ASSERT_NE(mem, nullptr);
  std::vector<std::string> labels = (*mem)["labels"];
  auto has = [&](const std::string& prefix) {
    for (auto& l : labels)
      if (l.rfind(prefix, 0) == 0) return true;
    return false;
  };
  EXPECT_TRUE(has("allocated peak 3.50 GiB")) << (*mem)["labels"].dump();
  EXPECT_TRUE(has("capacity 4.00 GiB")) << (*mem)["labels"].dump();
  EXPECT_TRUE(has("scale 0 - ")) << (*mem)["labels"].dump();
  EXPECT_FALSE(has("max")) << (*mem)["labels"].dump();
  // No text in the top strip of the time area, where a corner label used to cross the lines.
  int y0 = int((*mem)["y0"].get<double>()), x1 = int(s.layout["time_x1"].get<double>());
  int text = 0;
  for (int y = y0; y < y0 + 14; ++y)
    for (int x = x1 - 400; x < x1; ++x) text += s.pixel_is(x, y, 150, 150, 160, 6);
  EXPECT_EQ(text, 0) << "text drawn over the memory curves";
}

// Two traces split the timeline: B's tracks start on screen, not below A's, and the replay
// panel shows the state of both.
TEST_F(RenderTest, TwoTracesAreBothOnScreenAndReplayShowsBoth) {
  std::string err;
  ASSERT_TRUE(zt::test::write_known_trace(dir_.file("after.db"), &err)) << err;
  TAKE_OR_SKIP(s, dir_.file("after.db") + " --panel replay");
  double top = s.layout["timeline_y0"].get<double>(), bottom = s.layout["timeline_y1"].get<double>();
  ASSERT_EQ(s.layout["trace_areas"].size(), 2u);
  for (int trace = 0; trace < 2; ++trace) {
    const json* first = nullptr;
    for (auto& t : s.layout["tracks"])
      if (t["trace"] == trace) {
        first = &t;
        break;
      }
    ASSERT_NE(first, nullptr);
    EXPECT_GT((*first)["y0"].get<double>(), top) << "trace " << trace;
    EXPECT_LT((*first)["y1"].get<double>(), bottom) << "trace " << trace << "'s first track is below the timeline";
  }
  EXPECT_EQ(s.layout["replay_traces"], json({0, 1}));
}

// Kernel lanes are tall enough for the kernel's name to be written in a wide span.
TEST_F(RenderTest, KernelNamesAreWrittenInWideSpans) {
  using M = zt::test::MismatchTrace;
  std::string err;
  ASSERT_TRUE(zt::test::write_mismatch_trace(dir_.file("r2.db"), &err)) << err;
  TAKE_OF_OR_SKIP(s, dir_.file("r2.db"), "1600x1000", 1600, 1000);
  const json* k = s.track("kernels");
  ASSERT_NE(k, nullptr);
  int y0 = int((*k)["y0"].get<double>()), xa = int(s.x_of(M::kKernelStart)), xb = int(s.x_of(M::kKernelEnd));
  ASSERT_GT(xb - xa, 100);
  int text = 0;  // the label's dark pixels inside the span
  for (int y = y0 + 1; y < y0 + 12; ++y)
    for (int x = xa + 2; x < xb - 2; ++x) text += s.pixel_is(x, y, 15, 15, 20, 5);
  EXPECT_GT(text, 20) << "no kernel name drawn in the span at x=" << xa << ".." << xb;
}

TEST(ViewCommand, BadTraceIsAnErrorNotACrash) {
  zt::test::TempDir dir;
  std::string bad = dir.file("foreign.db");
  std::ofstream(bad) << "SQLite format 3? no, just text";
  std::string cmd = ZT_BINARY_DIR "/zt view " + bad + " --screenshot " + dir.file("x.png") + " 2>" + dir.file("err");
  int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  std::ifstream e(dir.file("err"));
  std::string line;
  std::getline(e, line);
  EXPECT_EQ(line.rfind("zt: " + bad, 0), 0u) << line;
  EXPECT_FALSE(std::ifstream(dir.file("x.png")).good());
}

// A trace whose detail stopped at its size cap (issue 39): past the cap the memory track goes on
// with each step's aggregates, and the stretch is marked as aggregates only in every track's header.
TEST_F(RenderTest, AnAggregateOnlyStretchIsDrawnAsSuch) {
  using M = zt::test::MixedTrace;
  std::string err;
  ASSERT_TRUE(zt::test::write_mixed_trace(dir_.file("mixed.db"), &err)) << err;
  TAKE_OF_OR_SKIP(s, dir_.file("mixed.db"), "1600x1000", 1600, 1000);
  ASSERT_EQ(s.layout["aggregate_bands"].size(), 1u) << s.layout.dump();
  const json& band = s.layout["aggregate_bands"][0];
  const std::string label = band["label"].get<std::string>();
  EXPECT_NE(label.find("aggregates only"), std::string::npos) << label;
  EXPECT_NE(label.find("size cap"), std::string::npos) << label;
  const int bx0 = int(band["x0"].get<double>()), bx1 = int(band["x1"].get<double>());
  EXPECT_NEAR(band["x0"].get<double>(), s.x_of(M::kDetailEnd), 2.0);
  EXPECT_NEAR(band["x1"].get<double>(), s.x_of(M::step_end(M::kSteps - 1)), 2.0);
  ASSERT_GT(bx1 - bx0, 200);
  const json* mem = s.track("memory");
  ASSERT_NE(mem, nullptr);
  const int y0 = int((*mem)["y0"].get<double>()), y1 = int((*mem)["y1"].get<double>());
  // The allocated curve goes on through the band (each step's end), not an empty track.
  int columns_with_curve = 0;
  for (int x = bx0 + 4; x < bx1 - 4; ++x)
    for (int y = y0; y < y1; ++y)
      if (s.pixel_is(x, y, 60, 200, 170, 20)) {
        ++columns_with_curve;
        break;
      }
  EXPECT_GT(columns_with_curve, (bx1 - bx0 - 8) * 8 / 10) << "the allocated curve is missing past the cap";
  // It climbs: its highest pixel near the band's end is above its highest near the band's start.
  auto top_of_curve = [&](int x) {
    for (int y = y0; y < y1; ++y)
      if (s.pixel_is(x, y, 60, 200, 170, 20)) return y;
    return y1;
  };
  EXPECT_LT(top_of_curve(bx1 - 6), top_of_curve(bx0 + 60) - 10);
  // Every track's header is marked over the band, and only there.
  for (auto& t : s.layout["tracks"]) {
    const int hy = int(t["y0"].get<double>()) - 4;
    EXPECT_TRUE(s.pixel_is(bx1 - 3, hy, 110, 80, 190, 16)) << t["title"];
    EXPECT_FALSE(s.pixel_is(bx0 - 20, hy, 110, 80, 190, 16)) << t["title"];
  }
  // The detail before the cap is drawn as before: its allocation track is there.
  EXPECT_NE(s.track("allocations"), nullptr);
}
