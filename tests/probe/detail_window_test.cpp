// Detail windows and the flight recorder (zt/probe/detail_policy.h; docs/probe.md, "Long jobs"):
// the policy's parsing, each kind of window on a recorded run (which steps have detail, and that
// live sums inside a window are whole), SIGUSR1's capture and its chaining, and the flight
// recorder's ring after each way a run ends (close, an uncaught exception, an out-of-memory error,
// SIGTERM, SIGINT, SIGABRT, SIGSEGV, and SIGKILL, which loses it and says so).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <set>
#include <stdexcept>

#include "../test_util.h"
#include "zt/db/trace_reader.h"
#include "zt/probe/detail_policy.h"
#include "zt/probe/probe_config.h"
#include "zt/probe/recorder.h"

using namespace zt::probe;
using namespace zt::db;

namespace {

constexpr int64_t kSecond = 1'000'000'000;

std::unique_ptr<Recorder> open_recorder(const std::string& path, const std::string& detail,
                                        const std::string& flight = "off", bool crash_handlers = false) {
  RecorderOptions o;
  o.path = path;
  o.command_line = "detail_window_test";
  o.crash_handlers = crash_handlers;
  if (!detail.empty()) {
    zt::Status s = parse_detail_policy(detail, &o.detail);
    EXPECT_TRUE(s.ok()) << s.message();
  }
  zt::Status f = parse_flight_recorder(flight, &o.flight);
  EXPECT_TRUE(f.ok()) << f.message();
  std::unique_ptr<Recorder> rec;
  zt::Status s = Recorder::open(o, &rec);
  EXPECT_TRUE(s.ok()) << s.message();
  return rec;
}

std::unique_ptr<TraceReader> open_reader(const std::string& path) {
  std::unique_ptr<TraceReader> r;
  zt::Status s = TraceReader::open(path, &r);
  EXPECT_TRUE(s.ok()) << s.message();
  return r;
}

// Steps one second apart from half a second after the recorder opened (times given, so that time
// windows are exact): in each, device blocks (some kept across steps), a copy, a kernel and a phase.
// A `capture` range ("fwd") in steps 12 and 13.
struct Steps {
  Recorder& rec;
  DeviceId gpu;
  int64_t t0 = now_ns() + kSecond / 2;
  std::vector<AllocId> kept;
  explicit Steps(Recorder& r) : rec(r) {
    rec.add_rank(0, 1);
    gpu = rec.add_device(0, DeviceKind::Sim, 0, "cuda:0", "simulated GPU", int64_t(80) << 30, true);
  }
  AllocId alloc(int64_t bytes, int64_t t, const char* name) {
    AllocEvent e;
    e.device = gpu;
    e.bytes = bytes;
    e.name = rec.intern(name);
    e.t = t;
    return rec.alloc(e);
  }
  void run(int n, bool flush_each = true, int first = 0) {
    alloc(1 << 20, t0 - 1000, "weights");  // before the first step: the set-up
    for (int s = first; s < first + n; ++s) step(s, flush_each);
  }
  void step(int s, bool flush_each = true) {
    const int64_t t = t0 + int64_t(s) * kSecond;
    MarkerEvent sm;
    sm.kind = MarkerKind::Step;
    sm.name = rec.intern("step");
    sm.step = s;
    sm.t = t;
    MarkerId sid = rec.marker_begin(sm);
    MarkerEvent ph;
    ph.kind = s == 12 || s == 13 ? MarkerKind::Range : MarkerKind::Phase;
    ph.name = rec.intern(s == 12 || s == 13 ? "fwd" : "forward");
    ph.t = t + 10;
    MarkerId pid = rec.marker_begin(ph);
    AllocId act = alloc(4096 * (s + 1), t + 20, "act");
    kept.push_back(alloc(1000 + s, t + 30, "cache"));  // lives on: freed 3 steps later
    if (kept.size() > 3) {
      rec.free(kept.front(), t + 40);
      kept.erase(kept.begin());
    }
    TransferEvent x;
    x.kind = TransferKind::H2D;
    x.bytes = 4096;
    x.src = gpu, x.dst = gpu;
    x.t_start = t + 50, x.t_end = t + 60;
    rec.transfer(x);
    KernelEvent k;
    k.device = gpu;
    k.name = rec.intern("gemm");
    k.t_start = t + 70, k.t_end = t + 80;
    rec.kernel(k);
    rec.free(act, t + 90);
    rec.marker_end(pid, INT64_MIN, t + 100);
    rec.marker_end(sid, INT64_MIN, t + kSecond - 1000);
    if (flush_each) rec.flush();
  }
};

std::set<int64_t> detailed_steps(TraceReader& r) {
  TraceSummary::Detail d;
  EXPECT_TRUE(r.summarize_detail(&d).ok());
  std::set<int64_t> out;
  for (auto& [a, b] : d.detail_steps)
    for (int64_t s = a; s <= b; ++s) out.insert(s);
  return out;
}

// The kernels' steps: a kernel row is written only inside the detail.
std::set<int64_t> kernel_steps(TraceReader& r, int64_t t0) {
  std::vector<KernelRow> ks;
  EXPECT_TRUE(r.read(&ks).ok());
  std::set<int64_t> out;
  for (auto& k : ks) out.insert((k.t_start - t0) / kSecond);
  return out;
}

// Inside the detail, the live bytes the allocation rows give at each detailed step's end are the
// step's aggregate (the rows of allocations made outside, carried in when a window opens).
void expect_whole_inside_windows(TraceReader& r, const std::set<int64_t>& detailed) {
  std::vector<AllocationRow> rows;
  ASSERT_TRUE(r.read(&rows).ok());
  std::vector<StepMemoryRow> steps;
  ASSERT_TRUE(r.read(&steps).ok());
  std::set<int64_t> ids;
  for (auto& a : rows) EXPECT_TRUE(ids.insert(a.id).second) << "allocation " << a.id << " written twice";
  int checked = 0;
  for (auto& s : steps) {
    if (!s.step || !detailed.count(*s.step) || !s.t_end) continue;
    int64_t live = 0;
    for (auto& a : rows)
      if (a.level == AllocLevel::Block && a.t_alloc <= *s.t_end && (!a.t_free || *a.t_free > *s.t_end)) live += a.bytes;
    EXPECT_EQ(live, s.allocated_bytes) << "step " << *s.step;
    ++checked;
  }
  EXPECT_EQ(checked, int(detailed.size()));
}

}  // namespace

