#include "zt/fail/failpoint.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "zt/fail/catalog.h"
#include "zt/probe/recorder.h"

namespace zt::fail {

namespace detail {
std::atomic<bool> g_any{false};
}

const char* action_name(Action a) {
  switch (a) {
    case Action::Off: return "off";
    case Action::Return: return "return";
    case Action::Print: return "print";
    case Action::Sleep: return "sleep";
    case Action::Delay: return "delay";
    case Action::Panic: return "panic";
    case Action::Pause: return "pause";
    case Action::Yield: return "yield";
  }
  return "?";
}

// ---------------------------------------------------------------- parsing

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

bool parse_int(std::string_view s, int64_t* out) {
  s = trim(s);
  if (s.empty()) return false;
  bool neg = false;
  if (s.front() == '-') {
    neg = true;
    s.remove_prefix(1);
  }
  if (s.empty()) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    if (v > (INT64_MAX - 9) / 10) return false;
    v = v * 10 + (c - '0');
  }
  *out = neg ? -v : v;
  return true;
}

bool parse_double(std::string_view s, double* out) {
  std::string t(trim(s));
  if (t.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return false;
  *out = v;
  return true;
}

Status cond_error(const std::string& spec, std::string_view cond, const std::string& why) {
  return Status::Error("'" + spec + "': condition '" + std::string(cond) + "': " + why);
}

Status parse_condition(const std::string& spec, std::string_view c, Condition* out) {
  c = trim(c);
  size_t i = 0;
  while (i < c.size() && ((c[i] >= 'a' && c[i] <= 'z') || c[i] == '_')) ++i;
  const std::string_view field = c.substr(0, i);
  if (field == "step") out->field = Condition::Field::Step;
  else if (field == "micro" || field == "micro_step") out->field = Condition::Field::Micro;
  else if (field == "epoch") out->field = Condition::Field::Epoch;
  else if (field == "rank") out->field = Condition::Field::Rank;
  else if (field == "call") out->field = Condition::Field::Call;
  else
    return cond_error(spec, c, "unknown field '" + std::string(field) + "' (step, micro, epoch, rank, call)");
  std::string_view rest = trim(c.substr(i));
  struct OpText {
    const char* text;
    Condition::Op op;
  };
  static const OpText ops[] = {{"==", Condition::Op::Eq}, {"!=", Condition::Op::Ne}, {">=", Condition::Op::Ge},
                               {"<=", Condition::Op::Le}, {"=", Condition::Op::Eq},  {">", Condition::Op::Gt},
                               {"<", Condition::Op::Lt},  {"%", Condition::Op::Mod}};
  for (const auto& o : ops) {
    std::string_view t(o.text);
    if (rest.substr(0, t.size()) != t) continue;
    out->op = o.op;
    rest.remove_prefix(t.size());
    if (o.op == Condition::Op::Mod) {
      const size_t eq = rest.find('=');
      if (eq == std::string_view::npos) return cond_error(spec, c, "expected FIELD%N=R (for example step%4=0)");
      if (!parse_int(rest.substr(0, eq), &out->modulus) || out->modulus <= 0)
        return cond_error(spec, c, "the modulus must be a positive integer");
      rest.remove_prefix(eq + 1);
    }
    if (!parse_int(rest, &out->rhs)) return cond_error(spec, c, "expected an integer after the operator");
    return Status::Ok();
  }
  return cond_error(spec, c, "expected an operator (= != >= <= > < %)");
}

// The position of the ')' closing the '(' at `open` (nested pairs allowed inside a print or
// panic message), or npos.
size_t closing_paren(std::string_view t, size_t open) {
  int depth = 0;
  for (size_t k = open; k < t.size(); ++k) {
    if (t[k] == '(') ++depth;
    else if (t[k] == ')' && --depth == 0) return k;
  }
  return std::string_view::npos;
}

// Where the next "->" between terms is: outside any argument's parentheses.
size_t next_arrow(std::string_view terms) {
  int depth = 0;
  for (size_t k = 0; k + 1 < terms.size(); ++k) {
    if (terms[k] == '(') ++depth;
    else if (terms[k] == ')' && depth > 0) --depth;
    else if (depth == 0 && terms[k] == '-' && terms[k + 1] == '>') return k;
  }
  return std::string_view::npos;
}

Status parse_term(const std::string& spec, const CatalogEntry& fault, std::string_view t, Term* out) {
  t = trim(t);
  const std::string term(t);
  auto err = [&](const std::string& why) { return Status::Error("'" + spec + "': action '" + term + "': " + why); };
  if (t.empty()) return err("no action (expected ACTION, as return)");
  // [P%]
  size_t pct = t.find('%');
  const size_t paren = t.find('(');
  if (pct != std::string_view::npos && (paren == std::string_view::npos || pct < paren)) {
    double p = 0;
    if (!parse_double(t.substr(0, pct), &p) || !(p > 0) || p > 100) return err("the probability must be in (0, 100]%");
    out->probability = p / 100.0;
    t.remove_prefix(pct + 1);
  }
  // [COUNT*]
  const size_t star = t.find('*');
  if (star != std::string_view::npos && (t.find('(') == std::string_view::npos || star < t.find('('))) {
    if (!parse_int(t.substr(0, star), &out->count) || out->count < 0) return err("the count must be an integer >= 0");
    t.remove_prefix(star + 1);
  }
  // ACTION[(ARG)]: the argument runs to its matching ')', and nothing may follow it.
  std::string_view name = t, arg;
  const size_t open = t.find('(');
  if (open != std::string_view::npos) {
    const size_t close = closing_paren(t, open);
    if (close == std::string_view::npos) return err("missing ')'");
    if (close + 1 != t.size())
      return err("unexpected '" + std::string(t.substr(close + 1)) + "' after " + std::string(t.substr(0, close + 1)) +
                 " (one ACTION(ARG) per term; chain terms with ->)");
    name = t.substr(0, open);
    arg = t.substr(open + 1, close - open - 1);
    out->has_arg = true;
    out->arg = std::string(arg);
  }
  name = trim(name);
  static const std::pair<const char*, Action> actions[] = {
      {"off", Action::Off},     {"return", Action::Return}, {"print", Action::Print}, {"sleep", Action::Sleep},
      {"delay", Action::Delay}, {"panic", Action::Panic},   {"pause", Action::Pause}, {"yield", Action::Yield}};
  for (const auto& [n, a] : actions)
    if (name == n) {
      out->action = a;
      if ((a == Action::Sleep || a == Action::Delay)) {
        int64_t ms = 0;
        if (!out->has_arg || !parse_int(out->arg, &ms) || ms < 0)
          return err(std::string(n) + " needs a duration in milliseconds, as " + n + "(100)");
      }
      if ((a == Action::Off || a == Action::Pause || a == Action::Yield) && !out->arg.empty())
        return err(std::string(n) + " takes no argument, got '" + out->arg + "' (write " + n + ")");
      // return passes its argument to the site: the catalog says what the site takes.
      if (a == Action::Return)
        if (std::string why = return_arg_problem(fault, out->arg); !why.empty())
          return Status::Error("'" + spec + "': fault " + why);
      return Status::Ok();
    }
  return err("unknown action '" + std::string(name) + "' (off, return, print, sleep, delay, panic, pause, yield)");
}

}  // namespace

