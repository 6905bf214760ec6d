// zt/repro/runner.h: `zt repro`: run a scenario with its faults, then with its fix, each
// into its own trace, and judge both from the traces.
//
// Owns: the two runs (bug.db, fix.db in the keep directory, ready for `zt view`), their
// progress lines, the verdict (REPRODUCED / NOT REPRODUCED / INCONCLUSIVE, and whether the
// fix cured it), its text and its JSON (written atomically: temp file, fsync, rename).
// May call: the trainer (train, load_corpus, plan_data), the probe's Recorder, the trace
// reader, the failpoint registry (through the trainer). Called by cli/repro_command.cpp and
// the tests.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zt/common/status.h"
#include "zt/repro/scenario.h"
#include "zt/repro/verdict.h"

namespace zt::repro {

struct RunOptions {
  Variant variant = Variant::Small;
  std::string keep_dir;             // empty: ./zt-repro-<scenario>
  std::optional<uint64_t> seed;     // replaces the scenario's
  std::ostream* progress = nullptr; // progress lines (null: none)
  int max_step_lines = 6;           // per run: the first few step lines, then one per ~tenth, then the last
  bool crash_handlers = true;       // the recorder's (off in tests that run many scenarios in one process)
  std::string command_line = "zt repro";
};

struct RunRecord {
  std::string label;      // "bug", "fix"
  std::string trace;      // its path
  std::string summary;    // one line: what this run is (stage, offload, faults, memory)
  Status status;          // what train() returned
  double seconds = 0;
  trainer::TrainConfig config;
  RunJudgement judgement;
};

struct ReproResult {
  std::string scenario, scenario_path, report_id, report_title;
  std::vector<std::string> report_sources;  // where the report came from (a seed article's file, URLs)
  Variant variant = Variant::Small;
  uint64_t seed = 0;
  std::string keep_dir;
  RunRecord bug, fix;
  std::string fix_description, fix_quote;
  Outcome reproduced = Outcome::Unknown;  // the bug run's
  Outcome cured = Outcome::Unknown;       // the fix run's
  int64_t expected_steps = -1;            // steps_lost scenarios: max_epochs over the full data
  std::string verdict;                    // REPRODUCED / NOT REPRODUCED / DIFFERENT FAILURE / INCONCLUSIVE
  int exit_code() const { return reproduced == Outcome::Valid && cured == Outcome::Valid ? 0 : 1; }
};

// Runs both runs. A Status error only for what stops the runs from starting at all (bad
// scenario values, a keep directory that cannot be written); a run that fails is a result.
Status run_scenario(const Scenario& s, const RunOptions& o, ReproResult* out);

// The verdict for people: the verdict word, the evidence from the trace, the fix.
void print_verdict(const ReproResult& r, std::ostream& out);
nlohmann::json to_json(const ReproResult& r);
// Writes `j` to `path` atomically (a reader sees the old file or the whole new one).
Status write_json_atomic(const std::string& path, const nlohmann::json& j);

// The optimizer steps `cfg` would run over its full data by epochs (no faults): what
// `steps_lost` compares with. -1 when it cannot be told (no epochs given).
int64_t full_data_steps(const trainer::TrainConfig& cfg, std::string* why = nullptr);

}  // namespace zt::repro