TEST(DetailPolicy, Parses) {
  DetailPolicy p;
  ASSERT_TRUE(parse_detail_policy("first:20;every:1000", &p).ok());
  EXPECT_FALSE(p.all);
  EXPECT_EQ(p.first, 20);
  EXPECT_EQ(p.every, 1000);
  EXPECT_EQ(p.text, "first:20;every:1000");
  ASSERT_TRUE(parse_detail_policy("steps:5,100-120; time:10m-15m ;range:DeepSpeedEngine\\.forward;signal:30s", &p).ok());
  EXPECT_EQ(p.steps, (std::vector<std::pair<int64_t, int64_t>>{{5, 5}, {100, 120}}));
  EXPECT_EQ(p.times, (std::vector<std::pair<int64_t, int64_t>>{{600 * kSecond, 900 * kSecond}}));
  EXPECT_EQ(p.ranges, std::vector<std::string>{"DeepSpeedEngine\\.forward"});
  EXPECT_TRUE(p.signal);
  EXPECT_EQ(p.signal_ns, 30 * kSecond);
  ASSERT_TRUE(parse_detail_policy("time:2h-;signal", &p).ok());
  EXPECT_EQ(p.times[0].first, 7200 * kSecond);
  EXPECT_EQ(p.times[0].second, INT64_MAX);
  EXPECT_EQ(p.signal_steps, 10);
  ASSERT_TRUE(parse_detail_policy("none", &p).ok());
  EXPECT_FALSE(p.all);
  EXPECT_FALSE(p.step_selected(0, 0));
  ASSERT_TRUE(parse_detail_policy("all", &p).ok());
  EXPECT_TRUE(p.all);

  ASSERT_TRUE(parse_detail_policy("first:3;every:10;steps:15-16", &p).ok());
  std::set<int64_t> sel;
  for (int s = 5; s < 40; ++s)
    if (p.step_selected(s, 5)) sel.insert(s);
  EXPECT_EQ(sel, (std::set<int64_t>{5, 6, 7, 10, 15, 16, 20, 30}));
  EXPECT_TRUE(p.step_selected(-1, -1));  // first:N takes the set-up before the first step

  for (const char* bad : {"", ";", "first", "first:0", "first:x", "every:-1", "steps:", "steps:5-3", "steps:a",
                          "time:10m", "time:15m-10m", "time:x-", "range:", "range:(", "signal:0", "signal:x",
                          "lots", "none;first:2", "all;every:3", "first:99999999999999999"}) {
    zt::Status s = parse_detail_policy(bad, &p);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  }
  zt::Status s = parse_detail_policy("first:20;evry:5", &p);
  EXPECT_NE(s.message().find("'evry:5': not a detail window"), std::string::npos) << s.message();
}

