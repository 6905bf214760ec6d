// zt/common/files.h: reading a user's input file with an error that names the file and the problem
// ("run.yaml: is a directory, not a file"), instead of a stream's own words.
#pragma once

#include <string>

#include "zt/common/status.h"

namespace zt {

// Ok when `path` names a regular file this process can open for reading. Otherwise one line:
// "PATH: no such WHAT", "PATH: is a directory, not a WHAT", "PATH: cannot open the WHAT: <errno text>".
// `what` names the file's role ("data file", "DeepSpeed config").
Status check_input_file(const std::string& path, const std::string& what);

// The whole file, after check_input_file; a read error is reported the same way.
Status read_text_file(const std::string& path, const std::string& what, std::string* out);

}  // namespace zt
