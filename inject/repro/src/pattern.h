// inject/repro/src/pattern.h: the regular expressions of a scenario's `expect` (error site,
// message, tensors, the phase of `when`), compiled and matched within bounds.
//
// A scenario is a file from a bug report, not trusted to be kind: std::regex compiles by
// recursive descent (20,000 nested groups overflow the stack) and its default matcher
// backtracks (exponential on (a|a)*b). So a pattern is at most kMaxPatternBytes long and nests
// groups at most kMaxPatternDepth deep, and matching uses libstdc++'s polynomial (Thompson NFA)
// matcher, which refuses back-references, and counts ({n,m}) have at most 4 digits (libstdc++
// reads them into an int unchecked). libstdc++ also caps a compiled pattern at 100,000 NFA states
// (x{1000}{1000} is refused, not expanded).
#pragma once

#include <regex>
#include <string>

namespace zt::repro {

inline constexpr size_t kMaxPatternBytes = 1000;
inline constexpr int kMaxPatternDepth = 32;

// "" when `re` compiles within the bounds; else why not, to follow the quoted pattern.
std::string pattern_problem(const std::string& re);
// True when `re` (which passed pattern_problem) matches somewhere in `text`; false for a bad one.
bool pattern_search(const std::string& re, const std::string& text);

}  // namespace zt::repro
