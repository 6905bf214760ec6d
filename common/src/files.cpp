#include "zt/common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
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

std::string printable(std::string_view text, size_t most) {
  std::string out;
  size_t shown = 0, i = 0;
  auto escape = [&](unsigned char c) {
    char b[8];
    std::snprintf(b, sizeof b, "\\x%02x", c);
    out += b;
  };
  while (i < text.size()) {
    if (shown == most) return out + "...";
    const unsigned char c = static_cast<unsigned char>(text[i]);
    // A whole UTF-8 character stays as it is, except the C1 controls (U+0080..U+009F), which
    // some terminals obey as ESC [ does.
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool whole = len > 0 && i + len <= text.size();
    for (size_t k = 1; whole && k < len; ++k) whole = (static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80;
    if (whole && len == 2 && c == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0) whole = false;
    if (len == 1 && (c < 0x20 || c == 0x7f)) whole = false;
    if (!whole) {
      escape(c);
      ++i;
    } else {
      out.append(text.substr(i, len));
      i += len;
    }
    ++shown;
  }
  return out;
}

}  // namespace zt
