// viewer/ui/memory_track.cpp: the memory counter tracks. Owns how live bytes are drawn:
// each series decimated to one min/max pair per pixel column (lod.h), the allocated series
// filled, the others as lines, the device capacity as a dashed line when it is within
// reach of the curve, the label column (each series with its peak, the capacity, and the
// scale: the value at the top edge of the track), and the hover readout. Nothing is written
// over the curves: every number is in the label column.
#include <algorithm>
#include <cmath>

#include "panels.h"
#include "style.h"
#include "zt/common/units.h"

namespace zt::viewer {

float memory_track_height(const Track& track) { return track.kind == TrackKind::HostMemory ? 70.0f : 90.0f; }

namespace {

struct Scale {
  double top = 1;                  // bytes at the top edge of the track
  bool capacity_on_scale = false;  // the capacity line is drawn
};

Scale memory_scale(const TraceModel& m, const Track& track) {
  Scale sc;
  double top = 0;
  for (auto& ref : track.series) top = std::max(top, m.series[size_t(ref.series)].peak);
  // Show the capacity line when usage is at least a quarter of it: a run near its limit is
  // the interesting case, and an 80 GiB line over a 1 GiB curve would flatten the curve.
  sc.capacity_on_scale = track.capacity > 0 && double(track.capacity) <= top * 4;
  if (sc.capacity_on_scale) top = std::max(top, double(track.capacity));
  if (top <= 0) top = 1;
  sc.top = top * 1.08;  // headroom, so the peak does not touch the edge
  return sc;
}

}  // namespace

std::vector<std::string> draw_memory_labels(const LoadedTrace& lt, const Track& track, ImDrawList* dl, float x0,
                                            float x1, float y0, float y1) {
  const TraceModel& m = *lt.model;
  Scale sc = memory_scale(m, track);
  std::vector<std::string> lines;
  const float row = 14;
  float y = y0;
  dl->PushClipRect(ImVec2(x0, y0), ImVec2(x1, y1), true);
  auto line = [&](ImU32 swatch, bool dashed, const std::string& name, const std::string& value, ImU32 text_col) {
    if (dashed) {
      dl->AddLine(ImVec2(x0, y + 8), ImVec2(x0 + 3, y + 8), swatch, 1.5f);
      dl->AddLine(ImVec2(x0 + 5, y + 8), ImVec2(x0 + 8, y + 8), swatch, 1.5f);
    } else if (swatch) {
      dl->AddRectFilled(ImVec2(x0, y + 4), ImVec2(x0 + 8, y + 12), swatch);
    }
    std::string shown = name;
    // In a host memory track "host_" says nothing the title does not (host_rss: rss).
    if (track.kind == TrackKind::HostMemory && shown.rfind("host_", 0) == 0) shown = shown.substr(5);
    // A long counter name gives way to its value (they were drawn over each other): "peak " goes
    // first (the rows above say it), then the name's end (its start says what it counts).
    std::string shown_value = value;
    auto room_for = [&](const std::string& v) { return std::max(0.0f, x1 - ImGui::CalcTextSize(v.c_str()).x - 8 - (x0 + 12)); };
    if (ImGui::CalcTextSize(shown.c_str()).x > room_for(shown_value) && shown_value.rfind("peak ", 0) == 0)
      shown_value = shown_value.substr(5);
    const ImVec2 vs = ImGui::CalcTextSize(shown_value.c_str());
    const float room = room_for(shown_value);
    if (ImGui::CalcTextSize(shown.c_str()).x > room) {
      while (!shown.empty() && ImGui::CalcTextSize((shown + "...").c_str()).x > room) shown.pop_back();
      shown += "...";
    }
    dl->AddText(ImVec2(x0 + 12, y), text_col, shown.c_str());
    dl->AddText(ImVec2(x1 - vs.x, y), text_col, shown_value.c_str());
    lines.push_back(name.empty() ? value : name + " " + value);
    y += row;
  };
  const ImU32 text = IM_COL32(170, 170, 180, 255), dim = IM_COL32(120, 120, 130, 255);
  for (size_t s = 0; s < track.series.size(); ++s) {
    const Series& ser = m.series[size_t(track.series[s].series)];
    line(series_color(track.series[s].name, int(s)), false, track.series[s].name, "peak " + format_bytes(ser.peak), text);
  }
  if (track.capacity > 0) {
    line(kCapacityColor, true, "capacity", format_bytes(double(track.capacity)), text);
    if (!sc.capacity_on_scale) line(0, false, "", "(above the scale)", dim);
  }
  line(0, false, "scale", "0 - " + format_bytes(sc.top), dim);
  dl->PopClipRect();
  return lines;
}

void draw_memory_track(const LoadedTrace& lt, const Track& track, const MemoryTrackArea& a, bool hovered,
                       ImVec2 mouse) {
  const TraceModel& m = *lt.model;
  const Scale sc = memory_scale(m, track);
  const double top = sc.top;
  const float h = a.y1 - a.y0 - 2;
  auto y_of = [&](double v) { return a.y1 - 1 - float(v / top) * h; };
  int columns = int(std::ceil(a.x1 - a.x0));
  std::vector<ColumnMinMax> cols;
  int64_t t0 = int64_t(std::floor(a.view_t0));
  for (size_t s = 0; s < track.series.size(); ++s) {
    const Series& ser = m.series[size_t(track.series[s].series)];
    ImU32 col = series_color(track.series[s].name, int(s));
    decimate(ser, t0, a.ns_per_px, columns, std::min(ser.stop, m.t_last + 1), &cols);
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
  if (sc.capacity_on_scale) {
    float y = y_of(double(track.capacity));
    for (float x = a.x0; x < a.x1; x += 12) a.dl->AddLine(ImVec2(x, y), ImVec2(std::min(x + 7, a.x1), y), kCapacityColor, 1.5f);
  }

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