TEST(DetailPolicy, FlightRecorderAndMemoryParse) {
  FlightRecorder f;
  EXPECT_EQ(f.steps, kDefaultFlightSteps);
  ASSERT_TRUE(parse_flight_recorder("50", &f).ok());
  EXPECT_EQ(f.steps, 50);
  ASSERT_TRUE(parse_flight_recorder("7steps", &f).ok());
  EXPECT_EQ(f.steps, 7);
  ASSERT_TRUE(parse_flight_recorder("30s", &f).ok());
  EXPECT_EQ(f.steps, 0);
  EXPECT_EQ(f.ns, 30 * kSecond);
  EXPECT_EQ(f.text(), "30.00 s");
  ASSERT_TRUE(parse_flight_recorder("off", &f).ok());
  EXPECT_FALSE(f.on());
  for (const char* bad : {"", "x", "-3", "5 apples", "0s"}) EXPECT_FALSE(parse_flight_recorder(bad, &f).ok()) << bad;

  int64_t b = 0;
  ASSERT_TRUE(parse_flight_memory("512MiB", int64_t(16) << 30, &b).ok());
  EXPECT_EQ(b, int64_t(512) << 20);
  zt::Status big = parse_flight_memory("9GiB", int64_t(16) << 30, &b);  // more than half of 16 GiB
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.message().find("more than half this machine's memory (16.00 GiB)"), std::string::npos) << big.message();
  EXPECT_FALSE(parse_flight_memory("100KiB", int64_t(16) << 30, &b).ok());
  EXPECT_FALSE(parse_flight_memory("lots", int64_t(16) << 30, &b).ok());
  EXPECT_FALSE(parse_flight_memory("2TiB", 0, &b).ok());
  EXPECT_GT(machine_memory_bytes(), 0);

  // The options together, each error named by its option; the variables, by theirs.
  DetailPolicy p;
  FlightRecorder r;
  zt::Status s = parse_recording_policy({"first:2", "every:x"}, "", "", &p, &r);
  EXPECT_EQ(s.message().rfind("--detail 'every:x'", 0), 0u) << s.message();
  s = parse_recording_policy({}, "", "900TiB", &p, &r);
  EXPECT_EQ(s.message().rfind("--flight-memory '900TiB' is more than half this machine's memory", 0), 0u) << s.message();
  ASSERT_TRUE(parse_recording_policy({"first:2", "steps:9"}, "5", "64MiB", &p, &r).ok());
  EXPECT_EQ(p.text, "first:2;steps:9");
  EXPECT_EQ(r.steps, 5);
  EXPECT_EQ(r.max_bytes, int64_t(64) << 20);

  std::map<std::string, std::string> env = {{kEnvDetail, "every:100"}, {kEnvFlightRecorder, "45s"}, {kEnvFlightMemory, "32MiB"}};
  auto get = [&](const char* k) -> const char* { return env.count(k) ? env[k].c_str() : nullptr; };
  ProbeConfig c;
  ASSERT_TRUE(probe_config_from_env(get, &c).ok());
  EXPECT_EQ(c.detail.every, 100);
  EXPECT_EQ(c.flight.ns, 45 * kSecond);
  EXPECT_EQ(c.flight.max_bytes, int64_t(32) << 20);
  ProbeConfig d;
  std::map<std::string, std::string> none;
  ASSERT_TRUE(probe_config_from_env([&](const char*) -> const char* { return nullptr; }, &d).ok());
  EXPECT_TRUE(d.detail.all);
  EXPECT_EQ(d.flight.steps, kDefaultFlightSteps);
  env[kEnvDetail] = "every:";
  EXPECT_EQ(probe_config_from_env(get, &c).message().rfind("ZT_PROBE_DETAIL='every:'", 0), 0u);
  env[kEnvDetail] = "all";
  env[kEnvFlightMemory] = "900TiB";
  EXPECT_EQ(probe_config_from_env(get, &c).message().rfind("ZT_PROBE_FLIGHT_MEMORY='900TiB'", 0), 0u);
}

