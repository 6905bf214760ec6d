// Evidence from a trace, and the judgement of a run against a scenario's expectation.
#include "zt/repro/verdict.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>

#include "pattern.h"
#include "zt/common/units.h"
#include "zt/db/trace_reader.h"

namespace zt::repro {

namespace {

using nlohmann::json;

std::string sql_int(int64_t v) { return std::to_string(v); }

// First cell of the first row, when there is one and it is not NULL.
std::optional<std::string> cell(db::TraceReader& r, const std::string& sql) {
  db::QueryResult q;
  if (!r.query(sql, &q) || q.rows.empty() || q.rows[0].empty() || q.rows[0][0] == "NULL") return std::nullopt;
  return q.rows[0][0];
}
std::optional<int64_t> cell_int(db::TraceReader& r, const std::string& sql) {
  auto c = cell(r, sql);
  if (!c) return std::nullopt;
  try {
    return int64_t(std::stod(*c));
  } catch (...) {
    return std::nullopt;
  }
}

const char* run_status_name(db::RunStatus s) {
  switch (s) {
    case db::RunStatus::Running: return "running";
    case db::RunStatus::Ok: return "ok";
    case db::RunStatus::Failed: return "failed";
    case db::RunStatus::Signal: return "signal";
    case db::RunStatus::Terminated: return "terminated";
  }
  return "unknown";
}

const char* memory_kind_name(int k) {
  switch (k) {
    case 1: return "device";
    case 2: return "pinned_host";
    case 3: return "pageable_host";
    case 4: return "managed";
  }
  return "unknown";
}

std::vector<std::string> tensor_names(const std::string& text) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  try {
    json j = json::parse(text);
    if (j.is_array())
      for (auto& x : j)
        if (x.is_string()) out.push_back(x.get<std::string>());
  } catch (...) {
    out.push_back(text);
  }
  return out;
}

bool search(const std::string& re, const std::string& text) { return pattern_search(re, text); }

std::string quote(const std::string& s, size_t max = 160) {
  if (s.size() <= max) return "\"" + s + "\"";
  return "\"" + s.substr(0, max) + "...\"";
}

// The size written right after `marker` in an error message ("Tried to allocate 3.39 GiB.",
// "of which 2.01 GiB is free", "tried to pin 32.00 GiB for"): PyTorch's "N bytes" too.
std::optional<int64_t> size_after(const std::string& message, const std::string& marker) {
  const size_t at = message.find(marker);
  if (at == std::string::npos) return std::nullopt;
  size_t i = at + marker.size(), j = i;
  while (j < message.size() && (std::isdigit(static_cast<unsigned char>(message[j])) || message[j] == '.')) ++j;
  if (j == i) return std::nullopt;
  std::string number = message.substr(i, j - i);
  if (number.back() == '.') number.pop_back();  // "512." ends a sentence
  size_t k = j;
  while (k < message.size() && message[k] == ' ') ++k;
  size_t u = k;
  while (u < message.size() && std::isalpha(static_cast<unsigned char>(message[u]))) ++u;
  std::string unit = message.substr(k, u - k);
  if (unit == "bytes" || unit == "byte") unit = "B";
  std::string why;
  return parse_size_i64(number + unit, &why);
}

std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", x * 100);
  return buf;
}

}  // namespace

std::optional<int64_t> predicted_figure(const Evidence& e, const std::string& name) {
  if (name == "tried_to_allocate") return e.error_tried_bytes;
  if (name == "already_allocated") return e.device_allocated;
  if (name == "reserved") return e.device_reserved;
  if (name == "capacity") return e.device_capacity;
  if (name == "free") return e.error_free_bytes;
  if (name == "host_rss") return e.host_live;
  return std::nullopt;
}

const char* outcome_name(Outcome o) {
  return o == Outcome::Valid ? "valid" : o == Outcome::Invalid ? "invalid" : "unknown";
}

Outcome compose(const std::vector<Outcome>& parts) {
  bool unknown = false;
  for (Outcome o : parts) {
    if (o == Outcome::Invalid) return Outcome::Invalid;
    if (o == Outcome::Unknown) unknown = true;
  }
  return unknown ? Outcome::Unknown : Outcome::Valid;
}

