// bench/bench_viewer: the viewer on a synthetic 10-million-row trace.
//
// Prints (1) time to first frame: loading the trace into columns plus building the first
// frame's draw lists, target <= 3 s; (2) CPU time to build one frame's draw lists fully
// zoomed out and at mid zoom, target <= 8 ms. Each frame figure is printed beside the time
// to merely iterate the rows in view once (touching start and end of every visible span),
// measured in the same run, as a ratio: level of detail should make a frame far cheaper than
// that walk. ImGui runs without a window (draw lists are built on the CPU; nothing is sent
// to a GPU), so this needs no display.
//
// Usage: bench_viewer [--rows N] [--trace PATH]   (the trace is generated once and reused)
#include <imgui.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>

#include "bench_util.h"
#include "ui/viewer_state.h"
#include "zt/common/units.h"
#include "zt/db/trace_reader.h"
#include "zt/db/trace_writer.h"

using namespace zt;
using namespace zt::viewer;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
double cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// A ZeRO-3-shaped workload written straight through TraceWriter in one transaction: per
// layer-step and rank 3 allocations, 6 placements, 4 transfers, 1 phase marker, 2 counters.
int64_t generate(const std::string& path, int64_t target_rows) {
  using namespace zt::db;
  std::unique_ptr<TraceWriter> w;
  if (Status s = TraceWriter::create(path, &w); !s) {
    std::fprintf(stderr, "bench_viewer: %s\n", s.message().c_str());
    std::exit(2);
  }
  const int ranks = 2, layers = 8;
  const int64_t rows_per_layer_step = 16 * ranks;
  const int64_t steps = std::max<int64_t>(target_rows / (rows_per_layer_step * layers), 1);
  w->begin();
  RunRow run;
  run.tool_version = "bench";
  run.command_line = "bench_viewer";
  run.t_start = 0;
  w->insert(run);
  int64_t sid = 0;
  auto str = [&](const std::string& t) {
    w->insert(StringRow{++sid, t});
    return sid;
  };
  std::vector<int64_t> gathered(layers), act(layers), grad(layers), shard(layers);
  for (int l = 0; l < layers; ++l) {
    std::string b = "block" + std::to_string(l);
    gathered[size_t(l)] = str(b + ".gathered");
    act[size_t(l)] = str(b + ".act");
    grad[size_t(l)] = str(b + ".grad");
    shard[size_t(l)] = str(b + ".shard");
  }
  int64_t n_alloc = str("allocated"), n_res = str("reserved"), ag = str("all_gather"), rs = str("reduce_scatter");
  int64_t n_fwd = str("forward layer"), n_step = str("step");
  int64_t rows = 0, alloc_id = 0, xfer_id = 0, marker_id = 0, place_id = 0, counter_id = 0;
  for (int r = 0; r < ranks; ++r) {
    RankRow rr;
    rr.rank = r;
    rr.world_size = ranks;
    w->insert(rr);
    w->insert(DeviceRow{1 + 2 * r, r, DeviceKind::Sim, r, "cuda:" + std::to_string(r), "simulated GPU", 80ll << 30, true});
    w->insert(DeviceRow{2 + 2 * r, r, DeviceKind::Cpu, 0, "cpu", "host", std::nullopt, false});
  }
  const int64_t mib = 1 << 20;
  for (int64_t s = 0; s < steps; ++s) {
    for (int r = 0; r < ranks; ++r) {
      int64_t t = s * 10'000'000 + r * 1000;  // 10 ms steps
      int64_t gpu = 1 + 2 * r, host = 2 + 2 * r;
      MarkerRow sm;
      sm.id = ++marker_id;
      sm.rank = r;
      sm.kind = MarkerKind::Step;
      sm.name_id = n_step;
      sm.t_start = t;
      sm.t_end = t + 9'900'000;
      sm.step = s;
      w->insert(sm);
      ++rows;
      int64_t live = 0;
      for (int l = 0; l < layers; ++l) {
        int64_t lt = t + l * 1'200'000;
        auto alloc = [&](int64_t name, int64_t bytes, int64_t t0, int64_t t1) {
          AllocationRow a;
          a.id = ++alloc_id;
          a.rank = r;
          a.device_id = gpu;
          a.bytes = a.requested_bytes = bytes;
          a.t_alloc = t0;
          a.t_free = t1;
          a.name_id = name;
          a.source = Source::Synthetic;
          w->insert(a);
          for (int k = 0; k < 2; ++k) {
            PlacementRow p;
            p.id = ++place_id;
            p.rank = r;
            p.t = k ? t1 : t0;
            p.tensor_id = name;
            p.device_id = gpu;
            p.why = k ? PlacementWhy::Freed : PlacementWhy::Created;
            p.allocation_id = a.id;
            w->insert(p);
          }
          rows += 3;
        };
        alloc(gathered[size_t(l)], 64 * mib, lt, lt + 300'000);
        alloc(act[size_t(l)], 32 * mib, lt + 100'000, t + 9'000'000 - l * 100'000);
        alloc(grad[size_t(l)], 64 * mib, lt + 600'000, lt + 1'100'000);
        auto xfer = [&](TransferKind kind, int64_t name, int64_t bytes, int64_t t0, int64_t dur, int64_t op) {
          TransferRow x;
          x.id = ++xfer_id;
          x.rank = r;
          x.kind = kind;
          x.bytes = bytes;
          x.src_device_id = kind == TransferKind::D2H ? gpu : host;
          x.dst_device_id = kind == TransferKind::D2H ? host : gpu;
          x.t_start = t0;
          x.t_end = t0 + dur;
          x.name_id = name;
          x.op_id = op;
          x.source = Source::Synthetic;
          w->insert(x);
          ++rows;
        };
        xfer(TransferKind::H2D, shard[size_t(l)], 32 * mib, lt, 50'000, 0);
        xfer(TransferKind::Collective, gathered[size_t(l)], 64 * mib, lt + 50'000, 40'000, ag);
        xfer(TransferKind::Collective, grad[size_t(l)], 64 * mib, lt + 700'000, 40'000, rs);
        xfer(TransferKind::D2H, grad[size_t(l)], 32 * mib, lt + 800'000, 50'000, 0);
        MarkerRow m;
        m.id = ++marker_id;
        m.rank = r;
        m.kind = MarkerKind::Phase;
        m.name_id = n_fwd;
        m.t_start = lt;
        m.t_end = lt + 1'100'000;
        m.step = s;
        w->insert(m);
        live += 96 * mib;
        for (int64_t name : {n_alloc, n_res}) {
          CounterRow c;
          c.id = ++counter_id;
          c.rank = r;
          c.device_id = gpu;
          c.name_id = name;
          c.t = lt + 1'150'000;
          c.value = double(live);
          w->insert(c);
        }
        rows += 3;
      }
    }
  }
  w->commit();
  if (Status s = w->finish(); !s) {
    std::fprintf(stderr, "bench_viewer: %s\n", s.message().c_str());
    std::exit(2);
  }
  return rows;
}

void init_imgui() {
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;
  io.DisplaySize = ImVec2(1600, 1000);
  io.DeltaTime = 1.0f / 60;
  unsigned char* px;
  int w, h;
  io.Fonts->GetTexDataAsRGBA32(&px, &w, &h);  // builds the atlas; no GPU upload needed
}

// One frame's draw lists: NewFrame, every panel, Render (which finalizes the draw data).
void frame(ViewerState& st) {
  ImGui::NewFrame();
  draw_frame(st, 1.0f / 60);
  ImGui::Render();
}

// The baseline: walk every row in view once, touching what a naive drawer would read.
double iterate_visible(const ViewerState& st, int64_t* touched) {
  double t0 = cpu_s();
  int64_t sum = 0, n = 0;
  for (const LoadedTrace& lt : st.traces) {
    int64_t a = lt.to_trace(st.view.t0), b = lt.to_trace(st.view.t1());
    for (const Track& t : lt.model->tracks)
      for (const IntervalLane& l : t.lanes) {
        auto [i, last] = visible_range(l, a, b);
        for (; i < last; ++i) sum += l.end[i] - l.start[i], ++n;
      }
    for (const Series& s : lt.model->series) {
      auto i = std::lower_bound(s.t.begin(), s.t.end(), a) - s.t.begin();
      auto e = std::upper_bound(s.t.begin(), s.t.end(), b) - s.t.begin();
      for (; i < e; ++i) sum += int64_t(s.value[size_t(i)]), ++n;
    }
  }
  *touched = n + (sum == 42 ? 1 : 0);
  return cpu_s() - t0;
}

void measure(ViewerState& st, const char* what) {
  const int frames = 30;
  frame(st);  // warm caches (and the panels' one-time analyses)
  double best = 1e9, total = 0;
  for (int i = 0; i < frames; ++i) {
    double c0 = cpu_s();
    frame(st);
    double dt = cpu_s() - c0;
    best = std::min(best, dt);
    total += dt;
  }
  int64_t rows = 0;
  double walk = 1e9;
  for (int i = 0; i < 5; ++i) walk = std::min(walk, iterate_visible(st, &rows));
  double avg = total / frames;
  size_t vertices = 0;
  if (ImDrawData* dd = ImGui::GetDrawData()) vertices = size_t(dd->TotalVtxCount);
  std::printf("%-22s frame %7.2f ms avg (%6.2f best, target <= 8 ms), %s vertices | walk of %s rows in view %8.2f ms"
              " | frame/walk = %.3f\n",
              what, avg * 1e3, best * 1e3, format_count(double(vertices)).c_str(), format_count(double(rows)).c_str(),
              walk * 1e3, avg / std::max(walk, 1e-9));
}

}  // namespace

int main(int argc, char** argv) {
  zt::bench::Options opt(argc, argv, "bench_viewer [--rows N] [--trace PATH]   (the trace is generated once and reused)");
  const int64_t target = opt.integer("--rows", 10'000'000, 1);
  const std::string path = opt.text("--trace", "/tmp/zt-bench-viewer.db");
  opt.done();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    std::printf("generating %s rows into %s ...\n", format_count(double(target)).c_str(), path.c_str());
    double g0 = now_s();
    int64_t rows = generate(path, target);
    std::printf("generated %s rows (%s) in %.1f s\n", format_count(double(rows)).c_str(),
                format_bytes(double(std::filesystem::file_size(path))).c_str(), now_s() - g0);
  }
  int64_t file_rows = 0;
  {
    std::unique_ptr<db::TraceReader> r;
    if (db::TraceReader::open(path, &r).ok())
      for (auto& t : db::TraceReader::table_names()) {
        int64_t n = 0;
        if (r->row_count(t, &n).ok()) file_rows += n;
      }
  }
  init_imgui();
  double w0 = now_s();
  std::clock_t c0 = std::clock();
  std::unique_ptr<TraceModel> model;
  if (Status s = TraceModel::load(path, &model); !s) {
    std::fprintf(stderr, "bench_viewer: %s\n", s.message().c_str());
    return 2;
  }
  double loaded = now_s() - w0;
  double load_cpu = double(std::clock() - c0) / CLOCKS_PER_SEC;
  int64_t rows = model->rows;
  ViewerState st;
  add_trace(st, std::move(model));
  st.request_panel(Panel::Replay);
  frame(st);
  double first = now_s() - w0;
  std::printf("trace: %s, %s rows in the file, %s read at load (placements wait for their panel)\n", path.c_str(),
              format_count(double(file_rows)).c_str(), format_count(double(rows)).c_str());
  std::printf("time to first frame   %.2f s wall (load %.2f s wall, %.2f s CPU on 2 threads; first frame %.0f ms), "
              "target <= 3 s\n",
              first, loaded, load_cpu, (first - loaded) * 1e3);
  st.fit_all();
  measure(st, "fully zoomed out");
  double span = st.span_t1() - st.span_t0();
  st.focus(st.span_t0() + span * 0.5, st.span_t0() + span * 0.51);  // 1% of the run
  measure(st, "mid zoom (1% of run)");
  st.focus(st.span_t0() + span * 0.5, st.span_t0() + span * 0.5 + 2e7);  // two steps
  measure(st, "zoomed in (20 ms)");
  ImGui::DestroyContext();
  return 0;
}
