#include "style.h"

#include <array>

#include "zt/common/units.h"

namespace zt::viewer {

ImU32 family_color(Family f) {
  static constexpr std::array<ImU32, kFamilyCount> colors{
      IM_COL32(80, 150, 255, 255),   // parameters: blue
      IM_COL32(255, 120, 60, 255),   // gradients: orange
      IM_COL32(180, 110, 240, 255),  // optimizer state: violet
      IM_COL32(90, 200, 90, 255),    // activations: green
      IM_COL32(160, 160, 160, 255),  // buffers/other: grey
  };
  return colors[size_t(f)];
}

ImU32 direction_color(Direction d) {
  static constexpr std::array<ImU32, kDirectionCount> colors{
      IM_COL32(70, 170, 255, 255), IM_COL32(255, 140, 90, 255), IM_COL32(200, 200, 90, 255),
      IM_COL32(170, 120, 255, 255)};
  return colors[size_t(d)];
}

uint32_t hash_str(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

ImU32 marker_color(db::MarkerKind k, uint32_t h) {
  switch (k) {
    case db::MarkerKind::Epoch: return IM_COL32(90, 90, 120, 255);
    case db::MarkerKind::Step: return (h & 1) ? IM_COL32(70, 110, 150, 255) : IM_COL32(60, 95, 130, 255);
    default: {
      // Phases: a muted hue per name, so "forward" is always the same colour.
      float hue = float(h % 360) / 360.0f, r, g, b;
      ImGui::ColorConvertHSVtoRGB(hue, 0.45f, 0.65f, r, g, b);
      return IM_COL32(int(r * 255), int(g * 255), int(b * 255), 255);
    }
  }
}

ImU32 device_color(int device_index, bool host) {
  if (host) return IM_COL32(150, 150, 150, 255);
  static constexpr std::array<ImU32, 4> colors{IM_COL32(90, 190, 120, 255), IM_COL32(90, 160, 220, 255),
                                               IM_COL32(210, 180, 90, 255), IM_COL32(190, 120, 200, 255)};
  return colors[size_t(device_index) % colors.size()];
}

ImU32 series_color(const std::string& name, int index) {
  if (name == "allocated") return kAllocatedColor;
  if (name == "reserved") return kReservedColor;
  if (name == "pinned") return IM_COL32(230, 150, 60, 255);
  if (name == "pageable") return IM_COL32(200, 200, 100, 255);
  static constexpr std::array<ImU32, 3> others{IM_COL32(240, 240, 240, 255), IM_COL32(120, 220, 255, 255),
                                               IM_COL32(255, 150, 220, 255)};
  return others[size_t(index) % others.size()];
}

std::string time_label(double ns) {
  return (ns < 0 ? "-" : "+") + format_duration_ns(ns < 0 ? -ns : ns);
}

void apply_style() {
  ImGui::StyleColorsDark();
  ImGuiStyle& s = ImGui::GetStyle();
  s.WindowRounding = 0;
  s.FrameRounding = 2;
  s.ItemSpacing = ImVec2(6, 4);
  s.Colors[ImGuiCol_WindowBg] = ImVec4(0.09f, 0.09f, 0.11f, 1.0f);
  s.Colors[ImGuiCol_ChildBg] = ImVec4(0.09f, 0.09f, 0.11f, 1.0f);
}

void color_swatch(ImU32 c) {
  ImVec2 p = ImGui::GetCursorScreenPos();
  float h = ImGui::GetTextLineHeight();
  ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x, p.y + 2), ImVec2(p.x + h - 4, p.y + h - 2), c);
  ImGui::Dummy(ImVec2(h - 2, h));
  ImGui::SameLine();
}

std::string ellipsize_left(const std::string& text, float width) {
  if (ImGui::CalcTextSize(text.c_str()).x <= width) return text;
  // The longest tail that fits after "...": the width only grows as the cut moves left.
  size_t lo = 1, hi = text.size();  // cut in [lo, hi]
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (ImGui::CalcTextSize(("..." + text.substr(mid)).c_str()).x <= width) hi = mid;
    else lo = mid + 1;
  }
  // Never inside a UTF-8 character (a cut continuation byte draws as '?'): a shorter tail still fits.
  while (lo < text.size() && (static_cast<unsigned char>(text[lo]) & 0xC0) == 0x80) ++lo;
  return "..." + text.substr(lo);
}

}  // namespace zt::viewer