std::string verdict_word(Outcome o) {
  return o == Outcome::Valid ? "REPRODUCED" : o == Outcome::Invalid ? "NOT REPRODUCED" : "INCONCLUSIVE";
}
std::string verdict_word(const RunJudgement& j) {
  return j.different_failure ? "DIFFERENT FAILURE" : verdict_word(j.outcome);
}
std::string cure_word(Outcome o) {
  return o == Outcome::Valid ? "CURED" : o == Outcome::Invalid ? "NOT CURED" : "INCONCLUSIVE";
}

Evidence read_evidence(const std::string& trace, const std::string& expected_kind) {
  Evidence e;
  e.trace = trace;
  std::unique_ptr<db::TraceReader> rd;
  if (Status s = db::TraceReader::open(trace, &rd); !s) {
    e.read_error = s.message();
    return e;
  }
  e.readable = true;
  db::TraceReader& r = *rd;

  std::vector<db::RunRow> runs;
  if (r.read(&runs) && !runs.empty()) {
    e.run_status = run_status_name(runs[0].status);
    e.exit_detail = runs[0].exit_detail;
    e.command_line = runs[0].command_line;
  }
  std::vector<db::RankRow> ranks;
  if (r.read(&ranks)) {
    e.ranks_recorded = int64_t(ranks.size());
    for (auto& k : ranks) e.world_size = std::max(e.world_size, k.world_size);
  }
  std::vector<db::DeviceRow> devices;
  (void)r.read(&devices);
  auto device_label = [&](int64_t id) -> std::string {
    for (auto& d : devices)
      if (d.id == id) return d.label;
    return "";
  };

  // Progress: steps whose marker ended, on the lowest rank that has step markers.
  e.steps_completed = cell_int(r, "SELECT count(DISTINCT step) FROM marker WHERE kind = 0 AND t_end IS NOT NULL AND rank = "
                                  "(SELECT min(rank) FROM marker WHERE kind = 0)")
                          .value_or(0);
  e.last_epoch = cell_int(r, "SELECT max(epoch) FROM marker WHERE kind IN (0, 2)").value_or(-1);
  e.steps_fast_forwarded = cell_int(r, "SELECT max(c.value) FROM counter c JOIN string s ON s.id = c.name_id "
                                       "WHERE s.text = 'virtual.steps_fast_forwarded'")
                               .value_or(0);
  {
    db::QueryResult q;
    if (r.query("SELECT s.text, c.value FROM counter c JOIN string s ON s.id = c.name_id WHERE s.text IN "
                "('data.steps_planned', 'data.steps_per_epoch', 'data.samples_per_epoch', 'data.documents', "
                "'data.documents_dropped') ORDER BY c.t, c.id",
                &q)) {
      for (auto& row : q.rows) {
        int64_t v = 0;
        try {
          v = int64_t(std::stod(row[1]));
        } catch (...) {
          continue;
        }
        if (row[0] == "data.steps_planned") e.steps_planned = v;
        else if (row[0] == "data.steps_per_epoch") e.steps_per_epoch = v;
        else if (row[0] == "data.samples_per_epoch") e.samples_per_epoch = v;
        else if (row[0] == "data.documents") e.documents = v;
        else e.documents_dropped = v;
      }
    }
  }

  // Faults that fired.
  e.fault_count = cell_int(r, "SELECT count(*) FROM fault").value_or(0);
  {
    db::QueryResult q;
    if (r.query("SELECT name, count(*) FROM fault GROUP BY name ORDER BY min(t)", &q))
      for (auto& row : q.rows) e.faults_by_name.push_back({row[0], std::stoll(row[1])});
    if (r.query("SELECT rank, step, name, trigger, details FROM fault ORDER BY coalesce(step, -1), rank, t, id LIMIT 20", &q))
      for (auto& row : q.rows) {
        FaultEvidence f;
        f.rank = std::stoll(row[0]);
        if (row[1] != "NULL") f.step = std::stoll(row[1]);
        f.name = row[2];
        f.trigger = row[3] == "NULL" ? "" : row[3];
        f.details = row[4] == "NULL" ? "" : row[4];
        e.faults.push_back(f);
      }
  }

  // The primary error: the first of the expected kind, else the first. Ranks are symmetric and
  // race to the same failure, so "first" is the lowest rank's first: the same every run.
  std::vector<db::ErrorRow> errors;
  (void)r.read(&errors);
  std::stable_sort(errors.begin(), errors.end(),
                   [](auto& a, auto& b) { return a.rank != b.rank ? a.rank < b.rank : a.t < b.t; });
  e.error_count = int64_t(errors.size());
  const db::ErrorRow* primary = nullptr;
  for (auto& x : errors)
    if (!expected_kind.empty() && x.kind == expected_kind) {
      primary = &x;
      break;
    }
  if (!primary && !errors.empty()) primary = &errors[0];

  // Without an error, memory is read at the end of the last step of the lowest rank (a steady
  // state: the teardown after it races between ranks).
  int64_t rank = cell_int(r, "SELECT min(rank) FROM marker WHERE kind = 0").value_or(0);
  int64_t at = cell_int(r, "SELECT max(t_end) FROM marker WHERE kind = 0 AND rank = " + sql_int(rank)).value_or(0);
  if (at == 0)
    at = cell_int(r, "SELECT max(t) FROM (SELECT max(t_start) AS t FROM marker UNION ALL SELECT max(t) FROM counter "
                     "UNION ALL SELECT max(t_alloc) FROM allocation)")
             .value_or(0);
  if (primary) {
    e.has_error = true;
    e.error_rank = rank = primary->rank;
    e.error_t = at = primary->t;
    e.error_kind = primary->kind;
    e.error_site = primary->site;
    e.error_message = primary->message;
    e.error_tensors = tensor_names(primary->tensors);
    e.error_device = device_label(primary->device_id);
    e.error_tried_bytes = size_after(e.error_message, "Tried to allocate ");
    if (!e.error_tried_bytes) e.error_tried_bytes = size_after(e.error_message, "tried to allocate ");
    if (!e.error_tried_bytes) e.error_tried_bytes = size_after(e.error_message, "tried to pin ");
    e.error_free_bytes = size_after(e.error_message, " of which ");
    if (primary->step) e.step = *primary->step;
    // Where it happened: the markers around it on its rank, outermost first.
    db::QueryResult q;
    const std::string T = sql_int(at);
    if (r.query("SELECT m.kind, s.text, m.step, m.micro_step, m.epoch FROM marker m LEFT JOIN string s ON s.id = m.name_id "
                "WHERE m.rank = " + sql_int(rank) + " AND m.t_start <= " + T + " AND (m.t_end IS NULL OR m.t_end >= " + T +
                    ") ORDER BY m.t_start, m.id",
                &q)) {
      for (auto& row : q.rows) {
        const int kind = std::stoi(row[0]);
        if (row[2] != "NULL") e.step = std::stoll(row[2]);
        if (row[4] != "NULL") e.epoch = std::stoll(row[4]);
        if (kind == 1 && row[3] != "NULL") e.micro_step = std::stoll(row[3]);
        if (kind == 3 && row[1] != "NULL") e.phases.push_back(row[1]);
      }
    }
    if (!e.step) {
      auto first = cell_int(r, "SELECT min(t_start) FROM marker WHERE kind = 0 AND rank = " + sql_int(rank));
      e.before_first_step = !first || *first > at;
    }
    if (e.step && e.epoch) {
      if (e.steps_per_epoch && *e.steps_per_epoch > 0) {
        e.step_in_epoch = *e.step - *e.epoch * *e.steps_per_epoch;
      } else if (auto first = cell_int(r, "SELECT min(step) FROM marker WHERE kind = 0 AND rank = " + sql_int(rank) +
                                              " AND epoch = " + sql_int(*e.epoch))) {
        e.step_in_epoch = *e.step - *first;
      }
    }
  }

  // Memory at that moment (or at the end of the run): the rank's accelerator and host.
  const db::DeviceRow* accel = nullptr;
  const db::DeviceRow* host = nullptr;
  for (auto& d : devices) {
    if (d.rank != rank) continue;
    if (d.kind == db::DeviceKind::Cpu) {
      if (!host) host = &d;
    } else if (!accel) {
      accel = &d;
    }
  }
  if (!accel) accel = host;  // training on the CPU
  const std::string T = sql_int(at);
  auto counter_at = [&](const db::DeviceRow* d, const char* name) -> std::optional<int64_t> {
    if (!d) return std::nullopt;
    return cell_int(r, "SELECT c.value FROM counter c JOIN string s ON s.id = c.name_id WHERE c.device_id = " +
                           sql_int(d->id) + " AND s.text = '" + name + "' AND c.t <= " + T +
                           " ORDER BY c.t DESC, c.id DESC LIMIT 1");
  };
  auto live_at = [&](const db::DeviceRow* d, int level) -> std::optional<int64_t> {
    if (!d) return std::nullopt;
    return cell_int(r, "SELECT coalesce(sum(bytes), 0) FROM allocation WHERE device_id = " + sql_int(d->id) +
                           " AND level = " + std::to_string(level) + " AND NOT " + db::kSecondRecordSql +
                           " AND t_alloc <= " + T +
                           " AND (t_free IS NULL OR t_free > " + T + ")");
  };
  if (accel) {
    e.device_label = accel->label;
    e.device_capacity = accel->capacity_bytes;
    e.device_allocated = counter_at(accel, "allocated");
    if (!e.device_allocated) e.device_allocated = live_at(accel, 0);
    e.device_reserved = counter_at(accel, "reserved");
    if (!e.device_reserved) e.device_reserved = live_at(accel, 1);
  }
  if (host && host != accel) {
    e.host_capacity = host->capacity_bytes;
    e.host_live = live_at(host, 1);
    e.host_pinned = counter_at(host, "pinned");
  }
  {
    std::string ids;
    for (const db::DeviceRow* d : {accel, host})
      if (d) ids += (ids.empty() ? "" : ", ") + sql_int(d->id);
    db::QueryResult q;
    if (!ids.empty() &&
        r.query("SELECT coalesce(s.text, '(unnamed)'), a.bytes, a.device_id, a.memory_kind FROM allocation a LEFT JOIN string s "
                "ON s.id = a.name_id WHERE a.device_id IN (" + ids + ") AND a.level = 0 AND a.t_alloc <= " + T +
                    " AND (a.t_free IS NULL OR a.t_free > " + T + ") ORDER BY a.bytes DESC, a.id LIMIT 6",
                &q))
      for (auto& row : q.rows)
        e.largest_alive.push_back({row[0], std::stoll(row[1]), device_label(std::stoll(row[2])),
                                   memory_kind_name(std::stoi(row[3]))});
    // Every name alive then on those devices (what expect.mechanism.alive matches), blocks only.
    if (!ids.empty() &&
        r.query("SELECT DISTINCT s.text, a.device_id, a.memory_kind FROM allocation a JOIN string s ON s.id = a.name_id "
                "WHERE a.device_id IN (" + ids + ") AND a.level = 0 AND a.t_alloc <= " + T +
                    " AND (a.t_free IS NULL OR a.t_free > " + T + ") LIMIT 200000",
                &q))
      for (auto& row : q.rows)
        e.alive_names.push_back(row[0] + "@" + device_label(std::stoll(row[1])) + ":" + memory_kind_name(std::stoi(row[2])));
  }
  return e;
}

