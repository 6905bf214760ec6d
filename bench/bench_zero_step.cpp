// bench_zero_step: where a ZeRO-3 offload step goes on the simulated GPU, step by step.
// Trains with a trace, then reads the phase markers back: fetch (host->device copy of the
// shard + all-gather, prefetch included), forward, loss, backward, reduce (reduce-scatter
// of gradient buckets), optimizer (gradient offload, norm, unscale-and-clip, write back), adamw
// (the "adamw <module>" phases inside it). Nested phases are subtracted from their parents; what no
// column names (the gradients landing, the norm's phases) is the rest of the step.
// Baseline in the same run: the same model and global batch at stage 0 on one rank. Beside it,
// the same ZeRO-3 run with the delayed parameter update from step 1 on (AdamW of step s beside
// step s+1's forward and backward, on a background thread): its mean step over the ordinary one;
// and the overlapped update (AdamW of step s beside step s+1's forward, each module awaited at its
// first use; the same losses as the ordinary run, checked here); and the gradient partitions kept in
// bf16 for AdamW (grad_partition_dtype compute; the same losses, checked): its AdamW time and step
// over the ordinary run's.
//   bench_zero_step [--model tiny|124M] [--steps N] [--ranks W] [--seq-len T]
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "bench_util.h"
#include "train/trainer.h"
#include "zt/common/units.h"
#include "zt/db/trace_reader.h"

using namespace zt;

