#include "probe_torch.h"

#include <unistd.h>

#include <cstdio>
#include <map>

#include "zt/db/torch_snapshot.h"
#include "zt/probe/probe_config.h"

namespace zt::cli {

void merge_torch_histories(const std::string& main, const std::string& run_id,
                           const std::vector<std::pair<std::string, int64_t>>& traces) {
  std::map<int64_t, std::string> last_image;  // pid -> its last trace
  for (auto& [path, pid] : traces) last_image[pid] = path;
  for (auto& [pid, trace] : last_image) {
    const std::string pickle = probe::torch_history_path(main, pid);
    if (::access(pickle.c_str(), R_OK) != 0) continue;
    db::TorchImportStats st;
    if (Status s = db::merge_torch_snapshot(trace, pickle, run_id, &st); !s) {
      std::fprintf(stderr, "zt probe: PyTorch's allocator history was not added (%s is kept): %s\n", pickle.c_str(),
                   s.message().c_str());
      continue;
    }
    ::unlink(pickle.c_str());
    auto n = [](int64_t v, const char* one, const char* many) { return std::to_string(v) + " " + (v == 1 ? one : many); };
    std::fprintf(stderr,
                 "zt probe: %s: PyTorch's allocator history added: %s in %s on %s (%s of CUPTI's cudaMalloc records "
                 "are PyTorch's segments)%s\n",
                 trace.c_str(), n(st.blocks, "block", "blocks").c_str(), n(st.segments, "segment", "segments").c_str(),
                 n(st.devices, "device", "devices").c_str(), std::to_string(st.cupti_paired).c_str(),
                 st.ooms ? (", " + std::to_string(st.ooms) + " out-of-memory error" + (st.ooms == 1 ? "" : "s")).c_str()
                         : "");
  }
}

}  // namespace zt::cli
