// zt faults: the fault catalog, one line per failpoint (inject/failpoint/catalog.h).
#include <cstdio>
#include <string>

#include "commands.h"
#include "zt/fail/catalog.h"
#include "zt/fail/failpoint.h"

namespace zt::cli {

void add_faults_command(CLI::App& app, Action& action) {
  auto* sub = app.add_subcommand("faults", "List the fault catalog (the failpoints --fault and ZT_FAULTS can switch on)\n"
                                           "Example: zt faults;  zt faults --check 'host.epoch_leak[epoch>=1]=return(pow2)'");
  auto verbose = std::make_shared<bool>(false);
  auto check = std::make_shared<std::string>();
  sub->add_flag("-v,--verbose", *verbose, "also print what each fault does for real");
  sub->add_option("--check", *check, "parse a spec (as --fault / ZT_FAULTS take it) and say what it means");
  sub->callback([&action, verbose, check] {
    action = [verbose, check]() -> int {
      if (!check->empty()) {
        std::vector<fail::Spec> specs;
        if (Status s = fail::parse_specs(*check, &specs); !s) return fail(s.message());
        for (const auto& sp : specs) {
          std::printf("%s: %zu condition(s), actions:", sp.name.c_str(), sp.when.size());
          for (size_t i = 0; i < sp.terms.size(); ++i) {
            const auto& t = sp.terms[i];
            char pct[32] = "";
            if (t.probability < 1) std::snprintf(pct, sizeof pct, "with probability %g%%, ", t.probability * 100);
            std::printf("%s %s%s%s%s", i ? " then" : "", pct, t.count >= 0 ? (std::to_string(t.count) + " times ").c_str() : "",
                        fail::action_name(t.action), t.has_arg ? ("(" + t.arg + ")").c_str() : "");
          }
          std::printf("\n");
        }
        return kExitOk;
      }
      std::printf("%-38s %-6s %s\n", "FAULT", "REPORT", "WHERE");
      for (const auto& e : fail::catalog()) {
        std::printf("%-38s %-6s %s\n", e.name, e.report, e.site);
        if (*verbose) std::printf("    %s\n", e.mechanism);
      }
      std::printf("\nSyntax: NAME[COND,...]=[P%%][N*]ACTION[(ARG)][->...]; COND on step, micro, epoch, rank, call "
                  "(=, !=, >=, <=, >, <, %%N=R); ACTION off, return, print, sleep, delay, panic, pause, yield.\n"
                  "Switch on with zt train --fault SPEC (repeatable) or ZT_FAULTS=\"SPEC;SPEC\"; zt faults -v explains each.\n");
      return kExitOk;
    };
  });
}

}  // namespace zt::cli
