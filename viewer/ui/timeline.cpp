// viewer/ui/timeline.cpp: the timeline panel. Owns drawing of the time ruler and of every
// non-memory track (markers, allocations, transfers, kernels, flags), the navigation input
// (wheel zoom at the cursor, drag pan, ruler drag to zoom, right-drag range select, WASD and
// arrows), track collapse and reorder, the split of the height between two traces (each
// scrolling its own tracks under the shared ruler), and the frame layout the screenshot mode
// records.
// Per frame each lane costs a binary search plus one draw item per ~3 px (lod.h).
#include <GLFW/glfw3.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "panels.h"
#include "style.h"
#include "zt/common/units.h"

namespace zt::viewer {
namespace {

constexpr float kLabelWidth = 210.0f;
constexpr float kHeaderHeight = 18.0f;
constexpr float kRulerHeight = 26.0f;
constexpr double kMinItemPx = 3.0;
// A span's name is written in it when the lane is at least this tall (the font is 13 px) and
// the span at least 40 px wide. Allocation lanes are thinner on purpose (hundreds of rows).
constexpr float kLabelLanePx = 12.0f;

float lane_height(TrackKind k) {
  switch (k) {
    case TrackKind::Markers: return 15;
    case TrackKind::Allocations: return 7;
    case TrackKind::Transfers: return 13;
    case TrackKind::Kernels: return 14;  // tall enough for the kernel's name
    default: return 12;
  }
}

ImU32 darker(ImU32 c, float f) {
  ImVec4 v = ImGui::ColorConvertU32ToFloat4(c);
  return ImGui::ColorConvertFloat4ToU32(ImVec4(v.x * f, v.y * f, v.z * f, v.w));
}

// An allocation track's legend, in its label column: the families its rows belong to, in their
// colours, and the allocator's segments (drawn dimmer). One column when the lanes are tall enough,
// else two, and the track is made as tall as the legend.
constexpr float kLegendRowPx = 14.0f;
std::vector<std::pair<ImU32, std::string>> legend_entries(const Track& t) {
  std::vector<std::pair<ImU32, std::string>> e;
  for (int f = 0; f < kFamilyCount; ++f)
    if (t.families & (1u << f)) e.push_back({family_color(Family(f)), std::string(to_string(Family(f)))});
  if (t.segments) e.push_back({darker(family_color(Family::Buffers), 0.55f), "dimmer: allocator segment"});
  return e;
}
int legend_columns(const Track& t, size_t entries) {
  return float(entries) * kLegendRowPx <= float(t.lanes.size()) * lane_height(t.kind) ? 1 : 2;
}

float content_height(const Track& t) {
  switch (t.kind) {
    case TrackKind::Memory:
    case TrackKind::HostMemory: return memory_track_height(t);
    case TrackKind::Flags: return 22;
    case TrackKind::Allocations: {
      const size_t n = legend_entries(t).size();
      const float legend = float((n + size_t(legend_columns(t, n)) - 1) / size_t(legend_columns(t, n))) * kLegendRowPx;
      return std::max({float(t.lanes.size()) * lane_height(t.kind), legend, 8.0f});
    }
    default: return std::max(float(t.lanes.size()) * lane_height(t.kind), 8.0f);
  }
}

// Draws the legend in the label column [x0, x1] x [y0, y1]; returns its entries' texts.
std::vector<std::string> draw_allocation_legend(const Track& t, ImDrawList* dl, float x0, float x1, float y0, float y1) {
  const auto entries = legend_entries(t);
  const size_t cols = size_t(legend_columns(t, entries.size()));
  const size_t rows = (entries.size() + cols - 1) / cols;
  const float col_w = (x1 - x0) / float(cols);
  std::vector<std::string> texts;
  dl->PushClipRect(ImVec2(x0, y0), ImVec2(x1, y1), true);
  for (size_t k = 0; k < entries.size(); ++k) {
    const float x = x0 + float(k / rows) * col_w, y = y0 + float(k % rows) * kLegendRowPx;
    dl->AddRectFilled(ImVec2(x, y + 4), ImVec2(x + 8, y + 12), entries[k].first);
    dl->AddText(ImVec2(x + 12, y), IM_COL32(170, 170, 180, 255), entries[k].second.c_str());
    texts.push_back(entries[k].second);
  }
  dl->PopClipRect();
  return texts;
}

const char* kind_name(TrackKind k) {
  switch (k) {
    case TrackKind::Markers: return "markers";
    case TrackKind::Memory: return "memory";
    case TrackKind::HostMemory: return "host_memory";
    case TrackKind::Allocations: return "allocations";
    case TrackKind::Transfers: return "transfers";
    case TrackKind::Kernels: return "kernels";
    case TrackKind::Flags: return "flags";
  }
  return "?";
}

struct Hover {
  int trace = -1;
  ItemKind kind = ItemKind::None;
  uint32_t row = 0;
  bool fold = false;
  uint32_t fold_count = 0;
  int64_t fold_t0 = 0, fold_t1 = 0;  // trace time
};

// Everything a track drawer needs: where to draw and how trace time maps to pixels.
struct Ctx {
  ViewerState& st;
  const LoadedTrace& lt;
  int trace;
  ImDrawList* dl;
  float x0, x1;
  double ns_per_px;
  int64_t t0, t1;  // visible trace times
  ImVec2 mouse;
  bool mouse_in;  // over the time area of this window
  Hover* hover;
  std::vector<DrawItem>* scratch;

