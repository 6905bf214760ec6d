#include "app.h"

#include <GLFW/glfw3.h>
#include <backends/imgui_impl_glfw.h>
#include <backends/imgui_impl_opengl3.h>
#include <imgui.h>
#include <stb_image_write.h>

#include <GL/gl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "panels.h"
#include "style.h"
#include "zt/common/units.h"
#include "zt/db/trace_reader.h"

namespace zt::viewer {

double ViewerState::span_t0() const {
  double v = 0;
  for (size_t i = 0; i < traces.size(); ++i) {
    double t = double(traces[i].to_view(traces[i].model->t_first));
    v = i == 0 ? t : std::min(v, t);
  }
  return v;
}
double ViewerState::start_playhead() const {
  double v = 0;
  for (size_t i = 0; i < traces.size(); ++i) {
    const TraceModel& m = *traces[i].model;
    const bool steps = m.align_label.rfind("step", 0) == 0;
    const int64_t t = steps ? m.t_align : m.alloc.size() > 0 ? m.alloc.t_alloc.front() : m.t_first;
    v = i == 0 ? double(traces[i].to_view(t)) : std::min(v, double(traces[i].to_view(t)));
  }
  return v;
}
double ViewerState::span_t1() const {
  double v = 0;
  for (size_t i = 0; i < traces.size(); ++i) {
    double t = double(traces[i].to_view(traces[i].model->t_last));
    v = i == 0 ? t : std::max(v, t);
  }
  return v;
}
void ViewerState::focus(double t0, double t1) { view.fit(t0, t1); }

void add_trace(ViewerState& st, std::unique_ptr<TraceModel> model) {
  LoadedTrace lt;
  lt.model = std::move(model);
  lt.label = std::string(1, char('A' + st.traces.size() % 26)) + "  " + lt.model->path();
  for (size_t k = 0; k < lt.model->tracks.size(); ++k) lt.order.push_back(int(k));
  lt.collapsed.assign(lt.model->tracks.size(), 0);
  st.traces.push_back(std::move(lt));
}

void draw_frame(ViewerState& st, float dt) {
  auto started = std::chrono::steady_clock::now();
  st.layout.clear_panels();
  if (st.playing) {
    st.playhead += double(dt) * st.speed * 1e9;
    if (st.playhead >= st.span_t1()) st.playhead = st.span_t1(), st.playing = false;
    // Keep the playhead in view: page the view forward when it leaves.
    if (st.playhead > st.view.t1() || st.playhead < st.view.t0) st.view.t0 = st.playhead - 0.1 * st.view.width_px * st.view.ns_per_px;
  }
  ImGuiIO& io = ImGui::GetIO();
  ImGui::SetNextWindowPos(ImVec2(0, 0));
  ImGui::SetNextWindowSize(io.DisplaySize);
  ImGui::Begin("zt view", nullptr,
               ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoSavedSettings |
                   ImGuiWindowFlags_NoBringToFrontOnFocus);
  draw_toolbar(st);
  ImVec2 avail = ImGui::GetContentRegionAvail();
  draw_timeline(st, ImVec2(avail.x, std::floor(avail.y * 0.64f)));
  if (ImGui::BeginTabBar("##panels")) {
    struct Tab {
      const char* name;
      Panel panel;
      void (*draw)(ViewerState&);
    };
    static const Tab tabs[] = {{"Inspector", Panel::Inspector, draw_inspector},
                               {"Replay", Panel::Replay, draw_replay_panel},
                               {"Leaks", Panel::Leaks, draw_leaks_panel},
                               {"Placement", Panel::Placement, draw_placement_panel},
                               {"Faults & errors", Panel::Errors, draw_errors_panel}};
    for (const Tab& tab : tabs) {
      ImGuiTabItemFlags flags = st.panel_requested && st.panel == tab.panel ? ImGuiTabItemFlags_SetSelected : 0;
      if (ImGui::BeginTabItem(tab.name, nullptr, flags)) {
        if (!st.panel_requested) st.panel = tab.panel;
        ImGui::BeginChild("##panel");
        tab.draw(st);
        ImGui::EndChild();
        ImGui::EndTabItem();
      }
    }
    st.panel_requested = false;
    ImGui::EndTabBar();
  }
  ImGui::End();
  st.last_frame_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
}

namespace {

std::string glfw_error;
void on_glfw_error(int, const char* what) { glfw_error = what ? what : "unknown GLFW error"; }

int fail(const std::string& m) {
  std::fprintf(stderr, "zt: %s\n", m.c_str());
  return 2;
}

Panel panel_named(const std::string& n) {
  if (n == "inspector") return Panel::Inspector;
  if (n == "leaks") return Panel::Leaks;
  if (n == "placement") return Panel::Placement;
  if (n == "errors") return Panel::Errors;
  return Panel::Replay;
}

// A long trace opens on its aggregates first (TraceModel's overview) when every trace has them:
// its step rows are few where its detail may be millions of rows.
bool overview_first(const std::vector<std::string>& paths) {
  for (auto& p : paths) {
    std::unique_ptr<db::TraceReader> r;
    int64_t n = 0;
    if (!db::TraceReader::open(p, &r, db::TraceReader::Checks::None) || !r->has_aggregates() ||
        !r->row_count("step_memory", &n) || n == 0)
      return false;
  }
  return true;
}

// The detail has been read: the full models replace the overviews, the view and playhead stay.
void replace_models(ViewerState& st, std::vector<std::unique_ptr<TraceModel>>& models) {
  for (size_t i = 0; i < st.traces.size() && i < models.size(); ++i) {
    LoadedTrace& lt = st.traces[i];
    lt.model = std::move(models[i]);
    lt.order.clear();
    for (size_t k = 0; k < lt.model->tracks.size(); ++k) lt.order.push_back(int(k));
    lt.collapsed.assign(lt.model->tracks.size(), 0);
    lt.leaks.reset();
    lt.placements.reset();
    lt.placement_error.clear();
  }
  st.selection = Selection{};
  st.range_summary.reset();
  st.playhead_states.clear();
}

void init_state(ViewerState& st, std::vector<std::unique_ptr<TraceModel>> models, const ViewOptions& opt) {
  for (auto& m : models) add_trace(st, std::move(m));
  st.request_panel(panel_named(opt.panel));
  st.playhead = st.start_playhead();
}

// Applies --at / --step once the first frame has fixed the width of the time area.
bool apply_start_position(ViewerState& st, const ViewOptions& opt) {
  const TraceModel& m = *st.traces.front().model;
  if (opt.step) {
    int64_t a = m.step_start(*opt.step), b = m.step_end(*opt.step);
    if (a < 0) return false;
    st.focus(double(st.traces.front().to_view(a)), double(st.traces.front().to_view(b)));
    st.playhead = double(st.traces.front().to_view(a));
  } else {
    st.fit_all();
  }
  if (opt.at_ns) st.playhead = double(*opt.at_ns);
  st.playhead_states.clear();
  return true;
}

void write_layout(const ViewerState& st, const std::string& path, int w, int h) {
  nlohmann::json j;
  const FrameLayout& l = st.layout;
  j["width"] = w;
  j["height"] = h;
  j["time_x0"] = l.time_x0;
  j["time_x1"] = l.time_x1;
  j["timeline_y0"] = l.timeline_y0;
  j["timeline_y1"] = l.timeline_y1;
  j["view_t0_ns"] = l.view_t0;
  j["ns_per_px"] = l.ns_per_px;
  j["playhead_ns"] = st.playhead;
  for (auto& lt : st.traces) j["traces"].push_back({{"path", lt.model->path()}, {"t_align", lt.model->t_align}});
  for (auto& t : l.tracks)
    j["tracks"].push_back({{"trace", t.trace}, {"track", t.track}, {"title", t.title}, {"kind", t.kind},
                           {"y0", t.y0}, {"y1", t.y1}, {"collapsed", t.collapsed}, {"labels", t.labels}});
  for (auto& [y0, y1] : l.trace_areas) j["trace_areas"].push_back({{"y0", y0}, {"y1", y1}});
  j["aggregate_bands"] = nlohmann::json::array();
  for (auto& b : l.aggregate_bands)
    j["aggregate_bands"].push_back({{"trace", b.trace}, {"x0", b.x0}, {"x1", b.x1}, {"t0_ns", b.t0}, {"t1_ns", b.t1},
                                    {"label", b.label}});
  j["placement_legend"] = l.placement_legend;
  j["placement_rows"] = nlohmann::json::array();
  for (auto& r : l.placement_rows)
    j["placement_rows"].push_back({{"trace", r.trace}, {"rank", r.rank}, {"name", r.name}, {"text", r.text},
                                   {"x0", r.x0}, {"x1", r.x1}, {"y0", r.y0}, {"y1", r.y1}, {"t0", r.t0}, {"t1", r.t1}});
  j["replay_traces"] = l.replay_traces;
  std::ofstream(path) << j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

}  // namespace

int run_viewer(const ViewOptions& opt) {
  if (opt.traces.empty() || opt.traces.size() > 2) return fail("zt view takes one or two traces");
  // Bad or foreign files are refused before any window opens.
  for (auto& p : opt.traces) {
    std::unique_ptr<db::TraceReader> r;
    if (Status s = db::TraceReader::open(p, &r, db::TraceReader::Checks::SmallTables); !s) return fail(s.message());
  }
  const bool headless = !opt.screenshot.empty();
  glfwSetErrorCallback(on_glfw_error);
  if (!glfwInit())
    return fail("cannot open a window: " + glfw_error +
                " (no display? set DISPLAY, or run under xvfb-run for --screenshot)");
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 0);
  if (headless) glfwWindowHint(GLFW_VISIBLE, GLFW_FALSE);
  std::string title = "zt view  " + opt.traces.front() + (opt.traces.size() > 1 ? "  vs  " + opt.traces[1] : "");
  GLFWwindow* window = glfwCreateWindow(opt.width, opt.height, title.c_str(), nullptr, nullptr);
  if (!window) {
    glfwTerminate();
    return fail("cannot create an OpenGL 3.0 window: " + glfw_error);
  }
  glfwMakeContextCurrent(window);
  glfwSwapInterval(headless ? 0 : 1);
  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  ImGui::GetIO().IniFilename = nullptr;  // nothing written into the user's directory
  apply_style();
  ImGui_ImplGlfw_InitForOpenGL(window, true);
  ImGui_ImplOpenGL3_Init("#version 130");

