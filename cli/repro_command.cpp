// zt repro: replay a bug report's scenario, then its fix, and print the verdict from the traces.
#include <algorithm>
#include <cstdlib>
#include <iostream>

#include <filesystem>

#include "commands.h"
#include "output_paths.h"
#include "zt/repro/runner.h"
#include "zt/repro/scenario.h"

namespace zt::cli {

namespace {

// The shipped scenarios' names, sorted.
std::vector<std::string> shipped_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(scenario_dir(), ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec))
    if (it->path().extension() == ".yaml") names.push_back(it->path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

// `zt repro --list`: each shipped scenario, its report and title, one line each.
int list_scenarios() {
  const std::string dir = scenario_dir();
  std::cout << "shipped scenarios (" << dir << "):\n";
  for (const std::string& n : shipped_names()) {
    repro::Scenario s;
    if (Status st = repro::load_scenario(dir + "/" + n + ".yaml", &s); !st) {
      std::cout << "  " << n << "  (cannot be read: " << st.message() << ")\n";
      continue;
    }
    std::cout << "  " << n << "\n      " << s.report_id << ": " << s.report_title << "\n";
  }
  std::cout << "run one by its name or a unique prefix of it (zt repro r2), or give a scenario file.\n";
  return kExitOk;
}

// A scenario argument that is no file: a shipped scenario of that name, or the one its prefix names.
// "" with *why set when there is none or several.
std::string shipped_by_prefix(const std::string& arg, std::string* why) {
  if (const std::string exact = shipped_scenario(arg); !exact.empty()) return exact;
  std::vector<std::string> hits;
  const std::vector<std::string> names = shipped_names();
  for (const auto& n : names)
    if (!arg.empty() && n.compare(0, arg.size(), arg) == 0) hits.push_back(n);
  if (hits.size() == 1) return shipped_scenario(hits[0]);
  std::string list;
  for (const auto& n : hits.empty() ? names : hits) list += "\n  " + n;
  *why = hits.empty() ? arg + ": no such scenario file, nor a shipped scenario of that name; the shipped ones:" + list
                      : arg + ": names several shipped scenarios; give more of the name:" + list;
  return "";
}

}  // namespace

void add_repro_command(CLI::App& app, Action& action) {
  auto* sub = app.add_subcommand(
      "repro",
      "Replay a bug report scenario with its faults, then with its known fix, and print a verdict from the traces "
      "(REPRODUCED / NOT REPRODUCED / DIFFERENT FAILURE / INCONCLUSIVE, and whether the fix cures it).\n"
      "Exit 0 only when reproduced and cured, 1 otherwise, 2 for a bad scenario file. The format: "
      "docs/scenario-format.md.\n"
      "Example: zt repro r3-internlm2-20b-no-zero-oom --json r3.json   (a shipped scenario by name)\n"
      "         zt repro r3          (a unique prefix of a shipped scenario's name)\n"
      "         zt repro --list      (the shipped scenarios: name, report, one line)\n"
      "         zt repro my-scenario.yaml\n"
      "         zt repro init --ds-config ds.json --hf-config config.json --gpus 8 --gpu-memory 80GiB -o my.yaml");
  auto path = std::make_shared<std::string>();
  auto json_out = std::make_shared<std::string>();
  auto keep = std::make_shared<std::string>();
  auto seed = std::make_shared<uint64_t>(0);
  auto virt = std::make_shared<bool>(false);
  auto quiet = std::make_shared<bool>(false);
  auto list = std::make_shared<bool>(false);
  sub->add_option("scenario", *path,
                  "scenario file, or the name (or a unique prefix of the name) of a shipped one (zt repro --list)");
  sub->add_flag("--list", *list, "list the shipped scenarios (name, report, one line) and exit");
  add_repro_init_command(*sub, action);
  sub->add_option("--json", *json_out, "also write the verdict as JSON (atomically)");
  sub->add_flag("--virtual", *virt,
                "run the full-size scenario (the report's model and cluster) in virtual mode: sizes only, one rank "
                "standing for all; default: the small real-compute variant");
  sub->add_option("--keep", *keep, "directory for the traces bug.db and fix.db (default ./zt-repro-SCENARIO)");
  auto* seed_opt = sub->add_option("--seed", *seed, "seed of the runs and of the faults' draws (default: the scenario's)");
  sub->add_flag("-q,--quiet", *quiet, "no progress lines, only the verdict");
  sub->callback([&action, sub, path, json_out, keep, seed, virt, quiet, seed_opt, list] {
    if (!sub->get_subcommands().empty()) return;  // zt repro init: its own action
    action = [path, json_out, keep, seed, virt, quiet, seed_opt, list]() -> int {
      if (*list) return list_scenarios();
      if (path->empty()) return fail("repro: give a scenario file or a shipped scenario's name (zt repro --list lists them)");
      // A name with no file of that name here: the shipped scenario of that name, or of that prefix.
      if (std::error_code ec; !std::filesystem::exists(*path, ec)) {
        std::string why;
        const std::string shipped = shipped_by_prefix(*path, &why);
        if (shipped.empty()) return fail(why);
        *path = shipped;
      }
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
