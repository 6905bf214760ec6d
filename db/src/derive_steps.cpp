// Steps, epochs and phases from range markers (see zt/db/derive_steps.h for the sources and
// their order).
#include "zt/db/derive_steps.h"

#include <sqlite3.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <unordered_map>

#include "sqlite.h"
#include "zt/db/schema.h"
#include "zt/db/trace_file.h"
#include "zt/db/trace_reader.h"

namespace zt::db {
using detail::SqlError;
using detail::Stmt;

namespace {

constexpr const char* kModuleDomain = "zerotrace";
constexpr size_t kMaxRuleName = 1024;  // longer range names serve no source (see plan_markers)
// The bootstrap's framework hooks (python/zerotrace/hooks/), source 3.
constexpr std::pair<const char*, const char*> kHookDomains[] = {
    {"zerotrace.transformers", "transformers.Trainer's callbacks"}, {"zerotrace.lightning", "Lightning's callbacks"}};
// The bootstrap's hook of torch.optim's optimizers: a range "optimizer step" per step (one name for
// all: numbered in time order), source 5.
constexpr const char* kTorchDomain = "zerotrace.torch";

struct Range {
  int64_t rank = 0;
  int64_t t_start = 0;
  std::optional<int64_t> t_end;
  std::optional<int64_t> number;  // N of the name
};

// One derived marker.
struct Span {
  int64_t rank = 0;
  int64_t t_start = 0;
  std::optional<int64_t> t_end;
  int64_t index = 0;
};

// What a range name says, for every source at once (a name may serve several).
struct NameRoles {
  bool user_step = false, user_epoch = false;
  char convention = 0;  // 'S' step, 'E' epoch
  char hook = 0;        // the bootstrap's HF Trainer / Lightning ranges
  std::string hook_source;  // ... in words
  char module = 0;      // the zerotrace module's
  bool torch_step = false;  // an optimizer's step (the bootstrap's torch.optim hook)
  bool ds_step = false;  // a DeepSpeed optimizer's step
  bool ds_start = false;  // DeepSpeedEngine.forward / .backward: where a step's work begins
  std::string phase;    // the phase it is, "" when none
  std::optional<int64_t> number;
};

// The name without its NVTX domain ("domain::name" as the CUPTI decoder writes it).
std::string_view bare(std::string_view name, std::string_view* domain) {
  size_t p = name.find("::");
  if (p == std::string_view::npos) {
    *domain = {};
    return name;
  }
  *domain = name.substr(0, p);
  return name.substr(p + 2);
}

std::optional<int64_t> last_number(std::string_view s) {
  size_t end = s.size();
  while (end > 0 && !std::isdigit(static_cast<unsigned char>(s[end - 1]))) --end;
  size_t start = end;
  while (start > 0 && std::isdigit(static_cast<unsigned char>(s[start - 1]))) --start;
  if (start == end || end - start > 18) return std::nullopt;
  return std::stoll(std::string(s.substr(start, end - start)));
}

// "epoch N" / "step N": 'E' / 'S', else 0.
char convention_kind(std::string_view bare_name) {
  static const std::regex re("(epoch|step)[ _:#]?[0-9]+", std::regex::icase);
  std::cmatch m;
  if (!std::regex_match(bare_name.begin(), bare_name.end(), m, re)) return 0;
  return std::tolower(static_cast<unsigned char>(m.str(1)[0])) == 'e' ? 'E' : 'S';
}

bool is_deepspeed_optimizer_step(std::string_view n) {
  static const std::regex re("(DeepSpeed[A-Za-z0-9_]*Optimizer[A-Za-z0-9_]*|BF16_Optimizer|FP16_Optimizer|"
                             "FP16_UnfusedOptimizer)\\.step");
  return std::regex_match(n.begin(), n.end(), re);
}

// zt train's phase names for DeepSpeed's ranges of the same work.
std::string deepspeed_phase(std::string_view n, bool optimizer_step) {
  if (optimizer_step) return "optimizer";
  if (n == "DeepSpeedEngine.forward") return "forward";
  if (n == "DeepSpeedEngine.backward") return "backward";
  if (n == "DeepSpeedEngine.allreduce_gradients") return "allreduce_gradients";
  static const std::regex re("DeepSpeed[A-Za-z0-9_]*Optimizer[A-Za-z0-9_]*\\.unscale_and_clip_grads");
  if (std::regex_match(n.begin(), n.end(), re)) return "unscale_and_clip_grads";
  return "";
}

struct Patterns {
  std::optional<std::regex> step, epoch;
  std::string step_text, epoch_text;
};

bool user_match(const std::optional<std::regex>& re, const std::string& text, const std::string& name) {
  if (!re) return false;
  if (name == text) return true;
  std::string_view domain;
  std::string_view b = bare(name, &domain);
  return std::regex_match(name, *re) || (!domain.empty() && (b == text || std::regex_match(b.begin(), b.end(), *re)));
}

NameRoles classify(const std::string& name, const Patterns& p) {
  NameRoles r;
  std::string_view domain;
  std::string_view b = bare(name, &domain);
  r.number = last_number(b);
  r.user_step = user_match(p.step, p.step_text, name);
  r.user_epoch = user_match(p.epoch, p.epoch_text, name);
  const char* hook_source = nullptr;
  for (auto& [d, words] : kHookDomains)
    if (domain == d) hook_source = words;
  const char conv = convention_kind(b);
  if (domain == kTorchDomain) {
    r.torch_step = b == "optimizer step";
  } else if (domain == kModuleDomain) {
    r.module = conv;
    if (!conv) r.phase = std::string(b);
  } else if (hook_source) {
    r.hook = conv;
    r.hook_source = hook_source;
  } else {
    r.convention = conv;
  }
  if (domain.empty()) {
    r.ds_step = is_deepspeed_optimizer_step(name);
    r.ds_start = name == "DeepSpeedEngine.forward" || name == "DeepSpeedEngine.backward";
    if (r.phase.empty()) r.phase = deepspeed_phase(name, r.ds_step);
  }
  return r;
}

// Numbers from the names where every range has one, else 0, 1, ... per rank in time order.
std::vector<Span> number_spans(std::vector<Range> ranges) {
  std::stable_sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.t_start < b.t_start;
  });
  bool named = std::all_of(ranges.begin(), ranges.end(), [](const Range& r) { return r.number.has_value(); });
  std::vector<Span> out;
  std::map<int64_t, int64_t> next;
  for (auto& r : ranges) out.push_back({r.rank, r.t_start, r.t_end, named ? *r.number : next[r.rank]++});
  return out;
}

