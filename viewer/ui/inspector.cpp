// viewer/ui/inspector.cpp: the details panel. Owns how one item is described (tooltip and
// panel share the text), the call stack of a selected allocation (fetched from the file the
// first time it is shown, never per frame), and the summary of a right-dragged range: bytes
// moved per direction, peak memory, allocations made and not freed in the range.
#include <algorithm>

#include "panels.h"
#include "style.h"
#include "zt/common/units.h"

namespace zt::viewer {
namespace {

std::string device_label(const TraceModel& m, int d) { return d >= 0 ? m.devices[size_t(d)].label : "-"; }

void describe(const LoadedTrace& lt, ItemKind kind, uint32_t r) {
  const TraceModel& m = *lt.model;
  auto t = [&](int64_t v) { return time_label(double(lt.to_view(v))); };
  switch (kind) {
    case ItemKind::Allocation: {
      const Allocations& a = m.alloc;
      Family f = Family(a.family[r]);
      color_swatch(family_color(f));
      ImGui::Text("%s", m.str(a.name[r]).empty() ? "(unnamed allocation)" : m.str(a.name[r]).c_str());
      ImGui::Text("%s, %s", format_bytes(double(a.bytes[r])).c_str(), std::string(to_string(f)).c_str());
      ImGui::Text("device %s, %s %s", device_label(m, a.device[r]).c_str(),
                  std::string(db::to_string(db::MemoryKind(a.kind[r]))).c_str(),
                  std::string(db::to_string(db::AllocLevel(a.level[r]))).c_str());
      ImGui::Text("allocated %s", t(a.t_alloc[r]).c_str());
      if (a.freed[r])
        ImGui::Text("freed     %s (lived %s)", t(a.t_free[r]).c_str(),
                    format_duration_ns(double(a.t_free[r] - a.t_alloc[r])).c_str());
      else
        ImGui::TextColored(ImVec4(1, 0.5f, 0.4f, 1), "never freed: alive at the end of the trace");
      ImGui::TextDisabled("allocation id %lld", static_cast<long long>(a.id[r]));
      break;
    }
    case ItemKind::Transfer: {
      const Transfers& x = m.xfer;
      auto kind_text = std::string(db::to_string(db::TransferKind(x.kind[r])));
      if (x.op[r]) kind_text += " " + m.str(x.op[r]);
      ImGui::Text("%s  %s", kind_text.c_str(), m.str(x.name[r]).c_str());
      double dur = double(x.t_end[r] - x.t_start[r]);
      ImGui::Text("%s, %s -> %s", format_bytes(double(x.bytes[r])).c_str(), device_label(m, x.src[r]).c_str(),
                  device_label(m, x.dst[r]).c_str());
      ImGui::Text("start %s, took %s (%s/s)", t(x.t_start[r]).c_str(), format_duration_ns(dur).c_str(),
                  dur > 0 ? format_bytes(double(x.bytes[r]) / (dur / 1e9)).c_str() : "-");
      ImGui::Text("rank %d", x.rank[r]);
      break;
    }
    case ItemKind::Kernel:
      ImGui::Text("kernel %s", m.str(m.kern.name[r]).c_str());
      ImGui::Text("device %s, start %s, took %s", device_label(m, m.kern.device[r]).c_str(), t(m.kern.t_start[r]).c_str(),
                  format_duration_ns(double(m.kern.t_end[r] - m.kern.t_start[r])).c_str());
      break;
    case ItemKind::Marker: {
      const Markers& k = m.mark;
      ImGui::Text("%s: %s", std::string(db::to_string(db::MarkerKind(k.kind[r]))).c_str(), m.str(k.name[r]).c_str());
      ImGui::Text("rank %d%s%s", k.rank[r], k.step[r] >= 0 ? (", step " + std::to_string(k.step[r])).c_str() : "",
                  k.epoch[r] >= 0 ? (", epoch " + std::to_string(k.epoch[r])).c_str() : "");
      ImGui::Text("start %s, took %s", t(k.t_start[r]).c_str(), format_duration_ns(double(k.t_end[r] - k.t_start[r])).c_str());
      break;
    }
    case ItemKind::Flag: {
      const Flag& f = m.flags[r];
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(f.is_error ? kErrorColor : kFaultColor), "%s: %s",
                         f.is_error ? "error" : "fault", f.title.c_str());
      ImGui::TextWrapped("%s", f.detail.c_str());
      ImGui::Text("rank %d%s at %s", f.rank, f.step >= 0 ? (", step " + std::to_string(f.step)).c_str() : "",
                  t(f.t).c_str());
      if (!f.tensors.empty() && f.tensors != "[]") ImGui::Text("tensors %s", f.tensors.c_str());
      if (f.device >= 0) ImGui::Text("device %s", device_label(m, f.device).c_str());
      break;
    }
    case ItemKind::None: break;
  }
}

}  // namespace

