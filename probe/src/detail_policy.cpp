// Parsing the detail policy and the flight recorder's settings (zt/probe/detail_policy.h).
#include "zt/probe/detail_policy.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>

#include "zt/common/units.h"
#include "zt/db/trace_values.h"

namespace zt::probe {
namespace {

constexpr const char* kExamples =
    " (terms: all, none, first:N, every:N, steps:A,B-C, time:A-B, range:REGEX, signal:K; joined by ';')";

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A whole number 0..2^53 (a step number or a count a trace can hold).
bool parse_count(std::string_view s, int64_t* out) {
  if (s.empty() || s.size() > 16) return false;
  int64_t n = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    n = n * 10 + (c - '0');
  }
  if (n > db::kMaxTraceCount) return false;
  *out = n;
  return true;
}

// A duration: "90s", "10m", "1.5h", "500ms", "2us"... or a plain number of seconds; >= 0.
bool parse_duration(std::string_view s, int64_t* out) {
  const std::string t(s);
  if (t.empty() || t[0] == '-' || t[0] == '+') return false;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end == t.c_str() || !std::isfinite(v) || v < 0) return false;
  const std::string unit(end);
  double scale;
  if (unit.empty() || unit == "s") scale = 1e9;
  else if (unit == "ms") scale = 1e6;
  else if (unit == "us") scale = 1e3;
  else if (unit == "ns") scale = 1;
  else if (unit == "m" || unit == "min") scale = 60e9;
  else if (unit == "h") scale = 3600e9;
  else return false;
  if (v * scale > double(db::kMaxTraceTime)) return false;
  *out = int64_t(std::llround(v * scale));
  return true;
}

std::string duration_text(int64_t ns) { return format_duration_ns(double(ns)); }

}  // namespace

bool DetailPolicy::step_selected(int64_t step, int64_t first_step) const {
  if (first > 0 && (first_step < 0 || step < 0 || step - first_step < first)) return true;
  if (step < 0) return false;
  if (every > 0 && step % every == 0) return true;
  for (auto& [a, b] : steps)
    if (step >= a && step <= b) return true;
  return false;
}

Status parse_detail_policy(std::string_view text, DetailPolicy* out) {
  DetailPolicy p;
  p.all = false;
  bool any = false, none = false, all = false;
  std::vector<std::string> canon;
  size_t pos = 0;
  const std::string whole(text);
  while (pos <= whole.size()) {
    size_t semi = whole.find(';', pos);
    if (semi == std::string::npos) semi = whole.size();
    const std::string_view term = trim(std::string_view(whole).substr(pos, semi - pos));
    pos = semi + 1;
    if (term.empty()) continue;
    any = true;
    const std::string quoted = "'" + std::string(term) + "'";
    const size_t colon = term.find(':');
    const std::string_view kind = term.substr(0, colon);
    const std::string_view arg = colon == std::string_view::npos ? std::string_view() : term.substr(colon + 1);
    auto bad = [&](const std::string& why) { return Status::Error(quoted + ": " + why); };
    if (kind == "all" && colon == std::string_view::npos) {
      all = true;
    } else if (kind == "none" && colon == std::string_view::npos) {
      none = true;
    } else if (kind == "first" || kind == "every") {
      int64_t n = 0;
      if (!parse_count(arg, &n) || n == 0)
        return bad("'" + std::string(arg) + "' is not a number of steps (1 or more; example: " + std::string(kind) + ":20)");
      (kind == "first" ? p.first : p.every) = n;
    } else if (kind == "steps") {
      if (arg.empty()) return bad("no steps (example: steps:5,100-120)");
      size_t q = 0;
      const std::string list(arg);
      while (q <= list.size()) {
        size_t comma = list.find(',', q);
        if (comma == std::string::npos) comma = list.size();
        const std::string_view item = trim(std::string_view(list).substr(q, comma - q));
        q = comma + 1;
        const size_t dash = item.find('-');
        int64_t a = 0, b = 0;
        if (dash == std::string_view::npos ? !parse_count(item, &a)
                                            : !parse_count(item.substr(0, dash), &a) || !parse_count(item.substr(dash + 1), &b))
          return bad("'" + std::string(item) + "' is not a step or a range of steps (examples: 5, 100-120)");
        if (dash == std::string_view::npos) b = a;
        if (b < a) return bad("'" + std::string(item) + "' ends before it begins");
        p.steps.emplace_back(a, b);
      }
    } else if (kind == "time") {
      const size_t dash = arg.find('-');
      int64_t a = 0, b = INT64_MAX;
      if (arg.empty() || dash == std::string_view::npos || !parse_duration(trim(arg.substr(0, dash)), &a) ||
          (!trim(arg.substr(dash + 1)).empty() && !parse_duration(trim(arg.substr(dash + 1)), &b)))
        return bad("'" + std::string(arg) + "' is not a time window after the start (examples: 10m-15m, 90s-120s, 2h-)");
      if (b <= a) return bad("the window ends before it begins");
      p.times.emplace_back(a, b);
    } else if (kind == "range") {
      if (arg.empty()) return bad("no range name (example: range:DeepSpeedEngine.forward)");
      try {
        std::regex re{std::string(arg)};
        (void)re;
      } catch (const std::regex_error& e) {
        return bad("not a regular expression (" + std::string(e.what()) + ")");
      }
      p.ranges.emplace_back(arg);
    } else if (kind == "signal") {
      p.signal = true;
      p.signal_steps = 10;
      if (colon != std::string_view::npos) {
        int64_t n = 0;
        if (parse_count(arg, &n) && n > 0) {
          p.signal_steps = n;
        } else if (const bool steps_word = arg.size() > 5 && arg.substr(arg.size() - 5) == "steps";
                   steps_word && parse_count(arg.substr(0, arg.size() - 5), &n) && n > 0) {
          p.signal_steps = n;
        } else if (int64_t ns = 0; parse_duration(arg, &ns) && ns > 0 && !arg.empty() && !std::isdigit(static_cast<unsigned char>(arg.back()))) {
          p.signal_steps = 0, p.signal_ns = ns;
        } else {
          return bad("'" + std::string(arg) + "' is neither a number of steps nor a time (examples: signal:10, signal:30s)");
        }
      }
    } else {
      return Status::Error(quoted + ": not a detail window" + kExamples);
    }
    canon.emplace_back(term);
  }
  if (!any) return Status::Error("'" + whole + "': no detail window" + kExamples);
  if (none && canon.size() > 1) return Status::Error("'" + whole + "': 'none' with other windows (none alone: aggregates only)");
  if (all && canon.size() > 1) return Status::Error("'" + whole + "': 'all' with other windows (all alone: detail everywhere)");
  p.all = all;
  p.text.clear();
  for (auto& c : canon) p.text += (p.text.empty() ? "" : ";") + c;
  *out = std::move(p);
  return Status::Ok();
}

