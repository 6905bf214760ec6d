// cli/probe_torch.h: zt probe's step for PyTorch programs. The zerotrace Python hook
// (python/zerotrace/hooks/torch_memory.py) leaves each process's allocator history beside the
// trace (zt/probe/probe_config.h: torch_history_path); this adds it to that process's trace
// (zt/db/torch_snapshot.h: merge_torch_snapshot) and says so on stderr.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace zt::cli {

// `traces`: this run's traces (path, pid) in the order their processes started. A process that
// exec'd has several; its history belongs to its last image (the one that ran Python to the end).
// A history merged is removed; one that cannot be merged is kept and the reason printed.
void merge_torch_histories(const std::string& main, const std::string& run_id,
                           const std::vector<std::pair<std::string, int64_t>>& traces);

}  // namespace zt::cli
