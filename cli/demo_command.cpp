// zt demo: the README's first command, in eleven titled sections: train with a trace, read the
// trace, run out of device memory for real and show the evidence, reproduce a bug report from its
// scenario and cure it, check the trace as CI would, export it for Perfetto, then four variants of
// the run (flash attention, the overlapped update, the delayed update, a partial optimizer
// offload). Each section opens with the command that does the same by hand (pasteable: made from
// the run's own configuration); the first run shows its step lines, the others one summary line
// each; every figure read from a trace says which run it comes from and carries its unit.
#include <algorithm>
#include <chrono>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "core/backend.h"
#include "text_width.h"
#include "train/progress_filter.h"
#include "train/trainer.h"
#include "zt/check/check.h"
#include "zt/common/units.h"
#include "zt/db/export.h"
#include "zt/db/kernel_summary.h"
#include "zt/db/trace_reader.h"
#include "zt/repro/runner.h"

namespace zt::cli {
namespace {

// Prose, indented by three columns and wrapped to the terminal (at most 100 columns).
void say(const std::string& text) { std::cout << "   " << wrap_text(text, output_width(), 3) << "\n"; }

void title(int n, const std::string& text) { std::cout << "\n== " << n << ". " << text << "\n"; }

// A word as a shell reads it back: quoted when it holds anything but plain path characters.
std::string shell_word(const std::string& w) {
  if (!w.empty() && w.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./:=,+-@%") ==
                        std::string::npos)
    return w;
  std::string q = "'";
  for (char c : w) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// A command one can paste, indented by three columns; a long one goes on over lines ending in
// " \" (a flag stays on the line of its value).
void print_command(const std::vector<std::string>& words) {
  const size_t width = output_width();
  std::vector<std::string> units;
  for (size_t i = 0; i < words.size(); ++i) {
    std::string u = shell_word(words[i]);
    if (words[i].rfind("--", 0) == 0 && i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0)
      u += " " + shell_word(words[++i]);
    units.push_back(u);
  }
  std::string line = "  ";
  for (const std::string& u : units) {
    if (line.size() > 5 && display_width(line) + 1 + display_width(u) + 2 > width) {
      std::cout << line << " \\\n";
      line = "    ";
    }
    line += " " + u;
  }
  std::cout << line << "\n";
}

// A size as zt's flags take it: "3MiB", "80GiB", "1000".
std::string size_flag(uint64_t b) {
  for (auto [shift, unit] : {std::pair<int, const char*>{30, "GiB"}, {20, "MiB"}, {10, "KiB"}})
    if (b != 0 && b % (uint64_t(1) << shift) == 0) return std::to_string(b >> shift) + unit;
  return std::to_string(b);
}

std::string number(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// The zt train command that runs `c`: the flags whose values differ from zt train's defaults (the
// settings the demo changes).
std::vector<std::string> train_words(const trainer::TrainConfig& c) {
  const trainer::TrainConfig d;
  std::vector<std::string> w = {"zt", "train", "--device", c.device, "--model", c.model};
  auto flag = [&](bool given, const char* name, const std::string& value = "") {
    if (!given) return;
    w.push_back(name);
    if (!value.empty()) w.push_back(value);
  };
  flag(c.seq_len != d.seq_len, "--seq-len", std::to_string(c.seq_len));
  flag(c.micro_batch != d.micro_batch, "--micro-batch", std::to_string(c.micro_batch));
  flag(c.grad_accum != d.grad_accum, "--grad-accum", std::to_string(c.grad_accum));
  flag(c.precision != d.precision, "--precision", c.precision);
  flag(c.world_size != d.world_size, "--world-size", std::to_string(c.world_size));
  flag(c.zero.stage != d.zero.stage, "--zero-stage", std::to_string(c.zero.stage));
  flag(c.zero.offload_optimizer, "--offload-optimizer");
  flag(c.zero.offload_param, "--offload-param");
  flag(c.zero.param_persistence_threshold != d.zero.param_persistence_threshold, "--param-persistence-threshold",
       std::to_string(c.zero.param_persistence_threshold));
  flag(c.zero.offload_ratio != d.zero.offload_ratio, "--offload-ratio", number(c.zero.offload_ratio));
  flag(c.attention != d.attention, "--attention", c.attention);
  flag(c.overlap_update, "--overlap-update");
  flag(c.delayed_update != d.delayed_update, "--delayed-update", std::to_string(c.delayed_update));
  // zt train --device cuda without --device-memory uses the whole GPU (0 here).
  flag(c.device_memory != d.device_memory && !(c.device == "cuda" && c.device_memory == 0), "--device-memory",
       size_flag(c.device_memory));
  flag(c.steps != d.steps, "--steps", std::to_string(c.steps));
  flag(!c.trace.empty(), "--trace", c.trace);
  return w;
}

std::string joined(const std::vector<std::string>& words) {
  std::string s;
  for (const std::string& w : words) s += (s.empty() ? "" : " ") + shell_word(w);
  return s;
}

std::string loss_text(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4f", v);
  return b;
}

// Trains `cfg` into its trace. progress: the step lines (the first run's); null for the runs that
// print one summary line. `note` ends that line. expect_failure: the run must start and fail
// (the out-of-memory section).
int run_training(const trainer::TrainConfig& cfg, std::ostream* progress, bool expect_failure,
                 const std::string& note = "") {
  probe::RecorderOptions ro;
  ro.path = cfg.trace;
  ro.command_line = "zt demo: " + joined(train_words(cfg));
  ro.config_json = trainer::to_json(cfg);
  ro.seed = static_cast<int64_t>(cfg.seed);
  std::unique_ptr<probe::Recorder> rec;
  if (Status s = probe::Recorder::open(ro, &rec); !s) return fail(s.message());
  trainer::TrainSummary sum;
  trainer::ProgressFilter filter(progress, 8, "");
  std::ostream filtered(&filter);
  Status s = trainer::train(cfg, rec.get(), progress ? &filtered : nullptr, &sum);
  filter.finish();
  Status closed = s ? rec->close(db::RunStatus::Ok, 0) : rec->close(db::RunStatus::Failed, 1, s.message());
  if (!closed) return fail(closed.message());
  if (s) {
    std::cout << "trained " << sum.steps << " step" << (sum.steps == 1 ? "" : "s") << " in "
              << format_duration_ns(sum.seconds * 1e9) << ": loss " << loss_text(sum.first_loss) << " -> "
              << loss_text(sum.last_loss) << note << "\n";
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

int query(const std::string& path, const std::string& sql, db::QueryResult* out) {
  std::unique_ptr<db::TraceReader> reader;
  if (Status s = db::TraceReader::open(path, &reader); !s) return fail(s.message());
  if (Status s = reader->query(sql, out); !s) return fail(path + ": " + s.message());
  return kExitOk;
}

// One value read from a trace ("" when the query has no row).
int query_value(const std::string& path, const std::string& sql, std::string* out) {
  db::QueryResult r;
  if (int rc = query(path, sql, &r); rc != 0) return rc;
  *out = r.rows.empty() || r.rows[0].empty() ? "" : r.rows[0][0];
  return kExitOk;
}

std::string bytes_cell(const std::string& v) { return v == "NULL" ? v : format_bytes(std::stod(v)); }

// Why there is no GPU, in words: the CUDA runtime's own text stays for the cases it is clearer.
std::string no_gpu_words(const std::string& why) {
  if (why.find("driver none") != std::string::npos || why.find("InsufficientDriver") != std::string::npos ||
      why.find("NoDevice") != std::string::npos)
    return "no NVIDIA driver";
  if (why.find("no CUDA backend") != std::string::npos) return "this build has no CUDA";
  return why;
}

// The loss rank 0 recorded at step 20 (the later runs are compared with run 1's).
const char* kLossAt20 = "SELECT value FROM counter_v WHERE rank = 0 AND name = 'loss' ORDER BY t LIMIT 1 OFFSET 19";

}  // namespace

void add_demo_command(CLI::App& app, Action& action) {
  auto* demo = app.add_subcommand(
      "demo",
      "A tour of zt in eleven sections, under a minute on two cores: train with a trace, read it, run out of "
      "memory, reproduce a bug report and cure it, check and export the trace, four variants of the run\n"
      "Each section opens with the command that does the same by hand.\n"
      "Example: zt demo --dir demo-out");
  auto dir = std::make_shared<std::string>("demo-out");
  auto steps = std::make_shared<int64_t>(80);
  auto device = std::make_shared<std::string>("auto");
  demo->add_option("--dir", *dir, "where the demo writes its files");
  demo->add_option("--device", *device, "where the training runs go: auto (a GPU when there is a usable one, else the "
                                        "simulated GPU), sim or cuda")
      ->check(CLI::IsMember({"auto", "sim", "cuda"}));
  // Later sections compare their loss at step 20 with the first run's: it must have one.
  demo->add_option("--steps", *steps, "training steps of the first run (20 or more; default 80)")
      ->check(CLI::Range(int64_t(20), int64_t(1) << 30));
  demo->callback([&action, dir, steps, device] {
    action = [=]() -> int {
      const auto started = std::chrono::steady_clock::now();
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
      if (gpu) cfg.device_memory = 0;  // the whole GPU, as zt train --device cuda
      const std::string accel = gpu ? "the GPU" : "the simulated GPU";
      // The first line says which GPU the demo uses, plainly: a missing driver is no failure here.
      const std::string first =
          gpu ? "A GPU is used: the training runs train on it (--device cuda); the out-of-memory run and the bug "
                "report use the simulated GPU."
              : (*device == "auto" ? "No usable GPU here (" + no_gpu_words(why) + "), so the demo uses"
                                   : std::string("The demo uses (--device sim)")) +
                    " zt's simulated GPU: device memory, its allocator and copies modelled on the CPU, shown as cuda:N.";
      std::cout << wrap_text(first + " Its files go to " + *dir + "/.", output_width(), 0) << "\n";

      // 1. Train with a trace: the one run that shows its step lines.
      title(1, "Train with a trace (run 1)");
      print_command(train_words(cfg));
      say(std::string("GPT-2 (tiny) with ZeRO-3 and CPU offload, on the built-in synthetic corpus: two ranks, ") +
          (gpu ? "threads sharing this machine's GPU" : "each on its own simulated GPU (cuda:0 and cuda:1)") +
          ". --param-persistence-threshold 0 shards every module: DeepSpeed keeps modules under 100k "
          "parameters whole on every GPU.");
      if (int rc = run_training(cfg, &std::cout, false); rc != 0) return rc;

      title(2, "What the trace holds");
      print_command({"zt", "db", "info", cfg.trace});
      if (int rc = db_info(cfg.trace); rc != 0) return rc;

      title(3, "Where rank 0's model states live, and its offload traffic");
      say("Run 1's trace (" + cfg.trace +
          ") read by SQL (zt db sql runs such queries): ZeRO-3 with offload keeps the parameter shards, fp32 "
          "master weights and Adam moments on the host and gathers each module on " + accel + ":");
      {
        db::QueryResult r;
        if (int rc = query(cfg.trace,
                           "SELECT device, CASE WHEN name LIKE '%.gathered' THEN '<module>.gathered' WHEN name LIKE "
                           "'%.shard' THEN '<module>.shard' WHEN name LIKE 'adam.%' THEN 'adam.m/v[<module>]' WHEN "
                           "name LIKE 'grad.from_device[%' THEN 'grad.from_device[<module>]' WHEN name LIKE "
                           "'fp32_partitioned_groups_flat%' THEN 'fp32_partitioned_groups_flat[<i>]...' ELSE name "
                           "END AS tensor, count(*) AS blocks, max(bytes) AS largest FROM allocation_v WHERE rank = 0 "
                           "AND level = 'block' GROUP BY 1, 2 ORDER BY 1, 4 DESC LIMIT 16",
                           &r);
            rc != 0)
          return rc;
        for (auto& row : r.rows) row[3] = bytes_cell(row[3]);
        print_table(std::cout, {"device", "tensor", "blocks", "largest block"}, r.rows, {false, false, true, true});
      }
      say("Run 1's offload copies on rank 0: parameter shards go up (H2D) while earlier modules compute, "
          "gradient partitions go down (D2H) during the rest of backward; a copy's time inside a module's "
          "forward or backward is hidden under compute:");
      {
        db::QueryResult r;
        if (int rc = query(cfg.trace,
                           "SELECT t.kind, count(*), sum(t.bytes), sum(t.t_end - t.t_start), round(100.0 * "
                           "sum(coalesce((SELECT sum(min(t.t_end, m.t_end) - max(t.t_start, m.t_start)) FROM marker_v "
                           "m WHERE m.rank = t.rank AND (m.name LIKE 'forward %' OR m.name LIKE 'backward %') AND "
                           "m.t_start < t.t_end AND t.t_start < m.t_end), 0)) / max(sum(t.t_end - t.t_start), 1), 1) "
                           "FROM transfer_v t WHERE t.rank = 0 AND t.kind IN ('H2D', 'D2H') AND t.name NOT LIKE "
                           "'batch.%' GROUP BY 1 ORDER BY 1 DESC",
                           &r);
            rc != 0)
          return rc;
        std::vector<std::vector<std::string>> rows;
        for (const auto& row : r.rows)
          rows.push_back({row[0] == "H2D" ? "H2D, parameter shards up" : "D2H, gradient partitions down", row[1],
                          bytes_cell(row[2]), format_duration_ns(std::stod(row[3])), row[4] + "%"});
        print_table(std::cout, {"copies", "count", "moved", "time copying", "hidden under compute"}, rows,
                    {false, true, true, true, true});
      }

      trainer::TrainConfig oom = cfg;
      oom.steps = 2;
      oom.world_size = 1;
      oom.zero = trainer::ZeroSettings{};
      oom.device_memory = 3ull << 20;
      oom.trace = *dir + "/oom.db";
      oom.device = "sim";
      title(4, "Run out of device memory");
      print_command(train_words(oom));
      say("The tiny model on one simulated GPU of 3 MiB (one rank, no ZeRO): the caching allocator really runs out, "
          "with PyTorch's message, and the trace keeps the evidence.");
      if (int rc = run_training(oom, nullptr, true); rc != 0) return rc;
      {
        db::QueryResult r;
        if (int rc = query(oom.trace,
                           "SELECT a.name, a.bytes, e.step, e.kind FROM error e JOIN allocation_v a ON a.device = 'cuda:0' "
                           "AND a.level = 'block' AND a.t_alloc <= e.t AND (a.t_free IS NULL OR a.t_free > e.t) "
                           "ORDER BY a.bytes DESC, a.name",
                           &r);
            rc != 0)
          return rc;
        double total = 0;
        for (const auto& row : r.rows) total += std::stod(row[1]);
        std::string largest;
        for (size_t i = 0; i < r.rows.size() && i < 4; ++i)
          largest += (i ? ", " : "") + r.rows[i][0] + " " + bytes_cell(r.rows[i][1]);
        if (r.rows.empty()) return fail(oom.trace + ": no error row with live blocks on cuda:0");
        const std::string step = r.rows[0][2] == "NULL" ? "before the first step" : "at step " + r.rows[0][2];
        say("In " + oom.trace + ": the error row (" + r.rows[0][3] + ", " + step + ") and the " + std::to_string(r.rows.size()) +
            " blocks live on cuda:0 at that moment, " + format_bytes(total) + " in all; the largest: " + largest + ".");
      }

      const std::string r2 = "r2-qwen72b-offload-device-mismatch";
      title(5, "Reproduce bug report R2, then cure it");
      print_command({"zt", "repro", r2, "--keep", *dir + "/r2", "--quiet"});
      say("R2: Qwen 72B with ZeRO-3 and offload fails in unscale_and_clip_grads (the clip scale on cuda:N, the fp32 "
          "partitions on the host). The scenario replays it small with its fault, then with the fix; the verdict is "
          "read from the two traces.");
      {
        const std::string path = shipped_scenario(r2);
        if (path.empty()) return fail(r2 + ": the shipped scenario is missing from " + scenario_dir());
        repro::Scenario sc;
        if (Status s = repro::load_scenario(path, &sc); !s) return fail(s.message());
        repro::RunOptions ro;
        ro.keep_dir = *dir + "/r2";
        ro.command_line = "zt demo: zt repro " + path;
        repro::ReproResult res;
        if (Status s = repro::run_scenario(sc, ro, &res); !s) return fail(s.message());
        repro::print_verdict(res, std::cout);
        if (res.exit_code() != 0) return fail("the R2 scenario did not reproduce and cure as it should");
      }

      title(6, "Check the trace as CI would");
      print_command({"zt", "check", cfg.trace});
      say("How run 1 ended, leaks across epochs, placement, steps: pass or fail, exit 1 on a failure.");
      {
        check::Report report;
        if (Status s = check::run_checks(cfg.trace, check::Options{}, &report); !s) return fail(s.message());
        std::cout << check::format_text(report);
        if (report.failed()) return fail("zt check found a problem in the demo's own training run");
      }

      const std::string json = *dir + "/train.json";
      title(7, "Export for Perfetto");
      print_command({"zt", "export", cfg.trace, "--chrome", json});
      {
        db::ExportStats st;
        if (Status s = db::export_chrome(cfg.trace, json, &st); !s) return fail(s.message());
        std::cout << "wrote " << st.events << " trace events (" << format_bytes(double(st.bytes)) << "): open " << json
                  << " in https://ui.perfetto.dev\n";
      }

      // Flash attention, written for the GPU (issue 8), runs on the simulated GPU too (its CPU twin).
      trainer::TrainConfig flash = cfg;
      flash.steps = 20;
      flash.attention = "flash";
      flash.trace = *dir + "/flash.db";
      title(8, "Flash attention: less activation memory");
      print_command(train_words(flash));
      say(std::string("Run 1 with FlashAttention-2, which keeps one value per attention row instead of the B x H x T "
                      "x T probabilities (") +
          (gpu ? "tensor-core kernels" : "on a GPU tensor-core kernels; here their CPU twin, which multiplies in bf16 "
                                         "as they do") +
          ").");
      if (int rc = run_training(flash, nullptr, false); rc != 0) return rc;
      {
        // On the simulated GPU the device holds what PyTorch's autograd would keep, tensor by tensor
        // (block0.attn.probs, ...); a GPU's passes hold theirs as one 'activations' tensor.
        const std::string sql =
            "SELECT sum(b) FROM (SELECT name, max(requested_bytes) AS b FROM allocation_v WHERE rank = 0 AND level = "
            "'block' AND (name = 'activations' OR (name GLOB 'block0.attn.*' AND name NOT GLOB '*.scores*' AND name NOT "
            "IN ('block0.attn.y', 'block0.attn.proj'))) GROUP BY name)";
        std::string before, after;
        if (int rc = query_value(cfg.trace, sql, &before); rc != 0) return rc;
        if (int rc = query_value(flash.trace, sql, &after); rc != 0) return rc;
        if (before.empty() || after.empty()) return fail("no attention activations in " + cfg.trace + " or " + flash.trace);
        char pct[32];
        std::snprintf(pct, sizeof pct, "%.0f%%", 100.0 * (1.0 - std::stod(after) / std::stod(before)));
        std::cout << (gpu ? "rank 0's activation memory: " : "what rank 0's block0 keeps of its attention for backward: ")
                  << bytes_cell(before) << " in run 1 (materialized attention), " << bytes_cell(after)
                  << " in this run (flash), " << pct << " less\n";
      }

      // The overlapped update, written for the GPU (issue 8): exact, so its losses are run 1's. The
      // demo prints whether they are; the tests hold them to it (on a GPU: tests/cuda/train_test.cpp).
      std::string loss1;
      if (int rc = query_value(cfg.trace, kLossAt20, &loss1); rc != 0) return rc;
      auto same_loss = [&](const std::string& trace) -> int {
        std::string loss;
        if (int rc = query_value(trace, kLossAt20, &loss); rc != 0) return rc;
        std::cout << "rank 0's loss at step 20: " << loss1 << " in run 1, " << loss << " in this run"
                  << (loss == loss1 ? " (the same)" : " (not the same)") << "\n";
        return kExitOk;
      };
      trainer::TrainConfig overlap = cfg;
      overlap.steps = 20;
      overlap.overlap_update = true;
      overlap.trace = *dir + "/overlap.db";
      title(9, "The overlapped update: AdamW beside the next forward, the same losses");
      print_command(train_words(overlap));
      say("Each step's CPU AdamW runs on a background thread beside the next step's forward, module by module; each "
          "module waits for its own update (the 'await update' phases), so the arithmetic is the ordinary update's.");
      if (int rc = run_training(overlap, nullptr, false); rc != 0) return rc;
      if (int rc = same_loss(overlap.trace); rc != 0) return rc;
      if (gpu) {
        say("zt train --cupti records the GPU's kernels; zt db kernels then shows when it computed and what the rank "
            "thread did while it sat idle.");
      } else {
        print_command({"zt", "db", "kernels", overlap.trace, "--top", "5", "--gaps", "3"});
        say("When rank 0's simulated GPU computed in this run (each model pass is a kernel row) and what the rank "
            "thread did while it sat idle; the background AdamW is not the rank thread's, its waits ('await "
            "update') are.");
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
      title(10, "The delayed update: weights one step behind, written back early");
      print_command(train_words(delayed));
      say("The parameters stay on " + accel +
          " (no --offload-param). Each step's CPU AdamW runs beside the next step's forward and backward, which see "
          "the weights one update behind; each module's update goes up to the device as soon as its AdamW has run "
          "(most copies begin before the update is applied) instead of all after the pass.");
      if (int rc = run_training(delayed, nullptr, false); rc != 0) return rc;
      if (int rc = db_background_update(delayed.trace); rc != 0) return rc;

      // The partial optimizer offload (DeepSpeed's offload_optimizer.ratio, issue 8): exact, so its
      // losses are run 1's.
      trainer::TrainConfig partial = cfg;
      partial.steps = 20;
      partial.zero.offload_ratio = 0.5;
      partial.trace = *dir + "/partial.db";
      title(11, "Partial optimizer offload: --offload-ratio 0.5");
      print_command(train_words(partial));
      say("DeepSpeed's partial offload (ZeRO-Offload++): the first half of the modules keep their optimizer state on " +
          accel + " and are updated there, the rest on the CPU; the same arithmetic, so the losses are run 1's.");
      const int64_t modules = trainer::optimizer_modules(partial);
      const int64_t on_host = modules - trainer::first_offloaded_module(partial.zero, modules);
      if (int rc = run_training(partial, nullptr, false,
                                "; the optimizer state of " + std::to_string(on_host) + " of " + std::to_string(modules) +
                                    " modules on the host, " + std::to_string(modules - on_host) + " on cuda:0");
          rc != 0)
        return rc;
      if (int rc = same_loss(partial.trace); rc != 0) return rc;
      if (int rc = db_partial_offload(partial.trace); rc != 0) return rc;

      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      std::cout << "\nThe demo took " << format_duration_ns(took * 1e9) << ". Next, by hand:\n";
      const std::vector<std::pair<std::string, std::string>> next = {
          {"zt view " + shell_word(cfg.trace), "the timeline viewer"},
          {"zt repro r3-internlm2-20b-no-zero-oom", "another bug report; all five are in " + scenario_dir()},
          {"zt repro r3-internlm2-20b-no-zero-oom --virtual", "the same at the report's real sizes"},
          {"zt faults", "the fault catalog"}};
      size_t w = 0;
      for (auto& [c, what] : next) w = std::max(w, display_width(c));
      for (auto& [c, what] : next) std::cout << "   " << pad_right(c, w) << "   # " << what << "\n";
      return kExitOk;
    };
  });
}

}  // namespace zt::cli