  auto shutdown = [&] {
    ImGui_ImplOpenGL3_Shutdown();
    ImGui_ImplGlfw_Shutdown();
    ImGui::DestroyContext();
    glfwDestroyWindow(window);
    glfwTerminate();
  };
  auto render = [&](bool capture) -> std::vector<unsigned char> {
    ImGui::Render();
    int fw, fh;
    glfwGetFramebufferSize(window, &fw, &fh);
    glViewport(0, 0, fw, fh);
    glClearColor(0.09f, 0.09f, 0.11f, 1.0f);
    glClear(GL_COLOR_BUFFER_BIT);
    ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
    std::vector<unsigned char> pixels;
    if (capture) {
      // Read the back buffer before the swap: a hidden window has no front buffer to read.
      pixels.resize(size_t(fw) * size_t(fh) * 3);
      glPixelStorei(GL_PACK_ALIGNMENT, 1);
      glReadBuffer(GL_BACK);
      glReadPixels(0, 0, fw, fh, GL_RGB, GL_UNSIGNED_BYTE, pixels.data());
    }
    glfwSwapBuffers(window);
    return pixels;
  };
  auto new_frame = [&] {
    ImGui_ImplOpenGL3_NewFrame();
    ImGui_ImplGlfw_NewFrame();
    ImGui::NewFrame();
  };

