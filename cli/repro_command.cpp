// zt repro: replay a bug report's scenario, then its fix, and print the verdict from the traces.
#include <cstdlib>
#include <iostream>

#include <filesystem>

#include "commands.h"
#include "output_paths.h"
#include "zt/repro/runner.h"
#include "zt/repro/scenario.h"

namespace zt::cli {

void add_repro_command(CLI::App& app, Action& action) {
  auto* sub = app.add_subcommand(
      "repro",
      "Replay a bug report scenario with its faults, then with its known fix, and print a verdict from the traces "
      "(REPRODUCED / NOT REPRODUCED / INCONCLUSIVE, and whether the fix cures it).\n"
      "Exit 0 only when reproduced and cured, 1 otherwise, 2 for a bad scenario file.\n"
      "Example: zt repro r3-internlm2-20b-no-zero-oom --json r3.json   (a shipped scenario by name)\n"
      "         zt repro my-scenario.yaml");
  auto path = std::make_shared<std::string>();
  auto json_out = std::make_shared<std::string>();
  auto keep = std::make_shared<std::string>();
  auto seed = std::make_shared<uint64_t>(0);
  auto virt = std::make_shared<bool>(false);
  auto quiet = std::make_shared<bool>(false);
  sub->add_option("scenario", *path,
                  "scenario file, or the name of a shipped one (zt demo lists where they are: inject/scenarios in a "
                  "checkout, share/zerotrace/scenarios installed)")
      ->required();
  sub->add_option("--json", *json_out, "also write the verdict as JSON (atomically)");
  sub->add_flag("--virtual", *virt,
                "run the full-size scenario (the report's model and cluster) in virtual mode: sizes only, one rank "
                "standing for all; default: the small real-compute variant");
  sub->add_option("--keep", *keep, "directory for the traces bug.db and fix.db (default ./zt-repro-SCENARIO)");
  auto* seed_opt = sub->add_option("--seed", *seed, "seed of the runs and of the faults' draws (default: the scenario's)");
  sub->add_flag("-q,--quiet", *quiet, "no progress lines, only the verdict");
  sub->callback([&action, path, json_out, keep, seed, virt, quiet, seed_opt] {
    action = [path, json_out, keep, seed, virt, quiet, seed_opt]() -> int {
      // A name with no file of that name here: the shipped scenario of that name.
      if (std::error_code ec; !std::filesystem::exists(*path, ec))
        if (const std::string shipped = shipped_scenario(*path); !shipped.empty()) *path = shipped;
      repro::Scenario s;
      if (Status st = repro::load_scenario(*path, &s); !st) return fail(st.message());
      // Before the runs: the verdict must not replace the scenario, nor the runs' traces
      // (KEEP/bug.db, KEEP/fix.db) or checkpoints (KEEP/ckpt-*, removed first) the scenario.
      const std::filesystem::path keep_dir = keep->empty() ? "zt-repro-" + s.name : *keep;
      const std::string bug_db = (keep_dir / "bug.db").string(), fix_db = (keep_dir / "fix.db").string();
      for (const std::string& out : {bug_db, fix_db, (keep_dir / "ckpt-bug").string(), (keep_dir / "ckpt-fix").string()})
        if (inside_directory(*path, out))
          return fail(out + ": the output of --keep " + keep_dir.string() + " is the input scenario " + *path +
                      " (choose another directory)");
      if (!json_out->empty()) {
        for (const std::string& trace : {bug_db, fix_db})
          if (same_file(*json_out, trace))
            return fail(*json_out + ": the --json output is the trace " + trace + " this run writes (choose another file)");
        // --keep out --json out/verdict.json: the run creates out/, where nothing can be overwritten yet.
        const std::filesystem::path parent = std::filesystem::path(*json_out).parent_path();
        const bool in_new_keep_dir =
            !std::filesystem::exists(keep_dir) && same_file(parent.empty() ? "." : parent.string(), keep_dir.string());
        if (!in_new_keep_dir)
          if (Status st = check_output_path(*json_out, {*path}, "scenario"); !st) return fail(st.message());
      }
      if (std::getenv("ZT_FAULTS")) {
        std::fprintf(stderr, "zt repro: warning: ignoring ZT_FAULTS: the scenario brings its own faults\n");
        unsetenv("ZT_FAULTS");
      }
      repro::RunOptions o;
      o.variant = *virt ? repro::Variant::Full : repro::Variant::Small;
      o.keep_dir = *keep;
      if (seed_opt->count() > 0) o.seed = *seed;
      o.progress = *quiet ? nullptr : &std::cout;
      o.command_line = "zt repro " + *path + (*virt ? " --virtual" : "");
      if (seed_opt->count() > 0) o.command_line += " --seed " + std::to_string(*seed);
      repro::ReproResult r;
      if (Status st = repro::run_scenario(s, o, &r); !st) return fail(st.message());
      repro::print_verdict(r, std::cout);
      if (!json_out->empty()) {
        if (Status st = repro::write_json_atomic(*json_out, repro::to_json(r)); !st) return fail(st.message());
        std::cout << "  json      " << *json_out << "\n";
      }
      return r.exit_code() == 0 ? kExitOk : kExitFailed;
    };
  });
}

}  // namespace zt::cli
