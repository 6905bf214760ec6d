// viewer/view_command.cpp: `zt view`, registered on the CLI by cli/main.cpp when the viewer
// is built. Parses the flags and hands them to the window (ui/app.h).
#include <cmath>
#include <cstdlib>

#include "commands.h"
#include "output_paths.h"
#include "ui/app.h"
#include "zt/common/units.h"

namespace zt::cli {

void add_view_command(CLI::App& app, Action& action) {
  auto* view = app.add_subcommand(
      "view",
      "Open traces in the timeline viewer (two traces: side by side on one axis, aligned at step 0)\n"
      "Example: zt view run.db\n"
      "         zt view before.db after.db\n"
      "         zt view run.db --screenshot out.png --step 3 --size 1600x1000   (headless, e.g. under xvfb-run)");
  auto traces = std::make_shared<std::vector<std::string>>();
  auto shot = std::make_shared<std::string>();
  auto at = std::make_shared<std::string>();
  auto step = std::make_shared<int64_t>(-1);
  auto size = std::make_shared<std::string>("1600x1000");
  auto panel = std::make_shared<std::string>("replay");
  view->add_option("TRACES", *traces, "one trace, or two to compare")->required()->expected(1, 2);
  view->add_option("--screenshot", *shot, "render off-screen into this PNG (plus PNG.json with the layout) and exit");
  view->add_option("--at", *at, "playhead time since step 0: 1.5s, 250ms, 40us, 1000ns");
  view->add_option("--step", *step, "zoom to step N, playhead at its start");
  view->add_option("--size", *size, "window size WxH");
  view->add_option("--panel", *panel, "panel shown below the timeline: inspector|replay|leaks|placement|errors")
      ->check(CLI::IsMember({"inspector", "replay", "leaks", "placement", "errors"}));
  view->callback([&action, view, traces, shot, at, step, size, panel] {
    // --screenshot '' would open the interactive window (and wait forever on a headless machine).
    const bool shot_empty = view->get_option("--screenshot")->count() > 0 && shot->empty();
    action = [=]() -> int {
      if (shot_empty) return fail("--screenshot: give the PNG file to write");
      // The PNG and its layout PNG.json must not replace a trace being shown.
      if (Status s = check_output_if_given(*shot, *traces); !s) return fail(s.message());
      if (!shot->empty())
        if (Status s = check_output_path(*shot + ".json", *traces); !s) return fail(s.message());
      viewer::ViewOptions o;
      o.traces = *traces;
      o.screenshot = *shot;
      o.panel = *panel;
      if (!at->empty()) {
        o.at_ns = parse_duration_ns(*at);
        if (!o.at_ns) return fail("--at: '" + *at + "' is not a time (try 1.5s, 250ms or 40us)");
      }
      if (view->get_option("--step")->count() > 0) {
        if (*step < 0) return fail("--step " + std::to_string(*step) + ": a step number is 0 or more");
        o.step = *step;
      }
      int w = 0, h = 0;
      char x = 0;
      if (std::sscanf(size->c_str(), "%d%c%d", &w, &x, &h) != 3 || (x != 'x' && x != 'X') || w < 320 || h < 240 ||
          w > 16384 || h > 16384)
        return fail("--size: '" + *size + "' is not WxH (at least 320x240), e.g. 1600x1000");
      o.width = w;
      o.height = h;
      return viewer::run_viewer(o);
    };
  });
}

}  // namespace zt::cli
