#include "zt/common/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace zt {

std::string format_bytes(double bytes) {
  const char* sign = bytes < 0 ? "-" : "";
  double b = std::fabs(bytes);
  char buf[64];
  if (b >= 1024.0 * 1024 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%s%.2f TiB", sign, b / (1024.0 * 1024 * 1024 * 1024));
  else if (b >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%s%.2f GiB", sign, b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%s%.2f MiB", sign, b / (1024.0 * 1024));
  else if (b >= 1024.0)
    std::snprintf(buf, sizeof buf, "%s%.2f KiB", sign, b / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%s%.0f B", sign, b);
  return buf;
}

std::string format_duration_ns(double ns) {
  char buf[64];
  double a = std::fabs(ns);
  if (a >= 60e9 * 60)
    std::snprintf(buf, sizeof buf, "%.2f h", ns / 3600e9);
  else if (a >= 60e9)
    std::snprintf(buf, sizeof buf, "%.2f min", ns / 60e9);
  else if (a >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f s", ns / 1e9);
  else if (a >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2f ms", ns / 1e6);
  else if (a >= 1e3)
    std::snprintf(buf, sizeof buf, "%.2f µs", ns / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f ns", ns);
  return buf;
}

std::string format_count(double n) {
  char buf[64];
  if (n >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2fG", n / 1e9);
  else if (n >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else if (n >= 1e4)
    std::snprintf(buf, sizeof buf, "%.1fk", n / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

std::optional<uint64_t> parse_bytes(std::string_view text) {
  std::string why;
  return parse_bytes(text, &why);
}

std::optional<uint64_t> parse_bytes(std::string_view text, std::string* why) {
  *why = "is not a size";
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s.push_back(c);
  if (s.empty()) return std::nullopt;
  const char* begin = s.c_str();
  char* end = nullptr;
  double value = std::strtod(begin, &end);
  if (end == begin || std::isnan(value) || value < 0) return std::nullopt;
  if (std::isinf(value)) {
    *why = "is not a size: too large (a size is below 16 EiB)";
    return std::nullopt;
  }
  std::string unit(end);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 0;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kib")
    mult = 1024.0;
  else if (unit == "m" || unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  // The SI units are what they say (4.9MB is 4,900,000 bytes): read as GiB, a budget of "70GB"
  // would pass a peak 5 GB over it.
  else if (unit == "kb")
    mult = 1e3;
  else if (unit == "mb")
    mult = 1e6;
  else if (unit == "gb")
    mult = 1e9;
  else if (unit == "tb")
    mult = 1e12;
  else {
    *why = "is not a size: unknown unit '" + std::string(end) + "' (B, KiB, MiB, GiB, TiB; or kB, MB, GB, TB: powers of 1000)";
    return std::nullopt;
  }
  // Rounded to whole bytes, halves away from zero; 2^64 and above do not fit (llround stopped at
  // 2^63: 9 EiB became garbage). A double near 2^64 is exact to 2 KiB, so the largest size that
  // parses is 2^64 - 2 KiB.
  const double bytes = std::round(value * mult);
  if (!(bytes < 18446744073709551616.0)) {
    *why = "is not a size: too large (a size is below 16 EiB)";
    return std::nullopt;
  }
  return static_cast<uint64_t>(bytes);
}

std::optional<int64_t> parse_size_i64(std::string_view text, std::string* why) {
  const std::optional<uint64_t> b = parse_bytes(text, why);
  if (!b) return std::nullopt;
  if (*b > uint64_t(INT64_MAX)) {
    *why = "is not a size: too large (at most 8 EiB)";
    return std::nullopt;
  }
  return static_cast<int64_t>(*b);
}

std::optional<int64_t> parse_duration_ns(std::string_view text) {
  const std::string t(text);
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end == t.c_str() || !std::isfinite(v)) return std::nullopt;
  const std::string unit(end);
  double scale;
  if (unit.empty() || unit == "s") scale = 1e9;
  else if (unit == "ms") scale = 1e6;
  else if (unit == "us") scale = 1e3;
  else if (unit == "ns") scale = 1;
  else return std::nullopt;
  if (std::fabs(v * scale) > 9.2e18) return std::nullopt;
  return int64_t(std::llround(v * scale));
}

}  // namespace zt
