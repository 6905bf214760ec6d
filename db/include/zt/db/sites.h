// zt/db/sites.h: allocation sites, the place in a program an allocation is charged to, and the
// memory each site holds over a trace, as heaptrack's and memray's summaries show it (`zt db top`;
// `zt check --leaks` names the growing site with it).
//
// A stack's site is the innermost frame of the user's own code: its innermost Python frame whose
// file is not the Python standard library (`.../lib/python3.X/`), an installed package
// (`site-packages`, `dist-packages`), frozen bootstrap code (`<frozen importlib._bootstrap>`), code
// compiled by exec() (`<string>`: dataclasses', namedtuple's) or zerotrace's own Python package. The library frame it called through is named beside it
// ("via"): the innermost Python frame of a library inside the user's frame, else the innermost
// native frame of an installed package's extension (numpy's `_multiarray_umath`), else none:
// `compute_loss (/x/hf_job.py:36) via numpy ones`. A stack with Python frames but none of the
// user's is charged to its innermost Python frame (no via). A stack without Python frames (a
// native program, a thread that never ran Python) is charged to its innermost native frame that
// is not the allocator's own: malloc and its family, operator new, the CUDA runtime's and
// driver's allocation and copy entry points, CPython's allocators and the probe are passed over.
// This is the one grouping rule of `zt db top`, `zt check --leaks` and the viewer.
//
// Memory counted, per device, by the rule of every sum of live bytes (SCHEMA.md): a second record
// of a segment is skipped; where a device has block rows (tensor-level) only blocks count, else
// its segments. Live at t: t_alloc <= t < t_free (never freed: alive to the end). A sampled row
// (the probe's byte sampler: allocation.weight_bytes) counts for its weight, so a site's bytes are
// an estimate; its standard error comes from the weights (docs/check.md derives it).
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
  // The library frame the site called through ("via"), or null.
  const FrameRow* via_frame(int64_t stack_id) const;

 private:
  struct Site {
    int64_t frame = 0, via = 0;  // frame ids, 0: none
  };
  const Site& site_of(int64_t stack_id) const;
  std::unordered_map<int64_t, FrameRow> frames_;
  std::unordered_map<int64_t, std::pair<int64_t, int64_t>> stacks_;  // id -> (parent, frame)
  mutable std::unordered_map<int64_t, Site> site_of_;                // stack -> its site
};

// The frame is of the user's own code (see above): a Python frame whose file is not the standard
// library, an installed package, frozen bootstrap code, exec()'d code or zerotrace's Python package.
bool user_frame(const FrameRow& f);
// How a library frame is named beside a site: its package and function ("numpy ones",
// "json dumps", "importlib._bootstrap _load").
std::string via_text(const FrameRow& f);

// The bytes an allocation counts for in an estimate by site, and its share of the estimate's
// variance: a row recorded one by one is exact (variance 0); a sampled row of `bytes` standing
// for `weight` bytes adds weight * (weight - bytes), an unbiased estimate of its variance.
inline double sampled_variance(int64_t bytes, int64_t weight) {
  return weight > bytes ? double(weight) * double(weight - bytes) : 0.0;
}

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
  int64_t bytes = 0;             // held at the moment (Epochs: at the last epoch's end); sampled rows by weight
  int64_t allocations = 0;       // how many allocation rows hold it
  int64_t sampled = 0;           // of those, sampled rows: `bytes` is then an estimate
  double stderr_bytes = 0;       // the estimate's standard error (0: every row exact)
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
  // Where the figures come from when the trace's detail stopped (db/SCHEMA.md, "Aggregates"): ""
  // from the allocation rows; else what was read instead ("from the aggregates (epoch_live): ...")
  // or what the detail leaves out ("the detail stopped at ...; the run's peak ...").
  std::string source;
};

// Devices in id order. A device label in options that names no device is an error naming the
// labels the trace has.
Status top_sites(TraceReader& reader, const TopOptions& options, std::vector<DeviceTop>* out);

}  // namespace zt::db
