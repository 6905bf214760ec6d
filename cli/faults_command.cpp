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
  auto* check_opt =
      sub->add_option("--check", *check, "parse a spec (as --fault / ZT_FAULTS take it) and say what it means");
  sub->callback([&action, verbose, check, check_opt] {
    const bool checking = check_opt->count() > 0;
    action = [verbose, check, checking]() -> int {
      if (checking) {
        std::vector<fail::Spec> specs;
        if (Status s = fail::parse_specs(*check, &specs); !s) return fail(s.message());
        if (specs.empty())
          return fail("faults --check: no spec in '" + *check +
                      "' (expected NAME=ACTION, as zero.norm_on_device=return; zt faults lists the catalog)");
        for (const auto& sp : specs) {
          std::printf("%s: %zu condition(s), actions:", sp.name.c_str(), sp.when.size());
          for (size_t i = 0; i < sp.terms.size(); ++i) {
            const auto& t = sp.terms[i];
            char pct[64] = "";
            if (t.probability < 1) std::snprintf(pct, sizeof pct, "with probability %g%%, ", t.probability * 100);
            std::printf("%s %s%s%s%s", i ? " then" : "", pct, t.count >= 0 ? (std::to_string(t.count) + " times ").c_str() : "",
                        fail::action_name(t.action), t.has_arg ? ("(" + t.arg + ")").c_str() : "");
          }
          std::printf("\n");
        }
        return kExitOk;
      }
      std::printf("%-38s %-6s %-24s %s\n", "FAULT", "REPORT", "RETURN", "WHERE");
      for (const auto& e : fail::catalog()) {
        const std::string ret = e.arg_syntax ? std::string("return(") + e.arg_syntax + ")" : std::string("return");
        std::printf("%-38s %-6s %-24s %s\n", e.name, e.report, ret.c_str(), e.site);
        if (*verbose) {
          std::printf("    %s\n", e.mechanism);
          if (e.arg) std::printf("    return(ARG): ARG is a %s: %s\n", e.arg, e.arg_allowed);
          else std::printf("    return takes no argument\n");
        }
      }
      std::printf("\nSyntax: NAME[COND,...]=[P%%][N*]ACTION[(ARG)][->...]; COND on step, micro, epoch, rank, call "
                  "(=, !=, >=, <=, >, <, %%N=R); ACTION off, return, print, sleep, delay, panic, pause, yield.\n"
                  "RETURN: the argument return passes to the site (return alone: its default); print(MSG) and "
                  "panic(MSG) take any message, sleep(MS) and delay(MS) milliseconds.\n"
                  "Switch on with zt train --fault SPEC (repeatable) or ZT_FAULTS=\"SPEC;SPEC\"; zt faults -v explains each.\n");
      return kExitOk;
    };
  });
}

}  // namespace zt::cli
