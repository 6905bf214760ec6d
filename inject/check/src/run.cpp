// --run: how the run ended. A run that failed, died on a signal, was terminated or never closed
// its trace fails, whatever the other checks say: the memory of a run cut short proves nothing
// about the run that should have happened. The rules are in inject/check/README.md.
#include <algorithm>

#include "trace_data.h"
#include "zt/common/units.h"

namespace zt::check::detail {

std::string run_end_line(const db::RunRow& run) { return "run " + std::to_string(run.id) + " " + db::run_end_text(run); }

std::vector<std::string> error_lines(const TraceData& d, size_t most) {
  std::vector<std::string> lines;
  for (auto& e : d.errors) {
    if (lines.size() == most) {
      lines.push_back("... and " + std::to_string(d.errors.size() - most) + " more error rows");
      break;
    }
    std::string line = "error on " + d.who(e.rank);
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

// What was alive on the device of an out-of-memory error when it happened: the largest tensors
// (block rows; a device without any: its segments), each with the innermost frames of its stack.
// PyTorch's history (zt probe, zt import) keeps each block's Python line.
std::string alive_at_failure(TraceData& d, const db::ErrorRow& e, size_t top) {
  bool blocks = false;
  for (const Alloc& a : d.allocs) blocks = blocks || (a.device_id == e.device_id && a.level == db::AllocLevel::Block);
  const db::AllocLevel level = blocks ? db::AllocLevel::Block : db::AllocLevel::Segment;
  std::vector<const Alloc*> live;
  int64_t total = 0;
  for (const Alloc& a : d.allocs)
    if (a.device_id == e.device_id && a.level == level && a.alive_at(e.t)) {
      live.push_back(&a);
      total += a.bytes;
    }
  if (live.empty()) return "";
  std::stable_sort(live.begin(), live.end(), [](const Alloc* x, const Alloc* y) { return x->bytes > y->bytes; });
  std::string line = "alive on " + d.device_label(e.device_id) + " at the " + e.kind + ": " +
                     std::to_string(live.size()) + (blocks ? " tensors, " : " segments, ") +
                     format_bytes(double(total)) + "; the largest: ";
  for (size_t k = 0; k < live.size() && k < top; ++k) {
    const std::string& name = d.str(live[k]->name_id);
    line += (k ? ", " : "") + (name.empty() ? std::string("(unnamed)") : name) + " " +
            format_bytes(double(live[k]->bytes));
    if (std::string st = d.stack_brief(live[k]->stack_id); !st.empty()) line += " (at " + st + ")";
  }
  return line;
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
  std::vector<std::string> terminated_workers;
  for (auto& run : d.runs) {
    const bool ok = run.status == db::RunStatus::Ok && (!run.exit_code || *run.exit_code == 0);
    // A forked worker ended by SIGTERM is how a pool ends its workers (multiprocessing's
    // terminate(), a DataLoader's shutdown of a worker that did not stop): said, not a failure. Its
    // rank's own run says whether the job ended ok.
    const db::RankRow* worker = nullptr;
    for (auto& rk : d.ranks)
      if (rk.run_id == run.id && rk.role == db::RankRole::Worker) worker = &rk;
    if (!ok && worker && run.status == db::RunStatus::Signal && run.exit_detail.rfind("killed by SIGTERM", 0) == 0) {
      terminated_workers.push_back(d.who(worker->rank) + " (run " + std::to_string(run.id) + ")");
      ++ended_ok;
      continue;
    }
    if (ok) ++ended_ok;
    else r.findings.push_back(run_end_line(run));
  }
  if (!terminated_workers.empty()) {
    std::string line = "ended by SIGTERM, as a pool ends its workers (not counted as a failure): ";
    for (size_t i = 0; i < terminated_workers.size(); ++i)
      line += (i ? ", " : "") + terminated_workers[i];
    r.context.push_back(line);
  }
  const std::string of = d.runs.size() == 1 ? "the run" : std::to_string(d.runs.size()) + " runs";
  if (r.findings.empty()) {
    r.summary = d.runs.size() == 1 ? "the run ended ok" : "all " + of + " ended ok";
    if (!terminated_workers.empty())
      r.summary += " (" + std::to_string(terminated_workers.size()) + " forked worker" +
                   (terminated_workers.size() == 1 ? "" : "s") + " ended by SIGTERM)";
    return Status::Ok();
  }
  r.outcome = Outcome::Fail;
  r.summary = d.runs.size() == 1 ? "the run did not end ok"
                                 : std::to_string(d.runs.size() - size_t(ended_ok)) + " of " + of + " did not end ok";
  for (std::string& line : error_lines(d, 3)) r.context.push_back(std::move(line));
  size_t shown = 0;
  for (auto& e : d.errors)
    if ((e.kind == "oom" || e.kind == "host_oom") && e.device_id && shown < 3)
      if (std::string line = alive_at_failure(d, e, 3); !line.empty()) {
        r.context.push_back(line);
        ++shown;
      }
  return Status::Ok();
}

}  // namespace zt::check::detail
