// zt/db/sites.h: allocation sites, the place in a program an allocation is charged to, and the
// memory each site holds over a trace, as heaptrack's and memray's summaries show it (`zt db top`;
// `zt check --leaks` names the growing site with it).
//
// A stack's site is its innermost Python frame (the line a Python program was running when it
// allocated, however deep in C the allocation happened). A stack without one (a native program,
// a thread that never ran Python) is charged to its innermost native frame that is not the
// allocator's own: malloc and its family, operator new, the CUDA runtime's and driver's
// allocation and copy entry points, CPython's allocators and the probe are passed over.
//
// Memory counted, per device, by the rule of every sum of live bytes (SCHEMA.md): a second record
// of a segment is skipped; where a device has block rows (tensor-level) only blocks count, else
// its segments. Live at t: t_alloc <= t < t_free (never freed: alive to the end).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "zt/common/status.h"
#include "zt/db/rows.h"

namespace zt::db {

class TraceReader;

// How sites are grouped: "train_step (/x/loop.py:42)", "train_step (/x/loop.py)", "/x/loop.py".
// A native site: "f (/lib/libx.so+0x1f3)" (the call site), "f (/lib/libx.so)", "/lib/libx.so".
enum class SiteLevel { Line, Function, Module };
std::optional<SiteLevel> parse_site_level(std::string_view word);  // "line", "function", "module"
const char* to_string(SiteLevel level);

// The frame and stack tables in memory, and each stack's site.
class StackSites {
 public:
  static Status load(TraceReader& reader, std::unique_ptr<StackSites>* out);
  // The site's text at `level`; "(no stack)" for stack 0 or one that names no frame.
  std::string site(int64_t stack_id, SiteLevel level) const;
  // The site's frame, or null.
  const FrameRow* site_frame(int64_t stack_id) const;

 private:
  std::unordered_map<int64_t, FrameRow> frames_;
  std::unordered_map<int64_t, std::pair<int64_t, int64_t>> stacks_;  // id -> (parent, frame)
  mutable std::unordered_map<int64_t, int64_t> site_of_;             // stack -> its site's frame id (0: none)
};

// When to look: at the peak of each device's counted memory, at the end (what was never freed),
// at a time since the trace began, or at each epoch's end (the epoch markers of the device's rank).
enum class TopWhen { Peak, End, Time, Epochs };

struct TopOptions {
  SiteLevel by = SiteLevel::Line;
  TopWhen when = TopWhen::Peak;
  int64_t t_ns = 0;    // TopWhen::Time: nanoseconds since the trace began
  size_t top = 10;     // sites listed per device
  std::string device;  // a device label ("cuda:0", "cpu"); empty: every device that has allocations
};

struct SiteBytes {
  std::string site;
  int64_t bytes = 0;             // held at the moment (Epochs: at the last epoch's end)
  int64_t allocations = 0;       // how many allocations hold it
  std::vector<int64_t> series;   // Epochs: held at each epoch's end
  double grew_per_epoch = 0;     // Epochs: mean growth per epoch, the first epoch left out as warm-up when there are 3 or more
};

struct DeviceTop {
  int64_t rank = 0;
  DeviceRow device;
  bool blocks = false;     // tensor-level rows counted (else segments)
  int64_t t = 0;           // the moment, ns since the trace began (Epochs: the last epoch's end)
  int64_t total = 0;       // bytes held then, all sites
  int64_t sites = 0;       // sites holding memory then
  std::vector<SiteBytes> top;  // the largest first (Epochs: the most grown first)
  int64_t other_bytes = 0;     // what the sites left out of `top` hold
  std::vector<int64_t> epochs;  // Epochs: the epoch numbers compared
  std::vector<int64_t> totals;  // Epochs: all sites at each epoch's end
  std::string note;             // why a device has no table (no epoch markers for its rank, ...)
};

// Devices in id order. A device label in options that names no device is an error naming the
// labels the trace has.
Status top_sites(TraceReader& reader, const TopOptions& options, std::vector<DeviceTop>* out);

}  // namespace zt::db
