// bench_ds_configs: the public DeepSpeed configs of tests/data/ds_configs/, each read by zt and
// judged against the resolution DeepSpeed 0.19 makes (bench/ds_configs.h). A line a file, then
//   N of M read as DeepSpeed would; K refused where DeepSpeed accepts
// Usage: bench_ds_configs [DIR]   (default: the source tree's tests/data/ds_configs)
#include <cstdio>

#include "ds_configs.h"

#ifndef ZT_SOURCE_DIR
#define ZT_SOURCE_DIR "."
#endif

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : std::string(ZT_SOURCE_DIR) + "/tests/data/ds_configs";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    std::fprintf(stderr, "bench_ds_configs: %s: not a folder\n", dir.c_str());
    return 2;
  }
  int same = 0, total = 0, wrongly_refused = 0;
  for (const std::string& path : zt::bench::corpus_files(dir)) {
    const auto r = zt::bench::judge_config(path);
    ++total;
    same += r.same;
    wrongly_refused += r.deepspeed_accepts && !r.zt_accepts;
    std::printf("%-4s %-44s %s\n", r.same ? "ok" : "DIFF", r.name.c_str(), r.diff.c_str());
  }
  std::printf("%d of %d read as DeepSpeed would; %d refused where DeepSpeed accepts\n", same, total, wrongly_refused);
  return 0;
}
