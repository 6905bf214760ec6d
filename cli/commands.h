// cli/commands.h: each subcommand of `zt` registers itself on the CLI11 app.
// Exit codes everywhere: 0 ok, 1 the check or reproduction failed, 2 bad usage or input.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace zt::db {
struct KernelSummaryOptions;  // zt/db/kernel_summary.h
}

namespace zt::cli {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitBadInput = 2;

// The action a parsed subcommand runs; main() calls the one that was selected.
using Action = std::function<int()>;

void add_db_commands(CLI::App& app, Action& action);  // db info|sql|kernels|merge, export, synth, demo
void add_train_command(CLI::App& app, Action& action);  // train
void add_probe_command(CLI::App& app, Action& action);  // probe (cli/probe_command.cpp)
void add_faults_command(CLI::App& app, Action& action);  // faults (cli/faults_command.cpp)
void add_repro_command(CLI::App& app, Action& action);  // repro (cli/repro_command.cpp, inject/repro)
void add_repro_init_command(CLI::App& repro, Action& action);  // repro init (cli/repro_init_command.cpp)
void add_ckpt_command(CLI::App& app, Action& action);  // ckpt info|consolidate (cli/ckpt_command.cpp)
void add_check_command(CLI::App& app, Action& action);  // check (cli/check_command.cpp, inject/check)
void add_import_command(CLI::App& app, Action& action);  // import (cli/import_command.cpp)
#ifdef ZT_HAVE_VIEWER
void add_view_command(CLI::App& app, Action& action);  // view (viewer/view_command.cpp)
#endif

int fail(const std::string& message);
// `rel` (a directory relative to the zt executable's, e.g. where `cmake --install` puts the probe
// library), normalized; "" when the executable cannot be found.
std::string beside_executable(const std::string& rel);
// Where the shipped scenarios are: ./inject/scenarios (a checkout), else where `cmake --install`
// put them beside this zt (share/zerotrace/scenarios), else the source tree this zt was built from.
std::string scenario_dir();
// A shipped scenario's file by its name ("r2-qwen72b-offload-device-mismatch", with or without
// ".yaml"); "" when there is none of that name.
std::string shipped_scenario(const std::string& name);

// Shared by several commands.
// Prints rows as an aligned table; right_align[c]: column c is numbers. Widths are columns on screen
// (cli/text_width.h): "251.81 µs" is 10 bytes but 9 columns.
void print_table(std::ostream& out, const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right_align,
                 const std::string& indent = "");
int db_info(const std::string& path);
// `zt db sql`: limits of 0 are none (the demo's own queries have none).
int db_sql(const std::string& path, const std::string& sql, bool csv, int64_t max_rows = 0, double timeout_s = 0);
// db info's report of a delayed or overlapped update (the background AdamW, the waits for it, the
// early write-back), alone.
int db_background_update(const std::string& path);
// db info's report of a partial optimizer offload (the modules on each side, the device AdamW), alone.
int db_partial_offload(const std::string& path);
int db_kernels(const std::string& path, const db::KernelSummaryOptions& opt, size_t top);
void add_demo_command(CLI::App& app, Action& action);  // prints "zt: message" to stderr, returns kExitBadInput

}  // namespace zt::cli
