// Aggregates and the size cap (db/SCHEMA.md, "Aggregates"): the recorder's step and epoch aggregates
// equal what the full detail gives on a run that keeps both; a cap stops the detail and the
// aggregates go on; zt check --leaks finds a leak after the cap from them; the reader says which
// steps have detail and refuses a hand-edited aggregate row, naming its table.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>

#include "../test_util.h"
#include "aggregates.h"
#include "zt/check/check.h"
#include "zt/db/export.h"
#include "zt/db/sites.h"
#include "zt/db/trace_reader.h"
#include "zt/db/trace_writer.h"
#include "zt/probe/probe_config.h"
#include "zt/probe/recorder.h"

using namespace zt::probe;
using namespace zt::db;

namespace {

std::unique_ptr<Recorder> open_recorder(const std::string& path, int64_t max_trace = 0) {
  RecorderOptions o;
  o.path = path;
  o.command_line = "aggregates_test";
  o.crash_handlers = false;
  o.max_trace_bytes = max_trace;
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

void exec_sql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

// A workload with steps and epochs on a simulated GPU (blocks in segments) and the host (segments and
// sampled rows), with its times given: a leak of named pinned buffers and of an unnamed host buffer
// made at a Python line, at each epoch's end.
struct Workload {
  Recorder& rec;
  DeviceId gpu = 0, cpu = 0;
  StackId leak_stack = 0;
  int64_t t = now_ns();
  std::mt19937_64 rng{11};
  std::vector<AllocId> live;
  int rank = 0;

  explicit Workload(Recorder& r, int rank_ = 0, int world = 1) : rec(r), rank(rank_) {
    rec.add_rank(rank, world);
    gpu = rec.add_device(rank, DeviceKind::Sim, 0, "cuda:0", "simulated GPU", int64_t(80) << 30, true);
    cpu = rec.add_device(rank, DeviceKind::Cpu, 0, "cpu", "host", std::nullopt, false);
    const uint64_t grow = rec.python_function("/w/leak.py", "grow");
    const uint64_t frames[] = {Recorder::python_frame_token(grow, 12), 0x401000};
    leak_stack = rec.intern_stack(frames, 2);
  }
  int64_t tick() { return t += 1000 + int64_t(rng() % 1000); }
  AllocId alloc(DeviceId dev, MemoryKind kind, AllocLevel level, int64_t bytes, const char* name, StackId stack = 0,
                int64_t weight = 0) {
    AllocEvent e;
    e.rank = rank;
    e.device = dev;
    e.memory_kind = kind;
    e.level = level;
    e.bytes = bytes;
    e.name = name ? rec.intern(name) : 0;
    e.stack = stack;
    e.weight_bytes = weight;
    e.t = tick();
    return rec.alloc(e);
  }
  void step_body(int n_allocs) {
    for (int i = 0; i < n_allocs; ++i) {
      const int64_t b = int64_t(1 + rng() % 64) << 12;
      live.push_back(alloc(gpu, MemoryKind::Device, AllocLevel::Block, b, "act"));
      if (i % 7 == 0)
        live.push_back(alloc(cpu, MemoryKind::PageableHost, AllocLevel::Segment, 4096, nullptr, leak_stack, 600000));
      if (live.size() > 5 && rng() % 2) {
        const size_t k = size_t(rng() % live.size());
        rec.free(live[k], tick());
        live.erase(live.begin() + long(k));
      }
    }
    while (live.size() > 8) {
      rec.free(live.back(), tick());
      live.pop_back();
    }
  }
  // epochs x steps; each step ends with a flush when `flush_steps` (so that the writer's cycles
  // follow the steps: the cap's test needs its size checks between them).
  void run(int epochs, int steps, int n_allocs, bool flush_steps) {
    alloc(gpu, MemoryKind::Device, AllocLevel::Segment, int64_t(2) << 30, "segment");
    for (int e = 0; e < epochs; ++e) {
      MarkerEvent em;
      em.rank = rank;
      em.kind = MarkerKind::Epoch;
      em.name = rec.intern("epoch " + std::to_string(e));
      em.epoch = e;
      em.t = tick();
      MarkerId eid = rec.marker_begin(em);
      for (int s = 0; s < steps; ++s) {
        MarkerEvent sm;
        sm.rank = rank;
        sm.kind = MarkerKind::Step;
        sm.name = rec.intern("step");
        sm.step = e * steps + s;
        sm.epoch = e;
        sm.t = tick();
        MarkerId sid = rec.marker_begin(sm);
        step_body(n_allocs);
        rec.counter(rank, cpu, rec.intern("host_rss"), double((100 + e * steps + s) << 20), tick());
        rec.marker_end(sid, INT64_MIN, tick());
        if (flush_steps) rec.flush();
      }
      // The leaks: a named pinned buffer and an unnamed host buffer made at leak.py:12.
      alloc(cpu, MemoryKind::PinnedHost, AllocLevel::Segment, 8 << 20, "leak.buffer[epoch]");
      alloc(cpu, MemoryKind::PageableHost, AllocLevel::Segment, 6 << 20, nullptr, leak_stack);
      rec.marker_end(eid, INT64_MIN, tick());
    }
  }
};

struct Row {
  int64_t rank, device, kind, level, bytes, t_alloc, t_free, name, stack, weight;
  bool alive(int64_t t) const { return t_alloc <= t && t < t_free; }
};

std::vector<Row> allocation_rows(TraceReader& r) {
  std::vector<AllocationRow> rows;
  EXPECT_TRUE(r.read(&rows).ok());
  std::vector<Row> out;
  for (auto& a : rows)
    out.push_back({a.rank, a.device_id, int64_t(a.memory_kind), int64_t(a.level), a.bytes, a.t_alloc,
                   a.t_free.value_or(INT64_MAX), a.name_id, a.stack_id, a.weight_bytes.value_or(0)});
  return out;
}

}  // namespace

TEST(Aggregates, StepAndEpochRangeNames) {
  using detail::step_or_epoch_range;
  EXPECT_EQ(step_or_epoch_range("step 3"), std::make_pair(MarkerKind::Step, int64_t(3)));
  EXPECT_EQ(step_or_epoch_range("zerotrace::epoch 12"), std::make_pair(MarkerKind::Epoch, int64_t(12)));
  EXPECT_EQ(step_or_epoch_range("Step_7"), std::make_pair(MarkerKind::Step, int64_t(7)));
  EXPECT_EQ(step_or_epoch_range("EPOCH:2"), std::make_pair(MarkerKind::Epoch, int64_t(2)));
  EXPECT_EQ(step_or_epoch_range("step4"), std::make_pair(MarkerKind::Step, int64_t(4)));
  for (const char* no : {"step", "steps 3", "step 3a", "forward", "zerotrace::phase", "step 12345678901", "epoch -1"})
    EXPECT_FALSE(step_or_epoch_range(no)) << no;
}

TEST(Aggregates, MaxTraceParses) {
  EXPECT_EQ(parse_max_trace("512MiB"), int64_t(512) << 20);
  EXPECT_EQ(parse_max_trace("2GiB"), int64_t(2) << 30);
  EXPECT_EQ(parse_max_trace("1048576"), int64_t(1) << 20);
  EXPECT_EQ(parse_max_trace("0"), 0);
  EXPECT_EQ(parse_max_trace("none"), 0);
  for (const char* bad : {"", "12Q", "-1MiB", "lots", "9PiB"}) EXPECT_FALSE(parse_max_trace(bad)) << bad;
  ProbeConfig c;
  EXPECT_EQ(c.max_trace, kDefaultMaxTrace);
  auto env = [](const char* value) {
    return [value](const char* k) -> const char* { return std::string(k) == kEnvMaxTrace ? value : nullptr; };
  };
  ASSERT_TRUE(probe_config_from_env(env("64MiB"), &c).ok());
  EXPECT_EQ(c.max_trace, int64_t(64) << 20);
  zt::Status bad = probe_config_from_env(env("big"), &c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("ZT_PROBE_MAX_TRACE=big"), std::string::npos) << bad.message();
}

// On a run that keeps its whole detail, each step's aggregates are what the allocation rows give:
// live blocks and segments at its end, their peaks within it, the last RSS sample; and each epoch
// boundary's live set by (device, kind, level, name, stack), sampled rows by their weight.
TEST(Aggregates, EqualWhatTheDetailGives) {
  zt::test::TempDir dir;
  const std::string path = dir.file("full.db");
  {
    auto rec = open_recorder(path);
    Workload w(*rec);
    w.run(3, 5, 40, false);
    ASSERT_TRUE(rec->close().ok());
  }
  auto r = open_reader(path);
  ASSERT_TRUE(r->has_aggregates());
  const auto rows = allocation_rows(*r);
  std::vector<MarkerRow> markers;
  ASSERT_TRUE(r->read(&markers).ok());
  std::vector<StepMemoryRow> steps;
  ASSERT_TRUE(r->read(&steps).ok());
  std::vector<CounterRow> counters;
  ASSERT_TRUE(r->read(&counters).ok());

  int checked = 0;
  for (auto& m : markers) {
    if (m.kind != MarkerKind::Step) continue;
    ASSERT_TRUE(m.t_end);
    for (int64_t dev : {int64_t(1), int64_t(2)}) {
      // From the detail: live exact bytes per level at the end, and the peak over every change in the step.
      auto live = [&](int64_t t, int64_t level) {
        int64_t sum = 0;
        for (auto& a : rows)
          if (a.device == dev && a.level == level && a.weight == 0 && a.alive(t)) sum += a.bytes;
        return sum;
      };
      int64_t peak[2] = {live(m.t_start, 0), live(m.t_start, 1)};
      for (auto& a : rows)
        for (int64_t t : {a.t_alloc, a.t_free})
          if (t >= m.t_start && t <= *m.t_end)
            for (int64_t level : {0, 1}) peak[level] = std::max(peak[level], live(t, level));
      const StepMemoryRow* s = nullptr;
      for (auto& x : steps)
        if (x.device_id == dev && x.step == m.step) s = &x;
      ASSERT_NE(s, nullptr) << "step " << *m.step << " device " << dev;
      EXPECT_EQ(s->t_start, m.t_start);
      EXPECT_EQ(s->t_end, m.t_end);
      EXPECT_EQ(s->epoch, m.epoch);
      EXPECT_EQ(s->allocated_bytes, live(*m.t_end, 0)) << "step " << *m.step << " device " << dev;
      EXPECT_EQ(s->reserved_bytes, live(*m.t_end, 1));
      EXPECT_EQ(s->peak_allocated_bytes, peak[0]) << "step " << *m.step << " device " << dev;
      EXPECT_EQ(s->peak_reserved_bytes, peak[1]);
      int64_t rss = -1;
      for (auto& c : counters)
        if (c.t <= *m.t_end) rss = int64_t(c.value);
      EXPECT_EQ(s->host_rss_bytes.value_or(-1), rss);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * 5 * 2);

  // Each epoch's start and end: the live set by site, from the detail and from the aggregates.
  std::vector<EpochLiveRow> live_rows;
  ASSERT_TRUE(r->read(&live_rows).ok());
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>;  // device, kind, level, name, stack
  int boundaries = 0;
  for (auto& m : markers) {
    if (m.kind != MarkerKind::Epoch) continue;
    for (int at : {0, 1}) {
      const int64_t t = at == 0 ? m.t_start : *m.t_end;
      std::map<Key, std::pair<int64_t, int64_t>> detail, aggregate;  // bytes, count
      for (auto& a : rows)
        if (a.alive(t)) {
          auto& x = detail[{a.device, a.kind, a.level, a.name, a.stack}];
          x.first += a.weight ? a.weight : a.bytes;
          ++x.second;
        }
      for (auto& l : live_rows)
        if (l.epoch == *m.epoch && l.at == at) {
          EXPECT_EQ(l.t, t);
          aggregate[{l.device_id, int64_t(l.memory_kind), int64_t(l.level), l.name_id, l.stack_id}] = {l.bytes,
                                                                                                      l.allocations};
        }
      EXPECT_EQ(aggregate, detail) << "epoch " << *m.epoch << (at ? " end" : " start");
      EXPECT_FALSE(aggregate.empty());
      ++boundaries;
    }
  }
  EXPECT_EQ(boundaries, 6);
  TraceSummary::Detail d;
  ASSERT_TRUE(r->summarize_detail(&d).ok());
  EXPECT_FALSE(d.t_end);
  EXPECT_EQ(d.steps, 15);
  EXPECT_EQ(d.steps_with_detail, 15);
  EXPECT_EQ(d.epoch_boundaries, 6);
}

// A cap the run passes early: the detail stops (no allocation row after the span's end), the
// aggregates go on to the last step, the trace says where and why, and zt check --leaks still finds
// the leaks made after the cap, with their name and their Python line.
TEST(Aggregates, CapStopsTheDetailAndTheLeakIsFoundFromAggregates) {
  zt::test::TempDir dir;
  const std::string path = dir.file("capped.db");
  int64_t empty_size = 0;
  {
    auto rec = open_recorder(dir.file("empty.db"));
    ASSERT_TRUE(rec->close().ok());
    empty_size = int64_t(std::filesystem::file_size(dir.file("empty.db")));
  }
  // 1.5 times a closed empty trace: the run's rows and their indexes pass it after a few steps.
  const int64_t cap = empty_size + empty_size / 2;
  {
    auto rec = open_recorder(path, cap);
    Workload w(*rec);
    w.run(5, 12, 150, true);
    ASSERT_TRUE(rec->close().ok());
  }
  auto r = open_reader(path);
  TraceSummary::Detail d;
  ASSERT_TRUE(r->summarize_detail(&d).ok());
  ASSERT_TRUE(d.t_end) << "the cap was never reached";
  EXPECT_NE(d.end_reason.find("size cap"), std::string::npos) << d.end_reason;
  EXPECT_EQ(d.steps, 60);
  EXPECT_GT(d.steps_with_detail, 0);
  EXPECT_LT(d.steps_with_detail, 20) << "the detail went on long past the cap";
  ASSERT_TRUE(d.first_aggregate_step);
  EXPECT_EQ(d.last_step, 59);
  for (auto& a : allocation_rows(*r)) EXPECT_LE(a.t_alloc, *d.t_end);
  std::vector<RunRow> runs;
  ASSERT_TRUE(r->read(&runs).ok());
  EXPECT_NE(runs[0].config_json.find("detail stopped"), std::string::npos) << runs[0].config_json;
  // Bounded: the rows stopped near the cap (one writer cycle past it at most), plus the aggregates
  // and the indexes built at close.
  EXPECT_LT(int64_t(std::filesystem::file_size(path)), cap + (1 << 20));

  // The trace itself, and the same after zt db merge (which keeps the aggregates and the span).
  const std::string merged = dir.file("merged.db");
  zt::Status ms = merge_traces(merged, {path}, false);
  ASSERT_TRUE(ms.ok()) << ms.message();
  for (const std::string& t : {path, merged}) {
    zt::check::Options o;
    o.leaks = true;
    zt::check::Report rep;
    ASSERT_TRUE(zt::check::run_checks(t, o, &rep).ok());
    ASSERT_EQ(rep.checks.size(), 1u);
    const auto& c = rep.checks[0];
    EXPECT_EQ(c.outcome, zt::check::Outcome::Fail) << zt::check::format_text(rep);
    std::string all;
    for (auto& f : c.findings) all += f + "\n";
    EXPECT_NE(all.find("from the aggregates"), std::string::npos) << t << ": " << all;
    EXPECT_NE(all.find("leak.buffer[epoch]"), std::string::npos) << all;
    EXPECT_NE(all.find("grow (/w/leak.py:12)"), std::string::npos) << all;
    EXPECT_NE(all.find("pinned host"), std::string::npos) << all;
  }
}

// A run capped from its first cycle whose epochs free what they made: the aggregates' live sets
// are flat, so a cap alone makes no finding.
TEST(Aggregates, CappedCleanRunPasses) {
  zt::test::TempDir dir;
  const std::string path = dir.file("clean.db");
  {
    auto rec = open_recorder(path, 1);  // the cap at once: aggregates only, from the first cycle
    Workload w(*rec);
    w.alloc(w.gpu, MemoryKind::Device, AllocLevel::Segment, int64_t(2) << 30, "segment");
    for (int e = 0; e < 4; ++e) {
      MarkerEvent em;
      em.kind = MarkerKind::Epoch;
      em.name = rec->intern("epoch");
      em.epoch = e;
      em.t = w.tick();
      MarkerId id = rec->marker_begin(em);
      w.step_body(100);
      for (AllocId a : w.live) rec->free(a, w.tick());  // the epoch's temporaries go at its end
      w.live.clear();
      rec->marker_end(id, INT64_MIN, w.tick());
      rec->flush();
    }
    ASSERT_TRUE(rec->close().ok());
  }
  zt::check::Options o;
  o.leaks = true;
  zt::check::Report rep;
  ASSERT_TRUE(zt::check::run_checks(path, o, &rep).ok());
  EXPECT_EQ(rep.checks[0].outcome, zt::check::Outcome::Pass) << zt::check::format_text(rep);
}

// A hand-edited aggregate row is refused by the value checks, naming its table and row.
TEST(Aggregates, BadAggregateRowsAreRefused) {
  zt::test::TempDir dir;
  const std::string good = dir.file("good.db");
  {
    auto rec = open_recorder(good);
    Workload w(*rec);
    w.run(2, 2, 10, false);
    ASSERT_TRUE(rec->close().ok());
  }
  struct Case {
    const char* sql;
    const char* says;
  } cases[] = {
      {"UPDATE step_memory SET t_end = t_start - 1 WHERE id = (SELECT min(id) FROM step_memory)", "step_memory row"},
      {"UPDATE step_memory SET peak_allocated_bytes = -5 WHERE id = (SELECT min(id) FROM step_memory)",
       "peak_allocated_bytes is -5"},
      {"UPDATE epoch_live SET at = 7 WHERE id = (SELECT min(id) FROM epoch_live)", "epoch_live row"},
      {"UPDATE epoch_live SET sampled_variance = 'x' WHERE id = (SELECT min(id) FROM epoch_live)", "sampled_variance"},
      {"UPDATE detail_span SET t_end = -1", "detail_span row"},
      {"DROP TABLE epoch_live", "epoch_live"},
  };
  int n = 0;
  for (auto& c : cases) {
    const std::string bad = dir.file("bad" + std::to_string(n++) + ".db");
    std::filesystem::copy_file(good, bad);
    exec_sql(bad, c.sql);
    std::unique_ptr<TraceReader> r;
    zt::Status s = TraceReader::open(bad, &r);
    ASSERT_FALSE(s.ok()) << c.sql;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  }
}

// A version 2 trace (before aggregates) reads as detail everywhere; rows added to it (zt probe's
// derived steps, a PyTorch history) give it the aggregate tables, empty, and version 3.
TEST(Aggregates, VersionTwoTracesReadAndGainTheTablesOnAppend) {
  zt::test::TempDir dir;
  const std::string path = dir.file("v2.db");
  {
    auto rec = open_recorder(path);
    Workload w(*rec);
    w.run(1, 2, 5, false);
    ASSERT_TRUE(rec->close().ok());
  }
  exec_sql(path, "DROP TABLE step_memory; DROP TABLE epoch_live; DROP TABLE detail_span; PRAGMA user_version=2;");
  {
    auto r = open_reader(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->schema_version(), 2);
    EXPECT_FALSE(r->has_aggregates());
    std::vector<StepMemoryRow> steps;
    EXPECT_TRUE(r->read(&steps).ok());
    EXPECT_TRUE(steps.empty());
    TraceSummary::Detail d;
    ASSERT_TRUE(r->summarize_detail(&d).ok());
    EXPECT_FALSE(d.aggregates);
  }
  {
    std::unique_ptr<TraceWriter> w;
    zt::Status s = TraceWriter::append(path, &w);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_TRUE(w->finish().ok());
  }
  auto r = open_reader(path);
  EXPECT_EQ(r->schema_version(), kSchemaVersion);
  EXPECT_TRUE(r->has_aggregates());
  TraceSummary::Detail d;
  ASSERT_TRUE(r->summarize_detail(&d).ok());
  EXPECT_EQ(d.steps, 0);
  EXPECT_FALSE(d.t_end);
}

// zt train --cupti: CUPTI's device rows fold into the trainer's when the trace is finished; the
// aggregates' rows follow them (no row names a device that went).
TEST(Aggregates, FollowDeviceRowsFoldedAtFinish) {
  zt::test::TempDir dir;
  const std::string path = dir.file("fold.db");
  {
    auto rec = open_recorder(path);
    rec->add_rank(0, 1);
    const DeviceId cupti_cpu = rec->add_device(0, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false);
    const DeviceId cpu = rec->add_device(0, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false);
    MarkerEvent sm;
    sm.kind = MarkerKind::Step;
    sm.step = 0;
    sm.epoch = 0;
    MarkerEvent em = sm;
    em.kind = MarkerKind::Epoch;
    MarkerId e = rec->marker_begin(em);
    MarkerId s = rec->marker_begin(sm);
    for (auto [dev, src] : {std::pair{cpu, Source::Api}, std::pair{cupti_cpu, Source::Cupti}}) {
      AllocEvent a;
      a.device = dev;
      a.memory_kind = MemoryKind::PinnedHost;
      a.level = AllocLevel::Segment;
      a.address = 0x10000;
      a.bytes = 1 << 20;
      a.source = src;
      rec->alloc(a);
    }
    rec->marker_end(s);
    rec->marker_end(e);
    ASSERT_TRUE(rec->close().ok());
  }
  auto r = open_reader(path);
  QueryResult q;
  ASSERT_TRUE(r->query("SELECT (SELECT count(*) FROM device), "
                       "(SELECT count(*) FROM step_memory WHERE device_id NOT IN (SELECT id FROM device)), "
                       "(SELECT count(*) FROM epoch_live WHERE device_id NOT IN (SELECT id FROM device)), "
                       "(SELECT count(*) FROM step_memory)",
                       &q)
                  .ok());
  ASSERT_EQ(q.rows.size(), 1u);
  EXPECT_EQ(q.rows[0][0], "1") << "the two cpu rows were not folded: the test does not test the fold";
  EXPECT_EQ(q.rows[0][1], "0");
  EXPECT_EQ(q.rows[0][2], "0");
  EXPECT_EQ(q.rows[0][3], "2");
}

// zt check --budget on a trace whose detail stopped: a peak after the cap is found from the steps'
// aggregates (the detail alone has no row of it, and passed).
TEST(Aggregates, BudgetSeesAPeakAfterTheCap) {
  zt::test::TempDir dir;
  const std::string path = dir.file("budget.db");
  {
    auto rec = open_recorder(path, 1);
    Workload w(*rec);
    rec->flush();  // the first cycle: the cap is passed at once, aggregates only from here
    for (int s = 0; s < 4; ++s) {
      MarkerEvent sm;
      sm.kind = MarkerKind::Step;
      sm.step = s;
      sm.t = w.tick();
      MarkerId id = rec->marker_begin(sm);
      AllocId big = w.alloc(w.gpu, MemoryKind::Device, AllocLevel::Block, (s == 2 ? int64_t(3) << 30 : 1 << 20), "big");
      rec->free(big, w.tick());
      rec->marker_end(id, INT64_MIN, w.tick());
      rec->flush();
    }
    ASSERT_TRUE(rec->close().ok());
  }
  zt::check::Options o;
  zt::check::Budget b;
  ASSERT_TRUE(zt::check::parse_budget("cuda=2GiB", &b).ok());
  o.budget = b;
  zt::check::Report rep;
  ASSERT_TRUE(zt::check::run_checks(path, o, &rep).ok());
  ASSERT_EQ(rep.checks.size(), 1u);
  const std::string text = zt::check::format_text(rep);
  EXPECT_EQ(rep.checks[0].outcome, zt::check::Outcome::Fail) << text;
  EXPECT_NE(text.find("3.00 GiB over the budget of 2.00 GiB"), std::string::npos) << text;
  EXPECT_NE(text.find("from the aggregates"), std::string::npos) << text;
}

// An epoch marker without its number writes no live set (a row must name its epoch): the trace
// stays readable.
TEST(Aggregates, AnEpochWithoutItsNumberKeepsTheTraceReadable) {
  zt::test::TempDir dir;
  const std::string path = dir.file("noepoch.db");
  {
    auto rec = open_recorder(path);
    Workload w(*rec);
    MarkerEvent em;
    em.kind = MarkerKind::Epoch;
    em.t = w.tick();
    MarkerId id = rec->marker_begin(em);
    w.step_body(10);
    rec->marker_end(id, INT64_MIN, w.tick());
    ASSERT_TRUE(rec->close().ok());
  }
  auto r = open_reader(path);
  ASSERT_TRUE(r);
  std::vector<EpochLiveRow> rows;
  ASSERT_TRUE(r->read(&rows).ok());
  EXPECT_TRUE(rows.empty());
}

// Eight ranks, each capped (a node's per-rank traces): each stays bounded, and zt db merge of them
// fits eight caps and keeps both layers (every detail row and every aggregate row of every rank).
TEST(Aggregates, MergeOfEightCappedRanksFitsEightCaps) {
  zt::test::TempDir dir;
  int64_t empty_size = 0;
  {
    auto rec = open_recorder(dir.file("empty.db"));
    ASSERT_TRUE(rec->close().ok());
    empty_size = int64_t(std::filesystem::file_size(dir.file("empty.db")));
  }
  const int64_t cap = empty_size + empty_size / 2;
  std::vector<std::string> ranks;
  std::map<std::string, int64_t> rows_in;
  for (int r = 0; r < 8; ++r) {
    ranks.push_back(dir.file("rank" + std::to_string(r) + ".db"));
    {
      auto rec = open_recorder(ranks.back(), cap);
      Workload w(*rec, r, 8);
      w.run(3, 10, 150, true);
      ASSERT_TRUE(rec->close().ok());
    }
    EXPECT_LT(int64_t(std::filesystem::file_size(ranks.back())), cap + (1 << 20)) << ranks.back();
    auto rd = open_reader(ranks.back());
    TraceSummary::Detail d;
    ASSERT_TRUE(rd->summarize_detail(&d).ok());
    ASSERT_TRUE(d.t_end) << ranks.back() << ": the cap was never reached";
    for (const char* t : {"allocation", "marker", "step_memory", "epoch_live", "detail_span"}) {
      int64_t n = 0;
      ASSERT_TRUE(rd->row_count(t, &n).ok());
      rows_in[t] += n;
    }
  }
  const std::string merged = dir.file("node.db");
  zt::Status ms = merge_traces(merged, ranks, false);
  ASSERT_TRUE(ms.ok()) << ms.message();
  EXPECT_LE(int64_t(std::filesystem::file_size(merged)), 8 * cap);
  auto rd = open_reader(merged);
  for (auto& [t, n] : rows_in) {
    int64_t m = 0;
    ASSERT_TRUE(rd->row_count(t, &m).ok());
    EXPECT_EQ(m, n) << t;
  }
  TraceSummary::Detail d;
  ASSERT_TRUE(rd->summarize_detail(&d).ok());
  ASSERT_TRUE(d.t_end);
  EXPECT_EQ(d.steps, 30);
  EXPECT_LT(d.steps_with_detail, 30);
  // The leak of every rank, found past the cap from the merged aggregates.
  zt::check::Options o;
  o.leaks = true;
  zt::check::Report rep;
  ASSERT_TRUE(zt::check::run_checks(merged, o, &rep).ok());
  ASSERT_EQ(rep.checks.size(), 1u);
  std::string all;
  for (auto& f : rep.checks[0].findings) all += f + "\n";
  EXPECT_EQ(rep.checks[0].outcome, zt::check::Outcome::Fail) << all;
  for (int r = 0; r < 8; ++r) EXPECT_NE(all.find("rank " + std::to_string(r)), std::string::npos) << r << ": " << all;
  EXPECT_NE(all.find("from the aggregates"), std::string::npos) << all;
}

// zt db top and zt export on a capped trace: what is held per epoch past the cap comes from
// epoch_live, said so (before: the allocation rows alone, which stop at the cap, showed no growth
// after it); the Chrome export keeps both layers (the memory counter goes on from step_memory
// past the cap, a slice marks the stretch, each epoch boundary's live set by site).
TEST(Aggregates, TopAndExportReadTheAggregatesPastTheCap) {
  zt::test::TempDir dir;
  int64_t empty_size = 0;
  {
    auto rec = open_recorder(dir.file("empty.db"));
    ASSERT_TRUE(rec->close().ok());
    empty_size = int64_t(std::filesystem::file_size(dir.file("empty.db")));
  }
  const std::string path = dir.file("capped.db");
  {
    auto rec = open_recorder(path, empty_size + empty_size / 2);
    Workload w(*rec);
    w.run(5, 12, 150, true);
    ASSERT_TRUE(rec->close().ok());
  }
  auto r = open_reader(path);
  TraceSummary::Detail detail;
  ASSERT_TRUE(r->summarize_detail(&detail).ok());
  ASSERT_TRUE(detail.t_end);
  ASSERT_GT(*detail.last_step, *detail.last_detail_step + 20) << "the cap should come in the first epoch";
  // zt db info's bytes per step: the transfers stop with the detail, so only its steps are counted.
  TraceSummary sum;
  ASSERT_TRUE(r->summarize(&sum).ok());
  ASSERT_EQ(sum.step_traffic.size(), 1u);
  EXPECT_EQ(sum.step_traffic[0].steps, detail.steps_with_detail);

  TopOptions o;
  o.when = TopWhen::Epochs;
  o.device = "cpu";
  std::vector<DeviceTop> top;
  ASSERT_TRUE(top_sites(*r, o, &top).ok());
  ASSERT_EQ(top.size(), 1u);
  EXPECT_NE(top[0].source.find("from the aggregates (epoch_live)"), std::string::npos) << top[0].source;
  EXPECT_NE(top[0].source.find("size cap"), std::string::npos) << top[0].source;
  EXPECT_EQ(top[0].epochs, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  const SiteBytes* leak = nullptr;
  for (auto& s : top[0].top)
    if (s.site.find("leak.py:12") != std::string::npos) leak = &s;
  ASSERT_NE(leak, nullptr) << "no site at leak.py:12";
  EXPECT_GE(leak->grew_per_epoch, double(6 << 20));
  EXPECT_EQ(leak->series.size(), 5u);

  o.when = TopWhen::End;
  ASSERT_TRUE(top_sites(*r, o, &top).ok());
  ASSERT_EQ(top.size(), 1u);
  EXPECT_NE(top[0].source.find("epoch 4's end"), std::string::npos) << top[0].source;
  EXPECT_GE(top[0].total, int64_t(5) * (14 << 20)) << "five epochs' leaks held at the end";

  // At the peak the detail is read, and the line says the detail stopped.
  o.when = TopWhen::Peak;
  o.device = "cuda:0";
  ASSERT_TRUE(top_sites(*r, o, &top).ok());
  ASSERT_EQ(top.size(), 1u);
  EXPECT_NE(top[0].source.find("the detail stopped"), std::string::npos) << top[0].source;
  EXPECT_FALSE(top[0].top.empty());

  const std::string json_path = dir.file("capped.json");
  ASSERT_TRUE(export_chrome(path, json_path).ok());
  nlohmann::json j;
  std::ifstream(json_path) >> j;
  double band_ts = -1;
  int counters_after = 0, live_sets = 0;
  bool leak_site = false;
  for (auto& e : j["traceEvents"])
    if (e["name"] == "aggregates only (per step)") band_ts = e["ts"].get<double>();
  ASSERT_GE(band_ts, 0) << "no aggregates-only slice";
  for (auto& e : j["traceEvents"]) {
    if (e["name"] == "memory cuda:0" && e["ts"].get<double>() > band_ts) ++counters_after;
    if (e.value("cat", "") == "aggregates" && e["ph"] == "i") {
      ++live_sets;
      for (auto& [site, bytes] : e["args"]["by_site"].items()) leak_site = leak_site || site.find("leak.py:12") != std::string::npos;
    }
  }
  EXPECT_GE(counters_after, 40) << "the memory counter should go on past the cap, a value each step";
  EXPECT_GE(live_sets, 10) << "each epoch's start and end on each device";
  EXPECT_TRUE(leak_site);
}
