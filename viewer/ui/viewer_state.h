// viewer/ui/viewer_state.h: what the panels share while the window is open.
//
// Owns the loaded traces (with per-trace track order and collapse state), the time view,
// the playhead, the selection, the selected range and the cached analyses. Panels read and
// change it; none of them owns data of another. Times stored here are view times (trace time
// minus the trace's alignment point, step 0), so two traces share one axis.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/analysis.h"
#include "model/time_view.h"
#include "model/trace_model.h"

namespace zt::viewer {

struct LoadedTrace {
  std::unique_ptr<TraceModel> model;
  std::string label;                // "A  run.db"
  std::vector<int> order;           // display order of model->tracks
  std::vector<char> collapsed;      // per track index
  // Analyses, computed the first time their panel is shown.
  std::optional<std::vector<LeakGroup>> leaks;
  std::optional<std::vector<TensorPlacement>> placements;
  std::string placement_error;
  int64_t to_view(int64_t t) const { return t - model->t_align; }
  int64_t to_trace(double v) const { return int64_t(v) + model->t_align; }
};

enum class ItemKind : uint8_t { None, Allocation, Transfer, Kernel, Marker, Flag };

struct Selection {
  int trace = -1;
  ItemKind kind = ItemKind::None;
  uint32_t row = 0;
  bool stack_loaded = false;
  std::vector<std::string> stack;
  std::string stack_error;
};

// Where things were drawn in the last frame: written by the timeline, read by the headless
// screenshot writer (as JSON beside the PNG) so tests can find a track or a time in pixels.
struct LayoutTrack {
  int trace = 0;
  int track = 0;
  std::string title;
  std::string kind;
  float y0 = 0, y1 = 0;  // window pixels, content area of the track
  bool collapsed = false;
  std::vector<std::string> labels;  // text in its label column (memory tracks: series, peaks, scale)
};
// A row of the placement view as drawn: the text in its tensor column (ellipsized from the
// left when narrow) and its bar, which maps trace times [t0, t1] onto [x0, x1].
struct LayoutPlacementRow {
  int trace = 0;
  int rank = 0;
  std::string name, text;
  float x0 = 0, x1 = 0, y0 = 0, y1 = 0;
  double t0 = 0, t1 = 0;
};
// A stretch of a trace drawn from its aggregates alone (the detail stopped there): where the
// band was drawn, and what its header says.
struct LayoutBand {
  int trace = 0;
  float x0 = 0, x1 = 0;
  double t0 = 0, t1 = 0;  // trace times
  std::string label;
};
struct FrameLayout {
  float time_x0 = 0, time_x1 = 0;  // window pixels of the time area
  float timeline_y0 = 0, timeline_y1 = 0;
  double view_t0 = 0, ns_per_px = 1;
  std::vector<LayoutTrack> tracks;
  // Per trace, the window rows its tracks scroll in (two traces split the timeline between them).
  std::vector<std::pair<float, float>> trace_areas;
  std::vector<LayoutBand> aggregate_bands;
  // Panels drawn this frame (cleared at its start).
  std::vector<std::string> placement_legend;
  std::vector<LayoutPlacementRow> placement_rows;
  std::vector<int> replay_traces;  // traces whose state the replay panel showed
  void clear_panels() {
    placement_legend.clear();
    placement_rows.clear();
    replay_traces.clear();
  }
};

enum class Panel : int { Inspector = 0, Replay, Leaks, Placement, Errors };

struct ViewerState {
  std::vector<LoadedTrace> traces;
  TimeView view;
  bool view_initialized = false;
  double playhead = 0;  // view time
  bool playing = false;
  double speed = 1.0;   // trace seconds per wall second
  Selection selection;
  bool has_range = false;
  double range_t0 = 0, range_t1 = 0;  // view times
  std::optional<RangeSummary> range_summary;  // of traces[range_trace]
  int range_trace = 0;                        // the trace the range was dragged over
  // The state at the playhead, per trace (recomputed when the playhead moves), and which
  // trace the replay panel shows: -1 every trace, side by side.
  std::vector<std::optional<PlayheadState>> playhead_states;
  int playhead_trace = -1;
  float split_fraction = -1;  // two traces: share of the timeline height for A; -1: automatic
  Panel panel = Panel::Replay;
  bool panel_requested = false;
  FrameLayout layout;
  int jump_step = 0, jump_epoch = 0;
  std::string status;  // one line for the toolbar (a jump that found nothing, ...)
  double last_frame_ms = 0;
  // While a long trace's detail is read behind its first frame (drawn from the aggregates): what
  // the toolbar says of it ("" when nothing is being read).
  std::string loading_note;

  // Full span of every trace in view time.
  double span_t0() const;
  double span_t1() const;
  // Where the playhead starts: the first step's start (view time 0), or, in a trace without steps,
  // its first allocation (its first event when it has none); the earliest of the traces. The span's
  // start is before anything is live ("0 B ... nothing" in the Replay panel).
  double start_playhead() const;
  void fit_all() { view.fit(span_t0(), span_t1()); }
  void select(int trace, ItemKind kind, uint32_t row);
  void focus(double t0, double t1);  // zoom so [t0, t1] fills the view
  void request_panel(Panel p) {
    panel = p;
    panel_requested = true;
  }
};

// Adds a loaded trace (labelled A, B in order), every track shown, in the model's order.
void add_trace(ViewerState& st, std::unique_ptr<TraceModel> model);

// One frame of the whole window (toolbar, timeline, panels). ImGui only, no GL: the window
// loop, the screenshot mode and the frame benchmark all call it.
void draw_frame(ViewerState& st, float dt);

}  // namespace zt::viewer
