// bench/long_run: a synthetic day through the real recording path (issue 39).
//
// Drives one steady step of the DeepSpeed ZeRO-3 offload fixture (tests/data/ds_zero3_offload_step_mix.tsv:
// its NVTX ranges, kernels, transfers, its allocation and counters, 18k rows a step) through the
// Recorder that zt probe and zt synth use, for --steps steps (86,400 by default: a day at one step a
// second, in virtual time, unslept), in 24 epochs, with a host leak of 64 MiB (a pageable allocation
// from one Python line, never freed) at each epoch's start and an OOM in the last step (an error row of
// kind oom; the step never ends, the run fails). The trace has the default size cap (--max-trace of
// zt probe, 768 MiB) unless --max-trace says otherwise.
//
// Then it reads the trace back the way a user would: zt check --leaks (its verdict and the line that
// names the leak), zt db info (timed), and the viewer's first frame (TraceModel's aggregates-first load
// and one frame's draw lists, as bench_viewer measures them; no display needed).
//
// Prints events recorded, events a second, trace size, steps with detail, the leak check's verdict and
// line, zt db info's time, the first frame's time; last line:
//   synthetic day: N steps, trace X MiB, leak found at SITE, detail steps K, info T s
// Exit 0 when it ran (a figure is a figure, not a verdict), 2 when it could not.
//
// Usage: long_run [--steps N] [--epochs N] [--max-trace BYTES] [--trace PATH] [--reuse]
//   --reuse: read an existing --trace again (no recording; the recording's figures are not printed).
#include <imgui.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "ui/viewer_state.h"
#include "zt/common/units.h"
#include "zt/db/trace_reader.h"
#include "zt/probe/probe_config.h"
#include "zt/probe/recorder.h"

using namespace zt;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "long_run: %s\n", m.c_str());
  std::exit(2);
}

struct MixLine {
  std::string kind, name;
  int64_t count = 0, bytes = 0, ns = 0;
};

std::vector<MixLine> read_mix(const std::string& path) {
  std::ifstream in(path);
  if (!in) die(path + ": cannot read the event mix");
  std::vector<MixLine> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, '\t')) f.push_back(cell);
    MixLine m;
    try {
      if (f.size() != 5) throw std::invalid_argument("fields");
      m = {f[0], f[1], std::stoll(f[2]), std::stoll(f[3]), std::stoll(f[4])};
    } catch (const std::exception&) {
      die(path + ":" + std::to_string(n) + ": not 5 tab-separated fields (kind, name, count, bytes, ns)");
    }
    if (m.count < 0 || m.bytes < 0 || m.ns < 0) die(path + ":" + std::to_string(n) + ": a negative figure");
    out.push_back(m);
  }
  return out;
}

// One event of the step, at an offset from the step's start.
struct Scheduled {
  enum Kind : uint8_t { Range, Kernel, Transfer, Alloc, Counter } kind;
  int64_t offset = 0, ns = 0, bytes = 0;
  probe::NameId name = 0;
  probe::TransferKind xkind = probe::TransferKind::H2D;
};

