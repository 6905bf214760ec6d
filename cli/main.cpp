// zt: the one command-line entry point. Subcommands live in the *_commands.cpp files.
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "zt/version.h"

namespace zt::cli {

int fail(const std::string& message) {
  std::fprintf(stderr, "zt: %s\n", message.c_str());
  return kExitBadInput;
}

namespace {
// Subcommands whose module has not landed yet: they exist so `zt --help` shows the whole
// tool, and they say so plainly instead of pretending.
void add_not_built(CLI::App& app, Action& action, const char* name, const char* what, const char* module) {
  auto* sub = app.add_subcommand(name, what);
  sub->allow_extras();
  sub->prefix_command();
  std::string n = name, m = module;
  sub->callback([&action, n, m] {
    action = [n, m] {
      std::fprintf(stderr, "zt %s: not built yet in zerotrace %s (it arrives with %s/).\n", n.c_str(), ZT_VERSION,
                   m.c_str());
      return kExitBadInput;
    };
  });
}
}  // namespace
}  // namespace zt::cli

int main(int argc, char** argv) {
  using namespace zt::cli;
  CLI::App app{"zerotrace: reproduce, record and explain the memory failures of ZeRO-3 offload training.\n"
               "Example: zt demo        (record a workload, print what the trace holds)"};
  app.set_version_flag("--version", std::string("zt ") + ZT_VERSION + (ZT_HAVE_CUDA_BUILD ? " (CUDA)" : " (no CUDA)"));
  app.require_subcommand(1);
  Action action;
  add_db_commands(app, action);
  add_not_built(app, action, "train", "Train GPT-2 with the ZeRO engine and record a trace", "trainer");
  add_not_built(app, action, "probe", "Record any CUDA program: zt probe -o out.db -- CMD ARGS...", "probe");
  add_not_built(app, action, "repro", "Replay a bug report scenario and print a verdict", "inject");
  add_not_built(app, action, "check", "Pass/fail checks on a trace for CI", "inject");
  add_not_built(app, action, "faults", "List the fault catalog", "inject");
#ifdef ZT_HAVE_VIEWER
  add_view_command(app, action);
#else
  add_not_built(app, action, "view", "Open a trace in the timeline viewer", "viewer");
#endif
  add_not_built(app, action, "ckpt", "Inspect and consolidate checkpoints", "trainer");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? kExitOk : kExitBadInput;
  }
  if (!action) return fail("no subcommand given; see zt --help");
  try {
    return action();
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