// DeepSpeed: a step ends with its optimizer's step and begins at the first forward (or backward)
// after the previous step ended. Forward and backward ranges after the last optimizer step make
// a step that never ended only where the run did not end well (else they are an evaluation).
std::vector<Span> deepspeed_steps(const std::vector<Range>& optimizer, const std::vector<Range>& starts,
                                  bool run_ended_well) {
  std::map<int64_t, std::vector<const Range*>> opt_by_rank, start_by_rank;
  for (auto& r : optimizer) opt_by_rank[r.rank].push_back(&r);
  for (auto& r : starts) start_by_rank[r.rank].push_back(&r);
  auto by_time = [](const Range* a, const Range* b) { return a->t_start < b->t_start; };
  std::vector<Span> out;
  for (auto& [rank, opts] : opt_by_rank) {
    std::sort(opts.begin(), opts.end(), by_time);
    auto& st = start_by_rank[rank];
    std::sort(st.begin(), st.end(), by_time);
    size_t si = 0;
    int64_t prev_end = INT64_MIN;
    int64_t index = 0;
    for (const Range* o : opts) {
      while (si < st.size() && st[si]->t_start <= prev_end) ++si;
      int64_t begin = o->t_start;
      if (si < st.size() && st[si]->t_start < o->t_start) begin = st[si]->t_start;
      while (si < st.size() && st[si]->t_start < o->t_start) ++si;
      out.push_back({rank, begin, o->t_end, index++});
      prev_end = o->t_end.value_or(INT64_MAX);
    }
    while (si < st.size() && st[si]->t_start <= prev_end) ++si;
    if (si < st.size() && !run_ended_well) out.push_back({rank, st[si]->t_start, std::nullopt, index});
  }
  return out;
}

// The span of `spans` (one rank's, sorted by t_start) that holds time t: the latest begun at or
// before t that has not ended by then (spans of one kind rarely overlap: a few are looked at).
std::optional<int64_t> index_at(const std::map<int64_t, std::vector<Span>>& spans, int64_t rank, int64_t t) {
  auto it = spans.find(rank);
  if (it == spans.end()) return std::nullopt;
  const auto& v = it->second;
  auto p = std::upper_bound(v.begin(), v.end(), t, [](int64_t x, const Span& s) { return x < s.t_start; });
  for (int looked = 0; p != v.begin() && looked < 16; ++looked) {
    --p;
    if (!p->t_end || t <= *p->t_end) return p->index;
  }
  return std::nullopt;
}

