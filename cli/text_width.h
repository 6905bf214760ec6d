// cli/text_width.h: padding text for aligned tables by its width on screen, not its bytes.
// "251.81 µs" is 10 bytes in UTF-8 but 9 columns: a table padded by bytes shifts that row.
#pragma once

#include <cstddef>
#include <string>

namespace zt::cli {

// Columns `text` takes on a terminal: its UTF-8 code points (the bytes that are not 10xxxxxx
// continuation bytes). Every character zt prints (ASCII, µ, ×, ...) is one column wide.
size_t display_width(const std::string& text);

// `text` with spaces before it (pad_left: right-aligned) or after it (pad_right: left-aligned)
// up to `width` columns; unchanged when it is already as wide or wider.
std::string pad_left(const std::string& text, size_t width);
std::string pad_right(const std::string& text, size_t width);

}  // namespace zt::cli