// Each kind of window on the same run of 20 steps: which steps have detail (zt db info's count), which
// steps' kernels are in the trace, and live sums inside the windows equal the aggregates.
TEST(DetailWindows, EachKindKeepsItsSteps) {
  struct Case {
    const char* policy;
    std::set<int64_t> steps;    // with detail, whole
    std::set<int64_t> kernels;  // whose kernel row is in the trace
  };
  const Case cases[] = {
      {"first:3", {0, 1, 2}, {0, 1, 2}},
      {"every:5", {0, 5, 10, 15}, {0, 5, 10, 15}},
      {"steps:4,17-18", {4, 17, 18}, {4, 17, 18}},
      // Steps begin 0.5 s + n s (and a few µs) after the run's start: 6, 7 and 8 begin inside.
      {"time:6.5s-9.5s", {6, 7, 8}, {6, 7, 8}},
      // Ranges "fwd" in steps 12 and 13 (not the phases "forward"): the range's own span, around
      // the step's kernel but not the whole step.
      {"range:fw.", {}, {12, 13}},
      {"first:2;steps:10", {0, 1, 10}, {0, 1, 10}},
      {"none", {}, {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.policy);
    zt::test::TempDir dir;
    const std::string path = dir.file("w.db");
    int64_t t0 = 0, run_start = 0;
    {
      auto rec = open_recorder(path, c.policy);
      Steps w(*rec);
      t0 = w.t0;
      w.run(20);
      ASSERT_TRUE(rec->close().ok());
    }
    auto r = open_reader(path);
    std::vector<RunRow> runs;
    ASSERT_TRUE(r->read(&runs).ok());
    run_start = runs[0].t_start;
    (void)run_start;
    EXPECT_EQ(detailed_steps(*r), c.steps);
    EXPECT_EQ(kernel_steps(*r, t0), c.kernels);
    expect_whole_inside_windows(*r, c.steps);
    // The aggregates are the run's whatever the policy: 20 steps of step_memory.
    std::vector<StepMemoryRow> sm;
    ASSERT_TRUE(r->read(&sm).ok());
    EXPECT_EQ(sm.size(), 20u);
    std::vector<DetailSpanRow> spans;
    ASSERT_TRUE(r->read(&spans).ok());
    ASSERT_FALSE(spans.empty());
    if (c.steps.empty() || !c.steps.count(0)) {  // no window at the start: the first stretch ends there
      EXPECT_EQ(spans[0].t_end, spans[0].t_start);
      EXPECT_NE(spans[0].end_reason.find("no detail window at the start"), std::string::npos) << spans[0].end_reason;
    }
  }
}

// Two ranks a step apart (rank 1 a step behind): a chosen step has its detail on both ranks (a
// window is open while any rank is inside a chosen step), and a rank's own steps never make the
// windows flap between the two ranks' numbers.
TEST(DetailWindows, OneRanksStepsDriveTheWindows) {
  zt::test::TempDir dir;
  const std::string path = dir.file("ranks.db");
  int64_t t0 = 0;
  {
    auto rec = open_recorder(path, "every:5");
    rec->add_rank(0, 2);
    rec->add_rank(1, 2);
    const DeviceId gpu[2] = {rec->add_device(0, DeviceKind::Sim, 0, "cuda:0", "sim", int64_t(80) << 30, true),
                             rec->add_device(1, DeviceKind::Sim, 1, "cuda:1", "sim", int64_t(80) << 30, true)};
    t0 = now_ns() + kSecond;
    for (int rank : {0, 1}) {  // memory on each device, so that each rank's steps have aggregates
      AllocEvent a;
      a.rank = rank;
      a.device = gpu[rank];
      a.bytes = 1 << 20;
      a.t = t0 - 100;
      rec->alloc(a);
    }
    std::map<int, MarkerId> open;
    for (int s = 0; s <= 20; ++s)
      for (int rank : {0, 1}) {
        const int step = rank == 0 ? s : s - 1;
        if (step < 0 || step > 19) continue;
        const int64_t t = t0 + int64_t(s) * kSecond + rank * 1000;
        if (open.count(rank)) rec->marker_end(open[rank], INT64_MIN, t - 10);
        MarkerEvent m;
        m.kind = MarkerKind::Step;
        m.rank = rank;
        m.step = step;
        m.t = t;
        open[rank] = rec->marker_begin(m);
        KernelEvent k;
        k.rank = rank;
        k.device = gpu[rank];
        k.t_start = t + 5, k.t_end = t + 6;
        rec->kernel(k);
      }
    for (auto& [rank, id] : open) rec->marker_end(id, INT64_MIN, t0 + 22 * kSecond);
    ASSERT_TRUE(rec->close().ok());
  }
  auto r = open_reader(path);
  std::vector<DetailSpanRow> spans;
  ASSERT_TRUE(r->read(&spans).ok());
  // None at the start, then for each of steps 0, 5, 10, 15 rank 0's and rank 1's (a second after).
  EXPECT_EQ(spans.size(), 9u);
  EXPECT_EQ(detailed_steps(*r), (std::set<int64_t>{0, 5, 10, 15}));
  std::vector<KernelRow> ks;
  ASSERT_TRUE(r->read(&ks).ok());
  std::set<std::pair<int64_t, int64_t>> kept;  // (rank, second)
  for (auto& k : ks) kept.emplace(k.rank, (k.t_start - t0) / kSecond);
  // Rank 1's kernels of steps 0, 5, 10, 15 (a second later), and of its steps 4, 9, 14 while rank 0
  // was in a chosen step; rank 0's of steps 2, 7, 12, 17 while rank 1 was.
  EXPECT_EQ(kept, (std::set<std::pair<int64_t, int64_t>>{{0, 0}, {0, 2}, {0, 5}, {0, 7}, {0, 10}, {0, 12}, {0, 15},
                                                          {0, 17}, {1, 1}, {1, 5}, {1, 6}, {1, 10}, {1, 11}, {1, 15},
                                                          {1, 16}}));
}

// The aggregates do not depend on the policy: a run with windows has the same step_memory and
// epoch-free live sums as the same run in full detail.
TEST(DetailWindows, AggregatesEqualFullDetail) {
  zt::test::TempDir dir;
  auto record = [&](const std::string& name, const std::string& policy) {
    const std::string path = dir.file(name);
    auto rec = open_recorder(path, policy);
    Steps w(*rec);
    w.t0 = now_ns() + kSecond / 2;
    w.run(12);
    EXPECT_TRUE(rec->close().ok());
    auto r = open_reader(path);
    std::vector<StepMemoryRow> sm;
    EXPECT_TRUE(r->read(&sm).ok());
    std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>> out;
    for (auto& s : sm)
      out.emplace_back(*s.step, s.allocated_bytes, s.reserved_bytes, s.peak_allocated_bytes, s.peak_reserved_bytes);
    return out;
  };
  const auto full = record("full.db", "all");
  const auto windows = record("windows.db", "every:4;steps:7");
  ASSERT_EQ(full.size(), 12u);
  EXPECT_EQ(full, windows);
}

// SIGUSR1 with `signal:K`: the next K steps get detail; a program's own SIGUSR1 handler still runs;
// without a signal term the probe never touches SIGUSR1.
namespace {
std::atomic<int> g_program_usr1{0};
void program_usr1(int) { g_program_usr1.fetch_add(1); }
}  // namespace

TEST(DetailWindows, SignalCapturesTheNextSteps) {
  struct sigaction mine{}, old{};
  mine.sa_handler = program_usr1;
  sigemptyset(&mine.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &mine, &old), 0);
  zt::test::TempDir dir;
  {
    // No signal term: SIGUSR1 stays the program's.
    auto rec = open_recorder(dir.file("plain.db"), "first:1");
    struct sigaction now{};
    sigaction(SIGUSR1, nullptr, &now);
    EXPECT_EQ(now.sa_handler, program_usr1);
    ASSERT_TRUE(rec->close().ok());
  }
  const std::string path = dir.file("sig.db");
  {
    auto rec = open_recorder(path, "signal:3");
    Steps w(*rec);
    w.alloc(1 << 20, w.t0 - 1000, "weights");
    for (int s = 0; s < 10; ++s) {
      w.step(s);
      if (s == 3) {
        const int before = g_program_usr1.load();
        raise(SIGUSR1);
        EXPECT_EQ(g_program_usr1.load(), before + 1);  // chained to the program's handler
        rec->flush();
      }
    }
    ASSERT_TRUE(rec->close().ok());
  }
  auto r = open_reader(path);
  EXPECT_EQ(detailed_steps(*r), (std::set<int64_t>{4, 5, 6}));
  expect_whole_inside_windows(*r, {4, 5, 6});
  TraceSummary sum;
  ASSERT_TRUE(r->summarize(&sum).ok());
  bool said = false;
  for (auto& n : sum.notes) said |= n.find("SIGUSR1") != std::string::npos && n.find("in step 3") != std::string::npos;
  EXPECT_TRUE(said);
  sigaction(SIGUSR1, &old, nullptr);
}

