// Rendering tests: the real `zt view --screenshot` under Xvfb with Mesa, checked by what
// must be where (the memory peak's x, the error flag's colour at its time, the number of
// tracks), never by byte-equal images. Skipped when no X display can be made.
#include <gtest/gtest.h>
#include <stb_image.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "known_trace.h"
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

Shot screenshot(const zt::test::TempDir& dir, const std::string& args) {
  Shot s;
  std::string png = dir.file("shot.png"), err = dir.file("stderr.txt");
  std::string cmd = "xvfb-run -a -s \"-screen 0 1600x1000x24\" " ZT_BINARY_DIR "/zt view " + args +
                    " --screenshot " + png + " --size 1600x1000 2>" + err;
  int status = std::system(cmd.c_str());
  s.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream e(err);
  std::stringstream ss;
  ss << e.rdbuf();
  s.err = ss.str();
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
  Shot take(const std::string& extra = "") {
    Shot s = screenshot(dir_, dir_.file("known.db") + " " + extra);
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
