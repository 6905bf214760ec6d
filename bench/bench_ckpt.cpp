// bench_ckpt: checkpoint save and load throughput, and the temporary device memory of the two
// gathers of the consolidated weights (issue 5, R4).
//
// W rank threads with their ZeRO-3 engines (both offloads, bf16, every module sharded), a save
// right after construction: the sharded optimizer state plus model.safetensors. Baselines in
// the same run, on the same disk: one thread writing the same number of bytes sequentially
// (1 MiB writes of varied bytes) and fsyncing, and reading them back. Each timed write starts after a sync and
// a 2 s pause, so neither pays for the other's write-back. Load = choosing the checkpoint (every
// file's checksum verified) plus every rank reading its shard into a fresh engine; it is
// measured warm (files in the page cache, as right after a save) and cold (the pages dropped
// with posix_fadvise first, as a new job resuming), against the read baseline in the same state.
//   bench_ckpt [--model 124M|tiny|350M] [--ranks W] [--dir DIR] [--repeat N]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "ckpt/checkpoint.h"
#include "model/config.h"
#include "train/rank_runtime.h"
#include "zero/communicator.h"
#include "zero/engine.h"
#include "zt/common/units.h"

using namespace zt;
using namespace zt::trainer;
namespace fs = std::filesystem;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Runs fn on W rank threads, each with its runtime and engine.
using RankFn = std::function<void(int, ZeroEngine&, Communicator&, RankRuntime&)>;
void on_ranks(const TrainConfig& cfg, const model::Config& mc, const RankFn& fn) {
  const int W = int(cfg.world_size);
  InProcessGroup group(W);
  std::vector<std::thread> threads;
  std::mutex mu;
  std::string failure;
  for (int r = 0; r < W; ++r)
    threads.emplace_back([&, r] {
      RuntimeOptions ro;
      ro.rank = r;
      ro.world_size = W;
      ro.device_capacity = cfg.device_memory;
      RankRuntime rt(ro, nullptr);
      auto comm = group.communicator(r, nullptr, rt.accelerator().trace_id());
      try {
        ZeroEngine engine(cfg, mc, 1, 64, rt, *comm);
        fn(r, engine, *comm, rt);
      } catch (const std::exception& e) {
        std::lock_guard lock(mu);
        if (failure.empty()) failure = "rank " + std::to_string(r) + ": " + e.what();
        comm->abort(e.what());
      }
    });
  for (auto& t : threads) t.join();
  if (!failure.empty()) {
    std::fprintf(stderr, "bench_ckpt: %s\n", failure.c_str());
    std::exit(1);
  }
}

int64_t dir_bytes(const std::string& dir) {
  int64_t b = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) b += int64_t(e.file_size());
  return b;
}

void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}
void drop_cache_dir(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) drop_cache(e.path().string());
}

// The baselines: `bytes` written in 1 MiB writes then fsync; read back in 1 MiB reads.
// The source is 64 MiB of varied bytes, cycled (on the dev VM, a constant 1 MiB buffer wrote
// slower than a checkpoint's real data).
double plain_write(const std::string& path, int64_t bytes) {
  static std::vector<char> src = [] {
    std::vector<char> v(64 << 20);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (auto& c : v) c = char((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 56);
    return v;
  }();
  const double t0 = now_s();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (int64_t at = 0; at < bytes;) {
    const size_t n = size_t(std::min<int64_t>(bytes - at, 1 << 20));
    const ssize_t w = ::write(fd, src.data() + size_t(at) % src.size(), n);
    if (w <= 0) std::exit(2);
    at += w;
  }
  ::fsync(fd);
  ::close(fd);
  return now_s() - t0;
}
double plain_read(const std::string& path) {
  std::vector<char> buf(1 << 20);
  const double t0 = now_s();
  const int fd = ::open(path.c_str(), O_RDONLY);
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  ::close(fd);
  return now_s() - t0;
}

// Before each timed write: everything earlier on disk, and a moment for the disk to drain
// (on the dev VM whichever write came right after another one ran several times slower).
void settle() {
  ::sync();
  std::this_thread::sleep_for(std::chrono::seconds(2));
}

std::string rate(int64_t bytes, double s) { return format_bytes(double(bytes) / s) + "/s"; }

}  // namespace

