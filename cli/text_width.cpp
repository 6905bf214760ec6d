// cli/text_width.cpp: see text_width.h.
#include "text_width.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace zt::cli {

size_t output_width() {
  size_t w = 0;
  if (const char* c = std::getenv("COLUMNS"); c && *c) {
    char* end = nullptr;
    const long v = std::strtol(c, &end, 10);
    if (*end == '\0' && v > 0) w = size_t(v);
  }
  winsize ws{};
  if (w == 0 && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) w = ws.ws_col;
  if (w == 0 || w > 100) w = 100;
  return std::max<size_t>(w, 40);
}

size_t display_width(const std::string& text) {
  size_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

std::string pad_left(const std::string& text, size_t width) {
  const size_t w = display_width(text);
  return w >= width ? text : std::string(width - w, ' ') + text;
}

std::string pad_right(const std::string& text, size_t width) {
  const size_t w = display_width(text);
  return w >= width ? text : text + std::string(width - w, ' ');
}

std::string wrap_text(const std::string& text, size_t width, size_t indent) {
  std::string out;
  size_t begin = 0;
  for (bool first = true;; first = false) {
    const size_t nl = text.find('\n', begin);
    const std::string para = text.substr(begin, nl == std::string::npos ? std::string::npos : nl - begin);
    const size_t lead = std::min(para.find_first_not_of(' '), para.size());
    if (!first) out += '\n';
    if (lead < para.size()) {  // an empty line stays empty
      if (!first) out += std::string(indent, ' ');
      const std::string hang(indent + lead, ' ');
      out += para.substr(0, lead);
      size_t col = indent + lead;
      // Word by word; the spaces between two words on one line are kept as written (aligned notes).
      for (size_t at = lead; at < para.size();) {
        const size_t end = std::min(para.find(' ', at), para.size());
        const size_t next = std::min(para.find_first_not_of(' ', end), para.size());
        const std::string word = para.substr(at, end - at);
        const size_t w = display_width(word);
        if (at > lead) {
          const size_t gap = at - para.find_last_not_of(' ', at - 1) - 1;
          if (col + gap + w > width) {
            out += "\n" + hang;
            col = hang.size();
          } else {
            out += std::string(gap, ' ');
            col += gap;
          }
        }
        out += word;
        col += w;
        at = next;
      }
    }
    if (nl == std::string::npos) break;
    begin = nl + 1;
  }
  return out;
}

}  // namespace zt::cli
