#include "train/trainer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/tensor.h"
#include "model/adamw.h"
#include "model/gpt2.h"
#include "model/layout.h"
#include "train/rank_runtime.h"
#include "zt/common/units.h"
#include "zt/memory/errors.h"

namespace zt::trainer {

namespace {

int64_t host_rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

bool is_token_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[8] = {};
  f.read(magic, 8);
  return f.gcount() == 8 && std::memcmp(magic, "ZTTOKENS", 8) == 0;
}

// Squared L2 norm of the gradients, in double so the order of a long sum does not matter much.
double grad_norm(const float* g, int64_t n) {
  double s = 0;
#pragma omp parallel for reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += double(g[i]) * double(g[i]);
  return std::sqrt(s);
}

// One micro-step through the model module by module, the way the ZeRO engine walks it, with
// a phase marker around each part: "forward" (embeddings and blocks), "loss" (the LM head's
// fused forward and backward), "backward" (blocks in reverse, then the embeddings).
template <typename Begin, typename End>
double micro_step(model::Workspace& ws, const std::vector<model::ModuleSpec>& modules, const float* p,
                  const int32_t* tokens, const int32_t* targets, float* g, float grad_scale, Begin begin, End end) {
  const int L = int(modules.size()) - 2;
  const int64_t emb = modules.front().offset, fin = modules.back().offset;
  const int64_t wte = model::embedding_offsets(ws.config()).wte;
  probe::MarkerId ph = begin("forward");
  model::embed_forward(ws, p + emb, tokens, ws.residual(0));
  for (int l = 0; l < L; ++l) model::block_forward(ws, l, p + modules[size_t(l) + 1].offset, ws.residual(l), ws.residual(l + 1));
  end(ph);
  ph = begin("loss");
  float* dx = ws.grad_residual();
  const float loss = model::head_forward_backward(ws, p + fin, p + emb + wte, ws.residual(L), targets, dx, g + fin,
                                                  g + emb + wte, grad_scale);
  end(ph);
  ph = begin("backward");
  for (int l = L - 1; l >= 0; --l)
    model::block_backward(ws, l, p + modules[size_t(l) + 1].offset, ws.residual(l), dx, dx, g + modules[size_t(l) + 1].offset);
  model::embed_backward(ws, tokens, dx, g + emb);
  end(ph);
  return loss;
}

}  // namespace

Status load_corpus(const TrainConfig& cfg, Corpus* out) {
  if (cfg.data.empty()) {
    *out = synthetic_corpus(cfg.seed, cfg.synthetic_bytes);
    return Status::Ok();
  }
  if (is_token_file(cfg.data)) return load_token_file(cfg.data, out);
  return load_text_corpus(cfg.data, cfg.max_doc_tokens, out);
}