int main(int argc, char** argv) {
  zt::bench::Options opt(argc, argv, "bench_ckpt [--model 124M|tiny|350M] [--ranks W] [--dir DIR] [--repeat N]");
  const std::string model = opt.text("--model", "124M");
  const int ranks = int(opt.integer("--ranks", 2, 1, 64));
  // A scratch directory of its own beside the benchmark's binary unless given: on the build's disk
  // (the system's temporary directory may be tmpfs, where the cold loads would read RAM), and not
  // the working directory (./bench-ckpt.tmp: run from a checkout, it left files in it).
  const std::string dir = opt.text(
      "--dir", (std::filesystem::read_symlink("/proc/self/exe").parent_path() / ("bench-ckpt-" + std::to_string(getpid()) + ".tmp"))
                   .string());
  const int repeat = int(opt.integer("--repeat", 3, 1, 1000));
  opt.done();
  const auto mc = model::preset(model);
  if (!mc) {
    std::fprintf(stderr, "bench_ckpt: --model %s: not a preset\n", model.c_str());
    return 2;
  }
  TrainConfig cfg;
  cfg.model = model;
  cfg.world_size = ranks;
  cfg.precision = "bf16";
  cfg.zero.stage = 3;
  cfg.zero.offload_optimizer = true;
  cfg.zero.offload_param = true;
  cfg.zero.param_persistence_threshold = 0;  // every module sharded, as in R4's 236B model
  cfg.save_safetensors = true;
  fs::remove_all(dir);
  fs::create_directories(dir);
  const int64_t model_bytes = model::num_params(*mc) * 2;
  std::printf("bench_ckpt: GPT-2 %s (%s parameters, %s in bf16), %d ranks, ZeRO-3 with optimizer and parameter offload,\n"
              "  checkpoints in %s, %d runs of each measurement\n",
              model.c_str(), format_count(double(model::num_params(*mc))).c_str(), format_bytes(double(model_bytes)).c_str(),
              ranks, dir.c_str(), repeat);

  // ---- saves: both gathers, `repeat` times each, each right after a plain write of the same
  // size to a fresh file (this disk's speed drifts a lot: each save is compared with its own
  // baseline, and the medians are shown)
  struct Save {
    std::vector<double> seconds, plain, ratio;
    int64_t bytes = 0, peak = 0;
  };
  Save saves[2];
  const char* names[2] = {"streamed", "device"};
  int64_t ckpt_bytes = 0;
  std::string last_dir;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  int plain_files = 0;
  auto fresh_plain = [&] { return dir + "/plain" + std::to_string(plain_files++) + ".bin"; };
  auto one_save = [&](int g, const std::string& d, ckpt::SaveReport* report) {
    TrainConfig c = cfg;
    c.checkpoint_gather = names[g];
    double seconds = 0;
    on_ranks(c, *mc, [&](int rank, ZeroEngine& e, Communicator& comm, RankRuntime&) {
      if (rank == 0) settle();
      comm.barrier();
      const double t0 = now_s();
      ckpt::SaveReport r;
      ckpt::save(d, c, {0, 0, 0}, e, comm, {}, &r);
      comm.barrier();
      if (rank == 0) {
        seconds = now_s() - t0;
        *report = r;
      }
    });
    return seconds;
  };
  {
    ckpt::SaveReport r;
    one_save(0, dir + "/size", &r);  // how many bytes a checkpoint is
    ckpt_bytes = dir_bytes(dir + "/size");
    fs::remove_all(dir + "/size");
  }
  for (int rep = 0; rep < repeat; ++rep) {
    for (int g = 0; g < 2; ++g) {
      const std::string d = dir + "/" + names[g] + std::to_string(rep);
      const std::string p = fresh_plain();
      settle();
      const double plain_s = plain_write(p, ckpt_bytes);
      fs::remove(p);
      ckpt::SaveReport report;
      const double seconds = one_save(g, d, &report);
      saves[g].bytes = dir_bytes(d);
      saves[g].peak = report.peak_temp_device_bytes;
      saves[g].seconds.push_back(seconds);
      saves[g].plain.push_back(plain_s);
      saves[g].ratio.push_back(plain_s / seconds);
      if (rep + 1 == repeat && g == 1) last_dir = d;
      else fs::remove_all(d);
    }
  }
  std::printf("\nsave (shards + model.safetensors + manifest + latest, fsynced), %s per checkpoint; medians of %d:\n",
              format_bytes(double(ckpt_bytes)).c_str(), repeat);
  for (int g = 0; g < 2; ++g) {
    const double t = median(saves[g].seconds), b = median(saves[g].plain);
    std::printf("  plain write + fsync %9s  %12s | save, %-8s gather %9s  %12s | %5.1f%% of the plain write\n",
                format_duration_ns(b * 1e9).c_str(), rate(ckpt_bytes, b).c_str(), names[g],
                format_duration_ns(t * 1e9).c_str(), rate(ckpt_bytes, t).c_str(), 100.0 * median(saves[g].ratio));
  }
  const std::string plain = fresh_plain();
  plain_write(plain, ckpt_bytes);

  // ---- loads: warm and cold, each right after the read baseline in the same state
  std::printf("\nload (verify every file's checksum, then every rank reads its shard into a fresh engine); medians of %d:\n",
              repeat);
  for (bool cold : {false, true}) {
    std::vector<double> load_v, select_v, read_v, ratio_v;
    for (int rep = 0; rep < repeat; ++rep) {
      if (cold) drop_cache(plain);
      else plain_read(plain);  // in the page cache
      const double read_s = plain_read(plain);
      ckpt::Selected sel;
      double t_select = 0, t_load = 0;
      on_ranks(cfg, *mc, [&](int rank, ZeroEngine& e, Communicator& comm, RankRuntime&) {
        comm.barrier();
        if (rank == 0) {
          if (cold) {
            drop_cache_dir(last_dir);
          } else {
            ckpt::Selected warm;
            (void)ckpt::select_checkpoint(last_dir, &warm);  // every file read once: in the page cache
          }
          const double t0 = now_s();
          if (Status s = ckpt::select_checkpoint(last_dir, &sel); !s) {
            std::fprintf(stderr, "bench_ckpt: %s\n", s.message().c_str());
            std::exit(1);
          }
          t_select = now_s() - t0;
        }
        comm.barrier();
        const double t1 = now_s();
        ckpt::load(sel, rank, e);
        comm.barrier();
        if (rank == 0) t_load = now_s() - t1;
      });
      read_v.push_back(read_s);
      select_v.push_back(t_select);
      load_v.push_back(t_select + t_load);
      ratio_v.push_back(read_s / (t_select + t_load));
    }
    const double r = median(read_v), l = median(load_v);
    std::printf("  %s plain read %9s  %12s | resume load %9s  %12s (verify %s) | %5.1f%% of the plain read\n",
                cold ? "cold (pages dropped):" : "warm (page cache):   ", format_duration_ns(r * 1e9).c_str(),
                rate(ckpt_bytes, r).c_str(), format_duration_ns(l * 1e9).c_str(), rate(ckpt_bytes, l).c_str(),
                format_duration_ns(median(select_v) * 1e9).c_str(), 100.0 * median(ratio_v));
  }

  std::printf("\ntemporary device memory of the consolidated-weights gather (rank 0), model %s in bf16:\n",
              format_bytes(double(model_bytes)).c_str());
  for (int g = 0; g < 2; ++g)
    std::printf("  %-8s  %12s  %5.1f%% of the model\n", names[g], format_bytes(double(saves[g].peak)).c_str(),
                100.0 * double(saves[g].peak) / double(model_bytes));
  fs::remove_all(dir);
  return 0;
}
