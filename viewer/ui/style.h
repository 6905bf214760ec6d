// viewer/ui/style.h: colours and text helpers every panel uses, so a family or a direction
// has one colour everywhere (timeline bars, legends, tables).
#pragma once

#include <imgui.h>

#include <string>

#include "model/families.h"
#include "model/trace_model.h"

namespace zt::viewer {

ImU32 family_color(Family f);
ImU32 direction_color(Direction d);
ImU32 marker_color(db::MarkerKind k, uint32_t name_hash);
ImU32 device_color(int device_index, bool host);

// Exact colours tests look for in screenshots.
inline constexpr ImU32 kErrorColor = IM_COL32(235, 30, 30, 255);
inline constexpr ImU32 kFaultColor = IM_COL32(255, 170, 0, 255);
inline constexpr ImU32 kPlayheadColor = IM_COL32(255, 230, 60, 255);
// A stretch with aggregates only (the detail stopped): a violet wash behind its tracks, a
// stronger one in their headers.
inline constexpr ImU32 kAggregateBandColor = IM_COL32(150, 110, 255, 30);
inline constexpr ImU32 kAggregateHeaderColor = IM_COL32(110, 80, 190, 255);
inline constexpr ImU32 kAllocatedColor = IM_COL32(60, 200, 170, 255);
inline constexpr ImU32 kReservedColor = IM_COL32(110, 140, 255, 255);
inline constexpr ImU32 kCapacityColor = IM_COL32(255, 80, 80, 255);
inline constexpr ImU32 kFoldColor = IM_COL32(120, 120, 140, 255);
inline constexpr ImU32 kMismatchColor = IM_COL32(255, 60, 200, 255);

ImU32 series_color(const std::string& name, int index);
std::string time_label(double view_ns);  // "+1.25 s", "-3.00 ms"
void apply_style();
void color_swatch(ImU32 c);  // a small square in text flow
// `text` as it fits in `width` pixels of the current font: whole, or "..." and its end.
std::string ellipsize_left(const std::string& text, float width);
uint32_t hash_str(const std::string& s);

}  // namespace zt::viewer