  float x_of(int64_t t) const {
    return float(double(x0) + (double(t - lt.model->t_align) - st.view.t0) / ns_per_px);
  }
};

bool hit(const Ctx& c, float ax, float ay, float bx, float by) {
  return c.mouse_in && c.mouse.x >= ax && c.mouse.x < bx && c.mouse.y >= ay && c.mouse.y < by;
}

void label_in(ImDrawList* dl, float ax, float ay, float bx, float by, const char* text, ImU32 col) {
  if (bx - ax < 24) return;
  ImVec4 clip(ax + 2, ay, bx - 1, by);
  dl->AddText(nullptr, 0, ImVec2(ax + 3, ay + (by - ay - ImGui::GetFontSize()) * 0.5f), col, text, nullptr, 0,
              &clip);
}

// Draws one lane: single spans coloured by `color(row)`, folds grey with "N" in them.
template <typename ColorFn, typename LabelFn>
void draw_lane(Ctx& c, const IntervalLane& lane, float y0, float y1, ItemKind kind, ColorFn color, LabelFn label) {
  c.scratch->clear();
  fold_visible(lane, c.t0, c.t1, c.ns_per_px, kMinItemPx, c.scratch);
  const Selection& sel = c.st.selection;
  for (const DrawItem& it : *c.scratch) {
    float ax = std::max(c.x_of(it.t0), c.x0 - 2), bx = std::min(c.x_of(it.t1), c.x1 + 2);
    if (bx - ax < 1) bx = ax + 1;
    if (it.count == 1) {
      uint32_t row = lane.item[it.first];
      ImU32 col = color(row);
      c.dl->AddRectFilled(ImVec2(ax, y0), ImVec2(bx, y1 - 1), col);
      if (bx - ax > 40 && y1 - y0 >= kLabelLanePx) {
        std::string text = label(row);
        label_in(c.dl, ax, y0, bx, y1, text.c_str(), IM_COL32(15, 15, 20, 255));
      }
      if (sel.trace == c.trace && sel.kind == kind && sel.row == row)
        c.dl->AddRect(ImVec2(ax - 1, y0 - 1), ImVec2(bx + 1, y1), IM_COL32(255, 255, 255, 255), 0, 0, 2);
      if (hit(c, ax, y0, bx, y1)) *c.hover = {c.trace, kind, row, false, 0, 0, 0};
    } else {
      c.dl->AddRectFilled(ImVec2(ax, y0), ImVec2(bx, y1 - 1), kFoldColor);
      if (bx - ax > 30 && y1 - y0 >= kLabelLanePx) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%u", it.count);
        label_in(c.dl, ax, y0, bx, y1, buf, IM_COL32(235, 235, 235, 255));
      }
      if (hit(c, ax, y0, bx, y1)) *c.hover = {c.trace, kind, 0, true, it.count, it.t0, it.t1};
    }
  }
}

void draw_markers(Ctx& c, const Track& t, float y) {
  const TraceModel& m = *c.lt.model;
  float h = lane_height(t.kind);
  for (size_t l = 0; l < t.lanes.size(); ++l) {
    float y0 = y + float(l) * h;
    draw_lane(
        c, t.lanes[l], y0, y0 + h, ItemKind::Marker,
        [&](uint32_t r) { return marker_color(db::MarkerKind(m.mark.kind[r]), hash_str(m.str(m.mark.name[r]))); },
        [&](uint32_t r) { return m.str(m.mark.name[r]); });
  }
}

void draw_allocations(Ctx& c, const Track& t, float y) {
  const TraceModel& m = *c.lt.model;
  float h = lane_height(t.kind);
  for (size_t l = 0; l < t.lanes.size(); ++l) {
    float y0 = y + float(l) * h;
    draw_lane(
        c, t.lanes[l], y0, y0 + h, ItemKind::Allocation,
        [&](uint32_t r) {
          ImU32 col = family_color(Family(m.alloc.family[r]));
          // Segments are the allocator's cache around blocks: drawn dimmer so blocks stand out.
          return m.alloc.level[r] == uint8_t(db::AllocLevel::Segment) ? darker(col, 0.55f) : col;
        },
        [&](uint32_t r) { return m.str(m.alloc.name[r]); });
  }
}

void draw_transfers(Ctx& c, const Track& t, float y) {
  const TraceModel& m = *c.lt.model;
  float h = lane_height(t.kind);
  for (size_t l = 0; l < t.lanes.size(); ++l) {
    float y0 = y + float(l) * h;
    draw_lane(
        c, t.lanes[l], y0, y0 + h, ItemKind::Transfer, [&](uint32_t) { return direction_color(Direction(l)); },
        [&](uint32_t r) { return m.str(m.xfer.name[r]) + " " + format_bytes(double(m.xfer.bytes[r])); });
  }
}

void draw_kernels(Ctx& c, const Track& t, float y) {
  const TraceModel& m = *c.lt.model;
  float h = lane_height(t.kind);
  for (size_t l = 0; l < t.lanes.size(); ++l) {
    float y0 = y + float(l) * h;
    draw_lane(
        c, t.lanes[l], y0, y0 + h, ItemKind::Kernel,
        [&](uint32_t r) { return marker_color(db::MarkerKind::Phase, hash_str(m.str(m.kern.name[r]))); },
        [&](uint32_t r) { return m.str(m.kern.name[r]); });
  }
}

void draw_flags(Ctx& c, const Track& t, float y, float h) {
  const TraceModel& m = *c.lt.model;
  auto first = std::lower_bound(m.flags.begin(), m.flags.end(), c.t0 - int64_t(8 * c.ns_per_px),
                                [](const Flag& f, int64_t v) { return f.t < v; });
  int shown = 0;
  for (auto it = first; it != m.flags.end() && it->t <= c.t1 + int64_t(8 * c.ns_per_px); ++it) {
    if (it->rank != t.rank) continue;
    ++shown;
    float x = std::round(c.x_of(it->t));
    ImU32 col = it->is_error ? kErrorColor : kFaultColor;
    // A pole and a pennant: solid colour so a screenshot test can find the flag at its time.
    c.dl->AddRectFilled(ImVec2(x - 1, y + 2), ImVec2(x + 1, y + h - 1), col);
    c.dl->AddTriangleFilled(ImVec2(x + 1, y + 2), ImVec2(x + 11, y + 6), ImVec2(x + 1, y + 10), col);
    uint32_t index = uint32_t(it - m.flags.begin());
    if (hit(c, x - 3, y, x + 12, y + h)) *c.hover = {c.trace, ItemKind::Flag, index, false, 0, 0, 0};
    const Selection& sel = c.st.selection;
    if (sel.trace == c.trace && sel.kind == ItemKind::Flag && sel.row == index)
      c.dl->AddRect(ImVec2(x - 3, y), ImVec2(x + 13, y + h), IM_COL32(255, 255, 255, 255));
  }
  if (shown == 0 && m.flags.empty())
    c.dl->AddText(ImVec2(c.x0 + 4, y + 3), IM_COL32(110, 110, 120, 255), "no faults or errors recorded");
}

// Ruler ticks at a 1-2-5 step that leaves ~100 px between labels.
void draw_ruler(ViewerState& st, ImDrawList* dl, float x0, float x1, float y0) {
  dl->AddRectFilled(ImVec2(x0, y0), ImVec2(x1, y0 + kRulerHeight), IM_COL32(30, 30, 38, 255));
  double target = st.view.ns_per_px * 100;
  double step = std::pow(10.0, std::floor(std::log10(std::max(target, 1.0))));
  if (step * 2 >= target) step *= 2;
  else if (step * 5 >= target) step *= 5;
  else step *= 10;
  double first = std::floor(st.view.t0 / step) * step;
  for (double t = first; t <= st.view.t1(); t += step) {
    float x = x0 + float((t - st.view.t0) / st.view.ns_per_px);
    if (x < x0) continue;
    dl->AddLine(ImVec2(x, y0 + kRulerHeight - 8), ImVec2(x, y0 + kRulerHeight), IM_COL32(150, 150, 160, 255));
    for (int k = 1; k < 5; ++k) {
      float xs = x + float(step / 5 * k / st.view.ns_per_px);
      if (xs < x1) dl->AddLine(ImVec2(xs, y0 + kRulerHeight - 4), ImVec2(xs, y0 + kRulerHeight), IM_COL32(90, 90, 100, 255));
    }
    std::string text = time_label(std::abs(t) < step * 1e-6 ? 0.0 : t);
    dl->AddText(ImVec2(x + 3, y0 + 2), IM_COL32(200, 200, 210, 255), text.c_str());
  }
}

void jump_to(ViewerState& st, int64_t trace_t0, int64_t trace_t1, const char* what) {
  if (trace_t0 < 0) {
    st.status = std::string("no ") + what + " in this trace";
    return;
  }
  const LoadedTrace& lt = st.traces.front();
  double a = double(lt.to_view(trace_t0)), b = double(lt.to_view(std::max(trace_t1, trace_t0)));
  st.focus(a, b);
  st.playhead = a;
  st.status.clear();
}

}  // namespace

