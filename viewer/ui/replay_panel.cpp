// viewer/ui/replay_panel.cpp: replay. Owns the play controls (play/pause, speed) and the
// panel showing the state at the playhead: live bytes per device and tensor family, the
// largest live allocations, and the transfers, kernels and phases in flight. The state is
// recomputed only when the playhead moves (analysis.h: state_at).
#include <cmath>
#include <string>

#include "panels.h"
#include "style.h"
#include "zt/common/units.h"

namespace zt::viewer {

void draw_replay_controls(ViewerState& st) {
  if (ImGui::Button(st.playing ? "Pause" : "Play ")) {
    st.playing = !st.playing;
    if (st.playing && st.playhead >= st.span_t1()) st.playhead = st.span_t0();
  }
  ImGui::SameLine();
  static const double speeds[] = {0.01, 0.1, 1.0, 10.0, 100.0};
  static const char* names[] = {"0.01x", "0.1x", "1x", "10x", "100x"};
  int current = 2;
  for (int i = 0; i < 5; ++i)
    if (std::abs(st.speed - speeds[i]) < 1e-9) current = i;
  ImGui::SetNextItemWidth(70);
  if (ImGui::Combo("##speed", &current, names, 5)) st.speed = speeds[current];
  ImGui::SameLine();
  ImGui::Text("playhead %s", time_label(st.playhead).c_str());
}

namespace {

// The state of one trace at the playhead (its own alignment applied).
void draw_trace_state(ViewerState& st, int ti) {
  LoadedTrace& lt = st.traces[size_t(ti)];
  const TraceModel& m = *lt.model;
  int64_t t = lt.to_trace(st.playhead);
  if (st.playhead_states.size() != st.traces.size()) st.playhead_states.resize(st.traces.size());
  std::optional<PlayheadState>& cached = st.playhead_states[size_t(ti)];
  if (!cached || cached->t != t) cached = state_at(m, t, 10);
  const PlayheadState& ps = *cached;
  st.layout.replay_traces.push_back(ti);
  ImGui::Text("State of %s at %s", lt.label.c_str(), time_label(st.playhead).c_str());
  if (ImGui::BeginTable("##live", 2 + kFamilyCount, ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_RowBg)) {
    ImGui::TableSetupColumn("device");
    ImGui::TableSetupColumn("live");
    for (int f = 0; f < kFamilyCount; ++f) ImGui::TableSetupColumn(std::string(to_string(Family(f))).c_str());
    ImGui::TableHeadersRow();
    for (size_t d = 0; d < m.devices.size(); ++d) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::Text("rank %d %s", m.devices[d].rank, m.devices[d].label.c_str());
      ImGui::TableNextColumn();
      ImGui::Text("%s", format_bytes(double(ps.live_total[d])).c_str());
      for (int f = 0; f < kFamilyCount; ++f) {
        ImGui::TableNextColumn();
        if (ps.live[d][size_t(f)]) {
          color_swatch(family_color(Family(f)));
          ImGui::Text("%s", format_bytes(double(ps.live[d][size_t(f)])).c_str());
        }
      }
    }
    ImGui::EndTable();
  }
  if (ImGui::BeginTable("##cols", 2, ImGuiTableFlags_BordersInnerV)) {
    ImGui::TableNextColumn();
    ImGui::TextDisabled("largest live allocations");
    for (uint32_t r : ps.largest) {
      ImGui::PushID(int(r));
      const std::string text = allocation_line(m, r);
      color_swatch(family_color(Family(m.alloc.family[r])));
      if (ImGui::Selectable(text.c_str())) st.select(ti, ItemKind::Allocation, r);
      ImGui::PopID();
    }
    ImGui::TableNextColumn();
    ImGui::TextDisabled("in flight");
    for (uint32_t r : ps.open_markers)
      ImGui::Text("rank %d %s: %s", m.mark.rank[r], std::string(db::to_string(db::MarkerKind(m.mark.kind[r]))).c_str(),
                  m.str(m.mark.name[r]).c_str());
    for (uint32_t r : ps.transfers_in_flight) {
      color_swatch(direction_color(direction_of(db::TransferKind(m.xfer.kind[r]))));
      ImGui::Text("rank %d %s %s %s", m.xfer.rank[r], to_string(direction_of(db::TransferKind(m.xfer.kind[r]))),
                  m.str(m.xfer.name[r]).c_str(), format_bytes(double(m.xfer.bytes[r])).c_str());
    }
    for (uint32_t r : ps.kernels_running) ImGui::Text("kernel %s", m.str(m.kern.name[r]).c_str());
    if (ps.open_markers.empty() && ps.transfers_in_flight.empty() && ps.kernels_running.empty())
      ImGui::TextDisabled("nothing");
    ImGui::EndTable();
  }
}

}  // namespace

void draw_replay_panel(ViewerState& st) {
  const int n = int(st.traces.size());
  if (st.playhead_trace >= n) st.playhead_trace = -1;
  if (n > 1) {
    // Which trace: both side by side (the default), or one with the whole width.
    ImGui::TextDisabled("show");
    ImGui::SameLine();
    ImGui::RadioButton("both", &st.playhead_trace, -1);
    for (int ti = 0; ti < n; ++ti) {
      ImGui::SameLine();
      std::string name(1, char('A' + ti % 26));
      ImGui::RadioButton(name.c_str(), &st.playhead_trace, ti);
    }
  }
  if (n > 1 && st.playhead_trace < 0) {
    if (ImGui::BeginTable("##traces", n, ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingStretchSame)) {
      for (int ti = 0; ti < n; ++ti) {
        ImGui::TableNextColumn();
        ImGui::PushID(ti);
        draw_trace_state(st, ti);
        ImGui::PopID();
      }
      ImGui::EndTable();
    }
  } else {
    draw_trace_state(st, std::max(st.playhead_trace, 0));
  }
}

}  // namespace zt::viewer
