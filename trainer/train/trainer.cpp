#include "train/trainer.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "ckpt/checkpoint.h"
#include "core/backend.h"
#include "core/tensor.h"
#include "model/adamw.h"
#include "model/gpt2.h"
#include "model/layout.h"
#include "train/model_shape.h"
#include "train/outside_memory.h"
#include "train/rank_runtime.h"
#include "zero/communicator.h"
#include "zero/engine.h"
#include "zero/launcher_env.h"
#include <thread>
#include "zt/common/files.h"
#include "zt/common/units.h"
#include "zt/memory/errors.h"
#include "zt/memory/numa.h"
#include "zt/fail/failpoint.h"

namespace zt::trainer {

namespace {

int64_t host_rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// A rank's memory as the progress lines give it: the accelerator's allocated and reserved bytes
// (0 where it has no caching allocator), the host's pinned and pageable reserved bytes.
struct RankMemory {
  int64_t allocated = 0, reserved = 0, pinned = 0, pageable = 0;
};
RankMemory rank_memory(RankRuntime& rt) {
  RankMemory m;
  if (auto* da = rt.device_allocator()) {
    const auto st = da->stats();
    m.allocated = st.allocated_bytes;
    m.reserved = st.reserved_bytes;
  }
  m.pinned = rt.pinned_allocator().stats().reserved_bytes;
  m.pageable = rt.pageable_allocator().stats().reserved_bytes;
  return m;
}

// What a virtual step leaves behind (virtual_fast_forward): the memory held on the device and the
// host, and how many allocations and frees the step made. Two steps in a row that leave the same
// are a steady state.
struct StepFootprint {
  std::array<int64_t, 16> v{};
  bool operator==(const StepFootprint& o) const { return v == o.v; }
};
StepFootprint footprint(RankRuntime& rt, const StepFootprint* before_step) {
  StepFootprint f;
  size_t i = 0;
  if (auto* da = rt.device_allocator()) {
    const auto st = da->stats();
    for (int64_t x : {st.allocated_bytes, st.requested_bytes, st.reserved_bytes, st.inactive_split_bytes, st.segments,
                      st.allocations, st.allocations_total, st.segment_allocs_total})
      f.v[i++] = x;
  }
  i = 8;
  for (const auto& st : {rt.pinned_allocator().stats(), rt.pageable_allocator().stats()})
    for (int64_t x : {st.allocated_bytes, st.reserved_bytes, st.regions, st.allocations_total}) f.v[i++] = x;
  // Cumulative counts as this step's own (the difference from the state before it).
  if (before_step)
    for (size_t k : {size_t(6), size_t(7), size_t(11), size_t(15)}) f.v[k] -= before_step->v[k];
  return f;
}

bool is_token_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[8] = {};
  f.read(magic, 8);
  return f.gcount() == 8 && std::memcmp(magic, "ZTTOKENS", 8) == 0;
}


void train_rank(const TrainConfig& cfg, const model::Config& mc, int B, int T, const Corpus& corpus,
                const DataPlan& plan, int64_t total_steps, RankRuntime& rt, Communicator& comm, std::ostream* progress,
                TrainSummary* summary, int64_t* step_out, const ckpt::Selected* resume) {
  probe::Recorder* rec = rt.recorder();
  const int rank = rt.rank();
  Device& dev = rt.accelerator();
  // Setting up takes a while at the large presets (the initial weights drawn, every model state
  // allocated and filled: tens of GiB of pinned host memory at 1.5B under optimizer offload).
  const int64_t t_setup = probe::now_ns();
  if (progress) {
    // The parameters the engine places: a real run draws the model's; virtual mode sizes its shape's.
    const bool custom = cfg.model == "custom";
    const std::string n = format_count(double(cfg.virtual_mode && custom ? shape_params(cfg.shape, false) : model::num_params(mc)));
    *progress << "setting up rank " << rank << ": "
              << (cfg.virtual_mode ? "placing the model states of " + n + " parameters (sizes only)"
                                   : "drawing " + n + " initial weights, placing the model states")
              << " ..." << std::endl;
  }
  ZeroEngine engine(cfg, mc, B, T, rt, comm);
  if (progress) {
    const RankMemory mem = rank_memory(rt);
    *progress << "set up in " << format_duration_ns(double(probe::now_ns() - t_setup)) << ": " << dev.label() << " "
              << format_bytes(double(mem.allocated)) << " allocated | host " << format_bytes(double(mem.pinned))
              << " pinned + " << format_bytes(double(mem.pageable)) << " pageable";
    if (const auto& load = engine.load_report(); load.on) {
      const int64_t node = cfg.ranks_per_node > 0 ? cfg.ranks_per_node : cfg.world_size;
      *progress << "\nmodel load (from_pretrained" << (load.zero_init ? ", zero.Init: one module at a time" : ": the whole model on every rank")
                << "): each rank reads " << format_bytes(double(load.model_bytes)) << " of weights (" << (cfg.load_dtype.empty() ? cfg.precision : cfg.load_dtype)
                << (cfg.load_copies > 1 ? ", " + std::to_string(cfg.load_copies) + " copies" : std::string()) << "); rank " << rank << " held at most "
                << format_bytes(double(load.host_peak_bytes)) << " of host memory while loading; a node of " << node
                << " ranks: " << format_bytes(double(load.host_peak_bytes) * double(node))
                << (cfg.host_memory ? " of its " + format_bytes(double(cfg.host_memory)) : std::string());
    }
    if (cfg.finetuning != "full") {
      const auto [trained, frozen] = engine.trainable_and_frozen();
      *progress << "\nfinetuning " << cfg.finetuning << ": " << format_count(double(trained)) << " parameters trained, "
                << format_count(double(frozen)) << " frozen (no gradients, no optimizer state)";
    }
    if (cfg.zero.offload_optimizer && cfg.zero.offload_ratio < 1) {
      const auto [host, all] = engine.offloaded_modules();
      *progress << "; offload_ratio " << cfg.zero.offload_ratio << ": the optimizer state of " << host << " of " << all
                << " modules on the host, " << all - host << " on " << dev.label();
    }
    *progress << std::endl;
  }
  DataLoader loader(corpus, plan, cfg.seed);
  const probe::NameId n_loss = rec ? rec->intern("loss") : 0, n_tps = rec ? rec->intern("tokens_per_s") : 0,
                      n_rss = rec ? rec->intern("host_rss") : 0;
  auto marker = [&](probe::MarkerKind kind, const std::string& n, int64_t step, int64_t epoch) {
    if (!rec) return probe::MarkerId(0);
    probe::MarkerEvent m;
    m.rank = rank;
    m.kind = kind;
    m.name = rec->intern(n);
    m.step = step;
    m.epoch = epoch;
    return rec->marker_begin(m);
  };
  if (rec && engine.load_report().on) {
    const int64_t node = cfg.ranks_per_node > 0 ? cfg.ranks_per_node : cfg.world_size;
    rec->counter(rank, rt.host().trace_id(), rec->intern("load.host_peak_per_node"),
                 double(engine.load_report().host_peak_bytes) * double(node));
  }
  if (rec && rank == 0) {
    // The data accounting, so a trace answers "why only 32 steps?" without the console.
    const std::pair<const char*, int64_t> facts[] = {
        {"data.tokens", plan.tokens},
        {"data.documents", corpus.documents},
        {"data.documents_truncated", corpus.truncated_documents},
        {"data.tokens_truncated", corpus.truncated_tokens},
        {"data.documents_dropped", corpus.dropped_documents},
        {"data.samples_per_epoch", plan.samples_per_epoch},
        {"data.tail_tokens_dropped", plan.tail_tokens_dropped},
        {"data.samples_per_step", plan.samples_per_step},
        {"data.steps_per_epoch", plan.steps_per_epoch},
        {"data.samples_dropped_per_epoch", plan.samples_dropped_per_epoch},
        {"data.steps_planned", total_steps}};
    for (auto& [n, v] : facts) rec->counter(rank, 0, rec->intern(n), double(v));
  }
  const int64_t t_run = probe::now_ns();
  const int64_t tokens_per_step = int64_t(B) * T * cfg.grad_accum * cfg.world_size;
  int64_t& step = *step_out;
  step = 0;  // set up: the engine placed the model states; a failure from here on is in a step
  // Checkpoints (issue 5): where a resumed run starts, and the periodic save.
  int64_t first_epoch = 0, first_s = 0;
  if (resume) {
    const ckpt::Position pos = ckpt::load(*resume, rank, engine);  // collective
    step = pos.global_step;
    first_epoch = pos.epoch;
    first_s = pos.step_in_epoch;
    if (summary) summary->steps = step;
  }
  auto save_checkpoint = [&](int64_t epoch, int64_t s) {
    ckpt::Position next{step + 1, epoch, s + 1};
    if (next.step_in_epoch == plan.steps_per_epoch) next = {step + 1, epoch + 1, 0};
    probe::MarkerId cm = marker(probe::MarkerKind::Phase, "checkpoint", step, epoch);
    ckpt::SaveReport rep;
    const int64_t bytes = ckpt::save(cfg.checkpoint_dir, cfg, next, engine, comm, {step, epoch, rec}, &rep);
    if (rec) rec->marker_end(cm, bytes);
    if (summary) {
      ++summary->checkpoints_saved;
      summary->checkpoint_peak_temp_device_bytes = std::max(summary->checkpoint_peak_temp_device_bytes, rep.peak_temp_device_bytes);
    }
    if (progress) {
      const std::string where = cfg.checkpoint_dir + "/" + ckpt::tag_for_step(next.global_step);
      std::string weights;
      if (rep.weights)
        weights = std::string(rep.optimizer_state ? "; " : "; weights only (save_only_model): ") +
                  (rep.files_written ? "model.safetensors " + format_bytes(double(rep.weights_bytes)) + ", " : std::string()) +
                  (rep.gathered_modules == 0
                       ? std::string("no gather needed (every module whole on the device)")
                       : rep.gather + " gather of " + std::to_string(rep.gathered_modules) + " modules" +
                             (rep.gather_forced_by_fault ? " (fault ckpt.gather_on_device)" : "") +
                             ", peak temporary device memory " + format_bytes(double(rep.peak_temp_device_bytes)));
      if (rep.files_written)
        *progress << "checkpoint: " << where << " (" << format_bytes(double(bytes)) << " written by rank 0" << weights << ")\n";
      else
        *progress << "checkpoint: " << where << ": virtual mode, no files written (gathers and staging only" << weights
                  << ")\n";
      *progress << std::flush;
    }
  };
  // Virtual fast-forward (cfg.virtual_fast_forward): only where nothing but memory carries from one
  // step to the next.
  const bool may_fast_forward = cfg.virtual_mode && cfg.virtual_fast_forward && cfg.faults.empty() && !std::getenv("ZT_FAULTS") &&
                                cfg.eval_steps == 0 && cfg.save_every == 0 && cfg.delayed_update < 0 &&
                                !cfg.overlap_update && !cfg.adam_in_backward && cfg.precision != "fp16";
  int64_t fast_forwarded = 0;
  const probe::NameId n_ff = rec && may_fast_forward ? rec->intern("virtual.steps_fast_forwarded") : 0;
  for (int64_t epoch = first_epoch; step < total_steps; ++epoch) {
    probe::MarkerId em = marker(probe::MarkerKind::Epoch, "epoch " + std::to_string(epoch), -1, epoch);
    if (epoch > 0 && !(epoch == first_epoch && first_s > 0)) engine.on_epoch_boundary(epoch, step);
    if (summary) summary->epochs_started = epoch + 1;
    // The epoch boundary changes the state: each epoch replays until two steps in a row leave the same.
    std::optional<StepFootprint> last;
    StepResult steady_res;
    int64_t steady_as = -1;  // the replayed step the fast-forwarded ones repeat
    for (int64_t s = epoch == first_epoch ? first_s : 0; s < plan.steps_per_epoch && step < total_steps; ++s, ++step) {
      const int64_t t_step = probe::now_ns();
      probe::MarkerId sm = marker(probe::MarkerKind::Step, "step " + std::to_string(step), step, epoch);
      const bool forward = steady_as >= 0;
      StepResult res;
      if (forward) {
        // The steady state's step again: its micro-batches used, nothing replayed.
        for (int64_t m = 0; m < cfg.grad_accum; ++m) loader.account_micro_batch();
        res = steady_res;
        ++fast_forwarded;
      } else {
        const StepFootprint before = may_fast_forward ? footprint(rt, nullptr) : StepFootprint{};
        res = engine.step(loader, epoch, s, step);
        if (may_fast_forward) {
          const StepFootprint after = footprint(rt, &before);
          if (last && *last == after) {
            steady_as = step;
            steady_res = res;
          }
          last = after;
        }
      }
      if (rec) rec->marker_end(sm);
      const int64_t now = probe::now_ns();
      const double tps = double(tokens_per_step) / std::max(double(now - t_step) / 1e9, 1e-9);
      const int64_t rss = host_rss_bytes();
      if (rec) {
        rec->counter(rank, 0, n_loss, res.loss, now);
        if (!forward) rec->counter(rank, 0, n_tps, tps, now);  // a fast-forwarded step ran nothing to time
        rec->counter(rank, rt.host().trace_id(), n_rss, double(rss), now);
      }
      if (summary) {
        summary->losses.push_back(res.loss);
        summary->tokens += tokens_per_step;
        if (summary->losses.size() == 1) summary->first_loss = res.loss;
        summary->last_loss = res.loss;
        summary->steps = step + 1;
        if (res.skipped) ++summary->skipped_steps;
      }
      if (progress) {
        char line[512];
        const RankMemory mem = rank_memory(rt);
        const std::string as = forward ? " (virtual: fast-forwarded, as step " + std::to_string(steady_as + 1) + ")" : "";
        std::snprintf(line, sizeof line,
                      "step %lld/%lld | epoch %lld | loss %.4f%s | %s tok/s | %s %s allocated / %s reserved | host %s pinned "
                      "+ %s pageable, RSS %s\n",
                      (long long)(step + 1), (long long)total_steps, (long long)epoch, res.loss,
                      res.skipped ? " (skipped: overflow)" : forward ? as.c_str() : cfg.virtual_mode ? " (virtual: no math)" : "",
                      (forward ? std::string("-") : format_count(tps)).c_str(), dev.label().c_str(),
                      format_bytes(double(mem.allocated)).c_str(), format_bytes(double(mem.reserved)).c_str(),
                      format_bytes(double(mem.pinned)).c_str(), format_bytes(double(mem.pageable)).c_str(),
                      format_bytes(double(rss)).c_str());
        *progress << line << std::flush;
      }
      // An evaluation after the step, before its save (Hugging Face Trainer's order).
      if (cfg.eval_steps > 0 && (step + 1) % cfg.eval_steps == 0) {
        const double eval_loss = engine.evaluate(loader, step, epoch);
        if (rec && !std::isnan(eval_loss)) rec->counter(rank, 0, rec->intern("eval_loss"), eval_loss);
        if (progress) {
          const RankMemory mem = rank_memory(rt);
          *progress << "evaluation after step " << step + 1 << ": "
                    << (std::isnan(eval_loss) ? std::string("virtual: no math") : "loss " + std::to_string(eval_loss))
                    << " | " << dev.label() << " peak " << format_bytes(double(rt.device_allocator() ? rt.device_allocator()->stats().peak_allocated_bytes : 0))
                    << " allocated | host " << format_bytes(double(mem.pinned)) << " pinned + "
                    << format_bytes(double(mem.pageable)) << " pageable\n" << std::flush;
        }
      }
      if (cfg.save_every > 0 && (step + 1) % cfg.save_every == 0) save_checkpoint(epoch, s);
    }
    if (rec) {
      rec->counter(rank, 0, rec->intern("data.samples_used"), double(loader.samples_used()));
      if (may_fast_forward) rec->counter(rank, 0, n_ff, double(fast_forwarded));
      rec->marker_end(em);
    }
  }
  engine.finish_update();  // the last step's update, when it was delayed
  if (summary) {
    summary->seconds = double(probe::now_ns() - t_run) / 1e9;
    summary->samples_used = loader.samples_used() * cfg.world_size;
    summary->model_state_bytes = engine.model_state_bytes();
    if (auto* da = rt.device_allocator()) {
      auto st = da->stats();
      summary->peak_allocated = st.peak_allocated_bytes;
      summary->peak_reserved = st.peak_reserved_bytes;
    }
  }
}

// The model the run trains (a preset, or a scenario's shape) and the batch shape it checks.
Status model_config_of(const TrainConfig& cfg, model::Config* out) {
  const bool virt = cfg.virtual_mode;
  std::optional<model::Config> mc;
  if (cfg.model == "custom") {
    // A real model's layout (issue 9's scenarios): sizes only, unless it is GPT-2's own layout
    // (the reference model computes any vocab/context/layers/heads/width; scenarios' small variants).
    const ModelShape& sh = cfg.shape;
    const bool gpt2_layout = sh.kv_heads == sh.heads && sh.ffn == 4 * sh.width && !sh.gated_ffn && sh.experts == 0 &&
                             sh.tied_embeddings && sh.head_dim == 0 && sh.kv_lora_rank == 0 && sh.encoder_layers == 0 &&
                             sh.positions == 0;
    if (!virt && !gpt2_layout)
      return Status::Error("--model custom (" + (sh.name.empty() ? std::string("a model shape") : sh.name) +
                           "): a shape other than GPT-2's layout (kv_heads = heads, ffn = 4 x width, no gate, no experts, "
                           "tied embeddings) runs in virtual mode only (--virtual)");
    if (Status s = validate_shape(sh); !s) return s;
    mc = model::Config{sh.vocab, sh.context, shape_blocks(sh), sh.heads, sh.width};  // an encoder's blocks too
    if (!virt)
      if (Status s = model::validate(*mc); !s) return s;
  } else {
    mc = model::preset(cfg.model);
  }
  if (!mc) return Status::Error("--model '" + cfg.model + "': not a preset (tiny, 124M, 350M, 774M, 1.5B)");
  const int64_t T = cfg.seq_len ? cfg.seq_len : mc->context;
  const int64_t B = cfg.micro_batch;
  if (!virt) {
    // Named by the settings that chose B and T, and the file they came from.
    if (Status s = model::Workspace::check(*mc, int(B), int(T)); !s) {
      std::string why = s.message();
      if (why.rfind("workspace: ", 0) == 0) why = why.substr(11);
      const std::string& file = !cfg.config_file.empty() ? cfg.config_file : cfg.ds_config;
      return Status::Error((file.empty() ? std::string() : file + ": ") + "micro_batch " + std::to_string(B) +
                           ", seq_len " + std::to_string(T) + " (model " + cfg.model + "): " + why);
    }
  } else if (cfg.data_samples <= 0) {
    return Status::Error("virtual mode needs data_samples (the size of the data set in samples of seq_len tokens): "
                         "no corpus is read");
  }
  *out = *mc;
  return Status::Ok();
}

// The fault specs of the run: --fault and ZT_FAULTS, each parsed (a bad one named by its origin).
Status fault_specs_of(const TrainConfig& cfg, std::vector<fail::Spec>* out) {
  std::vector<std::pair<std::string, std::string>> sources;  // (where it came from, the spec text)
  for (const std::string& text : cfg.faults) sources.emplace_back("--fault ", text);
  if (const char* env = std::getenv("ZT_FAULTS")) sources.emplace_back("ZT_FAULTS: ", env);
  std::vector<fail::Spec> specs;
  for (const auto& [origin, text] : sources) {
    std::vector<fail::Spec> more;
    if (Status s = fail::parse_specs(text, &more); !s) return Status::Error(origin + s.message());
    specs.insert(specs.end(), more.begin(), more.end());
  }
  *out = std::move(specs);
  return Status::Ok();
}

// A fault argument that names a module is checked against the model before anything runs (it was
// refused only when the fault fired, after a fault row that claimed it had acted).
Status fault_args_fit_model(const TrainConfig& cfg, const std::vector<fail::Spec>& specs) {
  const int64_t modules = optimizer_modules(cfg);
  for (const fail::Spec& s : specs) {
    if (s.name != "zero.grad_partition_stays_on_device") continue;
    for (const fail::Term& t : s.terms) {
      // Only return(N) names a module; print(msg), sleep(ms), ... carry their own arguments.
      if (t.action != fail::Action::Return || !t.has_arg || t.arg.empty()) continue;
      if (const std::string why = stays_on_device_module_problem(t.arg, cfg.zero, modules); !why.empty())
        return Status::Error("--fault '" + s.text + "': " + why);
    }
  }
  return Status::Ok();
}

// What --resume starts from: every file of the chosen checkpoint verified (ckpt::select_checkpoint).
Status select_resume(const TrainConfig& cfg, ckpt::Selected* out) {
  if (Status s = ckpt::select_checkpoint(cfg.checkpoint_dir, out); !s) return Status::Error("--resume: " + s.message());
  return Status::Ok();
}

// The chosen checkpoint against this run's settings that need no data plan: the model, and the
// seed (the data order depends on it). check_inputs and train() both ask, so a mismatch is refused
// before the trace is opened.
Status resume_fits_run(const TrainConfig& cfg, const ckpt::Selected& resume) {
  const ckpt::Manifest& m = resume.manifest;
  const std::string where = resume.dir + "/" + m.tag;
  if (!m.model.empty() && m.model != cfg.model)
    return Status::Error("--resume: " + where + " holds model '" + m.model + "'; this run has --model " + cfg.model);
  if (m.seed != cfg.seed)
    return Status::Error("--resume: " + where + " was saved with --seed " + std::to_string(m.seed) +
                         "; this run has --seed " + std::to_string(cfg.seed) +
                         " (the data order depends on it): run with --seed " + std::to_string(m.seed));
  return Status::Ok();
}

Status checkpoint_settings_ok(const TrainConfig& cfg) {
  if (cfg.save_every < 0) return Status::Error("--save-every " + std::to_string(cfg.save_every) + ": must be 0 (never) or more");
  if ((cfg.save_every > 0 || cfg.resume) && cfg.checkpoint_dir.empty())
    return Status::Error(std::string(cfg.resume ? "--resume" : "--save-every") + " needs --checkpoint-dir DIR");
  if (!cfg.checkpoint_dir.empty() && !cfg.virtual_mode) {
    std::error_code ec;
    if (std::filesystem::exists(cfg.checkpoint_dir, ec) && !std::filesystem::is_directory(cfg.checkpoint_dir, ec))
      return Status::Error("--checkpoint-dir " + cfg.checkpoint_dir + ": exists and is not a directory");
  }
  if (cfg.resume && cfg.virtual_mode)
    return Status::Error("--resume: virtual mode keeps sizes only, so there is no model state to load a checkpoint into");
  // Every save ends by renaming latest.tmp over `latest`: something there that is not a file
  // (a directory) would fail the first save, after a step has trained; found here instead.
  if (cfg.save_every > 0 && !cfg.virtual_mode) {
    std::error_code ec;
    const std::string latest = cfg.checkpoint_dir + "/latest";
    if (std::filesystem::is_directory(std::filesystem::symlink_status(latest, ec)))
      return Status::Error("--checkpoint-dir " + cfg.checkpoint_dir + ": " + latest +
                           " is a directory, where each save writes the name of the newest checkpoint; move it away");
  }
  // A fresh run saving into another run's checkpoints would replace some of them and leave the
  // rest beside its own, `latest` pointing back: two runs mixed in one directory.
  if (cfg.save_every > 0 && !cfg.resume && !cfg.virtual_mode) {
    std::error_code ec;
    if (std::filesystem::exists(cfg.checkpoint_dir + "/latest", ec))
      return Status::Error("--checkpoint-dir " + cfg.checkpoint_dir +
                           " already holds checkpoints (it has a 'latest'): --resume continues that run; to start "
                           "over, remove them or choose another directory");
  }
  return Status::Ok();
}

}  // namespace

