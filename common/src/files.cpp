#include "zt/common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace zt {

Status check_input_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Error(path + ": no such " + what);
    return Status::Error(path + ": cannot open the " + what + ": " + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) return Status::Error(path + ": is a directory, not a " + what);
  if (::access(path.c_str(), R_OK) != 0) return Status::Error(path + ": cannot open the " + what + ": " + std::strerror(errno));
  return Status::Ok();
}

Status read_text_file(const std::string& path, const std::string& what, std::string* out) {
  if (Status s = check_input_file(path, what); !s) return s;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Error(path + ": cannot open the " + what + ": " + std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return Status::Error(path + ": cannot read the " + what + ": " + std::strerror(err));
    }
    text.append(buf, size_t(n));
  }
  ::close(fd);
  *out = std::move(text);
  return Status::Ok();
}

}  // namespace zt
