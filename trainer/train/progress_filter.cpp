// trainer/train/progress_filter.cpp: see progress_filter.h.
#include "train/progress_filter.h"

#include <algorithm>
#include <cstdio>

namespace zt::trainer {

ProgressFilter::ProgressFilter(std::ostream* out, int max_step_lines, std::string indent)
    : out_(out), max_(std::max(3, max_step_lines)), indent_(std::move(indent)) {}

void ProgressFilter::finish() {
  if (!out_) return;
  flush_line();
  if (!held_.empty()) {
    if (skipped_ > 1) *out_ << indent_ << "... " << skipped_ - 1 << " step lines not shown\n";
    *out_ << indent_ << held_ << "\n";
    held_.clear();
  }
  out_->flush();
}

int ProgressFilter::overflow(int c) {
  if (c == traits_type::eof()) return 0;
  if (c == '\n') flush_line();
  else line_ += char(c);
  return c;
}

void ProgressFilter::flush_line() {
  if (!out_ || line_.empty()) return;
  long long x = 0, y = 0;
  if (std::sscanf(line_.c_str(), "step %lld/%lld", &x, &y) == 2 && y > 0) {
    const long long head = 3;
    const long long stride = std::max<long long>(1, y / std::max(1, max_ - 3));
    const bool show = y <= max_ || x <= head || x == y || x % stride == 0;
    if (show) {
      if (skipped_ > 0 && !held_.empty() && skipped_ > 1) *out_ << indent_ << "... " << skipped_ - 1 << " step lines not shown\n";
      *out_ << indent_ << line_ << "\n";
      held_.clear();
      skipped_ = 0;
    } else {
      held_ = line_;
      ++skipped_;
    }
  } else {
    *out_ << indent_ << line_ << "\n";
  }
  line_.clear();
}

}  // namespace zt::trainer