std::string meta(sqlite3* db, const char* key) {
  Stmt s(db, "SELECT value FROM meta WHERE key = ?1");
  s.bind(1, std::string_view(key));
  return s.step() ? s.text(0) : std::string();
}

void set_meta(sqlite3* db, const char* key, const std::string& value) {
  Stmt s(db, value.empty() ? "DELETE FROM meta WHERE key = ?1" : "INSERT OR REPLACE INTO meta(key, value) VALUES (?1, ?2)");
  s.bind(1, std::string_view(key));
  if (!value.empty()) s.bind(2, std::string_view(value));
  s.step_done();
}

int64_t intern(sqlite3* db, const std::string& text) {
  Stmt ins(db, "INSERT OR IGNORE INTO string(text) VALUES (?1)");
  ins.bind(1, std::string_view(text));
  ins.step_done();
  Stmt sel(db, "SELECT id FROM string WHERE text = ?1");
  sel.bind(1, std::string_view(text));
  sel.step();
  return sel.i64(0);
}

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// Reads the trace (nothing written) and decides the derived markers. Rows with ids in
// [skip_first, skip_last] were derived earlier: they are not the program's own.
// `recorded`: empty rules take the patterns recorded in the trace.
void plan_markers(sqlite3* db, const StepRules& given, bool recorded, int64_t skip_first, int64_t skip_last,
                  DerivedMarkers* out, std::vector<DerivedMarker>* rows_out, StepRules* used) {
  DerivedMarkers& d = *out;
  StepRules rules = given;
  if (recorded && rules.step_range.empty() && rules.epoch_range.empty()) {
    rules.step_range = meta(db, "step_range");
    rules.epoch_range = meta(db, "epoch_range");
  }
  Patterns p;
  p.step_text = rules.step_range;
  p.epoch_text = rules.epoch_range;
  try {
    if (!rules.step_range.empty()) p.step.emplace(rules.step_range);
    if (!rules.epoch_range.empty()) p.epoch.emplace(rules.epoch_range);
  } catch (const std::regex_error& e) {  // a pattern recorded in the trace by another zt
    throw SqlError(SQLITE_ERROR, std::string("a range pattern recorded in the trace is not a regular expression (") +
                                     e.what() + ")");
  }

  auto own = [&](int64_t kind) {
    Stmt c(db, "SELECT count(*) FROM marker WHERE kind = ?1 AND id NOT BETWEEN ?2 AND ?3");
    c.bind(1, kind).bind(2, skip_first).bind(3, skip_last);
    return c.step() && c.i64(0) > 0;
  };
  d.own_steps = own(0);
  d.own_epochs = own(2);

  // Every distinct range name, classified once (a trace has a few hundred names, and may have
  // hundreds of thousands of ranges: only the ranges of names that serve are read).
  std::unordered_map<int64_t, NameRoles> roles;
  std::vector<std::pair<int64_t, std::string>> names_by_count;  // for the notes
  {
    Stmt names(db,
               "SELECT m.name_id, s.text, count(*) FROM marker m JOIN string s ON s.id = m.name_id WHERE m.kind = 4 "
               "GROUP BY m.name_id ORDER BY count(*) DESC, s.text");
    while (names.step()) {
      const std::string text = names.text(1);
      // std::regex matches by recursion, a frame per character: a name of 100,000 digits overflows
      // the stack. No range that names a step or a phase is that long; a trace is untrusted input.
      NameRoles r = text.size() > kMaxRuleName ? NameRoles{} : classify(text, p);
      names_by_count.emplace_back(names.i64(2), text);
      if (r.user_step || r.user_epoch || r.convention || r.hook || r.module || r.torch_step || r.ds_step ||
          r.ds_start || !r.phase.empty())
        roles.emplace(names.i64(0), std::move(r));
    }
  }
  struct Named {
    Range range;
    const NameRoles* roles;
  };
  std::vector<Named> ranges;
  {
    Stmt rs(db, "SELECT name_id, rank, t_start, t_end FROM marker WHERE kind = 4 ORDER BY t_start, id");
    while (rs.step()) {
      auto it = roles.find(rs.i64(0));
      if (it == roles.end()) continue;
      Range r;
      r.rank = rs.i64(1);
      r.t_start = rs.i64(2);
      r.t_end = rs.opt(3);
      r.number = it->second.number;
      ranges.push_back({r, &it->second});
    }
  }
  auto select = [&](auto pred) {
    std::vector<Range> v;
    for (auto& n : ranges)
      if (pred(*n.roles)) v.push_back(n.range);
    return v;
  };
  const bool ended_well =
      detail::query_int(db, "SELECT count(*) FROM run WHERE status <> 1 OR coalesce(exit_code, 0) <> 0") == 0;

  // The framework hooks that wrote ranges of a kind ('S' / 'E'), in words.
  auto hook_source_of = [&](char kind) {
    std::set<std::string> v;
    for (auto& n : ranges)
      if (n.roles->hook == kind) v.insert(n.roles->hook_source);
    return v;
  };
  auto hook_words = [](const std::set<std::string>& v) {
    std::string s;
    for (auto& w : v) s += (s.empty() ? "" : " and ") + w;
    return s;
  };

  // Steps: the first source with any.
  std::vector<Span> steps, epochs;
  if (!d.own_steps) {
    auto user = select([](const NameRoles& r) { return r.user_step; });
    auto conv = select([](const NameRoles& r) { return r.convention == 'S'; });
    auto hook = select([](const NameRoles& r) { return r.hook == 'S'; });
    auto ds_opt = select([](const NameRoles& r) { return r.ds_step; });
    auto module = select([](const NameRoles& r) { return r.module == 'S'; });
    auto torch_opt = select([](const NameRoles& r) { return r.torch_step; });
    if (!user.empty()) steps = number_spans(user), d.steps_from = "--step-range " + quoted(p.step_text);
    else if (!conv.empty()) steps = number_spans(conv), d.steps_from = "NVTX ranges 'step N'";
    else if (!hook.empty()) steps = number_spans(hook), d.steps_from = hook_words(hook_source_of('S'));
    else if (!ds_opt.empty())
      steps = deepspeed_steps(ds_opt, select([](const NameRoles& r) { return r.ds_start; }), ended_well),
      d.steps_from = "DeepSpeed's ranges";
    else if (!module.empty()) steps = number_spans(module), d.steps_from = "the zerotrace module";
    else if (!torch_opt.empty()) steps = number_spans(torch_opt), d.steps_from = "PyTorch's optimizer steps";
  } else if (p.step) {
    d.notes.push_back("--step-range " + quoted(p.step_text) +
                      " not used: the program wrote step markers of its own");
  }
  if (!d.own_epochs) {
    auto user = select([](const NameRoles& r) { return r.user_epoch; });
    auto conv = select([](const NameRoles& r) { return r.convention == 'E'; });
    auto hook = select([](const NameRoles& r) { return r.hook == 'E'; });
    auto module = select([](const NameRoles& r) { return r.module == 'E'; });
    if (!user.empty()) epochs = number_spans(user), d.epochs_from = "--epoch-range " + quoted(p.epoch_text);
    else if (!conv.empty()) epochs = number_spans(conv), d.epochs_from = "NVTX ranges 'epoch N'";
    else if (!hook.empty()) epochs = number_spans(hook), d.epochs_from = hook_words(hook_source_of('E'));
    else if (!module.empty()) epochs = number_spans(module), d.epochs_from = "the zerotrace module";
  } else if (p.epoch) {
    d.notes.push_back("--epoch-range " + quoted(p.epoch_text) +
                      " not used: the program wrote epoch markers of its own");
  }
  // A pattern that matched nothing is said, with what the trace has instead.
  auto unmatched = [&](const std::optional<std::regex>& re, const std::string& text, const char* flag, bool user_used) {
    if (!re || user_used) return;
    std::string line = std::string(flag) + " " + quoted(text) + " matched no range in the trace";
    std::vector<std::string> some;
    for (auto& [n, name] : names_by_count) {
      // CUDA runtime calls and synchronizations (the CUPTI decoder's) are not what a user names.
      if (name.rfind("cuda", 0) == 0 || name.rfind("sync:", 0) == 0) continue;
      some.push_back(quoted(name));
      if (some.size() == 5) break;
    }
    if (names_by_count.empty())
      line += " (it has no ranges: NVTX ranges reach the trace only when CUDA tracing is on)";
    else if (!some.empty()) {
      line += " (its most frequent: ";
      for (size_t i = 0; i < some.size(); ++i) line += (i ? ", " : "") + some[i];
      line += ")";
    }
    d.notes.push_back(line);
  };
  unmatched(p.step, p.step_text, "--step-range", d.steps_from.rfind("--step-range", 0) == 0 || d.own_steps);
  unmatched(p.epoch, p.epoch_text, "--epoch-range", d.epochs_from.rfind("--epoch-range", 0) == 0 || d.own_epochs);

  // Phases: DeepSpeed's and the zerotrace module's, always.
  struct Phase {
    Range range;
    std::string name;
  };
  std::vector<Phase> phases;
  for (auto& n : ranges)
    if (!n.roles->phase.empty()) phases.push_back({n.range, n.roles->phase});

  // Nesting: a step's epoch, a phase's step and epoch (derived ones, else the program's own).
  std::map<int64_t, std::vector<Span>> step_spans, epoch_spans;
  auto load_own = [&](int kind, std::map<int64_t, std::vector<Span>>& into) {
    Stmt s(db, "SELECT rank, t_start, t_end, " + std::string(kind == 0 ? "step" : "epoch") +
                   " FROM marker WHERE kind = ?1 AND id NOT BETWEEN ?2 AND ?3 ORDER BY t_start");
    s.bind(1, int64_t(kind)).bind(2, skip_first).bind(3, skip_last);
    while (s.step()) into[s.i64(0)].push_back({s.i64(0), s.i64(1), s.opt(2), s.opt(3).value_or(0)});
  };
  if (d.own_epochs) load_own(2, epoch_spans);
  for (auto& e : epochs) epoch_spans[e.rank].push_back(e);
  if (d.own_steps) load_own(0, step_spans);
  for (auto& s : steps) step_spans[s.rank].push_back(s);
  for (auto* m : {&step_spans, &epoch_spans})
    for (auto& [rank, v] : *m)
      std::stable_sort(v.begin(), v.end(), [](const Span& a, const Span& b) { return a.t_start < b.t_start; });

  // The rows: epochs, then steps (each in its epoch), then phases (in their step and epoch).
  std::vector<DerivedMarker>& rows = *rows_out;
  rows.clear();
  for (auto& e : epochs)
    rows.push_back(
        {e.rank, MarkerKind::Epoch, "epoch " + std::to_string(e.index), e.t_start, e.t_end, std::nullopt, e.index});
  for (auto& s : steps)
    rows.push_back({s.rank, MarkerKind::Step, "step " + std::to_string(s.index), s.t_start, s.t_end, s.index,
                    index_at(epoch_spans, s.rank, s.t_start)});
  for (auto& ph : phases)
    rows.push_back({ph.range.rank, MarkerKind::Phase, ph.name, ph.range.t_start, ph.range.t_end,
                    index_at(step_spans, ph.range.rank, ph.range.t_start),
                    index_at(epoch_spans, ph.range.rank, ph.range.t_start)});
  d.epochs = int64_t(epochs.size());
  d.steps = int64_t(steps.size());
  d.phases = int64_t(phases.size());
  *used = rules;
}