Status parse_spec(std::string_view text, Spec* out) {
  *out = Spec{};
  text = trim(text);
  out->text = std::string(text);
  const std::string spec = out->text;
  if (text.empty()) return Status::Error("an empty fault spec (expected NAME=ACTION, as zero.norm_on_device=return)");
  // NAME [ '[' conds ']' ] '=' terms. The name ends at '[' or '='.
  size_t i = 0;
  while (i < text.size() && text[i] != '[' && text[i] != '=') ++i;
  out->name = std::string(trim(text.substr(0, i)));
  if (out->name.empty()) return Status::Error("'" + spec + "': no fault name before '='");
  const CatalogEntry* fault = find_fault(out->name);
  if (!fault) return Status::Error("'" + spec + "': unknown fault '" + out->name + "' (zt faults lists the catalog)");
  if (i < text.size() && text[i] == '[') {
    const size_t close = text.find(']', i);
    if (close == std::string_view::npos) return Status::Error("'" + spec + "': missing ']' after the conditions");
    std::string_view conds = text.substr(i + 1, close - i - 1);
    while (!trim(conds).empty()) {
      const size_t comma = conds.find(',');
      Condition c;
      if (Status s = parse_condition(spec, conds.substr(0, comma), &c); !s) return s;
      out->when.push_back(c);
      if (comma == std::string_view::npos) break;
      conds.remove_prefix(comma + 1);
    }
    i = close + 1;
    while (i < text.size() && text[i] == ' ') ++i;
  }
  if (i >= text.size() || text[i] != '=')
    return Status::Error("'" + spec + "': expected '=' and an action after the name (as " + out->name + "=return)");
  std::string_view terms = text.substr(i + 1);
  if (trim(terms).empty()) return Status::Error("'" + spec + "': no action after '='");
  while (true) {
    const size_t arrow = next_arrow(terms);
    Term t;
    if (Status s = parse_term(spec, *fault, terms.substr(0, arrow), &t); !s) return s;
    out->terms.push_back(t);
    if (arrow == std::string_view::npos) break;
    terms.remove_prefix(arrow + 2);
  }
  return Status::Ok();
}

