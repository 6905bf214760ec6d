// cli/text_width.cpp: see text_width.h.
#include "text_width.h"

namespace zt::cli {

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

}  // namespace zt::cli
