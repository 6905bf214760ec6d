// viewer/ui/placement_panel.cpp: the placement view. Owns the table of tensors with a bar
// per tensor showing on which device it lived over the whole run (colour per device, grey
// for host). Spans on a device class its siblings never use are drawn in the mismatch colour,
// on top of whatever they overlap (a .grad left on the GPU while its host copy lives on), and
// listed first, as are tensors named in an error. Computed once (analysis.h).
#include <algorithm>

#include "panels.h"
#include "style.h"
#include "zt/common/units.h"

namespace zt::viewer {
namespace {

// What a device is called in the legend and tooltips: its label ("cuda:1"), with its rank
// when another rank's device has the same label.
std::string device_name(const TraceModel& m, int d) {
  if (d < 0) return "?";
  const DeviceInfo& dev = m.devices[size_t(d)];
  if (dev.host) return "host (" + dev.label + ")";
  for (size_t o = 0; o < m.devices.size(); ++o)
    if (int(o) != d && !m.devices[o].host && m.devices[o].label == dev.label)
      return "rank " + std::to_string(dev.rank) + " " + dev.label;
  return dev.label;
}

}  // namespace

void draw_placement_panel(ViewerState& st) {
  for (int ti = 0; ti < int(st.traces.size()); ++ti) {
    LoadedTrace& lt = st.traces[size_t(ti)];
    const TraceModel& m = *lt.model;
    if (!lt.placements) {
      Status loaded;
      lt.placements = placement_timeline(m, std::max<int64_t>((m.t_last - m.t_first) / 2000, 1), &loaded);
      lt.placement_error = loaded ? "" : loaded.message();
    }
    const auto& rows = *lt.placements;
    if (!lt.placement_error.empty()) ImGui::TextColored(ImVec4(1, 0.4f, 0.4f, 1), "%s", lt.placement_error.c_str());
    size_t mismatched = 0;
    for (auto& r : rows) mismatched += r.mismatch;
    if (st.traces.size() > 1) ImGui::TextDisabled("%s", lt.label.c_str());
    if (rows.empty()) {
      ImGui::Text("No placement rows in this trace.");
      continue;
    }
    if (mismatched)
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kMismatchColor),
                         "%zu tensor(s) on a device class their siblings do not use (listed first)", mismatched);
    else
      ImGui::Text("%zu tensors; every one lives where its siblings live.", rows.size());
    // Legend: host once (every host is drawn grey), each accelerator in its colour, and the
    // mismatch colour, which replaces the device colour on a wrong-class span.
    ImGui::SameLine();
    ImGui::TextDisabled("  legend:");
    auto legend = [&](ImU32 col, const std::string& text) {
      // On this line when it fits, else on the next.
      float w = ImGui::GetTextLineHeight() + ImGui::GetStyle().ItemSpacing.x * 2 + ImGui::CalcTextSize(text.c_str()).x;
      ImGui::SameLine();
      if (ImGui::GetContentRegionAvail().x < w) ImGui::NewLine();
      color_swatch(col);
      ImGui::TextUnformatted(text.c_str());
      if (ti == 0) st.layout.placement_legend.push_back(text);
    };
    bool any_host = false;
    for (auto& d : m.devices) any_host = any_host || d.host;
    if (any_host) legend(device_color(0, true), "host");
    for (size_t d = 0; d < m.devices.size(); ++d)
      if (!m.devices[d].host) legend(device_color(int(d), false), device_name(m, int(d)));
    if (mismatched) legend(kMismatchColor, "wrong device class");
    ImGui::PushID(ti);
    float height = st.traces.size() > 1 ? ImGui::GetContentRegionAvail().y / 2 : 0;
    // The tensor column fits the longest name (with its error note), up to 40% of the panel;
    // a longer name loses its start, not its end: the ".grad" that matters is at the end.
    const char* kErrorNote = "  (in an error)";
    float name_w = 0;
    for (auto& r : rows)
      name_w = std::max(name_w, ImGui::CalcTextSize(r.name.c_str()).x + (r.in_error ? ImGui::CalcTextSize(kErrorNote).x : 0));
    name_w = std::clamp(name_w + 8, 120.0f, std::max(120.0f, ImGui::GetContentRegionAvail().x * 0.4f));
    if (ImGui::BeginTable("##placement", 4, ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY |
                                                ImGuiTableFlags_Resizable,
                          ImVec2(0, height))) {
      ImGui::TableSetupScrollFreeze(0, 1);
      ImGui::TableSetupColumn("rank", ImGuiTableColumnFlags_WidthFixed, 40);
      ImGui::TableSetupColumn("tensor", ImGuiTableColumnFlags_WidthFixed, name_w);
      ImGui::TableSetupColumn("expected", ImGuiTableColumnFlags_WidthFixed, 90);
      ImGui::TableSetupColumn("device over the run", ImGuiTableColumnFlags_WidthStretch);
      ImGui::TableHeadersRow();
      ImGuiListClipper clip;
      clip.Begin(int(rows.size()));
      double a = double(m.t_first), b = double(std::max(m.t_last, m.t_first + 1));
      while (clip.Step())
        for (int i = clip.DisplayStart; i < clip.DisplayEnd; ++i) {
          const TensorPlacement& p = rows[size_t(i)];
          ImGui::TableNextRow();
          ImGui::TableNextColumn();
          ImGui::Text("%d", p.rank);
          ImGui::TableNextColumn();
          const std::string full = p.name + (p.in_error ? kErrorNote : "");
          std::string text = ellipsize_left(full, ImGui::GetContentRegionAvail().x);
          if (p.mismatch || p.in_error)
            ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(p.in_error ? kErrorColor : kMismatchColor), "%s", text.c_str());
          else
            ImGui::TextUnformatted(text.c_str());
          if (text != full && ImGui::IsItemHovered())  // cut: the whole name (a cut can keep the byte count)
            ImGui::SetTooltip("%s", p.name.c_str());
          ImGui::TableNextColumn();
          ImGui::TextUnformatted(p.expected.c_str());
          ImGui::TableNextColumn();
          ImVec2 c0 = ImGui::GetCursorScreenPos();
          float w = ImGui::GetContentRegionAvail().x, h = ImGui::GetTextLineHeight();
          ImDrawList* dl = ImGui::GetWindowDrawList();
          dl->AddRectFilled(c0, ImVec2(c0.x + w, c0.y + h), IM_COL32(30, 30, 36, 255));
          // In the model's order: by start time, mismatched spans last, so they stay on top;
          // those are at least 3 px wide, however short.
          for (const PlacementSpan& s : p.spans) {
            float x0 = c0.x + float((double(s.t0) - a) / (b - a)) * w;
            float x1 = std::max(x0 + (s.mismatch ? 3.0f : 1.0f), c0.x + float((double(s.t1) - a) / (b - a)) * w);
            ImU32 col = s.mismatch ? kMismatchColor
                                   : device_color(s.device, s.device >= 0 && m.devices[size_t(s.device)].host);
            dl->AddRectFilled(ImVec2(x0, c0.y + 2), ImVec2(x1, c0.y + h - 2), col);
          }
          st.layout.placement_rows.push_back({ti, p.rank, p.name, text, c0.x, c0.x + w, c0.y, c0.y + h, a, b});
          ImGui::Dummy(ImVec2(w, h));
          if (ImGui::IsItemHovered()) {
            double t = a + double(ImGui::GetIO().MousePos.x - c0.x) / w * (b - a);
            ImGui::BeginTooltip();
            ImGui::Text("%s (rank %d) at %s", p.name.c_str(), p.rank, time_label(t - double(m.t_align)).c_str());
            std::string where;
            for (auto& s : p.spans)
              if (double(s.t0) <= t && t < double(s.t1)) where += (where.empty() ? "" : " and ") + device_name(m, s.device);
            ImGui::Text("on %s", where.empty() ? "nothing (freed)" : where.c_str());
            if (p.mismatch) ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kMismatchColor), "siblings live on the %s", p.expected.c_str());
            ImGui::EndTooltip();
          }
        }
      ImGui::EndTable();
    }
    ImGui::PopID();
  }
}

}  // namespace zt::viewer