Status parse_specs(std::string_view text, std::vector<Spec>* out) {
  out->clear();
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] != ';' && text[i] != '\n') continue;
    std::string_view one = trim(text.substr(start, i - start));
    start = i + 1;
    if (one.empty()) continue;
    Spec s;
    if (Status st = parse_spec(one, &s); !st) return st;
    out->push_back(std::move(s));
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- the registry

namespace {

struct SiteState {
  Spec spec;
  // Per rank (index rank + 1, so rank -1 has a slot): calls seen and, per term, times fired.
  std::map<int, int64_t> calls;
  std::map<int, std::vector<int64_t>> used;
  int64_t fired = 0;
};

struct Registry {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t seed = 0;
  uint64_t generation = 0;  // bumped by configure/clear: wakes pause
  std::vector<SiteState> sites;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: sites may run during exit
  return *r;
}

uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t fnv(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

bool holds(const Condition& c, const Context& ctx, int64_t call) {
  int64_t v = -1;
  switch (c.field) {
    case Condition::Field::Step: v = ctx.step; break;
    case Condition::Field::Micro: v = ctx.micro; break;
    case Condition::Field::Epoch: v = ctx.epoch; break;
    case Condition::Field::Rank: v = ctx.rank; break;
    case Condition::Field::Call: v = call; break;
  }
  if (v < 0) return false;  // the site does not know it: no match
  switch (c.op) {
    case Condition::Op::Eq: return v == c.rhs;
    case Condition::Op::Ne: return v != c.rhs;
    case Condition::Op::Ge: return v >= c.rhs;
    case Condition::Op::Le: return v <= c.rhs;
    case Condition::Op::Gt: return v > c.rhs;
    case Condition::Op::Lt: return v < c.rhs;
    case Condition::Op::Mod: return v % c.modulus == c.rhs;
  }
  return false;
}

std::string term_text(const Term& t) {
  std::string s = action_name(t.action);
  if (t.has_arg) s += "(" + t.arg + ")";
  return s;
}

}  // namespace

void configure(const std::vector<Spec>& specs, uint64_t seed) {
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.sites.clear();
    for (const auto& s : specs) r.sites.push_back(SiteState{s, {}, {}, 0});
    r.seed = seed;
    ++r.generation;
    detail::g_any.store(!r.sites.empty(), std::memory_order_release);
  }
  r.cv.notify_all();
}

void clear() { configure({}, 0); }

uint64_t seed() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.seed;
}

std::vector<Spec> configured() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<Spec> out;
  for (const auto& s : r.sites) out.push_back(s.spec);
  return out;
}

int64_t fired_count(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  int64_t n = 0;
  for (const auto& s : r.sites)
    if (s.spec.name == name) n += s.fired;
  return n;
}

