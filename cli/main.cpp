// zt: the one command-line entry point. Subcommands live in the *_commands.cpp files.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "help_format.h"
#include "text_width.h"
#include "zt/version.h"

namespace zt::cli {

int fail(const std::string& message) {
  std::fprintf(stderr, "zt: %s\n", message.c_str());
  return kExitBadInput;
}

std::string beside_executable(const std::string& rel) {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : (exe.parent_path() / rel).lexically_normal().string();
}

std::string scenario_dir() {
  for (const std::string& dir : {std::string("inject/scenarios"), beside_executable(ZT_INSTALLED_SCENARIO_DIR),
                                 std::string(ZT_SOURCE_DIR) + "/inject/scenarios"}) {
    std::error_code ec;
    if (!dir.empty() && std::filesystem::is_directory(dir, ec)) return dir;
  }
  return std::string(ZT_SOURCE_DIR) + "/inject/scenarios";
}

std::string shipped_scenario(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos) return "";
  const std::string file = name.size() > 5 && name.compare(name.size() - 5, 5, ".yaml") == 0 ? name : name + ".yaml";
  std::error_code ec;
  const std::string path = scenario_dir() + "/" + file;
  return std::filesystem::is_regular_file(path, ec) ? path : "";
}

namespace {
// Subcommands whose module is not in this build (the viewer without ImGui/GLFW): they exist so
// `zt --help` shows the whole tool, and they say so plainly instead of pretending.
[[maybe_unused]] void add_not_built(CLI::App& app, Action& action, const char* name, const char* what, const char* module) {
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
  // OpenBLAS runs its own threads beside OpenMP's; OpenMP's idle threads spinning on the same
  // cores made the tiny model 15-50x slower. The policy is read when the OpenMP runtime
  // starts, so it is set by restarting once with it in the environment.
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);  // on failure, carry on with the default policy
  }
  CLI::App app{"zerotrace: reproduce, record and explain the memory failures of ZeRO-3 offload training.\n"
               "Example: zt demo        (a tour: train with a trace, read it, reproduce a bug report)",
               "zt"};  // named, so that usage lines say "zt train", not the path zt was started by
  app.formatter(std::make_shared<HelpFormatter>(output_width()));  // before the subcommands: they copy it
  app.set_version_flag("--version", std::string("zt ") + ZT_VERSION + (ZT_HAVE_CUDA_BUILD ? " (CUDA)" : " (no CUDA)"));
  app.require_subcommand(1);
  Action action;
  add_db_commands(app, action);
  add_train_command(app, action);
  add_demo_command(app, action);
  add_probe_command(app, action);
  add_repro_command(app, action);
  add_check_command(app, action);
  add_import_command(app, action);
  add_faults_command(app, action);
#ifdef ZT_HAVE_VIEWER
  add_view_command(app, action);
#else
  add_not_built(app, action, "view", "Open a trace in the timeline viewer", "viewer");
#endif
  add_ckpt_command(app, action);
  // A usage error is one line, as every other error: "zt: <what> (zt train --help lists the options)".
  app.failure_message([](const CLI::App* failed, const CLI::Error& e) {
    std::string cmd = "zt";  // and the subcommands given, deepest last
    for (const CLI::App* a = failed; !a->get_subcommands().empty();) {
      a = a->get_subcommands().back();
      cmd += " " + a->get_name();
    }
    return "zt: " + std::string(e.what()) + " (" + cmd + " --help lists the options)\n";
  });
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