namespace {

struct Judge {
  std::vector<Check> checks;
  void add(std::string name, Outcome o, std::string detail, bool mechanism = false) {
    checks.push_back({std::move(name), o, std::move(detail), mechanism});
  }
  Outcome outcome() const {
    std::vector<Outcome> v;
    for (auto& c : checks) v.push_back(c.outcome);
    return compose(v);
  }
};

std::string position(const Evidence& e) {
  if (e.before_first_step) return "setup, before the first step, rank " + std::to_string(e.error_rank);
  auto f = [](const char* n, const std::optional<int64_t>& v) {
    return std::string(n) + " " + (v ? std::to_string(*v) : std::string("?"));
  };
  return f("step", e.step) + ", " + f("epoch", e.epoch) + (e.micro_step ? ", " + f("micro-step", e.micro_step) : "") +
         ", rank " + std::to_string(e.error_rank);
}

// The steps a virtual run counted without replaying them (a steady state), said beside its step count.
std::string fast_forwarded(const Evidence& e) {
  if (e.steps_fast_forwarded <= 0) return "";
  return " (" + std::to_string(e.steps_fast_forwarded) +
         " of them fast-forwarded: a steady state, each step leaving memory as the one before)";
}

// Checks common to both runs: the trace is there and says how the run ended.
bool readable(Judge& j, const Evidence& e, const JudgeContext& ctx) {
  if (!e.readable) {
    j.add("trace", Outcome::Unknown, "cannot read the trace: " + e.read_error);
    return false;
  }
  if (e.run_status == "running") {
    j.add("run ended", Outcome::Unknown, "the trace does not say how the run ended (killed?)");
    return false;
  }
  if (!ctx.train_status && !e.has_error && e.steps_completed == 0) {
    j.add("run started", Outcome::Unknown, "the run did not train: " + ctx.train_status.message());
    return false;
  }
  return true;
}

// `reached`: the run got to where the symptom is expected (a fault that never fired before that
// point says nothing).
void check_faults_fired(Judge& j, const Expectation& x, const Evidence& e, bool reached) {
  for (const auto& name : x.faults_fired) {
    int64_t n = 0;
    for (auto& [f, c] : e.faults_by_name)
      if (f == name) n = c;
    j.add("fault " + name + " fired", n > 0 ? Outcome::Valid : reached ? Outcome::Invalid : Outcome::Unknown,
          n > 0 ? std::to_string(n) + " fault row(s)"
                : reached ? "no fault row: the mechanism never switched on" : "no fault row (the run stopped before)",
          true);
  }
}

// expect.mechanism: the phase around the error (or its site), and tensors alive at it.
void check_mechanism(Judge& j, const Expectation& x, const Evidence& e) {
  if (!x.mechanism_phase.empty()) {
    std::string hit;
    for (auto& p : e.phases)
      if (hit.empty() && search(x.mechanism_phase, p)) hit = "phase '" + p + "'";
    if (hit.empty() && search(x.mechanism_phase, e.error_site)) hit = "site '" + e.error_site + "'";
    std::string around;
    for (size_t i = 0; i < e.phases.size(); ++i) around += (i ? " > " : "") + e.phases[i];
    j.add("mechanism: phase", hit.empty() ? Outcome::Invalid : Outcome::Valid,
          "/" + x.mechanism_phase + "/ " +
              (hit.empty() ? "matches neither the phases around the error (" + (around.empty() ? std::string("none") : around) +
                                 ") nor its site '" + e.error_site + "'"
                           : "matches " + hit),
          true);
  }
  for (const auto& t : x.mechanism_alive) {
    std::string hit;
    for (auto& n : e.alive_names)
      if (hit.empty() && search(t, n)) hit = n;
    j.add("mechanism: alive /" + t + "/", hit.empty() ? Outcome::Invalid : Outcome::Valid,
          hit.empty() ? "no tensor of that name was alive at the error (" + std::to_string(e.alive_names.size()) +
                            " names alive)"
                      : hit + " was alive at the error",
          true);
  }
}

// expect.figures: each the trace's number against the report's, within its tolerance. Not a check
// of the mechanism: a figure off is NOT REPRODUCED, whatever else holds.
std::vector<FigureCheck> check_figures(Judge& j, const Expectation& x, const Evidence& e, const JudgeContext& ctx) {
  std::vector<FigureCheck> out;
  for (const Figure& f : x.figures) {
    FigureCheck c;
    c.name = f.name;
    c.reported = int64_t(f.bytes);
    c.tolerance = f.tolerance;
    c.predicted = predicted_figure(e, f.name);
    const std::string reported = format_bytes(double(f.bytes)) + (f.text.empty() ? "" : " (" + f.text + ")");
    const std::string tol = percent(f.tolerance).substr(1);  // no sign
    std::string detail;
    if (!c.predicted) {
      c.outcome = Outcome::Unknown;
      detail = "reported " + reported + "; the trace does not give it" +
               (f.name == "tried_to_allocate" || f.name == "free" ? " (the error message has no such figure)" : "");
    } else {
      const double predicted = double(*c.predicted), rep = double(f.bytes);
      if (rep > 0) c.relative_error = (predicted - rep) / rep;
      const bool within = rep > 0 ? std::fabs(*c.relative_error) <= f.tolerance : predicted == 0;
      c.outcome = within ? Outcome::Valid : Outcome::Invalid;
      detail = "predicted " + format_bytes(predicted) + ", reported " + reported + ": " +
               (c.relative_error ? percent(*c.relative_error) : std::string(within ? "equal" : "not 0")) +
               (within ? ", within " : ", outside ") + "its tolerance of " + tol;
      if (f.name == "free" && rep > 0) {
        // free = capacity - reserved - outside: with the same error, free(c) = predicted - (c - charged).
        const double charged = double(ctx.outside_allocator_bytes), slack = f.tolerance * rep;
        const double lo = std::max(0.0, charged + predicted - rep - slack), hi = charged + predicted - rep + slack;
        c.outside_band = std::pair<int64_t, int64_t>(int64_t(lo), int64_t(hi));
        detail += "; with " + format_bytes(charged) + " outside PyTorch's allocator charged, it holds for ";
        if (hi < 0)
          detail += "none (with nothing outside it, free would still be " + format_bytes(rep - slack - charged - predicted) +
                    " short of the tolerance: PyTorch's reserved is off)";
        else
          detail += format_bytes(lo) + " to " + format_bytes(hi) + " there";
      }
    }
    c.detail = detail;
    c.depends_on = f.depends_on;
    if (!f.depends_on.empty())
      c.outcome = Outcome::Unknown;  // declared unknowable: printed apart (not judged), never a check that passes
    else
      j.add("figure " + f.name, c.outcome, detail);
    out.push_back(c);
  }
  return out;
}

// DeepSpeed keys that change memory zerotrace does not model: the verdict cannot be trusted either way.
void check_unmodeled(Judge& j, const JudgeContext& ctx) {
  for (const auto& k : ctx.unmodeled_keys)
    j.add("DeepSpeed key modeled", Outcome::Unknown, k + " changes memory and zerotrace does not model it");
}

// The outcome of a judged run: unmodeled keys make it unknown whatever the checks say.
Outcome outcome_of(const Judge& j, const JudgeContext& ctx) {
  return ctx.unmodeled_keys.empty() ? j.outcome() : Outcome::Unknown;
}

}  // namespace

