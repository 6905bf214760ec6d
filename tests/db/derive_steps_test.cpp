// Steps, epochs and phases of programs that say them only as ranges (zt/db/derive_steps.h):
// DeepSpeed's own NVTX ranges (a cut of a real trace), the NVTX convention, the user's patterns,
// the bootstrap's framework hooks and the zerotrace module, in their order of precedence.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <fstream>
#include <map>
#include <sstream>

#include "../test_util.h"
#include "zt/db/derive_steps.h"
#include "zt/db/trace_reader.h"
#include "zt/db/trace_writer.h"

using namespace zt::db;

namespace {

struct Trace {
  zt::test::TempDir dir;
  std::string path = dir.file("t.db");

  std::vector<std::vector<std::string>> rows(const std::string& sql) {
    std::unique_ptr<TraceReader> r;
    zt::Status s = TraceReader::open(path, &r);
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s) return {};
    QueryResult q;
    s = r->query(sql, &q);
    EXPECT_TRUE(s.ok()) << s.message();
    return q.rows;
  }
  std::string cell(const std::string& sql) {
    auto v = rows(sql);
    return v.empty() || v[0].empty() ? "(none)" : v[0][0];
  }
  DerivedMarkers derive(const StepRules& rules = {}) {
    DerivedMarkers d;
    zt::Status s = derive_steps(path, rules, &d);
    EXPECT_TRUE(s.ok()) << s.message();
    return d;
  }
};

// A trace of range markers: (name, t_start, t_end) on rank 0; t_end < 0 leaves it open.
struct RangeSpec {
  std::string name;
  int64_t t0, t1;
};
void write_ranges(const std::string& path, const std::vector<RangeSpec>& ranges, RunStatus status = RunStatus::Ok,
                  const std::vector<MarkerRow>& own = {}) {
  std::unique_ptr<TraceWriter> w;
  ASSERT_TRUE(TraceWriter::create(path, &w).ok());
  w->begin();
  RunRow run;
  run.id = 1, run.command_line = "python3 loop.py", run.t_start = 0, run.status = status;
  if (status == RunStatus::Ok) run.exit_code = 0;
  w->insert(run);
  w->insert(RankRow{0, 1, 1, 0, "h", 1});
  std::map<std::string, int64_t> ids;
  int64_t id = 1;
  for (auto& r : ranges) {
    auto [it, fresh] = ids.try_emplace(r.name, int64_t(ids.size() + 1));
    if (fresh) w->insert(StringRow{it->second, r.name});
    MarkerRow m;
    m.id = id++, m.rank = 0, m.kind = MarkerKind::Range, m.name_id = it->second, m.t_start = r.t0;
    if (r.t1 >= 0) m.t_end = r.t1;
    w->insert(m);
  }
  for (MarkerRow m : own) {
    m.id = id++;
    w->insert(m);
  }
  w->commit();
  ASSERT_TRUE(w->finish().ok());
}

