// viewer/model/time_view.h: the mapping between trace time and pixels, and the navigation
// moves on it (zoom at a point, pan, fit). Pure arithmetic so tests can check that zooming
// keeps the time under the cursor still.
// Invariants: ns_per_px > 0; times are in "view time", i.e. nanoseconds relative to the
// alignment point of each trace (step 0), so two traces share one axis.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace zt::viewer {

struct TimeView {
  double t0 = 0;         // view time at the left edge, ns
  double ns_per_px = 1;  // zoom
  double width_px = 1;   // width of the time area

  double t1() const { return t0 + ns_per_px * width_px; }
  double x_of(double t) const { return (t - t0) / ns_per_px; }
  double t_of(double x) const { return t0 + x * ns_per_px; }

  void fit(double a, double b) {
    if (b <= a) b = a + 1000;
    double pad = (b - a) * 0.02;
    t0 = a - pad;
    ns_per_px = std::max((b - a + 2 * pad) / std::max(width_px, 1.0), 1e-3);
  }
  // factor < 1 zooms in. The time under x stays under x.
  void zoom_at(double x, double factor) {
    double t = t_of(x);
    ns_per_px = std::clamp(ns_per_px * factor, 1e-3, 1e15);
    t0 = t - x * ns_per_px;
  }
  void pan_px(double dx) { t0 -= dx * ns_per_px; }
  void center_on(double t) { t0 = t - 0.5 * width_px * ns_per_px; }
};

}  // namespace zt::viewer
