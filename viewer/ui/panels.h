// viewer/ui/panels.h: the entry points of each panel (one file per panel) and the item
// descriptions they share. Each panel draws into the current ImGui window.
#pragma once

#include <imgui.h>

#include "viewer_state.h"

namespace zt::viewer {

// timeline.cpp: navigation toolbar, time ruler, tracks, hover/click/range input.
void draw_toolbar(ViewerState& st);
void draw_timeline(ViewerState& st, ImVec2 size);

// memory_track.cpp: a memory counter track (allocated, reserved, capacity line, host series).
struct MemoryTrackArea {
  ImDrawList* dl;
  float x0, x1, y0, y1;  // time area of the track, window pixels
  double view_t0, ns_per_px;
};
void draw_memory_track(const LoadedTrace& lt, const Track& track, const MemoryTrackArea& area, bool hovered,
                       ImVec2 mouse);
float memory_track_height(const Track& track);
// The track's label column in [x0, x1] x [y0, y1]: each series with its peak, the capacity, the
// scale (bytes at the top edge). Returns the lines drawn ("allocated peak 4.70 MiB", ...).
std::vector<std::string> draw_memory_labels(const LoadedTrace& lt, const Track& track, ImDrawList* dl, float x0,
                                            float x1, float y0, float y1);

// inspector.cpp: tooltips and the details panel (selection with its call stack, range summary).
void item_tooltip(const LoadedTrace& lt, ItemKind kind, uint32_t row);
void draw_inspector(ViewerState& st);

void draw_replay_controls(ViewerState& st);  // replay_panel.cpp: play/pause and speed, for the toolbar
void draw_replay_panel(ViewerState& st);
void draw_leaks_panel(ViewerState& st);
void draw_placement_panel(ViewerState& st);
void draw_errors_panel(ViewerState& st);

}  // namespace zt::viewer
