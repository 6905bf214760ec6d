// cli/text_width.h: padding and wrapping text by its width on screen, not its bytes.
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

// Columns to wrap text at (help, the demo's prose): $COLUMNS when it is a number, else stdout's
// terminal width, at most 100 (and 100 when neither is known: a pipe or a file); 40 at least.
size_t output_width();

// `text` broken at spaces into lines of at most `width` columns; its own line breaks are kept.
// The first line is taken to start at column `indent` (the caller has printed what comes before
// it); every later line starts with `indent` spaces, plus the leading spaces of its paragraph (an
// example aligned under another keeps its alignment). A word wider than the room stays whole on a
// line of its own. No trailing newline.
std::string wrap_text(const std::string& text, size_t width, size_t indent);

}  // namespace zt::cli
