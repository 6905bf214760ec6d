// --run: how the run ended. A run that failed, died on a signal, was terminated or never closed
// its trace fails, whatever the other checks say: the memory of a run cut short proves nothing
// about the run that should have happened. The rules are in inject/check/README.md.
#include "trace_data.h"

namespace zt::check::detail {

std::string run_end_line(const db::RunRow& run) { return "run " + std::to_string(run.id) + " " + db::run_end_text(run); }

std::vector<std::string> error_lines(const TraceData& d, size_t most) {
  std::vector<std::string> lines;
  for (auto& e : d.errors) {
    if (lines.size() == most) {
      lines.push_back("... and " + std::to_string(d.errors.size() - most) + " more error rows");
      break;
    }
    std::string line = "error on rank " + std::to_string(e.rank);
    if (e.step) {
      line += " at step " + std::to_string(*e.step);
    } else if (auto it = d.steps.find(e.rank); it != d.steps.end()) {
      // Rows an allocator wrote (oom, host_oom) know no step: the rank's step under way then.
      for (const Span& s : it->second)
        if (s.t_start <= e.t && e.t <= s.t_end) {
          line += " during step " + std::to_string(s.index);
          break;
        }
    }
    if (!e.site.empty()) line += " in " + e.site;
    line += ": " + e.kind + ": " + e.message;
    lines.push_back(std::move(line));
  }
  return lines;
}

Status check_run(TraceData& d, CheckResult* out) {
  CheckResult& r = *out;
  r.name = "run";
  if (d.runs.empty()) {
    // Every run writes its row into the trace file at its start: a trace without one is not a
    // record of a run that can pass (an empty run table, or a file copied from a live run's
    // before that row reached it).
    r.outcome = Outcome::Fail;
    r.summary = "the trace has no run row: it cannot say what ran or how it ended";
    return Status::Ok();
  }
  int ended_ok = 0;
  for (auto& run : d.runs) {
    const bool ok = run.status == db::RunStatus::Ok && (!run.exit_code || *run.exit_code == 0);
    if (ok) ++ended_ok;
    else r.findings.push_back(run_end_line(run));
  }
  const std::string of = d.runs.size() == 1 ? "the run" : std::to_string(d.runs.size()) + " runs";
  if (r.findings.empty()) {
    r.summary = d.runs.size() == 1 ? "the run ended ok" : "all " + of + " ended ok";
    return Status::Ok();
  }
  r.outcome = Outcome::Fail;
  r.summary = d.runs.size() == 1 ? "the run did not end ok"
                                 : std::to_string(d.runs.size() - size_t(ended_ok)) + " of " + of + " did not end ok";
  r.context = error_lines(d, 3);
  return Status::Ok();
}

}  // namespace zt::check::detail
