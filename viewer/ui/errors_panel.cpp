// viewer/ui/errors_panel.cpp: the faults and errors list. Owns the table of every fault
// (injected) and error (recorded) by time; clicking a row selects it and moves the view and
// the playhead to it.
#include "panels.h"
#include "style.h"
#include "zt/common/units.h"

namespace zt::viewer {

void draw_errors_panel(ViewerState& st) {
  size_t total = 0;
  // How a run ended comes first: a killed run or a crash is the news, with or without error rows.
  for (auto& lt : st.traces)
    for (const std::string& p : lt.model->run_problems) {
      ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(kErrorColor));
      ImGui::TextWrapped("%s%s", st.traces.size() > 1 ? (lt.label.substr(0, 1) + ": ").c_str() : "", p.c_str());
      ImGui::PopStyleColor();
    }
  for (auto& lt : st.traces) total += lt.model->flags.size();
  if (total == 0) {
    ImGui::Text("No faults or errors recorded.");
    return;
  }
  if (!ImGui::BeginTable("##errors", 6, ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY |
                                            ImGuiTableFlags_Resizable | ImGuiTableFlags_SizingStretchProp))
    return;
  // Long texts wrap in their columns (they were cut at a fixed width, the panel's lower part empty).
  ImGui::TableSetupScrollFreeze(0, 1);
  ImGui::TableSetupColumn("time", ImGuiTableColumnFlags_WidthFixed, ImGui::CalcTextSize("+00.000 ms").x);
  ImGui::TableSetupColumn("trace", ImGuiTableColumnFlags_WidthFixed, ImGui::CalcTextSize("trace").x);
  ImGui::TableSetupColumn("rank / step", ImGuiTableColumnFlags_WidthFixed, ImGui::CalcTextSize("rank / step").x);
  ImGui::TableSetupColumn("what", ImGuiTableColumnFlags_WidthStretch, 1.2f);
  ImGui::TableSetupColumn("message", ImGuiTableColumnFlags_WidthStretch, 2.5f);
  ImGui::TableSetupColumn("tensors", ImGuiTableColumnFlags_WidthStretch, 1.3f);
  ImGui::TableHeadersRow();
  for (int ti = 0; ti < int(st.traces.size()); ++ti) {
    LoadedTrace& lt = st.traces[size_t(ti)];
    const TraceModel& m = *lt.model;
    for (size_t i = 0; i < m.flags.size(); ++i) {
      const Flag& f = m.flags[i];
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::PushID(ti * 1000000 + int(i));
      bool selected = st.selection.trace == ti && st.selection.kind == ItemKind::Flag && st.selection.row == i;
      if (ImGui::Selectable(time_label(double(lt.to_view(f.t))).c_str(), selected, ImGuiSelectableFlags_SpanAllColumns)) {
        st.select(ti, ItemKind::Flag, uint32_t(i));
        double span = std::max(double(m.t_last - m.t_first) / 50, 1e4);
        double t = double(lt.to_view(f.t));
        st.focus(t - span, t + span);
        st.playhead = t;
      }
      ImGui::PopID();
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(lt.label.substr(0, 1).c_str());
      ImGui::TableNextColumn();
      if (f.step >= 0) ImGui::Text("%d / %lld", f.rank, static_cast<long long>(f.step));
      else ImGui::Text("%d", f.rank);
      ImGui::TableNextColumn();
      ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(f.is_error ? kErrorColor : kFaultColor));
      ImGui::TextWrapped("%s %s", f.is_error ? "error" : "fault", f.title.c_str());
      ImGui::PopStyleColor();
      ImGui::TableNextColumn();
      ImGui::TextWrapped("%s", f.detail.c_str());
      ImGui::TableNextColumn();
      ImGui::TextWrapped("%s", f.tensors.c_str());
    }
  }
  ImGui::EndTable();
}

}  // namespace zt::viewer