RunJudgement judge_bug(const Expectation& x, const JudgeContext& ctx, Evidence e) {
  Judge j;
  std::vector<FigureCheck> figures;
  bool reached = true;
  if (readable(j, e, ctx)) {
    if (x.steps_lost) {
      if (e.error_count > 0)
        j.add("no error", Outcome::Invalid, "the run failed instead: " + e.error_kind + ": " + quote(e.error_message));
      else
        j.add("no error", Outcome::Valid, "no error row: the run ended as if all was well");
      j.add("run completed", e.run_status == "ok" ? Outcome::Valid : Outcome::Invalid, "run status " + e.run_status);
      if (e.error_count > 0) {
        // The run died: the steps it lost say nothing about the data or the plan.
      } else if (ctx.expected_steps < 0)
        j.add("steps lost", Outcome::Unknown, "cannot tell how many steps the full data gives (no epochs?)");
      else
        j.add("steps lost", e.steps_completed < ctx.expected_steps ? Outcome::Valid : Outcome::Invalid,
              std::to_string(e.steps_completed) + " optimizer steps ran" + fast_forwarded(e) +
                  "; max_epochs over the full data gives " + std::to_string(ctx.expected_steps));
    } else if (!e.has_error || e.error_kind != x.error) {
      if (e.has_error) {
        j.add("error " + x.error, Outcome::Invalid,
              "the run failed with " + e.error_kind + " instead, at " + position(e) + ": " + quote(e.error_message));
      } else if (x.epoch && e.last_epoch < *x.epoch) {
        reached = false;
        j.add("error " + x.error, Outcome::Unknown,
              "the run stopped after " + std::to_string(e.steps_completed) + " steps in epoch " +
                  std::to_string(e.last_epoch) + ", before epoch " + std::to_string(*x.epoch) +
                  " where the symptom is expected: give it more steps");
      } else {
        j.add("error " + x.error, Outcome::Invalid,
              "no error: the run completed " + std::to_string(e.steps_completed) + " steps (status " + e.run_status + ")");
      }
    } else {
      j.add("error " + x.error, Outcome::Valid, "at " + position(e));
      if (!x.site.empty()) {
        std::string where = e.error_site;
        bool ok = search(x.site, e.error_site);
        for (auto& p : e.phases)
          if (!ok && search(x.site, p)) {
            ok = true;
            where = "phase '" + p + "'";
          }
        j.add("site", ok ? Outcome::Valid : Outcome::Invalid,
              "/" + x.site + "/ " + (ok ? "matches " : "does not match ") +
                  (where.empty() ? std::string("(no site)") : where));
      }
      if (!x.message.empty())
        j.add("message", search(x.message, e.error_message) ? Outcome::Valid : Outcome::Invalid,
              "/" + x.message + "/ against " + quote(e.error_message, 100));
      for (const auto& t : x.tensors) {
        std::string hit;
        for (auto& n : e.error_tensors)
          if (hit.empty() && search(t, n)) hit = n;
        j.add("tensor /" + t + "/", hit.empty() ? Outcome::Invalid : Outcome::Valid,
              hit.empty() ? "none of the error's tensors match" : hit);
      }
      auto when = [&](const char* name, const std::optional<int64_t>& want, const std::optional<int64_t>& got) {
        if (!want) return;
        int64_t w = *want;
        std::string wtext = std::to_string(w);
        if (w == -2) {
          w = ctx.grad_accum - 1;
          wtext = "last (" + std::to_string(w) + " of accumulation " + std::to_string(ctx.grad_accum) + ")";
        }
        if (!got && e.before_first_step)
          j.add(std::string("when: ") + name, Outcome::Invalid, "expected " + wtext + "; it came before the first step");
        else if (!got)
          j.add(std::string("when: ") + name, Outcome::Unknown, "expected " + wtext + "; the trace has no marker to tell");
        else
          j.add(std::string("when: ") + name, *got == w ? Outcome::Valid : Outcome::Invalid,
                "expected " + wtext + ", was " + std::to_string(*got));
      };
      when("epoch", x.epoch, e.epoch);
      when("step", x.step, e.step);
      when("step_in_epoch", x.step_in_epoch, e.step_in_epoch);
      when("micro_step", x.micro_step, e.micro_step);
      if (!x.phase.empty()) {
        // An error before the first step is inside "setup" too (engine init, the model states placed):
        // a report's load-time failure says so without naming zt's markers.
        std::vector<std::string> around = e.phases;
        if (e.before_first_step) around.push_back("setup");
        std::string hit;
        for (auto& p : around)
          if (hit.empty() && search(x.phase, p)) hit = p;
        j.add("when: phase", hit.empty() ? Outcome::Invalid : Outcome::Valid,
              "/" + x.phase + "/ " + (hit.empty() ? "matches no phase around the error" : "inside '" + hit + "'"));
      }
      check_mechanism(j, x, e);
      figures = check_figures(j, x, e, ctx);
    }
    check_faults_fired(j, x, e, reached);
  }
  check_unmodeled(j, ctx);
  RunJudgement out;
  out.outcome = outcome_of(j, ctx);
  // The expected kind of error, through another mechanism: not a reproduction of this report. Only
  // when the mechanism checks are the only ones that failed: the right error at the wrong step (or
  // with the wrong message, site, tensors) is NOT REPRODUCED whatever the mechanism says.
  if (out.outcome == Outcome::Invalid && !x.steps_lost && e.has_error && e.error_kind == x.error) {
    bool mechanism_failed = false, other_failed = false;
    for (auto& c : j.checks)
      if (c.outcome == Outcome::Invalid) (c.mechanism ? mechanism_failed : other_failed) = true;
    out.different_failure = mechanism_failed && !other_failed;
  }
  out.checks = std::move(j.checks);
  out.figures = std::move(figures);
  out.evidence = std::move(e);
  return out;
}

