// viewer/ui/leaks_panel.cpp: the leaks view. Owns the table of leak groups (analysis.h:
// find_leaks): what is alive at the end of the trace or grows across epochs, grouped by
// tensor name and stack, with the bytes held at each epoch end. Clicking a group selects one
// of its allocations and shows where it was made.
#include "panels.h"
#include "style.h"
#include "zt/common/units.h"

namespace zt::viewer {

void draw_leaks_panel(ViewerState& st) {
  for (int ti = 0; ti < int(st.traces.size()); ++ti) {
    LoadedTrace& lt = st.traces[size_t(ti)];
    if (!lt.leaks) lt.leaks = find_leaks(*lt.model);
    const auto& leaks = *lt.leaks;
    if (st.traces.size() > 1) ImGui::TextDisabled("%s", lt.label.c_str());
    if (leaks.empty()) {
      ImGui::Text("No leaks: everything allocated was freed, and nothing grows across epochs.");
      continue;
    }
    ImGui::PushID(ti);
    if (ImGui::BeginTable("##leaks", 6, ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY |
                                            ImGuiTableFlags_Resizable | ImGuiTableFlags_SizingStretchProp,
                          ImVec2(0, st.traces.size() > 1 ? ImGui::GetContentRegionAvail().y / 2 : 0))) {
      ImGui::TableSetupScrollFreeze(0, 1);
      // The tensor's name gets the room (names such as fp32_partitioned_groups_flat[48] were cut).
      ImGui::TableSetupColumn("tensor (grouped)", ImGuiTableColumnFlags_WidthStretch, 2.6f);
      ImGui::TableSetupColumn("verdict", ImGuiTableColumnFlags_WidthStretch, 1.0f);
      ImGui::TableSetupColumn("alive at end", ImGuiTableColumnFlags_WidthStretch, 1.0f);
      ImGui::TableSetupColumn("bytes at each epoch end", ImGuiTableColumnFlags_WidthStretch, 1.6f);
      ImGui::TableSetupColumn("devices", ImGuiTableColumnFlags_WidthStretch, 1.8f);
      ImGui::TableSetupColumn("site", ImGuiTableColumnFlags_WidthStretch, 1.6f);
      ImGui::TableHeadersRow();
      for (size_t i = 0; i < leaks.size(); ++i) {
        const LeakGroup& g = leaks[i];
        ImGui::TableNextRow();
        ImGui::TableNextColumn();
        ImGui::PushID(int(i));
        color_swatch(family_color(Family(lt.model->alloc.family[g.example])));
        if (ImGui::Selectable(g.name.c_str(), false, ImGuiSelectableFlags_SpanAllColumns)) {
          st.select(ti, ItemKind::Allocation, g.example);
          const Allocations& a = lt.model->alloc;
          st.focus(double(lt.to_view(a.t_alloc[g.example])) - 1e6, double(lt.to_view(a.t_free[g.example])));
        }
        ImGui::PopID();
        ImGui::TableNextColumn();
        if (g.grows) ImGui::TextColored(ImVec4(1, 0.45f, 0.35f, 1), "grows per epoch");
        else ImGui::Text("alive at end");
        ImGui::TableNextColumn();
        // "~": sampled rows (the probe's byte sampler) make the bytes an estimate.
        ImGui::Text("%lld x, %s%s", static_cast<long long>(g.alive_count), g.sampled ? "~" : "",
                    format_bytes(double(g.alive_bytes)).c_str());
        ImGui::TableNextColumn();
        std::string per;
        for (size_t e = 0; e < g.bytes_at_epoch_end.size(); ++e)
          per += (e ? "  " : "") + format_bytes(double(g.bytes_at_epoch_end[e]));
        ImGui::TextUnformatted(per.empty() ? "-" : per.c_str());
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(g.devices.c_str());
        ImGui::TableNextColumn();
        // Where it was allocated: the Python line, else the first native frame that is not the allocator's.
        if (!g.site.empty()) ImGui::TextUnformatted(g.site.c_str());
        else ImGui::TextDisabled("no stack recorded");
      }
      ImGui::EndTable();
    }
    ImGui::PopID();
  }
}

}  // namespace zt::viewer
