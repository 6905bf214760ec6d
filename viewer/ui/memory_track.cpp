// viewer/ui/memory_track.cpp: the memory counter tracks. Owns how live bytes are drawn:
// each series decimated to one min/max pair per pixel column (lod.h), the allocated series
// filled, the others as lines, the device capacity as a dashed line when it is within
// reach of the curve (else named in the corner), and the hover readout.
#include <algorithm>
#include <cmath>

#include "panels.h"
#include "style.h"
#include "zt/common/units.h"

namespace zt::viewer {

float memory_track_height(const Track& track) { return track.kind == TrackKind::HostMemory ? 70.0f : 90.0f; }

void draw_memory_track(const LoadedTrace& lt, const Track& track, const MemoryTrackArea& a, bool hovered,
                       ImVec2 mouse) {
  const TraceModel& m = *lt.model;
  double top = 0;
  for (auto& ref : track.series) top = std::max(top, m.series[size_t(ref.series)].peak);
  // Show the capacity line when usage is at least a quarter of it: a run near its limit is
  // the interesting case, and an 80 GiB line over a 1 GiB curve would flatten the curve.
  bool capacity_on_scale = track.capacity > 0 && double(track.capacity) <= top * 4;
  if (capacity_on_scale) top = std::max(top, double(track.capacity));
  if (top <= 0) top = 1;
  top *= 1.08;
  const float h = a.y1 - a.y0 - 2;
  auto y_of = [&](double v) { return a.y1 - 1 - float(v / top) * h; };
  int columns = int(std::ceil(a.x1 - a.x0));
  std::vector<ColumnMinMax> cols;
  int64_t t0 = int64_t(std::floor(a.view_t0));
  for (size_t s = 0; s < track.series.size(); ++s) {
    const Series& ser = m.series[size_t(track.series[s].series)];
    ImU32 col = series_color(track.series[s].name, int(s));
    decimate(ser, t0, a.ns_per_px, columns, m.t_last + 1, &cols);
    bool fill = s == 0;
    float prev_y = -1;
    for (int c = 0; c < columns; ++c) {
      const ColumnMinMax& v = cols[size_t(c)];
      if (!v.any) {
        prev_y = -1;
        continue;
      }
      float x = a.x0 + float(c);
      float ylo = y_of(v.lo), yhi = y_of(v.hi);
      if (fill) a.dl->AddRectFilled(ImVec2(x, yhi), ImVec2(x + 1, a.y1), (col & 0x00FFFFFF) | 0x50000000);
      // The column's own range, joined to the previous column so steps stay connected.
      float ya = std::min(yhi, prev_y < 0 ? yhi : prev_y), yb = std::max(ylo, prev_y < 0 ? ylo : prev_y);
      a.dl->AddRectFilled(ImVec2(x, ya - 0.5f), ImVec2(x + 1.5f, yb + 1.0f), col);
      prev_y = y_of(v.last);
    }
  }
  if (capacity_on_scale) {
    float y = y_of(double(track.capacity));
    for (float x = a.x0; x < a.x1; x += 12) a.dl->AddLine(ImVec2(x, y), ImVec2(std::min(x + 7, a.x1), y), kCapacityColor, 1.5f);
  }
  std::string scale = format_bytes(top / 1.08);
  std::string corner = "max " + scale;
  if (track.capacity > 0)
    corner += capacity_on_scale ? "  capacity " + format_bytes(double(track.capacity))
                                : "  capacity " + format_bytes(double(track.capacity)) + " (above scale)";
  ImVec2 ts = ImGui::CalcTextSize(corner.c_str());
  a.dl->AddText(ImVec2(a.x1 - ts.x - 6, a.y0 + 2), IM_COL32(150, 150, 160, 255), corner.c_str());

  if (hovered) {
    double t = a.view_t0 + double(mouse.x - a.x0) * a.ns_per_px;
    a.dl->AddLine(ImVec2(mouse.x, a.y0), ImVec2(mouse.x, a.y1), IM_COL32(255, 255, 255, 60));
    ImGui::BeginTooltip();
    ImGui::Text("%s at %s", track.title.c_str(), time_label(t - double(m.t_align)).c_str());
    for (size_t s = 0; s < track.series.size(); ++s) {
      const Series& ser = m.series[size_t(track.series[s].series)];
      color_swatch(series_color(track.series[s].name, int(s)));
      ImGui::Text("%-10s %s (peak %s at %s)", track.series[s].name.c_str(), format_bytes(ser.at(int64_t(t))).c_str(),
                  format_bytes(ser.peak).c_str(), time_label(double(ser.peak_t - m.t_align)).c_str());
    }
    if (track.capacity > 0) ImGui::Text("capacity   %s", format_bytes(double(track.capacity)).c_str());
    ImGui::EndTooltip();
  }
}

}  // namespace zt::viewer