// ---- the flight recorder ----

namespace {

enum class Ending { Close, Exception, Oom, Term, Int, Abort, Segv, Kill };

// In a child process: 30 steps with no detail window and a ring of the last 5, then the ending.
// The parent reads the trace.
void record_and_end(const std::string& path, Ending how) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    RecorderOptions o;
    o.path = path;
    o.command_line = "flight";
    o.crash_handlers = true;
    o.crash_on_interrupt = true;
    (void)parse_detail_policy("none", &o.detail);
    o.flight.steps = 5;
    std::unique_ptr<Recorder> rec;
    if (!Recorder::open(o, &rec).ok()) _exit(3);
    Steps w(*rec);
    w.run(30, false);
    rec->flush();
    switch (how) {
      case Ending::Close:
        (void)rec->close(RunStatus::Ok, 0);
        _exit(0);
      case Ending::Exception: {  // uncaught: past a noexcept frame, as past main (gtest would catch it here)
        void (*volatile thrower)() = [] { throw std::runtime_error("boom in step 29"); };
        [&]() noexcept { thrower(); }();
        break;
      }
      case Ending::Oom: {
        ErrorRow e;
        e.kind = "oom";
        e.message = "out of memory on cuda:0";
        rec->error(e);
        (void)rec->close(RunStatus::Failed, 1, "out of memory on cuda:0");
        _exit(1);
      }
      case Ending::Term: raise(SIGTERM); break;
      case Ending::Int: raise(SIGINT); break;
      case Ending::Abort: abort();
      case Ending::Segv: {
        volatile int* p = nullptr;
        *p = 1;
        break;
      }
      case Ending::Kill: raise(SIGKILL); break;
    }
    _exit(4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
}

}  // namespace