  // Load on a worker thread while the window shows progress. A window (not a screenshot) of
  // traces with aggregates shows them first, drawn from the aggregates, and their detail when
  // it has been read (a day's trace: its curve at once, its detail some seconds later).
  std::vector<std::unique_ptr<TraceModel>> models(opt.traces.size()), overviews(opt.traces.size());
  LoadProgress progress;
  Status load_status, overview_status;
  std::atomic<bool> loaded{false}, overview_ready{false};
  std::atomic<int> loading_index{0};
  const bool two_stage = !headless && overview_first(opt.traces);
  std::thread loader([&] {
    if (two_stage) {
      for (size_t i = 0; i < opt.traces.size() && overview_status.ok(); ++i)
        overview_status = TraceModel::load(opt.traces[i], &overviews[i], nullptr, LoadScope::Overview);
      overview_ready = true;
    }
    for (size_t i = 0; i < opt.traces.size() && load_status.ok(); ++i) {
      loading_index = int(i);
      progress.rows_done = 0;
      load_status = TraceModel::load(opt.traces[i], &models[i], &progress);
    }
    loaded = true;
  });
  while (!loaded && !(overview_ready && overview_status.ok())) {
    if (!headless) {
      glfwPollEvents();
      if (glfwWindowShouldClose(window)) progress.cancel = true;
      new_frame();
      ImGuiIO& io = ImGui::GetIO();
      ImGui::SetNextWindowPos(ImVec2(io.DisplaySize.x * 0.5f, io.DisplaySize.y * 0.5f), 0, ImVec2(0.5f, 0.5f));
      ImGui::Begin("Loading", nullptr, ImGuiWindowFlags_AlwaysAutoResize | ImGuiWindowFlags_NoCollapse);
      int64_t done = progress.rows_done, total = std::max<int64_t>(progress.rows_total, 1);
      ImGui::Text("Loading %s", opt.traces[size_t(loading_index.load())].c_str());
      ImGui::ProgressBar(float(double(done) / double(total)), ImVec2(420, 0));
      ImGui::Text("%s of %s rows", format_count(double(done)).c_str(), format_count(double(total)).c_str());
      ImGui::End();
      render(false);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  const bool show_overview = !loaded.load();
  if (show_overview) {
    ViewerState st;
    init_state(st, std::move(overviews), opt);
    bool positioned = false;
    while (!glfwWindowShouldClose(window) && !loaded) {
      glfwPollEvents();
      new_frame();
      int64_t done = progress.rows_done, total = std::max<int64_t>(progress.rows_total, 1);
      st.loading_note = "drawn from the aggregates; reading the detail: " + format_count(double(done)) + " of " +
                        format_count(double(total)) + " rows";
      draw_frame(st, ImGui::GetIO().DeltaTime);
      if (!positioned) {
        if (!apply_start_position(st, opt)) st.status = "no step " + std::to_string(*opt.step) + " in this trace";
        positioned = true;
      }
      render(false);
      if (!st.playing) glfwWaitEventsTimeout(0.1);
    }
    if (!loaded) progress.cancel = true;  // the window was closed first
    loader.join();
    if (glfwWindowShouldClose(window)) {
      shutdown();
      return 0;
    }
    st.loading_note.clear();
    if (load_status) replace_models(st, models);
    else st.status = "the detail could not be read (" + load_status.message() + "): the aggregates are shown";
    while (!glfwWindowShouldClose(window)) {
      glfwPollEvents();
      new_frame();
      draw_frame(st, ImGui::GetIO().DeltaTime);
      render(false);
      if (!st.playing) glfwWaitEventsTimeout(0.25);
    }
    shutdown();
    return 0;
  }
  loader.join();
  if (!load_status) {
    shutdown();
    return fail(load_status.message());
  }

  ViewerState st;
  init_state(st, std::move(models), opt);
  if (headless) {
    // A few frames so ImGui settles its layout (window and table sizes are known from the
    // second frame on), then capture the last.
    int rc = 0;
    std::vector<unsigned char> pixels;
    for (int frame = 0; frame < 4; ++frame) {
      new_frame();
      draw_frame(st, 0.0f);
      if (frame == 0 && !apply_start_position(st, opt)) {
        rc = fail(opt.traces.front() + ": no step " + std::to_string(*opt.step) + " in this trace");
        ImGui::Render();
        break;
      }
      pixels = render(frame == 3);
    }
    if (rc == 0) {
      int fw, fh;
      glfwGetFramebufferSize(window, &fw, &fh);
      // OpenGL's rows run bottom-up; PNG's top-down.
      std::vector<unsigned char> flipped(pixels.size());
      size_t row = size_t(fw) * 3;
      for (int y = 0; y < fh; ++y)
        std::copy(pixels.begin() + long(size_t(fh - 1 - y) * row), pixels.begin() + long(size_t(fh - y) * row),
                  flipped.begin() + long(size_t(y) * row));
      if (!stbi_write_png(opt.screenshot.c_str(), fw, fh, 3, flipped.data(), int(row)))
        rc = fail(opt.screenshot + ": cannot write the PNG");
      else
        write_layout(st, opt.screenshot + ".json", fw, fh);
    }
    shutdown();
    return rc;
  }

  bool positioned = false;
  while (!glfwWindowShouldClose(window)) {
    glfwPollEvents();
    new_frame();
    draw_frame(st, ImGui::GetIO().DeltaTime);
    if (!positioned) {
      if (!apply_start_position(st, opt)) st.status = "no step " + std::to_string(*opt.step) + " in this trace";
      positioned = true;
    }
    render(false);
    // Idle politely: when nothing moves, wait for input instead of spinning a core.
    if (!st.playing) glfwWaitEventsTimeout(0.25);
  }
  shutdown();
  return 0;
}

}  // namespace zt::viewer
