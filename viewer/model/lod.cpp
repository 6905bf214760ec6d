#include "lod.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace zt::viewer {

std::pair<size_t, size_t> visible_range(const IntervalLane& lane, int64_t t0, int64_t t1) {
  auto first = std::lower_bound(lane.max_end.begin(), lane.max_end.end(), t0) - lane.max_end.begin();
  auto last = std::upper_bound(lane.start.begin(), lane.start.end(), t1) - lane.start.begin();
  if (last < first) last = first;
  return {size_t(first), size_t(last)};
}

void fold_visible(const IntervalLane& lane, int64_t t0, int64_t t1, double ns_per_px, double min_px,
                  std::vector<DrawItem>* out) {
  auto [i, last] = visible_range(lane, t0, t1);
  const double min_ns = min_px * ns_per_px;
  const auto& start = lane.start;
  while (i < last) {
    int64_t s = start[i], e = lane.end[i];
    if (double(e - s) >= min_ns) {
      out->push_back({s, e, uint32_t(i), 1});
      ++i;
      continue;
    }
    // A thin span: swallow every following span that starts within min_px of the fold's end,
    // jumping over runs of them with a binary search so the cost follows the pixels, not the
    // rows. A wide span met this way ends the fold (it is drawn on its own next).
    size_t j = i + 1;
    int64_t fold_end = std::max(e, lane.max_end[i]);
    for (;;) {
      int64_t limit = fold_end + int64_t(std::ceil(min_ns));
      size_t k = std::lower_bound(start.begin() + j, start.begin() + last, limit) - start.begin();
      if (k == j) break;
      int64_t next_end = lane.max_end[k - 1];
      if (double(next_end - fold_end) > 2 * min_ns) {
        if (k - 1 > j) {
          fold_end = std::max(fold_end, lane.max_end[k - 2]);
          j = k - 1;
        }
        break;
      }
      fold_end = std::max(fold_end, next_end);
      j = k;
    }
    out->push_back({s, fold_end, uint32_t(i), uint32_t(j - i)});
    i = j;
  }
}

void Series::build() {
  lo.clear();
  hi.clear();
  peak = 0;
  peak_t = t.empty() ? 0 : t.front();
  for (size_t i = 0; i < value.size(); ++i)
    if (i == 0 || value[i] > peak) peak = value[i], peak_t = t[i];
  const std::vector<double>* plo = &value;
  const std::vector<double>* phi = &value;
  while (plo->size() > 1) {
    size_t n = (plo->size() + 1) / 2;
    std::vector<double> nlo(n), nhi(n);
    for (size_t j = 0; j < n; ++j) {
      size_t a = 2 * j, b = std::min(2 * j + 1, plo->size() - 1);
      nlo[j] = std::min((*plo)[a], (*plo)[b]);
      nhi[j] = std::max((*phi)[a], (*phi)[b]);
    }
    lo.push_back(std::move(nlo));
    hi.push_back(std::move(nhi));
    plo = &lo.back();
    phi = &hi.back();
  }
}

double Series::at(int64_t time) const {
  auto it = std::upper_bound(t.begin(), t.end(), time);
  if (it == t.begin()) return 0;
  return value[size_t(it - t.begin()) - 1];
}

void Series::index_min_max(size_t a, size_t b, double* out_lo, double* out_hi) const {
  double mn = std::numeric_limits<double>::infinity(), mx = -mn;
  size_t level = 0;
  // Bottom-up segment-tree walk over the pyramid: an odd left edge or odd right edge is
  // taken at this level, the rest is covered by whole blocks one level up.
  while (a < b) {
    const std::vector<double>& L = level == 0 ? value : lo[level - 1];
    const std::vector<double>& H = level == 0 ? value : hi[level - 1];
    if (a & 1) {
      mn = std::min(mn, L[a]);
      mx = std::max(mx, H[a]);
      ++a;
    }
    if (b & 1) {
      --b;
      mn = std::min(mn, L[b]);
      mx = std::max(mx, H[b]);
    }
    a >>= 1;
    b >>= 1;
    ++level;
  }
  *out_lo = mn;
  *out_hi = mx;
}

bool Series::range_min_max(int64_t t0, int64_t t1, double* out_lo, double* out_hi) const {
  if (t.empty() || t1 <= t0) return false;
  size_t a = size_t(std::upper_bound(t.begin(), t.end(), t0) - t.begin());
  size_t b = size_t(std::lower_bound(t.begin(), t.end(), t1) - t.begin());
  // The sample in effect at t0 started at or before it.
  if (a > 0) --a;
  else if (b == 0) return false;
  if (b <= a) b = a + 1;
  index_min_max(a, b, out_lo, out_hi);
  return true;
}

void decimate(const Series& s, int64_t t0, double ns_per_px, int columns, int64_t t_stop,
              std::vector<ColumnMinMax>* out) {
  out->assign(size_t(std::max(columns, 0)), ColumnMinMax{});
  if (s.empty() || columns <= 0) return;
  size_t n = s.t.size();
  // Index of the first sample at or after the column's left edge, advanced per column by a
  // galloping search: O(columns * log n) however many samples fall in view.
  size_t next = size_t(std::lower_bound(s.t.begin(), s.t.end(), t0) - s.t.begin());
  for (int c = 0; c < columns; ++c) {
    int64_t c0 = t0 + int64_t(double(c) * ns_per_px);
    int64_t c1 = t0 + int64_t(double(c + 1) * ns_per_px);
    if (c1 <= c0) c1 = c0 + 1;
    if (c0 >= t_stop) break;
    // Gallop from the previous column's end: neighbouring columns are close in the array, so
    // this touches O(log distance) cache lines instead of O(log n).
    size_t lo_i = next, hi_i = next, step = 1;
    while (hi_i < n && s.t[hi_i] < c1) {
      lo_i = hi_i + 1;
      hi_i += step;
      step *= 2;
    }
    size_t b = size_t(std::lower_bound(s.t.begin() + long(std::min(lo_i, n)), s.t.begin() + long(std::min(hi_i, n)), c1) -
                      s.t.begin());
    size_t a = next;
    // The value carried into the column from the last sample before it counts too.
    if (a > 0 && (a == n || s.t[a] > c0)) --a;
    next = b;
    if (b <= a) {
      if (a >= n || s.t[a] > c0) continue;  // before the first sample
      b = a + 1;
    }
    double lo, hi;
    s.index_min_max(a, b, &lo, &hi);
    (*out)[size_t(c)] = {float(lo), float(hi), float(s.value[b - 1]), true};
  }
}

}  // namespace zt::viewer
