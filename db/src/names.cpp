#include "zt/db/names.h"

#include <cctype>

namespace zt::db {

std::string tensor_group(std::string_view name) {
  std::string out;
  int depth = 0;
  bool in_digits = false;
  for (char c : name) {
    if (c == '[') ++depth;
    if (c == ']' && depth > 0) --depth;
    const bool digit = std::isdigit(static_cast<unsigned char>(c)) != 0;
    if (depth > 0 && digit) {
      if (!in_digits) out += '*';
      in_digits = true;
      continue;
    }
    in_digits = false;
    out += c;
  }
  return out;
}

}  // namespace zt::db
