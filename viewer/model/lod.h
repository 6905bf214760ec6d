// viewer/model/lod.h: level of detail, the part that keeps a 10-million-row trace
// interactive (Tracy's approach).
//
// Owns: IntervalLane (time-sorted spans plus a running maximum of their ends), Series (a
// time-sorted step function with a min/max pyramid), and the per-frame queries on them:
// the visible range by binary search, folding of spans narrower than a few pixels into
// one "N items" box, and min/max decimation of a series to one pair per pixel column.
// Invariants: a lane's spans are pushed in start order; max_end[i] = max(end[0..i]), so
// "first span that may reach time t" is a binary search even when spans overlap. A query
// costs O(columns * log n), never O(rows in view).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace zt::viewer {

struct IntervalLane {
  std::vector<int64_t> start, end, max_end;
  std::vector<uint32_t> item;  // index of the row in the track's source column

  void push(int64_t t0, int64_t t1, uint32_t row) {
    start.push_back(t0);
    end.push_back(t1);
    max_end.push_back(max_end.empty() ? t1 : std::max(max_end.back(), t1));
    item.push_back(row);
  }
  size_t size() const { return start.size(); }
  bool empty() const { return start.empty(); }
  void reserve(size_t n) {
    start.reserve(n);
    end.reserve(n);
    max_end.reserve(n);
    item.reserve(n);
  }
};

// [first, last) of the spans that intersect [t0, t1]: first is the first span whose running
// maximum end reaches t0, last the first span starting after t1.
std::pair<size_t, size_t> visible_range(const IntervalLane& lane, int64_t t0, int64_t t1);

// One thing to draw in a lane: a single span (count == 1, `first` is its index in the lane)
// or a fold of `count` consecutive spans [first, first + count) too thin to draw alone.
struct DrawItem {
  int64_t t0 = 0, t1 = 0;
  uint32_t first = 0;
  uint32_t count = 0;
};

// Spans in [t0, t1] as draw items at `ns_per_px`; spans narrower than min_px fold with their
// thin neighbours. Appends to *out.
void fold_visible(const IntervalLane& lane, int64_t t0, int64_t t1, double ns_per_px, double min_px,
                  std::vector<DrawItem>* out);

// A step function: value[i] holds from t[i] until t[i+1] (the last one until the series'
// end). levels[k] holds min/max over aligned blocks of 2^k samples (k >= 1) for range queries.
struct Series {
  std::vector<int64_t> t;
  std::vector<double> value;
  std::vector<std::vector<double>> lo, hi;  // pyramid levels 1.. (level 0 is `value`)
  double peak = 0;
  int64_t peak_t = 0;
  // Nothing is drawn from here on: a series from the detail of a trace whose detail stopped
  // (db/SCHEMA.md, "Aggregates") ends where the detail did, not flat to the trace's end.
  int64_t stop = INT64_MAX;

  void push(int64_t time, double v) {
    // Several changes at one instant collapse into the last one: a free and an alloc at the
    // same nanosecond are not a spike.
    if (!t.empty() && t.back() == time) value.back() = v;
    else {
      t.push_back(time);
      value.push_back(v);
    }
  }
  void build();  // pyramid and peak; call once after the last push
  bool empty() const { return t.empty(); }
  // Value in effect at time `time` (0 before the first sample).
  double at(int64_t time) const;
  // Min and max of the values in effect anywhere in [t0, t1); false if none is.
  bool range_min_max(int64_t t0, int64_t t1, double* lo, double* hi) const;
  // Min and max over sample indices [a, b).
  void index_min_max(size_t a, size_t b, double* lo, double* hi) const;
};

struct ColumnMinMax {
  float lo = 0, hi = 0;
  float last = 0;  // value in effect at the column's right edge, to join the next column
  bool any = false;
};

// One min/max pair per pixel column: column c covers [t0 + c*ns_per_px, t0 + (c+1)*ns_per_px).
// `t_stop` ends the series (nothing is drawn after it).
void decimate(const Series& s, int64_t t0, double ns_per_px, int columns, int64_t t_stop,
              std::vector<ColumnMinMax>* out);

}  // namespace zt::viewer