RunJudgement judge_fix(const Expectation& x, const JudgeContext& ctx, Evidence e) {
  Judge j;
  if (readable(j, e, ctx)) {
    if (e.error_count > 0) {
      const bool same = !x.steps_lost && e.error_kind == x.error;
      j.add(same ? "symptom gone" : "no error", Outcome::Invalid,
            std::string(same ? "the symptom is still there: " : "the fix run failed with ") + e.error_kind + " at " +
                position(e) + ": " + quote(e.error_message));
    } else {
      j.add("no error", Outcome::Valid, "no error row");
    }
    j.add("run completed", e.run_status == "ok" && ctx.train_status ? Outcome::Valid : Outcome::Invalid,
          "run status " + e.run_status + (ctx.train_status ? "" : ": " + ctx.train_status.message()));
    const int64_t planned = ctx.planned_steps >= 0 ? ctx.planned_steps : e.steps_planned.value_or(-1);
    if (x.steps_lost) {
      if (ctx.expected_steps < 0)
        j.add("all steps", Outcome::Unknown, "cannot tell how many steps the full data gives");
      else
        j.add("all steps", e.steps_completed == ctx.expected_steps ? Outcome::Valid : Outcome::Invalid,
              std::to_string(e.steps_completed) + " of the " + std::to_string(ctx.expected_steps) +
                  " steps max_epochs over the full data gives" + fast_forwarded(e));
    } else if (planned >= 0) {
      j.add("all steps", e.steps_completed >= planned ? Outcome::Valid : Outcome::Invalid,
            std::to_string(e.steps_completed) + " of " + std::to_string(planned) + " planned steps");
    }
  }
  check_unmodeled(j, ctx);
  RunJudgement out;
  out.outcome = outcome_of(j, ctx);
  out.checks = std::move(j.checks);
  out.evidence = std::move(e);
  return out;
}

