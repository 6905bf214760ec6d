// fuzz_viewer_model: the viewer's model without a window (`zt view` minus GL) on hostile
// traces (trace_mutator.h): TraceModel::load (the overview, then all of it), then what the panels ask of it (leaks,
// placements, the state at the playhead, a range summary) and the level-of-detail queries a
// frame makes. A bad file is one Status; nothing sized by a value from the file.
#include "trace_mutator.h"
#include "model/analysis.h"
#include "model/lod.h"
#include "model/trace_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zt;
  using namespace zt::viewer;
  fuzz::Input in(data, size);
  const std::string path = fuzz::scratch_dir() + "/viewer.db";
  fuzz::write_mutated_trace(in, path);

  std::unique_ptr<TraceModel> m;
  // The overview first (a long trace's first frame: its aggregates, step and epoch markers), then
  // the whole trace, as zt view reads them.
  if (TraceModel::load(path, &m, nullptr, LoadScope::Overview)) {
    const double px = double(std::max<int64_t>(m->t_last - m->t_first, 1)) / 800.0;
    std::vector<ColumnMinMax> c;
    for (const Track& t : m->tracks)
      for (const SeriesRef& sr : t.series)
        if (sr.series >= 0 && size_t(sr.series) < m->series.size())
          decimate(m->series[size_t(sr.series)], m->t_first, px, 800, m->t_last, &c);
  }
  m.reset();
  if (!TraceModel::load(path, &m)) return 0;
  (void)find_leaks(*m);
  Status s;
  (void)placement_timeline(*m, 1'000'000, &s);
  const int64_t span = m->t_last - m->t_first;
  for (int64_t t : {m->t_first, m->t_first + span / 3, m->t_last}) (void)state_at(*m, t, 10);
  (void)summarize_range(*m, m->t_first, m->t_last, 10);
  (void)summarize_range(*m, m->t_first + span / 2, m->t_first + span / 2 + 1, 3);
  std::vector<DrawItem> items;
  std::vector<ColumnMinMax> cols;
  const double ns_per_px = double(std::max<int64_t>(span, 1)) / 800.0;
  for (const Track& t : m->tracks) {
    for (const IntervalLane& lane : t.lanes) fold_visible(lane, m->t_first, m->t_last, ns_per_px, 3.0, &items);
    for (const SeriesRef& sr : t.series)
      if (sr.series >= 0 && size_t(sr.series) < m->series.size())
        decimate(m->series[size_t(sr.series)], m->t_first, ns_per_px, 800, m->t_last, &cols);
  }
  for (int64_t step = -1; step <= std::min<int64_t>(m->max_step, 8); ++step) (void)m->step_start(step), (void)m->step_end(step);
  std::vector<std::string> lines;
  for (size_t i = 0; i < m->alloc.size() && i < 4; ++i) (void)m->stack_text(m->alloc.stack[i], &lines);
  return 0;
}