// meta derived_markers: the ids of the rows derived earlier, [first, last] (an empty range when none).
std::pair<int64_t, int64_t> derived_earlier(sqlite3* db) {
  const std::string earlier = meta(db, "derived_markers");
  long long first = 0, last = -1;
  if (earlier.empty() || std::sscanf(earlier.c_str(), "%lld %lld", &first, &last) != 2) return {0, -1};
  return {int64_t(first), int64_t(last)};
}

}  // namespace

Status check_range_pattern(const std::string& pattern, const std::string& flag) {
  if (pattern.empty()) return Status::Error(flag + ": empty; give a range name or a regular expression");
  try {
    std::regex re(pattern);
  } catch (const std::regex_error& e) {
    return Status::Error(flag + " " + quoted(pattern) + ": not a regular expression (" + e.what() + ")");
  }
  return Status::Ok();
}

std::string range_label(std::string_view name) {
  // The hooks' domains, as the job knows the framework whose callbacks they are.
  constexpr std::pair<std::string_view, std::string_view> kOwn[] = {
      {"zerotrace.transformers", "Trainer"}, {"zerotrace.lightning", "Lightning"}, {"zerotrace.torch", "PyTorch"}};
  std::string_view domain;
  const std::string_view rest = bare(name, &domain);
  for (auto& [d, own] : kOwn)
    if (domain == d) return std::string(own) + " " + std::string(rest);
  return std::string(name);
}