void record(std::string_view name, const Context& ctx, std::string_view trigger, std::string_view details) {
  if (!ctx.rec) return;
  db::FaultRow row;
  row.rank = ctx.rank < 0 ? 0 : ctx.rank;
  row.name = std::string(name);
  row.trigger = std::string(trigger);
  if (ctx.step >= 0) row.step = ctx.step;
  row.details = std::string(details);
  ctx.rec->fault(row);
}

namespace {
thread_local Context t_position;
}

void set_thread_position(const Context& position) { t_position = position; }
const Context& thread_position() { return t_position; }

std::optional<Fired> eval(std::string_view name, const Context& given, std::string_view details) {
  Registry& r = registry();
  Context ctx = given;
  if (ctx.rank < 0) ctx.rank = t_position.rank;
  if (ctx.step < 0) ctx.step = t_position.step;
  if (ctx.micro < 0) ctx.micro = t_position.micro;
  if (ctx.epoch < 0) ctx.epoch = t_position.epoch;
  if (!ctx.rec) ctx.rec = t_position.rec;
  Term chosen;
  std::string trigger;
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    bool found = false;
    for (auto& site : r.sites) {
      if (site.spec.name != name) continue;
      // Every spec of this site counts the evaluation, also after an earlier one fired: `call` is
      // the Nth evaluation of the site on that rank whatever the other specs did.
      const int64_t call = ++site.calls[ctx.rank];
      if (found) continue;
      bool ok = true;
      for (const auto& c : site.spec.when) ok = ok && holds(c, ctx, call);
      if (!ok) continue;
      auto& used = site.used[ctx.rank];
      used.resize(site.spec.terms.size(), 0);
      for (size_t k = 0; k < site.spec.terms.size(); ++k) {
        const Term& t = site.spec.terms[k];
        if (t.count >= 0 && used[k] >= t.count) continue;
        if (t.probability < 1.0) {
          const uint64_t h = mix(r.seed ^ mix(fnv(name) ^ mix(uint64_t(ctx.rank + 1) * 0x100000001b3ull + uint64_t(call))));
          const double u = double(h >> 11) * (1.0 / 9007199254740992.0);
          if (u >= t.probability) continue;
        }
        if (t.count >= 0) ++used[k];  // fail-rs (Action::get_task): the count is taken once the draw passed
        chosen = t;
        found = true;
        ++site.fired;
        trigger = site.spec.text + " (call " + std::to_string(call) + (ctx.rank >= 0 ? ", rank " + std::to_string(ctx.rank) : "") +
                  (r.seed ? ", seed " + std::to_string(r.seed) : "") + ")";
        break;
      }
    }
    if (!found) return std::nullopt;
    generation = r.generation;
  }
  if (chosen.action == Action::Off) return std::nullopt;  // an explicit off: nothing happens, nothing recorded
  std::string what = term_text(chosen);
  if (!details.empty()) what += ": " + std::string(details);
  record(name, ctx, trigger, what);
  switch (chosen.action) {
    case Action::Return: return Fired{chosen.arg, trigger};
    case Action::Print:
      std::fprintf(stderr, "zt: failpoint %.*s: %s\n", int(name.size()), name.data(),
                   chosen.has_arg ? chosen.arg.c_str() : trigger.c_str());
      return std::nullopt;
    case Action::Sleep:
    case Action::Delay:
      std::this_thread::sleep_for(std::chrono::milliseconds(std::strtoll(chosen.arg.c_str(), nullptr, 10)));
      return std::nullopt;
    case Action::Yield: std::this_thread::yield(); return std::nullopt;
    case Action::Pause: {
      std::unique_lock<std::mutex> lock(r.mu);
      r.cv.wait(lock, [&] { return r.generation != generation; });
      return std::nullopt;
    }
    case Action::Panic: {
      const std::string msg = "zt: failpoint " + std::string(name) + " panicked" +
                              (chosen.has_arg ? ": " + chosen.arg : std::string()) + "\n";
      (void)!::write(2, msg.data(), msg.size());
      std::abort();  // the recorder's crash handler flushes the trace and marks the run
    }
    case Action::Off: break;
  }
  return std::nullopt;
}

}  // namespace zt::fail
