// zt/common/status.h: the error value that crosses module lines (LevelDB's habit).
// A Status is ok, or carries one human-readable line that names the file or object and
// the problem, ready to print after "zt: ".
#pragma once

#include <string>
#include <utility>

namespace zt {

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message)); }

  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const std::string& message() const { return message_; }

 private:
  explicit Status(std::string message) : failed_(true), message_(std::move(message)) {}
  bool failed_ = false;
  std::string message_;
};

}  // namespace zt
