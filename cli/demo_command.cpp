// zt demo: the main job of the README's first command: train on the simulated GPU with a
// trace, explain the trace, run out of device memory for real and show the evidence,
// reproduce a bug report from its scenario (and cure it), check the trace as CI would,
// export for Perfetto.
#include <unistd.h>

#include <filesystem>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "core/backend.h"
#include "train/trainer.h"
#include "zt/check/check.h"
#include "zt/common/units.h"
#include "zt/db/export.h"
#include "zt/db/kernel_summary.h"
#include "zt/repro/runner.h"

namespace zt::cli {
namespace {

int run_training(const trainer::TrainConfig& cfg, const std::string& command, bool expect_failure) {
  probe::RecorderOptions ro;
  ro.path = cfg.trace;
  ro.command_line = command;
  ro.config_json = trainer::to_json(cfg);
  ro.seed = static_cast<int64_t>(cfg.seed);
  std::unique_ptr<probe::Recorder> rec;
  if (Status s = probe::Recorder::open(ro, &rec); !s) return fail(s.message());
  trainer::TrainSummary sum;
  Status s = trainer::train(cfg, rec.get(), expect_failure ? nullptr : &std::cout, &sum);
  Status closed = s ? rec->close(db::RunStatus::Ok, 0) : rec->close(db::RunStatus::Failed, 1, s.message());
  if (!closed) return fail(closed.message());
  if (s) {
    std::cout << "trained " << sum.steps << " steps in " << format_duration_ns(sum.seconds * 1e9) << ": loss "
              << sum.first_loss << " -> " << sum.last_loss << "\n";
    return expect_failure ? kExitFailed : kExitOk;
  }
  // Expected: a run that started and failed (sum.failure), not one refused for its input.
  if (expect_failure && !sum.failure.empty()) {
    std::cout << "zt train failed, as it should: " << s.message() << "\n";
    return kExitOk;
  }
  std::fprintf(stderr, "zt demo: zt train failed: %s\n", s.message().c_str());
  return sum.failure.empty() ? kExitBadInput : kExitFailed;
}

// The shipped scenarios: beside the working directory's checkout, else where `cmake --install`
// put them (share/zerotrace/scenarios beside bin/), else the source tree the binary was built from.
std::string scenario_path(const std::string& file) { return scenario_dir() + "/" + file; }

}  // namespace

void add_demo_command(CLI::App& app, Action& action) {
  auto* demo = app.add_subcommand("demo", "The demo: train on a simulated GPU with a trace, explain it, run out of "
                                          "memory for real, reproduce bug report R2 and cure it, check the trace, export "
                                          "for Perfetto, train again with flash attention, the overlapped update, the delayed update and a partial "
                                          "optimizer offload\nExample: zt demo --dir demo-out");
  auto dir = std::make_shared<std::string>("demo-out");
  auto steps = std::make_shared<int64_t>(80);
  auto device = std::make_shared<std::string>("auto");
  demo->add_option("--dir", *dir, "where the demo writes its files");
  demo->add_option("--device", *device, "where the first run trains: auto (a GPU when there is a usable one, else the "
                                        "simulated GPU), sim or cuda")
      ->check(CLI::IsMember({"auto", "sim", "cuda"}));
  // Later sections compare their loss at step 20 with the first run's: it must have one.
  demo->add_option("--steps", *steps, "training steps of the first run (20 or more; default 80)")
      ->check(CLI::Range(int64_t(20), int64_t(1) << 30));
  demo->callback([&action, dir, steps, device] {
    action = [=]() -> int {
      std::error_code ec;
      std::filesystem::create_directories(*dir, ec);
      if (ec) return fail(*dir + ": cannot create the directory: " + ec.message());
      trainer::TrainConfig cfg;
      cfg.model = "tiny";
      cfg.steps = *steps;
      cfg.seq_len = 64;
      cfg.micro_batch = 4;
      cfg.grad_accum = 1;
      cfg.precision = "bf16";
      cfg.world_size = 2;
      cfg.zero.stage = 3;
      cfg.zero.offload_optimizer = true;
      cfg.zero.offload_param = true;
      // Every module of the tiny model is below DeepSpeed's default persistence threshold
      // (1e5 parameters), which would keep them whole on every GPU; shard them all.
      cfg.zero.param_persistence_threshold = 0;
      cfg.trace = *dir + "/train.db";
      std::string why;
      cfg.device = *device;
      if (*device == "auto") cfg.device = trainer::make_cuda_backend(0, &why) ? "cuda" : "sim";
      const bool gpu = cfg.device == "cuda";
      const std::string cmd = "zt train --device " + cfg.device +
                              " --model tiny --precision bf16 --world-size 2 --zero-stage 3 "
                              "--offload-optimizer --offload-param (stage3_param_persistence_threshold 0)";
      std::cout << "== 1. " << cmd << " --steps " << *steps << " --trace " << cfg.trace << "\n"
                << (gpu ? "   GPT-2 (tiny) trained with ZeRO-3 and CPU offload by two ranks sharing this machine's GPU\n"
                        : "   GPT-2 (tiny) trained with ZeRO-3 and CPU offload by two ranks, each on its own simulated GPU\n")
                << "   (shown as cuda:0 and cuda:1), on the built-in synthetic corpus\n";
      if (!gpu && *device == "auto") std::cout << "   (no GPU used: " << why << ")\n";
      if (int rc = run_training(cfg, "zt demo: " + cmd, false); rc != 0) return rc;
      std::cout << "\n== 2. zt db info " << cfg.trace << "\n";
      if (int rc = db_info(cfg.trace); rc != 0) return rc;
      std::cout << "\n== 3. where rank 0's model states live, by SQL (zt db sql): ZeRO-3 with offload keeps the\n"
                   "   parameter shards, fp32 master weights and Adam moments on the host, gathers on the GPU\n";
      if (int rc = db_sql(cfg.trace,
                          "SELECT device, CASE WHEN name LIKE '%.gathered' THEN '<module>.gathered' WHEN name LIKE "
                          "'%.shard' THEN '<module>.shard' WHEN name LIKE 'adam.%' THEN 'adam.m/v[<module>]' WHEN name LIKE "
                          "'grad.from_device[%' THEN 'grad.from_device[<module>]' WHEN name "
                          "LIKE 'fp32_partitioned_groups_flat%' THEN 'fp32_partitioned_groups_flat[<i>]...' ELSE name "
                          "END AS tensor, count(*) AS blocks, max(bytes) AS largest FROM allocation_v WHERE rank = 0 "
                          "AND level = 'block' GROUP BY 1, 2 ORDER BY 1, 4 DESC LIMIT 16",
                          false);
          rc != 0)
        return rc;
      std::cout << "   and the offload traffic: parameter shards go up (H2D) while earlier modules compute, gradient\n"
                   "   partitions go down (D2H) during the rest of backward; the time each copy spent inside a\n"
                   "   module's forward or backward marker is hidden under compute\n";
      if (int rc = db_sql(cfg.trace,
                          "SELECT t.kind, count(*) AS copies, sum(t.bytes) AS bytes, round(sum(t.t_end - t.t_start) / "
                          "1e3) AS busy_us, round(100.0 * sum(coalesce((SELECT sum(min(t.t_end, m.t_end) - "
                          "max(t.t_start, m.t_start)) FROM marker_v m WHERE m.rank = t.rank AND (m.name LIKE 'forward %' "
                          "OR m.name LIKE 'backward %') AND m.t_start < t.t_end AND t.t_start < m.t_end), 0)) / "
                          "max(sum(t.t_end - t.t_start), 1), 1) AS pct_hidden FROM transfer_v t WHERE t.rank = 0 AND "
                          "t.kind IN ('H2D', 'D2H') AND t.name NOT LIKE 'batch.%' GROUP BY 1 ORDER BY 1",
                          false);
          rc != 0)
        return rc;

      trainer::TrainConfig oom = cfg;
      oom.steps = 2;
      oom.world_size = 1;
      oom.zero = trainer::ZeroSettings{};
      oom.device_memory = 3ull << 20;
      oom.trace = *dir + "/oom.db";
      oom.device = "sim";
      std::cout << "\n== 4. the tiny model on one simulated GPU of 3 MiB (one rank, no ZeRO): the caching allocator "
                   "really runs out\n"
                << "   zt train --device sim --model tiny --steps 2 --device-memory 3MiB --trace " << oom.trace << "\n";
      if (int rc = run_training(oom, "zt demo: zt train --device sim --model tiny --device-memory 3MiB", true); rc != 0)
        return rc;
      std::cout << "   the evidence in the trace (zt db sql " << oom.trace << " ...):\n";
      if (int rc = db_sql(oom.trace,
                          "SELECT e.kind, e.step, (SELECT group_concat(name || ' ' || bytes, ', ') FROM allocation_v "
                          "WHERE device = 'cuda:0' AND level = 'block' AND t_alloc <= e.t AND (t_free IS NULL OR "
                          "t_free > e.t)) AS live_blocks_at_the_error FROM error e",
                          false);
          rc != 0)
        return rc;

      const std::string r2 = scenario_path("r2-qwen72b-offload-device-mismatch.yaml");
      std::cout << "\n== 5. zt repro " << r2 << " --keep " << *dir << "/r2\n"
                << "   bug report R2 (Qwen 72B, ZeRO-3 + offload: the clip scale on cuda:N, the fp32 partitions on the host)\n"
                << "   replayed small with its fault, then with the fix; the verdict is read from the two traces\n";
      {
        repro::Scenario sc;
        if (Status s = repro::load_scenario(r2, &sc); !s) return fail(s.message());
        repro::RunOptions ro;
        ro.keep_dir = *dir + "/r2";
        ro.max_step_lines = 2;
        ro.command_line = "zt demo: zt repro " + r2;
        repro::ReproResult res;
        if (Status s = repro::run_scenario(sc, ro, &res); !s) return fail(s.message());
        repro::print_verdict(res, std::cout);
        if (res.exit_code() != 0) return fail("the R2 scenario did not reproduce and cure as it should");
      }

      std::cout << "\n== 6. zt check " << cfg.trace << " (how the run ended, leaks across epochs, placement, steps: pass/fail for CI)\n";
      {
        check::Report report;
        if (Status s = check::run_checks(cfg.trace, check::Options{}, &report); !s) return fail(s.message());
        std::cout << check::format_text(report);
        if (report.failed()) return fail("zt check found a problem in the demo's own training run");
      }

      std::string json = *dir + "/train.json";
      std::cout << "\n== 7. zt export " << cfg.trace << " --chrome " << json << "\n";
      db::ExportStats st;
      if (Status s = db::export_chrome(cfg.trace, json, &st); !s) return fail(s.message());
      std::cout << "wrote " << st.events << " trace events (" << format_bytes(double(st.bytes)) << "): open " << json
                << " in https://ui.perfetto.dev\n";
      // Flash attention, written for the GPU (issue 8), runs on the simulated GPU too (its CPU twin).
      trainer::TrainConfig flash = cfg;
      flash.steps = 20;
      flash.attention = "flash";
      flash.trace = *dir + "/flash.db";
      std::cout << "\n== 8. the same run with --attention flash --steps 20 --trace " << flash.trace << "\n"
                << "   FlashAttention-2 keeps one value per attention row instead of the B x H x T x T probabilities\n"
                << "   (on a GPU tensor-core kernels; here their CPU twin, which multiplies in bf16 as they do)\n";
      if (int rc = run_training(flash, "zt demo: zt train ... --attention flash", false); rc != 0) return rc;
      // On the simulated GPU the device holds what PyTorch's autograd would keep, tensor by tensor
      // (block0.attn.probs, ...); a GPU's passes hold theirs as one 'activations' tensor.
      std::cout << "   what rank 0's block0 keeps of its attention for backward, with the materialized attention (run 1)\n"
                << "   and with flash (this run) (on a GPU: the passes' whole activation buffer):\n";
      const std::string activations =
          "SELECT sum(b) AS activation_bytes FROM (SELECT name, max(requested_bytes) AS b FROM allocation_v WHERE rank = 0 "
          "AND level = 'block' AND (name = 'activations' OR (name GLOB 'block0.attn.*' AND name NOT GLOB '*.scores*' "
          "AND name NOT IN ('block0.attn.y', 'block0.attn.proj'))) GROUP BY name)";
      if (int rc = db_sql(cfg.trace, activations, false); rc != 0) return rc;
      if (int rc = db_sql(flash.trace, activations, false); rc != 0) return rc;

      // The overlapped update, written for the GPU (issue 8): exact, so its losses are run 1's.
      trainer::TrainConfig overlap = cfg;
      overlap.steps = 20;
      overlap.overlap_update = true;
      overlap.trace = *dir + "/overlap.db";
      std::cout << "\n== 9. the same run with --overlap-update --steps 20 --trace " << overlap.trace << "\n"
                << "   each step's CPU AdamW runs on a background thread beside the next step's forward, module by\n"
                << "   module; each module waits for its own update (the 'await update' phases), so the arithmetic\n"
                << "   is the ordinary update's: rank 0's loss at step 20 in run 1 and in this run:\n";
      if (int rc = run_training(overlap, "zt demo: zt train ... --overlap-update", false); rc != 0) return rc;
      const std::string loss20 =
          "SELECT value AS loss_at_step_20 FROM counter_v WHERE rank = 0 AND name = 'loss' ORDER BY t LIMIT 1 OFFSET 19";
      if (int rc = db_sql(cfg.trace, loss20, false); rc != 0) return rc;
      if (int rc = db_sql(overlap.trace, loss20, false); rc != 0) return rc;
      if (gpu) {
        std::cout << "   (zt train --cupti records the GPU's kernels; zt db kernels then shows when it computed and\n"
                     "   what the rank thread did while it sat idle)\n";
      } else {
        std::cout << "   zt db kernels " << overlap.trace << " --top 5 --gaps 3: when rank 0's simulated GPU computed\n"
                  << "   (each model pass is a kernel row) and what the rank thread did while it sat idle; the\n"
                  << "   background AdamW is not the rank thread's, its waits ('await update') are\n";
        db::KernelSummaryOptions ko;
        ko.longest_gaps = 3;
        if (int rc = db_kernels(overlap.trace, ko, 5); rc != 0) return rc;
      }

      // The delayed update (ZeRO-Offload's DPU, issue 8) with the parameter shards on the device: each
      // module's updated weights go up into a second shard as soon as its AdamW has run.
      trainer::TrainConfig delayed = cfg;
      delayed.steps = 20;
      delayed.zero.offload_param = false;
      delayed.delayed_update = 0;
      delayed.trace = *dir + "/delayed.db";
      std::cout << "\n== 10. the same run with --delayed-update 0, the parameters on the simulated GPU, --steps 20\n"
                << "   --trace " << delayed.trace << "\n"
                << "   each step's CPU AdamW runs beside the next step's forward and backward, which see the weights\n"
                << "   one update behind; each module's update goes up to the device as soon as its AdamW has run\n"
                << "   (most copies begin before the update is applied) instead of all after the pass:\n";
      if (int rc = run_training(delayed, "zt demo: zt train ... --delayed-update 0", false); rc != 0) return rc;
      if (int rc = db_background_update(delayed.trace); rc != 0) return rc;

      // The partial optimizer offload (DeepSpeed's offload_optimizer.ratio, issue 8): exact, so its
      // losses are run 1's.
      trainer::TrainConfig partial = cfg;
      partial.steps = 20;
      partial.zero.offload_ratio = 0.5;
      partial.trace = *dir + "/partial.db";
      std::cout << "\n== 11. the same run with --offload-ratio 0.5 --steps 20 --trace " << partial.trace << "\n"
                << "   DeepSpeed's partial offload (ZeRO-Offload++): the first half of the modules keep their optimizer\n"
                << "   state on the simulated GPU and are updated there, the rest on the CPU; the same arithmetic, so\n"
                << "   rank 0's loss at step 20 is run 1's:\n";
      if (int rc = run_training(partial, "zt demo: zt train ... --offload-ratio 0.5", false); rc != 0) return rc;
      if (int rc = db_sql(partial.trace, loss20, false); rc != 0) return rc;
      if (int rc = db_partial_offload(partial.trace); rc != 0) return rc;

      std::cout << "\nNext: zt view " << cfg.trace << " (the timeline viewer); zt repro " << scenario_dir()
                << "/*.yaml, or a scenario by name (zt repro r3-internlm2-20b-no-zero-oom: all five reports; --virtual "
                   "for their real sizes); zt faults (the fault catalog).\n";
      return kExitOk;
    };
  });
}

}  // namespace zt::cli