std::string read_file(const std::string& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

// The DeepSpeed fixture (tests/data/deepspeed_zero3_offload_steps.sql, rows of a real zt probe
// trace of DeepSpeed 0.19.8 ZeRO-3 offload): four optimizer steps, one warm-up and three timed,
// each from its engine's forward to its optimizer's step's end, with DeepSpeed's phases inside.
TEST(DeriveSteps, DeepSpeedsFourOptimizerStepsWithTheirPhases) {
  Trace t;
  {
    std::unique_ptr<TraceWriter> w;
    ASSERT_TRUE(TraceWriter::create(t.path, &w).ok());
    const std::string sql = read_file(std::string(ZT_SOURCE_DIR) + "/tests/data/deepspeed_zero3_offload_steps.sql");
    ASSERT_FALSE(sql.empty());
    ASSERT_EQ(sqlite3_exec(w->handle(), sql.c_str(), nullptr, nullptr, nullptr), 0);
    ASSERT_TRUE(w->finish().ok());
  }
  ASSERT_EQ(t.cell("SELECT count(*) FROM marker WHERE kind IN (0, 2, 3)"), "0");  // as recorded: no steps
  DerivedMarkers d = t.derive();
  EXPECT_EQ(d.steps, 4);
  EXPECT_EQ(d.epochs, 0);
  EXPECT_EQ(d.steps_from, "DeepSpeed's ranges");
  EXPECT_EQ(describe(d), "4 steps (from DeepSpeed's ranges), 0 epochs");
  // Each step: from its DeepSpeedEngine.forward's start to its optimizer step's end.
  auto steps = t.rows(
      "SELECT m.step, m.t_start = (SELECT min(f.t_start) FROM marker_v f WHERE f.name = 'DeepSpeedEngine.forward' AND "
      "f.t_start >= m.t_start), m.t_end = (SELECT max(o.t_end) FROM marker_v o WHERE o.name = "
      "'DeepSpeedZeroOptimizer_Stage3.step' AND o.t_end <= m.t_end), name FROM marker_v m WHERE kind = 'step' ORDER BY step");
  ASSERT_EQ(steps.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(steps[i][0], std::to_string(i));
    EXPECT_EQ(steps[i][1], "1") << "step " << i << " begins at its forward";
    EXPECT_EQ(steps[i][2], "1") << "step " << i << " ends with its optimizer step";
    EXPECT_EQ(steps[i][3], "step " + std::to_string(i));
  }
  // DeepSpeed's phases, named as zt train names its own, each inside its step.
  auto phases = t.rows(
      "SELECT p.name, group_concat(p.step, ',') FROM (SELECT * FROM marker_v WHERE kind = 'phase' ORDER BY t_start) p "
      "GROUP BY p.name ORDER BY p.name");
  std::map<std::string, std::string> by_name;
  for (auto& r : phases) by_name[r[0]] = r[1];
  EXPECT_EQ(by_name.size(), 5u);
  for (const char* n : {"forward", "backward", "allreduce_gradients", "optimizer", "unscale_and_clip_grads"})
    EXPECT_EQ(by_name[n], "0,1,2,3") << n;
  EXPECT_EQ(t.cell("SELECT count(*) FROM marker_v p JOIN marker_v s ON s.kind = 'step' AND s.step = p.step WHERE "
                   "p.kind = 'phase' AND (p.t_start < s.t_start OR p.t_end > s.t_end)"),
            "0");
  // The readers see them: zt db info's counts.
  std::unique_ptr<TraceReader> r;
  ASSERT_TRUE(TraceReader::open(t.path, &r).ok());
  TraceSummary sum;
  ASSERT_TRUE(r->summarize(&sum).ok());
  EXPECT_EQ(sum.steps, 4);
  r.reset();
  // Deriving again replaces what was derived (nothing doubles) and the ranges stay.
  const std::string markers = t.cell("SELECT count(*) FROM marker");
  d = t.derive();
  EXPECT_EQ(d.steps, 4);
  EXPECT_EQ(t.cell("SELECT count(*) FROM marker"), markers);
  EXPECT_EQ(t.cell("SELECT count(*) FROM marker WHERE kind = 4"), "34");
}

// The NVTX convention: "epoch N" and "step N" ranges; a step belongs to the epoch around it.
// It outranks the zerotrace module's ranges of the same program.
TEST(DeriveSteps, TheConventionGivesEpochsAndStepsAndOutranksTheModule) {
  Trace t;
  std::vector<RangeSpec> r;
  for (int e = 0; e < 3; ++e) {
    r.push_back({"epoch " + std::to_string(e), 1000 * e, 1000 * e + 900});
    for (int s = 0; s < 2; ++s) {
      const int n = 2 * e + s;
      r.push_back({"step " + std::to_string(n), 1000 * e + 100 + 400 * s, 1000 * e + 400 + 400 * s});
      r.push_back({"zerotrace::step " + std::to_string(100 + n), 1000 * e + 110 + 400 * s, 1000 * e + 390 + 400 * s});
      r.push_back({"zerotrace::loss", 1000 * e + 120 + 400 * s, 1000 * e + 130 + 400 * s});
    }
  }
  r.push_back({"cudaLaunchKernel", 150, 151});
  write_ranges(t.path, r);
  DerivedMarkers d = t.derive();
  EXPECT_EQ(d.steps, 6);
  EXPECT_EQ(d.epochs, 3);
  EXPECT_EQ(d.steps_from, "NVTX ranges 'step N'");
  EXPECT_EQ(d.epochs_from, "NVTX ranges 'epoch N'");
  EXPECT_EQ(t.cell("SELECT group_concat(step || '@' || epoch, ' ') FROM (SELECT * FROM marker_v WHERE kind = 'step' "
                   "ORDER BY t_start)"),
            "0@0 1@0 2@1 3@1 4@2 5@2");
  // The module's other ranges are phases, placed in their step and epoch.
  EXPECT_EQ(t.cell("SELECT group_concat(name || ':' || step || '@' || epoch, ' ') FROM (SELECT * FROM marker_v "
                   "WHERE kind = 'phase' ORDER BY t_start)"),
            "loss:0@0 loss:1@0 loss:2@1 loss:3@1 loss:4@2 loss:5@2");
}

// The user's words first: a name (here with no number: steps counted 0, 1, ...) and a regex.
TEST(DeriveSteps, TheUsersPatternsOutrankEverythingAndUnknownNamesAreSaid) {
  Trace t;
  std::vector<RangeSpec> r;
  for (int s = 0; s < 4; ++s) {
    r.push_back({"train_iteration", 100 * s, 100 * s + 90});
    r.push_back({"step " + std::to_string(50 + s), 100 * s + 10, 100 * s + 80});
  }
  r.push_back({"my.domain::pass 7", 0, 150});
  r.push_back({"my.domain::pass 8", 200, 390});
  write_ranges(t.path, r);
  StepRules rules;
  rules.step_range = "train_iteration";
  rules.epoch_range = "pass [0-9]+";  // matched without its domain
  DerivedMarkers d = t.derive(rules);
  EXPECT_EQ(d.steps_from, "--step-range 'train_iteration'");
  EXPECT_EQ(d.epochs_from, "--epoch-range 'pass [0-9]+'");
  EXPECT_EQ(t.cell("SELECT group_concat(step || '@' || epoch, ' ') FROM (SELECT * FROM marker_v WHERE kind = 'step' "
                   "ORDER BY t_start)"),
            "0@7 1@7 2@8 3@8");
  EXPECT_TRUE(d.notes.empty());
  // The patterns are kept in the trace: deriving again without any uses them.
  d = t.derive();
  EXPECT_EQ(d.steps_from, "--step-range 'train_iteration'");

  // A name the trace does not have is said, with the names it has; the next source serves.
  rules.step_range = "optimizer_step";
  rules.epoch_range = "";
  d = t.derive(rules);
  ASSERT_EQ(d.notes.size(), 1u);
  EXPECT_EQ(d.notes[0],
            "--step-range 'optimizer_step' matched no range in the trace (its most frequent: 'train_iteration', "
            "'my.domain::pass 7', 'my.domain::pass 8', 'step 50', 'step 51')");
  EXPECT_EQ(d.steps_from, "NVTX ranges 'step N'");
  EXPECT_EQ(t.cell("SELECT group_concat(step, ' ') FROM marker WHERE kind = 0"), "50 51 52 53");
}

TEST(DeriveSteps, AMalformedPatternIsRefusedAndNothingIsWritten) {
  Trace t;
  write_ranges(t.path, {{"step 0", 0, 10}});
  StepRules rules;
  rules.step_range = "step (";
  DerivedMarkers d;
  zt::Status s = derive_steps(t.path, rules, &d);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("--step-range 'step (': not a regular expression (", 0), 0u) << s.message();
  EXPECT_EQ(t.cell("SELECT count(*) FROM marker WHERE kind = 0"), "0");
  EXPECT_FALSE(check_range_pattern("[", "--epoch-range").ok());
  EXPECT_TRUE(check_range_pattern("DeepSpeedZeroOptimizer_Stage3.step", "--step-range").ok());
}

