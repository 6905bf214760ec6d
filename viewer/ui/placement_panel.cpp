// viewer/ui/placement_panel.cpp: the placement view. Owns the table of tensors with a bar
// per tensor showing on which device it lived over the whole run (colour per device, grey
// for host). Spans on a device class its siblings never use are drawn in the mismatch colour
// and listed first, as are tensors named in an error. Computed once (analysis.h).
#include <algorithm>

#include "panels.h"
#include "style.h"
#include "zt/common/units.h"

namespace zt::viewer {

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
    ImGui::SameLine();
    ImGui::TextDisabled("  legend:");
    for (size_t d = 0; d < m.devices.size(); ++d) {
      if (m.devices[d].rank != 0 && !m.devices[d].host) continue;
      ImGui::SameLine();
      color_swatch(device_color(int(d), m.devices[d].host));
      ImGui::Text("%s", m.devices[d].host ? "host" : m.devices[d].label.c_str());
    }
    ImGui::PushID(ti);
    float height = st.traces.size() > 1 ? ImGui::GetContentRegionAvail().y / 2 : 0;
    if (ImGui::BeginTable("##placement", 4, ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY |
                                                ImGuiTableFlags_Resizable,
                          ImVec2(0, height))) {
      ImGui::TableSetupScrollFreeze(0, 1);
      ImGui::TableSetupColumn("rank", ImGuiTableColumnFlags_WidthFixed, 40);
      ImGui::TableSetupColumn("tensor", ImGuiTableColumnFlags_WidthFixed, 220);
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
          if (p.mismatch || p.in_error)
            ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(p.in_error ? kErrorColor : kMismatchColor), "%s%s",
                               p.name.c_str(), p.in_error ? "  (in an error)" : "");
          else
            ImGui::TextUnformatted(p.name.c_str());
          ImGui::TableNextColumn();
          ImGui::TextUnformatted(p.expected.c_str());
          ImGui::TableNextColumn();
          ImVec2 c0 = ImGui::GetCursorScreenPos();
          float w = ImGui::GetContentRegionAvail().x, h = ImGui::GetTextLineHeight();
          ImDrawList* dl = ImGui::GetWindowDrawList();
          dl->AddRectFilled(c0, ImVec2(c0.x + w, c0.y + h), IM_COL32(30, 30, 36, 255));
          for (const PlacementSpan& s : p.spans) {
            float x0 = c0.x + float((double(s.t0) - a) / (b - a)) * w;
            float x1 = std::max(x0 + 1, c0.x + float((double(s.t1) - a) / (b - a)) * w);
            ImU32 col = s.mismatch ? kMismatchColor
                                   : device_color(s.device, s.device >= 0 && m.devices[size_t(s.device)].host);
            dl->AddRectFilled(ImVec2(x0, c0.y + 2), ImVec2(x1, c0.y + h - 2), col);
          }
          ImGui::Dummy(ImVec2(w, h));
          if (ImGui::IsItemHovered()) {
            double t = a + double(ImGui::GetIO().MousePos.x - c0.x) / w * (b - a);
            ImGui::BeginTooltip();
            ImGui::Text("%s (rank %d) at %s", p.name.c_str(), p.rank, time_label(t - double(m.t_align)).c_str());
            const char* where = "nowhere (freed)";
            for (auto& s : p.spans)
              if (double(s.t0) <= t && t < double(s.t1)) where = s.device >= 0 ? m.devices[size_t(s.device)].label.c_str() : "?";
            ImGui::Text("on %s", where);
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