namespace {

struct Run {
  double seconds = 0;
  std::vector<double> losses;
  std::vector<std::map<std::string, double>> per_step;  // rank 0, ms per category
};

Run run(const trainer::TrainConfig& cfg, const std::string& path) {
  probe::RecorderOptions o;
  o.path = path;
  o.crash_handlers = false;
  std::unique_ptr<probe::Recorder> rec;
  if (Status s = probe::Recorder::open(o, &rec); !s) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    std::exit(2);
  }
  trainer::TrainSummary sum;
  Status s = trainer::train(cfg, rec.get(), nullptr, &sum);
  (void)rec->close();
  if (!s) {
    std::fprintf(stderr, "bench_zero_step: %s\n", s.message().c_str());
    std::exit(1);
  }
  Run r;
  r.seconds = sum.seconds;
  r.losses = sum.losses;
  std::unique_ptr<db::TraceReader> reader;
  if (Status st = db::TraceReader::open(path, &reader); !st) std::exit(2);
  db::QueryResult q;
  // Exclusive time of each phase: its span minus the spans of phases directly inside it. A module's
  // own forward or backward ("forward block0") is part of its parent's column, not a phase of its
  // own (as 'other' it was taken out of forward and backward, which then showed 0.00 ms).
  (void)reader->query(
      "WITH p AS (SELECT id, step, t_start, t_end, CASE WHEN name LIKE 'fetch %' OR name LIKE 'prefetch %' THEN 'fetch'"
      " WHEN name LIKE 'reduce %' THEN 'reduce' WHEN name LIKE 'release %' THEN 'release'"
      " WHEN name LIKE 'adamw %' THEN 'adamw'"
      " WHEN name IN ('forward','loss','backward','optimizer') THEN name ELSE 'other' END AS cat"
      " FROM marker_v WHERE rank = 0 AND kind = 'phase' AND name NOT LIKE 'forward %' AND name NOT LIKE 'backward %'),"
      " inner AS (SELECT o.id, sum(i.t_end - i.t_start) AS nested FROM p o JOIN p i ON i.step = o.step AND i.id != o.id"
      " AND i.t_start >= o.t_start AND i.t_end <= o.t_end AND o.cat IN ('forward','loss','backward','optimizer')"
      " AND i.cat NOT IN ('forward','loss','backward','optimizer') GROUP BY o.id)"
      " SELECT p.step, p.cat, sum(p.t_end - p.t_start - coalesce(inner.nested, 0)) / 1e6 FROM p LEFT JOIN inner"
      " ON inner.id = p.id GROUP BY 1, 2 ORDER BY 1, 2",
      &q);
  for (auto& row : q.rows) {
    size_t step = std::stoul(row[0]);
    if (r.per_step.size() <= step) r.per_step.resize(step + 1);
    r.per_step[step][row[1]] = std::stod(row[2]);
  }
  (void)reader->query("SELECT step, (t_end - t_start) / 1e6 FROM marker WHERE rank = 0 AND kind = 0 ORDER BY step", &q);
  for (auto& row : q.rows) r.per_step[std::stoul(row[0])]["step"] = std::stod(row[1]);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  trainer::TrainConfig cfg;
  cfg.model = "tiny";
  cfg.steps = 8;
  cfg.world_size = 2;
  cfg.seq_len = 64;
  cfg.micro_batch = 4;
  cfg.precision = "bf16";
  zt::bench::Options opt(argc, argv, "bench_zero_step [--model tiny|124M] [--steps N] [--ranks W] [--seq-len T]");
  cfg.model = opt.text("--model", cfg.model, {"tiny", "124M", "350M", "774M", "1.5B"});
  cfg.steps = opt.integer("--steps", cfg.steps, 1);
  cfg.world_size = int(opt.integer("--ranks", cfg.world_size, 1, 64));
  cfg.seq_len = opt.integer("--seq-len", cfg.seq_len, 1);
  opt.done();
  auto dir = std::filesystem::temp_directory_path() / ("zt_bench_zero_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);

  trainer::TrainConfig z3 = cfg;
  z3.zero.stage = 3;
  z3.zero.offload_optimizer = true;
  z3.zero.offload_param = true;
  trainer::TrainConfig base = cfg;
  base.grad_accum = cfg.world_size;  // the same global batch on one rank
  base.world_size = 1;
  trainer::TrainConfig dpu = z3;
  dpu.delayed_update = 1;
  Run a = run(z3, (dir / "z3.db").string());
  Run b = run(base, (dir / "base.db").string());
  Run d = run(dpu, (dir / "dpu.db").string());
  trainer::TrainConfig ovl = z3;
  ovl.overlap_update = true;
  Run o = run(ovl, (dir / "overlap.db").string());
  trainer::TrainConfig low = z3;
  low.grad_partition_dtype = "compute";
  Run l = run(low, (dir / "compute_grads.db").string());

  std::printf("bench_zero_step: GPT-2 %s, %lld ranks x micro-batch %lld x %lld tokens, bf16, ZeRO-3 with optimizer and "
              "parameter offload, on simulated GPUs (CPU compute)\n",
              cfg.model.c_str(), (long long)cfg.world_size, (long long)cfg.micro_batch, (long long)cfg.seq_len);
  std::printf("rank 0, exclusive time per phase [ms]:\n");
  std::printf("%5s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "step", "step", "fetch", "forward", "loss", "backward", "reduce",
              "optimizer", "adamw", "release");
  for (size_t s = 0; s < a.per_step.size(); ++s) {
    auto& m = a.per_step[s];
    std::printf("%5zu %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n", s, m["step"], m["fetch"], m["forward"],
                m["loss"], m["backward"], m["reduce"], m["optimizer"], m["adamw"], m["release"]);
  }
  // Steps 2 on: step 1 is the delayed run's first with an update in flight.
  auto mean_step = [](const Run& r) {
    double t = 0;
    size_t k = 0;
    for (size_t s = 2; s < r.per_step.size(); ++s, ++k) t += r.per_step[s].at("step");
    return k ? t / double(k) : 0.0;
  };
  const double za = mean_step(a), zb = mean_step(b), zd = mean_step(d), zo = mean_step(o);
  std::printf("mean step from step 2: ZeRO-3 offload %.2f ms, baseline (stage 0, 1 rank, same global batch) %.2f ms,"
              " ratio %.2fx\n", za, zb, zb > 0 ? za / zb : 0.0);
  std::printf("delayed parameter update (ZeRO-3 offload, AdamW beside the next step): %.2f ms, ratio to ZeRO-3 offload "
              "%.2fx\n", zd, za > 0 ? zd / za : 0.0);
  std::printf("overlapped update (ZeRO-3 offload, AdamW beside the next forward, exact): %.2f ms, ratio to ZeRO-3 offload "
              "%.2fx; losses %s the ordinary run's\n",
              zo, za > 0 ? zo / za : 0.0, o.losses == a.losses ? "bit-identical to" : "DIFFERENT from");
  auto mean_of = [](const Run& r, const char* cat) {
    double t = 0;
    size_t k = 0;
    for (size_t s = 2; s < r.per_step.size(); ++s, ++k) t += r.per_step[s].count(cat) ? r.per_step[s].at(cat) : 0.0;
    return k ? t / double(k) : 0.0;
  };
  const double zl = mean_step(l), adam_a = mean_of(a, "adamw"), adam_l = mean_of(l, "adamw");
  std::printf("bf16 gradient partitions for AdamW (grad_partition_dtype compute): step %.2f ms, ratio to ZeRO-3 offload "
              "%.2fx; AdamW (the 'adamw' phases) %.2f ms against %.2f ms a step, ratio %.2fx; losses %s the ordinary "
              "run's\n",
              zl, za > 0 ? zl / za : 0.0, adam_l, adam_a, adam_a > 0 ? adam_l / adam_a : 0.0,
              l.losses == a.losses ? "bit-identical to" : "DIFFERENT from");
  std::filesystem::remove_all(dir);
  return 0;
}