Status load_corpus(const TrainConfig& cfg, Corpus* out) {
  if (cfg.data.empty()) {
    *out = synthetic_corpus(cfg.seed, cfg.synthetic_bytes);
    return Status::Ok();
  }
  if (is_token_file(cfg.data)) {
    // A token file is one stream of tokens, no documents: the limit would be ignored silently.
    if (cfg.max_doc_tokens > 0)
      return Status::Error(cfg.data + ": a token file has no documents to cut: --max-doc-tokens applies to text data");
    return load_token_file(cfg.data, out);
  }
  return load_text_corpus(cfg.data, cfg.max_doc_tokens, out);
}

Status check_inputs(const TrainConfig& cfg, Corpus* corpus) {
  if (Status s = validate(cfg); !s) return s;
  model::Config mc;
  if (Status s = model_config_of(cfg, &mc); !s) return s;
  std::vector<fail::Spec> specs;
  if (Status s = fault_specs_of(cfg, &specs); !s) return s;
  if (Status s = fault_args_fit_model(cfg, specs); !s) return s;
  if (!cfg.virtual_mode && !cfg.data.empty()) {
    if (Status s = check_input_file(cfg.data, "data file"); !s) return s;
    // Its contents too (empty, not text, too small for one global batch): read once, and handed
    // to train() by a caller that passes `corpus`.
    Corpus local;
    Corpus& c = corpus ? *corpus : local;
    if (Status s = load_corpus(cfg, &c); !s) return s;
    if (c.vocab > mc.vocab)
      return Status::Error(c.source + ": its vocab of " + std::to_string(c.vocab) + " tokens does not fit the model's " +
                           std::to_string(mc.vocab));
    const DataPlan plan = plan_data(c, cfg.seq_len ? cfg.seq_len : mc.context, cfg.micro_batch, cfg.grad_accum, cfg.world_size);
    if (!plan.error.empty()) return Status::Error(c.source + ": " + plan.error);
  }
  if (Status s = checkpoint_settings_ok(cfg); !s) return s;
  if (cfg.resume) {  // a checkpoint to resume from exists and fits (train() checks it against the data plan too)
    ckpt::Selected resume;
    if (Status s = select_resume(cfg, &resume); !s) return s;
    if (Status s = resume_fits_run(cfg, resume); !s) return s;
  }
  return Status::Ok();
}

