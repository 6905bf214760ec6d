// trainer/train/progress_filter.h: the training run's progress lines (train()'s `progress`
// stream), indented and, on a long run, thinned: every line that is not a step line passes; of
// the step lines ("step X/Y | ..."), the first three, about one per tenth of the run and the last
// (held back and printed by finish() when it was not shown), with "... N step lines not shown"
// where lines were left out. Used by `zt repro` (each run's lines) and `zt demo`.
#pragma once

#include <ostream>
#include <streambuf>
#include <string>

namespace zt::trainer {

class ProgressFilter : public std::streambuf {
 public:
  // out null: everything is dropped. max_step_lines: 3 at least; a run of that many steps or fewer
  // shows them all.
  ProgressFilter(std::ostream* out, int max_step_lines, std::string indent = "    ");
  // Ends the last line and prints the held-back last step line. Call once the run has returned.
  void finish();

 protected:
  int overflow(int c) override;

 private:
  void flush_line();
  std::ostream* out_;
  int max_;
  std::string indent_, line_, held_;
  long long skipped_ = 0;
};

}  // namespace zt::trainer