// A trace without ranges (CUDA tracing off, no zerotrace module): the pattern's note says why.
TEST(DeriveSteps, APatternOnATraceWithoutRangesSaysWhy) {
  Trace t;
  write_ranges(t.path, {});
  StepRules rules;
  rules.epoch_range = "epoch";
  DerivedMarkers d = t.derive(rules);
  ASSERT_EQ(d.notes.size(), 1u);
  EXPECT_EQ(d.notes[0], "--epoch-range 'epoch' matched no range in the trace (it has no ranges: NVTX ranges reach "
                        "the trace only when CUDA tracing is on)");
  EXPECT_EQ(describe(d), "0 steps, 0 epochs");
}

// The bootstrap's HF Trainer ranges (source 3) outrank the zerotrace module (4); the module
// alone gives both.
TEST(DeriveSteps, FrameworkHooksOutrankTheModuleWhichServesAlone) {
  Trace t;
  write_ranges(t.path, {{"zerotrace.transformers::epoch 0", 0, 1000},
                        {"zerotrace.transformers::step 0", 10, 400},
                        {"zerotrace.transformers::step 1", 500, 900},
                        {"zerotrace::epoch 5", 0, 1000},
                        {"zerotrace::step 9", 20, 300}});
  DerivedMarkers d = t.derive();
  EXPECT_EQ(d.steps_from, "transformers.Trainer's callbacks");
  EXPECT_EQ(d.epochs_from, "transformers.Trainer's callbacks");
  EXPECT_EQ(t.cell("SELECT group_concat(step || '@' || epoch, ' ') FROM marker WHERE kind = 0"), "0@0 1@0");

  Trace m;
  write_ranges(m.path, {{"zerotrace::epoch 1", 0, 1000}, {"zerotrace::step 3", 20, 300}, {"zerotrace::step 4", 400, -1}},
               RunStatus::Failed);
  d = m.derive();
  EXPECT_EQ(d.steps_from, "the zerotrace module");
  EXPECT_EQ(d.epochs_from, "the zerotrace module");
  // A step that never ended stays so (the run died in it).
  EXPECT_EQ(m.cell("SELECT group_concat(step || '@' || epoch || ':' || coalesce(t_end, 'open'), ' ') FROM marker "
                   "WHERE kind = 0"),
            "3@1:300 4@1:open");
}