TEST(FlightRecorder, KeepsTheLastStepsHoweverTheRunEnds) {
  const std::pair<Ending, const char*> endings[] = {
      {Ending::Close, "run ok, exit code 0"},        {Ending::Exception, "boom in step 29"},
      {Ending::Oom, "run failed, exit code 1"},      {Ending::Term, "SIGTERM"},
      {Ending::Int, "SIGINT"},                       {Ending::Abort, "SIGABRT"},
      {Ending::Segv, "SIGSEGV"},
  };
  for (auto& [how, said] : endings) {
    SCOPED_TRACE(said);
    zt::test::TempDir dir;
    const std::string path = dir.file("f.db");
    record_and_end(path, how);
    auto r = open_reader(path);
    // Steps 25-29 have their detail (the ring's last 5), the others none.
    EXPECT_EQ(detailed_steps(*r), (std::set<int64_t>{25, 26, 27, 28, 29}));
    std::vector<KernelRow> ks;
    ASSERT_TRUE(r->read(&ks).ok());
    EXPECT_EQ(ks.size(), 5u);
    expect_whole_inside_windows(*r, {25, 26, 27, 28, 29});
    std::vector<DetailSpanRow> spans;
    ASSERT_TRUE(r->read(&spans).ok());
    ASSERT_EQ(spans.size(), 2u);
    EXPECT_NE(spans[1].end_reason.find("flight recorder: the last 5 steps before the end (steps 25-29"),
              std::string::npos)
        << spans[1].end_reason;
    EXPECT_NE(spans[1].end_reason.find(said), std::string::npos) << spans[1].end_reason;
    TraceSummary::Detail d;
    ASSERT_TRUE(r->summarize_detail(&d).ok());
    EXPECT_EQ(d.flight_recorder.rfind("written ", 0), 0u) << d.flight_recorder;
    // The phases of those steps are there, ended.
    std::vector<MarkerRow> ms;
    ASSERT_TRUE(r->read(&ms).ok());
    int phases = 0;
    for (auto& m : ms)
      if (m.kind == MarkerKind::Phase) {
        ++phases;
        EXPECT_TRUE(m.t_end);
      }
    EXPECT_EQ(phases, 5);
  }
}