json to_json(const Evidence& e) {
  auto opt = [](const std::optional<int64_t>& v) { return v ? json(*v) : json(nullptr); };
  json j = {{"trace", e.trace}, {"readable", e.readable}};
  if (!e.readable) {
    j["read_error"] = e.read_error;
    return j;
  }
  j["run_status"] = e.run_status;
  if (!e.exit_detail.empty()) j["exit_detail"] = e.exit_detail;
  j["world_size"] = e.world_size;
  j["ranks_recorded"] = e.ranks_recorded;
  j["steps_completed"] = e.steps_completed;
  j["steps_fast_forwarded"] = e.steps_fast_forwarded;
  j["last_epoch"] = e.last_epoch;
  j["data"] = {{"steps_planned", opt(e.steps_planned)},         {"steps_per_epoch", opt(e.steps_per_epoch)},
               {"samples_per_epoch", opt(e.samples_per_epoch)}, {"documents", opt(e.documents)},
               {"documents_dropped", opt(e.documents_dropped)}};
  j["errors"] = e.error_count;
  if (e.has_error) {
    j["error"] = {{"kind", e.error_kind},   {"site", e.error_site},     {"message", e.error_message},
                  {"tensors", e.error_tensors}, {"device", e.error_device}, {"rank", e.error_rank},
                  {"t_ns", e.error_t},      {"step", opt(e.step)},      {"epoch", opt(e.epoch)},
                  {"micro_step", opt(e.micro_step)}, {"step_in_epoch", opt(e.step_in_epoch)}, {"phases", e.phases},
                  {"before_first_step", e.before_first_step},
                  {"tried_to_allocate_bytes", opt(e.error_tried_bytes)}, {"free_bytes", opt(e.error_free_bytes)}};
  }
  j["memory"] = {{"at", e.has_error ? "the error" : "the end of the last step"},
                 {"device", e.device_label},
                 {"device_allocated_bytes", opt(e.device_allocated)},
                 {"device_reserved_bytes", opt(e.device_reserved)},
                 {"device_capacity_bytes", opt(e.device_capacity)},
                 {"host_live_bytes", opt(e.host_live)},
                 {"host_pinned_reserved_bytes", opt(e.host_pinned)},
                 {"host_capacity_bytes", opt(e.host_capacity)}};
  json alive = json::array();
  for (auto& t : e.largest_alive)
    alive.push_back({{"name", t.name}, {"bytes", t.bytes}, {"device", t.device}, {"kind", t.kind}});
  j["largest_alive"] = alive;
  json faults = json::array();
  for (auto& f : e.faults)
    faults.push_back({{"name", f.name},
                      {"rank", f.rank},
                      {"step", f.step ? json(*f.step) : json(nullptr)},
                      {"trigger", f.trigger},
                      {"details", f.details}});
  j["faults"] = {{"count", e.fault_count}, {"rows", faults}};
  json by = json::object();
  for (auto& [n, c] : e.faults_by_name) by[n] = c;
  j["faults"]["by_name"] = by;
  return j;
}

json to_json(const RunJudgement& r) {
  json checks = json::array();
  for (auto& c : r.checks)
    checks.push_back(
        {{"check", c.name}, {"outcome", outcome_name(c.outcome)}, {"detail", c.detail}, {"mechanism", c.mechanism}});
  json figures = json::array();
  for (auto& f : r.figures)
    figures.push_back({{"figure", f.name},
                       {"reported_bytes", f.reported},
                       {"predicted_bytes", f.predicted ? json(*f.predicted) : json(nullptr)},
                       {"relative_error", f.relative_error ? json(*f.relative_error) : json(nullptr)},
                       {"tolerance", f.tolerance},
                       {"outcome", outcome_name(f.outcome)}});
  return {{"outcome", outcome_name(r.outcome)},
          {"different_failure", r.different_failure},
          {"checks", checks},
          {"figures", figures},
          {"evidence", to_json(r.evidence)}};
}

}  // namespace zt::repro
