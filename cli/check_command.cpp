// zt check: pass/fail checks on a trace for CI (inject/check).
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>

#include "commands.h"
#include "output_paths.h"
#include "zt/check/check.h"
#include "zt/common/units.h"

namespace zt::cli {

namespace {

struct CheckArgs {
  std::string trace;
  bool run = false, leaks = false, placement = false;
  std::string budget;
  bool budget_given = false;  // --budget '' is refused, not taken for no budget
  std::vector<std::string> steps;  // --steps [N]: empty value = against the plan
  bool steps_given = false;
  std::string junit;
  std::string leak_threshold;
  std::string rss_threshold;
};

int run_check(const CheckArgs& a) {
  // Before anything is written: a bad trace still gets a JUnit file, which must not be the trace.
  if (Status s = check_output_if_given(a.junit, {a.trace}); !s) return fail(s.message());
  check::Options o;
  o.run = a.run;
  o.leaks = a.leaks;
  o.placement = a.placement;
  if (a.budget_given) {
    check::Budget b;
    if (Status s = check::parse_budget(a.budget, &b); !s) return fail(s.message());
    o.budget = b;
  }
  if (a.steps_given) {
    o.steps = true;
    const std::string v = a.steps.empty() ? "" : a.steps.front();
    if (!v.empty()) {
      char* end = nullptr;
      errno = 0;
      long long n = std::strtoll(v.c_str(), &end, 10);
      if (!end || *end || n < 0 || errno == ERANGE || v.empty())
        return fail("--steps: '" + v + "' is not a number of steps");
      o.expected_steps = n;
    }
  }
  if (!a.leak_threshold.empty()) {
    std::string why;
    auto b = parse_size_i64(a.leak_threshold, &why);
    if (!b) return fail("--leak-threshold: '" + a.leak_threshold + "' " + why + " (try 512KiB)");
    if (*b == 0) return fail("--leak-threshold: '" + a.leak_threshold + "' is not a size above 0 (try 512KiB)");
    o.leak_threshold = *b;
  }
  if (!a.rss_threshold.empty()) {
    std::string why;
    auto b = parse_size_i64(a.rss_threshold, &why);
    if (!b) return fail("--rss-threshold: '" + a.rss_threshold + "' " + why + " (try 8MiB)");
    if (*b == 0) return fail("--rss-threshold: '" + a.rss_threshold + "' is not a size above 0 (try 8MiB)");
    o.rss_threshold = *b;
  }
  check::Report report;
  if (Status s = check::run_checks(a.trace, o, &report); !s) {
    // Bad input: CI still gets a JUnit file that says why.
    if (!a.junit.empty()) (void)check::write_file_atomic(a.junit, check::junit_xml_error(a.trace, s.message()));
    return fail(s.message());
  }
  std::cout << check::format_text(report) << std::flush;
  if (!a.junit.empty()) {
    if (Status s = check::write_file_atomic(a.junit, check::junit_xml(report)); !s) return fail(s.message());
    std::cout << "junit: " << a.junit << "\n";
  }
  return report.failed() ? kExitFailed : kExitOk;
}

}  // namespace

void add_check_command(CLI::App& app, Action& action) {
  auto* c = app.add_subcommand(
      "check",
      "Pass/fail checks on a trace for CI: a run that failed or was killed, memory that grows across epochs, "
      "tensors on the wrong device, peak memory over a budget, steps lost.\n"
      "With no check named: --run, --leaks, --placement and --steps (vs the plan).\n"
      "A check named here that cannot run on the trace (no plan for --steps, no host allocations for "
      "--budget host=) does not pass: CANNOT RUN, with what it needs.\n"
      "Exit 0 all passed, 1 a check failed or a named one could not run, 2 bad input.\n"
      "Example: zt check run.db --junit check.xml\n"
      "         zt check run.db --budget cuda=70GiB,host=900GiB --steps 200 --leaks --leak-threshold 1MiB");
  auto a = std::make_shared<CheckArgs>();
  c->add_option("TRACE", a->trace, "trace file")->required();
  c->add_flag("--run", a->run,
              "the run must have ended ok: a run that failed, died on a signal, was terminated or never closed "
              "its trace fails");
  c->add_flag("--leaks", a->leaks,
              "live host or device bytes at each epoch's start (and end) must not grow by the threshold per epoch "
              "(without epochs: 4 windows of steps, else of time between the first and last tenth of the run); "
              "on a probed trace, nor the RSS beyond what the recorded allocations explain");
  c->add_flag("--placement", a->placement,
              "tensors where the run's zero_optimization config puts them (offloaded states on the host); "
              "no device_mismatch errors");
  auto* budget = c->add_option("--budget", a->budget, "peak allocated per accelerator and per host, e.g. cuda=70GiB,host=900GiB");
  auto* steps = c->add_option("--steps", a->steps,
                              "steps run must equal N (without N: the plan the trace records, data.steps_planned)")
                    ->expected(0, 1)
                    ->type_name("[N]");
  c->add_option("--junit", a->junit, "also write a JUnit XML report here (atomically)");
  c->add_option("--leak-threshold", a->leak_threshold, "growth per epoch that counts as a leak (default: 512KiB, or 1% of a smaller memory, 64KiB at least)");
  c->add_option("--rss-threshold", a->rss_threshold,
                "RSS growth per epoch beyond the recorded allocations that counts as a leak (probed traces; "
                "default 4MiB)");
  c->callback([&action, a, steps, budget] {
    a->steps_given = steps->count() > 0;
    a->budget_given = budget->count() > 0;
    action = [a] { return run_check(*a); };
  });
}

}  // namespace zt::cli
