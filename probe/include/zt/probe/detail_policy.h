// zt/probe/detail_policy.h: which stretches of a run get full detail (allocation, transfer, kernel,
// placement and range rows), and the flight recorder's ring of the last steps. Plain code: the
// parsers for `--detail`, `--flight-recorder`, `--flight-memory` (zt probe and zt train, the same
// syntax) and their ZT_PROBE_* variables; the Recorder's writer applies the policy
// (zt/probe/recorder.h, RecorderOptions::detail and ::flight). docs/probe.md, "Long jobs".
//
// Invariants:
//  - A parsed policy holds only values a trace can hold: step numbers and counts below 2^53,
//    times below 2^62 ns; a malformed term is an error naming it, never a silent default.
//  - `all` (the default, no term given) is full detail from the start until the size cap; any
//    other term keeps detail only inside its windows (the union of them all).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zt/common/status.h"

namespace zt::probe {

struct DetailPolicy {
  bool all = true;     // no window term: detail everywhere (until --max-trace)
  int64_t first = 0;   // first:N: from the run's start until the (N+1)th step begins
  int64_t every = 0;   // every:N: steps whose number is a multiple of N
  std::vector<std::pair<int64_t, int64_t>> steps;  // steps:A,B-C (inclusive)
  std::vector<std::pair<int64_t, int64_t>> times;  // time:A-B, ns after the run's start, [A, B); B INT64_MAX: open
  std::vector<std::string> ranges;                 // range:REGEX, while such a range is open
  bool signal = false;        // signal:K / signal:Ds: SIGUSR1 opens a window
  int64_t signal_steps = 0;   // ... of the next K steps (the rest of the current one and K more)
  int64_t signal_ns = 0;      // ... or of D (ns)
  std::string text = "all";   // the terms as parsed, canonical ("first:20;every:1000")

  // Is step `step` inside a step window (first, every, steps)? `first_step`: the first step number
  // the run began (-1: none yet; then only `first` holds, the set-up before the first step).
  bool step_selected(int64_t step, int64_t first_step) const;
  bool has_step_terms() const { return first > 0 || every > 0 || !steps.empty(); }
};

// "first:20;every:1000" (terms separated by ';'; several `--detail` options join with ';'):
//   all | none | first:N | every:N | steps:A,B-C | time:A-B (durations: 90s, 10m, 1.5h, 500ms; B
//   may be left out: to the end) | range:REGEX | signal | signal:K | signal:Ds (default K: 10).
// `none` alone: no window (aggregates only, and the flight recorder). An error says what is wrong
// with which term ("'first:x': x is not a number of steps"); the caller puts the option or
// variable before it.
Status parse_detail_policy(std::string_view text, DetailPolicy* out);

// The flight recorder: the last `steps` steps (or `ns` of time) of the detail that was not written
// (outside the windows, past the cap), kept in memory and written when the run ends in any way.
struct FlightRecorder {
  int64_t steps = 20;  // 0 with ns 0: off
  int64_t ns = 0;
  int64_t max_bytes = int64_t(256) << 20;  // the ring's memory bound (the oldest steps go first)
  bool on() const { return steps > 0 || ns > 0; }
  std::string text() const;  // "20 steps", "30.00 s", "off"
};
inline constexpr int64_t kDefaultFlightSteps = 20;
inline constexpr int64_t kDefaultFlightBytes = int64_t(256) << 20;
// An event kept in the ring (its row is made from it at the end): 104 bytes.
inline constexpr int64_t kFlightEntryBytes = 104;

// "20" or "20steps" (steps), "30s" / "2m" / "500ms" (time), "0" / "off" / "none" (off).
Status parse_flight_recorder(std::string_view text, FlightRecorder* out);
// The ring's memory bound: a size of at least 1 MiB and at most half the machine's memory
// (`mem_total_bytes`, /proc/meminfo's MemTotal; 0: not known, then up to 1 TiB). A larger one is
// refused: "'64GiB' is more than half this machine's memory (31.26 GiB)".
Status parse_flight_memory(std::string_view text, int64_t mem_total_bytes, int64_t* out);
// MemTotal from /proc/meminfo, in bytes; 0 when it cannot be read.
int64_t machine_memory_bytes();

// The three settings at once, as `zt probe` and `zt train` take them (empty strings: defaults),
// each error prefixed by its option name (`--detail`, `--flight-recorder`, `--flight-memory`).
Status parse_recording_policy(const std::vector<std::string>& detail, const std::string& flight,
                              const std::string& flight_memory, DetailPolicy* policy, FlightRecorder* ring);

// The variables (set by `zt probe` from its options; read by libzt_probe.so).
inline constexpr const char* kEnvDetail = "ZT_PROBE_DETAIL";                    // --detail, terms joined by ';'
inline constexpr const char* kEnvFlightRecorder = "ZT_PROBE_FLIGHT_RECORDER";   // --flight-recorder
inline constexpr const char* kEnvFlightMemory = "ZT_PROBE_FLIGHT_MEMORY";       // --flight-memory

}  // namespace zt::probe
