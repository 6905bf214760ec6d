// zt/common/files.h: reading a user's input file with an error that names the file and the problem
// ("run.yaml: is a directory, not a file"), instead of a stream's own words.
#pragma once

#include <string>
#include <string_view>

#include "zt/common/status.h"

namespace zt {

// Ok when `path` names a regular file this process can open for reading. Otherwise one line:
// "PATH: no such WHAT", "PATH: is a directory, not a WHAT", "PATH: cannot open the WHAT: <errno text>".
// `what` names the file's role ("data file", "DeepSpeed config").
Status check_input_file(const std::string& path, const std::string& what);

// The whole file, after check_input_file; a read error is reported the same way.
Status read_text_file(const std::string& path, const std::string& what, std::string* out);

// Text from a file, safe to print in a message: control characters (C0, DEL, C1) and bytes that
// are not UTF-8 as \xNN, cut after `most` characters with "..." (a binary `latest` file must not
// reach the terminal as it is).
std::string printable(std::string_view text, size_t most = 60);

// A message from elsewhere (SQLite's, which quotes a damaged schema's SQL with its newlines) as
// one line: each run of whitespace one space, then printable(text, most).
std::string one_line(std::string_view text, size_t most = 300);

// Where `text` stops being well-formed UTF-8 (a byte offset), or npos when it is all UTF-8. Text
// files zt reads (YAML) must be: their strings go into JSON (a trace's config, a verdict).
size_t utf8_invalid_at(std::string_view text);

}  // namespace zt
