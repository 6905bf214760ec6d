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

namespace {
// The length of the well-formed UTF-8 character at text[i] (RFC 3629: no overlong forms, no
// surrogates, nothing past U+10FFFF), or 0 where there is none.
size_t utf8_char(std::string_view text, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = at(i);
  if (c < 0x80) return 1;
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
  if (c >= 0xc2 && c <= 0xdf) len = 2;
  else if (c == 0xe0) len = 3, lo = 0xa0;
  else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) len = 3;
  else if (c == 0xed) len = 3, hi = 0x9f;
  else if (c == 0xf0) len = 4, lo = 0x90;
  else if (c >= 0xf1 && c <= 0xf3) len = 4;
  else if (c == 0xf4) len = 4, hi = 0x8f;
  else return 0;
  if (i + len > text.size() || at(i + 1) < lo || at(i + 1) > hi) return 0;
  for (size_t k = 2; k < len; ++k)
    if ((at(i + k) & 0xc0) != 0x80) return 0;
  return len;
}
}  // namespace

size_t utf8_invalid_at(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8_char(text, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string printable(std::string_view text, size_t most) {
  std::string out;
  size_t shown = 0, i = 0;
  while (i < text.size()) {
    if (shown == most) return out + "...";
    const unsigned char c = static_cast<unsigned char>(text[i]);
    // A whole UTF-8 character stays as it is, except the controls: C0, DEL and C1 (U+0080..U+009F,
    // which some terminals obey as ESC [ does).
    const size_t len = utf8_char(text, i);
    const bool control = len == 1 ? c < 0x20 || c == 0x7f : len == 2 && c == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0;
    if (len == 0 || control) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
      ++i;
    } else {
      out.append(text.substr(i, len));
      i += len;
    }
    ++shown;
  }
  return out;
}

std::string one_line(std::string_view text, size_t most) {
  std::string flat;
  bool space = false;
  for (char c : text) {
    const bool ws = c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\v' || c == '\f';
    if (ws && !space && !flat.empty()) flat += ' ';
    if (!ws) flat += c;
    space = ws;
  }
  while (!flat.empty() && flat.back() == ' ') flat.pop_back();
  return printable(flat, most);
}

}  // namespace zt