std::string describe(const DerivedMarkers& d) {
  auto part = [](int64_t n, const char* what, const std::string& from, bool own) {
    std::string s = std::to_string(n) + " " + what + (n == 1 ? "" : "s");
    if (own) s += " (the program's own)";
    else if (!from.empty()) s += " (from " + from + ")";
    return s;
  };
  return part(d.steps, "step", d.steps_from, d.own_steps) + ", " + part(d.epochs, "epoch", d.epochs_from, d.own_epochs);
}

Status derive_steps(const std::string& path, const StepRules& given, DerivedMarkers* out) {
  *out = DerivedMarkers{};
  if (!given.step_range.empty())
    if (Status s = check_range_pattern(given.step_range, "--step-range"); !s) return s;
  if (!given.epoch_range.empty())
    if (Status s = check_range_pattern(given.epoch_range, "--epoch-range"); !s) return s;
  if (Status s = validate_trace_file(path); !s) return s;
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    std::string m = db ? one_line(sqlite3_errmsg(db)) : "out of memory";
    sqlite3_close(db);
    return Status::Error(path + ": cannot open the trace for writing: " + m);
  }
  sqlite3_busy_timeout(db, 5000);
  try {
    detail::exec(db, "BEGIN IMMEDIATE");
    // Earlier derived rows go first.
    const auto [first, last] = derived_earlier(db);
    if (first <= last) {
      Stmt del(db, "DELETE FROM marker WHERE id BETWEEN ?1 AND ?2");
      del.bind(1, first).bind(2, last);
      del.step_done();
    }
    std::vector<DerivedMarker> rows;
    StepRules rules;
    plan_markers(db, given, true, 0, -1, out, &rows, &rules);

    // The rows, after every id the trace has.
    int64_t next_id = detail::query_int(db, "SELECT coalesce(max(id), 0) FROM marker") + 1;
    const int64_t first_id = next_id;
    Stmt ins(db,
             "INSERT INTO marker(id, rank, kind, name_id, t_start, t_end, step, micro_step, epoch, value) "
             "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, NULL, ?8, NULL)");
    std::unordered_map<std::string, int64_t> name_ids;
    auto name_id = [&](const std::string& text) {
      auto [it, fresh] = name_ids.try_emplace(text, 0);
      if (fresh) it->second = intern(db, text);
      return it->second;
    };
    for (auto& r : rows) {
      ins.bind(1, next_id++).bind(2, r.rank).bind(3, int64_t(r.kind)).bind(4, name_id(r.name)).bind(5, r.t_start);
      ins.bind_opt(6, r.t_end).bind_opt(7, r.step).bind_opt(8, r.epoch);
      ins.step_done();
    }

    set_meta(db, "derived_markers", next_id > first_id ? std::to_string(first_id) + " " + std::to_string(next_id - 1) : "");
    set_meta(db, "steps_from", out->steps_from);
    set_meta(db, "epochs_from", out->epochs_from);
    set_meta(db, "step_range", rules.step_range);
    set_meta(db, "epoch_range", rules.epoch_range);
    detail::exec(db, "COMMIT");
  } catch (const SqlError& e) {
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    sqlite3_close(db);
    return Status::Error(path + ": deriving steps failed: " + e.what());
  }
  sqlite3_close(db);
  return Status::Ok();
}

Status derive_steps_in_memory(const TraceReader& reader, const StepRules& given, DerivedMarkers* out,
                              std::vector<DerivedMarker>* rows) {
  *out = DerivedMarkers{};
  rows->clear();
  if (!given.step_range.empty())
    if (Status s = check_range_pattern(given.step_range, "--step-range"); !s) return s;
  if (!given.epoch_range.empty())
    if (Status s = check_range_pattern(given.epoch_range, "--epoch-range"); !s) return s;
  try {
    StepRules rules;
    const auto [first, last] = derived_earlier(reader.handle());
    plan_markers(reader.handle(), given, false, first, last, out, rows, &rules);
  } catch (const SqlError& e) {
    *out = DerivedMarkers{};
    rows->clear();
    return Status::Error(reader.path() + ": deriving steps failed: " + e.what());
  }
  return Status::Ok();
}

}  // namespace zt::db
