// viewer/ui/app.h: the window. Owns GLFW, the OpenGL3 context, the ImGui context, loading
// with a progress bar, the main loop, and the headless screenshot mode (render off-screen,
// glReadPixels after the draw, write a PNG plus a JSON layout of where each track was drawn).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace zt::viewer {

struct ViewOptions {
  std::vector<std::string> traces;  // one or two
  std::string screenshot;           // PNG path; empty: interactive
  std::optional<int64_t> at_ns;     // playhead, view time (ns since step 0)
  std::optional<int64_t> step;      // zoom to this step, playhead at its start
  int width = 1600, height = 1000;
  std::string panel = "replay";     // inspector|replay|leaks|placement|errors
};

// Returns the process exit code; prints "zt: ..." on failure.
int run_viewer(const ViewOptions& opt);

}  // namespace zt::viewer
