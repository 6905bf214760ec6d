// zt/common/units.h: sizes and durations the way users read and paste them.
// Bytes print as GiB/MiB/KiB/B (binary units, two decimals); times as ns/µs/ms/s.
// Sizes parse from "80GiB", "1.5 TiB", "512MiB", "4096", "1e9" (plain numbers are bytes).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace zt {

std::string format_bytes(double bytes);         // "3.39 GiB", "512.00 MiB", "17 B"
std::string format_duration_ns(double ns);      // "1.25 ms", "3.20 s", "850 ns"
std::string format_count(double n);             // "1.2M", "15.3k", "42"
std::optional<uint64_t> parse_bytes(std::string_view text);
// Sizes up to 2^64 - 2 KiB (the doubles near 2^64 are 2 KiB apart); 2.5B is 3 bytes. KiB/MiB/GiB/TiB
// (and K/M/G/T alone) are powers of 1024, kB/MB/GB/TB powers of 1000; case does not matter.
// The same; when `text` is not a size, *why says what is wrong with it, to follow the quoted text:
// "is not a size", or that followed by ": too large (a size is below 16 EiB)" or ": unknown unit
// 'x' (B, KiB, MiB, GiB, TiB; or kB, MB, GB, TB: powers of 1000)".
std::optional<uint64_t> parse_bytes(std::string_view text, std::string* why);
// A size kept as int64 (a trace's byte counts, budgets, thresholds): parse_bytes, and up to 8 EiB
// (2^63) less a byte; above, *why is "is not a size: too large (at most 8 EiB)".
std::optional<int64_t> parse_size_i64(std::string_view text, std::string* why);
// A time in nanoseconds from "1.5s", "250ms", "40us", "1000ns", or a plain number of seconds;
// negative allowed.
std::optional<int64_t> parse_duration_ns(std::string_view text);

}  // namespace zt
