// viewer/ui/errors_panel.cpp: the faults and errors list. Owns the table of every fault
// (injected) and error (recorded) by time; clicking a row selects it and moves the view and
// the playhead to it.
#include "panels.h"
#include "style.h"
#include "zt/common/units.h"

namespace zt::viewer {

void draw_errors_panel(ViewerState& st) {
  size_t total = 0;
  for (auto& lt : st.traces) total += lt.model->flags.size();
  if (total == 0) {
    ImGui::Text("No faults or errors recorded.");
    return;
  }
  if (!ImGui::BeginTable("##errors", 6, ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY |
                                            ImGuiTableFlags_Resizable))
    return;
  ImGui::TableSetupScrollFreeze(0, 1);
  ImGui::TableSetupColumn("time");
  ImGui::TableSetupColumn("trace");
  ImGui::TableSetupColumn("rank / step");
  ImGui::TableSetupColumn("what");
  ImGui::TableSetupColumn("message");
  ImGui::TableSetupColumn("tensors");
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
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(f.is_error ? kErrorColor : kFaultColor), "%s %s",
                         f.is_error ? "error" : "fault", f.title.c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(f.detail.c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(f.tensors.c_str());
    }
  }
  ImGui::EndTable();
}

}  // namespace zt::viewer
