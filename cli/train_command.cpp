// zt train: flags and a config file into a TrainConfig, then the trainer, with a trace.
#include <cstdlib>
#include <iostream>
#include <algorithm>
#include <charconv>
#include <limits>

#include "commands.h"
#include "train/run_args.h"
#include "zero/launcher_env.h"
#include "train/trainer.h"
#include "zt/common/units.h"
#include "zt/probe/probe_config.h"
#if ZT_HAVE_CUPTI
#include "zt/probe/cupti_collector.h"
#endif

namespace zt::cli {

void add_train_command(CLI::App& app, Action& action) {
  auto* sub = app.add_subcommand("train", "Train GPT-2 with ZeRO (stages 0-3, CPU offload) on a CUDA GPU, a simulated GPU or the CPU, "
                                          "and record a trace\n"
                                          "Example: zt train --device sim --model tiny --steps 200 --trace run.db");
  auto cfg = std::make_shared<trainer::TrainConfig>();
  auto config_file = std::make_shared<std::string>();
  auto device_memory = std::make_shared<std::string>();
  auto max_trace = std::make_shared<std::string>("768MiB");
  // --detail, --flight-recorder, --flight-memory: zt/probe/detail_policy.h (zt probe's, the same).
  struct Recording {
    std::vector<std::string> detail;
    std::string flight, flight_memory;
  };
  auto recording = std::make_shared<Recording>();
  auto host_memory = std::make_shared<std::string>();
  sub->add_option("--config", *config_file,
                  "YAML file with the same settings as the flags, by their names (micro_batch or micro-batch), but "
                  "--ds-config and --cupti; flags given too win");
  sub->add_option("--device", cfg->device,
                  "sim (a simulated GPU, shown as cuda:N), cpu, or cuda (a real GPU; under torchrun/mpirun/srun one "
                  "process per GPU joined by NCCL)");
  sub->add_option("--model", cfg->model, "tiny, 124M, 350M, 774M or 1.5B");
  sub->add_option("--steps", cfg->steps, "optimizer steps");
  sub->add_option("--epochs", cfg->epochs, "epochs (instead of --steps)");
  sub->add_option("--micro-batch", cfg->micro_batch, "sequences per micro-step");
  sub->add_option("--grad-accum", cfg->grad_accum, "micro-steps per optimizer step");
  sub->add_option("--world-size", cfg->world_size,
                  "ranks, as threads of this process: each with its own simulated GPU, or all on --device cuda's GPU");
  sub->add_option("--seq-len", cfg->seq_len, "tokens per sequence (default: the model's context)");
  sub->add_option("--seed", cfg->seed, "seed of init, data order and synthetic data");
  sub->add_option("--precision", cfg->precision, "fp32, bf16 or fp16 weights (math in fp32)");
  sub->add_option("--device-memory", *device_memory,
                  "simulated GPU capacity, e.g. 80GiB (default 80GiB); with --device cuda a cap below the GPU's memory");
  sub->add_option("--host-memory", *host_memory, "host memory cap for pinned + pageable buffers, e.g. 1TiB");
  sub->add_option("--data", cfg->data, "text file (byte-level) or token file; default: built-in synthetic corpus");
  sub->add_option("--max-doc-tokens", cfg->max_doc_tokens, "cut each document to this many tokens");
  sub->add_option("--trace", cfg->trace, "trace file to write");
  sub->add_option("--max-trace", *max_trace,
                  "the trace's size cap: past it allocations, copies, kernels and placements are no longer recorded one "
                  "by one, and the per-step and per-epoch aggregates go on (default 768MiB, the rows and their indexes; 0 or none = no cap)");
  sub->add_option("--detail", recording->detail,
                  "which steps get full detail (repeatable; default all, until --max-trace): first:N, every:N, "
                  "steps:A,B-C, time:A-B, range:REGEX, signal:K (SIGUSR1 captures the next K steps), none; outside "
                  "them only the aggregates");
  sub->add_option("--flight-recorder", recording->flight,
                  "keep the last N steps (20, 20steps) or seconds (30s) of the detail not written in memory, and write "
                  "them when the run ends in any way (default 20 steps; off)");
  sub->add_option("--flight-memory", recording->flight_memory,
                  "the flight recorder's memory bound (default 256MiB; at most half the machine's memory)");
  sub->add_option("--lr", cfg->lr, "AdamW learning rate");
  sub->add_option("--weight-decay", cfg->weight_decay, "AdamW weight decay");
  sub->add_option("--grad-clip", cfg->grad_clip, "clip the global gradient norm to this (0: off)");
  sub->add_flag("--activation-checkpointing", cfg->activation_checkpointing, "recompute each block in backward");
  sub->add_flag("--tf32", cfg->tf32,
                "--device cuda: fp32 matrix multiplies on TF32 tensor cores (10-bit mantissa, fp32 accumulation), as "
                "torch.backends.cuda.matmul.allow_tf32; default: true fp32");
  sub->add_option("--matmul-precision", cfg->matmul_precision,
                  "--device cuda: fp32 matrix multiplies as torch.set_float32_matmul_precision: highest (true fp32, "
                  "default), high (TF32 tensor cores, as --tf32) or medium (bf16 tensor cores)")
      ->check(CLI::IsMember({"highest", "high", "medium"}));
  sub->add_option("--matmul-dtype", cfg->matmul_dtype,
                  "--device cuda --precision bf16: fp32 (default: fp32 activations, GEMMs as --matmul-precision says) "
                  "or bf16 (bf16 activations and weights on bf16 tensor cores, fp32 accumulation, bias and GELU fused "
                  "into the GEMMs; results within bf16's tolerances of fp32's)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  sub->add_option("--delayed-update", cfg->delayed_update,
                  "ZeRO-Offload's delayed parameter update after N ordinary steps (needs --offload-optimizer): then each "
                  "step's CPU AdamW runs beside the next step's forward and backward, which see weights one update "
                  "behind; -1: off")
      ->check(CLI::Range(int64_t(-1), std::numeric_limits<int64_t>::max()));
  sub->add_flag("--overlap-update", cfg->overlap_update,
                "run each step's CPU AdamW beside the next step's forward, module by module in the forward's order "
                "(needs --offload-optimizer): each module waits for its own update, so the arithmetic is the ordinary "
                "update's, bit for bit");
  sub->add_flag("--adam-in-backward", cfg->adam_in_backward,
                "with --overlap-update, ZeRO stage 2-3: start each module's CPU AdamW as soon as its gradient "
                "partition has landed, during backward (exact: the update stands only where the step's norm says "
                "the ordinary one would be the same; 12 bytes a parameter more host memory)");
  sub->add_option("--grad-partition-dtype", cfg->grad_partition_dtype,
                  "the host gradient partitions CPU AdamW reads (with --offload-optimizer): fp32 (default, DeepSpeed's "
                  "fp32_partitioned_groups_flat[i].grad) or compute (ZeRO stage 2-3, bf16/fp16: kept as they land from "
                  "the device, AdamW widens them in its pass; the same results, less host memory and traffic)")
      ->check(CLI::IsMember({"fp32", "compute"}));
  sub->add_option("--pinned-numa", cfg->pinned_numa,
                  "where pinned host memory's pages lie on a host of several NUMA nodes: local (default: on the node "
                  "that pins them, as cudaHostAlloc does) or interleave (round robin over the nodes, so CPU AdamW gets "
                  "every node's memory bandwidth; on a GPU mapped, then pinned with cudaHostRegister)")
      ->check(CLI::IsMember({"local", "interleave"}));
  // Its names are checked with the rest of the settings (validate(): one line naming them all).
  sub->add_option("--attention", cfg->attention,
                  "materialized (default: the fp32 reference, keeps the B x H x T x T probabilities) or flash "
                  "(FlashAttention-2: keeps one value per row, multiplies in bf16; on a GPU tensor-core kernels for "
                  "head size 16, 32 or 64); Hugging Face's names: eager (materialized), sdpa, flash_attention_2 (flash)");
  sub->add_option("--optimizer", cfg->optimizer,
                  "the optimizer whose memory is charged: DeepSpeed's (adam, adamw, FusedAdam, DeepSpeedCPUAdam), the "
                  "HF Trainer's optim names (adamw_torch, adamw_torch_fused, adamw_hf, adamw_bnb_8bit, adafactor, sgd, "
                  "...), adamw_torch_foreach, adamw_torch_for_loop, sgd_momentum (docs/zero-model.md); outside AdamW's "
                  "family --virtual only");
  sub->add_flag("-q,--quiet", cfg->quiet, "no progress lines");
  // Checkpoints (issue 5).
  sub->add_option("--checkpoint-dir", cfg->checkpoint_dir, "directory of sharded checkpoints (DIR/stepNNNNNN, DIR/latest)");
  sub->add_option("--save-every", cfg->save_every, "save a checkpoint after every N optimizer steps (0: never)");
  sub->add_flag("--resume", cfg->resume, "resume from the latest complete checkpoint in --checkpoint-dir (any world size)");
  sub->add_flag("--save-safetensors", cfg->save_safetensors,
                "also write the consolidated weights (model.safetensors, Hugging Face GPT-2 names, config.json) at each save");
  sub->add_flag("--save-only-model", cfg->save_only_model,
                "save only the consolidated weights, streamed (no optimizer state: not resumable; R4's fix)");
  sub->add_option("--checkpoint-gather", cfg->checkpoint_gather,
                  "how a save gathers the weights: streamed (one module at a time, default) or device (all at once)")
      ->check(CLI::IsMember({"streamed", "device"}));
  // Faults (issue 9; zt faults lists them).
  sub->add_option("--fault", cfg->faults,
                  "switch on a failpoint: NAME[COND,...]=[P%][N*]ACTION(ARG)->... (repeatable; also ZT_FAULTS)\n"
                  "e.g. --fault 'zero.norm_on_device=return' --fault 'host.epoch_leak[epoch>=1]=return(pinned)'");
  sub->add_option("--fault-seed", cfg->fault_seed, "seed of the failpoints' probability draws (default: --seed)");
  sub->add_option("--comm-timeout", cfg->comm_timeout_ms, "ms a collective may wait before the watchdog ends the run");
  sub->add_flag("--virtual", cfg->virtual_mode, "virtual mode: sizes only, no math (replays a run for memory)");
  sub->add_option("--data-samples", cfg->data_samples, "virtual mode: samples in the data set");
  auto ds_config = std::make_shared<std::string>();
  sub->add_option("--ds-config", *ds_config,
                  "DeepSpeed JSON config (batch sizes, bf16/fp16, optimizer, zero_optimization); a flag given beside it "
                  "that it sets otherwise is refused");
  auto hf_args = std::make_shared<std::string>();
  sub->add_option("--hf-args", *hf_args,
                  "the run's TrainingArguments, which fill the DeepSpeed config's \"auto\" as the HF Trainer does: a "
                  "TrainingArguments JSON file, 'defaults', or name=value,... (per_device_train_batch_size, "
                  "gradient_accumulation_steps, max_grad_norm, bf16, fp16, learning_rate, ...); --micro-batch, "
                  "--grad-accum, --grad-clip, --precision, --lr and --weight-decay fill them too");
  sub->add_option("--zero-stage", cfg->zero.stage, "ZeRO stage 0, 1, 2 or 3")->check(CLI::Range(0, 3));
  sub->add_flag("--offload-optimizer", cfg->zero.offload_optimizer, "fp32 master weights and Adam moments on the host");
  sub->add_flag("--offload-param", cfg->zero.offload_param, "stage 3: parameter shards on the host");
  sub->add_option("--param-persistence-threshold", cfg->zero.param_persistence_threshold,
                  "stage 3: a module with fewer parameters than this stays whole on every GPU, not sharded "
                  "(DeepSpeed's stage3_param_persistence_threshold; default 100000; 0: shard every module)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--offload-ratio", cfg->zero.offload_ratio,
                  "with --offload-optimizer at stage 3: the fraction of the modules whose optimizer state goes to the "
                  "host (DeepSpeed's offload_optimizer.ratio, ZeRO-Offload++); the first modules keep theirs on the "
                  "accelerator and are updated there (default 1: all offloaded)");
  auto cupti = std::make_shared<bool>(false);
  sub->add_flag("--cupti", *cupti,
                "record CUPTI's view too (cudaMalloc, copies, kernels) into the trace, matched to the trainer's "
                "allocator rows; needs --device cuda and --trace");
  std::vector<std::string> argv_words;
  sub->callback([&action, sub, cfg, config_file, device_memory, host_memory, ds_config, hf_args, cupti, max_trace, recording] {
    action = [sub, cfg, config_file, device_memory, host_memory, ds_config, hf_args, cupti, max_trace, recording]() -> int {
      trainer::TrainConfig c = *cfg;
      bool memory_given = !device_memory->empty();  // --device-memory, or device_memory in the file
      if (!config_file->empty()) {
        // File first, then every flag the user typed on top of it.
        trainer::TrainConfig from_file;
        std::vector<std::string> file_keys;
        if (Status s = trainer::load_train_config(*config_file, &from_file, &file_keys); !s) return fail(s.message());
        for (const std::string& k : file_keys) memory_given = memory_given || k == "device_memory";
        for (auto* opt : sub->get_options()) {
          if (opt->count() == 0) continue;
          std::string n = opt->get_name();
          if (n == "--device") from_file.device = c.device;
          else if (n == "--model") from_file.model = c.model;
          // A flag also overrides the file's setting it excludes (--epochs against the file's
          // steps: "give steps or epochs, not both" was the file's doing, not the user's).
          else if (n == "--steps") from_file.steps = c.steps, from_file.epochs = sub->count("--epochs") ? c.epochs : 0;
          else if (n == "--epochs") from_file.epochs = c.epochs, from_file.steps = sub->count("--steps") ? c.steps : 0;
          else if (n == "--micro-batch") from_file.micro_batch = c.micro_batch;
          else if (n == "--grad-accum") from_file.grad_accum = c.grad_accum;
          else if (n == "--world-size") from_file.world_size = c.world_size;
          else if (n == "--seq-len") from_file.seq_len = c.seq_len;
          else if (n == "--seed") from_file.seed = c.seed;
          else if (n == "--precision") from_file.precision = c.precision;
          else if (n == "--data") from_file.data = c.data;
          else if (n == "--max-doc-tokens") from_file.max_doc_tokens = c.max_doc_tokens;
          else if (n == "--trace") from_file.trace = c.trace;
          else if (n == "--lr") from_file.lr = c.lr;
          else if (n == "--weight-decay") from_file.weight_decay = c.weight_decay;
          else if (n == "--grad-clip") from_file.grad_clip = c.grad_clip;
          else if (n == "--activation-checkpointing") from_file.activation_checkpointing = c.activation_checkpointing;
          else if (n == "--tf32") from_file.tf32 = c.tf32;
          else if (n == "--delayed-update")
            from_file.delayed_update = c.delayed_update,
            from_file.overlap_update = sub->count("--overlap-update") ? c.overlap_update : false;
          else if (n == "--overlap-update")
            from_file.overlap_update = c.overlap_update,
            from_file.delayed_update = sub->count("--delayed-update") ? c.delayed_update : -1;
          else if (n == "--adam-in-backward") from_file.adam_in_backward = c.adam_in_backward;
          else if (n == "--grad-partition-dtype") from_file.grad_partition_dtype = c.grad_partition_dtype;
          else if (n == "--pinned-numa") from_file.pinned_numa = c.pinned_numa;
          else if (n == "--matmul-precision") from_file.matmul_precision = c.matmul_precision;
          else if (n == "--matmul-dtype") from_file.matmul_dtype = c.matmul_dtype;
          else if (n == "--attention") from_file.attention = c.attention;
          else if (n == "--optimizer") from_file.optimizer = c.optimizer;
          else if (n == "--quiet") from_file.quiet = c.quiet;
          else if (n == "--checkpoint-dir") from_file.checkpoint_dir = c.checkpoint_dir;
          else if (n == "--save-every") from_file.save_every = c.save_every;
          else if (n == "--resume") from_file.resume = c.resume;
          else if (n == "--save-safetensors") from_file.save_safetensors = c.save_safetensors;
          else if (n == "--save-only-model") from_file.save_only_model = c.save_only_model;
          else if (n == "--checkpoint-gather") from_file.checkpoint_gather = c.checkpoint_gather;
          else if (n == "--zero-stage") from_file.zero.stage = c.zero.stage;
          else if (n == "--offload-optimizer") from_file.zero.offload_optimizer = c.zero.offload_optimizer;
          else if (n == "--offload-param") from_file.zero.offload_param = c.zero.offload_param;
          else if (n == "--offload-ratio") from_file.zero.offload_ratio = c.zero.offload_ratio;
          else if (n == "--param-persistence-threshold")
            from_file.zero.param_persistence_threshold = c.zero.param_persistence_threshold;
          else if (n == "--fault") from_file.faults.insert(from_file.faults.end(), c.faults.begin(), c.faults.end());
          else if (n == "--fault-seed") from_file.fault_seed = c.fault_seed;
          else if (n == "--comm-timeout") from_file.comm_timeout_ms = c.comm_timeout_ms;
          else if (n == "--virtual") from_file.virtual_mode = c.virtual_mode;
          else if (n == "--data-samples") from_file.data_samples = c.data_samples;
        }
        c = from_file;
      }
      const auto max_trace_bytes = probe::parse_max_trace(*max_trace);
      if (!max_trace_bytes)
        return fail("--max-trace: '" + *max_trace + "' is not a size (examples: 512MiB, 2GiB; 0 or none = no cap)");
      probe::DetailPolicy detail_policy;
      probe::FlightRecorder flight;
      // The options, else the ZT_PROBE_* variables zt probe's library reads (the same policy for both).
      if (Status s = probe::parse_recording_policy(recording->detail, recording->flight, recording->flight_memory,
                                                   &detail_policy, &flight);
          !s)
        return fail(s.message());
      {
        probe::ProbeConfig env;
        const bool any = std::getenv(probe::kEnvDetail) || std::getenv(probe::kEnvFlightRecorder) ||
                         std::getenv(probe::kEnvFlightMemory);
        if (any) {
          if (Status s = probe::probe_config_from_env(
                  [](const char* k) -> const char* {
                    const std::string_view key(k);
                    return key == probe::kEnvDetail || key == probe::kEnvFlightRecorder || key == probe::kEnvFlightMemory
                               ? std::getenv(k)
                               : nullptr;
                  },
                  &env);
              !s)
            return fail(s.message());
          if (recording->detail.empty() && std::getenv(probe::kEnvDetail)) detail_policy = env.detail;
          if (recording->flight.empty() && std::getenv(probe::kEnvFlightRecorder)) {
            flight.steps = env.flight.steps;
            flight.ns = env.flight.ns;
          }
          if (recording->flight_memory.empty() && std::getenv(probe::kEnvFlightMemory)) flight.max_bytes = env.flight.max_bytes;
        }
      }
      if (!device_memory->empty()) {
        std::string why;
        auto b = parse_bytes(*device_memory, &why);
        if (!b) return fail("--device-memory: '" + *device_memory + "' " + why + " (try 80GiB)");
        c.device_memory = *b;
      }
      if (!host_memory->empty()) {
        std::string why;
        auto b = parse_bytes(*host_memory, &why);
        if (!b) return fail("--host-memory: '" + *host_memory + "' " + why + " (try 1TiB)");
        c.host_memory = *b;
      }
      if (!ds_config->empty()) {
        std::vector<std::string> warnings;
        trainer::TrainConfig after = c;
        // The run's arguments fill the config's "auto": --hf-args, then the flags typed (not defaults).
        trainer::RunArgs args;
        if (!hf_args->empty())
          if (Status s = trainer::parse_hf_args(*hf_args, "--hf-args", &args); !s) return fail(s.message());
        trainer::add_settings_as_args(c, [&](const std::string& setting) -> std::optional<std::string> {
          std::string flag = "--" + setting;
          std::replace(flag.begin(), flag.end(), '_', '-');
          if (sub->get_option(flag)->count() > 0) return flag;
          return std::nullopt;
        }, &args);
        if (Status s = trainer::load_deepspeed_config(*ds_config, &after, &warnings, args); !s) return fail(s.message());
        if (!c.quiet) {
          // What the config resolved to, each value with where it came from.
          std::string line;
          for (const auto& r : after.ds_resolution)
            line += "\n  " + r.key + " = " + r.value + "   (" + r.source + ")";
          std::fprintf(stderr, "zt train: %s resolves to:%s\n", ds_config->c_str(), line.c_str());
        }
        for (auto& w : warnings) std::fprintf(stderr, "zt train: warning: %s\n", w.c_str());
        // A flag typed beside the DeepSpeed config that the config sets otherwise: neither may win
        // silently (DeepSpeed takes its JSON, the --config file gives way to flags), so say which.
        // Values are compared as they are (two learning rates that print alike still differ) and
        // printed in their shortest exact form (0.00030000001, not 0.00030000000999999999).
        auto num = [](double v) {
          char buf[64];
          const auto r = std::to_chars(buf, buf + sizeof buf, v);
          return std::string(buf, r.ptr);
        };
        auto yes_no = [](bool b) { return std::string(b ? "on" : "off"); };
        struct Setting {
          const char* flag;
          bool differs;
          std::string given, file;
        };
        const Setting settable[] = {
            {"--micro-batch", c.micro_batch != after.micro_batch, std::to_string(c.micro_batch), std::to_string(after.micro_batch)},
            {"--grad-accum", c.grad_accum != after.grad_accum, std::to_string(c.grad_accum), std::to_string(after.grad_accum)},
            {"--grad-clip", c.grad_clip != after.grad_clip, num(c.grad_clip), num(after.grad_clip)},
            {"--precision", c.precision != after.precision, c.precision, after.precision},
            {"--lr", c.lr != after.lr, num(c.lr), num(after.lr)},
            {"--weight-decay", c.weight_decay != after.weight_decay, num(c.weight_decay), num(after.weight_decay)},
            {"--zero-stage", c.zero.stage != after.zero.stage, std::to_string(c.zero.stage), std::to_string(after.zero.stage)},
            {"--offload-optimizer", c.zero.offload_optimizer != after.zero.offload_optimizer,
             yes_no(c.zero.offload_optimizer), yes_no(after.zero.offload_optimizer)},
            {"--offload-param", c.zero.offload_param != after.zero.offload_param, yes_no(c.zero.offload_param),
             yes_no(after.zero.offload_param)},
            {"--offload-ratio", c.zero.offload_ratio != after.zero.offload_ratio, num(c.zero.offload_ratio),
             num(after.zero.offload_ratio)},
            {"--param-persistence-threshold", c.zero.param_persistence_threshold != after.zero.param_persistence_threshold,
             std::to_string(c.zero.param_persistence_threshold), std::to_string(after.zero.param_persistence_threshold)}};
        for (const Setting& s : settable)
          if (sub->get_option(s.flag)->count() > 0 && s.differs)
            return fail(std::string(s.flag) + " " + s.given + " and --ds-config " + *ds_config + " (" + s.file +
                        (std::string(s.flag) == "--offload-ratio" && !after.zero.offload_optimizer
                             ? ": its optimizer is not offloaded, and a ratio only applies to a cpu offload_optimizer"
                             : "") +
                        ") disagree: set it in one place");
        c = after;
      }
      if (Status s = trainer::validate(c); !s) return fail(s.message());
      if (c.steps == 0 && c.epochs == 0) c.steps = 50;
      if (*cupti) {
        if (c.device != "cuda")
          return fail("--cupti needs --device cuda (CUPTI traces a real GPU; --device " + c.device + " has none)");
        if (c.trace.empty()) return fail("--cupti needs --trace (CUPTI's rows go into the trace)");
#if !ZT_HAVE_CUPTI
        return fail("--cupti: this build has no CUPTI (built without a CUDA toolkit)");
#endif
      }
      int process_rank = 0;  // under a launcher, this process's rank: the rank of CUPTI's rows
      if (c.device == "cuda") {
        // A real GPU has its own size: --device-memory (or the config file's device_memory) caps it
        // only when given.
        if (!memory_given) c.device_memory = 0;
        // One process per GPU under a launcher: one trace per process (zt db merge joins them).
        try {
          const trainer::LaunchInfo li = trainer::read_launch_info(trainer::process_environment());
          process_rank = li.rank;
          if (li.world_size > 1 && !c.trace.empty()) {
            // Before the extension of the file name ("run.db" -> "run.rank1.db"); a name with none,
            // or only a leading dot (".trace"), gets it at the end.
            const size_t base = c.trace.rfind('/') == std::string::npos ? 0 : c.trace.rfind('/') + 1;
            const size_t dot = c.trace.rfind('.');
            const size_t at = dot != std::string::npos && dot > base ? dot : c.trace.size();
            c.trace.insert(at, ".rank" + std::to_string(li.rank));
          }
        } catch (const trainer::LaunchError&) {
          // trainer::train reports it, naming the variable
        }
      }

      // Bad input is refused before the trace is opened: opening it replaces the file at that path.
      trainer::Corpus corpus;  // the data file, read once by the check
      if (Status s = trainer::check_inputs(c, &corpus); !s) return fail(s.message());
      std::unique_ptr<probe::Recorder> rec;
      if (!c.trace.empty()) {
        probe::RecorderOptions ro;
        ro.path = c.trace;
        ro.command_line = "zt train";
        for (auto* opt : sub->get_options())
          if (opt->count() > 0)
            for (auto& r : opt->results()) ro.command_line += " " + opt->get_name() + (opt->get_expected() == 0 ? "" : " " + r);
        ro.config_json = trainer::to_json(c);
        ro.seed = static_cast<int64_t>(c.seed);
        ro.max_trace_bytes = *max_trace_bytes;
        ro.detail = detail_policy;
        ro.flight = flight;
        if (Status s = probe::Recorder::open(ro, &rec); !s) return fail(s.message());
      }
      // --cupti: CUPTI inside this process, from before the first CUDA call (the caching
      // allocator's first cudaMalloc) until training is over; its rows are source cupti.
      bool cupti_running = false;
#if ZT_HAVE_CUPTI
      if (*cupti && rec) {
        probe::cupti::CollectorOptions co;
        co.recorder = rec.get();
        // Host endpoints (pinned memory, the host side of copies) on this rank's cpu device. The
        // trainer adds the same device (rank, cpu, 0, "cpu") itself once it starts; finishing the
        // trace folds the two rows into one.
        co.host_device = rec->add_device(process_rank, probe::DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false);
        co.stacks = true;
        co.rank = process_rank;
        const std::string why = probe::cupti::start(co);
        cupti_running = why.empty();
        if (!cupti_running) {
          // As zt probe does: say why, note why in the trace (a note, not an error of the run),
          // and train all the same.
          std::fprintf(stderr, "zt train: CUDA tracing (--cupti) is off: %s\n", why.c_str());
          rec->note("CUDA tracing (--cupti) was off: " + why + "; the trainer's own rows were recorded");
        }
      }
      // Stops CUDA tracing before `rec` goes, also when an exception unwinds past here (declared
      // after `rec`, so destroyed first): CUPTI's last buffers decoded and written, nothing left
      // that touches the recorder (the atexit stop the collector registers then has nothing to do).
      struct StopCupti {
        bool running;
        void now() {
          if (running) probe::cupti::stop();
          running = false;
        }
        ~StopCupti() { now(); }
      } stop_cupti{cupti_running};
#endif
      trainer::TrainSummary sum;
      Status s = trainer::train(c, rec.get(), c.quiet ? nullptr : &std::cout, &sum, nullptr, &corpus);
#if ZT_HAVE_CUPTI
      stop_cupti.now();  // before the close
#else
      (void)cupti_running;
      (void)process_rank;
#endif
      bool trace_failed = false;
      if (rec) {
        // The exit code the process returns below: 1 for a run that failed, 2 for input refused late.
        Status closed = s ? rec->close(db::RunStatus::Ok, 0)
                          : rec->close(db::RunStatus::Failed, sum.failure.empty() ? kExitBadInput : kExitFailed,
                                       s.message());
        if (!closed) std::fprintf(stderr, "zt: %s\n", closed.message().c_str());
        trace_failed = !closed;
      }
      if (!s) {
        // A failed training run is a result, not bad usage: exit 1 when it trained and died.
        std::fprintf(stderr, "zt train: %s\n", s.message().c_str());
        if (!c.trace.empty() && rec) std::fprintf(stderr, "zt train: the trace is in %s\n", c.trace.c_str());
        return sum.failure.empty() ? kExitBadInput : kExitFailed;
      }
      if (c.virtual_mode)
        std::printf("replayed %lld steps in virtual mode (sizes only, no math) in %s; samples used %lld; rank 0's peak %s "
                    "allocated, %s reserved\n",
                    (long long)sum.steps, format_duration_ns(sum.seconds * 1e9).c_str(), (long long)sum.samples_used,
                    format_bytes(double(sum.peak_allocated)).c_str(), format_bytes(double(sum.peak_reserved)).c_str());
      else if (sum.resumed_from_step >= 0 && sum.losses.empty())
        std::printf("nothing left to train: %s has the %lld steps this run asks for\n", sum.resumed_from.c_str(),
                    (long long)sum.steps);
      else if (sum.resumed_from_step >= 0)  // sum.steps counts from the run's start; the rest, this process's part
        std::printf("trained %lld step%s (%lld tokens), steps %lld-%lld after resuming from %s, in %s: loss %.4f -> %.4f; "
                    "samples used %lld (this part); peak %s allocated, %s reserved\n",
                    (long long)(sum.steps - sum.resumed_from_step), sum.steps - sum.resumed_from_step == 1 ? "" : "s",
                    (long long)sum.tokens, (long long)sum.resumed_from_step + 1,
                    (long long)sum.steps, sum.resumed_from.c_str(), format_duration_ns(sum.seconds * 1e9).c_str(),
                    sum.first_loss, sum.last_loss, (long long)sum.samples_used, format_bytes(double(sum.peak_allocated)).c_str(),
                    format_bytes(double(sum.peak_reserved)).c_str());
      else
        std::printf("trained %lld step%s (%lld tokens) in %s: loss %.4f -> %.4f; samples used %lld; peak %s allocated, %s reserved\n",
                    (long long)sum.steps, sum.steps == 1 ? "" : "s", (long long)sum.tokens, format_duration_ns(sum.seconds * 1e9).c_str(),
                    sum.first_loss, sum.last_loss, (long long)sum.samples_used, format_bytes(double(sum.peak_allocated)).c_str(),
                    format_bytes(double(sum.peak_reserved)).c_str());
      if (trace_failed) {
        // The training ran, but its record did not: a CI job must not take the trace for a whole one.
        std::fprintf(stderr, "zt train: the trace %s is incomplete: it holds what was written before the failure\n",
                     c.trace.c_str());
        return kExitFailed;
      }
      if (!c.trace.empty()) std::printf("trace: %s (zt db info %s)\n", c.trace.c_str(), c.trace.c_str());
      return kExitOk;
    };
  });
}

}  // namespace zt::cli
