// Internal: the `tensors` column of an error row is a JSON array of names.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace zt::memory::detail {

inline std::string json_name_array(std::string_view name) {
  if (name.empty()) return "[]";
  std::string out = "[\"";
  for (char c : name) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"]";
}

}  // namespace zt::memory::detail