std::string FlightRecorder::text() const {
  if (steps > 0) return std::to_string(steps) + (steps == 1 ? " step" : " steps");
  if (ns > 0) return duration_text(ns);
  return "off";
}

Status parse_flight_recorder(std::string_view text, FlightRecorder* out) {
  const std::string_view t = trim(text);
  FlightRecorder f = *out;
  int64_t n = 0;
  if (t == "0" || t == "off" || t == "none") {
    f.steps = 0, f.ns = 0;
  } else if (parse_count(t, &n)) {
    f.steps = n, f.ns = 0;
  } else if (t.size() > 5 && t.substr(t.size() - 5) == "steps" && parse_count(trim(t.substr(0, t.size() - 5)), &n) && n > 0) {
    f.steps = n, f.ns = 0;
  } else if (int64_t ns = 0; !t.empty() && !std::isdigit(static_cast<unsigned char>(t.back())) && parse_duration(t, &ns) && ns > 0) {
    f.steps = 0, f.ns = ns;
  } else {
    return Status::Error("'" + std::string(text) + "' is neither a number of steps nor a time (examples: 20, 20steps, 30s, 2m; off)");
  }
  *out = f;
  return Status::Ok();
}

int64_t machine_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemTotal:") return kib * 1024;
  return 0;
}

Status parse_flight_memory(std::string_view text, int64_t mem_total_bytes, int64_t* out) {
  std::string why;
  const auto b = parse_size_i64(trim(text), &why);
  if (!b) return Status::Error("'" + std::string(text) + "' " + why + " (examples: 256MiB, 1GiB)");
  if (*b < (int64_t(1) << 20)) return Status::Error("'" + std::string(text) + "' is less than 1 MiB: too small for a ring of steps");
  const int64_t limit = mem_total_bytes > 0 ? mem_total_bytes / 2 : int64_t(1) << 40;
  if (*b > limit)
    return Status::Error("'" + std::string(text) + "' is more than " +
                         (mem_total_bytes > 0 ? "half this machine's memory (" + format_bytes(double(mem_total_bytes)) + ")"
                                              : std::string("1 TiB")) +
                         ": the ring would not fit");
  *out = *b;
  return Status::Ok();
}

Status parse_recording_policy(const std::vector<std::string>& detail, const std::string& flight,
                              const std::string& flight_memory, DetailPolicy* policy, FlightRecorder* ring) {
  if (!detail.empty()) {
    std::string joined;
    for (auto& d : detail) joined += (joined.empty() ? "" : ";") + d;
    if (Status s = parse_detail_policy(joined, policy); !s) return Status::Error("--detail " + s.message());
  }
  if (!flight.empty())
    if (Status s = parse_flight_recorder(flight, ring); !s) return Status::Error("--flight-recorder " + s.message());
  if (!flight_memory.empty())
    if (Status s = parse_flight_memory(flight_memory, machine_memory_bytes(), &ring->max_bytes); !s)
      return Status::Error("--flight-memory " + s.message());
  return Status::Ok();
}

}  // namespace zt::probe