Status train(const TrainConfig& cfg, probe::Recorder* rec, std::ostream* progress, TrainSummary* summary,
             Backend* given_backend, Corpus* loaded) {
  *summary = TrainSummary{};
  if (Status s = validate(cfg); !s) return s;
  const bool virt = cfg.virtual_mode;
  // --device cuda: the GPU backend (core/backend.h). Under a launcher (torchrun, mpirun, srun)
  // with more than one process, this process is one rank on its local rank's GPU, joined to the
  // others by NCCL; otherwise every rank is a thread here, all on one GPU.
  std::unique_ptr<Backend> own_backend;
  Backend* backend = given_backend;
  LaunchInfo launch;
  bool multi_process = false;
  if (given_backend && cfg.device != "cuda") return Status::Error("train: a backend was given for --device " + cfg.device);
  if (cfg.device == "cuda" && !given_backend) {
    try {
      launch = read_launch_info(process_environment());
    } catch (const LaunchError& e) {
      return Status::Error(std::string("--device cuda: ") + e.what());
    }
    multi_process = launch.world_size > 1;
    if (multi_process && cfg.world_size != launch.world_size) {
      if (cfg.world_size != 1)
        return Status::Error("--world-size " + std::to_string(cfg.world_size) + " disagrees with the launcher: " +
                             launch.describe());
      TrainConfig c = cfg;  // the launcher's world
      c.world_size = launch.world_size;
      return train(c, rec, progress, summary, given_backend, loaded);
    }
    std::string why;
    CudaBackendOptions bo;
    bo.matmul = matmul_precision_of(cfg);
    bo.bf16_compute = cfg.matmul_dtype == "bf16";
    // ZT_CUDA_SYNC: how the rank thread waits for the GPU (an A/B knob for GPU hosts: bench/gpu_session).
    if (const char* env = std::getenv("ZT_CUDA_SYNC"); env && *env && !parse_cuda_sync(env, &bo.sync))
      return Status::Error(std::string("ZT_CUDA_SYNC='") + env +
                           "': use auto (CUDA's choice), spin, yield or blocking (how a thread waits for the GPU)");
    own_backend = make_cuda_backend(multi_process ? launch.local_rank : 0, &why, bo);
    if (!own_backend) return Status::Error("--device cuda: " + why);
    backend = own_backend.get();
  }
  model::Config mc_value;
  if (Status s = model_config_of(cfg, &mc_value); !s) return s;
  const model::Config* mc = &mc_value;
  const int64_t T = cfg.seq_len ? cfg.seq_len : mc->context;
  const int64_t B = cfg.micro_batch;
  if (cfg.ranks_per_node < 0) return Status::Error("ranks_per_node must not be negative");

  // Faults (inject/failpoint): --fault specs and ZT_FAULTS, for this run, from one seed.
  std::vector<fail::Spec> specs;
  if (Status s = fault_specs_of(cfg, &specs); !s) return s;
  if (Status s = fault_args_fit_model(cfg, specs); !s) return s;
  fail::Scope fault_scope(specs, cfg.fault_seed ? cfg.fault_seed : cfg.seed);

  Corpus corpus;
  int64_t virtual_samples = cfg.data_samples;
  if (virt)
    corpus.source = "virtual data set (" + std::to_string(cfg.data_samples) + " samples)";
  else if (loaded && !cfg.data.empty())
    corpus = std::move(*loaded);
  else if (Status s = load_corpus(cfg, &corpus); !s)
    return s;
  // data.parallel_drop (R1): parallel preprocessing lost part of the data, and said nothing.
  if (auto f = ZT_FAIL_D("data.parallel_drop", (fail::Context{0, -1, -1, -1, rec}),
                         "preprocessing with num_proc=4 workers loses part of the data without a message "
                         "(the data.* counters show what was left)")) {
    char* end = nullptr;
    const int64_t pct = f->arg.empty() ? 50 : std::strtoll(f->arg.c_str(), &end, 10);
    if ((end && *end) || pct < 0 || pct > 100) return Status::Error("fault data.parallel_drop: '" + f->arg + "' is not a percentage");
    virtual_samples = cfg.data_samples * (100 - pct) / 100;
    corpus.tokens.resize(corpus.tokens.size() * size_t(100 - pct) / 100);
    corpus.documents = corpus.documents * (100 - pct) / 100;  // silently: not counted as dropped
  }
  if (corpus.vocab > mc->vocab)
    return Status::Error(corpus.source + ": its vocab of " + std::to_string(corpus.vocab) +
                         " tokens does not fit the model's " + std::to_string(mc->vocab));
  DataPlan plan = virt ? plan_samples(virtual_samples, T, B, cfg.grad_accum, cfg.world_size)
                       : plan_data(corpus, T, B, cfg.grad_accum, cfg.world_size);
  summary->plan = plan;
  summary->corpus_accounting = corpus;
  summary->corpus_accounting.tokens.clear();
  if (!plan.error.empty()) return Status::Error(corpus.source + ": " + plan.error);
  int64_t total_steps = cfg.steps ? cfg.steps : std::max<int64_t>(cfg.epochs, 1) * plan.steps_per_epoch;
  // config.max_iters (R1): the run's config said max_iters where it meant max_epochs.
  if (auto f = ZT_FAIL("config.max_iters", (fail::Context{0, -1, -1, -1, rec}))) {
    char* end = nullptr;
    const int64_t iters = f->arg.empty() ? 32 : std::strtoll(f->arg.c_str(), &end, 10);
    if ((end && *end) || iters < 1) return Status::Error("fault config.max_iters: '" + f->arg + "' is not a step count");
    total_steps = std::min(total_steps, iters);
  }
  if (cfg.save_every > total_steps && !cfg.virtual_mode)
    std::fprintf(stderr, "zt train: warning: --save-every %lld is more than this run's %lld steps: no checkpoint will be saved\n",
                 (long long)cfg.save_every, (long long)total_steps);

  // Checkpoints (issue 5): the settings, and what to resume from (verified before any rank starts).
  if (Status s = checkpoint_settings_ok(cfg); !s) return s;
  ckpt::Selected resume;
  if (cfg.resume) {
    if (Status s = select_resume(cfg, &resume); !s) return s;
    const ckpt::Manifest& m = resume.manifest;
    const std::string where = resume.dir + "/" + m.tag;
    summary->resume_notes = resume.notes;
    if (!resume.notes.empty()) std::fprintf(stderr, "zt train: warning: %s", resume.notes.c_str());
    // A different world size (or ZeRO stage 0 against 1-3): each rank re-splits the saved
    // optimizer state (ckpt::load). The data order follows the global batch, so a run that
    // keeps it (micro-batch x accumulation x ranks) goes on with the same samples.
    std::string reshard;
    if (m.world_size != cfg.world_size) {
      reshard = "re-splitting the optimizer state of " + std::to_string(m.world_size) + " ranks for " +
                std::to_string(cfg.world_size);
      const int64_t global = cfg.micro_batch * cfg.grad_accum * cfg.world_size;
      if (m.global_batch() > 0 && m.global_batch() != global)
        reshard += "; the global batch changes from " + std::to_string(m.global_batch()) + " to " + std::to_string(global) +
                   " samples, so the data order from here on differs from the saved run's";
    }
    if (Status s = resume_fits_run(cfg, resume); !s) return s;
    if (m.pos.step_in_epoch >= plan.steps_per_epoch)
      return Status::Error("--resume: " + where + " resumes at step " + std::to_string(m.pos.step_in_epoch) +
                           " of epoch " + std::to_string(m.pos.epoch) + ", but this run's data plan has " +
                           std::to_string(plan.steps_per_epoch) +
                           " steps per epoch (the data, sequence length or batch sizes changed)");
    if (m.pos.global_step > total_steps)
      return Status::Error("--resume: " + where + " has " + std::to_string(m.pos.global_step) +
                           " steps done, more than the " + std::to_string(total_steps) +
                           " this run asks for (ask for as many steps or epochs or more)");
    summary->resumed_from_step = m.pos.global_step;
    summary->resumed_from = where;
    if (progress) {
      *progress << "resuming from " << where << ": " << m.pos.global_step << " steps done; next: epoch " << m.pos.epoch
                << ", step " << m.pos.step_in_epoch << " of the epoch\n";
      if (!reshard.empty()) *progress << "resuming: " << reshard << "\n";
    }
  }

  if (progress) {
    *progress << "data: " << corpus.source << ": " << corpus.tokens.size() << " tokens in " << corpus.documents
              << " documents (" << corpus.truncated_documents << " truncated, " << corpus.truncated_tokens
              << " tokens cut; " << corpus.dropped_documents << " empty dropped)\n"
              << "plan: " << plan.samples_per_epoch << " samples of " << T + 1 << " tokens per epoch ("
              << plan.tail_tokens_dropped << " tail tokens unused); " << plan.samples_per_step
              << " samples per step (micro-batch " << B << " x accumulation " << cfg.grad_accum << " x data-parallel "
              << cfg.world_size << ") = " << plan.steps_per_epoch << " steps per epoch, "
              << plan.samples_dropped_per_epoch << (plan.samples_dropped_per_epoch == 1 ? " sample" : " samples")
              << " dropped per epoch; training " << total_steps
              << " steps\n";
    if (cfg.delayed_update >= 0)
      *progress << "delayed parameter update after " << cfg.delayed_update << " ordinary step"
                << (cfg.delayed_update == 1 ? "" : "s") << ": from step " << cfg.delayed_update + 1
                << " on, each step's CPU AdamW runs beside the next step, which sees the weights one update behind\n";
    if (cfg.overlap_update)
      *progress << "overlapped update: each step's CPU AdamW runs beside the next step's forward, module by module; "
                   "each module waits for its own update (the ordinary update's arithmetic)\n";
    if (cfg.grad_partition_dtype == "compute")
      *progress << "gradient partitions kept in " << cfg.precision
                << " on the host: CPU AdamW widens them in its own pass (the fp32 partitions' arithmetic)\n";
    if (cfg.pinned_numa == "interleave" && !virt) {
      const std::vector<int>& nodes = memory::numa_nodes();
      *progress << (cfg.host_memory && !backend ? "host memory (pinned and pageable: one capped host memory)"
                                                : "pinned host memory")
                << " interleaved page by page over NUMA node" << (nodes.size() == 1 ? " " : "s ")
                << memory::node_list_text(nodes)
                << (nodes.size() == 1 ? " (one node: the same pages as local)" : "")
                << (backend ? " (mapped, then pinned with cudaHostRegister)" : "") << "\n";
    }
  }

  // One thread per rank, each with its own simulated GPU, joined by the in-process transport.
  // Virtual mode: rank 0 alone stands for every rank (they are symmetric).
  const int threads_n = virt || multi_process ? 1 : int(cfg.world_size);
  const int lead = multi_process ? launch.rank : 0;  // the rank this process reports for
  InProcessGroup group = virt ? InProcessGroup::representative(int(cfg.world_size), cfg.comm_timeout_ms)
                              : InProcessGroup(int(cfg.world_size), cfg.comm_timeout_ms);
  const uint64_t host_per_rank = cfg.ranks_per_node > 0 ? cfg.host_memory / uint64_t(cfg.ranks_per_node) : cfg.host_memory;
  if (virt && progress)
    *progress << "virtual mode: sizes only, no math; rank 0 stands for " << cfg.world_size << " symmetric ranks"
              << (cfg.model == "custom" ? "; " + describe_shape(cfg.shape, false) : std::string())
              << (cfg.host_memory ? "; host memory per rank " + format_bytes(double(host_per_rank)) : std::string())
              << "\n";
  if (virt && rec) rec->counter(0, 0, rec->intern("virtual.ranks_represented"), double(cfg.world_size));
  // The node memory watchdog (cfg.watchdog_kill_at): one per node, shared by its rank threads.
  const int64_t per_node = cfg.ranks_per_node > 0 ? cfg.ranks_per_node : cfg.world_size;
  std::vector<std::unique_ptr<NodeMemoryWatch>> watches;
  if (cfg.watchdog_kill_at > 0)
    for (int64_t n = 0; n < (virt ? 1 : (cfg.world_size + per_node - 1) / per_node); ++n)
      watches.push_back(std::make_unique<NodeMemoryWatch>(cfg.watchdog, cfg.watchdog_kill_at, cfg.host_memory,
                                                          int(std::min(per_node, cfg.world_size)), int(n)));
  std::vector<std::string> failures(size_t(cfg.world_size));
  std::vector<int64_t> steps_done(size_t(cfg.world_size), 0);
  // Rank threads share the cores: each gets its share of OpenMP threads, and OpenBLAS (which
  // keeps its own pool, whose idle threads spin) runs single-threaded inside each rank.
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  if (threads_n > 1) openblas_set_num_threads(1);
  auto run_rank = [&](int rank) {
    if (threads_n > 1) omp_set_num_threads(std::max(1, cores / threads_n));
    RuntimeOptions ro;
    ro.accelerator = cfg.device == "cpu" ? DeviceType::Cpu : backend ? DeviceType::Cuda : DeviceType::Sim;
    ro.backend = backend;
    ro.rank = rank;
    ro.world_size = int(cfg.world_size);
    ro.device_capacity = cfg.device_memory;
    ro.host_capacity = host_per_rank;
    ro.virtual_memory = virt;
    for (const OutsideTerm& t : outside_allocator_terms(cfg)) ro.outside_allocator.emplace_back(t.name, size_t(t.bytes));
    ro.pinned_placement = memory::parse_placement(cfg.pinned_numa);
    if (!watches.empty()) ro.watch = watches[virt ? 0 : size_t(rank / per_node)].get();
    std::unique_ptr<RankRuntime> rt;
    std::unique_ptr<Communicator> comm;
    int64_t step = -1;  // -1 until the rank's engine is set up (train_rank)
    try {
      rt = std::make_unique<RankRuntime>(ro, rec);
      if (multi_process) {
        std::string why;
        comm = backend->process_communicator(rank, rec, rt->accelerator().trace_id(), cfg.comm_timeout_ms, &why);
        if (!comm) throw std::invalid_argument("--device cuda under " + launch.launcher + ": " + why);
      } else {
        comm = group.communicator(rank, rec, rt->accelerator().trace_id(),
                                  backend ? &rt->accelerator().ops() : nullptr);
      }
      train_rank(cfg, *mc, int(B), int(T), corpus, plan, total_steps, *rt, *comm, rank == 0 ? progress : nullptr,
                 rank == lead ? summary : nullptr, &step, cfg.resume ? &resume : nullptr);
    } catch (const memory::OutOfMemoryError& e) {
      failures[size_t(rank)] = e.what();  // the allocator recorded the error row
    } catch (const memory::HostOutOfMemoryError& e) {
      failures[size_t(rank)] = e.what();
    } catch (const DeviceMismatchError& e) {
      failures[size_t(rank)] = e.what();  // the guard recorded the error row
    } catch (const MemoryWatchdogKill& e) {
      failures[size_t(rank)] = e.what();  // the watchdog recorded the error row: the whole job is killed
    } catch (const CommAborted& e) {
      failures[size_t(rank)] = std::string("aborted: ") + e.what();
    } catch (const CommTimeout& e) {
      failures[size_t(rank)] = e.what();  // the watchdog recorded the error row and aborted the group
    } catch (const RankExited& e) {
      // Gone without a word, as a process that exits: the others' watchdog tells the story.
      failures[size_t(rank)] = std::string("aborted: ") + e.what();
      steps_done[size_t(rank)] = step;
      return;
    } catch (const std::bad_alloc&) {
      failures[size_t(rank)] = "the host ran out of memory (std::bad_alloc)";
    } catch (const ckpt::CheckpointError& e) {
      failures[size_t(rank)] = std::string("checkpoint: ") + e.what();
    } catch (const std::invalid_argument& e) {
      failures[size_t(rank)] = std::string("invalid configuration: ") + e.what();
    } catch (const LaunchError& e) {
      failures[size_t(rank)] = std::string("invalid configuration: ") + e.what();
    } catch (const std::runtime_error& e) {
      failures[size_t(rank)] = e.what();  // a CUDA, cuBLAS or NCCL call failed (its name and error in the text)
    }
    if (!failures[size_t(rank)].empty() && comm) comm->abort(failures[size_t(rank)]);
    steps_done[size_t(rank)] = step;
  };
  if (threads_n == 1) {
    run_rank(lead);
  } else {
    std::vector<std::thread> threads;
    for (int r = 0; r < int(cfg.world_size); ++r) threads.emplace_back(run_rank, r);
    for (auto& t : threads) t.join();
  }
  // The first rank that failed on its own (not by the abort of another) tells the story.
  for (size_t r = 0; r < failures.size(); ++r)
    if (!failures[r].empty() && failures[r].rfind("aborted: ", 0) != 0) {
      summary->failure = failures[r];
      if (cfg.world_size > 1) summary->failure = "rank " + std::to_string(r) + ": " + summary->failure;
      if (summary->failure.find("invalid configuration") != std::string::npos)
        return Status::Error(summary->failure.substr(summary->failure.find("invalid configuration: ") + 23));
      return Status::Error((steps_done[r] < 0 ? std::string("before the first step (setting up the model states and activations)")
                                               : "step " + std::to_string(steps_done[r])) +
                           ": " + summary->failure);
    }
  for (auto& f : failures)
    if (!f.empty()) summary->failure = f;
  if (!summary->failure.empty()) return Status::Error(summary->failure);
  return Status::Ok();
}

}  // namespace zt::trainer