void item_tooltip(const LoadedTrace& lt, ItemKind kind, uint32_t row) {
  ImGui::PushTextWrapPos(ImGui::GetFontSize() * 40);
  describe(lt, kind, row);
  ImGui::PopTextWrapPos();
}

void ViewerState::select(int trace, ItemKind kind, uint32_t row) {
  selection = Selection{};
  selection.trace = trace;
  selection.kind = kind;
  selection.row = row;
}

void draw_inspector(ViewerState& st) {
  Selection& sel = st.selection;
  if (ImGui::BeginTable("##inspector", 2, ImGuiTableFlags_Resizable | ImGuiTableFlags_BordersInnerV)) {
    ImGui::TableNextColumn();
    ImGui::TextDisabled("Selection (click an item)");
    if (sel.kind != ItemKind::None && sel.trace >= 0 && size_t(sel.trace) < st.traces.size()) {
      LoadedTrace& lt = st.traces[size_t(sel.trace)];
      describe(lt, sel.kind, sel.row);
      if (sel.kind == ItemKind::Allocation) {
        // The stack: one recursive query the first time this allocation is shown.
        if (!sel.stack_loaded) {
          Status s = lt.model->stack_text(lt.model->alloc.stack[sel.row], &sel.stack);
          sel.stack_error = s ? "" : s.message();
          sel.stack_loaded = true;
        }
        ImGui::Separator();
        ImGui::TextDisabled("call stack (innermost first)");
        if (!sel.stack_error.empty()) ImGui::TextColored(ImVec4(1, 0.4f, 0.4f, 1), "%s", sel.stack_error.c_str());
        else if (sel.stack.empty()) ImGui::TextDisabled("no stack recorded for this allocation");
        for (size_t i = 0; i < sel.stack.size(); ++i) ImGui::Text("#%-2zu %s", i, sel.stack[i].c_str());
      }
    }
    ImGui::TableNextColumn();
    ImGui::TextDisabled("Range (right-drag on the tracks)");
    if (st.has_range) {
      LoadedTrace& lt = st.traces[size_t(std::min<int>(st.range_trace, int(st.traces.size()) - 1))];
      if (!st.range_summary) st.range_summary = summarize_range(*lt.model, lt.to_trace(st.range_t0), lt.to_trace(st.range_t1), 8);
      const RangeSummary& r = *st.range_summary;
      ImGui::Text("%s .. %s (%s)", time_label(st.range_t0).c_str(), time_label(st.range_t1).c_str(),
                  format_duration_ns(st.range_t1 - st.range_t0).c_str());
      ImGui::SameLine();
      if (ImGui::SmallButton("zoom to range")) st.focus(st.range_t0, st.range_t1);
      ImGui::SameLine();
      if (ImGui::SmallButton("clear")) st.has_range = false, st.range_summary.reset();
      for (int d = 0; d < kDirectionCount; ++d) {
        color_swatch(direction_color(Direction(d)));
        ImGui::Text("%-12s %s in %lld transfers", to_string(Direction(d)), format_bytes(double(r.bytes[size_t(d)])).c_str(),
                    static_cast<long long>(r.count[size_t(d)]));
      }
      for (auto& p : r.peaks)
        ImGui::Text("peak %-9s on %s: %s", p.series.c_str(), p.device >= 0 ? lt.model->devices[size_t(p.device)].label.c_str() : "-",
                    format_bytes(p.peak).c_str());
      ImGui::Text("%lld allocations made, %lld not freed by the range's end (%s)", static_cast<long long>(r.allocations),
                  static_cast<long long>(r.kept), format_bytes(double(r.kept_bytes)).c_str());
      for (uint32_t row : r.kept_largest) {
        ImGui::PushID(int(row));
        const std::string text = allocation_line(*lt.model, row);
        if (ImGui::Selectable(text.c_str()))
          st.select(st.range_trace, ItemKind::Allocation, row);
        ImGui::PopID();
      }
    }
    ImGui::EndTable();
  }
}

}  // namespace zt::viewer