// A plain PyTorch loop's optimizer steps (the bootstrap's torch.optim hook) are its steps, with no
// epochs, and the last source: the zerotrace module's, a Trainer's and the convention's come first.
TEST(DeriveSteps, OptimizerStepsServeAPlainLoopAndAreTheLastSource) {
  Trace t;
  write_ranges(t.path, {{"zerotrace.torch::optimizer step", 100, 150}, {"zerotrace.torch::optimizer step", 300, 350},
                        {"zerotrace.torch::optimizer step", 500, 550}});
  DerivedMarkers d = t.derive();
  EXPECT_EQ(d.steps_from, "PyTorch's optimizer steps");
  EXPECT_EQ(d.epochs, 0);
  EXPECT_EQ(t.cell("SELECT group_concat(step || ':' || t_start || '-' || t_end, ' ') FROM marker WHERE kind = 0"),
            "0:100-150 1:300-350 2:500-550");
  EXPECT_EQ(range_label("zerotrace.torch::optimizer step"), "PyTorch optimizer step");

  for (const char* other : {"zerotrace::step 7", "zerotrace.transformers::step 7", "step 7"}) {
    Trace both;
    write_ranges(both.path, {{"zerotrace.torch::optimizer step", 100, 150}, {other, 90, 160}});
    d = both.derive();
    EXPECT_NE(d.steps_from, "PyTorch's optimizer steps") << other;
    EXPECT_EQ(both.cell("SELECT group_concat(step, ' ') FROM marker WHERE kind = 0"), "7") << other;
  }
}

// A program that writes its own step markers (zt train) keeps them; nothing is derived.
TEST(DeriveSteps, AProgramsOwnMarkersStand) {
  Trace t;
  MarkerRow own;
  own.rank = 0, own.kind = MarkerKind::Step, own.t_start = 0, own.t_end = 100, own.step = 0;
  write_ranges(t.path, {{"step 7", 0, 100}, {"epoch 1", 0, 200}}, RunStatus::Ok, {own});
  DerivedMarkers d = t.derive();
  EXPECT_TRUE(d.own_steps);
  EXPECT_EQ(d.steps, 0);
  EXPECT_EQ(d.epochs, 1);
  EXPECT_EQ(describe(d), "0 steps (the program's own), 1 epoch (from NVTX ranges 'epoch N')");
  EXPECT_EQ(t.cell("SELECT group_concat(step || '@' || coalesce(epoch, '-'), ' ') FROM marker WHERE kind = 0"), "0@-");
}