void draw_toolbar(ViewerState& st) {
  if (ImGui::Button("Fit all (F)")) st.fit_all();
  ImGui::SameLine();
  ImGui::SetNextItemWidth(90);
  ImGui::InputInt("##step", &st.jump_step);
  ImGui::SameLine();
  const TraceModel& m = *st.traces.front().model;
  if (ImGui::Button("Go to step")) jump_to(st, m.step_start(st.jump_step), m.step_end(st.jump_step), "such step");
  ImGui::SameLine();
  ImGui::SetNextItemWidth(90);
  ImGui::InputInt("##epoch", &st.jump_epoch);
  ImGui::SameLine();
  if (ImGui::Button("Go to epoch")) {
    int64_t a = m.epoch_start(st.jump_epoch), b = m.epoch_start(st.jump_epoch + 1);
    jump_to(st, a, b > a ? b : m.t_last, "such epoch");
  }
  ImGui::SameLine();
  auto first_flag = [&](bool error) -> const Flag* {
    for (auto& f : m.flags)
      if (f.is_error == error) return &f;
    return nullptr;
  };
  if (ImGui::Button("First error")) {
    const Flag* f = first_flag(true);
    int64_t span = std::max<int64_t>((m.t_last - m.t_first) / 50, 1000);
    jump_to(st, f ? f->t - span : -1, f ? f->t + span : -1, "error");
    if (f) st.playhead = double(st.traces.front().to_view(f->t));
  }
  ImGui::SameLine();
  if (ImGui::Button("First fault")) {
    const Flag* f = first_flag(false);
    int64_t span = std::max<int64_t>((m.t_last - m.t_first) / 50, 1000);
    jump_to(st, f ? f->t - span : -1, f ? f->t + span : -1, "fault");
    if (f) st.playhead = double(st.traces.front().to_view(f->t));
  }
  ImGui::SameLine();
  draw_replay_controls(st);
  ImGui::SameLine();
  if (!st.loading_note.empty()) {
    ImGui::TextColored(ImVec4(0.75f, 0.65f, 1.0f, 1.0f), "%s", st.loading_note.c_str());
    ImGui::SameLine();
  }
  ImGui::TextDisabled("%s  |  frame %.1f ms", st.status.empty() ? "wheel: zoom  drag: pan  right-drag: select  ruler drag: zoom in  WASD"
                                                                : st.status.c_str(),
                      st.last_frame_ms);
}