Status train(const TrainConfig& cfg, probe::Recorder* rec, std::ostream* progress, TrainSummary* summary) {
  *summary = TrainSummary{};
  if (Status s = validate(cfg); !s) return s;
  if (cfg.device == "cuda")
    return Status::Error("--device cuda: the CUDA backend is not built yet; use --device sim (a simulated GPU)");
  if (cfg.world_size != 1)
    return Status::Error("--world-size " + std::to_string(cfg.world_size) +
                         ": several ranks need the ZeRO engine, which is not built yet; use --world-size 1");
  auto mc = model::preset(cfg.model);
  if (!mc) return Status::Error("--model '" + cfg.model + "': not a preset (tiny, 124M, 350M, 774M, 1.5B)");
  const int64_t T = cfg.seq_len ? cfg.seq_len : mc->context;
  const int64_t B = cfg.micro_batch;
  if (Status s = model::Workspace::check(*mc, int(B), int(T)); !s) return s;
  const DType storage = *parse_dtype(cfg.precision);

  Corpus corpus;
  if (Status s = load_corpus(cfg, &corpus); !s) return s;
  if (corpus.vocab > mc->vocab)
    return Status::Error(corpus.source + ": its vocab of " + std::to_string(corpus.vocab) +
                         " tokens does not fit the model's " + std::to_string(mc->vocab));
  DataPlan plan = plan_data(corpus, T, B, cfg.grad_accum, cfg.world_size);
  summary->plan = plan;
  summary->corpus_accounting = corpus;
  summary->corpus_accounting.tokens.clear();
  if (!plan.error.empty()) return Status::Error(corpus.source + ": " + plan.error);
  const int64_t total_steps = cfg.steps ? cfg.steps : std::max<int64_t>(cfg.epochs, 1) * plan.steps_per_epoch;

  if (progress) {
    *progress << "data: " << corpus.source << ": " << corpus.tokens.size() << " tokens in " << corpus.documents
              << " documents (" << corpus.truncated_documents << " truncated, " << corpus.truncated_tokens
              << " tokens cut; " << corpus.dropped_documents << " empty dropped)\n"
              << "plan: " << plan.samples_per_epoch << " samples of " << T + 1 << " tokens per epoch ("
              << plan.tail_tokens_dropped << " tail tokens unused); " << plan.samples_per_step
              << " samples per step (micro-batch " << B << " x accumulation " << cfg.grad_accum << " x data-parallel "
              << cfg.world_size << ") = " << plan.steps_per_epoch << " steps per epoch, "
              << plan.samples_dropped_per_epoch << " samples dropped per epoch; training " << total_steps
              << " steps\n";
  }

  RuntimeOptions ro;
  ro.accelerator = cfg.device == "cpu" ? DeviceType::Cpu : DeviceType::Sim;
  ro.device_capacity = cfg.device_memory;
  ro.host_capacity = cfg.host_memory;
  RankRuntime rt(ro, rec);
  Device& dev = rt.accelerator();
  Device& host = rt.host();
  const int rank = rt.rank();
  auto name = [&](const char* s) { return rec ? rec->intern(s) : 0; };
  auto marker = [&](probe::MarkerKind kind, const std::string& n, int64_t step, int64_t micro, int64_t epoch) {
    probe::MarkerEvent m;
    m.rank = rank;
    m.kind = kind;
    m.name = rec ? rec->intern(n) : 0;
    m.step = step;
    m.micro_step = micro;
    m.epoch = epoch;
    return rec ? rec->marker_begin(m) : 0;
  };
  auto end = [&](probe::MarkerId id) {
    if (rec) rec->marker_end(id);
  };
  const probe::NameId n_loss = name("loss"), n_tps = name("tokens_per_s"), n_rss = name("host_rss");
  if (rec) {
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

  int64_t step = 0;
  try {
    const int64_t N = model::num_params(*mc);
    // Model states on the accelerator, as a plain single-rank trainer keeps them.
    Tensor params = Tensor::empty("params", {N}, DType::F32, dev);
    model::init_params(*mc, cfg.seed, params.f32());
    Tensor low;      // the bf16/fp16 weights the model computes from
    Tensor compute;  // their fp32 upcast, what the fp32 kernels read
    if (storage != DType::F32) {
      low = Tensor::empty(std::string("params.") + std::string(dtype_name(storage)), {N}, storage, dev);
      compute = Tensor::empty("params.compute", {N}, DType::F32, dev);
      from_float(storage, params.f32(), low.raw(), size_t(N));
    }
    Tensor grads = Tensor::zeros("grads", {N}, DType::F32, dev);
    Tensor m = Tensor::zeros("adam.m", {N}, DType::F32, dev);
    Tensor v = Tensor::zeros("adam.v", {N}, DType::F32, dev);
    model::Workspace ws(*mc, int(B), int(T), cfg.activation_checkpointing);
    const std::vector<model::ModuleSpec> modules = model::module_table(*mc);
    // The reference kernels keep activations in their Workspace; the accelerator is charged
    // the same bytes so its memory figures and capacity hold what a GPU would need.
    Tensor activations = Tensor::empty("activations", {int64_t((ws.bytes() + 3) / 4)}, DType::F32, dev);
    Tensor host_tokens = Tensor::empty("batch.tokens", {B, T}, DType::I32, host, /*pinned=*/true);
    Tensor host_targets = Tensor::empty("batch.targets", {B, T}, DType::I32, host, /*pinned=*/true);
    DataLoader loader(corpus, plan, cfg.seed);
    const int64_t t_run = probe::now_ns();

    for (int64_t epoch = 0; step < total_steps; ++epoch) {
      probe::MarkerId em = marker(probe::MarkerKind::Epoch, "epoch " + std::to_string(epoch), -1, -1, epoch);
      summary->epochs_started = epoch + 1;
      for (int64_t s = 0; s < plan.steps_per_epoch && step < total_steps; ++s, ++step) {
        const int64_t t_step = probe::now_ns();
        probe::MarkerId sm = marker(probe::MarkerKind::Step, "step " + std::to_string(step), step, -1, epoch);
        std::memset(grads.raw(), 0, grads.bytes());
        if (storage != DType::F32) to_float(storage, low.raw(), compute.f32(), size_t(N));
        const float* p = storage != DType::F32 ? compute.f32() : params.f32();
        double loss_sum = 0;
        for (int64_t micro = 0; micro < cfg.grad_accum; ++micro) {
          probe::MarkerId mm = marker(probe::MarkerKind::MicroStep, "micro-step " + std::to_string(micro), step, micro, epoch);
          loader.micro_batch(epoch, s, micro, rank, host_tokens.data<int32_t>(), host_targets.data<int32_t>());
          Tensor tokens = copy_to(host_tokens, dev);
          Tensor targets = copy_to(host_targets, dev);
          check_same_device("forward", {&tokens, &targets, &params});
          loss_sum += micro_step(ws, modules, p, tokens.data<int32_t>(), targets.data<int32_t>(), grads.f32(),
                                 1.0f / float(cfg.grad_accum), [&](const char* phase) {
                                   return marker(probe::MarkerKind::Phase, phase, step, micro, epoch);
                                 }, end);
          end(mm);
        }
        double loss = loss_sum / double(cfg.grad_accum);
        probe::MarkerId om = marker(probe::MarkerKind::Phase, "optimizer", step, -1, epoch);
        check_same_device("adamw_step", {&params, &grads, &m, &v}, step);
        if (cfg.grad_clip > 0) {
          double norm = grad_norm(grads.f32(), N);
          if (norm > cfg.grad_clip) {
            float scale = float(cfg.grad_clip / (norm + 1e-6));
            float* g = grads.f32();
            for (int64_t i = 0; i < N; ++i) g[i] *= scale;
          }
        }
        model::adamw_step(params.f32(), grads.f32(), m.f32(), v.f32(), N, cfg.lr, cfg.beta1, cfg.beta2, cfg.eps,
                          cfg.weight_decay, step + 1);
        if (storage != DType::F32) from_float(storage, params.f32(), low.raw(), size_t(N));
        end(om);
        end(sm);

        const int64_t now = probe::now_ns();
        const double secs = double(now - t_step) / 1e9;
        const double tps = double(B * T * cfg.grad_accum) / std::max(secs, 1e-9);
        summary->losses.push_back(loss);
        summary->tokens += B * T * cfg.grad_accum;
        if (step == 0) summary->first_loss = loss;
        summary->last_loss = loss;
        summary->steps = step + 1;
        int64_t rss = host_rss_bytes();
        if (rec) {
          rec->counter(rank, 0, n_loss, loss, now);
          rec->counter(rank, 0, n_tps, tps, now);
          rec->counter(rank, host.trace_id(), n_rss, double(rss), now);
        }
        if (progress) {
          char line[512];
          int64_t alloc = 0, reserved = 0;
          if (auto* da = rt.device_allocator()) {
            auto st = da->stats();
            alloc = st.allocated_bytes;
            reserved = st.reserved_bytes;
          }
          std::snprintf(line, sizeof line, "step %lld/%lld | epoch %lld | loss %.4f | %s tok/s | %s %s allocated / %s reserved | host RSS %s\n",
                        (long long)(step + 1), (long long)total_steps, (long long)epoch, loss,
                        format_count(tps).c_str(), dev.label().c_str(), format_bytes(double(alloc)).c_str(),
                        format_bytes(double(reserved)).c_str(), format_bytes(double(rss)).c_str());
          *progress << line << std::flush;
        }
      }
      if (rec) rec->counter(rank, 0, name("data.samples_used"), double(loader.samples_used()));
      end(em);
    }
    summary->seconds = double(probe::now_ns() - t_run) / 1e9;
    summary->samples_used = loader.samples_used();
    if (auto* da = rt.device_allocator()) {
      auto st = da->stats();
      summary->peak_allocated = st.peak_allocated_bytes;
      summary->peak_reserved = st.peak_reserved_bytes;
    }
  } catch (const memory::OutOfMemoryError& e) {
    summary->failure = e.what();  // the allocator recorded the error row
  } catch (const memory::HostOutOfMemoryError& e) {
    summary->failure = e.what();
  } catch (const DeviceMismatchError& e) {
    summary->failure = e.what();  // the guard recorded the error row
  } catch (const std::bad_alloc&) {
    summary->failure = "the host ran out of memory (std::bad_alloc)";
  }
  if (!summary->failure.empty()) return Status::Error("step " + std::to_string(step) + ": " + summary->failure);
  return Status::Ok();
}

}  // namespace zt::trainer
