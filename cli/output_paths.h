// cli/output_paths.h: refusing an output path that would destroy what the command reads.
// One implementation for every command that writes a file named by the user (zt export --chrome,
// zt db merge OUT, zt check --junit, zt view --screenshot, zt repro --json/--keep, zt ckpt
// consolidate --out): "a.db: the output is the input trace (choose another file)".
#pragma once

#include <string>
#include <vector>

#include "zt/common/status.h"

namespace zt::cli {

// True when `a` and `b` name the same file: std::filesystem::equivalent when both exist (so
// ./a.db, a.db, a hard link and a symlink to it all match), otherwise the same absolute path with
// the existing part's symlinks resolved.
bool same_file(const std::string& a, const std::string& b);

// True when `path` is the directory `dir` or lies anywhere under it (symlinks resolved).
bool inside_directory(const std::string& path, const std::string& dir);

// Ok when a command that reads `inputs` may write `out`: the name is not empty, it is not the same
// file as any input, it is not a directory, and its directory exists (nothing is created, as
// zt db merge and zt export do). Otherwise one line, ready to print after "zt: ":
//   "a.db: the output is the input trace (choose another file)"
//   "./a.db: the output is the input trace a.db (choose another file)"   (spelled differently)
//   "hf/model.safetensors: directory hf does not exist"
// `what` names the inputs' role: "trace", "scenario".
Status check_output_path(const std::string& out, const std::vector<std::string>& inputs,
                         const std::string& what = "trace");

// The same for an optional output: Ok when `out` is empty (the option was not given).
Status check_output_if_given(const std::string& out, const std::vector<std::string>& inputs,
                             const std::string& what = "trace");

}  // namespace zt::cli