// SIGKILL: nothing can write the ring; the trace says what it held.
TEST(FlightRecorder, KillNineLosesTheRingAndSaysSo) {
  zt::test::TempDir dir;
  const std::string path = dir.file("k.db");
  record_and_end(path, Ending::Kill);
  auto r = open_reader(path);
  EXPECT_TRUE(detailed_steps(*r).empty());
  TraceSummary::Detail d;
  ASSERT_TRUE(r->summarize_detail(&d).ok());
  EXPECT_EQ(d.flight_recorder.rfind("in memory, not written (steps 25-29", 0), 0u) << d.flight_recorder;
  EXPECT_NE(d.flight_recorder.find("a process killed by SIGKILL loses it"), std::string::npos);
  std::vector<RunRow> runs;
  ASSERT_TRUE(r->read(&runs).ok());
  EXPECT_EQ(runs[0].status, RunStatus::Running);
}

// The ring's memory bound: a ring that would pass it keeps the newest events and says how many went.
TEST(FlightRecorder, MemoryBoundKeepsTheNewest) {
  zt::test::TempDir dir;
  const std::string path = dir.file("m.db");
  {
    RecorderOptions o;
    o.path = path;
    o.crash_handlers = false;
    (void)parse_detail_policy("none", &o.detail);
    o.flight.steps = 1000;
    o.flight.max_bytes = 20 * kFlightEntryBytes;  // 20 events: about the last 3 steps
    std::unique_ptr<Recorder> rec;
    ASSERT_TRUE(Recorder::open(o, &rec).ok());
    Steps w(*rec);
    w.run(10);
    ASSERT_TRUE(rec->close().ok());
  }
  auto r = open_reader(path);
  std::vector<DetailSpanRow> spans;
  ASSERT_TRUE(r->read(&spans).ok());
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_NE(spans[1].end_reason.find("dropped"), std::string::npos) << spans[1].end_reason;
  const auto steps = detailed_steps(*r);
  EXPECT_TRUE(steps.count(9));
  EXPECT_FALSE(steps.count(0));
}