// DeepSpeed forward/backward after the last optimizer step: a step that never ended where the
// run died, an evaluation (not a step) where it ended well.
TEST(DeriveSteps, DeepSpeedsUnfinishedStepOnlyWhereTheRunDied) {
  const std::vector<RangeSpec> r{{"DeepSpeedEngine.forward", 0, 10},
                                 {"DeepSpeedEngine.backward", 12, 20},
                                 {"DeepSpeedZeroOptimizer_Stage3.step", 21, 30},
                                 {"DeepSpeedEngine.forward", 40, 50}};
  Trace died;
  write_ranges(died.path, r, RunStatus::Failed);
  EXPECT_EQ(died.derive().steps, 2);
  EXPECT_EQ(died.cell("SELECT coalesce(t_end, 'open') FROM marker WHERE kind = 0 AND step = 1"), "open");
  Trace ok;
  write_ranges(ok.path, r, RunStatus::Ok);
  EXPECT_EQ(ok.derive().steps, 1);
}

// The same derivation without writing (zt check on a trace whose probe was killed before it
// derived them): the rows derive_steps would write, the file untouched; after derive_steps has
// written them, deriving in memory again does not take them for the program's own.
TEST(DeriveSteps, InMemoryGivesTheSameRowsAndWritesNothing) {
  Trace t;
  std::vector<RangeSpec> r;
  for (int e = 0; e < 2; ++e) {
    r.push_back({"zerotrace::epoch " + std::to_string(e), 1000 * e, 1000 * e + 900});
    for (int s = 0; s < 2; ++s)
      r.push_back({"zerotrace::step " + std::to_string(2 * e + s), 1000 * e + 100 + 400 * s, 1000 * e + 400 + 400 * s});
  }
  write_ranges(t.path, r, RunStatus::Running);
  auto in_memory = [&](DerivedMarkers* d) {
    std::unique_ptr<TraceReader> reader;
    EXPECT_TRUE(TraceReader::open(t.path, &reader).ok());
    std::vector<DerivedMarker> rows;
    EXPECT_TRUE(derive_steps_in_memory(*reader, {}, d, &rows).ok());
    std::string text;
    for (auto& m : rows)
      text += (text.empty() ? "" : " ") + m.name + "@" + std::to_string(m.t_start) + ":" +
              (m.epoch ? std::to_string(*m.epoch) : "-");
    return text;
  };
  DerivedMarkers d;
  const std::string rows = in_memory(&d);
  EXPECT_EQ(rows, "epoch 0@0:0 epoch 1@1000:1 step 0@100:0 step 1@500:0 step 2@1100:1 step 3@1500:1");
  EXPECT_EQ(d.steps, 4);
  EXPECT_EQ(d.epochs, 2);
  EXPECT_EQ(d.steps_from, "the zerotrace module");
  EXPECT_FALSE(d.own_steps);
  EXPECT_EQ(t.cell("SELECT count(*) FROM marker WHERE kind <> 4"), "0");  // nothing written
  EXPECT_EQ(t.cell("SELECT count(*) FROM meta WHERE key = 'derived_markers'"), "0");

  DerivedMarkers written = t.derive();
  EXPECT_EQ(written.steps, 4);
  EXPECT_EQ(t.cell("SELECT count(*) FROM marker WHERE kind IN (0, 2)"), "6");
  DerivedMarkers again;
  EXPECT_EQ(in_memory(&again), rows);
  EXPECT_FALSE(again.own_steps);
  EXPECT_FALSE(again.own_epochs);
}

// A trace is untrusted input: a range name of 100,000 digits after "step " overflowed std::regex's
// stack (a crash of zt probe, zt db steps and zt check). It serves no source now; the others still do.
TEST(DeriveSteps, AHugeRangeNameServesNoSourceAndDoesNotCrash) {
  Trace t;
  write_ranges(t.path, {{"step " + std::string(100000, '1'), 0, 50}, {"zerotrace::step 0", 100, 190},
                        {"zerotrace::step 1", 200, 290}});
  DerivedMarkers d = t.derive();
  EXPECT_EQ(d.steps, 2);
  EXPECT_EQ(d.steps_from, "the zerotrace module");
}
