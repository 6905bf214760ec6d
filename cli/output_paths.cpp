// cli/output_paths.cpp: see output_paths.h.
#include "output_paths.h"

#include <filesystem>

namespace zt::cli {
namespace fs = std::filesystem;

namespace {

// The absolute path with the symlinks of its existing part resolved, without "." / ".." or a
// trailing separator.
fs::path resolved(const std::string& p) {
  std::error_code ec;
  fs::path abs = fs::absolute(fs::path(p), ec);
  if (ec) abs = fs::path(p);
  fs::path r = fs::weakly_canonical(abs, ec);
  if (ec) r = abs;
  r = r.lexically_normal();
  if (!r.has_filename() && r.has_parent_path() && r != r.root_path()) r = r.parent_path();
  return r;
}

}  // namespace

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ea, eb;
  if (fs::exists(a, ea) && fs::exists(b, eb)) {
    std::error_code ec;
    const bool eq = fs::equivalent(a, b, ec);
    if (!ec) return eq;
  }
  return resolved(a) == resolved(b);
}

bool inside_directory(const std::string& path, const std::string& dir) {
  const fs::path p = resolved(path), d = resolved(dir);
  auto pi = p.begin();
  for (auto di = d.begin(); di != d.end(); ++di, ++pi)
    if (pi == p.end() || *pi != *di) return false;
  return true;
}

Status check_output_path(const std::string& out, const std::vector<std::string>& inputs, const std::string& what) {
  if (out.empty()) return Status::Error("the output file name is empty: name a file to write");
  for (const std::string& in : inputs)
    if (same_file(out, in))
      return Status::Error(out + ": the output is the input " + what + (in == out ? "" : " " + in) +
                           " (choose another file)");
  std::error_code ec;
  if (fs::is_directory(out, ec)) return Status::Error(out + ": is a directory; name a file to write");
  fs::path parent = fs::path(out).parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::exists(parent, ec)) return Status::Error(out + ": directory " + parent.string() + " does not exist");
  if (!fs::is_directory(parent, ec)) return Status::Error(out + ": " + parent.string() + " is not a directory");
  return Status::Ok();
}

Status check_output_if_given(const std::string& out, const std::vector<std::string>& inputs, const std::string& what) {
  return out.empty() ? Status::Ok() : check_output_path(out, inputs, what);
}

}  // namespace zt::cli
