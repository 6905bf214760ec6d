#include "pattern.h"

#include <algorithm>

namespace zt::repro {
namespace {

constexpr auto kFlags = std::regex_constants::ECMAScript | std::regex_constants::__polynomial;

// How deep the pattern's groups nest; escapes and bracket expressions hold no groups.
int group_depth(const std::string& re) {
  int depth = 0, deepest = 0;
  bool in_class = false;
  for (size_t i = 0; i < re.size(); ++i) {
    const char c = re[i];
    if (c == '\\') {
      ++i;
    } else if (in_class) {
      in_class = c != ']';
    } else if (c == '[') {
      in_class = true;
      if (i + 1 < re.size() && re[i + 1] == ']') ++i;  // "[]...]": the first ] is a member
    } else if (c == '(') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ')' && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// The longest number a pattern gives a repetition ({n,m}) or a back-reference (\n): libstdc++
// reads them into an int without a check (\5555555555555555555 overflows: undefined).
size_t longest_count(const std::string& re) {
  size_t longest = 0, run = 0;
  bool counting = false, in_braces = false, in_class = false;
  for (size_t i = 0; i < re.size(); ++i) {
    const char c = re[i];
    const bool digit = c >= '0' && c <= '9';
    if (counting && digit) {
      longest = std::max(longest, ++run);
      continue;
    }
    counting = in_braces && (digit || c == ',');
    run = 0;
    if (c == '\\' && i + 1 < re.size()) {
      const char n = re[i + 1];
      if (n >= '1' && n <= '9' && !in_class) counting = true;  // a back-reference
      else ++i;
    } else if (in_class) {
      in_class = c != ']';
    } else if (c == '[') {
      in_class = true;
    } else if (c == '{') {
      in_braces = counting = true;
    } else if (c == '}') {
      in_braces = false;
    }
  }
  return longest;
}

}  // namespace

std::string pattern_problem(const std::string& re) {
  if (re.size() > kMaxPatternBytes)
    return "is " + std::to_string(re.size()) + " characters long; a pattern may have at most " +
           std::to_string(kMaxPatternBytes);
  if (int d = group_depth(re); d > kMaxPatternDepth)
    return "nests groups " + std::to_string(d) + " deep; at most " + std::to_string(kMaxPatternDepth) + " are allowed";
  if (longest_count(re) > 4)
    return "has a repetition count or back-reference of more than 4 digits (at most {9999})";
  try {
    std::regex check(re, kFlags);
  } catch (const std::regex_error& x) {
    return std::string("is not a regular expression (") + x.what() + ")";
  }
  return "";
}

bool pattern_search(const std::string& re, const std::string& text) {
  if (!pattern_problem(re).empty()) return false;
  try {
    return std::regex_search(text, std::regex(re, kFlags));
  } catch (const std::regex_error&) {
    return false;
  }
}

}  // namespace zt::repro
