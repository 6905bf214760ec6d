// zt/check/check.h: pass/fail checks on a trace, for CI (`zt check`).
//
// Owns: the rules that turn one trace into verdicts (how the run ended, leaks across epochs,
// tensors on the wrong device, peak memory over a budget, steps run against the plan), their text report
// and their JUnit XML. May call: db/ (TraceReader, read-only) and common/. It reads traces
// and nothing else: it never runs a trainer and never writes a trace.
//
// Errors: run_checks() returns a failed Status only for bad input (missing, corrupt or
// unreadable trace), with one line naming the file and the problem; a check that finds
// something is a Report with a failed check, not an error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zt/common/status.h"

namespace zt::check {

// Peak-memory limits, from "cuda=70GiB,host=900GiB" (either key may be left out).
struct Budget {
  std::optional<int64_t> cuda;  // each accelerator device (cuda or simulated GPU), peak allocated
  std::optional<int64_t> host;  // each host machine (all its ranks' host buffers together), peak allocated
};

// Parses "cuda=70GiB,host=900GiB". Keys: cuda (also gpu), host (also cpu); sizes as
// parse_bytes reads them. A bad item fails with a line naming it:
// "--budget: 'cuda=70XB': '70XB' is not a size (try 70GiB)".
Status parse_budget(const std::string& text, Budget* out);

inline constexpr int64_t kLeakThresholdMax = 512 << 10;  // the default threshold of a large memory
inline constexpr int64_t kLeakThresholdMin = 64 << 10;   // ... and of a small one (1% below it)
// RSS growth per epoch (or window) that the recorded allocations do not explain and that counts as a
// leak (probed traces): above the allocator's and the interpreter's own drift in a clean job
// (inject/check/README.md says why 4 MiB).
inline constexpr int64_t kRssThresholdDefault = 4 << 20;

struct Options {
  bool run = false;                      // how the run ended: failed, killed or never closed is a failure
  bool leaks = false;
  bool placement = false;
  bool steps = false;                    // steps run vs expected_steps, else vs the plan in the trace
  std::optional<int64_t> expected_steps;  // --steps N (runs the steps check too)
  std::optional<Budget> budget;          // --budget: runs the budget check
  // Growth per epoch that counts as a leak (bytes); 0: per memory, kLeakThresholdMax or 1% of the
  // memory at the first compared epoch when that is smaller, but not below kLeakThresholdMin.
  int64_t leak_threshold = 0;
  // --leaks on a probed trace: RSS growth per epoch (or window) beyond what the recorded host
  // allocations explain that counts as a leak; 0: kRssThresholdDefault.
  int64_t rss_threshold = 0;

  // No check chosen: run, leaks, placement and steps against the plan.
  bool none_chosen() const { return !run && !leaks && !placement && !steps && !expected_steps && !budget; }
};

// Skip: a check of the default set that cannot run on this trace (it says why). CannotRun: the same
// for a check named on the command line: not a pass (zt check exits 1), with the reason and what
// the check needs.
enum class Outcome { Pass, Fail, Skip, CannotRun };
const char* to_string(Outcome);

struct CheckResult {
  std::string name;                   // "run", "leaks", "placement", "budget", "steps"
  Outcome outcome = Outcome::Pass;
  std::string summary;                // one line: what was checked, or why it failed / was skipped
  std::vector<std::string> findings;  // one line each, with the evidence
  std::vector<std::string> context;   // lines that explain the findings (how the run ended, data accounting)
  double seconds = 0;
};

struct Report {
  std::string trace;
  std::vector<CheckResult> checks;
  bool failed() const;  // a check failed or, named on the command line, could not run
  int count(Outcome) const;
};

// Opens `trace_path` read-only and runs the chosen checks (Options::none_chosen(): the default set).
// A chosen check that cannot run is CannotRun; in the default set it is Skip.
Status run_checks(const std::string& trace_path, const Options& options, Report* out);

// The report as the terminal shows it: a line per check, a line per finding, a summary line.
std::string format_text(const Report& report);

// JUnit XML: testsuite "zt check", a testcase per check, <failure message=...> with the
// findings, <skipped> for a check of the default set that could not run, <error type="cannot run">
// for a check named on the command line that could not.
std::string junit_xml(const Report& report);
// A JUnit file for a trace that could not be read at all: one testcase "trace" with <error>.
std::string junit_xml_error(const std::string& trace_path, const std::string& message);

// Writes `text` to `path` atomically (a temporary file beside it, fsync, rename): readers
// never see half a file, and a failure leaves any existing file as it was.
Status write_file_atomic(const std::string& path, const std::string& text);

}  // namespace zt::check