void draw_timeline(ViewerState& st, ImVec2 size) {
  ImGuiIO& io = ImGui::GetIO();
  ImVec2 origin = ImGui::GetCursorScreenPos();
  float x0 = origin.x + kLabelWidth, x1 = origin.x + size.x - 14;  // leave room for the scrollbar
  st.view.width_px = std::max(double(x1 - x0), 1.0);
  if (!st.view_initialized) {
    st.fit_all();
    st.view_initialized = true;
  }
  st.layout.time_x0 = x0;
  st.layout.time_x1 = x1;
  st.layout.tracks.clear();

  // Ruler: click sets the playhead, drag zooms to the dragged range.
  ImDrawList* top = ImGui::GetWindowDrawList();
  draw_ruler(st, top, x0, x1, origin.y);
  const std::string ruler_title =
      "time since " + (st.traces.empty() ? std::string("step 0") : st.traces[0].model->align_label);
  top->AddText(ImVec2(origin.x + 4, origin.y + 5), IM_COL32(170, 170, 180, 255), ruler_title.c_str());
  ImGui::SetCursorScreenPos(ImVec2(x0, origin.y));
  ImGui::InvisibleButton("##ruler", ImVec2(x1 - x0, kRulerHeight));
  static float ruler_press_x = -1;
  if (ImGui::IsItemActivated()) ruler_press_x = io.MousePos.x;
  if (ImGui::IsItemActive() && ruler_press_x >= 0) {
    float a = std::min(ruler_press_x, io.MousePos.x), b = std::max(ruler_press_x, io.MousePos.x);
    top->AddRectFilled(ImVec2(a, origin.y), ImVec2(b, origin.y + size.y), IM_COL32(120, 160, 255, 50));
  }
  if (ImGui::IsItemDeactivated() && ruler_press_x >= 0) {
    float a = std::min(ruler_press_x, io.MousePos.x), b = std::max(ruler_press_x, io.MousePos.x);
    if (b - a > 4) st.focus(st.view.t_of(a - x0), st.view.t_of(b - x0));
    else st.playhead = st.view.t_of(io.MousePos.x - x0), st.playhead_states.clear();
    ruler_press_x = -1;
  }

  // The tracks: one scrolling area per trace, stacked under the shared ruler. With two traces
  // each gets a share of the height (what it needs when that is less than half, the rest to
  // the other; the splitter between them moves the boundary), so both are on screen at once.
  const int n = int(st.traces.size());
  const float kTraceHeader = n > 1 ? 20.0f : 0.0f, kSplitter = n > 1 ? 6.0f : 0.0f;
  float area_y0 = origin.y + kRulerHeight, area_h = std::max(size.y - kRulerHeight, 40.0f);
  std::vector<float> heights(size_t(n), area_h);
  if (n > 1) {
    float avail = area_h - kSplitter * float(n - 1);
    std::vector<float> want(size_t(n), kTraceHeader);
    for (int ti = 0; ti < n; ++ti) {
      const LoadedTrace& lt = st.traces[size_t(ti)];
      for (int tix : lt.order)
        want[size_t(ti)] += kHeaderHeight + (lt.collapsed[size_t(tix)] ? 0 : content_height(lt.model->tracks[size_t(tix)])) + 4;
    }
    if (n == 2 && st.split_fraction > 0) {
      heights[0] = std::clamp(avail * st.split_fraction, 60.0f, std::max(avail - 60.0f, 60.0f));
      heights[1] = avail - heights[0];
    } else {
      // Water-filling: a trace needing less than an equal share gets what it needs.
      std::vector<char> fixed(size_t(n), 0);
      float left = avail;
      int open = n;
      for (bool changed = true; changed && open > 0;) {
        changed = false;
        for (int ti = 0; ti < n; ++ti)
          if (!fixed[size_t(ti)] && want[size_t(ti)] <= left / float(open)) {
            heights[size_t(ti)] = want[size_t(ti)];
            left -= want[size_t(ti)];
            fixed[size_t(ti)] = 1;
            --open;
            changed = true;
          }
      }
      for (int ti = 0; ti < n; ++ti)
        if (!fixed[size_t(ti)]) heights[size_t(ti)] = left / float(open);
      // What nobody needs goes to the last trace, so the areas fill the timeline.
      float used = 0;
      for (float h : heights) used += h;
      heights.back() += avail - used;
    }
  }
  st.layout.timeline_y0 = origin.y;
  st.layout.view_t0 = st.view.t0;
  st.layout.ns_per_px = st.view.ns_per_px;
  st.layout.trace_areas.clear();
  st.layout.aggregate_bands.clear();
  ImVec2 mouse = io.MousePos;
  Hover hover;
  bool panned = false;
  std::vector<DrawItem> scratch;
  scratch.reserve(4096);
  static bool range_drag = false;
  static double range_start = 0;
  float y_cursor = area_y0;
  float px = x0 + float((st.playhead - st.view.t0) / st.view.ns_per_px);

  for (int ti = 0; ti < n; ++ti) {
    LoadedTrace& lt = st.traces[size_t(ti)];
    const TraceModel& m = *lt.model;
    float h_trace = heights[size_t(ti)];
    if (n > 1) {
      top->AddRectFilled(ImVec2(origin.x, y_cursor), ImVec2(origin.x + size.x, y_cursor + kTraceHeader), IM_COL32(50, 50, 70, 255));
      top->AddText(ImVec2(origin.x + 6, y_cursor + 3), IM_COL32(240, 240, 255, 255), lt.label.c_str());
    }
    ImGui::SetCursorScreenPos(ImVec2(origin.x, y_cursor + kTraceHeader));
    ImGui::PushID(ti);
    ImGui::BeginChild("##tracks", ImVec2(size.x, std::max(h_trace - kTraceHeader, 10.0f)), false,
                      ImGuiWindowFlags_NoScrollWithMouse);
    ImDrawList* dl = ImGui::GetWindowDrawList();
    ImVec2 clip0 = ImGui::GetWindowPos();
    float clip_y0 = clip0.y, clip_y1 = clip0.y + ImGui::GetWindowHeight();
    st.layout.trace_areas.push_back({clip_y0, clip_y1});
    st.layout.timeline_y1 = clip_y1;
    bool window_hovered = ImGui::IsWindowHovered();
    bool mouse_in = window_hovered && mouse.x >= x0 && mouse.x < x1;
    Ctx c{st, lt, ti, dl, x0, x1, st.view.ns_per_px,
          lt.to_trace(st.view.t0), lt.to_trace(st.view.t1()) + 1, mouse, mouse_in, &hover, &scratch};
    // Where the detail stopped, the rest of the trace is drawn from its aggregates: a band behind
    // every track and a label in each header, so a stretch without allocation rows does not read
    // as a stretch without memory.
    float band_x0 = 0, band_x1 = 0;
    std::string band_label;
    if (m.detail_end >= 0) {
      band_x0 = std::max(x0, x0 + float((double(lt.to_view(m.detail_end)) - st.view.t0) / st.view.ns_per_px));
      band_x1 = std::min(x1, x0 + float((double(lt.to_view(m.t_last)) - st.view.t0) / st.view.ns_per_px));
      band_label = "aggregates only (per step): the detail stopped at " +
                   time_label(double(m.detail_end - m.t_align)) +
                   (m.detail_reason.empty() ? std::string() : " (" + m.detail_reason + ")");
      if (band_x1 > band_x0)
        st.layout.aggregate_bands.push_back({ti, band_x0, band_x1, double(m.detail_end), double(m.t_last), band_label});
    }
    for (size_t k = 0; k < lt.order.size(); ++k) {
      int tix = lt.order[k];
      const Track& t = m.tracks[size_t(tix)];
      bool collapsed = lt.collapsed[size_t(tix)] != 0;
      float ch = collapsed ? 0 : content_height(t);
      ImVec2 p = ImGui::GetCursorScreenPos();
      float y_head = p.y, y_body = p.y + kHeaderHeight, y_end = y_body + ch + 4;
      st.layout.tracks.push_back({ti, tix, t.title, kind_name(t.kind), y_body, y_body + ch, collapsed, {}});
      bool visible = y_end >= clip_y0 && y_head <= clip_y1;
      if (visible) {
        dl->AddRectFilled(ImVec2(p.x, y_head), ImVec2(x1, y_body), IM_COL32(38, 38, 48, 255));
        dl->AddLine(ImVec2(p.x, y_end - 1), ImVec2(x1, y_end - 1), IM_COL32(45, 45, 55, 255));
        ImGui::PushID(ti * 100000 + tix);
        ImGui::SetCursorScreenPos(ImVec2(p.x + 2, y_head + 1));
        if (ImGui::ArrowButton("##c", collapsed ? ImGuiDir_Right : ImGuiDir_Down)) lt.collapsed[size_t(tix)] ^= 1;
        ImGui::SameLine(0, 2);
        if (ImGui::SmallButton("^") && k > 0) std::swap(lt.order[k], lt.order[k - 1]);
        ImGui::SameLine(0, 2);
        if (ImGui::SmallButton("v") && k + 1 < lt.order.size()) std::swap(lt.order[k], lt.order[k + 1]);
        ImGui::PopID();
        dl->AddText(ImVec2(p.x + 66, y_head + 2), IM_COL32(225, 225, 235, 255), t.title.c_str());
        if (band_x1 > band_x0) {
          dl->AddRectFilled(ImVec2(band_x0, y_head), ImVec2(band_x1, y_body), kAggregateHeaderColor);
          if (!collapsed) dl->AddRectFilled(ImVec2(band_x0, y_body), ImVec2(band_x1, y_body + ch), kAggregateBandColor);
          dl->PushClipRect(ImVec2(band_x0, y_head), ImVec2(band_x1, y_body), true);
          dl->AddText(ImVec2(band_x0 + 4, y_head + 2), IM_COL32(240, 235, 255, 255), band_label.c_str());
          dl->PopClipRect();
        }
        if (!collapsed) {
          // Lane names in the label column.
          float lh = lane_height(t.kind);
          if (t.kind == TrackKind::Markers || t.kind == TrackKind::Transfers)
            for (size_t l = 0; l < t.lane_names.size(); ++l)
              if (!t.lane_names[l].empty())
                dl->AddText(ImVec2(p.x + 14, y_body + float(l) * lh), IM_COL32(140, 140, 150, 255),
                            t.lane_names[l].c_str());
          dl->PushClipRect(ImVec2(x0, y_body), ImVec2(x1, y_body + ch + 1), true);
          switch (t.kind) {
            case TrackKind::Markers: draw_markers(c, t, y_body); break;
            case TrackKind::Allocations: draw_allocations(c, t, y_body); break;
            case TrackKind::Transfers: draw_transfers(c, t, y_body); break;
            case TrackKind::Kernels: draw_kernels(c, t, y_body); break;
            case TrackKind::Flags: draw_flags(c, t, y_body, ch); break;
            case TrackKind::Memory:
            case TrackKind::HostMemory:
              draw_memory_track(lt, t, {dl, x0, x1, y_body, y_body + ch, st.view.t0 + double(m.t_align), st.view.ns_per_px},
                                mouse_in && mouse.y >= y_body && mouse.y < y_body + ch, mouse);
              break;
          }
          dl->PopClipRect();
          if (t.kind == TrackKind::Memory || t.kind == TrackKind::HostMemory)
            st.layout.tracks.back().labels = draw_memory_labels(lt, t, dl, p.x + 14, x0 - 8, y_body, y_body + ch);
          if (t.kind == TrackKind::Allocations)
            st.layout.tracks.back().labels = draw_allocation_legend(t, dl, p.x + 14, x0 - 8, y_body, y_body + ch);
        }
      }
      ImGui::SetCursorScreenPos(p);
      ImGui::Dummy(ImVec2(size.x - 14, y_end - y_head));
    }

    // Overlays across this trace's tracks: its fault/error lines, the selected range, the playhead.
    dl->PushClipRect(ImVec2(x0, clip_y0), ImVec2(x1, clip_y1), true);
    for (const Flag& f : m.flags) {
      float x = x0 + float((double(lt.to_view(f.t)) - st.view.t0) / st.view.ns_per_px);
      if (x >= x0 && x <= x1)
        dl->AddLine(ImVec2(x, clip_y0), ImVec2(x, clip_y1), (f.is_error ? kErrorColor : kFaultColor) & 0x50FFFFFF);
    }
    if (st.has_range) {
      float a = x0 + float((st.range_t0 - st.view.t0) / st.view.ns_per_px);
      float b = x0 + float((st.range_t1 - st.view.t0) / st.view.ns_per_px);
      dl->AddRectFilled(ImVec2(a, clip_y0), ImVec2(b, clip_y1), IM_COL32(120, 160, 255, 40));
      dl->AddLine(ImVec2(a, clip_y0), ImVec2(a, clip_y1), IM_COL32(120, 160, 255, 160));
      dl->AddLine(ImVec2(b, clip_y0), ImVec2(b, clip_y1), IM_COL32(120, 160, 255, 160));
    }
    if (px >= x0 && px <= x1) dl->AddLine(ImVec2(px, clip_y0), ImVec2(px, clip_y1), kPlayheadColor, 1.5f);
    dl->PopClipRect();

    // Input over this trace's tracks: wheel zooms the shared axis (Shift+wheel scrolls these
    // tracks), left-drag pans the axis and scrolls these tracks, right-drag selects a range.
    if (window_hovered) {
      if (io.MouseWheel != 0) {
        if (io.KeyShift) ImGui::SetScrollY(ImGui::GetScrollY() - io.MouseWheel * 40);
        else if (mouse_in) st.view.zoom_at(mouse.x - x0, std::pow(0.8, double(io.MouseWheel)));
      }
      if (ImGui::IsMouseClicked(ImGuiMouseButton_Right) && mouse_in) {
        range_drag = true;
        range_start = st.view.t_of(mouse.x - x0);
        st.range_trace = ti;
      }
    }
    if (!panned && (ImGui::IsWindowFocused() || window_hovered) && ImGui::IsMouseDragging(ImGuiMouseButton_Left) &&
        !ImGui::IsAnyItemActive()) {
      st.view.pan_px(io.MouseDelta.x);
      ImGui::SetScrollY(ImGui::GetScrollY() - io.MouseDelta.y);
      panned = true;
    }
    if (window_hovered && ImGui::IsMouseReleased(ImGuiMouseButton_Left) && io.MouseDragMaxDistanceSqr[0] < 9 &&
        !ImGui::IsAnyItemHovered()) {
      if (hover.kind != ItemKind::None) {
        st.select(hover.trace, hover.kind, hover.row);
        st.request_panel(Panel::Inspector);
      } else if (hover.fold) {
        const LoadedTrace& fl = st.traces[size_t(hover.trace)];
        st.focus(double(fl.to_view(hover.fold_t0)), double(fl.to_view(hover.fold_t1)));
      }
    }
    ImGui::EndChild();
    y_cursor += h_trace;
    // The splitter under this trace: drag it to give one trace more room than the other.
    if (ti + 1 < n) {
      ImGui::SetCursorScreenPos(ImVec2(origin.x, y_cursor));
      ImGui::InvisibleButton("##split", ImVec2(size.x - 14, kSplitter));
      bool hot = ImGui::IsItemHovered() || ImGui::IsItemActive();
      top->AddRectFilled(ImVec2(origin.x, y_cursor + 2), ImVec2(origin.x + size.x, y_cursor + kSplitter - 2),
                         hot ? IM_COL32(120, 140, 200, 255) : IM_COL32(60, 60, 80, 255));
      if (hot) ImGui::SetMouseCursor(ImGuiMouseCursor_ResizeNS);
      if (ImGui::IsItemActive() && n == 2) {
        float avail = area_h - kSplitter;
        st.split_fraction = std::clamp((heights[0] + io.MouseDelta.y) / avail, 0.05f, 0.95f);
      }
      y_cursor += kSplitter;
    }
    ImGui::PopID();
  }
  ImGui::SetCursorScreenPos(ImVec2(origin.x, area_y0 + area_h));
  ImGui::Dummy(ImVec2(size.x, 0));

  top->PushClipRect(ImVec2(x0, origin.y), ImVec2(x1, origin.y + kRulerHeight), true);
  if (px >= x0 && px <= x1)
    top->AddTriangleFilled(ImVec2(px - 6, origin.y + kRulerHeight - 9), ImVec2(px + 6, origin.y + kRulerHeight - 9),
                           ImVec2(px, origin.y + kRulerHeight), kPlayheadColor);
  top->PopClipRect();

  if (range_drag) {
    double now = st.view.t_of(mouse.x - x0);
    st.has_range = true;
    st.range_t0 = std::min(range_start, now);
    st.range_t1 = std::max(range_start, now);
    if (!ImGui::IsMouseDown(ImGuiMouseButton_Right)) {
      range_drag = false;
      if ((st.range_t1 - st.range_t0) / st.view.ns_per_px < 2) st.has_range = false;
      st.range_summary.reset();
      if (st.has_range) st.request_panel(Panel::Inspector);
    }
  }
  if (hover.kind != ItemKind::None) {
    ImGui::BeginTooltip();
    item_tooltip(st.traces[size_t(hover.trace)], hover.kind, hover.row);
    ImGui::EndTooltip();
  } else if (hover.fold) {
    ImGui::BeginTooltip();
    ImGui::Text("%u items folded (each narrower than %.0f px)", hover.fold_count, kMinItemPx);
    ImGui::TextDisabled("%s .. %s; click to zoom in", time_label(double(st.traces[size_t(hover.trace)].to_view(hover.fold_t0))).c_str(),
                        time_label(double(st.traces[size_t(hover.trace)].to_view(hover.fold_t1))).c_str());
    ImGui::EndTooltip();
  }

  // Keys, when no text field has focus: W/S or Up/Down zoom, A/D or Left/Right pan, F fits.
  if (!io.WantTextInput) {
    double dt = double(io.DeltaTime);
    double centre = st.view.width_px * 0.5;
    auto down = [&](int a, ImGuiKey b) { return ImGui::IsKeyDown(a) || ImGui::IsKeyDown(ImGui::GetKeyIndex(b)); };
    if (down(GLFW_KEY_W, ImGuiKey_UpArrow)) st.view.zoom_at(centre, std::pow(0.1, dt));
    if (down(GLFW_KEY_S, ImGuiKey_DownArrow)) st.view.zoom_at(centre, std::pow(10.0, dt));
    if (down(GLFW_KEY_A, ImGuiKey_LeftArrow)) st.view.pan_px(st.view.width_px * dt);
    if (down(GLFW_KEY_D, ImGuiKey_RightArrow)) st.view.pan_px(-st.view.width_px * dt);
    if (ImGui::IsKeyPressed(GLFW_KEY_F, false)) st.fit_all();
    if (ImGui::IsKeyPressed(GLFW_KEY_SPACE, false)) st.playing = !st.playing;
  }
}

}  // namespace zt::viewer
