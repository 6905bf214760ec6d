// inject/failpoint: named failure sites in the trainer, switched on by a spec (issue 9).
//
// Owns: the spec syntax, the process-wide registry of configured failpoints, evaluating a site
// (conditions, counts, probabilities from one recorded seed), running the generic actions, and
// recording every firing as a `fault` row. The catalog of site names lives in catalog.h.
// May call: zt_probe (the fault row), zt_common. It is the leaf of inject/: the trainer's
// sites call it; everything else in inject/ (scenarios, repro, check) sits above the trainer.
//
// Spec syntax (fail-rs / FreeBSD fail(9), plus conditions in brackets):
//   SPECS   := SPEC (';' SPEC)*                         ZT_FAULTS="a=return;b[step>=3]=1*panic(x)"
//   SPEC    := NAME ['[' COND (',' COND)* ']'] '=' TERM ('->' TERM)*
//   COND    := FIELD OP INT | FIELD '%' INT '=' INT      FIELD: step micro epoch rank call
//              OP: = == != >= <= > <                     (call: the Nth evaluation of the site
//                                                          on that rank, from 1)
//   TERM    := [P '%'] [COUNT '*'] ACTION ['(' ARG ')']
//   ACTION  := off | return | print | sleep | delay | panic | pause | yield
//   ARG runs to its matching ')' and nothing may follow it. return's ARG is checked against the
//   catalog (CatalogEntry::arg_ok: what the site takes, empty = its default); sleep/delay take
//   milliseconds, print/panic any message, off/pause/yield none.
// Evaluation, as in fail-rs: when the conditions hold, the terms are tried in order; a term
// whose count is used up, or whose probability draw fails, passes to the next; the first
// that passes runs. `return` is what switches a mechanism on: the site gets the argument
// (the trainer's code then does the faulty thing for real). `print` logs a line, `sleep`/
// `delay` wait ARG ms, `yield` yields, `pause` blocks until the registry is reconfigured or
// cleared, `panic` prints the message and aborts the process (SIGABRT: a real crash).
//
// Determinism: counts and calls are kept per (site, rank), and a probability draw is a hash
// of (seed, site, rank, call), so rank threads racing never change which calls fire, and
// the same seed repeats a run exactly.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zt/common/status.h"

namespace zt::probe {
class Recorder;
}

namespace zt::fail {

enum class Action { Off, Return, Print, Sleep, Delay, Panic, Pause, Yield };
const char* action_name(Action a);

struct Condition {
  enum class Field { Step, Micro, Epoch, Rank, Call };
  enum class Op { Eq, Ne, Ge, Le, Gt, Lt, Mod };  // Mod: value % modulus == rhs
  Field field = Field::Step;
  Op op = Op::Eq;
  int64_t rhs = 0;
  int64_t modulus = 0;
};

struct Term {
  double probability = 1.0;  // 0 < p <= 1
  int64_t count = -1;        // -1: unlimited
  Action action = Action::Return;
  std::string arg;
  bool has_arg = false;
};

struct Spec {
  std::string name;
  std::vector<Condition> when;
  std::vector<Term> terms;
  std::string text;  // as written (for fault rows and messages)
};

// Parses "a=...;b=..." (also accepts newlines between specs). Checks the names, and each
// return's argument, against the catalog. Errors name the spec and the problem ("'zero.nrom=return': unknown fault
// 'zero.nrom' (zt faults lists the catalog)").
Status parse_specs(std::string_view text, std::vector<Spec>* out);
Status parse_spec(std::string_view text, Spec* out);

// Where a site is evaluated. Fields left at -1 do not match any condition on them.
struct Context {
  int rank = -1;
  int64_t step = -1, micro = -1, epoch = -1;
  probe::Recorder* rec = nullptr;  // where the fault row goes (may be null)
};

// The position of the calling thread in the run (the trainer sets it per micro-step): eval()
// fills a Context's unknown (-1 / null) fields from it, so sites deep in the code (the
// communicator, the checkpoint writer) get the rank, step and epoch without passing them.
void set_thread_position(const Context& position);
const Context& thread_position();

// What a site gets when its `return` action fires.
struct Fired {
  std::string arg;      // the return's argument ("" when none)
  std::string trigger;  // why it fired: the spec text and the call number, as in the fault row
};

// The registry is process-wide: a run configures it, and clears it when it ends.
// Replaces every configured failpoint; wakes anything paused.
void configure(const std::vector<Spec>& specs, uint64_t seed);
// Removes every failpoint; wakes anything paused.
void clear();
uint64_t seed();
std::vector<Spec> configured();
// How many times each configured site fired since configure() (for verdicts and tests).
int64_t fired_count(std::string_view name);

namespace detail {
extern std::atomic<bool> g_any;
}
inline bool any_configured() { return detail::g_any.load(std::memory_order_relaxed); }

// Evaluates site `name` (a catalog name). Without a configured failpoint for it: nothing,
// fast. Every firing (whatever its action) is a fault row when ctx.rec is set; `details`
// is added to the row (what the mechanism did, when the site knows it before firing).
std::optional<Fired> eval(std::string_view name, const Context& ctx, std::string_view details = {});

// Records a fault row for a site that fired (eval does it; a site that learns more after
// firing, such as the bytes it leaked, may add a second row with the details).
void record(std::string_view name, const Context& ctx, std::string_view trigger, std::string_view details);

// RAII: configures in the constructor, clears in the destructor (tests, runs).
class Scope {
 public:
  Scope(const std::vector<Spec>& specs, uint64_t seed) { configure(specs, seed); }
  ~Scope() { clear(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

}  // namespace zt::fail

// The form sites use: one relaxed load when nothing is configured.
#define ZT_FAIL(name, ctx) \
  (::zt::fail::any_configured() ? ::zt::fail::eval((name), (ctx)) : ::std::optional<::zt::fail::Fired>())
// ... with the details for the fault row (evaluated only when something is configured).
#define ZT_FAIL_D(name, ctx, details) \
  (::zt::fail::any_configured() ? ::zt::fail::eval((name), (ctx), (details)) : ::std::optional<::zt::fail::Fired>())