// Runs a command, its output into *out; returns its exit status (-1: it did not run).
int run(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf;
  size_t n;
  out->clear();
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out->append(buf.data(), n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string first_line_with(const std::string& text, const std::string& what) {
  std::stringstream ss(text);
  std::string l;
  while (std::getline(ss, l))
    if (l.find(what) != std::string::npos) return l;
  return "";
}
std::string first_line_starting(const std::string& text, const std::string& what) {
  std::stringstream ss(text);
  std::string l;
  while (std::getline(ss, l))
    if (l.rfind(what, 0) == 0) return l;
  return "";
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

int main(int argc, char** argv) {
  bench::Options o(argc, argv,
                   "long_run [--steps N] [--epochs N] [--max-trace BYTES] [--trace PATH] [--reuse]");
  const int64_t steps = o.integer("--steps", 86400, 2, 10'000'000);
  const int64_t epochs = o.integer("--epochs", 24, 1, 100'000);
  const int64_t cap = o.integer("--max-trace", probe::kDefaultMaxTrace, 0);
  const std::string trace = o.text("--trace", "/tmp/zt-long-run-" + std::to_string(steps) + ".db");
  const bool reuse = o.flag("--reuse");
  o.done();
  if (epochs > steps) die("--epochs " + std::to_string(epochs) + " is more than --steps " + std::to_string(steps));
  const std::string zt_bin = std::string(ZT_BINARY_DIR) + "/zt";
  const int64_t leak_bytes = int64_t(64) << 20;
  const int64_t step_ns = 1'000'000'000;  // a day of 86,400 steps at one a second

  int64_t events = 0;
  double record_s = 0;
  if (!reuse) {
    const std::vector<MixLine> mix = read_mix(std::string(ZT_SOURCE_DIR) + "/tests/data/ds_zero3_offload_step_mix.tsv");
    std::remove(trace.c_str());
    probe::RecorderOptions ro;
    ro.path = trace;
    ro.command_line = "bench/long_run --steps " + std::to_string(steps);
    ro.config_json = "{\"workload\":\"synthetic day (bench/long_run)\",\"steps\":" + std::to_string(steps) + "}";
    ro.max_trace_bytes = cap;
    ro.crash_handlers = false;
    std::unique_ptr<probe::Recorder> rec;
    if (Status s = probe::Recorder::open(ro, &rec); !s) die(s.message());
    rec->add_rank(0, 1, 0);
    const probe::DeviceId gpu = rec->add_device(0, probe::DeviceKind::Sim, 0, "cuda:0", "NVIDIA H200 (synthetic)",
                                                int64_t(150109880320), true);
    const probe::DeviceId host = rec->add_device(0, probe::DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false);

    // The step's schedule, spread evenly over its first 760 ms (the fixture's step), sorted by time.
    const int64_t busy_ns = 760'000'000;
    std::vector<Scheduled> sched;
    std::vector<std::pair<int64_t, int64_t>> setup;  // (count, bytes) of device segments
    probe::NameId n_rss = 0;
    int64_t rss_per_step = 0;
    for (const MixLine& m : mix) {
      if (m.kind == "segment") {
        setup.push_back({m.count, m.bytes});
        continue;
      }
      Scheduled::Kind k;
      if (m.kind == "range") k = Scheduled::Range;
      else if (m.kind == "kernel") k = Scheduled::Kernel;
      else if (m.kind == "transfer") k = Scheduled::Transfer;
      else if (m.kind == "alloc") k = Scheduled::Alloc;
      else if (m.kind == "counter") k = Scheduled::Counter;
      else die("the event mix names a kind it should not: " + m.kind);
      const probe::NameId name = rec->intern(m.name);
      if (k == Scheduled::Counter && m.name == "host_rss") n_rss = name, rss_per_step = m.count;
      for (int64_t i = 0; i < m.count; ++i) {
        Scheduled e{k};
        e.offset = busy_ns * (2 * i + 1) / (2 * m.count) + int64_t(sched.size() % 997);
        e.ns = std::min(m.ns, busy_ns - e.offset);
        e.bytes = m.bytes;
        e.name = name;
        if (k == Scheduled::Transfer)
          e.xkind = m.name == "H2D" ? probe::TransferKind::H2D
                    : m.name == "D2H" ? probe::TransferKind::D2H
                                      : probe::TransferKind::D2D;
        sched.push_back(e);
      }
    }
    std::stable_sort(sched.begin(), sched.end(), [](const Scheduled& a, const Scheduled& b) { return a.offset < b.offset; });
    // The leak's site: one Python line, as zt probe records it.
    const uint64_t fn = rec->python_function("train.py", "Trainer.on_epoch_begin");
    const uint64_t frames[2] = {probe::Recorder::python_frame_token(fn, 412),
                                probe::Recorder::python_frame_token(rec->python_function("train.py", "main"), 88)};
    const probe::StackId leak_stack = rec->intern_stack(frames, 2);

    const double t_wall = now_s();
    int64_t t = probe::now_ns();
    const int64_t t0 = t;
    uint64_t address = 0x7f0000000000ull;
    for (auto [count, bytes] : setup)
      for (int64_t i = 0; i < count; ++i) {
        probe::AllocEvent a;
        a.device = gpu;
        a.memory_kind = probe::MemoryKind::Device;
        a.level = probe::AllocLevel::Segment;
        a.address = address += uint64_t(bytes + 4096);
        a.bytes = bytes;
        a.source = probe::Source::Synthetic;
        a.t = ++t;
        rec->alloc(a);
        ++events;
      }
    const int64_t steps_per_epoch = (steps + epochs - 1) / epochs;
    double rss = 9.0 * double(int64_t(1) << 30);  // the fixture's host RSS in steady training, about 9 GiB
    probe::MarkerId epoch_marker = 0;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t epoch = s / steps_per_epoch;
      const int64_t ts = t0 + 1'000'000 + s * step_ns;
      if (s % steps_per_epoch == 0) {
        if (epoch_marker) rec->marker_end(epoch_marker, INT64_MIN, ts - 1), ++events;
        probe::MarkerEvent em;
        em.kind = probe::MarkerKind::Epoch;
        em.name = rec->intern("epoch " + std::to_string(epoch));
        em.epoch = epoch;
        em.t = ts - 1;
        epoch_marker = rec->marker_begin(em);
        ++events;
      }
      probe::MarkerEvent sm;
      sm.kind = probe::MarkerKind::Step;
      sm.name = rec->intern("step " + std::to_string(s));
      sm.step = s;
      sm.epoch = epoch;
      sm.t = ts;
      const probe::MarkerId step_marker = rec->marker_begin(sm);
      ++events;
      if (s % steps_per_epoch == 0) {
        // The leak: a buffer made at each epoch's start and never freed.
        probe::AllocEvent a;
        a.device = host;
        a.memory_kind = probe::MemoryKind::PageableHost;
        a.level = probe::AllocLevel::Segment;
        a.address = address += uint64_t(leak_bytes + 4096);
        a.bytes = leak_bytes;
        a.stack = leak_stack;
        a.source = probe::Source::Synthetic;
        a.t = ts + 1;
        rec->alloc(a);
        ++events;
        rss += double(leak_bytes);
      }
      const bool last = s == steps - 1;
      for (const Scheduled& e : sched) {
        const int64_t at = ts + 2 + e.offset;
        switch (e.kind) {
          case Scheduled::Range: {
            probe::MarkerEvent m;
            m.kind = probe::MarkerKind::Range;
            m.name = e.name;
            m.t = at;
            rec->marker_end(rec->marker_begin(m), INT64_MIN, at + e.ns);
            events += 2;
            break;
          }
          case Scheduled::Kernel: {
            probe::KernelEvent k;
            k.device = gpu;
            k.name = e.name;
            k.t_start = at;
            k.t_end = at + e.ns;
            k.stream = 7;
            k.source = probe::Source::Synthetic;
            rec->kernel(k);
            ++events;
            break;
          }
          case Scheduled::Transfer: {
            probe::TransferEvent x;
            x.kind = e.xkind;
            x.bytes = e.bytes;
            x.src = e.xkind == probe::TransferKind::H2D ? host : gpu;
            x.dst = e.xkind == probe::TransferKind::D2H ? host : gpu;
            x.pinned = e.xkind == probe::TransferKind::D2D ? -1 : 1;
            x.t_start = at;
            x.t_end = at + e.ns;
            x.source = probe::Source::Synthetic;
            rec->transfer(x);
            ++events;
            break;
          }
          case Scheduled::Alloc: {
            probe::AllocEvent a;
            a.device = host;
            a.memory_kind = probe::MemoryKind::PageableHost;
            a.level = probe::AllocLevel::Segment;
            a.address = 0x7e0000000000ull;
            a.bytes = e.bytes;
            a.source = probe::Source::Synthetic;
            a.t = at;
            const probe::AllocId id = rec->alloc(a);
            rec->free(id, at + e.ns);
            events += 2;
            break;
          }
          case Scheduled::Counter:
            rec->counter(0, host, e.name,
                         e.name == n_rss ? rss + double(e.bytes) : double((s * rss_per_step) & 0xffff), at);
            ++events;
            break;
        }
        if (last && e.offset > busy_ns / 2) break;  // the OOM, halfway through the last step
      }
      if (last) {
        db::ErrorRow err;
        err.rank = 0;
        err.t = ts + busy_ns / 2 + 1000;
        err.step = s;
        err.kind = "oom";
        err.device_id = gpu;
        err.message =
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
            "1.12 GiB is free. (synthetic: bench/long_run)";
        rec->error(err);
        ++events;
        break;  // the step never ends
      }
      rec->marker_end(step_marker, INT64_MIN, ts + busy_ns + 1000);
      ++events;
    }
    if (Status s = rec->close(probe::RunStatus::Failed, 1, "torch.OutOfMemoryError (synthetic)"); !s) die(s.message());
    record_s = now_s() - t_wall;
    std::printf("recorded %s events (%lld steps in %lld epochs, %s rows a step) in %s: %s events a second\n",
                format_count(double(events)).c_str(), (long long)steps, (long long)epochs,
                format_count(double(sched.size())).c_str(), format_duration_ns(record_s * 1e9).c_str(),
                format_count(double(events) / std::max(record_s, 1e-9)).c_str());
  }

  struct stat sb {};
  if (stat(trace.c_str(), &sb) != 0) die(trace + ": no trace");
  const double trace_mib = double(sb.st_size) / double(1 << 20);
  std::printf("trace %s: %s (cap %s; without the cap, at the fixture's 1.4 MB a second, about %s)\n", trace.c_str(),
              format_bytes(double(sb.st_size)).c_str(), cap ? format_bytes(double(cap)).c_str() : "none",
              format_bytes(1.4e6 * double(steps)).c_str());

  std::unique_ptr<db::TraceReader> reader;
  if (Status s = db::TraceReader::open(trace, &reader); !s) die(s.message());
  db::TraceSummary::Detail d;
  if (Status s = reader->summarize_detail(&d); !s) die(s.message());
  reader.reset();
  std::printf("steps with detail: %lld of %lld%s\n", (long long)d.steps_with_detail, (long long)d.steps,
              d.t_end ? (" (" + d.end_reason + ")").c_str() : "");

  std::string out;
  const int leak_rc = run(shell_quote(zt_bin) + " check " + shell_quote(trace) + " --leaks", &out);
  const std::string verdict = first_line_with(out, "leaks:");
  const std::string site_line = first_line_with(out, "train.py");
  std::printf("leak check (exit %d): %s\n  %s\n", leak_rc, verdict.c_str(),
              site_line.empty() ? "(no line names train.py)" : site_line.c_str());
  std::string site = "nothing";
  if (auto a = site_line.find("Trainer.on_epoch_begin"); a != std::string::npos) {
    auto b = site_line.find(')', a);
    site = site_line.substr(a, b == std::string::npos ? std::string::npos : b - a + 1);
  }

  double t_info = now_s();
  const int info_rc = run(shell_quote(zt_bin) + " db info " + shell_quote(trace), &out);
  t_info = now_s() - t_info;
  if (info_rc != 0) die("zt db info failed: " + out);
  std::printf("zt db info: %s; %s\n", format_duration_ns(t_info * 1e9).c_str(), first_line_starting(out, "detail:").c_str());

  // The viewer's first frame: the aggregates-first load, then one frame's draw lists.
  double t_view = now_s();
  std::unique_ptr<viewer::TraceModel> model;
  if (Status s = viewer::TraceModel::load(trace, &model, nullptr, viewer::LoadScope::Overview); !s) die(s.message());
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;
  io.DisplaySize = ImVec2(1600, 1000);
  io.DeltaTime = 1.0f / 60;
  unsigned char* px;
  int w, h;
  io.Fonts->GetTexDataAsRGBA32(&px, &w, &h);
  viewer::ViewerState st;
  viewer::add_trace(st, std::move(model));
  st.playhead = st.start_playhead();
  ImGui::NewFrame();
  viewer::draw_frame(st, 1.0f / 60);
  ImGui::Render();
  st.fit_all();
  ImGui::NewFrame();
  viewer::draw_frame(st, 1.0f / 60);
  ImGui::Render();
  t_view = now_s() - t_view;
  std::printf("viewer first frame: %s (aggregates: %lld step rows; detail read after it)\n",
              format_duration_ns(t_view * 1e9).c_str(), (long long)st.traces.front().model->step_rows);
  ImGui::DestroyContext();

  std::printf("synthetic day: %lld steps, trace %.0f MiB, leak found at %s, detail steps %lld, info %.2f s\n",
              (long long)steps, trace_mib, site.c_str(), (long long)d.steps_with_detail, t_info);
  return 0;
}
